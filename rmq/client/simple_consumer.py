"""SimpleConsumer: POP consumption (RocketMQ 5's SimpleConsumer, snake_case).

::

    from rmq import SimpleConsumer
    with SimpleConsumer("127.0.0.1:9876", "cg", subscriptions={"orders": "*"}) as c:
        for view in c.receive(16, invisible_duration_s=30):
            handle(view.body)
            c.ack(view)

No queue belongs to a consumer: every consumer of the group receives from every queue, and
a message received and not acked within its invisible duration is delivered again (to any
consumer of the group), up to the group's ``retryMaxTimes`` (16), then moved to
``%DLQ%<group>``.  The broker side and the receipt handle format: :mod:`rmq.actors.pop`.

The frame builders, the response parser and the calls (:class:`SimpleConsumerCalls`) here are
shared with :mod:`rmq.aio`'s SimpleConsumer; only the waiting differs (:mod:`rmq.client.calls`).

Threads and state: :class:`SimpleConsumer` runs its calls in the caller's thread (one thread at a
time per consumer): the subscriptions (``_subs``) and the route cache of its
:class:`rmq.client.consumer_api.ConsumerAPI`.  ``ack_async`` starts one ack thread
(:class:`_AckSender`), which owns the acks waiting to be sent: an :class:`AckLane` per broker,
under its condition.  :class:`AckLane` itself does no I/O and takes no lock (its driver's: the ack
thread, or rmq.aio's event loop).
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from typing import Iterable, Mapping, Optional, Sequence, Union

from rmq._core import commitlog as _cl
from rmq._core.consume import MessageView, ack_bits, ack_groups, group_by_broker, lane_take, pop_views
from rmq.client.calls import blocking, drive
from rmq.client.futures import SendFuture
from rmq.client.consumer_api import (ConsumerAPI, SubscriptionData, consumer_data, default_client_id,
                                     heartbeat_body, post_process_messages)
from rmq.client.remoting import DEFAULT_TIMEOUT_MS
from rmq.errors import MQBrokerError, MQClientError, RemotingError
from rmq.filter import ExpressionType, MessageSelector
from rmq.protocol import Frame, RequestCode, ResponseCode, pack_body

log = logging.getLogger("rmq.simple_consumer")

MAX_MESSAGE_NUM = 32                    # PopMessageProcessor's maxMsgNums ceiling
MIN_INVISIBLE_DURATION_S = 1.0          # rmq.actors.pop.MIN_INVISIBLE_TIME_MS
MAX_INVISIBLE_DURATION_S = 12 * 3600.0  # rmq.actors.pop.MAX_INVISIBLE_TIME_MS (RocketMQ's proxy: 12 h)
AWAIT_DURATION_S = 15.0                 # long polling of an empty receive (brokerSuspendMaxTimeMillis)
MAX_BATCH_ACK = 1024                    # receipt handles per BATCH_ACK_MESSAGE (rmq.actors.pop)
# rmq.aio: ack requests out per broker before acks wait and merge.  2: rmq.aio receive + ack_batch
# loops, 300,000 x 100 B, timed to the last ack, alternated 3 times (stop 42): 8 loops 131-144k
# msgs/s at 2 against 120-128k at 1 (a loop waits less for its ack); 64 loops 207-261k against
# 233-245k (the machine full: the same within the noise).  Stop 41's "1 beats 2" was measured with
# the 1 s of idle long polling after the last message counted in.
ACK_REQUESTS_IN_FLIGHT = 2
ACK_FLUSH_TIMEOUT_S = 10.0              # shutdown() waits this long for the ack_async acks asked for
HEARTBEAT_INTERVAL_S = 30.0             # heartbeatBrokerInterval
CONSUME_TYPE_POP = "CONSUME_POP"        # ConsumeType.CONSUME_POP
RETRY_FLAG_NORMAL = "0"


class AckError(MQClientError):
    """Some acks of :meth:`SimpleConsumer.ack_batch` were refused: ``failed`` holds their views
    (not in flight any more: their invisible time passed and they will be delivered again)."""

    def __init__(self, message: str, failed: list):
        super().__init__(message)
        self.failed = failed


# -- sans-I/O parts, shared with rmq.aio ------------------------------------------------------
def check_receive_args(max_message_num: int, invisible_duration_s: float) -> int:
    """The invisible time in ms; ValueError for arguments out of range."""
    if isinstance(max_message_num, bool) or not isinstance(max_message_num, int) \
            or not 1 <= max_message_num <= MAX_MESSAGE_NUM:
        raise ValueError(f"max_message_num must be an int in [1, {MAX_MESSAGE_NUM}], got {max_message_num!r}")
    return check_invisible(invisible_duration_s)


def check_invisible(seconds: float) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not MIN_INVISIBLE_DURATION_S <= seconds <= MAX_INVISIBLE_DURATION_S:
        raise ValueError(f"invisible duration must be in [{MIN_INVISIBLE_DURATION_S}, {MAX_INVISIBLE_DURATION_S}] "
                         f"seconds, got {seconds!r}")
    return int(seconds * 1000)


def check_consumer_args(group: str, init_mode: str, await_duration_s: float) -> None:
    """ValueError for a SimpleConsumer's constructor arguments out of range."""
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty str")
    if init_mode not in ("MAX", "MIN"):
        raise ValueError(f"init_mode must be 'MAX' or 'MIN', got {init_mode!r}")
    if isinstance(await_duration_s, bool) or not isinstance(await_duration_s, (int, float)) or await_duration_s < 0:
        raise ValueError(f"await_duration_s must be >= 0, got {await_duration_s!r}")


