# cython: language_level=3
# IndexFile: RocketMQ's message-key hash index, byte for byte (SPEC.md §3).
#
#  +--------------+-------------------------------+-------------------------------------+
#  | header 40 B  | slot table: hash_slot_num x 4 | entries: index_num x 20             |
#  +--------------+-------------------------------+-------------------------------------+
#  slot  = entry number of the newest entry hashed to it (0 = empty)
#  entry = keyHash 4 | phyOffset 8 | timeDiff (s) 4 | prevIndex 4  (chain to older entry)
#
# Offsets and sizes come from rmq._core.layout (INDEX_*).  The header fields
# live in the C fields below and are written to the mapping on every put, as
# RocketMQ's IndexHeader setters do, so a crash loses at most page-cache data.
#
# Call order: construct (maps + loads the header of an existing file) ->
# put_hash/put_key (one writer) and select_phy_offsets (any reader thread) ->
# flush() -> close() or destroy().  put_hash never touches the GIL, so the
# dispatch loop of another Cython module can call it for every key.
from libc.stdint cimport int32_t, int64_t

from rmq._core.mapped_file cimport MappedFile


cdef class IndexFile:
    cdef readonly MappedFile mapped_file   # the whole file, mapped read/write
    cdef readonly int32_t hash_slot_num    # slots in the slot table (RocketMQ hashSlotNum)
    cdef readonly int32_t index_num        # entry capacity incl. the unused entry 0 (indexNum)
    cdef readonly int64_t begin_timestamp  # ms, store time of the first indexed message
    cdef readonly int64_t end_timestamp    # ms, store time of the last indexed message
    cdef readonly int64_t begin_phy_offset # CommitLog offset of the first indexed message
    cdef readonly int64_t end_phy_offset   # CommitLog offset of the last indexed message
    cdef readonly int32_t hash_slot_count  # slots that went from empty to used
    cdef readonly int32_t index_count      # next free entry number; starts at 1
    cdef int64_t entries_pos               # byte position of entry 0 in the file

    cdef void _write_header(self, unsigned char* base) noexcept nogil
    cdef int _read_header(self) except -1
    cdef unsigned char* _base(self) except NULL

    # Insert one key hash (SPEC.md §3.3).  Returns 1 stored, 0 full (the caller
    # rolls to a new file), -1 refused (file closed, or key_hash < 0, which
    # index_key_hash never returns).  Precondition: a single writer thread.
    cdef int put_hash(self, int32_t key_hash, int64_t phy_offset,
                      int64_t store_timestamp) noexcept nogil

    # Walk the slot chain of key_hash (SPEC.md §3.5), appending hits to ``out``
    # until ``len(out) >= max_num``.  Returns the number of hits appended.
    cdef int select_hash(self, int32_t key_hash, list out, int max_num,
                         int64_t begin, int64_t end) except -1
