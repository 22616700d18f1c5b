"""The frame schema: round trips, limits, and decoding that never trusts the peer."""
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq import protocol as P
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode


def test_codes_keep_rocketmq_numbers():
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT,
            RequestCode.REGISTER_BROKER, RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.SEND_BATCH_MESSAGE) == \
        (10, 11, 34, 103, 105, 320)
    assert (ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY, ResponseCode.FLUSH_DISK_TIMEOUT,
            ResponseCode.TOPIC_NOT_EXIST, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED) == \
        (0, 2, 10, 17, 19, 21)


def test_round_trip_keeps_bodies_untouched():
    body = memoryview(b"x" * 1000)
    f = Frame(RequestCode.SEND_MESSAGE, 7, 0, "", {"topic": "T", "queueId": 3}, [body, b"y"])
    parts = P.encode(f)
    assert parts[0] == P.PROTOCOL_MAGIC and parts[2] is body
    g = P.decode(parts)
    assert (g.code, g.opaque, g.fields, [bytes(b) for b in g.bodies]) == (10, 7, f.fields, [b"x" * 1000, b"y"])
    r = g.response(ResponseCode.SUCCESS, fields={"msgId": "A"})
    assert r.is_response and r.opaque == 7 and not g.is_response


@pytest.mark.parametrize("parts,code", [
    ([P.PROTOCOL_MAGIC], ResponseCode.SYSTEM_ERROR),
    ([b"RMQ2", msgpack.packb({"code": 1})], ResponseCode.VERSION_NOT_SUPPORTED),
    ([P.PROTOCOL_MAGIC, b"\xc1"], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({"code": 1}) + b"\x00"], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({"code": True})], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({"code": 1, "fields": [1]})], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({"code": 1, "remark": 5})], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({1: 2})], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, b"\x91" * 5000], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, b"x" * (P.MAX_HEADER_SIZE + 1)], ResponseCode.SYSTEM_ERROR),
    ([P.PROTOCOL_MAGIC, msgpack.packb({"code": 1}), *([b""] * (P.MAX_BODY_PARTS + 1))], ResponseCode.SYSTEM_ERROR),
])
def test_malformed_frames_raise_protocol_error(parts, code):
    with pytest.raises(ProtocolError) as e:
        P.decode(parts)
    assert e.value.code == code and e.value.remark


def test_opaque_is_kept_for_error_replies_when_readable():
    with pytest.raises(ProtocolError) as e:
        P.decode([P.PROTOCOL_MAGIC, msgpack.packb({"opaque": 99, "code": "x"})])
    assert e.value.opaque == 99


def test_encode_limits():
    with pytest.raises(ProtocolError):
        P.encode(Frame(1, bodies=[b""] * (P.MAX_BODY_PARTS + 1)))
    with pytest.raises(ProtocolError):
        P.encode(Frame(1, bodies=[b"x" * (P.MAX_MESSAGE_SIZE + 1)]))
    with pytest.raises(ProtocolError):
        P.encode(Frame(1, fields={"k": "v" * (P.MAX_HEADER_SIZE + 1)}))


def test_encode_after_a_failed_header_and_from_many_threads():
    """encode keeps one msgpack Packer per thread: a header that cannot be packed (or is too
    large) leaves nothing behind for the next, and threads never see each other's bytes."""
    import threading

    with pytest.raises(TypeError):
        P.encode(Frame(1, fields={"a": "x" * 100, "b": object()}))
    with pytest.raises(ProtocolError):
        P.encode(Frame(1, fields={"k": "v" * (P.MAX_HEADER_SIZE + 1)}))
    g = P.decode(P.encode(Frame(2, 5, fields={"k": "v"})))
    assert (g.code, g.opaque, g.fields) == (2, 5, {"k": "v"})

    errors = []

    def run(t):
        try:
            for i in range(2000):
                f = P.decode(P.encode(Frame(t, i, fields={"t": t, "pad": "p" * (i % 50)})))
                assert (f.code, f.opaque, f.fields) == (t, i, {"t": t, "pad": "p" * (i % 50)})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:1]


def test_field_validators():
    f = Frame(1, fields={"i": 5, "s": "abc", "b": True, "x": "5"})
    assert P.field_int(f, "i", lo=0, hi=10) == 5
    assert P.field_str(f, "s") == "abc"
    for name in ("b", "x", "missing"):
        with pytest.raises(ProtocolError, match=name):
            P.field_int(f, name)
    with pytest.raises(ProtocolError, match="outside"):
        P.field_int(f, "i", lo=6)
    with pytest.raises(ProtocolError, match="characters"):
        P.field_str(f, "s", max_len=2)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=5))
def test_decode_never_fails_other_than_protocol_error(parts):
    try:
        P.decode(parts)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_decode_arbitrary_header_bytes(header):
    try:
        f = P.decode([P.PROTOCOL_MAGIC, header])
    except ProtocolError:
        return
    assert isinstance(f.code, int) and isinstance(f.fields, dict)


# -- the C codec of the common case (rmq._core.wire) against msgpack ------------------------------
from rmq._core import wire  # noqa: E402

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=300) | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=20), inner, max_size=20),
    max_leaves=40)
FIELDS = st.dictionaries(st.text(max_size=30), VALUES, max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2 ** 31), 2 ** 31 - 1), st.integers(0, 2 ** 63 - 1), st.integers(0, 3), st.text(max_size=50),
       FIELDS)
