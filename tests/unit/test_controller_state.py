"""The controller's replicated state (RocketMQ 5's ReplicasInfoManager) and heartbeat table, without
sockets or Raft: registration ids, every election rule, SyncStateSet changes, bad input, snapshots."""
import pickle

import pytest

from rmq.controller.actor import parse_peers, resolve_peers
from rmq.controller.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_MS, BrokerHeartbeatManager
from rmq.controller.raft import ReplicatedState, raft_address
from rmq.controller.state import NO_MASTER, ControllerState, InputError
from rmq.protocol import ResponseCode as RC

A1, A2, A3, A4 = "127.0.0.1:10911", "127.0.0.1:11911", "127.0.0.1:12911", "127.0.0.1:13911"


def cand(bid, epoch=0, offset=0, priority=0):
    return {"brokerId": bid, "epoch": epoch, "maxOffset": offset, "electionPriority": priority}


def registered(*addrs, name="broker-a"):
    st = ControllerState()
    for a in addrs:
        assert st.register_broker("DefaultCluster", name, a).code == RC.SUCCESS
    return st


def with_master(n=3, sss=(1, 2)):
    """A broker set of ``n`` replicas, master 1 at epoch 1, SyncStateSet ``sss`` (epoch 2)."""
    st = registered(*(A1, A2, A3, A4)[:n])
    r = st.elect_master("broker-a", [cand(1)])
    assert (r.code, r.info["masterBrokerId"], r.info["masterEpoch"]) == (RC.SUCCESS, 1, 1)
    r = st.alter_sync_state_set("broker-a", 1, 1, 1, list(sss))
    assert r.code == RC.SUCCESS
    return st


def info(st, name="broker-a"):
    return st.replica_info(name)


# -- registration ---------------------------------------------------------------------------------
def test_register_assigns_ids_from_1_stable_per_address():
    st = ControllerState()
    r = st.register_broker("DefaultCluster", "broker-a", A1)
    assert r.code == RC.SUCCESS and r.changed
    assert r.info == {"brokerName": "broker-a", "brokerId": 1, "masterBrokerId": NO_MASTER, "masterAddress": "",
                      "masterEpoch": 0, "syncStateSetEpoch": 0, "syncStateSet": []}
    assert st.register_broker("DefaultCluster", "broker-a", A2).info["brokerId"] == 2
    again = st.register_broker("DefaultCluster", "broker-a", A1)
    assert again.info["brokerId"] == 1 and not again.changed
    assert st.register_broker("DefaultCluster", "broker-a", A1, 1).info["brokerId"] == 1
    # another broker set counts from 1 again
    assert st.register_broker("DefaultCluster", "broker-b", A3).info["brokerId"] == 1
    assert st.brokers("broker-a") == {1: A1, 2: A2}


def test_register_with_a_given_id_and_conflicts():
    st = ControllerState()
    assert st.register_broker("C", "b", A1, 5).info["brokerId"] == 5
    assert st.register_broker("C", "b", A2).info["brokerId"] == 6          # highest + 1, never reused
    before = st.to_dict()
    for args, words in ((("C", "b", A1, 7), "registered in b as broker id 5"),   # address under another id
                        (("D", "b", A3), "belongs to cluster C"),          # another cluster
                        (("C", "b", A3, 0), "start at 1"),
                        (("C", "b", A3, -2), "outside"),
                        (("C", "b", "nohost"), "host:port"),
                        (("C", "b", "h:70000"), "host:port"),
                        (("C", "b/../x", A3), "brokerName"),
                        (("", "b", A3), "clusterName"),
                        ((1, "b", A3), "clusterName"),
                        (("C", "b", A3, True), "must be an int")):
        r = st.register_broker(*args)
        assert r.code == RC.CONTROLLER_INVALID_REQUEST and words in r.remark, (args, r)
        assert not r.changed
    assert st.to_dict() == before


