"""A batch the producer made itself and the broker refuses as over its maxMessageSize goes again
in parts that fit (Kafka's split of a batch refused as MESSAGE_TOO_LARGE): send_async_many,
send_async_columns and send_async's batches, thread and asyncio producers, ordered and not.
A user batch (send_batch) is stored whole or not at all: its refusal stands.  The broker here
takes at most 64 KiB per batch, below the 256 KiB requests send_async_many makes by default."""
import asyncio
import os

import pytest

from rmq import Message, Producer, SendStatus
from rmq.client.producer import java_hash
from rmq.errors import MQBrokerError, SendManyError
from rmq.protocol import ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_producer import broker_put_total, create_topic, pull_topic, wait_route

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024          # the broker's maxMessageSize (bytes)
WAIT_S = 30.0
N = 3000                   # ~370 KB of 100 B messages: several times LIMIT
QUEUES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("split") / "store", conf={"maxMessageSize": str(LIMIT)})
    yield c
    c.close()


def bodies(tag: str, n: int = N) -> list:
    return [f"{tag}|{i:05d}|".encode() + b"x" * 100 for i in range(n)]


def check_stored(rc, cluster, topic: str, sent: list, keyed: bool, tag: str = "") -> None:
    """Every body sent is stored exactly once; ``keyed`` (sharding key = i % 3 for the bodies of
    ``tag``, default ``topic``): each key's bodies in one queue (select_by_hash's), in the order sent."""
    recs = pull_topic(rc, cluster, topic, QUEUES, len(sent))
    assert sorted(r.body for r in recs) == sorted(sent)
    if keyed:
        by_key: dict = {}
        prefix = (tag or topic).encode() + b"|"
        for r in sorted(recs, key=lambda r: (r.queue_id, r.queue_offset)):
            if not r.body.startswith(prefix):
                continue
            i = int(r.body.split(b"|")[1])
            by_key.setdefault(i % 3, []).append((r.queue_id, i))
        for k, got in by_key.items():
            assert {q for q, _ in got} == {abs(java_hash(k)) % QUEUES}
            assert [i for _, i in got] == sorted(i for _, i in got), f"key {k}: order broken"


@pytest.mark.parametrize("keyed", [False, True], ids=["unordered", "sharding_keys"])
def test_send_async_many_splits_a_refused_batch_and_learns_the_limit(cluster, rc, keyed):
    topic = f"SplitMany{int(keyed)}"
    create_topic(rc, cluster, topic, QUEUES)
    sent = bodies(topic)
    with Producer(cluster.namesrv_addr, group=f"pg-split-many{int(keyed)}") as p:
        wait_route(p, topic, QUEUES)
        assert p._request_size() > LIMIT                      # the default: 256 KiB
        results = p.send_async_many([Message(topic, b) for b in sent],
                                    sharding_keys=[i % 3 for i in range(N)] if keyed else None).result(WAIT_S)
        assert len(results) == N and {r.status for r in results} == {SendStatus.SEND_OK}
        split = p.stats["split_requests"]
        assert split >= 1
        assert p._request_size() == LIMIT                     # learned: later calls make parts that fit
        more = bodies(topic + "b", 1000)
        assert len(p.send_async_many([Message(topic, b) for b in more]).result(WAIT_S)) == 1000
        assert p.stats["split_requests"] == split
    check_stored(rc, cluster, topic, sent + more, keyed)


@pytest.mark.parametrize("keyed", [False, True], ids=["unordered", "sharding_keys"])
def test_send_async_columns_splits_a_refused_part(cluster, rc, keyed):
    topic = f"SplitCols{int(keyed)}"
    create_topic(rc, cluster, topic, QUEUES)
    sent = bodies(topic)
    with Producer(cluster.namesrv_addr, group=f"pg-split-cols{int(keyed)}") as p:
        wait_route(p, topic, QUEUES)
        res = p.send_async_columns(topic, sent, sharding_keys=[i % 3 for i in range(N)] if keyed else None,
                                   tags=["t"] * N).result(WAIT_S)
        assert len(res) == N and res.failed == 0
        assert p.stats["split_requests"] >= 1
        assert sorted(res.msg_ids) == sorted(set(res.msg_ids))
    check_stored(rc, cluster, topic, sent, keyed)


def test_send_async_batches_over_the_limit_are_split(cluster, rc):
    """batch_size above the broker's maxMessageSize (the client cannot know it): every future gets
    SEND_OK, and the producer's batches shrink to the limit after the first refusal."""
    topic = "SplitAsync"
    create_topic(rc, cluster, topic, QUEUES)
    sent = bodies(topic)
    with Producer(cluster.namesrv_addr, group="pg-split-async", batch_size=256 * 1024, linger_ms=200) as p:
        wait_route(p, topic, QUEUES)
        futs = [p.send_async(Message(topic, b)) for b in sent]
        assert {f.result(WAIT_S).status for f in futs} == {SendStatus.SEND_OK}
        assert p.stats["split_requests"] >= 1 and p._sender.batch_size == LIMIT
        assert p._sender._queue_turns.cap == LIMIT              # ordered requests are joined within it too
    check_stored(rc, cluster, topic, sent, False)


