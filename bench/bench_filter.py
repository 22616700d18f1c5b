"""Filtered reads on the broker: SQL92 and tag filters beside the unfiltered read of the same queue.

Run::

    python bench/bench_filter.py                                  # the table quoted in notes
    python -m pytest bench/bench_filter.py --benchmark-only -q    # pytest-benchmark

What is timed: ``MessageStore.get_messages`` -- what the broker runs for one PULL_MESSAGE -- over
a whole queue of 100 B messages (each with a few user properties), pull after pull from offset 0 to
the end, as a consumer catching up does (32 messages per pull, RocketMQ's default).  "examined" is
every message the read looked at (matched or not); the ceiling is the same loop without a filter
(every message examined is served), in the same run.
"""
from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import pytest

from rmq.filter import compile_sql92
from rmq.status import GetMessageStatus
from rmq.store.message_store import MessageStore

N_MSGS = int(os.environ.get("RMQ_BENCH_FILTER_MSGS", "200000"))
BODY = 100
PULL_BATCH = 32
ROUNDS = 3
TWO_TERM = "a > 5 AND region IN ('eu', 'us')"            # the "two-term expression"
SELECTIVE = "a > 98 AND region = 'eu'"                    # ~1 % match: mostly examining
TAGS = "T1"                                               # a tag filter of ~10 % for comparison


def build_store(path: str) -> MessageStore:
    s = MessageStore(path, mapped_file_size_commit_log=256 << 20)
    rng = random.Random(1)
    regions = ["eu", "us", "ap", "sa"]
    body = b"x" * BODY
    for i in range(0, N_MSGS, 1024):
        batch = [(body, {"a": str(rng.randrange(100)), "region": rng.choice(regions)}, f"T{rng.randrange(10)}")
                 for _ in range(min(1024, N_MSGS - i))]
        for b, props, tag in batch:
            s.put_message("F", b, 0, tags=tag, properties=props)
    s.dispatch()
    return s


def read_queue(s: MessageStore, tags=None, sql=None) -> tuple:
    """Pull the whole queue: (messages served, pulls)."""
    off = served = pulls = 0
    while True:
        res = s.get_messages("g", "F", 0, off, PULL_BATCH, tags, sql_filter=sql)
        pulls += 1
        if res.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
            return served, pulls
        served += res.message_count
        off = res.next_begin_offset


def timed(fn) -> tuple:
    secs, out = [], None
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs), out


@pytest.fixture(scope="module")
def store():
    d = tempfile.mkdtemp(prefix="rmq-bench-filter-")
    s = build_store(d)
    yield s
    s.shutdown()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("kind", ["none", "tag", "sql_two_term", "sql_selective"])
def test_filtered_read(benchmark, store, kind):
    args = {"none": {}, "tag": {"tags": TAGS}, "sql_two_term": {"sql": compile_sql92(TWO_TERM)},
            "sql_selective": {"sql": compile_sql92(SELECTIVE)}}[kind]
    served, _ = benchmark.pedantic(read_queue, args=(store,), kwargs=args, rounds=ROUNDS, iterations=1)
    benchmark.extra_info["examined_msgs_per_s"] = N_MSGS / benchmark.stats.stats.median
    benchmark.extra_info["served"] = served


def main() -> None:
    d = tempfile.mkdtemp(prefix="rmq-bench-filter-")
    try:
        s = build_store(d)
        rows = []
        t_none, (served, pulls) = timed(lambda: read_queue(s))
        rows.append(("no filter (ceiling)", t_none, served, pulls))
        for name, kw in (("tag " + TAGS, {"tags": TAGS}),
                         ("SQL92 " + TWO_TERM, {"sql": compile_sql92(TWO_TERM)}),
                         ("SQL92 " + SELECTIVE, {"sql": compile_sql92(SELECTIVE)})):
            t, (served, pulls) = timed(lambda kw=kw: read_queue(s, **kw))
            rows.append((name, t, served, pulls))
        s.shutdown()
        print(f"{N_MSGS:,} messages of {BODY} B in one queue, {PULL_BATCH} per pull, median of {ROUNDS} rounds")
        print(f"{'filter':48} {'examined/s':>12} {'ratio':>6} {'served':>8} {'pulls':>7}")
        for name, t, served, pulls in rows:
            print(f"{name:48} {N_MSGS / t:12,.0f} {t_none / t:6.2f} {served:8,} {pulls:7,}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
