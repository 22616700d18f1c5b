"""CommitLog record codec: golden bytes written from SPEC.md §1, and edge cases."""
import os
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq._core import commitlog as cl
from rmq._core.mapped_file import MappedFile
from rmq.errors import CorruptRecordError, MessageIllegalError
from tests.reference import codec as ref

BORN_HOST = bytes([192, 168, 0, 1]) + struct.pack(">i", 54321)
STORE_HOST = bytes([10, 0, 0, 7]) + struct.pack(">i", 10911)


def golden_record(body, topic, props, queue_id, queue_offset, phys, sys_flag, born_ts, store_ts,
                  flag=0, prop_crc=True):
    """Build the record field by field from SPEC.md §1.2 with struct (IPv4 hosts, V1)."""
    if prop_crc:
        props_stored = props + b"__CRC32#\x01" + b"0" * 10 + b"\x02"
    else:
        props_stored = props
    total = 91 + len(body) + len(topic) + len(props_stored)
    rec = bytearray()
    rec += struct.pack(">i", total)                       # 1 TOTALSIZE
    rec += struct.pack(">I", 0xDAA320A7)                  # 2 MAGICCODE
    rec += struct.pack(">i", ref.crc(body))               # 3 BODYCRC
    rec += struct.pack(">i", queue_id)                    # 4 QUEUEID
    rec += struct.pack(">i", flag)                        # 5 FLAG
    rec += struct.pack(">q", queue_offset)                # 6 QUEUEOFFSET
    rec += struct.pack(">q", phys)                        # 7 PHYSICALOFFSET
    rec += struct.pack(">i", sys_flag)                    # 8 SYSFLAG
    rec += struct.pack(">q", born_ts)                     # 9 BORNTIMESTAMP
    rec += BORN_HOST                                      # 10 BORNHOST
    rec += struct.pack(">q", store_ts)                    # 11 STORETIMESTAMP
    rec += STORE_HOST                                     # 12 STOREHOSTADDRESS
    rec += struct.pack(">i", 0)                           # 13 RECONSUMETIMES
    rec += struct.pack(">q", 0)                           # 14 PREPARED TRANSACTION OFFSET
    rec += struct.pack(">i", len(body)) + body            # 15 BODY
    rec += struct.pack(">b", len(topic)) + topic          # 16 TOPIC (V1: 1 byte)
    rec += struct.pack(">h", len(props_stored)) + props_stored   # 17 PROPERTIES
    assert len(rec) == total
    if prop_crc:
        c = ref.crc(bytes(rec[:total - 20]))
        digits = "".join(str(c // 10 ** i % 10) for i in range(10)).encode()  # least significant first
        rec[total - 11:total - 1] = digits
    return bytes(rec)


def append(mf, messages, topic=b"TopicTest", queue_id=3, queue_offset=7, sys_flag=0, born_ts=1700000000000,
           store_ts=1700000000123, extra=b"", prop_crc=True):
    batch = cl.encode_batch(messages)
    out = array("q", [0] * len(messages))
    res = cl.append_batch(mf, batch, topic, queue_id, queue_offset, sys_flag, born_ts, BORN_HOST, STORE_HOST,
                          store_ts, extra, prop_crc, 0, 0, 4 * 1024 * 1024, out)
    return res, list(out)


@pytest.fixture
def mf(tmp_path):
    f = MappedFile(str(tmp_path / "00000000000000000000"), 64 * 1024)
    yield f
    f.close()


@pytest.mark.parametrize("prop_crc", [True, False])
def test_golden_record(mf, prop_crc):
    props = b"TAGS\x01TagA\x02KEYS\x01OrderID188\x02"
    (status, count, wrote, qinc), offs = append(mf, [(b"Hello RocketMQ", props, 0)], prop_crc=prop_crc)
    expected = golden_record(b"Hello RocketMQ", b"TopicTest", props, 3, 7, 0, 0, 1700000000000,
                             1700000000123, prop_crc=prop_crc)
    assert (status, count, wrote, qinc, offs) == (cl.PUT_OK, 1, len(expected), 1, [0])
    assert mf.read(0, len(expected)) == expected
    assert mf.wrote_position == len(expected)


def test_golden_record_fixed_overhead_is_91_bytes(mf):
    (_, _, wrote, _), _ = append(mf, [(b"", b"", 0)], topic=b"T", prop_crc=False)
    assert wrote == 91 + 1


def test_golden_batch_element():
    # SPEC.md §1.11: TOTALSIZE 4 | MAGIC 0 | BODYCRC 0 | FLAG 4 | BODYLEN 4 + BODY | PROPLEN 2 + PROPS
    got = cl.encode_batch([(b"abc", b"K\x01V\x02", 5)])
    assert got == struct.pack(">iiiii", 29, 0, 0, 5, 3) + b"abc" + struct.pack(">h", 4) + b"K\x01V\x02"


def test_second_record_physical_and_queue_offsets(mf):
    (_, count, wrote, _), offs = append(mf, [(b"a" * 10, b"", 1), (b"b" * 20, b"X\x01Y\x02", 2)])
    first = ref.decode(mf.read(0, wrote), 0)
    second = ref.decode(mf.read(0, wrote), first["total"])
    assert offs == [0, first["total"]]
    assert (first["queue_offset"], second["queue_offset"]) == (7, 8)
    assert second["physical_offset"] == first["total"]
    assert (first["flag"], second["flag"]) == (1, 2)
    assert second["properties"]["X"] == "Y" and "__CRC32#" in second["properties"]


def test_batch_level_properties_are_appended_with_separator(mf):
    (_, _, wrote, _), _ = append(mf, [(b"x", b"A\x011", 0)], extra=b"B\x012\x02", prop_crc=False)
    rec = ref.decode(mf.read(0, wrote))
    assert rec["properties_raw"] == b"A\x011\x02B\x012\x02"


def test_long_system_topic_uses_v2_magic(mf):
    topic = ("%RETRY%" + "g" * 150).encode()
    (_, _, wrote, _), _ = append(mf, [(b"x", b"", 0)], topic=topic)
    rec = ref.decode(mf.read(0, wrote))
    assert rec["magic"] == ref.MAGIC_V2 and rec["topic"] == topic.decode()
    assert cl.decode_records(mf.read(0, wrote), True, True)[0].topic == topic.decode()


def test_ipv6_hosts_set_sysflag_bits(mf, tmp_path):
    v6 = bytes(range(16)) + struct.pack(">i", 9)
    batch = cl.encode_batch([(b"x", b"", 0)])
    out = array("q", [0])
    _, _, wrote, _ = cl.append_batch(mf, batch, b"T", 0, 0, 0, 1, v6, v6, 2, b"", True, 0, 0, 1 << 22, out)
    rec = ref.decode(mf.read(0, wrote))
    assert rec["sys_flag"] & 0x30 == 0x30 and rec["born_host"] == v6 and rec["store_host"] == v6
    m = cl.decode_records(mf.read(0, wrote), True, True)[0]
    assert len(m.offset_msg_id) == 56 and cl.decode_message_id(m.offset_msg_id) == (v6, 0)


def test_decoded_records_share_equal_hosts_and_keep_different_ones(mf):
    """decode_records shares one bytes for equal born / store hosts of consecutive records (a
    page's usual case) and still gives each record its own when they differ (two producers, an
    IPv6 one among them)."""
    v4a, v4b = BORN_HOST, bytes([10, 0, 0, 9]) + struct.pack(">i", 4242)
    v6 = bytes(range(16)) + struct.pack(">i", 9)
    batch = cl.encode_batch([(b"x", b"", 0), (b"y", b"", 0)])
    wrote = 0
    for born, sys_flag in ((v4a, 0), (v4a, 0), (v4b, 0), (v6, 0x10), (v4a, 0)):
        out = array("q", [0, 0])
        _, _, w, _ = cl.append_batch(mf, batch, b"T", 0, 0, sys_flag, 1, born, STORE_HOST, 2, b"", True, 0, 0,
                                     1 << 22, out)
        wrote += w
    ms = cl.decode_records(mf.read(0, wrote), True, True)
    assert [m.born_host for m in ms] == [v4a] * 4 + [v4b] * 2 + [v6] * 2 + [v4a] * 2
    assert all(m.store_host == STORE_HOST for m in ms)
    assert ms[0].born_host is ms[3].born_host and ms[0].store_host is ms[9].store_host
    assert ms[5].born_host is not ms[6].born_host


def test_end_of_file_blank_record(tmp_path):
    f = MappedFile(str(tmp_path / "00000000000000000000"), 1024)
    (_, _, w1, _), _ = append(f, [(b"x" * 500, b"", 0)])
    (status, count, w2, _), _ = append(f, [(b"y" * 500, b"", 0)])
    assert status == cl.END_OF_FILE and count == 0 and w2 == 1024 - w1
    assert f.read(w1, 8) == struct.pack(">iI", 1024 - w1, 0xCBD43194)
    assert f.wrote_position == 1024
    assert cl.check_message(f.read(0, 1024), w1) == ("BLANK", 1024 - w1)
    f.close()


def test_batch_larger_than_a_file_is_refused_without_writing(tmp_path):
    f = MappedFile(str(tmp_path / "00000000000000000000"), 1024)
    with pytest.raises(MessageIllegalError, match="more than a CommitLog file"):
        append(f, [(b"x" * 1000, b"", 0)])
    assert f.wrote_position == 0 and f.read(0, 16) == b"\0" * 16
    f.close()


@pytest.mark.parametrize("bad", [
    b"\x00\x00\x00\x05",                                                  # too short
    struct.pack(">iiiii", 100, 0, 0, 0, 3) + b"abc\x00\x00",              # TOTALSIZE beyond buffer
    struct.pack(">iiiii", 25, 0, 0, 0, 9) + b"abc\x00\x00",               # body length beyond element
    struct.pack(">iiiii", 25, 0, 0, 0, 3) + b"abc\x00\x05",               # properties length mismatch
    b"",                                                                  # empty batch
])
def test_malformed_batch_is_refused_without_writing(mf, bad):
    out = array("q", [0] * 4)
    with pytest.raises(MessageIllegalError):
        cl.append_batch(mf, bad, b"T", 0, 0, 0, 1, BORN_HOST, STORE_HOST, 2, b"", True, 0, 0, 1 << 22, out)
    assert mf.wrote_position == 0


def test_check_message_outcomes(mf):
    (_, _, wrote, _), _ = append(mf, [(b"payload", b"", 0)])
    data = bytearray(mf.read(0, 4096))
    assert cl.check_message(bytes(data), 0) == ("OK", wrote)
    assert cl.check_message(bytes(data[:wrote - 1]), 0)[0] == "TRUNCATED"
    assert cl.check_message(bytes(data), wrote)[0] == "BAD_MAGIC"      # zeroed tail
    flipped = bytearray(data)
    flipped[wrote - 30] ^= 0x01                                         # inside the body/topic area
    assert cl.check_message(bytes(flipped), 0)[0] in ("BAD_CRC", "BAD_LENGTH")
    assert cl.check_message(bytes(flipped), 0, False)[0] in ("OK", "BAD_LENGTH")


def test_whole_record_crc_catches_header_corruption(mf):
    (_, _, wrote, _), _ = append(mf, [(b"payload", b"", 0)])
    data = bytearray(mf.read(0, wrote))
    data[40] ^= 0x10                      # born timestamp: not covered by the body CRC
    assert cl.check_message(bytes(data), 0) == ("BAD_CRC", wrote)
    with pytest.raises(CorruptRecordError):
        cl.decode_records(bytes(data), True, True)


def test_properties_parse_both_trailing_forms():
    assert cl.decode_properties(b"A\x011\x02B\x012\x02") == {"A": "1", "B": "2"}
    assert cl.decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}
    # SPEC.md §1.6: segments < 3 chars, no \x01, \x01 first or last are ignored
    assert cl.decode_properties(b"A\x02\x01x\x02k\x01\x02C\x01v") == {"C": "v"}


def test_properties_refuse_separators():
    with pytest.raises(MessageIllegalError):
        cl.encode_properties({"a\x01": "b"})
    with pytest.raises(MessageIllegalError):
        cl.encode_properties({"a": "b\x02"})


def test_message_id_round_trip():
    mid = cl.create_message_id(STORE_HOST, 0x0102030405060708)
    assert mid == "0A00000700002A9F0102030405060708"
    assert cl.decode_message_id(mid) == (STORE_HOST, 0x0102030405060708)
    with pytest.raises(ValueError):
        cl.decode_message_id("ABC")


@pytest.mark.parametrize("s", ["", "TagA", "a", "键🙂", "\u00e9\u00e8", "x" * 300])
def test_tags_code_is_java_hashcode(s):
    assert cl.tags_string_to_tags_code(s) == (ref.java_hash(s) if s else 0)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_tags_code_matches_java_for_any_text(s):
    s2 = s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    assert cl.tags_string_to_tags_code(s2) == (ref.java_hash(s2) if s2 else 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300),
                          st.dictionaries(st.text(alphabet="abcXYZ_", min_size=1, max_size=8),
                                          st.text(alphabet="abc 123", min_size=1, max_size=20), max_size=4),
                          st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=20))
