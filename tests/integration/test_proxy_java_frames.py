"""What the RocketMQ 4.9 Java client does differently from the C++ one, in frames the tests build
(the Java client cannot be installed here): SEND_MESSAGE_V2 with SendMessageRequestHeaderV2's
one-letter fields, SEND_BATCH_MESSAGE with a MessageDecoder.encodeMessages body, RocketMQ's binary
header (answers in the same type), one-way UPDATE_CONSUMER_OFFSET (nothing on the wire, the offset
stored), PULL_MESSAGE in a binary header, heartbeats in a binary header.  Checked against rmq's own
view (PullConsumer, Admin)."""
import json
import time

import pytest

from rmq import Admin, PullConsumer
from rmq._core import commitlog as _cl
from rmq.client.consumer import MessageQueue
from rmq.protocol import RequestCode as C
from rmq.proxy.remoting import FLAG_ONEWAY, SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand, encode
from tests.integration.cluster import Cluster
from tests.integration.proxy_helpers import (connect, encode_messages, properties, read_frame, request,
                                             running_proxy)
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration
BOTH = pytest.mark.parametrize("stype", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
ONE_BYTE_TOPIC = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("proxy-java") / "store")
    yield c
    c.close()


@pytest.fixture(scope="module")
def proxy(cluster):
    with running_proxy(cluster.namesrv_addr) as addr:
        yield addr


def ok(r):
    assert r.code == 0, (r.code, r.remark)
    return r


def v2_header(topic, queue_id, props, batch=False, born=None):
    """SendMessageRequestHeaderV2 as MQClientAPIImpl.sendMessage fills it (every value a string)."""
    return {"a": "PG-java", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
            "g": born or int(time.time() * 1000), "h": 0, "i": properties(props), "j": 0, "k": "false",
            "l": 16, "m": "true" if batch else "false", "n": "rmq-proxy"}


def pulled(cluster, topic, queue_id, expected):
    """The messages of one queue as rmq's own PullConsumer reads them, once ``expected`` are there."""
    with PullConsumer(cluster.namesrv_addr, group="java-frames-reader", auto_commit=False) as pc:
        mq = MessageQueue(topic, "broker-a", queue_id)
        wait_for(lambda: pc.max_offset(mq) >= expected, what=f"{expected} messages dispatched")
        return pc.pull(mq, "*", 0, 32, timeout_ms=3000).msg_found_list


@BOTH
def test_send_message_v2(cluster, proxy, stype):
    topic = f"JV2{stype}"
    create_topic(cluster, topic, 2)
    born = int(time.time() * 1000) - 5
    answers = []
    with connect(proxy) as s:
        for i in range(3):
            props = {"KEYS": f"k{i}", "TAGS": "TagA", "UNIQ_KEY": f"UNIQ{stype}{i:04d}", "WAIT": "true", "seq": str(i)}
            r = ok(request(s, C.SEND_MESSAGE_V2, v2_header(topic, 1, props, born=born), b"v2-%d" % i, stype))
            answers.append(r)
    assert [int(r.ext_fields["queueId"]) for r in answers] == [1, 1, 1]
    assert [int(r.ext_fields["queueOffset"]) for r in answers] == [0, 1, 2]
    assert all(set(r.ext_fields) >= {"msgId", "queueId", "queueOffset"} for r in answers)
    if stype == SERIALIZE_ROCKETMQ:
        assert {(r.language, r.version) for r in answers} == {("JAVA", 407)}
    msgs = pulled(cluster, topic, 1, 3)
    assert [bytes(m.body) for m in msgs] == [b"v2-0", b"v2-1", b"v2-2"]
    assert [(m.tags, m.properties["KEYS"], m.properties["seq"], m.uniq_key) for m in msgs] == \
        [("TagA", f"k{i}", str(i), f"UNIQ{stype}{i:04d}") for i in range(3)]
    assert {m.born_timestamp for m in msgs} == {born}
    assert [m.offset_msg_id for m in msgs] == [r.ext_fields["msgId"] for r in answers]


@BOTH
def test_send_batch_message(cluster, proxy, stype):
    topic = f"JBT{stype}"
    create_topic(cluster, topic, 1)
    batch = [(b"batch-%d" % i, {"KEYS": f"bk{i}", "TAGS": f"T{i % 2}", "UNIQ_KEY": f"BUNIQ{stype}{i:04d}",
                                "WAIT": "true"}, i) for i in range(5)]
    with connect(proxy) as s:
        r = ok(request(s, C.SEND_BATCH_MESSAGE, v2_header(topic, 0, {"WAIT": "true"}, batch=True),
                       encode_messages(batch), stype))
    ids = r.ext_fields["msgId"].split(",")
    assert len(ids) == 5 and int(r.ext_fields["queueOffset"]) == 0 and int(r.ext_fields["queueId"]) == 0
    msgs = pulled(cluster, topic, 0, 5)
    assert [m.queue_offset for m in msgs] == list(range(5))
    assert [(bytes(m.body), m.tags, m.properties["KEYS"], m.uniq_key, m.flag) for m in msgs] == \
        [(body, p["TAGS"], p["KEYS"], p["UNIQ_KEY"], flag) for body, p, flag in batch]
    assert [m.offset_msg_id for m in msgs] == ids


