"""Store-level primitives of master/slave replication: chunking, replica append,
truncation marker, epoch file, HA config (real files, no mocks)."""
import hashlib
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq._core import commitlog as cl
from rmq.errors import CorruptRecordError, StoreError
from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.store.commitlog import ReplicaDataError, ReplicaOffsetMismatch
from rmq.store.config import HA_TRANSFER_BATCH_SIZE_MAX, MessageStoreConfig
from rmq.store.epoch import (EPOCH_FILE, EpochEntry, EpochFile, EpochFileError, encode_entries,
                             find_consistent_point)
from rmq.store.message_store import HA_TRUNCATE_FILE, MessageStore, read_truncate_marker, write_truncate_marker

FILE = 64 * 1024
GEOM = dict(mapped_file_size_commit_log=FILE, mapped_file_size_consume_queue=20 * 128,
            max_hash_slot_num=64, max_index_num=200)
TOPICS = ("TopicA", "TopicB")


def open_store(path, **kw):
    return MessageStore(str(path), **{**GEOM, **kw})


def fill(store, n, seed=0, prefix="m", max_body=3000):
    rnd = random.Random(seed)
    for i in range(n):
        topic = TOPICS[i % 2]
        body = (b"%s-%d-" % (prefix.encode(), i)) + bytes(rnd.randrange(256) for _ in range(rnd.randrange(max_body)))
        r = store.put_message(topic, body, rnd.randrange(3), tags=f"T{i % 3}", keys=[f"{prefix}{i}"])
        assert r.status is PutMessageStatus.PUT_OK, r.remark


def replicate(master, slave, start=None, max_bytes=32 * 1024):
    """Copy the master's CommitLog to the slave chunk by chunk; returns chunks sent."""
    mfq = master.commitlog.mapped_file_queue
    off = slave.get_max_phy_offset()
    if start is not None and not slave.commitlog.mapped_file_queue.files:
        off = start
    chunks = 0
    while off < master.get_max_phy_offset():
        mf = mfq.find_mapped_file_by_offset(off)
        pos = off - mf.file_from_offset
        end = cl.replica_chunk_end(mf, pos, mf.wrote_position, max_bytes)
        assert end > pos
        off = slave.apply_replica(off, mf.read(pos, end - pos))
        chunks += 1
    return chunks


def file_digests(store):
    return {os.path.basename(mf.file_name): hashlib.sha256(mf.read(0, mf.file_size)).hexdigest()
            for mf in store.commitlog.mapped_file_queue.files}


def assert_same_commitlog(master, slave):
    m, s = file_digests(master), file_digests(slave)
    assert s and set(s) <= set(m)
    assert {k: m[k] for k in s} == s
    assert slave.get_max_phy_offset() == master.get_max_phy_offset()


def queue_contents(store):
    out = {}
    for (topic, qid), cq in sorted(store.consume_queue_table.items()):
        off, msgs = cq.get_min_offset_in_queue(), []
        while True:
            res = store.get_messages("g", topic, qid, off, 32)
            if res.status is not GetMessageStatus.FOUND:
                break
            msgs.extend((m.queue_offset, m.commitlog_offset, m.body, m.tags) for m in res.messages())
            off = res.next_begin_offset
        out[(topic, qid)] = msgs
    return out


@pytest.fixture
def pair(tmp_path):
    stores = []

    def make(name, **kw):
        s = open_store(tmp_path / name, **kw)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()


# -- replica_chunk_end ---------------------------------------------------------------------------
def test_chunk_end_whole_records_within_budget(pair):
    m = pair("m")
    fill(m, 300)
    files = m.commitlog.mapped_file_queue.files
    assert len(files) >= 3
    mf = files[0]
    ends, pos = [], 0
    while pos < mf.file_size:
        end = cl.replica_chunk_end(mf, pos, mf.wrote_position, 4096)
        assert end > pos
        if end < mf.file_size:
            assert end - pos <= 4096 or cl.check_message(mf.read(pos, end - pos), 0, False)[1] == end - pos
        ends.append(end)
        pos = end
    assert ends[-1] == mf.file_size
    # every cut is a record boundary: a chunk decodes as whole records
    prev = 0
    for e in ends:
        data = mf.read(prev, e - prev)
        if e == mf.file_size:
            continue      # the last chunk may end with the blank
        assert len(cl.decode_records(data)) >= 1
        prev = e


