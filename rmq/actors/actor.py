"""Actor base: one event loop over pyzmq sockets and timers.

Every rmq service (nameserver, broker, flush, reput, cleaner, ha) is an Actor
subclass run as its own process.  The loop:

* polls its sockets (``zmq.Poller``) with a timeout that ends at the next timer;
* decodes each request with :func:`rmq.protocol.decode` and calls the handler
  registered for its code; an unknown code gets REQUEST_CODE_NOT_SUPPORTED, a
  malformed frame gets the ProtocolError's code and remark, and an exception
  in a handler gets SYSTEM_ERROR with the exception text: the actor keeps
  serving in every case;
* runs due timers (monotonic clock);
* sends a liveness beat (ACTOR_BEAT, one-way) to the supervisor every
  ``HEARTBEAT_INTERVAL_MS`` when a supervisor endpoint is given;
* stops on SIGTERM / SIGINT: ``on_stop()`` runs, sockets close with linger 0.

Logging goes to ``STORE/logs/<name>.log``.

Handlers receive ``(frame, reply)``; they return a response Frame, or None and
keep ``reply`` to answer later (deferred replies: long polling, group commit).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import logging.handlers
import os
import signal
import time
from typing import Callable, Optional

import zmq

from rmq import protocol as P
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode

HEARTBEAT_INTERVAL_MS = 1000        # actor -> supervisor beat
HEARTBEAT_LIVENESS = 5              # beats missed before the supervisor calls an actor dead
LOG_MAX_BYTES = 16 * 1024 * 1024
LOG_BACKUPS = 3

Handler = Callable[[Frame, "Reply"], Optional[Frame]]


class Reply:
    """Where a request's response goes: socket + routing envelope + opaque."""

    __slots__ = ("socket", "envelope", "opaque", "oneway", "sent", "received_at")

    def __init__(self, socket: zmq.Socket, envelope: list, opaque: int, oneway: bool):
        self.socket = socket
        self.envelope = envelope
        self.opaque = opaque
        self.oneway = oneway
        self.sent = False
        self.received_at = time.monotonic()

    def send(self, frame: Frame) -> None:
        """Send ``frame`` as the response (once; one-way requests get none)."""
        if self.sent or self.oneway:
            self.sent = True
            return
        self.sent = True
        frame.opaque = self.opaque
        frame.flag |= P.FLAG_RESPONSE
        try:
            parts = P.encode(frame)
        except ProtocolError as e:
            parts = P.encode(Frame(ResponseCode.SYSTEM_ERROR, self.opaque, P.FLAG_RESPONSE, e.remark))
        try:
            self.socket.send_multipart(self.envelope + parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            logging.getLogger("rmq.actor").warning("reply to %r dropped: peer queue full", self.envelope[:1])
        except zmq.ZMQError as e:   # peer gone (ROUTER_MANDATORY) or socket closed
            logging.getLogger("rmq.actor").warning("reply dropped: %s", e)

    def error(self, code: int, remark: str) -> None:
        self.send(Frame(int(code), remark=remark))


class Actor:
    """Base class of every actor process.  Subclasses set ``name`` and register
    sockets, handlers and timers in ``on_start``."""

    name = "actor"

    def __init__(self, store_path: Optional[str] = None, supervisor_endpoint: Optional[str] = None,
                 log_level: int = logging.INFO):
        self.store_path = store_path
        self.supervisor_endpoint = supervisor_endpoint
        self.ctx = zmq.Context(io_threads=1)
        self.poller = zmq.Poller()
        self._socket_handlers: dict[zmq.Socket, Callable[[list], None]] = {}
        self._request_handlers: dict[int, Handler] = {}
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._running = False
        self._beat_socket: Optional[zmq.Socket] = None
        self.log = self._setup_logging(log_level)
        self.started_at = time.time()
        self.poll_returned_at = time.monotonic()   # when the current batch of messages was read

    # -- setup ----------------------------------------------------------------------
    def _setup_logging(self, level: int) -> logging.Logger:
        log = logging.getLogger(f"rmq.{self.name}")
        log.setLevel(level)
        if self.store_path and not any(isinstance(h, logging.handlers.RotatingFileHandler) for h in log.handlers):
            d = os.path.join(self.store_path, "logs")
            os.makedirs(d, exist_ok=True)
            h = logging.handlers.RotatingFileHandler(os.path.join(d, f"{self.name}.log"), maxBytes=LOG_MAX_BYTES,
                                                     backupCount=LOG_BACKUPS)
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"))
            log.addHandler(h)
        return log

    def socket(self, kind: int, bind: Optional[str] = None, connect: Optional[str] = None) -> zmq.Socket:
        """A socket with rmq's options: linger 0, max message size, ROUTER_MANDATORY on ROUTERs."""
        s = P.configure_socket(self.ctx.socket(kind))
        if kind == zmq.ROUTER:
            s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if bind:
            s.bind(bind)
        if connect:
            s.connect(connect)
        return s

    def add_socket(self, sock: zmq.Socket, handler: Callable[[list], None]) -> None:
        """Poll ``sock``; ``handler(parts)`` gets each multipart message (zmq.Frame parts)."""
        self._socket_handlers[sock] = handler
        self.poller.register(sock, zmq.POLLIN)

    def serve(self, sock: zmq.Socket) -> None:
        """Serve requests arriving on a ROUTER (or DEALER) socket with the registered handlers."""
        self.add_socket(sock, lambda parts, s=sock: self._on_request(s, parts))

    def handle(self, code: int, fn: Handler) -> None:
        """Register ``fn`` for requests with ``code``."""
        self._request_handlers[int(code)] = fn

    def add_timer(self, interval_ms: float, fn: Callable[[], None], first_ms: Optional[float] = None,
                  repeat: bool = True) -> None:
        """Run ``fn`` every ``interval_ms`` (first after ``first_ms``, default one interval)."""
        due = time.monotonic() + (interval_ms if first_ms is None else first_ms) / 1000.0
        heapq.heappush(self._timers, (due, next(self._timer_seq), interval_ms if repeat else None, fn))

    # -- request path -------------------------------------------------------------------
    def _on_request(self, sock: zmq.Socket, parts: list) -> None:
        # envelope: the peer identity a ROUTER prepends, plus a REQ-style empty delimiter if present
        envelope: list = []
        rest = parts
        if sock.socket_type == zmq.ROUTER:
            if not parts:
                return
            envelope, rest = parts[:1], parts[1:]
            if rest and len(rest[0]) == 0:
                envelope, rest = envelope + rest[:1], rest[1:]
        try:
            frame = P.decode(rest)
        except ProtocolError as e:
            Reply(sock, envelope, e.opaque, False).error(e.code, e.remark)
            return
        if frame.is_response:
            self.on_response(frame)
            return
        reply = Reply(sock, envelope, frame.opaque, frame.is_oneway)
        fn = self._request_handlers.get(frame.code)
        if fn is None:
            reply.error(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        f"request code {frame.code} is not supported by {self.name}")
            return
        try:
            resp = fn(frame, reply)
        except ProtocolError as e:
            reply.error(e.code, e.remark)
            return
        except Exception as e:  # noqa: BLE001 - a handler bug must not kill the actor
            self.log.exception("handler of code %s failed", frame.code)
            reply.error(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            return
        if resp is not None:
            reply.send(resp)

    def after_poll(self) -> None:
        """Called once after the messages of one poll were handled (coalesced announcements)."""

    def on_response(self, frame: Frame) -> None:
        """A response arrived on a served socket (actors that also send requests override)."""

    # -- lifecycle ------------------------------------------------------------------------
    def on_start(self) -> None:
        """Open sockets, register handlers and timers."""

    def on_stop(self) -> None:
        """Flush and release resources (called once, on SIGTERM / SIGINT / stop())."""

    def stop(self) -> None:
        self._running = False

    def _beat(self) -> None:
        if self._beat_socket is not None:
            try:
                self._beat_socket.send_multipart(P.encode(Frame(
                    RequestCode.ACTOR_BEAT, flag=P.FLAG_ONEWAY, fields={"name": self.name, "pid": os.getpid()})),
                    flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def run(self) -> None:
        """Run the loop until stopped; always calls ``on_stop`` and closes the context."""
        def _sig(signum, _frame):
            self._running = False
        signal.signal(signal.SIGTERM, _sig)
        signal.signal(signal.SIGINT, _sig)
        self._running = True
        try:
            if self.supervisor_endpoint:
                self._beat_socket = self.socket(zmq.DEALER, connect=self.supervisor_endpoint)
                self.add_timer(HEARTBEAT_INTERVAL_MS, self._beat, first_ms=0)
            self.on_start()
            self.log.info("%s started (pid %d)", self.name, os.getpid())
            while self._running:
                self.run_once()
        finally:
            try:
                self.on_stop()
            finally:
                self.log.info("%s stopped", self.name)
                self.ctx.destroy(linger=0)

    def run_once(self, max_wait_ms: float = 1000.0) -> None:
        """One poll + dispatch + timers step."""
        now = time.monotonic()
        timeout = max_wait_ms
        if self._timers:
            timeout = max(0.0, min(timeout, (self._timers[0][0] - now) * 1000.0))
        try:
            events = self.poller.poll(timeout)
        except zmq.ZMQError as e:
            if e.errno == getattr(zmq, "EINTR", -1):
                return
            raise
        self.poll_returned_at = time.monotonic()
        for sock, _ in events:
            handler = self._socket_handlers.get(sock)
            if handler is None:
                continue
            # drain what is queued, bounded so timers are not starved
            for _ in range(256):
                try:
                    parts = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handler(parts)
        if events:
            self.after_poll()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            due, seq, interval, fn = heapq.heappop(self._timers)
            try:
                fn()
            except Exception:  # noqa: BLE001
                self.log.exception("timer %s failed", getattr(fn, "__name__", fn))
            if interval is not None:
                heapq.heappush(self._timers, (max(due + interval / 1000.0, now), seq, interval, fn))
