"""rmq._core.crc against zlib.crc32 (IEEE CRC-32, java.util.zip.CRC32).

Every test runs once per CRC engine the CPU supports ("vpclmul": AVX-512
VPCLMULQDQ, "pclmul": 128-bit PCLMULQDQ, "table": portable slicing-by-8),
selected at run time in the crc module's copy of crc32.h.
"""
import array
import mmap
import os
import random
import threading
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq._core.crc import _ENGINES, _engine, _set_engine, crc32, crc32_combine, crc32_copy, java_crc32

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)

_BEST = _engine()
ENGINES = list(_ENGINES[:_ENGINES.index(_BEST) + 1])


@pytest.fixture(autouse=True, scope="module", params=ENGINES[::-1])
def engine(request):
    assert _set_engine(request.param) == request.param
    yield request.param
    _set_engine(_BEST)


def test_engine_hooks():
    assert _BEST in _ENGINES
    assert _set_engine("table") == "table"
    assert _engine() == "table"
    assert _set_engine("vpclmul") == _BEST  # clamped to what the CPU has
    assert _engine() == _BEST
    with pytest.raises(ValueError):
        _set_engine("nope")


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
    assert crc32_combine(c, 0x12345678, (1 << 63) - 1) == _combine_ref(c, 0x12345678, (1 << 63) - 1)


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


# --- a pure-Python crc32_combine (zlib's algorithm) for lengths too big to
# --- materialise.  Reflected GF(2)[x] mod P, bit 31 = x^0.

def _multmodp(a, b):
    p = 0
    m = 1 << 31
    while m:
        if a & m:
            p ^= b
        m >>= 1
        b = (b >> 1) ^ (0xEDB88320 if b & 1 else 0)
    return p


def _combine_ref(crc1, crc2, len2):
    p = 1 << 31  # x^0
    s = 1 << 30  # x^1
    n = 8 * len2
    while n:  # square-and-multiply for x^n
        if n & 1:
            p = _multmodp(p, s)
        s = _multmodp(s, s)
        n >>= 1
    return _multmodp(p, crc1) ^ crc2


# A shared pool of random bytes for the combine tests (lengths up to 10**6).
_POOL = random.Random(2024).randbytes(10**6 + 4000)


@settings(max_examples=150, deadline=None)
@given(la=st.integers(0, 3000), lb=st.integers(0, 10**6), off=st.integers(0, 999), value=u32)
def test_combine_random_lengths_vs_zlib(la, lb, off, value):
    a = memoryview(_POOL)[off:off + la]
    b = memoryview(_POOL)[off + la:off + la + lb]
    ca = zlib.crc32(a, value)
    assert crc32_combine(ca, zlib.crc32(b), lb) == zlib.crc32(b, ca)
    assert crc32_combine(ca, crc32(b), lb) == _combine_ref(ca, zlib.crc32(b), lb)


@settings(max_examples=300)
@given(crc1=u32, crc2=u32, len2=st.integers(0, (1 << 63) - 1))
def test_combine_any_length_vs_reference(crc1, crc2, len2):
    # exponents past 2**32 - 1 (x's period mod P) included
    assert crc32_combine(crc1, crc2, len2) == _combine_ref(crc1, crc2, len2)


def test_combine_around_period():
    for n in (0xFFFFFFFE, 0xFFFFFFFF, 0x100000000, 0x1FFFFFFFE, 0x1FFFFFFFF, 0x200000000,
              1 << 32, (1 << 40) + 5, 255, 256, 65535, 65536, 1 << 24, (1 << 24) - 1):
        for c1, c2 in ((0x12345678, 0x9ABCDEF0), (0xFFFFFFFF, 0), (1, 0xFFFFFFFF)):
            assert crc32_combine(c1, c2, n) == _combine_ref(c1, c2, n), (n, c1, c2)


# --- crc32_copy -------------------------------------------------------------

GUARD = 0xA5


def test_copy_and_crc_every_length_and_offset():
    """Lengths 0..1100 x src offsets 0..63, dst offsets varying independently."""
    rnd = random.Random(4321)
    big = rnd.randbytes(64 + 1100 + 64)
    src = memoryview(big)
    pattern = bytes(rnd.randrange(256) for _ in range(1100 + 128))
    dbuf = bytearray([GUARD]) * (64 + 1100 + 64)
    guard = bytes(dbuf)
    dst = memoryview(dbuf)
    for n in range(1101):
        for so in range(64):
            do = (so * 37 + n * 11) % 64
            data = big[so:so + n]
            init = (n * 2654435761 + so) & 0xFFFFFFFF
            expect = zlib.crc32(data, init)
            assert crc32(src[so:so + n], init) == expect, (n, so)
            dbuf[do:do + n] = pattern[so:so + n]  # stale bytes differ from src
            assert crc32_copy(dst[do:do + n], src[so:so + n], init) == expect, (n, so, do)
            assert dbuf[do:do + n] == data, (n, so, do)
            assert dbuf.count(GUARD, 0, do) == do, (n, so, do)
            assert dbuf.count(GUARD, do + n) == len(dbuf) - do - n, (n, so, do)
            dbuf[do:do + n] = guard[:n]
    assert crc32(big) == zlib.crc32(big)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 191, 255, 256, 257, 1023, 1100])
