"""Client and admin side of master/slave HA (SPEC.md §9, §13.2): which broker of a group a
consumer reads from, offset-call addresses, and the admin HA views / commands.

No broker here: the selection logic runs on real route objects (TopicRouteData, TopicRoute)
parsed from NameServer-shaped bodies, the CLI through click's CliRunner and the rendering helpers.
"""
from __future__ import annotations

import io
import logging
import time

import pytest
from click.testing import CliRunner

from rmq.admin_cli import (CLUSTER_COLUMNS, cluster_rows, ha_rows, ha_slave_rows, render_broker_status,
                           status_rows)
from rmq.cli import main
from rmq.client.admin import Admin, BrokerInfo, _config_body, fill_ha_info
from rmq.client.consumer_api import (ConsumerAPI, PullFromWhichNode, TopicRoute, group_addrs,
                                     suggested_broker_id)
from rmq.client.message import MessageQueue
from rmq.client.route import TopicRouteData, find_broker_address_in_subscribe, find_master_or_slave
from rmq.errors import MQClientError, RemotingTimeoutError
from rmq.protocol import Frame, RequestCode, ResponseCode

MASTER, SLAVE1, SLAVE2 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
TOPIC = "TopicHA"
MQ = MessageQueue(TOPIC, "broker-a", 0)


def route_body(addrs: dict, broker_name: str = "broker-a", read_queue_nums: int = 4) -> dict:
    """A GET_ROUTEINFO_BY_TOPIC body with one broker group (brokerAddrs keys as on the wire: str)."""
    return {"queueDatas": [{"brokerName": broker_name, "readQueueNums": read_queue_nums,
                            "writeQueueNums": read_queue_nums, "perm": 6, "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": broker_name,
                             "brokerAddrs": {str(k): v for k, v in addrs.items()}}]}


def broker_data(addrs: dict):
    return TopicRouteData.from_wire(route_body(addrs), TOPIC).broker("broker-a")


def pull_response(suggest=None, code=ResponseCode.PULL_NOT_FOUND) -> Frame:
    fields = {"nextBeginOffset": 0, "minOffset": 0, "maxOffset": 0}
    if suggest is not None:
        fields["suggestWhichBrokerId"] = suggest
    return Frame(int(code), fields=fields, flag=1)


# -- address choice on TopicRouteData ------------------------------------------------------------------
def test_suggested_slave_is_used_when_in_route():
    bd = broker_data({0: MASTER, 1: SLAVE1})
    assert bd.find_broker_address_in_subscribe(1) == (1, SLAVE1)
    assert bd.find_broker_address_in_subscribe(0) == (0, MASTER)


def test_suggested_broker_missing_falls_back_to_master():
    bd = broker_data({0: MASTER, 1: SLAVE1})
    assert bd.find_broker_address_in_subscribe(2) == (0, MASTER)


def test_master_gone_reads_from_lowest_slave():
    bd = broker_data({2: SLAVE2, 1: SLAVE1})
    assert bd.master_addr() is None
    assert bd.find_broker_address_in_subscribe(0) == (1, SLAVE1)
    assert bd.find_broker_address_in_subscribe(2) == (2, SLAVE2)
    assert find_master_or_slave(bd.broker_addrs) == (1, SLAVE1)


def test_only_this_broker():
    bd = broker_data({0: MASTER, 1: SLAVE1})
    assert bd.find_broker_address_in_subscribe(1, only_this_broker=True) == (1, SLAVE1)
    assert bd.find_broker_address_in_subscribe(2, only_this_broker=True) is None


def test_avoided_address_is_skipped_but_used_when_alone():
    bd = broker_data({0: MASTER, 1: SLAVE1})
    assert bd.find_broker_address_in_subscribe(0, avoid={MASTER}) == (1, SLAVE1)
    assert bd.find_broker_address_in_subscribe(1, avoid={SLAVE1}) == (0, MASTER)
    # everything avoided: still an answer, in the normal order (try something rather than nothing)
    assert bd.find_broker_address_in_subscribe(1, avoid={MASTER, SLAVE1}) == (1, SLAVE1)
    assert broker_data({0: MASTER}).find_broker_address_in_subscribe(0, avoid={MASTER}) == (0, MASTER)


