# cython: language_level=3, embedsignature=True
"""Reput: CommitLog records -> dispatch entries -> ConsumeQueue units + IndexFile keys.

RocketMQ's ``ReputMessageService`` + ``CommitLogDispatcher``\\ s (SPEC.md §7).
``scan_dispatch`` walks the records of one CommitLog file in one C loop and
fills column arrays (one row per record: the DispatchRequest fields) plus the
runs of consecutive records of one (topic, queueId) so that the ConsumeQueue
writer is called once per run, not per record.  ``build_index`` then puts the
UNIQ_KEY and every KEYS token of every record into an IndexFile without the GIL.
"""
from cpython cimport array
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcmp

import array as _array

from rmq._core.commitlog cimport CRC_NONE, RECORD_BLANK, RECORD_OK, RecordView, check_record, find_property
from rmq._core.index_file cimport IndexFile
from rmq._core.jhash cimport index_key_hash, java_hash
from rmq._core.layout cimport (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK)
from rmq._core.mapped_file cimport MappedFile

from rmq._core.commitlog import CHECK_RESULT_NAMES

cdef array.array _Q = _array.array("q")
cdef array.array _I = _array.array("i")

cdef const char* PROP_TAGS = b"TAGS"
cdef const char* PROP_KEYS = b"KEYS"
cdef const char* PROP_UNIQ_KEY = b"UNIQ_KEY"
cdef const char* PROP_DELAY = b"DELAY"


cdef class DispatchBatch:
    """Dispatch entries of consecutive records of one CommitLog file (DispatchRequest columns).

    Columns (one row per record, ``count`` rows): ``physical_offsets`` (bytes),
    ``sizes`` (bytes), ``tags_codes``, ``queue_ids``, ``queue_offsets`` (entries),
    ``store_timestamps`` (ms), ``sys_flags``, ``topic_ids`` (index into
    ``topics``), and record-relative positions/lengths of UNIQ_KEY and KEYS.
    ``runs`` holds ``(start_row, length)`` pairs flattened: consecutive
    records for one ConsumeQueue with consecutive queue offsets.
    """
    cdef public int64_t count
    cdef public int64_t end_position      # bytes within the file, just past the last record scanned
    cdef public str result                # OK (reached the limit), BLANK (end of file), or why it stopped
    cdef public list topics               # str, by topic id
    cdef public array.array physical_offsets, sizes, tags_codes, queue_ids, queue_offsets
    cdef public array.array store_timestamps, sys_flags, topic_ids
    cdef public array.array uniq_pos, uniq_len, keys_pos, keys_len, topic_pos, topic_len
    cdef public array.array delay_levels   # DELAY property (0 = none): SCHEDULE_TOPIC_XXXX tagsCode
    cdef public array.array runs
    cdef public MappedFile mapped_file

    def row(self, Py_ssize_t i):
        """One dispatch entry as a dict (tests, debugging)."""
        return {"topic": self.topics[self.topic_ids[i]], "queue_id": self.queue_ids[i],
                "queue_offset": self.queue_offsets[i], "physical_offset": self.physical_offsets[i],
                "size": self.sizes[i], "tags_code": self.tags_codes[i],
                "store_timestamp": self.store_timestamps[i], "sys_flag": self.sys_flags[i]}


cdef inline bint dispatched_to_cq(int32_t sys_flag) noexcept nogil:
    cdef int32_t t = sys_flag & TRANSACTION_TYPE_MASK
    return t != TRANSACTION_PREPARED_TYPE and t != TRANSACTION_ROLLBACK_TYPE


