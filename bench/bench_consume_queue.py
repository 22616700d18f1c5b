"""ConsumeQueue throughput: ``put_batch`` of 1024-entry runs and ``read_raw`` (+ decode) of 1024 entries.

Run: ``python -m pytest bench/bench_consume_queue.py --benchmark-only -q``
(or ``python bench/bench_consume_queue.py`` for a plain table).

Every scenario moves the same ``N_ENTRIES * 20`` bytes through one
default-size (6,000,000-byte) ConsumeQueue file, beside its ceiling:

* ``put_batch x1024``: ``cq.put_batch(phys, sizes, tags, cq_offset, start, 1024)``
  200 times (idempotency checks, file lookup, one nogil ``put_entries`` per run);
  ceiling: ``MappedFile.append`` of a 20,480-byte chunk 200 times (memcpy).
* ``read_raw x1024`` / ``read_raw+decode x1024`` / ``read_raw+filter x1024``:
  ``cq.read_raw(q, 1024)`` over the whole queue, then ``decode_entries`` (three
  arrays) or ``filter_by_tags`` (one tag code); ceiling: ``MappedFile.read`` of
  20,480 bytes at a time over the same bytes (memcpy out into ``bytes``).

Files are pre-allocated and pre-touched (``warm_up``) in the untimed setup, on
both sides, so no first-touch page fault is timed.  ``extra_info`` carries
``entries_per_s`` and ``ratio_to_ceiling`` (ceiling measured in the same
session, median of its rounds).
"""
from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from array import array

import pytest

from rmq._core.consume_queue import decode_entries, filter_by_tags
from rmq._core.layout import CQ_STORE_UNIT_SIZE
from rmq._core.mapped_file import MappedFile
from rmq.store.consume_queue import ConsumeQueue

RUN = 1024                               # entries per put_batch / read_raw call
N_RUNS = 200
N_ENTRIES = RUN * N_RUNS                 # 204,800 entries = 4,096,000 bytes: one default file
CHUNK = RUN * CQ_STORE_UNIT_SIZE         # bytes per call
FILE_SIZE = CQ_STORE_UNIT_SIZE * 300_000   # RocketMQ's default ConsumeQueue file
ROUNDS = int(os.environ.get("RMQ_BENCH_ROUNDS", "5"))
TAG_A, TAG_B = 2598919, 2598920          # Java "TagA".hashCode(), "TagB".hashCode()

PHYS = array("q", range(0, N_ENTRIES * 256, 256))            # ~256-byte records
SIZES = array("i", [256]) * N_ENTRIES
TAGS = array("q", (TAG_A if k % 4 == 0 else TAG_B for k in range(N_ENTRIES)))
CODES = array("i", [TAG_A])


# -- scenarios: setup() -> state, run(state), teardown(state) -------------------------------------
def _tmpdir() -> str:
    return tempfile.mkdtemp(prefix="rmq-bench-cq-", dir=os.environ.get("RMQ_BENCH_DIR"))


def put_setup():
    root = _tmpdir()
    cq = ConsumeQueue(root, "bench", 0, FILE_SIZE)
    cq.load()
    cq.mapped_file_queue.get_last_mapped_file(0, True).warm_up()
    return root, cq


def put_run(state):
    _, cq = state
    put = cq.put_batch
    for r in range(N_RUNS):
        put(PHYS, SIZES, TAGS, r * RUN, r * RUN, RUN)
    assert cq.get_max_offset_in_queue() == N_ENTRIES


def cq_teardown(state):
    root, cq = state
    cq.destroy()
    shutil.rmtree(root, ignore_errors=True)


def write_ceiling_setup():
    root = _tmpdir()
    mf = MappedFile(os.path.join(root, "00000000000000000000"), FILE_SIZE, True)
    mf.warm_up()
    return root, mf


def write_ceiling_run(state):
    _, mf = state
    chunk = bytes(CHUNK)
    append = mf.append
    for _ in range(N_RUNS):
        append(chunk)


def mf_teardown(state):
    root, mf = state
    mf.destroy()
    shutil.rmtree(root, ignore_errors=True)


_READ_STATE: dict = {}


def read_setup():
    """One filled queue shared by the read scenarios (created on first use)."""
    if "cq" not in _READ_STATE:
        root, cq = put_setup()
        put_run((root, cq))
        cq.flush(0)
        _READ_STATE.update(root=root, cq=cq)
    return _READ_STATE["root"], _READ_STATE["cq"]