def test_the_c_header_codec_writes_and_reads_what_msgpack_does(code, opaque, flag, remark, fields):
    want = msgpack.Packer(use_bin_type=True).pack(
        {"code": code, "opaque": opaque, "flag": flag, "remark": remark, "fields": fields})
    assert wire.encode_header(code, opaque, flag, remark, fields) == want           # byte for byte
    got = wire.decode_header(want, P.MAX_HEADER_SIZE, P.MAX_FIELDS)
    ref = msgpack.unpackb(want, raw=False, strict_map_key=True, **P._UNPACKB_LIMITS)
    assert got == (code, opaque, flag, remark, ref["fields"])
    assert repr(got[4]) == repr(ref["fields"])                                    # same types, same order


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.builds(lambda h, cut: h[:cut],
                                            st.builds(lambda f: msgpack.packb({"code": 1, "fields": f}), FIELDS),
                                            st.integers(0, 400)))
def test_decoding_arbitrary_bytes_gives_msgpacks_frame_or_its_error(raw):
    """Whatever the C decoder takes, it reads as msgpack does; what it refuses, decode() answers
    with msgpack's path (a ProtocolError, never another exception)."""
    try:
        f = P.decode([P.PROTOCOL_MAGIC, raw])
    except ProtocolError:
        f = None
    c = wire.decode_header(raw, P.MAX_HEADER_SIZE, P.MAX_FIELDS)
    if c is not None:
        assert f is not None and (f.code, f.opaque, f.flag, f.remark, f.fields) == c
        ref = msgpack.unpackb(raw, raw=False, strict_map_key=True, **P._UNPACKB_LIMITS)
        assert ref.get("fields", {}) == c[4]


def test_what_the_c_codec_does_not_take_goes_to_msgpacks_path():
    assert wire.encode_header(1, 2, 0, "", {"o": object()}) is None              # msgpack's TypeError then
    assert wire.encode_header(1, 2 ** 64, 0, "", {}) is None                      # past uint64
    assert wire.encode_header(1, 2, 0, "", {"s": "\ud800"}) is None               # not UTF-8 encodable
    for raw in (msgpack.packb({"code": 1, "fields": None}), msgpack.packb({"code": True}),
                msgpack.packb({1: 2}), msgpack.packb({"code": 1}) + b"\x00", b"\x91" * 5000,
                msgpack.packb({"code": 1, "fields": {"e": msgpack.ExtType(1, b"x")}}),
                msgpack.packb({"code": 1, "fields": {"a": list(range(5000))}}),               # max_array_len
                msgpack.packb({"code": 1, "fields": {"m": {str(i): i for i in range(300)}}})):  # max_map_len
        assert wire.decode_header(raw, P.MAX_HEADER_SIZE, P.MAX_FIELDS) is None
    import zmq
    f = P.decode([zmq.Frame(P.PROTOCOL_MAGIC), zmq.Frame(msgpack.packb({"code": 3, "opaque": 2})), zmq.Frame(b"b")])
    assert (f.code, f.opaque, bytes(f.bodies[0])) == (3, 2, b"b")               # zmq.Frames read in place
    g = P.decode(P.encode(Frame(RequestCode.SEND_MESSAGE, 1, remark="r" * (P.MAX_REMARK_LENGTH + 10))))
    assert g.remark == "r" * P.MAX_REMARK_LENGTH and g.code == RequestCode.SEND_MESSAGE


def test_the_decoders_str_cache_never_answers_another_str():
    """Short strs are kept by the C decoder (a direct-mapped cache): thousands of distinct ones,
    colliding in its slots, each read back as itself, twice."""
    names = [f"k{i}" for i in range(3000)] + ["é" * 16, "x" * 32, "x" * 33, ""]
    for _ in range(2):
        for i in range(0, len(names), 100):
            fields = {n: n for n in names[i:i + 100]}
            raw = msgpack.packb({"code": 1, "fields": fields})
            assert wire.decode_header(raw, P.MAX_HEADER_SIZE, P.MAX_FIELDS)[4] == fields


def test_a_header_nested_deeper_than_the_c_decoder_goes_takes_msgpacks_path():
    """rmq._core.wire reads at most MAX_DEPTH (32) levels; a deeper header is msgpack's to read,
    with the same Frame as a result (and msgpack's own limits)."""
    deep = 0
    for _ in range(40):
        deep = [deep]
    raw = msgpack.packb({"code": 1, "opaque": 2, "fields": {"d": deep}})
    assert wire.decode_header(raw, P.MAX_HEADER_SIZE, P.MAX_FIELDS) is None
    f = P.decode([P.PROTOCOL_MAGIC, raw])
    assert (f.code, f.opaque, f.fields) == (1, 2, {"d": deep})
    shallow = msgpack.packb({"code": 1, "fields": {"d": [[[0]]]}})
    assert wire.decode_header(shallow, P.MAX_HEADER_SIZE, P.MAX_FIELDS) == (1, 0, 0, "", {"d": [[[0]]]})
    assert wire.encode_header(1, 2, 0, "", {"d": deep}) is None                     # msgpack packs it
    assert P.decode(P.encode(Frame(1, 2, fields={"d": deep}))).fields == {"d": deep}
