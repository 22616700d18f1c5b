"""Transactional messages on the broker (RocketMQ 4.9 / 5): half messages, END_TRANSACTION and
the check-back service (layout and defaults: SPEC.md §11; RocketMQ sources
``broker/.../processor/EndTransactionProcessor.java``, ``broker/.../transaction/queue/
TransactionalMessageBridge.java``, ``TransactionalMessageServiceImpl.java``,
``TransactionalMessageUtil.java``, ``DefaultTransactionalMessageCheckListener.java``).

A transaction in four records, every one an ordinary CommitLog record (replicated, recovered
and expired like the rest):

1. **Half message.**  A SEND_MESSAGE whose sysflag has TRANSACTION_PREPARED_TYPE (0x4) and property
   ``TRAN_MSG=true`` is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with ``REAL_TOPIC`` /
   ``REAL_QID`` set and its sysflag reset to TRANSACTION_NOT_TYPE (``parseHalfMessageInner``):
   consumers of the real topic, Spark included, never see it.
2. **Op message.**  END_TRANSACTION (37) with COMMIT (8) or ROLLBACK (12) writes a record to
   ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0: tag ``d``, body the half message's queue offset as
   decimal text (RocketMQ's format), plus two rmq properties, ``RMQ_TRAN_KEY`` (the transaction's
   key, below) and ``RMQ_TRAN_OUTCOME`` (``COMMIT`` / ``ROLLBACK`` / ``DISCARD``).
3. **Commit record** (COMMIT only).  The half message rebuilt for ``REAL_TOPIC`` / ``REAL_QID``
   (``TRAN_MSG``, ``REAL_*`` removed), sysflag TRANSACTION_COMMIT_TYPE (0x8), PREPARED TRANSACTION
   OFFSET = the half message's physical offset.
4. **Renewed half** (check-back).  Every ``transactionCheckInterval`` the service walks the half
   queue from its check offset; an unresolved half older than ``transactionTimeOut`` (or its
   ``CHECK_IMMUNITY_TIME_IN_SECONDS``) is re-appended to the half queue with
   ``TRANSACTION_CHECK_TIMES`` + 1 and ``TRAN_PREPARED_QUEUE_OFFSET`` (``putBackHalfMsgQueue``),
   then CHECK_TRANSACTION_STATE (39) goes one-way to a live producer of its group over that
   producer's own connection (the ROUTER identity of its last heartbeat); the producer answers
   with END_TRANSACTION ``fromTransactionCheck=true``.  A half checked ``transactionCheckMax``
   times is copied to ``TRANS_CHECK_MAX_TIME_TOPIC`` and closed with a ``DISCARD`` op.  Unlike
   RocketMQ, a round with no live producer of the group renews the half *without* counting a check
   (nobody was asked); a half older than ``fileReservedTime`` is discarded the same way
   (RocketMQ's ``needSkip``).

**Exactly once, where RocketMQ is at least once.**  RocketMQ writes the commit record, then the
op: a crash between the two, or a late END_TRANSACTION for a half message that was re-appended
by a check, commits twice.  rmq keys every transaction by the half message's ``UNIQ_KEY`` (the
client's message id, kept by every renewed copy; ``@<first queue offset>`` without one) and:

* answers END_TRANSACTION only for a key still *pending* (a later END, or a check answer for a
  transaction already ended, is acknowledged and ignored);
* writes the op **before** the commit record, back to back on the broker thread, so the commit
  record is the CommitLog record right after its op (or the first of the next file).  At start
  (and after a promotion) the service rebuilds the pending keys from the half and op queues and,
  for every key whose last op is a COMMIT without that commit record after it (a kill -9 between
  the two appends, or a refused append), writes the pair again.

State across restarts: the check offset (``CID_RMQ_SYS_TRANS`` on the half queue) and the op
offset (the same group on the op queue, the first op still needed), committed with the consumer
offsets.  Recovery waits, as POP's does, until reput has dispatched everything written before
start; END_TRANSACTIONs that arrive meanwhile are queued (at most MAX_QUEUED_ENDS).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq._core.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_TYPE_MASK
from rmq.actors.actor import Reply
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.protocol import Frame, RequestCode, ResponseCode, field_int, pack_body
from rmq.status import GetMessageStatus

if TYPE_CHECKING:      # pragma: no cover
    from rmq.actors.broker import BrokerActor

log = logging.getLogger("rmq.broker.transaction")

# TopicValidator / TransactionalMessageUtil / MixAll names (SPEC.md §11.1)
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_GROUP = "CID_RMQ_SYS_TRANS"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
REMOVE_TAG = "d"
HALF_QUEUE_ID = 0
# BrokerConfig defaults (5.x; SPEC.md §11.1)
TRANSACTION_CHECK_INTERVAL_MS = 30_000    # transactionCheckInterval
TRANSACTION_TIMEOUT_MS = 6_000            # transactionTimeOut
TRANSACTION_CHECK_MAX = 15                # transactionCheckMax
# rmq limits
CHECK_SLICE = 256                         # half messages examined per broker-loop turn of a check round
CHECK_SLICE_PAUSE_MS = 5                  # between slices: sends and pulls are served in between
MAX_QUEUED_ENDS = 100_000                 # END_TRANSACTIONs held while the state is being rebuilt
READ_BATCH = 32                           # half / op records read per store call
# MessageConst names
from rmq.common.message_const import PROPERTY_PRODUCER_GROUP as PROPERTY_PGROUP  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_REAL_QUEUE_ID as PROPERTY_REAL_QID  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_REAL_TOPIC  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_TRANSACTION_PREPARED as PROPERTY_TRAN_MSG  # noqa: E402,F401
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
from rmq.common.message_const import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX as PROPERTY_UNIQ_KEY  # noqa: E402,F401
# rmq's op-record properties (see the module docstring)
PROPERTY_TRAN_KEY = "RMQ_TRAN_KEY"
PROPERTY_TRAN_OUTCOME = "RMQ_TRAN_OUTCOME"
OUTCOME_COMMIT, OUTCOME_ROLLBACK, OUTCOME_DISCARD = "COMMIT", "ROLLBACK", "DISCARD"
COMMIT_OR_ROLLBACK = {8: OUTCOME_COMMIT, 12: OUTCOME_ROLLBACK}      # MessageSysFlag values
_DROP_ON_COMMIT = (PROPERTY_TRAN_MSG, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, "__CRC32#")


def transaction_key(props: dict, queue_offset: int) -> str:
    """A transaction's identity: the half message's UNIQ_KEY, else ``@`` + its first queue offset."""
    key = props.get(PROPERTY_UNIQ_KEY)
    if key:
        return key
    return "@" + str(props.get(PROPERTY_PREPARED_QUEUE_OFFSET, queue_offset))


def half_properties(topic: str, queue_id: int, props: dict) -> dict:
    """The properties a half message is stored with (``parseHalfMessageInner``): REAL_TOPIC /
    REAL_QID added, DELAY dropped (a transaction's message is never delayed, as in RocketMQ)."""
    out = {k: v for k, v in props.items() if k != "DELAY"}
    out[PROPERTY_REAL_TOPIC] = topic
    out[PROPERTY_REAL_QID] = str(queue_id)
    return out


class TransactionService:
    """END_TRANSACTION, the check-back rounds and their state, on the broker's thread.

    Parameters
    ----------
    broker : BrokerActor
        Settings read from broker.conf: ``transactionCheckInterval`` (ms, 30 000),
        ``transactionTimeOut`` (ms, 6 000), ``transactionCheckMax`` (15),
        ``rejectTransactionMessage`` (false).
    """

    def __init__(self, broker: "BrokerActor"):
        self.b = broker
        s = broker.settings
        self.check_interval_ms = max(10, int(s.get("transactionCheckInterval", TRANSACTION_CHECK_INTERVAL_MS)))
        self.timeout_ms = max(0, int(s.get("transactionTimeOut", TRANSACTION_TIMEOUT_MS)))
        self.check_max = max(1, int(s.get("transactionCheckMax", TRANSACTION_CHECK_MAX)))
        self.reject = str(s.get("rejectTransactionMessage", "false")).lower() == "true"
        self.pending: dict[str, tuple] = {}          # key -> (queue offset, physical offset) of the live half copy
        self.op_of_half: dict[int, int] = {}         # half queue offset (>= check offset) -> op queue offset
        self.ready = False
        self._recover_target = -1
        self._queued_ends: list = []                 # (frame, reply, *end_transaction args) while not ready
        self._round: Optional[dict] = None           # the check round in progress
        self._opaque = 1 << 29
        self.stats = {"halves": 0, "commits": 0, "rollbacks": 0, "discards": 0, "checks": 0,
                      "checksUnsent": 0, "endsIgnored": 0, "recommitted": 0}

    # -- start / recovery ------------------------------------------------------------------
    def start(self) -> None:
        """(Re)build the state: now, and after a promotion (the replicated log is the truth)."""
        tcm = self.b.store.topic_config_manager
        for topic in (HALF_TOPIC, OP_TOPIC):
            if tcm.select_topic_config(topic) is None:
                tcm.update_topic_config(tcm.new_topic_config(topic, 1, 1, PERM_READ | PERM_WRITE))
        self.ready = False
        self.pending.clear()
        self.op_of_half.clear()
        self._round = None
        self._recover_target = self.b.store.get_max_phy_offset()
        self.maybe_recover()

    def _offset(self, topic: str) -> int:
        off = self.b.store.consumer_offset_manager.query_offset(TRANS_GROUP, topic, HALF_QUEUE_ID)
        return max(off, self.b.store.get_min_offset_in_queue(topic, HALF_QUEUE_ID), 0)

    def _read(self, topic: str, offset: int, n: int = READ_BATCH) -> tuple[list, int]:
        """Up to ``n`` records of ``topic`` queue 0 from ``offset``: (messages, next offset)."""
        store = self.b.store
        while True:
            res = store.get_messages(TRANS_GROUP, topic, HALF_QUEUE_ID, offset, n)
            if res.message_count:
                return res.messages(), res.next_begin_offset
            if res.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.NO_MATCHED_MESSAGE,
                              GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.OFFSET_FOUND_NULL) \
                    and res.next_begin_offset > offset:
                offset = res.next_begin_offset
                continue
            return [], offset

    def maybe_recover(self) -> None:
        """Rebuild the pending transactions once reput has dispatched every record written before
        start; then re-write any commit record a crash cut off, and serve queued END_TRANSACTIONs."""
        b = self.b
        if self.ready or b.dispatched_offset < self._recover_target:
            return
        t0 = time.monotonic()
        check_offset = self._offset(HALF_TOPIC)
        offset, n_half = check_offset, 0
        while True:
            msgs, offset = self._read(HALF_TOPIC, offset)
            if not msgs:
                break
            for m in msgs:
                self.pending[transaction_key(m.properties, m.queue_offset)] = (m.queue_offset, m.commitlog_offset)
                n_half += 1
        last_op: dict[str, tuple] = {}               # key -> (outcome, op physical end, half queue offset)
        offset, n_op = self._offset(OP_TOPIC), 0
        while True:
            msgs, offset = self._read(OP_TOPIC, offset)
            if not msgs:
                break
            for m in msgs:
                n_op += 1
                props = m.properties
                named = _op_offsets(m.body)
                for o in named:
                    if o >= check_offset:
                        self.op_of_half.setdefault(o, m.queue_offset)
                key = props.get(PROPERTY_TRAN_KEY)
                if key is None:                      # an op without rmq's key: resolve by half offset
                    key = self._key_of_half(named[0] if named else -1)
                if key is None:
                    continue
                live = self.pending.pop(key, None)
                if live is not None and live[0] >= check_offset:
                    self.op_of_half.setdefault(live[0], m.queue_offset)
                last_op[key] = (props.get(PROPERTY_TRAN_OUTCOME, ""), m.commitlog_offset + m.store_size,
                                named[0] if named else -1)
        repaired = 0
        for key, (outcome, op_end, half_qo) in last_op.items():
            if outcome == OUTCOME_COMMIT and not self._commit_follows(op_end, key):
                half = self._half_at(half_qo)
                if half is None:
                    log.error("transaction %s: op says COMMIT, no commit record, half message %d gone", key, half_qo)
                    continue
                if self._resolve(half, key, OUTCOME_COMMIT, half.queue_offset):
                    repaired += 1
        self.stats["recommitted"] += repaired
        self.ready = True
        log.info("transaction state recovered in %.0f ms: %d half and %d op records read, %d pending, "
                 "%d commit records re-written", (time.monotonic() - t0) * 1000.0, n_half, n_op,
                 len(self.pending), repaired)
        queued, self._queued_ends = self._queued_ends, []
        for frame, reply, *args in queued:
            resp = self.end_transaction(frame, reply, *args)
            if resp is not None:
                reply.send(resp)

    def _key_of_half(self, queue_offset: int) -> Optional[str]:
        m = self._half_at(queue_offset)
        return None if m is None else transaction_key(m.properties, m.queue_offset)

    def _half_at(self, queue_offset: int):
        if queue_offset < 0:
            return None
        msgs, _ = self._read(HALF_TOPIC, queue_offset, 1)
        return msgs[0] if msgs and msgs[0].queue_offset == queue_offset else None

    def _commit_follows(self, op_end: int, key: str) -> bool:
        """Whether the record right after an op (at ``op_end``, or at the start of the next CommitLog
        file when it did not fit) is that transaction's commit record."""
        store = self.b.store
        size = store.config.mapped_file_size_commit_log
        for at in (op_end, (op_end // size + 1) * size):
            if at >= store.get_max_phy_offset():
                return False
            try:
                m = store.look_message_by_offset(at)
            except Exception:  # noqa: BLE001 - a blank end-of-file or a torn tail reads as nothing
                m = None
            if m is not None:
                if (m.sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_COMMIT_TYPE:
                    return False
                try:
                    half = store.look_message_by_offset(m.prepared_transaction_offset)
                except Exception:  # noqa: BLE001 - the half message expired
                    half = None
                return half is not None and transaction_key(half.properties, half.queue_offset) == key
        return False

    # -- half messages (from the send path) ----------------------------------------------
    def on_half_stored(self, props: dict, queue_offset: int, physical_offset: int) -> None:
        """A half message was appended (broker send path): its transaction is pending."""
        self.pending[transaction_key(props, queue_offset)] = (queue_offset, physical_offset)
        self.stats["halves"] += 1

    # -- END_TRANSACTION ---------------------------------------------------------------------
    def end_transaction(self, frame: Frame, reply: Reply, group: str, phys: int, qo: int,
                        outcome: str) -> Optional[Frame]:
        """Commit or roll back the half message at CommitLog ``phys`` (its queue offset ``qo``, -1:
        unknown) of producer group ``group`` (END_TRANSACTION, parsed by
        :class:`rmq.actors.processor.end_transaction.EndTransactionProcessor`).

        While the state is being recovered the request waits (at most MAX_QUEUED_ENDS, then
        SYSTEM_BUSY); a half message that does not exist, is not a half message, or belongs to
        another producer group gets SYSTEM_ERROR; a transaction already ended is acknowledged
        (SUCCESS, remark says so) and left as it is.
        """
        b = self.b
        if not self.ready:
            if len(self._queued_ends) >= MAX_QUEUED_ENDS:
                return frame.response(ResponseCode.SYSTEM_BUSY, "transaction state is being recovered: retry")
            reply.held = True
            self._queued_ends.append((frame, reply, group, phys, qo, outcome))
            return None
        try:
            half = b.store.look_message_by_offset(phys)
        except Exception as e:  # noqa: BLE001 - an offset past the end or inside a record
            half = None
            log.debug("END_TRANSACTION at %d: %s", phys, e)
        if half is None or half.topic != HALF_TOPIC:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"Find prepared transaction message failed: "
                                                             f"no half message at commitLogOffset {phys}")
        if half.properties.get(PROPERTY_PGROUP) != group:
            return frame.response(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if qo >= 0 and half.queue_offset != qo:
            return frame.response(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        key = transaction_key(half.properties, half.queue_offset)
        live = self.pending.get(key)
        if live is None:
            self.stats["endsIgnored"] += 1
            return frame.response(ResponseCode.SUCCESS, f"transaction {key} already ended")
        if not self._resolve(half, key, outcome, live[0]):
            return frame.response(ResponseCode.SYSTEM_ERROR, f"{outcome.lower()} of transaction {key} not stored")
        return frame.response()

    def _put(self, topic: str, queue_id: int, body: bytes, props: dict, flag: int, sys_flag: int,
             born_ts: int, born_host, reconsume: int, prepared: int = 0):
        batch = _cl.encode_batch([(body, _cl.encode_properties(props), flag)])
        res = self.b.store.put_encoded(topic, queue_id, batch, None, sys_flag, born_ts, born_host, reconsume, 1,
                                       prepared_transaction_offset=prepared)
        if not res.ok:
            log.error("transaction record for %s/%d not stored: %s %s", topic, queue_id, res.status, res.remark)
            return None
        return res

    def _resolve(self, half, key: str, outcome: str, live_qo: int) -> bool:
        """Write the op, then (COMMIT) the commit record right after it; the key is no longer pending.
        ``live_qo``: the queue offset of the transaction's latest half copy (the op names it, so a
        check round skips it).  False when the op could not be stored (nothing changed)."""
        now = int(time.time() * 1000)
        op = self._put(OP_TOPIC, HALF_QUEUE_ID, str(live_qo).encode(),
                       {"TAGS": REMOVE_TAG, "WAIT": "false", PROPERTY_TRAN_KEY: key, PROPERTY_TRAN_OUTCOME: outcome},
                       0, 0, now, None, 0)
        if op is None:
            return False
        self.pending.pop(key, None)
        self.op_of_half.setdefault(live_qo, op.append.queue_offset)
        if outcome == OUTCOME_COMMIT:
            if not self._put_commit(half):
                log.error("transaction %s: commit record not stored after its op; re-written at the next start", key)
            self.stats["commits"] += 1
        elif outcome == OUTCOME_ROLLBACK:
            self.stats["rollbacks"] += 1
        else:
            self.stats["discards"] += 1
        return True

    def _put_commit(self, half) -> bool:
        props = half.properties
        topic = props.get(PROPERTY_REAL_TOPIC)
        qid = props.get(PROPERTY_REAL_QID, "")
        if not topic or not str(qid).isdigit():
            log.error("half message at %d has no REAL_TOPIC / REAL_QID: not committed", half.commitlog_offset)
            return False
        b = self.b
        if b.topic_config(topic, create=True) is None:
            return False
        out = {k: v for k, v in props.items() if k not in _DROP_ON_COMMIT}
        out["WAIT"] = "false"
        sys_flag = (half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
        res = self._put(topic, int(qid), half.body, out, half.flag, sys_flag, half.born_timestamp, half.born_host,
                        half.reconsume_times, prepared=half.commitlog_offset)
        if res is None:
            return False
        b.pull_processor.note_append(topic, int(qid), res)
        return True

    # -- check-back ----------------------------------------------------------------------------
    def check(self) -> None:
        """Start a check round (every ``transactionCheckInterval``) unless one is running."""
        if not self.ready or self._round is not None or self.b.role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            return
        self._round = {"i": self._offset(HALF_TOPIC), "start_ms": int(time.time() * 1000), "buf": [],
                       "renewed": 0}
        self._step()

    def _step(self) -> None:
        """One slice of the round: at most CHECK_SLICE half messages, then back to the loop."""
        rnd = self._round
        if rnd is None:
            return
        if not self.ready:
            self._round = None
            return
        i, now = rnd["i"], int(time.time() * 1000)
        done = False
        for _ in range(CHECK_SLICE):
            if not rnd["buf"]:
                msgs, _next = self._read(HALF_TOPIC, i)
                if not msgs:
                    done = True
                    break
                rnd["buf"] = msgs
                if msgs[0].queue_offset > i:
                    i = msgs[0].queue_offset
            m = rnd["buf"].pop(0)
            if m.queue_offset < i:
                continue
            verdict = self._examine(m, rnd["start_ms"], now)
            if verdict == "stop":
                done = True
                break
            if verdict == "renewed":
                rnd["renewed"] += 1
            i = m.queue_offset + 1
        rnd["i"] = i
        self._advance(i)
        if done:
            if rnd["renewed"]:
                log.info("transaction check: %d half messages checked back", rnd["renewed"])
            if rnd.get("orphans"):
                log.warning("transaction check: no live producer of group(s) %s: their half messages wait, "
                            "uncounted, for the next round", ", ".join(sorted(rnd["orphans"])))
            self._round = None
        else:
            self.b.add_timer(CHECK_SLICE_PAUSE_MS, self._step, repeat=False)

    def _examine(self, m, round_start_ms: int, now_ms: int) -> str:
        """One half message of a round: "skip" (ended, or superseded by a renewed copy), "discard",
        "stop" (too young: the round ends here), "renewed" (re-appended and checked back), or "waiting"
        (re-appended with its check count unchanged: no live producer of its group to ask)."""
        props = m.properties
        key = transaction_key(props, m.queue_offset)
        live = self.pending.get(key)
        if live is None or live[0] != m.queue_offset:
            return "skip"
        try:
            times = int(props.get(PROPERTY_CHECK_TIMES, "0"))
        except ValueError:
            times = 0
        if times >= self.check_max:
            return "discard" if self._discard(m, key) else "stop"
        if m.store_timestamp >= round_start_ms:
            return "stop"
        age = now_ms - m.born_timestamp
        immunity = self.timeout_ms
        raw = props.get(PROPERTY_CHECK_IMMUNITY)
        if raw is not None:
            try:
                secs = int(raw)
                immunity = self.timeout_ms if secs < 0 else secs * 1000
            except ValueError:
                pass
        if 0 <= age <= immunity:
            return "stop"
        if age > self.b.store.config.file_reserved_time * 3_600_000:
            # RocketMQ's needSkip: a half message older than fileReservedTime is given up (rmq keeps a
            # copy in TRANS_CHECK_MAX_TIME_TOPIC, as for transactionCheckMax)
            return "discard" if self._discard(m, key) else "stop"
        group = props.get(PROPERTY_PGROUP, "")
        asked = self.b.client_manager.has_live_producer(group)
        # a check nobody can answer (no live producer of the group: all down, or not yet found this
        # broker after a promotion or restart) is not counted against transactionCheckMax
        renewed = self._renew(m, times + 1 if asked else times)
        if renewed is None:
            return "stop"                            # the store refused: try again next round
        if asked:
            self._send_check(renewed, group)
        else:
            self.stats["checksUnsent"] += 1
            self._round.setdefault("orphans", set()).add(group)
            return "waiting"
        return "renewed"

    def _renew(self, m, times: int):
        """putBackHalfMsgQueue: the half message appended again with its check count; the new copy
        (its offsets) is what the check-back names and what END_TRANSACTION then refers to."""
        props = dict(m.properties)
        props.pop("__CRC32#", None)
        props[PROPERTY_CHECK_TIMES] = str(times)
        props.setdefault(PROPERTY_PREPARED_QUEUE_OFFSET, str(m.queue_offset))
        props["WAIT"] = "false"
        res = self._put(HALF_TOPIC, HALF_QUEUE_ID, m.body, props, m.flag, m.sys_flag, m.born_timestamp, m.born_host,
                        m.reconsume_times)
        if res is None:
            return None
        a = res.append
        key = transaction_key(props, m.queue_offset)
        self.pending[key] = (a.queue_offset, a.wrote_offset)
        return a.wrote_offset, a.queue_offset, key, res.msg_id

    def _discard(self, m, key: str) -> bool:
        """``resolveDiscardMsg``: checked ``transactionCheckMax`` times: copied to
        TRANS_CHECK_MAX_TIME_TOPIC, and the transaction closed with a DISCARD op."""
        if self.b.topic_config(CHECK_MAX_TIME_TOPIC, create=True) is None:
            return False
        props = {k: v for k, v in m.properties.items() if k != "__CRC32#"}
        props["WAIT"] = "false"
        if self._put(CHECK_MAX_TIME_TOPIC, 0, m.body, props, m.flag, m.sys_flag, m.born_timestamp, m.born_host,
                     m.reconsume_times) is None:
            return False
        log.warning("transaction %s (%s) checked %d times: discarded to %s", key,
                    props.get(PROPERTY_REAL_TOPIC), self.check_max, CHECK_MAX_TIME_TOPIC)
        return self._resolve(m, key, OUTCOME_DISCARD, m.queue_offset)

    def _send_check(self, renewed: tuple, group: str) -> None:
        """CHECK_TRANSACTION_STATE one-way to a live producer of ``group``; the body is the half
        message's CommitLog record (the client restores REAL_TOPIC / REAL_QID, as the broker's
        ``sendCheckMessage`` does before encoding)."""
        phys, qo, key, offset_msg_id = renewed
        b = self.b
        record = b.store.select_one_message_by_offset(phys, check_crc=False)
        if not record:
            return
        self._opaque += 1
        frame = Frame(RequestCode.CHECK_TRANSACTION_STATE, self._opaque, P.FLAG_ONEWAY, "",
                      {"tranStateTableOffset": qo, "commitLogOffset": phys, "msgId": key,
                       "transactionId": key, "offsetMsgId": offset_msg_id, "brokerName": b.broker_name,
                       "producerGroup": group},
                      [bytes(record)])
        parts = P.encode(frame)
        if b.client_manager.send_to_producer(group, parts):
            self.stats["checks"] += 1
        else:
            self.stats["checksUnsent"] += 1
            log.warning("check-back of transaction %s: no live producer of group %s", key, group)

    def _advance(self, check_offset: int) -> None:
        """Commit the check offset and the op offset (the first op still needed)."""
        com = self.b.store.consumer_offset_manager
        com.commit_offset(TRANS_GROUP, HALF_TOPIC, HALF_QUEUE_ID, check_offset)
        for o in [o for o in self.op_of_half if o < check_offset]:
            del self.op_of_half[o]
        op_offset = min(self.op_of_half.values()) if self.op_of_half else \
            self.b.store.get_max_offset_in_queue(OP_TOPIC, HALF_QUEUE_ID)
        if op_offset >= com.query_offset(TRANS_GROUP, OP_TOPIC, HALF_QUEUE_ID):
            com.commit_offset(TRANS_GROUP, OP_TOPIC, HALF_QUEUE_ID, op_offset)

    # -- admin -------------------------------------------------------------------------------------
    def list_half(self, max_rows: int) -> dict:
        """Pending transactions, oldest first: ``{"pending": N, "halfMessages": [{transactionId,
        producerGroup, topic, queueId, bornTimestamp (ms), checkTimes, queueOffset, commitLogOffset}]},
        plus the service's counters under "stats", "ready" (state recovered) and "queuedEnds"
        (END_TRANSACTIONs waiting for the recovery)."""
        rows = []
        for key, (qo, phys) in sorted(self.pending.items(), key=lambda kv: kv[1][0])[:max_rows]:
            try:
                m = self.b.store.look_message_by_offset(phys)
            except Exception:  # noqa: BLE001 - expired under us
                m = None
            if m is None:
                continue
            p = m.properties
            rows.append({"transactionId": key, "producerGroup": p.get(PROPERTY_PGROUP, ""),
                         "topic": p.get(PROPERTY_REAL_TOPIC, ""), "queueId": int(p.get(PROPERTY_REAL_QID, -1)),
                         "bornTimestamp": m.born_timestamp, "checkTimes": int(p.get(PROPERTY_CHECK_TIMES, 0)),
                         "queueOffset": qo, "commitLogOffset": phys})
        return {"pending": len(self.pending), "halfMessages": rows, "stats": dict(self.stats),
                "ready": self.ready, "queuedEnds": len(self._queued_ends)}

    def on_list_half(self, frame: Frame, reply: Reply) -> Frame:
        """GET_HALF_MESSAGES (rmq): :meth:`list_half` as a msgpack body; ``maxRows`` (1..10 000, 1 000)."""
        return frame.response(bodies=[pack_body(self.list_half(field_int(frame, "maxRows", 1000, lo=1, hi=10_000)))])


def _op_offsets(body: bytes) -> list:
    """The half queue offsets an op record names (decimal text, ``,``-separated in 5.x)."""
    out = []
    for part in bytes(body).split(b","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def is_half_request(sys_flag: int, props: dict) -> bool:
    """A send that is a transaction's half message (sysflag PREPARED, or ``TRAN_MSG=true``)."""
    return (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE or \
        str(props.get(PROPERTY_TRAN_MSG, "")).lower() == "true"


__all__ = ["TransactionService", "HALF_TOPIC", "OP_TOPIC", "TRANS_GROUP", "CHECK_MAX_TIME_TOPIC",
           "transaction_key", "half_properties", "is_half_request"]
