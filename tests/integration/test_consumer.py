"""Consumers against a real broker group: PullConsumer (pull, poll, seek, commit), PushConsumer
(clustering rebalance, broadcasting, orderly through a rebalance, retry / DLQ, crash redelivery),
and the asyncio variants.  Messages are sent with the raw wire helper of test_broker.py."""
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

from rmq import PullConsumer, PushConsumer
from rmq.client.consumer import (ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, MessageQueue, PullStatus,
                                 dlq_topic, retry_topic)
from rmq.client.consumer_api import BROKER_SUSPEND_MAX_TIME_MS
from rmq.client.remoting import RemotingClient
from rmq.errors import MQBrokerError, MQClientError
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.conftest import ROOT
from tests.integration.test_broker import send

pytestmark = pytest.mark.integration

# short delay levels so that retries come back in ~0.1-1 s (the broker accepts ms units)
DELAY_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s 1s 1s 1s 1s"
FAST = dict(rebalance_interval_ms=300, persist_consumer_offset_interval_ms=200, heartbeat_broker_interval_ms=1000,
            poll_name_server_interval_ms=300, consume_thread_max=4, shutdown_await_ms=5000)


# channelExpiredTimeout of the module's clusters: a member is dropped by the broker after 10 s
# without a heartbeat (FAST beats every second).  Well above a loaded machine's scheduling gaps
# (up to ~1.5 s): the tests that count on the membership staying as it is (exactly-once delivery
# with stable members, a member kept while its rebalance is blocked) must not see a live member
# expire.  The tests that need a silent member to expire have clusters of their own (cluster_with).
CHANNEL_EXPIRED_MS = 10_000


def make_cluster(store_path, **conf) -> Cluster:
    """A broker group of this module in ``store_path``: short delay levels, ``conf`` over the defaults below.

    waitTimeMillsInSendQueue: sends here are raw SEND_MESSAGEs (send_many, test_broker.send), never
    retried; under load a scheduling gap of the broker could age one past the default 200 ms and
    get it SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] (flow control is test_broker's subject, not this one's)."""
    return Cluster(store_path, conf={"messageDelayLevel": DELAY_LEVELS,
                                     "channelExpiredTimeout": str(CHANNEL_EXPIRED_MS),
                                     "waitTimeMillsInSendQueue": "600000", **conf})


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path / "store")
    yield c
    c.close()


@pytest.fixture
def cluster_with(tmp_path):
    """``cluster_with(**conf)``: the module's cluster with other broker properties (closed after the test)."""
    made = []

    def make(**conf):
        made.append(make_cluster(tmp_path / f"store-{len(made) + 1}", **conf))
        return made[-1]
    yield make
    for c in made:
        c.close()


def wait_for(pred, timeout_s=15.0, what="condition"):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"{what} not met within {timeout_s} s")


def create_topic(cluster, topic, queues=8):
    with RemotingClient() as c:
        r = c.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues}))
        assert r.code == ResponseCode.SUCCESS, r.remark

        def routed():
            r = c.invoke(cluster.namesrv.endpoint, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic}))
            return r.code == ResponseCode.SUCCESS
        wait_for(routed, what=f"route of {topic}")


def send_many(cluster, topic, bodies_queues, tags=None):
    """Send (body, queue_id) pairs; returns the stored (queue_id, queue_offset) of each."""
    out = []
    with RemotingClient() as c:
        for body, q in bodies_queues:
            r = send(c, cluster.broker, topic, body, q, tags=tags)
            assert r.code == ResponseCode.SUCCESS, r.remark
            out.append((r.fields["queueId"], r.fields["queueOffset"]))
    return out


def wait_dispatched(cluster, topic, queues, expected_total, group="probe"):
    """Wait until reput has put ``expected_total`` messages in the ConsumeQueues of ``topic``."""
    with PullConsumer(cluster.namesrv_addr, group=group, auto_commit=False) as pc:
        wait_for(lambda: sum(pc.max_offset(MessageQueue(topic, "broker-a", q)) for q in range(queues))
                 >= expected_total, what="dispatch")


def push_consumer(cluster, group, listener=None, orderly=False, topic="T", expr="*", **kw):
    opts = {**FAST, **kw}
    c = PushConsumer(cluster.namesrv_addr, group, **opts)
    c.subscribe(topic, expr)
    if orderly:
        c.register_message_listener_orderly(listener)
    else:
        c.register_message_listener(listener)
    return c


def stable_assignment(consumers, topic, n_queues):
    """Every queue owned by exactly one member and the queues spread as AllocateMessageQueueAveragely
    spreads them (sizes differ by at most one): every member has rebalanced with all the others.
    (Owning all queues between them is not enough: a member that joined and has not rebalanced yet
    owns nothing while the others still own everything.)"""
    sets = [set(c.assigned_message_queues(topic)) for c in consumers]
    sizes = [len(x) for x in sets]
    return (sum(sizes) == n_queues and len(set().union(*sets)) == n_queues
            and max(sizes) - min(sizes) <= 1)


def at_least_once(deliveries, expected):
    """Check RocketMQ's push-consumption promise over ``deliveries`` [(member, queue_id, body)], in
    delivery order: every ``expected`` body delivered (nothing lost), duplicates only in queues
    that changed owner (a rebalance redelivers from the last committed offset), and no message
    more often than once per owner change of its queue.  Returns (duplicates, moved queue ids)."""
    counts = collections.Counter(body for _, _, body in deliveries)
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} messages never delivered, e.g. {sorted(missing)[:5]}"
    owners = collections.defaultdict(set)
    handovers = collections.Counter()          # owner changes per queue, in delivery order
    last = {}
    for member, q, _ in deliveries:
        owners[q].add(member)
        if q in last and last[q] != member:
            handovers[q] += 1
        last[q] = member
    moved = {q for q, m in owners.items() if len(m) > 1}
    dup_queues = {q for _, q, body in deliveries if counts[body] > 1}
    assert dup_queues <= moved, f"duplicates in queues {sorted(dup_queues - moved)} that never changed owner"
    # bounded: a handover redelivers from the last committed offset once, so a message comes back
    # at most once per owner change of its queue (the listener here never asks for a retry)
    queue_of = {body: q for _, q, body in deliveries}
    over = {b: n for b, n in counts.items() if n - 1 > handovers[queue_of[b]]}
    assert not over, f"delivered more often than its queue changed owner: {dict(list(over.items())[:5])}"
    return sum(v - 1 for v in counts.values()), moved


# -- PullConsumer -----------------------------------------------------------------------------------
def test_pull_consumer_round_trip_tags_seek_by_time_and_commit(cluster):
    create_topic(cluster, "flights", 4)
    first = [(b"early-%d" % i, i % 4) for i in range(8)]
    with RemotingClient() as c:
        for i, (body, q) in enumerate(first):
            r = send(c, cluster.broker, "flights", body, q, tags="A" if i % 2 else "B", keys=[f"k{i}", "x"])
            assert r.code == ResponseCode.SUCCESS
    time.sleep(0.3)
    boundary = int(time.time() * 1000)      # SEARCH_OFFSET_BY_TIMESTAMP answers the nearest message:
    send_many(cluster, "flights", [(b"late-%d" % i, i % 4) for i in range(8)], tags="C")
    # a zlib-compressed body (sysFlag COMPRESSED) comes back inflated
    with RemotingClient() as c:
        r = c.invoke(cluster.broker, Frame(RequestCode.SEND_MESSAGE, fields={
            "producerGroup": "pg", "topic": "flights", "queueId": 3, "sysFlag": 0x1, "properties": {"TAGS": "Z"},
            "bornTimestamp": int(time.time() * 1000)}, bodies=[zlib.compress(b"inflated " * 100)]))
        assert r.code == ResponseCode.SUCCESS
    wait_dispatched(cluster, "flights", 4, 17)

    with PullConsumer(cluster.namesrv_addr, group="cg") as c:
        mqs = c.fetch_subscribe_message_queues("flights")
        assert mqs == [MessageQueue("flights", "broker-a", q) for q in range(4)]
        seen = {}
        for mq in mqs:
            res = c.pull(mq, "*", offset=0, max_nums=32)
            assert res.pull_status is PullStatus.FOUND
            assert res.min_offset == 0 and res.next_begin_offset == res.max_offset == len(res.msg_found_list)
            for m in res.msg_found_list:
                assert m.queue_id == mq.queue_id and m.topic == "flights"
                assert m.msg_id and m.store_timestamp >= m.born_timestamp > 0
                seen[m.body] = m
            assert [m.queue_offset for m in res.msg_found_list] == list(range(len(res.msg_found_list)))
        assert seen[b"early-3"].tags == "A" and seen[b"early-3"].keys == ["k3", "x"]
        assert seen[b"early-3"].properties["KEYS"] == "k3 x"
        assert seen[b"inflated " * 100].tags == "Z"
        # tag filter: exact tags only
        res = c.pull(mqs[1], "A || C", offset=0)
        assert sorted(m.body for m in res.msg_found_list) == [b"early-1", b"early-5", b"late-1", b"late-5"]
        assert c.pull(mqs[1], "nope", offset=0).pull_status in (PullStatus.NO_MATCHED_MSG, PullStatus.FOUND)
        assert c.pull(mqs[1], "*", offset=4).pull_status is PullStatus.NO_NEW_MSG
        assert c.pull(mqs[1], "*", offset=99).pull_status is PullStatus.OFFSET_ILLEGAL
        assert c.min_offset(mqs[0]) == 0 and c.max_offset(mqs[0]) == 4
        with pytest.raises(MQBrokerError):
            c.pull(MessageQueue("NoSuchTopic", "broker-a", 0), "*", 0)

        # assign + seek_by_time + poll: only what was stored after the boundary
        c.assign(mqs)
        for mq in mqs:
            assert c.seek_by_time(mq, boundary) == 2
        got = []
        wait_for(lambda: got.extend(c.poll(500)) or len(got) >= 9, what="poll after seek")
        assert sorted(m.body for m in got) == sorted([b"late-%d" % i for i in range(8)] + [b"inflated " * 100])
        assert c.poll(100) == []
        c.commit_sync()
        assert [c.committed(mq) for mq in mqs] == [4, 4, 4, 5]
        c.seek(mqs[0], 0)
        assert [m.body for m in c.poll(1000)] == [b"early-0", b"early-4", b"late-0", b"late-4"]
    # auto commit on close stored the position
    with PullConsumer(cluster.namesrv_addr, group="cg") as c:
        assert c.committed(mqs[0]) == 4