def build_subscriptions(subscriptions: Optional[Mapping]) -> dict:
    out = {}
    for topic, expr in (subscriptions or {}).items():
        out[topic] = SubscriptionData.build(topic, expr)
    return out


def pop_frame(group: str, sub: SubscriptionData, max_nums: int, invisible_ms: int, poll_ms: int,
              init_mode: str = "MAX") -> Frame:
    """POP_MESSAGE of every queue of ``sub.topic`` on one broker (PopMessageRequestHeader)."""
    return Frame(RequestCode.POP_MESSAGE, fields={
        "consumerGroup": group, "topic": sub.topic, "queueId": -1, "maxMsgNums": max_nums,
        "invisibleTime": invisible_ms, "pollTime": poll_ms, "bornTime": int(time.time() * 1000),
        "initMode": init_mode, "expType": sub.expression_type, "exp": sub.sub_string})


def parse_pop_response(resp: Frame, sub: SubscriptionData, addr: str = "") -> tuple:
    """``(views, dropped)``: the views to hand out, and those that failed the exact tag re-check
    (a tag hash collision, SPEC.md §13.2; the caller acks them).

    Raises
    ------
    MQBrokerError
        Any refusal (TOPIC_NOT_EXIST, SUBSCRIPTION_PARSE_FAILED, ...).
    MQClientError
        The records do not decode or do not match the checkpoint info.
    """
    if resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT):
        return [], []
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(resp.remark or f"pop failed with code {resp.code}", resp.code, addr)
    f = resp.fields
    try:
        msgs = _cl.decode_records(resp.bodies[0]) if resp.bodies else []
        pt, it, bn = int(f["popTime"]), int(f["invisibleTime"]), str(f["brokerName"])
        segments = [(int(so), int(rq), str(retry), int(n)) for so, retry, _q, rq, n in f["ckInfo"]]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise MQClientError(f"pop from {addr}: malformed response: {e}") from None
    if sum(s[3] for s in segments) != len(msgs):
        raise MQClientError(f"pop from {addr}: {len(msgs)} records for {sum(s[3] for s in segments)} checkpointed")
    post_process_messages(msgs, None)
    # "*": every record (its properties stay unparsed until asked for); a TAG subscription re-checks
    return pop_views(msgs, segments, sub.topic, pt, it, bn, sub.tags_set, sub.matches)


def ack_frame(group: str, view: MessageView) -> Frame:
    return Frame(RequestCode.ACK_MESSAGE, fields={
        "consumerGroup": group, "topic": view.topic, "queueId": view.queue_id,
        "offset": view.queue_offset, "extraInfo": view.receipt_handle})


