"""Ordered send_async batches held behind their queue's request out are joined, when the turn
passes, up to ``many_request_size`` (256 KiB with the default ``batch_size``), not ``batch_size``
(64 KiB): an ordered queue has one request out at a time, so what waited behind it is handed over
at once and smaller requests only cost round trips (bench/results/client.md, stop 57: ordered
send_async 1.2x at 100 B, 1.6x at 1 KiB).  Both producers, the order kept.

The queue's turn is held by SIGSTOPping the broker while the messages are handed over (the first
request is out, unanswered); the batches sealed meanwhile are held and joined after SIGCONT.
Against a broker whose CommitLog files hold less than a join, the join is split on refusal, in
order, and the cap lowered to what that broker takes."""
import asyncio
import os
import signal

import pytest

from rmq import Message, Producer
from rmq.aio import Producer as AioProducer
from rmq.client.producer_request import DEFAULT_BATCH_SIZE, MANY_REQUEST_SIZE, ProducerOptions, many_request_size
from tests.integration.cluster import Cluster
from tests.integration.test_producer import _proc_state, create_topic, pull_topic, wait_route
from tests.integration.test_broker import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0
N = 600                                   # 1 KiB messages: ~10 batches of 64 KiB, ~3 of 256 KiB
BODY = 1024


def _held_cluster(tmp_path_factory, name: str, file_size: int):
    """A broker whose requests wait in a stopped broker's queue without SYSTEM_BUSY
    [TIMEOUT_CLEAN_QUEUE], with CommitLog files of ``file_size`` bytes."""
    c = Cluster(tmp_path_factory.mktemp(name) / "store",
                conf={"waitTimeMillsInSendQueue": "600000", "mappedFileSizeCommitLog": str(file_size)})
    yield c
    c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from _held_cluster(tmp_path_factory, "ordered-join", 4 << 20)     # 4 MiB files take a join whole


def test_the_join_cap_is_the_bulk_request_size_unless_the_user_set_batch_size():
    assert DEFAULT_BATCH_SIZE < MANY_REQUEST_SIZE
    assert many_request_size(ProducerOptions()) == MANY_REQUEST_SIZE
    assert many_request_size(ProducerOptions(batch_size=8192)) == 8192          # the user's bound is kept
    assert many_request_size(ProducerOptions(max_message_size=100_000)) == 100_000  # within the broker's limit


def _bodies():
    return [b"%06d" % i + b"x" * (BODY - 6) for i in range(N)]


def _check_stored_in_order(rc, cluster, topic):
    records = pull_topic(rc, cluster, topic, 1, N + 1)
    assert [bytes(r.body) for r in records] == [b"warm-up"] + _bodies()


class _Stopped:
    """The broker SIGSTOPped inside the block (its state "T" seen first), SIGCONTed at its end."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _proc_state(self.pid) == "T", WAIT_S)
        except BaseException:
            os.kill(self.pid, signal.SIGCONT)
            raise
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def _sent(before: dict, after: dict, held0: int, held1: int, cap: int) -> dict:
    """What a run did: requests and split_requests sent, requests held for order, the join cap."""
    return {"requests": after["requests"] - before["requests"], "held": held1 - held0,
            "splits": after["split_requests"] - before["split_requests"], "cap": cap}


def _send_thread(cluster, topic, bodies) -> dict:
    with Producer(cluster.namesrv_addr, group="pg-join", send_msg_timeout_ms=int(WAIT_S * 1000)) as p:
        wait_route(p, topic, 1)
        p.send(Message(topic, b"warm-up"))
        before = p.stats
        with _Stopped(cluster.pids()["broker"]):
            futs = [p.send_async(Message(topic, b), sharding_key="k") for b in bodies]
        p.flush()
        assert [f.result(WAIT_S).queue_offset for f in futs] == list(range(1, N + 1))
        after = p.stats
        return _sent(before, after, before["held_for_order"], after["held_for_order"], p._sender._queue_turns.cap)


async def _send_aio(cluster, topic, bodies) -> dict:
    async with AioProducer(cluster.namesrv_addr, group="pg-join-aio", send_msg_timeout_ms=int(WAIT_S * 1000)) as p:
        await p.fetch_publish_message_queues(topic)
        await p.send(Message(topic, b"warm-up"))
        before, held0 = dict(p.stats), p._queue_turns.held
        with _Stopped(cluster.pids()["broker"]):
            futs = [await p.send_async(Message(topic, b), sharding_key="k") for b in bodies]
        await p.flush()
        rs = [await asyncio.wait_for(f, WAIT_S) for f in futs]
        assert [r.queue_offset for r in rs] == list(range(1, N + 1))
        return _sent(before, p.stats, held0, p._queue_turns.held, p._queue_turns.cap)


def _send(client, cluster, topic) -> dict:
    if client == "thread":
        return _send_thread(cluster, topic, _bodies())
    return asyncio.run(asyncio.wait_for(_send_aio(cluster, topic, _bodies()), 2 * WAIT_S))


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_held_ordered_batches_go_as_requests_larger_than_batch_size(cluster, rc, client):
    topic = f"OrderedJoin{client}"
    create_topic(rc, cluster, topic, 1)
    sent = _send(client, cluster, topic)
    assert sent["cap"] == MANY_REQUEST_SIZE and sent["splits"] == 0
    assert sent["held"] > 0               # batches waited behind the request out
    total = N * BODY
    # the lone first request, then what was held joined into requests of up to 256 KiB; joined up
    # to 64 KiB (before), they were at least total / 64 KiB = 9 requests
    assert sent["requests"] <= 2 + total // MANY_REQUEST_SIZE + 1 < total // DEFAULT_BATCH_SIZE, sent
    _check_stored_in_order(rc, cluster, topic)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    # 128 KiB CommitLog files: a sealed 64 KiB batch fits one, a 256 KiB join does not
    yield from _held_cluster(tmp_path_factory, "ordered-join-small", 128 << 10)


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_a_join_the_broker_refuses_as_too_large_is_split_in_order_and_the_cap_lowered(small_files, rc, client):
    """The joins of the test above, against a broker whose CommitLog file holds less than 256 KiB:
    the first joined request is refused (MESSAGE_ILLEGAL with the largest batch it takes), goes
    again in parts that keep its queue's turn, and later joins keep to that size.  Every message
    stored once, in order."""
    topic = f"OrderedJoinSmall{client}"
    create_topic(rc, small_files, topic, 1)
    sent = _send(client, small_files, topic)
    assert sent["splits"] >= 1 and sent["held"] > 0, sent
    assert sent["cap"] < 128 << 10, sent
    _check_stored_in_order(rc, small_files, topic)
