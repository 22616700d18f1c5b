# cython: language_level=3, embedsignature=True
"""CommitLog records: batch encode + append, check, scan, decode (SPEC.md §1).

Every message of every topic is one record in RocketMQ's V1 layout (V2 only
for topics longer than 127 bytes).  ``append_batch`` takes a whole batch in
RocketMQ's batch encoding (SPEC.md §1.11) and writes every record, with its
physical offset, queue offset, store timestamp, body CRC and whole-record
``__CRC32#`` property, in one nogil loop.  ``check_record`` is RocketMQ's
``checkMessageAndReturnSize``; recovery and dispatch scan with it.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t
from libc.string cimport memchr, memcmp, memcpy

from array import array

from rmq._core.crc cimport rmq_crc32, rmq_crc32_combine, rmq_crc32_copy, rmq_crc32_java
from rmq._core.hton cimport load_be16, load_be32, load_be64, store_be16, store_be32, store_be64
from rmq._core.jhash cimport java_hash
from rmq._core.layout cimport *
from rmq._core.mapped_file cimport MappedFile

from rmq.errors import BatchTooLargeError, CorruptRecordError, MessageIllegalError

# AppendMessageStatus (SPEC.md §6.2), the outcomes append_batch returns
PUT_OK = 0
END_OF_FILE = 1

cdef const unsigned char* CRC32_PROPERTY = <const unsigned char*>b"__CRC32#\x01"   # 9 bytes
cdef int CRC32_PREFIX_LENGTH = 9


# -- record geometry ----------------------------------------------------------------
cdef inline int32_t host_length(int32_t sys_flag, int32_t v6_bit) noexcept nogil:
    return IPV6_HOST_LENGTH if (sys_flag & v6_bit) else IPV4_HOST_LENGTH


cdef inline int32_t store_timestamp_position(int32_t sys_flag) noexcept nogil:
    return MSG_BORN_HOST_OFFSET + host_length(sys_flag, BORNHOST_V6_FLAG)


cdef inline int32_t body_length_position(int32_t sys_flag) noexcept nogil:
    # STORETIMESTAMP 8, STOREHOST, RECONSUMETIMES 4, PREPARED_TX_OFFSET 8
    return (store_timestamp_position(sys_flag) + 8
            + host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG) + 4 + 8)


cdef inline int32_t record_length(int32_t sys_flag, int32_t body_len, int32_t topic_len,
                                  int32_t props_len) noexcept nogil:
    """calMsgLength (SPEC.md §1.2): V2 (2-byte topic length) above 127 topic bytes."""
    return (body_length_position(sys_flag) + 4 + body_len
            + (1 if topic_len <= TOPIC_MAX_LENGTH else 2) + topic_len + 2 + props_len)


cdef inline bint has_crc_property(const unsigned char* props, int32_t props_len) noexcept nogil:
    if props_len < CRC32_RESERVED_LENGTH:
        return False
    cdef const unsigned char* tail = props + props_len - CRC32_RESERVED_LENGTH
    if memcmp(tail, CRC32_PROPERTY, CRC32_PREFIX_LENGTH) != 0:
        return False
    if tail[CRC32_RESERVED_LENGTH - 1] != PROPERTY_SEPARATOR:
        return False
    if props_len > CRC32_RESERVED_LENGTH and props[props_len - CRC32_RESERVED_LENGTH - 1] != PROPERTY_SEPARATOR:
        return False
    return True


cdef const char* DIGIT_PAIRS = (b"00010203040506070809101112131415161718192021222324252627282930313233343536"
                                b"37383940414243444546474849505152535455565758596061626364656667686970717273"
                                b"74757677787980818283848586878889909192939495969798"
                                b"99")


cdef inline void write_crc_digits(unsigned char* p, int32_t crc) noexcept nogil:
    """10 ASCII digits, least significant first, zero padded (SPEC.md §1.7); two digits a step."""
    cdef uint32_t v = <uint32_t>crc
    cdef uint32_t r
    cdef int i
    for i in range(0, CRC32_DIGITS, 2):
        r = v % 100
        v = v // 100
        # DIGIT_PAIRS holds "tens, ones"; least significant first means ones, then tens
        p[i] = DIGIT_PAIRS[2 * r + 1]
        p[i + 1] = DIGIT_PAIRS[2 * r]


cdef inline int32_t read_crc_digits(const unsigned char* p) noexcept nogil:
    cdef int64_t v = 0, mult = 1
    cdef int i
    for i in range(CRC32_DIGITS):
        if p[i] < 48 or p[i] > 57:
            return -1
        v += (p[i] - 48) * mult
        mult *= 10
    if v > 0x7FFFFFFF:
        return -1
    return <int32_t>v


cdef int check_record(const unsigned char* p, int64_t avail, int crc_mode,
                      RecordView* out) noexcept nogil:
    """Parse and validate the record at ``p`` (RocketMQ checkMessageAndReturnSize).

    ``avail`` is the number of readable bytes from ``p``.  Returns a
    CheckResult; on RECORD_OK / RECORD_BLANK ``out.total_size`` is the size.
    """
    cdef int32_t total, magic, sys_flag, blp, body_len, tpos, topic_len, tlen_size, ppos, props_len
    if avail < END_FILE_MIN_BLANK_LENGTH:
        return RECORD_TRUNCATED
    total = load_be32(p + MSG_TOTAL_SIZE_OFFSET)
    magic = load_be32(p + MSG_MAGIC_CODE_OFFSET)
    out.total_size = total
    out.magic = magic
    if magic == BLANK_MAGIC_CODE:
        return RECORD_BLANK
    if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
        return RECORD_BAD_MAGIC
    if total < MSG_FIXED_LENGTH_IPV4_V1:
        return RECORD_BAD_LENGTH
    if total > avail:
        return RECORD_TRUNCATED
    sys_flag = load_be32(p + MSG_SYS_FLAG_OFFSET)
    blp = body_length_position(sys_flag)
    if blp + 4 > total:
        return RECORD_BAD_LENGTH
    body_len = load_be32(p + blp)
    if body_len < 0 or body_len > total - blp - 4:
        return RECORD_BAD_LENGTH
    tpos = blp + 4 + body_len
    if magic == MESSAGE_MAGIC_CODE:
        if tpos + 1 > total:
            return RECORD_BAD_LENGTH
        topic_len = p[tpos]
        tlen_size = 1
    else:
        if tpos + 2 > total:
            return RECORD_BAD_LENGTH
        topic_len = <uint16_t>load_be16(p + tpos)
        tlen_size = 2
    ppos = tpos + tlen_size + topic_len
    if ppos + 2 > total:
        return RECORD_BAD_LENGTH
    props_len = load_be16(p + ppos)
    if props_len < 0 or ppos + 2 + props_len != total:
        return RECORD_BAD_LENGTH
    out.sys_flag = sys_flag
    out.queue_id = load_be32(p + MSG_QUEUE_ID_OFFSET)
    out.queue_offset = load_be64(p + MSG_QUEUE_OFFSET_OFFSET)
    out.physical_offset = load_be64(p + MSG_PHYSICAL_OFFSET_OFFSET)
    out.store_timestamp = load_be64(p + store_timestamp_position(sys_flag))
    out.body_pos = blp + 4
    out.body_len = body_len
    out.topic_pos = tpos + tlen_size
    out.topic_len = topic_len
    out.props_pos = ppos + 2
    out.props_len = props_len
    cdef uint32_t body_crc, rec_crc
    if crc_mode != CRC_NONE:
        body_crc = rmq_crc32(0, p + out.body_pos, body_len)
        if <int32_t>(body_crc & 0x7FFFFFFF) != load_be32(p + MSG_BODY_CRC_OFFSET):
            return RECORD_BAD_CRC
        if has_crc_property(p + out.props_pos, props_len):
            # whole record but its last 20 bytes, reusing the body CRC (one pass over the body)
            rec_crc = rmq_crc32(0, p, out.body_pos)
            rec_crc = rmq_crc32_combine(rec_crc, body_crc, body_len)
            rec_crc = rmq_crc32(rec_crc, p + out.body_pos + body_len,
                                total - CRC32_RESERVED_LENGTH - out.body_pos - body_len)
            if <int32_t>(rec_crc & 0x7FFFFFFF) != read_crc_digits(
                    p + total - CRC32_RESERVED_LENGTH + CRC32_PREFIX_LENGTH):
                return RECORD_BAD_CRC
        elif crc_mode == CRC_STRICT:
            return RECORD_BAD_CRC
    return RECORD_OK


cdef inline int crc_mode_of(bint check_crc, bint require_prop_crc) noexcept nogil:
    if not check_crc:
        return CRC_NONE
    return CRC_STRICT if require_prop_crc else CRC_BODY


cdef int find_property(const unsigned char* props, int32_t props_len,
                       const char* name, int32_t name_len,
                       int32_t* value_pos, int32_t* value_len) noexcept nogil:
    """Find ``name`` in a properties string (SPEC.md §1.6); 1 if found.

    Segments are split on \\x02; a segment ``name \\x01 value`` matches.  The
    value position is relative to ``props``.  The separators are found with ``memchr``: the reput
    scan, four look-ups a record, 150 -> 79 ns a record with five properties against a
    byte-by-byte loop.
    """
    cdef int32_t start = 0, end
    cdef const unsigned char* sep
    while start < props_len:
        sep = <const unsigned char*>memchr(props + start, PROPERTY_SEPARATOR, props_len - start)
        end = props_len if sep == NULL else <int32_t>(sep - props)
        if (end - start > name_len and props[start + name_len] == NAME_VALUE_SEPARATOR
                and memcmp(props + start, name, name_len) == 0):
            value_pos[0] = start + name_len + 1
            value_len[0] = end - start - name_len - 1
            return 1
        start = end + 1
    return 0


# -- batch encoding (client side of SEND_BATCH_MESSAGE, SPEC.md §1.11) ---------------------
def encode_properties(dict properties):
    """Encode a properties dict: ``name \\x01 value \\x02`` per item, UTF-8 (SPEC.md §1.6).

    Raises
    ------
    MessageIllegalError
        A name or value contains the separators \\x01 / \\x02.
    """
    if not properties:
        return b""
    parts = []
    for k, v in properties.items():
        if v is None:
            continue
        k = str(k)
        v = str(v)
        if "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
            raise MessageIllegalError(f"property {k!r} contains a \\x01 or \\x02 separator")
        parts.append(f"{k}\x01{v}\x02")
    return "".join(parts).encode("utf-8")


def decode_properties(const unsigned char[::1] data):
    """Parse a properties string into a dict (SPEC.md §1.6 parsing rules).

    Accepts both the trailing-\\x02 and the 4.9.1-5.1 form.
    """
    return _parse_properties(bytes(data))


def encode_batch(messages):
    """Encode ``[(body: bytes, properties: bytes, flag: int), ...]`` in RocketMQ's batch
    encoding (SPEC.md §1.11): TOTALSIZE 4 | MAGIC 4 (0) | BODYCRC 4 (0) | FLAG 4 |
    BODYLEN 4 + BODY | PROPLEN 2 + PROPS, concatenated.

    Raises
    ------
    MessageIllegalError
        Properties longer than 32767 bytes.
    """
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t n
    for body, props, flag in messages:
        if len(props) > PROPERTIES_MAX_LENGTH:
            raise MessageIllegalError(
                f"properties are {len(props)} bytes, over the {PROPERTIES_MAX_LENGTH}-byte limit",
                "PROPERTIES_SIZE_EXCEEDED")
        total += BATCH_FIXED_LENGTH + len(body) + len(props)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    cdef const unsigned char[::1] bv
    cdef const unsigned char[::1] pv
    for body, props, flag in messages:
        bv = body
        pv = props
        p = put_batch_element(p, BATCH_FIXED_LENGTH + bv.shape[0] + pv.shape[0], <int32_t>flag,
                              &bv[0] if bv.shape[0] else NULL, bv.shape[0], pv.shape[0])
        if pv.shape[0]:
            memcpy(p, &pv[0], pv.shape[0])
        p += pv.shape[0]
    return out


cdef struct MergedProps:
    int32_t total       # bytes of the stored properties string
    int32_t sep1        # 1 if a \x02 goes between element and batch properties
    int32_t sep2        # 1 if a \x02 goes before the __CRC32# property


cdef inline MergedProps merge_props(const unsigned char* elem, int32_t elem_len,
                                    const unsigned char* extra, int32_t extra_len,
                                    bint prop_crc) noexcept nogil:
    cdef MergedProps m
    cdef int32_t mid
    cdef unsigned char last = PROPERTY_SEPARATOR
    m.sep1 = 1 if (elem_len > 0 and extra_len > 0 and elem[elem_len - 1] != PROPERTY_SEPARATOR) else 0
    mid = elem_len + m.sep1 + extra_len
    if extra_len > 0:
        last = extra[extra_len - 1]
    elif elem_len > 0:
        last = elem[elem_len - 1]
    m.sep2 = 1 if (prop_crc and mid > 0 and last != PROPERTY_SEPARATOR) else 0
    m.total = mid + m.sep2 + (CRC32_RESERVED_LENGTH if prop_crc else 0)
    return m


def validate_batch(const unsigned char[::1] batch, const unsigned char[::1] extra_props,
                   int32_t topic_len, int32_t sys_flag, int64_t max_body_size, bint prop_crc):
    """Check every element of a batch before anything is written.

    Returns
    -------
    (count, total_bytes) : (int, int)
        Number of messages and the bytes their CommitLog records will take.

    Raises
    ------
    MessageIllegalError
        Malformed element (lengths that do not add up), empty batch, body over
        ``max_body_size`` (MESSAGE_ILLEGAL) or stored properties over 32767
        bytes (PROPERTIES_SIZE_EXCEEDED).  Nothing is written.
    """
    cdef Py_ssize_t blen = batch.shape[0]
    cdef const unsigned char* b = &batch[0] if blen else NULL
    cdef const unsigned char* x = &extra_props[0] if extra_props.shape[0] else NULL
    cdef int32_t xlen = <int32_t>extra_props.shape[0]
    cdef Py_ssize_t pos = 0
    cdef int64_t count = 0, total_bytes = 0
    cdef int32_t tot, body_len, plen
    cdef MergedProps m
    while pos < blen:
        if blen - pos < BATCH_FIXED_LENGTH:
            raise MessageIllegalError(
                f"batch element #{count} at byte {pos}: {blen - pos} bytes left, "
                f"a batch element takes at least {BATCH_FIXED_LENGTH}")
        tot = load_be32(b + pos + BATCH_TOTAL_SIZE_OFFSET)
        if tot < BATCH_FIXED_LENGTH or tot > blen - pos:
            raise MessageIllegalError(
                f"batch element #{count} at byte {pos}: TOTALSIZE {tot} outside [{BATCH_FIXED_LENGTH}, {blen - pos}]")
        body_len = load_be32(b + pos + BATCH_BODY_LENGTH_OFFSET)
        if body_len < 0 or body_len > tot - BATCH_FIXED_LENGTH:
            raise MessageIllegalError(
                f"batch element #{count} at byte {pos}: body length {body_len} does not fit TOTALSIZE {tot}")
        if body_len > max_body_size:
            raise MessageIllegalError(
                f"message #{count} body is {body_len} bytes, over maxMessageSize {max_body_size}")
        plen = <uint16_t>load_be16(b + pos + BATCH_BODY_OFFSET + body_len)
        if BATCH_FIXED_LENGTH + body_len + plen != tot:
            raise MessageIllegalError(
                f"batch element #{count} at byte {pos}: properties length {plen} does not add up to TOTALSIZE {tot}")
        m = merge_props(b + pos + BATCH_BODY_OFFSET + body_len + 2, plen, x, xlen, prop_crc)
        if m.total > PROPERTIES_MAX_LENGTH:
            raise MessageIllegalError(
                f"message #{count} properties would be {m.total} bytes, over the {PROPERTIES_MAX_LENGTH}-byte limit",
                "PROPERTIES_SIZE_EXCEEDED")
        total_bytes += record_length(sys_flag, body_len, topic_len, m.total)
        pos += tot
        count += 1
    if count == 0:
        raise MessageIllegalError("empty batch: no message to store")
    return count, total_bytes


def append_batch(MappedFile mf, const unsigned char[::1] batch, const unsigned char[::1] topic,
                 int32_t queue_id, int64_t queue_offset, int32_t sys_flag,
                 int64_t born_timestamp, const unsigned char[::1] born_host,
                 const unsigned char[::1] store_host, int64_t store_timestamp,
                 const unsigned char[::1] extra_props, bint prop_crc,
                 int32_t reconsume_times, int64_t prepared_transaction_offset,
                 int64_t max_body_size, int64_t[::1] out_physical_offsets,
                 const int64_t[::1] born_timestamps=None):
    """Append a whole batch as CommitLog records at ``mf.wrote_position``.

    Parameters
    ----------
    mf : MappedFile
        The last CommitLog file.
    batch : bytes-like
        Messages in RocketMQ's batch encoding (SPEC.md §1.11); a single send is a
        batch of one.
    topic : bytes
        UTF-8 topic, 1..255 bytes (V2 record magic above 127 bytes).
    queue_id, queue_offset : int
        Queue and the queue offset (entries) of the first message.
    sys_flag : int
        SYSFLAG without the host bits (set here from the host lengths).
    born_host, store_host : bytes
        8 bytes (IPv4 + port) or 20 bytes (IPv6 + port).
    store_timestamp : int
        ms; every record of the batch gets it.
    extra_props : bytes
        Batch-level properties appended to each element's (SPEC.md §1.11).
    prop_crc : bool
        Append the ``__CRC32#`` whole-record CRC property (SPEC.md §1.7).
    max_body_size : int
        maxMessageSize, bytes.
    out_physical_offsets : int64 buffer
        Receives the physical offset of each record (length >= count).
    born_timestamps : int64 buffer, optional
        One BORNTIMESTAMP (ms) per element (length >= count), instead of ``born_timestamp`` for
        all: a re-put of many stored messages keeps each one's (the timer service).

    Returns
    -------
    (status, count, wrote_bytes, queue_offset_increment)
        status PUT_OK, or END_OF_FILE when the batch does not fit the rest of
        the file: a blank record then fills the file and nothing else is
        written; the caller rolls to the next file and appends again
        (batches never span files, as in RocketMQ).

    Raises
    ------
    MessageIllegalError
        Invalid batch, topic or hosts, or a batch larger than a whole file.
        Nothing is written.
    """
    mf._check_open()
    cdef int32_t topic_len = <int32_t>topic.shape[0]
    cdef int32_t bh_len = <int32_t>born_host.shape[0]
    cdef int32_t sh_len = <int32_t>store_host.shape[0]
    if topic_len <= 0 or topic_len > TOPIC_MAX_LENGTH_SYSTEM:
        raise MessageIllegalError(f"topic is {topic_len} bytes, must be 1..{TOPIC_MAX_LENGTH_SYSTEM}")
    if bh_len != IPV4_HOST_LENGTH and bh_len != IPV6_HOST_LENGTH:
        raise MessageIllegalError(f"born host must be {IPV4_HOST_LENGTH} or {IPV6_HOST_LENGTH} bytes, got {bh_len}")
    if sh_len != IPV4_HOST_LENGTH and sh_len != IPV6_HOST_LENGTH:
        raise MessageIllegalError(f"store host must be {IPV4_HOST_LENGTH} or {IPV6_HOST_LENGTH} bytes, got {sh_len}")
    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if bh_len == IPV6_HOST_LENGTH:
        sys_flag |= BORNHOST_V6_FLAG
    if sh_len == IPV6_HOST_LENGTH:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
    count, total_bytes = validate_batch(batch, extra_props, topic_len, sys_flag, max_body_size, prop_crc)
    if out_physical_offsets.shape[0] < count:
        raise ValueError(f"out_physical_offsets holds {out_physical_offsets.shape[0]} offsets, batch has {count}")
    cdef bint per_born = born_timestamps is not None
    if per_born and born_timestamps.shape[0] < count:
        raise MessageIllegalError(f"born_timestamps holds {born_timestamps.shape[0]} values, batch has {count}")
    cdef const int64_t* bts = &born_timestamps[0] if per_born and born_timestamps.shape[0] else NULL
    cdef int64_t file_size = mf.file_size
    if total_bytes + END_FILE_MIN_BLANK_LENGTH > file_size:
        # max_body: the share of this batch's body bytes that takes half a file (parts a producer
        # that made the batch may split it into; each then fits a fresh file)
        raise BatchTooLargeError(
            f"batch of {count} messages takes {total_bytes} bytes, more than a CommitLog file "
            f"({file_size} bytes, mappedFileSizeCommitLog) can hold",
            max(1, batch.shape[0] * (file_size // 2) // total_bytes))
    cdef int64_t wrote = mf.wrote_position
    cdef unsigned char* base = mf.ptr()
    cdef int64_t free_bytes = file_size - wrote
    if total_bytes + END_FILE_MIN_BLANK_LENGTH > free_bytes:
        store_be32(base + wrote + MSG_TOTAL_SIZE_OFFSET, <int32_t>free_bytes)
        store_be32(base + wrote + MSG_MAGIC_CODE_OFFSET, BLANK_MAGIC_CODE)
        mf.wrote_position = file_size
        return END_OF_FILE, 0, free_bytes, 0

    cdef bint count_queue = (sys_flag & TRANSACTION_TYPE_MASK) not in (TRANSACTION_PREPARED_TYPE,
                                                                      TRANSACTION_ROLLBACK_TYPE)
    cdef const unsigned char* b = &batch[0]
    cdef const unsigned char* t = &topic[0]
    cdef const unsigned char* x = &extra_props[0] if extra_props.shape[0] else NULL
    cdef int32_t xlen = <int32_t>extra_props.shape[0]
    cdef const unsigned char* bh = &born_host[0]
    cdef const unsigned char* sh = &store_host[0]
    cdef int64_t* out = &out_physical_offsets[0]
    cdef int64_t file_from = mf.file_from_offset
    cdef int32_t magic = MESSAGE_MAGIC_CODE if topic_len <= TOPIC_MAX_LENGTH else MESSAGE_MAGIC_CODE_V2
    cdef Py_ssize_t n = count
    cdef Py_ssize_t i
    cdef Py_ssize_t bpos = 0
    cdef int64_t qo = queue_offset
    cdef int32_t body_len, plen, total, q, flag, body_pos
    cdef uint32_t body_crc, rec_crc
    cdef const unsigned char* elem
    cdef unsigned char* p
    cdef MergedProps m
    with nogil:
        for i in range(n):
            elem = b + bpos
            flag = load_be32(elem + BATCH_FLAG_OFFSET)
            body_len = load_be32(elem + BATCH_BODY_LENGTH_OFFSET)
            plen = <uint16_t>load_be16(elem + BATCH_BODY_OFFSET + body_len)
            m = merge_props(elem + BATCH_BODY_OFFSET + body_len + 2, plen, x, xlen, prop_crc)
            total = record_length(sys_flag, body_len, topic_len, m.total)
            p = base + wrote
            store_be32(p + MSG_TOTAL_SIZE_OFFSET, total)
            store_be32(p + MSG_MAGIC_CODE_OFFSET, magic)
            store_be32(p + MSG_QUEUE_ID_OFFSET, queue_id)
            store_be32(p + MSG_FLAG_OFFSET, flag)
            store_be64(p + MSG_QUEUE_OFFSET_OFFSET, qo if count_queue else 0)
            store_be64(p + MSG_PHYSICAL_OFFSET_OFFSET, file_from + wrote)
            store_be32(p + MSG_SYS_FLAG_OFFSET, sys_flag)
            store_be64(p + MSG_BORN_TIMESTAMP_OFFSET, bts[i] if bts != NULL else born_timestamp)
            memcpy(p + MSG_BORN_HOST_OFFSET, bh, bh_len)
            q = MSG_BORN_HOST_OFFSET + bh_len
            store_be64(p + q, store_timestamp)
            q += 8
            memcpy(p + q, sh, sh_len)
            q += sh_len
            store_be32(p + q, reconsume_times)
            q += 4
            store_be64(p + q, prepared_transaction_offset)
            q += 8
            store_be32(p + q, body_len)
            q += 4
            body_pos = q
            # one pass over the body: copy + CRC (the whole-record CRC reuses it via combine)
            body_crc = rmq_crc32_copy(0, p + q, elem + BATCH_BODY_OFFSET, body_len)
            store_be32(p + MSG_BODY_CRC_OFFSET, <int32_t>(body_crc & 0x7FFFFFFF))
            q += body_len
            if magic == MESSAGE_MAGIC_CODE:
                p[q] = <unsigned char>topic_len
                q += 1
            else:
                store_be16(p + q, <int16_t>topic_len)
                q += 2
            memcpy(p + q, t, topic_len)
            q += topic_len
            store_be16(p + q, <int16_t>m.total)
            q += 2
            if plen:
                memcpy(p + q, elem + BATCH_BODY_OFFSET + body_len + 2, plen)
                q += plen
            if m.sep1:
                p[q] = PROPERTY_SEPARATOR
                q += 1
            if xlen:
                memcpy(p + q, x, xlen)
                q += xlen
            if m.sep2:
                p[q] = PROPERTY_SEPARATOR
                q += 1
            if prop_crc:
                memcpy(p + q, CRC32_PROPERTY, CRC32_PREFIX_LENGTH)
                # crc(record[0:total-20]) = crc(head) (+) body_crc (+) crc(tail), no second body pass
                rec_crc = rmq_crc32(0, p, body_pos)
                rec_crc = rmq_crc32_combine(rec_crc, body_crc, body_len)
                rec_crc = rmq_crc32(rec_crc, p + body_pos + body_len,
                                    total - CRC32_RESERVED_LENGTH - body_pos - body_len)
                write_crc_digits(p + q + CRC32_PREFIX_LENGTH, <int32_t>(rec_crc & 0x7FFFFFFF))
                p[q + CRC32_RESERVED_LENGTH - 1] = PROPERTY_SEPARATOR
            out[i] = file_from + wrote
            wrote += total
            bpos += load_be32(elem + BATCH_TOTAL_SIZE_OFFSET)
            if count_queue:
                qo += 1
    mf.wrote_position = wrote
    return PUT_OK, count, total_bytes, (count if count_queue else 0)


# -- scanning -------------------------------------------------------------------------------
CHECK_RESULT_NAMES = {
    RECORD_OK: "OK", RECORD_BLANK: "BLANK", RECORD_TRUNCATED: "TRUNCATED",
    RECORD_BAD_MAGIC: "BAD_MAGIC", RECORD_BAD_LENGTH: "BAD_LENGTH", RECORD_BAD_CRC: "BAD_CRC",
}


def check_message(const unsigned char[::1] data, int64_t pos=0, bint check_crc=True,
                  bint require_prop_crc=False):
    """Check the record at ``pos`` of ``data``.

    Returns
    -------
    (result, size) : (str, int)
        result is one of OK, BLANK, TRUNCATED, BAD_MAGIC, BAD_LENGTH, BAD_CRC;
        size is the record's TOTALSIZE (bytes; the rest of the file for BLANK).
    """
    cdef RecordView rv
    cdef int64_t avail = data.shape[0] - pos
    if pos < 0 or avail < 0:
        raise ValueError(f"position {pos} outside a buffer of {data.shape[0]} bytes")
    rv.total_size = 0
    cdef int r = check_record(&data[0] + pos if avail else NULL, avail,
                              crc_mode_of(check_crc, require_prop_crc), &rv)
    return CHECK_RESULT_NAMES[r], rv.total_size


def scan_valid(MappedFile mf, int64_t pos, bint check_crc, bint require_prop_crc=False):
    """Walk records from ``pos`` (bytes within ``mf``) while they check.

    Used by recovery (SPEC.md §5.2).

    Returns
    -------
    (end_pos, result, count, last_store_timestamp)
        ``end_pos`` is just past the last whole record (within the file);
        ``result`` is the CheckResult name that stopped the walk (BLANK means
        the file ended with its end-of-file record: continue with the next
        file); ``count`` is the number of records walked.
    """
    mf._check_open()
    cdef const unsigned char* base = mf.ptr()
    cdef int64_t size = mf.file_size
    cdef int64_t count = 0, last_ts = 0
    cdef RecordView rv
    cdef int r = RECORD_TRUNCATED
    cdef int mode = crc_mode_of(check_crc, require_prop_crc)
    with nogil:
        while pos < size:
            r = check_record(base + pos, size - pos, mode, &rv)
            if r != RECORD_OK:
                break
            if rv.physical_offset != mf.file_from_offset + pos:
                r = RECORD_BAD_LENGTH
                break
            last_ts = rv.store_timestamp
            pos += rv.total_size
            count += 1
    return pos, CHECK_RESULT_NAMES[r], count, last_ts


def first_store_timestamp(MappedFile mf):
    """Store timestamp (ms) of the file's first record, 0 if it is not a whole record."""
    mf._check_open()
    cdef RecordView rv
    if check_record(mf.ptr(), mf.file_size, CRC_NONE, &rv) != RECORD_OK:
        return 0
    return rv.store_timestamp