def read_raw_run(state):
    cq = state[1]
    read_raw = cq.read_raw
    for q in range(0, N_ENTRIES, RUN):
        read_raw(q, RUN)


def read_decode_run(state):
    cq = state[1]
    read_raw = cq.read_raw
    for q in range(0, N_ENTRIES, RUN):
        decode_entries(read_raw(q, RUN))


def read_filter_run(state):
    cq = state[1]
    read_raw = cq.read_raw
    for q in range(0, N_ENTRIES, RUN):
        filter_by_tags(read_raw(q, RUN), CODES)


def read_ceiling_setup():
    _, cq = read_setup()
    return None, cq.mapped_file_queue.get_first_mapped_file()


def read_ceiling_run(state):
    mf = state[1]
    read = mf.read
    for pos in range(0, N_ENTRIES * CQ_STORE_UNIT_SIZE, CHUNK):
        read(pos, CHUNK)


def no_teardown(state):
    pass


SCENARIOS = {
    # name: (setup, run, teardown, ceiling name)
    "put_batch x1024": (put_setup, put_run, cq_teardown, "memcpy into MappedFile"),
    "read_raw x1024": (read_setup, read_raw_run, no_teardown, "memcpy out of MappedFile"),
    "read_raw+decode x1024": (read_setup, read_decode_run, no_teardown, "memcpy out of MappedFile"),
    "read_raw+filter x1024": (read_setup, read_filter_run, no_teardown, "memcpy out of MappedFile"),
    "memcpy into MappedFile": (write_ceiling_setup, write_ceiling_run, mf_teardown, None),
    "memcpy out of MappedFile": (read_ceiling_setup, read_ceiling_run, no_teardown, None),
}


def time_round(name: str) -> float:
    setup, run, teardown, _ = SCENARIOS[name]
    state = setup()
    try:
        gc.collect()
        t0 = time.perf_counter()
        run(state)
        return time.perf_counter() - t0
    finally:
        teardown(state)


def close_shared() -> None:
    if "cq" in _READ_STATE:
        cq_teardown((_READ_STATE.pop("root"), _READ_STATE.pop("cq")))


# -- pytest-benchmark -------------------------------------------------------------------------------
_CEILING_S: dict = {}


def _ceiling_seconds(name: str) -> float:
    if name not in _CEILING_S:
        _CEILING_S[name] = statistics.median(time_round(name) for _ in range(ROUNDS))
    return _CEILING_S[name]


@pytest.fixture(scope="module", autouse=True)
def _shared_queue():
    yield
    close_shared()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_consume_queue(benchmark, name):
    setup, run, teardown, ceiling = SCENARIOS[name]
    states = []

    def pedantic_setup():
        states.append(setup())
        return (states[-1],), {}

    benchmark.group = "consume queue: " + ("write" if "into" in (ceiling or name) else "read")
    benchmark.pedantic(run, setup=pedantic_setup, teardown=lambda state: teardown(state),
                       rounds=ROUNDS, iterations=1)
    median = benchmark.stats.stats.median
    benchmark.extra_info["entries"] = N_ENTRIES
    benchmark.extra_info["entries_per_s"] = round(N_ENTRIES / median)
    benchmark.extra_info["mb_per_s"] = round(N_ENTRIES * CQ_STORE_UNIT_SIZE / median / 1e6, 1)
    if ceiling:
        benchmark.extra_info["ratio_to_ceiling"] = round(_ceiling_seconds(ceiling) / median, 4)


# -- plain runner ---------------------------------------------------------------------------------------
def main() -> None:
    print(f"{N_ENTRIES:,} entries ({N_ENTRIES * CQ_STORE_UNIT_SIZE / 1e6:.2f} MB) per round, "
          f"median of {ROUNDS} rounds")
    head = f"{'scenario':<26} {'entries/s':>14} {'MB/s':>9} {'ratio to ceiling':>17}"
    print(head)
    print("-" * len(head))
    medians = {}
    try:
        for name in SCENARIOS:
            medians[name] = statistics.median(time_round(name) for _ in range(ROUNDS))
    finally:
        close_shared()
    for name, (_, _, _, ceiling) in SCENARIOS.items():
        s = medians[name]
        ratio = f"{medians[ceiling] / s:>16.1%}" if ceiling else f"{'(ceiling)':>17}"
        print(f"{name:<26} {N_ENTRIES / s:>14,.0f} {N_ENTRIES * CQ_STORE_UNIT_SIZE / s / 1e6:>9,.1f} {ratio}")


if __name__ == "__main__":
    main()
