"""IndexFile (rmq._core.index_file) and IndexService (rmq.store.index_service), SPEC.md §3.

Golden vectors are written from SPEC.md by hand; Java's ``String.hashCode``
is re-implemented below as a tiny pure-Python oracle over UTF-16 code units.
"""
from __future__ import annotations

import os
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq._core.index_file import IndexFile, index_file_size, index_key_hash_py
from rmq._core.layout import (
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmq.errors import StoreClosedError, StoreError
from rmq.store.index_service import (
    IndexService,
    file_name_to_time_millis,
    time_millis_to_file_name,
)

SLOTS = 8        # tiny geometry: 8 slots ...
ENTRIES = 32     # ... and 32 entries (31 usable: entry 0 is never used)
T0 = 1_700_000_000_123       # ms, 2023-11-14T22:13:20.123Z
HEADER = struct.Struct(">qqqqii")   # begin/end timestamp, begin/end phy, hashSlotCount, indexCount
ENTRY = struct.Struct(">iqii")      # keyHash, phyOffset, timeDiff (s), prevIndex
INT_MIN = -(2 ** 31)


# -- oracle -------------------------------------------------------------------------
def java_hash(s: str) -> int:
    """Java String.hashCode(): h = 31*h + unit over UTF-16 code units, signed 32-bit."""
    h = 0
    units = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def java_index_key_hash(topic: str, key: str) -> int:
    """IndexFile.indexKeyHashMethod(topic + "#" + key): abs, and 0 for Integer.MIN_VALUE."""
    h = java_hash(f"{topic}#{key}")
    return 0 if h == INT_MIN else abs(h)


def key_with_min_value_hash(topic: str) -> str:
    """A key such that ("topic#key").hashCode() == Integer.MIN_VALUE.

    hash(prefix + s) = hash(prefix) * 31**n + hash(s) (mod 2**32).  Writing the
    needed hash(s) in base 31 with digits offset by '0' gives printable chars
    '0'..'N'; seven digits suffice because 31**7 > 2**32.
    """
    n = 7
    prefix = (java_hash(f"{topic}#") & 0xFFFFFFFF) * pow(31, n, 1 << 32)
    zeros = java_hash("0" * n) & 0xFFFFFFFF
    need = (0x80000000 - prefix - zeros) % (1 << 32)
    digits = []
    for _ in range(n):
        need, d = divmod(need, 31)
        digits.append(chr(ord("0") + d))
    assert need == 0
    return "".join(reversed(digits))


def read_file(f: IndexFile) -> bytes:
    with open(f.file_name, "rb") as fh:
        return fh.read()


@pytest.fixture
def index_file(tmp_path):
    f = IndexFile(str(tmp_path / "20231114221320123"), SLOTS, ENTRIES)
    yield f
    if not f.closed:
        f.close()


# -- the hash -----------------------------------------------------------------------
def test_oracle_matches_known_java_values():
    assert java_hash("") == 0
    assert java_hash("Aa") == java_hash("BB") == 2112
    assert java_hash("polygenelubricants") == INT_MIN       # a well-known MIN_VALUE string
    assert java_hash("TopicTest#OrderID188") == -1231271670


@pytest.mark.parametrize("topic,key", [
    ("TopicTest", "OrderID188"),
    ("TopicTest", "Aa"),
    ("T", "键🙂"),                     # CJK (3 UTF-8 bytes) and U+1F642 (surrogate pair)
    ("主题", "ключ-κλειδί"),
    ("TopicTest", ""),
    ("%RETRY%group", "7F000001" * 8),
])
def test_index_key_hash_matches_java(topic, key):
    assert index_key_hash_py(topic, key) == java_index_key_hash(topic, key)
    assert index_key_hash_py(topic.encode(), key.encode()) == java_index_key_hash(topic, key)
    assert index_key_hash_py(bytearray(topic.encode()), memoryview(key.encode())) == \
        java_index_key_hash(topic, key)


def test_index_key_hash_rejects_non_text():
    with pytest.raises(TypeError):
        index_key_hash_py("T", 5)


def test_index_key_hash_golden_value():
    # abs("TopicTest#OrderID188".hashCode()) in Java
    assert index_key_hash_py("TopicTest", "OrderID188") == 1231271670


def test_index_key_hash_min_value_is_zero():
    key = key_with_min_value_hash("TopicTest")
    assert java_hash(f"TopicTest#{key}") == INT_MIN
    assert index_key_hash_py("TopicTest", key) == 0


def test_lone_surrogate_hashes_like_java_utf8_round_trip():
    # Java's getBytes(UTF_8) writes '?' for a lone surrogate; the broker hashes that.
    assert index_key_hash_py("T", "a\ud800b") == index_key_hash_py("T", "a?b")


@settings(max_examples=300)
@given(st.text(max_size=20), st.text(max_size=40))
def test_index_key_hash_property(topic, key):
    assert index_key_hash_py(topic, key) == java_index_key_hash(topic, key)


# -- geometry and golden bytes ------------------------------------------------------
def test_geometry():
    assert INDEX_HEADER_SIZE == HEADER.size == 40
    assert INDEX_ENTRY_SIZE == ENTRY.size == 20
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040
    assert index_file_size(SLOTS, ENTRIES) == 40 + SLOTS * 4 + ENTRIES * 20


def test_new_file_header(index_file):
    f = index_file
    assert os.path.getsize(f.file_name) == index_file_size(SLOTS, ENTRIES)
    assert (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset) == (0, 0, 0, 0)
    assert (f.hash_slot_count, f.index_count) == (0, 1)
    assert not f.is_write_full()
    assert read_file(f)[:HEADER.size] == HEADER.pack(0, 0, 0, 0, 0, 1)


def test_golden_bytes_header_and_entries(index_file):
    """Three puts, the last two colliding in hash and slot, checked byte for byte."""
    f = index_file
    h_order = 1231271670                 # abs("TopicTest#OrderID188".hashCode())
    h_aa = java_index_key_hash("TopicTest", "Aa")   # "Aa" and "BB": same hashCode
    assert h_order % SLOTS == 6 and h_aa % SLOTS == 2
    assert f.put_key("TopicTest", "OrderID188", 1000, T0)
    assert f.put_key("TopicTest", "Aa", 2000, T0 + 5_500)    # timeDiff 5 s (truncated)
    assert f.put_key("TopicTest", "BB", 3000, T0 + 61_999)   # timeDiff 61 s, prevIndex 2
    data = read_file(f)

    # hand-written bytes: beginTimestamp T0, endTimestamp T0+61999, beginPhy 1000,
    # endPhy 3000, hashSlotCount 2, indexCount 4
    assert data[:HEADER.size] == bytes.fromhex(
        "0000018bcfe5687b" "0000018bcfe65aaa" "00000000000003e8" "0000000000000bb8"
        "00000002" "00000004")
    slots = [0] * SLOTS
    slots[6] = 1
    slots[2] = 3
    entries = [bytes(ENTRY.size)] * ENTRIES
    # entry 1: keyHash 0x4963b6f6, phy 1000, timeDiff 0 (beginTimestamp was 0), prev 0
    entries[1] = bytes.fromhex("4963b6f6" "00000000000003e8" "00000000" "00000000")
    entries[2] = ENTRY.pack(h_aa, 2000, 5, 0)
    entries[3] = ENTRY.pack(h_aa, 3000, 61, 2)
    expected = (HEADER.pack(T0, T0 + 61_999, 1000, 3000, 2, 4)
                + struct.pack(f">{SLOTS}i", *slots) + b"".join(entries))
    assert data == expected
    assert (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset,
            f.hash_slot_count, f.index_count) == (T0, T0 + 61_999, 1000, 3000, 2, 4)


def test_first_entry_of_rolled_file_is_relative_to_previous_end(tmp_path):
    """RocketMQ computes timeDiff before resetting the header's begin fields."""
    f = IndexFile(str(tmp_path / "f"), SLOTS, ENTRIES, end_phy_offset=5000, end_timestamp=T0)
    assert read_file(f)[:HEADER.size] == HEADER.pack(T0, T0, 5000, 5000, 0, 1)
    assert f.put_key("T", "k", 6000, T0 + 10_000)
    data = read_file(f)
    assert data[:HEADER.size] == HEADER.pack(T0 + 10_000, T0 + 10_000, 6000, 6000, 1, 2)
    entry1 = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE + 1 * INDEX_ENTRY_SIZE
    assert ENTRY.unpack_from(data, entry1) == (index_key_hash_py("T", "k"), 6000, 10, 0)
    # so its time reads back as begin + 10 s
    assert f.select_phy_offsets("T", "k", 10, T0 + 20_000, T0 + 20_000) == [6000]
    assert f.select_phy_offsets("T", "k", 10, T0, T0 + 19_999) == []
    f.close()


def test_time_diff_clamping(index_file):
    f = index_file
    assert f.put_key("T", "a", 1, T0)
    assert f.put_key("T", "b", 2, T0 - 50_000)                   # before begin: 0
    assert f.put_key("T", "c", 3, T0 + (2 ** 31 + 5) * 1000)     # huge: Integer.MAX_VALUE
    data = read_file(f)
    base = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE
    assert ENTRY.unpack_from(data, base + 2 * INDEX_ENTRY_SIZE)[2] == 0
    assert ENTRY.unpack_from(data, base + 3 * INDEX_ENTRY_SIZE)[2] == 2 ** 31 - 1


def test_min_value_hash_goes_to_slot_zero(index_file):
    f = index_file
    key = key_with_min_value_hash("TopicTest")
    assert f.put_key("TopicTest", key, 77, T0)
    data = read_file(f)
    assert struct.unpack_from(">i", data, INDEX_HEADER_SIZE)[0] == 1      # slot 0 -> entry 1
    base = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE
    assert ENTRY.unpack_from(data, base + INDEX_ENTRY_SIZE)[0] == 0
    assert f.select_phy_offsets("TopicTest", key, 10, 0, T0) == [77]


def test_non_ascii_keys(index_file):
    f = index_file
    keys = ["键🙂", "🙂", "ключ", "é", "e\u0301"]
    for i, k in enumerate(keys):
        assert f.put_key("主题", k, 100 + i, T0 + i * 1000)
    data = read_file(f)
    base = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE
    for i, k in enumerate(keys):
        assert ENTRY.unpack_from(data, base + (i + 1) * INDEX_ENTRY_SIZE)[0] == \
            java_index_key_hash("主题", k)
        assert 100 + i in f.select_phy_offsets("主题", k, 10, T0, T0 + 10_000)


# -- chains and queries -------------------------------------------------------------
def test_hash_collisions_are_all_returned_newest_first(index_file):
    f = index_file
    assert index_key_hash_py("TopicTest", "Aa") == index_key_hash_py("TopicTest", "BB")
    f.put_key("TopicTest", "Aa", 10, T0)
    f.put_key("TopicTest", "BB", 20, T0 + 1000)
    f.put_key("TopicTest", "Aa", 30, T0 + 2000)
    # the broker compares hashes only (SPEC.md §3.5)
    assert f.select_phy_offsets("TopicTest", "Aa", 10, T0, T0 + 2000) == [30, 20, 10]
    assert f.select_phy_offsets("TopicTest", "BB", 10, T0, T0 + 2000) == [30, 20, 10]


def test_same_slot_different_hash_is_chained_but_filtered(index_file):
    f = index_file
    # find keys that share a slot but not a hash
    k0 = "k0"
    slot = index_key_hash_py("T", k0) % SLOTS
    others = [f"k{i}" for i in range(1, 500)
              if index_key_hash_py("T", f"k{i}") % SLOTS == slot
              and index_key_hash_py("T", f"k{i}") != index_key_hash_py("T", k0)][:2]
    f.put_key("T", k0, 1, T0)
    f.put_key("T", others[0], 2, T0 + 1000)
    f.put_key("T", others[1], 3, T0 + 2000)
    f.put_key("T", k0, 4, T0 + 3000)
    assert f.hash_slot_count == 1
    data = read_file(f)
    base = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE
    prevs = [ENTRY.unpack_from(data, base + n * INDEX_ENTRY_SIZE)[3] for n in range(1, 5)]
    assert prevs == [0, 1, 2, 3]
    assert struct.unpack_from(">i", data, INDEX_HEADER_SIZE + slot * INDEX_HASH_SLOT_SIZE)[0] == 4
    assert f.select_phy_offsets("T", k0, 10, T0, T0 + 3000) == [4, 1]
    assert f.select_phy_offsets("T", others[0], 10, T0, T0 + 3000) == [2]


def test_query_time_window(index_file):
    f = index_file
    for i in range(6):                       # one entry per 10 s
        f.put_key("T", "k", 100 + i, T0 + i * 10_000)
    # entry times read back as T0 + timeDiff*1000: exact here
    assert f.select_phy_offsets("T", "k", 10, T0, T0 + 50_000) == [105, 104, 103, 102, 101, 100]
    assert f.select_phy_offsets("T", "k", 10, T0 + 10_000, T0 + 30_000) == [103, 102, 101]
    assert f.select_phy_offsets("T", "k", 10, T0 + 10_001, T0 + 29_999) == [102]
    assert f.select_phy_offsets("T", "k", 10, T0 + 60_000, T0 + 90_000) == []
    assert f.select_phy_offsets("T", "k", 2, T0, T0 + 50_000) == [105, 104]
    # a shared result list counts towards max_num, as in RocketMQ
    assert f.select_phy_offsets("T", "k", 3, T0, T0 + 50_000, [1, 2]) == [1, 2, 105]
    assert f.select_phy_offsets("T", "other", 10, T0, T0 + 50_000) == []


def test_query_stops_at_entry_before_begin(index_file):
    """The chain is cut at the first entry older than ``begin``, even if later ones match."""
    f = index_file
    f.put_key("T", "k", 1, T0 + 50_000)      # becomes begin; timeDiff 0
    f.put_key("T", "k", 2, T0)               # before begin: clamped to 0 -> reads T0+50 s
    f.put_key("T", "k", 3, T0 + 60_000)
    assert f.select_phy_offsets("T", "k", 10, T0 + 50_000, T0 + 60_000) == [3, 2, 1]
    assert f.select_phy_offsets("T", "k", 10, T0 + 55_000, T0 + 60_000) == [3]


def test_is_time_matched(index_file):
    f = index_file
    f.put_key("T", "k", 1, 1000)
    f.put_key("T", "k", 2, 5000)
    assert f.is_time_matched(0, 10_000)          # covers the file
    assert f.is_time_matched(2000, 3000)         # inside
    assert f.is_time_matched(5000, 9000)         # begin on the end edge
    assert f.is_time_matched(0, 1000)            # end on the begin edge
    assert not f.is_time_matched(0, 999)
    assert not f.is_time_matched(5001, 9000)


def test_stale_slot_value_is_ignored(index_file):
    """A slot value > indexCount (left over, torn) is treated as empty."""
    f = index_file
    slot = index_key_hash_py("T", "k") % SLOTS
    f.mapped_file.write_at(INDEX_HEADER_SIZE + slot * INDEX_HASH_SLOT_SIZE, struct.pack(">i", 9))
    assert f.put_key("T", "k", 5, T0)
    assert f.hash_slot_count == 1
    base = INDEX_HEADER_SIZE + SLOTS * INDEX_HASH_SLOT_SIZE
    assert ENTRY.unpack_from(read_file(f), base + INDEX_ENTRY_SIZE)[3] == 0
    assert f.select_phy_offsets("T", "k", 10, T0, T0) == [5]


# -- capacity, batches, lifecycle ---------------------------------------------------
def test_full_file(tmp_path):
    f = IndexFile(str(tmp_path / "f"), SLOTS, 4)           # entries 1..3 usable
    assert [f.put_key("T", f"k{i}", i, T0 + i) for i in range(4)] == [True, True, True, False]
    assert f.is_write_full() and f.index_count == 4
    assert f.end_phy_offset == 2
    f.close()


def test_put_hashes_matches_put_key(tmp_path):
    import array
    a = IndexFile(str(tmp_path / "a"), SLOTS, ENTRIES)
    b = IndexFile(str(tmp_path / "b"), SLOTS, ENTRIES)
    keys = [f"key-{i}" for i in range(40)]
    for i, k in enumerate(keys):
        a.put_key("T", k, i * 100, T0 + i * 777)
    hashes = array.array("i", [index_key_hash_py("T", k) for k in keys])
    phys = array.array("q", [i * 100 for i in range(40)])
    tss = array.array("q", [T0 + i * 777 for i in range(40)])
    assert b.put_hashes(hashes, phys, tss) == ENTRIES - 1      # stops when full
    assert read_file(a) == read_file(b)
    with pytest.raises(ValueError):
        b.put_hashes(hashes, phys[:3], tss)
    c = IndexFile(str(tmp_path / "c"), SLOTS, ENTRIES)
    with pytest.raises(ValueError, match="negative key hash"):
        c.put_hashes(array.array("i", [1, -1]), phys[:2], tss[:2])
    assert c.index_count == 2
    for f in (a, b, c):
        f.close()


def test_reload_from_disk(tmp_path):
    path = str(tmp_path / "20231114221320123")
    f = IndexFile(path, SLOTS, ENTRIES)
    for i in range(10):
        f.put_key("T", f"k{i % 3}", 1000 + i, T0 + i * 1000)
    f.flush()
    before = read_file(f)
    header = (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset,
              f.hash_slot_count, f.index_count)
    f.close()
    g = IndexFile(path, SLOTS, ENTRIES)
    assert (g.begin_timestamp, g.end_timestamp, g.begin_phy_offset, g.end_phy_offset,
            g.hash_slot_count, g.index_count) == header
    assert read_file(g) == before
    assert g.select_phy_offsets("T", "k1", 10, T0, T0 + 9000) == [1007, 1004, 1001]
    assert g.put_key("T", "k1", 2000, T0 + 10_000)
    assert g.select_phy_offsets("T", "k1", 1, T0, T0 + 10_000) == [2000]
    g.close()


def test_load_resets_non_positive_index_count(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as fh:
        fh.write(HEADER.pack(T0, T0, 5, 5, 0, -3))
        fh.write(bytes(index_file_size(SLOTS, ENTRIES) - HEADER.size))
    f = IndexFile(path, SLOTS, ENTRIES)
    assert f.index_count == 1
    f.mapped_file.write_at(0, HEADER.pack(T0, T0, 5, 5, 0, 0))
    f.load()
    assert f.index_count == 1 and f.begin_phy_offset == 5
    f.close()


def test_wrong_geometry_and_bad_arguments(tmp_path):
    path = str(tmp_path / "f")
    IndexFile(path, SLOTS, ENTRIES).close()
    with pytest.raises(StoreError, match="expected"):
        IndexFile(path, SLOTS * 2, ENTRIES)
    with pytest.raises(ValueError):
        IndexFile(str(tmp_path / "g"), 0, ENTRIES)
    with pytest.raises(ValueError):
        IndexFile(str(tmp_path / "g"), SLOTS, 2 ** 31)


def test_closed_and_destroyed(tmp_path):
    f = IndexFile(tmp_path / "f", SLOTS, ENTRIES)       # PathLike accepted
    f.put_key("T", "k", 1, T0)
    f.close()
    assert f.closed
    with pytest.raises(StoreClosedError):
        f.put_key("T", "k", 2, T0)
    with pytest.raises(StoreClosedError):
        f.select_phy_offsets("T", "k", 10, 0, T0)
    with pytest.raises(StoreClosedError):
        f.flush()
    g = IndexFile(str(tmp_path / "g"), SLOTS, ENTRIES)
    assert g.destroy() is True
    assert not os.path.exists(g.file_name)


# -- IndexService -------------------------------------------------------------------
def make_service(path, **kw) -> IndexService:
    return IndexService(str(path), max_hash_slot_num=4, max_index_num=5, **kw)   # 4 keys per file


def test_file_names():
    name = time_millis_to_file_name(T0)
    assert len(name) == 17 and name.isdigit() and name.endswith("123")
    assert file_name_to_time_millis(name) == T0
    assert file_name_to_time_millis("not-a-name") is None


def test_service_rolls_when_full(tmp_path):
    full = []
    svc = make_service(tmp_path / "index", on_file_full=full.append)
    for i in range(10):
        svc.build_index("T", [f"k{i}"], None, 100 * (i + 1), T0 + i * 1000)
    files = svc.files
    assert len(files) == 3
    names = [os.path.basename(f.file_name) for f in files]
    assert names == sorted(names) and len(set(names)) == 3 and all(len(n) == 17 for n in names)
    assert [f.index_count for f in files] == [5, 5, 3]
    # the second file started at the first one's end, then its first put reset begin
    assert files[1].begin_phy_offset == 500 and files[1].begin_timestamp == T0 + 4000
    assert files[0].end_phy_offset == 400 and files[0].end_timestamp == T0 + 3000
    assert full == [T0 + 3000, T0 + 7000]
    assert files[0].mapped_file.flushed_position == files[0].mapped_file.file_size
    r = svc.query_offset("T", "k7", 64, 0, T0 + 10_000)
    assert r.phy_offsets == [800]
    assert (r.index_last_update_timestamp, r.index_last_update_phyoffset) == (T0 + 9000, 1000)
    svc.shutdown()


def test_service_new_file_header_when_prev_full(tmp_path):
    svc = make_service(tmp_path)
    for i in range(4):
        svc.build_index("T", [f"k{i}"], None, 10 + i, T0 + i)
    new = svc.get_and_create_last_index_file()
    assert len(svc.files) == 2 and new is svc.files[-1]
    assert (new.begin_phy_offset, new.end_phy_offset) == (13, 13)
    assert (new.begin_timestamp, new.end_timestamp) == (T0 + 3, T0 + 3)
    assert svc.get_and_create_last_index_file() is new
    svc.shutdown()


def test_build_index_rules(tmp_path):
    svc = IndexService(str(tmp_path), max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    svc.build_index("T", "a  b c", "UNIQ1", 100, T0)                 # KEYS string, empty token
    svc.build_index("T", ["x"], None, 200, T0 + 1000, TRANSACTION_ROLLBACK_TYPE)
    svc.build_index("T", ["p"], None, 300, T0 + 2000, TRANSACTION_PREPARED_TYPE)
    svc.build_index("T", ["q"], None, 400, T0 + 3000, TRANSACTION_COMMIT_TYPE)
    svc.build_index("T", ["late"], None, 350, T0 + 4000)              # < endPhyOffset: skipped
    svc.build_index("T", [], "", 500, T0 + 5000)                      # empty UNIQ_KEY is indexed
    f = svc.files[-1]
    assert f.index_count == 1 + 4 + 1 + 1 + 1

    def q(k):
        return svc.query_offset("T", k, 64, 0, T0 + 10_000).phy_offsets
    assert q("a") == q("b") == q("c") == q("UNIQ1") == [100]
    assert q("x") == [] and q("late") == []
    assert q("p") == [300] and q("q") == [400] and q("") == [500]
    svc.shutdown()


def test_message_index_disabled(tmp_path):
    svc = IndexService(str(tmp_path / "index"), 4, 5, message_index_enable=False)
    svc.build_index("T", ["k"], "u", 1, T0)
    assert svc.files == [] and not os.path.exists(tmp_path / "index")


def test_query_offset_cap_and_stop_rules(tmp_path):
    svc = IndexService(str(tmp_path), max_hash_slot_num=4, max_index_num=101)   # 100 per file
    for i in range(300):
        svc.build_index("T", ["k"], None, i + 1, T0 + i * 1000)
    assert len(svc.files) == 3
    r = svc.query_offset("T", "k", 1000, 0, T0 + 10_000_000)
    assert r.phy_offsets == list(range(300, 236, -1))                 # capped at 64, newest first
    assert svc.query_offset("T", "k", 5, 0, T0 + 10_000_000).phy_offsets == [300, 299, 298, 297, 296]
    # a window inside the middle file: newest file does not match and is skipped,
    # the walk stops after the middle file (its begin < window begin)
    r = svc.query_offset("T", "k", 64, T0 + 150_000, T0 + 152_000)
    assert r.phy_offsets == [153, 152, 151]
    # window spanning the first two files
    r = svc.query_offset("T", "k", 64, T0 + 98_000, T0 + 101_000)
    assert r.phy_offsets == [102, 101, 100, 99]
    svc.shutdown()


def test_service_reload(tmp_path):
    svc = make_service(tmp_path)
    for i in range(9):
        svc.build_index("T", [f"k{i % 4}"], None, 10 * (i + 1), T0 + i * 1000)
    names = [f.file_name for f in svc.files]
    expected = {k: svc.query_offset("T", k, 64, 0, T0 + 9000).phy_offsets
                for k in ("k0", "k1", "k2", "k3")}
    svc.shutdown()
    assert svc.files == []
    again = make_service(tmp_path)
    assert again.load(True, 0)
    assert [f.file_name for f in again.files] == names
    for k, v in expected.items():
        assert again.query_offset("T", k, 64, 0, T0 + 9000).phy_offsets == v
    again.build_index("T", ["k0"], None, 1000, T0 + 20_000)
    assert again.query_offset("T", "k0", 1, 0, T0 + 20_000).phy_offsets == [1000]
    again.shutdown()


def test_abnormal_exit_drops_newer_files(tmp_path):
    svc = make_service(tmp_path)
    for i in range(12):
        svc.build_index("T", [f"k{i}"], None, 10 * (i + 1), T0 + i * 1000)
    files = svc.files
    assert len(files) == 3
    checkpoint = files[0].end_timestamp
    names = [f.file_name for f in files]
    svc.shutdown()

    ok = make_service(tmp_path)
    ok.load(True, checkpoint)              # clean exit: everything kept
    assert len(ok.files) == 3
    ok.shutdown()

    crashed = make_service(tmp_path)
    crashed.load(False, checkpoint)
    assert [f.file_name for f in crashed.files] == names[:1]
    assert os.path.exists(names[0]) and not os.path.exists(names[1]) and not os.path.exists(names[2])
    # dispatch re-indexes from the checkpoint: a new file follows the kept one
    crashed.build_index("T", ["k4"], None, 50, T0 + 4000)
    assert crashed.query_offset("T", "k4", 64, 0, T0 + 20_000).phy_offsets == [50]
    crashed.shutdown()


def test_load_empty_or_missing_dir(tmp_path):
    svc = make_service(tmp_path / "missing")
    assert svc.load(False, 0) and svc.files == []


def test_delete_expired_file(tmp_path):
    svc = make_service(tmp_path)
    for i in range(16):
        svc.build_index("T", [f"k{i}"], None, 10 * (i + 1), T0 + i * 1000)
    files = svc.files
    assert [f.end_phy_offset for f in files] == [40, 80, 120, 160]
    assert svc.delete_expired_file(40) == 0                # endPhyOffset 40 is not < 40
    assert svc.delete_expired_file(81) == 2
    assert [f.end_phy_offset for f in svc.files] == [120, 160]
    assert not os.path.exists(files[0].file_name) and not os.path.exists(files[1].file_name)
    assert svc.delete_expired_file(10 ** 12) == 1          # never the last file
    assert [f.end_phy_offset for f in svc.files] == [160]
    svc.destroy()
    assert svc.files == [] and os.listdir(tmp_path) == []


def test_unique_names_within_one_millisecond(tmp_path, monkeypatch):
    import rmq.store.index_service as mod
    monkeypatch.setattr(mod.time, "time_ns", lambda: T0 * 1_000_000)
    svc = make_service(tmp_path)
    for i in range(12):
        svc.build_index("T", [f"k{i}"], None, i + 1, T0)
    names = [os.path.basename(f.file_name) for f in svc.files]
    assert names == [time_millis_to_file_name(T0 + n) for n in range(3)]
    svc.shutdown()


def test_retry_failure_sets_sticky_error(tmp_path):
    blocker = tmp_path / "index"
    blocker.write_text("a file where the index directory should be")
    svc = IndexService(str(blocker), 4, 5, create_retry_interval_s=0)
    with pytest.raises(StoreError, match="after 3 attempts"):
        svc.build_index("T", ["k"], None, 1, T0)
    assert svc.write_index_file_error
    with pytest.raises(StoreError, match="sticky"):
        svc.build_index("T", ["k"], None, 1, T0)


# -- properties ---------------------------------------------------------------------
KEYS = st.text(min_size=1, max_size=12)
PUTS = st.lists(st.tuples(KEYS, st.integers(0, 2 ** 62), st.integers(0, 10 ** 7)),
                min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PUTS)
def test_every_put_is_found(puts):
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile(os.path.join(d, "f"), SLOTS, 64)
        for key, phy, ts in puts:
            assert f.put_key("Topic", key, phy, T0 + ts)
        end = max(T0 + ts for _, _, ts in puts)
        for key, phy, _ in puts:
            found = f.select_phy_offsets("Topic", key, len(puts) + 1, f.begin_timestamp, end)
            assert phy in found
        f.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(KEYS, min_size=1, max_size=3, unique=True),
                          st.integers(0, 5000)),
                min_size=1, max_size=40))
def test_service_every_message_is_found(messages):
    with tempfile.TemporaryDirectory() as d:
        svc = make_service(d)
        phy, ts = 0, T0
        expected = []
        for keys, gap in messages:
            phy += 100
            ts += gap
            svc.build_index("Topic", keys, None, phy, ts)
            expected.append((keys, phy))
        hits_per_hash: dict[int, int] = {}
        for keys, _ in expected:
            for k in keys:
                h = java_index_key_hash("Topic", k)
                hits_per_hash[h] = hits_per_hash.get(h, 0) + 1
        for keys, p in expected:
            for k in keys:
                if hits_per_hash[java_index_key_hash("Topic", k)] > 64:
                    continue        # colliding keys past the 64-hit cap
                assert p in svc.query_offset("Topic", k, 64, 0, 2 ** 62).phy_offsets
        svc.shutdown()
