"""ConsumeQueue (SPEC.md §2, §5.3): byte layout, put rules, recovery, deletion, search by time."""
import logging
import os
import struct
import tempfile
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq._core import consume_queue as core
from rmq._core.consume_queue import BLANK_ENTRY_SIZE, decode_entries, filter_by_tags
from rmq._core.layout import CQ_STORE_UNIT_SIZE
from rmq._core.mapped_file import MappedFile
from rmq.store.consume_queue import ConsumeQueue, round_up_mapped_file_size

UNIT = CQ_STORE_UNIT_SIZE
ENTRIES_PER_FILE = 8
FILE_SIZE = UNIT * ENTRIES_PER_FILE          # tiny files: every test rolls
MSG_SIZE = 100                               # bytes of every fake CommitLog record


def java_hash(s: str) -> int:
    """Java String.hashCode (SPEC.md §0.2), as a test oracle."""
    b = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(b), 2):
        h = (31 * h + int.from_bytes(b[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def make_cq(root, file_size=FILE_SIZE, topic="TopicTest", queue_id=0) -> ConsumeQueue:
    cq = ConsumeQueue(str(root), topic, queue_id, file_size)
    cq.load()
    cq.recover()
    return cq


def reopen(cq: ConsumeQueue, root) -> ConsumeQueue:
    cq.shutdown()
    return make_cq(root, cq.mapped_file_size, cq.topic, cq.queue_id)


def runs(n, first_phy=0, tags_code=0):
    """Arrays for ``n`` consecutive records of MSG_SIZE bytes from ``first_phy``."""
    phys = array("q", (first_phy + k * MSG_SIZE for k in range(n)))
    sizes = array("i", [MSG_SIZE] * n)
    tags = array("q", [tags_code] * n)
    return phys, sizes, tags


def fill(cq, n, first_cq_offset=0, first_phy=0):
    phys, sizes, tags = runs(n, first_phy)
    assert cq.put_batch(phys, sizes, tags, first_cq_offset) == n
    return phys


def all_entries(cq):
    """Every readable entry, read file piece by file piece."""
    out = []
    q = cq.get_min_offset_in_queue()
    while q < cq.get_max_offset_in_queue():
        raw = cq.read_raw(q, 1 << 20)
        assert raw, q
        phys, sizes, tags = decode_entries(raw)
        out.extend(zip(phys, sizes, tags))
        q += len(phys)
    return out


def file_names(cq):
    return sorted(os.listdir(cq.store_path))


# -- layout ---------------------------------------------------------------------------
def test_golden_entry_bytes(tmp_path):
    cq = make_cq(tmp_path)
    assert cq.put_message_position_info(0x0102030405060708, 0x11223344, -1, 0)
    path = tmp_path / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    assert path.stat().st_size == FILE_SIZE
    # SPEC.md §2.1: commitLogOffset 8 | size 4 | tagsCode 8, big-endian
    golden = bytes.fromhex("0102030405060708" "11223344" "ffffffffffffffff")
    assert path.read_bytes()[:UNIT] == golden
    assert cq.read_raw(0, 10) == golden
    assert cq.get_entry(0) == (0x0102030405060708, 0x11223344, -1)
    assert struct.calcsize(">qiq") == UNIT


def test_decode_matches_struct_oracle():
    entries = [(0, 1, 0), (2**63 - 1, 2**31 - 1, -(2**63)), (12345, 77, java_hash("TagA"))]
    raw = b"".join(struct.pack(">qiq", *e) for e in entries)
    phys, sizes, tags = decode_entries(raw)
    assert list(zip(phys, sizes, tags)) == entries
    assert (phys.typecode, sizes.typecode, tags.typecode) == ("q", "i", "q")
    assert decode_entries(b"") == (array("q"), array("i"), array("q"))
    with pytest.raises(ValueError):
        decode_entries(raw[:-1])


def test_mapped_file_size_rounds_up(tmp_path):
    assert round_up_mapped_file_size(21) == 40
    assert round_up_mapped_file_size(40) == 40
    assert ConsumeQueue(str(tmp_path), "T", 0).mapped_file_size == 6_000_000
    assert ConsumeQueue(str(tmp_path), "T", 0, 6_000_001).mapped_file_size == 6_000_020
    cq = make_cq(tmp_path, 50)
    assert cq.entries_per_file == 3
    fill(cq, 4)
    assert file_names(cq) == ["00000000000000000000", "00000000000000000060"]


def test_put_entries_bounds(tmp_path):
    mf = MappedFile(str(tmp_path / "00000000000000000000"), FILE_SIZE, True)
    phys, sizes, tags = runs(3)
    assert core.put_entries(mf, FILE_SIZE - 3 * UNIT, phys, sizes, tags, 0, 3) == FILE_SIZE
    with pytest.raises(ValueError):
        core.put_entries(mf, FILE_SIZE - 2 * UNIT, phys, sizes, tags, 0, 3)   # past the file
    with pytest.raises(ValueError):
        core.put_entries(mf, 0, phys, sizes, tags, 1, 3)                       # past the arrays
    with pytest.raises(ValueError):
        core.put_entries(mf, 1, phys, sizes, tags, 0, 1)                       # unaligned
    assert mf.wrote_position == 0                                              # never moved
    mf.close()
    with pytest.raises(ValueError):
        core.put_entries(mf, 0, phys, sizes, tags, 0, 1)


# -- put and read -------------------------------------------------------------------------
def test_put_read_round_trip_across_rolls(tmp_path):
    cq = make_cq(tmp_path)
    phys = fill(cq, 20)
    assert file_names(cq) == ["00000000000000000000", "00000000000000000160", "00000000000000000320"]
    assert cq.get_min_offset_in_queue() == 0
    assert cq.get_max_offset_in_queue() == 20
    assert cq.get_max_physic_offset() == 20 * MSG_SIZE
    assert [e[0] for e in all_entries(cq)] == list(phys)
    # a read never crosses the end of the file holding its start
    got = decode_entries(cq.read_raw(6, 100))[0]
    assert list(got) == [6 * MSG_SIZE, 7 * MSG_SIZE]
    # ... nor the written end
    assert len(cq.read_raw(17, 100)) == 3 * UNIT
    assert len(cq.read_raw(16, 2)) == 2 * UNIT
    assert cq.read_raw(20, 10) == b""
    assert cq.read_raw(99, 10) == b""
    assert cq.read_raw(0, 0) == b""
    assert cq.get_entry(19) == (19 * MSG_SIZE, MSG_SIZE, 0)
    assert cq.get_entry(20) is None
    assert cq.roll_next_file(0) == 8 and cq.roll_next_file(8) == 16 and cq.roll_next_file(15) == 16


def test_single_and_batch_puts_write_the_same_bytes(tmp_path):
    a = make_cq(tmp_path / "a")
    b = make_cq(tmp_path / "b")
    phys, sizes, tags = runs(19, tags_code=java_hash("TagA"))
    for k in range(19):
        assert a.put_message_position_info(phys[k], sizes[k], tags[k], k)
    assert b.put_batch(phys, sizes, tags, 0, start=0, count=11) == 11
    assert b.put_batch(phys, sizes, tags, 11, start=11) == 8
    assert all_entries(a) == all_entries(b)
    for name in file_names(a):
        assert (tmp_path / "a" / "consumequeue" / "TopicTest" / "0" / name).read_bytes() == \
            (tmp_path / "b" / "consumequeue" / "TopicTest" / "0" / name).read_bytes()


def test_put_batch_accepts_numpy(tmp_path):
    import numpy as np
    cq = make_cq(tmp_path)
    phys = np.arange(10, dtype=np.int64) * MSG_SIZE
    assert cq.put_batch(phys, np.full(10, MSG_SIZE, np.int32), np.zeros(10, np.int64), 0) == 10
    assert [e[0] for e in all_entries(cq)] == list(phys)
    assert type(cq.get_max_physic_offset()) is int


def test_put_batch_argument_checks(tmp_path):
    cq = make_cq(tmp_path)
    phys, sizes, tags = runs(4)
    with pytest.raises(ValueError):
        cq.put_batch(phys, sizes, tags, 0, start=2, count=3)
    with pytest.raises(ValueError):
        cq.put_batch(phys, sizes[:2], tags, 0)
    assert cq.put_batch(phys, sizes, tags, 0, count=0) == 0
    assert cq.get_max_offset_in_queue() == 0


# -- idempotency (SPEC.md §2.1) ----------------------------------------------------------------
def test_repeated_put_is_skipped(tmp_path):
    cq = make_cq(tmp_path)
    phys, sizes, tags = runs(12)
    assert cq.put_batch(phys, sizes, tags, 0) == 12
    before = all_entries(cq)
    # rule 1: offset + size <= max_physic_offset
    assert cq.put_batch(phys, sizes, tags, 0) == 0
    assert cq.put_message_position_info(phys[3], sizes[3], tags[3], 3)
    # rule 2: expected position below the write position (max_physic_offset forgotten)
    cq.max_physic_offset = -1
    assert cq.put_batch(phys, sizes, tags, 0) == 0
    assert cq.put_message_position_info(phys[5], sizes[5], 7, 5)
    assert all_entries(cq) == before
    assert cq.get_max_offset_in_queue() == 12


def test_overlapping_batch_writes_only_the_new_tail(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 10)
    phys, sizes, tags = runs(10, first_phy=5 * MSG_SIZE)        # entries 5..14
    assert cq.put_batch(phys, sizes, tags, 5) == 5
    assert [e[0] for e in all_entries(cq)] == [k * MSG_SIZE for k in range(15)]
    # the same overlap by position only
    cq.max_physic_offset = -1
    phys, sizes, tags = runs(6, first_phy=12 * MSG_SIZE)        # entries 12..17
    assert cq.put_batch(phys, sizes, tags, 12) == 3
    assert [e[0] for e in all_entries(cq)] == [k * MSG_SIZE for k in range(18)]


def test_gap_logs_bug_and_appends_at_write_position(tmp_path, caplog):
    cq = make_cq(tmp_path)
    fill(cq, 3)
    with caplog.at_level(logging.WARNING, logger="rmq.store.consume_queue"):
        assert cq.put_message_position_info(3 * MSG_SIZE, MSG_SIZE, 0, 5)
    assert "[BUG]" in caplog.text
    assert cq.get_max_offset_in_queue() == 4
    assert cq.get_entry(3) == (3 * MSG_SIZE, MSG_SIZE, 0)


# -- pre-blank fill (SPEC.md §2.1) -------------------------------------------------------------
@pytest.mark.parametrize("single", [True, False])
def test_pre_blank_fill_of_first_file(tmp_path, single):
    cq = make_cq(tmp_path)
    first_phy = 5000
    if single:
        assert cq.put_message_position_info(first_phy, MSG_SIZE, 9, 13)
        assert cq.put_message_position_info(first_phy + MSG_SIZE, MSG_SIZE, 9, 14)
    else:
        phys, sizes, tags = runs(2, first_phy, 9)
        assert cq.put_batch(phys, sizes, tags, 13) == 2
    assert file_names(cq) == ["00000000000000000160"]        # 13 // 8 * 8 entries * 20 bytes
    assert cq.min_logic_offset == 13 * UNIT
    assert cq.get_min_offset_in_queue() == 13
    assert cq.get_max_offset_in_queue() == 15
    raw = (tmp_path / "consumequeue" / "TopicTest" / "0" / "00000000000000000160").read_bytes()
    blank = struct.pack(">qiq", 0, BLANK_ENTRY_SIZE, 0)
    assert BLANK_ENTRY_SIZE == 2**31 - 1
    assert raw[:5 * UNIT] == blank * 5
    assert raw[5 * UNIT:7 * UNIT] == struct.pack(">qiq", first_phy, MSG_SIZE, 9) + \
        struct.pack(">qiq", first_phy + MSG_SIZE, MSG_SIZE, 9)
    assert cq.read_raw(12, 5) == b""                           # below the min offset
    assert cq.get_entry(12) is None
    assert [e[0] for e in all_entries(cq)] == [first_phy, first_phy + MSG_SIZE]
    # recovery keeps the blanks but neither exposes them nor counts them as an offset
    cq = reopen(cq, tmp_path)
    assert cq.get_min_offset_in_queue() == 13
    assert cq.get_max_offset_in_queue() == 15
    assert cq.get_max_physic_offset() == first_phy + 2 * MSG_SIZE


def test_no_pre_blank_at_file_boundary_or_offset_zero(tmp_path):
    cq = make_cq(tmp_path / "a")
    assert cq.put_message_position_info(800, MSG_SIZE, 0, 16)
    assert file_names(cq) == ["00000000000000000320"]
    assert cq.get_min_offset_in_queue() == 16
    assert cq.read_raw(16, 1) == struct.pack(">qiq", 800, MSG_SIZE, 0)
    cq0 = make_cq(tmp_path / "b")
    assert cq0.put_message_position_info(800, MSG_SIZE, 0, 0)
    assert cq0.get_min_offset_in_queue() == 0 and cq0.get_max_offset_in_queue() == 1


def test_pre_blank_after_destroy(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 10)
    cq.destroy()
    assert not os.path.exists(cq.store_path)
    assert cq.get_max_offset_in_queue() == 0 and cq.get_max_physic_offset() == -1
    phys, sizes, tags = runs(3, first_phy=10 * MSG_SIZE)
    assert cq.put_batch(phys, sizes, tags, 10) == 3
    assert cq.get_min_offset_in_queue() == 10 and cq.get_max_offset_in_queue() == 13


# -- recovery (SPEC.md §5.3) ---------------------------------------------------------------------
def test_recover_clean_queue(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 30)                   # 4 files, the last one partly written
    cq = reopen(cq, tmp_path)
    assert cq.get_max_offset_in_queue() == 30
    assert cq.get_max_physic_offset() == 30 * MSG_SIZE
    assert [e[0] for e in all_entries(cq)] == [k * MSG_SIZE for k in range(30)]
    fill(cq, 2, first_cq_offset=30, first_phy=30 * MSG_SIZE)
    assert cq.get_max_offset_in_queue() == 32


def test_recover_full_last_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 16)
    cq = reopen(cq, tmp_path)
    assert cq.get_max_offset_in_queue() == 16
    fill(cq, 1, first_cq_offset=16, first_phy=16 * MSG_SIZE)
    assert file_names(cq)[-1] == "00000000000000000320"


def test_recover_returns_max_physical_end(tmp_path):
    cq = ConsumeQueue(str(tmp_path), "T", 0, FILE_SIZE)
    cq.load()
    assert cq.recover() == -1
    fill(cq, 5)
    cq.shutdown()
    cq = ConsumeQueue(str(tmp_path), "T", 0, FILE_SIZE)
    cq.load()
    assert cq.recover() == 5 * MSG_SIZE


def test_recover_torn_tail_zeroed(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 13)
    path = os.path.join(cq.store_path, "00000000000000000160")
    cq.shutdown()
    with open(path, "r+b") as f:               # the last 2 entries never reached the disk
        f.seek(3 * UNIT)
        f.write(bytes(2 * UNIT))
    cq = make_cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 11
    assert cq.get_max_physic_offset() == 11 * MSG_SIZE
    fill(cq, 2, first_cq_offset=11, first_phy=11 * MSG_SIZE)
    assert [e[0] for e in all_entries(cq)] == [k * MSG_SIZE for k in range(13)]


def test_recover_half_written_entry_and_garbage_after_it(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 12)
    path = os.path.join(cq.store_path, "00000000000000000160")
    cq.shutdown()
    with open(path, "r+b") as f:
        f.seek(4 * UNIT)                       # entry 12: only commitLogOffset written (size 0)
        f.write(struct.pack(">q", 12 * MSG_SIZE))
        f.seek(5 * UNIT)                       # a stale, valid-looking entry after the hole
        f.write(struct.pack(">qiq", 99999, MSG_SIZE, 0))
    cq = make_cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 12
    assert cq.get_max_physic_offset() == 12 * MSG_SIZE
    with open(path, "rb") as f:
        assert f.read()[4 * UNIT:] == bytes(FILE_SIZE - 4 * UNIT)   # cut is final
    cq = reopen(cq, tmp_path)
    assert cq.get_max_offset_in_queue() == 12


def test_recover_torn_middle_file_drops_later_files(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 40)                                 # 5 files
    cq.shutdown()
    with open(os.path.join(cq.store_path, "00000000000000000480"), "r+b") as f:
        f.seek(2 * UNIT)                         # file 3 of 5 (third-last): torn at entry 26
        f.write(bytes(UNIT))
    cq = make_cq(tmp_path)
    assert file_names(cq) == ["00000000000000000000", "00000000000000000160",
                              "00000000000000000320", "00000000000000000480"]
    assert cq.get_max_offset_in_queue() == 26
    assert cq.get_max_physic_offset() == 26 * MSG_SIZE


def test_recover_scans_from_third_last_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 40)
    cq.shutdown()
    with open(os.path.join(cq.store_path, "00000000000000000000"), "r+b") as f:
        f.seek(UNIT)                             # damage in file 1 of 5 is not looked at
        f.write(bytes(UNIT))
    cq = make_cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 40


def test_recover_empty_last_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 8)
    cq.mapped_file_queue.get_last_mapped_file(0, True)    # created, crash before the write
    cq = reopen(cq, tmp_path)
    assert cq.get_max_offset_in_queue() == 8
    fill(cq, 1, first_cq_offset=8, first_phy=8 * MSG_SIZE)
    assert cq.get_max_offset_in_queue() == 9


