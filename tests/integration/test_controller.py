"""The controller as real processes: registration, heartbeats, automatic elections from the
SyncStateSet, a three-controller Raft group losing its leader (kill -9) and getting it back, and a
one-node controller keeping its state over restarts."""
import os
import socket
import threading
import time

import msgpack
import pytest

from rmq.client.remoting import RemotingClient
from rmq.errors import RemotingTimeoutError
from rmq.protocol import Frame, RequestCode as R, ResponseCode as RC, pack_body

pytestmark = pytest.mark.integration

TIMEOUT_MS = 5000              # > the controller's REPLICATION_TIMEOUT_MS (3000): its own answer comes first
HB_TIMEOUT_MS = 3000           # heartbeatTimeoutMillis the test brokers announce
HB_EVERY_S = 0.25
SCAN_MS = "200"
DEADLINE_S = 40                # generous: the tests share 2 cores
CLUSTER = "DefaultCluster"
A1, A2, A3 = "127.0.0.1:20911", "127.0.0.1:21911", "127.0.0.1:22911"


def controller(actors, store, port="0", peers=None, *extra):
    args = ["-m", "rmq.controller.actor", "--listen-port", str(port), "--store-path", str(store),
            "--scan-interval-ms", SCAN_MS, *extra]
    if peers:
        args += ["--peers", ";".join(peers)]
    return actors(*args)