def batch_ack_frame(group: str, broker_name: str, views: Sequence[MessageView]) -> tuple:
    """``(frame, index)``: one BATCH_ACK_MESSAGE of ``views`` (all of ``broker_name``), its body
    RocketMQ's BatchAckMessageRequestBody (one BatchAck per checkpoint, its ``b`` RocketMQ's BitSet
    of the views' queue offset - startOffset as ``BitSet.toByteArray()`` bytes, see
    :meth:`rmq.actors.pop.PopService.on_batch_ack`); ``index[i]`` is ``(startOffset, views)`` of
    BatchAck ``i`` (:func:`batch_ack_failures` reads it).  A view given twice has one bit."""
    by_ck = ack_groups(views)
    acks = []
    for (topic, ck, qid), vs in by_ck.items():
        so, pt, it, rq, retry = ck
        acks.append({"c": group, "t": topic, "r": retry, "so": so, "q": qid, "rq": rq, "pt": pt, "it": it,
                     "b": ack_bits(vs, so)})
    return Frame(RequestCode.BATCH_ACK_MESSAGE, fields={"consumerGroup": group},
                 bodies=[pack_body({"brokerName": broker_name, "acks": acks})]), \
        [(key[1][0], vs) for key, vs in by_ck.items()]


def change_invisible_frame(group: str, view: MessageView, invisible_ms: int) -> Frame:
    return Frame(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields={
        "consumerGroup": group, "topic": view.topic, "queueId": view.queue_id, "offset": view.queue_offset,
        "extraInfo": view.receipt_handle, "invisibleTime": invisible_ms})


def check_ack_response(resp: Frame, view: MessageView, addr: str) -> None:
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(resp.remark or f"ack failed with code {resp.code}", resp.code, addr)


def apply_change_invisible(resp: Frame, view: MessageView, addr: str) -> None:
    """Give ``view`` the receipt handle the broker answered with."""
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(resp.remark or f"change invisible time failed with code {resp.code}", resp.code, addr)
    f = resp.fields
    view._ck = (view.queue_offset, int(f["popTime"]), int(f["invisibleTime"]), int(f["reviveQid"]), view._ck[4])
    view._handle = None


def batch_ack_failures(resp: Frame, index: list, addr: str) -> list:
    """The views of a BATCH_ACK_MESSAGE answer's ``failed`` (``[[ack i, bit], ...]``; ``index``
    from :func:`batch_ack_frame`); entries that name no view sent are ignored."""
    if resp.code != ResponseCode.SUCCESS:
        raise MQBrokerError(resp.remark or f"batch ack failed with code {resp.code}", resp.code, addr)
    failed = resp.fields.get("failed", ())
    if not failed:
        return []
    by_bit: dict = {}
    for i, (so, vs) in enumerate(index):
        for v in vs:
            by_bit[(i, v.message.queue_offset - so)] = v
    out = []
    for item in failed:
        v = by_bit.get(tuple(item)) if isinstance(item, (list, tuple)) else None
        if v is not None:
            out.append(v)
    return out


