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
import math
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

import zmq

from rmq.zmqio import recv_waiting, send_parts

from rmq import protocol as P
from rmq import security as S
from rmq.common.malloc_tuning import tune_malloc
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode

HEARTBEAT_INTERVAL_MS = 1000        # actor -> supervisor beat
HEARTBEAT_LIVENESS = 5              # beats missed before the supervisor calls an actor dead
DRAIN_PER_POLL = 256                # messages read from one socket per poll round (timers are not starved)
LOG_MAX_BYTES = 16 * 1024 * 1024
LOG_BACKUPS = 3

Handler = Callable[[Frame, "Reply"], Optional[Frame]]


def poll_timeout_ms(now: float, next_due: Optional[float], max_wait_ms: float) -> int:
    """Milliseconds to poll: up to the next timer (``next_due``, monotonic s) or ``max_wait_ms``.

    Whole ms, rounded up: zmq_poll takes integer ms, and a fraction truncated to 0 would spin
    until the timer is due (reput's coalesced 1 ms dispatch burnt 70 % of a core that way)."""
    timeout = math.ceil(max_wait_ms)
    if next_due is not None:
        timeout = max(0, min(timeout, math.ceil((next_due - now) * 1000.0)))
    return timeout


RUN_DIR = "run"      # <store>/run/<actor>.pid


def write_pid_file(store_path: str, name: str) -> Optional[str]:
    """Write ``<store>/run/<name>.pid`` (this process); returns the path, None when it cannot."""
    d = os.path.join(store_path, RUN_DIR)
    path = os.path.join(d, f"{name}.pid")
    try:
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, path)
        return path
    except OSError as e:
        logging.getLogger("rmq.actor").warning("cannot write %s: %s", path, e)
        return None


class _Outbox(threading.local):
    """Replies made while an actor handles the requests it read from a socket in one turn
    (:meth:`Actor.run_once`, more than one), written when they are all handled, in the order
    made (Redis writes its replies before it sleeps, for the same reason).  Back to back,
    ZeroMQ's I/O thread is woken once for them and writes each connection's together; written
    between the handlers, each reply woke it on its own.  POP receive + ack from 64 asyncio
    loops: the broker's main thread 3.3-3.7 -> 2.8-3.0 us a message.  A turn holds at most
    DRAIN_PER_POLL requests, and a lone request is answered at once.  ``RMQ_DEFER_REPLIES=0`` in
    an actor's environment writes every reply at once (for measuring)."""
    parts: Optional[list] = None


_OUTBOX = _Outbox()
DEFER_REPLIES = os.environ.get("RMQ_DEFER_REPLIES", "1") != "0"


class Reply:
    """Where a request's response goes: socket + routing envelope + opaque."""

    __slots__ = ("socket", "envelope", "opaque", "oneway", "sent", "received_at", "request_code", "held",
                 "observer")

    def __init__(self, socket: zmq.Socket, envelope: list, opaque: int, oneway: bool):
        self.socket = socket
        self.envelope = envelope
        self.opaque = opaque
        self.oneway = oneway
        self.sent = False
        self.received_at = time.monotonic()
        self.request_code = 0
        self.held = False           # answered later (a long-polling pull, a parked sync send)
        # observer(request code, response code, ms since received, held, result): RPC metrics
        self.observer: Optional[Callable] = None

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
        outbox = _OUTBOX.parts
        if outbox is not None:              # answered while its actor handles a batch: sent after it
            outbox.append((self, frame.code, self.envelope + parts))
            return
        self._write(frame.code, self.envelope + parts)

    def _write(self, code: int, parts: list) -> None:
        result = "success"
        try:
            send_parts(self.socket, parts)
        except zmq.Again:
            result = "write_channel_failed"
            logging.getLogger("rmq.actor").warning("reply to %r dropped: peer queue full", self.envelope[:1])
        except zmq.ZMQError as e:   # peer gone (ROUTER_MANDATORY) or socket closed
            result = "write_channel_failed"
            # a client that closed with a request in flight (a parked long-poll pull) is routine
            level = logging.INFO if e.errno == zmq.EHOSTUNREACH else logging.WARNING
            logging.getLogger("rmq.actor").log(level, "reply dropped (code %s, opaque %s): %s",
                                               code, self.opaque, e)
        if self.observer is not None:
            self.observer(self.request_code, code, (time.monotonic() - self.received_at) * 1000.0,
                          self.held, result)

    def error(self, code: int, remark: str) -> None:
        self.send(Frame(int(code), remark=remark))


