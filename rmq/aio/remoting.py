"""Request / response to rmq addresses from an asyncio event loop: the one transport of
``rmq.aio``'s consumers and of the proxy (:mod:`rmq.proxy.server`, :mod:`rmq.proxy.grpc_server`).

One plain pyzmq DEALER per address (``host:port``), its file descriptor watched with
``loop.add_reader``; responses are matched to futures by opaque; one timer handle per request.
``zmq.asyncio`` would cost a future, a send event and a ``wait_for`` task per request (the aio
``SimpleConsumer`` spent a fifth of its time there).  Same frames (:mod:`rmq.protocol`), same
CURVE keys (:mod:`rmq.security`).

ZeroMQ's descriptor is edge-triggered and only reading ``EVENTS`` clears it: the reader drains
while ``EVENTS`` has POLLIN (a bare recv raising Again would leave the descriptor readable and the
loop spinning on it), and after every send ``EVENTS`` is checked again, or a response that came
during the send would wait for the next edge.

Each connection has a monitor socket, watched the same way: when the connection drops (a killed
broker) the requests in flight to that address fail at once with :class:`RemotingError` (after
the answers already queued are read) rather than at their deadline, which for a long-polling
pull is 30 s away (the monitor is read once right after it is watched: events queued before
that signal no edge of their own); until the connection's next handshake, new requests to it wait at most
``RECONNECT_WAIT_MS``.

A frame a broker sends that is not a response (NOTIFY_CONSUMER_IDS_CHANGED to a consumer, a
one-way CHECK_TRANSACTION_STATE to a producer) goes to ``on_request(frame, addr)``.

Concurrency: one event loop, the one of the first request.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable, Optional

import zmq
from zmq.utils.monitor import parse_monitor_message

from rmq import protocol as P
from rmq import security
from rmq.client.consumer_api import RECONNECT_WAIT_MS, decode_answer
from rmq.client.remoting import DEFAULT_TIMEOUT_MS
from rmq.errors import MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame

log = logging.getLogger("rmq.aio.remoting")

SEND_RETRY_S = 0.001          # a full send queue (SNDHWM) is retried this often until the request's timeout
_MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# plain ints: pyzmq's enum flags cost Python-level operator calls on every use
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class _Channel:
    """One address: its DEALER, its monitor and the requests in flight on it (opaque -> future)."""
    __slots__ = ("addr", "sock", "fd", "monitor", "monitor_fd", "inflight")

    def __init__(self, addr: str, sock: zmq.Socket, monitor: zmq.Socket):
        self.addr, self.sock, self.monitor = addr, sock, monitor
        self.fd = sock.getsockopt(zmq.FD)
        self.monitor_fd = monitor.getsockopt(zmq.FD)
        self.inflight: dict = {}


class AsyncRemoting:
    """Many requests in flight per address, answered in any order.

    Parameters
    ----------
    auth : optional
        CURVE client keys as :func:`rmq.security.client_auth` takes them (None: plain, or the
        ``RMQ_AUTH_*`` environment).
    on_request : callable, optional
        ``on_request(frame, addr)`` for a frame from a broker that is not a response; None: dropped.
        Its errors are logged, never raised.
    ctx : zmq.Context, optional
        Default: the process's shared context.
    """

    def __init__(self, auth=None, on_request: Optional[Callable[[Frame, str], None]] = None,
                 ctx: Optional[zmq.Context] = None):
        self.ctx = ctx or zmq.Context.instance()
        self.auth = security.client_auth(auth)
        self.on_request = on_request
        self._channels: dict = {}
        self._down: set = set()              # addrs whose connection dropped and has not come back
        self._opaque = itertools.count(1)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _channel(self, addr: str) -> _Channel:
        ch = self._channels.get(addr)
        if ch is None:
            if self._closed:
                raise MQClientError("the client is closed")
            loop = asyncio.get_running_loop()
            sock = P.dealer(self.ctx, auth=self.auth)
            monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
            sock.connect(P.endpoint(addr))
            ch = _Channel(addr, sock, monitor)
            self._channels[addr] = ch
            self._loop = loop
            loop.add_reader(ch.fd, self._drain, ch)
            loop.add_reader(ch.monitor_fd, self._watch, ch)
            # events queued before the descriptor was watched signal no edge of their own
            loop.call_soon(self._watch, ch)
        return ch

    def _drain(self, ch: _Channel) -> None:
        sock, inflight = ch.sock, ch.inflight
        while True:
            try:
                # reading EVENTS is what clears the descriptor's signal (see the module's docstring)
                if not sock.getsockopt(_EVENTS) & _POLLIN:
                    return
                parts = sock.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return
            resp = decode_answer(parts, ch.addr, self.on_request)   # None: undecodable, or a broker's request
            if resp is None:
                continue
            fut = inflight.pop(resp.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(resp)

    def _watch(self, ch: _Channel) -> None:
        mon = ch.monitor
        while True:
            try:
                if not mon.getsockopt(_EVENTS) & _POLLIN:
                    return
                msg = mon.recv_multipart(_NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return
            try:
                event = parse_monitor_message(msg)["event"]
            except Exception:  # noqa: BLE001 - a malformed monitor frame: ignore it
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._down.discard(ch.addr)
            elif event == zmq.EVENT_DISCONNECTED:
                self._down.add(ch.addr)
                self._drain(ch)                  # answers already queued count first
                failed = list(ch.inflight.values())
                ch.inflight.clear()
                for fut in failed:
                    if not fut.done():
                        fut.set_exception(RemotingError(f"connection to {ch.addr} closed with the request in flight"))

    async def invoke(self, addr: str, frame: Frame, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Frame:
        """Send ``frame`` to ``addr`` and await its response (``frame.opaque`` is set here).

        Raises
        ------
        RemotingTimeoutError
            No response within ``timeout_ms`` (at most RECONNECT_WAIT_MS while the address's
            connection is down).
        RemotingError
            The connection dropped with the request in flight, or the client closed.
        MQClientError
            The client is closed.
        """
        ch = self._channel(addr)
        loop = self._loop
        if addr in self._down:
            timeout_ms = min(timeout_ms, RECONNECT_WAIT_MS)
        opaque = frame.opaque = next(self._opaque)
        frame.flag &= ~P.FLAG_ONEWAY
        fut = loop.create_future()
        ch.inflight[opaque] = fut
        timer = loop.call_later(timeout_ms / 1000.0, _expire, fut)
        try:
            parts = P.encode(frame)
            while True:
                try:
                    ch.sock.send_multipart(parts, _NOBLOCK, copy=False)
                    break
                except zmq.Again:              # SNDHWM reached: wait for room, within the timeout
                    if fut.done():
                        break
                    await asyncio.sleep(SEND_RETRY_S)
                except zmq.ZMQError as e:      # closed under us
                    raise RemotingError(f"cannot send to {addr}: {e}") from None
            if ch.sock.getsockopt(_EVENTS) & _POLLIN:
                self._drain(ch)
            try:
                return await fut
            except asyncio.TimeoutError:
                raise RemotingTimeoutError(
                    f"no response from {addr} to request code {frame.code} within {timeout_ms} ms") from None
        finally:
            timer.cancel()
            ch.inflight.pop(opaque, None)

    def oneway(self, addr: str, frame: Frame) -> bool:
        """Send ``frame`` with the ONEWAY flag (no response is awaited); False when the socket's
        send queue is full (the frame is dropped, as RocketMQ's oneway under pressure)."""
        ch = self._channel(addr)
        frame.opaque = next(self._opaque)
        frame.flag |= P.FLAG_ONEWAY
        try:
            ch.sock.send_multipart(P.encode(frame), _NOBLOCK, copy=False)
        except zmq.Again:
            return False
        if ch.sock.getsockopt(_EVENTS) & _POLLIN:
            self._drain(ch)
        return True

    async def close(self) -> None:
        """Close every connection; requests still in flight fail with :class:`RemotingError`."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(ch.fd)
                self._loop.remove_reader(ch.monitor_fd)
            try:
                ch.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            ch.monitor.close(0)
            ch.sock.close(0)
            for fut in ch.inflight.values():
                if not fut.done():
                    fut.set_exception(RemotingError(f"the client closed with a request to {ch.addr} in flight"))
            ch.inflight.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


__all__ = ["AsyncRemoting", "SEND_RETRY_S"]
