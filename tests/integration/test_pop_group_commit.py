"""The POP service's group commit (rmq.actors.pop, "Group commit"): the POPs and acks the broker
reads in one turn write their revive-log records as one append per revive queue, before any of
their replies; when that append fails, the turn's requests are undone and answered SYSTEM_ERROR.

Requests go pipelined from one raw client (a burst, sent before any answer is read), so the
broker reads several in a turn.  A failed append is made the way the store refuses writes in
production: the cleaner's CLEAN_ANNOUNCE with ``diskFull`` (sent here on the broker's internal
socket, as the cleaner actor sends it), which makes every put SERVICE_NOT_AVAILABLE."""
import collections
import time

import pytest
import zmq

from rmq import PullConsumer
from rmq import protocol as P
from rmq.actors.broker_endpoints import internal_endpoint
from rmq.actors.pop import REVIVE_APPEND_MAX_RECORDS, REVIVE_QUEUE_NUM, parse_extra_info, revive_topic
from rmq.client.consumer import MessageQueue
from rmq.client.consumer_api import SubscriptionData
from rmq.client.remoting import RemotingClient
from rmq.client.simple_consumer import batch_ack_frame, parse_pop_response
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.test_broker import send
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration

BURST = 16          # requests sent before the first answer is read
PER_POP = 4         # maxMsgNums of each POP
WAIT_MS = 30_000


@pytest.fixture
def cluster(tmp_path):
    # waitTimeMillsInSendQueue: the raw sends here are never retried; under load a scheduling gap of
    # the broker could age one past the default 200 ms and get it SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE]
    # (flow control is test_broker's subject)
    with Cluster(str(tmp_path / "store"), conf={"waitTimeMillsInSendQueue": "600000"}) as c:
        yield c


def pop_stats(cluster, c) -> dict:
    return broker_runtime_info(cluster.broker_addr, c)["popStats"]


def burst(c, addr, frames) -> list:
    """Send every frame, then read every answer; the answers in the frames' order."""
    opaques = []
    for i, f in enumerate(frames):
        f.opaque = 1_000_000 + i
        opaques.append(f.opaque)
        c.send_raw(addr, P.encode(f))
    got = {}
    while len(got) < len(frames):
        r = c.recv_raw(addr, WAIT_MS)
        assert r is not None, f"{len(got)} of {len(frames)} answers"
        got[r.opaque] = r
    return [got[o] for o in opaques]


def pop_frames(group, topic, n=BURST):
    return [Frame(RequestCode.POP_MESSAGE, fields={
        "consumerGroup": group, "topic": topic, "queueId": -1, "maxMsgNums": PER_POP, "invisibleTime": 60_000,
        "pollTime": 0, "bornTime": int(time.time() * 1000), "initMode": "MIN", "expType": "TAG", "exp": "*"})
        for _ in range(n)]


def pop_all(c, addr, group, topic, want) -> list:
    """Bursts of POPs until ``want`` views came; the views of each successful POP, in lists."""
    sub = SubscriptionData.build(topic, "*")
    batches, n = [], 0
    deadline = time.monotonic() + WAIT_MS / 1000
    while n < want:
        assert time.monotonic() < deadline, f"{n} of {want} popped"
        for r in burst(c, addr, pop_frames(group, topic)):
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (r.code, r.remark)
            views, dropped = parse_pop_response(r, sub, addr)
            assert not dropped
            if views:
                batches.append(views)
                n += len(views)
    return batches


def ack_all(c, addr, group, batches) -> list:
    frames = [batch_ack_frame(group, "broker-a", views)[0] for views in batches]
    out = []
    for i in range(0, len(frames), BURST):
        out += burst(c, addr, frames[i:i + BURST])
    return out


class Cleaner:
    """The cleaner actor's CLEAN_ANNOUNCE to the broker, on the broker's internal socket."""

    def __init__(self, cluster):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(internal_endpoint(cluster.store_path))

    def disk_full(self, full: bool) -> None:
        self.sock.send_multipart(P.encode(Frame(RequestCode.CLEAN_ANNOUNCE, flag=P.FLAG_ONEWAY,
                                                fields={"minOffset": 0, "diskFull": full, "diskRatio": 0.5})))

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def set_disk_full(cluster, c, cleaner, full: bool) -> None:
    """Announce ``full`` until a probe send to another topic shows the broker took it."""
    want = (lambda code: code != ResponseCode.SUCCESS) if full else (lambda code: code == ResponseCode.SUCCESS)
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        cleaner.disk_full(full)
        if want(send(c, cluster.broker_addr, "GcProbe", b"probe").code):
            return
        assert time.monotonic() < deadline, f"the broker did not take diskFull={full}"
        time.sleep(0.05)


