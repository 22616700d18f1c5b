# cython: language_level=3, embedsignature=True
"""Columnar decoding of pulled CommitLog records straight into Arrow buffers (SPEC.md §1).

``decode_columns`` turns pages of concatenated CommitLog records (what a PULL_MESSAGE
answer carries) into numpy arrays laid out as Arrow expects them (fixed-width values,
int32 offsets + one data buffer for variable-length columns, LSB validity bitmaps),
in two nogil passes over all pages (sizes, then fill), without one Python object per
message.  The values are those of ``decode_records`` + ``MessageExt``:

* ``tags`` / ``keys``: the TAGS / KEYS property, null when absent;
* ``msg_id``: UNIQ_KEY when present, else the offset message id (store host +
  commitlog offset, upper-case hex, as ``create_message_id``);
* ``properties`` (with ``include_properties``): every property but ``__CRC32#``,
  parsed as ``_parse_properties`` does (segments split on \\x02, ``name \\x01 value``
  with both non-empty, a repeated name keeps its first position and its last value).

Bodies are returned as stored: rows whose SYSFLAG has COMPRESSED are listed in
``compressed`` for the caller to inflate.  Rows whose properties or topic are not
valid UTF-8 (``decode_records`` replaces such bytes with U+FFFD) are counted in
``bad_utf8``: their string columns hold the raw bytes and the caller should use the
slow path.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcmp, memcpy, memset

import numpy as np

from rmq._core.commitlog cimport *  # RecordView, check_record, CrcMode, CheckResult
from rmq._core.hton cimport load_be32, load_be64
from rmq._core.layout cimport *

from rmq._core.commitlog import CHECK_RESULT_NAMES
from rmq.errors import CorruptRecordError

cdef const char* HEX = b"0123456789ABCDEF"


cdef inline int32_t host_len(int32_t sys_flag, int32_t bit) noexcept nogil:
    return IPV6_HOST_LENGTH if (sys_flag & bit) else IPV4_HOST_LENGTH


cdef bint utf8_valid(const unsigned char* s, int64_t n) noexcept nogil:
    """Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF), as Python's decoder."""
    cdef int64_t i = 0
    cdef unsigned char c, c1
    cdef uint64_t word
    while i < n:
        c = s[i]
        if c < 0x80:
            # ASCII: skip 8 bytes at a time while none has its high bit set (properties are mostly
            # ASCII; byte by byte this check was a pass as long as the property split)
            while i + 8 <= n:
                memcpy(&word, s + i, 8)
                if word & 0x8080808080808080ULL:
                    break
                i += 8
            if i < n and s[i] < 0x80:
                i += 1
            continue
        if c >= 0xC2 and c <= 0xDF:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c >= 0xE0 and c <= 0xEF:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
        elif c >= 0xF0 and c <= 0xF4:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return False
            i += 4
        else:
            return False
    return True


cdef struct Prop:
    int32_t kpos
    int32_t klen
    int32_t vpos
    int32_t vlen


cdef inline bint key_is(const unsigned char* p, int32_t klen, const char* name, int32_t nlen) noexcept nogil:
    return klen == nlen and memcmp(p, name, nlen) == 0


cdef inline void set_bit(uint8_t* bitmap, int64_t i) noexcept nogil:
    bitmap[i >> 3] |= <uint8_t>(1 << (i & 7))


