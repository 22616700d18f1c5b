"""Timer messages: RocketMQ 5's TimerLog, TimerWheel and timer checkpoint (SPEC.md §10.4).

RocketMQ sources: ``store/.../timer/TimerMessageStore.java``, ``TimerLog.java``,
``TimerWheel.java``, ``Slot.java``, ``TimerCheckpoint.java``; the send-side transformation is
``broker/.../util/HookUtils.java`` (``checkIfTimerMessage``, ``transformTimerMessage``).

A message with ``TIMER_DELIVER_MS`` (absolute, epoch ms), ``TIMER_DELAY_MS`` or
``TIMER_DELAY_SEC`` (relative to the broker's clock) and no delay level is stored in topic
``rmq_sys_wheel_timer`` queue 0 with ``TIMER_OUT_MS`` (the deliver time rounded down to
``timerPrecisionMs``; an exact multiple is lowered by one precision), ``REAL_TOPIC`` and
``REAL_QID``.  :class:`TimerMessageStore` then, on the broker's thread:

* **enqueue**: reads that queue from its offset and appends one 52-byte TimerLog unit per message,
  chained per wheel slot (``prevPos``), and updates the slot (first / last unit, count);
* **dequeue**: once the write time (now, rounded down) passes a slot, walks the slot's chain and
  re-puts each message to its real topic and queue (``TIMER_ENQUEUE_MS`` / ``TIMER_DEQUEUE_MS``
  added, ``REAL_TOPIC`` / ``REAL_QID`` removed) -- or, for a timer beyond the roll window, back to
  ``rmq_sys_wheel_timer`` with ``TIMER_ROLL_TIMES`` + 1 ("rolled": enqueued again later);
* **flush**: every ``timerFlushIntervalMs`` the TimerLog, the ``timerwheel`` file and
  ``config/timercheck`` are made durable.

Files (byte layouts, big-endian as RocketMQ's ByteBuffer):

* ``timerlog/<20-digit offset>`` -- ``mappedFileSizeTimerLog`` bytes each, 52-byte units:
  size 4 (52) | prevPos 8 | magic 4 | currWriteTime 8 (ms) | delay 4 (ms, relative to
  currWriteTime) | offsetPy 8 | sizePy 4 | real-topic hash 4 (Java ``String.hashCode``) |
  reserved 8.  A file end too short for a unit holds a blank: size | 0 | BLANK_MAGIC_CODE.
* ``timerwheel`` -- ``2 x slotsTotal`` 32-byte slots (slotsTotal = 7 days x 86 400):
  timeMs / precision 8 | firstPos 8 | lastPos 8 | num 4 | magic 4; slot index
  ``(timeMs / precision) % (2 x slotsTotal)``.
* ``config/timercheck`` -- one page: lastReadTimeMs 8 | lastTimerLogFlushPos 8 |
  lastTimerQueueOffset 8 | masterTimerQueueOffset 8 | dataVersion (stateVersion 8, timestamp 8,
  counter 8).

**Where rmq goes further than RocketMQ.**

* *Accuracy.*  The reserved 8 bytes of a unit hold the message's exact deliver time (ms; RocketMQ
  writes 0 there and never reads it).  RocketMQ re-puts a slot once the write time has passed it,
  so a timer is up to ``timerPrecisionMs`` late by design.  rmq re-puts each unit of the slot that
  is filling now as soon as its exact time has come (the slot's units in a heap by deliver time,
  checked every tick and at the next deliver time), and a slot already past in deliver-time
  order, earliest first.  A timer is never early; its lateness is the tick plus the time to
  re-put the timers due before it, not the precision.
* *Warm-up.*  The next non-empty slot (up to WARM_AHEAD_MS ahead) is collected and its messages
  read and re-encoded ahead of time, so that only the CommitLog appends are left when it is due.
* *None twice.*  RocketMQ redoes the slots and queue entries after its last checkpoint on restart,
  re-delivering what it had already delivered.  rmq's checkpoint page also holds, after
  RocketMQ's 56 bytes, ``RMQ_MARK_MAGIC`` 4 | the CommitLog offset before which every delivery
  of the checkpointed state lies 8 (RocketMQ readers ignore the rest of the page).  Recovery reads
  the CommitLog from there, collects the deliveries already made (records with
  ``TIMER_DEQUEUE_MS``: ``UNIQ_KEY``, roll count, rolled or not) and skips them while redoing.  A
  timer without ``UNIQ_KEY`` gets one at the broker, so every timer has its key.

Not built: RocketMQ 5's timer deletion (``TIMER_DEL_UNIQKEY``, refused with a clear error), its
warm-up and metrics files (``timermetrics``), and the dequeue thread pools (one broker thread does
the work in slices).
"""
from __future__ import annotations

import logging
import os
import struct
import time
import uuid
from heapq import heapify, heappop, heappush
from array import array
from dataclasses import dataclass, field
from typing import Callable, Optional

from rmq._core import commitlog as _cl
from rmq._core.mapped_file import MappedFile
from rmq._core.layout import TRANSACTION_TYPE_MASK
from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger("rmq.store.timer")

TIMER_TOPIC = "rmq_sys_wheel_timer"          # TopicValidator.SYSTEM_TOPIC_PREFIX + "wheel_timer"
TIMER_QUEUE_ID = 0
TIMER_GROUP = "CID_RMQ_SYS_WHEEL_TIMER"      # rmq: the name reads of the timer queue are made under
# MessageConst property names (RocketMQ 5): rmq.common.message_const
from rmq.common.message_const import (PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DEL_UNIQKEY,  # noqa: E402,F401
                                      PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELIVER_MS,
                                      PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_TIMER_ENQUEUE_MS, PROPERTY_TIMER_OUT_MS,
                                      PROPERTY_TIMER_ROLL_TIMES, TIMER_PROPERTIES)
