"""POP consumption on the broker (RocketMQ 5): POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME and the revive service (RocketMQ 5 semantics, sources named below; SPEC.md has
no POP section yet: this docstring is the reference).

A POP consumer does not own queues: any number of consumers of one group receive from the
same queue.  Each POP takes the next messages of a queue from the group's *pop offset*,
writes a **checkpoint** (CK) for them to the revive topic ``rmq_sys_REVIVE_LOG_<clusterName>``
and answers; the consumer then acks each message (an ACK record in the same revive queue)
or changes its invisible time (a new CK for that message and an ACK of the old one, one
append).  A CK whose invisible time passes with messages still un-acked is *revived*: those
messages are written to the group's POP retry topic ``%RETRY%<group>_<topic>`` (RocketMQ 5's
``KeyBuilder.buildPopRetryTopicV1``) with ``reconsumeTimes + 1``, or to ``%DLQ%<group>`` once
``reconsumeTimes`` reached the group's ``retryMaxTimes``; then an ACK record marks them done.

Durability (kill -9): every CK and ACK is a CommitLog record written before the reply, so
the in-memory table of CKs in flight is rebuilt at start by reading the revive queues from
the revive offset (group ``CID_RMQ_SYS_REVIVE_GROUP``, committed as the lowest revive-queue
offset of a CK still in flight) once reput has dispatched the whole CommitLog; the pop
offsets are the larger of the persisted consumer offsets and the ends of those CKs.  So an
un-acked message is never lost and an acked one is never delivered again; a message revived
just before a crash may be revived once more (its retry copy written twice).

Group commit: the POPs and acks the broker reads from a socket in one turn (``Actor.at_turn_end``)
write their records as one append per revive queue when the turn's requests are all handled,
before any of their replies is written: a turn's checkpoints all go to one revive queue, and
each ack to its checkpoint's.  The in-memory table changes at once (an ack made in the turn
is not in flight for the next request); if an append fails, the changes of the requests whose
records it held are undone (checkpoints dropped, pop offsets put back, acked messages in flight
again) and those requests get SYSTEM_ERROR, as when their own append failed.  A lone request,
a held POP served by a timer and CHANGE_MESSAGE_INVISIBLETIME append at once.

Records (bodies JSON with RocketMQ's field names, ``store/pop/PopCheckPoint.java``,
``AckMsg.java``, ``BatchAckMsg.java``; tags ``ck`` / ``ack`` / ``bAck``):

- CK: ``{"so": startOffset, "pt": popTime ms, "it": invisibleTime ms, "n": num, "q": queueId,
  "t": topic (as stored: the retry topic for retried messages), "c": group, "d": [queue offset
  - startOffset per message], "bn": brokerName, "e": the pop offset after this pop (rmq)}``
- ACK: ``{"ao": ackOffset, "so", "pt", "c", "t", "q", "bn"}``; bAck the same with ``"aol"``.

A message's receipt handle is RocketMQ's extraInfo plus its queue offset
(``ExtraInfoUtil.buildExtraInfo``): ``"startOffset popTime invisibleTime reviveQid retry
brokerName queueId queueOffset"`` where ``retry`` is ``0`` for the topic itself and ``1`` for
the group's POP retry topic.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
import time
from typing import TYPE_CHECKING, Optional

import orjson

from rmq._core import commitlog as _cl
from rmq.actors.actor import Reply
from rmq.common.mix_all import RETRY_GROUP_TOPIC_PREFIX, dlq_topic, is_dlq_topic, is_retry_topic
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group
from rmq.filter import ExpressionType
from rmq.protocol import Frame, ProtocolError, ResponseCode, field_int, field_str, unpack_body
from rmq.status import GetMessageStatus

if TYPE_CHECKING:      # pragma: no cover
    from rmq.actors.broker import BrokerActor

log = logging.getLogger("rmq.broker.pop")

REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"       # PopAckConstants.REVIVE_TOPIC
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"         # PopAckConstants.REVIVE_GROUP
CK_TAG, ACK_TAG, BATCH_ACK_TAG = "ck", "ack", "bAck"
REVIVE_QUEUE_NUM = 8                              # BrokerConfig.reviveQueueNum
POP_MAX_MSG_NUMS = 32                             # PopMessageProcessor: "the max message num must be less than 32"
MIN_INVISIBLE_TIME_MS = 1_000                     # rmq: shorter is refused (RocketMQ's proxy: 10 s)
MAX_INVISIBLE_TIME_MS = 12 * 3600 * 1000          # ProxyConfig.maxInvisibleTimeMills (12 h)
REVIVE_SCAN_MS = 100                              # how often expired CKs are looked for
RECOVER_BATCH = 32                                # revive-queue records read per step at start
MAX_POP_HOLDS = 10_000                            # held POPs per broker (POLLING_FULL past it)
MAX_BATCH_ACK = 1024                              # receipt handles per BATCH_ACK_MESSAGE
MAX_ACK_BITSET_BYTES = 1024                       # a BatchAck's "b" as bytes: bits of queue offset -
                                                  # startOffset up to 8,191 (a POP reads at most 800
                                                  # ConsumeQueue units past its startOffset)
CK_SPAN_MAX = MAX_ACK_BITSET_BYTES * 8            # a checkpoint's offsets lie in [startOffset, + this): a
                                                  # revive record past it is not one of ours (skipped)
REVIVE_APPEND_MAX_RECORDS = 32                    # revive records per append (a CK is ~400 B: an append
                                                  # stays far below the smallest CommitLog file a test
                                                  # uses, 64 KiB)
MAX_RECONSUME_TIMES_DEFAULT = 16                  # SubscriptionGroupConfig.retryMaxTimes
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"          # MessageConst.PROPERTY_FIRST_POP_TIME
PROPERTY_POP_CK = "POP_CK"
RETRY_FLAG_NORMAL, RETRY_FLAG_RETRY = "0", "1"    # ExtraInfoUtil's retry field (v1 retry topic)
_DROP_ON_REVIVE = ("__CRC32#", "DELAY", "REAL_TOPIC", "REAL_QID", PROPERTY_POP_CK)
# each tag's properties, encoded once (the bodies are JSON: orjson, 13x the standard encoder on a
# checkpoint, which was 11 % of the broker's main thread under POP load: bench/results/client.md stop 46)
_REVIVE_PROPERTIES = {tag: _cl.encode_properties({"TAGS": tag, "WAIT": "false"}) for tag in (CK_TAG, ACK_TAG,
                                                                                             BATCH_ACK_TAG)}


def _offsets_ok(values) -> bool:
    """Every value an int (not a bool) >= 0 (checked in C: the types, then the minimum)."""
    return not values or (set(map(type, values)) == {int} and min(values) >= 0)


def offsets_mask(offsets, start: int) -> int:
    """The bitmask of queue ``offsets`` (each >= ``start``; a ``range`` with step 1 in one step):
    bit ``o - start`` set for each."""
    if type(offsets) is range and offsets.step == 1:
        return ((1 << len(offsets)) - 1) << (offsets.start - start) if offsets else 0
    m = 0
    for o in offsets:
        m |= 1 << (o - start)
    return m


def mask_offsets(mask: int, start: int) -> list:
    """The queue offsets of ``mask``'s bits (:func:`offsets_mask`), ascending."""
    if not mask & (mask + 1):                         # bits 0..n-1: a checkpoint's messages, all of them
        return list(range(start, start + mask.bit_length()))
    out = []
    while mask:
        low = mask & -mask
        out.append(start + low.bit_length() - 1)
        mask ^= low
    return out


