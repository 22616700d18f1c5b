"""RocketMQ's own numbers, pinned (STYLE.md §7.2; SPEC.md §1-§4)."""
import struct

from rmq._core import layout as L


def test_commitlog_positions_match_messagedecoder():
    assert L.MSG_MAGIC_CODE_OFFSET == 4          # MESSAGE_MAGIC_CODE_POSTION
    assert L.MSG_FLAG_OFFSET == 16               # MESSAGE_FLAG_POSTION
    assert L.MSG_QUEUE_OFFSET_OFFSET == 20
    assert L.MSG_PHYSICAL_OFFSET_OFFSET == 28    # MESSAGE_PHYSIC_OFFSET_POSTION
    assert L.MSG_SYS_FLAG_OFFSET == 36
    assert L.MSG_STORE_TIMESTAMP_OFFSET_IPV4 == 56  # MESSAGE_STORE_TIMESTAMP_POSTION
    assert L.MSG_FIXED_LENGTH_IPV4_V1 == 91


def test_magic_codes():
    assert L.MESSAGE_MAGIC_CODE & 0xFFFFFFFF == 0xDAA320A7
    assert L.MESSAGE_MAGIC_CODE_V2 & 0xFFFFFFFF == 0xDAA320AB
    assert L.BLANK_MAGIC_CODE & 0xFFFFFFFF == 0xCBD43194
    assert L.END_FILE_MIN_BLANK_LENGTH == 8


def test_consume_queue_and_index_geometry():
    assert struct.calcsize(">qiq") == L.CQ_STORE_UNIT_SIZE == 20
    assert L.CQ_ENTRIES_PER_FILE_DEFAULT * L.CQ_STORE_UNIT_SIZE == 6_000_000
    assert L.INDEX_HEADER_SIZE == 40
    assert L.INDEX_ENTRY_SIZE == 20
    assert (L.INDEX_HEADER_SIZE + L.INDEX_MAX_HASH_SLOT_NUM_DEFAULT * 4
            + L.INDEX_MAX_INDEX_NUM_DEFAULT * 20) == 420_000_040


def test_sysflag_bits():
    assert (L.COMPRESSED_FLAG, L.MULTI_TAGS_FLAG, L.BORNHOST_V6_FLAG, L.STOREHOSTADDRESS_V6_FLAG) == (1, 2, 16, 32)
    assert (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_COMMIT_TYPE, L.TRANSACTION_ROLLBACK_TYPE) == (4, 8, 12)
    assert L.CRC32_RESERVED_LENGTH == 20


def test_limits():
    assert L.TOPIC_MAX_LENGTH == 127
    assert L.PROPERTIES_MAX_LENGTH == 32767
    assert L.MAX_MESSAGE_SIZE_DEFAULT == 4 * 1024 * 1024