class AckLane:
    """The acks of one broker that wait while its ack requests are in flight: at most ``limit``
    requests in flight per broker, and everything that waited goes as the next request (up to
    MAX_BATCH_ACK views): under concurrent ``ack`` / ``ack_batch`` calls the broker gets a few
    requests per round trip instead of one per call.  Nagle's rule for acks, as Kafka's consumer
    merges offset commits; an ack made while fewer than ``limit`` are out goes at once, as before.

    No I/O (the drivers: :class:`rmq.aio.SimpleConsumer`, and the ack thread of
    ``SimpleConsumer.ack_async`` with a limit of one): the driver queues ``(views, waiter)``
    entries with :meth:`add` (``views`` at most MAX_BATCH_ACK, of this broker), counts its
    senders in ``sending``; :meth:`take` gives the next request's entries, which
    :func:`ack_request_call` sends; :meth:`outcomes` splits a merged request's answer.

    State: ``waiting`` (a deque of entries), ``sending`` (the driver's senders at work, each with
    at most one request in flight), ``limit``.
    """
    __slots__ = ("broker_name", "waiting", "sending", "limit")

    def __init__(self, broker_name: str, limit: int = 1):
        self.broker_name = broker_name
        self.waiting: collections.deque = collections.deque()
        self.sending = 0
        self.limit = limit

    def add(self, views: list, waiter) -> None:
        """Queue ``views`` (a list of 1..MAX_BATCH_ACK of this broker's MessageViews) for the
        caller ``waiter``.

        Raises
        ------
        TypeError
            ``views`` is not a list (its items are checked by :meth:`take`).
        ValueError
            No views, or more than MAX_BATCH_ACK.
        """
        if type(views) is not list:
            raise TypeError(f"an ack lane entry holds a list of MessageViews, got {type(views).__name__}")
        if not 1 <= len(views) <= MAX_BATCH_ACK:
            raise ValueError(f"an ack lane entry holds 1..{MAX_BATCH_ACK} views, got {len(views)}")
        self.waiting.append((views, waiter))

    def take(self, live=None) -> Optional[list]:
        """The entries of the next request: the waiting ones in order, as many as fit
        MAX_BATCH_ACK views (at least one), or None when none waits.  Entries whose waiter fails
        ``live(waiter)`` (a cancelled caller) are dropped unsent; an entry that repeats a view
        already taken waits for the next request (one bit per view a request).  The frame is
        :func:`ack_request_call`'s to build (none for an entry that goes alone).

        Raises
        ------
        TypeError
            An entry holds something else than MessageViews (:func:`rmq._core.consume.lane_take`:
            the waiting entries stay as they were).
        """
        return lane_take(self.waiting, MAX_BATCH_ACK, live)          # the loop, in C

    @staticmethod
    def outcomes(entries: list, failed: list) -> list:
        """``[(waiter, its failed views)]`` of a request's answer (``failed``: the views the broker
        refused, :func:`batch_ack_failures`)."""
        if len(entries) == 1:
            return [(entries[0][1], failed)]
        if not failed:                 # the common answer: no view looked up
            return [(w, []) for _, w in entries]
        owner = {id(v): k for k, (vs, _) in enumerate(entries) for v in vs}   # a view is in one entry
        out = [[] for _ in entries]
        for v in failed:
            out[owner[id(v)]].append(v)
        return [(w, out[k]) for k, (_, w) in enumerate(entries)]


class AckWaiter:
    """A caller on an :class:`AckLane`: ``fut`` gets its outcome (its driver's choice of shape);
    ``single`` marks an ``ack`` of one view (an ACK_MESSAGE when it goes alone, its refusal an
    MQBrokerError).  ``fut`` is an asyncio or a concurrent.futures Future: only its driver
    touches it."""
    __slots__ = ("fut", "single")

    def __init__(self, fut, single: bool):
        self.fut, self.single = fut, single


def ack_request_call(api, group: str, lane: AckLane, entries: list):
    """The call (:mod:`rmq.client.calls`) that sends one request of ``lane`` (``entries``, what
    :meth:`AckLane.take` returned) to its broker's master, found through ``api`` (a consumer
    client's :class:`rmq.client.consumer_api.ConsumerCalls`); returns ``[(waiter, refused views,
    exception or None)]``.  An entry alone goes as it would have without the lane (ACK_MESSAGE for
    a single ack); a merged request the broker refuses as a whole goes again entry by entry, so one
    call's refusal stays its own; a single ack the broker refused gets the NO_MESSAGE error
    ACK_MESSAGE would have (:func:`not_in_flight_error`); any other failure (no address,
    RemotingError) is every entry's."""
    try:
        addr = yield from api._broker_addr(lane.broker_name, entries[0][0][0].topic)
    except Exception as e:  # noqa: BLE001 - every entry's outcome
        return [(w, None, e) for _, w in entries]
    if len(entries) == 1:
        outcomes = [(yield from _ack_entry_call(group, lane.broker_name, addr, *entries[0]))]
    else:
        outcomes = yield from _merged_call(group, lane.broker_name, addr, entries)
    return [(w, refused, not_in_flight_error(refused[0], addr) if exc is None and refused and w.single else exc)
            for w, refused, exc in outcomes]