@BOTH
def test_oneway_update_consumer_offset_sends_nothing_and_stores(cluster, proxy, stype):
    topic, group = f"JOW{stype}", f"CG-oneway{stype}"
    create_topic(cluster, topic, 2)
    fields = {"consumerGroup": group, "topic": topic, "queueId": 1}
    with connect(proxy) as s:
        s.sendall(encode(RemotingCommand(C.UPDATE_CONSUMER_OFFSET, 77, FLAG_ONEWAY, None,
                                         {**{k: str(v) for k, v in fields.items()}, "commitOffset": "7"},
                                         serialize_type=stype)))

        # every frame read on this socket is the answer to its query (request() checks the opaque):
        # an answer to the one-way update would come first, the broker answering the proxy in order
        def stored():
            r = request(s, C.QUERY_CONSUMER_OFFSET, fields, stype=stype)
            return r.code == 0 and r.ext_fields.get("offset") == "7"
        wait_for(stored, what="the one-way offset stored")
        ok(request(s, C.QUERY_CONSUMER_OFFSET, fields, stype=stype))
    with Admin(cluster.namesrv_addr) as admin:
        rows = {p.queue_id: p.consumer_offset for p in admin.consumer_progress(group, topic).queues}
    assert rows == {0: 0, 1: 7}


def test_pull_in_a_binary_header_and_its_long_poll(cluster, proxy):
    topic, group = "JPL", "CG-java-pull"
    create_topic(cluster, topic, 1)
    with connect(proxy) as s:
        for i in range(4):
            ok(request(s, C.SEND_MESSAGE_V2, v2_header(topic, 0, {"TAGS": "TagP", "WAIT": "true"}), b"p-%d" % i,
                       SERIALIZE_ROCKETMQ))
    pulled(cluster, topic, 0, 4)

    def pull_fields(offset, sys_flag=0, suspend=0):
        """PullMessageRequestHeader as the Java client sends it."""
        return {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": offset, "maxMsgNums": 32,
                "sysFlag": sys_flag, "commitOffset": 0, "suspendTimeoutMillis": suspend, "subscription": "*",
                "subVersion": 0, "expressionType": "TAG"}
    with connect(proxy) as s:
        r = ok(request(s, C.PULL_MESSAGE, pull_fields(0), stype=SERIALIZE_ROCKETMQ))
        assert (r.language, r.version) == ("JAVA", 407)
        assert {k: r.ext_fields[k] for k in ("nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId")} \
            == {"nextBeginOffset": "4", "minOffset": "0", "maxOffset": "4", "suggestWhichBrokerId": "0"}
        msgs = _cl.decode_records(r.body, True)
        assert [(bytes(m.body), m.queue_offset, m.tags) for m in msgs] == [(b"p-%d" % i, i, "TagP") for i in range(4)]
        assert request(s, C.PULL_MESSAGE, pull_fields(4), stype=SERIALIZE_ROCKETMQ).code == 19   # PULL_NOT_FOUND
        # the push consumer's pull commits its offset on the way (sysFlag 1 commit | 2 suspend)
        ok(request(s, C.PULL_MESSAGE, {**pull_fields(2, 3, 1000), "commitOffset": 2}, stype=SERIALIZE_ROCKETMQ))
        r = ok(request(s, C.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": 0},
                       stype=SERIALIZE_ROCKETMQ))
        assert r.ext_fields["offset"] == "2"
        # a held pull (sysFlag 2 = suspend) is answered by the message sent after it
        s.sendall(encode(RemotingCommand(C.PULL_MESSAGE, 901, 0, None,
                                         {k: str(v) for k, v in pull_fields(4, 2, 10_000).items()},
                                         serialize_type=SERIALIZE_ROCKETMQ)))
        with connect(proxy) as s2:
            ok(request(s2, C.SEND_MESSAGE_V2, v2_header(topic, 0, {"TAGS": "TagP"}), b"late", SERIALIZE_ROCKETMQ))
        r = read_frame(s)
        assert (r.opaque, r.code, r.serialize_type) == (901, 0, SERIALIZE_ROCKETMQ)
        assert [bytes(m.body) for m in _cl.decode_records(r.body, True)] == [b"late"]


@BOTH
def test_java_heartbeat_and_consumer_list(cluster, proxy, stype):
    group, client = f"CG-java-beat{stype}", f"10.0.0.1@{stype}"
    beat = {"clientID": client, "producerDataSet": [{"groupName": "PG-java"}], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"classFilterMode": False, "topic": "JHB", "subString": "*", "tagsSet": [],
                                 "codeSet": [], "subVersion": 1, "expressionType": "TAG"}]}]}
    with connect(proxy) as s:
        ok(request(s, C.HEART_BEAT, body=json.dumps(beat).encode(), stype=stype))
        r = ok(request(s, C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}, stype=stype))
    assert json.loads(r.body) == {"consumerIdList": [client]}
    with Admin(cluster.namesrv_addr) as admin:
        assert admin.consumer_connection(group) == [client]
