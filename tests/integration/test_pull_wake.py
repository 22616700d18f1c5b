"""A pull held at a queue's tail is answered from the append itself (broker ``wakePullOnAppendEnable``,
default true), not only after reput's DISPATCH_ANNOUNCE (issue 12).

Reput is SIGSTOPped in these tests, so whatever a consumer gets while it is stopped came from the
append path.  They check what that path may and may not do: the reply is the records a normal
pull returns later, byte for byte; the consumer's next pull (ahead of the ConsumeQueue) is held,
not told its offset moved; an offset past what was appended still is; under SYNC_FLUSH nothing
unflushed is served; a tag-filtered pull is left to reput; switched off, the broker waits for
reput as before; and a PushConsumer gets every message once, with reput stopped and after.

Deterministic without timing: the broker answers a held pull in the same loop turn as the append
(before the send's own acknowledgement), so once a send is acknowledged, GET_BROKER_RUNTIME_INFO (answered in a
later turn) sees the pull answered or still parked."""
import os
import signal
import threading

import pytest

from rmq import PushConsumer
from rmq._core import commitlog as cl
from rmq.actors.broker import SYNC_FLUSH_INLINE_MAX_BYTES
from rmq.client.consumer import ConsumeConcurrentlyStatus
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, send, wait_for

pytestmark = pytest.mark.integration

TOPIC = "WakeT"


def create_topic(addr, topic=TOPIC, queues=1):
    with RemotingClient() as c:
        r = c.invoke(addr, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues}))
        assert r.code == ResponseCode.SUCCESS, r.remark


class HeldPull:
    """A PULL_MESSAGE with the suspend flag, in a thread of its own (its own socket)."""

    def __init__(self, addr, offset, sub="*", max_nums=32, topic=TOPIC):
        self.resp = None
        self.error = None

        def run():
            try:
                with RemotingClient() as c:
                    self.resp = pull(c, addr, topic, 0, offset, max_nums=max_nums, sub=sub, suspend_ms=20_000,
                                     timeout_ms=60_000)
            except Exception as e:  # noqa: BLE001 - reported by result()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout_s=60.0):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the held pull was never answered"
        if self.error:
            raise self.error
        return self.resp


def parked(addr) -> int:
    return int(broker_runtime_info(addr)["parkedPulls"])


def park(addr, n=1, **kw) -> HeldPull:
    before = parked(addr)
    h = HeldPull(addr, **kw)
    wait_for(lambda: parked(addr) >= before + n)
    return h


@pytest.fixture
def stopped_reput(tmp_path, request):
    conf = getattr(request, "param", {})
    c = Cluster(tmp_path / "store", conf=conf)
    create_topic(c.broker)
    reput = c.pids()["reput"]
    os.kill(reput, signal.SIGSTOP)
    try:
        yield c
    finally:
        os.kill(reput, signal.SIGCONT)
        c.close()


def test_held_pull_answered_from_the_append(stopped_reput):
    c = stopped_reput
    addr = c.broker
    h = park(addr, offset=0)
    with RemotingClient() as rc:
        r = send(rc, addr, TOPIC, b"first", tags="A")
        assert r.code == ResponseCode.SUCCESS, r.remark
        resp = h.result()
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert resp.fields["nextBeginOffset"] == 1 and resp.fields["maxOffset"] == 1
        fast_bytes = bytes(resp.bodies[0])
        (m,) = cl.decode_records(fast_bytes, check_crc=True)
        assert (m.body, m.queue_offset, m.tags) == (b"first", 0, "A")
        info = broker_runtime_info(addr)
        assert info["dispatchedOffset"] < info["commitLogMaxOffset"], info      # reput has not seen it
        # the consumer's next pull is ahead of the ConsumeQueue (reput is stopped): held, not "moved"
        r1 = pull(rc, addr, TOPIC, 0, 1)
        assert r1.code == ResponseCode.PULL_NOT_FOUND and r1.fields["nextBeginOffset"] == 1, (r1.code, r1.fields)
        # past what was appended it still is a moved offset
        r5 = pull(rc, addr, TOPIC, 0, 5)
        assert r5.code == ResponseCode.PULL_OFFSET_MOVED, (r5.code, r5.fields)
        # a held pull at the new tail is answered by the next append, reput still stopped
        h2 = park(addr, offset=1)
        assert send(rc, addr, TOPIC, b"second").code == ResponseCode.SUCCESS
        resp2 = h2.result()
        assert resp2.code == ResponseCode.SUCCESS and resp2.fields["nextBeginOffset"] == 2
        second_bytes = bytes(resp2.bodies[0])
        assert [m.body for m in cl.decode_records(second_bytes)] == [b"second"]
        # reput resumes: a normal pull returns the very same records, byte for byte
        os.kill(c.pids()["reput"], signal.SIGCONT)
        normal = wait_for(lambda: (lambda x: x if x.code == ResponseCode.SUCCESS else None)(pull(rc, addr, TOPIC, 0, 0)))
        assert bytes(normal.bodies[0]) == fast_bytes + second_bytes


