"""Producer: route look-up, queue selection, retries, sync / async / one-way / batch sends.

::

    from rmq import Producer, Message
    with Producer("127.0.0.1:9876", group="pg") as p:
        r = p.send(Message("flights", b"{...}", tags="UA", keys=["N14228"]))
        fut = p.send_async(Message("flights", b"..."))        # concurrent.futures.Future[SendResult]
        p.send_batch([Message("flights", b"a"), Message("flights", b"b")])

Behaviour follows RocketMQ's ``DefaultMQProducer`` (SPEC.md §15.1): a 3 000 ms
budget per send including retries, 2 retries on another broker, zlib
compression (level 5) of bodies of 4 096 bytes or more, a 4 MiB body limit
checked before sending, routes polled from the NameServer every 30 s, latency
fault avoidance with RocketMQ 4.9's tables (off by default, as in RocketMQ).
Every message gets a client unique id (``UNIQ_KEY``, :func:`create_uniq_id`),
which is :attr:`SendResult.msg_id`; the broker's offset id is
:attr:`SendResult.offset_msg_id`.

Modules, by role (as aiokafka's producer): :mod:`rmq.client.producer_request`
(defaults, options, message preparation, queue selectors, the send request and
its answer; shared with :mod:`rmq.aio`), :mod:`rmq.client.message_accumulator`
(hand-overs, requests, batches, ordered queues' turns),
:mod:`rmq.client.sender` (the I/O thread), :mod:`rmq.client.publish_routes`
(route state and NameServer look-ups; shared with :mod:`rmq.aio`) and this
one: the public :class:`Producer`, which also re-exports the names the module
held before that split.

Client-side batching (Kafka's ``linger_ms`` / ``batch_size``): with batching
on, :meth:`Producer.send_async` appends messages to an accumulator per topic
(per queue for ordered messages); a batch ships as one SEND_BATCH_MESSAGE when
it reaches ``batch_size`` bytes, when ``linger_ms`` has passed since its first
message, or on :meth:`flush` / :meth:`close`.  Each message's future gets its
own :class:`SendResult` (its own queue offset and ids).

Ordered sends (a selector, a sharding key or an explicit queue) have one request
out per queue at a time (``max_in_flight_per_queue``, 1), Kafka's
``max.in.flight.requests.per.connection=1`` setting for ordered partitions: the
next request for that queue waits until the previous one is answered, its batch
filling meanwhile, and the smaller batches sealed while it waited go as one
request (of up to ``batch_size`` bytes).  A batch then never waits at the broker
behind another batch of its own queue, which is what the broker's flow control
sheds first (SYSTEM_BUSY after ``waitTimeMillsInSendQueue``).  As in RocketMQ, a
failed ordered request is not retried, and the requests behind it still go: the
queue keeps the order of what it stored, with the failed messages missing (their
futures say so).  The cost: about a fifth of ordered ``send_async``'s throughput
in one thread (bench/results/client.md); more per queue pipelines a queue again.

Threads and sockets
    One I/O thread per producer owns every ZeroMQ socket (pyzmq sockets are not
    thread-safe): a DEALER per NameServer, a DEALER per broker address
    (``IMMEDIATE`` so nothing is queued towards a broker that is not
    connected, plus a monitor socket that reports disconnects), and the read
    end of a wake-up pipe.  Caller threads prepare messages (validation, unique
    id, compression), append them to a deque and wake the I/O thread; sync
    sends wait on a future.  Requests are pipelined: up to ``max_in_flight``
    requests are outstanding at once, matched to responses by ``opaque``.
    Future callbacks run in the I/O thread: keep them short, and never call a
    blocking producer method (``send``, ``flush``, ``close``) from one.

Failure behaviour
    A request that times out, meets a closed connection or gets a retryable
    broker code (TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR, SYSTEM_BUSY,
    NO_PERMISSION, ...: RocketMQ 5's set) is retried on a queue of another broker while attempts
    and time remain; then the send fails with the last error's type
    (:class:`MQBrokerError`, :class:`RemotingTimeoutError`,
    :class:`RemotingError`) and a message naming the attempts, the time spent
    and the brokers tried.  Ordered sends (selector / sharding key / explicit
    queue) are never retried elsewhere.  No message is dropped silently: each
    one's future gets a result or an exception, :meth:`Producer.flush` waits
    for all of them, and :meth:`Producer.close` raises (or logs, when an
    exception is already propagating) if messages queued before it failed.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable, Iterable, Optional, Sequence

from rmq import latency_trace as _lt
from rmq import security
from rmq.client import trace as _trace
from rmq._core.client_msg import (BATCH_ELEMENT_OVERHEAD, COMPRESSED_FLAG, COMPRESSION_ZLIB_TYPE,  # noqa: F401 (re-exported)
                                  CallerAppend, PROPERTY_TRANSACTION_PREPARED, TRANSACTION_PREPARED_TYPE, MessagePreparer,
                                  PreparedMessage, RowsPart, batch_body, complete_send_batch, encode_rows)
from rmq.client.direct import DirectSender
from rmq.client.futures import ColumnsFuture, ManyFuture, SendFuture
from rmq.client.message import Message, MessageQueue, SendResult
from rmq.client.message_accumulator import ASYNC, ONEWAY, SYNC, Pending, QueueTurns, Request  # noqa: F401 (re-exported)
from rmq.client.producer_request import (  # noqa: F401 (re-exported: what this module held before the split by role)
    COMPRESS_LEVEL, COMPRESS_MSG_BODY_OVER_HOWMUCH, CONNECT_TIMEOUT_MS, DEFAULT_BATCH_SIZE, DELIVERY_TIMEOUT_MS,
    HEARTBEAT_BROKER_INTERVAL_MS, MANY_REQUEST_SIZE, MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_QUEUE, MAX_MESSAGE_SIZE,
    MAX_PENDING_MESSAGES, OPEN_KEY_TYPES, POLL_NAME_SERVER_INTERVAL_MS, RETRY_RESPONSE_CODES,
    RETRY_TIMES_WHEN_SEND_ASYNC_FAILED, RETRY_TIMES_WHEN_SEND_FAILED, SEND_MSG_TIMEOUT_MS, SEND_STATUS_BY_CODE,
    ProducerOptions, Selector, ShardQueues, apply_selector, batch_body_of, client_id, column_list, encode_columns,
    encode_user_batch, heartbeat_request, java_hash, many_keys, many_parts, many_request_size, merge_results,
    message_preparer, parse_send_response, prepare_batch, prepare_many, prepare_message, queued_failures_error,
    refused_batch_limit, row_messages, select_by_hash, select_by_random, selector_for, send_request,
    send_response_fields, split_by_size, uniq_ids_of)
from rmq.client.route import MQFaultStrategy, RouteCache, split_namesrv_addr
from rmq.client.send_attempts import final_error, is_retryable
from rmq.client.sender import Sender
from rmq.common.malloc_tuning import tune_malloc
from rmq.common.topic_validator import check_group   # pure functions: the client never touches files
from rmq.errors import MQClientError, RemotingTimeoutError

log = logging.getLogger("rmq.producer")


# -- public API --------------------------------------------------------------------------------------
class Producer:
    """A RocketMQ-style producer (``DefaultMQProducer``), thread-safe.

    Parameters
    ----------
    namesrv_addr : str
        ``"host:port"``, or several separated by ``;``.
    group : str
        Producer group.
    send_msg_timeout_ms : int
        Budget of one send, retries included (3 000).
    retry_times_when_send_failed, retry_times_when_send_async_failed : int
        Retries on another broker (2 each).
    compress_msg_body_over_howmuch : int
        Bodies of at least this many bytes are zlib-compressed (4 096).
    compress_level : int
        zlib level (5).
    max_message_size : int
        Largest body (4 MiB); larger raises :class:`MQClientError` before anything is sent.
    send_latency_fault_enable : bool
        Isolate slow / failing brokers for a while (RocketMQ's tables, see
        :class:`rmq.client.route.MQFaultStrategy`); False by default, as in RocketMQ.
    linger_ms, batch_size : float, int
        Client-side batching of :meth:`send_async`, as Kafka's producer: messages for the same
        queue that wait while ``max_in_flight`` requests are outstanding, or for up to
        ``linger_ms`` (0), go together as one SEND_BATCH_MESSAGE of up to ``batch_size``
        bytes (64 KiB, ``DEFAULT_BATCH_SIZE``: Kafka's batch.size role; at most ``max_message_size``).
        With linger 0 a lone message leaves at once, so batching costs no latency and only forms
        under load (``send_async`` of 100 B messages: 17.5 k msgs/s one request each, 125 k batched).
        Larger batches carry more under load (one Python thread, 3 alternated rounds, this stop:
        1 KiB messages 51-71 k msgs/s at 16 KiB, 88-122 k at 64 KiB, 126-145 k at 256 KiB; 100 B
        124-154 k, 162-175 k, 163-193 k).  A batch the broker refuses as too large to store whole
        (over its maxMessageSize, or more than one CommitLog file holds) goes again in parts of the
        size it names, and later batches keep to that size (``stats["split_requests"]``).
        ``batch_size=0`` sends one SEND_MESSAGE per message (RocketMQ's ``sendAsync``).  An
        ordered queue's batches held behind its request out go as one request when its answer
        comes, of up to ``many_request_size`` (256 KiB with the default ``batch_size``; the
        ``batch_size`` given otherwise): ordered send_async 1.2x at 100 B, 1.6x at 1 KiB
        (bench/results/client.md, stop 57).
    max_in_flight : int
        Requests outstanding at once (pipelining; 32).  Ordered sends have at most
        ``max_in_flight_per_queue`` (an option, 1) per queue within it (module docstring,
        "Ordered sends"; Kafka's ``max.in.flight.requests.per.connection``).
    max_pending_messages : int
        :meth:`send_async` blocks (up to ``send_msg_timeout_ms``) while this many
        messages are unanswered (10 000).
    enable_msg_trace : bool
        Record a trace (RocketMQ's ``Pub`` record: when, cost, store host, result) of every
        message sent, in the background, to ``custom_trace_topic`` (default
        ``RMQ_SYS_TRACE_TOPIC``); ``rmq admin queryMsgTraceById`` reads it.  False by default.
    **options
        Any other :class:`ProducerOptions` field: ``delivery_timeout_ms`` (120 000: a
        :meth:`send_async` message fails if it has no result this long after it was
        handed over), ``connect_timeout_ms`` (1 000: an attempt waits this long for a
        broker connection), ``poll_name_server_interval_ms``, ``latency_max``,
        ``not_available_duration``, ``isolation_latency_ms``, ``retry_response_codes``, ...

    Raises
    ------
    MQClientError
        A bad address, group or option.
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", *,
                 send_msg_timeout_ms: int = SEND_MSG_TIMEOUT_MS,
                 retry_times_when_send_failed: int = RETRY_TIMES_WHEN_SEND_FAILED,
                 retry_times_when_send_async_failed: int = RETRY_TIMES_WHEN_SEND_ASYNC_FAILED,
                 compress_msg_body_over_howmuch: int = COMPRESS_MSG_BODY_OVER_HOWMUCH,
                 compress_level: int = COMPRESS_LEVEL, max_message_size: int = MAX_MESSAGE_SIZE,
                 send_latency_fault_enable: bool = False, linger_ms: float = 0.0,
                 batch_size: Optional[int] = None,
                 max_in_flight: int = MAX_IN_FLIGHT, max_pending_messages: int = MAX_PENDING_MESSAGES,
                 auth=None, enable_msg_trace: bool = False, custom_trace_topic: Optional[str] = None,
                 **options: Any):
        try:
            check_group(group)
        except ValueError as e:
            raise MQClientError(f"producer group: {e}") from None
        try:
            self.options = ProducerOptions(
                send_msg_timeout_ms=send_msg_timeout_ms, retry_times_when_send_failed=retry_times_when_send_failed,
                retry_times_when_send_async_failed=retry_times_when_send_async_failed,
                compress_msg_body_over_howmuch=compress_msg_body_over_howmuch, compress_level=compress_level,
                max_message_size=max_message_size, send_latency_fault_enable=send_latency_fault_enable,
                linger_ms=linger_ms, batch_size=batch_size, max_in_flight=max_in_flight,
                max_pending_messages=max_pending_messages, **options)
        except TypeError as e:
            raise MQClientError(f"unknown producer option: {e}") from None
        self.namesrv_addr = namesrv_addr
        self.namesrv_addrs = split_namesrv_addr(namesrv_addr)
        self.group = group
        self.client_id = client_id()
        self._closed = False
        o = self.options
        self._preparer = message_preparer(o)
        self._prepare = self._preparer.prepare
        self._batching = o.batching
        self._max_pending = o.max_pending_messages
        self._delivery_timeout_s = max(o.delivery_timeout_ms, o.send_msg_timeout_ms) / 1000.0
        self._attempt_timeout_s = o.send_msg_timeout_ms / 1000.0
        tune_malloc()                               # batch requests: rmq.common.malloc_tuning
        self._sender = Sender(self.namesrv_addrs, group, self.client_id, self.options)
        self._sender.client_auth = security.client_auth(auth)   # CURVE keys; None: environment / plain
        # send_async's common case in one C call (falls back to _append_async / _enqueue); made
        # before the I/O thread starts (it takes the sender's instance dict: CallerAppend)
        self._caller = CallerAppend(self._sender, self._preparer, SendFuture, o.max_pending_messages,
                                    weakref.ref(self), vars(_lt))
        self._caller_send = self._caller.send
        self._sender.start()
        self._sender.started_evt.wait()
        if self._sender.fatal is not None:
            raise MQClientError(f"producer I/O thread failed to start: {self._sender.fatal}") from self._sender.fatal
        sender = self._sender
        self._direct = DirectSender(group, self.client_id, self.options, sender.route_cache, sender.fault,
                                    sender.client_auth,
                                    refresh_route=lambda topic, exc: sender.call(
                                        lambda: sender.route_in_doubt(topic, exc)))
        self._finalizer = weakref.finalize(self, _finalize, self._sender, self._direct)
        # False: every send goes through the I/O thread's connections (a TransactionProducer: the
        # broker's check-backs arrive on the connection its heartbeats came from)
        self._use_direct = True
        # message trace (RocketMQ's enableMsgTrace / customizedTraceTopic): a Pub record per message
        # sent, queued for a background dispatcher; off unless asked for
        self._trace = _trace.TraceDispatcher(namesrv_addr, group, custom_trace_topic) if enable_msg_trace else None
        self._plain = self._trace is None and self._batching   # send_async's caller-side batch path applies
        if self._plain and type(self).send_async is Producer.send_async:
            # send_async's common case without a Python frame: 0.19 us of the ~1.4 us of client
            # CPU a message (bench/results/client.md, stop 56); it takes every other case here
            self.send_async = self._caller.send_async

    # -- message trace ---------------------------------------------------------------------------
    def _trace_sent(self, msgs: list, result: SendResult, t0: float, ordered: bool = False) -> None:
        self._trace.append_pub_batch(msgs, result, int((time.monotonic() - t0) * 1000), self.client_id, ordered)

    def _traced_callback(self, callback: Optional[Callable[[Future], Any]], msgs: list, ordered: bool = False):
        """The done-callback of a traced send_async: the Pub record(s), then the user's callback.
        Given at the future's creation (a callback added later costs the future its lock-free
        completion)."""
        t0 = time.monotonic()

        def done(f: Future) -> None:
            if f.exception() is None:
                self._trace_sent(msgs, f.result(), t0, ordered)
            if callback is not None:
                callback(f)
        return done

    @property
    def trace_dispatcher(self) -> "Optional[_trace.TraceDispatcher]":
        """The message-trace dispatcher (``enable_msg_trace=True``), else None."""
        return self._trace

    # -- properties --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Messages accepted and not yet answered."""
        return self._sender.pending

    @property
    def stats(self) -> dict:
        """Counters: requests, batch_requests, split_requests (batches the broker refused as too large and
        that went again in parts), messages (acknowledged), retries, failed_messages, route_requests
        (the I/O thread's plus those of synchronous sends made on callers' threads), held_for_order
        (ordered requests that waited for the previous request of their queue to be answered)."""
        st = dict(self._sender.stats)
        for k, v in list(self._direct.stats.items()):
            st[k] += v
        st["held_for_order"] = self._sender._queue_turns.held
        return st

    @property
    def fault_strategy(self) -> MQFaultStrategy:
        return self._sender.fault

    @property
    def route_cache(self) -> RouteCache:
        return self._sender.route_cache

    # -- sending --------------------------------------------------------------------------------
    def send(self, msg: Message, *, timeout_ms: Optional[int] = None, selector: Optional[Selector] = None,
             arg: Any = None, sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> SendResult:
        """Send and wait for the broker (RocketMQ ``send``).

        Parameters
        ----------
        msg : Message
        timeout_ms : int, optional
            Budget including retries (default ``send_msg_timeout_ms``).
        selector : callable(mqs, msg, arg) -> MessageQueue, optional
            Ordered send: the queue to use (no retry elsewhere).
        arg : any
            Passed to ``selector``.
        sharding_key : str or int, optional
            Ordered send by key: the same key always goes to the same queue
            (Java hashCode modulo the writable queue count).
        queue : MessageQueue, optional
            Send to this queue (no retry elsewhere).

        An ordered send (selector, sharding key or queue) made while :meth:`send_async`
        messages are unanswered goes after them, in its queue's turn (module docstring).

        Returns
        -------
        SendResult

        Raises
        ------
        MQClientError
            Invalid message (nothing sent), no route, or the producer is closed.
        MQBrokerError
            The broker refused the message (after retries when the code is retryable).
        RemotingTimeoutError
            No answer within the budget.
        RemotingError
            The broker could not be reached.
        """
        self._not_in_io_thread("send")
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = self._prepare(msg)
        t0 = time.monotonic() if self._trace is not None else 0.0
        # a known route: on this thread, unless an ordered send must follow async sends still unanswered
        # (the I/O thread sends it after them, in its queue's turn)
        if self._use_direct and (self._sender.pending == 0 or (sel is None and queue is None)) \
                and self._direct.usable(prep.msg.topic):
            self._check_open()
            result = self._direct.send(prep, timeout_ms, sel, arg, queue)
        else:
            fut = self._enqueue([prep], SYNC, timeout_ms, sel, arg, queue)
            result = self._wait(fut, timeout_ms)
        if self._trace is not None:
            self._trace_sent([prep.msg], result, t0, sel is not None)
        return result

    def send_async(self, msg: Message, callback: Optional[Callable[[Future], Any]] = None, *,
                   timeout_ms: Optional[int] = None, selector: Optional[Selector] = None, arg: Any = None,
                   sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> Future:
        """Queue ``msg``; the returned future gets its :class:`SendResult` or exception.

        ``callback(future)`` runs when it completes, in the producer's I/O
        thread (keep it short; do not call blocking producer methods from it).
        With batching on, the message waits up to ``linger_ms`` for companions.
        Blocks only when ``max_pending_messages`` are unanswered.  ``timeout_ms``
        (default ``send_msg_timeout_ms``) bounds each attempt's wait for the broker;
        ``delivery_timeout_ms`` bounds the whole (queueing, linger, retries).
        Selector / sharding key / queue as in :meth:`send`; such ordered sends
        have one request out per queue (module docstring, "Ordered sends").

        Raises
        ------
        MQClientError
            Invalid message (nothing queued), producer closed, or still no room
            in the pending buffer after ``send_msg_timeout_ms``.
        """
        if selector is None and queue is None and timeout_ms is None and self._plain and not _lt.ENABLED \
                and (sharding_key is None or type(sharding_key) in OPEN_KEY_TYPES):
            # the common case, with the fewest steps: in C (sets the SHARDING_KEY property too);
            # a plain producer's instance calls CallerAppend.send_async, which does this without
            # this frame
            r = self._caller_send(msg, callback, sharding_key)
            if type(r) is not tuple:
                return r
            return self._send_async_rest(r, callback, sharding_key)
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = self._prepare(msg)
        if self._trace is not None:
            callback = self._traced_callback(callback, [prep.msg], sel is not None)
        return self._enqueue([prep], ASYNC, timeout_ms, sel, arg, queue, callback=callback)

    def _send_async_rest(self, r: tuple, callback: Optional[Callable[[Future], Any]], sharding_key: Any) -> Future:
        """send_async's common case when CallerAppend.send did not append: ``r`` is its
        ``(prepared message, future or None)``; the message joins a new caller-side batch, or
        (a message that cannot be batched: compressed, delayed...) is a request of its own."""
        prep, fut = r
        if fut is not None:
            return self._append_async(prep, callback, sharding_key, fut)
        return self._enqueue([prep], ASYNC, None, None if sharding_key is None else select_by_hash, sharding_key,
                             None, callback=callback)

    def _append_async(self, prep: PreparedMessage, callback: Optional[Callable[[Future], Any]],
                      sharding_key: Any = None, fut: Optional[SendFuture] = None) -> Future:
        """send_async's common case (batching on, no selector, queue, timeout or trace): the
        message joins the caller-side batch of its topic, or of its topic and sharding key
        (Kafka's RecordAccumulator.append, done in the caller's thread); the I/O thread takes the
        batch whole, and sends a sharding key's batch to the key's queue (select_by_hash) in the
        order the batches were opened.  A batch is opened (and the I/O thread woken) when there
        is none open or the open one would pass ``batch_size``."""
        s = self._sender
        if fut is None:
            fut = SendFuture(callback)
        topic = prep.msg.topic
        key = topic if sharding_key is None else (topic, sharding_key)
        opened = None
        size = prep.size
        with s.lock:
            if self._closed or not s.running:
                self._check_open()
            if s.pending >= self._max_pending and s.pending > 0 and threading.get_ident() != s.ident:
                self._wait_for_room(1, self.options.send_msg_timeout_ms)
            s.pending += 1
            p = s.open.get(key)
            if p is None or p.nbytes + size > s.batch_size:
                now = time.monotonic()
                p = Pending([], None, ASYNC, now + self._delivery_timeout_s, self._attempt_timeout_s,
                             None if sharding_key is None else select_by_hash, sharding_key, started=now)
                p.futures = []
                p.open_key = key
                s.open[key] = opened = p
            p.preps.append(prep)
            p.futures.append(fut)
            p.nbytes += size
        if opened is not None:
            s.submit(opened)
        return fut

    def _wait_for_room(self, n: int, budget_ms: float) -> None:
        """Under ``s.lock``: block until ``n`` more messages fit under ``max_pending_messages``.

        Raises
        ------
        MQClientError
            Still no room after ``budget_ms``, or the producer closed meanwhile.
        """
        s = self._sender
        end = time.monotonic() + budget_ms / 1000.0
        s.blocked += 1
        try:
            while s.pending + n > self.options.max_pending_messages and s.pending > 0:
                left = end - time.monotonic()
                if left <= 0:
                    raise MQClientError(f"producer buffer full: {s.pending} messages unanswered "
                                        f"(max_pending_messages={self.options.max_pending_messages}) "
                                        f"for {budget_ms} ms")
                s.cond.wait(min(left, 0.5))
                self._check_open()
        finally:
            s.blocked -= 1

    def send_async_many(self, msgs: Iterable[Message], callback: Optional[Callable[[Future], Any]] = None, *,
                        sharding_key: Any = None, sharding_keys: Optional[Sequence] = None,
                        timeout_ms: Optional[int] = None) -> Future:
        """Queue many messages in one call, with one future for all of them (confluent-kafka's
        ``produce`` + ``flush``, its delivery reports in one piece): the messages go in batches of
        up to ``MANY_REQUEST_SIZE`` bytes (256 KiB, within ``max_message_size``), or
        ``batch_size`` when given (:func:`many_request_size`; 0: one per request), pipelined, with
        no future or callback per message.

        Parameters
        ----------
        msgs : iterable of Message
            Any topics; each message as :meth:`send_async` takes it.
        callback : callable(future), optional
            Runs once, in the I/O thread, when every message has its outcome.
        sharding_key : optional
            Every message ordered on the queue this key selects (as :meth:`send_async`).
        sharding_keys : sequence, optional
            One key per message (None: that message is unordered); messages of one key keep the
            order given.  Not with ``sharding_key``.
        timeout_ms : int, optional
            Each attempt's wait for the broker (default ``send_msg_timeout_ms``);
            ``delivery_timeout_ms`` bounds each message's whole send.

        Returns
        -------
        concurrent.futures.Future
            Of the list of :class:`SendResult`, one per message in the order given.  When any
            message failed, its exception is a :class:`rmq.errors.SendManyError` whose
            ``results`` hold each message's result or exception (the others are stored).

        Raises
        ------
        MQClientError
            A message is invalid (naming its position; nothing is queued), the keys do not
            match the messages, the producer is closed, or no room in the pending buffer
            (``max_pending_messages``) came within ``send_msg_timeout_ms`` for the first batch.
            Room that does not come for a later batch fails that batch's messages in the
            future's ``SendManyError`` instead (the earlier batches are on their way).
        """
        msgs = msgs if type(msgs) is list else list(msgs)
        n = len(msgs)
        sharding_keys = many_keys(n, sharding_key, sharding_keys)
        budget_ms = self._many_budget_ms(timeout_ms)
        preps = prepare_many(self._preparer, msgs, sharding_keys)
        many = ManyFuture(n, self._traced_many(callback, msgs) if self._trace is not None else callback)
        if n == 0:
            return many
        if _lt.ENABLED:
            _lt.stamp_ids("p_enq", [p.uniq_id for p in preps], time.monotonic_ns())
        self._hand_over_many(many, many_parts(preps, sharding_keys, self._request_size()), budget_ms)
        return many

    def send_async_columns(self, topic: str, bodies: Sequence[bytes],
                           callback: Optional[Callable[[Future], Any]] = None, *,
                           tags: Optional[Sequence[Optional[str]]] = None, keys: Optional[Sequence] = None,
                           properties: Optional[Sequence[Optional[dict]]] = None, sharding_key: Any = None,
                           sharding_keys: Optional[Sequence] = None, timeout_ms: Optional[int] = None) -> Future:
        """Send rows given as columns, all of one topic: row ``i`` is stored as
        ``Message(topic, bodies[i], tags=tags[i], keys=keys[i], properties=properties[i])``
        would be (byte for byte but its UNIQ_KEY), without a :class:`Message` or a
        :class:`SendResult` per row: the rows are encoded in C straight into request-sized
        SEND_BATCH_MESSAGE bodies, and each request's outcome is one record.  A request holds up to
        ``MANY_REQUEST_SIZE`` bytes (256 KiB, within ``max_message_size``), or ``batch_size``
        when given (:func:`many_request_size`): the rows are handed over at once, so smaller
        requests would only cost more round trips.
        The path for data that is already in columns (a DataFrame, an Arrow table; ``rmq demo
        flights``); :meth:`send_async_many` is the same for :class:`Message` objects.

        Parameters
        ----------
        topic : str
        bodies : sequence of bytes
            One body per row (bytes, bytearray or memoryview), 1..``max_message_size`` bytes
            each; never compressed (a batch's bodies are not, as in RocketMQ).
        callback : callable(future), optional
            Runs once, in the I/O thread, when every row has its outcome.
        tags : sequence of (str or None), optional
            One tag per row (None or "": none).
        keys : sequence, optional
            Per row: a key (str), a list / tuple of str keys, or None.
        properties : sequence of (dict or None), optional
            Per row user properties (str -> str; other values as ``str()``).  Names the
            producer sets (tags, keys, the sharding key, UNIQ_KEY) and those that need
            :meth:`send_async` (delay level, timers, WAIT, transactions) are refused:
            :data:`rmq._core.client_msg.COLUMNS_REFUSED_PROPERTIES`.
        sharding_key, sharding_keys
            As :meth:`send_async_many`: every row ordered on one key's queue, or one key per
            row (None: unordered); rows of one key keep the order given.
        timeout_ms : int, optional
            Each attempt's wait for the broker (default ``send_msg_timeout_ms``);
            ``delivery_timeout_ms`` bounds each row's whole send.

        Returns
        -------
        concurrent.futures.Future
            Of a :class:`rmq.client.message.ColumnSendResults` (a sequence of one
            :class:`SendResult` per row, with columnar views: ``queue_offsets``,
            ``queue_ids``, ``msg_ids``, ``last_offsets()``).  When any row failed, its
            exception is a :class:`rmq.errors.SendManyError` whose ``results`` is that
            ColumnSendResults (failed rows hold their exception).

        Raises
        ------
        MQClientError
            A column without one item per body, a bad topic or row (naming its position;
            nothing is queued), the producer is closed, or no room in the pending buffer
            (``max_pending_messages``) within ``send_msg_timeout_ms`` for the first request
            (for a later one its rows fail in the future's SendManyError instead).
        """
        budget_ms = self._many_budget_ms(timeout_ms)
        self._check_open()
        n, parts = encode_columns(self._preparer, topic, bodies, tags, keys, properties, sharding_key, sharding_keys,
                                  self._request_size(columns=True))
        many = ColumnsFuture(n, self._traced_many(callback, row_messages(topic, list(bodies), tags, keys))
                             if self._trace is not None and n else callback)
        if _lt.ENABLED:
            _lt.stamp_ids("p_enq", [u for part in parts for u in part.uniq_ids()], time.monotonic_ns())
        self._hand_over_many(many, parts, budget_ms)
        return many

    def _request_size(self, columns: bool = False) -> int:
        """Bytes of one send_async_many / send_async_columns request (:func:`many_request_size`)."""
        return many_request_size(self.options, columns, self._sender.batch_limit)

    def _many_budget_ms(self, timeout_ms: Optional[int]) -> int:
        budget_ms = timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms
        if budget_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {budget_ms}")
        return budget_ms

    def _hand_over_many(self, many: Any, parts: list, budget_ms: int) -> None:
        """Hand the parts of a send_async_many call (``[positions, preps, key, nbytes]``) or of a
        send_async_columns call (:class:`RowsPart`) to the I/O thread, each once it fits under
        ``max_pending_messages``; see send_async_many for what happens when room does not come."""
        s = self._sender
        in_io = threading.get_ident() == s.ident
        now = time.monotonic()
        deadline = now + max(self.options.delivery_timeout_ms, budget_ms) / 1000.0
        attempt_s = budget_ms / 1000.0
        limit = self.options.max_pending_messages
        rows = bool(parts) and type(parts[0]) is RowsPart
        for k, part in enumerate(parts):
            if rows:
                preps, key, nbytes, topic = part, part.key, part.nbytes, part.topic
            else:
                positions, preps, key, nbytes = part
                topic = preps[0].msg.topic
            m = len(preps)
            try:
                with s.lock:
                    self._check_open()
                    if not in_io and s.pending + m > limit and s.pending > 0:
                        self._wait_for_room(m, budget_ms)
                    s.pending += m
                    if key is not None and s.open and type(key) in OPEN_KEY_TYPES:
                        # seal send_async's open batch of this key: these messages go after it
                        s.open.pop((topic, key), None)
            except MQClientError as e:
                if k == 0:
                    raise
                for rest in parts[k:]:
                    (many.part(rest.positions, rest.uniq) if rows else many.part(rest[0])).set_exception(e)
                return
            p = Pending(preps, many.part(part.positions, part.uniq) if rows else many.part(positions), ASYNC,
                         deadline, attempt_s, None if key is None else select_by_hash, key, None, False, now)
            p.nbytes = nbytes
            if rows:
                p.rows = part
            s.submit(p)

    def _traced_many(self, callback: Optional[Callable[[Future], Any]], msgs: list):
        """The done-callback of a traced send_async_many (or send_async_columns, ``msgs`` its
        :func:`row_messages`): a Pub record per stored message."""
        t0 = time.monotonic()

        def done(f: Future) -> None:
            exc = f.exception()
            results = f.result() if exc is None else getattr(exc, "results", [])
            for m, r in zip(msgs, results):
                if isinstance(r, SendResult):
                    self._trace_sent([m], r, t0)
            if callback is not None:
                callback(f)
        return done

    def send_oneway(self, msg: Message, *, selector: Optional[Selector] = None, arg: Any = None,
                    sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> None:
        """Send without waiting for the broker's answer (RocketMQ ``sendOneway``): returns once
        the request is written to the broker's connection.

        Raises
        ------
        MQClientError, RemotingError, RemotingTimeoutError
            Invalid message, no route, or no connection within the budget.
        """
        self._not_in_io_thread("send_oneway")
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = prepare_message(msg, self.options)
        self._wait(self._enqueue([prep], ONEWAY, None, sel, arg, queue), None)

    def send_batch(self, msgs: Iterable[Message], *, timeout_ms: Optional[int] = None,
                   queue: Optional[MessageQueue] = None) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE to one queue and wait.

        Returns
        -------
        SendResult
            ``msg_id`` / ``offset_msg_id`` comma-joined, ``queue_offset`` of the first message
            (message ``i`` is at ``queue_offset + i``).

        Raises
        ------
        MQClientError
            Mixed topics, a delay level, or more than ``max_message_size`` bytes in all.
        MQBrokerError, RemotingTimeoutError, RemotingError
            As :meth:`send`.
        """
        self._not_in_io_thread("send_batch")
        ms = msgs if type(msgs) is list else list(msgs)
        topic = getattr(ms[0], "topic", None) if ms else None
        # on this thread as send() (rmq.client.direct): two thread hand-offs fewer per call, and
        # the batch encoded whole in one pass (no PreparedMessage per message)
        if self._use_direct and type(topic) is str and (self._sender.pending == 0 or queue is None) \
                and self._direct.usable(topic):
            batch = encode_user_batch(ms, self.options)
            t0 = time.monotonic() if self._trace is not None else 0.0
            self._check_open()
            result = self._direct.send_batch(batch, timeout_ms, queue)
            sent = batch.msgs
        else:
            preps = prepare_batch(ms, self.options)
            t0 = time.monotonic() if self._trace is not None else 0.0
            fut = self._enqueue(preps, SYNC, timeout_ms, None, None, queue, whole=True)
            result = self._wait(fut, timeout_ms)
            sent = [p.msg for p in preps]
        if self._trace is not None:
            self._trace_sent(sent, result, t0)
        return result

    def send_batch_async(self, msgs: Iterable[Message], callback: Optional[Callable[[Future], Any]] = None, *,
                         timeout_ms: Optional[int] = None, queue: Optional[MessageQueue] = None) -> Future:
        """:meth:`send_batch` without waiting: a future of the batch's :class:`SendResult`."""
        preps = prepare_batch(msgs, self.options)
        if self._trace is not None:
            callback = self._traced_callback(callback, [p.msg for p in preps])
        return self._enqueue(preps, ASYNC, timeout_ms, None, None, queue, whole=True, callback=callback)

    def fetch_publish_message_queues(self, topic: str, timeout_ms: Optional[int] = None) -> list:
        """The writable queues of ``topic``, freshly read from the NameServer
        (RocketMQ ``fetchPublishMessageQueues``).

        Raises
        ------
        MQClientError
            Unknown topic (code TOPIC_NOT_EXIST) or NameServer unreachable.
        """
        self._not_in_io_thread("fetch_publish_message_queues")
        self._check_open()
        timeout = (timeout_ms or self.options.send_msg_timeout_ms) / 1000.0
        answer: Future = Future()
        s = self._sender
        s.call(lambda: s.query_route(topic, answer))
        try:
            info = answer.result(timeout + 1.0)
        except FutureTimeoutError:
            raise RemotingTimeoutError(f"route of topic {topic}: no answer within {timeout * 1000:.0f} ms") from None
        return list(info.message_queue_list)

    # -- flush / close ------------------------------------------------------------------------
    def flush(self, timeout: Optional[float] = None) -> int:
        """Ship every queued batch now and wait until every message handed over so far has
        its result (success or exception).

        Parameters
        ----------
        timeout : float, optional
            Seconds; None waits until done (each message has its own send budget, so this ends).

        Returns
        -------
        int
            Messages still unanswered (0 when everything completed).
        """
        self._not_in_io_thread("flush")
        s = self._sender
        end = None if timeout is None else time.monotonic() + timeout
        with s.cond:
            s.flushing += 1
        try:
            s.wake()
            with s.cond:
                while s.pending > 0 and s.running:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    s.cond.wait(0.5 if left is None else min(left, 0.5))
                return s.pending if s.running else 0
        finally:
            with s.cond:
                s.flushing -= 1

    def close(self, timeout: Optional[float] = None) -> None:
        """Flush, then stop the I/O thread and close the sockets (idempotent).

        Messages that cannot be sent get their futures failed; none is dropped silently.

        Raises
        ------
        MQClientError
            Messages queued with :meth:`send_async` before the close failed (count and first
            error in the message, the first error as ``__cause__``).
        """
        self._close(timeout, raise_failures=True)

    shutdown = close        # RocketMQ's name

    def _close(self, timeout: Optional[float], raise_failures: bool) -> None:
        self._not_in_io_thread("close")
        s = self._sender
        with s.cond:
            if self._closed:
                return
            self._closed = True
            self._caller.closed = True
            s.record_failures = True
        try:
            self.flush(timeout)
        finally:
            s.stop()
            s.join(max(30.0, (timeout or 0) + 5.0))
            if s.is_alive():
                log.error("producer %s: I/O thread did not stop (a callback blocking it?)", self.group)
            self._direct.close()
            self._finalizer.detach()
            if self._trace is not None:
                self._trace.close()
        if s.failures:
            err = queued_failures_error(self.group, sum(len(p.preps) for p, _ in s.failures), s.failures[0][1])
            if raise_failures:
                raise err
            log.error("%s", err)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(None, raise_failures=exc_type is None)

    def __repr__(self) -> str:
        return (f"Producer(group={self.group!r}, namesrv={self.namesrv_addr!r}, "
                f"{'closed' if self._closed else 'open'}, pending={self.pending})")

    # -- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        if not self._sender.running:
            raise MQClientError(f"producer {self.group}: I/O thread is not running"
                                f"{': %s' % self._sender.fatal if self._sender.fatal else ''}")

    def _not_in_io_thread(self, what: str) -> None:
        if threading.get_ident() == self._sender.ident:
            raise MQClientError(f"{what}() called from a send callback would deadlock the producer's I/O thread; "
                                f"use send_async() there")

    def _enqueue(self, preps: list, mode: int, timeout_ms: Optional[int], selector, arg,
                 queue: Optional[MessageQueue], whole: bool = False,
                 callback: Optional[Callable[[Future], Any]] = None) -> Future:
        if queue is not None and not isinstance(queue, MessageQueue):
            raise MQClientError(f"queue must be a MessageQueue, got {type(queue).__name__}")
        if queue is not None and queue.topic != preps[0].msg.topic:
            raise MQClientError(f"queue {queue} is not of topic {preps[0].msg.topic}")
        budget_ms = timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms
        if budget_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {budget_ms}")
        n = len(preps)
        s = self._sender
        in_io = threading.get_ident() == s.ident
        with s.lock:                      # = s.cond (its lock); C-level enter on the per-message path
            self._check_open()
            if not in_io and s.pending + n > self.options.max_pending_messages and s.pending > 0:
                self._wait_for_room(n, budget_ms)
            s.pending += n
            if selector is select_by_hash and s.open:
                # the sharding key's open batch (send_async) is sealed: nothing sent after this
                # message may join it and overtake it
                s.open.pop((preps[0].msg.topic, arg), None)
        now = time.monotonic()
        if mode == ASYNC:
            deadline = now + max(self.options.delivery_timeout_ms, budget_ms) / 1000.0
        else:
            deadline = now + budget_ms / 1000.0
        fut = SendFuture(callback)            # RUNNING: cannot be cancelled, it is owned by the I/O thread
        if _lt.ENABLED:
            _lt.stamp_ids("p_enq", [p.uniq_id for p in preps], time.monotonic_ns())
        s.submit(Pending(preps, fut, mode, deadline, budget_ms / 1000.0, selector, arg, queue, whole, now))
        return fut

    def _wait(self, fut: Future, timeout_ms: Optional[int]) -> Any:
        budget = (timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms) / 1000.0
        try:
            return fut.result(budget + 5.0)
        except FutureTimeoutError:
            raise RemotingTimeoutError(f"no result within {budget * 1000:.0f} ms (+5 s grace): "
                                       f"is the producer's I/O thread blocked by a callback?") from None

def _finalize(sender: Sender, direct: DirectSender) -> None:
    """A producer garbage-collected (or alive at exit) without close(): flush what it holds."""
    if sender.is_alive() and threading.current_thread() is not sender:
        with sender.cond:
            sender.flushing += 1
        sender.wake()
        end = time.monotonic() + SEND_MSG_TIMEOUT_MS / 1000.0 + 1.0
        with sender.cond:
            while sender.pending > 0 and sender.is_alive() and time.monotonic() < end:
                sender.cond.wait(0.1)
        sender.stop()
        sender.join(5.0)
    try:
        direct.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


__all__ = ["Producer", "ProducerOptions", "PreparedMessage", "prepare_message", "prepare_batch", "select_by_hash",
           "select_by_random", "java_hash", "send_request", "parse_send_response", "merge_results", "final_error",
           "is_retryable", "SEND_MSG_TIMEOUT_MS", "MAX_MESSAGE_SIZE", "COMPRESSED_FLAG", "COMPRESSION_ZLIB_TYPE",
           "RETRY_RESPONSE_CODES", "SEND_STATUS_BY_CODE"]
