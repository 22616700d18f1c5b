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

The frame helpers and :class:`ConsumerCalls` (the calls themselves, as generators: route cache,
read-address choice, frames, answers; :mod:`rmq.client.calls`) have no I/O and are shared with
:mod:`rmq.aio.consumer`; :class:`ConsumerAPI` drives them blocking, with one
:class:`RemotingClient` (DEALER sockets) per calling thread.

Reading from slaves (SPEC.md §9, §13.2; RocketMQ ``PullAPIWrapper``): every PULL_MESSAGE
response carries ``suggestWhichBrokerId`` (0 = the master, >= 1 = a slave); :class:`PullFromWhichNode`
keeps the last one per MessageQueue and pulls go to that broker of the group when the route
lists it, else to the master, else to the lowest-id slave
(:func:`rmq.client.route.find_broker_address_in_subscribe`).  An address whose request failed
(no answer / socket error) is avoided for ``ADDR_ISOLATION_MS`` while another one of its group is
known, so a consumer keeps reading from a slave while a dead master is still in the route.
Offset calls (query / update / min / max / search) go to the master, else a slave.  Sends and
queue locks stay master-only.
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
from typing import Callable, Iterable, Optional, Sequence, Union

from rmq._core import commitlog as _cl
from rmq._core.consume import needs_post_processing
from rmq.client.message import (PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
                                MessageQueue, PullResult, PullStatus)
import zmq

from rmq import latency_trace as _lt
from rmq import protocol as P
from rmq import security
from rmq.client.calls import blocking
from rmq.client.remoting import DEFAULT_TIMEOUT_MS, RECONNECT_WAIT_MS, RemotingClient  # RECONNECT_WAIT_MS re-exported
from rmq.client.route import ROUTE_REFRESH_ON_FAILURE_MS, namesrv_attempt_s, route_suspect
from rmq.common.pull_epochs import PullEpochs
from rmq.common.malloc_tuning import tune_malloc
from rmq.common.mix_all import CLIENT_INNER_PRODUCER_GROUP, MASTER_ID, dlq_topic, retry_topic
from rmq.common.pull_sys_flag import build_sys_flag
from rmq.common.request_header import SUB_ALL, PullMessageRequestHeader, SendMessageRequestHeader  # SUB_ALL re-exported
from rmq.common.route import TopicRouteData, find_broker_address_in_subscribe
from rmq.errors import MQBrokerError, MQClientError, RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.filter import ExpressionType, MessageSelector, sql92
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, pack_body, unpack_body
from rmq.zmqio import monitor_events, recv_waiting, send_parts

log = logging.getLogger("rmq.client.consumer")

BROKER_SUSPEND_MAX_TIME_MS = 15_000               # long-poll hold asked of the broker (SPEC.md §13.3)
CONSUMER_TIMEOUT_MS_WHEN_SUSPEND = 30_000         # network timeout of a long-poll pull
SYS_FLAG_COMPRESSED = 0x1
COMPRESSION_TYPE_MASK = 0x700
ADDR_ISOLATION_MS = 30_000                        # a broker address that failed a request is avoided this long
ROUTE_REFRESH_INTERVAL_MS = 30_000                # pollNameServerInterval of the blocking pull paths
UNREGISTER_TIMEOUT_MS = 3_000                     # UNREGISTER_CLIENT at shutdown (RocketMQ's mqClientApiTimeout):
                                                  # one not answered leaves the member until channelExpiredTimeout