def _merged_call(group: str, broker_name: str, addr: str, entries: list):
    frame, index = batch_ack_frame(group, broker_name, [v for vs, _ in entries for v in vs])
    try:
        failed = batch_ack_failures((yield addr, frame, None), index, addr)
    except MQBrokerError:
        out = []
        for entry in entries:
            out.append((yield from _ack_entry_call(group, broker_name, addr, *entry)))
        return out
    except Exception as e:  # noqa: BLE001 - every entry's outcome
        return [(w, None, e) for _, w in entries]
    return [(w, refused, None) for w, refused in AckLane.outcomes(entries, failed)]


def _ack_entry_call(group: str, broker_name: str, addr: str, views: list, w: "AckWaiter"):
    """One entry as a request of its own: ``(waiter, refused views, exception or None)``."""
    try:
        if w.single:
            check_ack_response((yield addr, ack_frame(group, views[0]), None), views[0], addr)
            return w, [], None
        frame, index = batch_ack_frame(group, broker_name, views)
        return w, batch_ack_failures((yield addr, frame, None), index, addr), None
    except Exception as e:  # noqa: BLE001 - the entry's outcome
        return w, None, e


def not_in_flight_error(view: MessageView, addr: str) -> MQBrokerError:
    """What a single ack of ``view`` merged into a batch raises when the broker refused it (the
    NO_MESSAGE of ACK_MESSAGE)."""
    return MQBrokerError(f"message {view.topic}/{view.queue_id}@{view.queue_offset} is not in flight: already "
                         f"acked, or its invisible time passed and it was revived", ResponseCode.NO_MESSAGE, addr)


def pop_targets(routes: Iterable, subs: Mapping[str, SubscriptionData]) -> list:
    """``[(subscription, broker name, master address)]``: every readable broker of every subscribed
    topic with a master (POP is served by masters)."""
    out = []
    for route in routes:
        sub = subs.get(route.topic)
        if sub is None:
            continue
        for qd in route.queue_datas:
            addr = route.master_addr(qd.broker_name)
            if addr and qd.readable and qd.read_queue_nums > 0:
                out.append((sub, qd.broker_name, addr))
    return out


