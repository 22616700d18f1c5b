"""PullMessageProcessor (PULL_MESSAGE, 11) and PullRequestHoldService (long polling).

Source: RocketMQ ``broker/.../processor/PullMessageProcessor.java``,
``broker/.../longpolling/PullRequestHoldService.java``; SPEC.md §13 (pull, PullSysFlag, suggest
which broker), §13.3 (long polling).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Optional

from rmq import latency_trace as _lt
from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.common.perm import PERM_READ
from rmq.common.pull_sys_flag import has_commit_offset_flag, has_suspend_flag   # PullSysFlag (SPEC.md §13.1)
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group
from rmq.errors import FilterExpressionError
from rmq.filter import ExpressionType, compile_sql92
from rmq.protocol import Frame, ResponseCode, field_int, field_str
from rmq.status import GetMessageStatus

MAX_PULL_BATCH = 4096                        # maxMsgNums ceiling per pull (rmq limit)
RECENT_APPENDS_PER_QUEUE = 256               # appends per queue the broker remembers until reput has
                                             # dispatched them (pulls ahead of the ConsumeQueue are served
                                             # from them); beyond it the oldest are left to reput
NOT_LONG_POLLING_HOLD_MS = 1000              # a suspended pull's hold with longPollingEnable=false
                                             # (BrokerConfig.shortPollingTimeMills)

GET_STATUS_TO_CODE = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
}

# get_messages outcomes of an offset at or past the ConsumeQueue's end (pulls ahead of reput)
_AT_OR_PAST_CQ_END = frozenset({GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                                GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE})


class PullRequest:
    """A held PULL_MESSAGE (RocketMQ's PullRequest)."""
    __slots__ = ("frame", "reply", "offset", "deadline", "arrived")

    def __init__(self, frame: Frame, reply: Reply, offset: int, deadline: float, arrived: float):
        self.frame = frame
        self.reply = reply
        self.offset = offset            # the queue offset it waits for (entries)
        self.deadline = deadline        # monotonic s it is answered anyway
        self.arrived = arrived          # monotonic s the request was read (latency trace)


class PullRequestHoldService:
    """Pulls parked at a queue's tail until a message arrives or their suspend time ends.

    ``holds``: (topic, queueId) -> [PullRequest].  Woken by reput's DISPATCH_ANNOUNCE
    (:meth:`notify_message_arriving`), by the broker's own appends (:meth:`wake_from_appends`,
    rmq), and expired every HOLD_CHECK_MS (:meth:`check_holds`).
    """

    def __init__(self, processor: "PullMessageProcessor"):
        self.processor = processor
        self.holds: dict[tuple, list[PullRequest]] = {}
        self.appended_queues: set = set()        # held queues appended to in this loop turn

    def __len__(self) -> int:
        return sum(len(v) for v in self.holds.values())

    def suspend(self, key: tuple, request: PullRequest) -> None:
        self.holds.setdefault(key, []).append(request)

    def _sweep(self, key: tuple, answer) -> None:
        """``answer(pr)`` -> True when ``pr`` was answered (dropped), False to keep holding it."""
        reqs = self.holds.get(key)
        if not reqs:
            return
        keep = [pr for pr in reqs if not answer(pr)]
        if keep:
            self.holds[key] = keep
        else:
            del self.holds[key]

    def _repull(self, pr: PullRequest) -> bool:
        resp = self.processor.pull(pr.frame, allow_suspend=False, reply=pr.reply, arrived=pr.arrived)
        if resp is not None:
            pr.reply.send(resp)
        return True

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The ConsumeQueue of (topic, queue_id) now ends at ``max_offset``: answer the pulls
        waiting below it (NotifyMessageArrivingListener)."""
        self._sweep((topic, queue_id), lambda pr: max_offset > pr.offset and self._repull(pr))

    def wake_from_appends(self) -> None:
        """Answer pulls held on the queues appended to in this turn from those appends
        (:meth:`PullMessageProcessor.from_appends`); the others stay held for reput's announcement."""
        queues, self.appended_queues = self.appended_queues, set()
        p = self.processor
        for key in queues:
            def serve(pr: PullRequest, key=key) -> bool:
                f = pr.frame.fields
                served = p.from_appends(key[0], key[1], pr.offset,
                                        field_int(pr.frame, "maxMsgNums", 32, lo=1, hi=MAX_PULL_BATCH),
                                        f.get("subscription", "*")
                                        if ExpressionType.is_tag_type(f.get("expressionType")) else None)
                if served is None:
                    return False
                gcfg = p.b.group_config(field_str(pr.frame, "consumerGroup")) or {}
                pr.reply.send(p.appends_response(pr.frame, key[0], key[1], pr.offset, served, gcfg, pr.arrived))
                return True
            self._sweep(key, serve)

    def check_holds(self) -> None:
        """Answer the pulls whose suspend time is over (with what there is, usually PULL_NOT_FOUND)."""
        now = time.monotonic()
        for key in list(self.holds):
            self._sweep(key, lambda pr: now >= pr.deadline and self._repull(pr))

    def answer_all(self) -> None:
        """Broker stop: every held pull gets what there is, or PULL_NOT_FOUND."""
        for reqs in self.holds.values():
            for pr in reqs:
                pr.reply.send(self.processor.pull(pr.frame, allow_suspend=False, reply=pr.reply) or Frame(
                    ResponseCode.PULL_NOT_FOUND, remark="broker stopping"))
        self.holds.clear()


class PullMessageProcessor(RequestProcessor):
    """PULL_MESSAGE: permission and subscription checks, the store read, the suggested broker, the
    commit of the consumer's offset, and the hold of a pull at a queue's tail."""

    def __init__(self, broker):
        super().__init__(broker)
        self.hold_service = PullRequestHoldService(self)
        # (topic, queueId) -> deque of (first queue offset, count, physical offset, bytes): appends
        # reput has not announced yet (see from_appends)
        self.recent_appends: dict[tuple, deque] = {}

    def on_pull(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        return self.pull(frame, allow_suspend=True, reply=reply)

    def pull(self, frame: Frame, allow_suspend: bool, reply: Reply, arrived: Optional[float] = None) -> Optional[Frame]:
        """One PULL_MESSAGE; ``arrived`` (monotonic s) is set for a held pull woken or expired."""
        b = self.b
        if not b.broker_permission & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{b.broker_name}] pulling message is forbidden")
        group = field_str(frame, "consumerGroup")
        try:
            check_group(group)
        except ValueError as e:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, str(e))
        gcfg = b.group_config(group)
        if gcfg is None:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                  f"subscription group [{group}] does not exist")
        if not gcfg.get("consumeEnable", True):
            return frame.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        if arrived is None:
            b.client_manager.note_consumer_channel(group, reply)   # where NOTIFY_CONSUMER_IDS_CHANGED goes
        topic = field_str(frame, "topic")
        store = b.store
        cfg = store.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg["perm"] & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        if queue_id >= cfg["readQueueNums"]:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                  f"[{cfg['readQueueNums']}]")
        offset = field_int(frame, "queueOffset", lo=0)
        max_nums = field_int(frame, "maxMsgNums", 32, lo=1, hi=MAX_PULL_BATCH)
        sys_flag = field_int(frame, "sysFlag", 0, lo=0)
        subscription = frame.fields.get("subscription", "*")
        if not isinstance(subscription, str):
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "header field 'subscription' must be a str")
        sql_filter = self.subscription_filter(frame, group, frame.fields.get("expressionType"), subscription)
        if isinstance(sql_filter, Frame):
            return sql_filter
        moved = self.past_epoch_end(frame, group, topic, queue_id, offset)
        if moved is not None:
            return moved
        res = store.get_messages(group, topic, queue_id, offset, max_nums,
                                 None if sql_filter is not None else subscription, sql_filter=sql_filter)
        code = GET_STATUS_TO_CODE.get(res.status)
        if code is None:      # NO_MESSAGE_IN_QUEUE / NO_MATCHED_LOGIC_QUEUE
            code = ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED
        if allow_suspend and has_commit_offset_flag(sys_flag) and b.role != "SLAVE":
            commit = field_int(frame, "commitOffset", -1)
            # never back: this pull may have been overtaken by the consumer's later persist on another
            # connection (RocketMQ stores the value as is, SPEC.md §13.1 step 9; a move back still
            # comes by UPDATE_CONSUMER_OFFSET, which the consumer sends after a pull carried one)
            if commit >= 0:
                store.consumer_offset_manager.commit_offset(group, topic, queue_id, commit, increase_only=True)
        next_begin = res.next_begin_offset
        if res.status in _AT_OR_PAST_CQ_END and res.max_offset <= offset <= \
                store.get_current_queue_offset(topic, queue_id):
            # at or past the ConsumeQueue's end but within what was appended: reput has not announced
            # it yet.  Served from the appends (a consumer served that way pulls on before reput's
            # announcement), else nothing new yet -- never a moved offset
            served = self.from_appends(topic, queue_id, offset, max_nums,
                                       subscription if sql_filter is None else None)
            if served is not None:
                return self.appends_response(frame, topic, queue_id, offset, served, gcfg, arrived)
            code, next_begin = ResponseCode.PULL_NOT_FOUND, offset
        # SPEC.md §13.1/§13.2: with slaveReadEnable a consumer far behind (its data no longer
        # in memory) is sent to the slave, others to the group's brokerId; without it, to the master
        suggest = 0
        if b.slave_read_enable:
            suggest = int(gcfg.get("whichBrokerWhenConsumeSlowly", 1)) if res.suggest_pulling_from_slave \
                else int(gcfg.get("brokerId", 0))
        fields = self.with_epoch({"nextBeginOffset": next_begin, "minOffset": res.min_offset,
                                  "maxOffset": res.max_offset, "suggestWhichBrokerId": suggest})
        if code == ResponseCode.SUCCESS:
            if _lt.ENABLED:
                _lt.event("pull", topic, queue_id, offset, res.next_begin_offset,
                          int((arrived or b.request_received_at) * 1e9), time.monotonic_ns(), arrived is not None)
            self._count_get(topic, group, queue_id, res.message_count, len(res.records), res.next_begin_offset)
            return frame.response(code, fields=fields, bodies=[res.records])
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and has_suspend_flag(sys_flag):
            suspend_ms = min(field_int(frame, "suspendTimeoutMillis", b.suspend_max_ms, lo=0),
                             b.suspend_max_ms) if b.long_polling else NOT_LONG_POLLING_HOLD_MS
            self.hold_service.suspend((topic, queue_id), PullRequest(
                frame, reply, offset, time.monotonic() + suspend_ms / 1000.0, b.request_received_at))
            return None
        return frame.response(code, fields=fields)

    def past_epoch_end(self, frame: Frame, group: str, topic: str, queue_id: int, offset: int) -> Optional[Frame]:
        """PULL_OFFSET_MOVED when the consumer's position was read in an HA epoch this broker's log
        left behind (rmq; Kafka's consumer position validation, KIP-320), else None.

        A consumer sends ``lastEpoch``: the ``brokerEpoch`` of the answer that gave it its position.
        When an ASYNC_MASTER died with messages its replica never got, the consumers may have read
        them; the replica, promoted, writes its own messages at those queue offsets, and a consumer
        pulling on from its position would skip as many of them.  Here the log holds an epoch newer
        than ``lastEpoch``, starting at CommitLog byte S: the consumer saw at most the entries
        stored before S, so a position past the queue offset of S is moved back to it (the
        consumer reads every message of the newer epochs).  Undecided (None) until reput has
        dispatched past S.  With ``allAckInSyncStateSet=true`` consumers never read what a
        failover can lose, and this never moves anybody."""
        last = frame.fields.get("lastEpoch")
        if last is None:
            return None
        b = self.b
        try:
            last = int(last)
        except (TypeError, ValueError):
            return frame.response(ResponseCode.SYSTEM_ERROR, f"header field 'lastEpoch' must be an int, got {last!r}")
        end = self.lost_tail_start(topic, queue_id, last)
        if end is None or offset <= end:
            return None
        store, epochs = b.store, b.epochs
        self.log.warning("pull of %s:%d by %s from queue offset %d, read in epoch %d: this log's epoch %d "
                         "starts at queue offset %d (messages lost in a failover): moved back there",
                         topic, queue_id, group, offset, last, epochs.last_epoch(), end)
        return frame.response(ResponseCode.PULL_OFFSET_MOVED, fields=self.with_epoch({
            "nextBeginOffset": end, "minOffset": store.get_min_offset_in_queue(topic, queue_id),
            "maxOffset": store.get_max_offset_in_queue(topic, queue_id), "suggestWhichBrokerId": 0}))

    def with_epoch(self, fields: dict) -> dict:
        """A pull answer's header ``fields`` with ``brokerEpoch``: the newest HA epoch of this
        broker's log (none before a first epoch), which the consumer sends back as ``lastEpoch``."""
        epoch = self.b.epochs.last_epoch()
        if epoch > 0:
            fields["brokerEpoch"] = epoch
        return fields

    def _count_get(self, topic: str, group: str, queue_id: int, count: int, size: int, next_offset: int) -> None:
        b = self.b
        b.stats["getMessageTotal"] += count
        b.stats["getBytesTotal"] += size
        b.broker_stats.get.add(f"{topic}@{group}", count, size, int(time.time() * 1000))
        if b.metrics is not None:
            b.metrics.on_get(topic, group, count, size)
            b.pull_offsets[(group, topic, queue_id)] = next_offset

    def subscription_filter(self, frame: Frame, group: str, expression_type, expression: str):
        """The compiled SQL92 filter of a subscription, None for a tag expression, or the error
        response (PULL_MESSAGE and POP_MESSAGE).  PullMessageProcessor: a non-tag expression needs
        enablePropertyFilter; it is compiled once per distinct expression (compile_sql92's cache)."""
        if ExpressionType.is_tag_type(expression_type):
            return None
        if expression_type != ExpressionType.SQL92:
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                  f"unsupported expression type {expression_type!r} (TAG or SQL92)")
        if not self.b.enable_property_filter:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"The broker does not support consumer to filter message by {expression_type}")
        try:
            return compile_sql92(expression)
        except FilterExpressionError as e:
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                  f"parse the consumer's subscription[{expression}] failed, group: {group}: {e}")

    # -- pulls served from the broker's own appends (rmq) ------------------------------------------
    def note_append(self, topic: str, queue_id: int, res) -> None:
        """Remember an append of a consumable record (a send, a commit record, a timer's re-put) so
        that pulls held at that queue's tail are answered before reput has dispatched it (see
        :meth:`from_appends`)."""
        if not self.b.wake_pull_on_append:
            return
        a = res.append
        key = (topic, queue_id)
        recent = self.recent_appends.get(key)
        if recent is None:
            recent = self.recent_appends[key] = deque(maxlen=RECENT_APPENDS_PER_QUEUE)
        recent.append((a.queue_offset, a.msg_num, a.wrote_offset, a.wrote_bytes))
        if key in self.hold_service.holds:
            self.hold_service.appended_queues.add(key)

    def on_dispatched(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Reput announced the ConsumeQueue of (topic, queue_id) up to ``max_offset``: forget the
        appends it now holds, answer the pulls waiting below it."""
        recent = self.recent_appends.get((topic, queue_id))
        if recent is not None:            # in the ConsumeQueue now: normal pulls serve them
            while recent and recent[0][0] + recent[0][1] <= max_offset:
                recent.popleft()
            if not recent:
                del self.recent_appends[(topic, queue_id)]
        self.hold_service.notify_message_arriving(topic, queue_id, max_offset)

    def on_flushed(self) -> None:
        """SYNC_FLUSH: more of the CommitLog is durable; held pulls on recent appends may be served."""
        hs = self.hold_service
        if self.recent_appends and hs.holds:
            hs.appended_queues.update(k for k in self.recent_appends if k in hs.holds)
            hs.wake_from_appends()

    def from_appends(self, topic: str, queue_id: int, offset: int, max_nums: int, subscription) -> Optional[tuple]:
        """The records of queue offsets ``offset``.. from appends reput has not announced yet:
        ``(records, count, bytes)``, or None (rmq; ``wakePullOnAppendEnable``, default true).

        RocketMQ serves a pull from the ConsumeQueue, which its in-process reput fills and then wakes
        held pulls (NotifyMessageArrivingListener).  Here reput is another process, two process hops
        away.  The broker wrote these records and assigned their queue offsets itself, so it gives the
        very reply a pull gets once the ConsumeQueue has the entries: the records byte for byte,
        whole appends in queue-offset order from ``offset``, at most ``max_nums`` messages.  Only what
        a consumer may see (:meth:`BrokerActor.consumable_end`: under SYNC_FLUSH only flushed bytes, with
        allAckInSyncStateSet only what the SyncStateSet holds; SPEC.md header); half (prepared) messages are never recorded.  Whole appends only: a pull that
        starts inside a batch or wants fewer messages than the next append holds, one with a tag
        filter, or one older than what is remembered goes the normal way.
        """
        recent = self.recent_appends.get((topic, queue_id))
        if not recent or subscription not in ("*", "") or offset < recent[0][0]:     # None: a SQL92 filter
            return None
        b = self.b
        limit = b.consumable_end()
        parts, count, size, want = [], 0, 0, offset
        for first, n, phys, nbytes in recent:
            if first + n <= want:
                continue
            # whole appends only: a batch is never cut (bulk producers' batches go the normal way,
            # where one ConsumeQueue read serves any part of them)
            if first != want or count + n > max_nums or phys + nbytes > limit:
                break
            data = b.store.get_commit_log_data(phys, nbytes)
            if data is None:                # cleaned meanwhile: the normal path answers
                break
            parts.append(data)
            count += n
            size += nbytes
            want += n
        if not count:
            return None
        return (parts[0] if len(parts) == 1 else b"".join(parts)), count, size

    def appends_response(self, frame: Frame, topic: str, queue_id: int, offset: int, served: tuple,
                         gcfg: dict, arrived: Optional[float]) -> Frame:
        b = self.b
        records, count, size = served
        suggest = int(gcfg.get("brokerId", 0)) if b.slave_read_enable else 0
        group = field_str(frame, "consumerGroup")
        self._count_get(topic, group, queue_id, count, size, offset + count)
        if _lt.ENABLED:
            _lt.event("pull", topic, queue_id, offset, offset + count,
                      int((arrived or b.request_received_at) * 1e9), time.monotonic_ns(), arrived is not None)
        store = b.store
        return frame.response(ResponseCode.SUCCESS, fields=self.with_epoch({
            "nextBeginOffset": offset + count, "minOffset": store.get_min_offset_in_queue(topic, queue_id),
            "maxOffset": store.get_current_queue_offset(topic, queue_id) or offset + count,
            "suggestWhichBrokerId": suggest}), bodies=[records])