# -- truncation (SPEC.md §5.3) ----------------------------------------------------------------------
def test_truncate_dirty_logic_files_inside_a_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 20)
    cq.truncate_dirty_logic_files(10 * MSG_SIZE + 50)     # keeps entries with phy < 1050: 0..10
    assert cq.get_max_offset_in_queue() == 11
    assert cq.get_max_physic_offset() == 11 * MSG_SIZE
    assert file_names(cq) == ["00000000000000000000", "00000000000000000160"]
    fill(cq, 3, first_cq_offset=11, first_phy=11 * MSG_SIZE)
    cq = reopen(cq, tmp_path)
    assert [e[0] for e in all_entries(cq)] == [k * MSG_SIZE for k in range(14)]


def test_truncate_dirty_logic_files_whole_files(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 20)
    cq.truncate_dirty_logic_files(8 * MSG_SIZE)           # exactly the first entry of file 2
    assert file_names(cq) == ["00000000000000000000"]
    assert cq.get_max_offset_in_queue() == 8
    assert cq.get_max_physic_offset() == 8 * MSG_SIZE
    cq.truncate_dirty_logic_files(0)                      # everything: the first file stays, empty
    assert file_names(cq) == ["00000000000000000000"]
    assert cq.get_max_offset_in_queue() == 0
    assert cq.get_max_physic_offset() == 0