def test_batch_round_trip_against_reference_decoder(tmp_path_factory, msgs):
    d = tmp_path_factory.mktemp("rt")
    f = MappedFile(str(d / "00000000000000000000"), 256 * 1024)
    enc = [(b, cl.encode_properties(p), fl) for b, p, fl in msgs]
    (status, count, wrote, _), offs = append(f, enc, queue_offset=100)
    assert status == cl.PUT_OK and count == len(msgs)
    data = f.read(0, wrote)
    decoded = cl.decode_records(data, True, True)
    pos = 0
    for i, ((body, props, flag), m) in enumerate(zip(msgs, decoded)):
        r = ref.decode(data, pos)
        assert r["body"] == body == m.body and r["flag"] == flag == m.flag
        assert r["queue_offset"] == 100 + i == m.queue_offset
        assert r["physical_offset"] == offs[i] == m.commitlog_offset
        assert {k: v for k, v in m.properties.items() if k != "__CRC32#"} == props
        assert r["body_crc"] == ref.crc(body)
        pos += r["total"]
    assert pos == wrote
    f.close()


def test_mapped_files_hold_no_descriptor(tmp_path):
    """A mapping outlives its descriptor: a store of thousands of small files must not run the
    process out of file descriptors (the 200-cycle kill -9 loop did, one fd per mapped file)."""
    before = len(os.listdir("/proc/self/fd"))
    files = [MappedFile(str(tmp_path / f"{i * 4096:020d}"), 4096) for i in range(200)]
    assert len(os.listdir("/proc/self/fd")) - before < 10
    files[0].append(b"kept")
    files[0].flush()
    assert files[0].read(0, 4) == b"kept"
    for f in files:
        f.close()


