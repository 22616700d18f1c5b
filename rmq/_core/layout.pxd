# cython: language_level=3
#
# THE on-disk formats of rmq, byte for byte RocketMQ's (SPEC.md §1-§4).
# All lengths are in bytes; all multi-byte fields are big-endian (Java
# ByteBuffer order).  Never type one of these offsets literally elsewhere.

# ---------------------------------------------------------------------------
# CommitLog record, message version V1 (SPEC.md §1.2, MessageExtEncoder):
#
#  +0  TOTALSIZE 4 | +4 MAGICCODE 4 | +8 BODYCRC 4 | +12 QUEUEID 4 | +16 FLAG 4
#  +20 QUEUEOFFSET 8 | +28 PHYSICALOFFSET 8 | +36 SYSFLAG 4 | +40 BORNTIMESTAMP 8
#  +48 BORNHOST 8|20 | STORETIMESTAMP 8 | STOREHOST 8|20 | RECONSUMETIMES 4
#  PREPARED_TX_OFFSET 8 | BODYLEN 4 + BODY | TOPICLEN 1 (V1) or 2 (V2) + TOPIC
#  PROPERTIESLEN 2 + PROPERTIES
#
# Positions after BORNHOST depend on SYSFLAG bits 4/5 (IPv6 hosts); they are
# computed by commitlog.pyx, not listed here.  BODYCRC covers the body as
# stored; the __CRC32# property (SPEC.md §1.7) covers the whole record but its
# own 20 reserved bytes.  Recovery stops at the first record whose magic,
# lengths or CRC do not check, and truncates there (SPEC.md §5.2).
from libc.stdint cimport int16_t, int32_t
from libc.string cimport memcpy

from rmq._core.hton cimport store_be16, store_be32

cpdef enum:
    MSG_TOTAL_SIZE_OFFSET = 0
    MSG_MAGIC_CODE_OFFSET = MSG_TOTAL_SIZE_OFFSET + 4
    MSG_BODY_CRC_OFFSET = MSG_MAGIC_CODE_OFFSET + 4
    MSG_QUEUE_ID_OFFSET = MSG_BODY_CRC_OFFSET + 4
    MSG_FLAG_OFFSET = MSG_QUEUE_ID_OFFSET + 4
    MSG_QUEUE_OFFSET_OFFSET = MSG_FLAG_OFFSET + 4            # == 20
    MSG_PHYSICAL_OFFSET_OFFSET = MSG_QUEUE_OFFSET_OFFSET + 8  # == 28
    MSG_SYS_FLAG_OFFSET = MSG_PHYSICAL_OFFSET_OFFSET + 8      # == 36
    MSG_BORN_TIMESTAMP_OFFSET = MSG_SYS_FLAG_OFFSET + 4       # == 40
    MSG_BORN_HOST_OFFSET = MSG_BORN_TIMESTAMP_OFFSET + 8      # == 48
    MSG_STORE_TIMESTAMP_OFFSET_IPV4 = MSG_BORN_HOST_OFFSET + 8  # == 56

cpdef enum:
    IPV4_HOST_LENGTH = 8      # 4 address bytes + 4-byte port
    IPV6_HOST_LENGTH = 20     # 16 address bytes + 4-byte port
    # fixed bytes of a record with IPv4 hosts, V1 topic length: 91
    MSG_FIXED_LENGTH_IPV4_V1 = (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + IPV4_HOST_LENGTH
                                + 8 + IPV4_HOST_LENGTH + 4 + 8 + 4 + 1 + 2)

# Magic codes (SPEC.md §1.3), as signed Java ints.
cpdef enum:
    MESSAGE_MAGIC_CODE = -626843481      # 0xDAA320A7, V1: topic length 1 byte
    MESSAGE_MAGIC_CODE_V2 = -626843477   # 0xDAA320AB, V2: topic length 2 bytes
    BLANK_MAGIC_CODE = -875286124        # 0xCBD43194, end-of-file filler record
    # [TOTALSIZE = rest of file][BLANK magic]: a file always keeps 8 bytes for it
    END_FILE_MIN_BLANK_LENGTH = 4 + 4

# SYSFLAG bits (SPEC.md §1.5, MessageSysFlag.java)
cpdef enum:
    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x2
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_TYPE_MASK = 0xC
    BORNHOST_V6_FLAG = 0x10
    STOREHOSTADDRESS_V6_FLAG = 0x20
    NEED_UNWRAP_FLAG = 0x40
    INNER_BATCH_FLAG = 0x80
    COMPRESSION_TYPE_MASK = 0x700
    COMPRESSION_LZ4_TYPE = 0x100
    COMPRESSION_ZSTD_TYPE = 0x200
    COMPRESSION_ZLIB_TYPE = 0x300

# Properties string (SPEC.md §1.6): name \x01 value \x02 ...
cpdef enum:
    NAME_VALUE_SEPARATOR = 1
    PROPERTY_SEPARATOR = 2
    # "__CRC32#" \x01 10 digits \x02 (SPEC.md §1.7)
    CRC32_RESERVED_LENGTH = 8 + 1 + 10 + 1
    CRC32_DIGITS = 10