def test_truncate_everything_keeps_the_offset_base(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 20)
    assert cq.delete_expired_file(16 * MSG_SIZE) == 2
    cq.truncate_dirty_logic_files(0)
    assert file_names(cq) == ["00000000000000000320"]
    assert cq.get_max_offset_in_queue() == 16
    fill(cq, 2, first_cq_offset=16, first_phy=16 * MSG_SIZE)
    cq = reopen(cq, tmp_path)
    assert cq.get_min_offset_in_queue() == 16
    assert [e[0] for e in all_entries(cq)] == [16 * MSG_SIZE, 17 * MSG_SIZE]


def test_truncate_after_the_end_keeps_everything(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 12)
    cq.truncate_dirty_logic_files(10**9)
    assert cq.get_max_offset_in_queue() == 12
    assert cq.get_max_physic_offset() == 12 * MSG_SIZE


def test_truncate_skips_an_empty_last_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 8)
    cq.mapped_file_queue.get_last_mapped_file(0, True)    # empty file 160
    cq.truncate_dirty_logic_files(5 * MSG_SIZE)
    assert file_names(cq) == ["00000000000000000000"]
    assert cq.get_max_offset_in_queue() == 5


# -- min offset and deletion (SPEC.md §2.3) ------------------------------------------------------------
def test_correct_min_offset(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 20)
    cq.correct_min_offset(3 * MSG_SIZE + 1)
    assert cq.get_min_offset_in_queue() == 4
    assert cq.read_raw(3, 1) == b""
    cq.correct_min_offset(0)
    assert cq.get_min_offset_in_queue() == 0
    cq.correct_min_offset(10**9)                          # nothing of file 1 is still needed
    assert cq.get_min_offset_in_queue() == 8


