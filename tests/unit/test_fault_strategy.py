"""rmq.client.route: RocketMQ's latency fault tables and queue selection (SPEC.md §15.1), routes."""
import pytest

from rmq.client.message import MessageQueue
from rmq.client.route import (ISOLATION_LATENCY_MS_5, LATENCY_MAX_5, LATENCY_MAX_49, NOT_AVAILABLE_DURATION_5,
                              NOT_AVAILABLE_DURATION_49, BrokerData, LatencyFaultTolerance, MQFaultStrategy,
                              RouteCache, TopicPublishInfo, TopicRouteData, parse_cluster_info, parse_route_response,
                              route_to_publish_info, route_to_subscribe_info, split_namesrv_addr)
from rmq.errors import MQClientError
from rmq.protocol import Frame, ResponseCode, pack_body


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def info(*brokers, queues=2, start=0):
    mqs = [MessageQueue("T", b, q) for b in brokers for q in range(queues)]
    return TopicPublishInfo("T", mqs, start_index=start)


def test_tables_are_rocketmq_49_and_5():
    assert LATENCY_MAX_49 == (50, 100, 550, 1000, 2000, 3000, 15000)
    assert NOT_AVAILABLE_DURATION_49 == (0, 0, 30000, 60000, 120000, 180000, 600000)
    assert LATENCY_MAX_5 == (50, 100, 550, 1800, 3000, 5000, 15000)
    assert NOT_AVAILABLE_DURATION_5 == (0, 0, 2000, 5000, 6000, 10000, 30000)


@pytest.mark.parametrize("latency, duration", [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 30000), (999, 30000), (1000, 60000),
    (1999, 60000), (2000, 120000), (2999, 120000), (3000, 180000), (14999, 180000), (15000, 600000),
    (30000, 600000), (10 ** 9, 600000)])
def test_compute_not_available_duration_49(latency, duration):
    assert MQFaultStrategy().compute_not_available_duration(latency) == duration


@pytest.mark.parametrize("latency, duration", [(549, 0), (550, 2000), (1800, 5000), (3000, 6000), (5000, 10000),
                                               (10000, 10000), (15000, 30000)])
def test_compute_not_available_duration_5(latency, duration):
    s = MQFaultStrategy(True, LATENCY_MAX_5, NOT_AVAILABLE_DURATION_5, ISOLATION_LATENCY_MS_5)
    assert s.compute_not_available_duration(latency) == duration


def test_bad_tables_rejected():
    with pytest.raises(ValueError):
        MQFaultStrategy(latency_max=(1, 2), not_available_duration=(0,))
    with pytest.raises(ValueError):
        MQFaultStrategy(latency_max=(100, 50), not_available_duration=(0, 1))


def test_isolation_uses_pseudo_latency_30000_then_recovers():
    clock = Clock()
    s = MQFaultStrategy(enabled=True, clock=clock)
    s.update_fault_item("a", 5, isolation=True)
    item = s.latency_fault_tolerance.items()["a"]
    assert item.current_latency == 30000
    assert item.start_timestamp == clock.t + 600000
    assert not s.is_available("a")
    clock.t += 599_999
    assert not s.is_available("a")
    clock.t += 1
    assert s.is_available("a")


def test_fast_send_keeps_broker_available_slow_one_isolates():
    clock = Clock()
    s = MQFaultStrategy(enabled=True, clock=clock)
    s.update_fault_item("a", 80, isolation=False)
    assert s.is_available("a")
    s.update_fault_item("a", 1200, isolation=False)          # bucket 3: 60 s
    assert not s.is_available("a")
    clock.t += 60_000
    assert s.is_available("a")


def test_disabled_strategy_records_nothing():
    s = MQFaultStrategy(enabled=False)
    s.update_fault_item("a", 99999, isolation=True)
    assert s.latency_fault_tolerance.items() == {}
    assert s.is_available("a")


