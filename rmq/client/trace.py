"""Message trace: RocketMQ's trace records, written off the send / consume path to a trace topic.

Format: RocketMQ's ``TraceDataEncoder`` (client/trace): a trace message's body is one or more
records, each ended by ``\\x02`` (FIELD_SPLITOR), fields separated by ``\\x01``
(CONTENT_SPLITOR); its KEYS are the traced messages' ids and keys, so the trace topic's IndexFile
finds them by message id.  Record layouts (field order as RocketMQ's encoder writes them):

* ``Pub``: type, timestamp (ms), regionId, groupName, topic, msgId, tags, keys, storeHost,
  bodyLength, costTime (ms), msgType (ordinal), offsetMsgId, success[, clientHost];
* ``SubBefore``: type, timestamp, regionId, groupName, requestId, msgId, retryTimes, keys
  [, clientId: rmq's extension, ignored by RocketMQ's decoder];
* ``SubAfter``: type, requestId, msgId, costTime, success, keys, contextCode, timestamp, groupName;
* ``EndTransaction``: type, timestamp, regionId, groupName, topic, msgId, tags, keys, storeHost,
  msgType, transactionId, transactionState, fromTransactionCheck.

:class:`TraceDispatcher` is RocketMQ's AsyncTraceDispatcher: a bounded queue
(:data:`TRACE_QUEUE_SIZE`; when full, records are dropped and counted, never blocking the caller)
drained by one thread that packs records into trace messages of at most
:data:`MAX_TRACE_MESSAGE_BYTES` and sends them with its own producer (group
``_INNER_TRACE_PRODUCER-<group>``) to ``RMQ_SYS_TRACE_TOPIC`` or the topic the user names.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Optional

from rmq.common.topic_validator import RMQ_SYS_TRACE_TOPIC as TRACE_TOPIC    # the default trace topic

log = logging.getLogger(__name__)

__all__ = ["TRACE_TOPIC", "TraceType", "MessageType", "TraceBean", "TraceContext", "encode", "decode",
           "trace_keys", "TraceDispatcher", "MAX_TRACE_MESSAGE_BYTES", "TRACE_QUEUE_SIZE", "TRACE_BATCH_NUM"]

CONTENT_SPLITOR = "\x01"                              # TraceConstants
FIELD_SPLITOR = "\x02"
TRACE_PRODUCER_GROUP_PREFIX = "_INNER_TRACE_PRODUCER"  # TraceConstants.GROUP_NAME_PREFIX
#: Largest trace message body, bytes (AsyncTraceDispatcher.maxMsgSize).
MAX_TRACE_MESSAGE_BYTES = 128_000
#: Most bytes of keys one trace message carries (its KEYS property; a message's properties must stay
#: under 32 KiB, SPEC.md §1.6): a trace message is cut before its keys would pass this.
MAX_TRACE_KEYS_BYTES = 16_000
#: Records waiting to be sent; more are dropped (RocketMQ's AsyncTraceDispatcher keeps 2048; a
#: Python producer's bursts of send_async outrun one dispatcher turn, so more are kept here).
TRACE_QUEUE_SIZE = 20_000
#: Records the dispatcher takes per turn at most (packed into trace messages of at most
#: MAX_TRACE_MESSAGE_BYTES).
TRACE_BATCH_NUM = 512
#: How long the dispatcher waits for more records before sending what it has, ms
#: (AsyncTraceDispatcher.pollingTimeMil).
TRACE_POLL_MS = 100
DEFAULT_REGION = "DefaultRegion"


class TraceType(str, enum.Enum):
    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """RocketMQ's MessageType, by ordinal."""
    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3
    Order_Msg = 4


@dataclass
class TraceBean:
    topic: str = ""
    msg_id: str = ""
    offset_msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    client_host: str = ""
    retry_times: int = 0
    body_length: int = 0
    msg_type: MessageType = MessageType.Normal_Msg
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False


@dataclass
class TraceContext:
    """One trace record (RocketMQ's TraceContext with its one TraceBean)."""
    trace_type: TraceType
    timestamp: int = 0                  # ms since the epoch
    region_id: str = DEFAULT_REGION
    group_name: str = ""
    cost_time: int = 0                  # ms
    success: bool = True
    request_id: str = ""
    context_code: int = 0
    bean: TraceBean = field(default_factory=TraceBean)


def _clean(v) -> str:
    s = "" if v is None else str(v)
    return s.replace(CONTENT_SPLITOR, " ").replace(FIELD_SPLITOR, " ")


def _jbool(b: bool) -> str:
    return "true" if b else "false"