def test_offset_of_physical_offset(tmp_path):
    """The queue offset of the first entry at or after a CommitLog byte, across files (where an
    HA epoch that starts at that byte begins in this queue)."""
    cq = make_cq(tmp_path)
    assert cq.offset_of_physical_offset(0) == 0                     # empty: the end, 0
    fill(cq, 20)                                                    # entry i at phy i * MSG_SIZE
    assert cq.offset_of_physical_offset(0) == 0
    assert cq.offset_of_physical_offset(1) == 1
    assert cq.offset_of_physical_offset(7 * MSG_SIZE) == 7          # the last entry of file 0
    assert cq.offset_of_physical_offset(7 * MSG_SIZE + 1) == 8      # the first of file 1
    assert cq.offset_of_physical_offset(19 * MSG_SIZE) == 19
    assert cq.offset_of_physical_offset(19 * MSG_SIZE + 1) == 20    # past every entry: the end
    assert cq.offset_of_physical_offset(10**12) == 20
    cq.correct_min_offset(9 * MSG_SIZE)                             # file 0 no longer needed: min 8
    assert cq.get_min_offset_in_queue() == 8
    assert cq.offset_of_physical_offset(0) == 8                     # never below the first readable one


def test_delete_expired_file(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 20)
    # file 0's last entry (phy 700) < 900: deleted; file 1's (1500) is not
    assert cq.delete_expired_file(9 * MSG_SIZE) == 1
    assert file_names(cq) == ["00000000000000000160", "00000000000000000320"]
    assert cq.get_min_offset_in_queue() == 9
    assert cq.get_max_offset_in_queue() == 20
    assert cq.read_raw(8, 4) == b""
    assert decode_entries(cq.read_raw(9, 4))[0][0] == 9 * MSG_SIZE
    assert cq.delete_expired_file(9 * MSG_SIZE) == 0
    # the last file is never deleted
    assert cq.delete_expired_file(10**9) == 1
    assert file_names(cq) == ["00000000000000000320"]
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 20
    assert cq.read_raw(19, 1) == b""
    cq = reopen(cq, tmp_path)
    cq.correct_min_offset(10**9)
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 20


