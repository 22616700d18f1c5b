"""Consumers: ``PullConsumer`` (you pick queues and offsets) and ``PushConsumer`` (a group member
that is given queues and called back), after RocketMQ's ``DefaultMQPullConsumer`` /
``DefaultLitePullConsumer`` and ``DefaultMQPushConsumer`` (SPEC.md §12, §13, §15.2).

PullConsumer::

    with PullConsumer("127.0.0.1:9876", group="cg") as c:
        for mq in c.fetch_subscribe_message_queues("flights"):
            res = c.pull(mq, "*", offset=0, max_nums=32)
            for m in res.msg_found_list: ...
        c.assign(c.fetch_subscribe_message_queues("flights"))
        msgs = c.poll(1000)            # long polling over the assigned queues
        c.commit_sync()

PushConsumer::

    c = PushConsumer("127.0.0.1:9876", "cg")
    c.subscribe("flights", "tagA || tagB")
    c.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    c.start(); ...; c.shutdown()

PushConsumer threads and sockets
    ``rmq-pull-<group>``       the pull service: every queue's long-polling PULL_MESSAGE in flight at
                               once over one DEALER per broker (:class:`RequestMux`), delayed pulls,
                               decoding and tag re-filtering; hands messages to the consume pool.
    ``rmq-rebalance-<group>``  rebalance every ``rebalance_interval_ms`` (routes, GET_CONSUMER_LIST_BY_GROUP,
                               allocation, queue locks), heartbeats, offset persistence, lock renewal.
    ``rmq-consume-<group>_N``  the listener pool (``consume_thread_min`` .. ``consume_thread_max`` threads,
                               grown while listeners block; ``_monitor`` decides); a send-back to the
                               retry topic is made from the consuming thread.
    Each thread that makes blocking calls has its own DEALER sockets (``ConsumerAPI``).

Delivery: at-least-once.  A queue's committed offset is the lowest offset still in
flight in its ProcessQueue, so a crash between processing and commit redelivers.
Rebalancing may redeliver (concurrent mode); with stable membership nothing is
delivered twice.  Orderly mode locks each queue on its broker before consuming it
and, when a queue moves, finishes the running batch, commits and unlocks before the
new owner can lock it, so order per queue holds across a rebalance.
"""
from __future__ import annotations

import enum
import heapq
import inspect
import itertools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

from rmq import latency_trace as _lt
from rmq._core.consume import RUN_COMMIT_INTERVAL_S, ConsumeConcurrentlyContext, ConsumeRun, consume_run  # noqa: F401 (re-exported)
from rmq.client.calls import blocking, drive

if TYPE_CHECKING:                              # poll_arrow's return type; pyarrow is optional (rmq[spark])
    import pyarrow
from rmq.client.consume_pool import CONSUME_THREAD_LIMIT, CONSUME_THREAD_MAX, CONSUME_THREAD_MIN, ConsumePool
from rmq.client.consumer_api import (BROKER_SUSPEND_MAX_TIME_MS, CONSUMER_TIMEOUT_MS_WHEN_SUSPEND, ConsumerAPI,
                                     RequestMux, SubscriptionData, build_pull_frame, consumer_data,
                                     default_client_id, parse_pull_response)
from rmq.client.consumer_process_queue import ProcessQueue
from rmq.client.message import MessageExt, MessageQueue, PullResult, PullStatus
from rmq.client.offset_store import LocalFileOffsetStore, OffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from rmq.client.rebalance import (AllocateMessageQueueAveragely, AllocateMessageQueueAveragelyByCircle,
                                  AllocateMessageQueueByConfig, AllocateMessageQueueByMachineRoom,
                                  AllocateMessageQueueConsistentHash, AllocateMachineRoomNearby, resolve_strategy)
from rmq.client.remoting import DEFAULT_TIMEOUT_MS
from rmq.common.mix_all import MASTER_ID, dlq_topic, is_retry_topic, retry_topic
from rmq.client import trace as _trace
from rmq.filter import MessageSelector
from rmq.errors import MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode

log = logging.getLogger("rmq.client.consumer")

# DefaultMQPushConsumer defaults (SPEC.md §15.2)
PULL_BATCH_SIZE = 32                            # RocketMQ's pullBatchSize: the default max_nums of pull()
# rmq's defaults of the consumers' pull_batch_size (RocketMQ: 32).  A pull costs ~100-150 us of
# Python on the client (request, answer, process queue, hand-off) whatever its size: at 32 the
# PushConsumer spent more on pulls than on messages (100 B: 32 -> 256 took it 110k -> 290k msgs/s,
# PullConsumer.poll 240k -> 1.4M at 256, 1.75M at 512; 512 -> 1024, 400,000 x 100 B alternated:
# poll 1.38-1.73M -> 1.82-2.26M, poll_arrow 1.30-1.45M -> 1.78-1.95M; the PushConsumer, 4 rounds
# of 300,000: 256 374-415k, 512 409-602k, 1024 512-624k msgs/s).  The PushConsumer asked 512
# until stop 48 (two pages under PULL_THRESHOLD_FOR_QUEUE); 1024 against 512, 300,000 x 100 B, 3
# rounds, alternated four times: the client process 0.83-1.20 against 1.07-1.30 us of CPU a
# message, 776k-1.23M against 687k-1.10M msgs/s.  With 1024 a page alone passes the threshold, so
# the next pull waits for the listeners to take its first messages (ProcessQueue.notify_when_below):
# one page held and one in flight per queue.  The broker caps a pull at
# maxTransferCountOnMessageInMemory (rmq: 1024) and maxTransferBytesOnMessageInMemory (256 KiB).
PUSH_PULL_BATCH_SIZE = 1024
POLL_PULL_BATCH_SIZE = 1024
PULL_THRESHOLD_FOR_QUEUE = 1000                 # messages cached per queue before pulls pause
PULL_THRESHOLD_SIZE_FOR_QUEUE_MB = 100          # MiB cached per queue before pulls pause
CONSUME_CONCURRENTLY_MAX_SPAN = 2000            # offsets between first and last cached message
SUSPEND_CURRENT_QUEUE_TIME_MS = 1000            # orderly back-off after SUSPEND_CURRENT_QUEUE_A_MOMENT
PERSIST_CONSUMER_OFFSET_INTERVAL_MS = 5000
HEARTBEAT_BROKER_INTERVAL_MS = 30_000
POLL_NAME_SERVER_INTERVAL_MS = 30_000
REBALANCE_INTERVAL_MS = 20_000                  # rocketmq.client.rebalance.waitInterval
REBALANCE_LOCK_INTERVAL_MS = 20_000             # rocketmq.client.rebalance.lockInterval
PULL_TIME_DELAY_MS_WHEN_EXCEPTION = 3000
PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL = 50
PULL_TIME_DELAY_MS_WHEN_SUSPEND = 1000
MAX_TIME_CONSUME_CONTINUOUSLY_MS = 60_000       # one orderly task keeps a queue at most this long
RECONSUME_LATER_LOCALLY_MS = 5000               # failed send-back: consume again here after this
SHUTDOWN_AWAIT_MS = 10_000                      # how long shutdown waits for running listeners
ORDERLY_MAX_RECONSUME_TIMES = 2 ** 31 - 1       # Integer.MAX_VALUE: orderly retries locally forever
CONCURRENT_MAX_RECONSUME_TIMES = 16

__all__ = ["PullConsumer", "PushConsumer", "MessageModel", "ConsumeFromWhere", "ConsumeConcurrentlyStatus",
           "ConsumeOrderlyStatus", "ConsumeConcurrentlyContext", "ConsumeOrderlyContext", "MessageExt",
           "MessageQueue", "PullResult", "PullStatus", "AllocateMessageQueueAveragely",
           "AllocateMessageQueueAveragelyByCircle", "AllocateMessageQueueConsistentHash",
           "AllocateMessageQueueByConfig", "AllocateMessageQueueByMachineRoom", "AllocateMachineRoomNearby",
           "retry_topic", "dlq_topic"]


