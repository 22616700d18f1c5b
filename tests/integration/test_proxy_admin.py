"""The admin codes ``mqadmin`` sends, answered by the remoting proxy (rmq/proxy/admin.py) in front of
two broker groups (broker-a, broker-b: the virtual broker's global queue ids span both), in raw
frames with JSON and RocketMQ binary headers; every answer is checked against rmq's own view
(rmq.Admin, the brokers' runtime info)."""
import json
import time

import pytest

from rmq import Admin
from rmq.protocol import RequestCode as C
from rmq.proxy.admin import JMap, bean, to_json
from rmq.proxy.remoting import SERIALIZE_JSON, SERIALIZE_ROCKETMQ
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.proxy_helpers import (call, connect, fastjson, mq_table, properties, request,
                                             running_proxy)
from tests.integration.test_consumer import wait_for

pytestmark = pytest.mark.integration
BOTH = pytest.mark.parametrize("stype", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    root = tmp_path_factory.mktemp("proxy-admin")
    a = Cluster(root / "a")
    try:
        b = Cluster(root / "b", conf={"brokerName": "broker-b"}, namesrv_addr=a.namesrv_addr)
    except BaseException:
        a.close()
        raise
    yield a, b
    b.close()
    a.close()


@pytest.fixture(scope="module")
def proxy(clusters):
    with running_proxy(clusters[0].namesrv_addr) as addr:
        yield addr


@pytest.fixture(scope="module")
def admin(clusters):
    with Admin(clusters[0].namesrv_addr) as a:
        wait_for(lambda: {b.broker_name for b in a.cluster_list()} == {"broker-a", "broker-b"},
                 what="both broker groups registered")
        yield a


def ok(r):
    assert r.code == 0, (r.code, r.remark)
    return r


def route_of(admin, topic):
    try:
        return {q.broker_name: q.read_queue_nums for q in admin.topic_route(topic).queue_datas}
    except Exception:   # noqa: BLE001 - not routed (yet)
        return {}


def create(proxy, topic, queues, stype=SERIALIZE_JSON, **extra):
    """UPDATE_AND_CREATE_TOPIC as MQClientAPIImpl.createTopic sends it."""
    return call(proxy, C.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
                                                   "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                                   "topicSysFlag": 0, "order": "false", **extra}, stype=stype)


def send_v2(s, topic, queue_id, body, tags="T"):
    """SEND_MESSAGE_V2 (SendMessageRequestHeaderV2's one-letter fields) to a global queue id."""
    return ok(request(s, C.SEND_MESSAGE_V2, {
        "a": "PG-admin", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0, "g": int(time.time() * 1000),
        "h": 0, "i": properties({"TAGS": tags, "WAIT": "true"}), "j": 0, "k": "false", "m": "false"}, body))


# -- fastjson's text --------------------------------------------------------------------------------------
def test_fastjson_text_maps_with_object_and_number_keys():
    doc = bean(offsetTable=JMap([(bean(topic="T", brokerName="b", queueId=1), bean(minOffset=0, maxOffset=2))]),
               brokerAddrs=JMap([(0, "h:1")]), none=None, tps=0.0, name="ü")
    text = to_json(doc)
    assert text == ('{"brokerAddrs":{0:"h:1"},"name":"ü","offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
                    '{"maxOffset":2,"minOffset":0}},"tps":0.0}')
    back = fastjson(text.encode())
    assert back["brokerAddrs"] == {0: "h:1"} and mq_table(back["offsetTable"]) == {("T", "b", 1): {"maxOffset": 2,
                                                                                                  "minOffset": 0}}


# -- NameServer codes ----------------------------------------------------------------------------------------
@BOTH
def test_cluster_info_points_at_the_virtual_broker(proxy, admin, stype):
    r = ok(call(proxy, C.GET_BROKER_CLUSTER_INFO, stype=stype))
    assert b'"brokerAddrs":{0:"' in r.body                  # HashMap<Long, String>, as fastjson writes it
    info = fastjson(r.body)
    assert info["brokerAddrTable"] == {"rmq-proxy": {"brokerAddrs": {0: proxy}, "brokerName": "rmq-proxy",
                                                     "cluster": "TestCluster"}}
    assert info["clusterAddrTable"] == {"TestCluster": ["rmq-proxy"]}
    assert {b.cluster for b in admin.cluster_list()} == {"TestCluster"}


@BOTH
def test_topic_create_list_config_and_delete(proxy, admin, stype):
    topic = f"PXA{stype}"
    ok(create(proxy, topic, 3, stype))
    # on every master, as rmq sees it; through the proxy one virtual broker of 6 queues
    assert wait_for(lambda: route_of(admin, topic) == {"broker-a": 3, "broker-b": 3}, what="topic on both masters")
    route = json.loads(ok(call(proxy, C.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, stype=stype)).body)
    assert [(q["brokerName"], q["readQueueNums"]) for q in route["queueDatas"]] == [("rmq-proxy", 6)]
    listed = fastjson(ok(call(proxy, C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, stype=stype)).body)
    assert topic in listed["topicList"] and sorted(listed["topicList"]) == admin.topic_list()
    config = fastjson(ok(call(proxy, C.GET_ALL_TOPIC_CONFIG, stype=stype)).body)
    assert config["topicConfigTable"][topic] == {"order": False, "perm": 6, "readQueueNums": 6,
                                                 "topicFilterType": "SINGLE_TAG", "topicName": topic,
                                                 "topicSysFlag": 0, "writeQueueNums": 6}
    assert set(config["dataVersion"]) == {"counter", "timestamp"}
    # the real group named by brokerName (rmq's extension) only
    ok(create(proxy, f"PXB{stype}", 2, stype, brokerName="broker-b"))
    assert wait_for(lambda: route_of(admin, f"PXB{stype}") == {"broker-b": 2}, what="topic on broker-b")
    # mqadmin deleteTopic: every master, then every NameServer
    ok(call(proxy, C.DELETE_TOPIC_IN_BROKER, {"topic": topic}, stype=stype))
    ok(call(proxy, C.DELETE_TOPIC_IN_NAMESRV, {"topic": topic, "clusterName": "TestCluster"}, stype=stype))
    assert wait_for(lambda: topic not in admin.topic_list(), what="topic gone from rmq's NameServer")
    config = fastjson(ok(call(proxy, C.GET_ALL_TOPIC_CONFIG, stype=stype)).body)
    assert topic not in config["topicConfigTable"] and f"PXB{stype}" in config["topicConfigTable"]
    assert call(proxy, C.GET_TOPIC_STATS_INFO, {"topic": topic}, stype=stype).code == 17    # TOPIC_NOT_EXIST
    r = call(proxy, C.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, stype=stype)
    assert r.code == 17                                                     # TOPIC_NOT_EXIST


# -- subscription groups ------------------------------------------------------------------------------------
@BOTH
def test_subscription_group_create_list_and_delete(proxy, admin, stype):
    group = f"GPX{stype}"
    cfg = {"brokerId": 0, "consumeBroadcastEnable": False, "consumeEnable": True, "consumeFromMinEnable": True,
           "groupName": group, "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 5, "retryQueueNums": 1,
           "whichBrokerWhenConsumeSlowly": 1}                                # SubscriptionGroupConfig as fastjson
    ok(call(proxy, C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(cfg).encode(), stype=stype))
    mine = {g["group"]: g for g in admin.group_list()}
    assert mine[group]["brokers"] == ["broker-a", "broker-b"] and mine[group]["retry_max_times"] == 5
    r = ok(call(proxy, C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, stype=stype))
    wrapper = fastjson(r.body)
    assert wrapper["subscriptionGroupTable"][group] == cfg
    assert set(wrapper["subscriptionGroupTable"]) == set(mine)
    text = r.body.decode()
    at = text.index(f'"{group}":')
    assert text[at:].split("}", 1)[0].endswith('"whichBrokerWhenConsumeSlowly":1')   # properties in fastjson order
    ok(call(proxy, C.DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "removeOffset": "false"}, stype=stype))
    assert group not in {g["group"] for g in admin.group_list()}
    assert group not in fastjson(ok(call(proxy, C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)["subscriptionGroupTable"]
    bad = call(proxy, C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"{not json", stype=stype)
    assert bad.code == 1


# -- stats ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sent(proxy, admin):
    """Topic PXS, 2 queues on each group (global ids 0-1: broker-a, 2-3: broker-b), with 1, 0, 3, 2
    messages sent through the proxy; offsets of group CG-PXS committed through it: 1 on global
    queue 0 and 2 on global queue 2."""
    topic, counts = "PXS", [1, 0, 3, 2]
    ok(create(proxy, topic, 2))
    assert wait_for(lambda: route_of(admin, topic) == {"broker-a": 2, "broker-b": 2}, what="PXS on both")
    with connect(proxy) as s:
        wait_for(lambda: json.loads(ok(request(s, C.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})).body)
                 ["queueDatas"][0]["readQueueNums"] == 4, what="the proxy's layout of PXS")
        for q, n in enumerate(counts):
            for i in range(n):
                r = send_v2(s, topic, q, b"m%d-%d" % (q, i))
                assert int(r.ext_fields["queueId"]) == q and int(r.ext_fields["queueOffset"]) == i
        for q, off in ((0, 1), (2, 2)):
            ok(request(s, C.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "CG-PXS", "topic": topic, "queueId": q,
                                                     "commitOffset": off}))
    wanted = {real_queue(q): n for q, n in enumerate(counts)}
    wait_for(lambda: {(s.broker_name, s.queue_id): s.max_offset for s in admin.topic_status(topic)} == wanted,
             what="every message dispatched")
    return topic, counts


def real_queue(global_id):
    return ("broker-a", global_id) if global_id < 2 else ("broker-b", global_id - 2)


@BOTH
def test_topic_stats_name_global_queue_ids(proxy, admin, sent, stype):
    topic, counts = sent
    r = ok(call(proxy, C.GET_TOPIC_STATS_INFO, {"topic": topic}, stype=stype))
    assert r.body.startswith(b'{"offsetTable":{{"brokerName":"rmq-proxy","queueId":0,"topic":"PXS"}:')
    table = mq_table(fastjson(r.body)["offsetTable"])
    assert sorted(table) == [(topic, "rmq-proxy", q) for q in range(4)]
    mine = {(s.broker_name, s.queue_id): s for s in admin.topic_status(topic)}
    for q, n in enumerate(counts):
        e, m = table[(topic, "rmq-proxy", q)], mine[real_queue(q)]
        assert (e["minOffset"], e["maxOffset"]) == (0, n) == (m.min_offset, m.max_offset)
        assert e["lastUpdateTimestamp"] == m.last_update_timestamp and (e["lastUpdateTimestamp"] > 0) == (n > 0)
    assert call(proxy, C.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopicPX"}, stype=stype).code == 17


@BOTH
def test_consume_stats_per_global_queue(proxy, admin, sent, stype):
    topic, counts = sent
    progress = {(p.broker_name, p.queue_id): p for p in admin.consumer_progress("CG-PXS", topic).queues}
    for fields in ({"consumerGroup": "CG-PXS", "topic": topic}, {"consumerGroup": "CG-PXS"}):
        stats = fastjson(ok(call(proxy, C.GET_CONSUME_STATS, fields, stype=stype)).body)
        assert isinstance(stats["consumeTps"], float)
        table = mq_table(stats["offsetTable"])
        assert sorted(table) == [(topic, "rmq-proxy", q) for q in range(4)]
        for q, n in enumerate(counts):
            e, p = table[(topic, "rmq-proxy", q)], progress[real_queue(q)]
            assert e["brokerOffset"] == n == p.broker_offset
            assert e["consumerOffset"] == {0: 1, 2: 2}.get(q, 0) == p.consumer_offset
            assert e["lastTimestamp"] == p.last_timestamp and (e["lastTimestamp"] > 0) == (q in (0, 2))
    empty = fastjson(ok(call(proxy, C.GET_CONSUME_STATS, {"consumerGroup": "CG-never"}, stype=stype)).body)
    assert empty == {"consumeTps": 0.0, "offsetTable": {}}


# -- consumers -----------------------------------------------------------------------------------------------
@BOTH
def test_consumer_connection_list(proxy, admin, stype):
    group, client = f"CG-conn{stype}", f"127.0.0.1@java-{stype}"
    beat = {"clientID": client, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False, "subscriptionDataSet": [{
            "classFilterMode": False, "topic": "PXC", "subString": "a || b", "tagsSet": ["a", "b"],
            "codeSet": [97, 98], "subVersion": 1700000000000, "expressionType": "TAG"}]}]}
    assert call(proxy, C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}, stype=stype).code == 206
    with connect(proxy) as s:
        ok(request(s, C.HEART_BEAT, body=json.dumps(beat).encode(), stype=stype, version=401))
        local = "{}:{}".format(*s.getsockname()[:2])
        assert admin.consumer_connection(group) == [client]                   # rmq's view
        conn = fastjson(ok(call(proxy, C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}, stype=stype)).body)
        assert conn == {"connectionSet": [{"clientAddr": local, "clientId": client, "language": "JAVA",
                                           "version": 401}],
                        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
                        "messageModel": "CLUSTERING",
                        "subscriptionTable": {"PXC": {"classFilterMode": False, "codeSet": [97, 98],
                                                      "expressionType": "TAG", "subString": "a || b",
                                                      "subVersion": 1700000000000, "tagsSet": ["a", "b"],
                                                      "topic": "PXC"}}}
        ok(request(s, C.UNREGISTER_CLIENT, {"clientID": client, "consumerGroup": group}, stype=stype))
    assert admin.consumer_connection(group) == []
    assert call(proxy, C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}, stype=stype).code == 206


# -- the broker ---------------------------------------------------------------------------------------------
@BOTH
def test_runtime_info_sums_the_masters(proxy, clusters, stype):
    table = fastjson(ok(call(proxy, C.GET_BROKER_RUNTIME_INFO, stype=stype)).body)["table"]
    assert all(isinstance(v, str) for v in table.values())
    assert (table["brokerVersionDesc"], table["brokerVersion"]) == ("V4_9_7", "407")
    puts = sum(broker_runtime_info(c.broker_addr)["putMessageTotal"] for c in clusters)
    assert int(table["msgPutTotalTodayNow"]) == puts
    assert len(table["putTps"].split(" ")) == 3 and table["rmqBrokers"] == "broker-a,broker-b"