def test_flush_and_destroy(tmp_path):
    cq = make_cq(tmp_path)
    fill(cq, 10)
    assert cq.flush(0) is True
    assert cq.flush(0) is False
    cq.destroy()
    assert not os.path.exists(cq.store_path)
    assert cq.get_min_offset_in_queue() == 0 and cq.get_max_offset_in_queue() == 0


# -- filter by tags (SPEC.md §2.2) ----------------------------------------------------------------------------
def test_java_hash_oracle():
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == -(2**31)


def test_filter_by_tags(tmp_path):
    names = ["TagA", "TagB", "polygenelubricants", "", "TagA", "标签"]
    codes = [java_hash(n) if n else 0 for n in names]
    assert any(c < 0 for c in codes)
    cq = make_cq(tmp_path, 20 * 64)
    phys, sizes, _ = runs(len(names) + 1)
    # last entry: high 32 bits differ, low 32 bits are TagB's code: matches ((int) tagsCode)
    tags = array("q", codes + [(5 << 32) | (java_hash("TagB") & 0xFFFFFFFF)])
    cq.put_batch(phys, sizes, tags, 0)
    raw = cq.read_raw(0, 100)
    assert list(filter_by_tags(raw, array("i", [java_hash("TagA")]))) == [0, 4]
    assert list(filter_by_tags(raw, array("i", [java_hash("TagB"), -(2**31)]))) == [1, 2, 6]
    assert list(filter_by_tags(raw, array("i", [java_hash("标签")]))) == [5]
    assert list(filter_by_tags(raw, array("i", [java_hash("nope")]))) == []
    assert list(filter_by_tags(raw, array("i"))) == list(range(7))      # subscription "*"
    assert list(filter_by_tags(b"", array("i", [1]))) == []
    assert filter_by_tags(raw, array("i")).typecode == "i"
    with pytest.raises(ValueError):
        filter_by_tags(raw[:-3], array("i"))