def mask_bits(mask: int) -> list:
    """The indexes of ``mask``'s set bits, ascending."""
    return mask_offsets(mask, 0)


def revive_topic(cluster_name: str) -> str:
    """``rmq_sys_REVIVE_LOG_<clusterName>`` (PopAckConstants.buildClusterReviveTopic)."""
    return REVIVE_TOPIC_PREFIX + cluster_name


@functools.lru_cache(maxsize=4096)
def pop_retry_topic(topic: str, group: str) -> str:
    """``%RETRY%<group>_<topic>``: where a POP group's revived messages of ``topic`` go
    (KeyBuilder.buildPopRetryTopicV1).  Remembered: every POP asks for it."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


@functools.lru_cache(maxsize=POP_MAX_MSG_NUMS + 1)
def _dense_deltas(n: int) -> tuple:
    """A checkpoint's ``d`` for ``n`` messages at consecutive offsets: 0 .. n - 1 (a tuple, written
    as an array: the body is never changed once built)."""
    return tuple(range(n))


def build_extra_info(start_offset: int, pop_time: int, invisible_time: int, revive_qid: int, retry: str,
                     broker_name: str, queue_id: int, queue_offset: int) -> str:
    """A receipt handle: ExtraInfoUtil.buildExtraInfo + the message's queue offset."""
    return f"{start_offset} {pop_time} {invisible_time} {revive_qid} {retry} {broker_name} {queue_id} {queue_offset}"


def parse_extra_info(text: str) -> tuple:
    """``(start_offset, pop_time, invisible_time, revive_qid, retry, broker_name, queue_id, queue_offset)``.

    Raises
    ------
    ValueError
        Not 8 space-separated fields of the right types.
    """
    if not isinstance(text, str) or len(text) > 512:
        raise ValueError("receipt handle must be a str of at most 512 characters")
    parts = text.split(" ")
    if len(parts) != 8 or parts[4] not in (RETRY_FLAG_NORMAL, RETRY_FLAG_RETRY):
        raise ValueError(f"malformed receipt handle {text[:80]!r}")
    so, pt, it, rq, _, _, qid, qo = (int(parts[i]) if i not in (4, 5) else 0 for i in range(8))
    if min(so, pt, it, rq, qid, qo) < 0:
        raise ValueError(f"malformed receipt handle {text[:80]!r}")
    return so, pt, it, rq, parts[4], parts[5], qid, qo


class CheckPoint:
    """A POP in flight: the queue offsets it handed out and which of them are not acked yet.
    ``pending``: a bitmask, bit ``queue offset - startOffset`` set while that message is in
    flight (RocketMQ's BatchAck carries the acked ones as such a BitSet)."""
    __slots__ = ("key", "invisible_time", "revive_qid", "revive_offset", "pending", "deadline")

    def __init__(self, key: tuple, invisible_time: int, revive_qid: int, revive_offset: int, offsets):
        self.key = key                    # (group, stored topic, queueId, startOffset, popTime)
        self.invisible_time = invisible_time
        self.revive_qid = revive_qid
        self.revive_offset = revive_offset
        self.pending = offsets_mask(offsets, key[3])
        self.deadline = key[4] + invisible_time

    def in_flight(self, queue_offset: int) -> bool:
        """Whether the message at ``queue_offset`` is one of this POP's and not acked yet."""
        d = queue_offset - self.key[3]
        return d >= 0 and bool(self.pending >> d & 1)


_IN_TURN = object()        # _pop's answer when the turn's group commit replies


class ReviveTurn:
    """The revive-log records of one turn's POPs and acks, appended at the turn's end (module
    docstring, "Group commit").  ``records``: revive qid -> [(tag, body)]; ``cks``: (CheckPoint,
    index in its queue's records) of the turn's new checkpoints, whose revive offsets are known
    after the append; ``entries``: (reply, response, [(revive qid, undo callable)], on_ok
    callable or None) of each request the turn answers."""
    __slots__ = ("ck_rq", "records", "cks", "entries")

    def __init__(self, ck_rq: int):
        self.ck_rq = ck_rq
        self.records: dict[int, list] = {}
        self.cks: list = []
        self.entries: list = []

    def add(self, rq: int, tag: str, body: dict) -> int:
        """Queue one record for revive queue ``rq``; its index among that queue's records."""
        recs = self.records.get(rq)
        if recs is None:
            recs = self.records[rq] = []
        recs.append((tag, body))
        return len(recs) - 1