def wait_for(fn, what, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def call(c, ep, code, fields=None, bodies=None, timeout_ms=TIMEOUT_MS):
    return c.invoke(ep, Frame(code, fields=fields or {}, bodies=bodies or []), timeout_ms)


def register(c, ep, addr, name="broker-a", broker_id=None):
    fields = {"clusterName": CLUSTER, "brokerName": name, "brokerAddress": addr}
    if broker_id is not None:
        fields["brokerId"] = broker_id

    def attempt():
        try:
            r = call(c, ep, R.CONTROLLER_REGISTER_BROKER, fields)
        except RemotingTimeoutError:
            return None
        return r if r.code != RC.CONTROLLER_NOT_LEADER else None    # an election in progress: retry
    return wait_for(attempt, f"registration of {addr}")


def replica_info(c, ep, name="broker-a"):
    try:
        r = call(c, ep, R.CONTROLLER_GET_REPLICA_INFO, {"brokerName": name}, timeout_ms=2000)
    except RemotingTimeoutError:
        return {}
    return r.fields if r.code == RC.SUCCESS else {}


def master_is(c, ep, broker_id, epoch, name="broker-a"):
    f = replica_info(c, ep, name)
    return f if (f.get("masterBrokerId"), f.get("masterEpoch")) == (broker_id, epoch) else None


def alive(c, ep, broker_id, name="broker-a"):
    r = call(c, ep, R.CONTROLLER_GET_SYNC_STATE_DATA, bodies=[pack_body({"brokerNames": [name]})])
    reps = msgpack.unpackb(bytes(r.bodies[0])).get(name, {}).get("replicas", [])
    return any(x["brokerId"] == broker_id and x["alive"] for x in reps)


def metadata(c, ep):
    try:
        return call(c, ep, R.CONTROLLER_GET_METADATA_INFO, timeout_ms=2000).fields
    except RemotingTimeoutError:
        return {}


class Heartbeats(threading.Thread):
    """Brokers' heartbeats: every broker in ``on`` to every controller in ``targets``, every HB_EVERY_S."""

    def __init__(self, targets):
        super().__init__(daemon=True)
        self.targets = list(targets)
        self.brokers = {}          # broker id -> heartbeat fields
        self.on = set()
        self.done = threading.Event()

    def add(self, broker_id, addr, epoch=0, max_offset=0, name="broker-a"):
        self.brokers[broker_id] = {"clusterName": CLUSTER, "brokerName": name, "brokerAddress": addr,
                                   "brokerId": broker_id, "epoch": epoch, "maxOffset": max_offset,
                                   "confirmOffset": max_offset, "electionPriority": 1,
                                   "heartbeatTimeoutMillis": HB_TIMEOUT_MS}
        self.on.add(broker_id)

    def run(self):
        with RemotingClient() as c:
            while not self.done.is_set():
                for ep in list(self.targets):
                    for bid in sorted(self.on):
                        try:
                            call(c, ep, R.BROKER_HEARTBEAT, dict(self.brokers[bid]), timeout_ms=1000)
                        except RemotingTimeoutError:
                            pass
                self.done.wait(HB_EVERY_S)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join(10)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (what bind(0) and connect() are given)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_pairs(n):
    """``n`` ports P with P and P + 1 (its Raft port) free on loopback, picked at random below the
    kernel's ephemeral range: a controller binds them seconds later on a loaded machine, and a
    port of that range could meanwhile be given to a parallel test's connection (CI: "cannot bind
    the Raft port")."""
    import random
    rnd = random.SystemRandom()
    hi = max(_ephemeral_low() - 2, 12000)
    out, held = [], []
    try:
        while len(out) < n:
            p = rnd.randrange(10000, hi)
            if p in out or p + 1 in out or p - 1 in out:
                continue
            a, b = socket.socket(), socket.socket()
            try:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                a.close()
                b.close()
                continue
            held += [a, b]
            out.append(p)
    finally:
        for s in held:
            s.close()
    return out


def test_one_controller_elects_from_the_sync_state_set(actors, tmp_path):
    ctl = controller(actors, tmp_path)
    ep = ctl.endpoint
    with RemotingClient() as c:
        meta = call(c, ep, R.CONTROLLER_GET_METADATA_INFO).fields
        assert meta["isLeader"] is True and meta["leaderAddress"] == meta["controllerAddress"]
        assert meta["peers"] == [meta["controllerAddress"]] and ep.endswith(meta["controllerAddress"])

        r = register(c, ep, A1)
        assert r.code == RC.SUCCESS and r.fields["brokerId"] == 1 and r.fields["masterBrokerId"] == -1
        assert r.fields["leader"] is True
        assert register(c, ep, A2).fields["brokerId"] == 2
        assert register(c, ep, A1).fields["brokerId"] == 1           # stable
        r = call(c, ep, R.BROKER_HEARTBEAT, {"clusterName": CLUSTER, "brokerName": "broker-a",
                                            "brokerAddress": A3, "brokerId": 3})
        assert r.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST

        with Heartbeats([ep]) as hb:
            hb.add(1, A1)
            hb.add(2, A2)
            f = wait_for(lambda: master_is(c, ep, 1, 1), "the first master")
            assert f["masterAddress"] == A1 and f["syncStateSet"] == [1]
            # (1 can be elected on its own heartbeats before 2's first one is heard: an ALTER naming 2
            # is refused until then)
            wait_for(lambda: alive(c, ep, 2), "2's first heartbeat")

            # the master takes 2 into its SyncStateSet; stale epochs are fenced
            alter = {"brokerName": "broker-a", "masterBrokerId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
                     "syncStateSet": [1, 2]}
            r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET, alter)
            assert r.code == RC.SUCCESS and r.fields["syncStateSet"] == [1, 2] and r.fields["syncStateSetEpoch"] == 2
            r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET, alter)
            assert r.code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET, dict(alter, syncStateSet="1,2"))
            assert r.code == RC.CONTROLLER_INVALID_REQUEST and "syncStateSet" in r.remark

            # 3 joins, far ahead of 2 (never mind how), but is not in the SyncStateSet
            assert register(c, ep, A3).fields["brokerId"] == 3
            hb.brokers[2]["epoch"] = hb.brokers[2]["maxOffset"] = 1
            hb.add(3, A3, epoch=1, max_offset=10 ** 6)
            wait_for(lambda: alive(c, ep, 3), "3's first heartbeat")
            r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET, dict(alter, syncStateSetEpoch=2,
                                                                    syncStateSet=[1, 2, 4]))
            assert r.code == RC.CONTROLLER_INVALID_REPLICAS
            r = call(c, ep, R.CONTROLLER_ELECT_MASTER, {"brokerName": "broker-a", "brokerId": 3})
            assert r.code == RC.CONTROLLER_INVALID_REQUEST and "SyncStateSet" in r.remark
            assert r.fields["masterBrokerId"] == 1

            # the master stops: 2, in sync, takes over at epoch 2
            hb.on.discard(1)
            f = wait_for(lambda: master_is(c, ep, 2, 2), "the failover to 2")
            assert f["masterAddress"] == A2 and f["syncStateSet"] == [2] and f["syncStateSetEpoch"] == 3

            # 2 stops too: 3 is alive but out of sync, so nobody is master (unclean election off)
            hb.on.discard(2)
            f = wait_for(lambda: master_is(c, ep, -1, 2), "the master cleared")
            assert f["masterAddress"] == "" and f["syncStateSet"] == [2]

            data = msgpack.unpackb(bytes(call(c, ep, R.CONTROLLER_GET_SYNC_STATE_DATA,
                                              bodies=[pack_body({"brokerNames": ["broker-a", "nope"]})]).bodies[0]))
            assert list(data) == ["broker-a"] and data["broker-a"]["masterBrokerId"] == -1
            reps = {x["brokerId"]: x for x in data["broker-a"]["replicas"]}
            assert reps[3]["alive"] and not reps[3]["inSyncStateSet"] and reps[3]["maxOffset"] == 10 ** 6
            assert not reps[1]["alive"] and reps[2]["inSyncStateSet"] and reps[1]["lastHeartbeatAgoMs"] >= 0

            # 2 comes back: the only eligible replica, master again above every epoch seen
            hb.on.add(2)
            f = wait_for(lambda: master_is(c, ep, 2, 3), "2 back as master")
            assert f["syncStateSet"] == [2]

        # bad input and unknown codes
        r = call(c, ep, R.CONTROLLER_REGISTER_BROKER, {"clusterName": CLUSTER, "brokerName": "broker-a",
                                                       "brokerAddress": "no-port"})
        assert r.code == RC.CONTROLLER_INVALID_REQUEST and "brokerAddress" in r.remark
        r = call(c, ep, R.CONTROLLER_GET_REPLICA_INFO, {"brokerName": "broker-zz"})
        assert r.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST
        assert call(c, ep, R.SEND_MESSAGE).code == RC.REQUEST_CODE_NOT_SUPPORTED
        assert call(c, ep, R.CONTROLLER_GET_REPLICA_INFO, {"brokerName": "broker-a"}).fields["masterEpoch"] == 3
    assert ctl.terminate() == 0


