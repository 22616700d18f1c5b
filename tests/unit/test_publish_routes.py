"""The producers' route state and NameServer look-ups without any I/O
(rmq.client.publish_routes): a scripted NameServer answers or fails each request a call yields,
under the blocking and the awaiting driver, and the refresh rules are asked with a clock of the
test's own."""
import pytest

from rmq.client.publish_routes import (NAMESRV, PROVISIONAL_POLL_MS, PROVISIONAL_REFRESH_MS, ROUTE_WRONG_REFRESH_MS,
                                       PublishRoutes)
from rmq.client.route import ROUTE_REFRESH_ON_FAILURE_MS, RouteCache
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, RequestCode, ResponseCode, pack_body
from tests.unit.call_drivers import under_both_drivers

MASTER_A, MASTER_B, SLAVE_B = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10922"


def _route(write_queues: int = 4, perm: int = 6) -> Frame:
    return Frame(ResponseCode.SUCCESS, bodies=[pack_body({
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": write_queues, "perm": perm}],
        "brokerDatas": [{"brokerName": "broker-a", "cluster": "c", "brokerAddrs": {"0": MASTER_A}}]})])


def _cluster(*groups) -> Frame:
    return Frame(ResponseCode.SUCCESS, bodies=[pack_body({"brokerAddrTable": {
        name: {"brokerName": name, "cluster": "c", "brokerAddrs": addrs} for name, addrs in groups}})])


NOT_EXIST = Frame(ResponseCode.TOPIC_NOT_EXIST, remark="No topic route info in name server for the topic: T")


def _run(make_call, steps):
    """Run ``make_call(routes)`` against ``steps`` ([(request code, answer Frame or exception)])
    under both drivers: the outcome (result or exception) and the blocking run's table."""
    def setup():
        routes, todo = PublishRoutes(RouteCache()), list(steps)

        def invoke(addr, frame, timeout_ms):
            assert addr == NAMESRV and todo, f"unexpected request {frame.code} to {addr!r}"
            code, answer = todo.pop(0)
            assert frame.code == code
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return make_call(routes), invoke, (routes, todo)

    (o1, (routes, todo1)), (o2, (_, todo2)) = under_both_drivers(setup)
    assert todo1 == todo2 == [], f"requests never made: {todo1} / {todo2}"
    if isinstance(o1, Exception):
        assert (type(o1), str(o1), getattr(o1, "response_code", None)) == \
            (type(o2), str(o2), getattr(o2, "response_code", None))
    else:
        assert repr(o1) == repr(o2)
    return o1, routes


def test_a_known_topics_route_goes_into_the_cache():
    info, routes = _run(lambda r: r.publish_info_call("T"), [(RequestCode.GET_ROUTEINFO_BY_TOPIC, _route())])
    assert not info.provisional and [(q.broker_name, q.queue_id) for q in info.message_queue_list] == \
        [("broker-a", i) for i in range(4)]
    assert routes.cache.publish_info("T") is info and routes.cache.master_addrs() == [MASTER_A]
    assert routes.provisional_due(1e9) == [] and not routes.any_provisional


def test_route_call_returns_none_for_an_unknown_topic_and_asks_nothing_else():
    route, routes = _run(lambda r: r.route_call("T"), [(RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST)])
    assert route is None and routes.cache.publish_info("T") is None


def test_an_unknown_topic_gets_a_provisional_route_to_every_group_with_a_master():
    info, routes = _run(lambda r: r.publish_info_call("T"), [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST),
        (RequestCode.GET_BROKER_CLUSTER_INFO, _cluster(("broker-b", {"0": MASTER_B, "1": SLAVE_B}),
                                                       ("broker-a", {"0": MASTER_A}),
                                                       ("broker-c", {"1": "127.0.0.1:10931"})))])
    assert info.provisional and info.ok
    # queue -1: the broker picks the queue and creates the topic; broker-c has no master
    assert [(q.broker_name, q.queue_id) for q in info.message_queue_list] == [("broker-a", -1), ("broker-b", -1)]
    assert routes.any_provisional
    routes.started("T", 10.0)
    routes.ended("T")
    assert routes.provisional_due(10.0 + PROVISIONAL_POLL_MS / 1000.0 - 0.001) == []
    assert routes.provisional_due(10.0 + PROVISIONAL_POLL_MS / 1000.0 + 1e-9) == ["T"]
    assert routes.provisional_due(10.0 + PROVISIONAL_POLL_MS / 1000.0 + 1e-9) == []   # asked: not due again at once
    routes.started("T", 20.0)                         # a poll is out: not due twice
    assert routes.provisional_due(30.0) == []
    routes.ended("T")
    routes.cache.update("T", routes.cache.route("T") or _route_data())   # the NameServer knows it now
    assert routes.provisional_due(40.0) == [] and not routes.any_provisional


def _route_data():
    from rmq.client.route import parse_route_response
    return parse_route_response(_route(), "T")


def test_no_broker_with_a_master_is_no_route():
    err, _ = _run(lambda r: r.publish_info_call("T"), [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST),
        (RequestCode.GET_BROKER_CLUSTER_INFO, _cluster(("broker-b", {"1": SLAVE_B})))])
    assert isinstance(err, MQClientError) and err.response_code == ResponseCode.TOPIC_NOT_EXIST
    assert str(err).endswith("No route info of this topic: T, and the NameServer knows no broker with a master")


def test_a_route_without_a_writable_queue_is_no_route():
    err, routes = _run(lambda r: r.publish_info_call("T"), [(RequestCode.GET_ROUTEINFO_BY_TOPIC, _route(perm=4))])
    assert isinstance(err, MQClientError) and err.response_code == ResponseCode.TOPIC_NOT_EXIST
    assert "no writable queue" in str(err) and routes.usable("T") is None