def test_empty_group_and_wire_string_keys():
    assert find_broker_address_in_subscribe({}, 0) is None
    assert find_broker_address_in_subscribe({"1": SLAVE1, "0": MASTER}, 1) == (1, SLAVE1)
    assert find_broker_address_in_subscribe({"1": SLAVE1}, 0) == (1, SLAVE1)


# -- the consumer's TopicRoute ------------------------------------------------------------------------------
def test_slave_only_group_keeps_its_queues_readable():
    with_master = TopicRoute.from_wire(TOPIC, route_body({0: MASTER, 1: SLAVE1}))
    slave_only = TopicRoute.from_wire(TOPIC, route_body({1: SLAVE1}))
    assert slave_only.subscribe_queues() == with_master.subscribe_queues()
    assert [mq.queue_id for mq in slave_only.subscribe_queues()] == [0, 1, 2, 3]
    assert slave_only.all_master_addrs() == []
    assert slave_only.all_addrs() == [SLAVE1]
    assert slave_only.read_addrs() == [SLAVE1]
    assert with_master.read_addrs() == [MASTER]
    assert with_master.read_addrs(avoid={MASTER}) == [SLAVE1]
    assert with_master.all_addrs() == sorted([MASTER, SLAVE1])


def test_group_addrs_prefer_topic_route_then_freshest():
    old = TopicRoute.from_wire("Other", route_body({0: MASTER, 1: SLAVE1}))
    old.fetched_at = 100.0
    promoted = TopicRoute.from_wire(TOPIC, route_body({0: SLAVE1}))     # the slave re-registered as id 0
    promoted.fetched_at = 50.0
    assert group_addrs([old, promoted], "broker-a", TOPIC) == {0: SLAVE1}       # int ids: converted at the parse
    newer = TopicRoute.from_wire("Third", route_body({0: SLAVE1}))
    newer.fetched_at = 200.0
    assert group_addrs([old, newer], "broker-a") == {0: SLAVE1}
    assert group_addrs([old], "broker-b", TOPIC) == {}


# -- PullFromWhichNode ----------------------------------------------------------------------------------------
def test_suggested_broker_id_parsing():
    assert suggested_broker_id(pull_response(1)) == 1
    assert suggested_broker_id(pull_response(0)) == 0
    assert suggested_broker_id(pull_response("1")) == 1
    assert suggested_broker_id(pull_response()) is None
    assert suggested_broker_id(pull_response(-1)) is None
    assert suggested_broker_id(pull_response(True)) is None


def test_pull_from_which_node_follows_suggestions_per_queue():
    node = PullFromWhichNode()
    addrs = {"0": MASTER, "1": SLAVE1}
    other = MessageQueue(TOPIC, "broker-a", 1)
    assert node.select(MQ, addrs) == (0, MASTER)
    node.on_response(MQ, pull_response(1, ResponseCode.SUCCESS), MASTER)       # master: you lag, go to the slave
    assert node.select(MQ, addrs) == (1, SLAVE1)
    assert node.select(other, addrs) == (0, MASTER)                            # per queue
    node.on_response(MQ, pull_response(), SLAVE1)                              # no field: keep the last one
    assert node.select(MQ, addrs) == (1, SLAVE1)
    node.on_response(MQ, pull_response(0), SLAVE1)                             # slave: caught up, back to master
    assert node.select(MQ, addrs) == (0, MASTER)
    node.update(MQ, 1)
    assert node.select(MQ, {"0": MASTER}) == (0, MASTER)                       # slave gone from the route


