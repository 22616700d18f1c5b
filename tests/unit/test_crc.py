"""rmq._core.crc against zlib.crc32 (IEEE CRC-32, java.util.zip.CRC32)."""
import array
import mmap
import os
import random
import threading
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq._core.crc import crc32, crc32_combine, java_crc32

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)


def test_check_value():
    assert crc32(b"123456789") == 0xCBF43926
    assert crc32(b"") == 0
    assert java_crc32(b"123456789") == 0xCBF43926 & 0x7FFFFFFF


@settings(max_examples=500)
@given(data=st.binary(min_size=0, max_size=5000), value=u32)
def test_matches_zlib(data, value):
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, value) == zlib.crc32(data, value)


@pytest.mark.parametrize("n", [1 << 20, (1 << 20) + 13, 5 * 1024 - 1, 5 * 1024, 3 * 1024 * 1024 + 7])
def test_large(n):
    data = os.urandom(n)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(bytearray(data), 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)


def test_every_length_and_alignment():
    rnd = random.Random(1234)
    big = rnd.randbytes(300 + 16)
    for n in range(301):
        off = rnd.randrange(16)
        data = big[off:off + n]
        assert crc32(data) == zlib.crc32(data), (n, off)
        # memoryview slices keep the misalignment (bytes slicing copies)
        view = memoryview(big)[off:off + n]
        assert crc32(view) == zlib.crc32(data), (n, off)


def test_all_offsets_all_short_lengths():
    big = random.Random(99).randbytes(2048)
    view = memoryview(big)
    for off in range(16):
        for n in (0, 1, 15, 16, 63, 64, 65, 79, 80, 127, 128, 129, 191, 255, 1000, 2000):
            assert crc32(view[off:off + n]) == zlib.crc32(big[off:off + n]), (off, n)


@settings(max_examples=300)
@given(parts=st.lists(st.binary(max_size=700), max_size=6), value=u32)
def test_chaining(parts, value):
    crc = value
    for p in parts:
        crc = crc32(p, crc)
    assert crc == zlib.crc32(b"".join(parts), value)


def test_value_taken_modulo_2_32():
    assert crc32(b"abc", -1) == zlib.crc32(b"abc", -1)
    assert crc32(b"abc", (1 << 40) + 7) == zlib.crc32(b"abc", 7)


@settings(max_examples=300)
@given(a=st.binary(max_size=3000), b=st.binary(max_size=3000))
def test_combine(a, b):
    assert crc32_combine(crc32(a), crc32(b), len(b)) == zlib.crc32(a + b)


def test_combine_large_lengths():
    rnd = random.Random(7)
    a = rnd.randbytes(1000)
    for n in (1 << 16, (1 << 20) + 3, 5_000_001):
        b = rnd.randbytes(n)
        assert crc32_combine(crc32(a), crc32(b), n) == zlib.crc32(a + b)
    # huge len2: combining with n zero bytes == CRC of a followed by n zeros,
    # checked via the identity combine(combine(c, z1, n1), z2, n2)
    c = crc32(a)
    z = crc32(bytes(1 << 20))
    assert crc32_combine(crc32_combine(c, z, 1 << 20), z, 1 << 20) == crc32(a + bytes(2 << 20))
    assert 0 <= crc32_combine(c, 0x12345678, (1 << 63) - 1) <= 0xFFFFFFFF


def test_combine_edges():
    assert crc32_combine(0x12345678, 0, 0) == 0x12345678
    assert crc32_combine(0, crc32(b"xyz"), 3) == crc32(b"xyz")
    with pytest.raises(ValueError):
        crc32_combine(1, 2, -1)
    with pytest.raises(OverflowError):
        crc32_combine(1, 2, 1 << 64)


@settings(max_examples=300)
@given(data=st.binary(max_size=2000))
def test_java_crc32_masked(data):
    j = java_crc32(data)
    assert j == zlib.crc32(data) & 0x7FFFFFFF
    assert 0 <= j < 2**31
    assert java_crc32(bytearray(data)) == j


def test_java_crc32_high_bit_cleared():
    # find a short input whose CRC has bit 31 set, so the mask matters
    for i in range(1000):
        data = str(i).encode()
        if zlib.crc32(data) & 0x80000000:
            assert java_crc32(data) == zlib.crc32(data) - 0x80000000
            break
    else:
        pytest.fail("no CRC with the top bit set")


def test_mmap_and_memoryview(tmp_path):
    data = random.Random(5).randbytes(3 * 4096 + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert crc32(m) == zlib.crc32(data)
        assert java_crc32(m) == zlib.crc32(data) & 0x7FFFFFFF
        with memoryview(m) as mv:
            assert crc32(mv[100:2000]) == zlib.crc32(data[100:2000])
    with mmap.mmap(-1, 8192) as m:  # writable anonymous map
        m[:] = data[:8192]
        assert crc32(m) == zlib.crc32(data[:8192])
    mv = memoryview(data)
    assert crc32(mv) == zlib.crc32(data)
    assert crc32(mv[7:7 + 1000], 42) == zlib.crc32(data[7:1007], 42)
    assert crc32(bytearray()) == 0


def test_other_buffer_formats():
    arr = array.array("i", range(1000))
    assert crc32(arr) == zlib.crc32(arr)
    mv = memoryview(bytes(range(256)) * 4).cast("H", (32, 16))  # 2-D, items of 2 bytes
    assert crc32(mv) == zlib.crc32(mv)


def test_rejects_non_buffers():
    for bad in ("str", 1, None, [1, 2]):
        with pytest.raises(TypeError):
            crc32(bad)
        with pytest.raises(TypeError):
            java_crc32(bad)
    with pytest.raises((TypeError, ValueError, BufferError)):
        crc32(memoryview(b"abcdef")[::2])


def test_concurrent_threads_large_buffers():
    data = os.urandom(1 << 20)
    expected = zlib.crc32(data)
    results = []

    def work():
        results.append(all(crc32(data) == expected for _ in range(20)))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4
