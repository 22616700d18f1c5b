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
    that is not durable.  On SIGTERM it flushes everything announced and exits 0.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import zmq

from rmq import protocol as P
from rmq.actors.actor import Actor
from rmq.actors.broker import ANNOUNCE_APPEND, ANNOUNCE_TICK, announce_endpoint, internal_endpoint
from rmq.actors.reput import settings_from_args
from rmq.errors import StoreError
from rmq.protocol import Frame, ProtocolError, RequestCode
from rmq.store.checkpoint import StoreCheckpoint
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.mapped_file_queue import MappedFileQueue


CHECKPOINT_FLUSH_INTERVAL_MS = 1000


class FlushActor(Actor):
    name = "flush"

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config.store_path_root_dir, supervisor_endpoint)
        self.config = config
        self.end = 0
        self.end_store_timestamp = 0       # ms, store time of the last record before self.end
        self.announced_flushed = -1
        self.ok = True
        self._last_thorough = time.monotonic()
        self._last_checkpoint_flush = 0.0

    def on_start(self) -> None:
        root = os.path.abspath(self.config.store_path_root_dir)
        self.commitlog = MappedFileQueue(self.config.store_path_commit_log or os.path.join(root, "commitlog"),
                                         self.config.mapped_file_size_commit_log)
        self.commitlog.load()
        for mf in self.commitlog.files:
            mf.wrote_position = 0
            mf.flushed_position = 0
        self.checkpoint = StoreCheckpoint(os.path.join(root, "checkpoint"))
        self.sub = self.socket(zmq.SUB, connect=announce_endpoint(self.store_path))
        self.sync = self.config.flush_disk_type == SYNC_FLUSH
        # under ASYNC_FLUSH every append would wake us for nothing: the periodic tick is enough
        if self.sync:
            self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_APPEND)
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_TICK)
        self.add_socket(self.sub, self.on_announce)
        self.out = self.socket(zmq.DEALER, connect=internal_endpoint(self.store_path))
        self.add_timer(10 if self.sync else self.config.flush_interval_commit_log, self.flush_timer)
        print("ready", internal_endpoint(self.store_path), flush=True)

    def on_announce(self, parts: list) -> None:
        try:
            f = P.decode(parts[1:])      # parts[0]: the PUB topic
        except ProtocolError as e:
            self.log.warning("bad announcement: %s", e)
            return
        if f.code == RequestCode.APPEND_ANNOUNCE:
            end = int(f.fields.get("end", 0))
            if end > self.end:
                self.end = end
                self.end_store_timestamp = int(f.fields.get("storeTimestamp", 0))
                self.commitlog.refresh(end)
                if self.commitlog.flushed_where == 0 and self.commitlog.files:
                    # start: what the broker recovered is on disk already (it flushed before serving)
                    self.commitlog.flushed_where = min(int(f.fields.get("flushed", 0)), end)
                    for mf in self.commitlog.files:
                        mf.flushed_position = min(max(self.commitlog.flushed_where - mf.file_from_offset, 0),
                                                  mf.file_size)

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
        if not self.ok:
            return
        try:
            self.commitlog.flush(least_pages)
        except StoreError as e:
            self.ok = False
            self.log.error("CommitLog flush failed, acknowledgements stop: %s", e)
            return
        flushed = self.commitlog.flushed_where
        if flushed != self.announced_flushed:
            self.announced_flushed = flushed
            try:
                self.out.send_multipart(P.encode(Frame(RequestCode.FLUSH_ANNOUNCE, flag=P.FLAG_ONEWAY,
                                                       fields={"flushed": flushed})), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            self._checkpoint(flushed)

    def _checkpoint(self, flushed: int) -> None:
        # physicMsgTimestamp: store time of the last record flushed, known when the flush
        # reached the end the broker announced with that timestamp
        if flushed >= self.end and self.end_store_timestamp:
            self.checkpoint.physic_msg_timestamp = self.end_store_timestamp
        self.checkpoint.master_flushed_offset = flushed
        now = time.monotonic()
        if now - self._last_checkpoint_flush >= CHECKPOINT_FLUSH_INTERVAL_MS / 1000.0:
            # a second msync per group commit would halve SYNC_FLUSH; the checkpoint only
            # bounds where abnormal recovery starts, so once a second is enough
            self._last_checkpoint_flush = now
            self.checkpoint.flush()

    def on_stop(self) -> None:
        deadline = time.monotonic() + 10
        while self.sub.poll(100) and time.monotonic() < deadline:
            self.on_announce(self.sub.recv_multipart(copy=False))
        self.flush(0)
        self.checkpoint.shutdown()
        for mf in self.commitlog.files:
            mf.close()


def main(argv: Optional[list] = None) -> int:
    config, supervisor = settings_from_args(argv, "python -m rmq.actors.flush")
    actor = FlushActor(config, supervisor)
    actor.run()
    return 0 if actor.ok else 1


if __name__ == "__main__":
    sys.exit(main())