# Batch body element (SPEC.md §1.11, MessageDecoder.encodeMessage):
#   TOTALSIZE 4 | MAGICCODE 4 (0) | BODYCRC 4 (0) | FLAG 4 | BODYLEN 4 + BODY
#   PROPERTIESLEN 2 + PROPERTIES
cpdef enum:
    BATCH_TOTAL_SIZE_OFFSET = 0
    BATCH_MAGIC_CODE_OFFSET = 4
    BATCH_BODY_CRC_OFFSET = 8
    BATCH_FLAG_OFFSET = 12
    BATCH_BODY_LENGTH_OFFSET = 16
    BATCH_BODY_OFFSET = 20
    BATCH_FIXED_LENGTH = 4 + 4 + 4 + 4 + 4 + 2    # == 22


cdef inline unsigned char* put_batch_element(unsigned char* o, Py_ssize_t total, int32_t flag, const void* body,
                                             Py_ssize_t body_len, Py_ssize_t props_len) noexcept nogil:
    """One batch element's TOTALSIZE (``total`` = BATCH_FIXED_LENGTH + ``body_len`` +
    ``props_len``), MAGICCODE and BODYCRC (0), FLAG, BODYLEN, BODY and PROPERTIESLEN, at ``o``;
    returns where its PROPERTIES go.  Every writer of a batch body goes through here."""
    store_be32(o + BATCH_TOTAL_SIZE_OFFSET, <int32_t>total)
    store_be32(o + BATCH_MAGIC_CODE_OFFSET, 0)
    store_be32(o + BATCH_BODY_CRC_OFFSET, 0)
    store_be32(o + BATCH_FLAG_OFFSET, flag)
    store_be32(o + BATCH_BODY_LENGTH_OFFSET, <int32_t>body_len)
    if body_len:
        memcpy(o + BATCH_BODY_OFFSET, body, <size_t>body_len)
    store_be16(o + BATCH_BODY_OFFSET + body_len, <int16_t>props_len)
    return o + BATCH_BODY_OFFSET + body_len + 2

# Limits (SPEC.md §1.9)
cpdef enum:
    TOPIC_MAX_LENGTH = 127               # TopicValidator; V1 topic length byte
    TOPIC_MAX_LENGTH_SYSTEM = 255        # 5.x HookUtils.MAX_TOPIC_LENGTH (%RETRY%, %DLQ%)
    PROPERTIES_MAX_LENGTH = 32767        # Short.MAX_VALUE, UTF-8 bytes
    MAX_MESSAGE_SIZE_DEFAULT = 4 * 1024 * 1024   # maxMessageSize: body bytes

# ---------------------------------------------------------------------------
# ConsumeQueue store unit (SPEC.md §2.1): phyOffset 8 | size 4 | tagsCode 8
cpdef enum:
    CQ_PHYSICAL_OFFSET_OFFSET = 0
    CQ_SIZE_OFFSET = CQ_PHYSICAL_OFFSET_OFFSET + 8
    CQ_TAGS_CODE_OFFSET = CQ_SIZE_OFFSET + 4
    CQ_STORE_UNIT_SIZE = CQ_TAGS_CODE_OFFSET + 8          # == 20
    CQ_ENTRIES_PER_FILE_DEFAULT = 300000                  # 6,000,000-byte files

# ---------------------------------------------------------------------------
# IndexFile (SPEC.md §3.1): [header 40][slots hashSlotNum x 4][entries indexNum x 20]
# header: beginTimestamp 8 | endTimestamp 8 | beginPhyOffset 8 | endPhyOffset 8
#         hashSlotCount 4 | indexCount 4
cpdef enum:
    INDEX_BEGIN_TIMESTAMP_OFFSET = 0
    INDEX_END_TIMESTAMP_OFFSET = 8
    INDEX_BEGIN_PHY_OFFSET_OFFSET = 16
    INDEX_END_PHY_OFFSET_OFFSET = 24
    INDEX_HASH_SLOT_COUNT_OFFSET = 32
    INDEX_INDEX_COUNT_OFFSET = 36
    INDEX_HEADER_SIZE = 40
    INDEX_HASH_SLOT_SIZE = 4
    # entry: keyHash 4 | phyOffset 8 | timeDiff (s) 4 | prevIndex 4
    INDEX_ENTRY_KEY_HASH_OFFSET = 0
    INDEX_ENTRY_PHY_OFFSET_OFFSET = 4
    INDEX_ENTRY_TIME_DIFF_OFFSET = 12
    INDEX_ENTRY_PREV_INDEX_OFFSET = 16
    INDEX_ENTRY_SIZE = 20
    INDEX_MAX_HASH_SLOT_NUM_DEFAULT = 5000000
    INDEX_MAX_INDEX_NUM_DEFAULT = 5000000 * 4

# ---------------------------------------------------------------------------
# StoreCheckpoint (SPEC.md §4.1): one 4 KiB page
cpdef enum:
    CHECKPOINT_PHYSIC_MSG_TIMESTAMP_OFFSET = 0
    CHECKPOINT_LOGICS_MSG_TIMESTAMP_OFFSET = 8
    CHECKPOINT_INDEX_MSG_TIMESTAMP_OFFSET = 16
    CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET = 24
    CHECKPOINT_CONFIRM_PHY_OFFSET_OFFSET = 32
    CHECKPOINT_FILE_SIZE = 4096

cpdef enum:
    OS_PAGE_SIZE = 4096