class PopRequest:
    __slots__ = ("frame", "reply", "deadline")

    def __init__(self, frame: Frame, reply: Reply, deadline: float):
        self.frame, self.reply, self.deadline = frame, reply, deadline


class PopService:
    """The broker's POP processors and revive service; runs on the broker actor's thread."""

    def __init__(self, broker: "BrokerActor"):
        self.b = broker
        settings = broker.settings
        self.revive_topic = revive_topic(broker.cluster_name)
        self.revive_queue_num = max(1, min(int(settings.get("reviveQueueNum", REVIVE_QUEUE_NUM)), MAX_QUEUE_NUMS))
        self.cks: dict[tuple, CheckPoint] = {}
        self._heap: list = []                              # (deadline ms, seq, key)
        self._seq = itertools.count()
        self._rq = itertools.count()
        self._pop_counter = itertools.count()
        self.holds: dict[str, list[PopRequest]] = {}       # subscribed topic -> held POPs
        self.n_holds = 0
        self.ready = False                                 # the in-flight table is rebuilt
        self._recover_target = -1
        self._turn: Optional[ReviveTurn] = None            # this turn's group commit (at_turn_end)
        # GET_BROKER_RUNTIME_INFO's popStats (with inFlight): messages popped / acked / revived / sent
        # to the DLQ, checkpoints written, revive-log appends and the records they held
        self.stats = {"popped": 0, "acked": 0, "revived": 0, "dlq": 0, "checkpoints": 0, "reviveAppends": 0,
                      "reviveRecords": 0}

    # -- start / recovery ---------------------------------------------------------------------
    def start(self) -> None:
        b = self.b
        tcm = b.store.topic_config_manager
        cfg = tcm.select_topic_config(self.revive_topic)
        if cfg is None or cfg["readQueueNums"] < self.revive_queue_num:
            tcm.update_topic_config(tcm.new_topic_config(self.revive_topic, self.revive_queue_num,
                                                         self.revive_queue_num, PERM_READ | PERM_WRITE))
        # (again after a promotion: the replicated revive log is the truth, the table is rebuilt)
        self.ready = False
        self.cks.clear()
        self._heap = []
        self._recover_target = b.store.get_max_phy_offset()
        self.maybe_recover()

    def maybe_recover(self) -> None:
        """Rebuild the CKs in flight once reput has dispatched every record written before start."""
        if self.ready or self.b.dispatched_offset < self._recover_target:
            return
        t0 = time.monotonic()
        store, com = self.b.store, self.b.store.consumer_offset_manager
        n_ck = n_ack = 0
        acks: list = []
        for rq in range(self.revive_queue_num):
            start = com.query_offset(REVIVE_GROUP, self.revive_topic, rq)
            offset = max(start, 0)
            while True:
                res = store.get_messages(REVIVE_GROUP, self.revive_topic, rq, offset, RECOVER_BATCH)
                if res.status is GetMessageStatus.OFFSET_TOO_SMALL:
                    offset = res.next_begin_offset
                    continue
                if not res.message_count:
                    if res.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                      GetMessageStatus.MESSAGE_WAS_REMOVING) and res.next_begin_offset > offset:
                        offset = res.next_begin_offset
                        continue
                    break
                for m in res.messages():
                    try:
                        body = orjson.loads(m.body)
                    except ValueError:
                        log.error("revive record %s/%d@%d is not JSON: skipped", self.revive_topic, rq, m.queue_offset)
                        continue
                    tag = m.tags
                    if tag == CK_TAG:
                        self._recover_ck(body, rq, m.queue_offset)
                        n_ck += 1
                    elif tag in (ACK_TAG, BATCH_ACK_TAG):
                        acks.append(body)
                        n_ack += 1
                offset = res.next_begin_offset
        for body in acks:
            key = (body.get("c"), body.get("t"), body.get("q"), body.get("so"), body.get("pt"))
            ck = self.cks.get(key)
            if ck is not None:
                so = ck.key[3]
                for o in (body["aol"] if "aol" in body else (body.get("ao"),)):
                    if type(o) is int and 0 <= o - so < CK_SPAN_MAX:
                        ck.pending &= ~(1 << (o - so))
                if not ck.pending:
                    del self.cks[key]
        self._heap = [(ck.deadline, next(self._seq), k) for k, ck in self.cks.items()]
        heapq.heapify(self._heap)
        self.ready = True
        log.info("POP state recovered in %.0f ms: %d checkpoints and %d acks read, %d checkpoints in flight",
                 (time.monotonic() - t0) * 1000.0, n_ck, n_ack, len(self.cks))
        self.commit_revive_offsets()
        self.serve_holds(None)

    def _recover_ck(self, body: dict, rq: int, revive_offset: int) -> None:
        try:
            group, topic, qid = str(body["c"]), str(body["t"]), int(body["q"])
            so, pt, it = int(body["so"]), int(body["pt"]), int(body["it"])
            offsets = [so + int(d) for d in body.get("d", ())]
            if offsets and not 0 <= min(offsets) - so <= max(offsets) - so < CK_SPAN_MAX:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            log.error("revive record %s/%d@%d is not a checkpoint: skipped", self.revive_topic, rq, revive_offset)
            return
        end = body.get("e")
        com = self.b.store.consumer_offset_manager
        if isinstance(end, int) and end > com.query_offset(group, topic, qid):
            com.commit_offset(group, topic, qid, end)        # a pop the offsets file had not caught
        if offsets:
            key = (group, topic, qid, so, pt)
            self.cks[key] = CheckPoint(key, it, rq, revive_offset, offsets)

    # -- records ------------------------------------------------------------------------------
    def _put_revive(self, rq: int, records: list) -> Optional[int]:
        """Append ``records`` ([(tag, body dict)]) to revive queue ``rq``, back to back, in batches
        of at most REVIVE_APPEND_MAX_RECORDS; the queue offset of the first record, or None when
        the store refused one of the batches (logged; the batches before it stay written: a
        checkpoint or ack written for a request answered SYSTEM_ERROR is at most a redelivery
        after a restart, or an ack the client is told failed)."""
        first = None
        for i in range(0, len(records), REVIVE_APPEND_MAX_RECORDS):
            part = records[i:i + REVIVE_APPEND_MAX_RECORDS]
            batch = _cl.encode_batch([(orjson.dumps(body), _REVIVE_PROPERTIES[tag], 0) for tag, body in part])
            res = self.b.store.put_encoded(self.revive_topic, rq, batch, None, 0, int(time.time() * 1000), None, 0,
                                           len(part))
            if not res.ok:
                log.error("revive log append failed: %s %s", res.status, res.remark)
                return None
            self.stats["reviveAppends"] += 1
            self.stats["reviveRecords"] += len(part)
            self.b.note_quiet_append(res.append.wrote_offset, res.append.wrote_bytes)
            if first is None:
                first = res.queue_offset
        return first

    def _revive_turn(self) -> Optional[ReviveTurn]:
        """This turn's group commit (started on first use), or None when the broker is not handling
        a batch of requests (the caller appends at once)."""
        turn = self._turn
        if turn is None and self.b.at_turn_end(self._end_turn):
            turn = self._turn = ReviveTurn(next(self._rq) % self.revive_queue_num)
        return turn

    def _end_turn(self) -> None:
        """Append the turn's records (per revive queue, :meth:`_put_revive`), then answer its
        requests: those whose records were all written get their response, the others are undone
        (latest first) and get SYSTEM_ERROR."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        base: dict[int, int] = {}
        failed: set = set()
        for rq, recs in turn.records.items():
            try:
                first = self._put_revive(rq, recs)
            except Exception:  # noqa: BLE001 - the turn's requests must still be answered
                log.exception("revive log append failed")
                first = None
            if first is None:
                failed.add(rq)
            else:
                base[rq] = first
        for ck, idx in turn.cks:
            first = base.get(ck.revive_qid)
            if first is not None:
                ck.revive_offset = first + idx      # a queue's records are written back to back
        if failed:
            for _, _, parts, _ in reversed(turn.entries):
                for rq, undo in reversed(parts):
                    if rq in failed:
                        undo()
        for reply, resp, parts, on_ok in turn.entries:
            reply.held = False
            if failed and any(rq in failed for rq, _ in parts):
                reply.error(ResponseCode.SYSTEM_ERROR, "cannot write to the revive log")
                continue
            if on_ok is not None:
                on_ok()
            reply.send(resp)

    def _ck_body(self, key: tuple, invisible_time: int, offsets: list, end: Optional[int]) -> dict:
        group, topic, qid, so, pt = key
        body = {"so": so, "pt": pt, "it": invisible_time, "n": len(offsets), "q": qid, "t": topic, "c": group,
                "d": _dense_deltas(len(offsets)) if type(offsets) is range and offsets.start == so
                else [o - so for o in offsets], "bn": self.b.broker_name}
        if end is not None:
            body["e"] = end
        return body

    def _ack_body(self, key: tuple, offsets: list) -> tuple:
        group, topic, qid, so, pt = key
        body = {"so": so, "pt": pt, "c": group, "t": topic, "q": qid, "bn": self.b.broker_name}
        if len(offsets) == 1:
            body["ao"] = offsets[0]
            return ACK_TAG, body
        body["aol"] = list(offsets)
        return BATCH_ACK_TAG, body

    def _add_ck(self, key: tuple, invisible_time: int, rq: int, revive_offset: int, offsets: list) -> CheckPoint:
        ck = CheckPoint(key, invisible_time, rq, revive_offset, offsets)
        self.cks[key] = ck
        heapq.heappush(self._heap, (ck.deadline, next(self._seq), key))
        self.stats["checkpoints"] += 1
        return ck

    # -- request checks -----------------------------------------------------------------------
    def _check_group_topic(self, frame: Frame, need_write: bool = False):
        """``(group, group config, topic, topic config)`` or an error response."""
        b = self.b
        if b.role == "SLAVE":
            return frame.response(ResponseCode.NO_PERMISSION,
                                  f"the broker[{b.broker_name}] is a slave: POP is served by the master")
        if not b.broker_permission & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{b.broker_name}] pop message is forbidden")
        group = field_str(frame, "consumerGroup")
        try:
            check_group(group)
        except ValueError as e:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, str(e))
        gcfg = b.group_config(group)
        if gcfg is None:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist")
        if not gcfg.get("consumeEnable", True):
            return frame.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        topic = field_str(frame, "topic")
        cfg = b.store.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg["perm"] & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if not self.ready:
            return frame.response(ResponseCode.SYSTEM_BUSY, "POP state is being recovered, try again")
        return group, gcfg, topic, cfg

    # -- POP_MESSAGE --------------------------------------------------------------------------
    def on_pop(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        """POP_MESSAGE (200050). Fields: consumerGroup, topic, queueId (-1: every queue),
        maxMsgNums (1..POP_MAX_MSG_NUMS), invisibleTime (ms, MIN..MAX_INVISIBLE_TIME_MS),
        pollTime (ms of long polling, capped by brokerSuspendMaxTimeMillis), expType / exp
        (TAG or SQL92), initMode ("MAX" default / "MIN": where a group's first pop of a queue starts).

        Answer: SUCCESS with the records and ``popTime``, ``invisibleTime``, ``ckInfo`` (one
        ``[startOffset, retry, queueId, reviveQid, count]`` per queue popped, in record order);
        PULL_NOT_FOUND when nothing and no polling, POLLING_TIMEOUT when the poll expired.
        """
        try:
            checked = self._check_pop(frame)
        except ProtocolError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        if isinstance(checked, Frame):
            return checked
        resp = self._pop(frame, checked, reply)
        if resp is _IN_TURN:
            return None
        if resp is not None:
            return resp
        poll_ms = min(field_int(frame, "pollTime", 0, lo=0), self.b.suspend_max_ms)
        if poll_ms <= 0:
            return frame.response(ResponseCode.PULL_NOT_FOUND, "no new message")
        if self.n_holds >= MAX_POP_HOLDS:
            return frame.response(ResponseCode.POLLING_FULL, f"polling full: {self.n_holds} POPs held")
        self.holds.setdefault(checked[2], []).append(PopRequest(frame, reply, time.monotonic() + poll_ms / 1000.0))
        self.n_holds += 1
        return None

    def _check_pop(self, frame: Frame):
        ok = self._check_group_topic(frame)
        if isinstance(ok, Frame):
            return ok
        group, gcfg, topic, cfg = ok
        queue_id = field_int(frame, "queueId", -1, lo=-1, hi=MAX_QUEUE_NUMS - 1)
        if queue_id >= cfg["readQueueNums"]:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                                                             f"topicConfig.readQueueNums:[{cfg['readQueueNums']}]")
        max_nums = field_int(frame, "maxMsgNums", POP_MAX_MSG_NUMS, lo=1)
        if max_nums > POP_MAX_MSG_NUMS:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"the max message num must be less than {POP_MAX_MSG_NUMS + 1}: {max_nums}")
        invisible = field_int(frame, "invisibleTime", lo=0)
        if not MIN_INVISIBLE_TIME_MS <= invisible <= MAX_INVISIBLE_TIME_MS:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"invisibleTime {invisible} ms out of range "
                                  f"[{MIN_INVISIBLE_TIME_MS}, {MAX_INVISIBLE_TIME_MS}]")
        exp = frame.fields.get("exp", "*")
        exp_type = frame.fields.get("expType") or ExpressionType.TAG
        if not isinstance(exp, str):
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "header field 'exp' must be a str")
        sql_filter = self.b.pull_processor.subscription_filter(frame, group, exp_type, exp)
        if isinstance(sql_filter, Frame):
            return sql_filter
        init_min = frame.fields.get("initMode") == "MIN"
        return group, gcfg, topic, cfg, queue_id, max_nums, invisible, (None if sql_filter is not None else exp), \
            sql_filter, init_min

    def _pop_offset(self, group: str, topic: str, qid: int, init_min: bool, retry: bool) -> int:
        com = self.b.store.consumer_offset_manager
        off = com.query_offset(group, topic, qid)
        if off >= 0:
            return off
        # PopMessageProcessor.getInitOffset: MIN -> the queue's min offset; MAX -> its max offset,
        # except that a queue still starting at 0 is read from 0 (initPopOffsetByCheckMsgInMem)
        store = self.b.store
        lo = store.get_min_offset_in_queue(topic, qid)
        off = lo if (init_min or retry or lo == 0) else store.get_max_offset_in_queue(topic, qid)
        com.commit_offset(group, topic, qid, off)
        return off

    def _pop(self, frame: Frame, checked: tuple, reply: Reply):
        """Pop what there is now; the response, None when nothing was found, or _IN_TURN when the
        turn's group commit answers ``reply`` (module docstring)."""
        group, gcfg, topic, cfg, queue_id, max_nums, invisible, tags, sql_filter, init_min = checked
        b = self.b
        store = b.store
        tcm = store.topic_config_manager
        retry_topic = pop_retry_topic(topic, group)
        queues = [(topic, RETRY_FLAG_NORMAL, q) for q in
                  ([queue_id] if queue_id >= 0 else self._rotated(cfg["readQueueNums"]))]
        rcfg = tcm.select_topic_config(retry_topic)
        if rcfg is not None:
            rq_list = [(retry_topic, RETRY_FLAG_RETRY, q) for q in range(rcfg["readQueueNums"])]
            # PopMessageProcessor: one pop in five reads the retry topic first, the others after
            queues = rq_list + queues if next(self._pop_counter) % 5 == 0 else queues + rq_list
        now = int(time.time() * 1000)
        parts, ck_info, left = [], [], max_nums
        turn = self._revive_turn()
        popped: list = []                # the ck keys of a group-committed pop (undone if its append fails)
        com = store.consumer_offset_manager
        for t, retry, q in queues:
            if left <= 0:
                break
            offset = self._pop_offset(group, t, q, init_min, retry == RETRY_FLAG_RETRY)
            res = store.get_messages(group, t, q, offset, left, tags, sql_filter=sql_filter)
            st = res.status
            if st in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                store.consumer_offset_manager.commit_offset(group, t, q, res.next_begin_offset)
                offset = res.next_begin_offset
                res = store.get_messages(group, t, q, offset, left, tags, sql_filter=sql_filter)
            if not res.message_count:
                if res.next_begin_offset > offset and res.status is not GetMessageStatus.OFFSET_FOUND_NULL:
                    store.consumer_offset_manager.commit_offset(group, t, q, res.next_begin_offset)
                continue
            if res.next_begin_offset - offset == res.message_count:    # nothing skipped: dense offsets
                offsets = range(offset, res.next_begin_offset)
            else:
                offsets = [m.queue_offset for m in _cl.decode_records(res.records, False)]
            key = (group, t, q, offset, now)
            body = self._ck_body(key, invisible, offsets, res.next_begin_offset)
            if turn is not None:
                rq = turn.ck_rq
                idx = turn.add(rq, CK_TAG, body)
                # the revive queue's dispatched end stands in until the append: never above the record's
                turn.cks.append((self._add_ck(key, invisible, rq, store.get_max_offset_in_queue(
                    self.revive_topic, rq), offsets), idx))
                popped.append(key)
            else:
                rq = next(self._rq) % self.revive_queue_num
                put = self._put_revive(rq, [(CK_TAG, body)])
                if put is None:       # nothing handed out without its checkpoint
                    if not parts:
                        return frame.response(ResponseCode.SYSTEM_ERROR,
                                              "cannot write the checkpoint to the revive log")
                    break
                self._add_ck(key, invisible, rq, put, offsets)
            com.commit_offset(group, t, q, res.next_begin_offset)
            parts.append(res.records)
            ck_info.append([offset, retry, q, rq, len(offsets)])
            left -= len(offsets)
        if not parts:
            return None
        n = max_nums - left
        size = sum(len(p) for p in parts)
        resp = frame.response(ResponseCode.SUCCESS, fields={
            "popTime": now, "invisibleTime": invisible, "brokerName": b.broker_name, "ckInfo": ck_info},
            bodies=[parts[0] if len(parts) == 1 else b"".join(parts)])
        if turn is None:
            self._count_pop(topic, group, n, size, now)
            return resp

        def undo():               # the pop never happened: its checkpoints go, its offsets go back
            for key in reversed(popped):
                self.cks.pop(key, None)
                self.stats["checkpoints"] -= 1
                com.commit_offset(key[0], key[1], key[2], key[3])

        turn.entries.append((reply, resp, [(turn.ck_rq, undo)],
                             lambda: self._count_pop(topic, group, n, size, now)))
        return _IN_TURN

    def _count_pop(self, topic: str, group: str, n: int, size: int, now: int) -> None:
        b = self.b
        self.stats["popped"] += n
        b.stats["getMessageTotal"] += n
        b.stats["getBytesTotal"] += size
        b.broker_stats.get.add(f"{topic}@{group}", n, size, now)
        if b.metrics is not None:
            b.metrics.on_get(topic, group, n, size)

    def _rotated(self, n: int) -> list:
        start = random.randrange(n)
        return [(start + i) % n for i in range(n)]

    # -- long polling ---------------------------------------------------------------------------
    def serve_holds(self, topics: Optional[set]) -> None:
        """Try the POPs held on ``topics`` (None: all) again after an arrival."""
        if not self.holds:
            return
        for topic in list(self.holds if topics is None else topics & self.holds.keys()):
            keep = []
            for pr in self.holds.pop(topic):
                try:
                    checked = self._check_pop(pr.frame)
                    resp = checked if isinstance(checked, Frame) else self._pop(pr.frame, checked, pr.reply)
                except ProtocolError as e:
                    resp = pr.frame.response(ResponseCode.SYSTEM_ERROR, str(e))
                if resp is None:
                    keep.append(pr)
                else:
                    self.n_holds -= 1
                    if resp is not _IN_TURN:
                        pr.reply.send(resp)
            if keep:
                self.holds.setdefault(topic, []).extend(keep)

    def on_arrivals(self, topics: set) -> None:
        """Reput dispatched messages of ``topics`` (store topics; a POP retry topic wakes the POPs
        of its topic)."""
        if not self.holds:
            return
        wake = set()
        for t in topics:
            if is_retry_topic(t):
                for held in self.holds:
                    if t.endswith("_" + held):
                        wake.add(held)
            else:
                wake.add(t)
        self.serve_holds(wake)

    def expire_holds(self) -> None:
        if not self.holds:
            return
        now = time.monotonic()
        for topic in list(self.holds):
            keep = []
            for pr in self.holds[topic]:
                if now >= pr.deadline:
                    self.n_holds -= 1
                    pr.reply.send(pr.frame.response(ResponseCode.POLLING_TIMEOUT, "no new message within pollTime"))
                else:
                    keep.append(pr)
            if keep:
                self.holds[topic] = keep
            else:
                del self.holds[topic]

    # -- ACK_MESSAGE / BATCH_ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME -----------------------
    def _handle_key(self, group: str, topic: str, extra_info) -> tuple:
        """``(ck key, queue offset, revive qid, invisible time)`` of a receipt handle."""
        so, pt, it, rq, retry, _bn, qid, qo = parse_extra_info(extra_info)
        stored = topic if retry == RETRY_FLAG_NORMAL else pop_retry_topic(topic, group)
        return (group, stored, qid, so, pt), qo, rq, it

    def on_ack(self, frame: Frame, reply: Reply) -> Frame:
        """ACK_MESSAGE (200051): fields consumerGroup, topic, extraInfo (the receipt handle).
        NO_MESSAGE when the message is no longer in flight (already acked, or revived after
        its invisible time: it will be delivered again)."""
        ok = self._check_group_topic(frame)
        if isinstance(ok, Frame):
            return ok
        group, _, topic, _ = ok
        try:
            key, qo, rq, _ = self._handle_key(group, topic, frame.fields.get("extraInfo"))
        except ValueError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        ck = self.cks.get(key)
        if ck is None or not ck.in_flight(qo):
            return frame.response(ResponseCode.NO_MESSAGE,
                                  f"message {topic}/{key[2]}@{qo} is not in flight: already acked, or its "
                                  f"invisible time passed and it was revived")
        bit = 1 << (qo - key[3])
        turn = self._revive_turn()
        if turn is not None:
            turn.add(ck.revive_qid, *self._ack_body(key, [qo]))
            self._acked(ck, bit)
            turn.entries.append((reply, frame.response(), [(ck.revive_qid, lambda: self._unacked(ck, bit))],
                                 None))
            return None
        if self._put_revive(ck.revive_qid, [self._ack_body(key, [qo])]) is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, "cannot write the ack to the revive log")
        self._acked(ck, bit)
        return frame.response()

    def _acked(self, ck: CheckPoint, mask: int) -> None:
        """The messages of ``mask`` (bits of ``ck.pending``, all in flight) are acked."""
        ck.pending &= ~mask
        self.stats["acked"] += mask.bit_count()
        if not ck.pending:
            del self.cks[ck.key]

    def _unacked(self, ck: CheckPoint, mask: int) -> None:
        """Undo :meth:`_acked` (the ack's record was not written): the messages are in flight again
        (the checkpoint's heap entry is still there: no timer ran within the turn)."""
        ck.pending |= mask
        self.stats["acked"] -= mask.bit_count()
        self.cks.setdefault(ck.key, ck)

    def on_batch_ack(self, frame: Frame, reply: Reply) -> Frame:
        """BATCH_ACK_MESSAGE (200151): field consumerGroup; body RocketMQ's
        BatchAckMessageRequestBody, ``{"brokerName", "acks": [BatchAck]}``, each BatchAck the messages
        of one checkpoint: ``{"c": group, "t": topic, "r": retry ("0"/"1"), "so": startOffset,
        "q": queueId, "rq": reviveQueueId, "pt": popTime, "it": invisibleTime, "b": BitSet}``.
        ``b`` is RocketMQ's BitSet of queue offset - startOffset as ``BitSet.toByteArray()`` gives
        it (little-endian bytes, at most MAX_ACK_BITSET_BYTES), or the list of its set bits (what
        rmq clients before stop 51 sent; a bit listed twice counts as a repeat).  At most
        MAX_BATCH_ACK messages.  Answer: SUCCESS with ``failed``, ``[[ack index, bit], ...]`` of the
        messages no longer in flight (see :meth:`on_ack`) or repeated in the request; one ack record
        per checkpoint, one append per revive queue."""
        try:
            # a BitSet longer than the limit unpacks (and is refused below, by name)
            body = unpack_body(frame, max_bin_len=MAX_ACK_BITSET_BYTES * 2) if frame.bodies else None
        except ProtocolError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        acks = body.get("acks") if isinstance(body, dict) else None
        if not isinstance(acks, list) or not acks:
            return frame.response(ResponseCode.SYSTEM_ERROR, "body must be {'brokerName', 'acks': [BatchAck, ...]}")
        group = field_str(frame, "consumerGroup")
        failed, by_ck, checked, total = [], {}, {}, 0
        limit = MAX_ACK_BITSET_BYTES * 8
        for i, a in enumerate(acks):
            try:
                topic, retry, so, qid, pt = a["t"], a["r"], a["so"], a["q"], a["pt"]
                bits = a["b"]
                if a.get("c", group) != group or not isinstance(topic, str) or retry not in (
                        RETRY_FLAG_NORMAL, RETRY_FLAG_RETRY) or not _offsets_ok((so, qid, pt)):
                    raise ValueError
                extra = ()                    # bits failed whatever the checkpoint: repeats, past the limit
                if type(bits) is bytes:
                    if len(bits) > MAX_ACK_BITSET_BYTES:
                        return frame.response(ResponseCode.SYSTEM_ERROR, f"ack {i}: a BitSet of {len(bits)} bytes "
                                                                         f"(at most {MAX_ACK_BITSET_BYTES})")
                    mask = int.from_bytes(bits, "little")
                    n = mask.bit_count()
                elif type(bits) is list and _offsets_ok(bits):
                    mask, extra = 0, []
                    for d in bits:
                        b = 1 << d if d < limit else 0
                        if not b or mask & b:
                            extra.append(d)
                        else:
                            mask |= b
                    n = len(bits)
                else:
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                return frame.response(ResponseCode.SYSTEM_ERROR, f"ack {i}: not a BatchAck of group {group}")
            total += n
            if total > MAX_BATCH_ACK:
                return frame.response(ResponseCode.SYSTEM_ERROR, f"more than {MAX_BATCH_ACK} messages in one batch ack")
            if topic not in checked:
                ok = self._check_group_topic(Frame(frame.code, fields={"consumerGroup": group, "topic": topic}))
                if isinstance(ok, Frame):
                    return frame.response(ok.code, ok.remark)
                checked[topic] = True
            key = (group, topic if retry == RETRY_FLAG_NORMAL else pop_retry_topic(topic, group), qid, so, pt)
            ck = self.cks.get(key)
            if ck is None:
                bad = mask
            else:
                mine = by_ck.get(key, 0)
                ok = mask & ck.pending & ~mine  # in flight, and not already acked by this request
                by_ck[key] = mine | ok
                bad = mask & ~ok
            if bad:
                failed += [[i, d] for d in mask_bits(bad)]
            if extra:
                failed += [[i, d] for d in extra]
        by_rq: dict[int, list] = {}
        for key, m in by_ck.items():
            if m:
                by_rq.setdefault(self.cks[key].revive_qid, []).append((key, m))
        turn = self._revive_turn()
        if turn is not None:
            undos = []
            for rq, items in by_rq.items():
                done = []
                for k, m in items:
                    turn.add(rq, *self._ack_body(k, mask_offsets(m, k[3])))
                    ck = self.cks[k]
                    self._acked(ck, m)
                    done.append((ck, m))
                undos.append((rq, lambda done=done: [self._unacked(ck, m) for ck, m in done]))
            turn.entries.append((reply, frame.response(fields={"failed": failed}), undos, None))
            return None
        for rq, items in by_rq.items():
            if self._put_revive(rq, [self._ack_body(k, mask_offsets(m, k[3])) for k, m in items]) is None:
                return frame.response(ResponseCode.SYSTEM_ERROR, "cannot write the acks to the revive log")
            for k, m in items:
                self._acked(self.cks[k], m)
        return frame.response(fields={"failed": failed})

    def on_change_invisible_time(self, frame: Frame, reply: Reply) -> Frame:
        """CHANGE_MESSAGE_INVISIBLETIME (200053): fields consumerGroup, topic, extraInfo,
        invisibleTime (ms).  A new checkpoint for the message alone (popTime now) and the ack
        of the old, in one append.  Answer: ``popTime``, ``invisibleTime``, ``reviveQid`` and the
        new ``extraInfo``; NO_MESSAGE when the message is not in flight."""
        ok = self._check_group_topic(frame)
        if isinstance(ok, Frame):
            return ok
        group, _, topic, _ = ok
        try:
            invisible = field_int(frame, "invisibleTime", lo=0)
            key, qo, rq, _ = self._handle_key(group, topic, frame.fields.get("extraInfo"))
        except (ValueError, ProtocolError) as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        if not MIN_INVISIBLE_TIME_MS <= invisible <= MAX_INVISIBLE_TIME_MS:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"invisibleTime {invisible} ms out of range "
                                                             f"[{MIN_INVISIBLE_TIME_MS}, {MAX_INVISIBLE_TIME_MS}]")
        ck = self.cks.get(key)
        if ck is None or not ck.in_flight(qo):
            return frame.response(ResponseCode.NO_MESSAGE,
                                  f"message {topic}/{key[2]}@{qo} is not in flight: already acked, or its "
                                  f"invisible time passed and it was revived")
        # popTime strictly after the old one: the new checkpoint's key never equals the old's
        now = max(int(time.time() * 1000), key[4] + 1)
        new_key = (key[0], key[1], key[2], qo, now)
        put = self._put_revive(ck.revive_qid, [(CK_TAG, self._ck_body(new_key, invisible, [qo], None)),
                                               self._ack_body(key, [qo])])
        if put is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, "cannot write the checkpoint to the revive log")
        self._add_ck(new_key, invisible, ck.revive_qid, put, [qo])
        self._acked(ck, 1 << (qo - key[3]))
        self.stats["acked"] -= 1
        retry = RETRY_FLAG_NORMAL if key[1] == topic else RETRY_FLAG_RETRY
        return frame.response(fields={
            "popTime": now, "invisibleTime": invisible, "reviveQid": ck.revive_qid,
            "extraInfo": build_extra_info(qo, now, invisible, ck.revive_qid, retry, self.b.broker_name, key[2], qo)})

    # -- revive ---------------------------------------------------------------------------------
    def revive(self, now_ms: Optional[int] = None, max_cks: int = 256) -> int:
        """Revive the checkpoints whose invisible time passed (at most ``max_cks`` per call); the
        number of messages sent to a retry topic or the DLQ."""
        if not self.ready or self.b.role == "SLAVE":
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        heap, done = self._heap, 0
        n = 0
        while heap and heap[0][0] <= now and n < max_cks:
            _, _, key = heapq.heappop(heap)
            ck = self.cks.get(key)
            if ck is None:
                continue
            n += 1
            revived = self._revive_ck(ck)
            if revived is None:          # the store refused: try again on the next scan
                heapq.heappush(heap, (now + 1000, next(self._seq), key))
                break
            done += revived
        return done

    def _revive_ck(self, ck: CheckPoint) -> Optional[int]:
        b = self.b
        store = b.store
        group, topic, qid, _, _ = ck.key
        gcfg = b.group_config(group) or {}
        max_times = int(gcfg.get("retryMaxTimes", MAX_RECONSUME_TIMES_DEFAULT))
        retry_topic = topic if is_retry_topic(topic) else pop_retry_topic(topic, group)
        offsets = mask_offsets(ck.pending, ck.key[3])
        n = 0
        for o in offsets:
            res = store.get_messages(REVIVE_GROUP, topic, qid, o, 1)
            msgs = res.messages() if res.message_count else []
            if not msgs or msgs[0].queue_offset != o:
                log.warning("POP revive: %s/%d@%d is gone (retention): not retried", topic, qid, o)
                continue
            m = msgs[0]
            props = {k: v for k, v in m.properties.items() if k not in _DROP_ON_REVIVE}
            props.setdefault("RETRY_TOPIC", topic)
            props.setdefault(PROPERTY_FIRST_POP_TIME, str(ck.key[4]))
            props.setdefault("ORIGIN_MESSAGE_ID", m.msg_id)
            props["WAIT"] = "false"
            if m.reconsume_times >= max_times:
                dest = dlq_topic(group)
            else:
                dest = retry_topic
            if b.topic_config(dest, create=True) is None:
                return None
            batch = _cl.encode_batch([(m.body, _cl.encode_properties(props), m.flag)])
            put = store.put_encoded(dest, 0, batch, None, m.sys_flag, m.born_timestamp, m.born_host,
                                    m.reconsume_times + 1, 1)
            if not put.ok:
                log.error("POP revive of %s/%d@%d to %s failed: %s", topic, qid, o, dest, put.status)
                return None
            n += 1
            if is_dlq_topic(dest):
                self.stats["dlq"] += 1
                if b.metrics is not None:
                    b.metrics.on_dlq(props.get("RETRY_TOPIC", topic), group)
            else:
                self.stats["revived"] += 1
        if self._put_revive(ck.revive_qid, [self._ack_body(ck.key, offsets)]) is None:
            return None
        ck.pending = 0
        self.cks.pop(ck.key, None)
        return n

    def commit_revive_offsets(self) -> None:
        """The revive offset of each revive queue: its lowest checkpoint still in flight, else its end
        (what a restart reads from).  Called before consumer offsets are persisted."""
        if not self.ready:
            return
        lowest: dict[int, int] = {}
        for ck in self.cks.values():
            if ck.revive_offset < lowest.get(ck.revive_qid, 1 << 62):
                lowest[ck.revive_qid] = ck.revive_offset
        com, store = self.b.store.consumer_offset_manager, self.b.store
        for rq in range(self.revive_queue_num):
            off = lowest.get(rq)
            if off is None:
                off = store.get_max_offset_in_queue(self.revive_topic, rq)
            com.commit_offset(REVIVE_GROUP, self.revive_topic, rq, off)

    def runtime_stats(self) -> dict:
        """:attr:`stats` and ``inFlight`` (messages popped and not acked), for GET_BROKER_RUNTIME_INFO."""
        return {**self.stats, "inFlight": sum(ck.pending.bit_count() for ck in self.cks.values())}

    def inflight(self, group: Optional[str] = None) -> dict:
        """``{(group, topic, queueId): messages in flight}`` (consumerProgress of POP groups)."""
        out: dict = {}
        for (g, t, q, _, _), ck in self.cks.items():
            if group is None or g == group:
                out[(g, t, q)] = out.get((g, t, q), 0) + ck.pending.bit_count()
        return out


__all__ = ["PopService", "revive_topic", "pop_retry_topic", "build_extra_info", "parse_extra_info",
           "REVIVE_GROUP", "REVIVE_QUEUE_NUM", "POP_MAX_MSG_NUMS", "MIN_INVISIBLE_TIME_MS", "MAX_INVISIBLE_TIME_MS",
           "MAX_BATCH_ACK", "MAX_ACK_BITSET_BYTES", "MAX_POP_HOLDS", "offsets_mask", "mask_offsets"]