def decode_columns(list pages, bint check_crc=False, bint include_properties=False):
    """Decode pages of concatenated CommitLog records into Arrow-ready columns.

    Parameters
    ----------
    pages : list of bytes-like
        Each holds whole records (V1 or V2 magic), as ``decode_records`` takes them.
    check_crc : bool
        Verify the body CRC and the ``__CRC32#`` whole-record CRC when present
        (``decode_records``' default is False: the broker checked them).
    include_properties : bool
        Also build the ``properties`` map columns.

    Returns
    -------
    dict
        ``n``; int64 arrays ``queue_offset``, ``commitlog_offset``,
        ``born_timestamp``, ``store_timestamp`` (ms); int32 arrays ``queue_id``,
        ``reconsume_times``, ``sys_flag``; for each of ``body``, ``topic``,
        ``tags``, ``keys``, ``msg_id``: ``<name>_offsets`` (int32, n + 1) and
        ``<name>_data`` (uint8); ``tags_validity`` / ``keys_validity`` (uint8
        LSB bitmaps) with ``tags_nulls`` / ``keys_nulls``; ``compressed`` (int64
        row indices); ``bad_utf8`` (rows); with ``include_properties``:
        ``prop_offsets`` (int32, n + 1, entries per row), ``prop_key_offsets`` /
        ``prop_key_data``, ``prop_value_offsets`` / ``prop_value_data``.

    Raises
    ------
    CorruptRecordError
        A record does not check (page, position and reason in the message).
    ValueError
        A variable-length column would exceed 2 GiB (int32 offsets).
    """
    cdef Py_ssize_t npages = len(pages)
    cdef Py_ssize_t k
    cdef const unsigned char[::1] mv
    views = []
    cdef const unsigned char** ptrs = <const unsigned char**>malloc((npages + 1) * sizeof(void*))
    cdef int64_t* lens = <int64_t*>malloc((npages + 1) * sizeof(int64_t))
    if ptrs == NULL or lens == NULL:
        free(ptrs)
        free(lens)
        raise MemoryError()
    cdef int mode = CRC_BODY if check_crc else CRC_NONE
    cdef int64_t n = 0, body_total = 0, topic_total = 0, props_total = 0, max_props = 0
    cdef int64_t pos = 0
    cdef int r = RECORD_OK
    cdef Py_ssize_t bad_page = -1
    cdef RecordView rv
    cdef const unsigned char* p
    try:
        for k in range(npages):
            mv = pages[k]
            views.append(mv)
            lens[k] = mv.shape[0]
            ptrs[k] = &mv[0] if mv.shape[0] else NULL
        # pass 1: check every record, count rows and bytes
        with nogil:
            for k in range(npages):
                pos = 0
                while pos < lens[k]:
                    r = check_record(ptrs[k] + pos, lens[k] - pos, mode, &rv)
                    if r != RECORD_OK:
                        bad_page = k
                        break
                    n += 1
                    body_total += rv.body_len
                    topic_total += rv.topic_len
                    props_total += rv.props_len
                    if rv.props_len > max_props:
                        max_props = rv.props_len
                    pos += rv.total_size
                if bad_page >= 0:
                    break
        if bad_page >= 0:
            raise CorruptRecordError(
                f"page {bad_page}: record at byte {pos} of {lens[bad_page]}: {CHECK_RESULT_NAMES.get(r, r)} "
                f"(TOTALSIZE {rv.total_size})")
        if body_total > 0x7FFFFFFF or props_total + 56 * n > 0x7FFFFFFF or topic_total > 0x7FFFFFFF:
            raise ValueError(f"{n} records with {body_total} body bytes do not fit int32 Arrow offsets")
        return _fill(ptrs, lens, npages, n, body_total, topic_total, props_total, max_props,
                     include_properties)
    finally:
        free(ptrs)
        free(lens)


