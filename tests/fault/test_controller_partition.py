"""Controller mode: a master cut off from its controllers, but not from its clients or its replica.

The master's broker group runs in a network namespace joined to the root namespace (controller,
NameServer, replica, clients) by a veth pair.  The controller listens on an address of its own, and
the partition is a blackhole route to that address inside the master's namespace: the master still
reaches (and is reached by) everything else.  The controller, hearing nothing, elects the replica;
the master must have stopped acknowledging writes before that (its lease from the controllers runs
out at 3/4 of ``controllerHeartBeatTimeoutMills``, the election comes after all of it).  Producers
send to both brokers all along.  Checked and printed:

- ``writes acked by two masters in overlapping epochs: 0``: no SEND_OK from the old master after
  the new master's first one;
- ``acked messages lost: 0``: every SEND_OK (from either) is in the new master's log;
- after the heal, the old master learns it was replaced, stops and (restarted, as its supervisor
  would) comes back as a replica of the new one.

Needs root and iproute2 (``ip netns``, veth): the CI machine has both.
"""
import os
import subprocess
import threading
import time

import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from rmq.testing import ActorProcess
from tests.fault.netns import NsGroup, veth_namespace
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull_all, send, wait_for
from tests.integration.test_controller_failover import Controller, controlled_conf, role, sync_state

pytestmark = pytest.mark.fault

TAG = os.getpid() % 100000
NS = f"rmqc{TAG}"
ROOT_IF, NS_IF = f"rc{TAG}", f"nc{TAG}"
ROOT_IP, NS_IP, CTL_IP = "10.201.9.1", "10.201.9.2", "10.201.9.3"
TIMEOUT_MS = 4000                 # controllerHeartBeatTimeoutMills: lease 3 s, election after 4 s
TOPIC = "PART"


@pytest.fixture
def netns():
    with veth_namespace(NS, ROOT_IF, NS_IF, (ROOT_IP, CTL_IP), NS_IP) as ns:
        yield ns


def isolate_from_controller(on: bool) -> None:
    subprocess.run(["ip", "netns", "exec", NS, "ip", "route", "add" if on else "del", "blackhole", f"{CTL_IP}/32"],
                   check=on, capture_output=True, timeout=30)


def test_master_cut_off_from_the_controllers_stops_acking_before_a_new_one_is_elected(netns, tmp_path):
    ctl = Controller(str(tmp_path / "controller"), "--listen-addr", CTL_IP)
    conf = {**controlled_conf(ctl, brokerRole="SYNC_MASTER", allAckInSyncStateSet="true",
                              controllerHeartBeatTimeoutMills=str(TIMEOUT_MS), brokerHeartbeatInterval="500"),
            "brokerClusterName": "TestCluster", "brokerName": "broker-a"}
    old = replica = namesrv = None
    try:
        # the NameServer and the replica in the root namespace on ROOT_IP, the master in the namespace
        namesrv = ActorProcess(["-m", "rmq.actors.nameserver", "--listen-addr", ROOT_IP, "--listen-port", "0",
                                "--store-path", str(tmp_path / "namesrv")])
        namesrv_addr = namesrv.endpoint.replace("tcp://", "")
        old = NsGroup(NS, tmp_path / "old", namesrv_addr, {**conf, "brokerIP1": NS_IP})
        with RemotingClient() as c:
            wait_for(lambda: role(c, old) == "SYNC_MASTER", 60)
            replica = Cluster(tmp_path / "replica", conf={**conf, "brokerIP1": ROOT_IP}, with_ha=True,
                              namesrv_addr=namesrv_addr)
            wait_for(lambda: len(sync_state(ctl).get("syncStateSet") or []) == 2, 60)
            # (topic PART is created by the first send: admin requests are served to loopback peers only)
            lock, stop = threading.Lock(), threading.Event()
            acked = {}                            # body -> (broker addr, monotonic s of the SEND_OK)

            def producer(addr_of, tag):
                with RemotingClient() as pc:
                    i = 0
                    while not stop.is_set():
                        body = b"%s-%07d" % (tag, i)
                        i += 1
                        addr = addr_of()
                        try:
                            r = send(pc, addr, TOPIC, body, i % 4, timeout_ms=1000)
                        except Exception:  # noqa: BLE001 - indeterminate
                            continue
                        if r.code == ResponseCode.SUCCESS:
                            with lock:
                                acked[body] = (addr, time.monotonic())
                        else:
                            time.sleep(0.01)
            threads = [threading.Thread(target=producer, args=(lambda: old.broker_addr, b"old")),
                       threading.Thread(target=producer, args=(lambda: replica.broker_addr, b"rep"))]
            for t in threads:
                t.start()
            try:
                wait_for(lambda: sum(1 for a, _ in acked.values() if a == old.broker_addr) >= 50, 60)
                isolate_from_controller(True)
                t_cut = time.monotonic()
                wait_for(lambda: role(c, replica) == "SYNC_MASTER", 60)
                wait_for(lambda: any(a == replica.broker_addr for a, _ in list(acked.values())), 60)
                with lock:
                    first_new = min(t for a, t in acked.values() if a == replica.broker_addr)
                    last_old = max(t for a, t in acked.values() if a == old.broker_addr)
                    overlapping = sum(1 for a, t in acked.values() if a == old.broker_addr and t >= first_new)
            finally:
                isolate_from_controller(False)
                stop.set()
                for t in threads:
                    t.join(30)
            # healed: the old master hears it was replaced, stops (exit 75) and comes back as a replica
            assert old.procs[0].wait(60) == 75
            old.close()
            old.start_group()
            wait_for(lambda: role(c, old) == "SLAVE", 60)
            final = set()
            for q in range(4):
                msgs, _ = pull_all(c, replica.broker_addr, TOPIC, q, deadline_s=30)
                final.update(bytes(m.body) for m in msgs)
            lost = [b for b in acked if b not in final]
        print(f"partition from the controllers: the old master's last SEND_OK {last_old - t_cut:.2f} s after the "
              f"cut, the new master's first {first_new - t_cut:.2f} s after it (heartbeat timeout {TIMEOUT_MS} ms)")
        print(f"writes acked by two masters in overlapping epochs: {overlapping}")
        print(f"acked messages lost: {len(lost)} of {len(acked)}")
        assert overlapping == 0
        assert not lost, lost[:5]
    finally:
        for g in (old, replica, namesrv):
            if g is not None:
                g.close() if g is not namesrv else g.kill()
        ctl.close()
