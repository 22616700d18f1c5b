"""The consumer's wire calls without any I/O (rmq.client.consumer_api.ConsumerCalls, driven by
rmq.client.calls): a scripted transport answers or fails each request a call yields, in order,
and every script runs under the blocking and the awaiting driver with the same outcome."""

import pytest

from rmq._core import commitlog as cl
from rmq.client.consumer_api import ConsumerCalls
from rmq.client.message import MessageQueue
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, RequestCode, ResponseCode, pack_body
from tests.unit.call_drivers import under_both_drivers

NS = "127.0.0.1:9876"
MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"
MQ = MessageQueue("orders", "broker-a", 3)


def _route(addrs: dict) -> Frame:
    return Frame(ResponseCode.SUCCESS, bodies=[pack_body({
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
        "brokerDatas": [{"brokerName": "broker-a", "cluster": "c", "brokerAddrs": addrs}]})])


def _run(make_call, steps, core_of=lambda: ConsumerCalls(NS)):
    """Run ``make_call(core)`` against ``steps`` ([(addr, request code, answer Frame or exception)])
    under both drivers; the outcome (result or exception), the requests made ([(addr, code,
    fields but the clock's bornTimestamp)]) and the sync run's core.  The invoke does what ConsumerAPI.invoke does around the
    transport: ConsumerCalls._answered bookkeeping."""
    def setup():
        core, todo, asked = core_of(), list(steps), []

        def invoke(addr, frame, timeout_ms):
            assert todo, f"unexpected request {frame.code} to {addr}"
            want_addr, want_code, answer = todo.pop(0)
            asked.append((addr, frame.code, {k: v for k, v in frame.fields.items() if k != "bornTimestamp"}))
            assert (addr, frame.code) == (want_addr, want_code)
            core._answered(addr, answer)
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return make_call(core), invoke, (core, todo, asked)

    runs = []
    for out, (core, todo, asked) in under_both_drivers(setup):
        assert todo == [], f"requests never made: {todo}"
        runs.append((out, asked, core))
    (o1, a1, core), (o2, a2, _) = runs
    assert a1 == a2
    if isinstance(o1, Exception):
        assert (type(o1), str(o1)) == (type(o2), str(o2))
    else:
        assert o1 == o2
    return o1, a1, core


def test_route_comes_from_the_name_server_that_answers():
    ns2 = "127.0.0.1:9877"
    core = ConsumerCalls(f"{NS};{ns2}")
    call = core._fetch_route("orders")
    first, frame, _ = next(call)                      # the NameServers are tried in a random order
    assert first in (NS, ns2) and frame.code == RequestCode.GET_ROUTEINFO_BY_TOPIC and frame.fields == {"topic": "orders"}
    second, frame, _ = call.throw(RemotingTimeoutError("no answer"))
    assert {first, second} == {NS, ns2}
    with pytest.raises(StopIteration) as stop:
        call.send(_route({"0": MASTER, "1": SLAVE}))
    assert stop.value.value.master_addr("broker-a") == MASTER
    assert [r.topic for r in core.cached_routes()] == ["orders"]
    assert core.all_broker_addrs() == [MASTER] and core.heartbeat_addrs() == [MASTER, SLAVE]


def test_no_name_server_answering_raises_and_caches_nothing():
    out, _, core = _run(lambda c: c._fetch_route("orders"),
                        [(NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, RemotingTimeoutError("x"))])
    assert isinstance(out, RemotingError) and "no NameServer" in str(out)
    assert core.cached_routes() == []


def test_unknown_topic_is_none():
    out, _, _ = _run(lambda c: c._fetch_route("nope"),
                     [(NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, Frame(ResponseCode.TOPIC_NOT_EXIST))])
    assert out is None


def test_offset_query_falls_back_to_the_slave_when_the_master_does_not_answer():
    out, asked, core = _run(lambda c: c._query_consumer_offset("cg", MQ), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER, "1": SLAVE})),
        (MASTER, RequestCode.QUERY_CONSUMER_OFFSET, RemotingTimeoutError("master gone")),
        (SLAVE, RequestCode.QUERY_CONSUMER_OFFSET, Frame(ResponseCode.SUCCESS, fields={"offset": 42})),
    ])
    assert out == 42
    assert asked[1][2] == asked[2][2] == {"consumerGroup": "cg", "topic": "orders", "queueId": 3}
    assert MASTER in core.pull_from.suspects()        # the next read choices avoid it