def store_timestamp_at(MappedFile mf, int64_t pos):
    """Store timestamp (ms) of the record at ``pos`` (bytes within ``mf``), -1 if invalid."""
    mf._check_open()
    cdef RecordView rv
    if pos < 0 or pos >= mf.file_size:
        return -1
    if check_record(mf.ptr() + pos, mf.file_size - pos, CRC_NONE, &rv) != RECORD_OK:
        return -1
    return rv.store_timestamp


# -- message ids (SPEC.md §1.8) ------------------------------------------------------------
def create_message_id(const unsigned char[::1] store_host, int64_t physical_offset):
    """Offset message id: store host IP + port + physical offset, upper-case hex."""
    cdef unsigned char buf[28]
    cdef Py_ssize_t n = store_host.shape[0]
    if n != IPV4_HOST_LENGTH and n != IPV6_HOST_LENGTH:
        raise ValueError(f"store host must be 8 or 20 bytes, got {n}")
    memcpy(buf, &store_host[0], n)
    store_be64(buf + n, physical_offset)
    return (<bytes>buf[:n + 8]).hex().upper()


cdef const char* HEX_DIGITS = b"0123456789ABCDEF"


def create_message_ids(const unsigned char[::1] store_host, const int64_t[::1] physical_offsets):
    """Offset message ids of many records, comma-joined (a batch's msgId, SPEC.md §1.8), in one pass."""
    cdef Py_ssize_t hl = store_host.shape[0]
    cdef Py_ssize_t n = physical_offsets.shape[0]
    if hl != IPV4_HOST_LENGTH and hl != IPV6_HOST_LENGTH:
        raise ValueError(f"store host must be 8 or 20 bytes, got {hl}")
    if n == 0:
        return ""
    cdef Py_ssize_t idlen = 2 * (hl + 8)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n * (idlen + 1) - 1)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    cdef unsigned char raw[28]
    cdef Py_ssize_t i, j
    memcpy(raw, &store_host[0], hl)
    with nogil:
        for i in range(n):
            store_be64(raw + hl, physical_offsets[i])
            for j in range(hl + 8):
                o[2 * j] = HEX_DIGITS[raw[j] >> 4]
                o[2 * j + 1] = HEX_DIGITS[raw[j] & 15]
            o += idlen
            if i + 1 < n:
                o[0] = 44      # ','
                o += 1
    return out.decode("ascii")


