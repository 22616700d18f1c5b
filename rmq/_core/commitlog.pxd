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


cdef class MessageExt:
    # One stored message (commitlog.pyx); the fields, for C access from the other modules.
    cdef public str topic
    cdef public object body                 # bytes (None when not read)
    cdef public int flag
    cdef dict _properties                   # parsed on first use
    cdef bytes _props_raw                   # the stored properties string
    cdef public int queue_id
    cdef public long long queue_offset      # entries
    cdef public long long commitlog_offset  # physical offset, bytes
    cdef public int store_size              # TOTALSIZE, bytes
    cdef public int body_crc
    cdef public int sys_flag
    cdef public long long born_timestamp    # ms
    cdef public bytes born_host             # ip + port (8 or 20 bytes)
    cdef public long long store_timestamp   # ms
    cdef public bytes store_host
    cdef public int reconsume_times
    cdef public long long prepared_transaction_offset
