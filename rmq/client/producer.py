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
    broker code (TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR,
    NO_PERMISSION, ...) is retried on a queue of another broker while attempts
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

import collections
import dataclasses
import heapq
import itertools
import logging
import os
import random
import socket
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import zmq
from zmq.utils.monitor import parse_monitor_message

from rmq import latency_trace as _lt
from rmq import protocol as P
from rmq import security
from rmq.client import trace as _trace
from rmq._core.client_msg import (BATCH_ELEMENT_OVERHEAD, COMPRESSED_FLAG, COMPRESSION_ZLIB_TYPE,  # noqa: F401 (re-exported)
                                  PROPERTY_TRANSACTION_PREPARED, TRANSACTION_PREPARED_TYPE, MessagePreparer,
                                  PreparedMessage, RowsPart, batch_body, complete_send_batch, encode_rows)
from rmq._core.client_msg import many_parts as _many_parts
from rmq._core.commitlog import tags_string_to_tags_code
from rmq.client.direct import DirectSender, close_monitored
from rmq.client.futures import ColumnsFuture, ColumnsPart, ManyFuture, ManyPart, SendFuture
from rmq.client.message import (PROPERTY_SHARDING_KEY, Message,
                                MessageQueue, SendResult, SendStatus)
from rmq.client.send_attempts import SendAttempts, final_error, is_retryable
from rmq.client.publish_routes import PROVISIONAL_POLL_MS, PublishRoutes, no_route_error
from rmq.client.route import (LATENCY_MAX_49, NOT_AVAILABLE_DURATION_49, ISOLATION_LATENCY_MS_49,
                              MQFaultStrategy, RouteCache, TopicPublishInfo,
                              split_namesrv_addr)
from rmq.errors import MQBrokerError, MQClientError, RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode
from rmq.zmqio import recv_parts, send_parts
from rmq.common.mix_all import DEFAULT_TOPIC_QUEUE_NUMS
from rmq.common.request_header import MAX_BATCH_BYTES_FIELD, SendMessageRequestHeader, send_response_msg_id
from rmq.common.topic_validator import AUTO_CREATE_TOPIC_KEY_TOPIC as CREATE_TOPIC_KEY
from rmq.common.topic_validator import check_group, check_topic   # pure functions: the client never touches files

log = logging.getLogger("rmq.producer")

# -- defaults (SPEC.md §15.1, DefaultMQProducer) -------------------------------------------------
SEND_MSG_TIMEOUT_MS = 3000                 # total budget of one send, retries included
RETRY_TIMES_WHEN_SEND_FAILED = 2           # sync: up to 3 attempts
RETRY_TIMES_WHEN_SEND_ASYNC_FAILED = 2
COMPRESS_MSG_BODY_OVER_HOWMUCH = 4096      # bytes; body >= this is compressed (never inside a batch)
COMPRESS_LEVEL = 5                         # rocketmq.message.compressLevel
MAX_MESSAGE_SIZE = 4 * 1024 * 1024         # bytes of body (of the whole batch body for send_batch)
POLL_NAME_SERVER_INTERVAL_MS = 30_000      # route refresh period
HEARTBEAT_BROKER_INTERVAL_MS = 30_000      # HEART_BEAT to every broker in use
CONNECT_TIMEOUT_MS = 1000                  # an attempt waits this long for a broker connection (IMMEDIATE)
MAX_IN_FLIGHT = 32                         # outstanding requests per producer (pipelining)
MAX_IN_FLIGHT_PER_QUEUE = 1                # ordered sends: requests out per queue (Kafka's
                                           # max.in.flight.requests.per.connection=1 for strict order)
MAX_PENDING_MESSAGES = 10_000              # accepted but unanswered messages before send_async blocks
                                           # (every pending message is ~15 live objects the GC walks)
DELIVERY_TIMEOUT_MS = 120_000              # send_async: hand-over to final result (Kafka's delivery.timeout.ms)
DEFAULT_BATCH_SIZE = 64 * 1024             # bytes; Kafka's batch.size role (Kafka: 16 KiB; here a request
                                           # costs the broker ~100 us of Python, so 4x: 1.3x / 1.7x send_async
                                           # at 100 B / 1 KiB; 256 KiB would give a little more, but 32 of them
                                           # in flight wait 4x longer at the broker: flow control sheds sends
                                           # that waited > waitTimeMillsInSendQueue, 200 ms)
MANY_REQUEST_SIZE = 256 * 1024             # bytes; send_async_many / send_async_columns requests are at least
                                           # this big (all their messages are handed over at once: smaller
                                           # requests only cost round trips; Kafka's max.request.size role)
# BATCH_ELEMENT_OVERHEAD, COMPRESSED_FLAG, COMPRESSION_ZLIB_TYPE, TRANSACTION_PREPARED_TYPE,
# PROPERTY_TRANSACTION_PREPARED: from rmq._core.client_msg (which does the per-message work)
NO_BUYER_ID = 204                          # RocketMQ ResponseCode values not in rmq.protocol
NOT_IN_CURRENT_UNIT = 205
RETRY_RESPONSE_CODES = frozenset({
    int(ResponseCode.TOPIC_NOT_EXIST), int(ResponseCode.SERVICE_NOT_AVAILABLE), int(ResponseCode.SYSTEM_ERROR),
    int(ResponseCode.NO_PERMISSION), NO_BUYER_ID, NOT_IN_CURRENT_UNIT})
SEND_STATUS_BY_CODE = {
    int(ResponseCode.SUCCESS): SendStatus.SEND_OK,
    int(ResponseCode.FLUSH_DISK_TIMEOUT): SendStatus.FLUSH_DISK_TIMEOUT,
    int(ResponseCode.FLUSH_SLAVE_TIMEOUT): SendStatus.FLUSH_SLAVE_TIMEOUT,
    int(ResponseCode.SLAVE_NOT_AVAILABLE): SendStatus.SLAVE_NOT_AVAILABLE,
}

Selector = Callable[[list, Message, Any], MessageQueue]