def test_offset_query_not_found_is_minus_one_and_a_refusal_names_the_broker():
    out, _, _ = _run(lambda c: c._query_consumer_offset("cg", MQ), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.QUERY_CONSUMER_OFFSET, Frame(ResponseCode.QUERY_NOT_FOUND)),
    ])
    assert out == -1
    out, _, _ = _run(lambda c: c._max_offset(MQ), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.GET_MAX_OFFSET, Frame(ResponseCode.SYSTEM_ERROR, remark="disk full")),
    ])
    assert isinstance(out, MQBrokerError) and out.broker_addr == MASTER and "max offset of" in str(out)


def test_a_group_without_a_master_has_no_address_for_locks():
    out, _, _ = _run(lambda c: c._broker_addr("broker-a", "orders"),
                     [(NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"1": SLAVE}))])
    assert isinstance(out, MQClientError) and "the broker[broker-a] does not exist" in str(out)


def test_refused_send_back_sends_a_copy_to_the_retry_topic():
    m = cl.MessageExt()
    m.topic, m.body, m.properties, m.reconsume_times = "orders", b"x", {"TAGS": "t"}, 2
    m.store_host = bytes([127, 0, 0, 1, 0, 0, 0x2a, 0x9f])
    out, asked, _ = _run(lambda c: c._send_message_back("cg", MQ, m, 0, 16), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.CONSUMER_SEND_MSG_BACK, Frame(ResponseCode.SYSTEM_ERROR, remark="busy")),
        (MASTER, RequestCode.SEND_MESSAGE, Frame(ResponseCode.SUCCESS)),
    ])
    assert out is None
    assert asked[2][2]["topic"] == "%RETRY%cg" and asked[2][2]["reconsumeTimes"] == 3


def test_pull_suggestion_picks_the_next_pulls_broker_and_a_failed_pull_puts_the_route_in_doubt():
    not_found = Frame(ResponseCode.PULL_NOT_FOUND, fields={"nextBeginOffset": 0, "minOffset": 0, "maxOffset": 0,
                                                          "suggestWhichBrokerId": 1})
    out, asked, core = _run(lambda c: c._pull("cg", MQ, 0, 32), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER, "1": SLAVE})),
        (MASTER, RequestCode.PULL_MESSAGE, not_found),
    ])
    assert out.next_begin_offset == 0 and core.pull_from.suggested(MQ) == 1
    assert asked[1][2]["queueOffset"] == 0 and asked[1][2]["maxMsgNums"] == 32

    def failed_pull(c):                                 # the route cached, the slave suggested
        c._routes["orders"] = core._routes["orders"]
        c.pull_from.update(MQ, 1)
        return c._pull("cg", MQ, 0, 32)

    out, _, after = _run(failed_pull, [(SLAVE, RequestCode.PULL_MESSAGE, RemotingTimeoutError("slave gone"))])
    assert isinstance(out, RemotingTimeoutError)
    assert "orders" in after._route_doubt and SLAVE in after.pull_from.suspects()


def _pull_core(client: ConsumerCalls, **kw):
    """A PullConsumerCalls whose client is the I/O-free ``client``."""
    from rmq.client.consumer import PullConsumerCalls

    class Core(PullConsumerCalls):
        def _client(self):
            return self.api

    core = Core(NS, "cg", **kw)
    core.api = client
    return core


def test_pull_consumer_start_position_without_a_committed_offset_follows_consume_from_where():
    made = []

    def position(client):
        pc = _pull_core(client, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        pc.assign([MQ])
        made.append(pc)
        return pc._position(MQ)

    out, _, _ = _run(position, [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.QUERY_CONSUMER_OFFSET, Frame(ResponseCode.QUERY_NOT_FOUND)),
        (MASTER, RequestCode.GET_MIN_OFFSET, Frame(ResponseCode.SUCCESS, fields={"offset": 5}))])
    assert out == 5
    assert [(pc._positions, pc._committed) for pc in made] == [({MQ: 5}, {})] * 2