def decode_message_id(str msg_id):
    """Inverse of :func:`create_message_id`: ``(store_host bytes, physical_offset)``.

    Raises
    ------
    ValueError
        Not 32 (IPv4) or 56 (IPv6) hex characters.
    """
    if len(msg_id) not in (32, 56):
        raise ValueError(f"offset message id must be 32 or 56 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)


# -- decoding -------------------------------------------------------------------------------
@cython.no_gc          # what it holds (str, bytes, a dict of str) never refers back to it: pulled
cdef class MessageExt:   # messages are not for the cyclic GC to scan (its collections ran in poll())
    """One stored message, decoded from its CommitLog record (RocketMQ ``MessageExt``).  Its
    fields are declared in ``commitlog.pxd`` (other modules of rmq._core read them as C fields)."""

    @property
    def properties(self):
        """User and system properties (dict), parsed from the record on first access."""
        if self._properties is None:
            self._properties = _parse_properties(self._props_raw) if self._props_raw else {}
        return self._properties

    @properties.setter
    def properties(self, value):
        self._properties = value

    @property
    def tags(self):
        """The TAGS property (None when unset); read from the stored properties string while the
        dict is not parsed yet (a tag filter of a pulled page needs only this one)."""
        if self._properties is None:
            return _property_value(self._props_raw, b"TAGS") if self._props_raw else None
        return self._properties.get("TAGS")

    @property
    def keys(self):
        """KEYS split on single spaces (SPEC.md §1.6)."""
        k = self.properties.get("KEYS")
        return [x for x in k.split(" ") if x] if k else []

    @property
    def uniq_key(self):
        return self.properties.get("UNIQ_KEY")

    @property
    def offset_msg_id(self):
        """Offset message id (store host + physical offset), SPEC.md §1.8."""
        return create_message_id(self.store_host, self.commitlog_offset)

    @property
    def msg_id(self):
        """The message id users see (RocketMQ MessageClientExt): UNIQ_KEY when the producer set
        one, else the offset message id (SPEC.md §1.8)."""
        u = self.properties.get("UNIQ_KEY")
        return u if u else create_message_id(self.store_host, self.commitlog_offset)

    @property
    def delay_time_level(self):
        d = self.properties.get("DELAY")
        return int(d) if d and d.isdigit() else 0

    def __repr__(self):
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"commitlog_offset={self.commitlog_offset}, size={self.store_size})")


