"""rmq.zmqio: multipart send / receive, straight through libzmq (rmq._core.zmqc) and through
pyzmq's Cython backend (the fallback), and protocol.peek_header."""
import os
import subprocess
import sys

import pytest
import zmq

from rmq import protocol as P
from rmq import zmqio
from rmq._core import zmqc
from rmq.protocol import Frame, RequestCode
from rmq.zmqio import ZERO_COPY_MIN_BYTES

IMPLS = {
    "direct": (zmqc.send_parts, zmqc.recv_parts, zmqc.recv_waiting),
    "pyzmq": (zmqio.send_parts_pyzmq, zmqio.recv_parts_pyzmq, zmqio.recv_waiting_pyzmq),
}


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


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


def test_direct_path_in_use_with_pyzmq_wheels():
    """pyzmq's wheels (what the project installs) carry a libzmq 4 that zmqc finds."""
    assert zmqc.available()
    assert zmqio.DIRECT and zmqio.send_parts is zmqc.send_parts and zmqio.recv_waiting is zmqc.recv_waiting
    assert zmqc.ZERO_COPY_MIN_BYTES == ZERO_COPY_MIN_BYTES


def test_direct_path_can_be_turned_off():
    out = subprocess.run([sys.executable, "-c", "from rmq import zmqio; print(zmqio.DIRECT, zmqio.recv_parts.__name__)"],
                         env={**os.environ, "RMQ_ZMQ_DIRECT": "0"}, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "recv_parts_pyzmq"], out.stderr