@dataclass
class ProducerOptions:
    """Every producer setting (keyword arguments of :class:`Producer` and :class:`rmq.aio.Producer`).

    Times are milliseconds, sizes bytes.  RocketMQ names in brackets.
    """
    send_msg_timeout_ms: int = SEND_MSG_TIMEOUT_MS                       # [sendMsgTimeout]
    retry_times_when_send_failed: int = RETRY_TIMES_WHEN_SEND_FAILED     # [retryTimesWhenSendFailed]
    retry_times_when_send_async_failed: int = RETRY_TIMES_WHEN_SEND_ASYNC_FAILED
    compress_msg_body_over_howmuch: int = COMPRESS_MSG_BODY_OVER_HOWMUCH  # [compressMsgBodyOverHowmuch]
    compress_level: int = COMPRESS_LEVEL
    max_message_size: int = MAX_MESSAGE_SIZE                              # [maxMessageSize]
    poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS     # [pollNameServerInterval]
    heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS     # [heartbeatBrokerInterval]
    send_latency_fault_enable: bool = False                              # [sendLatencyFaultEnable]
    latency_max: Sequence[int] = LATENCY_MAX_49
    not_available_duration: Sequence[int] = NOT_AVAILABLE_DURATION_49
    isolation_latency_ms: int = ISOLATION_LATENCY_MS_49
    retry_response_codes: frozenset = RETRY_RESPONSE_CODES
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS             # [defaultTopicQueueNums]
    linger_ms: float = 0.0              # batching: wait up to this long for a batch to fill
    batch_size: Optional[int] = None    # batching: ship a batch at this many bytes (None: 64 KiB; 0 = off)
    max_in_flight: int = MAX_IN_FLIGHT  # outstanding requests (pipelining)
    max_in_flight_per_queue: int = MAX_IN_FLIGHT_PER_QUEUE  # ordered sends: requests out per queue
    max_pending_messages: int = MAX_PENDING_MESSAGES  # send_async blocks above this many unanswered messages
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS
    delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS  # send_async: queueing + linger + every attempt
    # whether batch_size was left to its default (then bulk hand-overs use MANY_REQUEST_SIZE)
    batch_size_defaulted: bool = dataclasses.field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def positive(name, allow_zero=False):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (v == 0 and not allow_zero):
                raise MQClientError(f"producer option {name} must be a {'non-negative' if allow_zero else 'positive'}"
                                    f" number, got {v!r}")
        if self.batch_size is None and isinstance(self.max_message_size, int):
            # the default: Kafka's batch.size, within max_message_size
            self.batch_size = min(DEFAULT_BATCH_SIZE, max(self.max_message_size, 0))
            self.batch_size_defaulted = True
        for n in ("send_msg_timeout_ms", "max_message_size", "poll_name_server_interval_ms",
                  "heartbeat_broker_interval_ms", "max_in_flight", "max_in_flight_per_queue", "max_pending_messages",
                  "connect_timeout_ms",
                  "default_topic_queue_nums", "delivery_timeout_ms"):
            positive(n)
        for n in ("retry_times_when_send_failed", "retry_times_when_send_async_failed",
                  "compress_msg_body_over_howmuch", "linger_ms", "batch_size"):
            positive(n, allow_zero=True)
        if not 0 <= self.compress_level <= 9:
            raise MQClientError(f"compress_level must be 0..9, got {self.compress_level}")
        if self.max_message_size > P.MAX_MESSAGE_SIZE - P.MAX_HEADER_SIZE:
            raise MQClientError(f"max_message_size {self.max_message_size} exceeds the wire limit "
                                f"{P.MAX_MESSAGE_SIZE - P.MAX_HEADER_SIZE}")
        if self.linger_ms > 0 and self.batch_size == 0:
            self.batch_size = DEFAULT_BATCH_SIZE
        if self.batch_size > self.max_message_size:
            raise MQClientError(f"batch_size {self.batch_size} exceeds max_message_size {self.max_message_size}")
        self.retry_response_codes = frozenset(int(c) for c in self.retry_response_codes)

    @property
    def batching(self) -> bool:
        return self.batch_size > 0


# -- message preparation (caller thread; rmq._core.client_msg does the per-message work in C) --------
_PREPARERS: dict = {}          # (max_message_size, compress over, level) -> MessagePreparer


def message_preparer(opts: ProducerOptions) -> MessagePreparer:
    """The :class:`rmq._core.client_msg.MessagePreparer` of ``opts``'s limits (shared, cached)."""
    key = (opts.max_message_size, opts.compress_msg_body_over_howmuch, opts.compress_level)
    mp = _PREPARERS.get(key)
    if mp is None:
        if len(_PREPARERS) >= 64:
            _PREPARERS.clear()
        mp = _PREPARERS[key] = MessagePreparer(Message, check_topic, MQClientError, int(ResponseCode.MESSAGE_ILLEGAL),
                                               opts.max_message_size, opts.compress_msg_body_over_howmuch,
                                               opts.compress_level)
    return mp


def prepare_message(msg: Message, opts: ProducerOptions) -> PreparedMessage:
    """Validate ``msg``, give it a ``UNIQ_KEY`` (kept if already set), compress a large body.

    Raises
    ------
    MQClientError
        Bad topic, empty body or body over ``max_message_size`` (code MESSAGE_ILLEGAL).
    """
    return message_preparer(opts).prepare(msg)


def prepare_batch(msgs: Iterable[Message], opts: ProducerOptions) -> list:
    """Validate a user batch: one topic, no delay level, total body within ``max_message_size``.
    Bodies are not compressed (as RocketMQ).  A refused batch is left as given.

    Raises
    ------
    MQClientError
    """
    return message_preparer(opts).prepare_batch(msgs)


# -- queue selectors (ordered messages) ----------------------------------------------------------------
def many_keys(n: int, sharding_key: Any, sharding_keys: Optional[Sequence]) -> Optional[list]:
    """send_async_many's sharding keys: one per message, or None (all unordered).

    Raises
    ------
    MQClientError
        Both arguments given, or not one key per message.
    """
    if sharding_key is not None and sharding_keys is not None:
        raise MQClientError("pass either sharding_key or sharding_keys, not both")
    if sharding_keys is not None:
        keys = list(sharding_keys)
        if len(keys) != n:
            raise MQClientError(f"sharding_keys has {len(keys)} keys for {n} messages")
        return keys
    return [sharding_key] * n if sharding_key is not None else None


def prepare_many(preparer: MessagePreparer, msgs: list, keys: Optional[list]) -> list:
    """Every message of a send_async_many call prepared (a message with a key gets the
    ``__SHARDINGKEY`` property first, as :func:`selector_for` gives it), or none (in C:
    ``MessagePreparer.prepare_many``).

    Raises
    ------
    MQClientError
        The first invalid message, naming its position; the sharding-key properties set
        so far are taken back.
    """
    return preparer.prepare_many(msgs, keys, PROPERTY_SHARDING_KEY)