@pytest.mark.parametrize("failure", [RemotingTimeoutError("NameServer did not answer"), RemotingError("refused")])
def test_a_name_server_that_cannot_be_asked_is_no_route_with_the_cause(failure):
    err, _ = _run(lambda r: r.publish_info_call("T"), [(RequestCode.GET_ROUTEINFO_BY_TOPIC, failure)])
    assert type(err) is MQClientError and err.response_code == -1
    assert str(err) == f"No route info of this topic: T: {failure}" and err.__cause__ is not None


def test_a_name_servers_error_code_is_the_calls_error_as_it_came():
    err, _ = _run(lambda r: r.publish_info_call("T"), [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, Frame(ResponseCode.SYSTEM_ERROR, remark="disk full"))])
    assert isinstance(err, MQClientError) and err.response_code == ResponseCode.SYSTEM_ERROR
    assert "disk full" in str(err)


def test_a_cluster_look_up_that_fails_is_no_route_too():
    err, _ = _run(lambda r: r.publish_info_call("T"), [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST),
        (RequestCode.GET_BROKER_CLUSTER_INFO, RemotingTimeoutError("late"))])
    assert str(err) == "No route info of this topic: T: late"


def test_brokers_call_fills_the_cache():
    brokers, routes = _run(lambda r: r.brokers_call(),
                           [(RequestCode.GET_BROKER_CLUSTER_INFO, _cluster(("broker-b", {"0": MASTER_B})))])
    assert [b.broker_name for b in brokers] == ["broker-b"] and routes.cache.master_addrs() == [MASTER_B]


def test_look_ups_out_are_counted_per_topic():
    routes = PublishRoutes(RouteCache())
    assert not routes.fetching("T") and routes.since_fetch("T", 5.0) == float("inf")
    routes.started("T", 1.0)
    routes.started("T", 2.0)
    routes.ended("T")
    assert routes.fetching("T") and not routes.fetching("U") and routes.since_fetch("T", 5.0) == 3.0
    routes.ended("T")
    assert not routes.fetching("T")


def test_when_a_failed_send_looks_its_route_up_again():
    gap, wrong = ROUTE_REFRESH_ON_FAILURE_MS / 1000.0, ROUTE_WRONG_REFRESH_MS / 1000.0
    # the route is wrong for sure: within ROUTE_WRONG_REFRESH_MS of the last look-up, not before
    for exc in (MQBrokerError("x", ResponseCode.TOPIC_NOT_EXIST), Frame(ResponseCode.NO_PERMISSION)):
        routes = PublishRoutes(RouteCache())
        routes.started("T", 100.0)
        routes.ended("T")
        assert not routes.refresh_after_failure("T", exc, 100.0 + wrong - 0.001)
        assert routes.refresh_after_failure("T", exc, 100.0 + wrong + 1e-9)
        assert not routes.refresh_after_failure("T", exc, 100.0 + wrong + 1e-9)   # the rest of the burst
    # in doubt (no answer, a lost connection, a slave): at most every ROUTE_REFRESH_ON_FAILURE_MS
    for exc in (RemotingTimeoutError("late"), MQBrokerError("x", ResponseCode.SERVICE_NOT_AVAILABLE)):
        routes = PublishRoutes(RouteCache())
        routes.started("T", 100.0)
        routes.ended("T")
        assert not routes.refresh_after_failure("T", exc, 100.0 + gap - 0.001)
        assert routes.refresh_after_failure("T", exc, 100.0 + gap + 1e-9)
        # a yes counts as the look-up's start: a burst of failures asks once, even before the
        # driver has started the look-up (rmq.aio spawns a task for it)
        assert not routes.refresh_after_failure("T", exc, 100.0 + gap + 0.5)
        assert routes.refresh_after_failure("T", exc, 100.0 + 2 * gap + 2e-9)
    # a refusal of the message itself says nothing of the route
    routes = PublishRoutes(RouteCache())
    assert not routes.refresh_after_failure("T", MQBrokerError("x", ResponseCode.MESSAGE_ILLEGAL), 1e9)
    assert not routes.refresh_after_failure("T", MQClientError("bad body"), 1e9)
    assert routes.refresh_after_failure("T", RemotingError("gone"), 1e9)         # never looked up: at once


def test_a_send_on_a_provisional_route_looks_it_up_at_most_every_refresh_interval():
    routes = PublishRoutes(RouteCache())
    info = routes.cache.set_provisional("T", [])
    known = routes.cache.update("K", _route_data()) and routes.cache.publish_info("K")
    routes.started("T", 50.0)
    routes.ended("T")
    assert not routes.refresh_after_send(info, 50.0 + PROVISIONAL_REFRESH_MS / 1000.0 - 0.001)
    assert routes.refresh_after_send(info, 50.0 + PROVISIONAL_REFRESH_MS / 1000.0 + 1e-9)
    assert not routes.refresh_after_send(info, 50.0 + PROVISIONAL_REFRESH_MS / 1000.0 + 1e-9)   # once per gap
    assert not routes.refresh_after_send(known, 1e9)


def test_each_name_server_still_to_try_gets_an_equal_share_of_what_is_left():
    from rmq.client.route import namesrv_attempt_s
    assert namesrv_attempt_s(3.0, 1) == 3.0                  # the only one: the whole budget
    assert namesrv_attempt_s(3.0, 3) == 1.0                  # the first of three: a third
    left = 3.0
    for k in (3, 2, 1):                                      # three that never answer: the budget, no more
        left -= namesrv_attempt_s(left, k)
    assert abs(left) < 1e-12
    assert namesrv_attempt_s(1.0, 0) == 1.0                  # never a division by zero
