"""Flush actor: makes the CommitLog durable (RocketMQ FlushRealTimeService / GroupCommitService).

Responsibility
    ASYNC_FLUSH: every flushIntervalCommitLog (500 ms) msync the CommitLog when
    at least flushCommitLogLeastPages (4) pages are dirty, everything every
    flushCommitLogThoroughInterval (10 s).  SYNC_FLUSH: group commit: as soon
    as the broker announces a new end, one msync covers every send waiting for
    it, and the durable offset goes back to the broker, which then answers
    those sends.  After a flush it stores physicMsgTimestamp and the durable
    offset in the checkpoint (it owns those fields).  ConsumeQueues and
    IndexFiles are flushed by reput, their only writer.

Sockets
    SUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, flushed, minOffset}.
    DEALER ``ipc://STORE/broker.ipc``: one-way FLUSH_ANNOUNCE {flushed}.

Files
    msyncs ``commitlog/*``; writes checkpoint physicMsgTimestamp / masterFlushedOffset.

Timers
    flushIntervalCommitLog (ASYNC_FLUSH); a 10 ms fallback under SYNC_FLUSH.

Failure behaviour
    A failed msync is sticky (MappedFile.write_error): no flushed offset is
    announced beyond it, so the broker never acknowledges a SYNC_FLUSH send
    that is not durable; FLUSH_ANNOUNCE {flushed, error} tells the broker,
    which then fails the parked sends and refuses writes until restarted.  On SIGTERM it flushes everything announced and exits 0.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

from rmq.actors.follower import ANNOUNCE_APPEND, ANNOUNCE_TICK, FollowerActor, run_follower
from rmq.errors import StoreError
from rmq.protocol import RequestCode
from rmq.store.checkpoint import StoreCheckpoint
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig

CHECKPOINT_FLUSH_INTERVAL_MS = 1000


class FlushActor(FollowerActor):
    name = "flush"

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config, supervisor_endpoint)
        self.sync = config.flush_disk_type == SYNC_FLUSH
        # under ASYNC_FLUSH every append would wake us for nothing: the periodic tick is enough
        self.topics = (ANNOUNCE_APPEND, ANNOUNCE_TICK) if self.sync else (ANNOUNCE_TICK,)
        self.end_store_timestamp = 0       # ms, store time of the last record before self.end
        self.refreshed_end = 0             # CommitLog end the file views were refreshed to (bytes)
        self.announced_flushed = -1
        self._last_thorough = time.monotonic()
        self._last_checkpoint_flush = 0.0
        self.flush_error = ""              # the failed msync, announced to the broker (sticky)
        self._last_error_announce = 0.0

    def on_started(self) -> None:
        self.commitlog = self.open_commitlog()
        self.checkpoint = StoreCheckpoint(os.path.join(os.path.abspath(self.store_path), "checkpoint"))
        self.add_timer(10 if self.sync else self.config.flush_interval_commit_log, self.flush_timer)

    def on_append_announce(self, fields: dict) -> None:
        end = self.end
        if end <= self.refreshed_end:
            return
        self.refreshed_end = end
        self.end_store_timestamp = int(fields.get("storeTimestamp", 0))
        first = self.commitlog.flushed_where == 0
        self.commitlog.refresh(end)
        if first and self.commitlog.files:
            # start: what the broker recovered counts as on disk (it flushed before serving)
            self._adopt_flushed(min(self.flushed, end))
        elif self.sync and not self.flush_error and self.commitlog.files and \
                min(self.flushed, end) > self.commitlog.flushed_where:
            # SYNC_FLUSH: the broker msynced this itself (its group commit of a small group): nothing
            # to msync here, but the checkpoint's flushed offset must follow
            self._adopt_flushed(min(self.flushed, end))
            self.announced_flushed = max(self.announced_flushed, self.commitlog.flushed_where)
            self._checkpoint(self.commitlog.flushed_where)

    def _adopt_flushed(self, flushed: int) -> None:
        """Count the CommitLog durable up to ``flushed`` (bytes) without an msync of our own."""
        self.commitlog.flushed_where = flushed
        for mf in self.commitlog.files:
            mf.flushed_position = max(mf.flushed_position,
                                      min(max(flushed - mf.file_from_offset, 0), mf.file_size))

    def after_poll(self) -> None:
        if self.sync:
            self.flush(0)

    def flush_timer(self) -> None:
        if self.sync:
            self.flush(0)
            return
        now = time.monotonic()
        least = self.config.flush_commit_log_least_pages
        if now - self._last_thorough >= self.config.flush_commit_log_thorough_interval / 1000.0:
            least = 0
            self._last_thorough = now
        self.flush(least)

    def flush(self, least_pages: int) -> None:
        if self.exit_code:
            now = time.monotonic()
            if self.flush_error and now - self._last_error_announce >= 1.0:
                self._announce_error()        # repeated: a one-way message may be dropped
            return
        t0 = time.monotonic()
        try:
            self.commitlog.flush(least_pages)
        except StoreError as e:
            self.exit_code = 1
            self.flush_error = str(e)
            self.log.error("CommitLog flush failed, acknowledgements stop: %s", e)
            self._announce_error()
            return
        flushed = self.commitlog.flushed_where
        if flushed != self.announced_flushed:
            self.announced_flushed = flushed
            # flushUs: how long the msync took (the broker's rocketmq_storage_flush_latency)
            self.tell_broker(RequestCode.FLUSH_ANNOUNCE,
                             {"flushed": flushed, "flushUs": int((time.monotonic() - t0) * 1e6)})
            self._checkpoint(flushed)

    def _announce_error(self) -> None:
        # never retried: after a failed msync the kernel may have dropped the dirty pages and a
        # later msync could "succeed" (PostgreSQL's fsync lesson); the broker refuses writes
        # and fails parked SYNC_FLUSH sends until a restart re-validates the log
        self._last_error_announce = time.monotonic()
        self.tell_broker(RequestCode.FLUSH_ANNOUNCE, {"flushed": max(self.announced_flushed, 0),
                                                      "error": self.flush_error})

    def _checkpoint(self, flushed: int, force: bool = False) -> None:
        # physicMsgTimestamp: store time of the last record flushed, known when the flush
        # reached the end the broker announced with that timestamp
        if flushed >= self.end and self.end_store_timestamp:
            self.checkpoint.physic_msg_timestamp = self.end_store_timestamp
        self.checkpoint.master_flushed_offset = flushed
        now = time.monotonic()
        if force or now - self._last_checkpoint_flush >= CHECKPOINT_FLUSH_INTERVAL_MS / 1000.0:
            # a second msync per group commit would halve SYNC_FLUSH; the checkpoint only
            # bounds where abnormal recovery starts, so once a second is enough
            self._last_checkpoint_flush = now
            self.checkpoint.flush()

    def on_stop(self) -> None:
        self.drain_announcements(10)
        self.flush(0)
        if not self.flush_error:
            self._checkpoint(self.commitlog.flushed_where, force=True)
        self.checkpoint.shutdown()
        for mf in self.commitlog.files:
            mf.close()


def main(argv: Optional[list] = None) -> int:
    return run_follower(FlushActor, argv)


if __name__ == "__main__":
    sys.exit(main())
