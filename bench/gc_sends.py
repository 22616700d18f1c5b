"""How much of a producer's time goes to CPython's cyclic GC: ``send_async`` of the thread and
asyncio producers, timed with ``gc.callbacks`` in the sending process.

Run::

    python bench/gc_sends.py [--messages 300000] [--rounds 2] [--rows send_async,aio_send]

One broker group on loopback (ASYNC_FLUSH, 1 GiB CommitLog files), then per row and round the
``rmq bench client`` loop (100 B bodies, a callback per message, until every future is done).
Printed per row: msgs/s of each round, and the GC time per message by generation (the time
between each collection's "start" and "stop" callbacks, in whichever thread ran it) with the
number of collections.  The first round of each row is a warm-up and is not counted in the GC
columns.  Figures: bench/results/client.md, stop 46.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq.bench import client as bc  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402

BODY_SIZE = 100
ROWS = ("send_async", "aio_send")


class GcClock:
    """Collections and seconds spent in them, per generation, while ``on`` (any thread)."""

    def __init__(self) -> None:
        self.on = False
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started: dict = {}

    def __call__(self, phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self._started[tid] = time.perf_counter()
            return
        t0 = self._started.pop(tid, None)
        if self.on and t0 is not None:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - t0

    def reset(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=2, help="counted rounds per row (after one warm-up)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            ap.error(f"unknown row {r!r}")
    clock = GcClock()
    gc.callbacks.append(clock)
    n = args.messages
    with tempfile.TemporaryDirectory(prefix="rmq-gc-sends-") as tmp, \
            Cluster(f"{tmp}/store", conf={"mapedFileSizeCommitLog": str(1 << 30), "flushDiskType": "ASYNC_FLUSH"}) as c:
        for row in rows:
            fn = getattr(bc, row)
            clock.reset()
            rates = []
            for rnd in range(args.rounds + 1):
                clock.on = rnd > 0
                out = fn(c.namesrv_addr, f"GC{row}{rnd}", BODY_SIZE, n)
                rates.append(out["msgs"] / out["seconds"])
            clock.on = False
            counted = n * args.rounds
            per = " ".join(f"gen{g} {clock.seconds[g] / counted * 1e6:.2f} us ({clock.count[g]})" for g in range(3))
            print(f"{row:12} {', '.join(f'{x:,.0f}' for x in rates[1:])} msgs/s (warm-up {rates[0]:,.0f}); "
                  f"GC per message: {per}; total {sum(clock.seconds) / counted * 1e6:.2f} us", flush=True)


if __name__ == "__main__":
    main()
