# cython: language_level=3
from libc.stdint cimport int32_t, int64_t

from rmq._core.mapped_file cimport MappedFile


cdef struct RecordView:
    # Where the parts of one CommitLog record are, relative to its first byte.
    int32_t total_size
    int32_t magic
    int32_t sys_flag
    int32_t queue_id
    int64_t queue_offset
    int64_t physical_offset
    int64_t store_timestamp
    int32_t body_pos
    int32_t body_len
    int32_t topic_pos
    int32_t topic_len
    int32_t props_pos
    int32_t props_len


cdef enum CheckResult:
    # check_record() outcomes (RocketMQ checkMessageAndReturnSize)
    RECORD_OK = 1
    RECORD_BLANK = 0
    RECORD_TRUNCATED = -1     # not enough bytes for the declared size / header
    RECORD_BAD_MAGIC = -2     # zeroed or garbage bytes
    RECORD_BAD_LENGTH = -3    # parsed lengths do not add up to TOTALSIZE
    RECORD_BAD_CRC = -4       # body CRC or __CRC32# whole-record CRC mismatch


cdef enum CrcMode:
    CRC_NONE = 0          # lengths and magic only (reput)
    CRC_BODY = 1          # + body CRC, and the __CRC32# whole-record CRC when the record has one
    CRC_STRICT = 2        # + the record must carry __CRC32# (forceVerifyPropCRC)


cdef int check_record(const unsigned char* p, int64_t avail, int crc_mode,
                      RecordView* out) noexcept nogil

cdef int find_property(const unsigned char* props, int32_t props_len,
                       const char* name, int32_t name_len,
                       int32_t* value_pos, int32_t* value_len) noexcept nogil
