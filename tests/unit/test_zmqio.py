"""rmq.zmqio: multipart send / receive through pyzmq's Cython backend, and protocol.peek_header."""
import pytest
import zmq

from rmq import protocol as P
from rmq.protocol import Frame, RequestCode
from rmq.zmqio import ZERO_COPY_MIN_BYTES, recv_parts, send_parts


@pytest.fixture
def pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://zmqio")
    b.connect("inproc://zmqio")
    yield a, b
    a.close(0)
    b.close(0)
    ctx.term()


def test_parts_round_trip_small_copied_and_large_zero_copy(pair):
    a, b = pair
    big = bytearray(b"z" * ZERO_COPY_MIN_BYTES)               # at the threshold: zero-copy
    parts = [b"RMQ1", b"h" * (ZERO_COPY_MIN_BYTES - 1), memoryview(big), b""]
    send_parts(a, parts)
    got = recv_parts(b, 0)
    assert [g.bytes for g in got] == [bytes(p) for p in parts]
    assert not got[-1].more and all(g.more for g in got[:-1])
    send_parts(a, [b"one"])                                    # a single part
    assert [g.bytes for g in recv_parts(b, 0)] == [b"one"]
    f = recv_parts                                             # frames sent back as they came
    send_parts(a, [b"x", b"y"])
    send_parts(b, f(b, 0))
    assert [g.bytes for g in recv_parts(a, 0)] == [b"x", b"y"]


def test_nothing_waiting_or_queue_full_raises_again(pair):
    a, b = pair
    with pytest.raises(zmq.Again):
        recv_parts(b)
    a.setsockopt(zmq.SNDHWM, 1)
    with pytest.raises(zmq.Again):
        for _ in range(100_000):
            send_parts(a, [b"x" * 10])


def test_peek_header_reads_code_opaque_flag_only():
    parts = P.encode(Frame(RequestCode.SEND_MESSAGE, opaque=77, flag=P.FLAG_ONEWAY, fields={"topic": "T"},
                           bodies=[b"b"]))
    assert P.peek_header(parts[0], parts[1]) == (int(RequestCode.SEND_MESSAGE), 77, P.FLAG_ONEWAY)
    bad = [(b"RMQ9", parts[1], "unknown protocol"),
           (parts[0], b"\xc1", "malformed"),
           (parts[0], P.encode(Frame(10))[1][:-2], "malformed"),
           (parts[0], b"\x93\x01\x02\x03", "must be a map"),
           (parts[0], b"\x81\xa4code\xa210", "must be ints"),
           (parts[0], b"\x81\xa4code\xc3", "must be ints"),
           (parts[0], b"\x00" * (P.MAX_HEADER_SIZE + 1), "exceeds")]
    for magic, header, words in bad:
        with pytest.raises(P.ProtocolError, match=words):
            P.peek_header(magic, header)