class Actor:
    """Base class of every actor process.  Subclasses set ``name`` and register
    sockets, handlers and timers in ``on_start``."""

    name = "actor"
    # auth* properties (rmq.security); None: the subclass's ``settings`` or ``config.extra``
    auth_props: Optional[dict] = None

    def __init__(self, store_path: Optional[str] = None, supervisor_endpoint: Optional[str] = None,
                 log_level: int = logging.INFO):
        self.store_path = store_path
        self.supervisor_endpoint = supervisor_endpoint
        self.ctx = zmq.Context(io_threads=1)
        self.poller = zmq.Poller()
        self._socket_handlers: dict[zmq.Socket, Callable[[list], None]] = {}
        self._request_handlers: dict[int, Handler] = {}
        # RPC metrics: requests on these sockets get their Reply observed (rmq.metrics)
        self.rpc_observer: Optional[Callable] = None
        self._observed_socks: set = set()
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._running = False
        self._beat_socket: Optional[zmq.Socket] = None
        self.log = self._setup_logging(log_level)
        self.started_at = time.time()
        self.poll_returned_at = time.monotonic()   # when the current batch of messages was read
        self.request_received_at = self.poll_returned_at   # monotonic s the message being handled was read
        self.last_of_turn = True        # the message being handled is the last one read from its socket this turn
        self._turn_end: Optional[list] = None   # at_turn_end's callables while a turn's batch is handled
        self._drain_limits: dict[zmq.Socket, int] = {}      # socket -> messages read per round (DRAIN_PER_POLL)
        self._shed: dict = {}                               # socket -> (seconds, shed function): shed_late
        self.security: Optional[S.ServerSecurity] = None
        self._security_checked = False
        self._auth_enabled = False
        self._sock_policy: dict = {}       # tcp-bound socket -> "curve" | "plain" (request checks)

    # -- setup ----------------------------------------------------------------------
    def _setup_logging(self, level: int) -> logging.Logger:
        log = logging.getLogger(f"rmq.{self.name}")
        log.setLevel(level)
        logging.getLogger("rmq.actor").setLevel(level)
        if self.store_path and not any(isinstance(h, logging.handlers.RotatingFileHandler) for h in log.handlers):
            d = os.path.join(self.store_path, "logs")
            os.makedirs(d, exist_ok=True)
            h = logging.handlers.RotatingFileHandler(os.path.join(d, f"{self.name}.log"), maxBytes=LOG_MAX_BYTES,
                                                     backupCount=LOG_BACKUPS)
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"))
            log.addHandler(h)
            logging.getLogger("rmq.actor").addHandler(h)     # Reply's messages go to the same file
            store_log = logging.getLogger("rmq.store")       # and the store's, run in this process
            store_log.setLevel(min(level, logging.INFO))
            store_log.addHandler(h)
        return log

    # -- security (rmq.security) ------------------------------------------------------------
    def _auth_properties(self) -> dict:
        if self.auth_props is not None:
            return self.auth_props
        props = getattr(self, "settings", None)
        if not isinstance(props, dict):
            props = getattr(getattr(self, "config", None), "extra", None)
        return props if isinstance(props, dict) else {}

    def init_security(self) -> None:
        """Start the ZAP authenticator if ``authEnable`` (before any socket is bound).

        Raises
        ------
        SecurityError
            Bad auth properties or key files: the actor must not start."""
        if self._security_checked:
            return
        self._security_checked = True
        cfg = S.AuthConfig.from_properties(self._auth_properties())
        self._auth_enabled = cfg.enable
        if cfg.enable:
            self.security = S.ServerSecurity(cfg, self.ctx, self.log)
            self.add_timer(S.KEYRING_TTL_S * 1000.0, self.security.keyring.refresh)
            self.log.info("CURVE on: server key %s, client keys %s, admin keys %s", cfg.server_key_file,
                          cfg.client_keys_dir or "-", cfg.admin_keys_dir or "-")

    def socket(self, kind: int, bind: Optional[str] = None, connect: Optional[str] = None,
               secure: Optional[bool] = None, options: Optional[dict] = None) -> zmq.Socket:
        """A socket with rmq's options: linger 0, max message size, ROUTER_MANDATORY on ROUTERs,
        then ``options`` (ZeroMQ option -> value, e.g. SNDHWM), all set before the bind / connect
        (a listener's pipes take the options it had when it was bound).

        With CURVE on (``authEnable``) a tcp ``bind`` is a CURVE server with the ZAP domain and
        a tcp ``connect`` a CURVE client with the node key (``secure=False``: never); an ipc
        ``bind`` restricts the store directory to 0700 and the socket file to 0600; a
        non-loopback tcp bind logs a warning."""
        self.init_security()
        s = P.configure_socket(self.ctx.socket(kind))
        if kind == zmq.ROUTER:
            s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        for opt, value in (options or {}).items():
            s.setsockopt(opt, value)
        curve = self.security is not None and secure is not False
        if bind:
            if bind.startswith("tcp://"):
                if curve:
                    self.security.secure_server(s)
                elif self._auth_enabled and secure is not False:
                    raise S.SecurityError(f"authEnable=true but no CURVE on {bind}: refusing to listen")
                self._sock_policy[s] = "curve" if curve else "plain"
                S.warn_if_public(bind, curve, self.log)
            S.secure_ipc_endpoint(bind)
            s.bind(bind)
            S.secure_ipc_endpoint(bind, bound=True)
        if connect:
            if curve and connect.startswith("tcp://"):
                self.security.secure_client(s)
            s.connect(connect)
        return s

    def add_socket(self, sock: zmq.Socket, handler: Callable[[list], None], drain_max: int = DRAIN_PER_POLL) -> None:
        """Poll ``sock``; ``handler(parts)`` gets each multipart message (:func:`rmq.zmqio.recv_parts`'s
        parts: the first a ``zmq.Frame`` or ``rmq._core.zmqc.Part``, with the connection's metadata).

        Each poll round reads up to ``drain_max`` messages from ``sock`` first (one
        :func:`rmq.zmqio.recv_waiting`), stamped with the monotonic time the read began, then
        hands them to ``handler`` in order; while they are handled, :attr:`request_received_at`
        is that stamp.  A large ``drain_max`` moves a
        backlog out of ZeroMQ's buffers, where its age cannot be seen, into this loop, where a
        handler can refuse what waited too long (the broker's send queue: RocketMQ's
        sendThreadPoolQueueCapacity and [TIMEOUT_CLEAN_QUEUE]).
        """
        if drain_max < 1:
            raise ValueError(f"drain_max must be >= 1, got {drain_max}")
        self._socket_handlers[sock] = handler
        self._drain_limits[sock] = drain_max
        self.poller.register(sock, zmq.POLLIN)

    def remove_socket(self, sock: zmq.Socket) -> None:
        """Stop polling ``sock`` (added with :meth:`add_socket`) and close it at once (linger 0)."""
        self.poller.unregister(sock)
        self._socket_handlers.pop(sock, None)
        self._drain_limits.pop(sock, None)
        self._shed.pop(sock, None)
        sock.close(0)

    def serve(self, sock: zmq.Socket, drain_max: int = DRAIN_PER_POLL) -> None:
        """Serve requests arriving on a ROUTER (or DEALER) socket with the registered handlers
        (``drain_max``: see :meth:`add_socket`)."""
        router = sock.socket_type == zmq.ROUTER
        self.add_socket(sock, lambda parts, s=sock, r=router: self._on_request(s, parts, r), drain_max)

    def shed_late(self, sock: zmq.Socket, after_ms: float, shed: Callable[[zmq.Socket, list, float], bool]) -> None:
        """Before a message read from ``sock`` is handled, one that waited longer than ``after_ms``
        since it was read goes to ``shed(sock, parts, waited_ms)`` first; True means it was
        answered there (the broker's cheap SYSTEM_BUSY for late sends: an overloaded loop must
        refuse faster than it serves)."""
        self._shed[sock] = (after_ms / 1000.0, shed)

    def handle(self, code: int, fn: Handler) -> None:
        """Register ``fn`` for requests with ``code``."""
        self._request_handlers[int(code)] = fn

    def at_turn_end(self, fn: Callable[[], None]) -> bool:
        """Run ``fn()`` once the requests read from a socket in this turn are all handled, before
        their replies are written (:class:`_Outbox`); replies ``fn`` sends go out with them.  A
        group commit: the POP service appends the revive records of a turn's POPs and acks as one
        batch per revive queue there.  Returns False, and registers nothing, when no such batch is
        being handled (a lone request, a timer, ``RMQ_DEFER_REPLIES=0``): the caller does its work
        now.  The callables run in the order registered, each once per registration; one that
        raises is logged and the others still run."""
        ends = self._turn_end
        if ends is None:
            return False
        ends.append(fn)
        return True

    def add_timer(self, interval_ms: float, fn: Callable[[], None], first_ms: Optional[float] = None,
                  repeat: bool = True) -> None:
        """Run ``fn`` every ``interval_ms`` (first after ``first_ms``, default one interval)."""
        due = time.monotonic() + (interval_ms if first_ms is None else first_ms) / 1000.0
        heapq.heappush(self._timers, (due, next(self._timer_seq), interval_ms if repeat else None, fn))

    # -- request path -------------------------------------------------------------------
    def _on_request(self, sock: zmq.Socket, parts: list, router: Optional[bool] = None) -> None:
        # envelope: the peer identity a ROUTER prepends, plus a REQ-style empty delimiter if present
        envelope: list = []
        rest = parts
        if router is None:
            router = sock.socket_type == zmq.ROUTER
        if router:
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
        reply.received_at = self.request_received_at      # read off the socket (RPC latency metrics)
        if self.rpc_observer is not None and sock in self._observed_socks:
            reply.request_code = frame.code
            reply.observer = self.rpc_observer
        policy = self._sock_policy.get(sock) if self._sock_policy else None
        if policy is not None and (policy == "curve" or frame.code in S.RESTRICTED_CODES):
            denied = self._denied(policy, frame.code, parts[0])   # any part has the connection's metadata
            if denied:
                self.log.warning("request code %s refused: %s", frame.code, denied)
                reply.error(ResponseCode.NO_PERMISSION, denied)
                return
        fn = self._request_handlers.get(frame.code)
        if fn is not None and frame.code in S.ADMIN_CODES:
            try:
                S.check_admin_names(frame)
            except ProtocolError as e:
                reply.error(e.code, e.remark)
                return
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
        if reply.observer is not None:
            if reply.oneway:
                reply.observer(frame.code, -1, (time.monotonic() - reply.received_at) * 1000.0, False, "oneway")
            elif not reply.sent:
                reply.held = True

    def serve_metrics(self, metrics, sock: zmq.Socket, setting: str) -> int:
        """Start ``metrics`` (:class:`rmq.metrics.ActorMetrics`): its scrape hand-off polled by this
        loop, requests on ``sock`` observed for ``rocketmq_rpc_latency``.  Returns the bound port.

        Raises
        ------
        SystemExit
            The address is taken: one line naming ``setting`` (the actor refuses to start).
        """
        from rmq.metrics import RpcObserver
        self.add_socket(metrics.bridge.socket, metrics.bridge.serve)
        try:
            port = metrics.start()
        except OSError as e:
            raise SystemExit(f"{self.name}: cannot serve metrics on {metrics.settings.host}:"
                             f"{metrics.settings.port} ({setting}): {e}") from None
        self.rpc_observer = RpcObserver(metrics, RequestCode, ResponseCode)
        self._observed_socks = {sock}
        self.log.info("metrics: http://%s:%d/metrics", metrics.settings.host, port)
        return port

    def _denied(self, policy: str, code: int, part) -> str:
        """Why a request on a tcp listener is refused ("" = allowed); see rmq.security."""
        if code in S.LOCAL_CODES:
            return f"request code {code} is internal: not served on a network listener"
        if policy == "curve":
            key = S.request_role(part)
            role = self.security.keyring.role_of(key) if self.security is not None else None
            if role is None:
                return "client key not (or no longer) allowed"
            if code in S.ADMIN_CODES and role != S.ROLE_ADMIN:
                return f"request code {code} needs an admin key"
            if code in S.NODE_CODES and role not in (S.ROLE_NODE, S.ROLE_ADMIN):
                return f"request code {code} needs the cluster node key"
            return ""
        if code in S.ADMIN_CODES and not S.peer_is_loopback(part):
            return (f"request code {code} is an admin command: served to loopback peers only "
                    f"while CURVE is off (set authEnable and use an admin key)")
        return ""

    def decode_or_log(self, parts: list, what: str) -> Optional[Frame]:
        """``parts`` decoded, or None with a warning naming ``what`` (a peer's bad frame is
        logged and dropped, never raised into the loop)."""
        try:
            return P.decode(parts)
        except ProtocolError as e:
            self.log.warning("bad %s: %s", what, e)
            return None

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
        """Run the loop until stopped; always calls ``on_stop`` and closes the context.  Tunes
        this process's malloc first (:func:`rmq.common.malloc_tuning.tune_malloc`)."""
        tune_malloc()

        def _sig(signum, _frame):
            self._running = False
        signal.signal(signal.SIGTERM, _sig)
        signal.signal(signal.SIGINT, _sig)
        try:
            self.init_security()
        except S.SecurityError as e:
            self.log.error("refusing to start: %s", e)
            self.ctx.destroy(linger=0)
            raise SystemExit(f"{self.name}: refusing to start: {e}") from None
        self._running = True
        if self.store_path:
            write_pid_file(self.store_path, self.name)   # how the broker's metrics find its group
        try:
            if self.supervisor_endpoint:
                self._beat_socket = self.socket(zmq.DEALER, connect=self.supervisor_endpoint, secure=False)
                self.add_timer(HEARTBEAT_INTERVAL_MS, self._beat, first_ms=0)
            self.on_start()
            self.log.info("%s started (pid %d)", self.name, os.getpid())
            while self._running:
                self.run_once()
        except Exception:
            self.log.exception("%s failed", self.name)     # the log has why, not only the lost stderr
            raise
        finally:
            try:
                self.on_stop()
            finally:
                self.log.info("%s stopped", self.name)
                if self.security is not None:
                    self.security.stop()
                self.ctx.destroy(linger=0)

    def run_once(self, max_wait_ms: float = 1000.0) -> None:
        """One poll + dispatch + timers step."""
        now = time.monotonic()
        timeout = poll_timeout_ms(now, self._timers[0][0] if self._timers else None, max_wait_ms)
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
            # read what is queued (bounded so timers are not starved), stamped when the read began
            monotonic = time.monotonic
            self.request_received_at = read_at = monotonic()
            batch = recv_waiting(sock, self._drain_limits.get(sock, DRAIN_PER_POLL))
            shed = self._shed.get(sock)
            last = len(batch) - 1
            outbox = _OUTBOX.parts = [] if DEFER_REPLIES and last > 0 else None
            self._turn_end = [] if outbox is not None else None
            try:
                if shed is None:
                    for i, parts in enumerate(batch):
                        self.last_of_turn = i == last
                        handler(parts)
                else:
                    after_s, shed_fn = shed
                    for i, parts in enumerate(batch):
                        waited = monotonic() - read_at
                        if waited > after_s and shed_fn(sock, parts, waited * 1000.0):
                            continue
                        self.last_of_turn = i == last
                        handler(parts)
            finally:
                ends, self._turn_end = self._turn_end, None
                for fn in ends or ():
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - as a handler's: logged, the turn's replies still go
                        self.log.exception("end of turn %s failed", getattr(fn, "__name__", fn))
                if outbox is not None:
                    _OUTBOX.parts = None
                    for reply, code, parts in outbox:
                        reply._write(code, parts)
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