def test_no_libzmq_found_falls_back_to_pyzmq():
    """When zmqc cannot find libzmq through pyzmq's backend (here: the backend module's file is
    not a loaded library), it says so and rmq.zmqio takes pyzmq's path, which still works."""
    code = """
import sys, types, zmq, zmq.backend.cython as zc
fake = types.ModuleType("zmq.backend.cython._zmq"); fake.__file__ = "/nonexistent/_zmq.so"
real = zc._zmq; zc._zmq = sys.modules["zmq.backend.cython._zmq"] = fake
from rmq._core import zmqc
zc._zmq = sys.modules["zmq.backend.cython._zmq"] = real
from rmq import zmqio
ctx = zmq.Context(); a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
a.bind("inproc://x"); b.connect("inproc://x")
zmqio.send_parts(a, [b"p", b"q"])
print(zmqc.available(), zmqio.DIRECT, zmqio.recv_parts.__name__, [bytes(p) for p in zmqio.recv_parts(b, 0)])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "recv_parts_pyzmq", "[b'p',", "b'q']"], out.stderr


def test_parts_round_trip_small_copied_and_large_zero_copy(pair, impl):
    send_parts, recv_parts, _ = impl
    a, b = pair
    big = bytearray(b"z" * ZERO_COPY_MIN_BYTES)               # at the threshold: zero-copy
    parts = [b"RMQ1", b"h" * (ZERO_COPY_MIN_BYTES - 1), memoryview(big), b""]
    send_parts(a, parts)
    got = recv_parts(b, 0)
    assert [bytes(g) for g in got] == [bytes(p) for p in parts]
    assert [len(g) for g in got] == [len(p) for p in parts]
    assert [bytes(P._buffer(g)) for g in got] == [bytes(p) for p in parts]     # what decode reads
    send_parts(a, [b"one"])                                    # a single part
    assert [bytes(g) for g in recv_parts(b, 0)] == [b"one"]
    send_parts(a, [b"x", b"y"])
    send_parts(b, recv_parts(b, 0))                            # parts sent back as they came
    assert [bytes(g) for g in recv_parts(a, 0)] == [b"x", b"y"]


def test_direct_parts_types_and_metadata():
    """First part and large parts stay in their libzmq message (a Part, as zmq.Frame: .bytes,
    .buffer, get() of the connection's metadata); the others are bytes."""
    ctx = zmq.Context()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = r.bind_to_random_port("tcp://127.0.0.1")
        d.connect(f"tcp://127.0.0.1:{port}")
        zmqc.send_parts(d, [b"RMQ1", b"h" * 10, b"b" * ZERO_COPY_MIN_BYTES], 0)
        got = zmqc.recv_parts(r, 0)
        assert [type(p).__name__ for p in got] == ["Part", "bytes", "bytes", "Part"]
        identity, magic, header, body = got
        assert identity.get("Peer-Address") == "127.0.0.1"       # what rmq.security reads
        with pytest.raises(zmq.ZMQError):
            identity.get("User-Id")                                # no ZAP on this connection
        assert magic == b"RMQ1" and header == b"h" * 10
        assert identity == identity.bytes and bytes(identity.buffer) == identity.bytes and len(identity) == 5
        assert len(body) == ZERO_COPY_MIN_BYTES and body.bytes == b"b" * ZERO_COPY_MIN_BYTES
        assert hash(identity) == hash(identity.bytes)
        zmqc.send_parts(r, [identity, b"back"], 0)                 # an identity routes the answer
        assert zmqc.recv_parts(d, 0)[0].bytes == b"back"
    finally:
        r.close(0)
        d.close(0)
        ctx.term()


def test_security_reads_the_first_part_and_fails_closed(impl):
    """rmq.security's checks on a tcp listener: a loopback peer's first part is loopback and has
    no ZAP User-Id; a part without the connection's metadata (bytes, or an inproc part with no
    Peer-Address) is not taken for a loopback peer, and has no role."""
    from rmq import security as S
    send_parts, recv_parts, _ = impl
    ctx = zmq.Context()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = r.bind_to_random_port("tcp://127.0.0.1")
        d.connect(f"tcp://127.0.0.1:{port}")
        send_parts(d, [b"RMQ1", b"h"])
        first = recv_parts(r, 0)[0]
        assert S.peer_is_loopback(first) is True
        assert S.request_role(first) is None
        a.bind("inproc://sec")
        b.connect("inproc://sec")
        send_parts(a, [b"x"])
        inproc_part = recv_parts(b, 0)[0]
        assert S.peer_is_loopback(inproc_part) is False
        assert S.peer_is_loopback(b"127.0.0.1") is False
        assert S.request_role(b"key") is None
    finally:
        for s in (r, d, a, b):
            s.close(0)
        ctx.term()


def test_monitor_events_drain_without_again_and_skip_bad_messages(impl, monkeypatch):
    """zmqio.monitor_events: a connection's handshake and drop as zmq.Event values, oldest first;
    nothing waiting is [] (no zmq.Again); a malformed event message is skipped."""
    import time
    monkeypatch.setattr(zmqio, "recv_waiting", impl[2])
    ctx = zmq.Context()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    mon = d.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        assert zmqio.monitor_events(mon) == []
        port = r.bind_to_random_port("tcp://127.0.0.1")
        d.connect(f"tcp://127.0.0.1:{port}")
        seen: list = []
        deadline = time.monotonic() + 10
        while zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen and time.monotonic() < deadline:
            mon.poll(100)
            seen += zmqio.monitor_events(mon)
        assert seen == [zmq.EVENT_HANDSHAKE_SUCCEEDED]
        r.close(0)
        while zmq.EVENT_DISCONNECTED not in seen and time.monotonic() < deadline:
            mon.poll(100)
            seen += zmqio.monitor_events(mon)
        assert seen == [zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED]
        a.bind("inproc://mon")
        b.connect("inproc://mon")
        a.send_multipart([b"bad"])
        a.send_multipart([b"\x02\x00\x00\x00\x00\x00", b"tcp://x"])   # "=hi": event 2, CONNECT_DELAYED
        assert b.poll(5000)
        assert zmqio.monitor_events(b) == [zmq.EVENT_CONNECT_DELAYED]
    finally:
        d.disable_monitor()
        for s in (r, d, mon, a, b):
            s.close(0)
        ctx.term()


def test_nothing_waiting_or_queue_full_raises_again(pair, impl):
    send_parts, recv_parts, recv_waiting = impl
    a, b = pair
    with pytest.raises(zmq.Again):
        recv_parts(b)
    assert recv_waiting(b, 10) == []
    a.setsockopt(zmq.SNDHWM, 1)
    with pytest.raises(zmq.Again):
        for _ in range(100_000):
            send_parts(a, [b"x" * 10])


def test_recv_waiting_takes_at_most_limit_in_order(pair, impl):
    send_parts, recv_parts, recv_waiting = impl
    a, b = pair
    for i in range(5):
        send_parts(a, [b"m", str(i).encode()])
    first = recv_waiting(b, 3)
    rest = recv_waiting(b, 10)
    assert [bytes(m[1]) for m in first] == [b"0", b"1", b"2"]
    assert [bytes(m[1]) for m in rest] == [b"3", b"4"]
    assert recv_waiting(b, 10) == []


def test_closed_socket_raises_enotsock(impl):
    send_parts, recv_parts, recv_waiting = impl
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.close(0)
    try:
        for call in (lambda: send_parts(s, [b"x"]), lambda: recv_parts(s), lambda: recv_waiting(s, 1)):
            with pytest.raises(zmq.ZMQError) as e:
                call()
            assert e.value.errno == zmq.ENOTSOCK
    finally:
        ctx.term()


def test_blocking_receive_releases_the_gil(pair):
    """A blocking receive (flags 0) waits without holding the GIL: another thread sends to it."""
    import threading
    a, b = pair
    t = threading.Thread(target=lambda: zmqc.send_parts(a, [b"late"]))
    timer = threading.Timer(0.05, t.start)
    timer.start()
    assert zmqc.recv_parts(b, 0)[0].bytes == b"late"
    timer.join()
    t.join()


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


@pytest.mark.parametrize("impl", ["direct", "pyzmq"])
def test_closed_and_events(pair, impl):
    closed, events = ((zmqc.closed, zmqc.events) if impl == "direct"
                      else (zmqio.closed_pyzmq, zmqio.events_pyzmq))
    a, b = pair
    assert not closed(b)
    assert events(b) & zmq.POLLIN == 0 and events(b) & zmq.POLLOUT
    zmqc.send_parts(a, [b"x"])
    assert events(b) & zmq.POLLIN
    assert events(b) == b.getsockopt(zmq.EVENTS)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.close(0)
    try:
        assert closed(s)
        with pytest.raises(zmq.ZMQError):
            events(s)
    finally:
        ctx.term()


def _until_sleeping(native_id: int, deadline_s: float = 10.0) -> None:
    """Until thread ``native_id`` of this process sleeps in the kernel (state S: blocked in its
    call), or has ended (the caller's checks say why)."""
    import time
    end = time.monotonic() + deadline_s
    while True:
        try:
            with open(f"/proc/self/task/{native_id}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    return
        except FileNotFoundError:
            return
        assert time.monotonic() < end, "the thread never blocked"
        time.sleep(0.005)


@pytest.mark.parametrize("op", ["recv", "send"])
def test_a_blocking_call_interrupted_by_a_signal_is_retried(op):
    """Signals delivered to a thread blocked in zmqc's receive or send (EINTR from libzmq: Python's
    handlers are installed without SA_RESTART) do not end the call: it checks the signals and
    waits again, and then returns what arrives (the send, what it was given once a peer came)."""
    import signal
    import threading
    import time
    ctx = zmq.Context()
    hits = []
    old = signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    a, b = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        got, errors = [], []

        def blocked():
            try:
                if op == "recv":
                    got.append(zmqc.recv_parts(b, 0)[0].bytes)
                else:
                    got.append(zmqc.send_parts(a, [b"waited"], 0))    # no peer yet: PUSH blocks
            except BaseException as e:  # noqa: BLE001 - the test's outcome
                errors.append(e)

        a.bind("inproc://eintr")                      # a socket is used by one thread at a time:
        if op == "recv":                              # only the other one connects later
            b.connect("inproc://eintr")
        t = threading.Thread(target=blocked)
        t.start()
        _until_sleeping(t.native_id)
        for i in range(3):
            signal.pthread_kill(t.ident, signal.SIGUSR1)
            end = time.monotonic() + 10
            while len(hits) <= i and time.monotonic() < end:
                time.sleep(0.005)                     # the handler runs in this (the main) thread
            _until_sleeping(t.native_id)              # and the call waits again
        assert len(hits) == 3 and t.is_alive() and not got and not errors, (hits, got, errors)
        if op == "recv":
            zmqc.send_parts(a, [b"late"], 0)
        else:
            b.connect("inproc://eintr")               # a peer: the send goes
        t.join(10)
        assert not t.is_alive() and not errors, errors
        if op == "recv":
            assert got == [b"late"]
        else:
            assert zmqc.recv_parts(b, 0)[0].bytes == b"waited"
    finally:
        signal.signal(signal.SIGUSR1, old)
        a.close(0)
        b.close(0)
        ctx.term()


def test_a_signal_handler_that_raises_ends_a_blocking_receive_with_its_exception():
    """In the main thread, a handler's exception (KeyboardInterrupt, a timeout) ends zmqc's
    blocking receive with that exception, not a ZMQError, and the socket still works."""
    import signal
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    b.bind("inproc://eintr-raise")
    a.connect("inproc://eintr-raise")

    def alarm(*_):
        raise TimeoutError("alarm")

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(TimeoutError, match="alarm"):
            zmqc.recv_parts(b, 0)
        zmqc.send_parts(a, [b"after"], 0)
        assert zmqc.recv_parts(b, 0)[0].bytes == b"after"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        a.close(0)
        b.close(0)
        ctx.term()
