"""Timer messages on the broker: the TimerMessageStore's work on the broker's thread (SPEC.md §10.4).

The store side (TimerLog, timerwheel, timercheck, enqueue / dequeue / recovery) is
:mod:`rmq.store.timer`; this service runs it on a master: it waits, as POP's and the transaction
service's recoveries do, until reput has dispatched every record written before start (the timer
queue's ConsumeQueue is complete), loads the files, then runs one slice every ``tick_ms`` (and
back to back while a crowded slot is being re-put, with the broker serving requests in between).
A slave keeps no timer state: the timer records replicate as any CommitLog record, and a promoted
slave starts the service from its own (replicated) timer queue.

``GET_TIMER_PENDING`` (rmq request 9022, admin) answers ``rmq admin timers``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Optional

from rmq.actors.actor import Reply
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.protocol import Frame, ResponseCode, field_int, pack_body
from rmq.store.timer import TIMER_TOPIC, TimerMessageStore

if TYPE_CHECKING:      # pragma: no cover
    from rmq.actors.broker import BrokerActor

log = logging.getLogger("rmq.broker.timer")

TICK_MS_MAX = 50          # slice period when idle: a due slot starts at most this late
SLICE_PAUSE_MS = 1        # between slices of a crowded slot: sends and pulls are served in between
MAX_ROWS_LIMIT = 10_000   # GET_TIMER_PENDING rows


class TimerService:
    """Runs :class:`~rmq.store.timer.TimerMessageStore` on the broker's thread (masters only)."""

    def __init__(self, broker: "BrokerActor"):
        self.b = broker
        cfg = broker.store_config
        self.enabled = bool(cfg.timer_wheel_enable)
        self.tick_ms = max(5, min(TICK_MS_MAX, cfg.timer_precision_ms // 20))
        self.timer_store: Optional[TimerMessageStore] = None
        self.ready = False
        self._recover_target = -1
        self._followup = False

    def start(self) -> None:
        """Start (a master) or restart after a promotion; a slave keeps no timer state."""
        if not self.enabled or self.b.role == "SLAVE":
            return
        tcm = self.b.store.topic_config_manager
        if tcm.select_topic_config(TIMER_TOPIC) is None:
            tcm.update_topic_config(tcm.new_topic_config(TIMER_TOPIC, 1, 1, PERM_READ | PERM_WRITE))
        self.close()
        self.ready = False
        self._recover_target = self.b.store.get_max_phy_offset()
        self.maybe_recover()

    def maybe_recover(self) -> None:
        if self.ready or not self.enabled or self._recover_target < 0 \
                or self.b.dispatched_offset < self._recover_target:
            return
        self.ready = True
        self._open_if_used()

    def _open_if_used(self) -> None:
        """Load the timer store -- only once a timer was ever sent (its files exist, or the timer
        queue holds a record): a broker without timers keeps no 40 MB wheel."""
        store = self.b.store
        if not os.path.exists(os.path.join(store.config.store_path_root_dir, "timerwheel")) \
                and store.get_max_offset_in_queue(TIMER_TOPIC, 0) <= 0:
            return
        t0 = time.monotonic()
        ts = TimerMessageStore(store, on_put=self._on_put)
        ts.load()
        self.timer_store = ts
        log.info("timer store ready in %.0f ms", (time.monotonic() - t0) * 1000.0)

    def _on_put(self, topic: str, queue_id: int, res) -> None:
        b = self.b
        b.pull_processor.note_append(topic, queue_id, res)
        b.stats["putMessageTotal"] += res.append.msg_num
        b.stats["putBytesTotal"] += res.append.wrote_bytes

    def tick(self) -> None:
        """One slice; a follow-up right after when work is left (a crowded slot, a backlog)."""
        if not self.ready or self.b.role == "SLAVE":
            return
        if self.timer_store is None:
            self._open_if_used()
            if self.timer_store is None:
                return
        ts = self.timer_store
        try:
            more = ts.run()
        except Exception:  # noqa: BLE001 - never kill the broker loop; the next tick retries
            log.exception("timer slice failed")
            more = False
        if self._followup:
            return
        if more:
            self._followup = True
            self.b.add_timer(SLICE_PAUSE_MS, self._follow, repeat=False)
            return
        # the filling slot's next timer: a slice at its exact deliver time, not at the next tick
        nxt = ts.next_due_ms()
        if nxt is not None:
            wait_ms = nxt - time.time() * 1000.0
            if wait_ms < self.tick_ms:
                self._followup = True
                self.b.add_timer(max(SLICE_PAUSE_MS, wait_ms), self._follow, repeat=False)

    def _follow(self) -> None:
        self._followup = False
        self.tick()

    def pending(self, max_rows: int) -> dict:
        if self.timer_store is None:
            return {"total": 0, "slots": 0, "rows": [], "ready": self.ready, "enabled": self.enabled,
                    "role": self.b.role}
        out = self.timer_store.pending(max_rows)
        out.update(ready=self.ready, enabled=self.enabled, role=self.b.role)
        return out

    def on_pending(self, frame: Frame, reply: Reply) -> Frame:
        """GET_TIMER_PENDING (rmq): :meth:`pending` as a msgpack body; ``maxRows`` (1..10 000, 100)."""
        if not self.enabled:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  "accurate timer message is not enabled, timerWheelEnable is false")
        return frame.response(bodies=[pack_body(self.pending(field_int(frame, "maxRows", 100, lo=1,
                                                                       hi=MAX_ROWS_LIMIT)))])

    def close(self) -> None:
        ts, self.timer_store = self.timer_store, None
        self.ready = False
        if ts is not None:
            try:
                ts.close()
            except Exception:  # noqa: BLE001 - a failed flush on stop: recovery redoes it
                log.exception("timer store close failed")
