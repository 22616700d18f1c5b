"""rmq: the announcements of the store's other actors to the broker (one-way, internal socket).

* DISPATCH_ANNOUNCE from reput: the CommitLog offset dispatched and the ConsumeQueues it extended;
  the broker maps them, wakes held pulls (RocketMQ's NotifyMessageArrivingListener, called by its
  in-process ReputMessageService) and lets the services waiting for reput (POP, transactions,
  timers) recover.
* FLUSH_ANNOUNCE from flush: the CommitLog offset durable; parked SYNC_FLUSH sends are answered
  (RocketMQ's GroupCommitService wake-up), a failed msync refuses writes until restart.
* CLEAN_ANNOUNCE from the cleaner: files deleted, disk full or not.

Source: ARCHITECTURE.md (processes and data flow); SPEC.md §5 (flush), §7 (reput), §8 (cleaning).
"""
from __future__ import annotations

import time

from rmq import latency_trace as _lt
from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.errors import StoreError
from rmq.protocol import Frame, field_int, unpack_body


class StoreAnnounceProcessor(RequestProcessor):

    def on_dispatch_announce(self, frame: Frame, reply: Reply) -> None:
        b = self.b
        b.dispatched_offset = field_int(frame, "dispatched", lo=0)
        queues = unpack_body(frame) if frame.bodies else []
        if _lt.ENABLED:
            now = time.monotonic_ns()
            r_rx, r_done = frame.fields.get("traceReceivedNs", 0), frame.fields.get("traceDispatchedNs", 0)
            for topic, queue_id, max_offset in queues:
                _lt.event("dispatch", topic, queue_id, max_offset, r_rx, r_done, now)
        pull = b.pull_processor
        for topic, queue_id, max_offset in queues:
            b.store.refresh_consume_queue(topic, queue_id, max_offset)
            pull.on_dispatched(topic, queue_id, max_offset)
        if not b.tx.ready:
            b.tx.maybe_recover()
        if not b.timer.ready:
            b.timer.maybe_recover()
        if not b.pop.ready:
            b.pop.maybe_recover()
        elif b.pop.holds and queues:          # the ConsumeQueues are refreshed above
            b.pop.on_arrivals({q[0] for q in queues})
        return None

    def on_flush_announce(self, frame: Frame, reply: Reply) -> None:
        b = self.b
        err = frame.fields.get("error")
        if err:
            self.flush_failed(str(err))
        flushed = field_int(frame, "flushed", lo=0)
        if b.metrics is not None and "flushUs" in frame.fields:
            b.metrics.on_flush(field_int(frame, "flushUs", 0, lo=0) / 1000.0, max(0, flushed - b.flushed_offset))
        self.flushed(flushed)
        return None

    def flush_failed(self, err: str) -> None:
        """A failed msync (the flush actor's, or the broker's own group commit): never an ack after
        it; parked SYNC_FLUSH sends not yet durable get FLUSH_DISK_TIMEOUT, later sends
        SERVICE_NOT_AVAILABLE (store) until a restart."""
        b = self.b
        if b.store.flush_error:
            return
        b.store.flush_error = err[:1000]
        self.log.error("CommitLog flush failed: writes refused until restart: %s", err)
        b.send_processor.sync_waits.fail_unflushed(b.flushed_offset, b.store.flush_error)

    def flushed(self, flushed: int) -> None:
        """The CommitLog is durable up to ``flushed`` (bytes): answer the sends parked for it."""
        b = self.b
        if flushed > b.flushed_offset:
            b.flushed_offset = flushed
            b.store.set_flushed_offset(flushed)
            b.send_processor.release_sync_waits()
            b.pull_processor.on_flushed()

    def group_commit_inline(self, max_bytes: int) -> None:
        """SYNC_FLUSH, a small group: the sends parked in this loop turn are made durable here, one
        msync for all of them, instead of by the flush actor two process hops away (RocketMQ's
        GroupCommitService runs in the broker too).  A group above ``max_bytes`` (bulk batches)
        is left to the flush actor, which msyncs while this loop goes on appending."""
        b = self.b
        store = b.store
        dirty = store.get_max_phy_offset() - b.flushed_offset
        if dirty <= 0 or dirty > max_bytes or store.flush_error:
            return
        t0 = time.monotonic()
        try:
            store.commitlog.flush(0)
        except StoreError as e:
            self.flush_failed(f"group commit in the broker: {e}")
            return
        flushed = store.commitlog.flushed_offset
        if b.metrics is not None:
            b.metrics.on_flush((time.monotonic() - t0) * 1000.0, max(0, flushed - b.flushed_offset))
        self.flushed(flushed)

    def on_clean_announce(self, frame: Frame, reply: Reply) -> None:
        b = self.b
        b.store.disk_full = bool(frame.fields.get("diskFull", False))
        b.store.drop_deleted_commit_log_files(field_int(frame, "minOffset", 0, lo=0))
        b.announce_append(force=True)      # reput learns the new min offset and cleans its files
        return None