def test_pull_consumer_commit_stores_only_the_positions_that_moved():
    other = MessageQueue("orders", "broker-a", 1)
    made = []

    def commit(client):
        pc = _pull_core(client)
        pc.assign([MQ, other])
        pc._positions, pc._committed = {MQ: 10, other: 7}, {other: 7}
        made.append(pc)
        return pc._commit_sync()

    _, asked, _ = _run(commit, [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.UPDATE_CONSUMER_OFFSET, Frame(ResponseCode.SUCCESS))])
    assert asked[1][2] == {"consumerGroup": "cg", "topic": "orders", "queueId": 3, "commitOffset": 10}
    assert [pc._committed for pc in made] == [{MQ: 10, other: 7}] * 2
    with pytest.raises(MQClientError, match="not assigned"):
        made[0].seek(MessageQueue("orders", "broker-a", 2), 0)


def _member(client: ConsumerCalls, client_id: str = "me@1"):
    """A PushConsumerCalls host with a push consumer's settings, on the I/O-free ``client``."""
    from rmq.client.consumer import ConsumeFromWhere, MessageModel, PushConsumerCalls
    from rmq.client.offset_store import OffsetStore
    from rmq.client.consumer_api import SubscriptionData
    from rmq.client.rebalance import AllocateMessageQueueAveragely

    m = PushConsumerCalls()
    m.api, m.group, m.client_id, m.clustering = client, "cg", client_id, True
    m.subscriptions = {"orders": SubscriptionData.build("orders", "*")}
    m.allocate_strategy = AllocateMessageQueueAveragely()
    m.poll_name_server_interval_ms = 30_000
    m.message_model, m.consume_from_where = MessageModel.CLUSTERING, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    m.consume_timestamp_ms = 0
    m.offset_store = OffsetStore("cg")
    m.stats = {}
    m._count = lambda name, n=1: m.stats.__setitem__(name, m.stats.get(name, 0) + n)
    m._max_reconsume_times = lambda: 16
    return m


def test_rebalance_gives_this_member_its_share_of_the_queues():
    ids = Frame(ResponseCode.SUCCESS, bodies=[pack_body({"consumerIdList": ["other@2", "me@1"]})])
    out, asked, _ = _run(lambda c: _member(c)._allocate_call("orders"), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.GET_CONSUMER_LIST_BY_GROUP, ids)])
    # 4 queues, two members sorted ["me@1", "other@2"]: AVG gives the first two to me@1
    assert out == {MessageQueue("orders", "broker-a", 0), MessageQueue("orders", "broker-a", 1)}
    assert asked[1][2] == {"consumerGroup": "cg"}


def test_rebalance_of_a_member_the_broker_does_not_know_sends_a_heartbeat_and_keeps_its_queues():
    ids = Frame(ResponseCode.SUCCESS, bodies=[pack_body({"consumerIdList": ["other@2"]})])
    out, asked, _ = _run(lambda c: _member(c)._allocate_call("orders"), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER, "1": SLAVE})),
        (MASTER, RequestCode.GET_CONSUMER_LIST_BY_GROUP, ids),
        (MASTER, RequestCode.HEART_BEAT, Frame(ResponseCode.SUCCESS)),
        (SLAVE, RequestCode.HEART_BEAT, RemotingTimeoutError("slave down"))])     # logged, not raised
    assert out is None
    assert [code for _, code, _ in asked][2:] == [RequestCode.HEART_BEAT] * 2


def test_start_offset_of_a_new_queue_without_a_stored_offset_is_its_end_and_unknown_on_failure():
    out, _, _ = _run(lambda c: _member(c)._start_offset_call(MQ, -1), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.GET_MAX_OFFSET, Frame(ResponseCode.SUCCESS, fields={"offset": 77}))])
    assert out == 77
    out, _, _ = _run(lambda c: _member(c)._start_offset_call(MQ, -1), [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.GET_MAX_OFFSET, RemotingTimeoutError("x"))])
    assert out == -1
    out, asked, _ = _run(lambda c: _member(c)._start_offset_call(MQ, 12), [])
    assert out == 12 and asked == []