def test_a_known_id_from_a_new_address_moves_there():
    # a broker restarted on another port keeps its id (config/controllerBrokerId.json)
    st = ControllerState()
    assert st.register_broker("C", "b", A1, 5).info["brokerId"] == 5
    assert st.register_broker("C", "b", A2).info["brokerId"] == 6
    r = st.register_broker("C", "b", A3, 5)
    assert r.code == RC.SUCCESS and r.changed and r.info["brokerId"] == 5
    assert st.brokers("b") == {5: A3, 6: A2}
    # the new address was held by another (stale) id: that one loses it until it registers again
    r = st.register_broker("C", "b", A2, 5)
    assert r.code == RC.SUCCESS and st.brokers("b") == {5: A2, 6: ""}
    assert st.resolve_broker("C", "b", A2, -1) == 5
    r = st.register_broker("C", "b", A1, 6)
    assert r.code == RC.SUCCESS and st.brokers("b") == {5: A2, 6: A1}


def test_resolve_broker():
    st = registered(A1, A2)
    assert st.resolve_broker("DefaultCluster", "broker-a", A2, -1) == 2
    assert st.resolve_broker("DefaultCluster", "broker-a", A2, 2) == 2
    assert st.resolve_broker("DefaultCluster", "broker-a", A2, 1) == NO_MASTER
    assert st.resolve_broker("Other", "broker-a", A2, 2) == NO_MASTER
    assert st.resolve_broker("DefaultCluster", "broker-x", A2, 2) == NO_MASTER
    assert st.resolve_broker("DefaultCluster", "broker-a", A3, -1) == NO_MASTER


# -- elections --------------------------------------------------------------------------------------
def test_first_election_any_alive_broker_best_by_epoch_offset_priority_id():
    st = registered(A1, A2, A3)
    assert st.eligible_ids("broker-a", [3, 2]) == [2, 3]       # never had a master: every alive one
    r = st.elect_master("broker-a", [cand(2, offset=5), cand(3, offset=9)])
    assert r.code == RC.SUCCESS and r.changed
    assert (r.info["masterBrokerId"], r.info["masterAddress"], r.info["masterEpoch"]) == (3, A3, 1)
    assert (r.info["syncStateSet"], r.info["syncStateSetEpoch"]) == ([3], 1)


@pytest.mark.parametrize("cands, winner", [
    ([cand(2, epoch=1, offset=10), cand(3, epoch=2, offset=0)], 3),                  # epoch first
    ([cand(2, epoch=2, offset=10), cand(3, epoch=2, offset=20)], 3),                 # then maxOffset
    ([cand(2, epoch=2, offset=20, priority=5), cand(3, epoch=2, offset=20, priority=1)], 3),   # then priority asc
    ([cand(3, epoch=2, offset=20, priority=1), cand(2, epoch=2, offset=20, priority=1)], 2),   # then id asc
])
def test_election_tie_breaks(cands, winner):
    st = with_master(3, sss=(1, 2, 3))
    r = st.elect_master("broker-a", cands)                  # master 1 is not among the alive
    assert r.code == RC.SUCCESS and r.info["masterBrokerId"] == winner


def test_alive_master_stays_and_nothing_changes():
    st = with_master(3, sss=(1, 2, 3))
    before = st.to_dict()
    r = st.elect_master("broker-a", [cand(1), cand(2, epoch=5, offset=100)])
    assert r.code == RC.SUCCESS and not r.changed and r.info["masterBrokerId"] == 1
    assert st.to_dict() == before


def test_only_the_sync_state_set_is_eligible():
    st = with_master(3, sss=(1, 2))
    # 3 is alive and far ahead, but out of sync: 2 is elected
    r = st.elect_master("broker-a", [cand(2, epoch=1, offset=10), cand(3, epoch=1, offset=10 ** 6)])
    assert r.code == RC.SUCCESS and r.info["masterBrokerId"] == 2
    assert (r.info["masterEpoch"], r.info["syncStateSet"], r.info["syncStateSetEpoch"]) == (2, [2], 3)