class SimpleConsumerCalls:
    """What a SimpleConsumer does, without I/O: its options, subscriptions and the calls
    (:mod:`rmq.client.calls`) of receive / ack / change_invisible_duration, composed with the
    consumer calls of its client (:class:`rmq.client.consumer_api.ConsumerCalls`).
    :class:`SimpleConsumer` drives them blocking and :class:`rmq.aio.SimpleConsumer` awaiting.

    State: the options, ``_subs`` (topic -> SubscriptionData), the rotation of receives over the
    brokers, the last heartbeat (time.monotonic()) and ``_api``, the client (None until started).
    """

    def __init__(self, namesrv_addr: str, group: str, subscriptions: Optional[Mapping] = None, *,
                 await_duration_s: float = AWAIT_DURATION_S, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 init_mode: str = "MAX", client_id: Optional[str] = None, auth=None):
        check_consumer_args(group, init_mode, await_duration_s)
        self.namesrv_addr = namesrv_addr
        self.group = group
        self.await_ms = int(await_duration_s * 1000)
        self.timeout_ms = timeout_ms
        self.init_mode = init_mode
        self.client_id = client_id or default_client_id()
        self._subs = build_subscriptions(subscriptions)
        self._auth = auth
        self._api = None
        self._rotate = itertools.count()
        self._last_heartbeat = 0.0

    _NOT_STARTED = "SimpleConsumer not started: call start()"

    def _started(self):
        if self._api is None:
            raise MQClientError(self._NOT_STARTED)
        return self._api

    def _invoke(self, addr: str, frame: Frame, timeout_ms: Optional[int]):
        """The client's invoke (what the drivers call for each request)."""
        return self._started().invoke(addr, frame, timeout_ms)

    def unsubscribe(self, topic: str) -> None:
        self._subs.pop(topic, None)

    @property
    def subscriptions(self) -> dict:
        """``{topic: expression}`` (a SQL92 one as its MessageSelector)."""
        return {t: (MessageSelector.by_sql(s.sub_string) if s.expression_type == ExpressionType.SQL92
                    else s.sub_string) for t, s in self._subs.items()}

    # -- calls -----------------------------------------------------------------------------------
    def _start_call(self):
        for topic in self._subs:
            yield from self._route_call(topic)
        yield from self._heartbeat_call(force=True)

    def _unregister_call(self):
        api = self._started()
        for addr in api.all_broker_addrs():
            try:
                yield from api._unregister(addr, self.client_id, self.group)
            except (RemotingError, MQClientError):
                pass

    def _subscribe(self, topic: str, expression: "Union[str, MessageSelector]" = "*"):
        """Add or replace the subscription of ``topic``."""
        sub = SubscriptionData.build(topic, expression)
        if self._api is not None:
            yield from self._route_call(topic)
        self._subs[topic] = sub

    def _route_call(self, topic: str):
        r = yield from self._started()._route(topic)
        if r is None:
            raise MQClientError(f"no route for topic {topic!r}: does it exist?")
        return r

    def _heartbeat_call(self, force: bool = False):
        now = time.monotonic()
        if not force and now - self._last_heartbeat < HEARTBEAT_INTERVAL_S:
            return
        self._last_heartbeat = now
        api = self._started()
        data = consumer_data(self.group, CONSUME_TYPE_POP, "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                             list(self._subs.values()))
        for addr in api.heartbeat_addrs():
            try:
                yield addr, Frame(RequestCode.HEART_BEAT, bodies=[heartbeat_body(self.client_id, [data])]), None
            except (RemotingError, MQClientError) as e:
                log.debug("heartbeat to %s failed: %s", addr, e)

    def _receive(self, max_message_num: int, invisible_duration_s: float):
        """Up to ``max_message_num`` (1..32) messages of the subscribed topics, invisible to every
        consumer of the group for ``invisible_duration_s`` seconds (1 s .. 12 h): ack each before
        then or it is delivered again.  Waits up to ``await_duration_s`` when there is none; an
        empty list then.

        Raises
        ------
        ValueError
            Arguments out of range.
        MQBrokerError
            The broker refused (e.g. SUBSCRIPTION_PARSE_FAILED, or SYSTEM_ERROR for SQL92 without
            ``enablePropertyFilter``).
        RemotingError
            The broker did not answer.
        """
        invisible_ms = check_receive_args(max_message_num, invisible_duration_s)
        api = self._started()
        if not self._subs:
            raise MQClientError("no subscription: call subscribe() first")
        yield from self._heartbeat_call()
        for topic in self._subs:
            yield from api._refresh_route_if_stale(topic)
        targets = pop_targets(api.cached_routes(), self._subs)
        if not targets:
            raise MQClientError(f"no readable broker for topics {sorted(self._subs)}")
        start = next(self._rotate) % len(targets)
        order = targets[start:] + targets[:start]
        # every broker once without waiting, then long polling on the first (RocketMQ 5's client
        # long-polls one broker per receive call)
        for sub, _name, addr in (order if len(order) > 1 else ()):
            views = yield from self._pop_call(sub, addr, max_message_num, invisible_ms, 0)
            if views:
                return views
        sub, _name, addr = order[0]
        return (yield from self._pop_call(sub, addr, max_message_num, invisible_ms, self.await_ms))

    def _pop_call(self, sub: SubscriptionData, addr: str, n: int, invisible_ms: int, poll_ms: int):
        resp = yield addr, pop_frame(self.group, sub, n, invisible_ms, poll_ms, self.init_mode), \
            poll_ms + self.timeout_ms
        views, dropped = parse_pop_response(resp, sub, addr)
        if dropped:         # hash collisions of the tag filter: not this consumer's, acked at once
            try:
                yield from self._batch_ack_call(dropped)
            except (MQClientError, RemotingError) as e:
                log.warning("ack of %d messages the tag filter dropped failed: %s", len(dropped), e)
        return views

    def _ack(self, message_view: MessageView):
        """Acknowledge one message: it is never delivered again.

        Raises
        ------
        MQBrokerError
            NO_MESSAGE: the message is no longer in flight (acked before, or its invisible time
            passed and it was handed back for redelivery).
        RemotingError
            No answer (the ack may or may not have been recorded).
        """
        addr = yield from self._started()._broker_addr(message_view.broker_name, message_view.topic)
        check_ack_response((yield addr, ack_frame(self.group, message_view), None), message_view, addr)

    def _ack_batch(self, message_views: Sequence[MessageView]):
        """Acknowledge many messages with one request per broker (BATCH_ACK_MESSAGE, at most
        MAX_BATCH_ACK per request) - what a receive of many messages wants.

        Raises
        ------
        AckError
            Some were no longer in flight (``failed``); all others are acked.
        MQBrokerError, RemotingError
            As :meth:`ack`.
        """
        views = list(message_views)
        failed = yield from self._batch_ack_call(views)
        if failed:
            raise AckError(f"{len(failed)} of {len(views)} acks refused: no longer in flight "
                           f"(their invisible time passed)", failed)

    def _batch_ack_call(self, views: list):
        api = self._started()
        failed = []
        for name, group_views in group_by_broker(views).items():
            addr = yield from api._broker_addr(name, group_views[0].topic)
            for i in range(0, len(group_views), MAX_BATCH_ACK):
                frame, index = batch_ack_frame(self.group, name, group_views[i:i + MAX_BATCH_ACK])
                failed += batch_ack_failures((yield addr, frame, None), index, addr)
        return failed

    def _change_invisible_duration(self, message_view: MessageView, invisible_duration_s: float):
        """Make the message invisible for ``invisible_duration_s`` seconds from now (1 s .. 12 h);
        ``message_view`` gets the new receipt handle (the old one is spent).

        Raises
        ------
        ValueError, MQBrokerError (NO_MESSAGE as :meth:`ack`), RemotingError
        """
        ms = check_invisible(invisible_duration_s)
        addr = yield from self._started()._broker_addr(message_view.broker_name, message_view.topic)
        resp = yield addr, change_invisible_frame(self.group, message_view, ms), None
        apply_change_invisible(resp, message_view, addr)


class SimpleConsumer(SimpleConsumerCalls):
    """POP consumer (RocketMQ 5 ``SimpleConsumer``).

    Parameters
    ----------
    namesrv_addr : str
        ``host:port[;host:port...]``.
    group : str
        Consumer group; its broker-side ``retryMaxTimes`` (16) bounds redeliveries.
    subscriptions : dict, optional
        ``{topic: expression}``, an expression being a tag expression (``"*"``, ``"a || b"``) or a
        :class:`rmq.MessageSelector` (SQL92 needs the broker's ``enablePropertyFilter=true``).
    await_duration_s : float
        How long an empty :meth:`receive` waits on the broker for messages (long polling; the
        broker caps it at ``brokerSuspendMaxTimeMillis``, 15 s).
    timeout_ms : int
        Request timeout beyond the long polling (RocketMQ 3000 ms).
    init_mode : str
        Where the group's first receive of a queue starts: ``"MAX"`` (the default, RocketMQ's;
        a queue that still starts at offset 0 is read from 0) or ``"MIN"`` (its oldest message).

    Concurrency: one thread at a time per consumer (use one consumer per thread).
    """

    _acker: "Optional[_AckSender]" = None

    def start(self) -> "SimpleConsumer":
        """Connect and look the subscribed topics up.

        Raises
        ------
        MQClientError
            A subscribed topic has no route (does not exist).
        """
        if self._api is None:
            self._api = ConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self._auth)
        try:
            drive(self._start_call(), self._invoke)
        except BaseException:
            api, self._api = self._api, None
            api.close()
            raise
        return self

    def ack_async(self, message_view: MessageView) -> Future:
        """Acknowledge one message without waiting for the broker (RocketMQ 5's ``ackAsync``).

        Returns
        -------
        concurrent.futures.Future
            Done with None once acked; with MQBrokerError NO_MESSAGE (no longer in flight, as
            :meth:`ack`), RemotingError, or MQClientError (the broker's address unknown).  The
            consumer's ack thread sends the acks: one request in flight per broker, the acks
            asked for meanwhile together as the next BATCH_ACK_MESSAGE (:class:`AckLane`; one
            waiting alone goes as ACK_MESSAGE).  :meth:`shutdown` first waits (up to
            ``ACK_FLUSH_TIMEOUT_S``) for the acks asked for.  The future cannot be cancelled.

        Raises
        ------
        MQClientError
            Not started, shutting down, or ``message_view`` not a MessageView.
        """
        if not isinstance(message_view, MessageView):
            raise MQClientError(f"expected a MessageView, got {type(message_view).__name__}")
        self._started()
        acker = self._acker
        if acker is None:
            acker = self._acker = _AckSender(self)
            acker.start()
        fut = SendFuture()
        acker.add(message_view, fut)
        return fut

    def shutdown(self) -> None:
        """Unregister from the brokers and close; messages received and not acked are delivered
        again after their invisible time (acks asked for with :meth:`ack_async` are sent first)."""
        if self._api is None:
            return
        acker, self._acker = self._acker, None
        if acker is not None:
            acker.close(ACK_FLUSH_TIMEOUT_S)
        drive(self._unregister_call(), self._invoke)
        api, self._api = self._api, None
        api.close()

    close = shutdown

    def __enter__(self) -> "SimpleConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    subscribe = blocking(SimpleConsumerCalls._subscribe, "_invoke")
    receive = blocking(SimpleConsumerCalls._receive, "_invoke")
    ack = blocking(SimpleConsumerCalls._ack, "_invoke")
    ack_batch = blocking(SimpleConsumerCalls._ack_batch, "_invoke")
    change_invisible_duration = blocking(SimpleConsumerCalls._change_invisible_duration, "_invoke")


