"""The NameServer as a real process: registration, routes, admin requests, expiry, bad input, stop."""
import os
import time

import msgpack
import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode

pytestmark = pytest.mark.integration

TIMEOUT_MS = 5000
RW = 6


def start_nameserver(actors, tmp_path, *extra):
    return actors("-m", "rmq.actors.nameserver", "--listen-port", "0", "--store-path", str(tmp_path), *extra)


def topic_config(topic, r=8, w=8, perm=RW):
    return {"topicName": topic, "readQueueNums": r, "writeQueueNums": w, "perm": perm, "topicSysFlag": 0,
            "order": False}


def register_frame(name="broker-a", addr="127.0.0.1:10911", bid=0, cluster="DefaultCluster", topics=("T",),
                   version=(1, 1), ha="127.0.0.1:10912"):
    body = {"topicConfigTable": {t: topic_config(t) for t in topics},
            "dataVersion": {"timestamp": version[0], "counter": version[1]}}
    return Frame(RequestCode.REGISTER_BROKER,
                 fields={"clusterName": cluster, "brokerAddr": addr, "brokerName": name, "brokerId": bid,
                         "haServerAddr": ha},
                 bodies=[msgpack.packb(body)])


def call(c, ns, code, fields=None, bodies=None):
    return c.invoke(ns.endpoint, Frame(code, fields=fields or {}, bodies=bodies or []), TIMEOUT_MS)


def route_of(c, ns, topic):
    return call(c, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def body(resp):
    return msgpack.unpackb(bytes(resp.bodies[0]))


def test_register_route_admin_and_clean_stop(actors, tmp_path):
    ns = start_nameserver(actors, tmp_path)
    assert ns.endpoint.startswith("tcp://127.0.0.1:")
    with RemotingClient() as c:
        r = c.invoke(ns.endpoint, register_frame(topics=("T", "U")), TIMEOUT_MS)
        assert r.code == ResponseCode.SUCCESS and r.fields == {"masterAddr": "", "haServerAddr": ""}
        r = c.invoke(ns.endpoint, register_frame(addr="127.0.0.1:11911", bid=1, ha=""), TIMEOUT_MS)
        assert r.code == ResponseCode.SUCCESS
        assert r.fields == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}

        r = route_of(c, ns, "T")
        assert r.code == ResponseCode.SUCCESS
        assert body(r) == {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 8, "writeQueueNums": 8, "perm": RW,
                            "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                             "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:11911"}}]}

        r = call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO)
        assert body(r)["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        assert body(r)["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": "127.0.0.1:10911",
                                                                         "1": "127.0.0.1:11911"}
        assert body(call(c, ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)) == {"topicList": ["T", "U"]}
        r = call(c, ns, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"})
        assert body(r) == {"topicList": ["T", "U"]}

        r = call(c, ns, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert r.code == ResponseCode.SUCCESS and r.fields == {"wipeTopicCount": 2}
        assert body(route_of(c, ns, "T"))["queueDatas"][0]["perm"] == 4
        r = call(c, ns, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert r.code == ResponseCode.SUCCESS and r.fields == {"addTopicCount": 2}
        assert body(route_of(c, ns, "T"))["queueDatas"][0]["perm"] == RW

        dv = msgpack.packb({"timestamp": 1, "counter": 1})
        q = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911", "brokerName": "broker-a",
             "brokerId": 0}
        r = call(c, ns, RequestCode.QUERY_DATA_VERSION, q, [dv])
        assert r.code == ResponseCode.SUCCESS and r.fields == {"changed": False}
        assert body(r) == {"timestamp": 1, "counter": 1}
        r = call(c, ns, RequestCode.QUERY_DATA_VERSION, q, [msgpack.packb({"timestamp": 2, "counter": 2})])
        assert r.fields == {"changed": True}

        r = call(c, ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "U"})
        assert r.code == ResponseCode.SUCCESS
        assert route_of(c, ns, "U").code == ResponseCode.TOPIC_NOT_EXIST

        for bid, addr in ((1, "127.0.0.1:11911"), (0, "127.0.0.1:10911")):
            r = call(c, ns, RequestCode.UNREGISTER_BROKER, {"clusterName": "DefaultCluster", "brokerAddr": addr,
                                                            "brokerName": "broker-a", "brokerId": bid})
            assert r.code == ResponseCode.SUCCESS
        assert route_of(c, ns, "T").code == ResponseCode.TOPIC_NOT_EXIST
        assert body(call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO)) == {"brokerAddrTable": {},
                                                                          "clusterAddrTable": {}}
    assert ns.terminate() == 0
    with open(os.path.join(tmp_path, "logs", "nameserver.log")) as f:
        log = f.read()
    assert "broker registered" in log and "nameserver stopped" in log