def test_no_eligible_replica_clears_the_master_and_keeps_the_sync_state_set():
    st = with_master(3, sss=(1, 2))
    r = st.elect_master("broker-a", [cand(3, epoch=1, offset=10 ** 6)])
    assert r.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and r.changed
    assert r.info == {"brokerName": "broker-a", "brokerId": -1, "masterBrokerId": NO_MASTER, "masterAddress": "",
                      "masterEpoch": 1, "syncStateSetEpoch": 2, "syncStateSet": [1, 2]}
    # again: nothing left to change
    r = st.elect_master("broker-a", [cand(3)])
    assert r.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and not r.changed
    assert st.eligible_ids("broker-a", [3]) == []
    # a member of the SyncStateSet comes back: elected above every epoch seen
    r = st.elect_master("broker-a", [cand(3), cand(2, epoch=1)])
    assert r.code == RC.SUCCESS and (r.info["masterBrokerId"], r.info["masterEpoch"]) == (2, 2)
    # the old master, back while the new one is dead, is out of the SyncStateSet {2}: not elected
    r = st.elect_master("broker-a", [cand(1, epoch=1)])
    assert r.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and r.info["masterBrokerId"] == NO_MASTER
    assert r.info["syncStateSet"] == [2]


def test_unclean_election_only_when_no_sync_state_set_member_is_alive():
    st = with_master(3, sss=(1, 2))
    assert st.eligible_ids("broker-a", [2, 3], unclean=True) == [2]
    assert st.eligible_ids("broker-a", [3], unclean=True) == [3]
    r = st.elect_master("broker-a", [cand(3, epoch=1, offset=5)], unclean=True)
    assert r.code == RC.SUCCESS and r.info["masterBrokerId"] == 3 and r.info["masterEpoch"] == 2


def test_epoch_goes_above_every_reported_epoch():
    st = with_master(3, sss=(1, 2))
    # 2 reports epoch 7 (it saw a master the state never recorded, say a restored snapshot)
    r = st.elect_master("broker-a", [cand(2, epoch=7)])
    assert r.info["masterEpoch"] == 8
    r = st.elect_master("broker-a", [cand(3, epoch=3)], unclean=True)   # 2 dead, 3 unclean, lower epoch
    assert r.info["masterEpoch"] == 9


def test_preferred_broker():
    st = with_master(3, sss=(1, 2))
    before = st.to_dict()
    # preferred = the alive master: nothing changes
    r = st.elect_master("broker-a", [cand(1), cand(2)], preferred_id=1)
    assert r.code == RC.SUCCESS and not r.changed
    # out of the SyncStateSet: refused, alive or not
    r = st.elect_master("broker-a", [cand(1), cand(3)], preferred_id=3)
    assert r.code == RC.CONTROLLER_INVALID_REQUEST and "not in the SyncStateSet" in r.remark
    r = st.elect_master("broker-a", [cand(1)], preferred_id=2)
    assert r.code == RC.CONTROLLER_BROKER_NOT_ALIVE
    r = st.elect_master("broker-a", [cand(1)], preferred_id=9)
    assert r.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST
    assert st.to_dict() == before
    # in sync and alive: it takes over from the alive master
    r = st.elect_master("broker-a", [cand(1, epoch=1), cand(2, epoch=1)], preferred_id=2)
    assert r.code == RC.SUCCESS and (r.info["masterBrokerId"], r.info["masterEpoch"]) == (2, 2)
    # unclean lets a preferred out-of-sync replica through
    r = st.elect_master("broker-a", [cand(3)], preferred_id=3, unclean=True)
    assert r.code == RC.SUCCESS and r.info["masterBrokerId"] == 3


def test_preferred_broker_of_a_set_that_never_had_a_master():
    st = registered(A1, A2)
    r = st.elect_master("broker-a", [cand(1, offset=100), cand(2)], preferred_id=2)
    assert r.code == RC.SUCCESS and r.info["masterBrokerId"] == 2


def test_bad_election_input_changes_nothing():
    st = with_master(3, sss=(1, 2))
    before = st.to_dict()
    for args in ((("nope", [cand(2)]), RC.CONTROLLER_BROKER_METADATA_NOT_EXIST),
                 (("broker-a", [cand(9)]), RC.CONTROLLER_BROKER_METADATA_NOT_EXIST),
                 (("broker-a", [cand(2), cand(2)]), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [{"brokerId": 2}]), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [cand(2, epoch=-1)]), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [cand(2, offset="1")]), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", "2"), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [[2, 0, 0, 0]]), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [cand(2)], 0), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [cand(2)], -1, "yes"), RC.CONTROLLER_INVALID_REQUEST),
                 (("broker-a", [cand(i + 1) for i in range(300)]), RC.CONTROLLER_INVALID_REQUEST)):
        call, code = args
        r = st.elect_master(*call)
        assert r.code == code and not r.changed, (call, r)
    assert st.to_dict() == before