def serve_as_actor(name: str, serve: Callable[[], None], listen: str, store_path: Optional[str] = None,
                   supervisor: Optional[str] = None) -> int:
    """Run ``serve()`` (a server with its own event loop: the dashboard, the proxy) as an actor of
    ``rmq start``: writes ``<store>/run/<name>.pid``, beats ACTOR_BEAT to ``supervisor`` from a
    :class:`BeatThread` while it runs, and turns a refusal into one line on stderr.

    Returns the exit code: 0 after ``serve`` returned (SIGTERM / SIGINT), 1 when it raised
    ValueError (a bad setting: "refusing to start") or OSError (``listen`` cannot be bound).
    Tunes this process's malloc first, as :meth:`Actor.run`.
    """
    tune_malloc()
    if store_path:
        write_pid_file(store_path, name)
    beat = BeatThread(supervisor, name) if supervisor else None
    if beat is not None:
        beat.start()
    try:
        serve()
    except ValueError as e:
        print(f"{name}: refusing to start: {e}", file=sys.stderr)
        return 1
    except OSError as e:          # the port is taken
        print(f"{name}: cannot listen on {listen}: {e}", file=sys.stderr)
        return 1
    finally:
        if beat is not None:
            beat.done.set()
    return 0


class BeatThread(threading.Thread):
    """ACTOR_BEAT to the supervisor at ``endpoint`` every HEARTBEAT_INTERVAL_MS until ``done`` is set:
    the beat of an actor whose main loop is not an :class:`Actor` loop (the dashboard, the proxy)."""

    def __init__(self, endpoint: str, name: str):
        super().__init__(name=f"rmq-{name}-beat", daemon=True)
        self.endpoint = endpoint
        self.actor_name = name
        self.done = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        frame = P.encode(Frame(RequestCode.ACTOR_BEAT, flag=P.FLAG_ONEWAY,
                               fields={"name": self.actor_name, "pid": os.getpid()}))
        try:
            while not self.done.is_set():
                try:
                    sock.send_multipart(frame, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
                self.done.wait(HEARTBEAT_INTERVAL_MS / 1000.0)
        finally:
            sock.close(linger=0)