def test_batch_send_served_whole_never_cut(stopped_reput):
    """A SEND_BATCH_MESSAGE's records go out in one reply (nextBeginOffset = first + count); a pull
    that wants fewer, or starts inside the batch, waits for reput (a batch is never cut), and then
    gets the same bytes."""
    from rmq.client.message import Message
    from rmq.client.producer import ProducerOptions, batch_body_of, prepare_message
    addr = stopped_reput.broker
    opts = ProducerOptions()
    body = batch_body_of([prepare_message(Message(TOPIC, b"b%d" % i), opts) for i in range(3)])
    small = park(addr, offset=0, max_nums=2)
    whole = park(addr, offset=0)
    with RemotingClient() as rc:
        r = rc.invoke(addr, Frame(RequestCode.SEND_BATCH_MESSAGE, fields={
            "producerGroup": "pg", "topic": TOPIC, "queueId": 0, "bornTimestamp": 1}, bodies=[body]))
        assert r.code == ResponseCode.SUCCESS, r.remark
        resp = whole.result()
        assert resp.code == ResponseCode.SUCCESS and resp.fields["nextBeginOffset"] == 3
        whole_bytes = bytes(resp.bodies[0])
        assert [m.body for m in cl.decode_records(whole_bytes, check_crc=True)] == [b"b0", b"b1", b"b2"]
        assert parked(addr) == 1                            # the maxMsgNums=2 pull waits for reput
        inside = pull(rc, addr, TOPIC, 0, 1)                # inside the batch: nothing yet, not "moved"
        assert inside.code == ResponseCode.PULL_NOT_FOUND and inside.fields["nextBeginOffset"] == 1
        os.kill(stopped_reput.pids()["reput"], signal.SIGCONT)
        resp = small.result()
        assert resp.code == ResponseCode.SUCCESS and resp.fields["nextBeginOffset"] == 2
        normal = wait_for(lambda: (lambda x: x if x.code == ResponseCode.SUCCESS else None)(pull(rc, addr, TOPIC, 0, 0)))
        assert bytes(normal.bodies[0]) == whole_bytes
        assert whole_bytes.startswith(bytes(resp.bodies[0]))


def test_tag_filtered_pull_left_to_reput(stopped_reput):
    addr = stopped_reput.broker
    h = park(addr, offset=0, sub="A")
    with RemotingClient() as rc:
        assert send(rc, addr, TOPIC, b"x", tags="A").code == ResponseCode.SUCCESS
    assert parked(addr) == 1
    os.kill(stopped_reput.pids()["reput"], signal.SIGCONT)
    resp = h.result()
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in cl.decode_records(bytes(resp.bodies[0]))] == [b"x"]


