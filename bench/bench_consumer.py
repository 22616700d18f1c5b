"""Consumer throughput against a real broker group (nameserver + broker + reput + flush on loopback).

Run::

    python bench/bench_consumer.py                 # a table of msgs/s
    python -m pytest bench/bench_consumer.py --benchmark-only -q

Setup (untimed): one broker group, topic ``bench`` with 8 queues filled with
``RMQ_CONSUMER_BENCH_MESSAGES`` (default 100 000) messages of 100 B (tag ``t``),
sent in batches of 256 (SEND_BATCH_MESSAGE), waiting until reput has dispatched
them all.  Every scenario reads the whole topic from offset 0 with its own
consumer group, so each is timed on the same data.

Scenarios (the timed part ends when the last message has been handed over):

=====================================  ========================================================================
``raw pull + decode (ceiling)``        RemotingClient PULL_MESSAGE, maxMsgNums 1024, queue after queue, each
                                       page decoded with ``decode_records`` (no client bookkeeping): the wire +
                                       decode ceiling of the consumers below
``PullConsumer.pull x32 / x1024``      ``pull(mq, "*", offset, max_nums)`` in a loop over the queues
``PullConsumer.pull tag filter``       the same with ``"t || u"`` (broker hash filter + exact re-filter)
``PullConsumer.poll x32 / x1024``      ``assign`` all queues, ``poll`` until the end (a pull in flight per queue)
``PushConsumer concurrent b1 / b32``   no-op listener, ``consume_message_batch_max_size`` 1 or 32,
                                       pull batch 32 (RocketMQ's default), 20 consume threads
``PushConsumer concurrent pull 256``   the same with ``pull_batch_size`` 256 and listener batches of 32
``PushConsumer orderly b32``           orderly no-op listener, batches of 32 (queue locks on the broker)
``AsyncPushConsumer concurrent b32``   asyncio consumer, coroutine no-op listener
=====================================  ========================================================================

A push scenario starts with ``start()`` (rebalance included) and stops timing
when the listener has seen every message; ``shutdown()`` is not timed.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from filled import FilledCluster  # noqa: E402
from rmq.client.consumer import PullConsumer, PushConsumer  # noqa: E402

N_MESSAGES = int(os.environ.get("RMQ_CONSUMER_BENCH_MESSAGES", "100000"))
QUEUES = 8
BODY = b"x" * 100
TOPIC = "bench"
SEND_BATCH = 256
TIMEOUT_S = 300.0


class BenchCluster(FilledCluster):
    """A broker group filled with N_MESSAGES of 100 B over QUEUES queues; ``group()`` names a new
    consumer group per scenario."""

    def __init__(self, n_messages: int = N_MESSAGES):
        super().__init__("rmq-bench-consumer-", n_messages, QUEUES, len(BODY), timeout_s=TIMEOUT_S)
        self.groups = 0

    def group(self, name: str) -> str:
        self.groups += 1
        return f"{name}-{self.groups}"


def timed(fn: Callable[[], int]) -> dict:
    t0 = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t0
    return {"msgs": n, "seconds": dt, "msgs_per_s": n / dt, "mb_per_s": n * len(BODY) / dt / 1e6}


# -- scenarios ---------------------------------------------------------------------------------------
def raw_pull_decode(bc: BenchCluster) -> int:
    return bc.raw_pull(decode=True)


def pull_consumer_pull(bc: BenchCluster, max_nums: int, expr: str = "*") -> int:
    n = 0
    with PullConsumer(bc.namesrv, group=bc.group("pull"), auto_commit=False) as c:
        for mq in c.fetch_subscribe_message_queues(TOPIC):
            off = 0
            while off < bc.ends[mq]:
                res = c.pull(mq, expr, offset=off, max_nums=max_nums)
                n += len(res.msg_found_list)
                off = res.next_begin_offset
    return n


def pull_consumer_poll(bc: BenchCluster, max_nums: int) -> int:
    n = 0
    with PullConsumer(bc.namesrv, group=bc.group("poll"), pull_batch_size=max_nums, auto_commit=False,
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues(TOPIC))
        deadline = time.monotonic() + TIMEOUT_S
        while n < bc.n and time.monotonic() < deadline:
            n += len(c.poll(1000))
    return n


def push_consumer(bc: BenchCluster, batch: int, orderly: bool = False, pull_batch: int = 32) -> Callable[[], int]:
    """Builds the consumer untimed; the returned callable starts it and waits for every message."""
    count = [0]
    done = threading.Event()
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            count[0] += len(msgs)
            if count[0] >= bc.n:
                done.set()
    c = PushConsumer(bc.namesrv, bc.group("orderly" if orderly else "push"), consume_message_batch_max_size=batch,
                     pull_batch_size=pull_batch, rebalance_interval_ms=1000,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(TOPIC, "*")
    if orderly:
        c.register_message_listener_orderly(listener)
    else:
        c.register_message_listener(listener)

    def run() -> int:
        c.start()
        try:
            done.wait(TIMEOUT_S)
            return count[0]
        finally:
            threading.Thread(target=c.shutdown, daemon=True).start()   # not timed
    return run


def async_push_consumer(bc: BenchCluster, batch: int) -> int:
    from rmq.aio.consumer import AsyncPushConsumer

    async def main() -> int:
        count = [0]
        done = asyncio.Event()

        async def listener(msgs, ctx):
            count[0] += len(msgs)
            if count[0] >= bc.n:
                done.set()
        c = AsyncPushConsumer(bc.namesrv, bc.group("apush"), consume_message_batch_max_size=batch,
                              rebalance_interval_ms=1000, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(TOPIC, "*")
        c.register_message_listener(listener)
        await c.start()
        try:
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
        finally:
            await c.shutdown()
        return count[0]
    return asyncio.run(main())


def scenarios(bc: BenchCluster) -> list:
    return [
        ("raw pull + decode (ceiling)", lambda: raw_pull_decode(bc)),
        ("PullConsumer.pull x32", lambda: pull_consumer_pull(bc, 32)),
        ("PullConsumer.pull x1024", lambda: pull_consumer_pull(bc, 1024)),
        ("PullConsumer.pull x1024 tag filter", lambda: pull_consumer_pull(bc, 1024, "t || u")),
        ("PullConsumer.poll x32", lambda: pull_consumer_poll(bc, 32)),
        ("PullConsumer.poll x1024", lambda: pull_consumer_poll(bc, 1024)),
        ("PushConsumer concurrent b1", push_consumer(bc, 1)),
        ("PushConsumer concurrent b32", push_consumer(bc, 32)),
        ("PushConsumer concurrent pull 256 b32", push_consumer(bc, 32, pull_batch=256)),
        ("PushConsumer orderly b32", push_consumer(bc, 32, orderly=True)),
        ("AsyncPushConsumer concurrent b32", lambda: async_push_consumer(bc, 32)),
    ]


# -- pytest-benchmark ------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:          # pragma: no cover - plain script use
    pytest = None

if pytest is not None:
    _ROWS: list = []
    _NAMES = ["raw pull + decode (ceiling)", "PullConsumer.pull x32", "PullConsumer.pull x1024",
              "PullConsumer.pull x1024 tag filter", "PullConsumer.poll x32", "PullConsumer.poll x1024",
              "PushConsumer concurrent b1", "PushConsumer concurrent b32", "PushConsumer concurrent pull 256 b32",
              "PushConsumer orderly b32", "AsyncPushConsumer concurrent b32"]

    @pytest.fixture(scope="module")
    def bench_cluster():
        bc = BenchCluster()
        yield bc
        bc.close()

    class _Summary:
        def pytest_terminal_summary(self, terminalreporter):
            if _ROWS:
                terminalreporter.section("rmq consumers: msgs/s (one pass over the topic)")
                _summary(terminalreporter.write_line)

    @pytest.fixture(scope="session", autouse=True)
    def _consumer_summary(request):
        pm = request.config.pluginmanager
        if pm.get_plugin("rmq-consumer-summary") is None:
            pm.register(_Summary(), "rmq-consumer-summary")
        yield

    @pytest.mark.parametrize("name", _NAMES)
    def test_consumer_throughput(benchmark, bench_cluster, name):
        fn = dict(scenarios(bench_cluster))[name]
        row = benchmark.pedantic(timed, args=(fn,), rounds=1, iterations=1)
        for k, v in row.items():
            benchmark.extra_info[k] = v
        _ROWS.append((name, row))
        assert row["msgs"] == bench_cluster.n


def _summary(write) -> None:
    rows = _ROWS if pytest is not None else []
    if not rows:
        return
    base = rows[0][1]["msgs_per_s"] if rows[0][0].startswith("raw") else None
    write(f"{'consumer scenario':<40} {'msgs/s':>12} {'MB/s':>8} {'vs raw':>8}")
    for name, r in rows:
        ratio = f"{r['msgs_per_s'] / base:.0%}" if base else "-"
        write(f"{name:<40} {r['msgs_per_s']:>12,.0f} {r['mb_per_s']:>8.1f} {ratio:>8}")


def main() -> int:
    bc = BenchCluster()
    try:
        print(f"{N_MESSAGES:,} messages of {len(BODY)} B in {QUEUES} queues; one pass per scenario")
        print(f"{'consumer scenario':<40} {'msgs/s':>12} {'MB/s':>8} {'vs raw':>8}")
        base = None
        for name, fn in scenarios(bc):
            r = timed(fn)
            assert r["msgs"] == bc.n, (name, r)
            base = base or r["msgs_per_s"]
            print(f"{name:<40} {r['msgs_per_s']:>12,.0f} {r['mb_per_s']:>8.1f} {r['msgs_per_s'] / base:>8.0%}",
                  flush=True)
    finally:
        bc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