def test_three_controllers_survive_the_loss_of_the_leader(actors, tmp_path):
    ports = free_port_pairs(3)
    peers = [f"127.0.0.1:{p}" for p in ports]
    eps = {a: f"tcp://{a}" for a in peers}
    procs = {peers[0]: controller(actors, tmp_path / "c0", ports[0], peers)}
    with RemotingClient() as c:      # alone, it has no quorum: a bounded CONTROLLER_NOT_LEADER
        r = call(c, eps[peers[0]], R.CONTROLLER_REGISTER_BROKER,
                 {"clusterName": CLUSTER, "brokerName": "broker-a", "brokerAddress": A1})
        assert r.code == RC.CONTROLLER_NOT_LEADER and r.fields == {"leader": False, "leaderAddress": ""}
        assert replica_info(c, eps[peers[0]]) == {}
    for i in (1, 2):
        procs[peers[i]] = controller(actors, tmp_path / f"c{i}", ports[i], peers)

    def agreed_leader(c, members):
        metas = [metadata(c, eps[a]) for a in members]
        leaders = {m.get("leaderAddress") for m in metas}
        if len(leaders) == 1 and "" not in leaders and None not in leaders \
                and sum(bool(m.get("isLeader")) for m in metas) == 1:
            return leaders.pop()
        return None

    with RemotingClient() as c:
        leader = wait_for(lambda: agreed_leader(c, peers), "a Raft leader")
        follower = next(a for a in peers if a != leader)
        # a follower forwards registrations to the leader
        r = register(c, eps[follower], A1)
        assert r.code == RC.SUCCESS and r.fields["brokerId"] == 1 and r.fields["leader"] is False
        assert r.fields["leaderAddress"] == leader
        assert register(c, eps[leader], A2).fields["brokerId"] == 2

        with Heartbeats(eps.values()) as hb:
            hb.add(1, A1)
            hb.add(2, A2)
            for a in peers:
                wait_for(lambda: master_is(c, eps[a], 1, 1), f"the first master on {a}")
            # the controller that takes the ALTER checks liveness in its own heartbeat table (each
            # controller hears the brokers itself): wait until the follower asked has heard 2 too
            for a in (leader, follower):
                wait_for(lambda: alive(c, eps[a], 2), f"2's first heartbeat on {a}")
            r = call(c, eps[follower], R.CONTROLLER_ALTER_SYNC_STATE_SET,
                     {"brokerName": "broker-a", "masterBrokerId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
                      "syncStateSet": [1, 2]})
            assert r.code == RC.SUCCESS and r.fields["syncStateSetEpoch"] == 2
            for a in peers:
                wait_for(lambda: replica_info(c, eps[a]).get("syncStateSet") == [1, 2], f"the SyncStateSet on {a}")

            # kill -9 the Raft leader: the other two elect another and keep serving
            hb.targets.remove(eps[leader])
            procs[leader].kill()
            survivors = [a for a in peers if a != leader]
            new_leader = wait_for(lambda: agreed_leader(c, survivors), "a new Raft leader")
            assert new_leader in survivors
            r = register(c, eps[survivors[0]], A3)
            assert r.code == RC.SUCCESS and r.fields["brokerId"] == 3

            # and elect: the master stops, 2 (in sync) takes over at epoch 2
            hb.on.discard(1)
            for a in survivors:
                f = wait_for(lambda: master_is(c, eps[a], 2, 2), f"the failover on {a}")
                assert f["syncStateSet"] == [2] and f["syncStateSetEpoch"] == 3

            # the old leader restarts from its journal and catches up
            idx = peers.index(leader)
            procs[leader] = controller(actors, tmp_path / f"c{idx}", ports[idx], peers)
            hb.targets.append(eps[leader])
            f = wait_for(lambda: master_is(c, eps[leader], 2, 2), "the restarted controller's state")
            assert f["syncStateSet"] == [2] and f["syncStateSetEpoch"] == 3
            assert wait_for(lambda: agreed_leader(c, peers), "one leader for all three") in peers
            r = register(c, eps[leader], A3)
            assert r.code == RC.SUCCESS and r.fields["brokerId"] == 3
    for p in procs.values():
        assert p.terminate() == 0


