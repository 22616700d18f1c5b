"""kill -9 of the master under load in controller mode (RocketMQ 5), with read-committed delivery.

Two brokers of one set (SYNC_MASTER, ``allAckInSyncStateSet=true``) under one controller.  Each
cycle: two producers send to whichever broker is master, a consumer pulls from it; at a random
moment (counted in acknowledged sends) the master's whole group is killed with -9.  The controller
elects the other broker; the producers find it; the killed broker is started again, comes back as a
replica (truncating a tail the new master never had: exit 75, started again) and rejoins the
SyncStateSet before the next cycle.  Checked and printed at the end, against the final master's log:

- ``acked messages lost: 0``: every SEND_OK body is in the log;
- ``messages read by a consumer and later truncated: 0``: every (queue, queue offset) the consumer
  read holds the same body in the final log;
- the time from the kill to the first SEND_OK on the new master, p50 / p99.  What bounds it: the
  brokers' ``controllerHeartBeatTimeoutMills`` (here TIMEOUT_MS), the controller's scan interval, the
  next heartbeat answer that tells the replica, and its reput catching up before it promotes.

Fast tier: 2 cycles with a 2 s heartbeat timeout; slow tier (``-m slow``): RMQ_CONTROLLER_KILL9_CYCLES
(default 50) with the default timeouts (heartbeat 1 s, timeout 4 s, controller scan 1 s).
"""
import random
import statistics
import threading
import time

import pytest

from rmq._core import commitlog as cl
from rmq.client.remoting import RemotingClient
from rmq.broker_conf import DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS, DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS
from rmq.protocol import ResponseCode
from tests.conftest import env_int
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, pull_all, send, wait_for
from tests.integration.test_controller_failover import (TIMEOUT_MS, Controller, controlled_conf, rejoin, role,
                                                        sync_state)
from tests.integration.test_ha import create_topic, runtime

pytestmark = pytest.mark.fault
QUEUES = 2
TOPIC = "CK9"
MASTERS = ("ASYNC_MASTER", "SYNC_MASTER")


