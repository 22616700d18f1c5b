"""The remoting proxy's limits (rmq/proxy/server.py): MAX_CONNECTIONS, MAX_IN_FLIGHT_PER_CONNECTION,
CHANNEL_MAX_IDLE_S, and 10,000 idle connections against the real ``rmq proxy`` process.

The limit tests run a :class:`ProxyServer` on its own event loop in a thread of the test process with
the constant lowered (monkeypatch), so that the limit is reached with a few sockets; the handler that
holds requests open is registered on that real server (a request code RocketMQ does not use)."""
import asyncio
import socket
import struct
import subprocess
import threading

import pytest

from rmq.launch import child_env, python_argv
from rmq.proxy import server as proxy_server
from rmq.proxy.remoting import RemotingCommand, decode, encode
from tests.integration.test_consumer import wait_for

pytestmark = pytest.mark.integration
HOLD_CODE = 64999            # not a RocketMQ request code: the tests' held request
UNKNOWN_CODE = 64998         # answered at once with REQUEST_CODE_NOT_SUPPORTED


class ThreadProxy:
    """A ProxyServer on 127.0.0.1:0 in a thread's event loop (its NameServer is never asked here)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.release = None
        self.held = 0
        self.max_held = 0
        ready = threading.Event()

        async def main():
            self.release = asyncio.Event()
            self.server = proxy_server.ProxyServer("127.0.0.1:1", listen_port=0)
            self.server.handlers[HOLD_CODE] = self._hold
            await self.server.start()
            self.stop = asyncio.Event()
            ready.set()
            await self.stop.wait()
            await self.server.close()

        def run():
            try:
                self.loop.run_until_complete(main())
            except (asyncio.CancelledError, RuntimeError):
                pass
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30), "the in-process proxy did not start"
        self.addr = ("127.0.0.1", self.server.listen_port)

    async def _hold(self, cmd, born_host):
        self.held += 1
        self.max_held = max(self.max_held, self.held)
        try:
            await self.release.wait()
        finally:
            self.held -= 1
        return cmd.response()

    def call(self, fn):
        return asyncio.run_coroutine_threadsafe(_call(fn), self.loop).result(10)

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        if not self.thread.is_alive():
            self.loop.close()


async def _call(fn):
    return fn()


def connect(addr, timeout=10.0) -> socket.socket:
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_frame(s) -> RemotingCommand:
    head = _exact(s, 4)
    return decode(_exact(s, struct.unpack(">i", head)[0]))


def _exact(s, n) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def is_closed(s, timeout=0.05) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionError:
        return True


@pytest.fixture
def tproxy():
    p = ThreadProxy()
    yield p
    p.close()


def test_max_connections_refuses_the_extra_ones_and_serves_the_rest(monkeypatch, tproxy):
    monkeypatch.setattr(proxy_server, "MAX_CONNECTIONS", 20)
    conns = [connect(tproxy.addr) for _ in range(20)]
    wait_for(lambda: tproxy.call(lambda: tproxy.server.connections) == 20, 30, what="20 connections accepted")
    extra = [connect(tproxy.addr) for _ in range(5)]
    try:
        for s in extra:                                   # closed by the proxy at once
            assert wait_for(lambda s=s: is_closed(s), 30, what="an extra connection closed")
        assert tproxy.call(lambda: tproxy.server.stats["refusedConnections"]) == 5
        conns[7].sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=1)))
        assert read_frame(conns[7]).code == 3             # the accepted ones are served
        conns.pop().close()                               # a slot frees: a new connection is taken
        wait_for(lambda: tproxy.call(lambda: tproxy.server.connections) == 19, 30, what="a closed connection counted")
        with connect(tproxy.addr) as s:
            s.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=2)))
            assert read_frame(s).opaque == 2
    finally:
        for s in conns + extra:
            s.close()


def test_max_in_flight_per_connection_stops_reading_until_answers_go(monkeypatch, tproxy):
    monkeypatch.setattr(proxy_server, "MAX_IN_FLIGHT_PER_CONNECTION", 4)
    with connect(tproxy.addr) as s:
        for i in range(10):
            s.sendall(encode(RemotingCommand(HOLD_CODE, opaque=100 + i)))
        s.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=7)))
        wait_for(lambda: tproxy.call(lambda: tproxy.held) == 4, 30, what="4 requests in flight")
        s.settimeout(0.5)
        with pytest.raises((TimeoutError, socket.timeout)):
            s.recv(1)                                     # the 5th request and the rest are not read
        assert tproxy.call(lambda: tproxy.held) == 4      # nothing past the limit started meanwhile
        tproxy.loop.call_soon_threadsafe(tproxy.release.set)
        s.settimeout(10)
        got = sorted(read_frame(s).opaque for _ in range(11))
        assert got == [7] + list(range(100, 110))         # every request answered once
    assert tproxy.max_held == 4


# CHANNEL_MAX_IDLE_S of the idle test: the busy connection sends a frame every ~0.25 s from the test's
# thread, in the proxy's process; a stall of that process (1.5 s on a loaded machine) must not make it idle
IDLE_S = 3.0


def test_a_connection_without_a_complete_frame_for_the_idle_time_is_closed(monkeypatch, tproxy):
    monkeypatch.setattr(proxy_server, "CHANNEL_MAX_IDLE_S", IDLE_S)
    monkeypatch.setattr(proxy_server, "IDLE_SWEEP_S", 0.1)
    tproxy.call(lambda: tproxy.server._sweeper.cancel())
    tproxy.call(lambda: setattr(tproxy.server, "_sweeper", tproxy.loop.create_task(tproxy.server._sweep_idle())))
    with connect(tproxy.addr) as half, connect(tproxy.addr) as busy:
        half.sendall(struct.pack(">i", 50) + b"half")    # then silence
        closed = []

        def half_closed():
            busy.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=3)))   # a frame keeps it alive
            assert read_frame(busy).opaque == 3
            if is_closed(half, 0.2):
                closed.append(True)
            return bool(closed)
        wait_for(half_closed, 30, what="the half-frame connection closed after the idle time")
        busy.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=4)))
        assert read_frame(busy).opaque == 4


IDLE_CONNECTIONS = 10_000     # issue 14: "10,000 idle connections: ... the proxy stays up"


def test_ten_thousand_idle_connections_leave_the_proxy_serving():
    p = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", "127.0.0.1:1", "--listen-port", "0", "--no-grpc"),
                         stdout=subprocess.PIPE, text=True, env=child_env())
    conns = []
    try:
        host, port = p.stdout.readline().split()[1].rsplit(":", 1)
        addr = (host, int(port))
        for _ in range(IDLE_CONNECTIONS):
            s = connect(addr, timeout=30)
            # closed with a reset: 10,000 client ports in TIME_WAIT would starve the tests that follow
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conns.append(s)
        with connect(addr) as s:
            s.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=9)))
            assert read_frame(s).code == 3
        for s in conns[::997]:                         # the idle ones are still open and served
            s.sendall(encode(RemotingCommand(UNKNOWN_CODE, opaque=10)))
            assert read_frame(s).opaque == 10
    finally:
        for s in conns:
            s.close()
        p.terminate()
        assert p.wait(30) == 0
        p.stdout.close()