cdef object _property_value(bytes raw, bytes name):
    """What ``_parse_properties(raw).get(name)`` gives, without the dict: the value of the last
    ``name \\x01 value`` segment with a non-empty value, or None (:func:`find_property`, the
    broker's look-up, takes the first segment and an empty value: not what the dict says)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(raw)
    cdef const char* nm = PyBytes_AS_STRING(name)
    cdef Py_ssize_t n = len(raw), nl = len(name), start = 0, end, pos = -1, vlen = 0
    cdef const unsigned char* sep
    while start < n:
        sep = <const unsigned char*>memchr(p + start, PROPERTY_SEPARATOR, n - start)
        end = n if sep == NULL else sep - p
        if end - start > nl + 1 and p[start + nl] == NAME_VALUE_SEPARATOR and memcmp(p + start, nm, nl) == 0:
            pos = start + nl + 1
            vlen = end - pos
        start = end + 1
    if pos < 0:
        return None
    return (<const char*>p)[pos:pos + vlen].decode("utf-8", "replace")


cdef dict _parse_properties(bytes raw):
    cdef str s = raw.decode("utf-8", "replace")
    cdef dict out = {}
    cdef Py_ssize_t i
    for item in s.split("\x02"):
        if len(item) < 3:
            continue
        i = item.find("\x01")
        if i <= 0 or i == len(item) - 1:
            continue
        out[item[:i]] = item[i + 1:]
    return out


cdef inline bytes _same_or_new(bytes last, const unsigned char* p, int32_t n):
    """``last`` when it holds the ``n`` bytes at ``p`` (a page's records share their hosts), else
    a new bytes of them."""
    if last is not None and PyBytes_GET_SIZE(last) == n and memcmp(PyBytes_AS_STRING(last), p, n) == 0:
        return last
    return (<const char*>p)[:n]


cdef MessageExt _decode_one(const unsigned char* p, RecordView* rv, bint read_body, str topic,
                            bytes last_born, bytes last_store):
    """One record as a MessageExt; ``last_born`` / ``last_store``: the previous record's host
    bytes, shared when equal (two allocations fewer per message of a page)."""
    cdef MessageExt m = MessageExt.__new__(MessageExt)
    cdef int32_t bh = host_length(rv.sys_flag, BORNHOST_V6_FLAG)
    cdef int32_t sh = host_length(rv.sys_flag, STOREHOSTADDRESS_V6_FLAG)
    cdef int32_t stp = store_timestamp_position(rv.sys_flag)
    m.topic = topic if topic is not None else \
        (<const char*>p)[rv.topic_pos:rv.topic_pos + rv.topic_len].decode("utf-8", "replace")
    m.body = (<const char*>p)[rv.body_pos:rv.body_pos + rv.body_len] if read_body else None
    m.flag = load_be32(p + MSG_FLAG_OFFSET)
    m._props_raw = (<const char*>p)[rv.props_pos:rv.props_pos + rv.props_len] if rv.props_len else None
    m.queue_id = rv.queue_id
    m.queue_offset = rv.queue_offset
    m.commitlog_offset = rv.physical_offset
    m.store_size = rv.total_size
    m.body_crc = load_be32(p + MSG_BODY_CRC_OFFSET)
    m.sys_flag = rv.sys_flag
    m.born_timestamp = load_be64(p + MSG_BORN_TIMESTAMP_OFFSET)
    m.born_host = _same_or_new(last_born, p + MSG_BORN_HOST_OFFSET, bh)
    m.store_timestamp = rv.store_timestamp
    m.store_host = _same_or_new(last_store, p + stp + 8, sh)
    m.reconsume_times = load_be32(p + stp + 8 + sh)
    m.prepared_transaction_offset = load_be64(p + stp + 8 + sh + 4)
    return m


def decode_records(const unsigned char[::1] data, bint read_body=True, bint check_crc=False,
                   bint require_prop_crc=False):
    """Decode concatenated CommitLog records (a pull result) into MessageExt objects.

    Raises
    ------
    CorruptRecordError
        A record does not check (position and reason in the message).
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef Py_ssize_t pos = 0
    cdef RecordView rv
    cdef int r
    cdef int mode = crc_mode_of(check_crc, require_prop_crc)
    cdef const unsigned char* p
    cdef const unsigned char* last_topic = NULL
    cdef int32_t last_topic_len = -1
    cdef str topic = None
    cdef MessageExt m = None
    out = []
    while pos < n:
        p = &data[0] + pos
        r = check_record(p, n - pos, mode, &rv)
        if r != RECORD_OK:
            raise CorruptRecordError(
                f"record at byte {pos} of {n}: {CHECK_RESULT_NAMES[r]} (TOTALSIZE {rv.total_size})")
        if last_topic == NULL or rv.topic_len != last_topic_len or \
                memcmp(p + rv.topic_pos, last_topic, rv.topic_len) != 0:
            topic = (<const char*>p)[rv.topic_pos:rv.topic_pos + rv.topic_len].decode("utf-8", "replace")
            last_topic = p + rv.topic_pos
            last_topic_len = rv.topic_len
        m = _decode_one(p, &rv, read_body, topic, m.born_host if m is not None else None,
                        m.store_host if m is not None else None)
        out.append(m)
        pos += rv.total_size
    return out


def read_record(MappedFile mf, int64_t pos, bint check_crc=True, bint require_prop_crc=False):
    """Copy the whole record at ``pos`` (bytes within ``mf``) if it checks, else None."""
    mf._check_open()
    cdef RecordView rv
    if pos < 0 or pos >= mf.file_size:
        return None
    if check_record(mf.ptr() + pos, mf.file_size - pos, crc_mode_of(check_crc, require_prop_crc),
                    &rv) != RECORD_OK:
        return None
    return (<const char*>mf.ptr())[pos:pos + rv.total_size]


# -- the read path of getMessage (SPEC.md §13.2) ------------------------------------------
from libc.stdlib cimport free, malloc

from rmq._core.layout cimport CQ_PHYSICAL_OFFSET_OFFSET, CQ_SIZE_OFFSET, CQ_STORE_UNIT_SIZE, CQ_TAGS_CODE_OFFSET
from rmq._core.sqlfilter cimport SqlFilter

# gather_records outcomes
GATHER_FOUND = 0
GATHER_NO_MATCHED_MESSAGE = 1
GATHER_MESSAGE_WAS_REMOVING = 2
GATHER_CORRUPT = 3
cdef int32_t BLANK_UNIT_SIZE = 0x7FFFFFFF     # fillPreBlank units (0, Integer.MAX_VALUE, 0)


def gather_records(list files, int64_t file_size, const unsigned char[::1] cq_units,
                   codes, int64_t max_msgs, int64_t max_bytes,
                   int64_t min_physical_offset, int64_t max_physical_offset, bint check_crc,
                   bint require_prop_crc=False, SqlFilter sql_filter=None):
    """Copy the CommitLog records that ConsumeQueue units point at into one ``bytes``.

    Parameters
    ----------
    files : list[MappedFile]
        The CommitLog files, in order (``MappedFileQueue.files``).
    file_size : int
        CommitLog file size, bytes.
    cq_units : bytes-like
        Raw 20-byte ConsumeQueue units, in queue order.
    codes : int32 buffer or None
        tagsCode set of the subscription (``(int)tagsCode`` must be in it), None = all.
    max_msgs, max_bytes : int
        Batch limits: stop before the message that would exceed either
        (at least one message is always taken).
    min_physical_offset, max_physical_offset : int
        CommitLog range still held / readable (bytes).
    check_crc : bool
        Verify body and whole-record CRC of every record served.
    sql_filter : SqlFilter, optional
        A compiled SQL92 expression (:func:`rmq.filter.compile_sql92`): records whose properties
        it does not match are skipped like tag misses (ExpressionMessageFilter.isMatchedByCommitLog).

    Returns
    -------
    (records, count, scanned_units, outcome, detail)
        ``records``: concatenated records; ``scanned_units``: units consumed
        (the next begin offset advances by this); ``outcome``: GATHER_FOUND,
        GATHER_NO_MATCHED_MESSAGE, GATHER_MESSAGE_WAS_REMOVING, or
        GATHER_CORRUPT (``detail`` = physical offset of the bad record; records
        before it are still returned).
    """
    cdef Py_ssize_t n_units = cq_units.shape[0] // CQ_STORE_UNIT_SIZE
    cdef const int32_t[::1] code_view
    cdef const int32_t* cset = NULL
    cdef Py_ssize_t n_codes = 0
    if codes is not None:
        code_view = codes
        n_codes = code_view.shape[0]
        if n_codes:
            cset = &code_view[0]
    if n_units == 0 or not files:
        return b"", 0, 0, GATHER_NO_MATCHED_MESSAGE, 0
    cdef const unsigned char* units = &cq_units[0]
    cdef const unsigned char** ptrs = <const unsigned char**>malloc(n_units * sizeof(void*))
    cdef int32_t* lens = <int32_t*>malloc(n_units * sizeof(int32_t))
    if ptrs == NULL or lens == NULL:
        free(ptrs)
        free(lens)
        raise MemoryError()
    cdef int64_t first_index = (<MappedFile>files[0]).file_from_offset // file_size
    cdef Py_ssize_t n_files = len(files)
    cdef Py_ssize_t i, j, count = 0, scanned = 0
    cdef int64_t total = 0, phy, fidx, detail = 0
    cdef int32_t size, tag32
    cdef int outcome = GATHER_NO_MATCHED_MESSAGE
    cdef bint removing = False, matched
    cdef MappedFile mf
    cdef RecordView rv
    cdef int r
    cdef bytes out
    cdef unsigned char* p
    cdef int crc_mode = crc_mode_of(check_crc, require_prop_crc)
    try:
        for i in range(n_units):
            phy = load_be64(units + i * CQ_STORE_UNIT_SIZE + CQ_PHYSICAL_OFFSET_OFFSET)
            size = load_be32(units + i * CQ_STORE_UNIT_SIZE + CQ_SIZE_OFFSET)
            if size == BLANK_UNIT_SIZE and phy == 0:
                scanned += 1
                continue
            if size <= 0 or phy < 0 or phy + size > max_physical_offset:
                break
            if phy < min_physical_offset:
                removing = True
                scanned += 1
                continue
            if count > 0 and (count >= max_msgs or total + size > max_bytes):
                break
            if n_codes:
                tag32 = <int32_t>load_be64(units + i * CQ_STORE_UNIT_SIZE + CQ_TAGS_CODE_OFFSET)
                matched = False
                for j in range(n_codes):
                    if cset[j] == tag32:
                        matched = True
                        break
                if not matched:
                    scanned += 1
                    continue
            fidx = phy // file_size - first_index
            if fidx < 0 or fidx >= n_files:
                removing = True
                scanned += 1
                continue
            mf = <MappedFile>files[fidx]
            if mf.base == NULL:
                removing = True
                scanned += 1
                continue
            r = check_record(mf.base + (phy - mf.file_from_offset), file_size - (phy - mf.file_from_offset),
                             crc_mode, &rv)
            if r != RECORD_OK or rv.total_size != size or rv.physical_offset != phy:
                outcome = GATHER_CORRUPT
                detail = phy
                break
            if sql_filter is not None and not sql_filter.match(
                    mf.base + (phy - mf.file_from_offset) + rv.props_pos, rv.props_len):
                scanned += 1
                continue
            ptrs[count] = mf.base + (phy - mf.file_from_offset)
            lens[count] = size
            total += size
            count += 1
            scanned += 1
        out = PyBytes_FromStringAndSize(NULL, total)
        p = <unsigned char*>PyBytes_AS_STRING(out)
        with nogil:
            for i in range(count):
                memcpy(p, ptrs[i], lens[i])
                p += lens[i]
    finally:
        free(ptrs)
        free(lens)
    if outcome != GATHER_CORRUPT:
        if count > 0:
            outcome = GATHER_FOUND
        elif removing:
            outcome = GATHER_MESSAGE_WAS_REMOVING
    return out, count, scanned, outcome, detail


def tags_string_to_tags_code(str tags):
    """tagsCode of a TAGS value: Java ``String.hashCode`` (SPEC.md §2.2); 0 for None/empty."""
    if not tags:
        return 0
    cdef bytes b = tags.encode("utf-8")
    return java_hash(<const unsigned char*>PyBytes_AS_STRING(b), len(b))


# -- master/slave replication (HA) ------------------------------------------------------------
def replica_chunk_end(MappedFile mf, int64_t pos, int64_t readable_pos, int64_t max_bytes):
    """Where a chunk streamed to a slave should end: whole records only.

    Walks the records of ``mf`` from ``pos`` (bytes within the file, a record
    boundary) without CRC checks and returns the position just past the last
    whole record that lies below ``readable_pos`` (bytes within the file the
    writer has announced, e.g. ``wrote_position``) such that the span
    ``[pos, end)`` is at most ``max_bytes`` -- but always at least one whole
    record when one is readable (a record larger than ``max_bytes`` goes
    alone).

    The end-of-file BLANK record (layout: SPEC.md §1.3) is readable when
    ``readable_pos`` is past its position (the writer rolls only after writing
    it); it counts as a record spanning the rest of the file: when it fits the
    budget (or is the first record), the result is ``mf.file_size``.
    Otherwise the walk stops before it and the next call returns
    ``mf.file_size``.

    Returns
    -------
    int
        End position within the file (bytes); ``pos`` when nothing whole is
        readable.

    Raises
    ------
    ValueError
        ``pos`` or ``readable_pos`` outside ``[0, file_size]``, or
        ``max_bytes <= 0``.
    CorruptRecordError
        A record below ``readable_pos`` has a bad magic or bad lengths, or a
        physical-offset field that is not its offset: the master's own
        CommitLog is damaged there (the message names file and position).
    """
    mf._check_open()
    cdef int64_t size = mf.file_size
    if pos < 0 or pos > size:
        raise ValueError(f"pos {pos} outside [0, {size}] of {mf.file_name}")
    if readable_pos < 0 or readable_pos > size:
        raise ValueError(f"readable_pos {readable_pos} outside [0, {size}] of {mf.file_name}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    cdef const unsigned char* base = mf.ptr()
    cdef int64_t from_offset = mf.file_from_offset
    cdef int64_t end = pos
    cdef int r = RECORD_TRUNCATED
    cdef bint bad_offset = False
    cdef RecordView rv
    with nogil:
        while end < readable_pos:
            r = check_record(base + end, readable_pos - end, CRC_NONE, &rv)
            if r == RECORD_BLANK:
                if end == pos or size - pos <= max_bytes:
                    end = size
                break
            if r != RECORD_OK:
                break
            if rv.physical_offset != from_offset + end:
                bad_offset = True
                break
            if end > pos and end + rv.total_size - pos > max_bytes:
                break
            end += rv.total_size
    if bad_offset:
        raise CorruptRecordError(
            f"record at {end} of {mf.file_name} has physical offset {rv.physical_offset}, "
            f"expected {from_offset + end}")
    if r == RECORD_BAD_MAGIC or r == RECORD_BAD_LENGTH:
        raise CorruptRecordError(
            f"record at {end} of {mf.file_name} (below readable position {readable_pos}): "
            f"{CHECK_RESULT_NAMES[r]} (TOTALSIZE {rv.total_size})")
    return end


def validate_replica(const unsigned char[::1] data, int64_t base_offset, int64_t file_size,
                     bint check_crc, bint require_prop_crc=False):
    """Check bytes received from a master before they are appended (one pass, nogil).

    ``data`` must be whole CommitLog records (SPEC.md §1.2), each checking
    (magic, lengths and -- with ``check_crc`` -- body and ``__CRC32#`` CRCs)
    and each carrying its own physical offset (``base_offset`` + its position
    in ``data``), optionally followed by one end-of-file BLANK record
    (SPEC.md §1.3) whose TOTALSIZE reaches exactly the end of the file
    (``file_size``) and of ``data``.

    Parameters
    ----------
    data : bytes-like
    base_offset : int
        Physical offset of ``data[0]`` (bytes).
    file_size : int
        CommitLog file size (bytes).

    Returns
    -------
    (end, result, count, last_store_timestamp)
        ``result`` is ``"OK"`` (records only, ``end == len(data)``),
        ``"BLANK"`` (records then a valid end-of-file blank, ``end ==
        len(data)``), or the reason the record at ``end`` (bytes into
        ``data``) fails: a CheckResult name (TRUNCATED, BAD_MAGIC, BAD_LENGTH,
        BAD_CRC), ``"BAD_PHYSICAL_OFFSET"`` or ``"BAD_BLANK"`` (a blank not
        ending data and file together).  ``count`` is the whole records checked
        before ``end``; ``last_store_timestamp`` (ms) the last one's, 0 if none.

    Raises
    ------
    ValueError
        ``file_size <= 0`` or ``base_offset < 0``.
    """
    if file_size <= 0 or base_offset < 0:
        raise ValueError(f"file_size {file_size} and base_offset {base_offset} must be > 0 / >= 0")
    cdef int64_t n = data.shape[0]
    cdef const unsigned char* p = &data[0] if n else NULL
    cdef int64_t file_pos = base_offset % file_size
    cdef int64_t pos = 0, count = 0, last_ts = 0
    cdef int mode = crc_mode_of(check_crc, require_prop_crc)
    cdef int r = RECORD_OK
    cdef int bad = 0          # 1 bad physical offset, 2 bad blank
    cdef RecordView rv
    with nogil:
        while pos < n:
            r = check_record(p + pos, n - pos, mode, &rv)
            if r == RECORD_BLANK:
                if rv.total_size != n - pos or file_pos + n != file_size:
                    bad = 2
                else:
                    pos = n
                break
            if r != RECORD_OK:
                break
            if rv.physical_offset != base_offset + pos:
                bad = 1
                break
            last_ts = rv.store_timestamp
            pos += rv.total_size
            count += 1
    if bad == 1:
        result = "BAD_PHYSICAL_OFFSET"
    elif bad == 2:
        result = "BAD_BLANK"
    elif pos == n and r == RECORD_BLANK:
        result = "BLANK"
    elif pos == n:
        result = "OK"
    else:
        result = CHECK_RESULT_NAMES[r]
    return pos, result, count, last_ts