def test_a_failed_batch_is_sent_back_and_what_could_not_be_is_consumed_again_here():
    from rmq.client.consumer import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
    from rmq.client.consumer_process_queue import ProcessQueue

    made = []

    def result(client):
        m = _member(client)
        made.append(m)
        msgs = []
        for i in range(3):
            x = cl.MessageExt()
            x.topic, x.body, x.queue_id, x.queue_offset, x.reconsume_times = "orders", b"x", 3, 10 + i, 0
            x.store_host = bytes([127, 0, 0, 1, 0, 0, 0x2a, 0x9f])
            msgs.append(x)
        pq = ProcessQueue()
        pq.put_message(msgs)
        ctx = ConsumeConcurrentlyContext(MQ)
        ctx.ack_index = 0                          # the first consumed, the other two failed
        again = yield from m._concurrent_result_call(ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ctx, msgs, pq, MQ)
        return [(x.queue_offset, x.reconsume_times) for x in again]

    out, asked, _ = _run(result, [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.CONSUMER_SEND_MSG_BACK, Frame(ResponseCode.SUCCESS)),
        (MASTER, RequestCode.CONSUMER_SEND_MSG_BACK, Frame(ResponseCode.SYSTEM_ERROR, remark="busy")),
        (MASTER, RequestCode.SEND_MESSAGE, Frame(ResponseCode.SYSTEM_ERROR, remark="still busy"))])
    assert out == [(12, 1)]                            # its send-back failed: consumed again here
    for m in made:
        assert m.stats == {"sent_back": 1, "send_back_failed": 1, "consumed_ok": 1, "consumed_failed": 2}
        assert m.offset_store.read_memory(MQ) == 12        # the lowest offset still in the process queue


def test_pull_gate_holds_a_full_or_unlocked_or_unsubscribed_queue_and_lets_the_others_pull():
    from rmq.client.consumer import (PULL_TIME_DELAY_MS_WHEN_EXCEPTION, PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL)
    from rmq.client.consumer_process_queue import ProcessQueue

    m = _member(ConsumerCalls(NS))
    m.orderly, m.pull_threshold_for_queue, m.pull_threshold_size_for_queue_mb = False, 2, 100
    m.consume_concurrently_max_span = 2000
    pq = ProcessQueue()
    assert m._pull_gate(pq, MQ) is None and pq.last_pull_timestamp > 0
    msgs = []
    for i in range(3):
        x = cl.MessageExt()
        x.topic, x.body, x.queue_offset = "orders", b"x", i
        msgs.append(x)
    pq.put_message(msgs)                                   # 3 > pull_threshold_for_queue
    assert m._pull_gate(pq, MQ) == PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL
    m.orderly, m.pull_threshold_for_queue = True, 1000
    assert m._pull_gate(ProcessQueue(), MQ) == PULL_TIME_DELAY_MS_WHEN_EXCEPTION      # orderly, not locked yet
    m.orderly = False
    assert m._pull_gate(ProcessQueue(), MessageQueue("gone", "broker-a", 0)) == PULL_TIME_DELAY_MS_WHEN_EXCEPTION


def test_pull_outcomes_found_again_and_illegal():
    from rmq.client.consumer_process_queue import ProcessQueue
    from rmq.client.message import PullResult, PullStatus

    m = _member(ConsumerCalls(NS))
    x = cl.MessageExt()
    x.topic, x.body, x.queue_offset = "orders", b"x", 5
    assert m._pull_outcome(PullResult(PullStatus.FOUND, 6, 0, 6, [x]), ProcessQueue(), MQ, 5) == "found"
    pq = ProcessQueue()
    assert m._pull_outcome(PullResult(PullStatus.NO_MATCHED_MSG, 9, 0, 9), pq, MQ, 6) == "again"
    assert m.offset_store.read_memory(MQ) == 9             # nothing in flight: past the filtered-out messages
    assert m._pull_outcome(PullResult(PullStatus.OFFSET_ILLEGAL, 100, 100, 200), pq, MQ, 9) == "illegal"
    assert pq.dropped


