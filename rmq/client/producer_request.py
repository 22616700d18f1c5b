"""What both producers (:class:`rmq.Producer` and :class:`rmq.aio.Producer`) do to a message
before and after the wire, without I/O: the defaults (SPEC.md §15.1, DefaultMQProducer) and
:class:`ProducerOptions`, message preparation (validation, unique id, compression; the
per-message work in C, ``rmq._core.client_msg``), queue selectors and sharding keys, the
SEND_MESSAGE / SEND_BATCH_MESSAGE request and its response.

State: none but the preparers' cache (one MessagePreparer per size and compression setting) and
each :class:`ShardQueues` (a producer's sharding key -> queue memo).  Thread: any (the callers').
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import random
import socket
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from rmq import protocol as P
from rmq._core.client_msg import (MessagePreparer, PreparedMessage, RowsPart, UserBatch, all_wait, batch_body,
                                  complete_send_batch, encode_rows, join_uniq_ids)
from rmq._core.client_msg import many_parts as _many_parts
from rmq._core.commitlog import tags_string_to_tags_code
from rmq.client.message import PROPERTY_SHARDING_KEY, Message, MessageQueue, SendResult, SendStatus
from rmq.client.route import ISOLATION_LATENCY_MS_49, LATENCY_MAX_49, NOT_AVAILABLE_DURATION_49, TopicPublishInfo
from rmq.errors import MQBrokerError, MQClientError
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.common.mix_all import DEFAULT_TOPIC_QUEUE_NUMS
from rmq.common.request_header import MAX_BATCH_BYTES_FIELD, SendMessageRequestHeader, send_response_msg_id
from rmq.common.topic_validator import AUTO_CREATE_TOPIC_KEY_TOPIC as CREATE_TOPIC_KEY
from rmq.common.topic_validator import check_topic   # pure functions: the client never touches files


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
# DefaultMQProducer.retryResponseCodes of RocketMQ 5 (4.9's set, SPEC.md's, plus SYSTEM_BUSY; GO_AWAY is
# a code rmq's broker never sends).  SYSTEM_BUSY is what the broker answers a send it shed unstored
# (waited > waitTimeMillsInSendQueue, or refused at once): retrying it stores nothing twice, and a
# broker stalled a few hundred ms (disk pressure) no longer fails the sends queued meanwhile.
RETRY_RESPONSE_CODES = frozenset({
    int(ResponseCode.TOPIC_NOT_EXIST), int(ResponseCode.SERVICE_NOT_AVAILABLE), int(ResponseCode.SYSTEM_ERROR),
    int(ResponseCode.SYSTEM_BUSY), int(ResponseCode.NO_PERMISSION), NO_BUYER_ID, NOT_IN_CURRENT_UNIT})
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


def encode_user_batch(msgs: Iterable[Message], opts: ProducerOptions) -> UserBatch:
    """:func:`prepare_batch`'s checks, and the batch's SEND_BATCH_MESSAGE body and comma-joined
    UNIQ_KEYs made in one pass, without an object per message (``Producer.send_batch``'s
    direct path; ``rmq._core.client_msg.MessagePreparer.encode_user_batch``).

    Raises
    ------
    MQClientError
        As :func:`prepare_batch`, or a message's properties over 32,767 bytes encoded.
    """
    return message_preparer(opts).encode_user_batch(msgs)


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
    """The bytes of one send_async_many (or, ``columns``, send_async_columns) request, and of one
    request joined from an ordered queue's held batches (``rmq.client.message_accumulator.QueueTurns.cap``), within
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
    """many_parts' grouping of a sharding key that is not an open-batch key (OPEN_KEY_TYPES): its
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
    ``preps`` may be a send_async_columns :class:`RowsPart` or a user batch's :class:`UserBatch`:
    its SEND_BATCH_MESSAGE, body encoded."""
    if type(preps) is UserBatch:
        h = SendMessageRequestHeader(group, preps.topic, queue_id, default_topic=CREATE_TOPIC_KEY,
                                     default_topic_queue_nums=default_topic_queue_nums, wait_store_msg_ok=preps.wait)
        return Frame(RequestCode.SEND_BATCH_MESSAGE, flag=P.FLAG_ONEWAY if oneway else 0, fields=h.to_fields(),
                     bodies=[preps.body])
    if type(preps) is RowsPart:
        h = SendMessageRequestHeader(group, preps.topic, queue_id, default_topic=CREATE_TOPIC_KEY,
                                     default_topic_queue_nums=default_topic_queue_nums, wait_store_msg_ok=True)
        return Frame(RequestCode.SEND_BATCH_MESSAGE, flag=P.FLAG_ONEWAY if oneway else 0, fields=h.to_fields(),
                     bodies=[preps.body])
    first = preps[0]
    h = SendMessageRequestHeader(group, first.msg.topic, queue_id, default_topic=CREATE_TOPIC_KEY,
                                 default_topic_queue_nums=default_topic_queue_nums,
                                 wait_store_msg_ok=all_wait(preps))
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
    status, mq, base, joined = _send_response_head(resp, topic, broker_name, broker_addr)
    return status, mq, base, _offset_ids(joined, n)