def test_chunk_end_limits_and_errors(pair):
    m = pair("m")
    fill(m, 5, max_body=100)
    mf = m.commitlog.mapped_file_queue.files[-1]
    wrote = mf.wrote_position
    assert cl.replica_chunk_end(mf, wrote, wrote, 1 << 20) == wrote          # nothing readable
    first = cl.check_message(mf.read(0, wrote), 0)[1]
    assert cl.replica_chunk_end(mf, 0, wrote, 1) == first                    # one record goes alone
    assert cl.replica_chunk_end(mf, 0, first - 1, 1 << 20) == 0              # half a record is not readable
    assert cl.replica_chunk_end(mf, 0, wrote, 1 << 20) == wrote
    for bad in ((-1, wrote), (0, FILE + 1), (FILE + 1, FILE), (0, -1)):
        with pytest.raises(ValueError):
            cl.replica_chunk_end(mf, bad[0], bad[1], 100)
    with pytest.raises(ValueError):
        cl.replica_chunk_end(mf, 0, wrote, 0)


def test_chunk_end_blank_goes_with_the_file_end(pair):
    m = pair("m")
    fill(m, 200)
    mf = m.commitlog.mapped_file_queue.files[0]
    end, result, count, _ = cl.scan_valid(mf, 0, True)
    assert result == "BLANK"
    # walk from the last record: it and the blank go together when the budget allows
    assert cl.replica_chunk_end(mf, end, mf.file_size, 1) == mf.file_size      # the blank alone
    assert cl.replica_chunk_end(mf, 0, mf.file_size, FILE) == mf.file_size
    # readable_pos at the blank's position: the blank is not readable yet
    assert cl.replica_chunk_end(mf, end, end, FILE) == end


def test_chunk_end_reports_damage_below_readable(pair):
    m = pair("m")
    fill(m, 5, max_body=100)
    mf = m.commitlog.mapped_file_queue.files[-1]
    first = cl.check_message(mf.read(0, 200), 0, False)[1]
    mf.write_at(first + 4, b"\0\0\0\0")          # magic of the second record
    with pytest.raises(CorruptRecordError, match=str(first)):
        cl.replica_chunk_end(mf, 0, mf.wrote_position, 1 << 20)


# -- append_replica / apply_replica -------------------------------------------------------------------
def test_replicate_whole_log_byte_identical_and_dispatch_matches(pair):
    m = pair("m")
    s = pair("s", broker_role="SLAVE")
    fill(m, 400)
    m.dispatch()
    assert len(m.commitlog.mapped_file_queue.files) >= 4
    assert replicate(m, s) > 4
    assert_same_commitlog(m, s)
    assert s.commitlog.last_store_timestamp == m.commitlog.last_store_timestamp
    s.dispatch()
    assert queue_contents(s) == queue_contents(m)
    # the IndexFiles were built too
    assert len(s.query_message("TopicA", "m10").records) == 1
    # promotion: the slave's queue table was stale, rebuilding gives the master's
    assert s.topic_queue_table != m.topic_queue_table
    assert s.recover_topic_queue_table() == m.topic_queue_table


def test_replicate_incrementally_while_master_writes(pair):
    m = pair("m")
    s = pair("s")
    for round_ in range(6):
        fill(m, 60, seed=round_, prefix=f"r{round_}-")
        replicate(m, s, max_bytes=7000)
        assert_same_commitlog(m, s)
    m.dispatch()
    s.dispatch()
    assert queue_contents(s) == queue_contents(m)


def test_replicate_from_master_min_offset_and_reopen(pair, tmp_path):
    m = pair("m")
    fill(m, 400)
    m.dispatch()
    m.delete_expired_commitlog_files(0, 0, True, 2)
    start = m.get_min_phy_offset()
    assert start > 0
    s = open_store(tmp_path / "s")
    replicate(m, s, start=start)
    assert s.get_min_phy_offset() == start
    assert_same_commitlog(m, s)
    s.dispatch()
    m.delete_expired_queue_files(start)
    assert queue_contents(s) == {k: v for k, v in queue_contents(m).items() if v}
    s.shutdown()
    s = pair("s")                          # clean reopen of a CommitLog starting above 0
    assert s.get_min_phy_offset() == start and s.get_max_phy_offset() == m.get_max_phy_offset()
    fill(m, 50, seed=9, prefix="late")
    replicate(m, s)
    assert_same_commitlog(m, s)