@settings(max_examples=200, deadline=None)
@given(tags=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60),
       codes=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5))
def test_filter_by_tags_matches_oracle(tags, codes):
    raw = b"".join(struct.pack(">qiq", k, 1, t) for k, t in enumerate(tags))
    low32 = [struct.unpack(">i", struct.pack(">q", t)[4:])[0] for t in tags]
    codes = codes + [low32[0]] if tags and codes else codes
    want = [k for k, c in enumerate(low32) if not codes or c in codes]
    assert list(filter_by_tags(raw, array("i", codes))) == want


# -- search by time (SPEC.md §2.3) ------------------------------------------------------------------------
BASE_MS = 1_700_000_000_000


def timed_queue(root, times, first_phy=0):
    """A queue of len(times) entries whose records were stored at ``times`` (ms)."""
    cq = make_cq(root)
    phys, sizes, tags = runs(len(times), first_phy)
    cq.put_batch(phys, sizes, tags, 0)
    by_phy = {p: t for p, t in zip(phys, times)}
    calls = []

    def store_time_of(phy_offset, size):
        assert size == MSG_SIZE
        calls.append(phy_offset)
        return by_phy[phy_offset]
    return cq, store_time_of, calls


def test_offset_by_time_exact_between_before_after(tmp_path):
    times = [BASE_MS + 10 * k for k in range(30)]          # 4 files
    cq, store_time_of, calls = timed_queue(tmp_path, times)
    for k in (0, 7, 8, 15, 29):                            # exact, across file boundaries
        assert cq.get_offset_in_queue_by_time(times[k], store_time_of) == k
    assert len(calls) < 10 * 5                             # binary search, not a scan
    assert cq.get_offset_in_queue_by_time(BASE_MS + 52, store_time_of) == 5   # closer to the left
    assert cq.get_offset_in_queue_by_time(BASE_MS + 58, store_time_of) == 6   # closer to the right
    assert cq.get_offset_in_queue_by_time(BASE_MS + 55, store_time_of) == 5   # tie: left
    assert cq.get_offset_in_queue_by_time(BASE_MS - 1000, store_time_of) == 0   # before all
    assert cq.get_offset_in_queue_by_time(BASE_MS + 10**6, store_time_of) == 29  # after all