class MessageModel(str, enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(str, enum.Enum):
    """Where a queue starts when the group has no stored offset for it (SPEC.md §15.2)."""
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"
    # deprecated names, treated as LAST_OFFSET (as RocketMQ)
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST"
    CONSUME_FROM_MIN_OFFSET = "CONSUME_FROM_MIN_OFFSET"
    CONSUME_FROM_MAX_OFFSET = "CONSUME_FROM_MAX_OFFSET"


class ConsumeConcurrentlyStatus(str, enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(str, enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """Passed to an orderly listener; ``suspend_current_queue_time_millis`` overrides the back-off."""
    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_millis: int = -1


def _concurrent_status(status) -> "ConsumeConcurrentlyStatus":
    """A concurrent listener's answer as a ConsumeConcurrentlyStatus: None or CONSUME_SUCCESS (the
    member or its name: the str enum compares equal to it) is success, anything else
    RECONSUME_LATER (logged when it is not that status either)."""
    if status is None or status == "CONSUME_SUCCESS":
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    if status != "RECONSUME_LATER":
        log.error("listener returned %r (not a ConsumeConcurrentlyStatus): treated as RECONSUME_LATER", status)
    return ConsumeConcurrentlyStatus.RECONSUME_LATER


def _enum(cls, value, what: str):
    try:
        return cls(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        raise MQClientError(f"{what} must be one of {[e.value for e in cls]}, got {value!r}") from None


def pull_from_where(consume_from_where: ConsumeFromWhere, last_offset: int, mq: MessageQueue, client,
                    consume_timestamp_ms: int):
    """RocketMQ's ``RebalancePushImpl.computePullFromWhere`` as a call (:mod:`rmq.client.calls`)
    on ``client`` (its ``_max_offset`` / ``_search_offset`` calls): the stored offset when there
    is one (``last_offset >= 0``); with none (-1) the queue's max offset (LAST; 0 for a retry
    topic), 0 (FIRST) or the offset at ``consume_timestamp_ms`` (TIMESTAMP; max offset for a retry
    topic); -1 when the stored offset could not be read (-2) or the broker could not be asked.
    """
    if last_offset >= 0:
        return last_offset
    if last_offset != -1:
        return -1
    is_retry = is_retry_topic(mq.topic)
    try:
        if consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        if consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            if is_retry:
                return (yield from client._max_offset(mq))
            return (yield from client._search_offset(mq, consume_timestamp_ms))
        return 0 if is_retry else (yield from client._max_offset(mq))
    except MQClientError as e:
        log.warning("cannot compute the start offset of %s: %s", mq, e)
        return -1


class _OffsetQuestions:
    """Offset calls that ask their driver (plain functions) instead of a broker."""

    def _max_offset(self, mq):
        return (yield "max", mq, None)

    def _search_offset(self, mq, timestamp_ms):
        return (yield "search", mq, timestamp_ms)


def compute_pull_from_where(consume_from_where: ConsumeFromWhere, last_offset: int, mq: MessageQueue,
                            max_offset: Callable[[MessageQueue], int], search_offset: Callable[[MessageQueue, int], int],
                            consume_timestamp_ms: int) -> int:
    """:func:`pull_from_where` with plain functions for the broker's answers."""
    def answer(kind, queue, timestamp_ms):
        return max_offset(queue) if kind == "max" else search_offset(queue, timestamp_ms)
    return drive(pull_from_where(consume_from_where, last_offset, mq, _OffsetQuestions(), consume_timestamp_ms),
                 answer)


# the push consumers' options kept as given (PushConsumerCalls._configure)
_PUSH_OPTIONS = ("auth", "enable_msg_trace", "custom_trace_topic", "namesrv_addr", "group", "consume_timestamp_ms",
                 "consume_thread_max", "pull_batch_size", "consume_message_batch_max_size", "max_reconsume_times",
                 "rebalance_interval_ms", "pull_threshold_for_queue", "pull_threshold_size_for_queue_mb",
                 "consume_concurrently_max_span", "suspend_current_queue_time_millis",
                 "persist_consumer_offset_interval_ms", "heartbeat_broker_interval_ms", "poll_name_server_interval_ms",
                 "lock_interval_ms", "offset_store_dir", "timeout_ms", "shutdown_await_ms")


class PushConsumerCalls:
    """The parts of a push consumer's rebalance that talk to brokers, as calls
    (:mod:`rmq.client.calls`) on ``self.api`` (a ConsumerAPI or AsyncConsumerAPI): which queues
    this member gets, heartbeats, queue locks.  :class:`PushConsumer` drives them blocking on its
    service thread, :class:`rmq.aio.consumer.AsyncPushConsumer` awaiting; each keeps its own
    process-queue table and pull engine.  Needs ``api``, ``group``, ``client_id``, ``clustering``,
    ``subscriptions``, ``allocate_strategy``, ``poll_name_server_interval_ms``, ``message_model``,
    ``consume_from_where``, ``consume_timestamp_ms``.
    """

    @property
    def trace_dispatcher(self) -> "Optional[_trace.TraceDispatcher]":
        """The message-trace dispatcher while running with ``enable_msg_trace=True``, else None."""
        return self._trace

    def _max_reconsume_times(self) -> int:
        """``max_reconsume_times``, or RocketMQ's default for the listener kind (-1: 16
        concurrently, Integer.MAX_VALUE orderly)."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return ORDERLY_MAX_RECONSUME_TIMES if self.orderly else CONCURRENT_MAX_RECONSUME_TIMES

    def _configure(self, opts: dict) -> None:
        """Check and set the options both push consumers take (``opts``: the constructor's
        arguments by name; each is an attribute of the same name, documented on
        :class:`PushConsumer`).  Message trace's dispatcher exists from ``start`` to ``shutdown``.

        Raises
        ------
        MQClientError
            No group (or DEFAULT_CONSUMER), a batch size outside [1, 1024], ``consume_thread_max``
            outside [1, CONSUME_THREAD_LIMIT] (DefaultMQPushConsumer.checkConfig), an unknown
            message model or consume-from-where.
        """
        for name in ("consume_message_batch_max_size", "pull_batch_size"):
            if not 1 <= opts[name] <= 1024:
                raise MQClientError(f"{name} must be in [1, 1024], got {opts[name]}")
        if not 1 <= opts["consume_thread_max"] <= CONSUME_THREAD_LIMIT:
            raise MQClientError(f"consume_thread_max must be in [1, {CONSUME_THREAD_LIMIT}], got "
                                f"{opts['consume_thread_max']}")
        if not opts["group"] or opts["group"] == "DEFAULT_CONSUMER":
            raise MQClientError("consumer group must be set (and not DEFAULT_CONSUMER)")
        for name in _PUSH_OPTIONS:
            setattr(self, name, opts[name])
        self.message_model = _enum(MessageModel, opts["message_model"], "message_model")
        self.consume_from_where = _enum(ConsumeFromWhere, opts["consume_from_where"], "consume_from_where")
        self.allocate_strategy = resolve_strategy(opts["allocate_strategy"])
        self.client_id = default_client_id(opts["instance_name"])
        self._trace: Optional[_trace.TraceDispatcher] = None

    def _allocate_call(self, topic: str):
        """The queues of ``topic`` this member consumes now (RocketMQ
        ``RebalanceImpl.rebalanceByTopic``): every readable queue in BROADCASTING; in CLUSTERING
        the allocation strategy's share among the group's members the broker lists.  None: keep
        what is held (no route yet, no member list, or the broker does not know this member yet:
        then it is sent a heartbeat)."""
        api = self.api
        route = yield from api._route(topic, self.poll_name_server_interval_ms)
        if route is None:
            return None                # e.g. the retry topic before the first send-back
        mq_all = route.subscribe_queues()
        if not self.clustering:
            return set(mq_all)
        addrs = route.read_addrs(api.pull_from.suspects())   # masters; a slave for a group without one
        if not addrs or not mq_all:
            return None
        cids = yield from api._consumer_id_list(random.choice(addrs), self.group)
        if self.client_id not in cids:
            # the broker does not know us (yet, or it restarted): tell it and keep what we have
            yield from self._heartbeat_all_call()
            return None
        cids.sort()
        try:
            allocated = self.allocate_strategy(self.group, self.client_id, sorted(mq_all), cids)
        except Exception:
            log.exception("allocate strategy %r failed", self.allocate_strategy)
            return None
        return set(allocated)

    def _consumer_datas(self) -> list:
        return [consumer_data(self.group, "CONSUME_PASSIVELY", self.message_model.value,
                              self.consume_from_where.value, self.subscriptions.values())]

    def _heartbeat_all_call(self):
        """HEART_BEAT to every broker of the subscribed topics' routes, masters and slaves
        (RocketMQ); the routes are refreshed first when older than poll_name_server_interval_ms."""
        api = self.api
        for topic in list(self.subscriptions):
            try:
                yield from api._route(topic, self.poll_name_server_interval_ms)
            except MQClientError:
                pass
        datas = self._consumer_datas()
        for addr in api.heartbeat_addrs():
            try:
                yield from api._heartbeat(addr, self.client_id, datas)
            except MQClientError as e:
                log.warning("heartbeat to %s failed: %s", addr, e)

    def _start_offset_call(self, mq: MessageQueue, last_offset: int):
        """Where a queue newly held starts (:func:`pull_from_where`); -1: unknown, try later."""
        return (yield from pull_from_where(self.consume_from_where, last_offset, mq, self.api,
                                           self.consume_timestamp_ms))

    def _lock_one_call(self, mq: MessageQueue):
        """LOCK_BATCH_MQ of ``mq`` alone: True when this member holds it now."""
        try:
            addr = yield from self.api._broker_addr(mq.broker_name, mq.topic)
            return mq in (yield from self.api._lock_batch_mq(addr, self.group, self.client_id, [mq]))
        except MQClientError as e:
            log.warning("lock %s failed: %s", mq, e)
            return False

    def _lock_all_call(self, table: dict):
        """Renew the lock of every queue of ``table`` ({mq: ProcessQueue}; RocketMQ
        ``RebalanceImpl.lockAll``): each ProcessQueue's ``locked`` is what its broker answered."""
        for broker, mqs in by_broker(table).items():
            try:
                addr = yield from self.api._broker_addr(broker, mqs[0].topic)
                ok = yield from self.api._lock_batch_mq(addr, self.group, self.client_id, mqs)
            except MQClientError as e:
                log.warning("lock renewal on %s failed: %s", broker, e)
                continue
            now = time.monotonic()
            for mq in mqs:
                pq = table[mq]
                if mq in ok:
                    if not pq.locked:
                        log.info("%s locked again", mq)
                    pq.locked = True
                    pq.last_lock_timestamp = now
                else:
                    if pq.locked:
                        log.warning("%s: lock lost", mq)
                    pq.locked = False

    def _unlock_call(self, mqs: Iterable[MessageQueue]):
        """UNLOCK_BATCH_MQ of ``mqs``, one request per broker group; failures are logged."""
        for broker, group_mqs in by_broker(mqs).items():
            try:
                addr = yield from self.api._broker_addr(broker, group_mqs[0].topic)
                yield from self.api._unlock_batch_mq(addr, self.group, self.client_id, group_mqs)
            except MQClientError as e:
                log.warning("unlock %s failed: %s", group_mqs, e)


    # -- pulls --------------------------------------------------------------------------------------
    def _pull_gate(self, pq: ProcessQueue, mq: MessageQueue) -> Optional[int]:
        """RocketMQ ``pullMessage``'s checks before a pull of ``mq``: None to pull now, else how
        long (ms) to wait first: flow control (the process queue holds more than
        ``pull_threshold_for_queue`` messages or ``pull_threshold_size_for_queue_mb``, or a
        concurrent consumer's span passed ``consume_concurrently_max_span``), an orderly queue not
        locked on its broker yet, or no subscription for the topic."""
        pq.last_pull_timestamp = time.monotonic()
        if pq.msg_count > self.pull_threshold_for_queue or \
                pq.msg_size > self.pull_threshold_size_for_queue_mb * 1024 * 1024:
            return PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL
        if not self.orderly:
            if pq.max_span() > self.consume_concurrently_max_span:
                return PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL
        elif self.clustering and not pq.locked:
            return PULL_TIME_DELAY_MS_WHEN_EXCEPTION
        if mq.topic not in self.subscriptions:
            return PULL_TIME_DELAY_MS_WHEN_EXCEPTION
        return None

    def _held_for_room(self, pq: ProcessQueue, delay_ms: Optional[int]) -> bool:
        """Whether a pull that :meth:`_pull_gate` held back (``delay_ms``) waits for the listeners
        to bring ``pq`` down to ``pull_threshold_for_queue`` (ProcessQueue.notify_when_below),
        not only out the delay: held by the message count.  The size and span limits wait the
        delay (the count is not what moves them)."""
        return delay_ms == PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL and pq.msg_count > self.pull_threshold_for_queue

    def _pull_frame(self, mq: MessageQueue, next_offset: int, broker_id: int) -> Frame:
        """The long-polling PULL_MESSAGE of ``mq`` from ``next_offset`` to broker ``broker_id``,
        carrying the consumed offset to a master (CLUSTERING; never to a slave, as RocketMQ).

        Raises
        ------
        MQClientError
            The topic was unsubscribed meanwhile.
        """
        sub = self.subscriptions.get(mq.topic)
        if sub is None:
            raise MQClientError(f"no subscription for topic {mq.topic} (unsubscribed)")
        commit_offset = self.offset_store.read_memory(mq) if self.clustering and broker_id == MASTER_ID else -1
        if commit_offset > 0:
            self._commit_carried(mq)
        return build_pull_frame(self.group, mq, next_offset, self.pull_batch_size, sub,
                                commit_offset if commit_offset > 0 else -1, BROKER_SUSPEND_MAX_TIME_MS,
                                self.api.pull_epoch(mq, next_offset))

    def _commit_carried(self, mq: MessageQueue) -> None:
        """A pull carries ``mq``'s offset (commitOffset): the broker may apply it after a later
        persist, so the next persist sends the offset even when unchanged."""
        self.offset_store.forget_persisted(mq)

    def _pull_outcome(self, res: PullResult, pq: ProcessQueue, mq: MessageQueue, next_offset: int) -> str:
        """What a pull answer means for ``mq`` (RocketMQ ``PullCallback``): ``"found"`` (messages to
        consume), ``"again"`` (none: pull again; with nothing in flight the queue's position moves
        past filtered-out messages) or ``"illegal"`` (the offset is out of range: the queue is
        dropped, to restart from ``res.next_begin_offset``)."""
        status = res.pull_status
        if status is PullStatus.FOUND and res.msg_found_list:
            return "found"
        if status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            if pq.msg_count == 0:
                self.offset_store.update_offset(mq, res.next_begin_offset, increase_only=True)
            return "again"
        log.warning("%s: offset %d illegal, moving to %d", mq, next_offset, res.next_begin_offset)
        pq.dropped = True
        return "illegal"

    # -- consume results ----------------------------------------------------------------------------
    def _send_back_call(self, msg, mq: MessageQueue, delay_level: int):
        """CONSUMER_SEND_MSG_BACK of ``msg`` (its retry, or the DLQ for ``delay_level`` -1); False
        when it failed (logged): the caller consumes it again here."""
        try:
            yield from self.api._send_message_back(self.group, mq, msg, delay_level, self._max_reconsume_times())
        except MQClientError as e:
            self._count("send_back_failed")
            log.warning("send back of %s failed: %s", msg.msg_id, e)
            return False
        self._count("sent_back")
        return True

    def _concurrent_result_call(self, status, ctx: ConsumeConcurrentlyContext, msgs: list, pq: ProcessQueue,
                                mq: MessageQueue):
        """A concurrent listener's answer (RocketMQ ``ConsumeMessageConcurrentlyService.processConsumeResult``):
        the messages past ``ack_index`` (all of them unless CONSUME_SUCCESS) are sent back
        (CLUSTERING; dropped with a warning in BROADCASTING), the others leave the process queue
        and move the offset.  Returns the messages whose send-back failed, to consume again here."""
        if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
            ack = min(max(ctx.ack_index, -1), len(msgs) - 1)
        else:
            ack = -1
        done, again = msgs, []
        if ack < len(msgs) - 1:
            failed = msgs[ack + 1:]
            if not self.clustering:
                for m in failed:
                    log.warning("BROADCASTING: dropping failed message %s", m.msg_id)
            else:
                for m in failed:
                    if not (yield from self._send_back_call(m, mq, ctx.delay_level_when_next_consume)):
                        m.reconsume_times += 1
                        again.append(m)
                if again:
                    keep = {id(m) for m in again}
                    done = [m for m in msgs if id(m) not in keep]
        offset = pq.remove_message(done)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(mq, offset, increase_only=True)
        # counted last: a reader that sees the count also sees the offset it committed (a
        # shutdown or a rebalance right after persists the offset past these messages)
        self._count("consumed_ok", ack + 1)
        self._count("consumed_failed", len(msgs) - ack - 1)
        return again

    def _reconsume_call(self, msgs: list, mq: MessageQueue):
        """An orderly batch that failed (RocketMQ ``checkReconsumeTimes``): True when it must be
        consumed again here; messages past ``max_reconsume_times`` go to the DLQ instead (again
        here when that fails; dropped with a warning in BROADCASTING)."""
        suspend = False
        limit = self._max_reconsume_times()
        for m in msgs:
            if m.reconsume_times >= limit and self.clustering:
                if not (yield from self._send_back_call(m, mq, -1)):
                    suspend = True
                    m.reconsume_times += 1
            elif m.reconsume_times >= limit:
                log.warning("BROADCASTING: dropping message %s after %d attempts", m.msg_id, m.reconsume_times)
            else:
                suspend = True
                m.reconsume_times += 1
        return suspend


def by_broker(mqs: Iterable[MessageQueue]) -> dict:
    """``{broker name: [mq, ...]}`` in the order given."""
    out: dict = {}
    for mq in mqs:
        out.setdefault(mq.broker_name, []).append(mq)
    return out


def _is_coroutine_fn(fn) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


# ==================================================================================================
# PullConsumer
# ==================================================================================================
def arrow_modules() -> tuple:
    """``(pyarrow, rmq.arrow)`` for ``poll_arrow``, imported before anything is polled (a missing
    pyarrow must not move a position).

    Raises
    ------
    MQClientError
        pyarrow is not installed (``pip install 'rmq[spark]'``).
    """
    try:
        import pyarrow as pa

        from rmq import arrow as A
    except ImportError as e:
        raise MQClientError(f"poll_arrow needs pyarrow (pip install 'rmq[spark]'): {e}") from None
    return pa, A


def pages_batch(pages: list, include_properties: bool, modules: tuple) -> "pyarrow.RecordBatch":
    """One ``pyarrow.RecordBatch`` of the raw pages a poll returned (``[(mq, page, subscription)]``,
    :meth:`PullConsumerCalls._raw_page`), the rows of ``rmq.arrow.arrow_schema(include_properties)``
    in page order: the pages of one broker and tag re-check are decoded in one call (C, no Python
    object per message); zero rows when there are none."""
    pa, A = modules
    schema = A.arrow_schema(include_properties)
    groups: dict = {}                   # (broker, tag re-check) -> ([page], [mq]): one decode each
    for mq, page, sub in pages:
        tags = None if sub is None or sub.is_all else frozenset(sub.tags_set)
        g = groups.setdefault((mq.broker_name, tags), ([], []))
        g[0].append(page)
        g[1].append(mq)
    batches = []
    for (_, tags), (group_pages, mqs) in groups.items():
        b = A.pages_to_batch(group_pages, None, schema, include_properties, tags=None if tags is None else set(tags),
                             mqs=mqs)
        if b.num_rows:
            batches.append(b)
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=schema).combine_chunks().to_batches()[0]



class PullConsumerCalls:
    """What a pull consumer does apart from :meth:`poll`, without I/O: its options, assignment,
    positions and commits, and the calls (:mod:`rmq.client.calls`) of single pulls, offset
    queries, seeks and commits, composed with :class:`rmq.client.consumer_api.ConsumerCalls`.
    :class:`PullConsumer` drives them blocking, :class:`rmq.aio.consumer.AsyncPullConsumer`
    awaiting.  Each drives its own ``poll`` loop (a RequestMux, or tasks) and takes every pull
    answer through :meth:`_take_answer` (with :meth:`_decode_messages` for ``poll``,
    :meth:`_raw_page` and :func:`pages_batch` for ``poll_arrow``).

    State: ``_assigned`` (the queues :meth:`assign` gave), ``_subs`` (topic -> SubscriptionData),
    ``_positions`` (mq -> next offset poll returns), ``_committed`` (mq -> offset stored on the
    broker), ``_inflight`` (mq -> the pull in flight; its kind is the driver's), ``_last_commit``.
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_CONSUMER", *, pull_batch_size: int = POLL_PULL_BATCH_SIZE,
                 consume_from_where: Union[str, ConsumeFromWhere] = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp_ms: Optional[int] = None, auto_commit: bool = True,
                 auto_commit_interval_ms: int = PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS, instance_name: Optional[str] = None, auth=None):
        self.auth = auth            # CURVE client keys (rmq.security.client_auth); None: environment / plain
        if not 1 <= pull_batch_size <= 1024:
            raise MQClientError(f"pull_batch_size must be in [1, 1024], got {pull_batch_size}")
        self.namesrv_addr = namesrv_addr
        self.group = group
        self.pull_batch_size = pull_batch_size
        self.consume_from_where = _enum(ConsumeFromWhere, consume_from_where, "consume_from_where")
        self.consume_timestamp_ms = consume_timestamp_ms
        self.auto_commit = auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.timeout_ms = timeout_ms
        self.client_id = default_client_id(instance_name)
        self.api = None
        self._assigned: list[MessageQueue] = []
        self._subs: dict[str, SubscriptionData] = {}
        self._positions: dict[MessageQueue, int] = {}
        self._committed: dict[MessageQueue, int] = {}
        self._inflight: dict = {}
        self._last_commit = time.monotonic()
        self._closed = False

    def _client(self):
        """The client (ConsumerAPI / AsyncConsumerAPI), made on first use."""
        raise NotImplementedError

    def _invoke(self, addr: str, frame: Frame, timeout_ms: Optional[int]):
        return self._client().invoke(addr, frame, timeout_ms)

    def _forget(self, mq: MessageQueue) -> None:
        """Drop ``mq``'s pull in flight (its answer is not used)."""
        self._inflight.pop(mq, None)

    # -- assignment (no I/O) -----------------------------------------------------------------------
    def assign(self, mqs: Iterable[MessageQueue], sub_expression: Union[str, dict] = "*") -> None:
        """Consume exactly ``mqs`` with ``poll`` (replaces the previous assignment).

        ``sub_expression`` is one expression for all topics or ``{topic: expression}``.
        Positions of queues that stay assigned are kept.
        """
        mqs = list(dict.fromkeys(mqs))
        topics = {mq.topic for mq in mqs}
        if isinstance(sub_expression, dict):
            self._subs = {t: SubscriptionData.build(t, sub_expression.get(t, "*")) for t in topics}
        else:
            self._subs = {t: SubscriptionData.build(t, sub_expression) for t in topics}
        keep = set(mqs)
        for mq in list(self._positions):
            if mq not in keep:
                self._positions.pop(mq, None)
        for mq in list(self._inflight):   # pulls in flight (prefetched ones too) carry the old subscription
            self._forget(mq)
        self._assigned = mqs

    def assignment(self) -> list:
        return list(self._assigned)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Next ``poll`` reads ``mq`` from ``offset``."""
        if mq not in self._assigned:
            raise MQClientError(f"{mq} is not assigned")
        if offset < 0:
            raise MQClientError(f"offset < 0: {offset}")
        self._positions[mq] = int(offset)
        self._forget(mq)
        self._client().forget_pull_epoch(mq)

    def _other_addr(self, mq: MessageQueue, failed_addr: str) -> bool:
        """True when the next pull of ``mq`` would go to another address than ``failed_addr``
        (e.g. a slave, the master having stopped answering); from the cached routes only (the
        call never asks the NameServer, so it is run here without I/O)."""
        try:
            return drive(self._client()._pull_broker_addr(mq, fetch=False), None)[1] != failed_addr
        except MQClientError:
            return False

    def _commit_due(self) -> bool:
        return self.auto_commit and (time.monotonic() - self._last_commit) * 1000 >= self.auto_commit_interval_ms

    # -- poll's rules, for both drivers (no I/O) --------------------------------------------------
    def _take_answer(self, mq: MessageQueue, off: int, resp, addr: str, decode: Callable, failed: set) -> tuple:
        """What one pull answer of a poll gives, for the thread and asyncio drivers alike:
        ``(items, error)``.  ``off``: the position the pull was made from; ``resp``: the Frame,
        or the exception the pull ended with; ``addr``: where it went ("" when unknown);
        ``decode(resp, subscription, addr, mq) -> (next offset, items)`` (:meth:`_decode_messages`
        or :meth:`_raw_page`).

        - The queue was seeked (or re-assigned) meanwhile: nothing, the answer is stale.
        - A transport failure where the queue's next pull would go to another address (a slave,
          the master having stopped answering): nothing and no error; the next round asks there.
        - Any other failure, or an answer that does not decode: no items, the error, and ``mq``
          joins ``failed`` (not asked again in this poll).
        - Otherwise the position moves to the answer's next begin offset (positions move only
          when a page is returned to the caller) and its items come back.
        """
        if self._positions.get(mq) != off:
            return (), None
        if isinstance(resp, Exception):
            if isinstance(resp, RemotingError) and addr and self._other_addr(mq, addr):
                log.warning("pull of %s from %s failed (%s); reading from another broker of %s",
                            mq, addr, resp, mq.broker_name)
                return (), None
            failed.add(mq)
            return (), resp
        try:
            next_offset, items = decode(resp, self._subs.get(mq.topic), addr, mq)
        except MQClientError as e:
            failed.add(mq)
            return (), e
        self._positions[mq] = next_offset
        return items, None

    @staticmethod
    def _decode_messages(resp, sub, addr: str, mq: MessageQueue) -> tuple:
        """(next begin offset, [MessageExt]) of a pull answer."""
        res = parse_pull_response(resp, sub, addr)
        return res.next_begin_offset, res.msg_found_list

    @staticmethod
    def _raw_page(resp, sub, addr: str, mq: MessageQueue) -> tuple:
        """(next begin offset, [(mq, raw record page, subscription)]) of a pull answer: the
        records left undecoded for ``poll_arrow``."""
        res = parse_pull_response(resp, sub, addr, decode=False)
        page = resp.bodies[0] if res.pull_status is PullStatus.FOUND and resp.bodies else None
        return res.next_begin_offset, ([(mq, page, sub)] if page else [])


    # -- calls -------------------------------------------------------------------------------------
    def _fetch_subscribe_message_queues(self, topic: str):
        """The topic's readable queues, sorted.

        Raises
        ------
        MQClientError
            The NameServer does not know the topic.
        """
        route = yield from self._client()._fetch_route(topic)
        if route is None:
            raise MQClientError(f"can not find message queue for this topic, {topic}", 17)
        return route.subscribe_queues()

    def _pull(self, mq: MessageQueue, sub_expression: str = "*", offset: int = 0, max_nums: int = PULL_BATCH_SIZE,
              timeout_ms: Optional[int] = None):
        """One pull, answered at once (no long polling).

        Returns
        -------
        PullResult
            ``msg_found_list`` holds MessageExt (bodies inflated, exact tag match).

        Raises
        ------
        MQBrokerError
            The broker refused (TOPIC_NOT_EXIST, ...).
        RemotingError
            No answer in ``timeout_ms``.
        """
        if offset < 0:
            raise MQClientError(f"offset < 0: {offset}")
        sub = SubscriptionData.build(mq.topic, sub_expression)
        return (yield from self._client()._pull(self.group, mq, offset, max_nums, sub, 0, timeout_ms))

    def _pull_block_if_not_found(self, mq: MessageQueue, sub_expression: str = "*", offset: int = 0,
                                 max_nums: int = PULL_BATCH_SIZE, timeout_ms: int = BROKER_SUSPEND_MAX_TIME_MS):
        """Like ``pull``, but the broker holds the request up to ``timeout_ms`` until a
        message arrives (long polling)."""
        sub = SubscriptionData.build(mq.topic, sub_expression)
        suspend = max(1, min(int(timeout_ms), BROKER_SUSPEND_MAX_TIME_MS))
        return (yield from self._client()._pull(self.group, mq, offset, max_nums, sub, suspend,
                                                suspend + self.timeout_ms))

    def _min_offset(self, mq: MessageQueue):
        """The first offset of ``mq`` still stored."""
        return (yield from self._client()._min_offset(mq))

    def _max_offset(self, mq: MessageQueue):
        """The offset after the last message of ``mq``."""
        return (yield from self._client()._max_offset(mq))

    def _search_offset(self, mq: MessageQueue, timestamp_ms: int):
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``."""
        return (yield from self._client()._search_offset(mq, timestamp_ms))

    def _fetch_consume_offset(self, mq: MessageQueue):
        """The group's committed offset of ``mq`` on the broker (-1 when none)."""
        return (yield from self._client()._query_consumer_offset(self.group, mq))

    def _update_consume_offset(self, mq: MessageQueue, offset: int):
        """Store ``offset`` (next to consume) for the group on the broker now."""
        yield from self._client()._update_consumer_offset(self.group, mq, offset)
        self._committed[mq] = offset

    def _seek_by_time(self, mq: MessageQueue, timestamp_ms: int):
        """Seek to the first message stored at or after ``timestamp_ms``; returns that offset."""
        off = yield from self._search_offset(mq, timestamp_ms)
        self.seek(mq, off)
        return off

    def _seek_to_begin(self, mq: MessageQueue):
        """Seek to the first message still stored."""
        self.seek(mq, (yield from self._min_offset(mq)))

    def _seek_to_end(self, mq: MessageQueue):
        """Seek past the last message (only new ones are polled)."""
        self.seek(mq, (yield from self._max_offset(mq)))

    def _position(self, mq: MessageQueue):
        """Offset of the next message ``poll`` returns from ``mq``."""
        off = self._positions.get(mq)
        if off is None:
            off = yield from self._initial_position_call(mq)
        return off

    def _initial_position_call(self, mq: MessageQueue):
        api = self._client()
        last = yield from api._query_consumer_offset(self.group, mq)
        if last >= 0:
            off = last
            self._committed[mq] = last
        elif self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            off = yield from api._min_offset(mq)
        elif self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            ts = self.consume_timestamp_ms or int(time.time() * 1000) - 30 * 60 * 1000
            off = yield from api._search_offset(mq, ts)
        else:
            off = yield from api._max_offset(mq)
        self._positions[mq] = off
        return off

    def _before_poll_call(self):
        """What each poll does first: an auto-commit when due, the start positions of new queues,
        the routes refreshed (a promoted slave shows up as the new master)."""
        if self._closed:
            raise MQClientError("the consumer is shut down")
        if self._commit_due():
            yield from self._commit_sync()
        for mq in self._assigned:
            if mq not in self._positions:
                yield from self._initial_position_call(mq)
        api = self._client()
        for topic in {mq.topic for mq in self._assigned}:
            yield from api._refresh_route_if_stale(topic)

    def _commit_sync(self, offsets: Optional[dict] = None):
        """Store positions on the broker: ``offsets`` ({mq: offset}) or every assigned queue's
        position (skipping unchanged ones).

        Raises
        ------
        MQClientError
            A broker refused or did not answer.
        """
        api = self._client()
        todo = offsets if offsets is not None else {mq: off for mq, off in self._positions.items()
                                                     if self._committed.get(mq) != off}
        for mq, off in todo.items():
            yield from api._update_consumer_offset(self.group, mq, off)
            self._committed[mq] = off
        self._last_commit = time.monotonic()


class PullConsumer(PullConsumerCalls):
    """Pull messages from queues you choose (RocketMQ DefaultMQPullConsumer + the assign /
    seek / poll / commit side of DefaultLitePullConsumer).

    Parameters
    ----------
    namesrv_addr : str
        ``host:port[;host:port]``.
    group : str
        Consumer group (offsets are stored under it).
    pull_batch_size : int
        Messages asked per queue per pull by :meth:`poll` (``POLL_PULL_BATCH_SIZE``, 1024: rmq's
        maxTransferCountOnMessageInMemory; the broker caps a pull at that count and at
        maxTransferBytesOnMessageInMemory).  One :meth:`poll` returns up to one page per queue.
    consume_from_where : str
        Start of an assigned queue with no committed offset: ``CONSUME_FROM_LAST_OFFSET`` (the end),
        ``CONSUME_FROM_FIRST_OFFSET`` (the queue's min offset) or ``CONSUME_FROM_TIMESTAMP``.
        Note the broker reports offset 0 for a group new to a queue that was never cleaned (as RocketMQ).
    consume_timestamp_ms : int, optional
        For CONSUME_FROM_TIMESTAMP (default: 30 minutes ago).
    auto_commit : bool
        Commit the positions every ``auto_commit_interval_ms`` during :meth:`poll` and on close.
    timeout_ms : int
        Network timeout of one request (3000).

    Concurrency: :meth:`pull`, :meth:`fetch_subscribe_message_queues`, offset queries and
    commits are thread-safe; ``assign`` / ``seek`` / ``poll`` keep per-consumer positions and
    must be called from one thread at a time (as KafkaConsumer).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._seq = itertools.count()
        self._mux: Optional[RequestMux] = None
        # answers that came during a poll for a queue that poll already had a page of: the next
        # poll takes them first (the pull was sent early, :meth:`_poll`)
        self._held: list = []

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "PullConsumer":
        if self._closed:
            raise MQClientError("the consumer is shut down")
        if self.api is None:
            self.api = ConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self.auth)
        return self

    def _started(self) -> ConsumerAPI:
        if self.api is None:
            self.start()
        return self.api

    _client = _started

    def shutdown(self) -> None:
        """Commit (with auto_commit) and close the sockets; idempotent."""
        if self._closed:
            return
        try:
            if self.auto_commit and self.api is not None and self._positions:
                try:
                    self.commit_sync()
                except MQClientError as e:
                    log.warning("commit on close failed: %s", e)
        finally:
            self._closed = True
            if self._mux is not None:
                self._mux.close()
                self._mux = None
            if self.api is not None:
                self.api.close()

    close = shutdown

    def __enter__(self) -> "PullConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    fetch_subscribe_message_queues = blocking(PullConsumerCalls._fetch_subscribe_message_queues, "_invoke")
    pull = blocking(PullConsumerCalls._pull, "_invoke")
    pull_block_if_not_found = blocking(PullConsumerCalls._pull_block_if_not_found, "_invoke")
    min_offset = blocking(PullConsumerCalls._min_offset, "_invoke")
    max_offset = blocking(PullConsumerCalls._max_offset, "_invoke")
    search_offset = blocking(PullConsumerCalls._search_offset, "_invoke")
    fetch_consume_offset = blocking(PullConsumerCalls._fetch_consume_offset, "_invoke")
    committed = fetch_consume_offset
    update_consume_offset = blocking(PullConsumerCalls._update_consume_offset, "_invoke")
    seek_by_time = blocking(PullConsumerCalls._seek_by_time, "_invoke")
    seek_to_begin = blocking(PullConsumerCalls._seek_to_begin, "_invoke")
    seek_to_end = blocking(PullConsumerCalls._seek_to_end, "_invoke")
    position = blocking(PullConsumerCalls._position, "_invoke")
    commit_sync = blocking(PullConsumerCalls._commit_sync, "_invoke")

    def poll(self, timeout_ms: int = 1000) -> list:
        """Messages from the assigned queues, waiting up to ``timeout_ms`` for some (long polling
        on every assigned queue at once).  Positions advance past what is returned.

        Returns
        -------
        list of MessageExt
            Possibly empty (nothing arrived in time).

        Raises
        ------
        MQBrokerError
            A broker refused a pull (e.g. TOPIC_NOT_EXIST).
        """
        return self._poll(timeout_ms, self._decode_messages)

    def poll_arrow(self, timeout_ms: int = 1000, include_properties: bool = False) -> "pyarrow.RecordBatch":
        """As :meth:`poll`, as one ``pyarrow.RecordBatch`` (the Spark source's row schema,
        ``rmq.arrow.arrow_schema``: topic, broker_name, queue_id, queue_offset,
        commitlog_offset, msg_id, tags, keys, body, [properties,] born_timestamp and
        store_timestamp (UTC, us), reconsume_times), decoded column-wise from the pulled pages
        in C, with no Python object per message.  Compressed bodies come inflated; a tag
        subscription is re-checked as :meth:`poll` does.  Zero rows when nothing arrived in time.

        Raises
        ------
        MQClientError
            pyarrow is not installed (``pip install 'rmq[spark]'``), or as :meth:`poll`.
        MQBrokerError
            As :meth:`poll`.
        """
        modules = arrow_modules()
        return pages_batch(self._poll(timeout_ms, self._raw_page), include_properties, modules)

    def _poll(self, timeout_ms: int, decode: Callable) -> list:
        """poll()'s loop; ``decode(resp, subscription, addr, mq) -> (next offset, items)``."""
        api = self._started()
        if self._assigned and self._mux is None:
            self._mux = RequestMux(auth=api.auth)
        new = [mq for mq in self._assigned if mq not in self._positions]
        if len(new) > 1 and not self._closed and not self._mux.pending:
            # the start positions of newly assigned queues, asked for all at once (each is one or
            # two round trips: the committed offset, then the queue's min / max / timestamp's)
            for r in self._mux.run_calls([self._initial_position_call(mq) for mq in new], self.timeout_ms,
                                         api._answered):
                if isinstance(r, Exception):
                    raise r
        drive(self._before_poll_call(), self._invoke)
        if not self._assigned:
            time.sleep(timeout_ms / 1000.0)
            return []
        deadline = time.monotonic() + timeout_ms / 1000.0
        out: list = []
        error: Optional[Exception] = None
        failed: set = set()                 # queues that failed in this call: not asked again
        taken: set = set()                  # queues this call has a page of
        held, self._held = self._held, []
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if not out:
                error = self._send_pulls(api, min(max(left_ms, 0), BROKER_SUSPEND_MAX_TIME_MS), failed) or error
            if held:                        # answers the last call held back come first
                done, held = held, []
            else:
                done, _ = self._mux.poll(0 if out else max(0, min(left_ms, 100)))
            took = False
            for token, resp, addr in done:
                mq, off = token[0], token[1]
                if mq in taken:             # its next page, asked early: for the next call
                    self._held.append((token, resp, addr))
                    continue
                api.on_pull_response(mq, resp, addr)           # suggestWhichBrokerId / failed address
                if self._inflight.get(mq) is not token:
                    continue                                   # superseded (seek, re-assign)
                del self._inflight[mq]
                items, e = self._take_answer(mq, off, resp, addr, decode, failed)
                if e is not None:
                    error = e
                elif items:
                    out.extend(items)
                    taken.add(mq)
                    took = True
            if out:
                # prefetch (Kafka's fetcher): the next page of each queue answered is asked for at
                # once, so the broker reads it while this call drains the other answers and the
                # caller handles these; positions move only when a page is returned
                self._send_pulls(api, BROKER_SUSPEND_MAX_TIME_MS, failed)
                if took:
                    continue        # drain what else is ready, without waiting
                return out
            if time.monotonic() >= deadline or len(failed) == len(self._assigned):
                if error is not None:
                    raise error
                return out

    def _send_pulls(self, api: ConsumerAPI, suspend_ms: int, failed: set) -> Optional[Exception]:
        """One pull in flight for every assigned queue that has none and has not failed in this
        :meth:`poll` (``failed`` gains the ones that fail now); returns the last error."""
        error = None
        for mq in self._assigned:
            if mq in self._inflight or mq in failed:
                continue
            off = self._positions[mq]
            frame = build_pull_frame(self.group, mq, off, self.pull_batch_size, self._subs[mq.topic], -1, suspend_ms,
                                     api.pull_epoch(mq, off))
            token = (mq, off, next(self._seq))
            addr = ""
            try:
                _, addr = api.pull_broker_addr(mq)   # suggested broker / master / a slave
                self._mux.send(addr, frame, suspend_ms + self.timeout_ms, token)
            except RemotingError as e:
                if addr:
                    api.on_pull_response(mq, e, addr)
                error = e
                failed.add(mq)
                continue
            except MQClientError as e:
                error = e
                failed.add(mq)
                continue
            self._inflight[mq] = token
        return error


    def __iter__(self):
        """Messages forever (poll in a loop); stop with ``break`` or :meth:`shutdown`."""
        while not self._closed:
            yield from self.poll(1000)


# ==================================================================================================
# PushConsumer
# ==================================================================================================
@dataclass(eq=False)
class PullRequest:
    """One queue's pull cursor (RocketMQ ``PullRequest``)."""
    group: str
    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    previously_locked: bool = False
    opaque: int = 0
    parked: int = 0           # serial of the flow-control wait this request is in (0: none)


class _PullService(threading.Thread):
    """The pull thread: every queue's PULL_MESSAGE in flight, plus a timer heap for delayed pulls
    and light tasks.  Other threads hand it work with :meth:`call_soon` / :meth:`call_later`,
    which wake it through a pipe."""

    def __init__(self, consumer: "PushConsumer"):
        super().__init__(name=f"rmq-pull-{consumer.group}", daemon=True)
        self.c = consumer
        self._lock = threading.Lock()
        self._timers: list = []
        self._seq = itertools.count()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._stopping = False

    def call_later(self, delay_ms: float, fn: Callable) -> None:
        with self._lock:
            if self._stopping:
                return
            heapq.heappush(self._timers, (time.monotonic() + delay_ms / 1000.0, next(self._seq), fn))
        self._wake()

    def call_soon(self, fn: Callable) -> None:
        self.call_later(0, fn)

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"x")
        except (BlockingIOError, OSError):
            pass

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake()

    def _on_broker_request(self, frame: Frame, addr: str) -> None:
        """A broker's request on a pull connection: NOTIFY_CONSUMER_IDS_CHANGED of this group makes
        it rebalance now (RocketMQ's ClientRemotingProcessor.notifyConsumerIdsChanged)."""
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and \
                frame.fields.get("consumerGroup") == self.c.group:
            self.c.stats["notifications"] += 1
            self.c.rebalance_immediately()

    def run(self) -> None:
        self.mux = RequestMux(auth=self.c.api.auth)
        self.mux.on_request = self._on_broker_request
        self.mux.register_fd(self._rfd)
        try:
            while not self._stopping:
                now = time.monotonic()
                due = []
                with self._lock:
                    while self._timers and self._timers[0][0] <= now:
                        due.append(heapq.heappop(self._timers)[2])
                    next_timer = self._timers[0][0] if self._timers else now + 1.0
                for fn in due:
                    try:
                        fn()
                    except Exception:           # a task must never kill the pull thread
                        log.exception("pull service task failed")
                nd = self.mux.next_deadline()
                wait = min(next_timer, nd if nd is not None else next_timer) - time.monotonic()
                done, fds = self.mux.poll(max(0, min(wait, 1.0)) * 1000 if not due else 0)
                if self._rfd in fds:
                    try:
                        while os.read(self._rfd, 4096):
                            pass
                    except BlockingIOError:
                        pass
                for pr, resp, addr in done:
                    try:
                        self.c._on_pull_response(pr, resp, addr)
                    except Exception:
                        log.exception("pull response handling failed for %s", pr.mq)
        finally:
            self.mux.close()
            os.close(self._rfd)
            os.close(self._wfd)


