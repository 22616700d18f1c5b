"""POP consumption against a real broker: SimpleConsumer receive / ack / ack_batch /
change_invisible_duration, redelivery after the invisible time, the DLQ after retryMaxTimes,
POP beside push consumers, tag and SQL92 filters, the broker's refusals of bad input, and the
revive log surviving a broker restart (kill -9 cases: tests/fault/test_pop_kill9.py)."""
import threading
import time

import msgpack
import pytest

from rmq import Message, MessageSelector, Producer, PullConsumer, SimpleConsumer
from rmq.actors.pop import MAX_ACK_BITSET_BYTES, MAX_BATCH_ACK, POP_MAX_MSG_NUMS, pop_retry_topic, revive_topic
from rmq.client.admin import Admin
from rmq.client.consumer import ConsumeConcurrentlyStatus, MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.client.simple_consumer import MAX_INVISIBLE_DURATION_S, MIN_INVISIBLE_DURATION_S, AckError
from rmq.errors import FilterExpressionError, MQBrokerError, MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import create_topic, push_consumer, wait_dispatched, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("pop") / "store", conf={"enablePropertyFilter": "true"})
    yield c
    c.close()


def produce(c, topic, n, queues, **kw):
    bodies = [b"%s-%d" % (topic.encode(), i) for i in range(n)]
    with Producer(c.namesrv_addr, group="pop-pg") as p:
        for i in range(0, n, 100):
            chunk = bodies[i:i + 100]
            for q in range(queues):      # spread over the queues
                part = chunk[q::queues]
                if part:
                    p.send_batch([Message(topic, b, **kw) for b in part], queue=MessageQueue(topic, "broker-a", q))
    wait_dispatched(c, topic, queues, n, group=f"probe-{topic}")
    return bodies


def simple(c, group, subs, **kw):
    kw.setdefault("await_duration_s", 0.5)
    return SimpleConsumer(c.namesrv_addr, group, subs, **kw).start()


async def areceive(sc, want, invisible=60.0, timeout_s=30.0):
    """rmq.aio: receive(32) until ``want`` views came (or ``timeout_s``); none acked."""
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += await sc.receive(POP_MAX_MSG_NUMS, invisible)
    return got


def bits(batch_ack: dict) -> int:
    """How many messages a BatchAck acks: the set bits of its ``b`` (RocketMQ's BitSet, as bytes)."""
    return int.from_bytes(batch_ack["b"], "little").bit_count()


def drain(sc, want, invisible=30.0, ack=True, timeout_s=30.0):
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        views = sc.receive(POP_MAX_MSG_NUMS, invisible)
        if ack and views:
            sc.ack_batch(views)
        got += views
    return got


def test_eight_consumers_share_one_queue_each_message_acked_once(cluster):
    create_topic(cluster, "P1", 1)
    bodies = produce(cluster, "P1", 2000, 1)
    acked = [[] for _ in range(8)]
    errors = []
    done = threading.Event()

    def run(i):
        try:
            with SimpleConsumer(cluster.namesrv_addr, "pop-g1", {"P1": "*"}, await_duration_s=0.3) as sc:
                while not done.is_set():
                    for v in sc.receive(8, 30):
                        sc.ack(v)                     # one at a time: an ack refused would raise
                        acked[i].append(v.body)
                    if sum(len(a) for a in acked) >= len(bodies):
                        done.set()
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
            done.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    all_acked = [b for a in acked for b in a]
    assert len(all_acked) == len(bodies) and set(all_acked) == set(bodies), "each message acked exactly once"
    assert sum(1 for a in acked if a) >= 2, "the one queue was shared"
    with simple(cluster, "pop-g1", {"P1": "*"}) as sc:
        assert sc.receive(32, 5) == [], "nothing left in flight or to redeliver"


