# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
"""ConsumeQueue hot loops: write, decode, scan and filter 20-byte store units (SPEC.md §2).

The queue logic (idempotent dispatch, pre-blank fill, recovery, deletion)
lives in :mod:`rmq.store.consume_queue`; this module only moves bytes, with
the GIL released around every loop.
"""
from cpython cimport array
from libc.stdint cimport INT32_MAX, int32_t, int64_t

import array

from rmq._core.layout cimport CQ_STORE_UNIT_SIZE
from rmq._core.mapped_file cimport MappedFile

#: size field of a pre-blank entry (Java Integer.MAX_VALUE, SPEC.md §2.1)
BLANK_ENTRY_SIZE = INT32_MAX

cdef array.array _INT64_TEMPLATE = array.array("q")
cdef array.array _INT32_TEMPLATE = array.array("i")


# -- C level ---------------------------------------------------------------------
cdef void put_entries_raw(unsigned char* dst, const int64_t* phys, const int32_t* sizes,
                          const int64_t* tags, Py_ssize_t count) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(count):
        write_entry(dst + k * CQ_STORE_UNIT_SIZE, phys[k], sizes[k], tags[k])


cdef int64_t put_entries_c(MappedFile mf, int64_t pos, const int64_t* phys,
                           const int32_t* sizes, const int64_t* tags,
                           Py_ssize_t count) except -1 nogil:
    cdef int64_t end = pos + <int64_t>count * CQ_STORE_UNIT_SIZE
    cdef unsigned char* base = mf.base
    if base == NULL or count < 0 or pos < 0 or end > mf.file_size:
        with gil:
            if base == NULL:
                raise ValueError(f"mapped file {mf.file_name} is closed")
            raise ValueError(
                f"{count} consume queue entries at byte {pos} do not fit in "
                f"{mf.file_name} ({mf.file_size} bytes)")
    put_entries_raw(base + pos, phys, sizes, tags, count)
    return end


cdef void fill_blank_raw(unsigned char* dst, Py_ssize_t count) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(count):
        write_entry(dst + k * CQ_STORE_UNIT_SIZE, 0, INT32_MAX, 0)


cdef Py_ssize_t scan_valid_c(const unsigned char* raw, Py_ssize_t n_units, int64_t phy_limit,
                             int64_t* last_end, int64_t* max_end) noexcept nogil:
    cdef Py_ssize_t k
    cdef const unsigned char* p
    cdef int64_t phy, end
    for k in range(n_units):
        p = raw + k * CQ_STORE_UNIT_SIZE
        if not entry_is_valid(p):
            return k
        if entry_is_blank(p):       # positional filler: kept whatever the limit
            continue
        phy = entry_physical_offset(p)
        if phy >= phy_limit:
            return k
        end = phy + entry_size(p)
        last_end[0] = end
        if end > max_end[0]:
            max_end[0] = end
    return n_units


cdef Py_ssize_t filter_by_tags_c(const unsigned char* raw, Py_ssize_t n_units,
                                 const int32_t* codes, Py_ssize_t n_codes,
                                 int32_t* out) noexcept nogil:
    cdef Py_ssize_t k, j, n = 0
    cdef int32_t code
    if n_codes == 0:
        for k in range(n_units):
            out[k] = <int32_t>k
        return n_units
    for k in range(n_units):
        # RocketMQ compares codeSet.contains((int) tagsCode): the low 32 bits
        code = <int32_t>entry_tags_code(raw + k * CQ_STORE_UNIT_SIZE)
        # subscriptions carry a handful of tags: a linear probe beats a hash set
        for j in range(n_codes):
            if codes[j] == code:
                out[n] = <int32_t>k
                n += 1
                break
    return n


cdef Py_ssize_t lower_bound_physical_offset_c(const unsigned char* raw, Py_ssize_t n_units,
                                              int64_t physical_offset) noexcept nogil:
    cdef Py_ssize_t lo = 0, hi = n_units, mid
    cdef const unsigned char* p
    while lo < hi:
        mid = lo + (hi - lo) // 2
        p = raw + mid * CQ_STORE_UNIT_SIZE
        if entry_is_blank(p) or entry_physical_offset(p) < physical_offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- helpers ---------------------------------------------------------------------------
cdef inline Py_ssize_t _units_of(Py_ssize_t n_bytes) except -1:
    if n_bytes % CQ_STORE_UNIT_SIZE:
        raise ValueError(
            f"buffer of {n_bytes} bytes is not a whole number of "
            f"{CQ_STORE_UNIT_SIZE}-byte consume queue entries")
    return n_bytes // CQ_STORE_UNIT_SIZE