def test_pull_frame_carries_the_commit_offset_to_a_master_only_and_refuses_an_unsubscribed_topic():
    m = _member(ConsumerCalls(NS))
    m.pull_batch_size = 32
    m.offset_store.update_offset(MQ, 7)
    assert m._pull_frame(MQ, 10, 0).fields["commitOffset"] == 7
    assert m._pull_frame(MQ, 10, 1).fields["commitOffset"] == -1          # a slave takes no commits
    with pytest.raises(MQClientError, match="no subscription for topic gone"):
        m._pull_frame(MessageQueue("gone", "broker-a", 0), 0, 0)


def test_a_pull_from_the_position_an_answer_gave_carries_its_epoch_and_a_seek_forgets_it():
    """Every pull answer's ``brokerEpoch`` (an int) is kept per queue with the position it gave
    (``nextBeginOffset``) and sent back as ``lastEpoch`` with the queue's pull from that position;
    none before an answer had one, and none from any other position (a committed offset loaded
    when a rebalance brings the queue back: an old epoch would move it back for nothing).  A seek
    makes the position the caller's (PullMessageProcessor.past_epoch_end)."""
    client = ConsumerCalls(NS)
    m = _member(client)
    m.pull_batch_size = 32
    assert "lastEpoch" not in m._pull_frame(MQ, 10, 0).fields
    client.note_pull_outcome(MQ, Frame(ResponseCode.PULL_NOT_FOUND, fields={"brokerEpoch": 3, "nextBeginOffset": 10}))
    assert m._pull_frame(MQ, 10, 0).fields["lastEpoch"] == 3
    assert "lastEpoch" not in m._pull_frame(MQ, 11, 0).fields and "lastEpoch" not in m._pull_frame(MQ, 9, 0).fields
    assert "lastEpoch" not in m._pull_frame(MessageQueue("orders", "broker-a", 0), 10, 0).fields
    for other in (Frame(ResponseCode.SUCCESS, fields={"brokerEpoch": "x", "nextBeginOffset": 12}),
                  Frame(ResponseCode.SUCCESS, fields={"brokerEpoch": 4}), Frame(ResponseCode.TOPIC_NOT_EXIST),
                  RemotingError("gone")):
        client.note_pull_outcome(MQ, other)          # not an epoch and a position: the last one stays
    assert client.pull_epoch(MQ, 10) == 3
    client.note_pull_outcome(MQ, Frame(ResponseCode.SUCCESS, fields={"brokerEpoch": 4, "nextBeginOffset": 42}))
    assert m._pull_frame(MQ, 42, 0).fields["lastEpoch"] == 4 and "lastEpoch" not in m._pull_frame(MQ, 10, 0).fields
    pc = _pull_core(client)
    pc.assign([MQ])
    pc.seek(MQ, 42)
    assert client.pull_epoch(MQ, 42) == 0 and "lastEpoch" not in m._pull_frame(MQ, 42, 0).fields


def test_a_commit_within_what_the_last_pull_answer_gave_carries_its_epoch():
    """UPDATE_CONSUMER_OFFSET sends ``lastEpoch`` (the queue's last pull answer's) when the offset
    is within the position that answer gave, and nothing otherwise or before any answer: the
    broker stores an offset read in a tail its log lost where its newer epochs begin
    (ConsumerManageProcessor)."""
    other = MessageQueue("orders", "broker-a", 0)

    def commit(core):
        core.note_pull_outcome(MQ, Frame(ResponseCode.SUCCESS, fields={"brokerEpoch": 6, "nextBeginOffset": 10}))

        def calls():
            yield from core._update_consumer_offset("cg", MQ, 10)
            yield from core._update_consumer_offset("cg", MQ, 11)      # past that position: not from it
            yield from core._update_consumer_offset("cg", other, 4)
        return calls()

    _, asked, _ = _run(commit, [
        (NS, RequestCode.GET_ROUTEINFO_BY_TOPIC, _route({"0": MASTER})),
        (MASTER, RequestCode.UPDATE_CONSUMER_OFFSET, Frame(ResponseCode.SUCCESS)),
        (MASTER, RequestCode.UPDATE_CONSUMER_OFFSET, Frame(ResponseCode.SUCCESS)),
        (MASTER, RequestCode.UPDATE_CONSUMER_OFFSET, Frame(ResponseCode.SUCCESS))])
    assert asked[1][2] == {"consumerGroup": "cg", "topic": "orders", "queueId": 3, "commitOffset": 10, "lastEpoch": 6}
    assert asked[2][2] == {"consumerGroup": "cg", "topic": "orders", "queueId": 3, "commitOffset": 11}
    assert asked[3][2] == {"consumerGroup": "cg", "topic": "orders", "queueId": 0, "commitOffset": 4}