def column_list(name: str, col: Any, n: Optional[int] = None) -> list:
    """``col``, a sequence with one item per message (``n`` of them when given), as a list.

    Raises
    ------
    MQClientError
        ``col`` is one str / bytes value rather than a column, is not iterable, or has not ``n`` items.
    """
    if type(col) is not list:
        if isinstance(col, (bytes, bytearray, str)):
            raise MQClientError(f"{name} must be a sequence with one item per message, got {type(col).__name__}")
        try:
            col = list(col)
        except TypeError:
            raise MQClientError(f"{name} must be a sequence with one item per message, "
                                f"got {type(col).__name__}") from None
    if n is not None and len(col) != n:
        raise MQClientError(f"{name} has {len(col)} items for {n} messages")
    return col


def encode_columns(preparer: MessagePreparer, topic: str, bodies: Any, tags: Any, keys: Any, properties: Any,
                   sharding_key: Any, sharding_keys: Any, batch_size: int) -> tuple:
    """send_async_columns' rows straight into request bodies: ``(n, [RowsPart])`` (in C:
    ``rmq._core.client_msg.encode_rows``; rows of one sharding key share parts of up to
    ``batch_size`` bytes, in the order given).

    Raises
    ------
    MQClientError
        A column that is not one item per body, both sharding arguments, a bad topic, or the
        first bad row (naming its position): nothing is encoded.
    """
    if not isinstance(topic, str):
        raise MQClientError(f"topic must be a str, got {type(topic).__name__}")
    bodies = column_list("bodies", bodies)
    n = len(bodies)
    cols = [None if c is None else column_list(name, c, n)
            for name, c in (("tags", tags), ("keys", keys), ("properties", properties))]
    skeys = many_keys(n, sharding_key, None if sharding_keys is None else column_list("sharding_keys", sharding_keys))
    return n, encode_rows(preparer, topic, bodies, cols[0], cols[1], cols[2], skeys, PROPERTY_SHARDING_KEY,
                          batch_size, _part_key)


def many_request_size(opts: ProducerOptions, columns: bool = False, limit: int = 0) -> int:
    """The bytes of one send_async_many (or, ``columns``, send_async_columns) request, within
    ``limit`` (bytes; 0: none): the largest batch a broker that refused one takes (the producer's
    learned limit, :func:`refused_batch_limit`).

    With ``batch_size`` left to its default: ``MANY_REQUEST_SIZE`` (256 KiB), within
    ``max_message_size`` (the broker's bound on a batch body, as RocketMQ's: a whole batch of up
    to maxMessageSize goes as one request) -- the messages are all handed over at once, so 64 KiB
    requests would only cost round trips.  A ``batch_size`` the user gave is kept (a broker with
    a small maxMessageSize, or small requests wanted); 0 (batching off) is one message per
    send_async_many request, and MANY_REQUEST_SIZE for columns (they always go as batches)."""
    if opts.batch_size_defaulted or (columns and not opts.batch_size):
        size = min(max(opts.batch_size, MANY_REQUEST_SIZE), opts.max_message_size)
    else:
        size = opts.batch_size
    return min(size, limit) if limit and size else size


def refused_batch_limit(resp: Frame, nbytes: int, n: int) -> int:
    """The largest batch body (bytes) the broker takes, when ``resp`` refused a batch of ``n``
    messages and ``nbytes`` body bytes as too large to store whole (over its maxMessageSize, or
    more than one CommitLog file holds) and the batch can be split (``n`` > 1); 0 otherwise: the
    refusal stands (field: :data:`rmq.common.request_header.MAX_BATCH_BYTES_FIELD`)."""
    if resp.code != ResponseCode.MESSAGE_ILLEGAL or n < 2:
        return 0
    limit = resp.fields.get(MAX_BATCH_BYTES_FIELD)
    if type(limit) is not int or not 0 < limit < nbytes:
        return 0
    return limit


def split_by_size(sizes: Sequence[int], limit: int) -> list:
    """Consecutive index ranges ``[(a, b)]`` covering ``sizes`` in order, each summing to at most
    ``limit`` bytes; an item over ``limit`` is a range of its own (the broker judges it alone)."""
    out: list = []
    a = total = 0
    for i, n in enumerate(sizes):
        if i > a and total + n > limit:
            out.append((a, i))
            a, total = i, 0
        total += n
    if len(sizes) > a:
        out.append((a, len(sizes)))
    return out


def row_messages(topic: str, bodies: Sequence, tags: Optional[Sequence], keys: Optional[Sequence]) -> list:
    """The :class:`Message` of each send_async_columns row (body, tag, keys): what a traced call's
    Pub records describe (built only with message trace on)."""
    n = len(bodies)
    tags = tags if tags is not None else [None] * n
    keys = keys if keys is not None else [None] * n
    return [Message(topic, bodies[i], tags=tags[i], keys=keys[i]) for i in range(n)]


def uniq_ids_of(preps) -> list:
    """The UNIQ_KEYs of a request's messages (PreparedMessages or a RowsPart)."""
    return preps.uniq_ids() if type(preps) is RowsPart else [p.uniq_id for p in preps]


def many_parts(preps: list, keys: Optional[list], batch_size: int) -> list:
    """Split one send_async_many call into the I/O thread's hand-overs: ``[[positions, preps,
    sharding key or None, bytes]]`` in the order each was opened (in C:
    ``rmq._core.client_msg.many_parts``).  Batchable messages of one topic and key share a
    part up to ``batch_size`` bytes (0: batching off, one message per part); every other
    message is a part of its own.  A key's parts keep the order given, so its messages do."""
    return _many_parts(preps, keys, batch_size, _part_key)


def _part_key(topic: str, key: Any) -> tuple:
    """many_parts' grouping of a sharding key that is not an open-batch key (_OPEN_KEYS): its
    java_hash, which picks its queue (the key itself may not be hashable)."""
    return (topic, None, java_hash(key))