def test_copy_all_offset_pairs(n):
    big = random.Random(n).randbytes(n + 64)
    expect = {so: zlib.crc32(big[so:so + n]) for so in range(64)}
    for do in range(64):
        dbuf = bytearray([GUARD]) * (n + 128)
        for so in range(64):
            dbuf[do:do + n] = bytes(n)
            assert crc32_copy(memoryview(dbuf)[do:do + n], memoryview(big)[so:so + n]) == expect[so]
            assert dbuf[do:do + n] == big[so:so + n]
            assert dbuf[:do] == bytes([GUARD]) * do and dbuf[do + n:] == bytes([GUARD]) * (128 - do)


@pytest.mark.parametrize("n", [1 << 20, (4 << 20) + 7, 5 * 1024, 5 * 1024 - 1])
def test_copy_large(n):
    data = os.urandom(n)
    dbuf = bytearray(n + 100)
    assert crc32_copy(memoryview(dbuf)[3:], data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)
    assert dbuf[3:3 + n] == data and dbuf[:3] == bytes(3) and dbuf[3 + n:] == bytes(97)
    assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


@settings(max_examples=300)
@given(data=st.binary(max_size=3000), extra=st.integers(0, 70), value=u32)
def test_copy_matches_zlib(data, extra, value):
    dbuf = bytearray(b"\x5a") * (len(data) + extra)
    assert crc32_copy(dbuf, data, value) == zlib.crc32(data, value)
    assert dbuf[:len(data)] == data
    assert dbuf[len(data):] == b"\x5a" * extra


def test_copy_chaining():
    rnd = random.Random(3)
    parts = [rnd.randbytes(rnd.randrange(0, 700)) for _ in range(20)]
    dbuf = bytearray(sum(map(len, parts)))
    crc = pos = 0
    for p in parts:
        crc = crc32_copy(memoryview(dbuf)[pos:], p, crc)
        pos += len(p)
    assert crc == zlib.crc32(b"".join(parts)) and dbuf == b"".join(parts)


def test_copy_buffer_kinds(tmp_path):
    data = random.Random(8).randbytes(3 * 4096 + 77)
    with mmap.mmap(-1, 4 * 4096) as m:  # into a writable mapping, as the CommitLog does
        assert crc32_copy(m, data) == zlib.crc32(data)
        assert m[:len(data)] == data and m[len(data):] == bytes(4 * 4096 - len(data))
    arr = array.array("I", bytes(4096))  # other item formats: raw bytes
    assert crc32_copy(arr, array.array("H", data[:4000])) == zlib.crc32(data[:4000])
    assert arr.tobytes()[:4000] == data[:4000]
    assert crc32_copy(bytearray(), b"") == 0
    assert crc32_copy(bytearray(5), b"", 1234) == 1234


def test_copy_overlapping_views():
    data = random.Random(9).randbytes(5000)
    for shift in (-1000, -65, -1, 1, 64, 1000):
        buf = bytearray(data)
        mv = memoryview(buf)
        a, b = (shift, 0) if shift > 0 else (0, -shift)
        n = 3000
        expect = zlib.crc32(data[b:b + n])
        assert crc32_copy(mv[a:a + n], mv[b:b + n]) == expect  # like memmove
        assert buf[a:a + n] == data[b:b + n]
    buf = bytearray(data)
    assert crc32_copy(buf, buf) == zlib.crc32(data) and buf == data


def test_copy_errors():
    with pytest.raises(ValueError):
        crc32_copy(bytearray(99), bytes(100))
    with pytest.raises(TypeError):
        crc32_copy(b"x" * 100, b"abc")  # read-only dst
    with pytest.raises(TypeError):
        crc32_copy(memoryview(bytearray(10)).toreadonly(), b"abc")
    for bad in (None, "str", 1):
        with pytest.raises(TypeError):
            crc32_copy(bad, b"abc")
        with pytest.raises(TypeError):
            crc32_copy(bytearray(10), bad)
    with pytest.raises((TypeError, ValueError, BufferError)):
        crc32_copy(memoryview(bytearray(20))[::2], b"abc")


def test_copy_concurrent_threads():
    data = os.urandom(1 << 20)
    expected = zlib.crc32(data)
    results = []

    def work():
        dbuf = bytearray(len(data))
        results.append(all(crc32_copy(dbuf, data) == expected for _ in range(10)) and dbuf == data)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


# --- the header alone, built with gcc against zlib under each compile-time
# --- switch (the Python build only ever uses one set of flags).