@pytest.mark.parametrize("stopped_reput", [{"wakePullOnAppendEnable": "false"}], indirect=True)
def test_switched_off_waits_for_reput(stopped_reput):
    addr = stopped_reput.broker
    h = park(addr, offset=0)
    with RemotingClient() as rc:
        assert send(rc, addr, TOPIC, b"x").code == ResponseCode.SUCCESS
    assert parked(addr) == 1
    os.kill(stopped_reput.pids()["reput"], signal.SIGCONT)
    resp = h.result()
    assert resp.code == ResponseCode.SUCCESS and resp.fields["nextBeginOffset"] == 1


def test_sync_flush_serves_only_flushed(tmp_path):
    """SYNC_FLUSH: an appended but unflushed message is not served from the append (flush is
    stopped; the message is larger than the broker's own group commit takes); once flush resumes,
    the send is acknowledged and the pull answered."""
    body = b"durable first" + b"." * SYNC_FLUSH_INLINE_MAX_BYTES
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "60000"})
    flush = c.pids()["flush"]
    try:
        create_topic(c.broker)
        h = park(c.broker, offset=0)
        before = broker_runtime_info(c.broker)["commitLogMaxOffset"]
        os.kill(flush, signal.SIGSTOP)
        acked = {}

        def do_send():
            with RemotingClient() as rc:
                acked["r"] = send(rc, c.broker, TOPIC, body, timeout_ms=60_000)
        t = threading.Thread(target=do_send, daemon=True)
        t.start()
        wait_for(lambda: broker_runtime_info(c.broker)["commitLogMaxOffset"] > before)   # appended
        info = broker_runtime_info(c.broker)
        assert info["flushedOffset"] <= before and info["parkedPulls"] == 1, info
        os.kill(flush, signal.SIGCONT)
        resp = h.result()
        t.join(60)
        assert acked["r"].code == ResponseCode.SUCCESS
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in cl.decode_records(bytes(resp.bodies[0]))] == [body]
    finally:
        os.kill(flush, signal.SIGCONT)
        c.close()


def test_push_consumer_with_reput_stopped_then_resumed(stopped_reput):
    """End to end through the public API: every message delivered once while reput is stopped
    (served from the appends), then after it resumes; the consumer never resets its offset."""
    from rmq import Message, Producer
    c = stopped_reput
    got, lock = [], threading.Lock()

    def listener(msgs, ctx):
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer = PushConsumer(c.namesrv_addr, "wake-cg", rebalance_interval_ms=300, heartbeat_broker_interval_ms=1000,
                            persist_consumer_offset_interval_ms=200)
    consumer.subscribe(TOPIC, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        wait_for(lambda: consumer.assigned_message_queues(TOPIC))
        wait_for(lambda: parked(c.broker) >= 1)      # its pull is held at the tail
        # batch_size=0: one SEND_MESSAGE per message, so the burst's appends are whole ones a pull
        # can take up to maxMsgNums of (a producer batch bigger than that waits for reput)
        with Producer(c.namesrv_addr, group="wake-pg", batch_size=0) as p:
            for i in range(20):               # one at a time: each wakes the held pull
                p.send(Message(TOPIC, b"m%d" % i))
                wait_for(lambda: len(got) == i + 1)
            for i in range(20, 60):           # a burst: pulls arrive behind the appends, still no reput
                p.send_async(Message(TOPIC, b"m%d" % i))
            p.flush()
            wait_for(lambda: len(got) >= 60)
            info = broker_runtime_info(c.broker)
            assert info["dispatchedOffset"] == 0 < info["commitLogMaxOffset"], info     # reput saw nothing
            os.kill(c.pids()["reput"], signal.SIGCONT)
            for i in range(60, 80):
                p.send(Message(TOPIC, b"m%d" % i))
        wait_for(lambda: len(got) >= 80)
        # the committed offset reaches the end: no OFFSET_MOVED reset on the way
        wait_for(lambda: consumer.offset_store.read_memory(consumer.assigned_message_queues(TOPIC)[0]) == 80)
        with lock:
            assert sorted(got) == sorted(b"m%d" % i for i in range(80)) and len(got) == 80, got
    finally:
        consumer.shutdown()