def java_hash(value: Any) -> int:
    """Java ``hashCode`` of a str (SPEC.md §0.2) or an int (``Long.hashCode``): stable across processes,
    unlike Python's ``hash``."""
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, int):
        v = value & 0xFFFFFFFFFFFFFFFF
        h = (v ^ (v >> 32)) & 0xFFFFFFFF
        return h - (1 << 32) if h >= 1 << 31 else h
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    return tags_string_to_tags_code(str(value))


def select_by_hash(mqs: list, msg: Message, arg: Any) -> MessageQueue:
    """RocketMQ ``SelectMessageQueueByHash``: ``abs(arg.hashCode() % len(mqs))``."""
    return mqs[abs(java_hash(arg)) % len(mqs)]


def select_by_random(mqs: list, msg: Message, arg: Any) -> MessageQueue:
    """RocketMQ ``SelectMessageQueueByRandom``."""
    return random.choice(mqs)


# -- wire helpers (shared with rmq.aio) --------------------------------------------------------------
def send_request(preps: Sequence[PreparedMessage], queue_id: int, group: str, batch: bool,
                 oneway: bool = False, batch_body: Optional[bytes] = None,
                 default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS) -> Frame:
    """SEND_MESSAGE (one message) or SEND_BATCH_MESSAGE (``batch``) for ``preps``, to ``queue_id``
    (-1: the broker picks).  ``batch_body`` reuses an earlier :func:`encode_batch` of the same messages.
    ``preps`` may be a send_async_columns :class:`RowsPart`: its SEND_BATCH_MESSAGE, body encoded."""
    if type(preps) is RowsPart:
        h = SendMessageRequestHeader(group, preps.topic, queue_id, default_topic=CREATE_TOPIC_KEY,
                                     default_topic_queue_nums=default_topic_queue_nums, wait_store_msg_ok=True)
        return Frame(RequestCode.SEND_BATCH_MESSAGE, flag=P.FLAG_ONEWAY if oneway else 0, fields=h.to_fields(),
                     bodies=[preps.body])
    first = preps[0]
    h = SendMessageRequestHeader(group, first.msg.topic, queue_id, default_topic=CREATE_TOPIC_KEY,
                                 default_topic_queue_nums=default_topic_queue_nums,
                                 wait_store_msg_ok=all(p.wait for p in preps))
    if batch:
        body = batch_body if batch_body is not None else batch_body_of(preps)
        code = RequestCode.SEND_BATCH_MESSAGE
    else:
        h.sys_flag, h.flag, h.properties = first.sys_flag, first.msg.flag, first.msg.properties
        body = first.body
        code = RequestCode.SEND_MESSAGE
    return Frame(code, flag=P.FLAG_ONEWAY if oneway else 0, fields=h.to_fields(), bodies=[body])


def batch_body_of(preps: Sequence[PreparedMessage]) -> bytes:
    """The SEND_BATCH_MESSAGE body (SPEC.md §1.11) of ``preps``."""
    return batch_body(preps if type(preps) is list else list(preps))


def send_response_fields(resp: Frame, topic: str, broker_name: str, broker_addr: str, n: int) -> tuple:
    """(status, MessageQueue, base queue offset, [offset msg id per message]) of a send answer
    for ``n`` messages.

    Raises
    ------
    MQBrokerError
        The broker answered an error code (``response_code``, ``broker_addr`` set).
    """
    status = SEND_STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise MQBrokerError(f"{resp.remark or 'error'} (broker {broker_name} at {broker_addr}, topic {topic})",
                            resp.code, broker_addr)
    f = resp.fields
    queue_id = f.get("queueId")
    base = f.get("queueOffset")
    if not isinstance(queue_id, int) or not isinstance(base, int):
        raise MQBrokerError(f"malformed send response from {broker_addr}: queueId={queue_id!r} "
                            f"queueOffset={base!r}", int(ResponseCode.SYSTEM_ERROR), broker_addr)
    offset_ids = send_response_msg_id(f, resp.bodies).split(",")
    if len(offset_ids) != n:
        offset_ids = [offset_ids[0] if n == 1 else ""] * n
    return status, MessageQueue(topic, broker_name, queue_id), base, offset_ids


def parse_send_response(resp: Frame, topic: str, broker_name: str, broker_addr: str,
                        preps: Sequence[PreparedMessage]):
    """One :class:`SendResult` per message of the request (queue offset = base + index); for a
    send_async_columns :class:`RowsPart`, its one record (:func:`send_response_fields`).

    Raises
    ------
    MQBrokerError
        The broker answered an error code (``response_code``, ``broker_addr`` set).
    """
    if type(preps) is RowsPart:
        return send_response_fields(resp, topic, broker_name, broker_addr, len(preps))
    preps = preps if type(preps) is list else list(preps)
    status, mq, base, offset_ids = send_response_fields(resp, topic, broker_name, broker_addr, len(preps))
    return complete_send_batch(None, SendResult, status, preps, mq, base, offset_ids)


def merge_results(results: list) -> SendResult:
    """The single SendResult of a user batch: comma-joined ids, the first queue offset."""
    first = results[0]
    if len(results) == 1:
        return first
    return SendResult(first.status, ",".join(r.msg_id for r in results), first.message_queue, first.queue_offset,
                      ",".join(r.offset_msg_id for r in results))


def queued_failures_error(group: str, n: int, first: BaseException) -> MQClientError:
    """What close() raises when ``n`` messages queued before it then failed (``first``: the
    first failure, also the cause)."""
    err = MQClientError(f"{n} message(s) queued before close() of producer {group} could not be "
                        f"sent; first error: {first}")
    err.__cause__ = first
    return err


SHARD_QUEUES_MAX = 65_536              # sharding keys whose queue a ShardQueues remembers
_OPEN_KEYS = (str, int, bytes)        # sharding keys a caller-side batch is keyed by (hashable, and equal only
                                      # when java_hash is: 1 and "1" are two keys, as their queues may differ)


class ShardQueues:
    """Each sharding key's queue under a topic's current route, remembered: select_by_hash's
    answer per (topic, key) while the topic's TopicPublishInfo is the same object (a new route
    is a new object, so a route change is seen at once).  Keys of the open-batch types (str,
    int, bytes; a bool is not one: ``True == 1`` but their hashCodes differ); at most
    SHARD_QUEUES_MAX entries (all forgotten past it).  No I/O; one event loop or thread."""
    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict = {}

    def select(self, info: TopicPublishInfo, msg: Message, key: Any) -> MessageQueue:
        """``apply_selector(select_by_hash, info, msg, key)``, remembered.  Raises as it."""
        if type(key) not in _OPEN_KEYS:
            return apply_selector(select_by_hash, info, msg, key)
        k = (info.topic, type(key), key)
        hit = self._queues.get(k)
        if hit is not None and hit[0] is info:
            return hit[1]
        mq = apply_selector(select_by_hash, info, msg, key)
        if len(self._queues) >= SHARD_QUEUES_MAX:
            self._queues.clear()
        self._queues[k] = (info, mq)
        return mq


