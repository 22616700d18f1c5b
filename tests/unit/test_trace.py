"""Message trace records: RocketMQ's TraceDataEncoder format both ways, the keys a trace message
carries, and the dispatcher's bounded queue."""
from rmq.client import trace as T


def test_pub_record_is_rocketmqs_layout_and_round_trips():
    ctx = T.TraceContext(T.TraceType.Pub, 1700000000123, "DefaultRegion", "pg", 3, True,
                         bean=T.TraceBean(topic="orders", msg_id="AB12", offset_msg_id="7F0000010000270F0000000000000010",
                                          tags="t1", keys="k1 k2", store_host="127.0.0.1:10911", body_length=100,
                                          client_host="10.0.0.1@42#1"))
    rec = T.encode(ctx)
    f = rec[:-1].split("\x01")
    # TraceDataEncoder: type, time, region, group, topic, msgId, tags, keys, storeHost, bodyLength, cost,
    # msgType ordinal, offsetMsgId, success (+ clientHost, which RocketMQ's decoder reads at [14])
    assert f == ["Pub", "1700000000123", "DefaultRegion", "pg", "orders", "AB12", "t1", "k1 k2", "127.0.0.1:10911",
                 "100", "3", "0", "7F0000010000270F0000000000000010", "true", "10.0.0.1@42#1"]
    assert rec.endswith("\x02")
    assert T.decode(rec) == [ctx]
    assert T.trace_keys(ctx) == ["AB12", "k1", "k2"]


def test_decodes_what_rocketmqs_java_encoder_writes():
    # a Pub of RocketMQ 4.9 (14 fields), a SubBefore and a SubAfter (9 fields), one trace message body
    java = ("Pub\x011700000000000\x01DefaultRegion\x01pg\x01T\x01ID1\x01tagA\x01key1\x01192.168.0.2:10911\x0111\x015"
            "\x010\x01C0A8000200002A9F0000000000000000\x01true\x02"
            "SubBefore\x011700000000100\x01DefaultRegion\x01cg\x01req-1\x01ID1\x010\x01key1\x02"
            "SubAfter\x01req-1\x01ID1\x017\x01false\x01key1\x011\x011700000000107\x01cg\x02")
    pub, before, after = T.decode(java)
    assert (pub.trace_type, pub.group_name, pub.bean.store_host, pub.cost_time, pub.success) == \
        (T.TraceType.Pub, "pg", "192.168.0.2:10911", 5, True)
    assert pub.bean.offset_msg_id == "C0A8000200002A9F0000000000000000" and pub.bean.client_host == ""
    assert (before.request_id, before.bean.msg_id, before.bean.retry_times) == ("req-1", "ID1", 0)
    assert (after.request_id, after.cost_time, after.success, after.context_code, after.group_name) == \
        ("req-1", 7, False, 1, "cg")
    # unknown types, short records and garbage are skipped, never raised
    assert T.decode("Nope\x01x\x02Pub\x01short\x02\x02") == []


def test_separators_in_values_cannot_break_a_record():
    ctx = T.TraceContext(T.TraceType.SubBefore, 1, group_name="g\x01x", request_id="r",
                         bean=T.TraceBean(msg_id="M", keys="a\x02b"))
    [back] = T.decode(T.encode(ctx))
    assert back.group_name == "g x" and back.bean.keys == "a b"


def test_store_host_from_the_offset_message_id():
    assert T.store_host_of("7F0000010000270F0000000000000010") == "127.0.0.1:9999"
    assert T.store_host_of("not-an-id") == ""


def test_dispatcher_never_blocks_and_counts_what_it_drops():
    d = T.TraceDispatcher("127.0.0.1:1", "g")
    d._stop.set()                          # the thread exits: nothing drains the queue
    d._thread.join(5)
    d._stop.clear()
    ctx = T.TraceContext(T.TraceType.SubBefore, 1, request_id="r", bean=T.TraceBean(msg_id="M"))
    accepted = sum(d.append(ctx) for _ in range(T.TRACE_QUEUE_SIZE + 10))
    assert accepted == T.TRACE_QUEUE_SIZE and d.dropped == 10
    d._stop.set()
    assert not d.append(ctx)               # closed: refused, not queued


def test_the_dispatchers_fast_pub_line_is_encode_of_pub_context():
    from rmq.client.message import Message, MessageQueue, SendResult, SendStatus
    m = Message("BT", b"x" * 10, tags="t", keys=["k1", "k2"], delay_time_level=3)
    m.properties["UNIQ_KEY"] = "A" * 32
    r = SendResult(SendStatus.SEND_OK, "A" * 32, MessageQueue("BT", "b", 0), 5, "7F0000010000270F0000000000000010")
    d = T.TraceDispatcher("127.0.0.1:1", "g")
    try:
        line, keys = d._pub_line((m, r, 4, "client-1", False, 1234))
        ctx = T.pub_context("g", m, r, 4, "client-1")
        ctx.timestamp = 1234
        assert line == T.encode(ctx) and keys == T.trace_keys(ctx) == ["A" * 32, "k1", "k2"]
        assert ctx.bean.msg_type is T.MessageType.Delay_Msg and ctx.bean.store_host == "127.0.0.1:9999"
    finally:
        d.close(1)