def test_pull_consumer_poll_long_polls_all_assigned_queues(cluster):
    create_topic(cluster, "LP", 4)
    with PullConsumer(cluster.namesrv_addr, group="lp") as c:
        mqs = c.fetch_subscribe_message_queues("LP")
        c.assign(mqs)
        t0 = time.monotonic()
        assert c.poll(300) == [] and time.monotonic() - t0 >= 0.25
        timer = threading.Timer(0.3, lambda: send_many(cluster, "LP", [(b"wake", 2)]))
        timer.start()
        t0 = time.monotonic()
        got = c.poll(60_000)
        elapsed = time.monotonic() - t0
        timer.join()
        assert [m.body for m in got] == [b"wake"] and got[0].queue_id == 2
        # a parked pull that is not woken is answered when its hold expires, BROKER_SUSPEND_MAX_TIME_MS
        # (15 s) after it was parked; the message (sent 0.3 s in) came well before: the send woke it
        assert elapsed < BROKER_SUSPEND_MAX_TIME_MS / 1000 - 3, f"the parked pull was not woken ({elapsed:.1f} s)"
        assert c.position(mqs[2]) == 1
        res = c.pull_block_if_not_found(mqs[2], "*", 1, timeout_ms=300)
        assert res.pull_status is PullStatus.NO_NEW_MSG



@pytest.mark.parametrize("aio", [False, True], ids=["thread", "asyncio"])
def test_poll_prefetches_the_next_page_and_seek_or_reassign_discards_it(cluster, aio):
    """poll() leaves the next page of each queue in flight (Kafka's fetcher prefetch) without
    moving the position past what it returned; a seek or a new assignment after it reads from
    the new position with the new subscription, never from the prefetched page."""
    create_topic(cluster, "PF", 1)
    send_many(cluster, "PF", [(b"a%d" % i, 0) for i in range(0, 40, 2)], tags="a")
    send_many(cluster, "PF", [(b"b%d" % i, 0) for i in range(1, 40, 2)], tags="b")
    wait_dispatched(cluster, "PF", 1, 40)

    def bodies(msgs):
        return [m.body for m in msgs]

    async def scenario(c, call):
        mq = (await call(c.fetch_subscribe_message_queues("PF")))[0]
        c.assign([mq])
        first = await call(c.poll(5000))
        assert [m.queue_offset for m in first] == list(range(10))           # pull_batch_size 10
        assert mq in c._inflight                                            # the next page is on its way
        assert await call(c.position(mq)) == 10                             # not counted before it is returned
        assert [m.queue_offset for m in await call(c.poll(5000))] == list(range(10, 20))   # the prefetched page
        c.seek(mq, 3)
        assert [m.queue_offset for m in await call(c.poll(5000))] == list(range(3, 13))
        c.assign([mq], "b")                                                 # same queue, a tag filter now
        got = await call(c.poll(5000))
        assert got and all(m.tags == "b" for m in got) and got[0].queue_offset >= 13
        assert bodies(got) == [b"b%d" % i for i in range(1, 40, 2)][:len(got)]  # a-tagged 13..19 skipped

    run_poll_scenario(cluster, aio, "pf", 10, scenario, 60)