def selector_for(selector: Optional[Selector], arg: Any, sharding_key: Any, msg: Message):
    """(selector, arg) for an ordered send, or (None, None)."""
    if sharding_key is not None:
        if selector is not None:
            raise MQClientError("pass either selector or sharding_key, not both")
        if isinstance(msg, Message):
            msg.properties[PROPERTY_SHARDING_KEY] = str(sharding_key)
        return select_by_hash, sharding_key
    if selector is not None and not callable(selector):
        raise MQClientError(f"selector must be callable(mqs, msg, arg), got {type(selector).__name__}")
    return selector, arg


def apply_selector(selector: Selector, info: TopicPublishInfo, msg: Message, arg: Any) -> MessageQueue:
    """Run a user selector over the writable queues.

    Raises
    ------
    MQClientError
        The topic has no route yet (ordered sends need an existing topic), or the
        selector failed or returned something that is not one of the queues.
    """
    if info.provisional or not info.message_queue_list:
        raise MQClientError(f"No route info of this topic: {info.topic}; ordered sends need the topic to "
                            f"exist (create it first, or send an unordered message to auto-create it)",
                            int(ResponseCode.TOPIC_NOT_EXIST))
    mqs = list(info.message_queue_list)
    try:
        mq = selector(mqs, msg, arg)
    except Exception as e:  # noqa: BLE001 - user code
        raise MQClientError(f"message queue selector failed: {type(e).__name__}: {e}") from e
    if not isinstance(mq, MessageQueue):
        raise MQClientError(f"message queue selector returned {mq!r}, not a MessageQueue")
    return mq


