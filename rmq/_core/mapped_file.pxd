# cython: language_level=3
from libc.stdint cimport int64_t


cdef class MappedFile:
    """One fixed-size mmap'd file of a MappedFileQueue (RocketMQ MappedFile)."""
    cdef readonly str file_name            # absolute path of the file
    cdef readonly int64_t file_from_offset # offset of its first byte in the queue (= its name)
    cdef readonly int64_t file_size        # bytes, fixed at creation
    cdef int fd                            # -1 once closed
    cdef unsigned char* base               # start of the MAP_SHARED mapping; NULL once closed
    cdef public int64_t wrote_position     # bytes appended (page cache)
    cdef public int64_t flushed_position   # bytes made durable by msync (only flush() moves it up)
    cdef readonly int64_t durable_position # bytes this process msynced from 0 (moved only after msync returned 0)
    cdef readonly bint write_error         # sticky: a failed msync stops acknowledgements
    cdef Py_ssize_t exports                # live buffer exports (memoryviews) of the mapping
    cdef public double store_timestamp_last  # ms, store time of the last record written (CommitLog)

    cdef inline unsigned char* ptr(self) noexcept nogil:
        return self.base
    cdef int _check_open(self) except -1
    cdef int _flush_range(self, int64_t start, int64_t end) except -1
