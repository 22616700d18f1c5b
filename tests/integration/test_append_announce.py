"""The broker's ANNOUNCE_APPEND to reput (and an ASYNC_MASTER's HA actor) is coalesced: at most one
per ``appendAnnounceIntervalMs`` (default 1 ms, RocketMQ's ReputMessageService round), the first
append after a quiet spell at once and the rest at the interval's end, so nothing appended is left
unannounced.  Under SYNC_FLUSH a small group is msynced by the broker itself before its acks and
announced as ANNOUNCE_DURABLE (the flush actor is not woken); a group left to the flush actor, and
every append of a SYNC_MASTER, is announced at once (a send waits for what it starts).  The POP
revive log's checkpoints and acks, which no reader waits for, make no announcement of their own:
the next one (an append's, or the periodic tick) takes them.

Counted on the broker's PUB socket itself.  Sends go one at a time (each answered before the next
is sent), so each is appended in a poll turn of its own: without coalescing, one announcement per
send, exactly."""
import time

import pytest
import zmq

from rmq import PullConsumer, SimpleConsumer
from rmq import protocol as P
from rmq.actors.broker import SYNC_FLUSH_INLINE_MAX_BYTES
from rmq.actors.broker_endpoints import ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK, announce_endpoint
from rmq.actors.pop import REVIVE_QUEUE_NUM, revive_topic
from rmq.client.consumer import MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.test_broker import send
from tests.integration.test_consumer import create_topic, wait_dispatched, wait_for

pytestmark = pytest.mark.integration

SENDS = 60
WAIT_S = 30.0


class Announcements:
    """A SUB on the broker's announcements, live once a periodic tick has come through."""

    def __init__(self, store_path):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_APPEND)
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_TICK)
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_DURABLE)
        self.durable: list = []            # the CommitLog end of each ANNOUNCE_DURABLE, in order
        self.sub.connect(announce_endpoint(store_path))
        self.appends: list = []            # the CommitLog end of each ANNOUNCE_APPEND, in order
        self.last_end = -1
        deadline = time.monotonic() + WAIT_S
        while not self._read(ANNOUNCE_TICK):
            assert time.monotonic() < deadline, "no announcement tick from the broker"

    def _read(self, want: bytes, timeout_ms: int = 100) -> bool:
        seen = False
        if not self.sub.poll(timeout_ms):
            return False
        while True:
            try:
                parts = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return seen
            end = P.decode(parts[1:]).fields["end"]
            self.last_end = end
            if parts[0] == ANNOUNCE_APPEND:
                self.appends.append(end)
            elif parts[0] == ANNOUNCE_DURABLE:
                self.durable.append(end)
            seen = seen or parts[0] == want

    def until_append_end(self, end: int, tick_will_do: bool = False) -> None:
        """Read until an ANNOUNCE_APPEND or ANNOUNCE_DURABLE (or, ``tick_will_do``, any
        announcement) has told ``end``."""
        deadline = time.monotonic() + WAIT_S
        while not any(seen and seen[-1] >= end for seen in (self.appends, self.durable)) \
                and not (tick_will_do and self.last_end >= end):
            assert time.monotonic() < deadline, (f"no ANNOUNCE_APPEND reached {end} "
                                                 f"(appends {self.appends[-3:]}, last seen {self.last_end})")
            self._read(ANNOUNCE_APPEND)

    def close(self):
        self.ctx.destroy(linger=0)


def sends_and_announcements(tmp_path, conf, then=None) -> tuple:
    """SENDS one-at-a-time sends; returns (the Announcements seen from the first send until one
    told the final CommitLog end, seconds the sends took, that end).  ``then(client, cluster,
    announcements)`` runs after, with the cluster still up."""
    with Cluster(str(tmp_path / "store"), conf=conf) as cluster, RemotingClient() as c:
        r = send(c, cluster.broker_addr, "AnnT", b"warm-up")      # auto-creates the topic
        assert r.code == ResponseCode.SUCCESS, r.remark
        ann = Announcements(cluster.store_path)
        try:
            ann.until_append_end(int(broker_runtime_info(cluster.broker_addr, c)["commitLogMaxOffset"]),
                                 tick_will_do=True)     # the warm-up's was before the subscription
            ann.appends.clear()
            ann.durable.clear()
            t0 = time.monotonic()
            for i in range(SENDS):
                r = send(c, cluster.broker_addr, "AnnT", b"m%03d" % i)
                assert r.code == ResponseCode.SUCCESS, r.remark
            elapsed_s = time.monotonic() - t0
            end = int(broker_runtime_info(cluster.broker_addr, c)["commitLogMaxOffset"])
            ann.until_append_end(end)       # no traffic after the last send: the deferred one tells it
            if then is not None:
                then(c, cluster, ann)
            return ann, elapsed_s, end
        finally:
            ann.close()


def test_every_append_announced_when_the_interval_is_zero(tmp_path):
    ann, _, end = sends_and_announcements(tmp_path, {"appendAnnounceIntervalMs": "0"})
    appends = ann.appends
    assert len(appends) == SENDS and appends[-1] == end, (len(appends), appends[-3:], end)
    assert appends == sorted(set(appends)), "each announcement tells a new, larger end"


