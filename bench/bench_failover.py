"""Controller mode's failover as a user sees it (issue 16): the public ``Producer`` and ``PushConsumer``
with their defaults against two brokers of one set under one controller, all with default timeouts
(broker heartbeat 1 s, timeout 4 s, controller scan 1 s).  The master's group is killed with -9
while a producer sends one message after the other; reported per cycle:

- the time from the kill to the first ``Producer.send`` that returns SEND_OK again (its retries and
  route refresh included), beside the raw figure of tests/fault/test_controller_kill9.py (a probe
  straight to the replica's address);
- the time from the kill to the PushConsumer's listener receiving the first message sent after it.

Run::

    python bench/bench_failover.py [cycles]      # default 3
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rmq import Message, Producer, PushConsumer  # noqa: E402
from rmq.client.remoting import RemotingClient  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.test_controller_failover import Controller, role, sync_state  # noqa: E402
from tests.integration.test_ha import HA_CONF, create_topic  # noqa: E402

TOPIC = "BenchFailover"
STAGE_TIMEOUT_S = 120.0       # a stage not done by then is reported as such


def main(cycles: int) -> None:
    tmp = tempfile.mkdtemp(prefix="rmq-bench-failover-")
    ctl = Controller(os.path.join(tmp, "controller"), scan_interval_ms=1000)
    conf = {**HA_CONF, "enableControllerMode": "true", "controllerAddr": ctl.addr}
    brokers = [Cluster(os.path.join(tmp, "b0"), conf=conf, with_ha=True)]
    brokers.append(Cluster(os.path.join(tmp, "b1"), conf=conf, with_ha=True, namesrv_addr=brokers[0].namesrv_addr))
    sends, deliveries = [], []
    try:
        with RemotingClient() as c:
            def master():
                while True:
                    m = [b for b in brokers if role(c, b) == "ASYNC_MASTER"]
                    if len(m) == 1 and all(role(c, b) for b in brokers):
                        return m[0]
                    time.sleep(0.05)
            create_topic(c, master().broker_addr, TOPIC)
            got, lock = {}, threading.Lock()

            def listener(msgs, ctx):
                now = time.monotonic()
                with lock:
                    for m in msgs:
                        got.setdefault(bytes(m.body), now)
            pc = PushConsumer(brokers[0].namesrv_addr, "bench-failover-cg")
            pc.subscribe(TOPIC, "*")
            pc.register_message_listener(listener)
            pc.start()
            with Producer(brokers[0].namesrv_addr, group="bench-failover-pg") as p:
                for cycle in range(cycles):
                    old = master()
                    for i in range(50):
                        p.send(Message(TOPIC, b"warm-%d-%d" % (cycle, i)))
                    # failover needs a replica in the SyncStateSet (never an out-of-sync one)
                    while len(sync_state(ctl).get("syncStateSet") or []) < 2:
                        time.sleep(0.05)
                    old.kill_group()
                    t0 = time.monotonic()
                    i, first_ok, first_body = 0, None, None
                    while first_ok is None:
                        if time.monotonic() - t0 > STAGE_TIMEOUT_S:
                            from rmq.protocol import Frame, RequestCode, unpack_body
                            r = c.invoke(brokers[0].namesrv_addr, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                        fields={"topic": TOPIC}))
                            route = unpack_body(r) if r.bodies else r.remark
                            raise SystemExit(f"cycle {cycle}: no SEND_OK within {STAGE_TIMEOUT_S} s of the kill; "
                                             f"the NameServer's route: {route}; roles: "
                                             f"{[(b.broker_addr, role(c, b)) for b in brokers if b is not old]}")
                        body = b"after-%d-%d" % (cycle, i)
                        i += 1
                        try:
                            if p.send(Message(TOPIC, body)).status.name == "SEND_OK":
                                first_ok, first_body = time.monotonic(), body
                        except Exception:  # noqa: BLE001 - the user's send failed: try the next one
                            pass
                    sends.append(first_ok - t0)
                    while first_body not in got:
                        if time.monotonic() - t0 > STAGE_TIMEOUT_S:
                            raise SystemExit(f"cycle {cycle}: SEND_OK after {sends[-1]:.2f} s but the listener got "
                                             f"nothing sent after the kill within {STAGE_TIMEOUT_S} s")
                        time.sleep(0.01)
                    deliveries.append(got[first_body] - t0)
                    print(f"cycle {cycle}: first SEND_OK {sends[-1]:.2f} s, delivered {deliveries[-1]:.2f} s "
                          f"after the kill ({i} sends tried)", flush=True)
                    old.start_group()
                    while role(c, old) != "SLAVE":
                        time.sleep(0.05)
            pc.shutdown()
    finally:
        for b in brokers:
            b.close()
        ctl.close()
    print(f"bench_failover: {cycles} master kills, default timeouts, public Producer / PushConsumer with defaults")
    print(f"  kill -9 -> first Producer.send SEND_OK: p50 {statistics.median(sends):.2f} s, max {max(sends):.2f} s")
    print(f"  kill -9 -> listener gets the first message sent after it: p50 {statistics.median(deliveries):.2f} s, "
          f"max {max(deliveries):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
