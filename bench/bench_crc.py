"""crc32 throughput: rmq._core.crc.crc32 vs zlib.crc32.

Run: python -m pytest bench/bench_crc.py --benchmark-only -q
"""
import os
import zlib

import pytest

from rmq._core.crc import crc32

SIZES = {"100B": 100, "1KiB": 1024, "64KiB": 64 * 1024, "1MiB": 1024 * 1024}
IMPLS = {"rmq": crc32, "zlib": zlib.crc32}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("impl", list(IMPLS))
def test_crc32(benchmark, impl, size):
    n = SIZES[size]
    data = os.urandom(n)
    fn = IMPLS[impl]
    benchmark.group = f"crc32 {size}"
    benchmark.extra_info["bytes"] = n
    result = benchmark(fn, data)
    assert result == zlib.crc32(data)
    benchmark.extra_info["GB/s"] = round(n / benchmark.stats.stats.min / 1e9, 2)