def test_empty_store_takes_only_a_file_boundary(pair):
    m = pair("m")
    s = pair("s")
    fill(m, 10, max_body=50)
    mf = m.commitlog.mapped_file_queue.files[0]
    first = cl.check_message(mf.read(0, 200), 0)[1]
    second = cl.check_message(mf.read(first, 200), 0)[1]
    with pytest.raises(ReplicaOffsetMismatch) as ei:
        s.apply_replica(first, mf.read(first, second))
    assert ei.value.expected == 0 and ei.value.got == first
    assert not s.commitlog.mapped_file_queue.files
    assert s.apply_replica(0, b"") == 0


def test_offset_mismatch_corruption_and_file_span_write_nothing(pair):
    m = pair("m")
    s = pair("s")
    fill(m, 200)
    mf0 = m.commitlog.mapped_file_queue.files[0]
    half = cl.replica_chunk_end(mf0, 0, mf0.wrote_position, FILE // 2)
    assert s.apply_replica(0, mf0.read(0, half)) == half
    before = file_digests(s)
    nxt = cl.replica_chunk_end(mf0, half, mf0.wrote_position, 8192)
    chunk = mf0.read(half, nxt - half)

    with pytest.raises(ReplicaOffsetMismatch, match=f"{half}") as ei:
        s.apply_replica(half + 1, chunk)
    assert (ei.value.expected, ei.value.got) == (half, half + 1)
    with pytest.raises(ReplicaOffsetMismatch):
        s.apply_replica(0, mf0.read(0, half))

    for i in (10, len(chunk) // 2, len(chunk) - 30):          # body / CRC property bytes
        bad = bytearray(chunk)
        bad[i] ^= 0x40
        with pytest.raises(ReplicaDataError) as ei:
            s.apply_replica(half, bytes(bad))
        assert ei.value.offset >= half and ei.value.result in ("BAD_CRC", "BAD_LENGTH", "BAD_MAGIC",
                                                                "TRUNCATED", "BAD_PHYSICAL_OFFSET")
        assert str(ei.value.offset) in str(ei.value)
    with pytest.raises(ReplicaDataError, match="TRUNCATED"):
        s.apply_replica(half, chunk[:-1])                      # torn last record
    # records of another position: right CRCs, wrong physical-offset field
    with pytest.raises(ReplicaDataError, match="BAD_PHYSICAL_OFFSET"):
        s.apply_replica(half, mf0.read(0, cl.replica_chunk_end(mf0, 0, mf0.wrote_position, 1)))
    # a chunk crossing into the next file is refused before anything is checked
    rest = mf0.read(half, FILE - half) + m.commitlog.mapped_file_queue.files[1].read(0, 100)
    with pytest.raises(ValueError, match="crosses"):
        s.apply_replica(half, rest)
    assert file_digests(s) == before and s.get_max_phy_offset() == half
    # and the right chunk still goes in
    assert s.apply_replica(half, chunk) == nxt


def test_blank_must_end_data_and_file(pair):
    m = pair("m")
    s = pair("s")
    fill(m, 200)
    mf0 = m.commitlog.mapped_file_queue.files[0]
    end = cl.scan_valid(mf0, 0, True)[0]
    s.apply_replica(0, mf0.read(0, end))
    with pytest.raises(ReplicaDataError, match="BAD_BLANK"):
        s.apply_replica(end, mf0.read(end, FILE - end - 8))       # blank cut short
    assert s.apply_replica(end, mf0.read(end, FILE - end)) == FILE
    assert s.commitlog.mapped_file_queue.files[-1].is_full()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 250), max_bytes=st.integers(1, 3 * FILE))
def test_hypothesis_any_chunking_gives_identical_copy(tmp_path_factory, seed, n, max_bytes):
    root = tmp_path_factory.mktemp("hyp")
    m = open_store(root / "m")
    s = open_store(root / "s")
    try:
        fill(m, n, seed=seed, max_body=seed % 4000 + 1)
        replicate(m, s, max_bytes=max_bytes)
        assert_same_commitlog(m, s)
    finally:
        m.shutdown()
        s.shutdown()


# -- truncation marker ---------------------------------------------------------------------------------
def diverge(tmp_path, extra_master=150, extra_slave=250):
    """Master and slave agree up to ``point``, then each writes its own tail."""
    m = open_store(tmp_path / "m")
    s = open_store(tmp_path / "s")
    fill(m, 150)
    replicate(m, s)
    point = s.get_max_phy_offset()
    fill(m, extra_master, seed=1, prefix="master")
    fill(s, extra_slave, seed=2, prefix="slave")      # the slave was a master for a while
    s.dispatch()
    assert s.query_message("TopicA", "slave0").records
    return m, s, point