class _AckSender(threading.Thread):
    """The ack thread of a :class:`SimpleConsumer` (started by its first ``ack_async``): finds each
    lane's broker address (once per request), sends the lanes' requests
    (:func:`ack_request_call`, blocking) one after the other and completes the futures.  State:
    ``lanes`` (broker name -> AckLane), ``idle`` (waiting for work) and ``closing``, under ``cond``."""

    def __init__(self, consumer: SimpleConsumer):
        super().__init__(name=f"rmq-ack-{consumer.group}", daemon=True)
        self.consumer = consumer
        self.cond = threading.Condition()
        self.lanes: dict = {}
        self.idle = False
        self.closing = False
        self.abandon = False               # shutdown waited long enough: fail what is not sent

    def add(self, view: MessageView, fut: Future) -> None:
        with self.cond:
            if self.closing:
                raise MQClientError("SimpleConsumer is shutting down")
            lane = self.lanes.get(view.broker_name)
            if lane is None:
                lane = self.lanes[view.broker_name] = AckLane(view.broker_name)
            lane.add([view], AckWaiter(fut, True))
            if self.idle:
                self.cond.notify()

    def close(self, timeout_s: float) -> None:
        """Send what was asked for (waiting up to ``timeout_s``), then end the thread: past it the
        acks not sent yet fail (MQClientError) and only the request on its way is waited for
        (its timeout), so the consumer's sockets are never closed under this thread."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.join(timeout_s)
        if self.is_alive():
            with self.cond:
                self.abandon = True
            # the request on its way: an address look-up and the ack, each within timeout_ms
            self.join(2 * self.consumer.timeout_ms / 1000.0 + 1.0)

    def run(self) -> None:
        c = self.consumer
        group = c.group
        while True:
            with self.cond:
                while not any(lane.waiting for lane in self.lanes.values()):
                    if self.closing:
                        return
                    self.idle = True
                    self.cond.wait()
                    self.idle = False
                work = [(lane, lane.take()) for lane in self.lanes.values() if lane.waiting]
            for lane, taken in work:
                if taken is None:
                    continue
                if self.abandon:
                    for _, w in taken:
                        w.fut.set_exception(MQClientError("SimpleConsumer shut down before the ack was sent"))
                    continue
                try:
                    outcomes = drive(ack_request_call(c._started(), group, lane, taken), c._invoke)
                except Exception as e:  # noqa: BLE001 - the consumer closed under it: every entry's
                    outcomes = [(w, None, e) for _, w in taken]
                for w, refused, exc in outcomes:
                    if exc is not None:
                        w.fut.set_exception(exc)
                    else:
                        w.fut.set_result(None)


__all__ = ["SimpleConsumer", "MessageView", "AckError", "AckLane", "MAX_MESSAGE_NUM", "MIN_INVISIBLE_DURATION_S",
           "MAX_INVISIBLE_DURATION_S", "AWAIT_DURATION_S", "MAX_BATCH_ACK"]