def encode(ctx: TraceContext) -> str:
    """TraceDataEncoder.encoderFromContextBean: one record, ``\\x02``-terminated."""
    b = ctx.bean
    t = ctx.trace_type
    if t is TraceType.Pub:
        f = [t.value, ctx.timestamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys,
             b.store_host, b.body_length, ctx.cost_time, int(b.msg_type), b.offset_msg_id, _jbool(ctx.success),
             b.client_host]
    elif t is TraceType.SubBefore:
        f = [t.value, ctx.timestamp, ctx.region_id, ctx.group_name, ctx.request_id, b.msg_id, b.retry_times,
             b.keys, b.client_host]
    elif t is TraceType.SubAfter:
        f = [t.value, ctx.request_id, b.msg_id, ctx.cost_time, _jbool(ctx.success), b.keys, ctx.context_code,
             ctx.timestamp, ctx.group_name]
    else:
        f = [t.value, ctx.timestamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys,
             b.store_host, int(b.msg_type), b.transaction_id, b.transaction_state,
             _jbool(b.from_transaction_check)]
    return CONTENT_SPLITOR.join(_clean(x) for x in f) + FIELD_SPLITOR


def trace_keys(ctx: TraceContext) -> list:
    """The keys a trace message carries for this record: the message id and its keys."""
    out = [ctx.bean.msg_id] if ctx.bean.msg_id else []
    out += [k for k in ctx.bean.keys.split(" ") if k]
    return out


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        return 0


def decode(data: str) -> list:
    """TraceDataEncoder.decoderFromTraceDataString: every record of a trace message body (records
    of an unknown type or too short are skipped)."""
    out = []
    for rec in data.split(FIELD_SPLITOR):
        f = rec.split(CONTENT_SPLITOR)
        kind = f[0]
        try:
            if kind == "Pub" and len(f) >= 13:
                bean = TraceBean(topic=f[4], msg_id=f[5], tags=f[6], keys=f[7], store_host=f[8],
                                 body_length=_int(f[9]), msg_type=MessageType(_int(f[11])))
                ok = f[12] if len(f) == 13 else f[13]
                if len(f) >= 14:
                    bean.offset_msg_id = f[12]
                if len(f) >= 15:
                    bean.client_host = f[14]
                out.append(TraceContext(TraceType.Pub, _int(f[1]), f[2], f[3], _int(f[10]), ok == "true", bean=bean))
            elif kind == "SubBefore" and len(f) >= 8:
                bean = TraceBean(msg_id=f[5], retry_times=_int(f[6]), keys=f[7],
                                 client_host=f[8] if len(f) >= 9 else "")
                out.append(TraceContext(TraceType.SubBefore, _int(f[1]), f[2], f[3], request_id=f[4], bean=bean))
            elif kind == "SubAfter" and len(f) >= 6:
                ctx = TraceContext(TraceType.SubAfter, request_id=f[1], cost_time=_int(f[3]), success=f[4] == "true",
                                   bean=TraceBean(msg_id=f[2], keys=f[5]))
                if len(f) >= 7:
                    ctx.context_code = _int(f[6])
                if len(f) >= 9:
                    ctx.timestamp, ctx.group_name = _int(f[7]), f[8]
                out.append(ctx)
            elif kind == "EndTransaction" and len(f) >= 13:
                bean = TraceBean(topic=f[4], msg_id=f[5], tags=f[6], keys=f[7], store_host=f[8],
                                 msg_type=MessageType(_int(f[9])), transaction_id=f[10], transaction_state=f[11],
                                 from_transaction_check=f[12] == "true")
                out.append(TraceContext(TraceType.EndTransaction, _int(f[1]), f[2], f[3], bean=bean))
        except ValueError:
            continue
    return out


def new_request_id() -> str:
    return uuid.uuid4().hex