from rmq.common.message_const import PROPERTY_DELAY_TIME_LEVEL as PROPERTY_DELAY  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_REAL_QUEUE_ID as PROPERTY_REAL_QID  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX as PROPERTY_UNIQ_KEY  # noqa: E402,F401

# TimerLog (TimerLog.java)
UNIT_SIZE = 52
UNIT_PRE_SIZE_FOR_MSG = 28                   # offsetPy starts here
MIN_BLANK_LEN = 4 + 8 + 4
BLANK_MAGIC_CODE = struct.unpack(">i", struct.pack(">I", (0xBBCCDDEE ^ (1880681586 + 8)) & 0xFFFFFFFF))[0]
_UNIT = struct.Struct(">iqiqiqiiq")          # size, prevPos, magic, writeTime, delay, offsetPy, sizePy, hash, reserved
_BLANK = struct.Struct(">iqi")
# TimerWheel / Slot (TimerWheel.java, Slot.java)
SLOT_SIZE = 32
_SLOT = struct.Struct(">qqqii")
TIMER_WHEEL_TTL_DAY = 7
DAY_SECS = 86_400
SLOTS_TOTAL = TIMER_WHEEL_TTL_DAY * DAY_SECS
TIMER_BLANK_SLOTS = 60
BLANK = -1
# unit magic bits (TimerMessageStore)
MAGIC_DEFAULT = 1
MAGIC_ROLL = 1 << 1
MAGIC_DELETE = 1 << 2
# timercheck (TimerCheckpoint.java) plus rmq's delivery mark after RocketMQ's 56 bytes
CHECKPOINT_FILE = "timercheck"
CHECKPOINT_PAGE = 4096
_CHECKPOINT = struct.Struct(">qqqqqqq")
RMQ_MARK_MAGIC = 0x524D5154                  # "RMQT"
_MARK = struct.Struct(">iq")
_MARK_AT = _CHECKPOINT.size
# rmq limits
DEQUEUE_SLICE = 2048                         # units re-put per call of run() (the broker serves between)
ENQUEUE_SLICE = 1024                         # queue entries enqueued per call of run()
READ_BATCH = 64                              # messages per read of the timer queue
WARM_AHEAD_MS = 2000                         # a slot is prepared up to this long before it is due
WARM_MAX_PREPARED = 500_000                  # units prepared ahead at most (memory: body + properties each)
REPUT_BATCH_BYTES = 1 << 20                  # bodies per CommitLog batch of re-puts (one message may be more)