cdef dict _fill(const unsigned char** ptrs, int64_t* lens, Py_ssize_t npages, int64_t n,
                int64_t body_total, int64_t topic_total, int64_t props_total, int64_t max_props,
                bint include_properties):
    cdef int64_t nbm = (n + 7) >> 3
    qo_a = np.empty(n, np.int64)
    co_a = np.empty(n, np.int64)
    bt_a = np.empty(n, np.int64)
    st_a = np.empty(n, np.int64)
    qi_a = np.empty(n, np.int32)
    rc_a = np.empty(n, np.int32)
    sf_a = np.empty(n, np.int32)
    body_o_a = np.empty(n + 1, np.int32)
    body_d_a = np.empty(body_total, np.uint8)
    topic_o_a = np.empty(n + 1, np.int32)
    topic_d_a = np.empty(topic_total, np.uint8)
    tags_o_a = np.empty(n + 1, np.int32)
    tags_d_a = np.empty(props_total, np.uint8)
    keys_o_a = np.empty(n + 1, np.int32)
    keys_d_a = np.empty(props_total, np.uint8)
    id_o_a = np.empty(n + 1, np.int32)
    id_d_a = np.empty(props_total + 56 * n, np.uint8)
    tags_v_a = np.zeros(nbm, np.uint8)
    keys_v_a = np.zeros(nbm, np.uint8)
    comp_a = np.empty(n, np.int64)
    # map columns: at most one entry per 3 property bytes
    cdef int64_t max_entries = (props_total // 3 + 1) if include_properties else 0
    po_a = np.empty(n + 1 if include_properties else 0, np.int32)
    pko_a = np.empty(max_entries + 1, np.int32)
    pkd_a = np.empty(props_total if include_properties else 0, np.uint8)
    pvo_a = np.empty(max_entries + 1, np.int32)
    pvd_a = np.empty(props_total if include_properties else 0, np.uint8)

    cdef int64_t[::1] qo = qo_a, co = co_a, bt = bt_a, st = st_a, comp = comp_a
    cdef int32_t[::1] qi = qi_a, rc = rc_a, sf = sf_a
    cdef int32_t[::1] body_o = body_o_a, topic_o = topic_o_a, tags_o = tags_o_a, keys_o = keys_o_a
    cdef int32_t[::1] id_o = id_o_a, po = po_a, pko = pko_a, pvo = pvo_a
    cdef uint8_t[::1] body_d = body_d_a, topic_d = topic_d_a, tags_d = tags_d_a, keys_d = keys_d_a
    cdef uint8_t[::1] id_d = id_d_a, tags_v = tags_v_a, keys_v = keys_v_a, pkd = pkd_a, pvd = pvd_a
    # raw pointers (empty arrays: a dummy, never written)
    cdef uint8_t dummy[8]
    cdef uint8_t* bd = &body_d[0] if body_total else dummy
    cdef uint8_t* td = &topic_d[0] if topic_total else dummy
    cdef uint8_t* gd = &tags_d[0] if props_total else dummy
    cdef uint8_t* kd = &keys_d[0] if props_total else dummy
    cdef uint8_t* idd = &id_d[0] if (props_total + 56 * n) else dummy
    cdef uint8_t* tv = &tags_v[0] if nbm else dummy
    cdef uint8_t* kv = &keys_v[0] if nbm else dummy
    cdef uint8_t* pk = &pkd[0] if (include_properties and props_total) else dummy
    cdef uint8_t* pv = &pvd[0] if (include_properties and props_total) else dummy
    cdef int32_t* pko_p = &pko[0]
    cdef int32_t* pvo_p = &pvo[0]
    cdef Prop* ents = <Prop*>malloc((max_props // 3 + 2) * sizeof(Prop))
    if ents == NULL:
        raise MemoryError()

    cdef int64_t i = 0, ncomp = 0, nbad = 0, tags_nulls = 0, keys_nulls = 0, nent = 0
    cdef int32_t bo = 0, to = 0, go = 0, ko = 0, io = 0, pko_off = 0, pvo_off = 0
    cdef Py_ssize_t k
    cdef int64_t pos
    cdef RecordView rv
    cdef const unsigned char* p
    cdef const unsigned char* props
    cdef const unsigned char* hit
    cdef int32_t stp, sh, plen, start, end, sep, klen, vlen, j, e, ne
    cdef int32_t tags_pos, tags_len, keys_pos, keys_len, uniq_pos, uniq_len
    cdef bint bad
    body_o[0] = topic_o[0] = tags_o[0] = keys_o[0] = id_o[0] = 0
    pko_p[0] = pvo_p[0] = 0
    if include_properties:
        po[0] = 0
    try:
        with nogil:
            for k in range(npages):
                pos = 0
                while pos < lens[k]:
                    p = ptrs[k] + pos
                    check_record(p, lens[k] - pos, CRC_NONE, &rv)     # checked in pass 1
                    pos += rv.total_size
                    stp = MSG_BORN_HOST_OFFSET + host_len(rv.sys_flag, BORNHOST_V6_FLAG)
                    sh = host_len(rv.sys_flag, STOREHOSTADDRESS_V6_FLAG)
                    qo[i] = rv.queue_offset
                    co[i] = rv.physical_offset
                    bt[i] = load_be64(p + MSG_BORN_TIMESTAMP_OFFSET)
                    st[i] = rv.store_timestamp
                    qi[i] = rv.queue_id
                    rc[i] = load_be32(p + stp + 8 + sh)
                    sf[i] = rv.sys_flag
                    if rv.sys_flag & COMPRESSED_FLAG:
                        comp[ncomp] = i
                        ncomp += 1
                    if rv.body_len:
                        memcpy(bd + bo, p + rv.body_pos, rv.body_len)
                        bo += rv.body_len
                    body_o[i + 1] = bo
                    if rv.topic_len:
                        memcpy(td + to, p + rv.topic_pos, rv.topic_len)
                        to += rv.topic_len
                    topic_o[i + 1] = to
                    # properties: segments split on \x02, "name \x01 value", both non-empty
                    props = p + rv.props_pos
                    plen = rv.props_len
                    bad = not utf8_valid(props, plen) or not utf8_valid(p + rv.topic_pos, rv.topic_len)
                    if bad:
                        nbad += 1
                    tags_pos = keys_pos = uniq_pos = -1
                    tags_len = keys_len = uniq_len = 0
                    ne = 0
                    start = 0
                    while start < plen:
                        # the segment's end and its first name-value separator, by memchr
                        hit = <const unsigned char*>memchr(props + start, PROPERTY_SEPARATOR, plen - start)
                        end = plen if hit == NULL else <int32_t>(hit - props)
                        hit = <const unsigned char*>memchr(props + start, NAME_VALUE_SEPARATOR, end - start)
                        sep = -1 if hit == NULL else <int32_t>(hit - props)
                        if sep > start and sep < end - 1:
                            klen = sep - start
                            vlen = end - sep - 1
                            if key_is(props + start, klen, b"TAGS", 4):
                                tags_pos = sep + 1
                                tags_len = vlen
                            elif key_is(props + start, klen, b"KEYS", 4):
                                keys_pos = sep + 1
                                keys_len = vlen
                            elif key_is(props + start, klen, b"UNIQ_KEY", 8):
                                uniq_pos = sep + 1
                                uniq_len = vlen
                            if include_properties and not key_is(props + start, klen, b"__CRC32#", 8):
                                # a repeated name keeps its first place and takes the last value (dict)
                                e = -1
                                for j in range(ne):
                                    if ents[j].klen == klen and memcmp(props + ents[j].kpos, props + start,
                                                                       klen) == 0:
                                        e = j
                                        break
                                if e < 0:
                                    e = ne
                                    ne += 1
                                    ents[e].kpos = start
                                    ents[e].klen = klen
                                ents[e].vpos = sep + 1
                                ents[e].vlen = vlen
                        start = end + 1
                    # tags and keys: two same-shape blocks on purpose; folding them into an inline
                    # helper cost 15-20 % of 1 KiB pages_to_batch (bench_spark.py --micro)
                    if tags_pos >= 0:
                        memcpy(gd + go, props + tags_pos, tags_len)
                        go += tags_len
                        set_bit(tv, i)
                    else:
                        tags_nulls += 1
                    tags_o[i + 1] = go
                    if keys_pos >= 0:
                        memcpy(kd + ko, props + keys_pos, keys_len)
                        ko += keys_len
                        set_bit(kv, i)
                    else:
                        keys_nulls += 1
                    keys_o[i + 1] = ko
                    if uniq_pos >= 0:
                        memcpy(idd + io, props + uniq_pos, uniq_len)
                        io += uniq_len
                    else:
                        # offset msg id: store host (ip + port) + physical offset, upper-case hex
                        for j in range(sh):
                            idd[io] = HEX[p[stp + 8 + j] >> 4]
                            idd[io + 1] = HEX[p[stp + 8 + j] & 15]
                            io += 2
                        for j in range(8):
                            idd[io] = HEX[p[MSG_PHYSICAL_OFFSET_OFFSET + j] >> 4]
                            idd[io + 1] = HEX[p[MSG_PHYSICAL_OFFSET_OFFSET + j] & 15]
                            io += 2
                    id_o[i + 1] = io
                    if include_properties:
                        for j in range(ne):
                            memcpy(pk + pko_off, props + ents[j].kpos, ents[j].klen)
                            pko_off += ents[j].klen
                            memcpy(pv + pvo_off, props + ents[j].vpos, ents[j].vlen)
                            pvo_off += ents[j].vlen
                            nent += 1
                            pko_p[nent] = pko_off
                            pvo_p[nent] = pvo_off
                        po[i + 1] = <int32_t>nent
                    i += 1
    finally:
        free(ents)
    out = {
        "n": n,
        "queue_offset": qo_a, "commitlog_offset": co_a, "born_timestamp": bt_a, "store_timestamp": st_a,
        "queue_id": qi_a, "reconsume_times": rc_a, "sys_flag": sf_a,
        "body_offsets": body_o_a, "body_data": body_d_a,
        "topic_offsets": topic_o_a, "topic_data": topic_d_a,
        "tags_offsets": tags_o_a, "tags_data": tags_d_a[:go], "tags_validity": tags_v_a, "tags_nulls": tags_nulls,
        "keys_offsets": keys_o_a, "keys_data": keys_d_a[:ko], "keys_validity": keys_v_a, "keys_nulls": keys_nulls,
        "msg_id_offsets": id_o_a, "msg_id_data": id_d_a[:io],
        "compressed": comp_a[:ncomp], "bad_utf8": nbad,
    }
    if include_properties:
        out.update({"prop_offsets": po_a, "prop_key_offsets": pko_a[:nent + 1], "prop_key_data": pkd_a[:pko_off],
                    "prop_value_offsets": pvo_a[:nent + 1], "prop_value_data": pvd_a[:pvo_off]})
    return out


def scan_page(const unsigned char[::1] data, int64_t end_queue_offset=-1):
    """Walk the records of one pull page (no CRC checks, as ``decode_records``' default).

    Parameters
    ----------
    end_queue_offset : int
        Stop before the first record whose queue offset is >= this (-1: no limit).

    Returns
    -------
    (nbytes, count, first_queue_offset, last_queue_offset, body_bytes)
        ``nbytes``: length of the prefix of whole records kept; offsets -1 when none.

    Raises
    ------
    CorruptRecordError
        A record does not check.
    """
    cdef int64_t n = data.shape[0]
    cdef const unsigned char* p = &data[0] if n else NULL
    cdef int64_t pos = 0, count = 0, first = -1, last = -1, body = 0
    cdef int r = RECORD_OK
    cdef RecordView rv
    with nogil:
        while pos < n:
            r = check_record(p + pos, n - pos, CRC_NONE, &rv)
            if r != RECORD_OK:
                break
            if end_queue_offset >= 0 and rv.queue_offset >= end_queue_offset:
                break
            if count == 0:
                first = rv.queue_offset
            last = rv.queue_offset
            body += rv.body_len
            count += 1
            pos += rv.total_size
    if r != RECORD_OK:
        raise CorruptRecordError(f"record at byte {pos} of {n}: {CHECK_RESULT_NAMES.get(r, r)} (TOTALSIZE {rv.total_size})")
    return pos, count, first, last, body