def test_disabled_round_robin_and_retry_avoids_last_broker():
    s = MQFaultStrategy(enabled=False)
    ti = info("a", "b", queues=2, start=-1)      # next index 0
    picked = [s.select_one_message_queue(ti) for _ in range(8)]
    assert [(m.broker_name, m.queue_id) for m in picked[:4]] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert picked[4:] == picked[:4]
    for _ in range(10):
        assert s.select_one_message_queue(ti, last_broker_name="a").broker_name == "b"


def test_single_broker_retry_falls_back_to_same_broker():
    ti = info("a", queues=3)
    assert TopicPublishInfo.select_one_message_queue(ti, "a").broker_name == "a"


def test_enabled_skips_unavailable_broker():
    clock = Clock()
    s = MQFaultStrategy(enabled=True, clock=clock)
    ti = info("a", "b", "c", queues=2, start=0)
    s.update_fault_item("b", 0, isolation=True)
    seen = {s.select_one_message_queue(ti).broker_name for _ in range(30)}
    assert seen == {"a", "c"}
    clock.t += 600_000
    seen = {s.select_one_message_queue(ti).broker_name for _ in range(30)}
    assert seen == {"a", "b", "c"}


def test_enabled_retry_prefers_another_available_broker():
    s = MQFaultStrategy(enabled=True, clock=Clock())
    ti = info("a", "b", queues=4)
    for _ in range(20):
        assert s.select_one_message_queue(ti, last_broker_name="a").broker_name == "b"


def test_enabled_all_unavailable_picks_not_best_broker():
    clock = Clock()
    s = MQFaultStrategy(enabled=True, clock=clock)
    ti = info("a", "b", queues=2)
    s.update_fault_item("a", 20000, isolation=False)    # 600 s
    s.update_fault_item("b", 600, isolation=False)      # 30 s, lower latency: the "least bad"
    for _ in range(10):
        mq = s.select_one_message_queue(ti)
        assert mq.broker_name == "b" and mq.queue_id in (0, 1)


def test_pick_one_at_least_orders_available_then_latency():
    clock = Clock()
    lft = LatencyFaultTolerance(clock)
    assert lft.pick_one_at_least() is None
    lft.update_fault_item("slow", 5000, 1000)
    lft.update_fault_item("fast", 10, 1000)
    lft.update_fault_item("ok", 3000, 0)                 # available now
    lft.update_fault_item("worst", 9000, 5000)
    picks = {lft.pick_one_at_least() for _ in range(20)}  # better half = 2 items: "ok" (available), "fast"
    assert picks == {"ok", "fast"}
    lft.remove("ok")
    lft.remove("fast")
    lft.remove("worst")
    assert lft.pick_one_at_least() == "slow"


def test_not_best_broker_without_queues_is_forgotten():
    s = MQFaultStrategy(enabled=True, clock=Clock())
    ti = info("a", queues=2)
    lft = s.latency_fault_tolerance
    lft.update_fault_item("a", 30000, 600000)
    lft.update_fault_item("gone", 1, 600000)          # least bad, but the topic has no queue there
    mq = s.select_one_message_queue(ti)
    assert mq.broker_name == "a"
    assert "gone" not in lft.items()


def test_no_queue_raises():
    with pytest.raises(MQClientError, match="No route info"):
        MQFaultStrategy(enabled=True).select_one_message_queue(TopicPublishInfo("T", []))
    with pytest.raises(MQClientError, match="No route info"):
        MQFaultStrategy().select_one_message_queue(TopicPublishInfo("T", []))


ROUTE = {"queueDatas": [{"brokerName": "b", "readQueueNums": 4, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0},
                        {"brokerName": "a", "readQueueNums": 3, "writeQueueNums": 3, "perm": 6},
                        {"brokerName": "ro", "readQueueNums": 2, "writeQueueNums": 2, "perm": 4},
                        {"brokerName": "nomaster", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}],
         "brokerDatas": [{"cluster": "c", "brokerName": "a", "brokerAddrs": {"0": "127.0.0.1:1"}},
                         {"cluster": "c", "brokerName": "b", "brokerAddrs": {"0": "127.0.0.1:2", "1": "127.0.0.1:3"}},
                         {"cluster": "c", "brokerName": "ro", "brokerAddrs": {"0": "127.0.0.1:4"}},
                         {"cluster": "c", "brokerName": "nomaster", "brokerAddrs": {"1": "127.0.0.1:5"}}]}