cdef int _check_range(MappedFile mf, int64_t pos, int64_t end) except -1:
    if mf.base == NULL:
        raise ValueError(f"mapped file {mf.file_name} is closed")
    if pos < 0 or end < pos or end > mf.file_size:
        raise ValueError(
            f"range [{pos}, {end}) outside {mf.file_name} ({mf.file_size} bytes)")
    if pos % CQ_STORE_UNIT_SIZE:
        raise ValueError(
            f"byte position {pos} of {mf.file_name} is not on a "
            f"{CQ_STORE_UNIT_SIZE}-byte entry boundary")
    return 0


# -- Python level ----------------------------------------------------------------
def put_entries(MappedFile mf, int64_t pos, const int64_t[::1] phys, const int32_t[::1] sizes,
                const int64_t[::1] tags, Py_ssize_t start, Py_ssize_t count):
    """Write ``count`` store units taken from index ``start`` of the arrays at byte ``pos``.

    Parameters
    ----------
    mf : MappedFile
        A ConsumeQueue file.
    pos : int
        Byte position within ``mf`` of the first unit (a multiple of 20).
    phys : int64 buffer (``array('q')``, numpy int64, ...)
        commitLogOffset of each entry, bytes.
    sizes : int32 buffer
        TOTALSIZE of each CommitLog record, bytes.
    tags : int64 buffer
        tagsCode of each entry (SPEC.md §2.2).
    start : int
        Index of the first entry to take from the three arrays.
    count : int
        Number of entries to write (``count * 20`` bytes).

    Returns
    -------
    int
        Byte position just past the last unit written (``pos + count * 20``).

    Raises
    ------
    ValueError
        ``start``/``count`` outside one of the arrays, the byte range outside
        the file or not unit-aligned, or the file is closed.

    Concurrency: the queue's single writer only; releases the GIL for the
    copy.  ``wrote_position`` is NOT moved: the caller publishes it after this
    returns.  Durability: page cache only until ``mf.flush()``.
    """
    if start < 0 or count < 0 or start + count > phys.shape[0] \
            or start + count > sizes.shape[0] or start + count > tags.shape[0]:
        raise ValueError(
            f"entries [{start}, {start + count}) outside the arrays "
            f"(lengths {phys.shape[0]}, {sizes.shape[0]}, {tags.shape[0]})")
    cdef int64_t end = pos + <int64_t>count * CQ_STORE_UNIT_SIZE
    _check_range(mf, pos, end)
    if count == 0:
        return end
    with nogil:
        put_entries_raw(mf.base + pos, &phys[start], &sizes[start], &tags[start], count)
    return end


def put_entry(MappedFile mf, int64_t pos, int64_t physical_offset, int32_t size, int64_t tags_code):
    """Write one store unit at byte ``pos`` of ``mf``; returns ``pos + 20``.

    Same contract as :func:`put_entries` (``wrote_position`` is not moved).

    Raises
    ------
    ValueError
        The unit does not fit, is not aligned, or the file is closed.
    """
    cdef int64_t end = pos + CQ_STORE_UNIT_SIZE
    _check_range(mf, pos, end)
    write_entry(mf.base + pos, physical_offset, size, tags_code)
    return end


def fill_blank_entries(MappedFile mf, int64_t pos, Py_ssize_t count):
    """Write ``count`` pre-blank units ``(0, INT32_MAX, 0)`` at byte ``pos`` (SPEC.md §2.1).

    Returns
    -------
    int
        Byte position just past the last unit (``pos + count * 20``).

    Raises
    ------
    ValueError
        The range does not fit, is not aligned, or the file is closed.
    """
    if count < 0:
        raise ValueError(f"negative blank entry count {count}")
    cdef int64_t end = pos + <int64_t>count * CQ_STORE_UNIT_SIZE
    _check_range(mf, pos, end)
    with nogil:
        fill_blank_raw(mf.base + pos, count)
    return end


def load_entry(MappedFile mf, int64_t pos):
    """Decode the store unit at byte ``pos`` of ``mf``.

    Returns
    -------
    tuple of (int, int, int)
        ``(physical_offset, size, tags_code)``: bytes, bytes, tag hash.

    Raises
    ------
    ValueError
        The unit is outside the file, not aligned, or the file is closed.
    """
    _check_range(mf, pos, pos + CQ_STORE_UNIT_SIZE)
    cdef const unsigned char* p = mf.base + pos
    return entry_physical_offset(p), entry_size(p), entry_tags_code(p)