def client_id() -> str:
    """``ip@pid#n`` (RocketMQ's clientId is ip@instanceName)."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return f"{ip}@{os.getpid()}#{next(_CLIENT_SEQ)}"


_CLIENT_SEQ = itertools.count(1)


def heartbeat_request(client: str, group: str) -> Frame:
    return Frame(RequestCode.HEART_BEAT, flag=P.FLAG_ONEWAY, bodies=[P.pack_body(
        {"clientID": client, "producerDataSet": [{"groupName": group}], "consumerDataSet": []})])


# -- I/O thread ------------------------------------------------------------------------------------
SYNC, ASYNC, ONEWAY = 0, 1, 2


class QueueTurns:
    """Ordered sends' rule, for the thread and asyncio producers: at most ``limit`` requests out per
    queue (``max_in_flight_per_queue``, Kafka's ``max.in.flight.requests.per.connection``), the
    next ones held in order; when a turn passes, the held requests behind the next one that may
    share its SEND_BATCH_MESSAGE are joined to it, up to ``cap`` bytes (``batch_size``).

    No I/O: the producer calls :meth:`take` before it sends an ordered request and :meth:`end`
    when one has its outcome.  Everything that moves a turn is here: a request's ``queue_turn``
    attribute says whether it holds one.  ``held`` counts the requests that had to wait.  The
    producer gives the join its request type's rules: ``mergeable(req)``, ``size_of(req)`` (bytes)
    and ``combine(first, joined) -> req``; without ``combine`` nothing is joined."""

    __slots__ = ("limit", "held", "_turns", "cap", "mergeable", "size_of", "combine")

    def __init__(self, limit: int, cap: int = 0, mergeable: Optional[Callable[[Any], bool]] = None,
                 size_of: Optional[Callable[[Any], int]] = None,
                 combine: Optional[Callable[[Any, list], Any]] = None):
        self.limit = limit
        self.held = 0
        self._turns: dict = {}          # MessageQueue -> [requests out, deque of the requests held]
        self.cap, self.mergeable, self.size_of, self.combine = cap, mergeable, size_of, combine

    def __bool__(self) -> bool:
        return bool(self._turns)

    def busy(self, queue) -> bool:
        """Whether a request for ``queue`` would be held now (its batch may keep filling)."""
        t = self._turns.get(queue)
        return t is not None and (t[0] >= self.limit or bool(t[1]))

    def take(self, queue, req) -> bool:
        """True: ``req`` may go now (it holds one of ``queue``'s turns); False: it is held."""
        t = self._turns.get(queue)
        if t is None:
            self._turns[queue] = [1, collections.deque()]
        elif t[0] >= self.limit or t[1]:
            t[1].append(req)
            self.held += 1
            return False
        else:
            t[0] += 1
        req.queue_turn = True
        return True

    def end(self, queue, req):
        """``req`` of ``queue`` has its outcome: the held request that takes its turn (the ones behind
        it joined to it, :meth:`_join`), or None."""
        req.queue_turn = False
        t = self._turns.get(queue)
        if t is None:
            return None                 # cleared (the producer is closing)
        t[0] -= 1
        held = t[1]
        if held and t[0] < self.limit:
            nxt = self._join(held.popleft(), held)
            nxt.queue_turn = True
            t[0] += 1
            return nxt
        if t[0] <= 0 and not held:
            del self._turns[queue]
        return None

    def hold_first(self, queue, reqs: list) -> None:
        """``reqs`` go next for ``queue``, in order, ahead of everything held there: the parts of a
        request split while it held the queue's turn (the turn stays with its first part)."""
        t = self._turns.get(queue)
        if t is None or not reqs:
            return
        t[1].extendleft(reversed(reqs))
        self.held += len(reqs)

    def _join(self, first, held: collections.deque):
        if self.combine is None or not held or not self.mergeable(first):
            return first
        size = self.size_of(first)
        joined: list = []
        while held and self.mergeable(held[0]):
            more = self.size_of(held[0])
            if size + more > self.cap:
                break
            joined.append(held.popleft())
            size += more
        return self.combine(first, joined) if joined else first

    def clear(self) -> list:
        """Forget every turn; the requests that were held, in order (to fail them)."""
        out = [r for t in self._turns.values() for r in t[1]]
        self._turns.clear()
        return out


class _Pending:
    """What one caller handed over: one message, or a user batch (one future, one merged result)."""

    __slots__ = ("preps", "future", "mode", "deadline", "attempt_timeout", "selector", "arg", "queue", "whole",
                 "started", "futures", "nbytes", "open_key", "rows")

    def __init__(self, preps: list, future: Future, mode: int, deadline: float, attempt_timeout: float,
                 selector=None, arg=None, queue: Optional[MessageQueue] = None, whole: bool = False,
                 started: Optional[float] = None):
        self.preps = preps
        self.future = future
        self.mode = mode
        self.deadline = deadline          # time.monotonic() seconds: the send fails after this
        self.attempt_timeout = attempt_timeout  # seconds one attempt waits for the broker
        self.selector = selector
        self.arg = arg
        self.queue = queue
        self.whole = whole
        self.started = time.monotonic() if started is None else started
        # a caller-side batch (Producer.send_async's common case): one future per message, filled
        # by callers under the sender's lock until the I/O thread seals it (_Sender.open)
        self.futures: Optional[list] = None
        self.nbytes = 0
        self.open_key = None              # its key in _Sender.open: the topic, or (topic, sharding key)
        self.rows: Optional[RowsPart] = None   # send_async_columns: ``preps`` is this part (encoded already)

    @property
    def topic(self) -> str:
        return self.rows.topic if self.rows is not None else self.preps[0].msg.topic


class _Request(SendAttempts):
    """One request on the wire (a message, a user batch, or an accumulated batch); its attempts
    follow :class:`rmq.client.send_attempts.SendAttempts`."""

    __slots__ = ("items", "mode", "batch", "attempt_timeout", "opaque", "batch_body", "park_deadline", "preps",
                 "queue_turn", "split")

    def __init__(self, items: list, fixed: Optional[MessageQueue], opts: ProducerOptions):
        self.items = items
        first = items[0]
        self.mode = first.mode
        if first.rows is not None:        # a send_async_columns part: a request of its own
            self.preps = first.rows
            self.batch = True
        else:
            self.preps = [p for it in items for p in it.preps]
            self.batch = first.whole or len(self.preps) > 1
        if fixed is not None or self.mode == ONEWAY:
            max_attempts = 1
        elif self.mode == SYNC:
            max_attempts = 1 + opts.retry_times_when_send_failed
        else:
            max_attempts = 1 + opts.retry_times_when_send_async_failed
        SendAttempts.__init__(self, first.topic, len(self.preps), fixed, max_attempts,
                              min(it.started for it in items), min(it.deadline for it in items))
        self.attempt_timeout = min(it.attempt_timeout for it in items)
        self.opaque = 0
        self.batch_body: Optional[bytes] = first.rows.body if first.rows is not None else None
        self.park_deadline = 0.0
        self.queue_turn = False          # holds its fixed queue's turn (_Sender._pump): ordered sends
        self.split = False               # a part of a batch the broker refused as too large: never joined


def _mergeable(req: _Request) -> bool:
    """Whether ``req`` may share a SEND_BATCH_MESSAGE with its neighbours: send_async messages that
    can be batched (not a user batch, delayed, compressed or transactional one), never attempted."""
    return req.attempt == 0 and not req.split and all(it.mode == ASYNC and not it.whole and it.rows is None and it.preps[0].batchable
                                    for it in req.items)


def _pending_bytes(p: _Pending) -> int:
    """Bytes of one caller's hand-over that is not a user batch: a caller-side batch or one message."""
    return p.nbytes if p.nbytes else p.preps[0].size     # nbytes: a caller-side batch, a send_async_many part


def _request_bytes(req: _Request) -> int:
    """Bytes of a mergeable request (:func:`_mergeable`), item by item."""
    return sum(_pending_bytes(it) for it in req.items)


def _split_pending(it: _Pending, limit: int) -> list:
    """``it`` as hand-overs of at most ``limit`` bytes each, in order, each completing its own
    messages' futures (a caller-side batch's futures, a send_async_many part's or a
    send_async_columns part's sink, cut to its messages); ``[it]`` when it fits or is one message."""
    if _pending_bytes(it) <= limit or len(it.preps) < 2:
        return [it]
    if it.rows is not None:
        pieces = [(part, ColumnsPart(it.future.many, part.positions, part.uniq), None, part.nbytes)
                  for part in it.rows.split(limit)]
    else:
        sizes = [p.size for p in it.preps]
        pieces = []
        for a, b in split_by_size(sizes, limit):
            if it.futures is not None:
                sink, futures = None, it.futures[a:b]
            elif type(it.future) is ManyPart:
                sink, futures = ManyPart(it.future.many, it.future.positions[a:b]), None
            else:
                return [it]               # not a kind of hand-over that is split
            pieces.append((it.preps[a:b], sink, futures, sum(sizes[a:b])))
    out = []
    for preps, sink, futures, nbytes in pieces:
        p = _Pending(preps, sink, it.mode, it.deadline, it.attempt_timeout, it.selector, it.arg, it.queue,
                     False, it.started)
        p.futures = futures
        p.nbytes = nbytes
        if it.rows is not None:
            p.rows = preps
        out.append(p)
    return out


class _Accumulator:
    __slots__ = ("items", "nbytes", "created")

    def __init__(self, now: float):
        self.items: list = []
        self.nbytes = 0
        self.created = now


class _Conn:
    """A DEALER to one broker address (owned by the I/O thread)."""

    __slots__ = ("addr", "sock", "monitor", "parked", "need_heartbeat", "pollout")

    def __init__(self, addr: str, sock: zmq.Socket, monitor: Optional[zmq.Socket]):
        self.addr = addr
        self.sock = sock
        self.monitor = monitor
        self.parked: collections.deque = collections.deque()
        self.need_heartbeat = True
        self.pollout = False


def _socket(ctx: zmq.Context, immediate: bool) -> zmq.Socket:
    s = P.dealer(ctx)
    s.setsockopt(zmq.SNDHWM, 10_000)
    s.setsockopt(zmq.RCVHWM, 10_000)
    if immediate:
        s.setsockopt(zmq.IMMEDIATE, 1)
    return s


class _Sender(threading.Thread):
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
        self._sends: collections.deque = collections.deque()    # _Pending
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
        self._conns: dict = {}            # addr -> _Conn
        self._by_sock: dict = {}          # socket -> handler
        self._ns: list = []               # DEALERs to the NameServers
        self._ns_next = 0
        self._ns_pending: dict = {}       # opaque -> (deadline, ns index, tries, frame, step of its call)
        self._routes = PublishRoutes(self.route_cache)   # per-topic look-up state (sans I/O, shared rules)
        self._resolving: set = set()      # topics with a publish_info_call out for their waiters
        self._route_waiters: dict = {}    # topic -> [_Pending]
        self._route_queries: dict = {}    # topic -> [Future of TopicPublishInfo] (fetch_publish_message_queues)
        self._pub: dict = {}              # topic -> TopicPublishInfo: lock-free copy of the cache's, reset on change
        self._discovering = False         # a GET_BROKER_CLUSTER_INFO of discover_brokers is out
        self._inflight: dict = {}         # opaque -> _Request
        self._parked_n = 0
        self._timeouts: list = []         # heap (deadline, opaque): stale entries are skipped, and hold
                                          # no request (a finished request must not stay alive until then)
        self._ready: collections.deque = collections.deque()
        self._accs: dict = {}             # (topic, fixed MessageQueue or None) -> _Accumulator
        # ordered sends (a fixed queue): max_in_flight_per_queue requests out per queue, the next held
        # (the held ones joined up to batch_size when a turn passes: _request_bytes, _Request)
        # bytes of a batch: the option, lowered to the largest batch a broker takes once one refused
        # a batch as too large (_split); callers read it under ``lock``
        self.batch_size = opts.batch_size
        self.batch_limit = 0              # the lowest such size a broker answered with (bytes; 0: none)
        self._queue_turns = QueueTurns(opts.max_in_flight_per_queue, opts.batch_size, _mergeable, _request_bytes,
                                       lambda first, joined: _Request(
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

    def submit(self, pending: _Pending) -> None:
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
                s = _socket(self._ctx, immediate=False)
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
    def _complete(self, pending: _Pending, result: Any) -> None:
        self._done += len(pending.preps)
        self.stats["messages"] += len(pending.preps)
        try:
            pending.future.set_result(result)
        except Exception:  # noqa: BLE001 - InvalidStateError: nothing to deliver to
            pass

    def _complete_each(self, pending: _Pending, results: Optional[list]) -> None:
        """A caller-side batch: message ``i``'s future gets ``results[i]`` (None: one-way)."""
        n = len(pending.preps)
        self._done += n
        self.stats["messages"] += n
        for i, f in enumerate(pending.futures):
            try:
                f.set_result(results[i] if results is not None else None)
            except Exception:  # noqa: BLE001
                pass

    def _fail(self, pending: _Pending, exc: BaseException) -> None:
        self._done += len(pending.preps)
        self.stats["failed_messages"] += len(pending.preps)
        if pending.mode == ASYNC and self.record_failures:
            self.failures.append((pending, exc))
        for f in (pending.futures if pending.futures is not None else (pending.future,)):
            try:
                f.set_exception(exc)
            except Exception:  # noqa: BLE001
                pass

    def _fail_request(self, req: _Request, exc: BaseException) -> None:
        for it in req.items:
            self._fail(it, exc)
        if req.queue_turn:
            self._end_turn(req)

    # -- accepting messages -------------------------------------------------------------------
    def _accept(self, pending: _Pending) -> None:
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

    def _place(self, pending: _Pending, info: TopicPublishInfo) -> None:
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
            size = _pending_bytes(pending)
            acc = self._accs.get(key)
            if acc is not None and acc.items and acc.nbytes + size > self.batch_size:
                self._ship(key, acc)
                acc = None
            if acc is None:
                acc = self._accs[key] = _Accumulator(time.monotonic())
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
        self._ready.append(_Request([pending], fixed, self.opts))

    def _ship(self, key: tuple, acc: _Accumulator) -> None:
        del self._accs[key]
        self._ready.append(_Request(acc.items, key[1], self.opts))

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

    def _end_turn(self, req: _Request) -> None:
        """``req`` (an ordered send) has its outcome: the next request held for its queue goes next,
        with the small batches held behind it (QueueTurns joins them up to ``batch_size``: the
        user's bound; a batch must also fit in one of the broker's CommitLog files)."""
        nxt = self._queue_turns.end(req.fixed, req)
        if nxt is not None:
            self._ready.appendleft(nxt)

    def _attempt(self, req: _Request) -> None:
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

    def _sent(self, req: _Request, now: float) -> None:
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

    def _try_send(self, conn: _Conn, parts: list) -> bool:
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

    def _set_pollout(self, conn: _Conn, on: bool) -> None:
        if conn.pollout != on:
            conn.pollout = on
            self._poller.modify(conn.sock, zmq.POLLIN | (zmq.POLLOUT if on else 0))

    def _flush_parked(self, conn: _Conn) -> None:
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

    def _conn(self, addr: str) -> _Conn:
        conn = self._conns.get(addr)
        if conn is None:
            s = _socket(self._ctx, immediate=True)
            mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            s.connect(f"tcp://{addr}")
            conn = self._conns[addr] = _Conn(addr, s, mon)
            self._register(s, lambda sock, ev, c=conn: self._on_broker_readable(c, ev))
            self._register(mon, lambda sock, ev, c=conn: self._on_monitor(c))
        return conn

    def _register(self, sock: zmq.Socket, handler: Callable) -> None:
        self._by_sock[sock] = handler
        self._poller.register(sock, zmq.POLLIN)

    # -- responses ------------------------------------------------------------------------------
    def _on_broker_readable(self, conn: _Conn, ev: int) -> None:
        if ev & zmq.POLLIN:
            self._drain_broker(conn)
        if ev & zmq.POLLOUT and conn.parked:
            self._flush_parked(conn)

    def _drain_broker(self, conn: _Conn, limit: int = 4096) -> None:
        for _ in range(limit):
            try:
                parts = recv_parts(conn.sock)
            except zmq.Again:
                return
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

    def _on_response(self, req: _Request, resp: Frame) -> None:
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
            elif it.whole and n > 1:              # a user batch: one result, ids comma-joined
                self._complete(it, SendResult(status, ",".join([p.uniq_id for p in it.preps]), answered_mq,
                                              base + i, ",".join(offset_ids[i:i + n])))
            else:
                part = complete_send_batch(None, SendResult, status, it.preps, answered_mq, base + i, offset_ids[i:i + n])
                if type(it.future) is ManyPart:  # a part of send_async_many: its results in one call
                    self._complete(it, part)
                else:
                    self._complete(it, merge_results(part) if it.whole else part[0])
            i += n
        if req.queue_turn:
            self._end_turn(req)
        info = self.route_cache.publish_info(req.topic)
        if info is not None and self._routes.refresh_after_send(info, now):
            self._fetch_route(req.topic)

    def _split(self, req: _Request, limit: int) -> bool:
        """The broker refused ``req``'s batch as too large to store whole, taking at most ``limit``
        bytes (``refused_batch_limit``): send its messages again as parts that fit (Kafka's split of a batch refused as MESSAGE_TOO_LARGE),
        in order, ahead of what waits; an ordered request's parts keep its queue's turn, one
        after the other.  Later batches of this producer are made to fit (``batch_size``).  False
        (the refusal stands): a user batch (``send_batch``), stored whole or not at all."""
        if any(it.whole for it in req.items):
            return False
        items: list = []
        for it in req.items:
            items.extend(_split_pending(it, limit))
        groups: list = []
        group: list = []
        size = 0
        for it in items:
            n = _pending_bytes(it)
            if group and (it.rows is not None or group[0].rows is not None or size + n > limit):
                groups.append(group)      # a send_async_columns part is a request of its own
                group, size = [], 0
            group.append(it)
            size += n
        groups.append(group)
        parts = [_Request(g, req.fixed, self.opts) for g in groups]
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

    def _on_monitor(self, conn: _Conn) -> None:
        disconnected = connected = False
        while True:
            try:
                msg = conn.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                event = parse_monitor_message(msg)["event"]
            except Exception:  # noqa: BLE001 - malformed monitor frame: ignore
                continue
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

    def _retry_or_fail(self, req: _Request, exc: BaseException, now: float) -> None:
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
                    f"{self.opts.send_msg_timeout_ms} ms"))

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
        fails (no answer in ``send_msg_timeout_ms``, send queue full).  ``step(answer, False)`` gets
        the answer Frame, ``step(error, True)`` the last error once every NameServer failed."""
        idx = (self._ns_next + tries) % len(self._ns)
        frame.opaque = next(self._opaque)
        deadline = time.monotonic() + self.opts.send_msg_timeout_ms / 1000.0
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
        ``batch_size=0`` sends one SEND_MESSAGE per message (RocketMQ's ``sendAsync``).
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
        self._sender = _Sender(self.namesrv_addrs, group, self.client_id, self.options)
        self._sender.client_auth = security.client_auth(auth)   # CURVE keys; None: environment / plain
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

    # -- message trace ---------------------------------------------------------------------------
    def _trace_sent(self, msgs: list, result: SendResult, t0: float, ordered: bool = False) -> None:
        cost = int((time.monotonic() - t0) * 1000)
        if len(msgs) == 1:
            self._trace.append_pub(msgs[0], result, cost, self.client_id, ordered)
            return
        ids, offs = result.msg_id.split(","), result.offset_msg_id.split(",")
        for i, m in enumerate(msgs):
            one = dataclasses.replace(result, msg_id=ids[i] if i < len(ids) else "",
                                      offset_msg_id=offs[i] if i < len(offs) else "")
            self._trace.append_pub(m, one, cost, self.client_id, ordered)

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
        if selector is None and queue is None and timeout_ms is None and self._plain and not _lt.ENABLED:
            if sharding_key is None:                    # the common case, with the fewest steps
                prep = self._prepare(msg)
                if prep.batchable:
                    return self._append_async(prep, callback, None)
                return self._enqueue([prep], ASYNC, None, None, None, None, callback=callback)
            if type(sharding_key) in _OPEN_KEYS:
                sel, arg = selector_for(None, None, sharding_key, msg)
                prep = self._prepare(msg)
                if prep.batchable:
                    return self._append_async(prep, callback, sharding_key)
                return self._enqueue([prep], ASYNC, None, sel, arg, None, callback=callback)
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = self._prepare(msg)
        if self._trace is not None:
            callback = self._traced_callback(callback, [prep.msg], sel is not None)
        return self._enqueue([prep], ASYNC, timeout_ms, sel, arg, queue, callback=callback)

    def _append_async(self, prep: PreparedMessage, callback: Optional[Callable[[Future], Any]],
                      sharding_key: Any = None) -> Future:
        """send_async's common case (batching on, no selector, queue, timeout or trace): the
        message joins the caller-side batch of its topic, or of its topic and sharding key
        (Kafka's RecordAccumulator.append, done in the caller's thread); the I/O thread takes the
        batch whole, and sends a sharding key's batch to the key's queue (select_by_hash) in the
        order the batches were opened.  A batch is opened (and the I/O thread woken) when there
        is none open or the open one would pass ``batch_size``."""
        s = self._sender
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
                p = _Pending([], None, ASYNC, now + self._delivery_timeout_s, self._attempt_timeout_s,
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
                    if key is not None and s.open and type(key) in _OPEN_KEYS:
                        # seal send_async's open batch of this key: these messages go after it
                        s.open.pop((topic, key), None)
            except MQClientError as e:
                if k == 0:
                    raise
                for rest in parts[k:]:
                    (many.part(rest.positions, rest.uniq) if rows else many.part(rest[0])).set_exception(e)
                return
            p = _Pending(preps, many.part(part.positions, part.uniq) if rows else many.part(positions), ASYNC,
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
        preps = prepare_batch(msgs, self.options)
        t0 = time.monotonic() if self._trace is not None else 0.0
        fut = self._enqueue(preps, SYNC, timeout_ms, None, None, queue, whole=True)
        result = self._wait(fut, timeout_ms)
        if self._trace is not None:
            self._trace_sent([p.msg for p in preps], result, t0)
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
        s.submit(_Pending(preps, fut, mode, deadline, budget_ms / 1000.0, selector, arg, queue, whole, now))
        return fut

    def _wait(self, fut: Future, timeout_ms: Optional[int]) -> Any:
        budget = (timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms) / 1000.0
        try:
            return fut.result(budget + 5.0)
        except FutureTimeoutError:
            raise RemotingTimeoutError(f"no result within {budget * 1000:.0f} ms (+5 s grace): "
                                       f"is the producer's I/O thread blocked by a callback?") from None


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _finalize(sender: _Sender, direct: DirectSender) -> None:
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