# -- SyncStateSet -----------------------------------------------------------------------------------
def test_alter_sync_state_set_validations():
    st = with_master(3, sss=(1,))
    assert info(st)["syncStateSetEpoch"] == 1            # {1} == the elected set: unchanged, no bump
    r = st.alter_sync_state_set("broker-a", 1, 1, 1, [1, 2])
    assert r.code == RC.SUCCESS and r.changed and (r.info["syncStateSet"], r.info["syncStateSetEpoch"]) == ([1, 2], 2)
    assert r.info["brokerId"] == 1                          # the caller, the master
    before = st.to_dict()
    for call, code in ((("broker-a", 2, 1, 2, [1, 2]), RC.CONTROLLER_INVALID_MASTER),
                       (("broker-a", 1, 0, 2, [1, 2, 3]), RC.CONTROLLER_FENCED_MASTER_EPOCH),
                       (("broker-a", 1, 2, 2, [1, 2, 3]), RC.CONTROLLER_FENCED_MASTER_EPOCH),
                       (("broker-a", 1, 1, 1, [1, 2, 3]), RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
                       (("broker-a", 1, 1, 2, [1, 9]), RC.CONTROLLER_INVALID_REPLICAS),
                       (("broker-a", 1, 1, 2, [2, 3]), RC.CONTROLLER_INVALID_REPLICAS),
                       (("broker-a", 1, 1, 2, []), RC.CONTROLLER_INVALID_REQUEST),
                       (("broker-a", 1, 1, 2, [1, 1]), RC.CONTROLLER_INVALID_REQUEST),
                       (("broker-a", 1, 1, 2, "1,2"), RC.CONTROLLER_INVALID_REQUEST),
                       (("broker-a", 1, 1, 2, [1, "2"]), RC.CONTROLLER_INVALID_REQUEST),
                       (("broker-a", 1, -1, 2, [1]), RC.CONTROLLER_INVALID_REQUEST),
                       (("broker-x", 1, 1, 2, [1]), RC.CONTROLLER_BROKER_METADATA_NOT_EXIST)):
        r = st.alter_sync_state_set(*call)
        assert r.code == code and not r.changed, (call, r)
    assert st.to_dict() == before
    # the same set again: success, no epoch bump
    r = st.alter_sync_state_set("broker-a", 1, 1, 2, [2, 1])
    assert r.code == RC.SUCCESS and not r.changed and r.info["syncStateSetEpoch"] == 2
    r = st.alter_sync_state_set("broker-a", 1, 1, 2, [1])      # shrink
    assert r.code == RC.SUCCESS and r.info["syncStateSet"] == [1] and r.info["syncStateSetEpoch"] == 3


def test_alter_without_master_is_refused():
    st = registered(A1, A2)
    r = st.alter_sync_state_set("broker-a", 1, 0, 0, [1])
    assert r.code == RC.CONTROLLER_INVALID_MASTER


def test_old_master_is_fenced_after_a_failover():
    st = with_master(3, sss=(1, 2))
    st.elect_master("broker-a", [cand(2, epoch=1)])
    r = st.alter_sync_state_set("broker-a", 1, 1, 2, [1, 2])
    assert r.code == RC.CONTROLLER_INVALID_MASTER and r.info["masterBrokerId"] == 2


# -- snapshot -----------------------------------------------------------------------------------------
def test_snapshot_round_trip_is_plain_data():
    st = with_master(3, sss=(1, 2))
    st.register_broker("Other", "broker-b", A4, 7)
    d = st.to_dict()

    def plain(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, (int, str)) and not isinstance(v, bool)
    assert plain(d)
    back = ControllerState.from_dict(pickle.loads(pickle.dumps(d)))
    assert back == st and back.to_dict() == d
    assert back.replica_info("broker-a") == st.replica_info("broker-a")
    # the copy behaves the same
    assert back.register_broker("DefaultCluster", "broker-a", "127.0.0.1:14911").info["brokerId"] == 4
    for bad in ({}, {"version": 2, "brokerSets": {}}, {"version": 1, "brokerSets": []},
                {"version": 1, "brokerSets": {"b": {"clusterName": "C", "brokers": [[1, A1]], "masterBrokerId": 2,
                                                    "masterEpoch": 1, "syncStateSet": [], "syncStateSetEpoch": 0}}}):
        with pytest.raises(InputError):
            ControllerState.from_dict(bad)


def test_replicated_state_snapshot_hooks():
    import threading
    rs = ReplicatedState(threading.RLock())
    rs.state = with_master(2, sss=(1, 2))
    data = rs._serialize()
    other = ReplicatedState(threading.RLock())
    other._deserialize(pickle.loads(pickle.dumps(data)))
    assert other.state == rs.state and other.load_error is None
    other._deserialize({"controllerState": {"version": 99}})
    assert other.load_error and other.state == rs.state       # kept, and flagged


# -- heartbeats ---------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 100.0

    def monotonic(self):
        return self.t


def test_heartbeat_liveness_and_candidates():
    clock = FakeClock()
    hb = BrokerHeartbeatManager(clock)
    assert not hb.covers(DEFAULT_HEARTBEAT_TIMEOUT_MS)
    hb.on_heartbeat("C", "b", A1, 1, 1, 100, 90, 5, heartbeat_timeout_ms=1000)
    hb.on_heartbeat("C", "b", A2, 2, 1, 80, 80)
    assert hb.is_alive("b", 1) and hb.is_alive("b", 1, A1) and not hb.is_alive("b", 1, A2)
    assert not hb.is_alive("b", 3) and hb.last_ago_ms("b", 3) == -1
    assert hb.timeout_ms("b", 1) == 1000 and hb.timeout_ms("b", 9) == DEFAULT_HEARTBEAT_TIMEOUT_MS
    clock.t += 1.5
    assert not hb.is_alive("b", 1) and hb.is_alive("b", 2)
    assert hb.last_ago_ms("b", 1) == 1500
    assert hb.alive_candidates("b", {1: A1, 2: A2}) == [
        {"brokerId": 2, "epoch": 1, "maxOffset": 80, "electionPriority": 2 ** 31 - 1}]
    # a heartbeat from an address the state does not list for that id is no proof of life
    assert hb.alive_candidates("b", {1: A1, 2: A3}) == []
    clock.t += DEFAULT_HEARTBEAT_TIMEOUT_MS / 1000.0
    assert hb.covers(DEFAULT_HEARTBEAT_TIMEOUT_MS)
    # after the controller's own stall it counts a timeout again; what it heard stays
    hb.on_heartbeat("C", "b", A2, 2, 1, 80, 80)
    hb.restart_count()
    assert not hb.covers(1) and hb.is_alive("b", 2)
    clock.t += 1.0
    assert hb.covers(1000) and not hb.covers(DEFAULT_HEARTBEAT_TIMEOUT_MS)


# -- peers ---------------------------------------------------------------------------------------------
def test_peers_parsing_and_self():
    assert parse_peers(" 127.0.0.1:9878;127.0.0.1:9880, 127.0.0.1:9878 ,") == ["127.0.0.1:9878", "127.0.0.1:9880"]
    for bad in ("127.0.0.1", "h:0", "h:65535", "a b:1"):
        with pytest.raises(ValueError):
            parse_peers(bad)
    assert resolve_peers("127.0.0.1", 9878, []) == ("127.0.0.1:9878", ["127.0.0.1:9878"])
    assert resolve_peers("127.0.0.1", 9878, ["127.0.0.1:9880"]) == ("127.0.0.1:9878",
                                                                   ["127.0.0.1:9880", "127.0.0.1:9878"])
    assert resolve_peers("0.0.0.0", 9880, ["10.0.0.1:9878", "10.0.0.2:9880"]) == (
        "10.0.0.2:9880", ["10.0.0.1:9878", "10.0.0.2:9880"])
    with pytest.raises(ValueError):
        resolve_peers("127.0.0.1", 0, ["127.0.0.1:9880"])
    assert raft_address("127.0.0.1:9878") == "127.0.0.1:9879"