def scan_dispatch(MappedFile mf, int64_t pos, int64_t end, Py_ssize_t max_records):
    """Parse records of ``mf`` from ``pos`` up to ``end`` (bytes within the file).

    Stops at ``end``, at ``max_records``, at the end-of-file blank record
    (result ``BLANK``: continue at the next file) or at a record that does not
    check (result names why; the writer never publishes such bytes, so reput
    waits there).  No CRC check (reput does not check CRC, SPEC.md §7).

    Returns
    -------
    DispatchBatch
    """
    mf._check_open()
    if end > mf.file_size:
        end = mf.file_size
    cdef DispatchBatch db = DispatchBatch.__new__(DispatchBatch)
    cdef Py_ssize_t cap = max_records if max_records > 0 else 0
    db.mapped_file = mf
    db.physical_offsets = array.clone(_Q, cap, False)
    db.sizes = array.clone(_I, cap, False)
    db.tags_codes = array.clone(_Q, cap, False)
    db.queue_ids = array.clone(_I, cap, False)
    db.queue_offsets = array.clone(_Q, cap, False)
    db.store_timestamps = array.clone(_Q, cap, False)
    db.sys_flags = array.clone(_I, cap, False)
    db.topic_ids = array.clone(_I, cap, False)
    db.uniq_pos = array.clone(_I, cap, False)
    db.uniq_len = array.clone(_I, cap, False)
    db.keys_pos = array.clone(_I, cap, False)
    db.keys_len = array.clone(_I, cap, False)
    db.topic_pos = array.clone(_I, cap, False)
    db.topic_len = array.clone(_I, cap, False)
    db.delay_levels = array.clone(_I, cap, False)
    db.runs = array.clone(_Q, 0, False)
    db.topics = []
    cdef dict topic_ids = {}
    cdef const unsigned char* base = mf.ptr()
    cdef int64_t file_from = mf.file_from_offset
    cdef int64_t* phys = <int64_t*>db.physical_offsets.data.as_longlongs
    cdef int32_t* sizes = <int32_t*>db.sizes.data.as_ints
    cdef int64_t* tags = <int64_t*>db.tags_codes.data.as_longlongs
    cdef int32_t* qids = <int32_t*>db.queue_ids.data.as_ints
    cdef int64_t* qoffs = <int64_t*>db.queue_offsets.data.as_longlongs
    cdef int64_t* sts = <int64_t*>db.store_timestamps.data.as_longlongs
    cdef int32_t* sflags = <int32_t*>db.sys_flags.data.as_ints
    cdef int32_t* tids = <int32_t*>db.topic_ids.data.as_ints
    cdef int32_t* upos = <int32_t*>db.uniq_pos.data.as_ints
    cdef int32_t* ulen = <int32_t*>db.uniq_len.data.as_ints
    cdef int32_t* kpos = <int32_t*>db.keys_pos.data.as_ints
    cdef int32_t* klen = <int32_t*>db.keys_len.data.as_ints
    cdef int32_t* tpos = <int32_t*>db.topic_pos.data.as_ints
    cdef int32_t* tlen = <int32_t*>db.topic_len.data.as_ints
    cdef int32_t* dlev = <int32_t*>db.delay_levels.data.as_ints
    cdef int32_t k, level
    cdef Py_ssize_t n = 0
    cdef int r = RECORD_OK
    cdef RecordView rv
    cdef const unsigned char* p
    cdef const unsigned char* last_topic = NULL
    cdef int32_t last_topic_len = -1, last_tid = -1
    cdef int32_t vpos, vlen
    cdef const unsigned char* props
    cdef list runs = []
    cdef Py_ssize_t run_start = 0
    while n < cap and pos < end:
        p = base + pos
        r = check_record(p, end - pos, CRC_NONE, &rv)
        if r != RECORD_OK:
            break
        phys[n] = file_from + pos
        sizes[n] = rv.total_size
        qids[n] = rv.queue_id
        qoffs[n] = rv.queue_offset
        sts[n] = rv.store_timestamp
        sflags[n] = rv.sys_flag
        tpos[n] = rv.topic_pos
        tlen[n] = rv.topic_len
        if last_topic == NULL or rv.topic_len != last_topic_len or memcmp(p + rv.topic_pos, last_topic, rv.topic_len) != 0:
            tb = (<const char*>p)[rv.topic_pos:rv.topic_pos + rv.topic_len]
            last_tid = topic_ids.get(tb, -1)
            if last_tid < 0:
                last_tid = len(db.topics)
                topic_ids[tb] = last_tid
                db.topics.append(tb.decode("utf-8", "replace"))
            last_topic = p + rv.topic_pos
            last_topic_len = rv.topic_len
        tids[n] = last_tid
        props = p + rv.props_pos
        if find_property(props, rv.props_len, PROP_TAGS, 4, &vpos, &vlen) and vlen > 0:
            tags[n] = java_hash(props + vpos, vlen)
        else:
            tags[n] = 0
        if find_property(props, rv.props_len, PROP_UNIQ_KEY, 8, &vpos, &vlen):
            upos[n] = rv.props_pos + vpos
            ulen[n] = vlen
        else:
            upos[n] = 0
            ulen[n] = 0
        level = 0
        if find_property(props, rv.props_len, PROP_DELAY, 5, &vpos, &vlen) and 0 < vlen < 4:
            for k in range(vlen):
                if props[vpos + k] < 48 or props[vpos + k] > 57:
                    level = 0
                    break
                level = level * 10 + (props[vpos + k] - 48)
        dlev[n] = level
        if find_property(props, rv.props_len, PROP_KEYS, 4, &vpos, &vlen):
            kpos[n] = rv.props_pos + vpos
            klen[n] = vlen
        else:
            kpos[n] = 0
            klen[n] = 0
        # runs: same topic and queue, consecutive queue offsets, CQ-dispatched records
        if n > 0 and not (tids[n] == tids[n - 1] and qids[n] == qids[n - 1]
                          and qoffs[n] == qoffs[n - 1] + 1
                          and dispatched_to_cq(sflags[n]) and dispatched_to_cq(sflags[n - 1])):
            runs.append(run_start)
            runs.append(n - run_start)
            run_start = n
        pos += rv.total_size
        n += 1
    if n > run_start:
        runs.append(run_start)
        runs.append(n - run_start)
    db.count = n
    db.end_position = pos
    if r == RECORD_BLANK:
        db.end_position = mf.file_size
    db.result = CHECK_RESULT_NAMES[r] if (r != RECORD_OK) else "OK"
    for arr in (db.physical_offsets, db.sizes, db.tags_codes, db.queue_ids, db.queue_offsets,
                db.store_timestamps, db.sys_flags, db.topic_ids, db.uniq_pos, db.uniq_len,
                db.keys_pos, db.keys_len, db.topic_pos, db.topic_len, db.delay_levels):
        array.resize(arr, n)
    db.runs = _array.array("q", runs)
    return db