__all__ = ["TopicRoute", "SubscriptionData", "ConsumerCalls", "ConsumerAPI", "RequestMux", "retry_topic", "dlq_topic", "build_pull_frame",
           "parse_pull_response", "post_process_messages", "default_client_id", "PullFromWhichNode",
           "suggested_broker_id", "group_addrs"]


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
    """A consumer's cached route of a topic: the NameServer's TopicRouteData
    (:class:`rmq.common.route.TopicRouteData`, the one route model: QueueData, int broker ids)
    with each group's addresses by name and when it was fetched."""
    topic: str
    queue_datas: tuple = ()                              # rmq.common.route.QueueData, by broker name
    broker_addrs: dict = field(default_factory=dict)     # brokerName -> {0: "host:port", 1: ...} (int broker ids)
    fetched_at: float = 0.0                              # time.monotonic()

    @classmethod
    def from_wire(cls, topic: str, body: object) -> "TopicRoute":
        """Parse a GET_ROUTEINFO_BY_TOPIC body.

        Raises
        ------
        MQClientError
            A malformed route (the message names the topic and the field).
        """
        data = TopicRouteData.from_wire(body, topic)
        return cls(topic, data.queue_datas, {b.broker_name: dict(b.broker_addrs) for b in data.broker_datas},
                   time.monotonic())

    def subscribe_queues(self) -> list:
        """Readable queues (``readQueueNums`` of each readable broker group with an address: its
        master or, with the master gone, a slave), sorted."""
        out = []
        for qd in self.queue_datas:
            if not qd.readable or not self.broker_addrs.get(qd.broker_name):
                continue
            out.extend(MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def master_addr(self, broker_name: str) -> Optional[str]:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def all_master_addrs(self) -> list:
        return sorted({a[MASTER_ID] for a in self.broker_addrs.values() if MASTER_ID in a})

    def all_addrs(self) -> list:
        """Every broker address of the route, masters and slaves, sorted."""
        return sorted({a for addrs in self.broker_addrs.values() for a in addrs.values()})

    def read_addrs(self, avoid: Iterable = ()) -> list:
        """One address per broker group to read group data from (GET_CONSUMER_LIST_BY_GROUP):
        its master, else its lowest-id slave; addresses in ``avoid`` only when nothing else is left."""
        avoid = frozenset(avoid)
        out = set()
        for addrs in self.broker_addrs.values():
            found = find_broker_address_in_subscribe(addrs, MASTER_ID, False, avoid)
            if found is not None:
                out.add(found[1])
        return sorted(out)


def group_addrs(routes: Iterable[TopicRoute], broker_name: str, topic: Optional[str] = None) -> dict:
    """brokerId (int) -> address of ``broker_name`` from the freshest route that lists the group:
    ``topic``'s route first, then the others newest first ({} when no route lists it).  A stale
    route of another topic must not bring back a master the NameServer dropped or replaced."""
    ordered = sorted(routes, key=lambda r: (r.topic != topic, -r.fetched_at))
    for r in ordered:
        addrs = r.broker_addrs.get(broker_name)
        if addrs:
            return dict(addrs)
    return {}


def route_refresh_due(route: Optional[TopicRoute], last_try: float, now: float, max_age_ms: float) -> bool:
    """Whether to refetch a route: the cached one (None: none) is older than ``max_age_ms`` and no
    attempt was made within that interval either (an unreachable NameServer costs one timeout
    per interval, not one per call).  ``last_try`` / ``now``: time.monotonic() seconds."""
    if route is not None and (now - route.fetched_at) * 1000 < max_age_ms:
        return False
    return (now - last_try) * 1000 >= max_age_ms


def suggested_broker_id(resp: Frame) -> Optional[int]:
    """``suggestWhichBrokerId`` of a PULL_MESSAGE response (None when absent or malformed)."""
    v = resp.fields.get("suggestWhichBrokerId") if isinstance(resp.fields, dict) else None
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    return v if isinstance(v, int) and v >= 0 else None


class PullFromWhichNode:
    """Where each MessageQueue is read from (RocketMQ ``PullAPIWrapper.pullFromWhichNodeTable``),
    plus the addresses to avoid for a while because a request to them failed.

    Parameters
    ----------
    isolation_ms : int
        How long an address stays avoided after a failure (a success ends it sooner).
    clock : callable
        Seconds, monotonic (tests move it).

    Concurrency: thread-safe (one lock); shared by the sync and asyncio clients.
    """

    def __init__(self, isolation_ms: int = ADDR_ISOLATION_MS, clock=time.monotonic):
        self.isolation_ms = isolation_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._table: dict = {}            # MessageQueue -> suggested broker id
        self._suspects: dict = {}         # addr -> clock() until which it is avoided

    def suggested(self, mq: MessageQueue) -> int:
        """The last suggested broker id of ``mq`` (0, the master, by default)."""
        with self._lock:
            return self._table.get(mq, MASTER_ID)

    def update(self, mq: MessageQueue, broker_id: int) -> None:
        with self._lock:
            self._table[mq] = int(broker_id)

    def update_from_response(self, mq: MessageQueue, resp: Frame) -> Optional[int]:
        """Record the response's ``suggestWhichBrokerId``; returns it (None when absent)."""
        bid = suggested_broker_id(resp)
        if bid is not None:
            self.update(mq, bid)
        return bid

    def forget(self, mq: MessageQueue) -> None:
        with self._lock:
            self._table.pop(mq, None)

    def mark_unreachable(self, addr: str) -> None:
        with self._lock:
            self._suspects[addr] = self._clock() + self.isolation_ms / 1000.0

    def mark_reachable(self, addr: str) -> None:
        if self._suspects:
            with self._lock:
                self._suspects.pop(addr, None)

    def suspects(self) -> frozenset:
        """Addresses avoided now."""
        if not self._suspects:
            return frozenset()
        now = self._clock()
        with self._lock:
            for a in [a for a, t in self._suspects.items() if t <= now]:
                del self._suspects[a]
            return frozenset(self._suspects)

    def select(self, mq: MessageQueue, broker_addrs: dict) -> Optional[tuple]:
        """``(broker id, address)`` for the next pull of ``mq`` among ``broker_addrs`` (the group's
        brokerId -> address): the suggested broker, else the master, else the lowest-id slave;
        avoided addresses last.  None for an empty group."""
        return find_broker_address_in_subscribe(broker_addrs, self.suggested(mq), False, self.suspects())

    def select_for_offsets(self, broker_addrs: dict) -> Optional[tuple]:
        """``(broker id, address)`` for offset calls: the master, else the lowest-id slave."""
        return find_broker_address_in_subscribe(broker_addrs, MASTER_ID, False, self.suspects())

    def on_response(self, mq: Optional[MessageQueue], resp: object, addr: str) -> None:
        """Bookkeeping of one answer from ``addr``: a Frame (reachable; a pull's suggestion is
        recorded when ``mq`` is given) or an exception (a RemotingError makes ``addr`` avoided)."""
        if isinstance(resp, Frame):
            self.mark_reachable(addr)
            if mq is not None:
                self.update_from_response(mq, resp)
        elif isinstance(resp, RemotingError):
            self.mark_unreachable(addr)


# -- subscriptions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubscriptionData:
    """A subscription of one topic: a TAG expression (``"*"`` or ``"tagA || tagB"``) or a SQL92
    property filter (``expression_type="SQL92"``), RocketMQ's SubscriptionData.

    For tags the broker filters on the tag hash code and :meth:`matches` re-checks the exact tag
    string on the client (hash collisions, SPEC.md §13.2).  A SQL92 expression is evaluated by the
    broker alone: the client keeps what it is sent.
    """
    topic: str
    sub_string: str = SUB_ALL
    tags_set: frozenset = frozenset()
    sub_version: int = 0
    expression_type: str = ExpressionType.TAG

    @classmethod
    def build(cls, topic: str, expression: "Union[None, str, MessageSelector]") -> "SubscriptionData":
        """From a tag expression string or a :class:`rmq.MessageSelector`.

        Raises
        ------
        MQClientError
            A tag expression with no tag.
        FilterExpressionError
            A SQL92 expression that does not parse (line and column in the message).
        """
        version = time.time_ns() // 1000
        if isinstance(expression, MessageSelector):
            if expression.expression_type == ExpressionType.SQL92:
                sql92.parse(expression.expression)
                return cls(topic, expression.expression, frozenset(), version, ExpressionType.SQL92)
            expression = expression.expression
        elif expression is not None and not isinstance(expression, str):
            raise MQClientError(f"subscription expression must be a str or a MessageSelector, "
                                f"got {type(expression).__name__}")
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return cls(topic, SUB_ALL, frozenset(), version)
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        if not tags:
            raise MQClientError(f"subscription expression {expression!r} has no tag")
        return cls(topic, " || ".join(sorted(tags)), tags, version)

    @property
    def is_all(self) -> bool:
        """No client-side re-check: everything (``*``) or a SQL92 filter the broker applied."""
        return not self.tags_set

    @property
    def is_sql92(self) -> bool:
        return self.expression_type == ExpressionType.SQL92

    def matches(self, tags: Optional[str]) -> bool:
        return not self.tags_set or (tags is not None and tags in self.tags_set)

    def to_wire(self) -> dict:
        return {"topic": self.topic, "subString": self.sub_string, "tagsSet": sorted(self.tags_set),
                "subVersion": self.sub_version, "expressionType": self.expression_type}


# -- frames ----------------------------------------------------------------------------------------
def build_pull_frame(group: str, mq: MessageQueue, offset: int, max_nums: int,
                     sub_string: "Union[str, SubscriptionData]" = SUB_ALL,
                     commit_offset: int = -1, suspend_ms: int = 0, last_epoch: int = 0) -> Frame:
    """PULL_MESSAGE with the SUBSCRIPTION flag (the expression travels with every pull),
    SUSPEND when ``suspend_ms`` > 0 and COMMIT_OFFSET when ``commit_offset`` >= 0; ``last_epoch``:
    :meth:`ConsumerAPI.pull_epoch` of ``mq`` at ``offset`` (0: none known).

    ``sub_string``: a tag expression, or the :class:`SubscriptionData` (its expressionType goes
    along, as PullMessageRequestHeader.expressionType)."""
    expression_type = ExpressionType.TAG
    if isinstance(sub_string, SubscriptionData):
        expression_type = sub_string.expression_type
        sub_string = sub_string.sub_string
    flag = build_sys_flag(commit_offset=commit_offset >= 0, suspend=suspend_ms > 0, subscription=True)
    return Frame(RequestCode.PULL_MESSAGE, fields=PullMessageRequestHeader(
        group, mq.topic, mq.queue_id, offset, max_nums, flag, commit_offset, suspend_ms, sub_string or SUB_ALL,
        expression_type=expression_type, last_epoch=last_epoch).to_fields())


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
        out = [m for m in msgs if m.tags in tags]
    if not needs_post_processing(out, SYS_FLAG_COMPRESSED, group_retry_topic):
        return out
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
                        group_retry_topic: Optional[str] = None, decode: bool = True) -> PullResult:
    """PULL_MESSAGE response -> PullResult (messages decoded and post-processed; with
    ``decode=False`` the status and offsets only, ``msg_found_list`` empty).

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
    if status is PullStatus.FOUND and resp.bodies and decode:
        t_rx = time.monotonic_ns() if _lt.ENABLED else 0
        try:
            msgs = _cl.decode_records(resp.bodies[0])
        except (ValueError, TypeError) as e:
            raise MQClientError(f"pull from {addr}: records do not decode: {e}") from None
        msgs = post_process_messages(msgs, sub, group_retry_topic)
        if t_rx:
            _lt.stamp_messages("c_rx", msgs, t_rx)
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
    return Frame(RequestCode.SEND_MESSAGE, fields=SendMessageRequestHeader(
        CLIENT_INNER_PRODUCER_GROUP, topic, flag=msg.flag, properties=props, reconsume_times=msg.reconsume_times + 1,
        max_reconsume_times=max_reconsume_times).to_fields(), bodies=[msg.body or b""])


def _check(resp: Frame, addr: str, what: str) -> Frame:
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(f"{what}: {resp.remark or resp.code}", resp.code, addr)
    return resp


# -- blocking client -----------------------------------------------------------------------------
class ConsumerCalls:
    """The consumer's wire calls without I/O: the route cache, the read-address choice, the frames
    and the answers.  Each ``_name`` method is a call (:mod:`rmq.client.calls`): a generator that
    yields ``(addr, frame, timeout_ms)`` and is sent the answer; :class:`ConsumerAPI` drives them
    blocking and :class:`rmq.aio.consumer.AsyncConsumerAPI` awaiting, so each rule (which broker an
    offset call goes to, when a route is refetched, what a refusal raises) is written once.

    Parameters
    ----------
    namesrv_addr : str
        ``host:port[;host:port...]``.
    timeout_ms : int
        Default request timeout (RocketMQ 3000 ms).

    State: the routes fetched (topic -> :class:`TopicRoute`, under one lock), each topic's last
    refresh attempt, the topics in doubt (a pull of them failed on a broker) and
    :class:`PullFromWhichNode`.  Thread-safe.
    """

    def __init__(self, namesrv_addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.namesrv_addrs = [a.strip() for a in (namesrv_addr or "").split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise MQClientError("no NameServer address given")
        self.timeout_ms = timeout_ms
        self._ns_last: Optional[str] = None      # the NameServer that answered last (asked first)
        self._lock = threading.Lock()
        self._routes: dict[str, TopicRoute] = {}
        self.pull_from = PullFromWhichNode()
        self.route_refresh_interval_ms = ROUTE_REFRESH_INTERVAL_MS
        self._refresh_tried: dict = {}            # topic -> time.monotonic() of the last refresh attempt
        self._route_doubt: set = set()            # topics whose last pull failed on a broker (route_suspect)
        self.pull_epochs = PullEpochs()           # MessageQueue -> (brokerEpoch, nextBeginOffset) of its last pull answer

    def _answered(self, addr: str, outcome: object) -> None:
        """Bookkeeping of one request to ``addr``: an answer clears an avoided address, a
        RemotingError makes it avoided for ADDR_ISOLATION_MS (:class:`PullFromWhichNode`)."""
        if isinstance(outcome, RemotingError):
            self.pull_from.mark_unreachable(addr)
        else:
            self.pull_from.mark_reachable(addr)

    # -- routes (no I/O) -----------------------------------------------------------------------
    def cached_routes(self) -> list:
        """The routes fetched so far."""
        with self._lock:
            return list(self._routes.values())

    def all_broker_addrs(self) -> list:
        """Master addresses of the cached routes."""
        return sorted({a for r in self.cached_routes() for a in r.all_master_addrs()})

    def heartbeat_addrs(self) -> list:
        """Every broker address of the cached routes, masters and slaves (RocketMQ consumers
        heartbeat to slaves too: a slave then knows the group when it serves its pulls)."""
        return sorted({a for r in self.cached_routes() for a in r.all_addrs()})

    def note_pull_outcome(self, mq: MessageQueue, outcome: object) -> None:
        """A pull of ``mq`` answered (a Frame) or failed (an exception): a failure that puts the
        route in doubt (:func:`rmq.client.route.route_suspect`) makes :meth:`_refresh_route_if_stale`
        refetch ``mq.topic``'s route every ROUTE_REFRESH_ON_FAILURE_MS until a pull of it is
        answered again."""
        if isinstance(outcome, Frame):
            self.pull_epochs.note(mq, outcome.fields.get("brokerEpoch"), outcome.fields.get("nextBeginOffset"))
        if route_suspect(outcome):
            self._route_doubt.add(mq.topic)
        elif self._route_doubt and isinstance(outcome, Frame):
            self._route_doubt.discard(mq.topic)

    def pull_epoch(self, mq: MessageQueue, offset: int) -> int:
        """The HA epoch (``brokerEpoch``) of the last pull answer of ``mq`` when ``offset`` is the
        position that answer gave (its ``nextBeginOffset``), else 0: a pull from there sends it as
        ``lastEpoch``, and a broker whose log left that epoch behind moves a position read in the
        lost part of it back (PULL_OFFSET_MOVED) instead of letting the consumer skip the messages
        stored there since (``PullMessageProcessor.past_epoch_end``; the rule:
        :class:`rmq.common.pull_epochs.PullEpochs`)."""
        return self.pull_epochs.for_pull(mq, offset)

    def forget_pull_epoch(self, mq: MessageQueue) -> None:
        """``mq``'s position is the caller's (a seek): its next pulls carry no ``lastEpoch``."""
        self.pull_epochs.forget(mq)

    def on_pull_response(self, mq: MessageQueue, resp: object, addr: str) -> None:
        """Record a pull's outcome (a Frame or an exception from a RequestMux) for the next choice
        (``suggestWhichBrokerId``, a failed address) and for the route's doubt (:meth:`note_pull_outcome`)."""
        self.pull_from.on_response(mq, resp, addr)
        self.note_pull_outcome(mq, resp)

    # -- routes (calls) ------------------------------------------------------------------------
    def _fetch_route(self, topic: str, timeout_ms: Optional[int] = None):
        """Ask the NameServers for ``topic``'s route (the one that answered last first, the others
        in a random order, each waited for :func:`rmq.client.route.namesrv_attempt_s` of
        ``timeout_ms``: one that never answers leaves the others the time to); None if unknown.

        Raises
        ------
        RemotingError
            No NameServer answered.
        """
        last: Optional[Exception] = None
        addrs = self.namesrv_addrs
        order = random.sample(addrs, len(addrs))
        if self._ns_last in order:
            order.remove(self._ns_last)
            order.insert(0, self._ns_last)
        share_ms = max(1, int(namesrv_attempt_s(timeout_ms or self.timeout_ms, len(order))))
        for addr in order:
            try:
                resp = yield addr, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic}), share_ms
            except RemotingError as e:
                last = e
                continue
            self._ns_last = addr
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            _check(resp, addr, f"route of {topic}")
            route = TopicRoute.from_wire(topic, unpack_body(resp))
            with self._lock:
                self._routes[topic] = route
            return route
        raise RemotingError(f"no NameServer of {self.namesrv_addrs} answered the route of {topic}: {last}")

    def _route(self, topic: str, max_age_ms: Optional[int] = None):
        """Cached route (refetched when older than ``max_age_ms``, or missing); the cached one when
        the NameServers do not answer."""
        with self._lock:
            r = self._routes.get(topic)
        if r is not None and (max_age_ms is None or (time.monotonic() - r.fetched_at) * 1000 < max_age_ms):
            return r
        try:
            return (yield from self._fetch_route(topic)) or r
        except RemotingError:
            if r is not None:
                return r
            raise

    def _refresh_route_if_stale(self, topic: str, max_age_ms: Optional[int] = None):
        """Refetch ``topic``'s route when older than ``max_age_ms`` (default
        ``route_refresh_interval_ms``; ROUTE_REFRESH_ON_FAILURE_MS while the topic is in doubt),
        trying the NameServers at most once per that interval (an unreachable NameServer costs one
        timeout per interval, not one per call).  Errors are logged; the cached route stays."""
        max_age_ms = self.route_refresh_interval_ms if max_age_ms is None else max_age_ms
        if topic in self._route_doubt:           # a pull failed on a broker: its master may have changed
            max_age_ms = min(max_age_ms, ROUTE_REFRESH_ON_FAILURE_MS)
        now = time.monotonic()
        with self._lock:
            if not route_refresh_due(self._routes.get(topic), self._refresh_tried.get(topic, -1e18), now,
                                     max_age_ms):
                return
            self._refresh_tried[topic] = now
        try:
            yield from self._fetch_route(topic)
        except MQClientError as e:
            log.warning("route refresh of %s failed: %s", topic, e)

    def _refresh_doubtful_routes(self):
        """Refetch the routes in doubt (a pull of them failed on a broker), each at most every
        ROUTE_REFRESH_ON_FAILURE_MS."""
        for topic in list(self._route_doubt):
            yield from self._refresh_route_if_stale(topic, ROUTE_REFRESH_ON_FAILURE_MS)

    def _group_addrs(self, broker_name: str, topic: Optional[str] = None, fetch: bool = True):
        """brokerId (int) -> address of ``broker_name`` from the freshest cached route listing it
        (``topic``'s first); with ``fetch``, fetches ``topic``'s route when no cached route lists
        the group."""
        addrs = group_addrs(self.cached_routes(), broker_name, topic)
        if not addrs and topic is not None and fetch:
            r = yield from self._fetch_route(topic)
            addrs = dict(r.broker_addrs.get(broker_name) or {}) if r else {}
        return addrs

    def _broker_addr(self, broker_name: str, topic: Optional[str] = None):
        """Master address of ``broker_name`` from the cached routes (refreshing ``topic``'s if needed).
        For sends-like calls (locks, send-back); reads use :meth:`_read_broker_addr`.

        Raises
        ------
        MQClientError
            The broker group has no known master.
        """
        a = group_addrs(self.cached_routes(), broker_name, topic).get(MASTER_ID)
        if a:
            return a
        if topic is not None:
            r = yield from self._fetch_route(topic)
            a = r.master_addr(broker_name) if r else None
            if a:
                return a
        raise MQClientError(f"the broker[{broker_name}] does not exist")

    def _read_broker_addr(self, broker_name: str, topic: Optional[str] = None):
        """``(broker id, address)`` for offset calls of ``broker_name``: the master, else (master
        gone from the route, or avoided after a failure) the lowest-id slave.

        Raises
        ------
        MQClientError
            No route lists the broker group.
        """
        found = self.pull_from.select_for_offsets((yield from self._group_addrs(broker_name, topic)))
        if found is None:
            raise MQClientError(f"the broker[{broker_name}] does not exist")
        return found

    def _pull_broker_addr(self, mq: MessageQueue, fetch: bool = True):
        """``(broker id, address)`` for the next pull of ``mq``: the broker the last pull response
        suggested (``suggestWhichBrokerId``) when the route lists it, else the master, else the
        lowest-id slave; an address avoided after a failure only when nothing else is left.
        ``broker id != 0`` is a slave (no commit-offset flag in the pull then).  ``fetch=False``
        never calls the NameServer.

        Raises
        ------
        MQClientError
            No route lists the broker group.
        """
        found = self.pull_from.select(mq, (yield from self._group_addrs(mq.broker_name, mq.topic, fetch)))
        if found is None:
            raise MQClientError(f"the broker[{mq.broker_name}] does not exist")
        return found

    # -- pulls and offsets ------------------------------------------------------------------------
    def _pull(self, group: str, mq: MessageQueue, offset: int, max_nums: int, sub: Optional[SubscriptionData] = None,
              suspend_ms: int = 0, timeout_ms: Optional[int] = None, commit_offset: int = -1,
              group_retry_topic: Optional[str] = None, last_epoch: int = 0):
        """One PULL_MESSAGE to the broker :meth:`_pull_broker_addr` picks (the route is refreshed
        when older than ``route_refresh_interval_ms``); the response's ``suggestWhichBrokerId``
        picks the broker of the next pull of ``mq``.  A :class:`PullResult`.  ``last_epoch``: the
        HA epoch ``offset`` was read in (0: none), as :meth:`pull_epoch` (an offset read in a tail
        the broker's log lost answers OFFSET_ILLEGAL, its next begin offset where that tail began).

        Raises
        ------
        MQBrokerError
            The broker refused.
        RemotingError
            No answer (the address is then avoided: the next pull goes to another broker of the group).
        """
        yield from self._refresh_route_if_stale(mq.topic)
        bid, addr = yield from self._pull_broker_addr(mq)
        if bid != MASTER_ID:
            commit_offset = -1                  # a slave does not take commits in pulls (RocketMQ)
        frame = build_pull_frame(group, mq, offset, max_nums, sub if sub else SUB_ALL, commit_offset,
                                 suspend_ms, last_epoch)
        if timeout_ms is None:
            timeout_ms = suspend_ms + self.timeout_ms if suspend_ms else self.timeout_ms
        try:
            resp = yield addr, frame, timeout_ms
        except RemotingError as e:
            self.note_pull_outcome(mq, e)
            raise
        self.note_pull_outcome(mq, resp)
        self.pull_from.update_from_response(mq, resp)
        return parse_pull_response(resp, sub, addr, group_retry_topic)

    def _invoke_read(self, mq: MessageQueue, frame: Frame):
        """``(addr, response)`` of an offset call to ``mq``'s group: the master, else a slave; when
        the chosen broker does not answer and the group has another one (a dead master still in
        the route), the call is made once more there."""
        _, addr = yield from self._read_broker_addr(mq.broker_name, mq.topic)
        try:
            return addr, (yield addr, frame, None)
        except RemotingError:
            _, other = yield from self._read_broker_addr(mq.broker_name, mq.topic)     # ``addr`` is avoided now
            if other == addr:
                raise
            return other, (yield other, frame, None)

    def _offset_call(self, code: int, mq: MessageQueue, what: str, **fields):
        addr, resp = yield from self._invoke_read(mq, Frame(code, fields={"topic": mq.topic, "queueId": mq.queue_id,
                                                                          **fields}))
        return int(_check(resp, addr, f"{what} of {mq}").fields.get("offset", 0))

    def _max_offset(self, mq: MessageQueue):
        """The queue's max offset (one past its last message)."""
        return (yield from self._offset_call(RequestCode.GET_MAX_OFFSET, mq, "max offset"))

    def _min_offset(self, mq: MessageQueue):
        """The queue's min offset (its first message still stored)."""
        return (yield from self._offset_call(RequestCode.GET_MIN_OFFSET, mq, "min offset"))

    def _search_offset(self, mq: MessageQueue, timestamp_ms: int):
        """The queue offset of the first message stored at or after ``timestamp_ms`` (ms)."""
        return (yield from self._offset_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, "offset by time",
                                             timestamp=int(timestamp_ms)))

    def _query_consumer_offset(self, group: str, mq: MessageQueue):
        """The group's stored offset of ``mq``; -1 on QUERY_NOT_FOUND.

        Raises
        ------
        MQBrokerError, RemotingError
        """
        addr, resp = yield from self._invoke_read(mq, Frame(RequestCode.QUERY_CONSUMER_OFFSET, fields={
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id}))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        return int(_check(resp, addr, f"query offset of {mq}").fields.get("offset", -1))

    def _update_consumer_offset(self, group: str, mq: MessageQueue, offset: int):
        """Store ``offset`` on the master, else (master gone or avoided) on a slave (kept there
        locally; RocketMQ does the same).  Sends ``lastEpoch`` when ``offset`` is within what the
        last pull answer of ``mq`` gave (its ``brokerEpoch``; :meth:`pull_epoch`): a broker whose
        log lost the tail the offset was read in stores the offset where its newer epochs begin
        (``ConsumerManageProcessor.on_update_consumer_offset``)."""
        fields = {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": int(offset)}
        epoch = self.pull_epochs.for_commit(mq, int(offset))
        if epoch:                           # read within what that answer gave: the broker lowers
            fields["lastEpoch"] = epoch     # an offset read in a tail it lost
        addr, resp = yield from self._invoke_read(mq, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields=fields))
        _check(resp, addr, f"update offset of {mq}")

    # -- group membership -----------------------------------------------------------------------
    def _heartbeat(self, addr: str, client_id: str, consumer_datas: Sequence[dict]):
        """HEART_BEAT with ``consumer_datas`` (:func:`consumer_data`) to ``addr``."""
        _check((yield addr, Frame(RequestCode.HEART_BEAT, bodies=[heartbeat_body(client_id, consumer_datas)]),
                None), addr, "heartbeat")

    def _unregister(self, addr: str, client_id: str, group: str):
        """UNREGISTER_CLIENT of ``client_id`` from ``group`` at ``addr`` (``UNREGISTER_TIMEOUT_MS``)."""
        _check((yield addr, Frame(RequestCode.UNREGISTER_CLIENT, fields={
            "clientID": client_id, "consumerGroup": group}), UNREGISTER_TIMEOUT_MS), addr, "unregister")

    def _consumer_id_list(self, addr: str, group: str):
        """Client ids of ``group`` known to the broker at ``addr`` ([] when none)."""
        resp = yield addr, Frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, fields={"consumerGroup": group}), None
        if resp.code != ResponseCode.SUCCESS:
            return []
        body = unpack_body(resp)
        ids = body.get("consumerIdList") if isinstance(body, dict) else None
        return [str(x) for x in ids or []]

    def _lock_batch_mq(self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                       timeout_ms: int = 1000):
        """LOCK_BATCH_MQ: the set of ``mqs`` this client holds now."""
        resp = yield addr, Frame(RequestCode.LOCK_BATCH_MQ, bodies=[mq_set_body(group, client_id, mqs)]), timeout_ms
        return parse_lock_response(_check(resp, addr, "lock queues"))

    def _unlock_batch_mq(self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                         timeout_ms: int = 1000):
        """UNLOCK_BATCH_MQ of ``mqs``."""
        _check((yield addr, Frame(RequestCode.UNLOCK_BATCH_MQ, bodies=[mq_set_body(group, client_id, mqs)]),
                timeout_ms), addr, "unlock queues")

    # -- retry ----------------------------------------------------------------------------------------
    def _send_message_back(self, group: str, mq: MessageQueue, msg, delay_level: int, max_reconsume_times: int):
        """CONSUMER_SEND_MSG_BACK to the broker holding ``msg``; on failure a copy is sent to
        ``%RETRY%group`` (SPEC.md §12.2).

        Raises
        ------
        MQClientError
            Both ways failed (the caller consumes the message again locally).
        """
        addr = yield from self._broker_addr(mq.broker_name, mq.topic)
        try:
            _check((yield addr, send_back_frame(group, msg, delay_level, max_reconsume_times), None), addr,
                   "send message back")
            return
        except MQClientError as e:
            log.warning("send back of %s to %s failed (%s); sending a copy to %s", msg.msg_id, addr, e,
                        retry_topic(group))
        _check((yield addr, retry_send_frame(group, msg, max_reconsume_times, delay_level), None), addr,
               "send to retry topic")