def test_unknown_topic_is_topic_not_exist(actors, tmp_path):
    ns = start_nameserver(actors, tmp_path)
    with RemotingClient() as c:
        r = route_of(c, ns, "NoSuchTopic")
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert "NoSuchTopic" in r.remark and "No topic route info" in r.remark
        assert r.bodies == []
    assert ns.terminate() == 0


def test_two_nameservers_are_independent(actors, tmp_path):
    ns1 = start_nameserver(actors, tmp_path / "a")
    ns2 = start_nameserver(actors, tmp_path / "b")
    assert ns1.endpoint != ns2.endpoint
    with RemotingClient() as c:
        assert c.invoke(ns1.endpoint, register_frame(topics=("Only1",)), TIMEOUT_MS).code == ResponseCode.SUCCESS
        assert route_of(c, ns1, "Only1").code == ResponseCode.SUCCESS
        assert route_of(c, ns2, "Only1").code == ResponseCode.TOPIC_NOT_EXIST
        assert body(call(c, ns2, RequestCode.GET_BROKER_CLUSTER_INFO))["brokerAddrTable"] == {}
        # a broker registers with every NameServer; each answers from its own tables
        assert c.invoke(ns2.endpoint, register_frame(name="broker-b", addr="127.0.0.1:20911", topics=("Only2",)),
                        TIMEOUT_MS).code == ResponseCode.SUCCESS
        assert route_of(c, ns1, "Only2").code == ResponseCode.TOPIC_NOT_EXIST
        assert body(call(c, ns1, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)) == {"topicList": ["Only1"]}
        assert body(call(c, ns2, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)) == {"topicList": ["Only2"]}
    assert ns1.terminate() == 0 and ns2.terminate() == 0


# the silent broker's expiry in test_silent_broker_expires: twice a loaded machine's longest stall, so
# that the kept broker, registered again right before the checks, outlives a stall among them
BROKER_EXPIRED_MS = 3000


def test_silent_broker_expires(actors, tmp_path):
    ns = start_nameserver(actors, tmp_path, "--scan-interval-ms", "100", "--broker-expired-ms", str(BROKER_EXPIRED_MS))
    with RemotingClient() as c:
        def keep():
            r = c.invoke(ns.endpoint, register_frame(name="broker-b", addr="127.0.0.1:20911", topics=("Kept", "Both")),
                         TIMEOUT_MS)
            assert r.code == ResponseCode.SUCCESS, r.remark

        # two brokers: one keeps registering, the other stops
        c.invoke(ns.endpoint, register_frame(topics=("Gone", "Both")), TIMEOUT_MS)
        keep()
        assert route_of(c, ns, "Gone").code == ResponseCode.SUCCESS
        deadline = time.monotonic() + BROKER_EXPIRED_MS / 1000 + 30
        gone = False
        while time.monotonic() < deadline:
            keep()
            if route_of(c, ns, "Gone").code == ResponseCode.TOPIC_NOT_EXIST:
                gone = True
                break
            time.sleep(0.05)
        assert gone, f"the silent broker's route did not expire within {BROKER_EXPIRED_MS / 1000 + 30:.0f} s"
        keep()               # the kept broker's last registration: just now, whatever the loop's last pass took
        both = body(route_of(c, ns, "Both"))
        assert [q["brokerName"] for q in both["queueDatas"]] == ["broker-b"]
        assert [b["brokerName"] for b in both["brokerDatas"]] == ["broker-b"]
        info = body(call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO))
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-b"]}
        assert list(info["brokerAddrTable"]) == ["broker-b"]
        assert route_of(c, ns, "Kept").code == ResponseCode.SUCCESS
    assert ns.terminate() == 0


def _fields(**over):
    f = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911", "brokerName": "broker-a",
         "brokerId": 0, "haServerAddr": "127.0.0.1:10912"}
    f.update(over)
    return {k: v for k, v in f.items() if v is not None}


def _body(**over):
    b = {"topicConfigTable": {"T": topic_config("T")}, "dataVersion": {"timestamp": 1, "counter": 1}}
    b.update(over)
    return [msgpack.packb({k: v for k, v in b.items() if v is not None})]