class TimerMessageError(ValueError):
    """A timer message the broker refuses (``status``: a PutMessageStatus name,
    WHEEL_TIMER_MSG_ILLEGAL / WHEEL_TIMER_NOT_ENABLE / WHEEL_TIMER_FLOW_CONTROL)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def java_string_hash(s: Optional[str]) -> int:
    """Java ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int; 0 for None."""
    if s is None:
        return 0
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def is_timer_message(props: dict) -> bool:
    """``HookUtils.checkIfTimerMessage``: a timer property, no delay level, not already converted."""
    if props.get(PROPERTY_DELAY) not in (None, "", "0"):
        return False
    if PROPERTY_TIMER_OUT_MS in props:
        return False
    return any(k in props for k in TIMER_PROPERTIES)


def transform_timer(topic: str, queue_id: int, props: dict, precision_ms: int, max_delay_sec: int,
                    now_ms: Optional[int] = None) -> tuple[str, int, dict]:
    """Where a timer message is stored (``HookUtils.transformTimerMessage``, SPEC.md §10.4).

    Returns ``(topic, queue_id, properties)``: ``rmq_sys_wheel_timer`` queue 0 with
    ``TIMER_OUT_MS`` / ``REAL_TOPIC`` / ``REAL_QID`` (and a ``UNIQ_KEY`` when the message has
    none) for a deliver time ahead; the message unchanged (delivered at once) for a time not
    ahead.  A delay level clears the timer properties (RocketMQ: the level wins).

    Raises
    ------
    TimerMessageError
        WHEEL_TIMER_MSG_ILLEGAL: a timer property that is not an integer, a negative delay, a
        deliver time more than ``max_delay_sec`` ahead, or ``TIMER_DEL_UNIQKEY`` (deletion is
        not supported).
    """
    if props.get(PROPERTY_DELAY) not in (None, "", "0"):
        if any(k in props for k in TIMER_PROPERTIES):
            props = {k: v for k, v in props.items() if k not in TIMER_PROPERTIES}
        return topic, queue_id, props
    if not is_timer_message(props) or topic == TIMER_TOPIC:
        return topic, queue_id, props
    now = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        if PROPERTY_TIMER_DELAY_SEC in props:
            d = int(props[PROPERTY_TIMER_DELAY_SEC])
            deliver = now + d * 1000
        elif PROPERTY_TIMER_DELAY_MS in props:
            d = int(props[PROPERTY_TIMER_DELAY_MS])
            deliver = now + d
        else:
            d = 0
            deliver = int(props[PROPERTY_TIMER_DELIVER_MS])
    except (TypeError, ValueError):
        raise TimerMessageError("WHEEL_TIMER_MSG_ILLEGAL",
                                "timer message illegal: TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC "
                                "must be an integer") from None
    if d < 0:
        raise TimerMessageError("WHEEL_TIMER_MSG_ILLEGAL", f"timer message illegal: negative delay {d}")
    if PROPERTY_TIMER_DEL_UNIQKEY in props:
        raise TimerMessageError("WHEEL_TIMER_MSG_ILLEGAL",
                                "timer message illegal: deleting a timer (TIMER_DEL_UNIQKEY) is not supported")
    if deliver <= now:
        return topic, queue_id, props                 # a time not ahead: delivered at once
    if deliver - now > max_delay_sec * 1000:
        raise TimerMessageError(
            "WHEEL_TIMER_MSG_ILLEGAL",
            f"timer message illegal, the delay time should not be bigger than the max delay "
            f"{max_delay_sec * 1000}ms (timerMaxDelaySec={max_delay_sec}); deliver time {deliver} is "
            f"{deliver - now} ms ahead")
    out_ms = deliver - precision_ms if deliver % precision_ms == 0 else deliver // precision_ms * precision_ms
    props = dict(props)
    props[PROPERTY_TIMER_OUT_MS] = str(out_ms)
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QID] = str(queue_id)
    if not props.get(PROPERTY_UNIQ_KEY):
        props[PROPERTY_UNIQ_KEY] = uuid.uuid4().hex.upper()
    if PROPERTY_TIMER_DELIVER_MS not in props:        # the exact time, for in-slot order and lateness
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver)
    return TIMER_TOPIC, TIMER_QUEUE_ID, props


@dataclass(frozen=True)
class Slot:
    """One TimerWheel slot (``Slot.java``); ``time_ms`` -1 when the slot holds another time."""
    time_ms: int
    first_pos: int
    last_pos: int
    num: int = 0
    magic: int = 0


EMPTY_SLOT = Slot(-1, -1, -1)


class TimerWheel:
    """The ``timerwheel`` file: ``2 x slots_total`` 32-byte slots, one MappedFile (``TimerWheel.java``).

    Raises
    ------
    StoreError
        An existing file of another length (another slot count), or it cannot be created.
    """

    def __init__(self, path: str, slots_total: int, precision_ms: int):
        self.path = path
        self.slots_total = slots_total
        self.precision_ms = precision_ms
        self.length = slots_total * 2 * SLOT_SIZE
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._mf = MappedFile(path, self.length, True)

    def slot_index(self, time_ms: int) -> int:
        return (time_ms // self.precision_ms) % (self.slots_total * 2)

    def get_raw_slot(self, time_ms: int) -> Slot:
        t, first, last, num, magic = _SLOT.unpack_from(self._mf, self.slot_index(time_ms) * SLOT_SIZE)
        return Slot(t * self.precision_ms, first, last, num, magic)

    def get_slot(self, time_ms: int) -> Slot:
        s = self.get_raw_slot(time_ms)
        if s.time_ms != time_ms // self.precision_ms * self.precision_ms:
            return EMPTY_SLOT
        return s

    def put_slot(self, time_ms: int, first_pos: int, last_pos: int, num: int, magic: int = 0) -> None:
        _SLOT.pack_into(self._mf, self.slot_index(time_ms) * SLOT_SIZE, time_ms // self.precision_ms,
                        first_pos, last_pos, num, magic)

    def revise_slot_last(self, time_ms: int, last_pos: int) -> None:
        """``reviseSlot(timeMs, IGNORE, lastPos, force=true)``: point the slot's chain at ``last_pos``."""
        s = self.get_raw_slot(time_ms)
        if s.time_ms != time_ms // self.precision_ms * self.precision_ms:
            self.put_slot(time_ms, last_pos, last_pos, 0)
        else:
            self.put_slot(time_ms, s.first_pos, last_pos, s.num, s.magic)

    def occupied(self, start_ms: int) -> list[Slot]:
        """Every slot holding a time from ``start_ms`` on, in time order (``getAllNum``'s walk)."""
        p = self.precision_ms
        start = start_ms // p
        out = []
        n = self.slots_total * 2
        first = start % n
        for idx, (t, f, last, num, magic) in enumerate(_SLOT.iter_unpack(memoryview(self._mf))):
            if t <= 0:
                continue
            i = (idx - first) % n
            if t == start + i:
                out.append(Slot(t * p, f, last, num, magic))
        out.sort(key=lambda s: s.time_ms)
        return out

    def flush(self) -> None:
        """msync the whole wheel (slots change anywhere; clean pages cost nothing) -- through
        MappedFile's journaled sync (RELIABILITY.md T1b)."""
        mf = self._mf
        mf.wrote_position = self.length
        mf.flushed_position = 0
        mf.flush(0)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._mf.close()