def test_offset_by_time_equal_timestamps_gives_first(tmp_path):
    times = [BASE_MS] * 3 + [BASE_MS + 5] * 9 + [BASE_MS + 9] * 4
    cq, store_time_of, _ = timed_queue(tmp_path, times)
    assert cq.get_offset_in_queue_by_time(BASE_MS + 5, store_time_of) == 3
    assert cq.get_offset_in_queue_by_time(BASE_MS + 9, store_time_of) == 12
    assert cq.get_offset_in_queue_by_time(BASE_MS + 8, store_time_of) == 12


def test_offset_by_time_skips_entries_below_commitlog_min(tmp_path):
    times = [BASE_MS + 10 * k for k in range(20)]
    cq, store_time_of, calls = timed_queue(tmp_path, times)
    min_phy = 6 * MSG_SIZE
    assert cq.get_offset_in_queue_by_time(BASE_MS, store_time_of, min_phy) == 6
    assert cq.get_offset_in_queue_by_time(BASE_MS + 100, store_time_of, min_phy) == 10
    assert min(calls) >= min_phy                            # deleted records are never read
    assert cq.get_offset_in_queue_by_time(BASE_MS, store_time_of, 10**9) == 20


def test_offset_by_time_respects_min_logic_offset_and_blanks(tmp_path):
    cq = make_cq(tmp_path)
    phys, sizes, tags = runs(6, first_phy=1000)
    cq.put_batch(phys, sizes, tags, 11)                     # pre-blank fill 8..10
    times = dict(zip(phys, (BASE_MS + k for k in range(6))))
    assert cq.get_offset_in_queue_by_time(0, lambda p, s: times[p]) == 11
    assert cq.get_offset_in_queue_by_time(BASE_MS + 3, lambda p, s: times[p]) == 14


