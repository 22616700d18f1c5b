"""asyncio producer: :class:`rmq.Producer`'s behaviour with ``await``.

::

    from rmq import Message
    from rmq.aio import Producer

    async with Producer("127.0.0.1:9876", group="pg") as p:
        r = await p.send(Message("orders", b"x", tags="created"))
        rs = await asyncio.gather(*(p.send(Message("orders", b"%d" % i)) for i in range(1000)))
        await p.send_batch([Message("orders", b"a"), Message("orders", b"b")])
        for i in range(100_000):                      # client-side batching, as rmq.Producer.send_async
            fut = await p.send_async(Message("orders", b"%d" % i), callback=done)
        await p.flush()

Same options, defaults, unique ids, compression, queue selection, latency
fault strategy and retries as :class:`rmq.client.producer.Producer` (the
message preparation, request encoding, batch bodies, response parsing and
route handling are shared).  Concurrent ``send`` calls are pipelined on one
DEALER per broker, one request each; :meth:`Producer.send_async` batches.

Client-side batching (:meth:`Producer.send_async`)
    As :meth:`rmq.Producer.send_async`'s default path (Kafka's RecordAccumulator,
    ``linger_ms`` 0): a message joins its topic's open batch on the event loop; a
    batch leaves as one SEND_BATCH_MESSAGE at once while fewer than ``max_in_flight``
    requests are out, otherwise it fills until a request completes or it reaches
    ``batch_size`` bytes (64 KiB; then it waits its turn, sealed).  A lone message
    leaves at once, so batching costs no latency and forms only under load.
    Ordered messages (selector, sharding key, explicit queue) whose topic's route
    is known join their queue's batch, and each such queue has one request out
    at a time (Kafka's ``max.in.flight.requests.per.connection=1`` rule for
    ordered partitions, as the thread producer): its next batch fills meanwhile,
    the batches held behind the request out go as one request when its answer
    comes (up to ``many_request_size``, 256 KiB with the default ``batch_size``),
    and an ordered ``send`` to a queue with batches unanswered goes after them.
    Messages that cannot share a batch (delay / timer, compressed body, an
    ordered one before its topic's route is known) are one request each, in turn
    with the batches.  ``send_async`` is a coroutine that returns the message's future as
    soon as the message is accepted: without suspending while fewer than
    ``max_pending_messages`` messages are unanswered, else after awaiting room
    (the thread producer blocks there), up to ``send_msg_timeout_ms``, then
    :class:`MQClientError` ("producer buffer full ...").  An ordered ``send_async``
    also lets the loop run once (``asyncio.sleep(0)``) when ``ORDERED_YIELD_MS`` have
    passed since it last did: an ordered queue's next batch goes only once the answer
    to its last one is read, and a caller's loop that never suspends would hold every
    queue's next batch until ``max_pending_messages`` is reached (the broker then
    idles while the caller fills the room, and the caller while the broker works:
    0.75x the rate, bench/results/client.md stop 56).  Unordered batches are not
    held that way (``max_in_flight`` requests out), and a yield there costs rate: in
    the same run, yielding every millisecond made their requests 4x smaller.  :meth:`Producer.flush`
    ships what is queued and awaits every answer; :meth:`Producer.close` flushes.

Sockets
    :class:`rmq.aio.remoting.AsyncRemoting`: a plain DEALER per NameServer and per broker
    address (brokers ``IMMEDIATE``, their first frame a HEART_BEAT), read from the event loop,
    answers matched by opaque; requests are written at once without blocking (parked in order,
    and written when the peer connects, while the socket cannot take them); one timer over a
    heap of response deadlines; a dropped broker connection fails its requests at once.
    Everything runs on the event loop that called :meth:`Producer.start`; the producer is not
    thread-safe.

Memory
    A pending ``send_async`` future and its callback entry's tuple (future, callback, context)
    are held by the producer and kept out of CPython's cyclic GC until the request ends: a stream
    of sends made them faster than they completed, and the collections walked every one in flight
    (1.7 µs a message of GC, a quarter of the call; bench/results/client.md stop 46).  A future
    is tracked again before its outcome is set, or, when every message of its request has a
    callback, just before its callback runs (the entries hold it until then)
    (:mod:`rmq._core.client_msg`: ``untrack_pending``, ``pending_callback``, ``track_done``): a
    done future in a cycle is collected as any other.  The context stays tracked: CPython frees
    a Context assuming it is (``pending_callback``), and a producer dropped unclosed with queued
    callbacks crashed the interpreter when it untracked them (stop 53).

Failure behaviour
    As the sync producer: retries on another broker for timeouts, unreachable
    brokers and retryable codes, then the last error's type with RocketMQ's
    "Send [N] times, still failed" description.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import time
import logging
from typing import Any, Callable, Iterable, Optional

import zmq

from rmq import security
from rmq.client import trace as _trace
from rmq.client.message import Message, MessageQueue, SendResult
from rmq.aio.remoting import AsyncRemoting
from rmq.client.send_attempts import SendAttempts
from rmq.client.message_accumulator import QueueTurns
from rmq.client.producer_request import (OPEN_KEY_TYPES, ProducerOptions, RowsPart, Selector, ShardQueues,
                                         UserBatch, apply_selector, batch_body_of, client_id, encode_columns,
                                         encode_user_batch, heartbeat_request, many_keys, many_parts,
                                         many_request_size, message_preparer, parse_send_response, prepare_many,
                                         queued_failures_error,
                                         refused_batch_limit, row_messages, select_by_hash, selector_for,
                                         send_request, split_by_size, user_batch_result)
from rmq.common.malloc_tuning import tune_malloc
from rmq.common.topic_validator import check_group
from rmq._core.client_msg import AioAppend, pending_callback as _pending_callback, set_results as _set_results, \
    run_callbacks as _c_run_callbacks, snapshot_context as _snapshot_context, \
    track_done as _track, untrack_pending as _untrack
from rmq.client.calls import adrive
from rmq.client.publish_routes import PROVISIONAL_POLL_MS, PublishRoutes, no_route_error
from rmq.client.route import MQFaultStrategy, RouteCache, TopicPublishInfo, namesrv_attempt_s, split_namesrv_addr
from rmq.client.futures import ColumnOutcomes, ManyOutcomes
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode

log = logging.getLogger("rmq.aio.producer")

_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)
_Future = asyncio.Future
_monotonic = time.monotonic

ORDERED_YIELD_MS = 1.0      # an ordered send_async lets the loop run after this long without (module docstring)
_copy_context = contextvars.copy_context


_run_callbacks = _c_run_callbacks     # in C: each callback in a copy of its snapshot, errors to the loop


class _Many:
    """One send_async_many call (``outcomes``: a ManyOutcomes) or send_async_columns call (a
    ColumnOutcomes), both shared with the thread producer, and the asyncio future that gets
    them once the last part ends."""

    __slots__ = ("outcomes", "future")

    def __init__(self, outcomes, future: asyncio.Future) -> None:
        self.outcomes = outcomes
        self.future = future

    def fill(self, *outcome) -> None:
        if self.outcomes.fill(*outcome) and not self.future.done():
            result, err = self.outcomes.outcome()
            if err is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(err)


class _Batch:
    """Messages of :meth:`Producer.send_async` that go as one request: a topic's accumulated
    batch, or one message that cannot share one.  ``futures[i]`` gets ``preps[i]``'s result."""

    __slots__ = ("topic", "preps", "futures", "callbacks", "nbytes", "created", "deadline", "attempt_timeout",
                 "queue", "selector", "arg", "finished", "queue_turn", "parts", "rows")

    def __init__(self, topic: str, now: float, deadline: float, attempt_timeout: float,
                 queue: Optional[MessageQueue] = None, selector=None, arg=None):
        self.topic = topic
        self.preps: list = []
        self.futures: list = []
        self.callbacks: Optional[list] = None    # (future, callback, context) of messages given one
        self.nbytes = 0
        self.created = now                  # loop time of its first message (linger_ms)
        self.deadline = deadline            # loop time: the delivery deadline of its first message
        self.attempt_timeout = attempt_timeout   # seconds one attempt waits for the broker
        self.queue = queue
        self.selector = selector
        self.arg = arg
        self.finished = False
        self.queue_turn = False             # holds its queue's turn (Producer._pump): ordered sends
        # send_async_many parts: [(_Many, positions, index of its first message in preps)]; their
        # messages have None in futures
        self.parts: Optional[list] = None
        # send_async_columns: (_Many, RowsPart): ``preps`` is the part (its body encoded already)
        self.rows: Optional[tuple] = None