def test_failed_master_is_avoided_until_isolation_ends_or_it_answers():
    now = [1000.0]
    node = PullFromWhichNode(isolation_ms=30_000, clock=lambda: now[0])
    addrs = {"0": MASTER, "1": SLAVE1}
    node.on_response(MQ, RemotingTimeoutError("no response"), MASTER)
    assert node.suspects() == {MASTER}
    assert node.select(MQ, addrs) == (1, SLAVE1)
    assert node.select_for_offsets(addrs) == (1, SLAVE1)
    node.on_response(MQ, pull_response(0), SLAVE1)                             # slave says "master", master still avoided
    assert node.select(MQ, addrs) == (1, SLAVE1)
    now[0] += 31
    assert node.suspects() == frozenset()
    assert node.select(MQ, addrs) == (0, MASTER)
    node.mark_unreachable(MASTER)
    node.on_response(None, pull_response(), MASTER)                            # any answer clears it
    assert node.select(MQ, addrs) == (0, MASTER)
    node.on_response(MQ, MQClientError("broker refused"), MASTER)              # not a remoting failure
    assert node.suspects() == frozenset()


# -- ConsumerAPI (no broker: routes put in its cache) -----------------------------------------------------------
@pytest.fixture
def api():
    a = ConsumerAPI("127.0.0.1:1", timeout_ms=100)                             # nothing listens there
    yield a
    a.close()


def _cache(api: ConsumerAPI, route: TopicRoute) -> None:
    with api._lock:
        api._routes[route.topic] = route


def test_consumer_api_pull_and_offset_addresses(api):
    _cache(api, TopicRoute.from_wire(TOPIC, route_body({0: MASTER, 1: SLAVE1})))
    assert api.pull_broker_addr(MQ) == (0, MASTER)
    assert api.read_broker_addr("broker-a", TOPIC) == (0, MASTER)
    assert api.broker_addr("broker-a", TOPIC) == MASTER
    api.on_pull_response(MQ, pull_response(1), MASTER)
    assert api.pull_broker_addr(MQ) == (1, SLAVE1)
    assert api.read_broker_addr("broker-a", TOPIC) == (0, MASTER)              # offsets stay on the master
    assert api.heartbeat_addrs() == sorted([MASTER, SLAVE1])
    assert api.all_broker_addrs() == [MASTER]


def test_consumer_api_master_gone_then_slave_promoted(api):
    _cache(api, TopicRoute.from_wire(TOPIC, route_body({1: SLAVE1})))          # NameServer dropped the master
    assert api.pull_broker_addr(MQ) == (1, SLAVE1)
    assert api.read_broker_addr("broker-a", TOPIC) == (1, SLAVE1)
    with pytest.raises(MQClientError):
        api.broker_addr("broker-a")                                            # master-only calls fail
    _cache(api, TopicRoute.from_wire(TOPIC, route_body({0: SLAVE1})))          # the slave re-registered as id 0
    assert api.pull_broker_addr(MQ) == (0, SLAVE1)
    assert api.broker_addr("broker-a", TOPIC) == SLAVE1


def test_consumer_api_failed_invoke_moves_reads_to_slave(api):
    _cache(api, TopicRoute.from_wire(TOPIC, route_body({0: MASTER, 1: SLAVE1})))
    with pytest.raises(RemotingTimeoutError):
        api.invoke("127.0.0.1:1", Frame(RequestCode.GET_MAX_OFFSET, fields={"topic": TOPIC, "queueId": 0}), 50)
    assert "127.0.0.1:1" in api.pull_from.suspects()
    api.on_pull_response(MQ, RemotingTimeoutError("no response"), MASTER)
    assert api.pull_broker_addr(MQ) == (1, SLAVE1)
    assert api.read_broker_addr("broker-a", TOPIC) == (1, SLAVE1)


def test_route_refresh_tries_an_unreachable_namesrv_once_per_interval(api, caplog):
    stale = TopicRoute.from_wire(TOPIC, route_body({0: MASTER}))
    stale.fetched_at = time.monotonic() - 3600
    _cache(api, stale)
    failed = "route refresh of %s failed" % TOPIC
    with caplog.at_level(logging.WARNING, logger="rmq"):
        api.refresh_route_if_stale(TOPIC, 30_000)                              # one NameServer timeout
        assert caplog.text.count(failed) == 1 and "127.0.0.1:1" in caplog.text
        tried = api._refresh_tried[TOPIC]
        for _ in range(5):
            api.refresh_route_if_stale(TOPIC, 30_000)                          # not again within the interval
    assert caplog.text.count(failed) == 1 and api._refresh_tried[TOPIC] == tried
    assert api.pull_broker_addr(MQ) == (0, MASTER)                             # the cached route stays


