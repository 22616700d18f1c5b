"""ProcessQueue: a push consumer's in-flight messages of one queue (RocketMQ ``ProcessQueue``, SPEC.md §15.2).

Messages enter in queue-offset order as pulls return them (``put_message``) and
leave when processed (``remove_message``).  The offset a consumer may commit is
the **lowest offset still in flight**, or ``max + 1`` when nothing is: so a
crash between processing and commit redelivers what was not finished, never
skips it (at-least-once).

Orderly consumption takes messages out in order (``take_messages``) into a
"consuming" map; ``commit`` returns the offset after the batch, and
``make_message_to_consume_again`` puts a failed batch back in front.

Flow control: a pull held back because the queue is full (``pull_threshold_for_queue``)
registers ``notify_when_below``; the :meth:`remove_message` or :meth:`commit` that brings the
count down to the threshold calls it (once, outside the lock) to send the pull at once.

``consume_lock`` serialises an orderly consume step against the rebalance that
takes the queue away (which waits for the step, commits, then unlocks the queue
on the broker).  ``locked`` / ``last_lock_timestamp`` mirror the broker-side
queue lock (LOCK_BATCH_MQ); the client treats its lock as expired after
``REBALANCE_LOCK_MAX_LIVE_TIME_MS`` (30 s) without renewal.

The in-flight map (``msg_tree_map``, queue offset -> message, in arrival order, which is queue
order) is a plain dict: a pull result's 1,024 messages go in and out of it in C
(:func:`rmq._core.consume.tree_put` / ``tree_remove``), and a dict costs about 60 % of an
OrderedDict there.  The first orderly operation (:meth:`take_messages`,
:meth:`make_message_to_consume_again`) turns it into an OrderedDict, which takes and puts back
at its front in O(1).

Concurrency: thread-safe; one internal lock guards the maps and counters
(never held while calling out).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

from rmq._core.consume import tree_put, tree_remove

REBALANCE_LOCK_MAX_LIVE_TIME_MS = 30_000     # rocketmq.client.rebalance.lockMaxLiveTime
PULL_MAX_IDLE_TIME_MS = 120_000              # rocketmq.client.pull.pullMaxIdleTime

__all__ = ["ProcessQueue", "REBALANCE_LOCK_MAX_LIVE_TIME_MS", "PULL_MAX_IDLE_TIME_MS"]


class ProcessQueue:
    """In-flight messages of one MessageQueue (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.msg_tree_map: dict = {}       # queue_offset -> MessageExt, ascending (module docstring)
        self.consuming_msg_orderly: "OrderedDict[int, object]" = OrderedDict()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = 0
        self.consuming = False
        self.dropped = False
        self.locked = False
        self.last_lock_timestamp = time.monotonic()
        self.last_pull_timestamp = time.monotonic()
        self.last_consume_timestamp = time.monotonic()
        self.try_unlock_times = 0
        self.consume_lock = threading.Lock()
        self._below: Optional[tuple] = None      # (count, callback) of notify_when_below

    # -- both modes ------------------------------------------------------------------------------
    def put_message(self, msgs: list) -> bool:
        """Add pulled messages (ascending offsets); True when an orderly consume task must be
        started (messages waiting and no task running)."""
        with self._lock:
            m = self.msg_tree_map
            added, size, hi = tree_put(m, msgs)
            self.msg_count += added
            self.msg_size += size
            if hi > self.queue_offset_max:
                self.queue_offset_max = hi
            dispatch = False
            if m and not self.consuming:
                dispatch = True
                self.consuming = True
            return dispatch

    def remove_message(self, msgs: list) -> int:
        """Drop processed messages; the offset to commit: the lowest offset still in flight,
        else ``queue_offset_max + 1``; -1 when nothing was held."""
        with self._lock:
            m = self.msg_tree_map
            if not m:
                return -1
            result = self.queue_offset_max + 1
            removed, size = tree_remove(m, msgs)
            self.msg_count -= removed
            self.msg_size -= size
            if m:
                result = next(iter(m))
            self.last_consume_timestamp = time.monotonic()
            below = self._take_below()
        if below is not None:
            below()
        return result

    def notify_when_below(self, count: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, as soon as the queue holds ``count`` messages or fewer: at
        once (in this thread) when it already does, else in the thread whose
        :meth:`remove_message` or :meth:`commit` brings it there.  Replaces a callback not called
        yet.  The push consumers' flow control: a pull held back because the queue was full
        goes out when the consume side has made room, not a fixed delay later."""
        with self._lock:
            self._below = (count, callback)
            below = self._take_below()
        if below is not None:
            below()

    def _take_below(self) -> Optional[Callable[[], None]]:
        """Under ``_lock``: the notify_when_below callback when it is due (forgotten here)."""
        b = self._below
        if b is None or self.msg_count > b[0]:
            return None
        self._below = None
        return b[1]

    def max_span(self) -> int:
        """Offset distance between the first and the last message held (flow control)."""
        with self._lock:
            m = self.msg_tree_map
            if not m:
                return 0
            return next(reversed(m)) - next(iter(m))

    def has_temp_message(self) -> bool:
        with self._lock:
            return bool(self.msg_tree_map)

    def first_offset(self) -> int:
        with self._lock:
            return next(iter(self.msg_tree_map)) if self.msg_tree_map else -1

    def clear(self) -> None:
        with self._lock:
            self.msg_tree_map.clear()
            self.consuming_msg_orderly.clear()
            self.msg_count = self.msg_size = 0
            self.queue_offset_max = 0

    # -- orderly ------------------------------------------------------------------------------------
    def take_messages(self, batch_size: int) -> list:
        """Move up to ``batch_size`` messages, in order, into the consuming map; [] (and the
        consuming flag cleared) when none is left."""
        with self._lock:
            out = []
            m = self._ordered()
            while m and len(out) < batch_size:
                off, msg = m.popitem(last=False)
                self.consuming_msg_orderly[off] = msg
                out.append(msg)
            if not out:
                self.consuming = False
            self.last_consume_timestamp = time.monotonic()
            return out

    def commit(self) -> int:
        """Forget the consuming map; the offset after its last message (-1 when empty)."""
        with self._lock:
            c = self.consuming_msg_orderly
            if not c:
                return -1
            offset = next(reversed(c)) + 1
            self.msg_count -= len(c)
            for msg in c.values():
                self.msg_size -= len(msg.body) if msg.body is not None else 0
            c.clear()
            below = self._take_below()
        if below is not None:
            below()
        return offset

    def make_message_to_consume_again(self, msgs: list) -> None:
        """Put a failed orderly batch back in front of the queue."""
        with self._lock:
            m = self._ordered()
            for msg in sorted(msgs, key=lambda x: x.queue_offset, reverse=True):
                self.consuming_msg_orderly.pop(msg.queue_offset, None)
                m[msg.queue_offset] = msg
                m.move_to_end(msg.queue_offset, last=False)

    def _ordered(self) -> OrderedDict:
        """Under ``_lock``: the in-flight map as an OrderedDict (made one on the first orderly use)."""
        m = self.msg_tree_map
        if type(m) is not OrderedDict:
            m = self.msg_tree_map = OrderedDict(m)
        return m

    # -- liveness -------------------------------------------------------------------------------------
    def is_lock_expired(self, now: Optional[float] = None) -> bool:
        return ((now or time.monotonic()) - self.last_lock_timestamp) * 1000 > REBALANCE_LOCK_MAX_LIVE_TIME_MS

    def is_pull_expired(self, now: Optional[float] = None) -> bool:
        return ((now or time.monotonic()) - self.last_pull_timestamp) * 1000 > PULL_MAX_IDLE_TIME_MS

    def __repr__(self) -> str:
        return (f"ProcessQueue(count={self.msg_count}, max={self.queue_offset_max}, dropped={self.dropped}, "
                f"locked={self.locked}, consuming={self.consuming})")