def _mergeable(b: _Batch) -> bool:
    """Whether ``b`` (its queue chosen) may share a SEND_BATCH_MESSAGE: every message batchable."""
    return b.selector is None and not b.finished and b.rows is None and all(p.batchable for p in b.preps)


def _batch_bytes(b: _Batch) -> int:
    return b.nbytes


def _combine(first: _Batch, joined: list) -> _Batch:
    """One request of ``first`` and the batches ``joined`` behind it, in order (QueueTurns)."""
    m = _Batch(first.topic, first.created, first.deadline, first.attempt_timeout, first.queue)
    for b in (first, *joined):
        if b.parts is not None:
            base = len(m.preps)
            m.parts = (m.parts or []) + [(many, positions, base + at) for many, positions, at in b.parts]
        m.preps.extend(b.preps)
        m.futures.extend(b.futures)
        if b.callbacks is not None:
            m.callbacks = (m.callbacks or []) + b.callbacks
        m.created = min(m.created, b.created)
        m.deadline = min(m.deadline, b.deadline)
        m.attempt_timeout = min(m.attempt_timeout, b.attempt_timeout)
        m.nbytes += b.nbytes
    return m


class _BatchTooLarge(Exception):
    """A broker refused a batch of send_async's as too large to store whole; it takes at most
    ``limit`` bytes (:func:`rmq.client.producer_request.refused_batch_limit`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def _split_batch(b: _Batch, limit: int) -> list:
    """``b`` as consecutive batches of at most ``limit`` bytes each (a message over it alone), each
    completing its own messages: their futures, callbacks and send_async_many slices, or a
    send_async_columns part's rows (the thread producer's ``message_accumulator.split_pending``)."""
    if b.rows is not None:
        columns, part = b.rows
        out = []
        for sub in part.split(limit):
            m = _Batch(b.topic, b.created, b.deadline, b.attempt_timeout, b.queue, b.selector, b.arg)
            m.preps, m.rows, m.nbytes = sub, (columns, sub), sub.nbytes
            out.append(m)
        return out
    sizes = [p.size for p in b.preps]
    out = []
    for a, c in split_by_size(sizes, limit):
        m = _Batch(b.topic, b.created, b.deadline, b.attempt_timeout, b.queue, b.selector, b.arg)
        m.preps, m.futures, m.nbytes = b.preps[a:c], b.futures[a:c], sum(sizes[a:c])
        if b.callbacks is not None:
            mine = {id(f) for f in m.futures if f is not None}
            m.callbacks = [cb for cb in b.callbacks if id(cb[0]) in mine] or None
        if b.parts is not None:
            m.parts = []
            for many, positions, at in b.parts:
                lo, hi = max(a, at), min(c, at + len(positions))
                if lo < hi:
                    m.parts.append((many, positions[lo - at:hi - at], lo - a))
        out.append(m)
    return out


class Producer:
    """An asyncio producer (RocketMQ ``DefaultMQProducer`` semantics).

    Parameters
    ----------
    namesrv_addr : str
        ``"host:port"``, or several separated by ``;``.
    group : str
        Producer group.
    **options
        :class:`rmq.client.producer_request.ProducerOptions` fields (``send_msg_timeout_ms``,
        ``retry_times_when_send_failed``, ``compress_msg_body_over_howmuch``,
        ``max_message_size``, ``send_latency_fault_enable``, ...).  ``batch_size``,
        ``linger_ms``, ``max_in_flight``, ``max_pending_messages``, ``delivery_timeout_ms`` and
        ``retry_times_when_send_async_failed`` shape :meth:`send_async` as they shape
        :meth:`rmq.Producer.send_async` (``send`` calls are not held to ``max_in_flight``).

    Raises
    ------
    MQClientError
        A bad address, group or option.
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", auth=None, *,
                 enable_msg_trace: bool = False, custom_trace_topic: Optional[str] = None, **options: Any):
        self._auth = security.client_auth(auth)   # CURVE client keys (rmq.security); None: environment / plain
        # message trace, as rmq.Producer: Pub records sent by a background dispatcher
        self._trace = _trace.TraceDispatcher(namesrv_addr, group, custom_trace_topic) if enable_msg_trace else None
        try:
            check_group(group)
        except ValueError as e:
            raise MQClientError(f"producer group: {e}") from None
        try:
            self.options = ProducerOptions(**options)
        except TypeError as e:
            raise MQClientError(f"unknown producer option: {e}") from None
        o = self.options
        self.namesrv_addr = namesrv_addr
        self.namesrv_addrs = split_namesrv_addr(namesrv_addr)
        self.group = group
        self.client_id = client_id()
        self.route_cache = RouteCache()
        self._routes = PublishRoutes(self.route_cache)   # per-topic look-up state (sans I/O, shared rules)
        self.fault_strategy = MQFaultStrategy(o.send_latency_fault_enable, o.latency_max, o.not_available_duration,
                                              o.isolation_latency_ms)
        self.stats = {"requests": 0, "batch_requests": 0, "split_requests": 0, "messages": 0, "retries": 0,
                      "route_requests": 0,
                      "failed_messages": 0}
        self._preparer = message_preparer(o)
        self._prepare = self._preparer.prepare
        self._batch_size = o.batch_size             # 0: send_async sends one request per message
        self._batch_limit = 0                       # the largest batch a broker that refused one takes (bytes)
        self._max_in_flight = o.max_in_flight
        self._max_pending = o.max_pending_messages
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ctx: Optional[zmq.Context] = None
        self._remoting: Optional[AsyncRemoting] = None
        self._ns_next = 0
        self._route_locks: dict = {}        # topic -> asyncio.Lock
        self._tasks: set = set()
        self._started = False
        self._closed = False                # close() called: new sends are refused
        self._shut = False                  # close() is tearing down: nothing goes out any more
        # send_async: batches (see the module docstring)
        self._accs: dict = {}               # (topic, ordered MessageQueue or None) -> _Batch being filled
        self._shards = ShardQueues()        # sharding key -> queue, under the current route
        # ordered batches: max_in_flight_per_queue requests out per queue, the next ones held
        # (the held ones joined up to many_request_size when a turn passes, as the thread producer's)
        self._queue_turns = QueueTurns(o.max_in_flight_per_queue, many_request_size(o), _mergeable, _batch_bytes,
                                       _combine)
        self._ready: collections.deque = collections.deque()   # _Batch sealed, waiting for room
        self._reqs: set = set()             # _Batch on the wire (a task each)
        self._inflight = 0                  # len(_reqs): requests out, held to max_in_flight
        self._pending = 0                   # messages accepted and not yet answered
        self._ordered_yield_at = 0.0        # time.monotonic(): an ordered send_async yields after this
        self._low_water = max(o.max_pending_messages * 3 // 4, 1)   # waiters for room wake at or below
        self._room_waiters: list = []       # futures of send_async calls waiting for room
        self._idle_waiters: list = []       # futures of flush calls waiting for pending == 0
        self._flushing = 0
        self._linger_timer: Optional[asyncio.TimerHandle] = None
        self._record_failures = False       # set by close(): send_async failures from then on
        self._failures: list = []           # (messages, exception)
        # called on the loop with (broker address, Frame) for requests a broker sends
        # (CHECK_TRANSACTION_STATE to an rmq.aio.TransactionProducer); None: ignored
        self.request_handler = None
        # True (an rmq.aio.TransactionProducer): learn every broker of the cluster at start and at each
        # route poll, so that each master gets heartbeats (and can check back) before the first send
        self.discover_brokers = False

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> "Producer":
        """Open the NameServer sockets and start the route / heartbeat timers (idempotent)."""
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        if self._started:
            return self
        self._loop = asyncio.get_running_loop()
        appender = AioAppend(self, self._preparer, _Future, self._loop)
        self._append_c, self._add_c, self._keyed_c = appender.send, appender.add, appender.send_keyed
        tune_malloc()                               # batch requests: rmq.common.malloc_tuning
        self._ctx = zmq.Context()
        security.register_context(self._ctx, self._auth)
        ns = set(self.namesrv_addrs)
        self._remoting = AsyncRemoting(
            self._auth, self._on_broker_request, self._ctx, immediate=lambda addr: addr not in ns,
            connect_timeout_ms=self.options.connect_timeout_ms, linger_ms=100,
            on_connect=lambda addr: None if addr in ns else heartbeat_request(self.client_id, self.group))
        self._started = True
        self._spawn(self._timer_loop())
        return self

    async def close(self, timeout: Optional[float] = None) -> None:
        """Flush (ship what :meth:`send_async` has queued and await the answers, up to
        ``timeout`` seconds; None: until each message has its outcome, which its own budget
        bounds), then stop the timers, fail what is still waiting, close the sockets
        (idempotent).  :meth:`send` calls in progress end with :class:`RemotingError`.

        Raises
        ------
        MQClientError
            Messages accepted by :meth:`send_async` failed after close() began (count and
            first error in the message, the first error as ``__cause__``); every one's future
            has its exception.
        """
        await self._close(timeout, raise_failures=True)

    async def _close(self, timeout: Optional[float], raise_failures: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._record_failures = True
        try:
            if self._started and self._pending:
                await self.flush(timeout)
        finally:
            await self._teardown()
        if self._failures:
            err = queued_failures_error(self.group, sum(k for k, _ in self._failures), self._failures[0][1])
            if raise_failures:
                raise err
            log.error("%s", err)

    async def _teardown(self) -> None:
        self._shut = True
        if self._trace is not None:
            await asyncio.to_thread(self._trace.close)
        remoting = self._remoting
        if remoting is not None:
            for addr in self._broker_addrs():
                remoting.oneway(addr, Frame(RequestCode.UNREGISTER_CLIENT, fields={
                    "clientID": self.client_id, "producerGroup": self.group}))
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # send_async messages not answered: queued ones were never sent, the rest were on the wire
        closed = MQClientError(f"producer {self.group} closed before the message was sent")
        held = self._queue_turns.clear()
        for b in list(self._accs.values()) + list(self._ready) + held:
            self._fail(b, closed)
        self._accs.clear()
        self._ready.clear()
        for b in list(self._reqs):
            self._fail(b, RemotingError(f"producer {self.group} closed while waiting for a response"))
        self._reqs.clear()
        if remoting is not None:
            await remoting.close()
            self._remoting = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._wake_waiters()

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._close(None, raise_failures=exc_type is None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Messages accepted by :meth:`send_async` and not yet answered."""
        return self._pending

    def __repr__(self) -> str:
        return f"aio.Producer(group={self.group!r}, namesrv={self.namesrv_addr!r}, closed={self._closed})"

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, msg: Message, *, timeout_ms: Optional[int] = None, selector: Optional[Selector] = None,
                   arg: Any = None, sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> SendResult:
        """Send and await the broker's answer; same parameters, result and errors as
        :meth:`rmq.Producer.send`."""
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = self._prepare(msg)
        if (sel is not None or queue is not None) and self._started and (self._queue_turns or self._accs):
            behind = self._behind_ordered(prep, timeout_ms, sel, arg, queue)
            if behind is not None:
                return await behind          # traced by the batch's completion, as send_async's
        t0 = time.monotonic()
        results = await self._send([prep], False, timeout_ms, sel, arg, queue, oneway=False)
        if self._trace is not None:
            self._trace.append_pub(prep.msg, results[0], int((time.monotonic() - t0) * 1000), self.client_id,
                                   sel is not None)
        return results[0]

    async def send_batch(self, msgs: Iterable[Message], *, timeout_ms: Optional[int] = None,
                         queue: Optional[MessageQueue] = None) -> SendResult:
        """One SEND_BATCH_MESSAGE of messages of one topic; as :meth:`rmq.Producer.send_batch`."""
        batch = encode_user_batch(msgs, self.options)    # the body and ids in one pass, as the thread producer's
        t0 = time.monotonic()
        result = await self._send(batch, True, timeout_ms, None, None, queue, oneway=False)
        if self._trace is not None:
            self._trace.append_pub_batch(batch.msgs, result, int((time.monotonic() - t0) * 1000), self.client_id)
        return result

    async def send_oneway(self, msg: Message, *, selector: Optional[Selector] = None, arg: Any = None,
                          sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> None:
        """Send without waiting for an answer (returns once the request is queued on a connected socket)."""
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = self._prepare(msg)
        await self._send([prep], False, None, sel, arg, queue, oneway=True)

    async def send_async(self, msg: Message, callback: Optional[Callable[[asyncio.Future], Any]] = None, *,
                         timeout_ms: Optional[int] = None, selector: Optional[Selector] = None, arg: Any = None,
                         sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> asyncio.Future:
        """Accept ``msg`` for sending; returns an :class:`asyncio.Future` that gets its
        :class:`SendResult` or exception (:meth:`rmq.Producer.send_async` on the event loop).

        ::

            fut = await p.send_async(Message("orders", b"x"), callback=lambda f: ...)
            result = await fut              # or not: flush() / close() await every answer

        The message joins its topic's batch (module docstring): it leaves at once while fewer
        than ``max_in_flight`` requests are out, else with the messages queued meanwhile, as one
        SEND_BATCH_MESSAGE of up to ``batch_size`` bytes; each future gets its own message's
        result (its ``msg_id``, queue and offset).  ``callback(future)`` runs on the loop once
        the future is done, as a done-callback would (scheduled with ``call_soon``, in the
        context of the call, an exception going to the loop's exception handler); the callbacks
        of one request's messages are scheduled together, in order, not one ``call_soon``
        each (a cancelled future's callback runs when its request ends).  A failed attempt is
        retried on another broker up to ``retry_times_when_send_async_failed`` times;
        ``timeout_ms`` (default ``send_msg_timeout_ms``) bounds each attempt's wait for the
        broker and ``delivery_timeout_ms`` the whole.  Selector / sharding key / queue as in
        :meth:`send` (such a message is a request of its own, never retried elsewhere).

        Back-pressure: the call returns without suspending while fewer than
        ``max_pending_messages`` messages are unanswered; at the limit it awaits room (until
        3/4 of the limit), at most ``send_msg_timeout_ms``.  An ordered call (selector, sharding
        key, queue) also suspends once when ``ORDERED_YIELD_MS`` (1 ms) have passed since one
        last did, so that its queues' answers are read (module docstring).

        Raises
        ------
        MQClientError
            Invalid message (nothing queued), producer closed, or still no room after
            ``send_msg_timeout_ms`` ("producer buffer full ...").
        """
        if self._closed or not self._started:
            await self._ensure_started()
        if selector is not None or sharding_key is not None or queue is not None or timeout_ms is not None:
            if type(sharding_key) in OPEN_KEY_TYPES and selector is None and queue is None and timeout_ms is None:
                fut = self._keyed_c(msg, callback, sharding_key)   # its queue known and open: in C (AioAppend)
                if type(fut) is not _Future:
                    if self._pending >= self._max_pending and self._pending > 0:
                        await self._wait_for_room(1)
                    fut = self._send_async_with(fut, callback, None, select_by_hash, sharding_key, None)
            else:
                if selector is not None or sharding_key is not None:
                    selector, arg = selector_for(selector, arg, sharding_key, msg)
                prep = self._prepare(msg)
                if self._pending >= self._max_pending and self._pending > 0:
                    self._check_with(prep, timeout_ms, queue)      # nothing waits for room that is refused anyway
                    await self._wait_for_room(1)
                fut = self._send_async_with(prep, callback, timeout_ms, selector, arg, queue)
            if selector is not None or sharding_key is not None or queue is not None:
                now = _monotonic()
                if now >= self._ordered_yield_at:          # an ordered send: the loop reads answers now and then
                    self._ordered_yield_at = now + ORDERED_YIELD_MS / 1000.0
                    await asyncio.sleep(0)
            return fut
        prep = self._append_c(msg, callback)      # the common case in C (AioAppend): its future
        if type(prep) is _Future:
            if self._inflight < self._max_in_flight:
                self._pump((msg.topic, None))
            return prep
        if self._pending >= self._max_pending and self._pending > 0:
            await self._wait_for_room(1)
        fut = _Future(loop=self._loop)
        _untrack(fut)                   # out of the cyclic GC until done (module docstring, "Memory")
        self._pending += 1
        if prep.batchable and self._batch_size:
            self._append(prep, fut, callback, None)
        else:
            self._alone(prep, fut, callback, None, None, None, None)
        if self._inflight < self._max_in_flight:
            self._pump((prep.msg.topic, None))
        return fut

    def _request_size(self, columns: bool = False) -> int:
        """Bytes of one send_async_many / send_async_columns request (:func:`many_request_size`)."""
        return many_request_size(self.options, columns, self._batch_limit)

    async def send_async_many(self, msgs: Iterable[Message],
                              callback: Optional[Callable[[asyncio.Future], Any]] = None, *,
                              sharding_key: Any = None, sharding_keys: Optional[Iterable] = None,
                              timeout_ms: Optional[int] = None) -> asyncio.Future:
        """Accept many messages in one call, with one :class:`asyncio.Future` for all of them
        (:meth:`rmq.Producer.send_async_many` on the event loop): its result is the list of their
        :class:`SendResult` objects in the order given; when any failed, its exception is a
        :class:`rmq.errors.SendManyError` holding each message's result or exception.

        ::

            results = await (await p.send_async_many([Message("orders", b) for b in bodies]))

        The messages go in batches of up to ``MANY_REQUEST_SIZE`` bytes, or ``batch_size`` when
        given (as the thread producer's: :func:`rmq.client.producer_request.many_request_size`), pipelined, with no future or
        callback per message; ``callback(future)`` runs on the loop once, when all are done.
        ``sharding_key`` orders every message on its key's queue, ``sharding_keys`` gives one key
        per message (None: unordered); ordered messages need the topic's route (looked up first).

        Raises
        ------
        MQClientError
            A message is invalid (naming its position; nothing is queued), the keys do not match
            the messages, an ordered topic has no route, the producer is closed, or no room in
            the pending buffer came within ``send_msg_timeout_ms`` for the first batch (for a
            later one its messages fail in the future's ``SendManyError`` instead).
        """
        if self._closed or not self._started:
            await self._ensure_started()
        msgs = msgs if type(msgs) is list else list(msgs)
        n = len(msgs)
        keys = many_keys(n, sharding_key, sharding_keys)
        if timeout_ms is not None and timeout_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {timeout_ms}")
        preps = prepare_many(self._preparer, msgs, keys)
        fut = _Future(loop=self._loop)
        if callback is not None:
            fut.add_done_callback(callback, context=_copy_context())
        many = _Many(ManyOutcomes(n), fut)
        if n == 0:
            fut.set_result([])
            return fut
        await self._hand_over_many(many, many_parts(preps, keys, self._request_size()), timeout_ms)
        return fut

    async def send_async_columns(self, topic: str, bodies, callback: Optional[Callable[[asyncio.Future], Any]] = None,
                                 *, tags=None, keys=None, properties=None, sharding_key: Any = None,
                                 sharding_keys: Optional[Iterable] = None,
                                 timeout_ms: Optional[int] = None) -> asyncio.Future:
        """Accept rows given as columns, all of one topic, with one :class:`asyncio.Future` for all
        of them (:meth:`rmq.Producer.send_async_columns` on the event loop: the same columns,
        rules and errors).  Its result is a :class:`rmq.client.message.ColumnSendResults`; when
        any row failed, its exception is a :class:`rmq.errors.SendManyError` holding it.

        ::

            results = await (await p.send_async_columns("orders", bodies, tags=tags))

        Raises
        ------
        MQClientError
            A column without one item per body, a bad topic or row (naming its position;
            nothing is queued), an ordered topic with no route, the producer is closed, or no
            room in the pending buffer came within ``send_msg_timeout_ms`` for the first request.
        """
        if self._closed or not self._started:
            await self._ensure_started()
        if timeout_ms is not None and timeout_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {timeout_ms}")
        n, parts = encode_columns(self._preparer, topic, bodies, tags, keys, properties, sharding_key, sharding_keys,
                                  self._request_size(columns=True))
        fut = _Future(loop=self._loop)
        if self._trace is not None and n:
            fut.add_done_callback(self._traced_rows(row_messages(topic, list(bodies), tags, keys)),
                                  context=_copy_context())
        if callback is not None:
            fut.add_done_callback(callback, context=_copy_context())
        if n == 0:
            fut.set_result(ColumnOutcomes(0).outcome()[0])
            return fut
        columns = _Many(ColumnOutcomes(n), fut)
        await self._hand_over_many(columns, parts, timeout_ms)
        return fut

    def _traced_rows(self, msgs: list):
        """A Pub record per stored row of a send_async_columns call (``msgs``: its
        :func:`rmq.client.producer.row_messages`)."""
        t0 = self._loop.time()

        def done(f: asyncio.Future) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            results = f.result() if exc is None else getattr(exc, "results", [])
            cost = int((self._loop.time() - t0) * 1000)
            for m, r in zip(msgs, results):
                if isinstance(r, SendResult):
                    self._trace.append_pub(m, r, cost, self.client_id, False)
        return done

    async def _hand_over_many(self, many: Any, parts: list, timeout_ms: Optional[int]) -> None:
        """Queue the parts of a send_async_many call (``[positions, preps, key, nbytes]``, filling
        ``many``: a _Many of ManyOutcomes) or of a send_async_columns call (:class:`RowsPart`, a _Many
        of ColumnOutcomes),
        each once it fits under ``max_pending_messages``."""
        rows = type(parts[0]) is RowsPart
        queues = {}                       # ordered parts: their queue, from the route (nothing queued if none)
        for part in parts:
            key = part.key if rows else part[2]
            if key is not None:
                topic = part.topic if rows else part[1][0].msg.topic
                info = await self._publish_info(topic, self._loop.time() + self._delivery_s(timeout_ms))
                queues[id(part)] = apply_selector(select_by_hash, info, None if rows else part[1][0].msg, key)
        for k, entry in enumerate(parts):
            if rows:
                part, key, nbytes, topic, positions = entry, entry.key, entry.nbytes, entry.topic, entry.positions
            else:
                positions, part, key, nbytes = entry
                topic = part[0].msg.topic
            m = len(part)
            if self._pending + m > self._max_pending and self._pending > 0:
                try:
                    await self._wait_for_room(m)
                except MQClientError as e:
                    if k == 0:
                        raise
                    for rest in parts[k:]:
                        if rows:
                            many.fill(rest.positions, rest.uniq, None, e)
                        else:
                            many.fill(rest[0], None, e)
                    return
            self._pending += m
            queue = queues.get(id(entry)) if key is not None else None
            if queue is not None:         # after what send_async queued for that queue
                open_ = self._accs.pop((topic, queue), None)
                if open_ is not None:
                    self._ready.append(open_)
            now = self._loop.time()
            b = _Batch(topic, now, now + self._delivery_s(timeout_ms),
                       (self.options.send_msg_timeout_ms if timeout_ms is None else timeout_ms) / 1000.0, queue)
            b.preps = part
            b.nbytes = nbytes
            if rows:
                b.rows = (many, part)
            else:
                b.futures = [None] * m
                b.parts = [(many, positions, 0)]
            self._ready.append(b)
            if self._inflight < self._max_in_flight:
                self._pump()

    def _append(self, prep, fut: asyncio.Future, callback, timeout_ms: Optional[int],
                queue: Optional[MessageQueue] = None) -> None:
        """Add a batchable message to its topic's open batch, or its ordered queue's (opened if
        there is none or it would pass ``batch_size``); a full batch is sealed and waits its turn."""
        topic = prep.msg.topic
        key = (topic, queue)
        size = prep.size
        b = self._accs.get(key)
        if b is None or b.nbytes + size > self._batch_size:
            b = self._open_batch(key, b, timeout_ms)
        elif timeout_ms is not None:              # the batch's attempts wait the shortest timeout
            b.attempt_timeout = min(b.attempt_timeout, timeout_ms / 1000.0)
            b.deadline = min(b.deadline, self._loop.time() + self._delivery_s(timeout_ms))
        b.preps.append(prep)
        b.futures.append(fut)
        if callback is not None:
            if b.callbacks is None:
                b.callbacks = []
            b.callbacks.append(_pending_callback(fut, callback, _snapshot_context()))
        b.nbytes += size
        if b.nbytes >= self._batch_size:
            del self._accs[key]
            self._ready.append(b)

    @staticmethod
    def _check_with(prep, timeout_ms: Optional[int], queue: Optional[MessageQueue]) -> None:
        """send_async's ``queue`` / ``timeout_ms`` checks (MQClientError)."""
        topic = prep.msg.topic
        if queue is not None and (not isinstance(queue, MessageQueue) or queue.topic != topic):
            raise MQClientError(f"queue must be a MessageQueue of topic {topic}, got {queue!r}")
        if timeout_ms is not None and timeout_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {timeout_ms}")

    def _send_async_with(self, prep, callback, timeout_ms: Optional[int], selector, arg,
                         queue: Optional[MessageQueue]) -> asyncio.Future:
        """send_async of a prepared message with a selector (sharding key), queue or timeout, room
        made: not a coroutine (one frame less per message)."""
        self._check_with(prep, timeout_ms, queue)
        topic = prep.msg.topic
        if selector is not None:
            info = self.route_cache.publish_info(topic)
            if info is not None and info.ok:           # the queue now: it joins that queue's batch
                try:
                    queue = self._shards.select(info, prep.msg, arg) if selector is select_by_hash \
                        else apply_selector(selector, info, prep.msg, arg)
                    selector = None
                except MQClientError:
                    pass                               # a request of its own: its future gets the error
        if selector is None and timeout_ms is None:
            fut = self._add_c(prep, callback, queue)  # its queue's open batch with room, in C (AioAppend)
            if fut is not None:
                if self._inflight < self._max_in_flight:
                    self._pump((topic, queue))
                return fut
        fut = _Future(loop=self._loop)
        _untrack(fut)
        self._pending += 1
        if selector is None and prep.batchable and self._batch_size:
            self._append(prep, fut, callback, timeout_ms, queue)
        else:
            self._alone(prep, fut, callback, timeout_ms, queue, selector, arg)
        if self._inflight < self._max_in_flight:
            self._pump((topic, queue))
        return fut

    def _delivery_s(self, timeout_ms: Optional[int]) -> float:
        """A send_async message's whole budget: ``delivery_timeout_ms``, at least its attempt's."""
        o = self.options
        return max(o.delivery_timeout_ms, o.send_msg_timeout_ms if timeout_ms is None else timeout_ms) / 1000.0

    def _open_batch(self, key: tuple, full: Optional[_Batch], timeout_ms: Optional[int]) -> _Batch:
        """A new open batch for ``key`` (topic, ordered queue or None); ``full``, the one that has
        no room left, is sealed."""
        if full is not None:
            self._ready.append(full)
        now = self._loop.time()
        b = self._accs[key] = _Batch(key[0], now, now + self._delivery_s(timeout_ms),
                                     (self.options.send_msg_timeout_ms if timeout_ms is None else timeout_ms)
                                     / 1000.0, key[1])
        return b

    def _behind_ordered(self, prep, timeout_ms: Optional[int], selector, arg,
                        queue: Optional[MessageQueue]) -> Optional[asyncio.Future]:
        """An ordered :meth:`send` to a queue with send_async batches queued or unanswered: a
        request of its own after them, in its queue's turn (its future), else None (send it now)."""
        info = self.route_cache.publish_info(prep.msg.topic)
        if info is None or not info.ok:
            return None
        if queue is None:
            queue = apply_selector(selector, info, prep.msg, arg)
        elif not isinstance(queue, MessageQueue) or queue.topic != prep.msg.topic:
            return None                     # _send raises the error
        if not self._queue_turns.busy(queue) and (prep.msg.topic, queue) not in self._accs:
            return None
        budget_ms = timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms
        if budget_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {budget_ms}")
        fut = _Future(loop=self._loop)
        self._pending += 1
        self._alone(prep, fut, None, timeout_ms, queue, None, None, budget_ms / 1000.0)
        self._pump()
        return fut

    def _alone(self, prep, fut: asyncio.Future, callback, timeout_ms: Optional[int], queue, selector, arg,
               budget_s: Optional[float] = None) -> None:
        """A message that cannot share a batch: a request of its own, after what its topic (or its
        ordered queue) has queued.  ``budget_s``: its whole budget (default: send_async's)."""
        topic = prep.msg.topic
        b = self._accs.pop((topic, queue), None)
        if b is not None:
            self._ready.append(b)
        now = self._loop.time()
        b = _Batch(topic, now, now + (self._delivery_s(timeout_ms) if budget_s is None else budget_s),
                   (self.options.send_msg_timeout_ms if timeout_ms is None else timeout_ms) / 1000.0,
                   queue, selector, arg)
        b.preps.append(prep)
        b.futures.append(fut)
        b.nbytes = prep.size
        if callback is not None:
            b.callbacks = [_pending_callback(fut, callback, _snapshot_context())]
        self._ready.append(b)

    async def flush(self, timeout: Optional[float] = None) -> int:
        """Ship every queued :meth:`send_async` batch (as fast as ``max_in_flight`` allows) and
        await until every message accepted so far has its outcome.

        Parameters
        ----------
        timeout : float, optional
            Seconds; None waits until done (each message has its own budget, so this ends).

        Returns
        -------
        int
            Messages still unanswered (0 when everything completed).
        """
        if not self._started or self._pending == 0:
            return self._pending
        accs = self._accs
        if accs:
            self._ready.extend(accs.values())
            accs.clear()
        self._pump()
        fut = self._loop.create_future()
        self._idle_waiters.append(fut)
        self._flushing += 1
        try:
            if timeout is None:
                await fut
            else:
                await asyncio.wait((fut,), timeout=timeout)
        finally:
            self._flushing -= 1
            if not fut.done():
                fut.cancel()
            try:
                self._idle_waiters.remove(fut)
            except ValueError:
                pass
        return self._pending

    async def fetch_publish_message_queues(self, topic: str) -> list:
        """Writable queues of ``topic`` read from the NameServer.

        Raises
        ------
        MQClientError
            Unknown topic (TOPIC_NOT_EXIST) or NameServer unreachable.
        """
        await self._ensure_started()
        deadline = self._loop_time() + self.options.send_msg_timeout_ms / 1000.0
        route = await self._fetch_route(topic, deadline)
        if route is None:
            raise no_route_error(topic)
        return list(self.route_cache.publish_info(topic).message_queue_list)

    async def _send(self, preps, batch: bool, timeout_ms: Optional[int], selector, arg,
                    queue: Optional[MessageQueue], oneway: bool):
        """RocketMQ ``sendDefaultImpl`` / ``sendSelectImpl``: attempts within the time budget.
        ``preps``: PreparedMessages (one result each), or a user batch's :class:`UserBatch` (its
        one SendResult)."""
        if self._closed or not self._started:
            await self._ensure_started()
        user_batch = type(preps) is UserBatch
        topic = preps.topic if user_batch else preps[0].msg.topic
        if queue is not None and (not isinstance(queue, MessageQueue) or queue.topic != topic):
            raise MQClientError(f"queue must be a MessageQueue of topic {topic}, got {queue!r}")
        budget_ms = timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms
        if budget_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {budget_ms}")
        begin = self._loop.time()
        deadline = begin + budget_ms / 1000.0
        info = self.route_cache.publish_info(topic)
        if info is None or not info.ok:
            info = await self._publish_info(topic, deadline)
        fixed = queue
        if fixed is None and selector is not None:
            fixed = apply_selector(selector, info, preps[0].msg, arg)
        max_attempts = 1 if (fixed is not None or oneway) else 1 + self.options.retry_times_when_send_failed
        body = (preps.body if user_batch else batch_body_of(preps)) if batch else None
        return await self._attempts(preps, batch, body, topic, info, fixed, max_attempts, begin, deadline, None,
                                    oneway)

    async def _attempts(self, preps: list, batch: bool, body: Optional[bytes], topic: str, info: TopicPublishInfo,
                        fixed: Optional[MessageQueue], max_attempts: int, begin: float, deadline: float,
                        attempt_timeout: Optional[float], oneway: bool, splittable: bool = False) -> list:
        """The attempts of one request (shared by :meth:`send` and :meth:`send_async`'s batches),
        under :class:`rmq.client.send_attempts.SendAttempts`' rules; each attempt waits at most
        ``attempt_timeout`` seconds (None: what is left until ``deadline``).  ``splittable`` (a
        batch this producer made): a refusal as over the broker's maxMessageSize raises
        :class:`_BatchTooLarge` instead of failing it."""
        loop_time = self._loop.time
        att = SendAttempts(topic, len(preps), fixed, max_attempts, begin, deadline)
        while True:
            now = loop_time()
            try:
                mq, addr = att.target(now, self.route_cache, self.fault_strategy)
            except MQClientError as e:        # out of time before sending, or no queue / broker
                raise att.give_up(e, now, self.options) from None
            if att.attempt > 1:
                self.stats["retries"] += 1
            frame = send_request(preps, mq.queue_id, self.group, batch, oneway, body,
                                 self.options.default_topic_queue_nums)
            wait = deadline - now if attempt_timeout is None else min(attempt_timeout, deadline - now)
            try:
                resp = await self._invoke(addr, frame, wait, oneway, mq.broker_name)
                if oneway:
                    self.stats["messages"] += len(preps)
                    return []
                if splittable and batch and resp.code == ResponseCode.MESSAGE_ILLEGAL:
                    limit = refused_batch_limit(resp, len(body) if body is not None else preps.nbytes, len(preps))
                    if limit:
                        raise _BatchTooLarge(limit)
                # a RowsPart: one record; a UserBatch: its one SendResult
                results = user_batch_result(resp, topic, mq.broker_name, addr, preps) if type(preps) is UserBatch \
                    else parse_send_response(resp, topic, mq.broker_name, addr, preps)
            except (MQBrokerError, RemotingError) as e:
                self._refresh_suspect(topic, e)
                final = att.failed(e, loop_time(), self.fault_strategy, self.options)
                if final is None:
                    continue                      # retried, another broker preferred
                if final is e:
                    raise
                raise final
            att.answered(loop_time(), self.fault_strategy)
            self.stats["messages"] += len(preps)
            if self._routes.refresh_after_send(info, loop_time()):
                self._spawn(self._refresh(topic))
            return results

    # -- send_async's batches --------------------------------------------------------------------
    def _pump(self, changed: Optional[tuple] = None) -> None:
        """Put queued batches on the wire while fewer than ``max_in_flight`` requests are out:
        sealed ones first, then the open ones (at once with ``linger_ms`` 0).  ``changed``: the
        key (topic, queue) of the one open batch a send_async just added to; with ``linger_ms``
        0 only that one is looked at, as every other was when it last changed or when the
        request it waited for ended (which pumps them all): 8 ordered queues cost one look per
        message, not eight."""
        if self._shut:
            return
        limit = self._max_in_flight
        ready = self._ready
        while ready and self._inflight < limit:
            self._start(ready.popleft())
        if self._inflight >= limit or not self._accs:
            return
        linger = self.options.linger_ms / 1000.0
        accs = self._accs
        turns = self._queue_turns
        if linger <= 0 or self._flushing:
            if changed is None or self._flushing:
                items = list(accs.items())
            else:
                b = accs.get(changed)
                items = [(changed, b)] if b is not None else ()
            for key, b in items:
                if self._inflight >= limit:
                    return
                if key[1] is None or not turns.busy(key[1]) or self._flushing:
                    del accs[key]         # an ordered queue's batch fills while its queue has a request out
                    self._start(b)
            return
        now = self._loop.time()
        first = None
        for key, b in list(accs.items()):
            if self._inflight >= limit:
                return
            if key[1] is not None and turns.busy(key[1]):
                continue                  # filling until its queue's request is answered
            if now >= b.created + linger:
                del accs[key]
                self._start(b)
            elif first is None or b.created < first:
                first = b.created
        if first is not None and self._linger_timer is None:
            self._linger_timer = self._loop.call_at(first + linger, self._linger_due)

    def _linger_due(self) -> None:
        self._linger_timer = None
        self._pump()

    def _start(self, b: _Batch) -> None:
        q = b.queue
        if q is not None and not b.queue_turn and not self._queue_turns.take(q, b):
            return                        # its queue has its requests out: wait behind them
        self._inflight += 1
        self._reqs.add(b)
        self._spawn(self._run(b))

    def _end_turn(self, b: _Batch) -> None:
        """``b`` (an ordered batch) has its outcome: the next batch held for its queue goes next."""
        nxt = self._queue_turns.end(b.queue, b)
        if nxt is not None:
            self._ready.appendleft(nxt)

    async def _run(self, b: _Batch) -> None:
        """One request of send_async messages, through its attempts; each future its own outcome."""
        try:
            preps = b.preps
            topic = b.topic
            info = self.route_cache.publish_info(topic)
            if info is None or not info.ok:
                info = await self._publish_info(topic, b.deadline)
            fixed = b.queue
            if fixed is None and b.selector is not None:
                fixed = apply_selector(b.selector, info, None if b.rows is not None else preps[0].msg, b.arg)
            max_attempts = 1 if fixed is not None else 1 + self.options.retry_times_when_send_async_failed
            batch = b.rows is not None or len(preps) > 1
            body = None if b.rows is not None or not batch else batch_body_of(preps)
            try:
                results = await self._attempts(preps, batch, body, topic, info, fixed, max_attempts, b.created,
                                               b.deadline, b.attempt_timeout, False, True)
            except _BatchTooLarge as e:
                await self._run_split(b, e.limit, info, fixed, max_attempts)
                return
        except asyncio.CancelledError:
            self._fail(b, RemotingError(f"producer {self.group} closed while waiting for a response"))
            raise
        except Exception as e:  # noqa: BLE001 - the messages' outcome
            self._fail(b, e)
        else:
            self._complete(b, results)
        finally:
            self._inflight -= 1
            self._reqs.discard(b)
            if b.queue_turn:
                self._end_turn(b)
            self._pump()

    async def _run_split(self, b: _Batch, limit: int, info: TopicPublishInfo, fixed: Optional[MessageQueue],
                         max_attempts: int) -> None:
        """The broker refused ``b`` as too large to store whole, taking at most ``limit`` bytes: its
        messages go again as batches that fit, one after the other (an ordered batch's queue turn
        is held until the last; a part refused again is split again), each with its own outcome
        (Kafka's split of a batch refused as MESSAGE_TOO_LARGE).  Later batches of this producer
        are made to fit."""
        parts = _split_batch(b, limit)
        b.finished = True                 # its messages' outcomes come from the parts
        self.stats["split_requests"] += 1
        if not self._batch_limit or limit < self._batch_limit:
            self._batch_limit = limit
            log.warning("a broker refused a batch as too large (it takes at most %d): sending it in %d parts; "
                        "batches of this producer are now at most %d bytes", limit, len(parts), limit)
            if self._batch_size:
                self._batch_size = min(self._batch_size, limit)
            self._queue_turns.cap = min(self._queue_turns.cap, limit)
        for part in parts:
            try:
                body = None if part.rows is not None or len(part.preps) < 2 else batch_body_of(part.preps)
                try:
                    results = await self._attempts(part.preps, part.rows is not None or len(part.preps) > 1, body,
                                                   b.topic, info, fixed, max_attempts, b.created, b.deadline,
                                                   b.attempt_timeout, False, True)
                except _BatchTooLarge as e:   # a part that still does not fit (its messages larger than most)
                    await self._run_split(part, e.limit, info, fixed, max_attempts)
                    continue
            except asyncio.CancelledError:
                for rest in parts[parts.index(part):]:
                    self._fail(rest, RemotingError(f"producer {self.group} closed while waiting for a response"))
                raise
            except Exception as e:  # noqa: BLE001 - the part's outcome
                self._fail(part, e)
            else:
                self._complete(part, results)

    def _complete(self, b: _Batch, results: list) -> None:
        if b.finished:
            return
        b.finished = True
        if b.rows is not None:
            columns, part = b.rows
            columns.fill(part.positions, part.uniq, results, None)
            self._done(part.n)
            return
        # every future with its callback entry: each is tracked by the GC again as its callback
        # runs (_run_callbacks, held by the entries until then), else now, before its outcome
        later = b.callbacks is not None and len(b.callbacks) == len(b.futures)
        _set_results(b.futures, results, not later)   # send_async_many's messages: their parts below
        if b.parts is not None:
            for many, positions, at in b.parts:
                many.fill(positions, results[at:at + len(positions)], None)
        if b.callbacks is not None:
            self._loop.call_soon(_run_callbacks, self._loop, b.callbacks)
        if self._trace is not None:
            cost = int((self._loop.time() - b.created) * 1000)
            ordered = b.selector is not None or b.queue is not None
            for p, r in zip(b.preps, results):
                self._trace.append_pub(p.msg, r, cost, self.client_id, ordered)
        self._done(len(b.futures))

    def _fail(self, b: _Batch, exc: BaseException) -> None:
        if b.finished:
            return
        b.finished = True
        n = len(b.futures)
        if b.rows is not None:
            columns, part = b.rows
            columns.fill(part.positions, part.uniq, None, exc)
            n = part.n
        for f in b.futures:
            if f is not None:
                _track(f)
                if not f.done():
                    f.set_exception(exc)
        if b.parts is not None:
            for many, positions, _ in b.parts:
                many.fill(positions, None, exc)
        if b.callbacks is not None:
            self._loop.call_soon(_run_callbacks, self._loop, b.callbacks)
        self.stats["failed_messages"] += n
        if self._record_failures:
            self._failures.append((n, exc))
        self._done(n)

    def _done(self, n: int) -> None:
        self._pending -= n
        if self._room_waiters and self._pending <= self._low_water:
            waiters, self._room_waiters = self._room_waiters, []
            for f in waiters:
                if not f.done():
                    f.set_result(None)
        if self._idle_waiters and self._pending == 0:
            for f in self._idle_waiters:
                if not f.done():
                    f.set_result(None)

    def _wake_waiters(self) -> None:
        for f in self._room_waiters + self._idle_waiters:
            if not f.done():
                f.set_result(None)
        self._room_waiters = []

    async def _wait_for_room(self, n: int) -> None:
        """Await until ``n`` more messages fit under ``max_pending_messages`` (woken at 3/4 of it).

        Raises
        ------
        MQClientError
            Still no room after ``send_msg_timeout_ms``, or the producer closed meanwhile.
        """
        limit = self.options.max_pending_messages
        budget_ms = self.options.send_msg_timeout_ms
        end = self._loop.time() + budget_ms / 1000.0
        while self._pending + n > limit and self._pending > 0:
            left = end - self._loop.time()
            if left <= 0:
                raise MQClientError(f"producer buffer full: {self._pending} messages unanswered "
                                    f"(max_pending_messages={limit}) for {budget_ms} ms")
            fut = self._loop.create_future()
            self._room_waiters.append(fut)
            try:
                await asyncio.wait((fut,), timeout=left)
            finally:
                if not fut.done():
                    fut.cancel()
            if self._closed:
                raise MQClientError(f"producer {self.group} is closed")

    # -- wire ------------------------------------------------------------------------------------
    async def _invoke(self, addr: str, frame: Frame, timeout_s: float, oneway: bool = False,
                      what: str = "") -> Optional[Frame]:
        """Send ``frame`` to ``addr`` and await the response (None for ``oneway``), counted in
        ``stats``.

        Raises
        ------
        MQClientError
            The producer is closed, or ``frame`` cannot be encoded (MESSAGE_ILLEGAL).
        RemotingError
            Not connected within ``connect_timeout_ms``, or the connection dropped.
        RemotingTimeoutError
            No response within ``timeout_s``.
        """
        if self._shut or self._remoting is None:
            raise MQClientError(f"producer {self.group} is closed")
        self.stats["requests"] += 1
        if frame.code == _SEND_BATCH:
            self.stats["batch_requests"] += 1
        try:
            return await self._remoting.invoke(addr, frame, timeout_s * 1000.0, oneway=oneway, what=what)
        except ProtocolError as e:
            raise MQClientError(f"cannot encode the request: {e.remark}", int(ResponseCode.MESSAGE_ILLEGAL)) from None

    def _on_broker_request(self, frame: Frame, addr: str) -> None:
        """A broker's own request (CHECK_TRANSACTION_STATE) goes to ``request_handler``."""
        if self.request_handler is not None:
            self.request_handler(addr, frame)

    def _broker_addrs(self) -> list:
        """The broker addresses connected so far."""
        ns = set(self.namesrv_addrs)
        return [a for a in (self._remoting.addrs() if self._remoting is not None else ()) if a not in ns]

    def _heartbeat(self, addr: str) -> None:
        """HEART_BEAT to ``addr`` now, or once it can take it (given up after ``send_msg_timeout_ms``);
        a new connection's first frame is one anyway."""
        if self._remoting is not None and not self._shut:
            self._remoting.post(addr, heartbeat_request(self.client_id, self.group),
                                self.options.send_msg_timeout_ms / 1000.0)

    async def _timer_loop(self) -> None:
        interval = self.options.poll_name_server_interval_ms / 1000.0
        hb_interval = self.options.heartbeat_broker_interval_ms / 1000.0
        loop = asyncio.get_running_loop()
        next_refresh, next_hb = loop.time() + interval, loop.time() + hb_interval
        if self.discover_brokers:
            await self._discover()
            next_hb = loop.time()
        while True:
            await asyncio.sleep(max(0.0, min(next_refresh, next_hb, loop.time() + PROVISIONAL_POLL_MS / 1000.0)
                                    - loop.time()))
            now = loop.time()
            for topic in self._routes.provisional_due(now):
                self._spawn(self._refresh(topic))
            if now >= next_refresh:
                next_refresh = now + interval
                for topic in self.route_cache.topics():
                    self._spawn(self._refresh(topic))
                if self.discover_brokers:
                    self._spawn(self._discover())
            if now >= next_hb:
                next_hb = now + hb_interval
                # sendHeartbeatToAllBroker: every master, connected or not
                known = self._broker_addrs()
                for addr in known:
                    self._heartbeat(addr)
                for addr in set(self.route_cache.master_addrs()).difference(known):
                    self._remoting.connect(addr)        # its first frame is a heartbeat

    def _spawn(self, coro) -> None:
        if self._shut:
            coro.close()
            return
        t = self._loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)

    def _task_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("background task failed: %s", t.exception())

    async def _ensure_started(self) -> None:
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        if not self._started:
            await self.start()

    def _loop_time(self) -> float:
        return self._loop.time()

    # -- routes ------------------------------------------------------------------------------------
    async def _ns_invoke(self, frame_factory, deadline: float) -> Frame:
        """A NameServer request, the one that answered last first, failing over to the next on
        errors and timeouts (each waited for :func:`rmq.client.route.namesrv_attempt_s`
        of what is left until ``deadline``)."""
        last: Optional[BaseException] = None
        n = len(self.namesrv_addrs)
        for i in range(n):
            idx = (self._ns_next + i) % n
            left = deadline - self._loop_time()
            if left <= 0:
                break
            self.stats["route_requests"] += 1
            try:
                resp = await self._invoke(self.namesrv_addrs[idx], frame_factory(), namesrv_attempt_s(left, n - i),
                                          what="NameServer")
                self._ns_next = idx
                return resp
            except RemotingError as e:
                last = e
        raise last or RemotingTimeoutError("NameServer request timed out")

    async def _ns_call(self, call, deadline: float):
        """Run a NameServer call of :mod:`rmq.client.publish_routes` to its end before ``deadline``."""
        return await adrive(call, lambda _addr, frame, _timeout: self._ns_invoke(lambda: frame, deadline))

    async def _fetch_route(self, topic: str, deadline: float):
        """Ask the NameServer; cache and return the route (None: TOPIC_NOT_EXIST)."""
        routes = self._routes
        routes.started(topic, self._loop_time())
        try:
            return await self._ns_call(routes.route_call(topic), deadline)
        finally:
            routes.ended(topic)

    async def _discover(self) -> None:
        """The cluster's brokers from the NameServer into the route table (their masters get heartbeats)."""
        try:
            await self._ns_call(self._routes.brokers_call(), self._loop_time() + self.options.send_msg_timeout_ms / 1000.0)
        except MQClientError as e:
            log.debug("cluster info refresh failed: %s", e)

    def _refresh_suspect(self, topic: str, exc: BaseException) -> None:
        """A send failed: refetch the route in the background when the failure puts it in doubt
        (:meth:`rmq.client.publish_routes.PublishRoutes.refresh_after_failure`)."""
        if self._routes.refresh_after_failure(topic, exc, self._loop_time()):
            self._spawn(self._refresh(topic))

    async def _refresh(self, topic: str) -> None:
        try:
            await self._fetch_route(topic, self._loop_time() + self.options.send_msg_timeout_ms / 1000.0)
        except MQClientError as e:
            log.debug("route refresh of %s failed: %s", topic, e)

    async def _publish_info(self, topic: str, deadline: float) -> TopicPublishInfo:
        routes = self._routes
        info = routes.usable(topic)
        if info is not None:
            return info
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:                     # one look-up per topic: the others take its outcome
            info = routes.usable(topic)
            if info is not None:
                return info
            routes.started(topic, self._loop_time())
            try:
                return await self._ns_call(routes.publish_info_call(topic), deadline)
            finally:
                routes.ended(topic)


AsyncProducer = Producer       # the name ECOSYSTEM.md's sketch uses

__all__ = ["ORDERED_YIELD_MS", "Producer", "AsyncProducer"]
