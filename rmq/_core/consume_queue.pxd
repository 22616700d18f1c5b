# cython: language_level=3
# C-level API of the ConsumeQueue core (SPEC.md §2).
#
# A ConsumeQueue file is an array of 20-byte store units, big-endian:
#
#   +------------------+----------+-------------------+
#   | commitLogOffset 8| size 4   | tagsCode 8        |   CQ_STORE_UNIT_SIZE = 20
#   +------------------+----------+-------------------+
#
# An entry is *valid* when commitLogOffset >= 0 and size > 0 (recovery stops
# at the first one that is not, SPEC.md §5.3).  A *blank* entry
# (0, INT32_MAX, 0) is the pre-blank filler written before the first entry of
# a queue whose first file starts at a non-zero offset (SPEC.md §2.1): it is
# valid for recovery but refers to no message.
#
# Call order: the owning writer computes the byte position (idempotency rules
# live in rmq/store/consume_queue.py), calls put_entries_c, THEN publishes the
# new MappedFile.wrote_position.  Readers never look past wrote_position.
from libc.stdint cimport INT32_MAX, int32_t, int64_t

from rmq._core.hton cimport load_be32, load_be64, store_be32, store_be64
from rmq._core.layout cimport (CQ_PHYSICAL_OFFSET_OFFSET, CQ_SIZE_OFFSET,
                               CQ_STORE_UNIT_SIZE, CQ_TAGS_CODE_OFFSET)
from rmq._core.mapped_file cimport MappedFile


# -- one store unit -------------------------------------------------------------
cdef inline void write_entry(unsigned char* p, int64_t physical_offset, int32_t size,
                             int64_t tags_code) noexcept nogil:
    store_be64(p + CQ_PHYSICAL_OFFSET_OFFSET, physical_offset)
    store_be32(p + CQ_SIZE_OFFSET, size)
    store_be64(p + CQ_TAGS_CODE_OFFSET, tags_code)


cdef inline int64_t entry_physical_offset(const unsigned char* p) noexcept nogil:
    return load_be64(p + CQ_PHYSICAL_OFFSET_OFFSET)


cdef inline int32_t entry_size(const unsigned char* p) noexcept nogil:
    return load_be32(p + CQ_SIZE_OFFSET)


cdef inline int64_t entry_tags_code(const unsigned char* p) noexcept nogil:
    return load_be64(p + CQ_TAGS_CODE_OFFSET)


cdef inline bint entry_is_valid(const unsigned char* p) noexcept nogil:
    # RocketMQ ConsumeQueue.recover: offset >= 0 && size > 0
    return entry_physical_offset(p) >= 0 and entry_size(p) > 0


cdef inline bint entry_is_blank(const unsigned char* p) noexcept nogil:
    # fillPreBlank writes (0, Integer.MAX_VALUE, 0)
    return entry_size(p) == INT32_MAX and entry_physical_offset(p) == 0


# -- loops over raw units (no GIL, no Python objects) ---------------------------
cdef void put_entries_raw(unsigned char* dst, const int64_t* phys, const int32_t* sizes,
                          const int64_t* tags, Py_ssize_t count) noexcept nogil

cdef int64_t put_entries_c(MappedFile mf, int64_t pos, const int64_t* phys,
                           const int32_t* sizes, const int64_t* tags,
                           Py_ssize_t count) except -1 nogil
    # Writes `count` units at byte `pos` of `mf`; returns pos + count * 20.
    # Raises ValueError (file closed, range outside the file).  Does NOT move
    # wrote_position: the caller publishes it after the call.

cdef void fill_blank_raw(unsigned char* dst, Py_ssize_t count) noexcept nogil

cdef Py_ssize_t scan_valid_c(const unsigned char* raw, Py_ssize_t n_units, int64_t phy_limit,
                             int64_t* last_end, int64_t* max_end) noexcept nogil
    # Number of leading units that are valid and point below `phy_limit`
    # (blank units always count: they are positional filler).
    # *last_end / *max_end get offset+size of the last / largest non-blank one
    # (left untouched when there is none).

cdef Py_ssize_t filter_by_tags_c(const unsigned char* raw, Py_ssize_t n_units,
                                 const int32_t* codes, Py_ssize_t n_codes,
                                 int32_t* out) noexcept nogil
    # Writes the indexes of units whose (int32)tagsCode is in codes[0:n_codes]
    # (all units when n_codes == 0) to out; returns how many.

cdef Py_ssize_t lower_bound_physical_offset_c(const unsigned char* raw, Py_ssize_t n_units,
                                              int64_t physical_offset) noexcept nogil
    # Index of the first non-blank unit with commitLogOffset >= physical_offset
    # (n_units if none).  Units must be in physical-offset order (they are:
    # dispatch appends in CommitLog order) with blanks only in front.