def test_a_turns_pops_and_acks_share_revive_log_appends(cluster):
    """Bursts of POPs and batch acks: every message handed out once and acked, every checkpoint
    and ack record written (and dispatched to the revive queues), in fewer appends than records."""
    n = 512
    with RemotingClient() as c:
        create_topic(cluster, "GcOk", 2)
        for i in range(n):
            assert send(c, cluster.broker_addr, "GcOk", b"m%04d" % i, queue_id=i % 2).code == ResponseCode.SUCCESS
        before = pop_stats(cluster, c)
        batches = pop_all(c, cluster.broker_addr, "gc-ok", "GcOk", n)
        bodies = [v.body for views in batches for v in views]
        assert sorted(bodies) == [b"m%04d" % i for i in range(n)], "each message handed out once"
        assert pop_stats(cluster, c)["inFlight"] == n
        for r in ack_all(c, cluster.broker_addr, "gc-ok", batches):
            assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
            assert r.fields.get("failed") == [], r.fields
        after = pop_stats(cluster, c)
        assert after["inFlight"] == 0
        assert after["popped"] - before["popped"] == n and after["acked"] - before["acked"] == n
        cks = after["checkpoints"] - before["checkpoints"]
        records = after["reviveRecords"] - before["reviveRecords"]
        appends = after["reviveAppends"] - before["reviveAppends"]
        # one checkpoint per queue a POP read; one ack record per checkpoint of each batch ack
        assert cks >= len(batches) and records == cks + cks, (cks, records, len(batches))
        assert appends < records, f"{appends} appends for {records} records: no turn was group committed"
        with PullConsumer(cluster.namesrv_addr, "gc-revive-reader") as pc:
            wait_for(lambda: sum(pc.max_offset(MessageQueue(revive_topic("TestCluster"), "broker-a", q))
                                 for q in range(REVIVE_QUEUE_NUM)) >= after["reviveRecords"],
                     what="every revive record dispatched to the revive queues")


def test_a_failed_group_commit_undoes_its_pops_and_acks(cluster):
    """With the store refusing writes, a burst of POPs gets SYSTEM_ERROR and hands nothing out:
    once writes are back every message is popped from the first offset, once.  A burst of batch
    acks that cannot be written gets SYSTEM_ERROR and leaves its messages in flight: acked again
    later, each is acked once."""
    n = 64
    cleaner = Cleaner(cluster)
    try:
        with RemotingClient() as c:
            create_topic(cluster, "GcFail", 1)
            create_topic(cluster, "GcProbe", 1)
            for i in range(n):
                assert send(c, cluster.broker_addr, "GcFail", b"f%03d" % i).code == ResponseCode.SUCCESS
            set_disk_full(cluster, c, cleaner, True)
            before = pop_stats(cluster, c)
            for r in burst(c, cluster.broker_addr, pop_frames("gc-fail", "GcFail")):
                assert r.code == ResponseCode.SYSTEM_ERROR, (r.code, r.remark, r.fields)
                assert "revive log" in r.remark
            st = pop_stats(cluster, c)
            assert st["inFlight"] == 0 and st["popped"] == before["popped"], st
            assert st["checkpoints"] == before["checkpoints"], "the failed pops' checkpoints are gone"

            set_disk_full(cluster, c, cleaner, False)
            batches = pop_all(c, cluster.broker_addr, "gc-fail", "GcFail", n)
            assert sorted(v.body for views in batches for v in views) == [b"f%03d" % i for i in range(n)]
            assert pop_stats(cluster, c)["inFlight"] == n

            set_disk_full(cluster, c, cleaner, True)
            for r in ack_all(c, cluster.broker_addr, "gc-fail", batches):
                assert r.code == ResponseCode.SYSTEM_ERROR, (r.code, r.remark, r.fields)
            assert pop_stats(cluster, c)["inFlight"] == n, "the unwritten acks left their messages in flight"

            set_disk_full(cluster, c, cleaner, False)
            acked0 = pop_stats(cluster, c)["acked"]
            for r in ack_all(c, cluster.broker_addr, "gc-fail", batches):
                assert r.code == ResponseCode.SUCCESS and r.fields.get("failed") == [], (r.code, r.remark, r.fields)
            st = pop_stats(cluster, c)
            assert st["inFlight"] == 0 and st["acked"] - acked0 == n, st
    finally:
        cleaner.close()


def test_a_revive_append_holds_at_most_revive_append_max_records(cluster):
    """REVIVE_APPEND_MAX_RECORDS: one BATCH_ACK of 300 checkpoints, each made by a POP of its own
    (one at a time: revive queues in rotation), writes its ack records to each revive queue in
    appends of at most REVIVE_APPEND_MAX_RECORDS, and acks every message."""
    n = 300
    with RemotingClient() as c:
        create_topic(cluster, "GcMax", 1)
        for i in range(n):
            assert send(c, cluster.broker_addr, "GcMax", b"x%03d" % i).code == ResponseCode.SUCCESS
        sub = SubscriptionData.build("GcMax", "*")
        views = []
        deadline = time.monotonic() + WAIT_MS / 1000
        while len(views) < n:
            assert time.monotonic() < deadline, f"{len(views)} of {n} popped"
            f = pop_frames("gc-max", "GcMax", 1)[0]
            f.fields["maxMsgNums"] = 1
            got, _ = parse_pop_response(c.invoke(cluster.broker_addr, f, WAIT_MS), sub, cluster.broker_addr)
            views += got
        per_rq = collections.Counter(parse_extra_info(v.receipt_handle)[3] for v in views)
        assert max(per_rq.values()) > REVIVE_APPEND_MAX_RECORDS, per_rq     # the limit is reached
        before = pop_stats(cluster, c)
        frame, _ = batch_ack_frame("gc-max", "broker-a", views)
        r = c.invoke(cluster.broker_addr, frame, WAIT_MS)
        assert r.code == ResponseCode.SUCCESS and r.fields.get("failed") == [], (r.code, r.remark, r.fields)
        after = pop_stats(cluster, c)
        assert after["reviveRecords"] - before["reviveRecords"] == n
        assert after["reviveAppends"] - before["reviveAppends"] == sum(
            -(-k // REVIVE_APPEND_MAX_RECORDS) for k in per_rq.values()), per_rq
        assert after["inFlight"] == 0