BAD_REQUESTS = [
    # (code, fields, bodies, word the remark must contain)
    (RequestCode.REGISTER_BROKER, _fields(brokerId="0"), _body(), "brokerId"),
    (RequestCode.REGISTER_BROKER, _fields(brokerId=-1), _body(), "brokerId"),
    (RequestCode.REGISTER_BROKER, _fields(brokerId=True), _body(), "brokerId"),
    (RequestCode.REGISTER_BROKER, _fields(brokerName=None), _body(), "brokerName"),
    (RequestCode.REGISTER_BROKER, _fields(brokerName="../etc"), _body(), "brokerName"),
    (RequestCode.REGISTER_BROKER, _fields(clusterName=7), _body(), "clusterName"),
    (RequestCode.REGISTER_BROKER, _fields(brokerAddr="nohost"), _body(), "brokerAddr"),
    (RequestCode.REGISTER_BROKER, _fields(brokerAddr="h:99999"), _body(), "brokerAddr"),
    (RequestCode.REGISTER_BROKER, _fields(haServerAddr=["x"]), _body(), "haServerAddr"),
    (RequestCode.REGISTER_BROKER, _fields(), [], "body"),
    (RequestCode.REGISTER_BROKER, _fields(), [b"\xc1"], "body"),
    (RequestCode.REGISTER_BROKER, _fields(), [msgpack.packb([1, 2])], "body"),
    (RequestCode.REGISTER_BROKER, _fields(), _body(dataVersion=None), "dataVersion"),
    (RequestCode.REGISTER_BROKER, _fields(), _body(dataVersion={"timestamp": "x", "counter": 1}), "timestamp"),
    (RequestCode.REGISTER_BROKER, _fields(), _body(topicConfigTable=[1]), "topicConfigTable"),
    (RequestCode.REGISTER_BROKER, _fields(), _body(topicConfigTable={"../x": topic_config("../x")}), "topic"),
    (RequestCode.REGISTER_BROKER, _fields(), _body(topicConfigTable={"T": {**topic_config("T"), "perm": 99}}),
     "perm"),
    (RequestCode.REGISTER_BROKER, _fields(),
     _body(topicConfigTable={"T": {**topic_config("T"), "readQueueNums": "8"}}), "readQueueNums"),
    (RequestCode.REGISTER_BROKER, _fields(),
     _body(topicConfigTable={"T": {**topic_config("T"), "topicName": "Other"}}), "topicName"),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "../x"}, [], "topic"),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": ""}, [], "topic"),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "a" * 200}, [], "topic"),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": 5}, [], "topic"),
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, [], "topic"),
    (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "a/b"}, [], "topic"),
    (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "clusterName": 3}, [], "clusterName"),
    (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {}, [], "brokerName"),
    (RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": 1.5}, [], "brokerName"),
    (RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": None}, [], "cluster"),
    (RequestCode.UNREGISTER_BROKER, _fields(brokerId="x"), [], "brokerId"),
    (RequestCode.QUERY_DATA_VERSION, _fields(), [msgpack.packb({"counter": 1})], "timestamp"),
]


def test_bad_fields_are_rejected_and_change_nothing(actors, tmp_path):
    ns = start_nameserver(actors, tmp_path)
    with RemotingClient() as c:
        assert c.invoke(ns.endpoint, register_frame(topics=("T",)), TIMEOUT_MS).code == ResponseCode.SUCCESS
        before_route = body(route_of(c, ns, "T"))
        before_info = body(call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO))
        for code, fields, bodies, word in BAD_REQUESTS:
            r = call(c, ns, code, fields, bodies)
            assert r.code == ResponseCode.SYSTEM_ERROR, (code, fields, r)
            assert word in r.remark, (code, fields, r.remark)
        # nothing changed, and the nameserver still serves
        assert body(route_of(c, ns, "T")) == before_route
        assert body(call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO)) == before_info
        assert route_of(c, ns, "x").code == ResponseCode.TOPIC_NOT_EXIST
        assert call(c, ns, RequestCode.SEND_MESSAGE).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert ns.terminate() == 0


def test_listen_port_in_use_fails_to_start(actors, tmp_path):
    ns = start_nameserver(actors, tmp_path)
    port = ns.endpoint.rsplit(":", 1)[1]
    with pytest.raises(RuntimeError, match="did not start"):
        actors("-m", "rmq.actors.nameserver", "--listen-port", port, "--store-path", str(tmp_path / "2"))
    assert ns.terminate() == 0
