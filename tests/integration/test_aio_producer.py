"""rmq.aio.Producer.send_async (client-side batches on the event loop) against a real broker group."""
import asyncio
import contextvars
import gc
import os
import signal
import time
import zlib

import pytest

from rmq import Message, SendStatus
from rmq.aio import Producer
from rmq.client.producer import COMPRESSED_FLAG
from rmq.errors import MQClientError, RemotingError, RemotingTimeoutError
from tests.integration.cluster import Cluster
from tests.integration.test_producer import create_topic, pull_topic

pytestmark = pytest.mark.integration

WAIT_S = 30.0          # bound of every wait in this module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # the back-pressure test SIGSTOPs the broker with requests on the wire: no SYSTEM_BUSY
    # [TIMEOUT_CLEAN_QUEUE] for requests that waited in its queue meanwhile (see test_producer)
    c = Cluster(tmp_path_factory.mktemp("aio-producer") / "store", conf={"waitTimeMillsInSendQueue": "600000"})
    yield c
    c.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_send_async_batches_and_each_future_gets_its_own_message(cluster, rc):
    topics = ["AioBatchA", "AioBatchB"]
    n = 5000
    var = contextvars.ContextVar("who", default="nobody")
    seen: list = []

    async def main():
        async with Producer(cluster.namesrv_addr, group="pg") as p:
            for t in topics:
                await p.send(Message(t, b"warm-up"))
            before = dict(p.stats)
            var.set("sender")
            sent = []
            for i in range(n):
                m = Message(topics[i % 2], b"m-%d" % i)
                sent.append((m, await p.send_async(m, callback=lambda f: seen.append((f, var.get(),
                                                                                      gc.is_tracked(f))))))
            # pending futures stay out of the cyclic GC (their producer holds them); done, back in
            assert p.pending > 0 and not gc.is_tracked(sent[-1][1])
            assert await p.flush(WAIT_S) == 0 and p.pending == 0
            assert all(f.done() for _, f in sent)
            # callbacks run on the loop soon after their future is done, in the caller's context
            await asyncio.wait_for(_until(lambda: len(seen) == n), WAIT_S)
            return sent, {k: p.stats[k] - before[k] for k in before}

    sent, stats = run(main())
    results = [(m, f.result()) for m, f in sent]
    for m, r in results:
        assert r.status is SendStatus.SEND_OK and r.msg_id == m.properties["UNIQ_KEY"]
        assert r.message_queue.topic == m.topic
    assert len({(r.message_queue.topic, r.queue_id, r.queue_offset) for _, r in results}) == n
    assert {id(f) for f, _, _ in seen} == {id(f) for _, f in sent} and {who for _, who, _ in seen} == {"sender"}
    assert all(tracked for _, _, tracked in seen) and all(gc.is_tracked(f) for _, f in sent)
    # batching: far fewer requests than messages, most of them SEND_BATCH_MESSAGE
    assert stats["messages"] == n and stats["failed_messages"] == 0
    assert stats["batch_requests"] > 0 and stats["requests"] < n / 10, stats
    recs = {(x.topic, x.queue_id, x.queue_offset): x for t in topics for x in pull_topic(rc, cluster, t, 4, n // 2 + 1)}
    for m, r in results:
        rec = recs[(m.topic, r.queue_id, r.queue_offset)]
        assert rec.body == m.body and rec.msg_id == r.msg_id


async def _until(pred):
    while not pred():
        await asyncio.sleep(0.01)


async def _until_route(p, topic, queues):
    while True:
        try:
            if len(await p.fetch_publish_message_queues(topic)) == queues:
                return
        except MQClientError:
            pass
        await asyncio.sleep(0.05)


def test_a_lone_send_async_message_leaves_at_once_as_its_own_request(cluster):
    async def main():
        async with Producer(cluster.namesrv_addr, group="pg") as p:
            await p.send(Message("AioLone", b"warm-up"))
            before = dict(p.stats)
            fut = await p.send_async(Message("AioLone", b"alone"))
            r = await asyncio.wait_for(fut, WAIT_S)           # no flush: linger 0
            return r, {k: p.stats[k] - before[k] for k in before}

    r, stats = run(main())
    assert r.status is SendStatus.SEND_OK
    assert stats["requests"] - stats["route_requests"] == 1 and stats["batch_requests"] == 0


def test_send_async_linger_ms_gathers_messages_for_that_long(cluster):
    async def main():
        async with Producer(cluster.namesrv_addr, group="pg", linger_ms=200) as p:
            await p.send(Message("AioLinger", b"warm-up"))
            before = dict(p.stats)
            t0 = time.monotonic()
            futs = []
            for i in range(10):
                futs.append(await p.send_async(Message("AioLinger", b"l%d" % i)))
                await asyncio.sleep(0)                    # the loop runs: nothing leaves before linger_ms
            results = await asyncio.wait_for(asyncio.gather(*futs), WAIT_S)
            return results, time.monotonic() - t0, {k: p.stats[k] - before[k] for k in before}

    results, waited, stats = run(main())
    # (requests also counts NameServer look-ups)
    assert stats["requests"] - stats["route_requests"] == 1 and stats["batch_requests"] == 1 and waited >= 0.2
    offsets = sorted((r.queue_id, r.queue_offset) for r in results)
    assert len({q for q, _ in offsets}) == 1 and [o for _, o in offsets] == list(range(offsets[0][1],
                                                                                         offsets[0][1] + 10))


def test_send_async_without_batching_sends_one_request_per_message(cluster):
    async def main():
        async with Producer(cluster.namesrv_addr, group="pg", batch_size=0) as p:
            await p.send(Message("AioNoBatch", b"warm-up"))
            before = dict(p.stats)
            futs = [await p.send_async(Message("AioNoBatch", b"%d" % i)) for i in range(300)]
            assert await p.flush(WAIT_S) == 0
            return [f.result() for f in futs], {k: p.stats[k] - before[k] for k in before}

    results, stats = run(main())
    assert stats["requests"] - stats["route_requests"] == 300 and stats["batch_requests"] == 0
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 300


def test_unbatchable_send_async_messages_go_alone_between_the_batches(cluster, rc):
    create_topic(rc, cluster, "AioMixed", 4)           # ordered sends need the topic's route

    async def main():
        async with Producer(cluster.namesrv_addr, group="pg") as p:
            await asyncio.wait_for(_until_route(p, "AioMixed", 4), WAIT_S)
            await p.send(Message("AioMixed", b"warm-up"))
            futs = []
            for i in range(600):
                if i % 100 == 50:
                    m = Message("AioMixed", b"z%d" % i * 2000)            # compressed: not batchable
                    futs.append((m, "big", await p.send_async(m)))
                elif i % 100 == 70:
                    m = Message("AioMixed", b"k%d" % i)
                    futs.append((m, "key", await p.send_async(m, sharding_key="order-1")))
                else:
                    m = Message("AioMixed", b"p%d" % i)
                    futs.append((m, "plain", await p.send_async(m)))
            assert await p.flush(WAIT_S) == 0
            return [(m, kind, f.result()) for m, kind, f in futs], dict(p.stats)

    results, stats = run(main())
    assert all(r.status is SendStatus.SEND_OK and r.msg_id == m.properties["UNIQ_KEY"] for m, _, r in results)
    assert len({r.queue_id for _, kind, r in results if kind == "key"}) == 1      # one key, one queue
    assert stats["batch_requests"] > 0
    recs = {(x.queue_id, x.queue_offset): x for x in pull_topic(rc, cluster, "AioMixed", 4, 601)}
    for m, kind, r in results:
        rec = recs[(r.queue_id, r.queue_offset)]
        if kind == "big":
            assert rec.sys_flag & COMPRESSED_FLAG and zlib.decompress(rec.body) == m.body
        else:
            assert rec.body == m.body and not rec.sys_flag & COMPRESSED_FLAG


def test_close_ships_what_send_async_queued(cluster, rc):
    n = 3000

    async def main():
        p = Producer(cluster.namesrv_addr, group="pg")
        await p.start()
        await p.send(Message("AioCloseShips", b"warm-up"))
        futs = [await p.send_async(Message("AioCloseShips", b"c%d" % i)) for i in range(n)]
        assert p.pending > 0                       # nothing awaited them yet
        await p.close()
        assert all(f.done() for f in futs) and p.pending == 0
        with pytest.raises(MQClientError, match="closed"):
            await p.send_async(Message("AioCloseShips", b"late"))
        return [f.result() for f in futs]

    results = run(main())
    assert all(r.status is SendStatus.SEND_OK for r in results)
    recs = pull_topic(rc, cluster, "AioCloseShips", 4, n + 1)
    assert sorted(x.body for x in recs if x.body != b"warm-up") == sorted(b"c%d" % i for i in range(n))


def test_send_async_awaits_room_at_max_pending_messages_then_fails_clearly(cluster):
    """Back-pressure: send_async returns without suspending below max_pending_messages; at the
    limit it awaits room; with the broker stopped, it gives up after send_msg_timeout_ms with
    "producer buffer full"; nothing is lost, and the response timeouts fire on time."""
    broker = cluster.pids()["broker"]

    async def main():
        # the broker running: 500 sends through a buffer of 50, the caller paced by it.  The default
        # send_msg_timeout_ms (the wait for room and for each answer): a broker that stalls for a
        # few hundred ms on a loaded machine must not fail this part
        async with Producer(cluster.namesrv_addr, group="pg", max_pending_messages=50) as p:
            await p.send(Message("AioPending50", b"warm-up"))
            top = 0
            futs = []
            for i in range(500):
                futs.append(await p.send_async(Message("AioPending50", b"r%d" % i)))
                top = max(top, p.pending)
            assert top == 50 and await p.flush(WAIT_S) == 0
            assert all(f.result().status is SendStatus.SEND_OK for f in futs)

        # the broker stopped: a short send_msg_timeout_ms, the time measured below; the requests
        # with no reason to measure it (the warm-up, the send after the stop) get WAIT_S each
        async with Producer(cluster.namesrv_addr, group="pg", max_pending_messages=50,
                            send_msg_timeout_ms=400) as p:
            await p.send(Message("AioPending50", b"warm-up"), timeout_ms=int(WAIT_S * 1000))
            os.kill(broker, signal.SIGSTOP)
            try:
                await asyncio.wait_for(_until(lambda: _proc_state(broker) == "T"), WAIT_S)
                loop_turns = [0]

                def tick():
                    loop_turns[0] += 1
                asyncio.get_running_loop().call_soon(tick)
                futs = [await p.send_async(Message("AioPending50", b"p%d" % i)) for i in range(50)]
                assert loop_turns[0] == 0 and p.pending == 50         # accepted without suspending
                t0 = time.monotonic()
                with pytest.raises(MQClientError, match=r"producer buffer full: 50 messages unanswered"):
                    await p.send_async(Message("AioPending50", b"one too many"))
                assert 0.3 < time.monotonic() - t0 < 5.0
                assert await p.flush(0.05) == 50                        # still unanswered: the count left
                t0 = time.monotonic()
                with pytest.raises(RemotingTimeoutError):
                    await p.send(Message("AioPending50", b"sync"), timeout_ms=300)
                assert 0.25 < time.monotonic() - t0 < 5.0
            finally:
                os.kill(broker, signal.SIGCONT)
            assert await p.flush(WAIT_S) == 0
            # held past their budget, some may end in a timeout: each has an outcome, and every one
            # answered SEND_OK has its own offset
            assert all(f.done() for f in futs)
            ok = [f.result() for f in futs if f.exception() is None]
            assert len({(r.queue_id, r.queue_offset) for r in ok}) == len(ok)
            r = await asyncio.wait_for(await p.send_async(Message("AioPending50", b"room again"),
                                                          timeout_ms=int(WAIT_S * 1000)), WAIT_S)
            assert r.status is SendStatus.SEND_OK

    run(main())


def test_send_async_to_a_killed_broker_fails_with_remoting_error_after_retries(tmp_path):
    c = Cluster(tmp_path / "store")
    try:
        async def main():
            p = Producer(c.namesrv_addr, group="pg", connect_timeout_ms=300, send_msg_timeout_ms=1000)
            await p.start()
            assert (await p.send(Message("AioDoomedAsync", b"ok"))).status is SendStatus.SEND_OK
            c.kill_group()
            futs = [await p.send_async(Message("AioDoomedAsync", b"lost-%d" % i)) for i in range(20)]
            assert await p.flush(WAIT_S) == 0
            for f in futs:
                e = f.exception()
                assert isinstance(e, RemotingError), e
                assert "Send [3] times" in str(e) and "broker-a" in str(e), e    # 1 + 2 retries
            assert p.stats["failed_messages"] == 20 and p.stats["retries"] >= 2 * len(
                {id(f.exception()) for f in futs})
            # queued before close() and failed during its flush: close() says so
            late = [await p.send_async(Message("AioDoomedAsync", b"late-%d" % i)) for i in range(5)]
            with pytest.raises(MQClientError, match=r"5 message\(s\) queued before close\(\)"):
                await p.close()
            assert all(isinstance(f.exception(), RemotingError) for f in late)

        run(main())
    finally:
        c.close()


def test_send_async_refuses_bad_input_before_queueing(cluster):
    async def main():
        async with Producer(cluster.namesrv_addr, group="pg") as p:
            with pytest.raises(MQClientError):
                await p.send_async(Message("AioBad", b"x" * (4 * 1024 * 1024 + 1)))
            with pytest.raises(MQClientError, match="queue must be"):
                await p.send_async(Message("AioBad", b"x"), queue="not a queue")
            assert p.pending == 0
            assert await p.flush() == 0

    run(main())


def test_send_async_without_a_nameserver_fails_within_its_budget():
    """send_async with no NameServer: the future fails with "No route info" (nothing hangs)."""
    async def main():
        async with Producer("127.0.0.1:1", group="pg", send_msg_timeout_ms=300, delivery_timeout_ms=500) as p:
            fut = await p.send_async(Message("AioNoNs", b"x"))
            assert await p.flush(WAIT_S) == 0
            with pytest.raises(MQClientError, match="No route info"):
                fut.result()

    run(main())



def test_ordered_send_async_with_a_failing_selector_fails_its_future_only(cluster, rc):
    """A selector that raises (the route known, so the queue is chosen at send_async) fails that
    message's future with MQClientError; nothing is left pending, and the producer goes on."""
    create_topic(rc, cluster, "AioBadSelector", 2)

    def bad(mqs, msg, arg):
        raise ValueError("no queue for you")

    async def main():
        async with Producer(cluster.namesrv_addr, group="pg") as p:
            await asyncio.wait_for(_until_route(p, "AioBadSelector", 2), WAIT_S)
            fut = await p.send_async(Message("AioBadSelector", b"x"), selector=bad)
            with pytest.raises(MQClientError, match="selector failed: ValueError: no queue for you"):
                await asyncio.wait_for(fut, WAIT_S)
            assert await p.flush(WAIT_S) == 0 and p.pending == 0
            ok = await p.send_async(Message("AioBadSelector", b"y"), sharding_key="k")
            return await asyncio.wait_for(ok, WAIT_S)

    assert run(main()).status is SendStatus.SEND_OK


def test_a_loop_of_ordered_send_async_that_never_suspends_still_gets_answers(cluster, rc):
    """A caller that sends ordered messages in a loop that never awaits anything else, with room
    for all of them (no back-pressure wait): send_async lets the event loop run every
    ORDERED_YIELD_MS, so answers are read and each queue's next batch goes while the caller is
    still in its loop (without it, nothing at all would go before the loop ends).  Every key's
    messages are stored in order, in one queue."""
    from rmq.aio.producer import ORDERED_YIELD_MS
    assert ORDERED_YIELD_MS > 0
    create_topic(rc, cluster, "AioOrderedLoop", 4)
    keys = [f"k{i}" for i in range(4)]
    cap = 300_000

    async def main():
        done = [0]
        ticks = [0]

        def cb(fut):
            done[0] += 1

        async def ticker():
            while True:
                await asyncio.sleep(0)
                ticks[0] += 1

        async with Producer(cluster.namesrv_addr, group="pg", max_pending_messages=cap + 1) as p:
            await asyncio.wait_for(_until_route(p, "AioOrderedLoop", 4), WAIT_S)
            t = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            sent, ticks[0] = 0, 0
            while done[0] == 0 and sent < cap:      # the caller's loop: only send_async
                await p.send_async(Message("AioOrderedLoop", b"%s:%d" % (keys[sent % 4].encode(), sent)),
                                   callback=cb, sharding_key=keys[sent % 4])
                sent += 1
            in_loop = done[0], ticks[0]
            t.cancel()
            assert await p.flush(WAIT_S) == 0
            return sent, in_loop, done[0]

    sent, (done_in_loop, ticks_in_loop), done = run(main())
    assert done_in_loop > 0 and ticks_in_loop > 0 and sent < cap, (sent, done_in_loop, ticks_in_loop)
    assert done == sent
    msgs = pull_topic(rc, cluster, "AioOrderedLoop", 4, sent)
    by_key: dict = {}
    for m in sorted(msgs, key=lambda m: (m.queue_id, m.queue_offset)):
        key, i = m.body.split(b":")
        by_key.setdefault(key, []).append((m.queue_id, int(i)))
    assert sum(len(v) for v in by_key.values()) == sent
    for key, got in by_key.items():
        assert len({q for q, _ in got}) == 1, key                 # one queue a key
        assert [i for _, i in got] == sorted(i for _, i in got), key   # in the order sent


def test_a_nameserver_that_does_not_answer_is_failed_over_within_the_send_budget(cluster, rc):
    """The first NameServer of the list never answers (ZeroMQ queues the request and says
    nothing): it is waited for its share of the budget only, so the next one answers and the
    first send succeeds within ``send_msg_timeout_ms``; the one that answered is asked first from
    then on.  (Before stop 43 the first one took the whole budget every time: every send failed.)"""
    create_topic(rc, cluster, "AioNsFailover", 4)

    async def go():
        async with Producer(f"127.0.0.1:1;{cluster.namesrv_addr}", group="pg", send_msg_timeout_ms=4000) as p:
            r = await p.send(Message("AioNsFailover", b"x"))       # MQClientError if the budget ran out
            asked = p.stats["route_requests"]
            qs = await p.fetch_publish_message_queues("AioNsFailover")
            return r, asked, len(qs), p.stats["route_requests"] - asked

    r, asked, queues, more = run(go())
    assert r.status == SendStatus.SEND_OK
    assert asked == 2 and queues == 4 and more == 1
