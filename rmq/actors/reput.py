"""Reput actor: dispatches the CommitLog into ConsumeQueues and IndexFiles (RocketMQ ReputMessageService).

Responsibility
    The only writer of ``consumequeue/`` and ``index/`` while the broker runs.
    It follows the CommitLog end the broker announces (under SYNC_FLUSH only the
    flushed end, so a consumer never sees a message a crash could take back),
    dispatches with :class:`rmq.store.reput.Dispatcher`, and announces its
    dispatched offset plus every queue that got messages (with its new max
    offset) to the broker, which wakes parked pulls.  It also flushes the files
    it writes (ConsumeQueues every flushIntervalConsumeQueue, everything every
    flushConsumeQueueThoroughInterval) and then stores logicsMsgTimestamp in the
    checkpoint (it owns that field).

Sockets
    SUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, flushed, minOffset, confirmed}.
    DEALER ``ipc://STORE/broker.ipc``: one-way DISPATCH_ANNOUNCE {dispatched};
    body 0 = [[topic, queueId, maxOffset], ...].

Files
    Writes ``consumequeue/``, ``index/``, checkpoint logics/index timestamps;
    reads ``commitlog/``.

Timers
    ConsumeQueue/IndexFile flush: 1 000 ms (2 dirty pages), thorough 60 000 ms.  Dispatch runs
    right after an announcement unless it ran less than DISPATCH_MIN_INTERVAL_MS ago; then once
    when that interval is over (appends faster than 1 000/s are dispatched in groups).

Failure behaviour
    Dispatch is idempotent (ConsumeQueue and IndexFile skip what they hold), so a
    restarted reput resumes from the max physical offset its ConsumeQueues
    cover.  On SIGTERM it dispatches up to the last announced end, flushes and
    exits 0; it exits 1 if it could not catch up.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

from rmq import latency_trace as _lt
from rmq.actors.follower import ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK, FollowerActor, run_follower
from rmq.actors.store_view import StoreView
from rmq.protocol import RequestCode, pack_body
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.reput import Dispatcher

DISPATCH_STEP_RECORDS = 65536      # records per loop turn before the actor polls again
DISPATCH_MIN_INTERVAL_MS = 1.0     # dispatch runs at most once per this interval (RocketMQ's
                                   # ReputMessageService sleeps 1 ms per loop): appends arriving
                                   # faster are dispatched together, an isolated one at once


class ReputActor(FollowerActor):
    name = "reput"
    topics = (ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK)

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config, supervisor_endpoint)
        self._last_thorough = time.monotonic()
        self._last_dispatch = 0.0          # monotonic s of the last dispatch that found work
        self._deferred = False             # a coalesced dispatch is scheduled
        self.confirmed = -1                # the broker's confirm offset (-1: no bound)

    def on_started(self) -> None:
        self.view = StoreView(self.config)
        start = max(self.view.max_physic_offset_of_consume_queues(), self.view.commitlog.get_min_offset())
        self.dispatcher = Dispatcher(self.view.commitlog, self.view.find_consume_queue,
                                     lambda: self.view.index_service if self.config.message_index_enable else None,
                                     start, delay_levels_ms=self.config.delay_levels_ms)
        self.add_timer(self.config.flush_interval_consume_queue, self.flush_files)

    def on_min_offset(self, min_offset: int) -> None:
        """The cleaner deleted CommitLog files: drop ConsumeQueue / IndexFiles below ``min_offset``
        (CleanConsumeQueueService, SPEC.md §8.3)."""
        self.view.commitlog.drop_missing_head()
        cq_files = sum(cq.delete_expired_file(min_offset) for cq in self.view.consume_queue_table.values())
        index_files = self.view.index_service.delete_expired_file(min_offset)
        if self.dispatcher.reput_from_offset < min_offset:
            self.dispatcher.reput_from_offset = min_offset
        self.log.info("CommitLog min offset %d: %d ConsumeQueue and %d index file(s) deleted",
                      min_offset, cq_files, index_files)

    def on_append_announce(self, fields: dict) -> None:
        self.confirmed = int(fields.get("confirmed", -1))

    def limit(self) -> int:
        """Dispatch bound: under SYNC_FLUSH only what is flushed (SPEC.md header), and with
        allAckInSyncStateSet only up to the broker's confirm offset (RocketMQ 5's confirmOffset:
        what every member of the SyncStateSet holds)."""
        base = self.flushed if self.config.flush_disk_type == SYNC_FLUSH else self.end
        return base if self.confirmed < 0 else min(base, self.confirmed)

    def after_poll(self) -> None:
        wait_ms = DISPATCH_MIN_INTERVAL_MS - (time.monotonic() - self._last_dispatch) * 1000.0
        if wait_ms <= 0:
            self.run_dispatch()
        elif not self._deferred and self.dispatcher.reput_from_offset < self.limit():
            self._deferred = True              # appends in quick succession: one dispatch for them all
            self.add_timer(wait_ms, self._deferred_dispatch, repeat=False)

    def _deferred_dispatch(self) -> None:
        self._deferred = False
        self.run_dispatch()

    def run_dispatch(self, max_records: Optional[int] = DISPATCH_STEP_RECORDS) -> int:
        limit = self.limit()
        if self.dispatcher.reput_from_offset >= limit:
            return 0
        self._last_dispatch = time.monotonic()
        self.view.commitlog.refresh(limit)
        n = self.dispatcher.dispatch(limit, max_records)
        arrivals = self.dispatcher.take_arrivals()
        fields = {"dispatched": self.dispatcher.reput_from_offset}
        if _lt.ENABLED:       # when the announcement that caused this turn was read, when dispatch ended
            fields["traceReceivedNs"] = int(self.poll_returned_at * 1e9)
            fields["traceDispatchedNs"] = time.monotonic_ns()
        self.tell_broker(RequestCode.DISPATCH_ANNOUNCE, fields,
                         [pack_body([[t, q, m] for (t, q), m in arrivals.items()])])
        if self.dispatcher.reput_from_offset < limit:
            self.add_timer(0, self.run_dispatch, repeat=False)    # more to do: continue after polling
        return n

    def flush_files(self, thorough: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_thorough >= self.config.flush_consume_queue_thorough_interval / 1000.0:
            thorough = True
        least = 0 if thorough else self.config.flush_consume_queue_least_pages
        ts = self.dispatcher.dispatched_store_timestamp
        for cq in list(self.view.consume_queue_table.values()):
            cq.flush(least)
        if thorough:
            self._last_thorough = now
            self.view.index_service.flush()
            if ts:
                self.view.checkpoint.logics_msg_timestamp = ts
            self.view.checkpoint.flush()

    def on_stop(self) -> None:
        # drain what is already announced (the broker stops first), then flush everything
        self.drain_announcements(30)
        deadline = time.monotonic() + 30
        while self.dispatcher.reput_from_offset < self.limit() and time.monotonic() < deadline:
            if not self.run_dispatch(None):
                break
        self.exit_code = 0 if self.dispatcher.reput_from_offset >= self.limit() else 1
        self.flush_files(thorough=True)
        self.view.close()


def main(argv: Optional[list] = None) -> int:
    return run_follower(ReputActor, argv)


if __name__ == "__main__":
    sys.exit(main())
