"""What a POP consumer gets: ``SimpleConsumer`` receive + ack of 100 B messages, beside the
``PushConsumer`` with its defaults on the same messages, in one run.

Run::

    python bench/bench_pop.py

One broker group on loopback (the test harness's Cluster), N messages (default 300,000) of 100 B
in 8 queues, produced first.  Then, from one process:

- ``SimpleConsumer.receive(32, 60)`` + ``ack_batch(views)`` (one BATCH_ACK_MESSAGE per receive),
  one thread, until every message is acked;
- the same with ``ack(view)`` per message (what RocketMQ 5's SimpleConsumer offers), on a slice;
- the same with ``ack_async(view)`` per message (RocketMQ 5's ackAsync), until every future is done;
- ``rmq.aio``'s SimpleConsumer with AIO_TASKS (8) receive + ack_batch loops in flight at once;
- the same with every view acked by a task of its own (``gather`` of ``ack(view)``);
- ``PushConsumer`` (defaults: 20 consume threads, batch size 1) of another group, until its
  listener saw every message.

Each figure is messages per second, the ratio is to the push consumer of the same run.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq import Message, Producer, PushConsumer, SimpleConsumer  # noqa: E402
from rmq.client.consumer import ConsumeConcurrentlyStatus  # noqa: E402
from rmq.bench.e2e import BENCH_INDEX_CONF  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.test_consumer import create_topic, wait_dispatched  # noqa: E402

N = int(os.environ.get("RMQ_BENCH_POP_N", "300000"))
N_SINGLE = int(os.environ.get("RMQ_BENCH_POP_SINGLE", "20000"))
QUEUES = 8
AIO_TASKS = int(os.environ.get("RMQ_BENCH_POP_TASKS", "8"))
BODY = b"x" * 100


def produce(c: Cluster, topic: str, n: int) -> None:
    with Producer(c.namesrv_addr, group="bench-pg") as p:
        for k in range(0, n, 1000):
            p.send_batch([Message(topic, BODY) for _ in range(min(1000, n - k))])
    wait_dispatched(c, topic, QUEUES, n)


def pop_rate(c: Cluster, topic: str, group: str, n: int, batch_ack) -> float:
    """receive(32) in a loop, each batch acked by ``ack_batch`` (True), ``ack`` per view (False)
    or ``ack_async`` per view ("async", timed until every future is done)."""
    got = 0
    futs = []
    with SimpleConsumer(c.namesrv_addr, group, {topic: "*"}, await_duration_s=1, init_mode="MIN") as sc:
        t0 = time.perf_counter()
        while got < n:
            views = sc.receive(32, 60)
            if not views:
                break
            if batch_ack == "async":
                futs += [sc.ack_async(v) for v in views]
            elif batch_ack:
                sc.ack_batch(views)
            else:
                for v in views:
                    sc.ack(v)
            got += len(views)
        for f in futs:
            f.result(60)
        dt = time.perf_counter() - t0
    assert got >= n, f"{got} of {n} received"
    return got / dt


def aio_pop_rate(c: Cluster, topic: str, group: str, n: int, tasks: int, ack_each: bool = False) -> float:
    """``tasks`` receive(32) + ack_batch loops on one rmq.aio SimpleConsumer (one thread); with
    ``ack_each``, every view acked by a task of its own (``gather`` of ``ack(view)``: the asyncio
    way to handle each message on its own, whose acks the consumer merges)."""
    import asyncio

    from rmq.aio import SimpleConsumer as AioSimpleConsumer

    async def main() -> float:
        got, acked, t_end = [0], [0], [0.0]
        async with AioSimpleConsumer(c.namesrv_addr, group, {topic: "*"}, await_duration_s=1,
                                     init_mode="MIN") as sc:
            async def loop():
                while got[0] < n:
                    views = await sc.receive(32, 60)
                    if not views:
                        return
                    got[0] += len(views)
                    if ack_each:
                        await asyncio.gather(*(sc.ack(v) for v in views))
                    else:
                        await sc.ack_batch(views)
                    acked[0] += len(views)
                    if acked[0] >= n and not t_end[0]:
                        t_end[0] = time.perf_counter()
            t0 = time.perf_counter()
            # timed to the n-th ack: the other loops' receives then wait out await_duration_s
            # (1 s) for messages there are no more of, which is not the consumer's rate (it was
            # counted before stop 42, understating these rows by up to half)
            await asyncio.gather(*(loop() for _ in range(tasks)))
        assert acked[0] >= n and t_end[0], f"{acked[0]} of {n} received and acked"
        return acked[0] / (t_end[0] - t0)

    return asyncio.run(main())


def push_rate(c: Cluster, topic: str, n: int) -> float:
    done = threading.Event()
    count = [0]
    lock = threading.Lock()
    pc = PushConsumer(c.namesrv_addr, "bench-push", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    pc.subscribe(topic, "*")

    @pc.register_message_listener
    def on(msgs, ctx):
        with lock:
            count[0] += len(msgs)
            if count[0] >= n:
                done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    t0 = time.perf_counter()
    pc.start()
    try:
        assert done.wait(600), f"push consumer saw {count[0]} of {n}"
        return n / (time.perf_counter() - t0)
    finally:
        pc.shutdown()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rmq-bench-pop-") as tmp, \
            Cluster(f"{tmp}/store", conf={"mapedFileSizeCommitLog": str(256 << 20), **BENCH_INDEX_CONF}) as c:
        create_topic(c, "BP", QUEUES)
        produce(c, "BP", N)
        pop = pop_rate(c, "BP", "bench-pop", N, True)
        single = pop_rate(c, "BP", "bench-pop-single", min(N_SINGLE, N), False)
        single_async = pop_rate(c, "BP", "bench-pop-async", N, "async")
        aio = aio_pop_rate(c, "BP", "bench-pop-aio", N, AIO_TASKS)
        aio_each = aio_pop_rate(c, "BP", "bench-pop-aio-each", N, AIO_TASKS, ack_each=True)
        push = push_rate(c, "BP", N)
        print(f"messages: {N} x {len(BODY)} B in {QUEUES} queues, one process, one thread")
        print(f"SimpleConsumer receive(32) + ack_batch : {pop:>10,.0f} msgs/s  ({pop / push:.2f}x push)")
        print(f"SimpleConsumer receive(32) + ack each  : {single:>10,.0f} msgs/s  ({single / push:.2f}x push)")
        print(f"SimpleConsumer receive(32) + ack_async each: {single_async:>7,.0f} msgs/s  "
              f"({single_async / push:.2f}x push)")
        print(f"rmq.aio SimpleConsumer, {AIO_TASKS} receive loops: {aio:>9,.0f} msgs/s  ({aio / push:.2f}x push)")
        print(f"rmq.aio, {AIO_TASKS} loops, each view acked alone   : {aio_each:>7,.0f} msgs/s  "
              f"({aio_each / push:.2f}x push)")
        print(f"PushConsumer, defaults                  : {push:>10,.0f} msgs/s  (1.00x)")


if __name__ == "__main__":
    main()
