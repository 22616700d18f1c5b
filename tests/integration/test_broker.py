"""Broker group over the wire: send / pull round trips, tags, long polling, offsets, SYNC_FLUSH."""
import json
import os
import time

import msgpack
import pytest

from rmq import protocol as P
from rmq._core import commitlog as cl
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "store")
    yield c
    c.close()


def send(c, addr, topic, body, queue_id=0, tags=None, keys=None, timeout_ms=5000):
    props = {}
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = " ".join(keys)
    return c.invoke(addr, Frame(RequestCode.SEND_MESSAGE, fields={
        "producerGroup": "pg", "topic": topic, "queueId": queue_id, "properties": props,
        "bornTimestamp": int(time.time() * 1000)}, bodies=[body]), timeout_ms)


def pull(c, addr, topic, queue_id, offset, max_nums=32, sub="*", suspend_ms=0, timeout_ms=5000, commit=-1):
    flag = (0x2 if suspend_ms else 0) | (0x1 if commit >= 0 else 0)
    return c.invoke(addr, Frame(RequestCode.PULL_MESSAGE, fields={
        "consumerGroup": "cg", "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": flag, "suspendTimeoutMillis": suspend_ms, "subscription": sub,
        "commitOffset": commit}), timeout_ms)


def pull_all(c, addr, topic, queue_id, sub="*", deadline_s=5.0):
    out, off = [], 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        r = pull(c, addr, topic, queue_id, off, sub=sub)
        if r.code == ResponseCode.SUCCESS:
            out.extend(cl.decode_records(bytes(r.bodies[0])))
            off = r.fields["nextBeginOffset"]
        elif r.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
            off = r.fields["nextBeginOffset"]
        else:
            return out, r
    raise AssertionError("pull_all did not reach the end")


def wait_for(pred, timeout_s=30.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_send_pull_round_trip_across_topics_and_queues(cluster):
    with RemotingClient() as c:
        sent = {}
        for i in range(60):
            topic = f"Topic{i % 2}"
            q = i % 4
            r = send(c, cluster.broker, topic, b"msg-%d" % i, q, tags=f"T{i % 3}", keys=[f"k{i}"])
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert r.fields["queueId"] == q
            sent.setdefault((topic, q), []).append(b"msg-%d" % i)
        for (topic, q), bodies in sent.items():
            msgs = wait_for(lambda: (lambda m: m if len(m) == len(bodies) else None)(
                pull_all(c, cluster.broker, topic, q)[0]))
            assert [m.body for m in msgs] == bodies
            assert [m.queue_offset for m in msgs] == list(range(len(bodies)))
            assert all(m.store_host and m.msg_id for m in msgs)


def test_tag_filter_over_the_wire(cluster):
    with RemotingClient() as c:
        for i in range(30):
            assert send(c, cluster.broker, "TagTopic", b"%d" % i, 0, tags=f"T{i % 3}").code == ResponseCode.SUCCESS
        msgs = wait_for(lambda: (lambda m: m if len(m) == 10 else None)(
            pull_all(c, cluster.broker, "TagTopic", 0, sub="T1")[0]))
        assert {m.tags for m in msgs} == {"T1"}


def test_long_polling_wakes_on_arrival(cluster):
    with RemotingClient() as c, RemotingClient() as c2:
        assert send(c, cluster.broker, "LP", b"first", 0).code == ResponseCode.SUCCESS
        wait_for(lambda: pull(c, cluster.broker, "LP", 0, 0).code == ResponseCode.SUCCESS)
        # park a pull at offset 1 with a long suspend, then send: the pull must be answered with it
        s = c2._socket(cluster.broker)
        f = Frame(RequestCode.PULL_MESSAGE, opaque=77, fields={
            "consumerGroup": "cg", "topic": "LP", "queueId": 0, "queueOffset": 1, "maxMsgNums": 8,
            "sysFlag": 0x2, "suspendTimeoutMillis": 10_000, "subscription": "*"})
        s.send_multipart(P.encode(f))
        assert not s.poll(300), "a pull with nothing new must be parked, not answered"
        assert send(c, cluster.broker, "LP", b"second", 0).code == ResponseCode.SUCCESS
        assert s.poll(5000), "parked pull was not woken by the arrival"
        resp = P.decode(s.recv_multipart())
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in cl.decode_records(bytes(resp.bodies[0]))] == [b"second"]


def test_parked_pull_times_out_with_not_found(cluster):
    with RemotingClient() as c:
        assert send(c, cluster.broker, "LP2", b"x", 0).code == ResponseCode.SUCCESS
        wait_for(lambda: pull(c, cluster.broker, "LP2", 0, 0).code == ResponseCode.SUCCESS)
        t0 = time.monotonic()
        r = pull(c, cluster.broker, "LP2", 0, 1, suspend_ms=300)
        assert r.code == ResponseCode.PULL_NOT_FOUND and time.monotonic() - t0 >= 0.25


