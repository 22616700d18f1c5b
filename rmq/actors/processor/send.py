"""SendMessageProcessor: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and
CONSUMER_SEND_MSG_BACK (36), and the sends parked until a flush or a slave makes them safe.

Source: RocketMQ ``broker/.../processor/SendMessageProcessor.java`` (and
``AbstractSendMessageProcessor.msgCheck``), SPEC.md §6 (write path), §9.3 (SYNC_MASTER), §10 (delay
and timer transforms), §11.2 (half messages), §12.2 (retries and the DLQ).
"""
from __future__ import annotations

import random
import time
from collections import deque
from typing import NamedTuple, Optional

from rmq import latency_trace as _lt
from rmq import metrics as M
from rmq._core import commitlog as _cl
from rmq._core.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_TYPE_MASK
from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.actors.transaction import HALF_TOPIC, half_properties, is_half_request
from rmq import protocol as P
from rmq.common.mix_all import dlq_topic, is_dlq_topic, retry_topic
from rmq.common.perm import PERM_WRITE
from rmq.common.request_header import MAX_BATCH_BYTES_FIELD, send_response_msg_id_parts
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group, check_topic
from rmq.protocol import Frame, RequestCode, ResponseCode, field_int, field_str
from rmq.zmqio import send_parts
from rmq.status import PutMessageStatus
from rmq.store.commitlog import host_to_bytes
from rmq.store.config import SYNC_FLUSH
from rmq.store.schedule import transform_delay
from rmq.store.timer import TimerMessageError, is_timer_message, transform_timer

SEND_CODES = frozenset({int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_MESSAGE_V2),
                        int(RequestCode.SEND_BATCH_MESSAGE)})
MAX_RECONSUME_TIMES_DEFAULT = 16             # SubscriptionGroupConfig.retryMaxTimes
MAX_SYS_FLAG = 0x7FF                         # MessageSysFlag bits a request may carry

PUT_STATUS_TO_CODE = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}


class SyncWait(NamedTuple):
    """A send answered once its records are safe (GroupCommitRequest / GroupTransferService)."""
    end: int              # CommitLog offset (bytes) the send's records end at
    since: float          # monotonic s it was parked
    reply: Reply
    response: Frame       # the answer; its code and remark change on a timeout
    need_flush: bool      # SYNC_FLUSH: until the flush actor reports ``end`` durable
    need_slave: bool      # SYNC_MASTER: until a slave acknowledges ``end``


class SyncWaits:
    """Sends parked for a flush (SYNC_FLUSH) and / or a slave's acknowledgement (SYNC_MASTER), in
    CommitLog order.  Released by :meth:`release`; FLUSH_DISK_TIMEOUT after ``syncFlushTimeout``,
    FLUSH_SLAVE_TIMEOUT after ``slaveTimeout`` (ms, MessageStoreConfig)."""

    def __init__(self):
        self.waits: deque[SyncWait] = deque()

    def __len__(self) -> int:
        return len(self.waits)

    def add(self, wait: SyncWait) -> None:
        self.waits.append(wait)

    def release(self, flushed: int, acked: int, flush_timeout_ms: int, slave_timeout_ms: int,
                force_timeout: bool = False) -> None:
        """Answer the sends whose end is durable (``<= flushed``) and acknowledged (``<= acked``);
        time out the others past their limit, or all of them with ``force_timeout`` (stop)."""
        now = time.monotonic()
        keep: deque[SyncWait] = deque()
        for w in self.waits:
            done_flush = not w.need_flush or w.end <= flushed
            done_slave = not w.need_slave or w.end <= acked
            if done_flush and done_slave:
                w.reply.send(w.response)
            elif not done_flush and (force_timeout or now - w.since >= flush_timeout_ms / 1000.0):
                w.response.code = ResponseCode.FLUSH_DISK_TIMEOUT
                w.response.remark = f"not flushed within {flush_timeout_ms} ms"
                w.reply.send(w.response)
            elif not done_slave and (force_timeout or now - w.since >= slave_timeout_ms / 1000.0):
                w.response.code = ResponseCode.FLUSH_SLAVE_TIMEOUT
                w.response.remark = (f"no slave acknowledged offset {w.end} within {slave_timeout_ms} ms "
                                     f"(slave at {acked})")
                w.reply.send(w.response)
            else:
                keep.append(w)
        self.waits = keep

    def fail_all(self, code: int, remark: str) -> None:
        """Answer every parked send with ``code`` (the master lost its right to acknowledge)."""
        for w in self.waits:
            w.response.code = code
            w.response.remark = remark
            w.reply.send(w.response)
        self.waits = deque()

    def fail_unflushed(self, flushed: int, error: str) -> None:
        """A failed msync: every parked SYNC_FLUSH send not yet durable gets FLUSH_DISK_TIMEOUT."""
        keep: deque[SyncWait] = deque()
        for w in self.waits:
            if w.need_flush and w.end > flushed:
                w.response.code = ResponseCode.FLUSH_DISK_TIMEOUT
                w.response.remark = f"[FLUSH_FAILED] {error}"
                w.reply.send(w.response)
            else:
                keep.append(w)
        self.waits = keep


