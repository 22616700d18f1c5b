"""kill -9 of the broker group while SimpleConsumers receive and ack (POP, RocketMQ 5).

Each cycle: consumer threads receive (invisible 3 s) and ack continuously; the broker group is
killed at a random moment (counted in acks, not seconds) and restarted.  At the end a consumer
drains the topic until every message is acked.  Checked and printed:

- ``un-acked messages lost: 0``: every message is acked in the end (none vanished with a
  checkpoint the crash cut, none stuck in flight);
- ``acked messages delivered again: 0``: no message is received after an ack of it succeeded
  (the ACK record is in the CommitLog before the reply, the table is rebuilt from it).

An ack whose reply the crash swallowed is *uncertain* (it may or may not be recorded): its
message may be delivered again, and that is not counted.  Fast tier: 3 cycles; slow tier
(``-m slow``): RMQ_POP_KILL9_CYCLES (default 30).
"""
import random
import threading
import time

import msgpack
import pytest

from rmq import Message, Producer, SimpleConsumer
from rmq.client.consumer import MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.errors import MQBrokerError, MQClientError
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.conftest import env_int
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import create_topic, wait_dispatched, wait_for

pytestmark = pytest.mark.fault
QUEUES = 2
N_MESSAGES = 600
INVISIBLE_S = 3.0


def wait_routed(c: Cluster, topic: str) -> None:
    """The NameServer routes ``topic`` to the broker that runs now (a restart takes a new port)."""
    def routed():
        with RemotingClient() as rc:
            r = rc.invoke(c.namesrv.endpoint, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic}))
        if r.code != ResponseCode.SUCCESS:
            return False
        body = msgpack.unpackb(r.bodies[0])
        return any(c.broker_addr in (bd.get("brokerAddrs") or {}).values() for bd in body.get("brokerDatas", []))
    wait_for(routed, timeout_s=30, what=f"route of {topic} to {c.broker_addr}")


def kill_mid_run(c: Cluster, worker, n_threads: int, progress, want: int, topic: str) -> None:
    """One crash cycle: ``n_threads`` threads run ``worker(stop_event)`` until ``progress()``
    reaches ``want`` (or 60 s, or every thread ended), then the broker group is killed with -9, the
    threads are stopped and joined, and the group is restarted and routed for ``topic`` again."""
    stop = threading.Event()
    threads = [threading.Thread(target=worker, args=(stop,), daemon=True) for _ in range(n_threads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while progress() < want and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.002)
    c.kill_group()
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    c.start_group()
    wait_routed(c, topic)


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked_at: dict = {}        # body -> monotonic time of the first successful ack
        self.uncertain: set = set()     # acks sent whose reply never came
        self.redelivered_after_ack: list = []

    def received(self, views) -> None:
        now = time.monotonic()
        with self.lock:
            for v in views:
                if v.body in self.acked_at and self.acked_at[v.body] < now:
                    self.redelivered_after_ack.append(v.body)

    def acked(self, views) -> None:
        now = time.monotonic()
        with self.lock:
            for v in views:
                self.acked_at.setdefault(v.body, now)


def consume(c: Cluster, ledger: Ledger, stop: threading.Event, rng: random.Random) -> None:
    try:
        sc = SimpleConsumer(c.namesrv_addr, "pop-kill", {"PK": "*"}, await_duration_s=0.3, timeout_ms=1000).start()
    except (MQClientError, OSError):
        return
    try:
        while not stop.is_set():
            try:
                views = sc.receive(rng.randint(1, 16), INVISIBLE_S)
            except (MQClientError, OSError):
                return                  # the broker is gone
            ledger.received(views)
            if not views:
                continue
            keep = [v for v in views if rng.random() < 0.9]     # some are never acked: redelivered later
            try:
                if rng.random() < 0.5:
                    sc.ack_batch(keep)
                    ledger.acked(keep)
                else:
                    for v in keep:
                        sc.ack(v)
                        ledger.acked([v])
            except MQBrokerError:
                return                  # e.g. a handle spent by a revive during a slow restart
            except (MQClientError, OSError):
                with ledger.lock:
                    ledger.uncertain.update(v.body for v in keep if v.body not in ledger.acked_at)
                return
    finally:
        sc.shutdown()


def pop_crash_loop(tmp_path, cycles: int, seed: int) -> tuple:
    rng = random.Random(seed)
    c = Cluster(tmp_path / "store")
    ledger = Ledger()
    try:
        create_topic(c, "PK", QUEUES)
        bodies = [b"pk-%05d" % i for i in range(N_MESSAGES)]
        with Producer(c.namesrv_addr, group="pk-pg") as p:
            for i in range(0, N_MESSAGES, 50):
                p.send_batch([Message("PK", b) for b in bodies[i:i + 50]],
                             queue=MessageQueue("PK", "broker-a", (i // 50) % QUEUES))
        wait_dispatched(c, "PK", QUEUES, N_MESSAGES, group="pk-probe")
        for cycle in range(cycles):
            want = min(len(ledger.acked_at) + rng.randint(5, N_MESSAGES // (cycles + 2)), N_MESSAGES)
            kill_mid_run(c, lambda stop, r=random.Random(rng.random()): consume(c, ledger, stop, r), 2,
                         lambda: len(ledger.acked_at), want, "PK")
        # drain: everything not acked yet comes back within its invisible time
        final = Ledger()
        with SimpleConsumer(c.namesrv_addr, "pop-kill", {"PK": "*"}, await_duration_s=0.5) as sc:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                views = sc.receive(32, 30)
                ledger.received(views)
                if views:
                    sc.ack_batch(views)
                    ledger.acked(views)
                    final.acked(views)
                elif len(ledger.acked_at) + len(ledger.uncertain - ledger.acked_at.keys()) >= N_MESSAGES:
                    break
        lost = [b for b in bodies if b not in ledger.acked_at and b not in ledger.uncertain]
        again = [b for b in ledger.redelivered_after_ack if b not in ledger.uncertain]
        print(f"\nPOP kill -9: {cycles} cycles, {N_MESSAGES} messages, {len(ledger.acked_at)} acked, "
              f"{len(ledger.uncertain)} acks uncertain (reply lost in a crash)")
        print(f"un-acked messages lost: {len(lost)}")
        print(f"acked messages delivered again: {len(again)}")
        assert not lost, f"messages never acked nor delivered again: {lost[:5]}"
        assert not again, f"delivered after their ack succeeded: {again[:5]}"
        return len(ledger.acked_at), len(ledger.uncertain - ledger.acked_at.keys())
    finally:
        c.close()


def test_pop_kill9_fast(tmp_path):
    acked, uncertain = pop_crash_loop(tmp_path, cycles=3, seed=5)
    assert acked + uncertain == N_MESSAGES


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_pop_kill9_slow(tmp_path):
    cycles = env_int("RMQ_POP_KILL9_CYCLES", 30)
    acked, uncertain = pop_crash_loop(tmp_path, cycles=cycles, seed=env_int("RMQ_SEED", 13))
    assert acked + uncertain == N_MESSAGES
