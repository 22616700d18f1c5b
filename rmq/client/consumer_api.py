"""The consumer's half of RocketMQ's ``MQClientAPIImpl`` / ``MQClientInstance``: route look-up,
request frames, response parsing, and a thread-safe synchronous client over them.

Frames built and parsed here (fields are the broker's, see rmq/actors/broker.py)::

    GET_ROUTEINFO_BY_TOPIC (105)    -> NameServer  topic                      -> body TopicRouteData
    PULL_MESSAGE (11)               -> broker      consumerGroup, topic, queueId, queueOffset, maxMsgNums,
                                                   sysFlag, commitOffset, suspendTimeoutMillis, subscription
    QUERY_CONSUMER_OFFSET (14)      -> broker      consumerGroup, topic, queueId  -> offset | QUERY_NOT_FOUND
    UPDATE_CONSUMER_OFFSET (15)     -> broker      consumerGroup, topic, queueId, commitOffset
    GET_MAX_OFFSET / GET_MIN_OFFSET -> broker      topic, queueId                 -> offset
    SEARCH_OFFSET_BY_TIMESTAMP (29) -> broker      topic, queueId, timestamp      -> offset
    HEART_BEAT (34)                 -> broker      body {clientID, consumerDataSet, producerDataSet}
    UNREGISTER_CLIENT (35)          -> broker      clientID, consumerGroup
    GET_CONSUMER_LIST_BY_GROUP (38) -> broker      consumerGroup                  -> body {consumerIdList}
    CONSUMER_SEND_MSG_BACK (36)     -> broker      offset, group, delayLevel, originMsgId, originTopic,
                                                   maxReconsumeTimes
    LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42)      body {consumerGroup, clientId, mqSet}
                                                   -> body {lockOKMQSet}
    SEND_MESSAGE (10)               -> broker      the retry-topic fallback of a failed send-back

The frame helpers are pure (shared with :mod:`rmq.aio.consumer`); :class:`ConsumerAPI`
adds blocking I/O with one :class:`RemotingClient` (DEALER sockets) per calling thread.
"""
from __future__ import annotations

import itertools
import logging
import os
import random
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from rmq._core import commitlog as _cl
from rmq.client.message import (PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
                                MessageQueue, PullResult, PullStatus)
import zmq

from rmq import protocol as P
from rmq.client.remoting import DEFAULT_TIMEOUT_MS, RemotingClient
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, pack_body, unpack_body

log = logging.getLogger("rmq.client.consumer")

PERM_READ = 4
PERM_WRITE = 2
MASTER_ID = "0"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
BROKER_SUSPEND_MAX_TIME_MS = 15_000               # long-poll hold asked of the broker (SPEC.md §13.3)
CONSUMER_TIMEOUT_MS_WHEN_SUSPEND = 30_000         # network timeout of a long-poll pull
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
SYS_FLAG_COMPRESSED = 0x1
COMPRESSION_TYPE_MASK = 0x700
SUB_ALL = "*"

__all__ = ["TopicRoute", "SubscriptionData", "ConsumerAPI", "RequestMux", "retry_topic", "dlq_topic", "build_pull_frame",
           "parse_pull_response", "post_process_messages", "default_client_id"]


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


_instance_seq = iter(range(1, 1 << 62))
_instance_lock = threading.Lock()


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def default_client_id(instance_name: Optional[str] = None) -> str:
    """RocketMQ's ``ip@instanceName``; the default instance name is ``pid#n`` (n counts the
    consumers of this process), so two consumers in one process are two group members."""
    if not instance_name:
        with _instance_lock:
            n = next(_instance_seq)
        instance_name = f"{os.getpid()}#{n}"
    return f"{_local_ip()}@{instance_name}"


