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