def test_offset_by_time_empty_and_unreadable(tmp_path):
    cq = make_cq(tmp_path)
    assert cq.get_offset_in_queue_by_time(BASE_MS, lambda p, s: pytest.fail("no entries")) == 0
    fill(cq, 5)
    assert cq.get_offset_in_queue_by_time(BASE_MS, lambda p, s: -1) == 0


# -- randomised round trip ---------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(entries_per_file=st.integers(1, 9),
       batches=st.lists(st.integers(1, 30), min_size=1, max_size=12),
       first_cq_offset=st.integers(0, 40),
       redo=st.integers(0, 5),
       data=st.data())
def test_random_batches_round_trip(entries_per_file, batches, first_cq_offset, redo, data):
    total = sum(batches)
    tags_list = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=total, max_size=total))
    # a record is smaller than a 1 GiB CommitLog file: (0, INT32_MAX) is only ever a pre-blank
    size_list = data.draw(st.lists(st.integers(1, 2**30), min_size=total, max_size=total))
    phys = array("q")
    p = 0
    for s in size_list:
        phys.append(p)
        p += s
    sizes = array("i", size_list)
    tags = array("q", tags_list)
    with tempfile.TemporaryDirectory() as root:
        cq = make_cq(root, UNIT * entries_per_file)
        start = 0
        for n in batches:
            assert cq.put_batch(phys, sizes, tags, first_cq_offset + start, start, n) == n
            # a replay of the tail of what was just written is a no-op
            back = min(redo, start + n)
            assert cq.put_batch(phys, sizes, tags, first_cq_offset + start + n - back,
                                start + n - back, back) == 0
            start += n
        expected = list(zip(phys, sizes, tags))
        assert cq.get_min_offset_in_queue() == first_cq_offset
        assert cq.get_max_offset_in_queue() == first_cq_offset + total
        assert all_entries(cq) == expected
        assert cq.get_max_physic_offset() == phys[-1] + sizes[-1]
        cq = reopen(cq, root)
        assert cq.get_min_offset_in_queue() == first_cq_offset
        assert all_entries(cq) == expected
        assert cq.get_max_physic_offset() == phys[-1] + sizes[-1]
        k = data.draw(st.integers(0, total - 1))
        cq.truncate_dirty_logic_files(phys[k])
        assert cq.get_max_offset_in_queue() == first_cq_offset + k
        assert all_entries(cq) == expected[:k]
        cq.shutdown()
