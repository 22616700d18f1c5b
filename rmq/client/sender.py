"""The thread producer's I/O thread (:class:`Sender`): every ZeroMQ socket of a producer (a
DEALER per NameServer and per broker address, with a monitor), the accumulators of
:mod:`rmq.client.message_accumulator`, the requests in flight, their timeouts and retries, and the
route look-ups of :mod:`rmq.client.publish_routes` driven as answers arrive.

State: all of it owned by the thread, but the hand-over deque, the caller-side batches
(``open``) and the pending / flush counters, which callers touch under ``lock`` / ``cond``.
Thread: ``rmq-producer-<group>``; callers reach it through :meth:`Sender.submit`,
:meth:`Sender.call` and :meth:`Sender.wake`.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Optional

import zmq

from rmq import latency_trace as _lt
from rmq import protocol as P
from rmq import security
from rmq._core.client_msg import complete_send_batch
from rmq.client.direct import close_monitored
from rmq.client.futures import ManyPart
from rmq.client.message import SendResult
from rmq.client.message_accumulator import (ASYNC, ONEWAY, Accumulator, Pending, QueueTurns, Request, mergeable,
                                            pending_bytes, request_bytes, split_pending)
from rmq.client.producer_request import (ProducerOptions, apply_selector, batch_body_of, batch_send_result,
                                         heartbeat_request, many_request_size, refused_batch_limit, send_request,
                                         send_response_fields, uniq_ids_of)
from rmq.client.publish_routes import PROVISIONAL_POLL_MS, PublishRoutes, no_route_error
from rmq.client.route import MQFaultStrategy, RouteCache, TopicPublishInfo, namesrv_attempt_s
from rmq.errors import MQBrokerError, MQClientError, RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode
from rmq.zmqio import monitor_events, recv_waiting, send_parts

log = logging.getLogger("rmq.producer")

class Conn:
    """A DEALER to one broker address (owned by the I/O thread)."""

    __slots__ = ("addr", "sock", "monitor", "parked", "need_heartbeat", "pollout")

    def __init__(self, addr: str, sock: zmq.Socket, monitor: Optional[zmq.Socket]):
        self.addr = addr
        self.sock = sock
        self.monitor = monitor
        self.parked: collections.deque = collections.deque()
        self.need_heartbeat = True
        self.pollout = False


def broker_socket(ctx: zmq.Context, immediate: bool) -> zmq.Socket:
    s = P.dealer(ctx)
    s.setsockopt(zmq.SNDHWM, 10_000)
    s.setsockopt(zmq.RCVHWM, 10_000)
    if immediate:
        s.setsockopt(zmq.IMMEDIATE, 1)
    return s


class Sender(threading.Thread):
    """The producer's I/O thread: every socket, the route cache, accumulators, in-flight requests.

    Caller threads use only :meth:`submit`, :meth:`call`, :meth:`wake` and the
    ``cond`` / ``pending`` pair; everything else runs in this thread.
    """

    def __init__(self, namesrv_addrs: list, group: str, client: str, opts: ProducerOptions):
        super().__init__(name=f"rmq-producer-{group}", daemon=True)
        self.namesrv_addrs = namesrv_addrs
        self.group = group
        self.client = client
        self.opts = opts
        self.route_cache = RouteCache()
        self.fault = MQFaultStrategy(opts.send_latency_fault_enable, opts.latency_max, opts.not_available_duration,
                                     opts.isolation_latency_ms)
        self.stats = {"requests": 0, "batch_requests": 0, "split_requests": 0, "messages": 0, "retries": 0, "failed_messages": 0,
                      "route_requests": 0}
        # caller <-> I/O thread
        self._cmds: collections.deque = collections.deque()     # ("call" | "stop", arg)
        self._sends: collections.deque = collections.deque()    # Pending
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # closed when the sender is garbage (never earlier: a late wake() must not write to a reused fd)
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._wake_pending = False
        self.lock = threading.Lock()      # the cond's lock: ``with lock`` where no wait/notify is needed
        self.cond = threading.Condition(self.lock)
        self.pending = 0                  # messages accepted and not yet completed (under cond)
        self.flushing = 0                 # flush() calls in progress (under cond)
        self.blocked = 0                  # send_async callers waiting for room (under cond)
        self.low_water = max(opts.max_pending_messages * 3 // 4, 1)   # ... are woken at or below this
        # topic -> the caller-side batch send_async callers append to (under lock); the I/O thread
        # seals it (removes it from here) when it takes it from _sends
        self.open: dict = {}
        self.record_failures = False      # set by close(): collect async failures
        self.failures: list = []
        self.started_evt = threading.Event()
        self.running = False              # True from start until the loop ends (cheaper than is_alive())
        self.fatal: Optional[BaseException] = None
        # I/O-thread-only state
        self._ctx: Optional[zmq.Context] = None
        self._poller = zmq.Poller()
        self._conns: dict = {}            # addr -> Conn
        self._by_sock: dict = {}          # socket -> handler
        self._ns: list = []               # DEALERs to the NameServers
        self._ns_next = 0
        self._ns_pending: dict = {}       # opaque -> (deadline, ns index, tries, frame, step of its call)
        self._routes = PublishRoutes(self.route_cache)   # per-topic look-up state (sans I/O, shared rules)
        self._resolving: set = set()      # topics with a publish_info_call out for their waiters
        self._route_waiters: dict = {}    # topic -> [Pending]
        self._route_queries: dict = {}    # topic -> [Future of TopicPublishInfo] (fetch_publish_message_queues)
        self._pub: dict = {}              # topic -> TopicPublishInfo: lock-free copy of the cache's, reset on change
        self._discovering = False         # a GET_BROKER_CLUSTER_INFO of discover_brokers is out
        self._inflight: dict = {}         # opaque -> Request
        self._parked_n = 0
        self._timeouts: list = []         # heap (deadline, opaque): stale entries are skipped, and hold
                                          # no request (a finished request must not stay alive until then)
        self._ready: collections.deque = collections.deque()
        self._accs: dict = {}             # (topic, fixed MessageQueue or None) -> Accumulator
        # ordered sends (a fixed queue): max_in_flight_per_queue requests out per queue, the next held
        # (the held ones joined when a turn passes, up to many_request_size: request_bytes, Request)
        # bytes of a batch: the option, lowered to the largest batch a broker takes once one refused
        # a batch as too large (_split); callers read it under ``lock``
        self.batch_size = opts.batch_size
        self.batch_limit = 0              # the lowest such size a broker answered with (bytes; 0: none)
        self._queue_turns = QueueTurns(opts.max_in_flight_per_queue, many_request_size(opts), mergeable, request_bytes,
                                       lambda first, joined: Request(
                                           [it for r in (first, *joined) for it in r.items], first.fixed, opts))
        self._opaque = itertools.count(1)
        self._done = 0                    # messages completed in this loop turn
        self._stopping = False
        self._next_refresh = 0.0
        self._next_heartbeat = 0.0
        # called on this thread with (broker address, Frame) for requests a broker sends
        # (CHECK_TRANSACTION_STATE to a TransactionProducer); None: ignored
        self.request_handler: Optional[Callable[[str, Frame], None]] = None
        # True (a TransactionProducer): learn every broker of the cluster from the NameServer at start
        # and at each route poll, so that each master gets heartbeats, and can check back, before
        # this producer has sent anything to it
        self.discover_brokers = False

    def enable_broker_discovery(self) -> None:
        """(any thread) Set :attr:`discover_brokers` and ask the NameServer now."""
        self.discover_brokers = True
        self._next_refresh = 0.0
        self.wake()

    # -- caller side ---------------------------------------------------------------------------
    def send_frame(self, addr: str, frame: Frame) -> None:
        """I/O thread only: send ``frame`` (one-way) to the broker at ``addr`` on this producer's
        connection (heartbeat first if due).  Raises RemotingError when it cannot be queued."""
        conn = self._conn(addr)
        try:
            if conn.need_heartbeat:
                send_parts(conn.sock, P.encode(heartbeat_request(self.client, self.group)))
                conn.need_heartbeat = False
            send_parts(conn.sock, P.encode(frame))
        except zmq.ZMQError as e:
            raise RemotingError(f"cannot send {RequestCode(frame.code).name} to broker {addr}: {e}") from None

    def wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def submit(self, pending: Pending) -> None:
        self._sends.append(pending)
        if self.running:
            self.wake()
        else:
            self._fail_orphans()

    def _fail_orphans(self) -> None:
        """(any thread) Fail sends handed over after the loop ended (it died or was stopped)."""
        err = MQClientError(f"producer {self.group}: I/O thread is not running"
                            f"{': %s' % self.fatal if self.fatal else ''}")
        n = 0
        while True:
            try:
                p = self._sends.popleft()
            except IndexError:
                break
            n += len(p.preps)
            for f in (p.futures if p.futures is not None else (p.future,)):
                try:
                    f.set_exception(err)
                except Exception:  # noqa: BLE001
                    pass
        with self.lock:
            self.open.clear()
        if n:
            with self.cond:
                self.pending -= n
                self.cond.notify_all()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` in the I/O thread; its return value (or exception) lands in the future."""
        fut: Future = Future()
        self._cmds.append(("call", (fn, fut)))
        self.wake()
        return fut

    def stop(self) -> None:
        self._cmds.append(("stop", None))
        self.wake()

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._ctx = zmq.Context()
            security.register_context(self._ctx, getattr(self, "client_auth", None))
            for addr in self.namesrv_addrs:
                s = broker_socket(self._ctx, immediate=False)
                s.connect(f"tcp://{addr}")
                self._ns.append(s)
                self._register(s, self._on_ns_readable)
            self._poller.register(self._wake_r, zmq.POLLIN)
            now = time.monotonic()
            self._next_refresh = now + self.opts.poll_name_server_interval_ms / 1000.0
            self._next_heartbeat = now + self.opts.heartbeat_broker_interval_ms / 1000.0
            self.running = True
            self.started_evt.set()
            while True:
                self._turn()
                if self._stopping and self._idle():
                    break
        except BaseException as e:  # noqa: BLE001 - report, fail everything, never hang callers
            self.fatal = e
            log.exception("producer I/O thread failed")
        finally:
            self.started_evt.set()
            try:
                self._shutdown()
            finally:
                with self.cond:
                    self.running = False
                    self.cond.notify_all()
                self._fail_orphans()

    def _idle(self) -> bool:
        return not (self._inflight or self._parked_n or self._ready or self._accs or self._route_waiters
                    or self._cmds or self._sends)

    def _turn(self) -> None:
        timeout = self._poll_timeout_ms()
        events = self._poller.poll(timeout)
        for sock, ev in events:
            if sock == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            handler = self._by_sock.get(sock)
            if handler is not None:
                handler(sock, ev)
        self._wake_pending = False
        self._drain_commands()
        now = time.monotonic()
        self._expire(now)
        self._timers(now)
        self._close_batches(now)
        self._pump()
        self._release_done()

    def _poll_timeout_ms(self) -> float:
        if self._cmds or self._sends or (self._ready and self._room()):
            return 0
        now = time.monotonic()
        t = now + 1.0
        if self._timeouts:
            t = min(t, self._timeouts[0][0])
        for conn in self._conns.values():
            if conn.parked:
                t = min(t, conn.parked[0][0].park_deadline)
        for (deadline, _, _, _, _) in self._ns_pending.values():
            t = min(t, deadline)
        if self._accs and self._room():
            linger = self.opts.linger_ms / 1000.0
            if self.flushing or self._stopping:
                return 0
            turns = self._queue_turns
            for key, acc in self._accs.items():
                if not turns.busy(key[1]):   # a busy ordered queue's batch waits for its turn, not linger
                    t = min(t, acc.created + linger)
        t = min(t, self._next_refresh, self._next_heartbeat)
        if self._routes.any_provisional:
            t = min(t, now + PROVISIONAL_POLL_MS / 1000.0)
        return max(0.0, (t - now) * 1000.0 + 0.5)

    def _drain_commands(self) -> None:
        sends = self._sends
        accept = self._accept
        while sends:
            p = sends.popleft()
            if p.futures is not None:           # seal a caller-side batch: no caller appends after this
                with self.lock:
                    if self.open.get(p.open_key) is p:
                        del self.open[p.open_key]
            accept(p)
        cmds = self._cmds
        while cmds:
            kind, arg = cmds.popleft()
            if kind == "call":
                fn, fut = arg
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001
                    fut.set_exception(e)
            elif kind == "stop":
                self._stopping = True

    def _release_done(self) -> None:
        if self._done:
            with self.cond:
                self.pending -= self._done
                if (self.blocked and self.pending <= self.low_water) or (self.flushing and self.pending == 0):
                    self.cond.notify_all()
            self._done = 0

    # -- completion ------------------------------------------------------------------------
    def _complete(self, pending: Pending, result: Any) -> None:
        self._done += len(pending.preps)
        self.stats["messages"] += len(pending.preps)
        try:
            pending.future.set_result(result)
        except Exception:  # noqa: BLE001 - InvalidStateError: nothing to deliver to
            pass

    def _complete_each(self, pending: Pending, results: Optional[list]) -> None:
        """A caller-side batch: message ``i``'s future gets ``results[i]`` (None: one-way)."""
        n = len(pending.preps)
        self._done += n
        self.stats["messages"] += n
        for i, f in enumerate(pending.futures):
            try:
                f.set_result(results[i] if results is not None else None)
            except Exception:  # noqa: BLE001
                pass

    def _fail(self, pending: Pending, exc: BaseException) -> None:
        self._done += len(pending.preps)
        self.stats["failed_messages"] += len(pending.preps)
        if pending.mode == ASYNC and self.record_failures:
            self.failures.append((pending, exc))
        for f in (pending.futures if pending.futures is not None else (pending.future,)):
            try:
                f.set_exception(exc)
            except Exception:  # noqa: BLE001
                pass

    def _fail_request(self, req: Request, exc: BaseException) -> None:
        for it in req.items:
            self._fail(it, exc)
        if req.queue_turn:
            self._end_turn(req)

    # -- accepting messages -------------------------------------------------------------------
    def _accept(self, pending: Pending) -> None:
        if self._stopping and self._ctx is None:
            self._fail(pending, MQClientError("producer is closed"))
            return
        topic = pending.topic
        info = self._pub.get(topic)
        if info is None:
            info = self.route_cache.publish_info(topic)
            if info is not None and info.ok:
                self._pub[topic] = info
        if info is None or not info.ok:
            self._route_waiters.setdefault(topic, []).append(pending)
            self._resolve(topic)
            return
        self._place(pending, info)

    def _place(self, pending: Pending, info: TopicPublishInfo) -> None:
        fixed = pending.queue
        if fixed is None and pending.selector is not None:
            try:
                fixed = apply_selector(pending.selector, info,
                                       None if pending.rows is not None else pending.preps[0].msg, pending.arg)
            except MQClientError as e:
                self._fail(pending, e)
                return
        if (self.opts.batching and pending.mode == ASYNC and not pending.whole and pending.rows is None
                and pending.preps[0].batchable):
            key = (pending.topic, fixed)
            size = pending_bytes(pending)
            acc = self._accs.get(key)
            if acc is not None and acc.items and acc.nbytes + size > self.batch_size:
                self._ship(key, acc)
                acc = None
            if acc is None:
                acc = self._accs[key] = Accumulator(time.monotonic())
            acc.items.append(pending)
            acc.nbytes += size
            if acc.nbytes >= self.batch_size:
                self._ship(key, acc)
            return
        if self.opts.batching and (pending.mode == ASYNC or fixed is not None):
            # an unbatchable message (compressed, delayed, user batch), or a sync / one-way one for a
            # chosen queue (an ordered send), goes after what is queued for its queue
            key = (pending.topic, fixed)
            acc = self._accs.get(key)
            if acc is not None:
                self._ship(key, acc)
        self._ready.append(Request([pending], fixed, self.opts))

    def _ship(self, key: tuple, acc: Accumulator) -> None:
        del self._accs[key]
        self._ready.append(Request(acc.items, key[1], self.opts))

    def _close_batches(self, now: float) -> None:
        if not self._accs:
            return
        force = self.flushing > 0 or self._stopping
        if not force and not self._room():
            return                          # keep filling while the pipeline is full
        linger = self.opts.linger_ms / 1000.0
        turns = self._queue_turns
        for key, acc in list(self._accs.items()):
            if force or (now >= acc.created + linger and not turns.busy(key[1])):
                self._ship(key, acc)   # an ordered queue's batch fills while its queue has a request out

    # -- sending ------------------------------------------------------------------------------
    def _room(self) -> bool:
        # requests parked on a broker that is not connected do not count: they all wait for the
        # same connection (at most connect_timeout_ms), so a dead broker cannot stall the queue
        return len(self._inflight) < self.opts.max_in_flight

    def _pump(self) -> None:
        ready = self._ready
        turns = self._queue_turns
        while ready and self._room():
            req = ready.popleft()
            q = req.fixed
            if q is not None and not req.queue_turn and not turns.take(q, req):
                continue                     # its queue has its requests out: wait behind them
            self._attempt(req)

    def _end_turn(self, req: Request) -> None:
        """``req`` (an ordered send) has its outcome: the next request held for its queue goes next,
        with the batches held behind it (QueueTurns joins them up to ``many_request_size``: 256 KiB
        with the default ``batch_size``, else the user's ``batch_size``; lowered to what a broker
        takes once one refused a batch as too large)."""
        nxt = self._queue_turns.end(req.fixed, req)
        if nxt is not None:
            self._ready.appendleft(nxt)

    def _attempt(self, req: Request) -> None:
        """Select a queue and send ``req`` (or park it until its broker is connected)."""
        now = time.monotonic()
        try:
            mq, addr = req.target(now, self.route_cache, self.fault)
        except MQClientError as e:        # out of time before sending, or no queue / broker
            self._fail_request(req, req.give_up(e, now, self.opts))
            return
        if req.attempt > 1:
            self.stats["retries"] += 1
        if req.batch and req.batch_body is None:
            req.batch_body = batch_body_of(req.preps)
        frame = send_request(req.preps, mq.queue_id, self.group, req.batch, req.mode == ONEWAY, req.batch_body,
                             self.opts.default_topic_queue_nums)
        req.opaque = frame.opaque = next(self._opaque)
        try:
            parts = P.encode(frame)
        except ProtocolError as e:
            self._fail_request(req, req.give_up(MQClientError(f"cannot encode the send request: {e.remark}",
                                                              int(ResponseCode.MESSAGE_ILLEGAL)), now, self.opts))
            return
        conn = self._conn(addr)
        if _lt.ENABLED:                   # before the write: the broker may read it before we run again
            _lt.stamp_ids("p_write", uniq_ids_of(req.preps), time.monotonic_ns())
        if conn.parked or not self._try_send(conn, parts):
            req.park_deadline = min(req.deadline, now + self.opts.connect_timeout_ms / 1000.0)
            conn.parked.append((req, parts))
            self._parked_n += 1
            self._set_pollout(conn, True)
            return
        self._sent(req, now)

    def _sent(self, req: Request, now: float) -> None:
        self.stats["requests"] += 1
        if req.batch:
            self.stats["batch_requests"] += 1
        if req.mode == ONEWAY:
            for it in req.items:
                if it.futures is not None:
                    self._complete_each(it, None)
                else:
                    self._complete(it, None)
            if req.queue_turn:
                self._end_turn(req)
            return
        self._inflight[req.opaque] = req
        heapq.heappush(self._timeouts, (min(req.deadline, now + req.attempt_timeout), req.opaque))

    def _try_send(self, conn: Conn, parts: list) -> bool:
        if conn.need_heartbeat:
            try:
                send_parts(conn.sock, P.encode(heartbeat_request(self.client, self.group)))
                conn.need_heartbeat = False
            except zmq.Again:
                return False
        try:
            send_parts(conn.sock, parts)
            return True
        except zmq.Again:
            return False

    def _set_pollout(self, conn: Conn, on: bool) -> None:
        if conn.pollout != on:
            conn.pollout = on
            self._poller.modify(conn.sock, zmq.POLLIN | (zmq.POLLOUT if on else 0))

    def _flush_parked(self, conn: Conn) -> None:
        now = time.monotonic()
        while conn.parked:
            req, parts = conn.parked[0]
            if not self._try_send(conn, parts):
                break
            conn.parked.popleft()
            self._parked_n -= 1
            req.sent_at = now
            self._sent(req, now)
        self._set_pollout(conn, bool(conn.parked))

    def _conn(self, addr: str) -> Conn:
        conn = self._conns.get(addr)
        if conn is None:
            s = broker_socket(self._ctx, immediate=True)
            mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            s.connect(f"tcp://{addr}")
            conn = self._conns[addr] = Conn(addr, s, mon)
            self._register(s, lambda sock, ev, c=conn: self._on_broker_readable(c, ev))
            self._register(mon, lambda sock, ev, c=conn: self._on_monitor(c))
        return conn

    def _register(self, sock: zmq.Socket, handler: Callable) -> None:
        self._by_sock[sock] = handler
        self._poller.register(sock, zmq.POLLIN)

    # -- responses ------------------------------------------------------------------------------
    def _on_broker_readable(self, conn: Conn, ev: int) -> None:
        if ev & zmq.POLLIN:
            self._drain_broker(conn)
        if ev & zmq.POLLOUT and conn.parked:
            self._flush_parked(conn)

    def _drain_broker(self, conn: Conn, limit: int = 4096) -> None:
        for parts in recv_waiting(conn.sock, limit):
            try:
                resp = P.decode(parts)
            except ProtocolError as e:
                log.warning("undecodable response from broker %s: %s", conn.addr, e)
                continue
            if not resp.is_response:           # a broker's request (CHECK_TRANSACTION_STATE)
                handler = self.request_handler
                if handler is None:
                    log.debug("request %s from broker %s ignored: no handler", resp.code, conn.addr)
                    continue
                try:
                    handler(conn.addr, resp)
                except Exception:  # noqa: BLE001 - a handler's bug must not stop the I/O thread
                    log.exception("handling request %s from broker %s failed", resp.code, conn.addr)
                continue
            req = self._inflight.pop(resp.opaque, None)
            if req is None:
                continue                       # late answer to a request that timed out, or a heartbeat
            self._on_response(req, resp)

    def _on_response(self, req: Request, resp: Frame) -> None:
        now = time.monotonic()
        mq = req.mq
        if resp.code == ResponseCode.MESSAGE_ILLEGAL and req.batch and req.batch_body is not None:
            limit = refused_batch_limit(resp, len(req.batch_body), len(req.preps))
            if limit and self._split(req, limit):
                return
        try:
            status, answered_mq, base, offset_ids = send_response_fields(resp, req.topic, mq.broker_name, req.addr,
                                                                  len(req.preps))
        except MQBrokerError as e:
            self._retry_or_fail(req, e, now)
            return
        req.answered(now, self.fault)
        i = 0
        for it in req.items:
            n = len(it.preps)
            if it.rows is not None:               # send_async_columns: one record for the request's rows
                self._complete(it, (status, answered_mq, base + i, offset_ids[i:i + n]))
            elif it.futures is not None:           # a caller-side batch: each future its own result, in C
                complete_send_batch(it.futures, SendResult, status, it.preps, answered_mq, base + i,
                                    offset_ids[i:i + n])
                self._done += n
                self.stats["messages"] += n
            elif it.whole:                        # a user batch: one result, ids comma-joined
                self._complete(it, batch_send_result(status, answered_mq, base + i, it.preps, offset_ids[i:i + n]))
            else:
                part = complete_send_batch(None, SendResult, status, it.preps, answered_mq, base + i, offset_ids[i:i + n])
                # a part of send_async_many: its results in one call; else one message
                self._complete(it, part if type(it.future) is ManyPart else part[0])
            i += n
        if req.queue_turn:
            self._end_turn(req)
        info = self.route_cache.publish_info(req.topic)
        if info is not None and self._routes.refresh_after_send(info, now):
            self._fetch_route(req.topic)

    def _split(self, req: Request, limit: int) -> bool:
        """The broker refused ``req``'s batch as too large to store whole, taking at most ``limit``
        bytes (``refused_batch_limit``): send its messages again as parts that fit (Kafka's split of a batch refused as MESSAGE_TOO_LARGE),
        in order, ahead of what waits; an ordered request's parts keep its queue's turn, one
        after the other.  Later batches of this producer are made to fit (``batch_size``).  False
        (the refusal stands): a user batch (``send_batch``), stored whole or not at all."""
        if any(it.whole for it in req.items):
            return False
        items: list = []
        for it in req.items:
            items.extend(split_pending(it, limit))
        groups: list = []
        group: list = []
        size = 0
        for it in items:
            n = pending_bytes(it)
            if group and (it.rows is not None or group[0].rows is not None or size + n > limit):
                groups.append(group)      # a send_async_columns part is a request of its own
                group, size = [], 0
            group.append(it)
            size += n
        groups.append(group)
        parts = [Request(g, req.fixed, self.opts) for g in groups]
        for r in parts:
            r.split = True
        self.stats["split_requests"] += 1
        if not self.batch_limit or limit < self.batch_limit:
            self.batch_limit = limit
            log.warning("broker %s refused a batch of %d bytes as too large (it takes at most %d): sending it "
                        "in %d parts; batches of this producer are now at most %d bytes", req.addr,
                        len(req.batch_body or b""), limit, len(parts), limit)
            with self.lock:
                self.batch_size = min(self.batch_size, limit) if self.batch_size else 0
            self._queue_turns.cap = min(self._queue_turns.cap, limit)
        if req.queue_turn:                # the turn passes to the first part; the others go next
            req.queue_turn = False
            parts[0].queue_turn = True
            self._queue_turns.hold_first(req.fixed, parts[1:])
            self._ready.appendleft(parts[0])
        else:
            self._ready.extendleft(reversed(parts))
        return True

    def _on_monitor(self, conn: Conn) -> None:
        disconnected = connected = False
        for event in monitor_events(conn.monitor):
            if event == zmq.EVENT_DISCONNECTED:
                disconnected, connected = True, False
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
        if connected and conn.need_heartbeat and not conn.parked:
            # (re)connected: the broker learns of this producer now, not at the next send or interval
            try:
                send_parts(conn.sock, P.encode(heartbeat_request(self.client, self.group)))
                conn.need_heartbeat = False
            except zmq.Again:
                pass
        if not disconnected:
            return
        conn.need_heartbeat = True
        self._drain_broker(conn)              # answers that made it before the connection closed
        now = time.monotonic()
        lost = [r for r in self._inflight.values() if r.addr == conn.addr]
        for req in lost:
            del self._inflight[req.opaque]
        for req in lost:
            self._retry_or_fail(req, RemotingConnectionClosedError(
                f"connection to broker {req.mq.broker_name} at {conn.addr} closed with the request in flight"), now)

    def _retry_or_fail(self, req: Request, exc: BaseException, now: float) -> None:
        self.route_in_doubt(req.topic, exc)     # a new master may have replaced this one
        final = req.failed(exc, now, self.fault, self.opts)
        if final is None:
            log.debug("retrying send to topic %s after: %s", req.topic, exc)
            self._attempt(req)
            return
        self._fail_request(req, final)

    def _expire(self, now: float) -> None:
        heap = self._timeouts
        while heap and heap[0][0] <= now:
            _, opaque = heapq.heappop(heap)
            req = self._inflight.pop(opaque, None)     # opaques are unique per attempt
            if req is not None:
                self._retry_or_fail(req, RemotingTimeoutError(
                    f"wait response from broker {req.mq.broker_name} at {req.addr} timed out after "
                    f"{(now - req.sent_at) * 1000:.0f} ms (topic {req.topic}, {len(req.preps)} message(s))"), now)
        for conn in list(self._conns.values()):
            while conn.parked and conn.parked[0][0].park_deadline <= now:
                req, _ = conn.parked.popleft()
                self._parked_n -= 1
                self._retry_or_fail(req, RemotingError(
                    f"cannot connect to broker {req.mq.broker_name} at {conn.addr} "
                    f"(waited {(now - req.sent_at) * 1000:.0f} ms)"), now)
            self._set_pollout(conn, bool(conn.parked))
        for opaque, (deadline, idx, tries, frame, step) in list(self._ns_pending.items()):
            if deadline <= now:
                del self._ns_pending[opaque]
                self._on_ns_failure(idx, tries, frame, step, RemotingTimeoutError(
                    f"NameServer {self.namesrv_addrs[idx]} did not answer within "
                    f"{self.opts.send_msg_timeout_ms / len(self._ns):.0f} ms"))

    def _timers(self, now: float) -> None:
        if self._routes.any_provisional:
            for topic in self._routes.provisional_due(now):
                self._fetch_route(topic)
        if now >= self._next_refresh:
            self._next_refresh = now + self.opts.poll_name_server_interval_ms / 1000.0
            for topic in self.route_cache.topics():
                self._fetch_route(topic)
            if self.discover_brokers:
                self._discover()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.opts.heartbeat_broker_interval_ms / 1000.0
            self._heartbeat_new_masters()
            for conn in self._conns.values():
                conn.need_heartbeat = True
                if not conn.parked:
                    try:
                        conn.sock.send_multipart(P.encode(heartbeat_request(self.client, self.group)), zmq.NOBLOCK)
                        conn.need_heartbeat = False
                    except zmq.Again:
                        pass

    # -- NameServer ------------------------------------------------------------------------------
    def _ns_send(self, frame: Frame, step: Callable[[Any, bool], None], tries: int = 0) -> None:
        """Send ``frame`` to a NameServer: the one that answered last, then the next ones while it
        fails (no answer in its share of ``send_msg_timeout_ms``, send queue full).  ``step(answer, False)`` gets
        the answer Frame, ``step(error, True)`` the last error once every NameServer failed."""
        idx = (self._ns_next + tries) % len(self._ns)
        frame.opaque = next(self._opaque)
        # each NameServer a share of the budget: a dead first one leaves the others time to answer
        deadline = time.monotonic() + namesrv_attempt_s(self.opts.send_msg_timeout_ms / 1000.0, len(self._ns))
        self._ns_pending[frame.opaque] = (deadline, idx, tries, frame, step)
        self.stats["route_requests"] += 1
        try:
            self._ns[idx].send_multipart(P.encode(frame), zmq.NOBLOCK)
        except zmq.Again:
            del self._ns_pending[frame.opaque]
            self._on_ns_failure(idx, tries, frame, step,
                                RemotingError(f"NameServer {self.namesrv_addrs[idx]}: send queue full"))

    def _on_ns_failure(self, idx: int, tries: int, frame: Frame, step: Callable[[Any, bool], None],
                       exc: BaseException) -> None:
        if tries + 1 < len(self._ns):
            self._ns_send(frame, step, tries + 1)
        else:
            log.warning("NameServer request %s failed: %s", frame.code, exc)
            step(exc, True)

    def _run_call(self, call, done: Callable[[Any, Optional[BaseException]], None]) -> None:
        """Drive a NameServer call of :mod:`rmq.client.publish_routes` on this thread's events:
        each request it yields goes out with :meth:`_ns_send`, and its answer (or error) goes back
        into it when it arrives; ``done(result, None)`` or ``done(None, error)`` at its end."""
        def step(value: Any, failed: bool) -> None:
            try:
                _, frame, _ = call.throw(value) if failed else call.send(value)
            except StopIteration as stop:
                done(stop.value, None)
            except Exception as e:  # noqa: BLE001 - the call's outcome
                done(None, e)
            else:
                self._ns_send(frame, step)
        step(None, False)

    def _fetch_route(self, topic: str) -> None:
        """Look ``topic``'s route up again (the periodic refresh, a provisional route's poll, a
        failure, :meth:`query_route`), unless a look-up of it is out."""
        routes = self._routes
        if routes.fetching(topic):
            return
        routes.started(topic, time.monotonic())
        self._run_call(routes.route_call(topic), lambda _route, exc: self._looked_up(topic, None, exc))

    def _resolve(self, topic: str) -> None:
        """Find a publish info for the messages waiting for ``topic``'s route (one look-up at a
        time; RocketMQ's tryToFindTopicPublishInfo, with rmq's provisional route)."""
        if topic in self._resolving:
            return
        self._resolving.add(topic)
        routes = self._routes
        routes.started(topic, time.monotonic())
        self._run_call(routes.publish_info_call(topic), lambda info, exc: self._looked_up(topic, info, exc, True))

    def _looked_up(self, topic: str, info: Optional[TopicPublishInfo], exc: Optional[BaseException],
                   resolved: bool = False) -> None:
        """A look-up of ``topic`` ended: queries answered; with ``resolved``, the messages waiting
        placed (or failed with ``exc``)."""
        self._routes.ended(topic)
        self._pub.clear()
        self._heartbeat_new_masters()
        if exc is not None and not resolved:
            exc = MQClientError(f"route of topic {topic}: {exc}", getattr(exc, "response_code", -1))
        self._answer_queries(topic, exc)
        if not resolved:
            return
        self._resolving.discard(topic)
        if exc is not None:
            info = self._routes.usable(topic)   # known meanwhile (another look-up): use it
        for p in self._route_waiters.pop(topic, None) or ():
            if info is None:
                self._fail(p, exc)
            else:
                self._place(p, info)

    def route_in_doubt(self, topic: str, exc: object) -> None:
        """(I/O thread) A send to ``topic`` failed with ``exc``: look its route up again when that
        puts it in doubt (:meth:`rmq.client.publish_routes.PublishRoutes.refresh_after_failure`)."""
        if self._routes.refresh_after_failure(topic, exc, time.monotonic()):
            self._fetch_route(topic)

    def _heartbeat_new_masters(self) -> None:
        """Connect to, and heartbeat, every master of the route table not connected yet
        (sendHeartbeatToAllBroker): a broker just promoted to master, or one a TransactionProducer
        has not sent to, learns of this producer before it needs it (check-backs)."""
        for addr in self.route_cache.master_addrs():
            if addr not in self._conns:
                self._conn(addr)         # its heartbeat goes once connected (_on_monitor)

    def _discover(self) -> None:
        """The cluster's brokers into the route table (:attr:`discover_brokers`), one look-up at a time."""
        if self._discovering:
            return
        self._discovering = True
        self._run_call(self._routes.brokers_call(), self._discovered)

    def _discovered(self, _brokers, exc: Optional[BaseException]) -> None:
        self._discovering = False
        if exc is not None:
            log.debug("cluster info refresh failed: %s", exc)
        self._heartbeat_new_masters()

    def _on_ns_readable(self, sock: zmq.Socket, ev: int) -> None:
        for _ in range(1024):
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                resp = P.decode(parts)
            except ProtocolError as e:
                log.warning("undecodable NameServer response: %s", e)
                continue
            entry = self._ns_pending.pop(resp.opaque, None)
            if entry is None:
                continue
            self._ns_next = entry[1]             # stick to a NameServer that answers
            entry[4](resp, False)

    def query_route(self, topic: str, answer: Future) -> None:
        """(I/O thread) Fetch ``topic``'s route; ``answer`` gets its TopicPublishInfo or an MQClientError."""
        self._route_queries.setdefault(topic, []).append(answer)
        self._fetch_route(topic)

    def _answer_queries(self, topic: str, exc: Optional[BaseException] = None) -> None:
        info = self.route_cache.publish_info(topic)
        for fut in self._route_queries.pop(topic, None) or []:
            if exc is None and (info is None or info.provisional):
                exc = no_route_error(topic)
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(info)

    # -- shutdown -----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        closed = MQClientError("producer closed before the message was sent")
        try:
            self._drain_commands()
        except BaseException:  # noqa: BLE001
            pass
        for topic in list(self._route_waiters):
            for p in self._route_waiters.pop(topic):
                self._fail(p, closed)
        for topic in list(self._route_queries):
            self._answer_queries(topic, closed)
        for acc in self._accs.values():
            for it in acc.items:
                self._fail(it, closed)
        self._accs.clear()
        for req in self._queue_turns.clear():   # an ending request's turn has no one to pass to now
            self._fail_request(req, closed)
        while self._ready:
            self._fail_request(self._ready.popleft(), closed)
        for conn in self._conns.values():
            while conn.parked:
                self._fail_request(conn.parked.popleft()[0], closed)
        self._parked_n = 0
        for req in self._inflight.values():
            self._fail_request(req, RemotingError(f"producer closed while waiting for broker {req.addr}"))
        self._inflight.clear()
        while self._sends:
            self._fail(self._sends.popleft(), closed)
        while self._cmds:
            kind, arg = self._cmds.popleft()
            if kind == "call":
                arg[1].set_exception(closed)
        self._release_done()
        for conn in self._conns.values():
            try:
                conn.sock.send_multipart(P.encode(Frame(RequestCode.UNREGISTER_CLIENT, flag=P.FLAG_ONEWAY, fields={
                    "clientID": self.client, "producerGroup": self.group})), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            close_monitored(conn.sock, conn.monitor, linger_ms=100)
        for s in self._ns:
            s.close(0)
        self._conns.clear()
        self._ns.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None




def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