def test_unacked_messages_go_to_another_consumer_after_the_invisible_time(cluster):
    create_topic(cluster, "P2", 2)
    bodies = produce(cluster, "P2", 40, 2)
    invisible = MIN_INVISIBLE_DURATION_S * 2
    with simple(cluster, "pop-g2", {"P2": "*"}) as a, simple(cluster, "pop-g2", {"P2": "*"}) as b:
        popped_at = time.monotonic()                  # before the POPs: their invisible time ends later
        first = drain(a, 40, invisible=invisible, ack=False)
        assert sorted(v.body for v in first) == sorted(bodies)
        assert {v.delivery_attempt for v in first} == {1}
        early = b.receive(32, 30)
        # invisible to the group until the invisible time passes: checked when this receive (its
        # long poll included) ended within it; after a scheduling gap (a loaded machine) the
        # messages may be back already, legitimately: they are then part of the redelivery below
        if time.monotonic() - popped_at < invisible:
            assert early == [], "invisible to the group until the invisible time passes"
        if early:
            b.ack_batch(early)
        t0 = time.monotonic()
        again = early + drain(b, 40 - len(early), ack=True)
        assert sorted(v.body for v in again) == sorted(bodies), "every un-acked message redelivered"
        assert time.monotonic() - t0 < 20
        assert {v.delivery_attempt for v in again} == {2}
        assert {v.topic for v in again} == {"P2"}, "the subscribed topic, not the POP retry topic"
        assert all(v.properties.get("RETRY_TOPIC") == "P2" for v in again)
        assert {v.message.topic for v in again} == {pop_retry_topic("P2", "pop-g2")}
        # the first consumer's handles are spent: its acks are refused, nothing is delivered twice more
        with pytest.raises(MQBrokerError) as ei:
            a.ack(first[0])
        assert ei.value.response_code == ResponseCode.NO_MESSAGE
        with pytest.raises(AckError) as ei:
            a.ack_batch(first[:3])
        assert len(ei.value.failed) == 3
        assert b.receive(32, 5) == []


def test_change_invisible_duration_and_spent_handles(cluster):
    create_topic(cluster, "P3", 1)
    produce(cluster, "P3", 3, 1)
    with simple(cluster, "pop-g3", {"P3": "*"}) as sc:
        # 3 s invisible: the admin query, the change and the ack below are done well before then,
        # even after a scheduling gap of a loaded machine (or views[0] / views[1] would be revived
        # first); views[2], left alone, comes back after it
        views = drain(sc, 3, invisible=3.0, ack=False)
        assert len(views) == 3
        with Admin(cluster.namesrv_addr) as adm:      # consumerProgress of a POP group: 3 in flight
            row = adm.consumer_progress("pop-g3", "P3").queues[0]
        assert (row.consumer_offset, row.diff, row.inflight) == (3, 0, 3)
        old = views[0].receipt_handle
        sc.change_invisible_duration(views[0], 30)
        assert views[0].receipt_handle != old
        assert views[0].invisible_until_ms > time.time() * 1000 + 20_000
        sc.ack(views[1])
        # views[2] comes back after its 3 s; views[0] (30 s now) and views[1] (acked) do not
        back = drain(sc, 1, invisible=30, ack=False, timeout_s=15)
        assert [v.body for v in back] == [views[2].body]
        assert sc.receive(32, 30) == []
        stale = type(views[0])(views[0].message, "P3", tuple(int(x) if i < 4 else x for i, x in
                                                             enumerate(old.split(" ")[:5])), "broker-a")
        with pytest.raises(MQBrokerError) as ei:
            sc.ack(stale)                                    # the handle before the change is spent
        assert ei.value.response_code == ResponseCode.NO_MESSAGE
        sc.ack(views[0])
        sc.ack(back[0])
        with pytest.raises(MQBrokerError):
            sc.ack(views[1])                                 # acked twice
        with pytest.raises(MQBrokerError):
            sc.change_invisible_duration(views[1], 10)


def test_dlq_after_retry_max_times(cluster):
    create_topic(cluster, "P4", 1)
    produce(cluster, "P4", 2, 1)
    with RemotingClient() as rc:
        r = rc.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, fields={
            "groupName": "pop-g4"}, bodies=[msgpack.packb({"groupName": "pop-g4", "retryMaxTimes": 1})]))
        assert r.code == 0
    attempts = []
    with simple(cluster, "pop-g4", {"P4": "*"}) as sc:
        deadline = time.monotonic() + 30
        while len(attempts) < 4 and time.monotonic() < deadline:
            attempts += [v.delivery_attempt for v in sc.receive(32, 1.0)]     # never acked
        assert sorted(attempts) == [1, 1, 2, 2], "retryMaxTimes 1: a first delivery and one redelivery"
    with PullConsumer(cluster.namesrv_addr, "dlq-reader") as pc:
        mq = MessageQueue("%DLQ%pop-g4", "broker-a", 0)
        def in_dlq():
            try:
                return pc.max_offset(mq) >= 2
            except MQClientError:       # the DLQ topic is not routed yet
                return False
        wait_for(in_dlq, what="both messages in the DLQ")
        msgs = pc.pull(mq, "*", 0, 32).msg_found_list
        assert sorted(m.body for m in msgs) == [b"P4-0", b"P4-1"]
        assert {m.properties.get("RETRY_TOPIC") for m in msgs} == {"P4"}
    with simple(cluster, "pop-g4", {"P4": "*"}) as sc:
        assert sc.receive(32, 5) == []