# -- admin: HA fields of clusterList --------------------------------------------------------------------------------
def _info(bid: int, addr: str, table: dict) -> BrokerInfo:
    i = BrokerInfo("DefaultCluster", "broker-a", bid, addr)
    i.runtime = table
    i.commitlog_max_offset = int(table.get("commitLogMaxOffset", 0))
    return i


def test_fill_ha_info_from_master_ha_slaves():
    master = _info(0, MASTER, {"brokerRole": "SYNC_MASTER", "brokerId": 0, "haEpoch": 3, "commitLogMaxOffset": 5000,
                               "haSlaveAckOffset": 4000,
                               "haSlaves": [{"slaveAddr": SLAVE1, "brokerId": 1, "ackOffset": 4000, "lagBytes": 1000,
                                             "lastAckMs": 1_700_000_000_000}]})
    slave = _info(1, SLAVE1, {"brokerRole": "SLAVE", "brokerId": 1, "haEpoch": 3, "commitLogMaxOffset": 4100,
                              "haMasterAddress": "10.0.0.1:10912", "haConnected": True})
    fill_ha_info([master, slave])
    assert (master.broker_role, master.ha_epoch, master.ha_slave_count) == ("SYNC_MASTER", 3, 1)
    assert (master.ha_ack_offset, master.ha_lag_bytes, master.ha_connected) == (-1, -1, None)
    assert (slave.broker_role, slave.ha_ack_offset, slave.ha_lag_bytes) == ("SLAVE", 4000, 1000)
    assert (slave.ha_connected, slave.ha_master_address) == (True, "10.0.0.1:10912")
    rows = cluster_rows([master, slave])
    col = {c: i for i, c in enumerate(CLUSTER_COLUMNS)}
    assert rows[0][col["Role"]] == "SYNC_MASTER" and rows[0][col["HA Lag (bytes)"]] == ""
    assert (rows[1][col["Role"]], rows[1][col["HA Ack Offset"]], rows[1][col["HA Lag (bytes)"]]) == ("SLAVE", 4000, 1000)


def test_fill_ha_info_without_master_entry_uses_the_slaves_own_offset():
    master = _info(0, MASTER, {"brokerRole": "ASYNC_MASTER", "commitLogMaxOffset": 5000, "haSlaves": []})
    slave = _info(1, SLAVE1, {"brokerRole": "SLAVE", "commitLogMaxOffset": 4500, "haConnected": False})
    fill_ha_info([master, slave])
    assert (slave.ha_ack_offset, slave.ha_lag_bytes, slave.ha_connected) == (4500, 500, False)
    # master down: the slave's own offset, lag unknown
    dead = BrokerInfo("DefaultCluster", "broker-a", 0, MASTER, error="did not answer")
    slave2 = _info(1, SLAVE1, {"brokerRole": "SLAVE", "commitLogMaxOffset": 4500})
    fill_ha_info([dead, slave2])
    assert (dead.broker_role, slave2.ha_ack_offset, slave2.ha_lag_bytes) == ("", 4500, -1)
    # an older broker without brokerRole: the role follows the broker id
    old_m, old_s = _info(0, MASTER, {"commitLogMaxOffset": 10}), _info(1, SLAVE1, {"commitLogMaxOffset": 10})
    fill_ha_info([old_m, old_s])
    assert (old_m.broker_role, old_s.broker_role) == ("ASYNC_MASTER", "SLAVE")


def test_config_body_and_promote_argument_checks():
    assert _config_body({"brokerRole": "ASYNC_MASTER", "brokerId": 0, "slaveReadEnable": True}) == {
        "brokerRole": "ASYNC_MASTER", "brokerId": "0", "slaveReadEnable": "true"}
    with pytest.raises(MQClientError):
        _config_body({})
    with pytest.raises(MQClientError):
        _config_body({" ": "x"})
    with Admin("127.0.0.1:1", timeout_ms=100) as a:
        with pytest.raises(MQClientError, match="role must be one of"):
            a.promote_slave(SLAVE1, role="SLAVE")                             # refused before any request