def test_truncate_marker_then_rereplicate_is_identical(tmp_path):
    m, s, point = diverge(tmp_path)
    assert s.get_max_phy_offset() > point + FILE           # the divergent tail spans files
    s.shutdown()
    write_truncate_marker(str(tmp_path / "s"), point)
    assert read_truncate_marker(str(tmp_path / "s")) == point
    s = open_store(tmp_path / "s")
    try:
        assert not os.path.exists(tmp_path / "s" / HA_TRUNCATE_FILE)
        assert s.get_max_phy_offset() == point
        assert not s.query_message("TopicA", "slave0").records
        replicate(m, s)
        assert_same_commitlog(m, s)
        m.dispatch()
        s.dispatch()
        assert queue_contents(s) == queue_contents(m)
        assert s.recover_topic_queue_table() == m.topic_queue_table
        assert len(s.query_message("TopicA", "master0").records) == 1
        assert len(s.query_message("TopicA", "m10").records) == 1
        # the IndexFiles holding the divergent tail were dropped, not just shadowed
        assert s.index_service.query_offset("TopicA", "slave0", 64, 0, 1 << 62).phy_offsets == []
        assert s.index_service.query_offset("TopicA", "m10", 64, 0, 1 << 62).phy_offsets == \
            m.index_service.query_offset("TopicA", "m10", 64, 0, 1 << 62).phy_offsets
    finally:
        s.shutdown()
        m.shutdown()


def test_truncate_after_crash_without_clean_shutdown(tmp_path):
    m, s, point = diverge(tmp_path)
    s.abandon()
    MessageStore.request_truncate(str(tmp_path / "s"), point)
    s = open_store(tmp_path / "s")
    try:
        assert s.get_max_phy_offset() == point
        replicate(m, s)
        assert_same_commitlog(m, s)
        s.dispatch()
        m.dispatch()
        assert queue_contents(s) == queue_contents(m)
    finally:
        s.shutdown()
        m.shutdown()


def test_marker_survives_crash_before_removal_and_is_redone(tmp_path, monkeypatch):
    m, s, point = diverge(tmp_path)
    s.shutdown()
    write_truncate_marker(str(tmp_path / "s"), point)

    class Crash(Exception):
        pass

    def crash(self):
        raise Crash()
    monkeypatch.setattr(MessageStore, "_remove_truncate_marker", crash)
    with pytest.raises(Crash):
        open_store(tmp_path / "s")
    monkeypatch.undo()
    assert read_truncate_marker(str(tmp_path / "s")) == point
    s = open_store(tmp_path / "s")
    try:
        assert read_truncate_marker(str(tmp_path / "s")) is None
        assert s.get_max_phy_offset() == point
        replicate(m, s)
        assert_same_commitlog(m, s)
        s.dispatch()
        m.dispatch()
        assert queue_contents(s) == queue_contents(m)
    finally:
        s.shutdown()
        m.shutdown()


def test_marker_at_a_file_boundary_and_beyond_the_end(tmp_path):
    m, s, point = diverge(tmp_path)
    beyond = s.get_max_phy_offset() + 12345
    before = queue_contents(s)
    s.shutdown()
    write_truncate_marker(str(tmp_path / "s"), beyond)
    s = open_store(tmp_path / "s")
    assert queue_contents(s) == before and s.get_max_phy_offset() > point
    s.shutdown()
    boundary = FILE * 2
    assert boundary < point
    write_truncate_marker(str(tmp_path / "s"), boundary)
    s = open_store(tmp_path / "s")
    try:
        assert s.get_max_phy_offset() == boundary
        assert all(e[1] < boundary for q in queue_contents(s).values() for e in q)
        replicate(m, s)
        assert_same_commitlog(m, s)
    finally:
        s.shutdown()
        m.shutdown()


def test_marker_zero_empties_the_store(tmp_path):
    m, s, _ = diverge(tmp_path)
    s.shutdown()
    write_truncate_marker(str(tmp_path / "s"), 0)
    s = open_store(tmp_path / "s")
    try:
        assert s.get_max_phy_offset() == 0
        assert all(not v for v in queue_contents(s).values())
        replicate(m, s)
        assert_same_commitlog(m, s)
    finally:
        s.shutdown()
        m.shutdown()


