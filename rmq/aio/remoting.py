"""Request / response to rmq addresses from an asyncio event loop: the one transport of ``rmq.aio``
(producer and consumers) and of the proxy (:mod:`rmq.proxy.server`, :mod:`rmq.proxy.grpc_server`).

One plain pyzmq DEALER per address (``host:port``), its file descriptor watched with
``loop.add_reader``: a readiness callback reads the responses that are there (up to
DRAIN_LIMIT, then it yields to the loop) and resolves each waiting request by opaque.
``zmq.asyncio`` would cost a future, a send event and a ``wait_for`` task per request (the aio
``SimpleConsumer`` spent a fifth of its time there).  Same frames (:mod:`rmq.protocol`), same
CURVE keys (:mod:`rmq.security`).

Requests are written at once without blocking.  One the socket cannot take now (an ``immediate``
socket whose peer is not connected yet, or a full send queue) is *parked*: queued in order and
written once the socket takes it, or failed with :class:`RemotingError` after
``connect_timeout_ms``.  Response timeouts are one timer over a heap of deadlines (not a timer
per request).

ZeroMQ's descriptor is edge-triggered and only reading ``EVENTS`` clears it: the reader drains
while ``EVENTS`` has POLLIN (a bare recv raising Again would leave the descriptor readable and the
loop spinning on it), and after every write ``EVENTS`` is checked again, or a response that came
during the write would wait for the next edge.

Each connection has a monitor socket, watched the same way (and read once right after it is
watched: events queued before that give no edge of their own): when the connection drops (a
killed broker) the requests in flight on it fail at once with
:class:`rmq.errors.RemotingConnectionClosedError`, a RemotingTimeoutError (after the
answers already queued are read) rather than at their deadline, which for a long-polling pull
is 30 s away; until the connection's next handshake, new requests to it wait at most
``RECONNECT_WAIT_MS``.

A frame a broker sends that is not a response (NOTIFY_CONSUMER_IDS_CHANGED to a consumer, a
one-way CHECK_TRANSACTION_STATE to a producer) goes to ``on_request(frame, addr)``.

Concurrency: one event loop, the one of the first request.
"""
from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
from typing import Callable, Optional

import zmq

from rmq import protocol as P
from rmq import security
from rmq.client.consumer_api import decode_answer
from rmq.client.remoting import DEFAULT_TIMEOUT_MS, RECONNECT_WAIT_MS
from rmq.errors import MQClientError, RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame
from rmq.zmqio import closed, events, monitor_events, recv_waiting, send_parts

log = logging.getLogger("rmq.aio.remoting")

CONNECT_TIMEOUT_MS = 3_000       # a parked request fails after this (RocketMQ connectTimeoutMillis)
DRAIN_LIMIT = 1024               # responses read per readiness callback before other callbacks run
TIMER_SLACK_S = 0.005            # after a response timeout fires, the next check is at least this later
_MONITOR_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# plain ints: pyzmq's enum flags cost Python-level operator calls on every use
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)


class _Channel:
    """One address: its DEALER and monitor, the requests in flight on it (opaque -> future) and
    the ones parked until it takes them (in order: ``(parts, sent future or None, deadline)``)."""
    __slots__ = ("addr", "sock", "fd", "monitor", "monitor_fd", "inflight", "parked", "drain_scheduled", "watched")

    def __init__(self, addr: str, sock: zmq.Socket, monitor: zmq.Socket):
        self.addr, self.sock, self.monitor = addr, sock, monitor
        self.fd = sock.getsockopt(zmq.FD)
        self.monitor_fd = monitor.getsockopt(zmq.FD)
        self.inflight: dict = {}
        self.parked: collections.deque = collections.deque()
        self.drain_scheduled = False
        self.watched = True


