"""Admin reads routes and the cluster table with the clients' one checked parser
(rmq.common.route.TopicRouteData / rmq.client.route.parse_cluster_info): a NameServer answer that
is malformed is an MQClientError naming the field, never a KeyError, and a good one keeps the
admin's shape (BrokerData.master_addr a property, int broker ids).  The NameServer here is a
scripted ROUTER that answers each request with the body given."""
import threading

import pytest
import zmq

from rmq import protocol as P
from rmq.client.admin import Admin, BrokerData, TopicRoute
from rmq.errors import MQClientError
from rmq.protocol import Frame, ResponseCode


class ScriptedNamesrv:
    """Answers every request with SUCCESS and the next body of ``bodies`` (packed)."""

    def __init__(self, bodies):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.bodies = list(bodies)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while self.bodies:
            if not poller.poll(10_000):
                return
            parts = self.sock.recv_multipart()
            req = P.decode(parts[1:])
            body = self.bodies.pop(0)
            resp = Frame(ResponseCode.SUCCESS, req.opaque, P.FLAG_RESPONSE, bodies=[P.pack_body(body)])
            self.sock.send_multipart([parts[0]] + P.encode(resp))

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def close(self):
        self.thread.join(10)
        self.sock.close(0)
        self.ctx.destroy(0)


GOOD_ROUTE = {"queueDatas": [{"brokerName": "b", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
                             {"brokerName": "a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}],
              "brokerDatas": [{"cluster": "c", "brokerName": "b", "brokerAddrs": {"0": "127.0.0.1:2", "1": "127.0.0.1:3"}},
                              {"cluster": "c", "brokerName": "a", "brokerAddrs": {"0": "127.0.0.1:1"}}]}


def admin_with(*bodies):
    ns = ScriptedNamesrv(bodies)
    return ns, Admin(ns.addr, timeout_ms=5000)


def test_a_route_keeps_the_admins_shape_sorted_with_int_broker_ids():
    ns, admin = admin_with(GOOD_ROUTE)
    try:
        route = admin.topic_route("T")
    finally:
        admin.close()
        ns.close()
    assert isinstance(route, TopicRoute) and route.topic == "T"
    assert [q.broker_name for q in route.queue_datas] == ["a", "b"]
    assert [type(b) for b in route.broker_datas] == [BrokerData, BrokerData]
    assert [(b.broker_name, b.master_addr, b.broker_addrs) for b in route.broker_datas] == [
        ("a", "127.0.0.1:1", {0: "127.0.0.1:1"}), ("b", "127.0.0.1:2", {0: "127.0.0.1:2", 1: "127.0.0.1:3"})]


@pytest.mark.parametrize("route, field", [
    ({"queueDatas": [{"brokerName": "a", "readQueueNums": 4, "writeQueueNums": 4}], "brokerDatas": []}, "perm"),
    ({"queueDatas": [], "brokerDatas": [{"cluster": "c", "brokerAddrs": {"0": "127.0.0.1:1"}}]}, "brokerName"),
    ({"queueDatas": [], "brokerDatas": [{"brokerName": "a", "brokerAddrs": {"master": "127.0.0.1:1"}}]},
     "broker id"),
    (["not", "a", "map"], "must be a map"),
], ids=["no perm", "no broker name", "broker id not an int", "not a map"])
def test_a_malformed_route_is_a_clear_client_error(route, field):
    ns, admin = admin_with(route)
    try:
        with pytest.raises(MQClientError, match=field):
            admin.topic_route("T")
    finally:
        admin.close()
        ns.close()


def test_a_malformed_cluster_table_is_a_clear_client_error():
    bad = {"brokerAddrTable": {"a": {"cluster": "c", "brokerName": "a", "brokerAddrs": {"0": "127.0.0.1:1"}}},
           "clusterAddrTable": {"c": "a"}}
    ns, admin = admin_with(bad, {"brokerAddrTable": {"a": {"cluster": "c"}}, "clusterAddrTable": {}})
    try:
        with pytest.raises(MQClientError, match="clusterAddrTable"):
            admin._cluster_info()
        with pytest.raises(MQClientError, match="brokerName"):
            admin._cluster_info()
    finally:
        admin.close()
        ns.close()