def _offset_ids(joined: str, n: int) -> list:
    """The ``n`` offset msg ids of an answer's comma-joined msgId: an answer with another count
    gives its first id to a single message, and "" to each of several."""
    offset_ids = joined.split(",")
    if len(offset_ids) != n:
        offset_ids = [offset_ids[0] if n == 1 else ""] * n
    return offset_ids


def _send_response_head(resp: Frame, topic: str, broker_name: str, broker_addr: str) -> tuple:
    """(status, MessageQueue, base queue offset, the answer's msgId: its messages' offset msg ids
    comma-joined) of a send answer (see :func:`send_response_fields`)."""
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
    return status, MessageQueue(topic, broker_name, queue_id), base, send_response_msg_id(f, resp.bodies)


def user_batch_result(resp: Frame, topic: str, broker_name: str, broker_addr: str, preps) -> SendResult:
    """The one SendResult of a user batch's answer (``send_batch``; ``preps`` its PreparedMessages
    or its :class:`UserBatch`), as :func:`batch_send_result` gives it, without a string per
    message: the answer's comma-joined offset msg ids are kept as they came when there is one per
    message (any other answer goes the general way), the UNIQ_KEYs joined in C (``join_uniq_ids``,
    or the UserBatch's own).

    Raises
    ------
    MQBrokerError
        As :func:`send_response_fields`.
    """
    status, mq, base, joined = _send_response_head(resp, topic, broker_name, broker_addr)
    n = len(preps)
    if type(preps) is UserBatch:                      # its UNIQ_KEYs joined already
        if joined.count(",") != n - 1:
            joined = ",".join(_offset_ids(joined, n))
        return SendResult(status, preps.uniq_ids, mq, base, joined)
    if n > 1 and joined.count(",") == n - 1:          # one offset msg id per message, as sent
        return SendResult(status, join_uniq_ids(preps if type(preps) is list else list(preps)), mq, base, joined)
    return batch_send_result(status, mq, base, preps, _offset_ids(joined, n))


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


def batch_send_result(status, mq: MessageQueue, base: int, preps: Sequence[PreparedMessage],
                      offset_ids: Sequence[str]) -> SendResult:
    """The one SendResult of a user batch's answer (``send_batch``): ``msg_id`` and
    ``offset_msg_id`` comma-joined in the batch's order, the first message's queue offset; no
    result object per message.  (``status``, ``mq``, ``base``, ``offset_ids``: what
    :func:`send_response_fields` reads from the answer.)"""
    if len(preps) == 1:
        return SendResult(status, preps[0].uniq_id, mq, base, offset_ids[0])
    return SendResult(status, ",".join([p.uniq_id for p in preps]), mq, base, ",".join(offset_ids))


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
OPEN_KEY_TYPES = (str, int, bytes)        # sharding keys a caller-side batch is keyed by (hashable, and equal only
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
        if type(key) not in OPEN_KEY_TYPES:
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