# -- admin CLI --------------------------------------------------------------------------------------------------------
def _admin(*args):
    return CliRunner().invoke(main, ["admin", "--timeout-ms", "100", "-n", "127.0.0.1:1", *args])


def test_cli_commands_and_aliases_exist():
    for name in ("updateBrokerConfig", "update-broker-config", "getBrokerConfig", "get-broker-config",
                 "promoteSlave", "promote-slave"):
        r = _admin(name, "-h")
        assert r.exit_code == 0, (name, r.output)
    helptext = _admin("promoteSlave", "-h").output
    assert "--role" in helptext and "ASYNC_MASTER" in helptext and "SYNC_MASTER" in helptext
    assert "-k, --key" in _admin("updateBrokerConfig", "-h").output


def test_cli_argument_errors():
    r = _admin("promoteSlave")
    assert r.exit_code == 2 and "--broker-addr" in r.output
    r = _admin("promoteSlave", "-b", SLAVE1, "--role", "SLAVE")
    assert r.exit_code == 2 and "SLAVE" in r.output
    r = _admin("updateBrokerConfig", "-b", MASTER, "-k", "brokerRole")
    assert r.exit_code == 2 and "--value" in r.output


def test_cli_unreachable_broker_is_a_clean_error():
    r = _admin("promoteSlave", "-b", "127.0.0.1:1")
    assert r.exit_code == 1
    assert "did not answer GET_BROKER_RUNTIME_INFO" in r.output
    r = _admin("getBrokerConfig", "-b", "127.0.0.1:1")
    assert r.exit_code == 1 and "did not answer GET_BROKER_CONFIG" in r.output
    r = _admin("updateBrokerConfig", "-b", "127.0.0.1:1", "-k", "brokerRole", "-v", "SYNC_MASTER")
    assert r.exit_code == 1 and "did not answer UPDATE_BROKER_CONFIG" in r.output


def test_broker_status_rendering_of_ha_keys():
    from rich.console import Console
    status = {"brokerRole": "ASYNC_MASTER", "brokerId": 0, "haEpoch": 2, "haSlaveAckOffset": 900,
              "commitLogMaxOffset": 1000, "putTps": 1.5,
              "haSlaves": [{"slaveAddr": SLAVE1, "brokerId": 1, "ackOffset": 900, "lagBytes": 100, "lastAckMs": 0}]}
    assert ha_rows(status) == [("brokerRole", "ASYNC_MASTER"), ("brokerId", "0"), ("haEpoch", "2"),
                               ("haSlaveAckOffset", "900"), ("commitLogMaxOffset", "1000")]
    assert ha_slave_rows(status) == [(SLAVE1, "1", "900", "100", "")]
    assert "haSlaves" not in dict(status_rows(status))
    assert ha_rows({"brokerRole": "SLAVE", "haConnected": False})[1] == ("haConnected", "false")
    out = io.StringIO()
    render_broker_status(Console(file=out, width=200), MASTER, status)
    text = out.getvalue()
    assert f"slaves of broker {MASTER}" in text and "Lag (bytes)" in text and SLAVE1 in text


def test_route_refresh_due_rule():
    from types import SimpleNamespace
    from rmq.client.consumer_api import route_refresh_due
    fresh = SimpleNamespace(fetched_at=100.0)
    assert not route_refresh_due(fresh, -1e18, 100.5, 1000)          # younger than the interval
    assert route_refresh_due(fresh, -1e18, 102.0, 1000)              # stale, never tried
    assert not route_refresh_due(fresh, 101.5, 102.0, 1000)          # stale, but tried 0.5 s ago
    assert route_refresh_due(None, -1e18, 0.0, 1000)                 # no route at all
    assert not route_refresh_due(None, 0.0, 0.2, 1000)
