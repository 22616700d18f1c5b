"""What message trace costs a producer: the same sends with ``enable_msg_trace`` off and on.

Run::

    python bench/bench_trace.py

One broker group on loopback (the test harness's Cluster), 100 B bodies.  Per mode, in one run:
``send`` one at a time (N_SYNC messages) and ``send_async`` with the defaults (N_ASYNC messages,
until every future is done); each alternates off / on for ROUNDS rounds and reports the median.
With trace on the figure includes the trace records' own traffic (one trace message per up to
100 records, sent by the dispatcher thread of the same process) -- what a user gets.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq import Message, Producer  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402

N_SYNC = int(os.environ.get("RMQ_BENCH_TRACE_SYNC", "3000"))
N_ASYNC = int(os.environ.get("RMQ_BENCH_TRACE_ASYNC", "30000"))
ROUNDS = 3
BODY = b"x" * 100


def run_sync(p: Producer, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        p.send(Message("BT", BODY))
    return n / (time.perf_counter() - t0)


def run_async(p: Producer, n: int) -> float:
    t0 = time.perf_counter()
    futs = [p.send_async(Message("BT", BODY)) for _ in range(n)]
    for f in futs:
        f.result(60)
    return n / (time.perf_counter() - t0)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rmq-bench-trace-") as tmp, \
            Cluster(f"{tmp}/store", conf={"mapedFileSizeCommitLog": str(64 << 20)}) as c:
        rates = {("sync", False): [], ("sync", True): [], ("async", False): [], ("async", True): []}
        producers = {t: Producer(c.namesrv_addr, group=f"bt{int(t)}", enable_msg_trace=t) for t in (False, True)}
        try:
            for t, p in producers.items():
                p.send(Message("BT", BODY))                     # route learned, topic created
                if t:
                    p.trace_dispatcher.flush(30)
            for _ in range(ROUNDS):
                for t in (False, True):
                    rates[("sync", t)].append(run_sync(producers[t], N_SYNC))
                    rates[("async", t)].append(run_async(producers[t], N_ASYNC))
                    if t:
                        producers[t].trace_dispatcher.flush(60)
            d = producers[True].trace_dispatcher
            lost = d.dropped + d.failed
        finally:
            for p in producers.values():
                p.close()
    print(f"100 B messages, median of {ROUNDS} rounds; trace records dropped or failed: {lost}")
    print(f"{'mode':8} {'trace off':>12} {'trace on':>12} {'on / off':>9}")
    for mode in ("sync", "async"):
        off, on = statistics.median(rates[(mode, False)]), statistics.median(rates[(mode, True)])
        print(f"{mode:8} {off:12,.0f} {on:12,.0f} {on / off:9.2f}")


if __name__ == "__main__":
    sys.exit(main())