def test_a_user_batch_over_the_limit_is_refused_whole(cluster, rc):
    topic = "SplitUserBatch"
    create_topic(rc, cluster, topic, 1)
    with Producer(cluster.namesrv_addr, group="pg-split-user") as p:
        wait_route(p, topic, 1)
        before = broker_put_total(rc, cluster)
        direct = dict(p._direct.stats)
        with pytest.raises(MQBrokerError) as ei:
            p.send_batch([Message(topic, b) for b in bodies(topic, 1000)])
        assert ei.value.response_code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in str(ei.value)
        assert p.stats["split_requests"] == 0
        # the route is known: the batch went on the caller's thread (rmq.client.direct), was not
        # retried (MESSAGE_ILLEGAL is not retryable), and its 1,000 messages count as failed
        assert p._direct.stats["failed_messages"] - direct["failed_messages"] == 1000
        assert p._direct.stats["retries"] == direct["retries"] and p._direct.stats["messages"] == direct["messages"]
        # one message over the limit cannot be split either: its refusal stands too
        with pytest.raises(SendManyError) as ei:
            p.send_async_many([Message(topic, os.urandom(LIMIT + 1))]).result(WAIT_S)   # random: not compressed
        assert "maxMessageSize" in str(ei.value)
        assert broker_put_total(rc, cluster) == before


@pytest.mark.parametrize("keyed", [False, True], ids=["unordered", "sharding_keys"])
def test_aio_producer_splits_refused_batches(cluster, rc, keyed):
    from rmq.aio import Producer as AioProducer
    topic = f"SplitAio{int(keyed)}"
    create_topic(rc, cluster, topic, QUEUES)
    many, cols = bodies(topic + "m"), bodies(topic + "c")
    keys = [i % 3 for i in range(N)] if keyed else None

    async def main():
        async with AioProducer(cluster.namesrv_addr, group=f"pg-split-aio{int(keyed)}") as p:
            fut = await p.send_async_many([Message(topic, b) for b in many], sharding_keys=keys)
            results = await asyncio.wait_for(fut, WAIT_S)
            assert {r.status for r in results} == {SendStatus.SEND_OK}
            assert p.stats["split_requests"] >= 1 and p._request_size() == LIMIT
            fut = await p.send_async_columns(topic, cols, sharding_keys=keys)
            res = await asyncio.wait_for(fut, WAIT_S)
            assert len(res) == N and res.failed == 0
    asyncio.run(main())
    check_stored(rc, cluster, topic, many + cols, False)
    if keyed:
        for tag in (topic + "m", topic + "c"):
            check_stored(rc, cluster, topic, many + cols, True, tag)


def test_a_batch_larger_than_a_commitlog_file_is_split_to_fit(tmp_path, rc):
    """Small CommitLog files (64 KiB) under the default maxMessageSize (4 MiB): the broker says how
    large a batch one file holds (half a file's worth), and send_async_many's 256 KiB requests
    and send_async's batches are sent in parts of that size."""
    c = Cluster(tmp_path / "store", conf={"mappedFileSizeCommitLog": str(64 * 1024)})
    try:
        create_topic(rc, c, "SplitFile", QUEUES)
        sent, more = bodies("SplitFile"), bodies("SplitFileAsync", 1000)
        with Producer(c.namesrv_addr, group="pg-split-file", batch_size=200 * 1024, linger_ms=100) as p:
            wait_route(p, "SplitFile", QUEUES)
            results = p.send_async_many([Message("SplitFile", b) for b in sent]).result(WAIT_S)
            assert {r.status for r in results} == {SendStatus.SEND_OK}
            assert p.stats["split_requests"] >= 1 and 0 < p._request_size() <= 32 * 1024
            futs = [p.send_async(Message("SplitFile", b)) for b in more]
            assert {f.result(WAIT_S).status for f in futs} == {SendStatus.SEND_OK}
        check_stored(rc, c, "SplitFile", sent + more, False)
    finally:
        c.close()


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_a_part_that_still_does_not_fit_is_split_again(tmp_path, rc, client):
    """64 KiB CommitLog files and one 1 MiB request of 600 two-byte messages then 150 of 4,000 B:
    the broker names a size from the whole batch's bytes in the CommitLog per byte of body
    (about 1.1), but the first part holds only tiny messages (about 2.3), so it is refused too,
    and split again; every message is stored once, in order."""
    topic = f"SplitAgain{client}"
    c = Cluster(tmp_path / "store", conf={"mappedFileSizeCommitLog": str(64 * 1024)})
    try:
        create_topic(rc, c, topic, 1)
        sent = [i.to_bytes(2, "big") if i < 600 else f"{i:05d}|".encode() + b"L" * 3994 for i in range(750)]
        msgs = [Message(topic, b) for b in sent]
        keys = ["k"] * len(msgs)                 # one queue, ordered: the parts keep the order
        if client == "thread":
            with Producer(c.namesrv_addr, group="pg-split-again", batch_size=1024 * 1024) as p:
                wait_route(p, topic, 1)
                results = p.send_async_many(msgs, sharding_keys=keys).result(WAIT_S)
                splits = p.stats["split_requests"]
        else:
            from rmq.aio import Producer as AioProducer

            async def main():
                async with AioProducer(c.namesrv_addr, group="pg-split-again", batch_size=1024 * 1024) as p:
                    out = await asyncio.wait_for(await p.send_async_many(msgs, sharding_keys=keys), WAIT_S)
                    return out, p.stats["split_requests"]
            results, splits = asyncio.run(main())
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        assert splits >= 2
        recs = sorted(pull_topic(rc, c, topic, 1, len(sent)), key=lambda r: r.queue_offset)
        assert [r.body for r in recs] == sent
    finally:
        c.close()