class PushConsumer(PushConsumerCalls):
    """A consumer-group member that is assigned queues and called back with their messages
    (RocketMQ DefaultMQPushConsumer).

    Parameters
    ----------
    namesrv_addr : str
        ``host:port[;host:port]``.
    group : str
        Consumer group.
    message_model : str
        ``CLUSTERING`` (queues divided among the group, offsets on the broker, failures to
        ``%RETRY%group``) or ``BROADCASTING`` (every member takes every queue, offsets in a
        local file, failures dropped).
    consume_from_where : str
        Start of a queue without a stored offset (see :class:`ConsumeFromWhere`).
    consume_timestamp_ms : int, optional
        For CONSUME_FROM_TIMESTAMP (default: 30 minutes before start).
    allocate_strategy : strategy, callable or name
        Queue allocation (default AllocateMessageQueueAveragely, see rmq.client.rebalance).
    consume_thread_max, consume_thread_min : int
        Bounds of the listener threads (20 and 1; RocketMQ's consumeThreadMin is 20).  The pool
        starts with ``consume_thread_min`` and grows towards ``consume_thread_max`` only while the
        listener calls wait off the CPU (I/O, sleeps, locks); while they are CPU-bound, more
        threads would only pass the GIL around (see :mod:`rmq.client.consume_pool`).  Raise
        ``consume_thread_min`` for a listener that spends its time in C code that releases the
        GIL.  An orderly listener has ``consume_thread_max`` threads from the start.
    pull_batch_size : int
        Messages asked per pull (``PUSH_PULL_BATCH_SIZE``, 1024; RocketMQ's pullBatchSize is 32,
        see the constant for why rmq asks more).
    consume_message_batch_max_size : int
        Messages per listener call (1).
    max_reconsume_times : int
        Deliveries before the DLQ; -1 = 16 (concurrent) or unlimited local retries (orderly).
    rebalance_interval_ms : int
        Rebalance period (20 000 ms; tests use ~500).
    persist_consumer_offset_interval_ms, heartbeat_broker_interval_ms, poll_name_server_interval_ms,
    lock_interval_ms : int
        Periods (5 000, 30 000, 30 000, 20 000 ms).
    pull_threshold_for_queue, pull_threshold_size_for_queue_mb, consume_concurrently_max_span : int
        Flow control per queue (1000 messages, 100 MiB, 2000 offsets): past one, the queue's next
        pull waits.  Past the message count it goes out as soon as the listeners bring the queue
        back to ``pull_threshold_for_queue``; otherwise (and at the latest) after RocketMQ's
        PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL (50 ms).  ``stats["flow_control"]`` counts the waits.
    suspend_current_queue_time_millis : int
        Orderly back-off after SUSPEND_CURRENT_QUEUE_A_MOMENT (1000 ms).
    instance_name : str, optional
        The client id is ``ip@instance_name`` (default ``pid#n``); set it to keep a BROADCASTING
        consumer's local offsets across restarts.
    offset_store_dir : str, optional
        Root of BROADCASTING offset files (default ``$RMQ_OFFSET_STORE_DIR`` or ``~/.rmq_offsets``).
    shutdown_await_ms : int
        How long :meth:`shutdown` waits for running listener calls (10 000 ms).
    enable_msg_trace, custom_trace_topic : bool, str
        Record RocketMQ's ``SubBefore`` / ``SubAfter`` trace of every listener call (group,
        client, time, cost, status, retries) in the background, to ``custom_trace_topic``
        (default ``RMQ_SYS_TRACE_TOPIC``); ``rmq admin queryMsgTraceById`` reads it.

    Concurrency: ``subscribe`` / ``register_message_listener*`` before ``start``; ``start`` /
    ``shutdown`` from one thread.  The listener runs on the consume threads.
    """

    def __init__(self, namesrv_addr: str, group: str, message_model: Union[str, MessageModel] = "CLUSTERING",
                 consume_from_where: Union[str, ConsumeFromWhere] = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 allocate_strategy=None, consume_thread_max: int = CONSUME_THREAD_MAX,
                 pull_batch_size: int = PUSH_PULL_BATCH_SIZE, consume_message_batch_max_size: int = 1,
                 max_reconsume_times: int = -1, rebalance_interval_ms: int = REBALANCE_INTERVAL_MS, *,
                 consume_timestamp_ms: Optional[int] = None, consume_thread_min: int = CONSUME_THREAD_MIN,
                 pull_interval_ms: int = 0, pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE,
                 pull_threshold_size_for_queue_mb: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_MB,
                 consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN,
                 suspend_current_queue_time_millis: int = SUSPEND_CURRENT_QUEUE_TIME_MS,
                 persist_consumer_offset_interval_ms: int = PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
                 heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
                 poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
                 lock_interval_ms: int = REBALANCE_LOCK_INTERVAL_MS, instance_name: Optional[str] = None,
                 offset_store_dir: Optional[str] = None, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 shutdown_await_ms: int = SHUTDOWN_AWAIT_MS, auth=None, enable_msg_trace: bool = False,
                 custom_trace_topic: Optional[str] = None):
        self._configure(locals())
        if not 1 <= consume_thread_min <= consume_thread_max:
            raise MQClientError(f"consume_thread_min must be in [1, consume_thread_max={consume_thread_max}], got "
                                f"{consume_thread_min}")
        self.consume_thread_min = consume_thread_min
        self.pull_interval_ms = pull_interval_ms
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.listener: Optional[Callable] = None
        self.orderly = False
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self._pq_lock = threading.RLock()
        self._mq_locks: dict[MessageQueue, threading.Lock] = {}
        self.api: Optional[ConsumerAPI] = None
        self.offset_store: Optional[OffsetStore] = None
        self._pull: Optional[_PullService] = None
        self._executor: Optional[ConsumePool] = None
        self._service: Optional[threading.Thread] = None
        self._heartbeats: Optional[threading.Thread] = None
        self._heartbeat_stop = threading.Event()
        self._wakeup = threading.Event()
        self._state = "CREATED"
        self.stats = {"consumed_ok": 0, "consumed_failed": 0, "sent_back": 0, "send_back_failed": 0, "pulls": 0,
                      "notifications": 0, "flow_control": 0}
        self._stats_lock = threading.Lock()
        self._park_seq = 0                      # serials of flow-control waits (_park; pull thread)

    # -- configuration ------------------------------------------------------------------------
    def subscribe(self, topic: str, sub_expression: "str | MessageSelector" = "*") -> None:
        """Consume ``topic`` filtered by tags (``"*"`` or ``"tagA || tagB"``, or
        ``MessageSelector.by_tag``) or by a SQL92 expression over message properties
        (``MessageSelector.by_sql("a > 5")``; the broker needs ``enablePropertyFilter=true``).

        Raises
        ------
        MQClientError
            A tag expression with no tag.
        FilterExpressionError
            A SQL92 expression that does not parse (line and column in the message).
        """
        self.subscriptions[topic] = SubscriptionData.build(topic, sub_expression)
        if self._state == "RUNNING":
            self._heartbeat_all()
            self.rebalance_immediately()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self._state == "RUNNING":
            self.rebalance_immediately()

    def register_message_listener(self, fn: Callable) -> Callable:
        """Concurrent listener ``fn(msgs, context) -> ConsumeConcurrentlyStatus`` (or its name;
        None counts as CONSUME_SUCCESS, an exception as RECONSUME_LATER).  Usable as a decorator."""
        if _is_coroutine_fn(fn):
            raise MQClientError("a coroutine listener needs rmq.aio.consumer.PushConsumer")
        self.listener, self.orderly = fn, False
        return fn

    def register_message_listener_orderly(self, fn: Callable) -> Callable:
        """Orderly listener ``fn(msgs, context) -> ConsumeOrderlyStatus`` (None counts as SUCCESS,
        an exception as SUSPEND_CURRENT_QUEUE_A_MOMENT).  Messages of one queue arrive one batch
        at a time, in queue order."""
        if _is_coroutine_fn(fn):
            raise MQClientError("a coroutine listener needs rmq.aio.consumer.PushConsumer")
        self.listener, self.orderly = fn, True
        return fn

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "PushConsumer":
        """Connect, announce the group membership and begin rebalancing and consuming.

        Raises
        ------
        MQClientError
            No listener or subscription, or already started.  An unreachable NameServer or
            broker is not an error: the member keeps retrying (and logs).
        """
        if self._state != "CREATED":
            raise MQClientError(f"the consumer is {self._state}, it can be started once")
        if self.listener is None:
            raise MQClientError("register a message listener before start()")
        if not self.subscriptions:
            raise MQClientError("subscribe to a topic before start()")
        self.api = ConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self.auth)
        if self.clustering:
            self.subscriptions.setdefault(retry_topic(self.group), SubscriptionData.build(retry_topic(self.group), "*"))
            self.offset_store = RemoteBrokerOffsetStore(self.group, self.api.query_consumer_offset,
                                                        self.api.update_consumer_offset)
        else:
            self.offset_store = LocalFileOffsetStore(self.group, self.client_id, self.offset_store_dir)
        self.offset_store.load()
        if self.consume_timestamp_ms is None:
            self.consume_timestamp_ms = int(time.time() * 1000) - 30 * 60 * 1000
        # orderly: every thread from the start (a task keeps its queue up to MAX_TIME_CONSUME_CONTINUOUSLY_MS:
        # a CPU-bound listener on too few threads would hold the other queues back that long)
        self._executor = ConsumePool(self.consume_thread_max, f"rmq-consume-{self.group}",
                                     self.consume_thread_max if self.orderly else self.consume_thread_min)
        if self.enable_msg_trace and self._trace is None:
            self._trace = _trace.TraceDispatcher(self.namesrv_addr, self.group, self.custom_trace_topic)
        self._pull = _PullService(self)
        self._pull.start()
        self._state = "RUNNING"
        for topic in list(self.subscriptions):
            try:
                self.api.route(topic)
            except MQClientError as e:
                log.warning("route of %s: %s", topic, e)
        self._heartbeat_all()
        self._service = threading.Thread(target=self._service_loop, name=f"rmq-rebalance-{self.group}", daemon=True)
        self._service.start()
        # heartbeats on a thread of their own (RocketMQ's MQClientInstance schedules them apart from
        # rebalancing): a slow rebalance, offset commit or lock round must not make the broker expire
        # this member (channelExpiredTimeout) and move its queues
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name=f"rmq-heartbeat-{self.group}",
                                            daemon=True)
        self._heartbeats.start()
        return self

    def shutdown(self) -> None:
        """Stop pulling, wait up to ``shutdown_await_ms`` for running listener calls, persist
        offsets, release queue locks, leave the group and close the sockets.  Messages pulled but
        not processed are not committed (the group gets them again).  Idempotent."""
        if self._state != "RUNNING":
            self._state = "SHUTDOWN"
            return
        self._state = "STOPPING"
        self._wakeup.set()
        self._heartbeat_stop.set()
        if self._service is not None:
            self._service.join(30)
        if self._heartbeats is not None:
            self._heartbeats.join(30)                    # no beat after the unregister below
        if self._pull is not None:
            self._pull.stop()
            self._pull.join(10)
        # queued batches are dropped (not committed: redelivered later); running listener calls
        # get shutdown_await_ms to finish and record their offsets
        self._executor.shutdown(self.shutdown_await_ms / 1000.0)
        with self._pq_lock:
            items = list(self.process_queue_table.items())
        for _, pq in items:
            pq.dropped = True
        try:
            # every offset, changed or not: a held pull carries the offset of its time, and the
            # broker may apply it after the last persist (RocketMQ's shutdown persists them all)
            self.offset_store.persist_all([mq for mq, _ in items], force=True)
            if self.orderly and self.clustering:
                self._unlock_all([mq for mq, _ in items])
            for addr in self.api.heartbeat_addrs():
                try:
                    self.api.unregister(addr, self.client_id, self.group)
                except MQClientError as e:
                    log.info("unregister from %s: %s", addr, e)
        finally:
            self._state = "SHUTDOWN"
            self.api.close()
            if self._trace is not None:
                self._trace.close()
                self._trace = None

    close = shutdown

    def __enter__(self) -> "PushConsumer":
        if self._state == "CREATED":
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        return self._state == "RUNNING"

    def assigned_message_queues(self, topic: Optional[str] = None) -> list:
        """Queues this member consumes now (not being dropped), sorted; retry topics included
        unless ``topic`` is given."""
        with self._pq_lock:
            return sorted(mq for mq, pq in self.process_queue_table.items()
                          if not pq.dropped and (topic is None or mq.topic == topic))

    def rebalance_immediately(self) -> None:
        self._wakeup.set()

    # -- the service thread: rebalance, heartbeats, offsets, locks --------------------------------------
    def _service_loop(self) -> None:
        now = time.monotonic()
        next_rebalance = now
        next_persist = now + max(self.persist_consumer_offset_interval_ms, 0) / 1000.0
        next_lock = now + self.lock_interval_ms / 1000.0
        while self._state == "RUNNING":
            now = time.monotonic()
            try:
                self.api.refresh_doubtful_routes()      # a pull failed on a broker: a new master?
                if self._wakeup.is_set() or now >= next_rebalance:
                    self._wakeup.clear()
                    self.do_rebalance()
                    next_rebalance = time.monotonic() + self.rebalance_interval_ms / 1000.0
                if now >= next_persist:
                    self.persist_consumer_offset()
                    next_persist = now + self.persist_consumer_offset_interval_ms / 1000.0
                if self.orderly and self.clustering and now >= next_lock:
                    self._lock_all()
                    next_lock = now + self.lock_interval_ms / 1000.0
            except Exception:                    # keep the member alive whatever one step does
                log.exception("consumer %s service step failed", self.group)
            if self._state != "RUNNING":
                break
            nxt = min(next_rebalance, next_persist, next_lock if self.orderly and self.clustering else next_rebalance)
            self._wakeup.wait(max(0.0, min(nxt - time.monotonic(), 1.0)))

    def _heartbeat_loop(self) -> None:
        """Every ``heartbeat_broker_interval_ms``, on this thread only, until shutdown."""
        interval = self.heartbeat_broker_interval_ms / 1000.0
        next_heartbeat = time.monotonic() + interval
        while self._state == "RUNNING":
            wait = next_heartbeat - time.monotonic()
            if wait > 0:
                self._heartbeat_stop.wait(min(wait, 1.0))
                continue
            next_heartbeat += interval
            if next_heartbeat < time.monotonic():        # fell behind (a long stall): no burst of beats
                next_heartbeat = time.monotonic() + interval
            try:
                self._heartbeat_all()
            except Exception:                            # keep beating whatever one round does
                log.exception("consumer %s heartbeat failed", self.group)

    def persist_consumer_offset(self) -> None:
        self.offset_store.persist_all(self.assigned_message_queues())

    def _heartbeat_all(self) -> None:
        drive(self._heartbeat_all_call(), self.api.invoke)

    def do_rebalance(self) -> None:
        """One rebalance of every subscribed topic (RocketMQ ``RebalanceImpl.doRebalance``)."""
        for topic in list(self.subscriptions):
            try:
                self._rebalance_by_topic(topic)
            except MQClientError as e:
                log.warning("rebalance of %s for %s: %s", topic, self.group, e)
        with self._pq_lock:
            stale = [(mq, pq) for mq, pq in self.process_queue_table.items() if mq.topic not in self.subscriptions]
        for mq, pq in stale:
            pq.dropped = True
            if self._remove_unnecessary_message_queue(mq, pq):
                with self._pq_lock:
                    if self.process_queue_table.get(mq) is pq:
                        del self.process_queue_table[mq]

    def _rebalance_by_topic(self, topic: str) -> None:
        mq_set = drive(self._allocate_call(topic), self.api.invoke)
        if mq_set is not None:
            self._update_process_queue_table(topic, mq_set)

    def _update_process_queue_table(self, topic: str, mq_set: set) -> bool:
        changed = False
        with self._pq_lock:
            items = [(mq, pq) for mq, pq in self.process_queue_table.items() if mq.topic == topic]
        for mq, pq in items:
            if mq not in mq_set or pq.dropped or pq.is_pull_expired():
                if mq in mq_set and not pq.dropped:
                    log.warning("%s: no pull for %d s, dropping its process queue", mq,
                                int(time.monotonic() - pq.last_pull_timestamp))
                pq.dropped = True
                if self._remove_unnecessary_message_queue(mq, pq):
                    with self._pq_lock:
                        if self.process_queue_table.get(mq) is pq:
                            del self.process_queue_table[mq]
                    changed = True
        for mq in sorted(mq_set):
            with self._pq_lock:
                if mq in self.process_queue_table:
                    continue
            locked = False
            if self.orderly and self.clustering:
                if not self._lock_one(mq):
                    log.debug("%s: lock held by another member, will retry", mq)
                    continue
                locked = True
            self.offset_store.remove_offset(mq)
            pq = ProcessQueue()
            if locked:
                pq.locked = True
                pq.last_lock_timestamp = time.monotonic()
            last = self.offset_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
            next_offset = drive(self._start_offset_call(mq, last), self.api.invoke)
            if next_offset < 0:
                log.warning("%s: start offset unknown, retrying at the next rebalance", mq)
                if locked:
                    self._unlock_all([mq])
                continue
            self.offset_store.update_offset(mq, next_offset, increase_only=False)
            with self._pq_lock:
                self.process_queue_table[mq] = pq
            pr = PullRequest(self.group, mq, pq, next_offset, previously_locked=True)
            # its first pull goes now, while the next queues' start offsets are asked for (each one
            # or two round trips: 8 new queues kept the first pull ~16 round trips back)
            self._pull.call_soon(lambda pr=pr: self._pull_message(pr))
            changed = True
            log.info("%s: %s takes %s from offset %d", self.group, self.client_id, mq, next_offset)
        return changed

    def _remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Commit what ``mq`` processed and forget it; an orderly clustering member first waits
        (1 s at most) for the running batch, then unlocks the queue on the broker.  False when
        the batch is still running (the next rebalance tries again)."""
        if self.orderly and self.clustering:
            if not pq.consume_lock.acquire(timeout=1.0):
                pq.try_unlock_times += 1
                return False
            try:
                self.offset_store.persist(mq)
                self.offset_store.remove_offset(mq)
                self._unlock_all([mq])
                pq.locked = False
                return True
            finally:
                pq.consume_lock.release()
        self.offset_store.persist(mq)
        self.offset_store.remove_offset(mq)
        return True

    # -- queue locks (orderly, clustering) ------------------------------------------------------------
    def _lock_one(self, mq: MessageQueue) -> bool:
        return drive(self._lock_one_call(mq), self.api.invoke)

    def _lock_all(self) -> None:
        """Renew every queue lock (RocketMQ ``RebalanceImpl.lockAll``)."""
        with self._pq_lock:
            table = {mq: pq for mq, pq in self.process_queue_table.items() if not pq.dropped}
        drive(self._lock_all_call(table), self.api.invoke)

    def _unlock_all(self, mqs: Iterable[MessageQueue]) -> None:
        drive(self._unlock_call(mqs), self.api.invoke)

    # -- pulling (pull thread) ----------------------------------------------------------------------------
    def _pull_later(self, pr: PullRequest, delay_ms: float) -> None:
        if self._state == "RUNNING" and not pr.pq.dropped:
            self._pull.call_later(delay_ms, lambda: self._pull_message(pr))

    def _park(self, pr: PullRequest, delay_ms: float) -> None:
        """Flow control by message count (pull thread): pull ``pr`` again as soon as the consume
        side has brought its process queue down to ``pull_threshold_for_queue``
        (:meth:`ProcessQueue.notify_when_below`), or after ``delay_ms`` (RocketMQ's fixed
        PULL_TIME_DELAY_MS_WHEN_FLOW_CONTROL), whichever comes first.  RocketMQ only waits the
        50 ms; with rmq's 1,024-message pulls one page passes the 1,000-message threshold, the
        listener made room within about a millisecond and then had nothing to do for the rest
        of the 50 ms (the PushConsumer's rate fell by about a quarter in the runs where it
        happened, bench/results/client.md, stop 44)."""
        self._park_seq += 1
        serial = pr.parked = self._park_seq
        self.stats["flow_control"] += 1

        def resume() -> None:
            if pr.parked == serial:          # not resumed yet by the other path
                pr.parked = 0
                self._pull_message(pr)
        self._pull.call_later(delay_ms, resume)
        pr.pq.notify_when_below(self.pull_threshold_for_queue, lambda: self._pull.call_soon(resume))

    def _pull_message(self, pr: PullRequest) -> None:
        """Send one PULL_MESSAGE for ``pr`` (pull thread only); RocketMQ ``pullMessage``."""
        pq = pr.pq
        if pq.dropped or self._state != "RUNNING":
            return
        delay = self._pull_gate(pq, pr.mq)
        if delay is not None:
            if self._held_for_room(pq, delay):
                self._park(pr, delay)
            else:
                self._pull_later(pr, delay)
            return
        addr = ""
        try:
            # the broker the last response suggested, else the master, else a slave (PullAPIWrapper)
            broker_id, addr = self.api.pull_broker_addr(pr.mq, fetch=False)
            frame = self._pull_frame(pr.mq, pr.next_offset, broker_id)
            pr.opaque = self._pull.mux.send(addr, frame, CONSUMER_TIMEOUT_MS_WHEN_SUSPEND, pr)
            self.stats["pulls"] += 1
        except MQClientError as e:
            if isinstance(e, RemotingError) and addr:
                self.api.on_pull_response(pr.mq, e, addr)
            log.warning("pull of %s not sent: %s", pr.mq, e)
            self._pull_later(pr, PULL_TIME_DELAY_MS_WHEN_EXCEPTION)

    def _on_pull_response(self, pr: PullRequest, resp, addr: str) -> None:
        self.api.on_pull_response(pr.mq, resp, addr)        # suggestWhichBrokerId / failed address
        pq = pr.pq
        if pq.dropped or self._state != "RUNNING":
            return
        if isinstance(resp, Exception):
            log.warning("pull of %s from %s failed: %s", pr.mq, addr, resp)
            self._pull_later(pr, PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
            return
        sub = self.subscriptions.get(pr.mq.topic)
        try:
            res = parse_pull_response(resp, sub, addr, retry_topic(self.group) if self.clustering else None)
        except MQClientError as e:
            log.warning("pull of %s from %s: %s", pr.mq, addr, e)
            self._pull_later(pr, PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
            return
        outcome = self._pull_outcome(res, pq, pr.mq, pr.next_offset)
        pr.next_offset = res.next_begin_offset
        if outcome == "found":
            msgs = res.msg_found_list
            self._submit_consume(msgs, pq, pr.mq, pq.put_message(msgs))
            if self.pull_interval_ms > 0:
                self._pull_later(pr, self.pull_interval_ms)
            else:
                self._pull_message(pr)
        elif outcome == "again":
            self._pull_message(pr)
        else:
            self._pull.call_later(1000, lambda: self._executor_submit(self._fix_illegal_offset, pr))

    def _fix_illegal_offset(self, pr: PullRequest) -> None:
        self.offset_store.update_offset(pr.mq, pr.next_offset, increase_only=False)
        self.offset_store.persist(pr.mq)
        with self._pq_lock:
            if self.process_queue_table.get(pr.mq) is pr.pq:
                del self.process_queue_table[pr.mq]
        self.rebalance_immediately()

    # -- consuming ----------------------------------------------------------------------------------------
    def _executor_submit(self, fn: Callable, *args) -> None:
        if self._state not in ("RUNNING", "STOPPING") or self._executor is None:
            return
        self._executor.submit(fn, args)

    def _submit_consume(self, msgs: list, pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        if _lt.ENABLED:
            _lt.stamp_messages("c_submit", msgs, time.monotonic_ns())
        if self.orderly:
            if dispatch:
                self._executor_submit(self._consume_orderly, pq, mq)
            return
        run = ConsumeRun(msgs, self.consume_message_batch_max_size, pq, mq)
        # one task per idle worker, at least one: a busy pool gets one task per pull result, an
        # idle one still runs the requests of a pull in parallel (slow listeners)
        if self._state not in ("RUNNING", "STOPPING") or self._executor is None:
            return
        for _ in range(max(1, min(run.count, self._executor.waiting()))):
            self._executor.submit(self._consume_run, (run,), run)

    def _submit_consume_later(self, msgs: list, pq: ProcessQueue, mq: MessageQueue, delay_ms: float) -> None:
        self._pull.call_later(delay_ms, lambda: self._executor_submit(self._consume_concurrently, msgs, pq, mq))

    # -- message trace (ConsumeMessageTraceHookImpl) ----------------------------------------------------
    def _trace_before(self, msgs: list) -> tuple:
        rid, recs = _trace.sub_contexts(self.group, msgs, self.client_id)
        for r in recs:
            self._trace.append(r)
        return rid, time.monotonic()

    def _trace_after(self, tr: tuple, msgs: list, success: bool) -> None:
        rid, t0 = tr
        for r in _trace.sub_after_contexts(self.group, rid, msgs, int((time.monotonic() - t0) * 1000), success):
            self._trace.append(r)

    def _consume_run(self, run: ConsumeRun) -> None:
        """Take the ConsumeRequests of ``run`` one after the other until none is left (other
        workers may take some too).  Wholly consumed requests are committed together (removed
        from the process queue, offset, counts) at the end and at least every
        ``RUN_COMMIT_INTERVAL_S``; any other outcome goes through the per-request path at once.
        Stops taking requests when the consumer stops (those left are redelivered later).
        The loop is ``rmq._core.consume.consume_run``: with the defaults it runs once per
        message, so it is C; the rare paths call back into the methods below."""
        consume_run(run, self, self.listener, ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
                    ConsumeConcurrentlyStatus.RECONSUME_LATER, _concurrent_status)

    def _listener_failed(self, msgs: list, mq: MessageQueue) -> None:
        """consume_run's except block: the listener raised (logged with its traceback)."""
        log.exception("listener failed on %d message(s) of %s", len(msgs), mq)

    def _dropped_while_consuming(self, mq: MessageQueue, n: int) -> None:
        log.info("%s dropped while consuming; %d message(s) will be redelivered", mq, n)

    def _commit_consumed(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Messages consumed successfully: out of the process queue, the offset forward, counted
        (last: a reader of the count sees the offset)."""
        offset = pq.remove_message(msgs)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(mq, offset, increase_only=True)
        with self._stats_lock:
            self.stats["consumed_ok"] += len(msgs)

    def _consume_concurrently(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """One listener call (RocketMQ ``ConsumeMessageConcurrentlyService.ConsumeRequest``): a
        request consumed again locally after a failed send-back, as a run of one request."""
        self._consume_run(ConsumeRun(msgs, len(msgs), pq, mq))

    def _process_concurrent_result(self, status, ctx: ConsumeConcurrentlyContext, msgs: list, pq: ProcessQueue,
                                   mq: MessageQueue) -> None:
        again = drive(self._concurrent_result_call(status, ctx, msgs, pq, mq), self.api.invoke)
        if again:
            self._submit_consume_later(again, pq, mq, RECONSUME_LATER_LOCALLY_MS)

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] += n

    # -- orderly -------------------------------------------------------------------------------------------
    def _mq_lock(self, mq: MessageQueue) -> threading.Lock:
        with self._pq_lock:
            lk = self._mq_locks.get(mq)
            if lk is None:
                lk = self._mq_locks[mq] = threading.Lock()
            return lk

    def _submit_orderly_later(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: float) -> None:
        self._pull.call_later(delay_ms, lambda: self._executor_submit(self._consume_orderly, pq, mq))

    def _try_lock_later_and_reconsume(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: float) -> None:
        def relock():
            if pq.dropped:
                return
            if self._lock_one(mq):
                pq.locked = True
                pq.last_lock_timestamp = time.monotonic()
                self._submit_orderly_later(pq, mq, 10)
            else:
                self._submit_orderly_later(pq, mq, PULL_TIME_DELAY_MS_WHEN_EXCEPTION)
        self._pull.call_later(delay_ms, lambda: self._executor_submit(relock))

    def _consume_orderly(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consume ``mq`` in order while it is locked (RocketMQ ``ConsumeMessageOrderlyService.ConsumeRequest``)."""
        if pq.dropped:
            return
        with self._mq_lock(mq):
            if self.clustering and (not pq.locked or pq.is_lock_expired()):
                if not pq.dropped:
                    self._try_lock_later_and_reconsume(pq, mq, 100)
                return
            begin = time.monotonic()
            while True:
                if pq.dropped:
                    return
                if self.clustering and (not pq.locked or pq.is_lock_expired()):
                    self._try_lock_later_and_reconsume(pq, mq, 10)
                    return
                if (time.monotonic() - begin) * 1000 > MAX_TIME_CONSUME_CONTINUOUSLY_MS:
                    self._submit_orderly_later(pq, mq, 10)
                    return
                msgs = pq.take_messages(self.consume_message_batch_max_size)
                if not msgs:
                    return
                with pq.consume_lock:
                    if pq.dropped:
                        return
                    ctx = ConsumeOrderlyContext(mq)
                    tr = self._trace_before(msgs) if self._trace is not None else None
                    try:
                        status = self.listener(msgs, ctx)
                        status = ConsumeOrderlyStatus.SUCCESS if status is None else \
                            ConsumeOrderlyStatus(status.value if isinstance(status, enum.Enum) else status)
                    except Exception:
                        log.exception("orderly listener failed on %d message(s) of %s", len(msgs), mq)
                        status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                    if tr is not None:
                        self._trace_after(tr, msgs, status is ConsumeOrderlyStatus.SUCCESS)
                    if not self._process_orderly_result(status, ctx, msgs, pq, mq):
                        return

    def _process_orderly_result(self, status, ctx: ConsumeOrderlyContext, msgs: list, pq: ProcessQueue,
                                mq: MessageQueue) -> bool:
        """Commit or put back; True to keep consuming.  Caller holds ``pq.consume_lock`` (so the
        offset is recorded before a rebalance persists it and unlocks the queue)."""
        commit_offset = -1
        if status is ConsumeOrderlyStatus.SUCCESS:
            commit_offset = pq.commit()
            if commit_offset >= 0:
                self.offset_store.update_offset(mq, commit_offset, increase_only=False)
            self._count("consumed_ok", len(msgs))       # after the offset: see _process_concurrent_result
            return True
        else:
            self._count("consumed_failed", len(msgs))
            if self._check_reconsume_times(msgs, mq):
                pq.make_message_to_consume_again(msgs)
                delay = ctx.suspend_current_queue_time_millis
                self._submit_orderly_later(pq, mq, delay if delay >= 0 else self.suspend_current_queue_time_millis)
                return False
            commit_offset = pq.commit()
            cont = True
        if commit_offset >= 0:
            self.offset_store.update_offset(mq, commit_offset, increase_only=False)
        return cont

    def _check_reconsume_times(self, msgs: list, mq: MessageQueue) -> bool:
        return drive(self._reconsume_call(msgs, mq), self.api.invoke)