def test_malformed_marker_changes_nothing(tmp_path):
    m, s, point = diverge(tmp_path)
    m.shutdown()
    digests = file_digests(s)
    s.shutdown()
    path = tmp_path / "s" / HA_TRUNCATE_FILE
    for junk in (b"", b"12x\n", b"-5\n"):
        path.write_bytes(junk)
        with pytest.raises(StoreError, match=HA_TRUNCATE_FILE):
            open_store(tmp_path / "s")
    os.unlink(path)
    s = open_store(tmp_path / "s")
    try:
        assert file_digests(s) == digests
    finally:
        s.shutdown()
    with pytest.raises(ValueError):
        write_truncate_marker(str(tmp_path / "s"), -1)


def test_marker_truncates_the_epoch_file(tmp_path):
    m, s, point = diverge(tmp_path)
    m.shutdown()
    s.shutdown()
    ef = EpochFile(str(tmp_path / "s" / EPOCH_FILE))
    ef.load()
    ef.append(1, 0)
    ef.append(2, point)
    ef.append(3, point + 100)
    write_truncate_marker(str(tmp_path / "s"), point)
    open_store(tmp_path / "s").shutdown()
    assert EpochFile(ef.path).load().entries == [EpochEntry(1, 0)]


# -- epoch file --------------------------------------------------------------------------------------
def test_epoch_file_round_trip_and_format(tmp_path):
    path = str(tmp_path / EPOCH_FILE)
    ef = EpochFile(path).load()
    assert ef.entries == [] and ef.last_epoch() == 0 and ef.last_entry() is None
    ef.append(1, 0)
    ef.append(2, 4096)
    ef.append(5, 4096)
    with open(path) as f:
        text = f.read().splitlines()
    assert text[0] == "3" and text[2:] == ["1-0", "2-4096", "5-4096"]
    import zlib
    assert int(text[1]) == zlib.crc32(b"1-0\n2-4096\n5-4096\n")
    again = EpochFile(path).load()
    assert again.entries == [EpochEntry(1, 0), EpochEntry(2, 4096), EpochEntry(5, 4096)]
    assert again.last_epoch() == 5 and again.last_entry() == EpochEntry(5, 4096)
    assert again.end_offset_of(1, 9999) == 4096 and again.end_offset_of(5, 9999) == 9999
    assert again.end_offset_of(3, 9999) == -1
    # where a reader of an epoch stops finding what it read: the next newer epoch's start
    assert again.start_offset_after(1) == 4096 and again.start_offset_after(3) == 4096
    assert again.start_offset_after(0) == 0 and again.start_offset_after(5) == -1
    with pytest.raises(ValueError):
        again.append(5, 5000)
    with pytest.raises(ValueError):
        again.append(6, 100)
    assert again.truncate_from(4096) == 2
    assert EpochFile(path).load().entries == [EpochEntry(1, 0)]
    assert again.truncate_from(10) == 0


def test_epoch_file_bak_fallback_and_corruption(tmp_path):
    path = str(tmp_path / EPOCH_FILE)
    ef = EpochFile(path).load()
    ef.append(1, 0)
    ef.append(2, 100)                  # .bak now holds [1-0]
    with open(path, "r+") as f:
        f.seek(len(f.readline()) + len(f.readline()))
        f.write("7")                   # entry damaged: crc mismatch
    assert EpochFile(path).load().entries == [EpochEntry(1, 0)]
    with open(path + ".bak", "w") as f:
        f.write("2\n1\n1-0\n")         # size mismatch
    with pytest.raises(EpochFileError, match=EPOCH_FILE):
        EpochFile(path).load()
    with open(path, "w") as f:
        f.write(encode_entries([EpochEntry(3, 5)]))
    assert EpochFile(path).load().entries == [EpochEntry(3, 5)]


def test_find_consistent_point():
    E = EpochEntry
    # same epoch, slave behind / equal / ahead
    assert find_consistent_point([E(1, 0)], 1000, [E(1, 0)], 400) == 400
    assert find_consistent_point([E(1, 0)], 1000, [E(1, 0)], 1000) == 1000
    assert find_consistent_point([E(1, 0)], 1000, [E(1, 0)], 1500) == 1000
    # slave ahead with a divergent newer epoch (it was master briefly, unreplicated)
    master = [E(1, 0), E(3, 800)]
    slave = [E(1, 0), E(2, 900)]
    assert find_consistent_point(master, 2000, slave, 1500) == 800
    # master has newer epochs the slave never saw
    assert find_consistent_point([E(1, 0), E(2, 500), E(4, 700)], 3000, [E(1, 0), E(2, 500)], 650) == 650
    assert find_consistent_point([E(1, 0), E(2, 500), E(4, 700)], 3000, [E(1, 0), E(2, 500)], 900) == 700
    # the same epoch number with another start offset is not shared
    assert find_consistent_point([E(1, 0), E(2, 600)], 900, [E(1, 0), E(2, 500)], 900) == 500
    # empty lists: implicit epoch 0 at 0
    assert find_consistent_point([], 1000, [], 300) == 300
    assert find_consistent_point([], 200, [], 300) == 200
    assert find_consistent_point([E(0, 0), E(1, 400)], 1000, [], 900) == 400
    # nothing shared
    assert find_consistent_point([E(2, 0)], 1000, [E(1, 0)], 300) == -1
    assert find_consistent_point([E(1, 0)], 1000, [], 300) == -1