def test_a_pull_that_carries_the_offset_makes_the_next_persist_send_it_again():
    """The broker applies a pull's commitOffset when it reads the pull, possibly after a later
    persist of a higher offset: the offset store forgets what it last persisted for the queue."""
    from rmq.client.offset_store import RemoteBrokerOffsetStore
    sent = []
    m = _member(ConsumerCalls(NS))
    m.pull_batch_size = 32
    m.offset_store = RemoteBrokerOffsetStore("cg", lambda g, mq: -1, lambda g, mq, off: sent.append(off))
    m.offset_store.update_offset(MQ, 7)
    m.offset_store.persist_all([MQ])
    m.offset_store.persist_all([MQ])
    assert sent == [7]                                  # unchanged: not sent twice
    m._pull_frame(MQ, 10, 1)                            # to a slave: no commitOffset, nothing forgotten
    m.offset_store.persist_all([MQ])
    assert sent == [7]
    m._pull_frame(MQ, 10, 0)                            # to the master, carrying 7
    m.offset_store.persist_all([MQ])
    assert sent == [7, 7]


def test_a_failed_pull_is_asked_again_elsewhere_only_when_the_group_has_another_address():
    def pc_with(addrs):
        pc = _pull_core(ConsumerCalls(NS))
        from rmq.client.consumer_api import TopicRoute
        pc.api._routes["orders"] = TopicRoute.from_wire("orders", {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
            "brokerDatas": [{"brokerName": "broker-a", "cluster": "c", "brokerAddrs": addrs}]})
        return pc

    both = pc_with({"0": MASTER, "1": SLAVE})
    both.api.pull_from.mark_unreachable(MASTER)
    assert both._other_addr(MQ, MASTER) is True                # the slave is next
    assert pc_with({"0": MASTER})._other_addr(MQ, MASTER) is False
    assert _pull_core(ConsumerCalls(NS))._other_addr(MQ, MASTER) is False    # no route cached: no request made


def test_a_poll_answer_moves_the_position_only_when_its_page_is_taken():
    """PullConsumerCalls._take_answer, the rule both poll drivers (threads, asyncio) apply to
    each pull answer: a stale answer, a failure retried at the group's other address, a failure,
    an answer that does not decode, and a page."""
    from rmq.client.consumer_api import TopicRoute

    def core(addrs):
        pc = _pull_core(ConsumerCalls(NS))
        pc.api._routes["orders"] = TopicRoute.from_wire("orders", {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}],
            "brokerDatas": [{"brokerName": "broker-a", "cluster": "c", "brokerAddrs": addrs}]})
        pc.assign([MQ])
        pc._positions[MQ] = 10
        return pc

    page = Frame(ResponseCode.SUCCESS)
    decoded = []

    def decode(resp, sub, addr, mq):
        decoded.append((resp, sub.topic, addr, mq))
        return 13, ["m10", "m11", "m12"]

    def refuse(resp, sub, addr, mq):
        raise MQClientError("malformed page")

    pc, failed = core({"0": MASTER}), set()
    assert pc._take_answer(MQ, 9, page, MASTER, decode, failed) == ((), None)       # seeked since: stale
    assert (pc._positions[MQ], failed, decoded) == (10, set(), [])
    assert pc._take_answer(MQ, 10, page, MASTER, decode, failed) == (["m10", "m11", "m12"], None)
    assert (pc._positions[MQ], failed, decoded) == (13, set(), [(page, "orders", MASTER, MQ)])

    items, err = pc._take_answer(MQ, 13, page, MASTER, refuse, failed)
    assert (items, str(err), pc._positions[MQ], failed) == ((), "malformed page", 13, {MQ})

    down = RemotingTimeoutError("no response from the master in time")
    pc, failed = core({"0": MASTER}), set()                 # no other address: the poll's error
    assert pc._take_answer(MQ, 10, down, MASTER, decode, failed) == ((), down)
    assert (pc._positions[MQ], failed) == (10, {MQ})
    pc, failed = core({"0": MASTER, "1": SLAVE}), set()
    pc.api.pull_from.mark_unreachable(MASTER)
    assert pc._take_answer(MQ, 10, down, MASTER, decode, failed) == ((), None)       # asked again at the slave
    assert (pc._positions[MQ], failed) == (10, set())
    assert pc._take_answer(MQ, 10, down, "", decode, failed) == ((), down)           # where it went unknown
    assert failed == {MQ}
    refused = MQBrokerError("TOPIC_NOT_EXIST", ResponseCode.TOPIC_NOT_EXIST, MASTER)
    assert pc._take_answer(MQ, 10, refused, MASTER, decode, set()) == ((), refused)  # a refusal is not retried