class Run:
    """What the producers had acknowledged and what the consumer read, across cycles."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acked: set = set()
        self.read: dict = {}              # (queue, queue offset) -> body
        self.next_offset = [0] * QUEUES   # the consumer's position per queue
        self.target = ""                  # the master's address as the workers know it
        self.seq = 0

    def body(self, pid: int) -> bytes:
        with self.lock:
            self.seq += 1
            return b"p%d-%08d" % (pid, self.seq)


def producer(run: Run, pid: int, stop: threading.Event) -> None:
    with RemotingClient() as c:
        i = 0
        while not stop.is_set():
            target = run.target
            if not target:
                time.sleep(0.01)
                continue
            body = run.body(pid)
            try:
                r = send(c, target, TOPIC, body, i % QUEUES, timeout_ms=1000)
            except Exception:  # noqa: BLE001 - the master died mid-request: indeterminate, not acked
                time.sleep(0.01)
                continue
            i += 1
            if r.code == ResponseCode.SUCCESS:
                with run.lock:
                    run.acked.add(body)
            else:
                time.sleep(0.01)         # a replica, a fenced master, a timeout: try again


def consumer(run: Run, stop: threading.Event) -> None:
    with RemotingClient() as c:
        while not stop.is_set():
            target = run.target
            if not target:
                time.sleep(0.01)
                continue
            for q in range(QUEUES):
                try:
                    r = pull(c, target, TOPIC, q, run.next_offset[q], max_nums=32, timeout_ms=3000)
                except Exception:  # noqa: BLE001 - the master died: the next target
                    continue
                if r.code != ResponseCode.SUCCESS:
                    continue
                for m in cl.decode_records(bytes(r.bodies[0])):
                    with run.lock:
                        run.read[(q, m.queue_offset)] = bytes(m.body)
                run.next_offset[q] = int(r.fields["nextBeginOffset"])
            time.sleep(0.005)


def find_master(c, brokers):
    masters = [b for b in brokers if role(c, b) in MASTERS]
    return masters[0] if len(masters) == 1 else None


def kill_loop(tmp_path, cycles: int, seed: int, defaults: bool = False) -> dict:
    rnd = random.Random(seed)
    conf = dict(brokerRole="SYNC_MASTER", allAckInSyncStateSet="true", haMaxTimeSlaveNotCatchup="15000")
    if defaults:     # the brokers' and the controller's default heartbeat, timeout and scan interval
        ctl = Controller(str(tmp_path / "controller"), scan_interval_ms=1000)
        conf.update(brokerHeartbeatInterval=str(DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS),
                    controllerHeartBeatTimeoutMills=str(DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS))
        timeout_ms = DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS
    else:
        ctl = Controller(str(tmp_path / "controller"))
        timeout_ms = TIMEOUT_MS
    brokers = []
    run, stop = Run(), threading.Event()
    failovers = []
    try:
        brokers.append(Cluster(tmp_path / "b0", conf=controlled_conf(ctl, **conf), with_ha=True))
        brokers.append(Cluster(tmp_path / "b1", conf=controlled_conf(ctl, **conf), with_ha=True,
                               namesrv_addr=brokers[0].namesrv_addr))
        with RemotingClient() as c:
            master = wait_for(lambda: find_master(c, brokers), 60)
            create_topic(c, master.broker_addr, TOPIC, queues=QUEUES)
            wait_for(lambda: len(sync_state(ctl).get("syncStateSet") or []) == 2, 60)
            run.target = master.broker_addr
            workers = [threading.Thread(target=producer, args=(run, p, stop), daemon=True) for p in range(2)]
            workers.append(threading.Thread(target=consumer, args=(run, stop), daemon=True))
            for t in workers:
                t.start()
            for cycle in range(cycles):
                want = len(run.acked) + rnd.randint(20, 300)
                wait_for(lambda: len(run.acked) >= want, 120)
                old = master
                old.kill_group()
                t0 = time.monotonic()
                run.target = ""
                others = [b for b in brokers if b is not old]

                def first_send_ok():
                    # a probe send to the other broker, short timeout: SEND_OK once it is the master
                    body = run.body(9)
                    try:
                        r = send(c, others[0].broker_addr, TOPIC, body, 0, timeout_ms=500)
                    except Exception:  # noqa: BLE001 - not answering yet
                        return None
                    if r.code != ResponseCode.SUCCESS:
                        return None
                    with run.lock:
                        run.acked.add(body)
                    return time.monotonic()
                failovers.append(wait_for(first_send_ok, 120) - t0)
                master = wait_for(lambda: find_master(c, others), 120)
                run.target = master.broker_addr
                rejoin(c, ctl, old)
            stop.set()
            for t in workers:
                t.join(30)
            # the whole log, from the final master
            final = {}
            for q in range(QUEUES):
                msgs, _ = pull_all(c, master.broker_addr, TOPIC, q, deadline_s=60)
                for m in msgs:
                    final[(q, m.queue_offset)] = bytes(m.body)
            bodies = set(final.values())
            lost = [b for b in run.acked if b not in bodies]
            truncated = [k for k, b in run.read.items() if final.get(k) != b]
            assert runtime(c, master.broker_addr)["brokerRole"] in MASTERS
    finally:
        stop.set()
        for b in brokers:
            b.close()
        ctl.close()
    p50 = statistics.median(failovers)
    p99 = sorted(failovers)[max(0, int(round(0.99 * len(failovers))) - 1)]
    print(f"controller mode, {cycles} master kills (-9) under load: {len(run.acked)} sends acked, "
          f"{len(run.read)} messages read by the consumer")
    print(f"acked messages lost: {len(lost)}")
    print(f"messages read by a consumer and later truncated: {len(truncated)}")
    print(f"kill -9 to the first SEND_OK on the new master: p50 {p50:.2f} s, p99 {p99:.2f} s, max "
          f"{max(failovers):.2f} s (controllerHeartBeatTimeoutMills {timeout_ms} ms)")
    assert not lost, f"{len(lost)} acked messages lost, e.g. {lost[:5]}"
    assert not truncated, f"{len(truncated)} messages read and later truncated, e.g. {truncated[:5]}"
    assert run.acked and run.read, "a run that acknowledged or read nothing checks nothing"
    return {"acked": len(run.acked), "read": len(run.read), "failovers": failovers}


def test_master_kill9_loses_no_acked_message_and_truncates_nothing_read(tmp_path):
    kill_loop(tmp_path, 2, seed=16)


@pytest.mark.slow
def test_master_kill9_loop_slow(tmp_path):
    kill_loop(tmp_path, env_int("RMQ_CONTROLLER_KILL9_CYCLES", 50),
              seed=env_int("RMQ_FAULT_SEED", 20261126), defaults=True)
