"""RocketMQ remoting frames (rmq.proxy.remoting): both header types round-trip, Java's binary
layout byte for byte, every limit refused with RemotingFrameError and nothing else."""
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq.proxy.remoting import (FLAG_ONEWAY, FLAG_RESPONSE, MAX_FRAME_BYTES, SERIALIZE_JSON, SERIALIZE_ROCKETMQ,
                                RemotingCommand, RemotingFrameError, check_length, decode, encode)

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(-2**15, 2**15 - 1), opaque=st.integers(-2**31, 2**31 - 1), flag=st.integers(0, 3),
       remark=st.none() | text, ext=st.dictionaries(text.filter(bool), text, max_size=8), body=st.binary(max_size=200),
       stype=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
def test_round_trip(code, opaque, flag, remark, ext, body, stype):
    cmd = RemotingCommand(code, opaque, flag, remark, ext, body, "CPP", 63, stype)
    wire = encode(cmd)
    assert struct.unpack(">i", wire[:4])[0] == len(wire) - 4
    back = decode(wire[4:])
    assert (back.code, back.opaque, back.flag, back.ext_fields, back.body, back.serialize_type) == \
        (code, opaque, flag, ext, body, stype)
    assert back.remark == (remark if stype == SERIALIZE_JSON or remark else None)
    assert (back.language, back.version) == ("CPP", 63)


def test_binary_header_layout_is_rocketmqs():
    """RocketMQSerializable.rocketMQProtocolEncode: code i16, language u8, version i16, opaque i32,
    flag i32, remark (i32 length + bytes), extFields (i32 length + (i16 klen, k, i32 vlen, v)*)."""
    wire = encode(RemotingCommand(10, 7, FLAG_ONEWAY, "r", {"a": "bc"}, b"B", "JAVA", 433, SERIALIZE_ROCKETMQ))
    header = struct.pack(">hBhii", 10, 0, 433, 7, 2) + struct.pack(">i", 1) + b"r" + \
        struct.pack(">i", 2 + 1 + 4 + 2) + struct.pack(">h", 1) + b"a" + struct.pack(">i", 2) + b"bc"
    assert wire == struct.pack(">i", 4 + len(header) + 1) + struct.pack(">I", (1 << 24) | len(header)) + header + b"B"


def test_json_header_values_are_strings_and_responses_keep_the_type():
    req = RemotingCommand(105, 9, 0, None, {"topic": "T"}, serialize_type=SERIALIZE_ROCKETMQ)
    resp = req.response(0, None, {"queueOffset": 5, "ok": True, "none": None})
    assert (resp.opaque, resp.flag, resp.serialize_type) == (9, FLAG_RESPONSE, SERIALIZE_ROCKETMQ)
    assert resp.ext_fields == {"queueOffset": "5", "ok": "true"}
    j = encode(RemotingCommand(0, 1, FLAG_RESPONSE, None, {"n": 5}))
    doc = json.loads(j[8:])
    assert doc["extFields"] == {"n": "5"} and doc["code"] == 0


@pytest.mark.parametrize("length", [-1, 0, 3, MAX_FRAME_BYTES + 1])
def test_lengths_outside_the_limits(length):
    with pytest.raises(RemotingFrameError):
        check_length(length)
    check_length(4)
    check_length(MAX_FRAME_BYTES)


def test_an_encoded_frame_over_the_limit_is_refused():
    with pytest.raises(RemotingFrameError, match="limit"):
        encode(RemotingCommand(10, body=b"x" * MAX_FRAME_BYTES))


@pytest.mark.parametrize("data", [
    b"",                                                          # no header-length word
    struct.pack(">I", 10) + b"{}",                                # header past the frame
    struct.pack(">I", 3) + b"{x}",                                # not JSON
    struct.pack(">I", 2) + b"[]",                                 # JSON, not an object
    struct.pack(">I", 12) + b'{"code":"x"}',                      # code not an integer
    struct.pack(">I", (9 << 24) | 2) + b"{}",                     # unknown serialize type
    struct.pack(">I", (1 << 24) | 3) + b"\x00\x0a\x00",           # truncated binary header
    struct.pack(">I", (1 << 24) | 17) + struct.pack(">hBhii", 1, 0, 0, 0, 0) + struct.pack(">i", 99),  # remark past
    (lambda h: struct.pack(">I", (1 << 24) | len(h)) + h)(
        struct.pack(">hBhii", 1, 0, 0, 0, 0) + struct.pack(">i", 0) + struct.pack(">i", 3) + b"\x00\x05a"),  # key past
])
def test_malformed_frames_raise_remoting_frame_error(data):
    with pytest.raises(RemotingFrameError):
        decode(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_or_raise_remoting_frame_error(data):
    try:
        decode(data)
    except RemotingFrameError:
        pass