def test_a_malformed_route_is_refused_with_the_field_named():
    from rmq.client.consumer_api import TopicRoute
    with pytest.raises(MQClientError, match="readQueueNums"):
        TopicRoute.from_wire("orders", {"queueDatas": [{"brokerName": "broker-a", "perm": 6}], "brokerDatas": []})


def test_the_asyncio_consumer_forgets_what_it_persisted_when_a_pull_carries_the_offset():
    from rmq.aio.consumer import AsyncPushConsumer, _AsyncOffsets
    from rmq.client.offset_store import OffsetStore
    c = AsyncPushConsumer(NS, "cg")
    c.offsets = _AsyncOffsets(OffsetStore("cg"), None)
    c.offsets._persisted[MQ] = 7
    c._commit_carried(MQ)
    assert MQ not in c.offsets._persisted


def test_the_name_server_that_answered_is_asked_first_and_each_gets_a_share_of_the_timeout():
    """A NameServer that never answers (ZeroMQ queues the request and says nothing) is waited for
    its share of the timeout only, and the one that answered is asked first from then on."""
    ns2 = "127.0.0.1:9877"
    core = ConsumerCalls(f"{NS};{ns2}", timeout_ms=3000)
    call = core._fetch_route("orders")
    first, _, share = next(call)
    assert share == 1500                                   # half of 3000 ms each: both fit in the timeout
    second, _, share = call.throw(RemotingTimeoutError("no answer"))
    assert share == 1500 and {first, second} == {NS, ns2}
    with pytest.raises(StopIteration):
        call.send(_route({"0": MASTER}))
    for _ in range(8):                                     # the random order no longer decides the first
        call = core._fetch_route("orders")
        assert next(call)[0] == second
        call.close()


def test_unregister_waits_the_named_timeout_and_a_refusal_raises():
    """UNREGISTER_CLIENT waits UNREGISTER_TIMEOUT_MS (RocketMQ's mqClientApiTimeout, 3 s): one that
    times out leaves the member registered until the broker's channelExpiredTimeout."""
    from rmq.client.consumer_api import UNREGISTER_TIMEOUT_MS
    assert UNREGISTER_TIMEOUT_MS == 3000
    call = ConsumerCalls(NS)._unregister(MASTER, "cid@1", "g")
    addr, frame, timeout_ms = next(call)
    assert (addr, frame.code, timeout_ms) == (MASTER, RequestCode.UNREGISTER_CLIENT, UNREGISTER_TIMEOUT_MS)
    assert frame.fields == {"clientID": "cid@1", "consumerGroup": "g"}
    with pytest.raises(StopIteration):
        call.send(Frame(ResponseCode.SUCCESS))
    refused = ConsumerCalls(NS)._unregister(MASTER, "cid@1", "g")
    next(refused)
    with pytest.raises((MQBrokerError, MQClientError)):
        refused.send(Frame(ResponseCode.SYSTEM_ERROR, remark="no"))