class ConsumerAPI(ConsumerCalls):
    """Blocking wire calls of a consumer, with a route cache (:class:`ConsumerCalls` driven with a
    blocking :meth:`invoke`).  Parameters as :class:`ConsumerCalls`, plus ``auth``: CURVE client
    keys (:func:`rmq.security.client_auth`).

    Concurrency: thread-safe.  Each calling thread gets its own
    :class:`RemotingClient` (ZeroMQ sockets are single-threaded); :meth:`close`
    closes all of them and must be called once the callers are done.
    """

    def __init__(self, namesrv_addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, auth=None):
        super().__init__(namesrv_addr, timeout_ms)
        tune_malloc()                               # pull pages: rmq.common.malloc_tuning
        self.auth = security.client_auth(auth)     # CURVE keys (rmq.security); None: plain
        self._local = threading.local()
        self._clients: list[RemotingClient] = []
        self._closed = False

    def remoting(self) -> RemotingClient:
        if self._closed:
            raise MQClientError("consumer client is closed")
        c = getattr(self._local, "client", None)
        if c is None:
            c = RemotingClient(auth=self.auth)
            self._local.client = c
            with self._lock:
                self._clients.append(c)
        return c

    def invoke(self, addr: str, frame: Frame, timeout_ms: Optional[int] = None) -> Frame:
        """Send ``frame`` to ``addr`` and return the answer; a failure makes ``addr`` avoided by the
        read-address choices for ``ADDR_ISOLATION_MS`` (an answer clears that).

        Raises
        ------
        RemotingError
            No answer in time (:class:`RemotingTimeoutError`; :class:`RemotingConnectionClosedError`
            when the connection dropped), or ``frame`` cannot be encoded.  An undecodable answer is
            dropped by the transport (then no answer comes in time).
        """
        try:
            resp = self.remoting().invoke(addr, frame, timeout_ms or self.timeout_ms)
        except ProtocolError as e:
            raise RemotingError(f"cannot encode the request to {addr}: {e}") from None
        except RemotingError as e:
            self._answered(addr, e)
            raise
        self._answered(addr, resp)
        return resp

    def invoke_oneway(self, addr: str, frame: Frame) -> None:
        self.remoting().invoke_oneway(addr, frame)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    fetch_route = blocking(ConsumerCalls._fetch_route)
    route = blocking(ConsumerCalls._route)
    refresh_route_if_stale = blocking(ConsumerCalls._refresh_route_if_stale)
    refresh_doubtful_routes = blocking(ConsumerCalls._refresh_doubtful_routes)
    group_addrs = blocking(ConsumerCalls._group_addrs)
    broker_addr = blocking(ConsumerCalls._broker_addr)
    read_broker_addr = blocking(ConsumerCalls._read_broker_addr)
    pull_broker_addr = blocking(ConsumerCalls._pull_broker_addr)
    pull = blocking(ConsumerCalls._pull)
    max_offset = blocking(ConsumerCalls._max_offset)
    min_offset = blocking(ConsumerCalls._min_offset)
    search_offset = blocking(ConsumerCalls._search_offset)
    query_consumer_offset = blocking(ConsumerCalls._query_consumer_offset)
    update_consumer_offset = blocking(ConsumerCalls._update_consumer_offset)
    heartbeat = blocking(ConsumerCalls._heartbeat)
    unregister = blocking(ConsumerCalls._unregister)
    consumer_id_list = blocking(ConsumerCalls._consumer_id_list)
    lock_batch_mq = blocking(ConsumerCalls._lock_batch_mq)
    unlock_batch_mq = blocking(ConsumerCalls._unlock_batch_mq)
    send_message_back = blocking(ConsumerCalls._send_message_back)


