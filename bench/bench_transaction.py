"""What a transactional producer gets: ``TransactionProducer.send_message_in_transaction`` (half
message + local transaction + END_TRANSACTION, COMMIT) beside ``Producer.send`` with its
defaults, one message at a time, in one run.

Run::

    python bench/bench_transaction.py

One broker group on loopback (the test harness's Cluster), 100 B bodies, one thread each:

- ``Producer.send`` one at a time for SECONDS (default 5);
- ``TransactionProducer.send_message_in_transaction`` with a local transaction that returns
  COMMIT_MESSAGE at once, for SECONDS; then the time until every committed message is visible
  to a consumer (the commit records dispatched);
- the same with 4 threads sharing one TransactionProducer (what a web service does).

Each figure is transactions (messages) per second; the ratio is to ``Producer.send`` of the same run.
The bar (issue 18): transactional send >= 40 % of the plain ``Producer.send`` rate.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer  # noqa: E402
from rmq.client.consumer import MessageQueue  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.test_consumer import create_topic, wait_for  # noqa: E402

SECONDS = float(os.environ.get("RMQ_BENCH_TX_SECONDS", "5"))
THREADS = int(os.environ.get("RMQ_BENCH_TX_THREADS", "4"))
QUEUES = 8
BODY = b"x" * 100
COMMIT = LocalTransactionState.COMMIT_MESSAGE
# production-like geometry (the test Cluster's tiny files would roll every few thousand messages)
CONF = {"mappedFileSizeCommitLog": str(256 << 20), "mappedFileSizeConsumeQueue": str(300_000 * 20),
        "maxHashSlotNum": "500000", "maxIndexNum": "2000000"}


def timed(n_threads: int, fn) -> float:
    """Run ``fn()`` in ``n_threads`` threads for SECONDS; calls per second."""
    counts = [0] * n_threads
    stop = time.perf_counter() + SECONDS

    def run(i):
        while time.perf_counter() < stop:
            fn()
            counts[i] += 1
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def visible_total(c: Cluster, topic: str) -> int:
    with PullConsumer(c.namesrv_addr, group="bench-tx-probe", auto_commit=False) as pc:
        return sum(pc.max_offset(MessageQueue(topic, "broker-a", q)) for q in range(QUEUES))


def main() -> int:
    with tempfile.TemporaryDirectory() as d, Cluster(os.path.join(d, "store"), conf=CONF) as c:
        create_topic(c, "BenchPlain", QUEUES)
        create_topic(c, "BenchTx", QUEUES)
        with Producer(c.namesrv_addr, group="bench-plain") as p:
            for _ in range(200):
                p.send(Message("BenchPlain", BODY))           # warm
            plain = timed(1, lambda: p.send(Message("BenchPlain", BODY)))
        with TransactionProducer(c.namesrv_addr, group="bench-tx", checker=lambda m: COMMIT) as tp:
            for _ in range(200):
                tp.send_message_in_transaction(Message("BenchTx", BODY), lambda m, a: COMMIT)
            before = visible_total(c, "BenchTx")
            tx1 = timed(1, lambda: tp.send_message_in_transaction(Message("BenchTx", BODY), lambda m, a: COMMIT))
            txn = timed(THREADS, lambda: tp.send_message_in_transaction(Message("BenchTx", BODY),
                                                                         lambda m, a: COMMIT))
            sent = tp.stats["commit"]
            t0 = time.perf_counter()
            wait_for(lambda: visible_total(c, "BenchTx") >= sent, timeout_s=120, what="every commit visible")
            settle_ms = (time.perf_counter() - t0) * 1000
        print(f"\ntransactional send vs Producer.send, 100 B, {SECONDS:.0f} s each, one broker group on loopback")
        print(f"  Producer.send, 1 thread:                               {plain:9,.0f} msgs/s  (1.00x)")
        print(f"  TransactionProducer (half + COMMIT), 1 thread:         {tx1:9,.0f} tx/s    ({tx1 / plain:.2f}x)")
        print(f"  TransactionProducer (half + COMMIT), {THREADS} threads:        {txn:9,.0f} tx/s    "
              f"({txn / plain:.2f}x)")
        print(f"  every commit visible {settle_ms:.0f} ms after the last send returned "
              f"({visible_total(c, 'BenchTx') - before:,} commits counted)")
        print(f"  bar: >= 0.40x plain send -> {'met' if tx1 / plain >= 0.4 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