def test_appends_within_the_interval_are_announced_together_and_the_last_one_is_not_lost(tmp_path):
    interval_ms = 50
    ann, elapsed_s, end = sends_and_announcements(tmp_path, {"appendAnnounceIntervalMs": str(interval_ms)})
    appends = ann.appends
    # the rule: one at once after a quiet spell, then at most one per interval (+1 for the
    # trailing one after the sends): bounded by the time the sends took, whatever the machine
    bound = int(elapsed_s * 1000 / interval_ms) + 2
    assert 1 <= len(appends) <= bound, (len(appends), bound, elapsed_s)
    assert len(appends) < SENDS and not ann.durable
    assert appends[-1] == end and appends == sorted(set(appends)), (appends[-3:], end)


def test_sync_flush_small_sends_made_durable_by_the_broker_do_not_wake_the_flush_actor(tmp_path):
    """SYNC_FLUSH: one-at-a-time sends are msynced by the broker's own group commit before their ack,
    then announced as ANNOUNCE_DURABLE (reput and HA subscribe, the flush actor does not), coalesced
    like any append.  A group too large for the broker (a big message) is announced at once as
    ANNOUNCE_APPEND: the flush actor msyncs it, and the send is acknowledged after that."""
    interval_ms = 50

    def big_send(c, cluster, ann):
        ann.appends.clear()
        r = send(c, cluster.broker_addr, "AnnT", b"B" * (SYNC_FLUSH_INLINE_MAX_BYTES + 1024))
        assert r.code == ResponseCode.SUCCESS, r.remark
        info = broker_runtime_info(cluster.broker_addr, c)
        assert int(info["flushedOffset"]) == int(info["commitLogMaxOffset"]), info
        ann.until_append_end(int(info["commitLogMaxOffset"]))
        assert ann.appends, "the big group was announced to the flush actor (ANNOUNCE_APPEND)"

    ann, elapsed_s, end = sends_and_announcements(tmp_path, {"appendAnnounceIntervalMs": str(interval_ms),
                                                             "flushDiskType": "SYNC_FLUSH"}, then=big_send)
    durable = [e for e in ann.durable if e <= end]
    assert durable and durable[-1] == end and durable == sorted(set(durable)), (durable[-3:], end)
    assert len(durable) <= int(elapsed_s * 1000 / interval_ms) + 2 and len(durable) < SENDS, (len(durable), elapsed_s)


@pytest.mark.parametrize("interval_ms", [None, 0])
def test_pop_revive_log_appends_are_announced_by_the_next_announcement(tmp_path, interval_ms):
    """POP receives and acks append only revive-log records: with the default interval no
    ANNOUNCE_APPEND goes out for them, the periodic tick tells reput their end (they get
    dispatched), and the next send is announced at once with them.  With
    appendAnnounceIntervalMs=0 they are announced as any append."""
    conf = {} if interval_ms is None else {"appendAnnounceIntervalMs": str(interval_ms)}
    with Cluster(str(tmp_path / "store"), conf=conf) as cluster, RemotingClient() as c:
        create_topic(cluster, "AnnPop", 1)
        for i in range(100):
            assert send(c, cluster.broker_addr, "AnnPop", b"p%03d" % i).code == ResponseCode.SUCCESS
        wait_dispatched(cluster, "AnnPop", 1, 100, group="ann-probe")
        ann = Announcements(cluster.store_path)
        try:
            ann.until_append_end(int(broker_runtime_info(cluster.broker_addr, c)["commitLogMaxOffset"]),
                                 tick_will_do=True)
            start = int(broker_runtime_info(cluster.broker_addr, c)["commitLogMaxOffset"])
            ann.appends.clear()
            got = 0
            with SimpleConsumer(cluster.namesrv_addr, "ann-pop", {"AnnPop": "*"}, await_duration_s=0.5,
                                init_mode="MIN") as sc:
                while got < 100:
                    views = sc.receive(10, 60)
                    assert views, f"POP returned nothing after {got} of 100"
                    sc.ack_batch(views)
                    got += len(views)
            info = broker_runtime_info(cluster.broker_addr, c)
            end = int(info["commitLogMaxOffset"])
            assert end > start, "the checkpoints and acks went to the CommitLog"
            ann.until_append_end(end, tick_will_do=True)
            if interval_ms == 0:
                assert ann.appends and ann.appends[-1] == end, (ann.appends[-3:], end)
            else:
                assert not ann.appends, f"revive-log appends announced on their own: {ann.appends[-3:]}"
            # reput dispatched them (from the tick): the revive queues hold every record
            with PullConsumer(cluster.namesrv_addr, "ann-revive-reader") as pc:
                wait_for(lambda: sum(pc.max_offset(MessageQueue(revive_topic("TestCluster"), "broker-a", q))
                                     for q in range(REVIVE_QUEUE_NUM)) >= 20,
                         what="the revive log dispatched (10 checkpoints + 10 acks)")
            ann.appends.clear()
            r = send(c, cluster.broker_addr, "AnnPop", b"after")
            assert r.code == ResponseCode.SUCCESS, r.remark
            end2 = int(broker_runtime_info(cluster.broker_addr, c)["commitLogMaxOffset"])
            ann.until_append_end(end2)          # an ANNOUNCE_APPEND, not the tick
            assert ann.appends[0] == end2, (ann.appends, end2)
        finally:
            ann.close()