def scan_valid(MappedFile mf, int64_t pos, int64_t end, int64_t phy_limit):
    """Count the leading valid units of ``mf[pos:end]`` that point below ``phy_limit``.

    A unit is valid when ``physical_offset >= 0 and size > 0`` (SPEC.md §5.3);
    the scan stops at the first invalid one or the first one at/after
    ``phy_limit`` (bytes of CommitLog).  Pre-blank units always count.

    Returns
    -------
    tuple of (int, int, int)
        ``(count, last_end, max_end)``: number of units; ``offset + size`` of
        the last and of the largest non-blank unit counted (bytes, -1 if none).

    Raises
    ------
    ValueError
        The range is outside the file, not aligned, or the file is closed.
    """
    if end > pos:
        end -= (end - pos) % CQ_STORE_UNIT_SIZE
    else:
        end = pos
    _check_range(mf, pos, end)
    cdef int64_t last_end = -1, max_end = -1
    cdef Py_ssize_t n
    with nogil:
        n = scan_valid_c(mf.base + pos, <Py_ssize_t>((end - pos) // CQ_STORE_UNIT_SIZE),
                         phy_limit, &last_end, &max_end)
    return n, last_end, max_end


def lower_bound_physical_offset(MappedFile mf, int64_t pos, int64_t end, int64_t physical_offset):
    """Byte position of the first non-blank unit in ``mf[pos:end]`` with offset >= ``physical_offset``.

    Binary search; the units must be in CommitLog order (dispatch order).

    Returns
    -------
    int
        Byte position within ``mf``; ``end`` when every unit points below.

    Raises
    ------
    ValueError
        The range is outside the file, not aligned, or the file is closed.
    """
    _check_range(mf, pos, end)
    cdef Py_ssize_t k
    with nogil:
        k = lower_bound_physical_offset_c(mf.base + pos,
                                          <Py_ssize_t>((end - pos) // CQ_STORE_UNIT_SIZE),
                                          physical_offset)
    return pos + <int64_t>k * CQ_STORE_UNIT_SIZE


def decode_entries(const unsigned char[::1] raw):
    """Decode whole 20-byte store units into three typed arrays.

    Parameters
    ----------
    raw : bytes-like, length a multiple of 20
        Entries as returned by ``ConsumeQueue.read_raw``.

    Returns
    -------
    tuple of (array('q'), array('i'), array('q'))
        ``(physical_offsets, sizes, tags_codes)``, one item per entry.

    Raises
    ------
    ValueError
        ``len(raw)`` is not a multiple of 20.
    """
    cdef Py_ssize_t n = _units_of(raw.shape[0])
    cdef array.array phys = array.clone(_INT64_TEMPLATE, n, False)
    cdef array.array sizes = array.clone(_INT32_TEMPLATE, n, False)
    cdef array.array tags = array.clone(_INT64_TEMPLATE, n, False)
    cdef long long* p_out = phys.data.as_longlongs
    cdef int* s_out = sizes.data.as_ints
    cdef long long* t_out = tags.data.as_longlongs
    cdef const unsigned char* p
    cdef Py_ssize_t k
    if n == 0:
        return phys, sizes, tags
    with nogil:
        for k in range(n):
            p = &raw[0] + k * CQ_STORE_UNIT_SIZE
            p_out[k] = entry_physical_offset(p)
            s_out[k] = entry_size(p)
            t_out[k] = entry_tags_code(p)
    return phys, sizes, tags


def filter_by_tags(const unsigned char[::1] raw, const int32_t[::1] codes):
    """Indexes of the entries whose ``(int32)tagsCode`` is in ``codes`` (SPEC.md §2.2).

    Parameters
    ----------
    raw : bytes-like, length a multiple of 20
        Entries as returned by ``ConsumeQueue.read_raw``.
    codes : int32 buffer (``array('i')``)
        The subscription's code set (Java ``String.hashCode`` of each tag).
        Empty means subscription ``*``: every entry matches.

    Returns
    -------
    array('i')
        Entry indexes (0-based within ``raw``), ascending.

    Raises
    ------
    ValueError
        ``len(raw)`` is not a multiple of 20.

    Concurrency: releases the GIL for the scan.
    """
    cdef Py_ssize_t n = _units_of(raw.shape[0])
    cdef Py_ssize_t n_codes = codes.shape[0]
    cdef array.array out = array.clone(_INT32_TEMPLATE, n, False)
    cdef Py_ssize_t found
    if n == 0:
        return out
    cdef const int32_t* c_codes = &codes[0] if n_codes else NULL
    with nogil:
        found = filter_by_tags_c(&raw[0], n, c_codes, n_codes, <int32_t*>out.data.as_ints)
    array.resize(out, found)
    return out