def test_route_to_publish_and_subscribe_info():
    r = TopicRouteData.from_wire(ROUTE, "T")
    pub = route_to_publish_info("T", r)
    assert [(m.broker_name, m.queue_id) for m in pub.message_queue_list] == [
        ("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    sub = route_to_subscribe_info("T", r)
    assert [(m.broker_name, m.queue_id) for m in sub] == [
        ("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2), ("b", 3), ("nomaster", 0), ("ro", 0), ("ro", 1)]


def test_route_cache_update_and_addresses():
    c = RouteCache()
    r = TopicRouteData.from_wire(ROUTE, "T")
    assert c.update("T", r) is True
    assert c.update("T", TopicRouteData.from_wire(ROUTE, "T")) is False
    assert c.find_broker_addr("b") == "127.0.0.1:2"
    assert c.find_broker_addr("nomaster") is None
    assert c.find_broker_addr("nomaster", master_only=False) == "127.0.0.1:5"
    assert c.topics() == ["T"]
    assert len(c.subscribe_info("T")) == 10
    idx = c.publish_info("T").index
    c.publish_info("T").next_index()
    changed = dict(ROUTE, queueDatas=ROUTE["queueDatas"][:1])
    assert c.update("T", TopicRouteData.from_wire(changed, "T")) is True
    assert c.publish_info("T").index == idx + 1          # round robin continues across route changes


def test_route_cache_provisional():
    c = RouteCache()
    info = c.set_provisional("New", [BrokerData("c", "b", {0: "h:2"}), BrokerData("c", "a", {0: "h:1"}),
                                     BrokerData("c", "s", {1: "h:3"})])
    assert info.provisional and [(m.broker_name, m.queue_id) for m in info.message_queue_list] == [("a", -1),
                                                                                                   ("b", -1)]
    assert c.find_broker_addr("a") == "h:1"
    assert c.update("New", TopicRouteData.from_wire(ROUTE, "New")) is True
    assert not c.publish_info("New").provisional


def test_parse_responses():
    ok = Frame(ResponseCode.SUCCESS, bodies=[pack_body(ROUTE)])
    assert len(parse_route_response(ok, "T").queue_datas) == 4
    assert parse_route_response(Frame(ResponseCode.TOPIC_NOT_EXIST), "T") is None
    with pytest.raises(MQClientError) as ei:
        parse_route_response(Frame(ResponseCode.SYSTEM_ERROR, remark="boom"), "T")
    assert ei.value.response_code == ResponseCode.SYSTEM_ERROR
    with pytest.raises(MQClientError, match="queueDatas"):
        parse_route_response(Frame(ResponseCode.SUCCESS, bodies=[pack_body({"queueDatas": 3})]), "T")
    with pytest.raises(MQClientError, match="writeQueueNums"):
        parse_route_response(Frame(ResponseCode.SUCCESS, bodies=[pack_body(
            {"queueDatas": [{"brokerName": "a", "readQueueNums": 1, "writeQueueNums": -1, "perm": 6}]})]), "T")
    with pytest.raises(MQClientError, match="msgpack"):
        parse_route_response(Frame(ResponseCode.SUCCESS, bodies=[b"\xc1"]), "T")
    ci = Frame(ResponseCode.SUCCESS, bodies=[pack_body({"brokerAddrTable": {
        "b": {"cluster": "c", "brokerName": "b", "brokerAddrs": {"0": "h:2"}}}, "clusterAddrTable": {"c": ["b"]}})])
    assert [b.broker_name for b in parse_cluster_info(ci)] == ["b"]


def test_split_namesrv_addr():
    assert split_namesrv_addr("127.0.0.1:9876") == ["127.0.0.1:9876"]
    assert split_namesrv_addr(" a:1; b:2 ;tcp://c:3;") == ["a:1", "b:2", "c:3"]
    for bad in ("", ";", "nohost", "a:b"):
        with pytest.raises(MQClientError):
            split_namesrv_addr(bad)