# -- routes ------------------------------------------------------------------------------------
@dataclass
class TopicRoute:
    """A parsed TopicRouteData: queue data per broker group and each group's addresses."""
    topic: str
    queue_datas: list = field(default_factory=list)      # [{"brokerName", "readQueueNums", "perm", ...}]
    broker_addrs: dict = field(default_factory=dict)     # brokerName -> {"0": "host:port", ...}
    fetched_at: float = 0.0                              # time.monotonic()

    @classmethod
    def from_wire(cls, topic: str, body: object) -> "TopicRoute":
        if not isinstance(body, dict):
            raise MQClientError(f"route of {topic}: body is not a map")
        qds = [q for q in body.get("queueDatas") or [] if isinstance(q, dict)]
        addrs = {}
        for bd in body.get("brokerDatas") or []:
            if isinstance(bd, dict) and isinstance(bd.get("brokerName"), str):
                addrs[bd["brokerName"]] = {str(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
        return cls(topic, qds, addrs, time.monotonic())

    def subscribe_queues(self) -> list:
        """Readable queues (``readQueueNums`` of each readable broker group with a master), sorted."""
        out = []
        for qd in self.queue_datas:
            name = qd.get("brokerName")
            if not (int(qd.get("perm", 0)) & PERM_READ) or MASTER_ID not in self.broker_addrs.get(name, {}):
                continue
            out.extend(MessageQueue(self.topic, name, i) for i in range(int(qd.get("readQueueNums", 0))))
        return sorted(out)

    def master_addr(self, broker_name: str) -> Optional[str]:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def all_master_addrs(self) -> list:
        return sorted({a[MASTER_ID] for a in self.broker_addrs.values() if MASTER_ID in a})


# -- subscriptions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubscriptionData:
    """A TAG subscription: ``"*"`` (everything) or ``"tagA || tagB"``.

    The broker filters on the tag hash code; :meth:`matches` re-checks the exact
    tag string on the client (hash collisions, SPEC.md §13.2).
    """
    topic: str
    sub_string: str = SUB_ALL
    tags_set: frozenset = frozenset()
    sub_version: int = 0

    @classmethod
    def build(cls, topic: str, expression: Optional[str]) -> "SubscriptionData":
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return cls(topic, SUB_ALL, frozenset(), time.time_ns() // 1000)
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        if not tags:
            raise MQClientError(f"subscription expression {expression!r} has no tag")
        return cls(topic, " || ".join(sorted(tags)), tags, time.time_ns() // 1000)

    @property
    def is_all(self) -> bool:
        return not self.tags_set

    def matches(self, tags: Optional[str]) -> bool:
        return not self.tags_set or (tags is not None and tags in self.tags_set)

    def to_wire(self) -> dict:
        return {"topic": self.topic, "subString": self.sub_string, "tagsSet": sorted(self.tags_set),
                "subVersion": self.sub_version, "expressionType": "TAG"}


# -- frames ----------------------------------------------------------------------------------------
def build_pull_frame(group: str, mq: MessageQueue, offset: int, max_nums: int, sub_string: str = SUB_ALL,
                     commit_offset: int = -1, suspend_ms: int = 0) -> Frame:
    """PULL_MESSAGE with the SUBSCRIPTION flag (the expression travels with every pull),
    SUSPEND when ``suspend_ms`` > 0 and COMMIT_OFFSET when ``commit_offset`` >= 0."""
    flag = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_ms > 0 else 0) | (
        PULL_FLAG_COMMIT_OFFSET if commit_offset >= 0 else 0)
    return Frame(RequestCode.PULL_MESSAGE, fields={
        "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": int(offset),
        "maxMsgNums": int(max_nums), "sysFlag": flag, "commitOffset": int(commit_offset),
        "suspendTimeoutMillis": int(suspend_ms), "subscription": sub_string or SUB_ALL})


def _decompress(body: bytes, sys_flag: int) -> bytes:
    kind = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
    if kind in (0, 3):
        return zlib.decompress(body)
    if kind == 1:
        import lz4.frame  # optional dependency
        return lz4.frame.decompress(body)
    if kind == 2:
        import zstandard  # optional dependency
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    raise MQClientError(f"unknown compression type {kind} in sysFlag {sys_flag:#x}")


def post_process_messages(msgs: list, sub: Optional[SubscriptionData] = None,
                          group_retry_topic: Optional[str] = None) -> list:
    """Client side of a FOUND pull: inflate compressed bodies, keep exact tag matches, and
    give retry-topic copies their original topic back (RocketMQ ``resetRetryAndNamespace``).

    A body that does not inflate is left as stored (logged), never dropped.
    """
    out = msgs
    if sub is not None and not sub.is_all:
        tags = sub.tags_set
        out = [m for m in msgs if m.properties.get("TAGS") in tags]
    for m in out:
        if m.sys_flag & SYS_FLAG_COMPRESSED and m.body is not None:
            try:
                m.body = _decompress(m.body, m.sys_flag)
            except (zlib.error, ImportError, MQClientError, RuntimeError, ValueError) as e:
                log.warning("cannot decompress message %s (sysFlag %#x): %s", m.msg_id, m.sys_flag, e)
        if group_retry_topic is not None and m.topic == group_retry_topic:
            real = m.properties.get(PROPERTY_RETRY_TOPIC)
            if real:
                m.topic = real
    return out


_PULL_STATUS = {ResponseCode.SUCCESS: PullStatus.FOUND, ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


def parse_pull_response(resp: Frame, sub: Optional[SubscriptionData] = None, addr: str = "",
                        group_retry_topic: Optional[str] = None) -> PullResult:
    """PULL_MESSAGE response -> PullResult (messages decoded and post-processed).

    Raises
    ------
    MQBrokerError
        Any other response code (TOPIC_NOT_EXIST, SUBSCRIPTION_GROUP_NOT_EXIST, ...).
    MQClientError
        The records do not decode.
    """
    status = _PULL_STATUS.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.remark or f"pull failed with code {resp.code}", resp.code, addr)
    f = resp.fields
    msgs: list = []
    if status is PullStatus.FOUND and resp.bodies:
        try:
            msgs = _cl.decode_records(resp.bodies[0])
        except (ValueError, TypeError) as e:
            raise MQClientError(f"pull from {addr}: records do not decode: {e}") from None
        msgs = post_process_messages(msgs, sub, group_retry_topic)
    return PullResult(status, int(f.get("nextBeginOffset", 0)), int(f.get("minOffset", 0)),
                      int(f.get("maxOffset", 0)), msgs)


def heartbeat_body(client_id: str, consumer_datas: Sequence[dict]) -> bytes:
    return pack_body({"clientID": client_id, "consumerDataSet": list(consumer_datas), "producerDataSet": []})


def consumer_data(group: str, consume_type: str, message_model: str, consume_from_where: str,
                  subs: Iterable[SubscriptionData]) -> dict:
    return {"groupName": group, "consumeType": consume_type, "messageModel": message_model,
            "consumeFromWhere": consume_from_where, "unitMode": False,
            "subscriptionDataSet": [s.to_wire() for s in subs]}


def mq_set_body(group: str, client_id: str, mqs: Iterable[MessageQueue]) -> bytes:
    return pack_body({"consumerGroup": group, "clientId": client_id,
                      "mqSet": [[mq.topic, mq.broker_name, mq.queue_id] for mq in mqs]})


def parse_lock_response(resp: Frame) -> set:
    body = unpack_body(resp) if resp.bodies else {}
    out = set()
    for item in (body.get("lockOKMQSet") if isinstance(body, dict) else None) or []:
        if isinstance(item, dict):
            out.add(MessageQueue(item["topic"], item["brokerName"], int(item["queueId"])))
        else:
            out.add(MessageQueue(item[0], item[1], int(item[2])))
    return out


def send_back_frame(group: str, msg, delay_level: int, max_reconsume_times: int) -> Frame:
    return Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields={
        "offset": int(msg.commitlog_offset), "group": group, "delayLevel": int(delay_level),
        "originMsgId": msg.msg_id, "originTopic": msg.topic, "unitMode": False,
        "maxReconsumeTimes": int(max_reconsume_times)})


def retry_send_frame(group: str, msg, max_reconsume_times: int, delay_level: int = 0) -> Frame:
    """Fallback of a failed send-back (DefaultMQPushConsumerImpl.sendMessageBack): a copy sent
    to ``%RETRY%group`` with RETRY_TOPIC / RECONSUME_TIME / MAX_RECONSUME_TIMES and delay
    level ``3 + reconsumeTimes`` (or straight to ``%DLQ%group`` when ``delay_level`` < 0).
    The body goes plain (the consumer inflated it)."""
    props = dict(msg.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
    props.setdefault("ORIGIN_MESSAGE_ID", msg.msg_id)
    props[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[PROPERTY_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    props.pop("DELAY", None)
    if delay_level < 0:
        topic = dlq_topic(group)
    else:
        topic = retry_topic(group)
        props["DELAY"] = str(min(delay_level or 3 + msg.reconsume_times, 18))
    return Frame(RequestCode.SEND_MESSAGE, fields={
        "producerGroup": "CLIENT_INNER_PRODUCER", "topic": topic, "queueId": -1, "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000), "flag": int(msg.flag), "properties": props,
        "reconsumeTimes": int(msg.reconsume_times + 1), "maxReconsumeTimes": int(max_reconsume_times)},
        bodies=[msg.body or b""])


def _check(resp: Frame, addr: str, what: str) -> Frame:
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(f"{what}: {resp.remark or resp.code}", resp.code, addr)
    return resp


# -- blocking client -----------------------------------------------------------------------------
class ConsumerAPI:
    """Blocking wire calls of a consumer, with a route cache.

    Parameters
    ----------
    namesrv_addr : str
        ``host:port[;host:port...]``.
    timeout_ms : int
        Default request timeout (RocketMQ 3000 ms).

    Concurrency: thread-safe.  Each calling thread gets its own
    :class:`RemotingClient` (ZeroMQ sockets are single-threaded); :meth:`close`
    closes all of them and must be called once the callers are done.
    """

    def __init__(self, namesrv_addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.namesrv_addrs = [a.strip() for a in (namesrv_addr or "").split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise MQClientError("no NameServer address given")
        self.timeout_ms = timeout_ms
        self._local = threading.local()
        self._clients: list[RemotingClient] = []
        self._lock = threading.Lock()
        self._routes: dict[str, TopicRoute] = {}
        self._closed = False

    def remoting(self) -> RemotingClient:
        if self._closed:
            raise MQClientError("consumer client is closed")
        c = getattr(self._local, "client", None)
        if c is None:
            c = RemotingClient()
            self._local.client = c
            with self._lock:
                self._clients.append(c)
        return c

    def invoke(self, addr: str, frame: Frame, timeout_ms: Optional[int] = None) -> Frame:
        try:
            return self.remoting().invoke(addr, frame, timeout_ms or self.timeout_ms)
        except ProtocolError as e:
            raise RemotingError(f"bad response from {addr}: {e}") from None

    def invoke_oneway(self, addr: str, frame: Frame) -> None:
        self.remoting().invoke_oneway(addr, frame)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    # -- routes --------------------------------------------------------------------------------
    def fetch_route(self, topic: str, timeout_ms: Optional[int] = None) -> Optional[TopicRoute]:
        """Ask the NameServers (in a random order) for ``topic``'s route; None if unknown.

        Raises
        ------
        RemotingError
            No NameServer answered.
        """
        last: Optional[Exception] = None
        for addr in random.sample(self.namesrv_addrs, len(self.namesrv_addrs)):
            try:
                resp = self.invoke(addr, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic}),
                                   timeout_ms)
            except RemotingError as e:
                last = e
                continue
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            _check(resp, addr, f"route of {topic}")
            route = TopicRoute.from_wire(topic, unpack_body(resp))
            with self._lock:
                self._routes[topic] = route
            return route
        raise RemotingError(f"no NameServer of {self.namesrv_addrs} answered the route of {topic}: {last}")

    def route(self, topic: str, max_age_ms: Optional[int] = None) -> Optional[TopicRoute]:
        """Cached route (refetched when older than ``max_age_ms``, or missing)."""
        with self._lock:
            r = self._routes.get(topic)
        if r is not None and (max_age_ms is None or (time.monotonic() - r.fetched_at) * 1000 < max_age_ms):
            return r
        try:
            return self.fetch_route(topic) or r
        except RemotingError:
            if r is not None:
                return r
            raise

    def cached_routes(self) -> list:
        with self._lock:
            return list(self._routes.values())

    def broker_addr(self, broker_name: str, topic: Optional[str] = None) -> str:
        """Master address of ``broker_name`` from the cached routes (refreshing ``topic``'s if needed).

        Raises
        ------
        MQClientError
            The broker group has no known master.
        """
        with self._lock:
            routes = list(self._routes.values())
        for r in routes:
            a = r.master_addr(broker_name)
            if a:
                return a
        if topic is not None:
            r = self.fetch_route(topic)
            a = r.master_addr(broker_name) if r else None
            if a:
                return a
        raise MQClientError(f"the broker[{broker_name}] does not exist")

    def all_broker_addrs(self) -> list:
        with self._lock:
            routes = list(self._routes.values())
        return sorted({a for r in routes for a in r.all_master_addrs()})

    # -- pulls and offsets ------------------------------------------------------------------------
    def pull(self, group: str, mq: MessageQueue, offset: int, max_nums: int, sub: Optional[SubscriptionData] = None,
             suspend_ms: int = 0, timeout_ms: Optional[int] = None, commit_offset: int = -1,
             group_retry_topic: Optional[str] = None) -> PullResult:
        addr = self.broker_addr(mq.broker_name, mq.topic)
        frame = build_pull_frame(group, mq, offset, max_nums, sub.sub_string if sub else SUB_ALL, commit_offset,
                                 suspend_ms)
        if timeout_ms is None:
            timeout_ms = suspend_ms + self.timeout_ms if suspend_ms else self.timeout_ms
        resp = self.invoke(addr, frame, timeout_ms)
        return parse_pull_response(resp, sub, addr, group_retry_topic)

    def _offset_call(self, code: int, mq: MessageQueue, what: str, **fields) -> int:
        addr = self.broker_addr(mq.broker_name, mq.topic)
        resp = self.invoke(addr, Frame(code, fields={"topic": mq.topic, "queueId": mq.queue_id, **fields}))
        return int(_check(resp, addr, f"{what} of {mq}").fields.get("offset", 0))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._offset_call(RequestCode.GET_MAX_OFFSET, mq, "max offset")

    def min_offset(self, mq: MessageQueue) -> int:
        return self._offset_call(RequestCode.GET_MIN_OFFSET, mq, "min offset")

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._offset_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, "offset by time",
                                 timestamp=int(timestamp_ms))

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        """The group's stored offset of ``mq``; -1 on QUERY_NOT_FOUND.

        Raises
        ------
        MQBrokerError, RemotingError
        """
        addr = self.broker_addr(mq.broker_name, mq.topic)
        resp = self.invoke(addr, Frame(RequestCode.QUERY_CONSUMER_OFFSET, fields={
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id}))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        return int(_check(resp, addr, f"query offset of {mq}").fields.get("offset", -1))

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        addr = self.broker_addr(mq.broker_name, mq.topic)
        _check(self.invoke(addr, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": int(offset)})),
            addr, f"update offset of {mq}")

    # -- group membership -----------------------------------------------------------------------
    def heartbeat(self, addr: str, client_id: str, consumer_datas: Sequence[dict]) -> None:
        _check(self.invoke(addr, Frame(RequestCode.HEART_BEAT, bodies=[heartbeat_body(client_id, consumer_datas)])),
               addr, "heartbeat")

    def unregister(self, addr: str, client_id: str, group: str) -> None:
        _check(self.invoke(addr, Frame(RequestCode.UNREGISTER_CLIENT, fields={
            "clientID": client_id, "consumerGroup": group}), 1000), addr, "unregister")

    def consumer_id_list(self, addr: str, group: str) -> list:
        """Client ids of ``group`` known to the broker at ``addr`` ([] when none)."""
        resp = self.invoke(addr, Frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, fields={"consumerGroup": group}))
        if resp.code != ResponseCode.SUCCESS:
            return []
        body = unpack_body(resp)
        ids = body.get("consumerIdList") if isinstance(body, dict) else None
        return [str(x) for x in ids or []]

    def lock_batch_mq(self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                      timeout_ms: int = 1000) -> set:
        resp = self.invoke(addr, Frame(RequestCode.LOCK_BATCH_MQ, bodies=[mq_set_body(group, client_id, mqs)]),
                           timeout_ms)
        return parse_lock_response(_check(resp, addr, "lock queues"))

    def unlock_batch_mq(self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                        timeout_ms: int = 1000) -> None:
        _check(self.invoke(addr, Frame(RequestCode.UNLOCK_BATCH_MQ, bodies=[mq_set_body(group, client_id, mqs)]),
                           timeout_ms), addr, "unlock queues")

    # -- retry ----------------------------------------------------------------------------------------
    def send_message_back(self, group: str, mq: MessageQueue, msg, delay_level: int,
                          max_reconsume_times: int) -> None:
        """CONSUMER_SEND_MSG_BACK to the broker holding ``msg``; on failure a copy is sent to
        ``%RETRY%group`` (SPEC.md §12.2).

        Raises
        ------
        MQClientError
            Both ways failed (the caller consumes the message again locally).
        """
        addr = self.broker_addr(mq.broker_name, mq.topic)
        try:
            _check(self.invoke(addr, send_back_frame(group, msg, delay_level, max_reconsume_times)), addr,
                   "send message back")
            return
        except MQClientError as e:
            log.warning("send back of %s to %s failed (%s); sending a copy to %s", msg.msg_id, addr, e,
                        retry_topic(group))
        _check(self.invoke(addr, retry_send_frame(group, msg, max_reconsume_times, delay_level)), addr,
               "send to retry topic")


class RequestMux:
    """Many outstanding requests over DEALER sockets (one per address), answered in any order.

    The pull engine of the push consumer and of ``PullConsumer.poll``: requests are
    sent with :meth:`send` and come back from :meth:`poll` as ``(token, Frame or
    exception, addr)``; a request not answered by its deadline comes back as a
    :class:`RemotingTimeoutError` and a late answer to it is dropped.  Extra file
    descriptors (a wake-up pipe) can be polled alongside.

    Concurrency: single-threaded (create, use and close it in one thread).
    """

    def __init__(self, ctx: Optional[zmq.Context] = None):
        self.ctx = ctx or zmq.Context.instance()
        self.poller = zmq.Poller()
        self._sockets: dict = {}
        self._addr_of: dict = {}
        self._opaque = itertools.count(1)
        self.pending: dict = {}          # opaque -> (deadline, addr, token)

    def _socket(self, addr: str) -> zmq.Socket:
        s = self._sockets.get(addr)
        if s is None:
            s = P.dealer(self.ctx, addr)
            self._sockets[addr] = s
            self._addr_of[s] = addr
            self.poller.register(s, zmq.POLLIN)
        return s

    def send(self, addr: str, frame: Frame, timeout_ms: int, token: object) -> int:
        """Send ``frame``; its answer (or timeout) will come back from :meth:`poll` with ``token``.

        Raises
        ------
        RemotingError
            The socket would block (the peer is gone and the queue is full).
        """
        s = self._socket(addr)
        frame.opaque = next(self._opaque)
        frame.flag &= ~P.FLAG_ONEWAY
        try:
            s.send_multipart(P.encode(frame), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise RemotingError(f"send queue to {addr} is full") from None
        self.pending[frame.opaque] = (time.monotonic() + timeout_ms / 1000.0, addr, token)
        return frame.opaque

    def cancel(self, opaque: int) -> None:
        self.pending.pop(opaque, None)

    def register_fd(self, fd: int) -> None:
        self.poller.register(fd, zmq.POLLIN)

    def next_deadline(self) -> Optional[float]:
        return min((d for d, _, _ in self.pending.values()), default=None)

    def poll(self, timeout_ms: float) -> tuple:
        """Wait up to ``timeout_ms``; returns (completed [(token, Frame | Exception, addr)], ready fds)."""
        events = self.poller.poll(max(0.0, timeout_ms))
        done = []
        fds = set()
        for sock, _ in events:
            if isinstance(sock, int):
                fds.add(sock)
                continue
            addr = self._addr_of.get(sock, "")
            for _ in range(1024):
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    resp = P.decode(parts)
                except ProtocolError as e:
                    log.warning("undecodable response from %s: %s", addr, e)
                    continue
                entry = self.pending.pop(resp.opaque, None)
                if entry is not None:
                    done.append((entry[2], resp, addr))
        if self.pending:
            now = time.monotonic()
            for opaque in [o for o, (d, _, _) in self.pending.items() if d <= now]:
                _, addr, token = self.pending.pop(opaque)
                done.append((token, RemotingTimeoutError(f"no response from {addr} in time"), addr))
        return done, fds

    def close(self) -> None:
        for s in self._sockets.values():
            s.close(0)
        self._sockets.clear()
        self._addr_of.clear()
        self.pending.clear()