class TimerCheckpoint:
    """``config/timercheck`` (``TimerCheckpoint.java``: one OS page) plus rmq's delivery mark
    (module docstring)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.existed = os.path.exists(path)
        self._mf = MappedFile(path, CHECKPOINT_PAGE, True)
        (self.last_read_time_ms, self.last_timer_log_flush_pos, self.last_timer_queue_offset,
         self.master_timer_queue_offset, self.state_version, self.timestamp, self.counter) = \
            _CHECKPOINT.unpack_from(self._mf, 0)
        magic, mark = _MARK.unpack_from(self._mf, _MARK_AT)
        self.delivery_mark = mark if magic == RMQ_MARK_MAGIC else -1

    def flush(self) -> None:
        self.counter += 1
        self.timestamp = int(time.time() * 1000)
        _CHECKPOINT.pack_into(self._mf, 0, self.last_read_time_ms, self.last_timer_log_flush_pos,
                              self.last_timer_queue_offset, self.master_timer_queue_offset,
                              self.state_version, self.timestamp, self.counter)
        _MARK.pack_into(self._mf, _MARK_AT, RMQ_MARK_MAGIC, self.delivery_mark)
        self._mf.wrote_position = CHECKPOINT_PAGE
        self._mf.flushed_position = 0
        self._mf.flush(0)

    def close(self) -> None:
        self._mf.close()


class TimerLog:
    """``timerlog/``: a MappedFileQueue of 52-byte units (``TimerLog.java``)."""

    def __init__(self, path: str, file_size: int):
        self.file_size = file_size
        self.mfq = MappedFileQueue(path, file_size)

    def load(self) -> None:
        self.mfq.load()

    def append(self, unit: bytes) -> int:
        """Append one unit; returns its offset (bytes).  A file end too short gets a blank."""
        mfq = self.mfq
        mf = mfq.get_last_mapped_file(0, need_create=True)
        if len(unit) + MIN_BLANK_LEN > mf.file_size - mf.wrote_position:
            remaining = mf.file_size - mf.wrote_position
            mf.append(_BLANK.pack(remaining, 0, BLANK_MAGIC_CODE))
            mf.wrote_position = mf.file_size
            mf = mfq.get_last_mapped_file(0, need_create=True)
        pos = mf.file_from_offset + mf.wrote_position
        mf.append(unit)
        return pos

    def read_unit(self, pos: int) -> Optional[tuple]:
        mf = self.mfq.find_mapped_file_by_offset(pos)
        if mf is None:
            return None
        return _UNIT.unpack_from(mf, pos - mf.file_from_offset)

    def max_offset(self) -> int:
        return self.mfq.get_max_offset()

    def flush(self) -> None:
        self.mfq.flush(0)

    def recover(self, begin: int) -> int:
        """Find the end of the valid units from the file holding ``begin`` on and cut the rest
        (``recoverAndRevise`` with checkTimerLog).  Returns the end offset (bytes); the units
        seen are left in :attr:`recovered` as (offset, delayed time ms) pairs, to revise the wheel."""
        self.recovered: list[tuple[int, int]] = []
        files = self.mfq.files
        if not files:
            return 0
        idx = len(files) - 1
        while idx > 0 and files[idx].file_from_offset > begin:
            idx -= 1
        check = files[idx].file_from_offset
        for mf in files[idx:]:
            pos, full = 0, False
            while pos + MIN_BLANK_LEN <= mf.file_size:
                size, _prev, magic = _BLANK.unpack_from(mf, pos)
                if magic == BLANK_MAGIC_CODE:
                    full = True
                    break
                if size != UNIT_SIZE or (magic | 0xF) != 0xF or pos + UNIT_SIZE > mf.file_size:
                    break
                u = _UNIT.unpack_from(mf, pos)
                if not magic & MAGIC_DEFAULT or u[6] <= 0:
                    break                             # every unit has MAGIC_DEFAULT and a size: a torn one
                self.recovered.append((mf.file_from_offset + pos, u[3] + u[4]))
                pos += UNIT_SIZE
            mf.wrote_position = mf.file_size if full else pos
            check = mf.file_from_offset + mf.wrote_position
            if not full:
                break
        self.mfq.truncate_dirty_files(check)
        self.mfq.flushed_where = check
        return check

    def close(self) -> None:
        try:
            self.mfq.flush(0)
        finally:
            self.mfq.shutdown()


@dataclass
class _Due:
    """A slot being re-put (or warmed ahead of its time): its units collected from the chain, kept
    in a heap by exact deliver time, prepared ahead where possible, and what was re-put already."""
    time_ms: int
    mark: int                                         # CommitLog end when the slot was taken up
    head: int                                         # newest unit collected (the chain head then)
    cursor: int                                       # next older unit to collect; -1: all collected
    heap: list = field(default_factory=list)          # units not re-put: (deliver ms, pos, offsetPy, sizePy,
                                                      # magic, writeTime)
    fresh: list = field(default_factory=list)         # collected, not in the heap yet
    order: list = field(default_factory=list)         # every unit collected, in collection order (warm-up)
    prep_index: int = 0                               # order[:prep_index] prepared (or re-put)
    prepared: dict = field(default_factory=dict)      # pos -> (group key, element) or None (skip)
    done: set = field(default_factory=set)            # TimerLog offsets re-put (or skipped for good)

    def take_fresh(self) -> None:
        """Move the units collected since the last call into the heap."""
        if not self.fresh:
            return
        if self.heap:
            for u in self.fresh:
                heappush(self.heap, u)
        else:
            self.heap = self.fresh
            heapify(self.heap)
        self.fresh = []

    def next_due_ms(self) -> Optional[int]:
        return self.heap[0][0] if self.heap else None


class TimerMessageStore:
    """RocketMQ 5's TimerMessageStore on an rmq :class:`~rmq.store.message_store.MessageStore`.

    Parameters
    ----------
    store : MessageStore
        Its ``rmq_sys_wheel_timer`` queue is read (ConsumeQueue built by reput) and due messages
        are put back through :meth:`MessageStore.put_encoded`.
    on_put : callable, optional
        ``on_put(topic, queue_id, PutMessageResult)`` after every re-put (the broker wakes pulls
        and counts it).

    Settings come from ``store.config`` (MessageStoreConfig 5.x names): ``timer_precision_ms``,
    ``timer_roll_window_slot``, ``timer_flush_interval_ms``, ``mapped_file_size_timer_log``,
    ``timer_max_delay_sec``, ``timer_congest_num_each_slot``.
    """

    def __init__(self, store, on_put: Optional[Callable] = None, slots_total: int = SLOTS_TOTAL):
        cfg = store.config
        self.store = store
        self.on_put = on_put
        self.precision_ms = cfg.timer_precision_ms
        self.slots_total = slots_total
        rw = cfg.timer_roll_window_slot
        self.roll_window_slots = slots_total - TIMER_BLANK_SLOTS if (rw > slots_total - TIMER_BLANK_SLOTS or rw < 2) \
            else rw
        root = cfg.store_path_root_dir
        self.wheel = TimerWheel(os.path.join(root, "timerwheel"), slots_total, self.precision_ms)
        self.timer_log = TimerLog(os.path.join(root, "timerlog"), cfg.mapped_file_size_timer_log)
        self.checkpoint = TimerCheckpoint(os.path.join(root, "config", CHECKPOINT_FILE))
        self.curr_read_time_ms = 0
        self.curr_write_time_ms = 0
        self.curr_queue_offset = 0
        self._due: Optional[_Due] = None              # the slot being re-put
        self._warm: Optional[_Due] = None             # the next slot, prepared ahead of its time
        self._delivered: set = set()                  # keys delivered after the checkpoint (recovery)
        self._redo_until: tuple = (0, 0)              # (read time, queue offset) the redo ends at
        self._redo_mark: Optional[int] = None         # the CommitLog offset the skip set was read from
        self._last_flush = 0.0
        self.stats = {"enqueued": 0, "delivered": 0, "rolled": 0, "skippedDuplicates": 0, "missing": 0,
                      "putFailures": 0}
        self.closed = False

    # -- start / recovery ------------------------------------------------------------------
    def load(self) -> None:
        """Map the files and recover (``TimerMessageStore.load`` + ``recover``)."""
        self.timer_log.load()
        ck = self.checkpoint
        lastfile = self.timer_log.mfq.files[-1] if self.timer_log.mfq.files else None
        begin = max(0, ck.last_timer_log_flush_pos - (lastfile.file_size if lastfile is not None else 0))
        end = self.timer_log.recover(begin)
        for pos, delayed in self.timer_log.recovered:
            self.wheel.revise_slot_last(delayed, pos)
        self.timer_log.recovered = []
        # queue offset: past the last unit's message, never behind the checkpoint (which the flushed
        # TimerLog and the deliveries before the mark cover)
        q = ck.last_timer_queue_offset
        if end >= UNIT_SIZE:
            u = self.timer_log.read_unit(self._last_unit_pos(end))
            if u is not None:
                m = self._message(u[5])
                if m is not None and m.topic == TIMER_TOPIC:
                    q = max(q, m.queue_offset + 1)
        lo = self.store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        hi = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        self.curr_queue_offset = min(max(q, lo), max(hi, lo))
        now = self._floor(int(time.time() * 1000))
        self.curr_read_time_ms = max(ck.last_read_time_ms,
                                     now - self.slots_total * self.precision_ms + TIMER_BLANK_SLOTS * self.precision_ms)
        self.curr_write_time_ms = now
        # what was delivered after the checkpoint: skipped while the redo repeats it
        if not ck.existed:
            self.curr_read_time_ms = now                  # a new wheel: nothing before now to walk
        if ck.delivery_mark >= 0:
            mark = ck.delivery_mark
        elif ck.existed:
            mark = self.store.get_min_phy_offset()        # a checkpoint without rmq's mark
        else:
            # no checkpoint but timer records (a promoted slave, lost files): the queue is enqueued
            # from its start, so skip what another broker already delivered -- every delivery of a
            # timer lies after that timer's own record
            mark = self._first_timer_phy_offset(lo, hi)
        if mark >= 0:
            self._delivered = self._scan_deliveries(mark)
            self._redo_mark = mark
        self._redo_until = (now + self.precision_ms, hi)
        self.flush()
        log.info("timer store recovered: read time %d, queue offset %d of %d, TimerLog end %d, "
                 "%d deliveries after the checkpoint", self.curr_read_time_ms, self.curr_queue_offset, hi, end,
                 len(self._delivered))

    def _first_timer_phy_offset(self, lo: int, hi: int) -> int:
        """CommitLog offset of the first record still in the timer queue; -1 when it is empty."""
        if hi <= lo:
            return -1
        res = self.store.get_messages(TIMER_GROUP, TIMER_TOPIC, TIMER_QUEUE_ID, lo, 1)
        return res.messages()[0].commitlog_offset if res.message_count else self.store.get_min_phy_offset()

    def _last_unit_pos(self, end: int) -> int:
        fs = self.timer_log.file_size
        pos = end - UNIT_SIZE
        if end % fs == 0 and end > 0:
            # the unit before a file end: the last whole unit of the previous file
            base = end - fs
            pos = base + ((fs - MIN_BLANK_LEN) // UNIT_SIZE - 1) * UNIT_SIZE
            u = self.timer_log.read_unit(pos)
            if u is None or u[0] != UNIT_SIZE:
                pos = end - UNIT_SIZE
        return pos

    def _scan_deliveries(self, start: int) -> set:
        """Delivery keys of the records with TIMER_DEQUEUE_MS in the CommitLog from ``start``."""
        store = self.store
        out: set = set()
        size = store.config.mapped_file_size_commit_log
        end = store.get_max_phy_offset()
        at = max(start, store.get_min_phy_offset())
        while at < end:
            try:
                m = store.look_message_by_offset(at)
            except Exception:  # noqa: BLE001 - a torn or blank record ends this file
                m = None
            if m is None:
                at = (at // size + 1) * size
                continue
            props = m.properties
            if PROPERTY_TIMER_DEQUEUE_MS in props:
                out.add(_delivery_key(props, m.topic == TIMER_TOPIC))
            at += m.store_size
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _floor(self, ms: int) -> int:
        return ms // self.precision_ms * self.precision_ms

    def _message(self, phy: int):
        try:
            return self.store.look_message_by_offset(phy)
        except Exception:  # noqa: BLE001 - expired, torn or cut: the caller counts it missing
            return None

    def is_reject(self, deliver_ms: int) -> bool:
        """Flow control (``isReject``): a slot past ``timerCongestNumEachSlot`` refuses more."""
        limit = self.store.config.timer_congest_num_each_slot
        num = self.wheel.get_slot(deliver_ms).num
        if num <= limit:
            return False
        return True

    # -- the work ---------------------------------------------------------------------------
    def run(self, now_ms: Optional[int] = None) -> bool:
        """One slice: enqueue new timer messages, re-put due ones, flush when due.

        Returns True when work is left (call again soon), False when idle.
        """
        if self.closed:
            return False
        now = int(time.time() * 1000) if now_ms is None else now_ms
        w = self._floor(now)
        if w > self.curr_write_time_ms:
            self.curr_write_time_ms = w
        more = self._enqueue(ENQUEUE_SLICE)
        more = self._dequeue(DEQUEUE_SLICE, now) or more
        if self._redo_mark is not None and (self.curr_read_time_ms >= self._redo_until[0]
                                            and self.curr_queue_offset >= self._redo_until[1]):
            self._delivered = set()                   # the redo is over
            self._redo_mark = None
        if time.monotonic() - self._last_flush >= self.store.config.timer_flush_interval_ms / 1000.0:
            self.flush()
        return more

    def _enqueue(self, budget: int) -> bool:
        store = self.store
        hi = store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        lo = store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        if self.curr_queue_offset < lo:
            log.warning("timer queue offset %d is below the queue's min %d (expired)", self.curr_queue_offset, lo)
            self.curr_queue_offset = lo
        done = 0
        while self.curr_queue_offset < hi and done < budget:
            res = store.get_messages(TIMER_GROUP, TIMER_TOPIC, TIMER_QUEUE_ID, self.curr_queue_offset,
                                     min(READ_BATCH, budget - done))
            if not res.message_count:
                if res.next_begin_offset > self.curr_queue_offset and res.status in (
                        GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.NO_MATCHED_MESSAGE,
                        GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.OFFSET_FOUND_NULL):
                    self.curr_queue_offset = res.next_begin_offset
                    continue
                break
            for m in res.messages():
                if not self._enqueue_one(m):
                    return True                        # a refused re-put: try again later
                self.curr_queue_offset = m.queue_offset + 1
                done += 1
            self.curr_queue_offset = max(self.curr_queue_offset, res.next_begin_offset)
        return self.curr_queue_offset < hi

    def _enqueue_one(self, m) -> bool:
        props = m.properties
        try:
            delayed = int(props[PROPERTY_TIMER_OUT_MS])
        except (KeyError, ValueError):
            log.error("timer message at %d has no valid TIMER_OUT_MS: dropped", m.commitlog_offset)
            return True
        exact = _exact_deliver_ms(props, m.store_timestamp, delayed)
        if delayed < self.curr_write_time_ms:
            # already due (a late enqueue, a restart): straight to the real topic
            unit = (exact, -1, m.commitlog_offset, m.store_size, MAGIC_DEFAULT, 2 ** 63 - 1)
            _done, blocked = self._deliver_units([unit], [m])
            return not blocked
        self._append_unit(m.commitlog_offset, m.store_size, delayed, exact, props.get(PROPERTY_REAL_TOPIC))
        self.stats["enqueued"] += 1
        return True

    def _append_unit(self, offset_py: int, size_py: int, delayed: int, exact: int, real_topic: Optional[str]) -> None:
        write_time = self.curr_write_time_ms
        magic = MAGIC_DEFAULT
        window = self.roll_window_slots * self.precision_ms
        if delayed - write_time >= window:
            magic |= MAGIC_ROLL
            if delayed - write_time - window < self.roll_window_slots // 3 * self.precision_ms:
                delayed = write_time + self.roll_window_slots // 2 * self.precision_ms
            else:
                delayed = write_time + window
        slot = self.wheel.get_slot(delayed)
        unit = _UNIT.pack(UNIT_SIZE, slot.last_pos, magic, write_time, delayed - write_time, offset_py, size_py,
                          java_string_hash(real_topic), exact)
        pos = self.timer_log.append(unit)
        self.wheel.put_slot(delayed, pos if slot.first_pos == -1 else slot.first_pos, pos, slot.num + 1, slot.magic)

    def _dequeue(self, budget: int, now_ms: int) -> bool:
        """Re-put what is due: every unit of a slot the write time has passed (deliver-time order),
        and the units of the slot filling now whose exact deliver time has come.  With budget left,
        prepare the rest of that slot and warm the next one.  True: work left now."""
        done = 0
        p = self.precision_ms
        while done < budget:
            due = self._due
            if due is None:
                t = self.curr_read_time_ms
                w = self._warm
                if w is not None and w.time_ms == t:
                    due, self._warm = w, None         # prepared ahead: mostly appends are left
                else:
                    slot = self.wheel.get_slot(t)
                    if slot.time_ms == -1:
                        if t >= self.curr_write_time_ms:
                            return self._warm_next(budget - done, t + p)
                        self.curr_read_time_ms += p
                        continue
                    due = _Due(t, self.store.get_max_phy_offset(), slot.last_pos, slot.last_pos)
                self._due = due
            filling = due.time_ms >= self.curr_write_time_ms
            # units appended to the slot since the last look, and (budgeted while it fills) older ones
            complete = self._collect(due, self.wheel.get_slot(due.time_ms).last_pos,
                                     budget - done if filling else None)
            due.take_fresh()
            heap = due.heap
            limit = now_ms if filling else None
            batch = []
            room = max(1, budget - done)
            while heap and len(batch) < room and (limit is None or heap[0][0] <= limit):
                batch.append(heappop(heap))
            if batch:
                ok, blocked = self._deliver_units(batch, prepared=due.prepared)
                for k, u in enumerate(batch):
                    if k in ok:
                        due.prepared.pop(u[1], None)
                        due.done.add(u[1])
                    else:
                        heappush(heap, u)
                if blocked:                           # refused for now: the rest later
                    return True
                done += len(batch)
            if not filling:
                if complete and not heap:
                    self._due = None
                    self.curr_read_time_ms = due.time_ms + p
                continue
            if not complete or (heap and heap[0][0] <= now_ms):
                return True                           # more to collect or due now: the next slice
            # nothing more due in the filling slot: prepare its units, then warm the next slot
            left = budget - done
            more = self._prepare_ahead(due, left)
            return self._warm_next(left, due.time_ms + p) or more
        return True

    def next_due_ms(self) -> Optional[int]:
        """Exact deliver time (epoch ms) of the next unit of the slot filling now, None when it has
        none left (the broker schedules a slice for then)."""
        due = self._due
        return due.next_due_ms() if due is not None else None

    def _collect(self, due: _Due, head: int, budget: Optional[int]) -> bool:
        """Add the slot's units not collected yet: those appended since ``due.head`` (all of them)
        and older ones from ``due.cursor`` (``budget`` of them; None: all).  True when complete."""
        tl = self.timer_log
        pos = head
        while pos != due.head and pos != -1:
            u = tl.read_unit(pos)
            if u is None or u[0] != UNIT_SIZE:
                break
            t = _unit_tuple(pos, u)
            due.fresh.append(t)
            due.order.append(t)
            pos = u[1]
        due.head = head
        n = 0
        while due.cursor != -1 and (budget is None or n < budget):
            u = tl.read_unit(due.cursor)
            if u is None or u[0] != UNIT_SIZE:
                due.cursor = -1
                break
            t = _unit_tuple(due.cursor, u)
            due.fresh.append(t)
            due.order.append(t)
            due.cursor = u[1]
            n += 1
        return due.cursor == -1

    def _prepare_ahead(self, due: _Due, budget: int) -> bool:
        """Prepare up to ``budget`` collected units of ``due`` not yet prepared (WARM_MAX_PREPARED in
        all).  True when some are left."""
        order, n = due.order, 0
        while due.prep_index < len(order) and n < budget and len(due.prepared) < WARM_MAX_PREPARED:
            u = order[due.prep_index]
            due.prep_index += 1
            if u[1] in due.done or u[1] in due.prepared:
                continue
            due.prepared[u[1]] = self._prepare(u, None)
            n += 1
        return due.prep_index < len(order) and len(due.prepared) < WARM_MAX_PREPARED

    def _warm_next(self, budget: int, start: int) -> bool:
        """Warm-up (RocketMQ's TimerDequeueWarmService, taken further): collect and prepare up to
        ``budget`` units of the next non-empty slot from ``start`` within WARM_AHEAD_MS, so that
        only the CommitLog appends are left when it comes due.  True: work left."""
        if budget <= 0:
            return True
        p = self.precision_ms
        t = start
        horizon = self.curr_write_time_ms + max(WARM_AHEAD_MS, 2 * p)
        while t <= horizon:
            slot = self.wheel.get_slot(t)
            if slot.time_ms != -1:
                break
            t += p
        else:
            return False
        w = self._warm
        if w is None or w.time_ms != t:
            w = self._warm = _Due(t, self.store.get_max_phy_offset(), slot.last_pos, slot.last_pos)
        complete = self._collect(w, slot.last_pos, budget)
        return self._prepare_ahead(w, budget) or not complete

    def _read_chain(self, last_pos: int) -> list:
        units = []
        pos = last_pos
        tl = self.timer_log
        while pos != -1:
            u = tl.read_unit(pos)
            if u is None or u[0] != UNIT_SIZE:
                break
            units.append(_unit_tuple(pos, u))
            pos = u[1]
        units.sort()
        return units

    def _prepare(self, unit: tuple, m) -> Optional[tuple]:
        """A re-put ready to append: (group key, (body, properties, flag, born time, rolled)), or None
        to skip it for good (gone, already delivered before a crash, unreadable)."""
        _exact, _pos, offset_py, _size_py, magic, write_time = unit
        if m is None:
            m = self._message(offset_py)
        if m is None:
            self.stats["missing"] += 1
            log.warning("timer message at CommitLog offset %d is gone (expired?): not delivered", offset_py)
            return None
        props = dict(m.properties)
        roll = bool(magic & MAGIC_ROLL)
        props.pop("__CRC32#", None)
        props.pop(PROPERTY_TIMER_DEQUEUE_MS, None)            # set when appended
        props[PROPERTY_TIMER_ENQUEUE_MS] = str(write_time)
        if roll:
            props[PROPERTY_TIMER_ROLL_TIMES] = str(int(props.get(PROPERTY_TIMER_ROLL_TIMES, "0") or 0) + 1)
        if self._delivered and _delivery_key(props, roll) in self._delivered:
            self.stats["skippedDuplicates"] += 1
            return None
        if roll:
            topic, qid = TIMER_TOPIC, TIMER_QUEUE_ID
        else:
            topic = props.pop(PROPERTY_REAL_TOPIC, None)
            qid_s = props.pop(PROPERTY_REAL_QID, None)
            if not topic or qid_s is None or not qid_s.isdigit():
                log.error("timer message at %d has no REAL_TOPIC / REAL_QID: dropped", offset_py)
                return None
            qid = int(qid_s)
        props["WAIT"] = "false"
        try:
            pb = _cl.encode_properties(props)
        except ValueError as e:
            log.error("timer message at %d cannot be re-encoded (%s): dropped", offset_py, e)
            return None
        return ((topic, qid, m.born_host, m.sys_flag & ~TRANSACTION_TYPE_MASK, m.reconsume_times),
                (m.body, pb, m.flag, m.born_timestamp, roll))

    def _deliver_units(self, units: list, msgs: Optional[list] = None,
                       prepared: Optional[dict] = None) -> tuple[set, bool]:
        """Re-put timers: each to its real topic, or (rolled) back to the timer queue, in CommitLog
        batches per (topic, queue, born host, sysflag, reconsume times) that keep each message's
        born time; ``TIMER_DEQUEUE_MS`` is the time of the append.

        Returns (indexes of ``units`` done -- re-put, or skipped for good --, blocked): blocked when
        the store refused a batch for now (retry those later)."""
        store = self.store
        done: set = set()
        groups: dict = {}
        for k, unit in enumerate(units):
            p = prepared.get(unit[1], False) if prepared is not None else False
            if p is False:
                p = self._prepare(unit, msgs[k] if msgs is not None else None)
            if p is None:
                done.add(k)
                continue
            groups.setdefault(p[0], []).append((k, *p[1]))
        for (topic, qid, born_host, sys_flag, reconsume), elems in groups.items():
            start = 0
            while start < len(elems):
                size, end = 0, start
                while end < len(elems) and (end == start or size + len(elems[end][1]) <= REPUT_BATCH_BYTES):
                    size += len(elems[end][1]) + len(elems[end][2])
                    end += 1
                chunk = elems[start:end]
                batch = _cl.encode_batch([(body, pb, flag) for _k, body, pb, flag, _b, _r in chunk])
                borns = array("q", [b for _k, _body, _pb, _f, b, _r in chunk])
                res = store.put_encoded(topic, qid, batch, {PROPERTY_TIMER_DEQUEUE_MS: str(int(time.time() * 1000))},
                                        sys_flag, borns[0], born_host, reconsume, len(chunk), born_timestamps=borns)
                if not res.ok:
                    self.stats["putFailures"] += 1
                    if res.status in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
                        log.error("%d timer messages refused for good (%s %s): dropped", len(chunk), res.status,
                                  res.remark)
                        done.update(e[0] for e in chunk)
                        start = end
                        continue
                    log.warning("%d timer messages not re-put yet: %s %s", len(chunk), res.status, res.remark)
                    return done, True
                done.update(e[0] for e in chunk)
                n_roll = sum(1 for e in chunk if e[5])
                self.stats["rolled"] += n_roll
                self.stats["delivered"] += len(chunk) - n_roll
                if self.on_put is not None:
                    self.on_put(topic, qid, res)
                start = end
        return done, False

    # -- durability --------------------------------------------------------------------------
    def flush(self) -> None:
        """Flush TimerLog and wheel, then write the checkpoint (``TimerFlushService``)."""
        if self.closed:
            return
        self._last_flush = time.monotonic()
        self.timer_log.flush()
        self.wheel.flush()
        ck = self.checkpoint
        ck.last_timer_log_flush_pos = self.timer_log.mfq.flushed_where
        ck.last_read_time_ms = self._due.time_ms if self._due is not None else self.curr_read_time_ms
        ck.last_timer_queue_offset = self.curr_queue_offset
        ck.master_timer_queue_offset = self.curr_queue_offset
        ck.delivery_mark = self._due.mark if self._due is not None else self.store.get_max_phy_offset()
        if self._redo_mark is not None:
            # a redo in progress: what it skips must still be found after another crash
            ck.delivery_mark = min(ck.delivery_mark, self._redo_mark)
        ck.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            self.timer_log.close()
            self.wheel.close()
            self.checkpoint.close()

    # -- admin -------------------------------------------------------------------------------
    def pending(self, max_rows: int = 100) -> dict:
        """Timers not yet re-put: totals and the first ``max_rows`` units in time order.

        Returns ``{"total": n, "slots": k, "readTimeMs", "writeTimeMs", "queueOffset",
        "queueBehind", "rows": [{"deliverTimeMs", "slotTimeMs", "topic", "queueId", "msgId",
        "rolled"}]}``.
        """
        slots = self.wheel.occupied(self.curr_read_time_ms)
        total = sum(s.num for s in slots)
        if self._due is not None:
            total -= len(self._due.done)
        rows = []
        for s in slots:
            if len(rows) >= max_rows:
                break
            units = self._read_chain(s.last_pos)
            if self._due is not None and s.time_ms == self._due.time_ms:
                units = [u for u in units if u[1] not in self._due.done]
            for u in units:
                if len(rows) >= max_rows:
                    break
                m = self._message(u[2])
                props = m.properties if m is not None else {}
                rows.append({"deliverTimeMs": u[0], "slotTimeMs": s.time_ms,
                             "topic": props.get(PROPERTY_REAL_TOPIC, ""),
                             "queueId": int(props.get(PROPERTY_REAL_QID, "-1") or -1),
                             "msgId": props.get(PROPERTY_UNIQ_KEY, ""),
                             "rolled": bool(u[4] & MAGIC_ROLL)})
        hi = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        return {"total": total, "slots": len(slots), "readTimeMs": self.curr_read_time_ms,
                "writeTimeMs": self.curr_write_time_ms, "queueOffset": self.curr_queue_offset,
                "queueBehind": max(0, hi - self.curr_queue_offset), "precisionMs": self.precision_ms,
                "rows": rows, "stats": dict(self.stats)}


def _exact_deliver_ms(props: dict, store_ts: int, fallback: int) -> int:
    v = props.get(PROPERTY_TIMER_DELIVER_MS)
    if v is not None:
        try:
            return int(v)
        except ValueError:
            pass
    for name, mult in ((PROPERTY_TIMER_DELAY_MS, 1), (PROPERTY_TIMER_DELAY_SEC, 1000)):
        v = props.get(name)
        if v is not None:
            try:
                return store_ts + int(v) * mult
            except ValueError:
                pass
    return fallback + 1


def _unit_tuple(pos: int, u: tuple) -> tuple:
    """(deliver ms, pos, offsetPy, sizePy, magic, writeTime) of a TimerLog unit read at ``pos``."""
    _size, _prev, magic, write_time, delay, offset_py, size_py, _h, exact = u
    return (exact if exact > 0 else write_time + delay, pos, offset_py, size_py, magic, write_time)


def _delivery_key(props: dict, rolled: bool) -> tuple:
    return (props.get(PROPERTY_UNIQ_KEY, ""), props.get(PROPERTY_TIMER_ROLL_TIMES, "0"), rolled)
