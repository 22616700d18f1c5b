"""RemotingClient: blocking request / response over a DEALER socket per address (one client per
thread): the consumers' calls (:class:`rmq.client.consumer_api.ConsumerAPI`), ``Admin``, and the
producer's direct ``send`` path (:mod:`rmq.client.direct`, with ``immediate`` sockets and a
HEART_BEAT as each connection's first frame).

``invoke(addr, frame, timeout_ms)`` sends a request to ``tcp://addr`` and waits for the response
with the same opaque; ``invoke_oneway`` sends without waiting.  Responses that arrive after their
request timed out (or frames that do not decode) are dropped.  Each connection has a monitor:
when it drops with a request in flight the request fails at once with
:class:`rmq.errors.RemotingConnectionClosedError` (a RemotingTimeoutError)
(an answer that made it before the close still counts) instead of at its deadline, and until the
connection's next handshake a request to it waits at most ``RECONNECT_WAIT_MS``.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Callable, Optional

import zmq

from rmq import protocol as P
from rmq import security
from rmq.errors import RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError
from rmq.zmqio import monitor_events, recv_parts, send_parts

DEFAULT_TIMEOUT_MS = 3000
RECONNECT_WAIT_MS = 3_000      # a request to an address whose connection dropped waits this long for it to come back

log = logging.getLogger("rmq.client.remoting")

__all__ = ["RemotingClient", "RemotingTimeoutError", "DEFAULT_TIMEOUT_MS", "RECONNECT_WAIT_MS"]

_MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class _Channel:
    __slots__ = ("sock", "monitor", "poller", "need_first")

    def __init__(self, sock: zmq.Socket, monitor: zmq.Socket):
        self.sock, self.monitor = sock, monitor
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(monitor, zmq.POLLIN)
        self.need_first = True            # on_connect's frame goes before the next request

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
        self.sock.close(0)


class RemotingClient:
    """One DEALER socket per remote address; not thread-safe (one per thread).

    Parameters
    ----------
    ctx : zmq.Context, optional
        Default: the process's shared context.
    auth : optional
        CURVE client keys, see :func:`rmq.security.client_auth` (None: the environment's
        RMQ_AUTH_CLIENT_KEY / RMQ_AUTH_SERVER_KEY, else plain).
    immediate : bool
        ZMQ_IMMEDIATE: a request is written only to a connected peer; :meth:`invoke` waits for the
        connection up to its ``connect_timeout_ms``, then raises RemotingError.
    on_connect : callable, optional
        ``on_connect(addr) -> Frame``: written before the first request on each connection (and
        again after it dropped), without awaiting an answer (the producer's HEART_BEAT).
    """

    def __init__(self, ctx: Optional[zmq.Context] = None, auth=None, *, immediate: bool = False,
                 on_connect: Optional[Callable[[str], Frame]] = None):
        self.ctx = ctx or zmq.Context.instance()
        self.auth = security.client_auth(auth)
        self.immediate = immediate
        self.on_connect = on_connect
        self._channels: dict[str, _Channel] = {}
        self._down: set = set()
        self._opaque = itertools.count(1)

    def _channel(self, addr: str) -> _Channel:
        ch = self._channels.get(addr)
        if ch is None:
            s = P.dealer(self.ctx, auth=self.auth)
            if self.immediate:
                s.setsockopt(zmq.IMMEDIATE, 1)         # before connect: a send fails fast (Again) while not connected
            monitor = s.get_monitor_socket(_MONITOR_EVENTS)
            s.connect(P.endpoint(addr))
            ch = self._channels[addr] = _Channel(s, monitor)
        return ch

    def _socket(self, addr: str) -> zmq.Socket:
        return self._channel(addr).sock

    def _send(self, ch: _Channel, addr: str, parts: list, connect_deadline: float) -> None:
        while True:
            try:
                send_parts(ch.sock, parts)
                return
            except zmq.Again:                            # not connected (immediate) or the queue is full
                left_ms = (connect_deadline - time.monotonic()) * 1000.0
                if left_ms <= 0 or not ch.sock.poll(left_ms, zmq.POLLOUT):
                    raise RemotingError(f"connect to {addr} failed (not connected within the connect timeout)") \
                        from None

    def invoke(self, addr: str, frame: Frame, timeout_ms: float = DEFAULT_TIMEOUT_MS,
               connect_timeout_ms: Optional[float] = None) -> Frame:
        """Send ``frame`` (its opaque set here) and return its response.

        Raises
        ------
        RemotingTimeoutError
            No response in ``timeout_ms`` (at most RECONNECT_WAIT_MS while the address's
            connection is down).
        RemotingError
            Not written within ``connect_timeout_ms`` (default: ``timeout_ms``), or the
            connection dropped with the request in flight.
        ProtocolError
            ``frame`` cannot be encoded.
        """
        ch = self._channel(addr)
        self._dropped(ch, addr)             # events from before this request: a drop then is not this one's
        if addr in self._down:
            timeout_ms = min(timeout_ms, RECONNECT_WAIT_MS)
        frame.opaque = next(self._opaque)
        frame.flag &= ~P.FLAG_ONEWAY
        parts = P.encode(frame)
        now = time.monotonic()
        deadline = now + timeout_ms / 1000.0
        connect_deadline = min(deadline, now + (connect_timeout_ms if connect_timeout_ms is not None
                                                else timeout_ms) / 1000.0)
        if ch.need_first and self.on_connect is not None:
            first = self.on_connect(addr)
            first.opaque = next(self._opaque)
            self._send(ch, addr, P.encode(first), connect_deadline)
        ch.need_first = False
        self._send(ch, addr, parts, connect_deadline)
        while True:
            left_ms = (deadline - time.monotonic()) * 1000.0
            if left_ms <= 0:
                raise RemotingTimeoutError(
                    f"no response from {addr} to request code {frame.code} within {timeout_ms:.0f} ms")
            ready = dict(ch.poller.poll(left_ms))
            if ch.sock in ready:
                resp = self._answer(ch, addr, frame.opaque)
                if resp is not None:
                    return resp
            if ch.monitor in ready and self._dropped(ch, addr):
                resp = self._answer(ch, addr, frame.opaque)      # an answer that made it before the close
                if resp is not None:
                    return resp
                raise RemotingConnectionClosedError(f"connection to {addr} closed with the request in flight")

    @staticmethod
    def _answer(ch: _Channel, addr: str, opaque: int) -> Optional[Frame]:
        while True:
            try:
                parts = recv_parts(ch.sock)
            except zmq.Again:
                return None
            try:
                resp = P.decode(parts)
            except ProtocolError as e:
                log.warning("undecodable frame from %s dropped: %s", addr, e)
                continue
            if resp.opaque == opaque and resp.is_response:   # not a broker's own request (NOTIFY_...)
                return resp                                   # else a late answer to a timed-out request

    def _dropped(self, ch: _Channel, addr: str) -> bool:
        """Read the monitor's events: True when the connection dropped."""
        gone = False
        for event in monitor_events(ch.monitor):
            if event == zmq.EVENT_DISCONNECTED:
                gone = True
                ch.need_first = True
                self._down.add(addr)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._down.discard(addr)
        return gone

    def invoke_oneway(self, addr: str, frame: Frame) -> None:
        frame.flag |= P.FLAG_ONEWAY
        frame.opaque = next(self._opaque)
        self._socket(addr).send_multipart(P.encode(frame), copy=False)

    def send_raw(self, addr: str, parts: list) -> None:
        """Send arbitrary parts (fuzz tests)."""
        self._socket(addr).send_multipart(parts)

    def recv_raw(self, addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Optional[Frame]:
        s = self._socket(addr)
        if not s.poll(timeout_ms):
            return None
        parts = s.recv_multipart()
        while parts and parts[0] == b"":      # a reply routed back with a REQ-style delimiter
            parts = parts[1:]
        return P.decode(parts)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    def __del__(self) -> None:          # its thread ended (a thread-local client): close its sockets
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, a context already destroyed
            pass

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