def run_poll_scenario(cluster, aio: bool, group: str, batch: int, scenario, timeout_s: float) -> None:
    """``scenario(consumer, call)`` on a PullConsumer (``aio``: an AsyncPullConsumer, group
    ``group + "-aio"``) of ``group`` reading from the first offset, ``batch`` messages a pull;
    ``call(x)`` awaits what the asyncio consumer returns and passes the thread one's through."""
    from rmq.aio.consumer import AsyncPullConsumer

    async def call(x):
        return await x if asyncio.iscoroutine(x) else x

    if aio:
        async def run():
            async with AsyncPullConsumer(cluster.namesrv_addr, group=f"{group}-aio", pull_batch_size=batch,
                                         consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
                await scenario(c, call)
        asyncio.run(asyncio.wait_for(run(), timeout_s))
    else:
        with PullConsumer(cluster.namesrv_addr, group=group, pull_batch_size=batch,
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
            asyncio.run(scenario(c, call))


@pytest.mark.parametrize("aio", [False, True], ids=["thread", "aio"])
def test_poll_pages_stay_contiguous_per_queue_through_early_prefetches_and_seeks(cluster, aio):
    """A queue's next page is asked for as soon as its answer is taken, and an answer that comes
    back within the same poll waits for the next one: whatever the timing, every queue's messages
    come in offset order without a gap or a repeat, and a seek is obeyed at once (a page fetched
    or held before it is never returned)."""
    import random

    queues, per_queue, max_seeks = 4, 300, 40
    create_topic(cluster, "PFC", queues)
    send_many(cluster, "PFC", [(b"%d-%d" % (q, i), q) for i in range(per_queue) for q in range(queues)])
    wait_dispatched(cluster, "PFC", queues, queues * per_queue)
    rnd = random.Random(7)

    async def scenario(c, call):
        mqs = sorted(await call(c.fetch_subscribe_message_queues("PFC")), key=lambda mq: mq.queue_id)
        c.assign(mqs)
        want = {mq.queue_id: 0 for mq in mqs}
        seeks = 0
        # how many pages one poll returns depends on the timing (a slow machine: one page): the
        # seeks are counted, not drawn per poll, so that the end is reached whatever the timing
        # (with a seek drawn per poll and one page a poll, a queue's progress is set back about
        # as fast as it is made).  At most 1,200 + 40 x 300 messages are read.
        deadline = time.monotonic() + 90
        while not all(v >= per_queue for v in want.values()) and time.monotonic() < deadline:
            for m in await call(c.poll(5000)):
                assert m.queue_offset == want[m.queue_id], (m.queue_id, m.queue_offset, want)
                assert m.body == b"%d-%d" % (m.queue_id, m.queue_offset)
                want[m.queue_id] += 1
            if seeks < max_seeks and rnd.random() < 0.2:     # back to an earlier offset of one queue
                mq = rnd.choice(mqs)
                to = rnd.randrange(0, max(1, want[mq.queue_id]))
                c.seek(mq, to)
                want[mq.queue_id] = to
                seeks += 1
        assert all(v >= per_queue for v in want.values()) and seeks, (want, seeks)

    run_poll_scenario(cluster, aio, "pfc", 16, scenario, 120)


# -- PushConsumer, clustering ------------------------------------------------------------------------
def test_three_push_consumers_share_all_queues_without_gaps_or_duplicates(cluster):
    create_topic(cluster, "T", 8)
    counts = collections.Counter()
    owner = {}
    lock = threading.Lock()

    def make_listener(name):
        def listener(msgs, ctx):
            with lock:
                for m in msgs:
                    counts[m.body] += 1
                    owner.setdefault(m.queue_id, set()).add(name)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        return listener

    consumers = [push_consumer(cluster, "share", make_listener(i)) for i in range(3)]
    try:
        for c in consumers:
            c.start()
        wait_for(lambda: stable_assignment(consumers, "T", 8), what="stable assignment")
        sizes = sorted(len(c.assigned_message_queues("T")) for c in consumers)
        assert sizes == [2, 3, 3]                       # AllocateMessageQueueAveragely of 8 over 3
        n = 1600
        send_many(cluster, "T", [(b"%d" % i, i % 8) for i in range(n)])
        wait_for(lambda: len(counts) == n, what="all messages consumed")
        wait_for(lambda: sum(c.stats["consumed_ok"] for c in consumers) >= n, what="every listener call counted")
        # a counted message has its offset committed in memory already (a shutdown or rebalance
        # right after the count persists it): checked at once, no waiting
        for c in consumers:
            for mq in c.assigned_message_queues("T"):
                assert c.offset_store.read_memory(mq) == n // 8, (mq, c.offset_store.read_memory(mq))
        assert set(counts) == {b"%d" % i for i in range(n)}             # no gaps
        # the membership stayed as it was (no member expired, no queue moved): only then is each
        # message delivered exactly once -- at-least-once allows redelivery after a rebalance
        assert all(len(v) == 1 for v in owner.values()), owner          # one owner per queue
        assert stable_assignment(consumers, "T", 8)
        dups = {k: v for k, v in counts.items() if v > 1}
        assert not dups, f"{len(dups)} duplicates with stable membership"
        assert sum(c.stats["consumed_ok"] for c in consumers) == n
        # what the periodic persist does: the broker holds every final offset before a member
        # leaves.  Each shutdown below hands queues between the members left (3 -> 2 moves two
        # queues), and a member taking a queue reads its offset from the broker while the one
        # giving it up persists it: without this, a held pull's older commitOffset could be what
        # is read, and that member's own shutdown would persist it (a redelivery, at-least-once)
        for c in consumers:
            c.offset_store.persist_all(c.assigned_message_queues("T"), force=True)
    finally:
        for c in consumers:
            c.shutdown()
    # offsets committed on shutdown: every queue at its end (no late pull commit moved one back)
    with PullConsumer(cluster.namesrv_addr, group="share", auto_commit=False) as pc:
        ends = {q: (pc.committed(MessageQueue("T", "broker-a", q)), pc.max_offset(MessageQueue("T", "broker-a", q)))
                for q in range(8)}
    assert all(ends[q] == (n // 8, n // 8) for q in range(8)), f"(committed, max) by queue: {ends}"


def test_membership_changes_redeliver_but_never_lose(cluster):
    create_topic(cluster, "T", 8)
    counts = collections.Counter()
    lock = threading.Lock()

    def listener(msgs, ctx):
        time.sleep(0.001)
        with lock:
            for m in msgs:
                counts[m.body] += 1

    stop = threading.Event()
    sent = []

    def producer():
        with RemotingClient() as c:
            i = 0
            while not stop.is_set():
                body = b"%d" % i
                assert send(c, cluster.broker, "T", body, i % 8).code == ResponseCode.SUCCESS
                sent.append(body)
                i += 1
                time.sleep(0.002)

    a = push_consumer(cluster, "churn", listener).start()
    t = threading.Thread(target=producer)
    t.start()
    others = []
    try:
        time.sleep(0.5)
        others = [push_consumer(cluster, "churn", listener).start() for _ in range(2)]
        wait_for(lambda: stable_assignment([a, *others], "T", 8), what="3-member assignment")
        time.sleep(0.3)
        others[0].shutdown()                        # leaves: its queues move to the others
        # (at once on its unregister; should that request time out on a loaded machine, once the
        # broker expires the member: CHANNEL_EXPIRED_MS and a scan later)
        wait_for(lambda: stable_assignment([a, others[1]], "T", 8), timeout_s=30, what="2-member assignment")
        time.sleep(0.3)
    finally:
        stop.set()
        t.join()
    try:
        wait_for(lambda: set(sent) <= set(counts), what="every sent message consumed")
        redelivered = sum(v - 1 for v in counts.values())
        print(f"membership churn: {len(sent)} sent, {redelivered} redelivered")
    finally:
        for c in (a, *others):
            c.shutdown()


def test_offsets_committed_on_shutdown_resume_in_next_member(cluster):
    create_topic(cluster, "T", 4)
    first, second = [], []
    c1 = push_consumer(cluster, "resume", lambda msgs, ctx: first.extend(m.body for m in msgs)).start()
    try:
        wait_for(lambda: len(c1.assigned_message_queues("T")) == 4, what="assignment")
        send_many(cluster, "T", [(b"a%d" % i, i % 4) for i in range(40)])
        wait_for(lambda: len(first) == 40, what="first batch")
    finally:
        c1.shutdown()
    send_many(cluster, "T", [(b"b%d" % i, i % 4) for i in range(20)])
    c2 = push_consumer(cluster, "resume", lambda msgs, ctx: second.extend(m.body for m in msgs)).start()
    try:
        wait_for(lambda: len(second) >= 20, what="second batch")
        time.sleep(0.3)
        assert sorted(second) == sorted(b"b%d" % i for i in range(20))
    finally:
        c2.shutdown()


def test_push_consumer_tag_filter_and_batch_listener(cluster):
    create_topic(cluster, "T", 2)
    got = []
    sizes = []

    def listener(msgs, ctx):
        sizes.append(len(msgs))
        got.extend((m.tags, m.body) for m in msgs)
        return "CONSUME_SUCCESS"
    c = push_consumer(cluster, "tags", listener, expr="A || B", consume_message_batch_max_size=8,
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET").start()
    try:
        with RemotingClient() as rc:
            for i in range(60):
                assert send(rc, cluster.broker, "T", b"%d" % i, i % 2, tags="ABC"[i % 3]).code == 0
        wait_for(lambda: len(got) == 40, what="tagged messages")
        time.sleep(0.3)
        assert len(got) == 40 and {t for t, _ in got} == {"A", "B"}
        assert max(sizes) <= 8
    finally:
        c.shutdown()


# -- orderly -----------------------------------------------------------------------------------------
def test_orderly_keeps_per_key_order_through_a_rebalance(cluster):
    create_topic(cluster, "O", 8)
    keys = [f"order-{k}" for k in range(12)]
    per_key = 70
    log = []
    lock = threading.Lock()
    concurrent_queue = []
    active = collections.Counter()

    def make_listener(name):
        def listener(msgs, ctx):
            q = ctx.message_queue.queue_id
            with lock:
                active[q] += 1
                if active[q] > 1:
                    concurrent_queue.append(q)
            time.sleep(0.002)
            with lock:
                for m in msgs:
                    key, seq = m.body.decode().rsplit(":", 1)
                    log.append((key, int(seq), name))
                active[q] -= 1
            return ConsumeOrderlyStatus.SUCCESS
        return listener

    def send_range(lo, hi):
        with RemotingClient() as c:
            for seq in range(lo, hi):
                for key in keys:
                    q = zlib.crc32(key.encode()) % 8          # queue chosen by the sharding key
                    assert send(c, cluster.broker, "O", f"{key}:{seq}".encode(), q).code == 0

    a = push_consumer(cluster, "ord", make_listener("a"), orderly=True, topic="O").start()
    b = c = None
    try:
        wait_for(lambda: len(a.assigned_message_queues("O")) == 8, what="a owns all")
        send_range(0, 20)
        sender = threading.Thread(target=send_range, args=(20, 40))      # in flight while b joins
        sender.start()
        b = push_consumer(cluster, "ord", make_listener("b"), orderly=True, topic="O").start()
        wait_for(lambda: stable_assignment([a, b], "O", 8), what="a and b share")
        sender.join()
        sender = threading.Thread(target=send_range, args=(40, 60))      # in flight while c joins
        sender.start()
        c = push_consumer(cluster, "ord", make_listener("c"), orderly=True, topic="O").start()
        wait_for(lambda: stable_assignment([a, b, c], "O", 8), what="a, b and c share")
        sender.join()
        send_range(60, per_key)
        wait_for(lambda: len(log) >= len(keys) * per_key, what="all ordered messages")
        time.sleep(0.3)
    finally:
        for x in (a, b, c):
            if x is not None:
                x.shutdown()
    by_key = collections.defaultdict(list)
    owners = collections.defaultdict(set)
    for key, seq, name in log:
        by_key[key].append(seq)
        owners[key].add(name)
    redelivered = 0
    for key in keys:
        seqs = by_key[key]
        assert sorted(set(seqs)) == list(range(per_key)), f"{key} lost messages: {seqs[:80]}"
        # order per key: consecutive runs; a new run may only restart at or before where the last
        # one ended (a new owner redelivers from the committed offset), and only if the queue moved
        for prev, cur in zip(seqs, seqs[1:]):
            if cur != prev + 1:
                assert cur <= prev and len(owners[key]) > 1, f"{key} out of order at {prev} -> {cur}: {seqs[:80]}"
                redelivered += prev - cur + 1
    print(f"\norderly through two rebalances: {len(log)} deliveries, {redelivered} redelivered")
    assert not concurrent_queue, f"queues consumed by two listeners at once: {concurrent_queue}"
    assert len({name for _, _, name in log}) == 3


def test_orderly_suspend_retries_locally_in_order(cluster):
    create_topic(cluster, "O", 1)
    seen = []
    fails = {b"1": 2}

    def listener(msgs, ctx):
        m = msgs[0]
        seen.append((m.body, m.reconsume_times))
        if fails.get(m.body, 0) > 0:
            fails[m.body] -= 1
            ctx.suspend_current_queue_time_millis = 50
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS
    x = push_consumer(cluster, "ordsus", listener, orderly=True, topic="O").start()
    try:
        wait_for(lambda: x.assigned_message_queues("O"), what="assignment")
        send_many(cluster, "O", [(b"%d" % i, 0) for i in range(4)])
        wait_for(lambda: [b for b, _ in seen][-1:] == [b"3"], what="all consumed")
        assert seen == [(b"0", 0), (b"1", 0), (b"1", 1), (b"1", 2), (b"2", 0), (b"3", 0)]
    finally:
        x.shutdown()


# test_heartbeats_go_on_while_a_rebalance_is_blocked: a member beating every 0.5 s on a broker that
# drops it after 4 s of silence.  A live member is dropped only by a heartbeat gap of 3.5 s (a
# loaded machine's scheduling gaps are shorter); one whose beats stopped with its rebalance is
# dropped within 4 s + a scan (a quarter of it) of the block, well inside the 2 x 4 s observed.
HB_EXPIRED_MS, HB_INTERVAL_MS = 4000, 500


def test_heartbeats_go_on_while_a_rebalance_is_blocked(cluster_with):
    """A rebalance stuck for longer than the broker's channelExpiredTimeout (4 s here; e.g. a slow
    allocate strategy, a NameServer call, a loaded machine) must not let the broker expire the
    member: heartbeats run apart from rebalancing (RocketMQ's MQClientInstance)."""
    from rmq.client.consumer_api import ConsumerAPI

    cluster = cluster_with(channelExpiredTimeout=str(HB_EXPIRED_MS))
    create_topic(cluster, "HB", 2)
    entered, release = threading.Event(), threading.Event()
    calls = []

    def slow_strategy(group, cid, mqs, cids):
        calls.append(cid)
        if len(calls) == 2:                      # the first periodic rebalance after start: blocks
            entered.set()
            release.wait(60)
        return mqs if cids and cid == cids[0] else []

    x = push_consumer(cluster, "hb", lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS, topic="HB",
                      allocate_strategy=slow_strategy, heartbeat_broker_interval_ms=HB_INTERVAL_MS)
    api = ConsumerAPI(cluster.namesrv_addr)
    try:
        x.start()
        assert entered.wait(60), "the rebalance never reached the strategy"
        blocked_at = time.monotonic()
        # observe the broker's member list for 2 x channelExpiredTimeout while the rebalance is stuck
        seen = []
        while time.monotonic() - blocked_at < 2 * HB_EXPIRED_MS / 1000:
            seen.append(x.client_id in api.consumer_id_list(cluster.broker_addr, "hb"))
            time.sleep(0.25)
        assert release.is_set() is False and len(calls) == 2            # still blocked all along
        assert seen and all(seen), f"the member expired while its rebalance was blocked: {seen}"
    finally:
        release.set()
        api.close()
        x.shutdown()


# -- broadcasting ------------------------------------------------------------------------------------
def test_broadcasting_delivers_every_message_to_every_member(cluster, tmp_path):
    create_topic(cluster, "B", 4)
    got = [collections.Counter() for _ in range(3)]
    offsets_dir = str(tmp_path / "offsets")

    def make_listener(i):
        def listener(msgs, ctx):
            for m in msgs:
                got[i][m.body] += 1
        return listener
    members = [push_consumer(cluster, "bcast", make_listener(i), topic="B", message_model="BROADCASTING",
                             instance_name=f"member{i}", offset_store_dir=offsets_dir) for i in range(3)]
    try:
        for m in members:
            m.start()
        wait_for(lambda: all(len(m.assigned_message_queues("B")) == 4 for m in members), what="every member")
        assert all(not m.assigned_message_queues(retry_topic("bcast")) for m in members)
        send_many(cluster, "B", [(b"%d" % i, i % 4) for i in range(200)])
        wait_for(lambda: all(len(g) == 200 for g in got), what="every member has all")
        assert all(set(g.values()) == {1} for g in got)
    finally:
        for m in members:
            m.shutdown()
    for i, m in enumerate(members):
        with open(m.offset_store.store_path) as f:
            table = json.load(f)["offsetTable"]
        assert os.path.dirname(os.path.dirname(os.path.dirname(m.offset_store.store_path))) == offsets_dir
        assert table == {f"B/broker-a/{q}": 50 for q in range(4)}
    # a restarted member with the same instance name resumes from its local offsets
    again = []
    r = push_consumer(cluster, "bcast", lambda msgs, ctx: again.extend(m.body for m in msgs), topic="B",
                      message_model="BROADCASTING", instance_name="member0", offset_store_dir=offsets_dir).start()
    try:
        send_many(cluster, "B", [(b"new", 1)])
        wait_for(lambda: again, what="new message")
        time.sleep(0.3)
        assert again == [b"new"]
    finally:
        r.shutdown()


# -- retry and DLQ -----------------------------------------------------------------------------------
def test_failed_messages_go_to_retry_then_dlq(cluster):
    create_topic(cluster, "T", 2)
    deliveries = collections.defaultdict(list)
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            for m in msgs:
                deliveries[m.body].append((m.reconsume_times, m.topic))
        return ConsumeConcurrentlyStatus.RECONSUME_LATER
    x = push_consumer(cluster, "dlqg", listener, max_reconsume_times=2).start()
    bodies = [b"fail-%d" % i for i in range(3)]
    try:
        wait_for(lambda: len(x.assigned_message_queues("T")) == 2, what="assignment")
        send_many(cluster, "T", [(b, i % 2) for i, b in enumerate(bodies)])
        # original delivery + 2 retries (levels 3 and 4: 300 ms and 400 ms here), then the DLQ
        wait_for(lambda: all(len(deliveries[b]) >= 3 for b in bodies), timeout_s=20, what="3 deliveries each")
        with PullConsumer(cluster.namesrv_addr, group="dlq-reader") as pc:
            def dlq_msgs():
                try:
                    mqs = pc.fetch_subscribe_message_queues(dlq_topic("dlqg"))
                except Exception:
                    return None
                out = [m for mq in mqs for m in pc.pull(mq, "*", 0).msg_found_list]
                return out if len(out) == len(bodies) else None
            dead = wait_for(dlq_msgs, timeout_s=15, what="DLQ copies")
        time.sleep(0.5)
        assert x.assigned_message_queues(retry_topic("dlqg"))
    finally:
        x.shutdown()
    for b in bodies:
        assert deliveries[b] == [(0, "T"), (1, "T"), (2, "T")], deliveries[b]
    assert sorted(m.body for m in dead) == bodies
    for m in dead:
        assert m.topic == dlq_topic("dlqg") and m.properties["RETRY_TOPIC"] == "T"
        assert m.reconsume_times == 3 and m.properties.get("ORIGIN_MESSAGE_ID")


def test_retry_redelivers_with_original_topic_then_succeeds(cluster):
    create_topic(cluster, "T", 1)
    seen = []

    def listener(msgs, ctx):
        m = msgs[0]
        seen.append((m.body, m.topic, m.reconsume_times, m.properties.get("RETRY_TOPIC")))
        return "RECONSUME_LATER" if m.reconsume_times == 0 else "CONSUME_SUCCESS"
    x = push_consumer(cluster, "retryg", listener).start()
    try:
        wait_for(lambda: x.assigned_message_queues("T"), what="assignment")
        send_many(cluster, "T", [(b"once", 0)])
        wait_for(lambda: len(seen) == 2, what="redelivery")
        time.sleep(0.5)
        assert seen == [(b"once", "T", 0, None), (b"once", "T", 1, "T")]
    finally:
        x.shutdown()


@pytest.mark.parametrize("aio", [False, True], ids=["thread", "aio"])
def test_shutdown_persists_every_offset_over_a_late_pull_commit(cluster, aio):
    """A long-polling pull carries the offset of its time (commitOffset) and can reach the broker
    after a later persist of a higher one (another connection): the broker never lets it move the
    offset back.  An UPDATE_CONSUMER_OFFSET does (a stale persist, an admin's); the offset is then
    unchanged in the consumer, which persisted it already, and shutdown persists every offset
    anyway (RocketMQ's persistAll)."""
    from rmq.aio.consumer import AsyncPushConsumer
    from rmq.client.consumer_api import SubscriptionData, build_pull_frame
    create_topic(cluster, "T", 1)
    mq = MessageQueue("T", "broker-a", 0)
    seen = []
    send_many(cluster, "T", [(b"%d" % i, 0) for i in range(5)])

    def late_commit():
        with RemotingClient() as rc:
            frame = build_pull_frame("late", mq, 5, 1, SubscriptionData.build("T", "*"), 3, 0)
            assert rc.invoke(cluster.broker, frame).code == ResponseCode.PULL_NOT_FOUND
        with PullConsumer(cluster.namesrv_addr, group="late", auto_commit=False) as pc:
            assert pc.committed(mq) == 5                  # the late pull's 3: refused
            pc.api.update_consumer_offset("late", mq, 3)
            assert pc.committed(mq) == 3

    def committed():
        with PullConsumer(cluster.namesrv_addr, group="late", auto_commit=False) as pc:
            return pc.committed(mq)

    if not aio:
        x = push_consumer(cluster, "late", lambda msgs, ctx: seen.extend(msgs),
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET").start()
        try:
            wait_for(lambda: x.offset_store.read_memory(mq) == 5, what="5 consumed")
            x.offset_store.persist_all([mq])
            assert committed() == 5
            late_commit()
        finally:
            x.shutdown()
    else:
        async def listener(msgs, ctx):
            seen.extend(msgs)

        async def main():
            c = AsyncPushConsumer(cluster.namesrv_addr, "late", **{**FAST, "consume_from_where":
                                                                      "CONSUME_FROM_FIRST_OFFSET"})
            c.subscribe("T", "*")
            c.register_message_listener(listener)
            await c.start()
            try:
                await asyncio.to_thread(wait_for, lambda: c.offset_store.read_memory(mq) == 5, what="5 consumed")
                await c.offsets.persist_all([mq])
                assert await asyncio.to_thread(committed) == 5
                await asyncio.to_thread(late_commit)
            finally:
                await c.shutdown()
        asyncio.run(asyncio.wait_for(main(), 90))
    assert len(seen) == 5 and committed() == 5


@pytest.mark.parametrize("aio", [False, True], ids=["thread", "aio"])
def test_flow_control_holds_pulls_while_the_queue_is_full_and_resumes_them(cluster, aio, monkeypatch):
    """pull_threshold_for_queue (RocketMQ's flow control): while the listeners hold a queue's
    messages no pull goes out once the process queue is past the threshold; when they let go the
    held pull resumes at once (ProcessQueue.notify_when_below), not a fixed delay later: the
    delay is made 60 s here, so it is the only way on.  Every message is consumed, once."""
    import rmq.client.consumer
    from rmq.aio.consumer import AsyncPushConsumer
    # the one rule of both consumers (PushConsumerCalls._pull_gate / _held_for_room) reads it here
    monkeypatch.setattr(rmq.client.consumer, "PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL", 60_000)
    # a topic and group of each run's own: the other run's consumer, just shut down, must not be
    # in this group's rebalance (a queue handed away and back would start a second pull loop)
    topic, group = ("FlowA", "flow-aio") if aio else ("FlowT", "flow-thread")
    create_topic(cluster, topic, 1)
    n, batch, threshold = 200, 16, 20
    send_many(cluster, topic, [(b"%d" % i, 0) for i in range(n)])
    wait_dispatched(cluster, topic, 1, n)
    mq = MessageQueue(topic, "broker-a", 0)
    opts = {**FAST, "consume_from_where": "CONSUME_FROM_FIRST_OFFSET", "pull_batch_size": batch,
            "pull_threshold_for_queue": threshold}
    seen = collections.Counter()

    def held(c):
        pq = c.process_queue_table.get(mq)
        return pq is not None and pq.msg_count > threshold and c.stats["flow_control"] >= 1

    def check_held(c):
        # the held queue's own pulls: every pull of it, sent or held back, goes through the gate
        # (_pull_gate), which stamps pq.last_pull_timestamp.  (Not stats["pulls"]: it counts the
        # pulls of the group's retry topic too, whose first long poll may go out only now when
        # the start was slowed down by a loaded machine.)
        pq = c.process_queue_table[mq]
        last_pull, count = pq.last_pull_timestamp, pq.msg_count
        time.sleep(0.3)
        assert pq.last_pull_timestamp == last_pull, "a pull went out while the process queue was full"
        assert c.process_queue_table[mq] is pq and pq.msg_count == count <= threshold + batch

    if not aio:
        release = threading.Event()

        def listener(msgs, ctx):
            release.wait(30)
            seen.update(m.body for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        c = PushConsumer(cluster.namesrv_addr, group, **opts)
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        c.start()
        try:
            wait_for(lambda: held(c), what="flow control")
            check_held(c)
            release.set()
            wait_for(lambda: len(seen) == n, what="every message consumed")
            stats = dict(c.stats)
        finally:
            c.shutdown()
    else:
        async def main():
            release = asyncio.Event()

            async def listener(msgs, ctx):
                await release.wait()
                seen.update(m.body for m in msgs)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
            c = AsyncPushConsumer(cluster.namesrv_addr, group, **opts)
            c.subscribe(topic, "*")
            c.register_message_listener(listener)
            await c.start()
            try:
                deadline = time.monotonic() + 15
                while not held(c):
                    assert time.monotonic() < deadline, "no flow control within 15 s"
                    await asyncio.sleep(0.02)
                await asyncio.to_thread(check_held, c)
                release.set()
                deadline = time.monotonic() + 15
                while len(seen) < n:
                    assert time.monotonic() < deadline, f"{len(seen)} of {n} consumed"
                    await asyncio.sleep(0.02)
                return dict(c.stats)
            finally:
                await c.shutdown()
        stats = asyncio.run(asyncio.wait_for(main(), 90))
    assert set(seen) == {b"%d" % i for i in range(n)} and set(seen.values()) == {1}
    # one pull per page found (n / batch) plus the long polls at the end: never a second pull
    # of the queue in flight beside a held one
    assert stats["pulls"] <= n // batch + 4, stats


def _answers_listener(seen: dict):
    """A listener (sync) answering by body: raise, junk, None, the status's name; success on a
    redelivery."""
    lock = threading.Lock()

    def listener(msgs, ctx):
        m = msgs[0]
        with lock:
            seen[m.body].append(m.reconsume_times)
        if m.reconsume_times:
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        if m.body == b"raise":
            raise RuntimeError("listener bug")
        return {b"junk": 42, b"none": None, b"name": "CONSUME_SUCCESS"}[m.body]
    return listener


def _answers_judged(cluster, seen: dict, stats: dict, offset) -> None:
    send_many(cluster, "T", [(b, 0) for b in (b"raise", b"junk", b"none", b"name")])
    wait_for(lambda: len(seen[b"raise"]) == 2 and len(seen[b"junk"]) == 2, what="both redelivered")
    wait_for(lambda: offset() == 4, what="offset past all 4")
    # the offset passes a message only after its outcome: two failures were sent back, no more
    assert stats["sent_back"] == 2 and stats["consumed_failed"] == 2
    assert dict(seen) == {b"raise": [0, 1], b"junk": [0, 1], b"none": [0], b"name": [0]}


def test_listener_answers_raise_junk_none_and_names_are_judged_per_request(cluster):
    """A consume run's listener outcomes: an exception and an answer that is no status are
    RECONSUME_LATER (redelivered once, from the retry topic); None and the status's name are
    success (never redelivered)."""
    create_topic(cluster, "T", 1)
    seen = collections.defaultdict(list)
    x = push_consumer(cluster, "answersg", _answers_listener(seen)).start()
    try:
        wait_for(lambda: x.assigned_message_queues("T"), what="assignment")
        _answers_judged(cluster, seen, x.stats, lambda: x.offset_store.read_memory(MessageQueue("T", "broker-a", 0)))
    finally:
        x.shutdown()


def test_async_listener_answers_are_judged_as_the_thread_consumers(cluster):
    """rmq.aio's consume run (a coroutine listener: its own loop) judges the same answers the same way."""
    from rmq.aio.consumer import AsyncPushConsumer
    create_topic(cluster, "T", 1)
    seen = collections.defaultdict(list)
    sync_listener = _answers_listener(seen)

    async def listener(msgs, ctx):
        return sync_listener(msgs, ctx)

    async def main():
        c = AsyncPushConsumer(cluster.namesrv_addr, "answers-aio", **FAST)
        c.subscribe("T", "*")
        c.register_message_listener(listener)
        await c.start()
        try:
            await asyncio.to_thread(wait_for, lambda: c.assigned_message_queues("T"), what="assignment")
            await asyncio.to_thread(_answers_judged, cluster, seen, c.stats,
                                    lambda: c.offset_store.read_memory(MessageQueue("T", "broker-a", 0)))
        finally:
            await c.shutdown()
    asyncio.run(asyncio.wait_for(main(), 90))


# -- crash: a killed member's uncommitted messages go to the others --------------------------------------
CHILD = r"""
import sys, threading, time
from rmq import PushConsumer
c = PushConsumer(sys.argv[1], "crash", rebalance_interval_ms=300, persist_consumer_offset_interval_ms=200,
                 consume_message_batch_max_size=4, consume_thread_max=2, poll_name_server_interval_ms=300,
                 heartbeat_broker_interval_ms=1000)
c.subscribe("T", "*")
out = threading.Lock()
def listener(msgs, ctx):
    time.sleep(0.05)                      # slow: a SIGKILL lands mid-batch
    with out:                             # whole lines: the two consume threads must not interleave
        sys.stdout.write("".join("DONE %s\n" % m.body.decode() for m in msgs))
        sys.stdout.flush()
c.register_message_listener(listener)
c.start()
print("CID", c.client_id, flush=True)
while True:
    time.sleep(1)
"""


#: channelExpiredTimeout of test_killed_consumer_redelivers_uncommitted_to_the_others: the broker
#: drops the SIGKILLed member after 3 s of silence (the module's 10 s would only slow the takeover).
#: A live member dropped by a scheduling gap meanwhile comes back with its next heartbeat: a
#: rebalance more, which the test allows (it checks that nothing is lost, redeliveries allowed)
KILLED_EXPIRED_MS = 3000


def test_killed_consumer_redelivers_uncommitted_to_the_others(cluster_with):
    cluster = cluster_with(channelExpiredTimeout=str(KILLED_EXPIRED_MS))
    create_topic(cluster, "T", 4)
    n = 400
    mine = collections.Counter()
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            for m in msgs:
                mine[m.body.decode()] += 1
    child = subprocess.Popen([sys.executable, "-c", CHILD, cluster.namesrv_addr], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    child_done = []
    survivor = None
    try:
        line = child.stdout.readline().split()
        assert line and line[0] == "CID", line
        assert line[1]            # the child's client id
        reader = threading.Thread(target=lambda: [child_done.append(ln.split()[1]) for ln in child.stdout
                                                  if ln.startswith("DONE")], daemon=True)
        reader.start()
        survivor = push_consumer(cluster, "crash", listener).start()
        wait_for(lambda: len(survivor.assigned_message_queues("T")) == 2, what="the survivor's half")
        send_many(cluster, "T", [(b"%d" % i, i % 4) for i in range(n)])
        wait_for(lambda: len(child_done) >= 40, what="the child consuming")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        # the broker notices the silent member (channelExpiredTimeout) and the survivor rebalances
        wait_for(lambda: len(survivor.assigned_message_queues("T")) == 4, timeout_s=20,
                 what="the survivor takes over")
        expected = {str(i) for i in range(n)}
        try:
            wait_for(lambda: expected <= set(mine) | set(child_done), timeout_s=20, what="no message lost")
        except AssertionError:
            missing = sorted(expected - set(mine) - set(child_done), key=int)
            with PullConsumer(cluster.namesrv_addr, group="crash", auto_commit=False) as pc:
                offs = [(pc.committed(mq), pc.max_offset(mq)) for mq in pc.fetch_subscribe_message_queues("T")]
            raise AssertionError(f"missing {len(missing)}: {missing[:50]}; offsets {offs}; "
                                 f"{survivor.process_queue_table}; stats {survivor.stats}")
        lost_in_flight = expected - set(child_done)
        assert lost_in_flight <= set(mine)
        print(f"crash: child processed {len(child_done)}, survivor {len(mine)}, "
              f"redelivered {len(set(child_done) & set(mine))}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if survivor is not None:
            survivor.shutdown()


# -- asyncio ---------------------------------------------------------------------------------------------
def test_async_pull_consumer_and_push_consumer(cluster):
    from rmq.aio.consumer import AsyncPullConsumer, AsyncPushConsumer
    create_topic(cluster, "A", 4)
    send_many(cluster, "A", [(b"%d" % i, i % 4) for i in range(40)])
    wait_dispatched(cluster, "A", 4, 40)

    async def pull_side():
        async with AsyncPullConsumer(cluster.namesrv_addr, group="apull") as c:
            mqs = await c.fetch_subscribe_message_queues("A")
            res = await c.pull(mqs[0], "*", offset=0, max_nums=32)
            assert [m.body for m in res.msg_found_list] == [b"%d" % i for i in range(0, 40, 4)]
            c.assign(mqs)
            got = []
            async for m in c:
                got.append(m.body)
                if len(got) == 40:
                    break
            await c.commit_sync()
            assert [await c.committed(mq) for mq in mqs] == [10] * 4
            assert await c.seek_by_time(mqs[1], 0) == 0
            return got

    got = asyncio.run(asyncio.wait_for(pull_side(), 30))
    assert sorted(got) == sorted(b"%d" % i for i in range(40))

    async def push_side():
        seen = collections.Counter()
        deliveries = []

        def make_listener(member):
            async def listener(msgs, ctx):
                await asyncio.sleep(0)
                for m in msgs:
                    seen[m.body] += 1
                    deliveries.append((member, m.queue_id, m.body))
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
            return listener
        members = []
        for i in range(2):
            # heartbeats well inside the fixture's channelExpiredTimeout (as FAST), or the broker drops
            # the members mid-test and the queues move (and are redelivered) between them
            m = AsyncPushConsumer(cluster.namesrv_addr, "apush", rebalance_interval_ms=300,
                                  persist_consumer_offset_interval_ms=200, poll_name_server_interval_ms=300,
                                  heartbeat_broker_interval_ms=1000)
            m.subscribe("A", "*")
            m.register_message_listener(make_listener(i))
            await m.start()
            members.append(m)
        try:
            deadline = time.monotonic() + 60
            while not stable_assignment(members, "A", 4):            # 2 + 2: both have rebalanced
                assert time.monotonic() < deadline, [m.assigned_message_queues("A") for m in members]
                await asyncio.sleep(0.05)
            await asyncio.to_thread(send_many, cluster, "A", [(b"n%d" % i, i % 4) for i in range(100)])
            deadline = time.monotonic() + 60
            while sum(1 for k in seen if k.startswith(b"n")) < 100 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            for m in members:
                await m.shutdown()
        return seen, deliveries

    seen, deliveries = asyncio.run(asyncio.wait_for(push_side(), 180))
    expected = [b"%d" % i for i in range(40)] + [b"n%d" % i for i in range(100)]   # new group starts at 0
    dups, moved = at_least_once(deliveries, expected)
    assert set(seen) == set(expected)
    print(f"\nasync push, 2 members: {len(deliveries)} deliveries, {dups} duplicates, queues moved: {sorted(moved)}")



def test_async_orderly_push_consumer_keeps_queue_order(cluster):
    from rmq.aio.consumer import AsyncPushConsumer
    create_topic(cluster, "AO", 2)

    async def main():
        seen = collections.defaultdict(list)
        fail_once = {b"q0-5"}

        async def listener(msgs, ctx):
            for m in msgs:
                if m.body in fail_once:
                    fail_once.discard(m.body)
                    ctx.suspend_current_queue_time_millis = 50
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            for m in msgs:
                seen[m.queue_id].append(m.body)
            return ConsumeOrderlyStatus.SUCCESS
        c = AsyncPushConsumer(cluster.namesrv_addr, "aord", rebalance_interval_ms=300, consume_message_batch_max_size=3,
                              persist_consumer_offset_interval_ms=200, poll_name_server_interval_ms=300,
                              heartbeat_broker_interval_ms=1000)
        c.subscribe("AO", "*")
        c.register_message_listener_orderly(listener)
        await c.start()
        try:
            for _ in range(300):
                if len(c.assigned_message_queues("AO")) == 2:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the consumer never locked both queues")
            await asyncio.to_thread(send_many, cluster, "AO", [(b"q%d-%d" % (i % 2, i // 2), i % 2) for i in range(60)])
            for _ in range(400):
                if sum(map(len, seen.values())) >= 60:
                    break
                await asyncio.sleep(0.05)
        finally:
            await c.shutdown()
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 60))
    for q in (0, 1):
        assert seen[q] == [b"q%d-%d" % (q, i) for i in range(30)]


NO_PERIODIC_REBALANCE_MS = 600_000      # members that rebalance only at start and when the broker notifies them


def test_members_joining_and_leaving_are_notified_and_rebalance_at_once(cluster):
    """NOTIFY_CONSUMER_IDS_CHANGED (RocketMQ's Broker2Client): a member joining (heartbeat) or leaving
    (unregister) makes the broker notify the group's other members on their pull connections, and
    they rebalance at once; the periodic rebalance is 10 min away here, so only the notification
    can split the queues.  Sync PushConsumer and rmq.aio's, each as the notified one."""
    from rmq.aio.consumer import AsyncPushConsumer

    create_topic(cluster, "N", 8)
    all_mqs = {MessageQueue("N", "broker-a", q) for q in range(8)}
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()

    def on_loop(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    async def aio_listener(msgs, ctx):
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async def aio_member(group):
        m = AsyncPushConsumer(cluster.namesrv_addr, group, rebalance_interval_ms=NO_PERIODIC_REBALANCE_MS)
        m.subscribe("N", "*")
        m.register_message_listener(aio_listener)
        await m.start()
        return m

    def split(a, b):
        qa, qb = set(a.assigned_message_queues("N")), set(b.assigned_message_queues("N"))
        return qa and qb and not qa & qb and qa | qb == all_mqs

    try:
        for first_aio in (True, False):
            group = f"notify-{'aio' if first_aio else 'sync'}-first"
            if first_aio:
                a = on_loop(aio_member(group))
            else:
                a = push_consumer(cluster, group, lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
                                  topic="N", rebalance_interval_ms=NO_PERIODIC_REBALANCE_MS)
                a.start()
            wait_for(lambda: set(a.assigned_message_queues("N")) == all_mqs, 30, "the first member owns every queue")
            if first_aio:                         # the notified member is the asyncio one: a sync one joins
                b = push_consumer(cluster, group, lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
                                  topic="N", rebalance_interval_ms=NO_PERIODIC_REBALANCE_MS)
                b.start()
            else:
                b = on_loop(aio_member(group))
            wait_for(lambda: split(a, b), 30, f"{group}: the members split the queues after the join")
            if first_aio:
                b.shutdown()                      # leaves: unregisters, the broker notifies the other
            else:
                on_loop(b.shutdown())
            wait_for(lambda: set(a.assigned_message_queues("N")) == all_mqs, 30,
                     f"{group}: the member left takes every queue back")
            if first_aio:
                on_loop(a.shutdown())
            else:
                assert a.stats["notifications"] >= 2          # the join and the leave
                a.shutdown()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        loop.close()


def test_one_pull_is_consumed_in_parallel_by_idle_workers_and_committed(cluster):
    """The ConsumeRequests of one pull result run in parallel when the listener blocks (the pool
    grows from one thread and the added workers help with the running pull result: a slow
    listener is not serialised by the per-pull hand-off), and what they consumed is committed."""
    create_topic(cluster, "T", 1)
    send_many(cluster, "T", [(b"%d" % i, 0) for i in range(8)])      # one queue: one pull takes all 8
    lock = threading.Lock()
    active = [0]
    peak = [0]
    seen = set()

    def listener(msgs, ctx):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen.update(m.body for m in msgs)
        # wait (bounded) until 4 calls run at once: met only if the pull's requests run in parallel
        end = time.monotonic() + 10
        while time.monotonic() < end and peak[0] < 4:
            time.sleep(0.005)
        with lock:
            active[0] -= 1

    c = push_consumer(cluster, "par", listener, consume_thread_max=8)
    try:
        c.start()
        wait_for(lambda: len(seen) == 8, what="all 8 consumed")
        assert peak[0] >= 4, f"at most {peak[0]} listener calls at once"
        mq = MessageQueue("T", "broker-a", 0)
        wait_for(lambda: c.offset_store.read_memory(mq) == 8, what="offset committed past the 8")
        wait_for(lambda: c.stats["consumed_ok"] == 8, what="counted")
    finally:
        c.shutdown()


def test_aio_one_pull_is_consumed_in_parallel_while_the_listener_waits(cluster):
    """rmq.aio: one task takes a pull result; while its listener call waits, tasks are added
    (AsyncPushConsumer._fan_out) so the run's other requests are consumed at the same time, up
    to consume_thread_max; what they consumed is committed."""
    from rmq.aio.consumer import AsyncPushConsumer
    create_topic(cluster, "T", 1)
    send_many(cluster, "T", [(b"%d" % i, 0) for i in range(8)])      # one queue: one pull takes all 8
    active, peak, seen = [0], [0], set()

    async def listener(msgs, ctx):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        seen.update(m.body for m in msgs)
        end = time.monotonic() + 10             # until 4 calls wait at once (bounded)
        while time.monotonic() < end and peak[0] < 4:
            await asyncio.sleep(0.005)
        active[0] -= 1

    async def main():
        c = AsyncPushConsumer(cluster.namesrv_addr, "par", **{**FAST, "consume_thread_max": 6})
        c.subscribe("T", "*")
        c.register_message_listener(listener)
        await c.start()
        try:
            mq = MessageQueue("T", "broker-a", 0)
            deadline = time.monotonic() + 30
            while not (len(seen) == 8 and c.offset_store.read_memory(mq) == 8 and c.stats["consumed_ok"] == 8):
                assert time.monotonic() < deadline, (len(seen), c.offset_store.read_memory(mq), c.stats)
                await asyncio.sleep(0.02)
        finally:
            await c.shutdown()
    asyncio.run(asyncio.wait_for(main(), 60))
    assert 4 <= peak[0] <= 6, f"{peak[0]} listener calls at once"


def test_consumer_pull_batch_defaults_and_the_brokers_cap():
    """rmq's pull sizes (PUSH_PULL_BATCH_SIZE, POLL_PULL_BATCH_SIZE; RocketMQ's 32 stays the
    default of pull()), validated 1..1024; the broker caps a pull at 1024 in-memory messages."""
    from rmq.client import consumer as C
    from rmq.store.config import MessageStoreConfig
    assert (C.PUSH_PULL_BATCH_SIZE, C.POLL_PULL_BATCH_SIZE, C.PULL_BATCH_SIZE) == (1024, 1024, 32)
    assert MessageStoreConfig().max_transfer_count_on_message_in_memory == 1024
    assert MessageStoreConfig().max_transfer_bytes_on_message_in_memory == 256 * 1024
    for bad in (0, 1025):
        with pytest.raises(MQClientError, match="pull_batch_size must be in"):
            PushConsumer("127.0.0.1:1", "g", pull_batch_size=bad)
        with pytest.raises(MQClientError, match="pull_batch_size must be in"):
            PullConsumer("127.0.0.1:1", "g", pull_batch_size=bad)
    assert PushConsumer("127.0.0.1:1", "g").pull_batch_size == 1024 == C.PUSH_PULL_BATCH_SIZE
    assert PullConsumer("127.0.0.1:1", "g").pull_batch_size == 1024 == C.POLL_PULL_BATCH_SIZE


def test_poll_arrow_gives_polls_messages_as_columns(cluster):
    """PullConsumer.poll_arrow: the same messages as poll() (ids, queues, offsets, tags, keys,
    bodies, a compressed one inflated), as one RecordBatch per call; a tag subscription is
    re-checked; zero rows when nothing arrives."""
    from rmq import Message, Producer
    create_topic(cluster, "T", 4)
    with Producer(cluster.namesrv_addr, group="pa") as p:
        sent = [p.send(Message("T", b"b%d" % i, tags="a" if i % 2 else "b", keys=[f"k{i}"])) for i in range(200)]
        sent.append(p.send(Message("T", b"z" * 8000, tags="a")))          # compressed on the wire
    want = {r.msg_id: r for r in sent}

    def drain(c, n, arrow):
        got = []
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end:
            if arrow:
                b = c.poll_arrow(500)
                got.extend(b.to_pylist())
            else:
                got.extend(c.poll(500))
        return got

    with PullConsumer(cluster.namesrv_addr, "pa-arrow", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues("T"))
        rows = drain(c, len(sent), True)
        assert c.poll_arrow(100).num_rows == 0                               # nothing more
    with PullConsumer(cluster.namesrv_addr, "pa-poll", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues("T"))
        msgs = drain(c, len(sent), False)
    assert len(rows) == len(msgs) == len(sent)
    by_id = {m.msg_id: m for m in msgs}
    for r in rows:
        m, s = by_id[r["msg_id"]], want[r["msg_id"]]
        assert (r["topic"], r["queue_id"], r["queue_offset"]) == ("T", s.queue_id, s.queue_offset)
        assert (r["body"], r["tags"], r["keys"]) == (m.body, m.tags, " ".join(m.keys) or None)   # null: no KEYS
        assert r["commitlog_offset"] == m.commitlog_offset and r["broker_name"] == "broker-a"
    assert by_id[sent[-1].msg_id].body == b"z" * 8000
    with PullConsumer(cluster.namesrv_addr, "pa-tags", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues("T"), "a")
        tagged = drain(c, 101, True)
    assert len(tagged) == 101 and {r["tags"] for r in tagged} == {"a"}


def test_the_asyncio_poll_arrow_gives_the_thread_consumers_rows(cluster):
    """rmq.aio's AsyncPullConsumer.poll_arrow: the rows of PullConsumer.poll_arrow (every column,
    properties when asked, a compressed body inflated), positions that move with what it returns
    (a seek reads again), a tag subscription re-checked, zero rows with the schema when nothing
    arrives."""
    from rmq import Message, Producer
    from rmq.aio.consumer import AsyncPullConsumer
    from rmq.arrow import arrow_schema
    create_topic(cluster, "T", 4)
    with Producer(cluster.namesrv_addr, group="pa") as p:
        sent = [p.send(Message("T", b"b%d" % i, tags="a" if i % 2 else "b", keys=[f"k{i}"],
                               properties={"n": str(i)})) for i in range(150)]
        sent.append(p.send(Message("T", b"z" * 8000, tags="a")))          # compressed on the wire
    key = lambda r: (r["queue_id"], r["queue_offset"])   # noqa: E731

    with PullConsumer(cluster.namesrv_addr, "pa-thread", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues("T"))
        want = []
        end = time.monotonic() + 30
        while len(want) < len(sent) and time.monotonic() < end:
            want.extend(c.poll_arrow(500, include_properties=True).to_pylist())
    assert len(want) == len(sent)

    async def drain(c, n, **kw):
        got = []
        end = time.monotonic() + 30
        while len(got) < n and time.monotonic() < end:
            b = await c.poll_arrow(500, **kw)
            assert b.schema == arrow_schema(kw.get("include_properties", False))
            got.extend(b.to_pylist())
        return got

    async def main():
        async with AsyncPullConsumer(cluster.namesrv_addr, "pa-aio",
                                     consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
            mqs = await c.fetch_subscribe_message_queues("T")
            c.assign(mqs)
            rows = await drain(c, len(sent), include_properties=True)
            empty = await c.poll_arrow(100)
            c.seek(mqs[0], 0)                                                  # read again from the start
            again = await drain(c, sum(1 for r in rows if r["queue_id"] == mqs[0].queue_id))
        async with AsyncPullConsumer(cluster.namesrv_addr, "pa-aio-tags",
                                     consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
            c.assign(await c.fetch_subscribe_message_queues("T"), "a")
            tagged = await drain(c, 76)
        return rows, empty, again, mqs[0].queue_id, tagged

    rows, empty, again, q0, tagged = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(rows, key=key) == sorted(want, key=key)
    assert {r["msg_id"] for r in rows} == {s.msg_id for s in sent}
    assert {r["body"] for r in rows if r["msg_id"] == sent[-1].msg_id} == {b"z" * 8000}
    assert empty.num_rows == 0 and empty.schema == arrow_schema(False)
    assert sorted(map(key, again)) == sorted(key(r) for r in rows if r["queue_id"] == q0)
    assert len(tagged) == 76 and {r["tags"] for r in tagged} == {"a"}


def test_an_asyncio_poll_survives_a_seek_made_while_it_waits(cluster):
    """AsyncPullConsumer: a seek from another task while poll() awaits a long-polling pull drops
    that pull (its answer is stale); the same poll asks again from the new position and returns
    what is there."""
    from rmq.aio.consumer import AsyncPullConsumer
    create_topic(cluster, "SK", 1)
    send_many(cluster, "SK", [(b"old-%d" % i, 0) for i in range(3)])
    wait_dispatched(cluster, "SK", 1, 3)

    async def main():
        async with AsyncPullConsumer(cluster.namesrv_addr, "seek-aio") as c:
            mqs = await c.fetch_subscribe_message_queues("SK")
            c.assign(mqs)
            c.seek(mqs[0], 3)                                                # the end: nothing to read
            polling = asyncio.ensure_future(c.poll(20_000))
            end = time.monotonic() + 15
            while mqs[0] not in c._inflight and time.monotonic() < end:   # its long poll is out
                await asyncio.sleep(0.01)
            assert mqs[0] in c._inflight and not polling.done()
            c.seek(mqs[0], 1)
            got = await asyncio.wait_for(polling, 15)
            return [m.body for m in got]

    assert asyncio.run(main()) == [b"old-1", b"old-2"]


@pytest.mark.parametrize("aio", [False, True], ids=["thread", "asyncio"])
def test_a_long_run_commits_its_offset_before_it_ends(cluster, aio):
    """A worker (a consume task in rmq.aio) going through a pull's requests alone commits what
    it consumed at least every RUN_COMMIT_INTERVAL_S, not only at the end of the run."""
    from rmq.aio.consumer import AsyncPushConsumer
    from rmq.client.consumer import RUN_COMMIT_INTERVAL_S
    create_topic(cluster, "T", 1)
    send_many(cluster, "T", [(b"%d" % i, 0) for i in range(20)])        # one queue: one pull, one run
    mq = MessageQueue("T", "broker-a", 0)
    seen_at_last = []
    holder = {}

    def work(msgs):
        n = int(msgs[0].body)
        if n == 19:
            seen_at_last.append(holder["c"].offset_store.read_memory(mq))
        return RUN_COMMIT_INTERVAL_S / 2 if n < 5 else 0      # stands for work: 5 of them outlast the interval

    def listener(msgs, ctx):
        time.sleep(work(msgs))

    async def aio_listener(msgs, ctx):
        await asyncio.sleep(work(msgs))

    if not aio:
        c = holder["c"] = push_consumer(cluster, "longrun", listener, consume_thread_max=1)
        try:
            c.start()
            wait_for(lambda: seen_at_last, what="the last message consumed")
            assert 0 < seen_at_last[0] < 20, seen_at_last      # committed during the run, before its end
            wait_for(lambda: c.offset_store.read_memory(mq) == 20, what="the whole run committed")
        finally:
            c.shutdown()
        return

    async def main():
        c = holder["c"] = AsyncPushConsumer(cluster.namesrv_addr, "longrun-aio", **{**FAST, "consume_thread_max": 1})
        c.subscribe("T", "*")
        c.register_message_listener(aio_listener)
        await c.start()
        try:
            deadline = time.monotonic() + 30
            while not seen_at_last or c.offset_store.read_memory(mq) != 20:
                assert time.monotonic() < deadline, (seen_at_last, c.offset_store.read_memory(mq))
                await asyncio.sleep(0.02)
        finally:
            await c.shutdown()
        assert 0 < seen_at_last[0] < 20, seen_at_last          # committed during the run, before its end

    asyncio.run(asyncio.wait_for(main(), 60))


def test_request_mux_runs_calls_at_once_and_keeps_each_calls_outcome(cluster):
    """RequestMux.run_calls (the PullConsumer's start positions): every call's first request is
    out before any answer is read; results come back in the calls' order; a call that fails
    (here: its broker refuses, then an address nobody listens on) has its exception as its result
    and the others finish; ``answered`` sees every outcome."""
    from rmq.client.consumer_api import RequestMux
    from rmq.errors import RemotingError

    log = []

    def call(name, code):
        log.append(("send", name))
        first = yield cluster.broker_addr, Frame(code), None
        log.append(("answer", name))
        second = yield cluster.broker_addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO), None
        return name, first.code, second.code

    def failing():
        try:
            yield "127.0.0.1:1", Frame(RequestCode.GET_BROKER_RUNTIME_INFO), 300
        except RemotingError as e:
            raise MQClientError(f"no answer: {e}") from e

    def unencodable():
        from rmq import protocol as P
        try:
            yield cluster.broker_addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO,
                                             fields={"k": "v" * (P.MAX_HEADER_SIZE + 1)}), None
        except RemotingError as e:          # not sent: handed to the call, as drive() does
            return f"refused: {e}"

    seen = []
    mux = RequestMux()
    try:
        out = mux.run_calls([call("a", RequestCode.GET_BROKER_RUNTIME_INFO), failing(), call("b", 99999),
                             unencodable()], 5000,
                            lambda addr, outcome: seen.append((addr, type(outcome).__name__)))
    finally:
        mux.close()
    assert out[3].startswith("refused: cannot encode the request") and not mux.pending
    assert log.index(("send", "b")) < log.index(("answer", "a")), log       # both out before an answer
    assert out[0] == ("a", ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert out[2] == ("b", ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.SUCCESS)
    assert isinstance(out[1], MQClientError) and "no answer" in str(out[1])
    assert len(seen) == 5 and ("127.0.0.1:1", "RemotingTimeoutError") in seen


def poll_until(pc, n: int, timeout_s: float = 30.0) -> list:
    """PullConsumer.poll(500) until ``n`` messages came or ``timeout_s`` passed; the messages."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += pc.poll(500)
    return got


async def apoll_until(ac, n: int, timeout_s: float = 30.0) -> list:
    """:func:`poll_until` for an rmq.aio PullConsumer."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += await ac.poll(500)
    return got


def test_poll_raises_a_start_position_it_cannot_read_and_serves_the_next_assignment(cluster):
    """The parallel start positions of a first poll: one that fails (queues of a broker the route
    does not have) is raised by poll(), no request is left behind, no position is made up, and the
    queues assigned next are read from their start (threads and rmq.aio)."""
    with RemotingClient() as c:
        r = c.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
            "topic": "StartPosBad", "readQueueNums": 2, "writeQueueNums": 2}))
        assert r.code == ResponseCode.SUCCESS
        for q in range(2):
            assert send(c, cluster.broker_addr, "StartPosBad", b"m%d" % q, queue_id=q).code == ResponseCode.SUCCESS
    gone = [MessageQueue("StartPosBad", "broker-gone", q) for q in range(2)]
    want = [b"m0", b"m1"]
    with PullConsumer(cluster.namesrv_addr, "start-pos-bad", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as pc:
        pc.assign(gone)
        with pytest.raises(MQClientError, match="broker-gone"):
            pc.poll(500)
        assert not pc._mux.pending
        with pytest.raises(MQClientError):
            pc.position(gone[0])                  # none was stored: asked again, it fails again
        mqs = pc.fetch_subscribe_message_queues("StartPosBad")
        pc.assign(mqs)
        assert sorted(m.body for m in poll_until(pc, 2)) == want

    from rmq.aio.consumer import AsyncPullConsumer

    async def aio():
        async with AsyncPullConsumer(cluster.namesrv_addr, "start-pos-bad-aio",
                                     consume_from_where="CONSUME_FROM_FIRST_OFFSET") as ac:
            ac.assign(gone)
            with pytest.raises(MQClientError, match="broker-gone"):
                await ac.poll(500)
            ac.assign(await ac.fetch_subscribe_message_queues("StartPosBad"))
            return await apoll_until(ac, 2)
    assert sorted(m.body for m in asyncio.run(aio())) == want


def test_poll_asks_the_start_positions_of_all_new_queues_at_once(cluster):
    """A PullConsumer's first poll of 8 new queues (CONSUME_FROM_FIRST_OFFSET: the committed
    offset, then the min offset, per queue) gets every queue's position and reads from it."""
    with RemotingClient() as c:
        r = c.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
            "topic": "StartPos", "readQueueNums": 8, "writeQueueNums": 8}))
        assert r.code == ResponseCode.SUCCESS
        for q in range(8):
            for i in range(3):
                assert send(c, cluster.broker_addr, "StartPos", b"%d-%d" % (q, i), queue_id=q).code == ResponseCode.SUCCESS
    with PullConsumer(cluster.namesrv_addr, "start-pos", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as pc:
        mqs = pc.fetch_subscribe_message_queues("StartPos")
        pc.assign(mqs)
        got = poll_until(pc, 24)
        assert sorted(m.body for m in got) == sorted(b"%d-%d" % (q, i) for q in range(8) for i in range(3))
        assert {mq: pc.position(mq) for mq in mqs} == {mq: 3 for mq in mqs}

    from rmq.aio.consumer import AsyncPullConsumer

    async def aio():
        async with AsyncPullConsumer(cluster.namesrv_addr, "start-pos-aio",
                                     consume_from_where="CONSUME_FROM_FIRST_OFFSET") as ac:
            ac.assign(await ac.fetch_subscribe_message_queues("StartPos"))
            return await apoll_until(ac, 24)
    got = asyncio.run(aio())
    assert sorted(m.body for m in got) == sorted(b"%d-%d" % (q, i) for q in range(8) for i in range(3))