def decode_answer(parts: list, addr: str, on_request: Optional[Callable[[Frame, str], None]]) -> Optional[Frame]:
    """A message read from a broker connection: its response Frame, or None when it was
    undecodable (logged) or a broker's own request (NOTIFY_CONSUMER_IDS_CHANGED), which goes
    to ``on_request(frame, addr)`` if given (its errors logged, never raised)."""
    try:
        frame = P.decode(parts)
    except ProtocolError as e:
        log.warning("undecodable response from %s: %s", addr, e)
        return None
    if frame.is_response:
        return frame
    if on_request is not None:
        try:
            on_request(frame, addr)
        except Exception:  # noqa: BLE001 - a handler's bug must not stop the reader
            log.exception("handling request %s from %s failed", frame.code, addr)
    return None


_RUN_CALLS = object()      # RequestMux.run_calls' tokens: (_RUN_CALLS, index of the call)


class RequestMux:
    """Many outstanding requests over DEALER sockets (one per address), answered in any order.

    The pull engine of the push consumer and of ``PullConsumer.poll``: requests are
    sent with :meth:`send` and come back from :meth:`poll` as ``(token, Frame or
    exception, addr)``; a request not answered by its deadline comes back as a
    :class:`RemotingTimeoutError` and a late answer to it is dropped.  Extra file
    descriptors (a wake-up pipe) can be polled alongside.

    Concurrency: single-threaded (create, use and close it in one thread).
    """

    def __init__(self, ctx: Optional[zmq.Context] = None, auth=None):
        self.ctx = ctx or zmq.Context.instance()
        self.auth = security.client_auth(auth)     # CURVE keys (rmq.security); None: plain
        self.poller = zmq.Poller()
        self._sockets: dict = {}
        self._addr_of: dict = {}
        self._opaque = itertools.count(1)
        self.pending: dict = {}          # opaque -> (deadline, addr, token)
        self._monitors: dict = {}        # addr -> its socket's monitor (disconnect events)
        # on_request(frame, addr): a broker's own request on these connections (NOTIFY_CONSUMER_IDS_CHANGED)
        self.on_request: Optional[Callable[[Frame, str], None]] = None
        self._monitor_addr: dict = {}    # monitor socket -> addr
        self._down: set = set()          # addrs whose connection dropped and has not come back

    def _socket(self, addr: str) -> zmq.Socket:
        s = self._sockets.get(addr)
        if s is None:
            s = P.dealer(self.ctx, auth=self.auth)
            # a dead broker fails its pulls at once, and later ones after RECONNECT_WAIT_MS
            mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            s.connect(P.endpoint(addr))
            self._sockets[addr] = s
            self._addr_of[s] = addr
            self._monitors[addr] = mon
            self._monitor_addr[mon] = addr
            self.poller.register(s, zmq.POLLIN)
            self.poller.register(mon, zmq.POLLIN)
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
            send_parts(s, P.encode(frame))
        except zmq.Again:
            raise RemotingError(f"send queue to {addr} is full") from None
        now = time.monotonic()
        deadline = now + timeout_ms / 1000.0
        if addr in self._down:                   # its connection dropped and has not come back (yet)
            deadline = min(deadline, now + RECONNECT_WAIT_MS / 1000.0)
        self.pending[frame.opaque] = (deadline, addr, token)
        return frame.opaque

    def cancel(self, opaque: int) -> None:
        self.pending.pop(opaque, None)

    def run_calls(self, calls: list, timeout_ms: int,
                  answered: Optional[Callable[[str, object], None]] = None) -> list:
        """Drive ``calls`` (:mod:`rmq.client.calls` generators) at once: each call's next request
        goes out as soon as it yields it, so n calls of k requests each take about k round trips
        instead of n x k (a PullConsumer's start positions: two per queue).  ``timeout_ms`` is a
        request's when the call gives none; ``answered(addr, Frame or exception)`` sees every
        outcome (the client's address bookkeeping).  The mux must have nothing else in flight
        (what this reads is its own).  Returns each call's result, or the exception it let out,
        in the order of ``calls``."""
        out: list = [None] * len(calls)
        live = 0

        def step(i: int, advance, value) -> None:
            nonlocal live
            while True:
                try:
                    addr, frame, t = advance(value)
                except StopIteration as stop:
                    out[i] = stop.value
                    return
                except Exception as e:  # noqa: BLE001 - the call's own failure is its result
                    out[i] = e
                    return
                try:
                    self.send(addr, frame, t or timeout_ms, (_RUN_CALLS, i))
                except (RemotingError, ProtocolError) as e:
                    err = e if isinstance(e, RemotingError) else RemotingError(
                        f"cannot encode the request to {addr}: {e}")
                    advance, value = calls[i].throw, err       # handed to the call, as drive() does
                    continue
                live += 1
                return

        for i, call in enumerate(calls):
            step(i, call.send, None)
        while live:
            done, _ = self.poll(100)
            for token, resp, addr in done:
                if type(token) is not tuple or token[0] is not _RUN_CALLS:
                    continue
                live -= 1
                if answered is not None:
                    answered(addr, resp)
                call = calls[token[1]]
                step(token[1], call.throw if isinstance(resp, Exception) else call.send, resp)
        return out

    def register_fd(self, fd: int) -> None:
        self.poller.register(fd, zmq.POLLIN)

    def next_deadline(self) -> Optional[float]:
        return min((d for d, _, _ in self.pending.values()), default=None)

    def poll(self, timeout_ms: float) -> tuple:
        """Wait up to ``timeout_ms``; returns (completed [(token, Frame | Exception, addr)], ready fds)."""
        events = self.poller.poll(max(0.0, timeout_ms))
        done = []
        fds = set()
        closed = []
        for sock, _ in events:
            if isinstance(sock, int):
                fds.add(sock)
                continue
            addr = self._monitor_addr.get(sock)
            if addr is not None:
                dropped, up = self._connection_events(sock)
                if dropped:                      # what was in flight on the old connection is lost
                    closed.append(addr)
                if up is False:
                    self._down.add(addr)
                elif up:
                    self._down.discard(addr)
                continue
            self._drain(sock, self._addr_of.get(sock, ""), done)
        for addr in closed:
            # the connection dropped (a killed broker): what it answered before counts, the rest of
            # its requests fail now rather than at their deadline (a long poll's is 30 s away)
            self._drain(self._sockets[addr], addr, done)
            for opaque in [o for o, (_, a, _) in self.pending.items() if a == addr]:
                _, _, token = self.pending.pop(opaque)
                done.append((token, RemotingConnectionClosedError(f"connection to {addr} closed with the request in flight"), addr))
        if self.pending:
            now = time.monotonic()
            for opaque in [o for o, (d, _, _) in self.pending.items() if d <= now]:
                _, addr, token = self.pending.pop(opaque)
                done.append((token, RemotingTimeoutError(f"no response from {addr} in time"), addr))
        return done, fds

    def _drain(self, sock: zmq.Socket, addr: str, done: list) -> None:
        for parts in recv_waiting(sock, 1024):
            resp = decode_answer(parts, addr, self.on_request)
            if resp is None:
                continue
            entry = self.pending.pop(resp.opaque, None)
            if entry is not None:
                done.append((entry[2], resp, addr))

    @staticmethod
    def _connection_events(monitor: zmq.Socket) -> tuple:
        """Drain a monitor socket: ``(a disconnection was seen, state)`` with state False when the
        last event was a disconnection, True when it was a handshake, None when there was none."""
        state = None
        dropped = False
        for event in monitor_events(monitor):
            if event == zmq.EVENT_DISCONNECTED:
                state, dropped = False, True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                state = True
        return dropped, state

    def close(self) -> None:
        for addr, s in self._sockets.items():
            mon = self._monitors.get(addr)
            if mon is not None:
                try:
                    s.disable_monitor()
                except zmq.ZMQError:
                    pass
                mon.close(0)
            s.close(0)
        self._sockets.clear()
        self._addr_of.clear()
        self._monitors.clear()
        self._monitor_addr.clear()
        self.pending.clear()