def test_pull_statuses(cluster):
    with RemotingClient() as c:
        r = pull(c, cluster.broker, "NoSuchTopic", 0, 0)
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert send(c, cluster.broker, "St", b"x", 0).code == ResponseCode.SUCCESS
        wait_for(lambda: pull(c, cluster.broker, "St", 0, 0).code == ResponseCode.SUCCESS)
        assert pull(c, cluster.broker, "St", 0, 1).code == ResponseCode.PULL_NOT_FOUND
        assert pull(c, cluster.broker, "St", 0, 5).code == ResponseCode.PULL_OFFSET_MOVED
        assert pull(c, cluster.broker, "St", 99, 0).code == ResponseCode.SYSTEM_ERROR


def commit_offset(broker, topic, queue_id, offset, group="cg"):
    with RemotingClient() as c:
        assert c.invoke(broker, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
            "consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset})).code == 0


def query_offset(broker, topic, queue_id, group="cg"):
    with RemotingClient() as c:
        r = c.invoke(broker, Frame(RequestCode.QUERY_CONSUMER_OFFSET, fields={
            "consumerGroup": group, "topic": topic, "queueId": queue_id}))
    assert r.code == 0, r.remark
    return r.fields["offset"]


def test_offsets_persist_across_restart(cluster):
    commit_offset(cluster.broker, "Off", 2, 42)
    assert cluster.stop_group() == {"broker": 0, "reput": 0, "flush": 0}
    cluster.start_group()
    assert query_offset(cluster.broker, "Off", 2) == 42


def test_a_pulls_commit_offset_never_moves_the_stored_offset_back(cluster):
    """A pull's commitOffset can be overtaken by the consumer's later UPDATE_CONSUMER_OFFSET (they
    travel on different connections, e.g. at shutdown): it moves the offset forward only, while
    UPDATE_CONSUMER_OFFSET (and an admin reset) moves it either way."""
    with RemotingClient() as c:
        assert send(c, cluster.broker, "PcOff", b"x", 0).code == ResponseCode.SUCCESS
        wait_for(lambda: pull(c, cluster.broker, "PcOff", 0, 0).code == ResponseCode.SUCCESS)
        assert pull(c, cluster.broker, "PcOff", 0, 0, suspend_ms=1, commit=5).code == ResponseCode.SUCCESS
        assert query_offset(cluster.broker, "PcOff", 0) == 5           # nothing stored yet: taken
        commit_offset(cluster.broker, "PcOff", 0, 9)
        assert pull(c, cluster.broker, "PcOff", 0, 0, suspend_ms=1, commit=8).code == ResponseCode.SUCCESS
        assert query_offset(cluster.broker, "PcOff", 0) == 9           # a late pull's 8: refused
        assert pull(c, cluster.broker, "PcOff", 0, 0, suspend_ms=1, commit=12).code == ResponseCode.SUCCESS
        assert query_offset(cluster.broker, "PcOff", 0) == 12          # forward: taken
        commit_offset(cluster.broker, "PcOff", 0, 3)
        assert query_offset(cluster.broker, "PcOff", 0) == 3           # UPDATE_CONSUMER_OFFSET: back too


def test_the_periodic_offset_persist_is_written_off_the_main_thread_and_survives_kill9(tmp_path):
    """flushConsumerOffsetInterval: the broker hands consumerOffset.json to its config writer's
    thread on a timer; once the file holds a commit, a kill -9 of the group loses nothing of it."""
    path = tmp_path / "store" / "config" / "consumerOffset.json"
    with Cluster(tmp_path / "store", conf={"flushConsumerOffsetInterval": "100"}) as group:
        commit_offset(group.broker, "Off", 1, 77)

        def on_disk():
            try:
                return json.loads(path.read_text())["offsetTable"].get("Off@cg") == {"1": 77}
            except (OSError, ValueError):        # not written yet, or caught mid-replace
                return False
        wait_for(on_disk)
        group.kill_group()
        group.start_group()
        assert query_offset(group.broker, "Off", 1) == 77


def test_a_flush_consumer_offset_interval_below_the_floor_is_refused_at_start(tmp_path):
    from rmq.actors.broker import MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS
    with pytest.raises(RuntimeError):
        Cluster(tmp_path / "store", conf={"flushConsumerOffsetInterval": str(MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS - 1)})
    log = (tmp_path / "store" / "logs" / "broker.stderr.log").read_text()
    assert f"at least {MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS} ms" in log


def test_messages_survive_clean_restart_and_kill9(cluster):
    with RemotingClient() as c:
        for i in range(20):
            assert send(c, cluster.broker, "Dur", b"%d" % i, 0).code == ResponseCode.SUCCESS
    cluster.stop_group()
    cluster.start_group()
    with RemotingClient() as c:
        for i in range(20, 30):
            assert send(c, cluster.broker, "Dur", b"%d" % i, 0).code == ResponseCode.SUCCESS
    cluster.kill_group()
    cluster.start_group()
    with RemotingClient() as c:
        msgs = wait_for(lambda: (lambda m: m if len(m) == 30 else None)(pull_all(c, cluster.broker, "Dur", 0)[0]))
        assert [m.body for m in msgs] == [b"%d" % i for i in range(30)]


def test_bad_requests_change_nothing(cluster):
    with RemotingClient() as c:
        for fields in ({"topic": "../etc", "queueId": 0}, {"topic": "T", "queueId": "x"},
                       {"topic": 5}, {"queueId": 0}, {"topic": "T", "queueId": 10_000}):
            r = c.invoke(cluster.broker, Frame(RequestCode.SEND_MESSAGE, fields=fields, bodies=[b"x"]))
            assert r.code != ResponseCode.SUCCESS and r.remark
        r = c.invoke(cluster.broker, Frame(RequestCode.SEND_MESSAGE, fields={"topic": "T", "queueId": 0}))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        r = c.invoke(cluster.broker, Frame(RequestCode.SEND_BATCH_MESSAGE, fields={"topic": "T", "queueId": 0},
                                           bodies=[b"\x00\x00\x00\x30garbage"]))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        r = c.invoke(cluster.broker, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
        table = msgpack.unpackb(bytes(r.bodies[0]))["table"]
        assert table["putMessageTotal"] == 0 and table["commitLogMaxOffset"] == 0


def test_batch_send(cluster):
    with RemotingClient() as c:
        batch = cl.encode_batch([(b"b%d" % i, cl.encode_properties({"KEYS": f"bk{i}"}), 0) for i in range(100)])
        r = c.invoke(cluster.broker, Frame(RequestCode.SEND_BATCH_MESSAGE,
                                           fields={"topic": "Batch", "queueId": 1}, bodies=[batch]))
        assert r.code == 0 and r.fields["msgNum"] == 100 and r.fields["msgId"].count(",") == 99
        msgs = wait_for(lambda: (lambda m: m if len(m) == 100 else None)(pull_all(c, cluster.broker, "Batch", 1)[0]))
        assert [m.body for m in msgs] == [b"b%d" % i for i in range(100)]
        r = wait_for(lambda: (lambda r: r if r.code == 0 else None)(c.invoke(cluster.broker, Frame(
            RequestCode.QUERY_MESSAGE, fields={"topic": "Batch", "key": "bk42"}))))
        assert [m.body for m in cl.decode_records(bytes(r.bodies[0]))] == [b"b42"]


BACKLOG_REQUESTS = 20_000        # sends offered at once: several times what the broker handles in 30 ms
BACKLOG_WAIT_MS = 30             # the broker's waitTimeMillsInSendQueue for the backlog test: a drain of
                                 # sendThreadPoolQueueCapacity (10,000) sends takes longer to handle


def test_backlog_beyond_the_send_queue_wait_gets_system_busy(tmp_path):
    """Flow control under a backlog: sends offered faster than the broker appends wait in its
    queue; those that waited longer than waitTimeMillsInSendQueue since the broker read them are
    answered SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] (RocketMQ's BrokerFastFailure), not left to age in
    ZeroMQ's buffers.  Every request is answered SUCCESS or SYSTEM_BUSY, exactly the successes are
    stored (distinct queue offsets 0..n-1), and a send after the backlog succeeds."""
    import zmq
    c = Cluster(tmp_path / "backlog", conf={"waitTimeMillsInSendQueue": str(BACKLOG_WAIT_MS)}, with_namesrv=False)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    rc = RemotingClient()
    try:
        sock.connect(c.broker)
        assert send(rc, c.broker, "Backlog", b"warm").code == ResponseCode.SUCCESS     # topic created
        frames = [P.encode(Frame(RequestCode.SEND_MESSAGE, opaque=i + 1, fields={
            "producerGroup": "pg", "topic": "Backlog", "queueId": 0, "properties": {},
            "bornTimestamp": 0}, bodies=[b"%099d" % i])) for i in range(BACKLOG_REQUESTS)]
        answers: dict = {}
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN | zmq.POLLOUT)
        sent, deadline = 0, time.monotonic() + 120
        while len(answers) < BACKLOG_REQUESTS and time.monotonic() < deadline:
            if sent == BACKLOG_REQUESTS:
                poller.modify(sock, zmq.POLLIN)
            events = dict(poller.poll(1000))
            if events.get(sock, 0) & zmq.POLLOUT and sent < BACKLOG_REQUESTS:
                for _ in range(1000):
                    try:
                        sock.send_multipart(frames[sent], flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    sent += 1
                    if sent == BACKLOG_REQUESTS:
                        break
            if events.get(sock, 0) & zmq.POLLIN:
                while True:
                    try:
                        r = P.decode(sock.recv_multipart(flags=zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    assert r.opaque not in answers, f"request {r.opaque} answered twice"
                    answers[r.opaque] = r
        assert len(answers) == BACKLOG_REQUESTS, f"{BACKLOG_REQUESTS - len(answers)} requests never answered"
        codes: dict = {}
        for r in answers.values():
            codes[ResponseCode(r.code).name] = codes.get(ResponseCode(r.code).name, 0) + 1
        assert set(codes) <= {"SUCCESS", "SYSTEM_BUSY"}, codes
        busy = [r for r in answers.values() if r.code == ResponseCode.SYSTEM_BUSY]
        assert busy, f"no SYSTEM_BUSY for a backlog of {BACKLOG_REQUESTS} sends: {codes}"
        assert all("[TIMEOUT_CLEAN_QUEUE]" in r.remark for r in busy), busy[0].remark
        table = msgpack.unpackb(bytes(rc.invoke(c.broker, Frame(RequestCode.GET_BROKER_RUNTIME_INFO)).bodies[0]))
        assert 0 < table["table"]["sendShedBusy"] <= len(busy)      # refused before being decoded
        ok = {r.fields["queueOffset"]: r.opaque for r in answers.values() if r.code == ResponseCode.SUCCESS}
        assert len(ok) == codes.get("SUCCESS", 0) and sorted(ok) == list(range(1, len(ok) + 1))
        after = send(rc, c.broker, "Backlog", b"after")            # flow control lets go once the backlog is gone
        assert after.code == ResponseCode.SUCCESS and after.fields["queueOffset"] == len(ok) + 1
        stored, _ = pull_all(rc, c.broker, "Backlog", 0, deadline_s=60)
        assert [m.body for m in stored] == [b"warm"] + [b"%099d" % (ok[o] - 1) for o in sorted(ok)] + [b"after"]
    finally:
        rc.close()
        sock.close(0)
        c.close()


def test_request_waiting_too_long_gets_system_busy(tmp_path):
    """Fast failure: a send read longer than waitTimeMillsInSendQueue ago is refused with
    SYSTEM_BUSY and nothing is stored (0 ms makes every send late)."""
    c = Cluster(tmp_path / "busy", conf={"waitTimeMillsInSendQueue": "0"}, with_namesrv=False)
    try:
        with RemotingClient() as rc:
            r = send(rc, c.broker, "Busy", b"x", 0)
            assert r.code == ResponseCode.SYSTEM_BUSY and "[TIMEOUT_CLEAN_QUEUE]" in r.remark
            table = msgpack.unpackb(bytes(rc.invoke(c.broker, Frame(RequestCode.GET_BROKER_RUNTIME_INFO)).bodies[0]))
            assert table["table"]["commitLogMaxOffset"] == 0
    finally:
        c.close()


def test_a_store_path_too_deep_for_ipc_sockets_still_serves(tmp_path):
    """A store directory whose ``broker-pub.ipc`` path would not fit a Unix socket address: the
    broker and its followers meet in a private directory named after the store (ipc_dir), and the
    group serves as usual (reput dispatches, a SYNC_FLUSH-free pull sees what was sent)."""
    from rmq.actors.broker_endpoints import MAX_IPC_PATH, ipc_dir
    store = tmp_path / ("deep" * 15) / ("er" * 20) / "store"
    assert len(str(store / "broker-pub.ipc")) > MAX_IPC_PATH
    with Cluster(store) as c, RemotingClient() as rc:
        for i in range(10):
            assert send(rc, c.broker, "DeepT", b"d%d" % i, 0).code == ResponseCode.SUCCESS
        msgs = wait_for(lambda: (lambda m: m if len(m) == 10 else None)(pull_all(rc, c.broker, "DeepT", 0)[0]))
        assert [m.body for m in msgs] == [b"d%d" % i for i in range(10)]
        d = ipc_dir(str(store))
        assert d != str(store) and {"broker.ipc", "broker-pub.ipc"} <= set(os.listdir(d))
        assert c.stop_group()["broker"] == 0
        assert not os.path.exists(d)       # a broker that stops removes it (no litter in /tmp)
        c.start_group()                    # and one that starts again makes it again
        assert wait_for(lambda: pull_all(rc, c.broker, "DeepT", 0)[0])
    assert not os.path.exists(d)           # a killed group's sockets go with it (rmq.testing.Cluster)