# -- config --------------------------------------------------------------------------------------------
def test_ha_config_defaults_and_properties():
    c = MessageStoreConfig()
    assert (c.ha_listen_port, c.ha_master_address, c.ha_send_heartbeat_interval, c.ha_housekeeping_interval,
            c.ha_transfer_batch_size, c.ha_slave_fallbehind_max, c.slave_read_enable, c.slave_timeout) == \
        (0, "", 5000, 20000, 32768, 256 * 1024 * 1024, False, 3000)
    c = MessageStoreConfig.from_properties({
        "haListenPort": "10912", "haMasterAddress": "10.0.0.1:10912", "haSendHeartbeatInterval": "1000",
        "haHousekeepingInterval": "3000", "haTransferBatchSize": str(HA_TRANSFER_BATCH_SIZE_MAX),
        "haSlaveFallbehindMax": "1024", "slaveReadEnable": "true", "slaveTimeout": "500"})
    assert (c.ha_listen_port, c.ha_master_address, c.ha_send_heartbeat_interval, c.ha_housekeeping_interval,
            c.ha_transfer_batch_size, c.ha_slave_fallbehind_max, c.slave_read_enable, c.slave_timeout) == \
        (10912, "10.0.0.1:10912", 1000, 3000, HA_TRANSFER_BATCH_SIZE_MAX, 1024, True, 500)
    assert not c.extra


@pytest.mark.parametrize("field,value,prop", [
    ("ha_listen_port", -1, "haListenPort"),
    ("ha_listen_port", 65536, "haListenPort"),
    ("ha_master_address", "nohost", "haMasterAddress"),
    ("ha_master_address", "h:99999", "haMasterAddress"),
    ("ha_send_heartbeat_interval", 0, "haSendHeartbeatInterval"),
    ("ha_housekeeping_interval", 0, "haHousekeepingInterval"),
    ("ha_transfer_batch_size", 0, "haTransferBatchSize"),
    ("ha_transfer_batch_size", HA_TRANSFER_BATCH_SIZE_MAX + 1, "haTransferBatchSize"),
    ("ha_slave_fallbehind_max", -1, "haSlaveFallbehindMax"),
    ("slave_timeout", 0, "slaveTimeout"),
])
def test_ha_config_limits(field, value, prop):
    with pytest.raises(ValueError, match=prop):
        MessageStoreConfig(**{field: value})


def test_the_lineage_id_is_absent_until_written_and_a_bad_file_is_an_error_not_an_id(tmp_path):
    from rmq.store.epoch import (LOG_ID_FILE, LOG_ID_MAX_LEN, EpochFileError, new_log_id, read_log_id,
                                 write_log_id)
    root = str(tmp_path)
    assert read_log_id(root) == ""
    a, b = new_log_id(), new_log_id()
    assert a != b and len(a) == 32 and int(a, 16) >= 0
    write_log_id(root, a)
    assert read_log_id(root) == a
    write_log_id(root, b)                       # replaced whole (tmp + rename)
    assert read_log_id(root) == b and not (tmp_path / (LOG_ID_FILE + ".tmp")).exists()
    for bad in ("", "x" * (LOG_ID_MAX_LEN + 1), "two words", "tab\there"):
        with pytest.raises(ValueError, match="not a CommitLog lineage id"):
            write_log_id(root, bad)
        assert read_log_id(root) == b           # a refused id changes nothing
    for text in ("\n", "x" * (LOG_ID_MAX_LEN + 1), "a b\n", "\x00\x01"):
        (tmp_path / LOG_ID_FILE).write_text(text)
        with pytest.raises(EpochFileError, match="not a CommitLog lineage id"):
            read_log_id(root)