class AsyncRemoting:
    """Many requests in flight per address, answered in any order.

    Parameters
    ----------
    auth : optional
        CURVE client keys as :func:`rmq.security.client_auth` takes them (None: plain, or the
        ``RMQ_AUTH_*`` environment / the keys registered for ``ctx``).
    on_request : callable, optional
        ``on_request(frame, addr)`` for a frame from a broker that is not a response; None: dropped.
        Its errors are logged, never raised.
    ctx : zmq.Context, optional
        Default: the process's shared context.
    immediate : callable or bool
        ZMQ_IMMEDIATE for the sockets (``immediate(addr)`` decides per address): requests are only
        queued to a connected peer, the others parked (a producer: a dead broker's requests fail
        after the connect timeout instead of waiting in a pipe).
    connect_timeout_ms : int
        How long a parked request waits for its socket to take it.
    on_connect : callable, optional
        ``on_connect(addr) -> Frame or None``: a frame written first on each new connection (the
        producer's HEART_BEAT), before any request.
    linger_ms : int
        ZMQ_LINGER of the sockets on :meth:`close` (one-way frames still queued get that long).
    """

    def __init__(self, auth=None, on_request: Optional[Callable[[Frame, str], None]] = None,
                 ctx: Optional[zmq.Context] = None, *, immediate=False, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 on_connect: Optional[Callable[[str], Optional[Frame]]] = None, linger_ms: int = 0):
        self.ctx = ctx or zmq.Context.instance()
        self.auth = security.client_auth(auth)
        self.on_request = on_request
        self.on_connect = on_connect
        self._immediate = immediate if callable(immediate) else (lambda addr, on=bool(immediate): on)
        self.connect_timeout_s = connect_timeout_ms / 1000.0
        self.linger_ms = linger_ms
        self._channels: dict = {}
        self._down: set = set()              # addrs whose connection dropped and has not come back
        self._opaque = itertools.count(1)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._timeouts: list = []            # heap (deadline, opaque, channel, code, timeout ms, what)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = 0.0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def addrs(self) -> list:
        """The addresses with a connection."""
        return list(self._channels)

    def connect(self, addr: str) -> None:
        """Open the connection to ``addr`` now (``on_connect``'s frame is written first)."""
        self._channel(addr)

    # -- connections -----------------------------------------------------------------------------
    def _channel(self, addr: str) -> _Channel:
        ch = self._channels.get(addr)
        if ch is None:
            if self._closed:
                raise MQClientError("the client is closed")
            loop = self._loop = asyncio.get_running_loop()
            sock = P.dealer(self.ctx, auth=self.auth)
            if self._immediate(addr):
                sock.setsockopt(zmq.IMMEDIATE, 1)    # before connect: only queue to a live peer
            monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
            sock.connect(P.endpoint(addr))
            ch = _Channel(addr, sock, monitor)
            self._channels[addr] = ch
            loop.add_reader(ch.fd, self._on_events, ch)
            loop.add_reader(ch.monitor_fd, self._watch, ch)
            loop.call_soon(self._watch, ch)          # events queued before the fd was watched give no edge
            first = self.on_connect(addr) if self.on_connect is not None else None
            if first is not None:
                self.post(addr, first, self.connect_timeout_s)
        return ch

    def _unwatch(self, ch: _Channel) -> None:
        if ch.watched:
            ch.watched = False
            try:
                self._loop.remove_reader(ch.fd)
                self._loop.remove_reader(ch.monitor_fd)
            except (RuntimeError, ValueError, OSError, AttributeError):    # the loop is closed
                pass

    def _schedule_drain(self, ch: _Channel) -> None:
        if not ch.drain_scheduled:
            ch.drain_scheduled = True
            self._loop.call_soon(self._on_events, ch)

    def _on_events(self, ch: _Channel) -> None:
        """The socket's fd is readable (its events may have changed), or a drain was scheduled:
        read every response there (up to DRAIN_LIMIT), write what is parked."""
        ch.drain_scheduled = False
        sock = ch.sock
        if closed(sock):
            return
        inflight, addr, on_request = ch.inflight, ch.addr, self.on_request
        try:
            for parts in recv_waiting(sock, DRAIN_LIMIT):
                resp = decode_answer(parts, addr, on_request)   # None: undecodable, or a broker's request
                if resp is not None:
                    fut = inflight.pop(resp.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(resp)
            if ch.parked:
                self._flush_parked(ch)
            elif events(sock) & _POLLIN:         # DRAIN_LIMIT reached, or arrived meanwhile
                self._schedule_drain(ch)
        except zmq.ZMQError as e:
            if not self._closed:
                log.warning("receive from %s failed: %s", addr, e)
                self._unwatch(ch)

    def _watch(self, ch: _Channel) -> None:
        try:
            evs = monitor_events(ch.monitor)
        except zmq.ZMQError:
            return
        for event in evs:
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._down.discard(ch.addr)
            elif event == zmq.EVENT_DISCONNECTED:
                self._down.add(ch.addr)
                self._on_events(ch)                  # answers already queued count first
                failed = list(ch.inflight.values())
                ch.inflight.clear()
                for fut in failed:
                    if not fut.done():
                        fut.set_exception(RemotingConnectionClosedError(f"connection to {ch.addr} closed with the request in flight"))

    # -- writing ---------------------------------------------------------------------------------
    def _send_now(self, ch: _Channel, parts: list) -> bool:
        """Write ``parts`` on ``ch`` if nothing is parked there and the socket takes it now."""
        if ch.parked:
            return False
        sock = ch.sock
        try:
            send_parts(sock, parts)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            raise RemotingError(f"cannot send to {ch.addr}: {e}") from None
        # the write may have taken the fd's edge for responses that arrived meanwhile
        if not ch.drain_scheduled and events(sock) & _POLLIN:
            self._schedule_drain(ch)
        return True

    def _park(self, ch: _Channel, parts: list, sent: Optional[asyncio.Future], deadline: float) -> None:
        ch.parked.append((parts, sent, deadline))
        self._flush_parked(ch)

    def _flush_parked(self, ch: _Channel) -> None:
        """Write what is parked on ``ch``, in order, while the socket takes it."""
        parked, sock = ch.parked, ch.sock
        if closed(sock):
            return
        now = self._loop.time()
        for _ in range(4):
            while parked:
                parts, sent, deadline = parked[0]
                if (sent.done() if sent is not None else deadline <= now):
                    parked.popleft()            # given up (connect timeout) meanwhile
                    continue
                try:
                    send_parts(sock, parts)
                except zmq.Again:
                    break
                except zmq.ZMQError as e:
                    parked.popleft()
                    if sent is not None:
                        sent.set_exception(RemotingError(f"cannot send to {ch.addr}: {e}"))
                    continue
                parked.popleft()
                if sent is not None:
                    sent.set_result(None)
            # reading the events takes the fd's edge: act on what they say now
            ev = events(sock)
            if ev & _POLLIN:
                self._schedule_drain(ch)
            if not (parked and ev & _POLLOUT):
                return
        self._loop.call_later(TIMER_SLACK_S, self._flush_parked, ch)    # writable, yet refusing: retry soon

    def post(self, addr: str, frame: Frame, within_s: Optional[float] = None) -> None:
        """Write ``frame`` as it is (its opaque set here) without awaiting anything: now, or once
        the socket takes it, given up after ``within_s`` seconds (default: the connect timeout)."""
        ch = self._channel(addr)
        frame.opaque = next(self._opaque)
        parts = P.encode(frame)
        try:
            if not self._send_now(ch, parts):
                self._park(ch, parts, None, self._loop.time() + (within_s or self.connect_timeout_s))
        except RemotingError:
            pass

    def oneway(self, addr: str, frame: Frame) -> bool:
        """Send ``frame`` with the ONEWAY flag (no response is awaited); False when the socket
        cannot take it now (the frame is dropped, as RocketMQ's oneway under pressure)."""
        ch = self._channel(addr)
        frame.opaque = next(self._opaque)
        frame.flag |= P.FLAG_ONEWAY
        try:
            return self._send_now(ch, P.encode(frame))
        except RemotingError:
            return False

    # -- request / response ------------------------------------------------------------------------
    async def invoke(self, addr: str, frame: Frame, timeout_ms: int = DEFAULT_TIMEOUT_MS, *, oneway: bool = False,
                     what: str = "") -> Optional[Frame]:
        """Send ``frame`` to ``addr`` (``frame.opaque`` is set here) and await its response;
        ``oneway``: return None once it is written.  ``what`` names the peer in errors.

        Raises
        ------
        RemotingTimeoutError
            No response within ``timeout_ms`` (at most RECONNECT_WAIT_MS while the address's
            connection is down).
        RemotingError
            Not written within the connect timeout, the connection dropped with the request in
            flight, or the client closed.
        MQClientError
            The client is closed.
        ProtocolError
            ``frame`` cannot be encoded.
        """
        ch = self._channel(addr)
        loop = self._loop
        if addr in self._down:
            timeout_ms = min(timeout_ms, RECONNECT_WAIT_MS)
        opaque = frame.opaque = next(self._opaque)
        if oneway:
            frame.flag |= P.FLAG_ONEWAY
        else:
            frame.flag &= ~P.FLAG_ONEWAY
        parts = P.encode(frame)
        timeout_s = timeout_ms / 1000.0
        t0 = loop.time()
        fut = None
        if not oneway:
            fut = ch.inflight[opaque] = loop.create_future()
        try:
            if not self._send_now(ch, parts):
                connect_s = min(timeout_s, self.connect_timeout_s)
                sent = loop.create_future()
                self._park(ch, parts, sent, t0 + connect_s)
                try:
                    await asyncio.wait_for(sent, connect_s)
                except asyncio.TimeoutError:
                    raise RemotingError(f"cannot connect to {what or 'peer'} at {addr} "
                                        f"(waited {connect_s * 1000:.0f} ms)") from None
            if fut is None:
                return None
            self._arm_timeout((t0 + timeout_s, opaque, ch, frame.code, timeout_ms, what))
            return await fut
        finally:
            if fut is not None:
                ch.inflight.pop(opaque, None)

    def _arm_timeout(self, entry: tuple) -> None:
        """Fail the waiter of ``entry``'s opaque with RemotingTimeoutError at its deadline
        (entry: deadline, opaque, channel, code, timeout ms, what)."""
        heap = self._timeouts
        heapq.heappush(heap, entry)
        if len(heap) > 4096 and len(heap) > 4 * sum(len(c.inflight) for c in self._channels.values()):
            heap[:] = [e for e in heap if e[1] in e[2].inflight]      # answered ones: drop them
            heapq.heapify(heap)
        deadline = entry[0]
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timeouts)

    def _on_timeouts(self) -> None:
        self._timer = None
        now = self._loop.time()
        heap = self._timeouts
        while heap and heap[0][0] <= now:
            _, opaque, ch, code, timeout_ms, what = heapq.heappop(heap)
            fut = ch.inflight.get(opaque)
            if fut is not None and not fut.done():
                fut.set_exception(RemotingTimeoutError(
                    f"no response from {what or 'peer'} at {ch.addr} to request code {code} within {timeout_ms} ms"))
        if heap and not self._closed:
            self._timer_at = max(heap[0][0], now + TIMER_SLACK_S)
            self._timer = self._loop.call_at(self._timer_at, self._on_timeouts)

    async def close(self) -> None:
        """Close every connection; requests still in flight or parked fail with :class:`RemotingError`."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timeouts.clear()
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            if self._loop is not None and not self._loop.is_closed():
                self._unwatch(ch)
            for _, sent, _ in ch.parked:
                if sent is not None and not sent.done():
                    sent.set_exception(RemotingError(f"the client closed before a request to {ch.addr} was sent"))
            ch.parked.clear()
            try:
                ch.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            ch.monitor.close(0)
            ch.sock.close(linger=self.linger_ms)
            for fut in ch.inflight.values():
                if not fut.done():
                    fut.set_exception(RemotingError(f"the client closed with a request to {ch.addr} in flight"))
            ch.inflight.clear()


__all__ = ["AsyncRemoting", "CONNECT_TIMEOUT_MS", "DRAIN_LIMIT"]