def run_is_dispatched(DispatchBatch db, Py_ssize_t row):
    """True when the record at ``row`` goes to a ConsumeQueue (not a prepared/rollback half)."""
    return dispatched_to_cq(db.sys_flags[row])


def build_index(DispatchBatch db, IndexFile index_file, Py_ssize_t row, Py_ssize_t key):
    """Put the keys of records ``row..count-1`` into ``index_file`` (SPEC.md §3.2).

    For each record: its UNIQ_KEY (key number 0) and every non-empty KEYS token
    (1, 2, ...), as ``topic#key`` hashes.  Rollback records are skipped, and
    records below the file's end physical offset are taken as already indexed.
    Runs without the GIL.

    Parameters
    ----------
    row, key : int
        Where to resume (from a previous call that returned because the file was full).

    Returns
    -------
    (row, key)
        ``row == db.count`` when every key is in; otherwise the file is full
        and the caller rolls to a new IndexFile and calls again with them.
    """
    cdef const unsigned char* base = db.mapped_file.ptr()
    cdef int64_t file_from = db.mapped_file.file_from_offset
    cdef Py_ssize_t n = db.count
    cdef int64_t* phys = <int64_t*>db.physical_offsets.data.as_longlongs
    cdef int64_t* sts = <int64_t*>db.store_timestamps.data.as_longlongs
    cdef int32_t* sflags = <int32_t*>db.sys_flags.data.as_ints
    cdef int32_t* upos = <int32_t*>db.uniq_pos.data.as_ints
    cdef int32_t* ulen = <int32_t*>db.uniq_len.data.as_ints
    cdef int32_t* kpos = <int32_t*>db.keys_pos.data.as_ints
    cdef int32_t* klen = <int32_t*>db.keys_len.data.as_ints
    cdef int32_t* tpos = <int32_t*>db.topic_pos.data.as_ints
    cdef int32_t* tlen = <int32_t*>db.topic_len.data.as_ints
    cdef const unsigned char* rec
    cdef const unsigned char* topic
    cdef Py_ssize_t k, s, e
    cdef int32_t h
    cdef bint full = False
    with nogil:
        while row < n:
            if (sflags[row] & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE or phys[row] < index_file.end_phy_offset:
                row += 1
                key = 0
                continue
            rec = base + (phys[row] - file_from)
            topic = rec + tpos[row]
            k = 0
            if ulen[row] > 0:
                if key <= k:
                    h = index_key_hash(topic, tlen[row], rec + upos[row], ulen[row])
                    if index_file.put_hash(h, phys[row], sts[row]) != 1:
                        full = True
                        break
                    key = k + 1
                k += 1
            s = 0
            while s < klen[row]:
                e = s
                while e < klen[row] and rec[kpos[row] + e] != 32:   # KEY_SEPARATOR " "
                    e += 1
                if e > s:
                    if key <= k:
                        h = index_key_hash(topic, tlen[row], rec + kpos[row] + s, e - s)
                        if index_file.put_hash(h, phys[row], sts[row]) != 1:
                            full = True
                            break
                        key = k + 1
                    k += 1
                s = e + 1
            if full:
                break
            row += 1
            key = 0
    return row, key