class SendMessageProcessor(RequestProcessor):
    """Sends into the CommitLog (one Cython append per request) and the retry / DLQ path."""

    def __init__(self, broker):
        super().__init__(broker)
        self.sync_waits = SyncWaits()
        self.page_cache_busy_until = 0.0         # monotonic s: sends refused (PCBUSY) until then
        self.shed = 0                            # late sends answered SYSTEM_BUSY by shed_late_send

    def release_sync_waits(self, force_timeout: bool = False) -> None:
        b = self.b
        cfg = b.store_config
        if b.controller is not None and not b.controller.lease_valid(time.monotonic()) and self.sync_waits:
            # controller mode: a master whose lease ran out acknowledges nothing more, parked sends
            # included (another master may be elected now: no two masters acknowledge at once)
            self.sync_waits.fail_all(ResponseCode.SERVICE_NOT_AVAILABLE,
                                     "no leading controller confirmed this master within its lease: not acknowledged")
            return
        acked = b.controller.sss_acked() if b.controller is not None and b.controller.read_committed \
            else b.ha_ack_offset
        self.sync_waits.release(b.flushed_offset, acked, cfg.sync_flush_timeout, cfg.slave_timeout, force_timeout)

    def shed_late_send(self, sock, parts: list, waited_ms: float) -> bool:
        """A request that waited longer than waitTimeMillsInSendQueue since the broker read it,
        before it is decoded: a send is answered SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] here, with
        only its header's code, opaque and flag read (RocketMQ's BrokerFastFailure
        cleanExpiredRequest) - about a third of the full path's cost, so a backlog is shed
        faster than it is served.  Anything else (not a send, unreadable, one-way: no answer
        due) returns False and takes the normal path, which has the same check.
        ``parts``: a ROUTER message (identity, optional empty delimiter, magic, header, bodies)."""
        i = 2 if len(parts) > 3 and not len(parts[1]) else 1
        if len(parts) < i + 2:
            return False
        try:
            header = P.peek_header(parts[i], parts[i + 1])
        except P.ProtocolError:
            return False
        code, opaque, flag = header
        if code not in SEND_CODES or flag & P.FLAG_ONEWAY:
            return False
        self.shed += 1
        try:
            send_parts(sock, parts[:i] + P.encode(Frame(
                ResponseCode.SYSTEM_BUSY, opaque, P.FLAG_RESPONSE,
                f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: "
                f"{waited_ms:.0f}ms")))
        except Exception as e:  # noqa: BLE001 - the peer is gone or its queue is full: nothing to answer
            self.log.info("SYSTEM_BUSY answer dropped (opaque %s): %s", opaque, e)
        return True

    # -- SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE ---------------------------------------
    def on_send(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        b = self.b
        t_handler = time.monotonic_ns() if _lt.ENABLED else 0     # read from the socket (latency trace)
        waited_ms = (time.monotonic() - b.request_received_at) * 1000.0    # since it was read off the socket
        if waited_ms > b.wait_time_ms_in_send_queue:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                                  f"period in queue: {waited_ms:.0f}ms")
        if time.monotonic() < self.page_cache_busy_until:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  "[PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a while")
        if not b.broker_permission & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{b.broker_name}] sending message is forbidden")
        if b.fenced_by:
            return frame.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  f"this master was replaced by a promoted slave (epoch {b.fenced_by}): "
                                  f"sends refused; restart it as a slave")
        if b.controller is not None and b.role != "SLAVE" and not b.controller.lease_valid(time.monotonic()):
            return frame.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  "no leading controller confirmed this master within its lease "
                                  "(controller mode): sends refused until one does")
        topic = field_str(frame, "topic")
        try:
            check_topic(topic)
        except ValueError as e:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        cfg = b.topic_config(topic, create=True,
                             requested_queue_nums=field_int(frame, "defaultTopicQueueNums", 0, lo=0,
                                                            hi=MAX_QUEUE_NUMS))
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST,
                                  f"topic[{topic}] not exist, apply first please!")
        if not cfg["perm"] & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = field_int(frame, "queueId", -1, lo=-1, hi=MAX_QUEUE_NUMS)
        if queue_id < 0:
            queue_id = random.randrange(cfg["writeQueueNums"])
        if queue_id >= cfg["writeQueueNums"]:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"request queueId[{queue_id}] is illegal, topic writeQueueNums {cfg['writeQueueNums']}")
        if not frame.bodies:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, "no message body part")
        sys_flag = field_int(frame, "sysFlag", 0, lo=0, hi=MAX_SYS_FLAG)
        born_ts = field_int(frame, "bornTimestamp", int(time.time() * 1000))
        born_host = None
        if "bornHost" in frame.fields:
            try:
                born_host = host_to_bytes(field_str(frame, "bornHost", max_len=64))
            except ValueError:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'bornHost' is not ip:port")
        reconsume = field_int(frame, "reconsumeTimes", 0, lo=0)
        store = b.store
        t0 = time.monotonic()
        store_topic, store_queue_id = topic, queue_id
        is_half = False
        if frame.code == RequestCode.SEND_BATCH_MESSAGE:
            if (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be transactional")
            batch = frame.bodies[0]
            props = frame.fields.get("properties") or None
            if props is not None and not isinstance(props, dict):
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'properties' must be a map")
            sent_props = props
            res = store.put_messages(topic, queue_id, batch, properties=props, sys_flag=sys_flag,
                                     born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume)
        else:
            props = frame.fields.get("properties", {})
            if isinstance(props, str):
                props = _cl.decode_properties(props.encode("utf-8"))
            if not isinstance(props, dict):
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'properties' must be a map or str")
            sent_props = props
            if is_half_request(sys_flag, props):
                if b.tx.reject:
                    return frame.response(ResponseCode.NO_PERMISSION,
                                          f"the broker[{b.broker_name}] sending transaction message is forbidden")
                # SPEC.md §11.2: parked in the half topic, invisible until END_TRANSACTION commits it
                is_half = True
                store_topic, store_queue_id = HALF_TOPIC, 0
                props = half_properties(topic, queue_id, props)
                sys_flag &= ~TRANSACTION_TYPE_MASK
            elif "DELAY" in props and (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
                # parked in SCHEDULE_TOPIC_XXXX; the reply still names the queue the producer chose
                # (RocketMQ's SendMessageProcessor answers with the request's queueId)
                store_topic, store_queue_id, props = transform_delay(topic, queue_id, props,
                                                                     len(b.store_config.delay_levels_ms))
            elif is_timer_message(props) and (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
                # SPEC.md §10.4: parked in rmq_sys_wheel_timer until its deliver time
                refused = self._timer_refusal(frame)
                if refused is not None:
                    return refused
                try:
                    store_topic, store_queue_id, props = transform_timer(
                        topic, queue_id, props, b.store_config.timer_precision_ms,
                        b.store_config.timer_max_delay_sec)
                except TimerMessageError as e:
                    return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
                if store_topic != topic and b.timer.timer_store is not None \
                        and b.timer.timer_store.is_reject(int(props["TIMER_OUT_MS"])):
                    cap = b.store_config.timer_congest_num_each_slot
                    return frame.response(ResponseCode.SYSTEM_ERROR,
                                          f"timer message is under flow control, max num limit is {cap} "
                                          f"timers per slot (timerCongestNumEachSlot)")
            try:
                props_bytes = _cl.encode_properties(props)
            except ValueError as e:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            flag = field_int(frame, "flag", 0)
            try:
                batch = _cl.encode_batch([(frame.bodies[0], props_bytes, flag)])
            except ValueError as e:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            res = store.put_encoded(store_topic, store_queue_id, batch, None, sys_flag, born_ts, born_host,
                                    reconsume, 1)
        elapsed_ms = (time.monotonic() - t0) * 1000.0
        if elapsed_ms > b.store_config.os_page_cache_busy_time_out_mills:
            self.page_cache_busy_until = time.monotonic() + elapsed_ms / 1000.0
        code = PUT_STATUS_TO_CODE.get(res.status, ResponseCode.SYSTEM_ERROR)
        if res.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and res.remark.startswith("[DISK_FULL]"):
            code = ResponseCode.SERVICE_NOT_AVAILABLE     # ENOSPC: a clear refusal, as RocketMQ's DISK_FULL
        if res.status is PutMessageStatus.OS_PAGE_CACHE_BUSY:
            return frame.response(code, "[PC_SYNCHRONIZED]broker busy, start flow control for a while")
        if not res.ok:
            if res.max_body and frame.code == RequestCode.SEND_BATCH_MESSAGE:
                # too large to store whole: the largest body it takes, for a producer that made the
                # batch itself to split it and send the parts (rmq)
                return frame.response(code, res.remark, fields={MAX_BATCH_BYTES_FIELD: res.max_body})
            return frame.response(code, res.remark or res.status.value)
        a = res.append
        if is_half:
            b.tx.on_half_stored(props, a.queue_offset, a.wrote_offset)
        elif (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
            b.pull_processor.note_append(store_topic, store_queue_id, res)
        if _lt.ENABLED:
            _lt.event("append", store_topic, store_queue_id, a.queue_offset, a.msg_num, t_handler,
                      time.monotonic_ns())
        hs = b.pull_processor.hold_service
        if hs.appended_queues and b.last_of_turn:
            # the last send read this turn: a pull held at the tail of a queue appended to in this
            # turn is answered before this ack goes out (delivery does not wait behind it), with
            # every append of the turn (earlier sends of a busy turn leave the wake to the turn's
            # end, so a pull answer carries the whole turn, not its first message)
            hs.wake_from_appends()
        b.stats["putMessageTotal"] += a.msg_num
        b.stats["putBytesTotal"] += a.wrote_bytes
        b.broker_stats.put.add(topic, a.msg_num, a.wrote_bytes, int(time.time() * 1000))
        if b.metrics is not None:
            b.metrics.on_put(topic, M.message_type(sent_props, is_half or (sys_flag & TRANSACTION_TYPE_MASK)
                                                   == TRANSACTION_PREPARED_TYPE), a.msg_num, a.wrote_bytes)
        id_fields, id_bodies = send_response_msg_id_parts(res.msg_id)
        resp = frame.response(ResponseCode.SUCCESS, fields={
            **id_fields, "queueId": queue_id, "queueOffset": a.queue_offset,
            "storeTimestamp": a.store_timestamp, "msgNum": a.msg_num}, bodies=id_bodies)
        wait = str(frame.fields.get("waitStoreMsgOK", "true")).lower() != "false"
        if not wait:
            return resp
        end = a.wrote_offset + a.wrote_bytes
        need_flush = b.store_config.flush_disk_type == SYNC_FLUSH and end > b.flushed_offset
        need_slave = False
        if b.role == "SYNC_MASTER" and b.controller is not None and b.controller.read_committed:
            # allAckInSyncStateSet: every other member of the SyncStateSet holds it (none: at once)
            need_slave = end > b.controller.sss_acked()
        elif b.role == "SYNC_MASTER":
            # SPEC.md §9.3 (4.9): the record is written; without a slave in reach the sender is told so
            if not b.ha_processor.slave_ok(end):
                resp.code = ResponseCode.SLAVE_NOT_AVAILABLE
                resp.remark = ("no slave connected" if not b.ha_slaves else
                               f"slave behind by {end - b.ha_ack_offset} bytes "
                               f"(haSlaveFallbehindMax {b.store_config.ha_slave_fallbehind_max})")
                return resp
            need_slave = end > b.ha_ack_offset
        if need_flush or need_slave:
            self.sync_waits.add(SyncWait(end, time.monotonic(), reply, resp, need_flush, need_slave))
            return None
        return resp

    def _timer_refusal(self, frame: Frame) -> Optional[Frame]:
        """WHEEL_TIMER_NOT_ENABLE (RocketMQ: SYSTEM_ERROR) when this broker keeps no timers."""
        if not self.b.store_config.timer_wheel_enable:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  "accurate timer message is not enabled, timerWheelEnable is false")
        return None

    # -- CONSUMER_SEND_MSG_BACK --------------------------------------------------------------------
    def on_send_back(self, frame: Frame, reply: Reply) -> Frame:
        """CONSUMER_SEND_MSG_BACK (SPEC.md §12.2): a message the consumer failed goes to
        %RETRY%group with a delay level, or to %DLQ%group after maxReconsumeTimes."""
        b = self.b
        offset = field_int(frame, "offset", lo=0)
        group = check_group(field_str(frame, "group"))
        delay_level = field_int(frame, "delayLevel", 0)
        gcfg = b.group_config(group)
        if gcfg is None:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        if not b.broker_permission & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{b.broker_name}] sending message is forbidden")
        if int(gcfg.get("retryQueueNums", 1)) <= 0:
            return frame.response()
        rec = b.store.select_one_message_by_offset(offset)
        if rec is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        m = _cl.decode_records(rec)[0]
        props = {k: v for k, v in m.properties.items() if k not in ("__CRC32#", "DELAY", "REAL_TOPIC", "REAL_QID")}
        props.setdefault("RETRY_TOPIC", m.topic)
        max_times = field_int(frame, "maxReconsumeTimes", int(gcfg.get("retryMaxTimes", MAX_RECONSUME_TIMES_DEFAULT)))
        origin = frame.fields.get("originMsgId") if isinstance(frame.fields.get("originMsgId"), str) else ""
        props["ORIGIN_MESSAGE_ID"] = props.get("ORIGIN_MESSAGE_ID") or origin or m.msg_id
        props["WAIT"] = "false"
        if m.reconsume_times >= max_times or delay_level < 0:
            topic, queue_id = dlq_topic(group), 0
        else:
            topic, queue_id = retry_topic(group), 0
            props["DELAY"] = str(delay_level if delay_level > 0 else 3 + m.reconsume_times)
        cfg = b.topic_config(topic, create=True)
        if cfg is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"topic[{topic}] not exist")
        topic_s, queue_s, props = transform_delay(topic, queue_id, props, len(b.store_config.delay_levels_ms))
        batch = _cl.encode_batch([(m.body, _cl.encode_properties(props), m.flag)])
        res = b.store.put_encoded(topic_s, queue_s, batch, None, m.sys_flag & ~TRANSACTION_TYPE_MASK, m.born_timestamp,
                                  m.born_host, m.reconsume_times + 1, 1)
        if not res.ok:
            return frame.response(PUT_STATUS_TO_CODE.get(res.status, ResponseCode.SYSTEM_ERROR), res.remark)
        if b.metrics is not None and is_dlq_topic(topic):
            b.metrics.on_dlq(props.get("RETRY_TOPIC", m.topic), group)
        return frame.response()
