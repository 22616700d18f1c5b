"""kill -9 of the broker group while transactions run (half message, local transaction,
END_TRANSACTION, check-backs).

Each cycle: two TransactionProducers of one group send transactions continuously; a
transaction's outcome is fixed by its number (even: COMMIT, odd: ROLLBACK).  The local
transaction returns that outcome, or UNKNOW four times in ten (then the broker checks back and
the checker answers the outcome), so kills land between half messages and END_TRANSACTIONs and
during check-backs.  The group is killed at a random moment (counted in transactions) and
restarted; new producers of the group answer the check-backs of the old ones' transactions.
At the end one producer stays until no transaction is pending.  Checked and printed:

- ``transactions resolved wrongly after N broker kills: 0``: every message visible in the topic
  is a COMMIT transaction, visible once; every COMMIT transaction whose half message was stored
  (the send returned) is visible; nothing is left pending.

A send that raised because of the kill is *uncertain* (its half message may be stored): it may
be visible, once, only if its outcome is COMMIT.  Fast tier: 3 cycles; slow tier (``-m slow``):
RMQ_TX_KILL9_CYCLES (default 50).
"""
import random
import threading

import pytest

from rmq import LocalTransactionState, Message, PullConsumer, TransactionProducer
from rmq.client.admin import Admin
from rmq.client.consumer import MessageQueue
from rmq.errors import RmqError
from tests.conftest import env_int
from tests.fault.test_pop_kill9 import kill_mid_run
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.fault
TOPIC = "TXK"
GROUP = "txk-pg"
# checks soon and often; a high check maximum: a transaction waiting through restarts is never discarded
CONF = {"transactionCheckInterval": "500", "transactionTimeOut": "1000", "transactionCheckMax": "1000"}


def outcome(body: bytes) -> LocalTransactionState:
    n = int(body.split(b"-")[1])
    return LocalTransactionState.COMMIT_MESSAGE if n % 2 == 0 else LocalTransactionState.ROLLBACK_MESSAGE


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.next = 0
        self.stored: set = set()        # half message stored (the send returned)
        self.uncertain: set = set()     # the send raised (the kill): maybe stored

    def take(self) -> bytes:
        with self.lock:
            self.next += 1
            return b"tx-%06d" % self.next


def run_producer(c: Cluster, ledger: Ledger, stop: threading.Event, rng: random.Random) -> None:
    try:
        p = TransactionProducer(c.namesrv_addr, group=GROUP, checker=lambda m: outcome(m.body),
                                send_msg_timeout_ms=2000)
    except RmqError:
        return
    try:
        while not stop.is_set():
            body = ledger.take()

            def local(msg, arg, body=body):
                return LocalTransactionState.UNKNOW if rng.random() < 0.4 else outcome(body)
            try:
                p.send_message_in_transaction(Message(TOPIC, body), local)
            except (RmqError, OSError):
                with ledger.lock:
                    ledger.uncertain.add(body)
                return
            with ledger.lock:
                ledger.stored.add(body)
    finally:
        p.close()


def visible(c: Cluster) -> list:
    out = []
    with PullConsumer(c.namesrv_addr, group="txk-probe", auto_commit=False) as pc:
        for q in range(2):
            offset = 0
            while True:
                r = pc.pull(MessageQueue(TOPIC, "broker-a", q), "*", offset, 32, timeout_ms=3000)
                if not r.msg_found_list:
                    break
                out += [m.body for m in r.msg_found_list]
                offset = r.next_begin_offset
    return out


def transaction_crash_loop(tmp_path, cycles: int, seed: int) -> dict:
    rng = random.Random(seed)
    c = Cluster(tmp_path / "store", conf=CONF)
    ledger = Ledger()
    try:
        create_topic(c, TOPIC, 2)
        for cycle in range(cycles):
            kill_mid_run(c, lambda stop, r=random.Random(rng.random()): run_producer(c, ledger, stop, r), 2,
                         lambda: len(ledger.stored), len(ledger.stored) + rng.randint(20, 300), TOPIC)
        # one producer answers check-backs until nothing is pending
        with TransactionProducer(c.namesrv_addr, group=GROUP, checker=lambda m: outcome(m.body)) as p:
            p.producer.send(Message(TOPIC, b"warm-0"))       # its connection, for the check-backs

            def settled():
                with Admin(c.namesrv_addr) as a:
                    h = a.half_messages("broker-a")
                return h["ready"] and h["pending"] == 0
            wait_for(settled, timeout_s=120, what="no transaction pending")
        seen = [b for b in visible(c) if b.startswith(b"tx-")]
        counts: dict = {}
        for b in seen:
            counts[b] = counts.get(b, 0) + 1
        twice = [b for b, n in counts.items() if n > 1]
        rolled_back_visible = [b for b in counts if outcome(b) is not LocalTransactionState.COMMIT_MESSAGE]
        missing = [b for b in ledger.stored if outcome(b) is LocalTransactionState.COMMIT_MESSAGE and b not in counts]
        wrong = len(twice) + len(rolled_back_visible) + len(missing)
        print(f"\ntransactions kill -9: {cycles} cycles, {len(ledger.stored)} half messages stored, "
              f"{len(ledger.uncertain)} sends cut by a kill, {len(counts)} committed messages visible")
        print(f"transactions resolved wrongly after {cycles} broker kills: {wrong}")
        assert not twice, f"committed twice: {twice[:5]}"
        assert not rolled_back_visible, f"rolled back but visible: {rolled_back_visible[:5]}"
        assert not missing, f"committed but not visible: {sorted(missing)[:5]}"
        return {"stored": len(ledger.stored), "visible": len(counts)}
    finally:
        c.close()


def test_transaction_kill9_fast(tmp_path):
    r = transaction_crash_loop(tmp_path, cycles=3, seed=7)
    assert r["stored"] > 0 and r["visible"] > 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_transaction_kill9_slow(tmp_path):
    cycles = env_int("RMQ_TX_KILL9_CYCLES", 50)
    r = transaction_crash_loop(tmp_path, cycles=cycles, seed=env_int("RMQ_SEED", 17))
    assert r["stored"] > 0