def test_pop_and_push_groups_on_one_topic_do_not_disturb_each_other(cluster):
    create_topic(cluster, "P5", 4)
    bodies = produce(cluster, "P5", 400, 4)
    pushed = []
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            pushed.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    pc = push_consumer(cluster, "push-g5", listener, topic="P5", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    pc.start()
    try:
        with simple(cluster, "pop-g5", {"P5": "*"}) as sc:
            popped = drain(sc, 400)
        wait_for(lambda: len(pushed) >= 400, what="push consumer saw every message")
    finally:
        pc.shutdown()
    assert sorted(v.body for v in popped) == sorted(bodies)
    assert sorted(set(pushed)) == sorted(bodies)
    with Admin(cluster.namesrv_addr) as adm:
        progress = adm.consumer_progress("pop-g5", "P5")
    assert progress.total_diff == 0 and all(r.inflight == 0 for r in progress.queues)


def test_tag_and_sql92_filters(cluster):
    create_topic(cluster, "P6", 2)
    with Producer(cluster.namesrv_addr, group="pop-pg") as p:
        for i in range(60):
            p.send(Message("P6", b"%d" % i, tags="a" if i % 3 else "b", properties={"n": str(i)}))
    wait_dispatched(cluster, "P6", 2, 60, group="probe-P6")
    with simple(cluster, "pop-g6a", {"P6": "b"}) as sc:
        got = drain(sc, 20)
        assert sorted(int(v.body) for v in got) == list(range(0, 60, 3))
        assert {v.tag for v in got} == {"b"}
    with simple(cluster, "pop-g6b", {"P6": MessageSelector.by_sql("n >= 50 AND TAGS = 'a'")}) as sc:
        got = drain(sc, 6)
        assert sorted(int(v.body) for v in got) == [i for i in range(50, 60) if i % 3]
        assert sc.receive(32, 5) == []
    with pytest.raises(FilterExpressionError) as ei:      # checked on the client, before any request
        SimpleConsumer(cluster.namesrv_addr, "pop-g6d", {"P6": "b"}).subscribe("P6", MessageSelector("SQL92", "n >"))
    assert "column 4" in str(ei.value)


def test_bad_input_is_refused_and_changes_nothing(cluster):
    create_topic(cluster, "P7", 1)
    produce(cluster, "P7", 5, 1)
    sc = simple(cluster, "pop-g7", {"P7": "*"})
    try:
        for n in (0, POP_MAX_MSG_NUMS + 1, 1.5, True):
            with pytest.raises(ValueError):
                sc.receive(n, 10)
        for s in (0, MIN_INVISIBLE_DURATION_S / 2, MAX_INVISIBLE_DURATION_S + 1, "10"):
            with pytest.raises(ValueError):
                sc.receive(1, s)
        with pytest.raises(MQClientError):
            SimpleConsumer(cluster.namesrv_addr, "pop-g7", {"NoSuchTopicP7": "*"}).start()
        for kw in ({"group": ""}, {"init_mode": "FIRST"}, {"await_duration_s": -1}, {"await_duration_s": True}):
            with pytest.raises(ValueError):
                SimpleConsumer(cluster.namesrv_addr, **{"group": "pop-g7", "subscriptions": {"P7": "*"}, **kw})
        with RemotingClient() as rc:
            def pop(**f):
                fields = {"consumerGroup": "pop-g7", "topic": "P7", "queueId": -1, "maxMsgNums": 4,
                          "invisibleTime": 10_000, "pollTime": 0, **f}
                return rc.invoke(cluster.broker, Frame(RequestCode.POP_MESSAGE, fields=fields))
            assert pop(maxMsgNums=POP_MAX_MSG_NUMS + 1).code == ResponseCode.SYSTEM_ERROR
            assert pop(invisibleTime=10).code == ResponseCode.SYSTEM_ERROR
            assert pop(invisibleTime="x").code == ResponseCode.SYSTEM_ERROR
            assert pop(queueId=5).code == ResponseCode.SYSTEM_ERROR
            assert pop(topic="NoSuchTopicP7").code == ResponseCode.TOPIC_NOT_EXIST
            assert pop(expType="XPATH").code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            r = pop(expType="SQL92", exp="a >")
            assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "column" in r.remark
            for handle in ("", "1 2 3", "a b c d 0 broker-a 0 1", "1 2 3 4 9 broker-a 0 1", "-1 2 3 4 0 b 0 1",
                           "x" * 600, 17):
                r = rc.invoke(cluster.broker, Frame(RequestCode.ACK_MESSAGE, fields={
                    "consumerGroup": "pop-g7", "topic": "P7", "extraInfo": handle}))
                assert r.code == ResponseCode.SYSTEM_ERROR, handle
                r = rc.invoke(cluster.broker, Frame(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields={
                    "consumerGroup": "pop-g7", "topic": "P7", "extraInfo": handle, "invisibleTime": 5000}))
                assert r.code == ResponseCode.SYSTEM_ERROR, handle
            ok = {"c": "pop-g7", "t": "P7", "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 5000, "b": [0]}
            for body in (msgpack.packb({"a": 1}), msgpack.packb([]), msgpack.packb({"acks": []}),
                         msgpack.packb({"acks": [{"t": "P7"}]}), msgpack.packb({"acks": [{**ok, "c": "other"}]}),
                         msgpack.packb({"acks": [{**ok, "r": "7"}]}), msgpack.packb({"acks": [{**ok, "b": [-1]}]}),
                         msgpack.packb({"acks": [{**ok, "so": "0"}]}), msgpack.packb({"acks": [{**ok, "t": "NoP7"}]}),
                         msgpack.packb({"acks": [{**ok, "b": list(range(MAX_BATCH_ACK + 1))}]}), b"\xc1"):
                r = rc.invoke(cluster.broker, Frame(RequestCode.BATCH_ACK_MESSAGE, fields={"consumerGroup": "pop-g7"},
                                                    bodies=[body]))
                assert r.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.TOPIC_NOT_EXIST), body[:40]
            r = rc.invoke(cluster.broker, Frame(RequestCode.BATCH_ACK_MESSAGE, fields={"consumerGroup": "pop-g7"},
                                                bodies=[msgpack.packb({"acks": [ok]})]))
            assert r.code == ResponseCode.SUCCESS and r.fields["failed"] == [[0, 0]], "not in flight: refused"
        # nothing above took a message: all 5 are still there, first delivery
        got = drain(sc, 5)
        assert len(got) == 5 and {v.delivery_attempt for v in got} == {1}
    finally:
        sc.shutdown()


def test_sql92_needs_enable_property_filter(tmp_path):
    with Cluster(tmp_path / "store") as c:
        create_topic(c, "P8", 1)
        with simple(c, "pop-g8", {"P8": MessageSelector.by_sql("a > 1")}) as sc:
            with pytest.raises(MQBrokerError) as ei:
                sc.receive(1, 10)
            assert ei.value.response_code == ResponseCode.SYSTEM_ERROR and "SQL92" in str(ei.value)


def test_long_polling_receive_wakes_on_arrival(cluster):
    create_topic(cluster, "P9", 2)
    with SimpleConsumer(cluster.namesrv_addr, "pop-g9", {"P9": "*"}, await_duration_s=10) as sc:
        result = []
        t = threading.Thread(target=lambda: result.append((sc.receive(32, 10), time.monotonic())))
        t.start()
        time.sleep(0.3)       # let the receive be held on the broker (not a correctness wait)
        with Producer(cluster.namesrv_addr, group="pop-pg") as p:
            sent_at = time.monotonic()
            p.send(Message("P9", b"wake"))
        t.join(15)
        views, at = result[0]
        assert [v.body for v in views] == [b"wake"]
        assert at - sent_at < 8, "answered on arrival, not at the end of the poll"
        sc.ack(views[0])


def _write_non_json_revive_records(c, store_path) -> None:
    """With the group down: a record whose body is not JSON appended to every revive queue,
    after the real checkpoints and acks, and a checkpoint whose offsets reach CK_SPAN_MAX past
    its startOffset (not one a broker writes)."""
    import orjson

    from rmq._core import commitlog as _cl
    from rmq.actors.broker import store_config_from_settings
    from rmq.actors.pop import CK_SPAN_MAX, CK_TAG, REVIVE_QUEUE_NUM
    from rmq.broker_conf import actor_settings
    from rmq.store.message_store import MessageStore
    settings = actor_settings(c.conf_path, {"storePathRootDir": str(store_path)}, "broker")
    store = MessageStore(config=store_config_from_settings(settings))
    try:
        props = _cl.encode_properties({"TAGS": CK_TAG, "WAIT": "false"})
        for rq in range(REVIVE_QUEUE_NUM):
            wide = orjson.dumps({"so": 5, "pt": 1, "it": 60_000, "n": 2, "q": 0, "t": "PR", "c": "pop-gr",
                                 "d": [0, CK_SPAN_MAX], "bn": "broker-a"})
            batch = _cl.encode_batch([(b"\x00 not a checkpoint {", props, 0), (wide, props, 0)])
            assert store.put_encoded(revive_topic("TestCluster"), rq, batch, None, 0, int(time.time() * 1000),
                                     None, 0, 2).ok
        store.commitlog.flush(0)
    finally:
        store.shutdown()


@pytest.mark.parametrize("restart", ["kill", "stop, records not JSON"])
def test_in_flight_messages_survive_a_broker_restart(tmp_path, restart):
    """Restart: the CK table is rebuilt from the revive log; acked messages stay acked,
    un-acked ones come back after their invisible time, the pop offset does not go back.  After
    a clean stop a record of the revive log whose body is not JSON (written by hand) is logged
    and skipped, and the checkpoints around it still count."""
    c = Cluster(tmp_path / "store")
    try:
        create_topic(c, "PR", 2)
        bodies = produce(c, "PR", 100, 2)
        with simple(c, "pop-gr", {"PR": "*"}) as sc:
            got = drain(sc, 60, invisible=3, ack=False)
            acked = got[:30]
            sc.ack_batch(acked)
        if restart == "kill":
            c.kill_group()
        else:
            c.stop_group()
            _write_non_json_revive_records(c, tmp_path / "store")
        c.start_group()
        with simple(c, "pop-gr", {"PR": "*"}) as sc:
            rest = drain(sc, 70, invisible=30, timeout_s=60)
        assert sorted(v.body for v in rest) == sorted(set(bodies) - {v.body for v in acked})
        with PullConsumer(c.namesrv_addr, "revive-reader") as pc:    # the revive log is a topic of its own
            assert pc.max_offset(MessageQueue(revive_topic("TestCluster"), "broker-a", 0)) >= 0
        if restart != "kill":
            logs = "".join(f.read_text(errors="replace") for f in (tmp_path / "store").rglob("*.log"))
            assert "is not JSON: skipped" in logs and "is not a checkpoint: skipped" in logs
    finally:
        c.close()


def test_aio_simple_consumer(cluster):
    import asyncio

    from rmq.aio import SimpleConsumer as AioSimpleConsumer

    create_topic(cluster, "PA", 4)
    bodies = produce(cluster, "PA", 300, 4)

    async def main():
        async with AioSimpleConsumer(cluster.namesrv_addr, "pop-ga", {"PA": "*"}, await_duration_s=0.3) as sc:
            got = []

            async def loop():                 # four receives in flight at once on one consumer
                while len(got) < 300:
                    views = await sc.receive(32, 30)
                    if not views:
                        return
                    got.extend(views)
                    await sc.ack_batch(views[1:])
                    await sc.ack(views[0])
            await asyncio.wait_for(asyncio.gather(*(loop() for _ in range(4))), 60)
            assert sorted(v.body for v in got) == sorted(bodies)
            with pytest.raises(MQBrokerError):
                await sc.ack(got[0])
            with pytest.raises(ValueError):
                await sc.receive(0, 10)
        # change_invisible_duration, and a redelivery after a short invisible time
        with Producer(cluster.namesrv_addr, group="pop-pg") as p:
            p.send(Message("PA", b"late"))
        async with AioSimpleConsumer(cluster.namesrv_addr, "pop-ga", {"PA": "*"}, await_duration_s=2) as sc:
            views = []
            while not views:
                views = await sc.receive(1, 10)       # long enough to change it whatever the load
            await sc.change_invisible_duration(views[0], 2)
            again = []
            while not again:
                again = await sc.receive(1, 30)
            assert again[0].body == b"late" and again[0].delivery_attempt == 2
            await sc.ack(again[0])
        with pytest.raises(MQClientError):
            await AioSimpleConsumer(cluster.namesrv_addr, "pop-ga", {"NoSuchTopicPA": "*"}).start()

    asyncio.run(main())


def test_aio_acks_of_concurrent_tasks_merge(cluster):
    """rmq.aio: ack / ack_batch calls made while one is in flight go as one BATCH_ACK_MESSAGE;
    each caller still gets its own outcome: an AckError naming only its stale views, NO_MESSAGE
    for a stale single ack, a whole-request refusal (a view of a topic that does not exist) only
    for the call that caused it.  Every other message is acked once and never delivered again."""
    import asyncio

    from rmq.aio import SimpleConsumer as AioSimpleConsumer
    from rmq.client.simple_consumer import MessageView

    create_topic(cluster, "PM", 4)
    bodies = produce(cluster, "PM", 200, 4)
    sent = []                                   # the BatchAck lists of the requests sent
    singles = []                                # the ACK_MESSAGE requests sent

    class Counting(AioSimpleConsumer):
        async def _invoke(self, addr, frame, timeout_ms):
            if frame.code == RequestCode.BATCH_ACK_MESSAGE:
                sent.append(msgpack.unpackb(frame.bodies[0])["acks"])
            elif frame.code == RequestCode.ACK_MESSAGE:
                singles.append(frame.fields["extraInfo"])
            return await super()._invoke(addr, frame, timeout_ms)

    async def main():
        async with Counting(cluster.namesrv_addr, "pop-gm", {"PM": "*"}, await_duration_s=0.3,
                            init_mode="MIN") as sc:
            got = await areceive(sc, 200)
            assert sorted(v.body for v in got) == sorted(bodies)
            got, ones = got[:160], got[160:]
            stale, parts = got[:10], [got[10 + 30 * k:40 + 30 * k] for k in range(5)]
            await sc.ack_batch(stale)                  # acked: a second ack of them is refused
            assert len(sent) == 1
            bogus = MessageView(got[0].message, "NoSuchTopicPM", got[0]._ck, got[0].broker_name)
            outcomes = await asyncio.gather(sc.ack_batch(parts[0]), sc.ack_batch(stale), sc.ack_batch(parts[1]),
                                            sc.ack_batch(parts[2]), return_exceptions=True)
            assert outcomes[0] is None and outcomes[2] is None and outcomes[3] is None
            assert isinstance(outcomes[1], AckError) and outcomes[1].failed == stale
            assert len(sent) == 2, "four calls made together go as one request"
            assert sum(bits(a) for a in sent[1]) == 100
            outcomes = await asyncio.gather(sc.ack_batch(parts[3]), sc.ack_batch([bogus]), sc.ack_batch(parts[4]),
                                            return_exceptions=True)
            assert outcomes[0] is None and outcomes[2] is None
            assert isinstance(outcomes[1], MQBrokerError) and outcomes[1].response_code == ResponseCode.TOPIC_NOT_EXIST
            assert len(sent) == 6, "the refused merged request went again call by call"
            # single acks: alone an ACK_MESSAGE, made together one BATCH_ACK_MESSAGE; a stale one
            # is an MQBrokerError NO_MESSAGE for its own caller only
            await sc.ack(ones[0])
            assert len(singles) == 1 and len(sent) == 6
            outcomes = await asyncio.gather(*(sc.ack(v) for v in ones), return_exceptions=True)
            assert isinstance(outcomes[0], MQBrokerError) and outcomes[0].response_code == ResponseCode.NO_MESSAGE
            assert outcomes[1:] == [None] * 39
            assert len(singles) == 1 and len(sent) == 7 and sum(bits(a) for a in sent[6]) == 40
            with pytest.raises(MQBrokerError) as e:
                await sc.ack(ones[1])
            assert e.value.response_code == ResponseCode.NO_MESSAGE and len(singles) == 2
            with pytest.raises(MQClientError):
                await sc.ack("not a view")                 # refused before anything is queued
            assert len(singles) == 2 and len(sent) == 7
            assert not await sc.receive(32, 60), "every message acked once"

    asyncio.run(main())


def test_ack_async_merges_and_shutdown_sends_what_was_asked(cluster):
    """SimpleConsumer.ack_async (RocketMQ 5's ackAsync): futures done with None, NO_MESSAGE for a
    view no longer in flight; acks asked for while one is on its way go in fewer requests than
    acks; shutdown sends the acks asked for before it, so none of those messages comes back."""
    create_topic(cluster, "PAA", 2)
    bodies = produce(cluster, "PAA", 128, 2)
    requests = []

    class Counting(SimpleConsumer):
        def _invoke(self, addr, frame, timeout_ms):
            if frame.code in (RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE):
                requests.append(frame.code)
            return super()._invoke(addr, frame, timeout_ms)

    # the acks below are sent well within the invisible time, even after a scheduling gap of a loaded
    # machine (a message revived before its ack would make that ack fail)
    invisible = 5.0
    popped_at = time.monotonic()                  # before the POPs: their invisible time ends later
    with Counting(cluster.namesrv_addr, "pop-gaa", {"PAA": "*"}, await_duration_s=0.3, init_mode="MIN") as sc:
        got = drain(sc, 128, invisible=invisible, ack=False)
        assert sorted(v.body for v in got) == sorted(bodies)
        futs = [sc.ack_async(v) for v in got[:96]]
        assert [f.result(30) for f in futs] == [None] * 96
        assert 1 <= len(requests) < 96
        stale = sc.ack_async(got[0])
        with pytest.raises(MQBrokerError) as e:
            stale.result(30)
        assert e.value.response_code == ResponseCode.NO_MESSAGE
        with pytest.raises(MQClientError):
            sc.ack_async("not a view")
        last = [sc.ack_async(v) for v in got[96:]]          # shutdown (leaving the block) sends these
    assert all(f.done() and f.exception() is None for f in last)
    with simple(cluster, "pop-gaa", {"PAA": "*"}) as sc:
        # until 2 s past the invisible time (revive scans every 0.1 s): nothing comes back
        deadline = popped_at + invisible + 2
        while time.monotonic() < deadline:
            assert sc.receive(32, 30) == []


def test_shutdown_with_the_broker_gone_fails_the_acks_not_sent(tmp_path, monkeypatch):
    """ack_async and a broker that died: shutdown() waits ACK_FLUSH_TIMEOUT_S, then fails the acks
    not sent and waits only for the request on its way; every future ends with an error."""
    from rmq.client import simple_consumer as S
    c = Cluster(tmp_path / "store")
    try:
        create_topic(c, "PAD", 1)
        produce(c, "PAD", 40, 1)
        sc = simple(c, "pop-gad", {"PAD": "*"}, timeout_ms=500)
        got = drain(sc, 40, invisible=60, ack=False)
        assert len(got) == 40
        c.kill_group()
        monkeypatch.setattr(S, "ACK_FLUSH_TIMEOUT_S", 0.3)
        futs = [sc.ack_async(v) for v in got]
        acker = sc._acker                       # the ack thread: gone before the sockets close
        sc.shutdown()
        assert not acker.is_alive()
        assert all(f.done() for f in futs)
        errors = [f.exception() for f in futs]
        assert all(isinstance(e, (RemotingError, MQClientError)) for e in errors), errors
    finally:
        c.close()


def test_aio_ack_sender_cancelled_before_it_ran_fails_its_waiters(cluster):
    """rmq.aio: an ack sender task cancelled before its first step (the loop tearing down) still
    counts itself out: the calls waiting on it get an MQClientError (never hang), and the next
    ack goes through a new sender."""
    import asyncio

    from rmq.aio import SimpleConsumer as AioSimpleConsumer

    create_topic(cluster, "PX", 1)
    produce(cluster, "PX", 20, 1)

    async def main():
        async with AioSimpleConsumer(cluster.namesrv_addr, "pop-gx", {"PX": "*"}, await_duration_s=0.3,
                                     init_mode="MIN") as sc:
            views = await areceive(sc, 20)
            call = asyncio.ensure_future(sc.ack_batch(views))
            await asyncio.sleep(0)                     # the call queued its acks and a sender task
            senders = list(sc._pumps)
            assert senders
            for t in senders:
                t.cancel()                             # before the sender's first step
            with pytest.raises(MQClientError):
                await asyncio.wait_for(call, 10)
            await asyncio.wait_for(sc.ack_batch(views), 10)   # a new sender: acked now
            assert not await sc.receive(32, 60)

    asyncio.run(main())


def test_aio_ack_batch_over_max_batch_ack_and_two_senders(cluster, monkeypatch):
    """rmq.aio: one ack_batch of more than MAX_BATCH_ACK views goes as requests of at most
    MAX_BATCH_ACK each, and with two ack requests allowed in flight per broker
    (ACK_REQUESTS_IN_FLIGHT) concurrent calls all complete and every message is acked once."""
    import asyncio

    from rmq.aio import SimpleConsumer as AioSimpleConsumer
    from rmq.aio import simple_consumer as A

    create_topic(cluster, "PB", 2)
    bodies = produce(cluster, "PB", MAX_BATCH_ACK + 100, 2)
    sizes = []

    class Counting(AioSimpleConsumer):
        async def _invoke(self, addr, frame, timeout_ms):
            if frame.code == RequestCode.BATCH_ACK_MESSAGE:
                sizes.append(sum(bits(a) for a in msgpack.unpackb(frame.bodies[0])["acks"]))
            return await super()._invoke(addr, frame, timeout_ms)

    async def main():
        async with Counting(cluster.namesrv_addr, "pop-gb", {"PB": "*"}, await_duration_s=0.3,
                            init_mode="MIN") as sc:
            got = await areceive(sc, len(bodies))
            assert sorted(v.body for v in got) == sorted(bodies)
            await sc.ack_batch(got[:MAX_BATCH_ACK + 50])
            assert sizes == [MAX_BATCH_ACK, 50]
            monkeypatch.setattr(A, "ACK_REQUESTS_IN_FLIGHT", 2)
            sc._lanes.clear()                       # new lanes take the new limit
            rest = got[MAX_BATCH_ACK + 50:]
            outcomes = await asyncio.wait_for(asyncio.gather(*(sc.ack(v) for v in rest), return_exceptions=True), 30)
            assert outcomes == [None] * len(rest)
            assert all(lane.sending == 0 and not lane.waiting for lane in sc._lanes.values())
            assert not await sc.receive(32, 60), "every message acked once"

    asyncio.run(main())


def test_a_batch_ack_as_rocketmqs_bitset_acks_exactly_its_bits(cluster):
    """BATCH_ACK_MESSAGE with ``b`` as RocketMQ's BitSet (``BitSet.toByteArray()``: little-endian
    bytes, what rmq's clients send): its set bits are acked once; a bit set in two BatchAcks of one
    request, one acked before and one past the checkpoint are in ``failed``; a list and a BitSet mix
    in one request; a BitSet longer than MAX_ACK_BITSET_BYTES is refused and changes nothing."""
    from rmq._core.consume import ACK_BITSET_MAX_BYTES
    assert ACK_BITSET_MAX_BYTES == MAX_ACK_BITSET_BYTES
    create_topic(cluster, "PBS", 1)
    produce(cluster, "PBS", 12, 1)
    sc = simple(cluster, "pop-gbs", {"PBS": "*"})
    try:
        views = drain(sc, 12, ack=False)
        assert len(views) == 12 and len({v._ck for v in views}) == 1
        so, pt, it, rq, retry = views[0]._ck
        assert [v.message.queue_offset - so for v in views] == list(range(12))
        base = {"c": "pop-gbs", "t": "PBS", "r": retry, "so": so, "q": 0, "rq": rq, "pt": pt, "it": it}

        def bitset(*ds):
            m = sum(1 << d for d in set(ds))
            return m.to_bytes((m.bit_length() + 7) // 8, "little")

        def batch_ack(*bs):
            with RemotingClient() as rc:
                r = rc.invoke(cluster.broker, Frame(RequestCode.BATCH_ACK_MESSAGE, fields={"consumerGroup": "pop-gbs"},
                                                    bodies=[msgpack.packb({"brokerName": "broker-a", "acks": [
                                                        {**base, "b": b} for b in bs]})]))
            return r.code, sorted(map(tuple, r.fields.get("failed", ()))), r.remark

        sc.ack(views[4])                                                   # acked before
        assert batch_ack(bitset(0, 1, 4, 40), bitset(1, 2)) == (ResponseCode.SUCCESS, [(0, 4), (0, 40), (1, 1)], "")
        code, _, remark = batch_ack(bitset(3), b"\x01" * (MAX_ACK_BITSET_BYTES + 1))
        assert code == ResponseCode.SYSTEM_ERROR and "at most" in remark
        code, _, remark = batch_ack(bitset(3), b"\x01" * (MAX_ACK_BITSET_BYTES * 2 + 1))   # past the body's bin limit
        assert code == ResponseCode.SYSTEM_ERROR and "not valid msgpack" in remark
        assert batch_ack(bitset(3, 5), [6, 6, 7], bitset(0)) == (ResponseCode.SUCCESS, [(1, 6), (2, 0)], "")
        assert batch_ack(bitset(*range(12))) == (ResponseCode.SUCCESS, [(0, d) for d in (0, 1, 2, 3, 4, 5, 6, 7)], "")
        assert batch_ack(b"") == (ResponseCode.SUCCESS, [], "")                # an empty BitSet acks nothing
        assert sc.receive(32, 30) == []                                    # all 12 acked once: none comes back
    finally:
        sc.shutdown()


def test_a_batch_ack_with_repeats_and_acked_messages_refuses_exactly_those(cluster):
    """BATCH_ACK_MESSAGE: a message repeated within a BatchAck, or in two BatchAcks of one request,
    and one acked before are each in ``failed`` (as [ack index, bit]); every other is acked once."""
    create_topic(cluster, "PBR", 1)
    produce(cluster, "PBR", 6, 1)
    sc = simple(cluster, "pop-gbr", {"PBR": "*"})
    try:
        views = drain(sc, 6, ack=False)
        assert len(views) == 6 and len({v._ck for v in views}) == 1          # one checkpoint
        so, pt, it, rq, retry = views[0]._ck
        sc.ack(views[4])                                                     # acked before
        base = {"c": "pop-gbr", "t": "PBR", "r": retry, "so": so, "q": 0, "rq": rq, "pt": pt, "it": it}
        d = [v.message.queue_offset - so for v in views]

        def batch_ack(*bit_lists):
            with RemotingClient() as rc:
                r = rc.invoke(cluster.broker, Frame(RequestCode.BATCH_ACK_MESSAGE, fields={"consumerGroup": "pop-gbr"},
                                                    bodies=[msgpack.packb({"brokerName": "broker-a", "acks": [
                                                        {**base, "b": bits} for bits in bit_lists]})]))
            assert r.code == ResponseCode.SUCCESS, r.remark
            return sorted(map(tuple, r.fields["failed"]))

        assert batch_ack([d[0], d[1], d[1]], [d[1], d[2]], [d[4]]) == [(0, d[1]), (1, d[1]), (2, d[4])]
        assert batch_ack([d[0], d[3], d[5]]) == [(0, d[0])]                  # d[3], d[5]: now acked
        assert batch_ack([d[3]]) == [(0, d[3])]
        assert batch_ack(d) == [(0, x) for x in sorted(d)]                   # all six acked: none in flight
    finally:
        sc.shutdown()
