"""Claims of README.md's Clients section that had no test (issue 19, item 10), against real
processes: the producer's ``delay_time_level`` through ``Producer.send()``, and broadcasting
consumption with ``rmq.aio``."""
import asyncio
import collections
import os
import time

import pytest

from rmq import Message, Producer, PullConsumer
from rmq.client.consumer import ConsumeConcurrentlyStatus, MessageQueue
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration

# level 3 = 2 s: long enough that "not before its delay" is told apart from scheduling noise
DELAY_LEVELS = "500ms 1s 2s 3s 4s 5s 6s 7s 8s 9s 10s 20s 30s 1m 2m 3m 4m 5m"
DEADLINE_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("claims") / "store", conf={"messageDelayLevel": DELAY_LEVELS})
    yield c
    c.close()


def test_producer_send_with_delay_time_level_is_delivered_after_its_delay(cluster):
    """``Message(delay_time_level=3)`` through ``Producer.send()`` to each queue of a topic: the
    reply names the queue the producer chose (not SCHEDULE_TOPIC_XXXX's queue 2, as the broker
    answered before: caught here when the producer happened to pick another queue), the message is
    parked, then stored again in that same queue no earlier than 2 s (level 3) after the send."""
    with Producer(cluster.namesrv_addr, group="claims-pg") as p:
        warm = p.send(Message("DelayedClaims", b"warm-up"))            # creates the topic (4 queues)
        queues = [MessageQueue("DelayedClaims", warm.message_queue.broker_name, q) for q in range(4)]
        sent = {}
        for mq in queues:
            r = p.send(Message("DelayedClaims", b"later-%d" % mq.queue_id, keys=[f"delayed-{mq.queue_id}"],
                               delay_time_level=3), queue=mq)
            plain = p.send(Message("DelayedClaims", b"now-%d" % mq.queue_id), queue=mq)
            assert r.status.name == "SEND_OK" and plain.status.name == "SEND_OK"
            assert r.message_queue == mq, (r.message_queue, mq)
            sent[mq.queue_id] = r
    with PullConsumer(cluster.namesrv_addr, group="claims-cg") as c:
        for mq in queues:
            q = mq.queue_id
            want = {b"later-%d" % q, b"now-%d" % q}
            got = {}
            deadline = time.monotonic() + DEADLINE_S
            while not want <= set(got) and time.monotonic() < deadline:
                res = c.pull_block_if_not_found(mq, "*", 0, 32, timeout_ms=1000)
                got = {m.body: m for m in res.msg_found_list}
            assert want <= set(got), (q, list(got))
            assert set(got) - want <= {b"warm-up"}, (q, list(got))
            later, now = got[b"later-%d" % q], got[b"now-%d" % q]
            # the undelayed message, sent after it, is in the queue first: the delayed one came back later
            assert now.queue_offset < later.queue_offset
            assert later.properties.get("REAL_TOPIC") == "DelayedClaims" and "DELAY" not in later.properties
            assert later.properties.get("REAL_QID") == str(q)
            assert later.keys == [f"delayed-{q}"]
            # its store time is its re-put time: at least the level's delay after the producer sent it
            assert later.store_timestamp - later.born_timestamp >= 2000 - 5, (later.born_timestamp,
                                                                               later.store_timestamp)


def test_aio_broadcasting_delivers_every_message_to_every_member(cluster, tmp_path):
    """Two ``AsyncPushConsumer``s of one group with ``message_model="BROADCASTING"`` each get every
    message (nothing shared, nothing lost), and keep their offsets in their own local files
    (RocketMQ's LocalFileOffsetStore), not on the broker."""
    from rmq.aio.consumer import AsyncPushConsumer

    with Producer(cluster.namesrv_addr, group="claims-pg") as p:
        p.send(Message("BcastClaims", b"warm-up"))                 # creates the topic (4 queues)
    offsets_dir = str(tmp_path / "offsets")

    async def main():
        got = [collections.Counter(), collections.Counter()]
        members = []

        def listener_of(i):
            async def listener(msgs, ctx):
                for m in msgs:
                    got[i][m.body] += 1
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
            return listener

        for i in range(2):
            m = AsyncPushConsumer(cluster.namesrv_addr, "claims-bcast", message_model="BROADCASTING",
                                  consume_from_where="CONSUME_FROM_FIRST_OFFSET", offset_store_dir=offsets_dir,
                                  rebalance_interval_ms=300, persist_consumer_offset_interval_ms=200)
            m.subscribe("BcastClaims", "*")
            m.register_message_listener(listener_of(i))
            await m.start()
            members.append(m)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not all(len(m.assigned_message_queues("BcastClaims")) == 4 for m in members):
                assert time.monotonic() < deadline, [m.assigned_message_queues("BcastClaims") for m in members]
                await asyncio.sleep(0.05)
            with Producer(cluster.namesrv_addr, group="claims-pg") as p:
                for i in range(200):
                    await asyncio.to_thread(p.send, Message("BcastClaims", b"b%d" % i))
            want = {b"b%d" % i for i in range(200)} | {b"warm-up"}
            deadline = time.monotonic() + DEADLINE_S
            while not all(want <= set(g) for g in got) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            for m in members:
                await m.shutdown()
        return got, want, [m.client_id for m in members]

    got, want, client_ids = asyncio.run(asyncio.wait_for(main(), 3 * DEADLINE_S))
    for g in got:
        assert set(g) == want                                      # every member, every message
    # offsets: local files of this group, none committed to the broker
    files = [os.path.join(d, f) for d, _, fs in os.walk(offsets_dir) for f in fs]
    assert files, f"no local offset file under {offsets_dir}"
    with PullConsumer(cluster.namesrv_addr, group="claims-bcast", auto_commit=False) as c:
        for q in range(4):
            assert c.committed(MessageQueue("BcastClaims", "broker-a", q)) in (-1, 0, None)