class TraceDispatcher:
    """Sends trace records in the background (RocketMQ's AsyncTraceDispatcher).

    Parameters
    ----------
    namesrv_addr : str
    group : str
        The traced producer's or consumer's group; the trace producer is
        ``_INNER_TRACE_PRODUCER-<group>``.
    trace_topic : str, optional
        Default ``RMQ_SYS_TRACE_TOPIC``.

    :meth:`append` / :meth:`append_pub` never block: with :data:`TRACE_QUEUE_SIZE` records waiting
    the record is dropped and counted in ``dropped``.  The caller's thread only queues a tuple;
    records are built and encoded on the dispatcher's thread and sent with ``send_async`` (pipelined).
    A trace message that cannot be sent is logged and its records counted in ``failed`` (the
    traced traffic is never affected).
    """

    def __init__(self, namesrv_addr: str, group: str, trace_topic: Optional[str] = None):
        self.namesrv_addr = namesrv_addr
        self.group = group
        self.trace_topic = trace_topic or TRACE_TOPIC
        self._items: collections.deque = collections.deque()
        self.dropped = 0
        self.failed = 0
        self.sent_messages = 0
        self.sent_records = 0
        self._producer = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0
        self._inflight = 0
        self._hosts: dict = {}
        self._thread = threading.Thread(target=self._run, name=f"rmq-trace-{group}", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._items)

    def _put(self, item) -> bool:
        if self._stop.is_set():
            return False
        if len(self._items) >= TRACE_QUEUE_SIZE:
            self.dropped += 1
            return False
        self._items.append(item)
        if len(self._items) >= TRACE_BATCH_NUM:
            self._wake.set()
        return True

    def append(self, ctx: TraceContext) -> bool:
        """Queue one record; False (and ``dropped`` + 1) when the queue is full or closed."""
        return self._put(ctx)

    def append_pub(self, msg, result, cost_ms: int, client_host: str, ordered: bool = False) -> bool:
        """Queue the Pub record of one sent message (built on the dispatcher's thread)."""
        return self._put((msg, result, cost_ms, client_host, ordered, int(time.time() * 1000)))

    def append_pub_batch(self, msgs: list, result, cost_ms: int, client_host: str, ordered: bool = False) -> None:
        """Queue a Pub record per message of ``msgs``, sent together with one ``result`` (a user
        batch's, or a message's alone): each record gets its message's ids out of the result's
        comma-joined ``msg_id`` / ``offset_msg_id``."""
        if len(msgs) == 1:
            self.append_pub(msgs[0], result, cost_ms, client_host, ordered)
            return
        ids, offs = result.msg_id.split(","), result.offset_msg_id.split(",")
        for i, m in enumerate(msgs):
            one = dataclasses.replace(result, msg_id=ids[i] if i < len(ids) else "",
                                      offset_msg_id=offs[i] if i < len(offs) else "")
            self.append_pub(m, one, cost_ms, client_host, ordered)

    def _take(self) -> list:
        if not self._items:
            self._wake.wait(TRACE_POLL_MS / 1000.0)
            self._wake.clear()
        batch = []
        pop = self._items.popleft
        try:
            while len(batch) < TRACE_BATCH_NUM:
                batch.append(pop())
        except IndexError:
            pass
        return batch

    def _run(self) -> None:
        while not (self._stop.is_set() and not self._items):
            batch = self._take()
            if not batch:
                continue
            with self._idle:
                self._busy += 1
            try:
                self._send(batch)
            except Exception as e:           # never let the thread die: trace is best effort
                self.failed += len(batch)
                log.warning("trace: %d record(s) lost: %s", len(batch), e)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def _pub_line(self, item) -> tuple:
        """The encoded Pub record and its keys of a queued ``append_pub`` tuple: :func:`encode` of
        :func:`pub_context`, without the objects (the dispatcher's hot path).  Topic, tags, keys and
        ids come from a validated message (no separators in them); the store host is cached per
        broker (the first 16 hex digits of an IPv4 offset message id)."""
        msg, result, cost, client, ordered, ts = item
        props = msg.properties
        off = result.offset_msg_id
        host = self._hosts.get(off[:16])
        if host is None:
            host = store_host_of(off) or result.message_queue.broker_name
            if len(off) == 32:
                self._hosts[off[:16]] = host
        mtype = _msg_type(props, ordered)
        keys = props.get("KEYS", "")
        ok = "true" if str(getattr(result.status, "value", result.status)) == "SEND_OK" else "false"
        line = CONTENT_SPLITOR.join((
            "Pub", str(ts), result.region_id or DEFAULT_REGION, _clean(self.group), msg.topic, result.msg_id,
            props.get("TAGS", ""), keys, host, str(len(msg.body)), str(cost), str(int(mtype)), off, ok,
            _clean(client))) + FIELD_SPLITOR
        return line, ([result.msg_id] + keys.split(" ")) if keys else [result.msg_id]

    def _send(self, batch: list) -> None:
        from rmq.client.message import Message
        from rmq.client.producer import Producer
        chunks, parts, keys, size, key_bytes = [], [], {}, 0, 0
        for item in batch:
            if isinstance(item, TraceContext):
                rec, rkeys = encode(item), trace_keys(item)
            else:
                rec, rkeys = self._pub_line(item)
            n = len(rec)
            kn = sum(len(k) + 1 for k in rkeys)
            if parts and (size + n > MAX_TRACE_MESSAGE_BYTES // 2 or      # chars; UTF-8 may double them
                          key_bytes + kn > MAX_TRACE_KEYS_BYTES // 2):
                chunks.append((parts, keys))
                parts, keys, size, key_bytes = [], {}, 0, 0
            parts.append(rec)
            size += n
            for k in rkeys:
                if k and k not in keys:
                    keys[k] = None
                    key_bytes += len(k) + 1
        if parts:
            chunks.append((parts, keys))
        if self._producer is None:
            self._producer = Producer(self.namesrv_addr, f"{TRACE_PRODUCER_GROUP_PREFIX}-{self.group}")
        for parts, keys in chunks:
            n = len(parts)
            try:
                fut = self._producer.send_async(Message(self.trace_topic, "".join(parts).encode("utf-8"),
                                                        keys=list(keys)))
            except Exception as e:
                self.failed += n
                log.warning("trace: %d record(s) to %s not sent: %s", n, self.trace_topic, e)
                continue
            with self._idle:
                self._inflight += 1
            fut.add_done_callback(lambda f, n=n: self._sent(f, n))

    def _sent(self, fut, n: int) -> None:
        if fut.exception() is not None:
            self.failed += n
            log.warning("trace: %d record(s) to %s not sent: %s", n, self.trace_topic, fut.exception())
        else:
            self.sent_messages += 1
            self.sent_records += n
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued record has been sent (or failed); False on timeout."""
        end = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._items or self._busy or self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, TRACE_POLL_MS / 1000.0))
                self._wake.set()
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to ``timeout_s``), then stop the thread and the trace producer."""
        self.flush(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._producer is not None:
            try:
                self._producer.close()
            except Exception as e:
                log.warning("trace producer of %s: %s", self.group, e)
            self._producer = None


def _msg_type(props: dict, ordered: bool) -> MessageType:
    """SendMessageTraceHookImpl's message type: half (transactional), delay, order or normal."""
    if props.get("TRAN_MSG") == "true":
        return MessageType.Trans_Msg_Half
    if (props.get("DELAY") or "0") not in ("0", ""):
        return MessageType.Delay_Msg
    return MessageType.Order_Msg if ordered else MessageType.Normal_Msg


def store_host_of(offset_msg_id: str) -> str:
    """``ip:port`` of the broker that stored a message, from its offset message id ("" if none)."""
    from rmq._core.commitlog import decode_message_id
    try:
        host, _ = decode_message_id(offset_msg_id)
    except (ValueError, TypeError):
        return ""
    if len(host) == 8:
        return f"{'.'.join(str(b) for b in host[:4])}:{int.from_bytes(host[4:], 'big')}"
    if len(host) == 20:
        import ipaddress
        return f"[{ipaddress.IPv6Address(host[:16])}]:{int.from_bytes(host[16:], 'big')}"
    return ""


def pub_context(group: str, msg, result, cost_ms: int, client_host: str, ordered: bool = False) -> TraceContext:
    """The Pub record of one sent message (SendMessageTraceHookImpl.sendMessageAfter)."""
    props = msg.properties
    mtype = _msg_type(props, ordered)
    bean = TraceBean(topic=msg.topic, msg_id=result.msg_id, offset_msg_id=result.offset_msg_id,
                     tags=props.get("TAGS", ""), keys=props.get("KEYS", ""),
                     store_host=store_host_of(result.offset_msg_id) or result.message_queue.broker_name,
                     client_host=client_host, body_length=len(msg.body), msg_type=mtype)
    return TraceContext(TraceType.Pub, int(time.time() * 1000), getattr(result, "region_id", DEFAULT_REGION) or
                        DEFAULT_REGION, group, cost_ms, str(getattr(result.status, "value", result.status)) == "SEND_OK",
                        bean=bean)


def sub_contexts(group: str, msgs: Iterable, client_host: str) -> tuple:
    """SubBefore records of one listener call and the request id its SubAfter records share."""
    rid = new_request_id()
    now = int(time.time() * 1000)
    out = [TraceContext(TraceType.SubBefore, now, DEFAULT_REGION, group, request_id=rid,
                        bean=TraceBean(topic=m.topic, msg_id=m.msg_id, keys=" ".join(m.keys),
                                       retry_times=m.reconsume_times, client_host=client_host,
                                       body_length=len(m.body or b"")))
           for m in msgs]
    return rid, out


def sub_after_contexts(group: str, rid: str, msgs: Iterable, cost_ms: int, success: bool) -> list:
    now = int(time.time() * 1000)
    return [TraceContext(TraceType.SubAfter, now, DEFAULT_REGION, group, cost_ms, success, request_id=rid,
                         context_code=0 if success else 1,
                         bean=TraceBean(topic=m.topic, msg_id=m.msg_id, keys=" ".join(m.keys)))
            for m in msgs]