def test_one_controller_keeps_its_state_over_restarts(actors, tmp_path):
    store = tmp_path / "ctl"
    port = free_port_pairs(1)[0]
    ep = f"tcp://127.0.0.1:{port}"
    # a tiny compaction threshold: the restart reads a snapshot plus the journal after it
    ctl = controller(actors, store, port, None, "--snapshot-min-entries", "2")
    with RemotingClient() as c, Heartbeats([ep]) as hb:     # the master stays alive throughout
        assert register(c, ep, A1).fields["brokerId"] == 1
        assert register(c, ep, A2).fields["brokerId"] == 2
        hb.add(1, A1)
        hb.add(2, A2)
        wait_for(lambda: master_is(c, ep, 1, 1), "the first master")
        wait_for(lambda: alive(c, ep, 2), "2's first heartbeat")
        r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET,
                 {"brokerName": "broker-a", "masterBrokerId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
                  "syncStateSet": [1, 2]})
        assert r.code == RC.SUCCESS
        before = replica_info(c, ep)
        assert before["syncStateSet"] == [1, 2] and before["syncStateSetEpoch"] == 2
        assert ctl.terminate() == 0
        assert os.path.exists(store / "controller" / "raft.dump")
        assert os.path.exists(store / "controller" / "raft.journal")

        ctl = controller(actors, store, port)
        assert replica_info(c, ep) == before
        r = register(c, ep, A2)
        assert r.fields["brokerId"] == 2 and r.fields["masterEpoch"] == 1
        assert register(c, ep, A3).fields["brokerId"] == 3
        ctl.kill()                                           # kill -9: the journal is all there is

        ctl = controller(actors, store, port)
        assert replica_info(c, ep) == before
        assert register(c, ep, A3).fields["brokerId"] == 3
        for bodies in ([], [pack_body({"brokerNames": []})]):       # no body, or no names: every broker set
            r = call(c, ep, R.CONTROLLER_GET_SYNC_STATE_DATA, bodies=bodies)
            assert [x["brokerId"] for x in msgpack.unpackb(bytes(r.bodies[0]))["broker-a"]["replicas"]] == [1, 2, 3]
    assert ctl.terminate() == 0


def test_a_controller_that_did_not_run_declares_nobody_dead_before_a_timeout(actors, tmp_path):
    """A controller stopped (SIGSTOP: a starved process, a paused VM) for twice the heartbeat
    timeout while the master was also silent cannot tell one from the other: its scan, late by more
    than OWN_STALL_MS, counts a heartbeat timeout again from when it runs, so a master heard again
    at once stays master at its epoch.  One that really stays silent is replaced a timeout later."""
    import signal
    from rmq.controller.actor import OWN_STALL_MS
    assert 2 * HB_TIMEOUT_MS > int(SCAN_MS) + OWN_STALL_MS
    ctl = controller(actors, tmp_path)
    ep = ctl.endpoint
    with RemotingClient() as c:
        register(c, ep, A1)
        register(c, ep, A2)
        with Heartbeats([ep]) as hb:
            hb.add(1, A1)
            hb.add(2, A2)
            wait_for(lambda: master_is(c, ep, 1, 1), "the first master")
            wait_for(lambda: alive(c, ep, 2), "2's first heartbeat")
            r = call(c, ep, R.CONTROLLER_ALTER_SYNC_STATE_SET, {       # 2 in sync: a candidate
                "brokerName": "broker-a", "masterBrokerId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
                "syncStateSet": [1, 2]})
            assert r.code == RC.SUCCESS, r.remark
            for _ in range(2):
                hb.on.discard(1)                        # the master silent while the controller is stopped
                os.kill(ctl.proc.pid, signal.SIGSTOP)
                try:
                    time.sleep(2 * HB_TIMEOUT_MS / 1000)
                    hb.on.add(1)                        # heard again as soon as the controller runs
                finally:
                    os.kill(ctl.proc.pid, signal.SIGCONT)
                wait_for(lambda: alive(c, ep, 1), "1's heartbeat after the stall")
                time.sleep(HB_TIMEOUT_MS / 1000)
                assert master_is(c, ep, 1, 1), replica_info(c, ep)
            hb.on.discard(1)                            # now silent with the controller running: replaced
            wait_for(lambda: master_is(c, ep, 2, 2), "the failover to 2")
    assert ctl.terminate() == 0
