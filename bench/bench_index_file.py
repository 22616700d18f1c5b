"""IndexFile insert throughput on a default-geometry file (420,000,040 bytes).

Run: ``pytest bench/bench_index_file.py --benchmark-only``.

* ``put_hashes``: the nogil C loop the dispatch path uses (``put_hash`` per key),
  fed precomputed hashes;
* ``put_key``: the per-key Python path (UTF-8 encode + Java hash + put).

Each round starts on a fresh file (setup is not timed), so the slot table is
as cold as a newly rolled file's.  keys/s is reported in ``extra_info``.
"""
from __future__ import annotations

import array
import os
import random

import pytest

from rmq._core.index_file import IndexFile, index_key_hash_py

BATCH = 2_000_000        # keys per round for the C loop (10 % of a file)
PY_BATCH = 200_000       # keys per round for the Python loop
T0 = 1_700_000_000_000   # ms


def _batch(n: int, seed: int = 7):
    rng = random.Random(seed)
    hashes = array.array("i", (rng.randrange(0, 2 ** 31) for _ in range(n)))
    phys = array.array("q", range(0, n * 256, 256))          # ~256-byte messages
    tss = array.array("q", (T0 + i // 10 for i in range(n)))  # 10 keys per ms
    return hashes, phys, tss


@pytest.fixture
def fresh_file(tmp_path):
    files: list[IndexFile] = []
    counter = iter(range(10 ** 6))

    def make():
        while files:
            files.pop().destroy()
        f = IndexFile(os.path.join(tmp_path, f"{next(counter):017d}"))
        files.append(f)
        return f

    yield make
    while files:
        files.pop().destroy()


def test_put_hashes(benchmark, fresh_file):
    hashes, phys, tss = _batch(BATCH)

    def setup():
        return (fresh_file(), hashes, phys, tss), {}

    def run(f, h, p, t):
        assert f.put_hashes(h, p, t) == BATCH

    benchmark.pedantic(run, setup=setup, rounds=5, iterations=1)
    benchmark.extra_info["keys_per_round"] = BATCH
    benchmark.extra_info["keys_per_s"] = round(BATCH / benchmark.stats.stats.mean)


def test_put_key_python(benchmark, fresh_file):
    keys = [f"ORDER-{i:09d}" for i in range(PY_BATCH)]

    def setup():
        return (fresh_file(), keys), {}

    def run(f, ks):
        put = f.put_key
        for i, k in enumerate(ks):
            put("TopicTest", k, i * 256, T0 + i)

    benchmark.pedantic(run, setup=setup, rounds=5, iterations=1)
    benchmark.extra_info["keys_per_round"] = PY_BATCH
    benchmark.extra_info["keys_per_s"] = round(PY_BATCH / benchmark.stats.stats.mean)


def test_index_key_hash(benchmark):
    keys = [f"ORDER-{i:09d}" for i in range(PY_BATCH)]

    def run():
        for k in keys:
            index_key_hash_py("TopicTest", k)

    benchmark.pedantic(run, rounds=5, iterations=1)
    benchmark.extra_info["keys_per_s"] = round(PY_BATCH / benchmark.stats.stats.mean)