def test_pulled_messages_are_not_for_the_cyclic_gc():
    """MessageExt (a pull's messages, hundreds per poll) is not GC-tracked: what it holds never
    refers back to it, and the collections that tracking them caused ran in poll() (about 20 %
    of PullConsumer.poll's time)."""
    import gc

    from rmq._core.commitlog import MessageExt
    m = MessageExt.__new__(MessageExt)
    m.properties = {"TAGS": "a"}
    m.body = b"x"
    assert not gc.is_tracked(m) and m.tags == "a"


_PROP_BYTES = st.lists(st.sampled_from([b"TAGS", b"TAG", b"TAGSX", b"KEYS", b"a", b"\x01", b"\x02", b"\xe2\x82",
                                        b"\xff", b"v", b"x\x01y", b""]), max_size=12).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(props=_PROP_BYTES)
def test_tags_read_in_place_are_what_the_parsed_properties_say(props):
    """MessageExt.tags reads TAGS from the stored properties string while the dict is not parsed
    (the tag filter of a pulled page): the same value as the dict's, for any properties bytes
    (duplicates: the last; empty values: absent; bad UTF-8: replaced)."""
    rec = golden_record(b"body", b"T", props, 0, 0, 0, 0, 1, 2, prop_crc=False)
    fast, = cl.decode_records(rec)
    parsed, = cl.decode_records(rec)
    expected = parsed.properties.get("TAGS")      # parses the dict first
    assert fast.tags == expected and parsed.tags == expected
