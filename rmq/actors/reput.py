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
    SUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, flushed, minOffset}.
    DEALER ``ipc://STORE/broker.ipc``: one-way DISPATCH_ANNOUNCE {dispatched};
    body 0 = [[topic, queueId, maxOffset], ...].

Files
    Writes ``consumequeue/``, ``index/``, checkpoint logics/index timestamps;
    reads ``commitlog/``.

Timers
    ConsumeQueue/IndexFile flush: 1 000 ms (2 dirty pages), thorough 60 000 ms.

Failure behaviour
    Dispatch is idempotent (ConsumeQueue and IndexFile skip what they hold), so a
    restarted reput resumes from the max physical offset its ConsumeQueues
    cover.  On SIGTERM it dispatches up to the last announced end, flushes and
    exits 0; it exits 1 if it could not catch up.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import zmq

from rmq import protocol as P
from rmq.actors.actor import Actor
from rmq.actors.broker import ANNOUNCE_APPEND, ANNOUNCE_TICK, announce_endpoint, internal_endpoint, store_config_from_settings
from rmq.actors.store_view import StoreView
from rmq.broker_conf import broker_settings, load_broker_conf
from rmq.protocol import Frame, ProtocolError, RequestCode, pack_body
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.reput import Dispatcher

DISPATCH_STEP_RECORDS = 65536      # records per loop turn before the actor polls again


class ReputActor(Actor):
    name = "reput"

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config.store_path_root_dir, supervisor_endpoint)
        self.config = config
        self.end = 0
        self.flushed = 0
        self.caught_up = True
        self.commitlog_min_offset = 0
        self._last_thorough = time.monotonic()

    def on_start(self) -> None:
        self.view = StoreView(self.config)
        start = max(self.view.max_physic_offset_of_consume_queues(), self.view.commitlog.get_min_offset())
        self.dispatcher = Dispatcher(self.view.commitlog, self.view.find_consume_queue,
                                     lambda: self.view.index_service if self.config.message_index_enable else None,
                                     start,
                                     delay_levels_ms=self.config.delay_levels_ms)
        self.sub = self.socket(zmq.SUB, connect=announce_endpoint(self.store_path))
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_APPEND)
        self.sub.setsockopt(zmq.SUBSCRIBE, ANNOUNCE_TICK)
        self.add_socket(self.sub, self.on_announce)
        self.out = self.socket(zmq.DEALER, connect=internal_endpoint(self.store_path))
        self.add_timer(self.config.flush_interval_consume_queue, self.flush_files)
        print("ready", internal_endpoint(self.store_path), flush=True)

    def on_announce(self, parts: list) -> None:
        try:
            f = P.decode(parts[1:])      # parts[0]: the PUB topic
        except ProtocolError as e:
            self.log.warning("bad announcement: %s", e)
            return
        if f.code != RequestCode.APPEND_ANNOUNCE:
            return
        self.end = max(self.end, int(f.fields.get("end", 0)))
        self.flushed = max(self.flushed, int(f.fields.get("flushed", 0)))
        min_offset = int(f.fields.get("minOffset", 0))
        if min_offset > self.commitlog_min_offset:
            self.clean_queues(min_offset)

    def clean_queues(self, min_offset: int) -> None:
        """The cleaner deleted CommitLog files: drop ConsumeQueue / IndexFiles below ``min_offset``
        (CleanConsumeQueueService, SPEC.md §8.3) and announce the queues' new min offsets."""
        self.commitlog_min_offset = min_offset
        self.view.commitlog.drop_missing_head()
        cq_files = sum(cq.delete_expired_file(min_offset) for cq in self.view.consume_queue_table.values())
        index_files = self.view.index_service.delete_expired_file(min_offset)
        if self.dispatcher.reput_from_offset < min_offset:
            self.dispatcher.reput_from_offset = min_offset
        self.log.info("CommitLog min offset %d: %d ConsumeQueue and %d index file(s) deleted",
                      min_offset, cq_files, index_files)

    def limit(self) -> int:
        return self.flushed if self.config.flush_disk_type == SYNC_FLUSH else self.end

    def after_poll(self) -> None:
        self.run_dispatch()

    def run_dispatch(self, max_records: Optional[int] = DISPATCH_STEP_RECORDS) -> int:
        limit = self.limit()
        if self.dispatcher.reput_from_offset >= limit:
            return 0
        self.view.commitlog.refresh(limit)
        n = self.dispatcher.dispatch(limit, max_records)
        arrivals = self.dispatcher.take_arrivals()
        frame = Frame(RequestCode.DISPATCH_ANNOUNCE, flag=P.FLAG_ONEWAY,
                      fields={"dispatched": self.dispatcher.reput_from_offset},
                      bodies=[pack_body([[t, q, m] for (t, q), m in arrivals.items()])])
        try:
            self.out.send_multipart(P.encode(frame), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.warning("broker queue full: dispatch announcement dropped")
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
        deadline = time.monotonic() + 30
        while self.sub.poll(100) and time.monotonic() < deadline:
            self.on_announce(self.sub.recv_multipart(copy=False))
        while self.dispatcher.reput_from_offset < self.limit() and time.monotonic() < deadline:
            if not self.run_dispatch(None):
                break
        self.caught_up = self.dispatcher.reput_from_offset >= self.limit()
        self.flush_files(thorough=True)
        self.view.close()


def settings_from_args(argv: Optional[list], prog: str):
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("-c", "--config", default=None, help="broker.conf (RocketMQ key=value form)")
    p.add_argument("--store-path", default=None, help="storePathRootDir")
    p.add_argument("--supervisor", default=None, help="supervisor endpoint for liveness beats")
    args = p.parse_args(argv)
    props = load_broker_conf(args.config) if args.config else {}
    overrides = {"storePathRootDir": args.store_path} if args.store_path else {}
    return store_config_from_settings(broker_settings(props, overrides)), args.supervisor


def main(argv: Optional[list] = None) -> int:
    config, supervisor = settings_from_args(argv, "python -m rmq.actors.reput")
    actor = ReputActor(config, supervisor)
    actor.run()
    return 0 if actor.caught_up else 1


if __name__ == "__main__":
    sys.exit(main())
