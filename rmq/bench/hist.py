"""An HDR-style latency histogram: logarithmic buckets (about 1 % wide), mergeable across
processes (a plain dict of bucket -> count), exact min and max."""
from __future__ import annotations

import math
import time
from typing import Callable

#: buckets per factor e of value: bucket width ~ 1 / PER_E relative (1 %)
PER_E = 100.0


class Histogram:
    __slots__ = ("counts", "n", "min", "max", "total")

    def __init__(self) -> None:
        self.counts: dict = {}
        self.n = 0
        self.min = math.inf
        self.max = 0
        self.total = 0

    def record(self, value_ns: int, count: int = 1) -> None:
        v = max(1, int(value_ns))
        b = int(math.log(v) * PER_E)
        self.counts[b] = self.counts.get(b, 0) + count
        self.n += count
        self.total += v * count
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v

    def merge(self, other: "Histogram") -> "Histogram":
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.n += other.n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        return self

    def percentile(self, q: float) -> float:
        """Value (ns) at quantile ``q`` (0..1): the upper edge of its bucket, capped by max."""
        if not self.n:
            return float("nan")
        rank = q * self.n
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return min(float(self.max), math.exp((b + 1) / PER_E))
        return float(self.max)

    def cdf(self) -> list:
        """[(value_us, cumulative fraction)] for plotting."""
        out, seen = [], 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            out.append((min(self.max, math.exp((b + 1) / PER_E)) / 1e3, seen / self.n))
        return out

    def stats(self) -> dict:
        return {"n": self.n, "p50_us": self.percentile(0.5) / 1e3, "p99_us": self.percentile(0.99) / 1e3,
                "p999_us": self.percentile(0.999) / 1e3, "max_us": self.max / 1e3 if self.n else float("nan"),
                "mean_us": self.total / self.n / 1e3 if self.n else float("nan")}

    def to_dict(self) -> dict:
        return {"counts": {str(k): v for k, v in self.counts.items()}, "n": self.n, "min": self.min if self.n else 0,
                "max": self.max, "total": self.total}

    @classmethod
    def from_dict(cls, d: dict) -> "Histogram":
        h = cls()
        h.counts = {int(k): v for k, v in d["counts"].items()}
        h.n, h.max, h.total = d["n"], d["max"], d["total"]
        h.min = d["min"] if h.n else math.inf
        return h


def time_calls(call: Callable[[], object], seconds: float) -> tuple:
    """Call ``call()`` back to back for ``seconds``, timing each call (a closed loop: one at a
    time, each waited for).  Returns ``(calls, seconds taken, Histogram of ns per call)``."""
    h = Histogram()
    n = 0
    pc = time.perf_counter_ns
    t0 = time.perf_counter()
    stop = t0 + seconds
    while time.perf_counter() < stop:
        a = pc()
        call()
        h.record(pc() - a)
        n += 1
    return n, time.perf_counter() - t0, h
