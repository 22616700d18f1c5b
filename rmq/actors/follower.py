"""FollowerActor: the base of the actors that follow the broker's CommitLog (reput, flush, cleaner).

Each one subscribes to the broker's announcements (PUB ``ipc://STORE/broker-pub.ipc``,
topics ANNOUNCE_APPEND / ANNOUNCE_TICK), keeps the latest ``end`` / ``flushed`` /
``dispatched`` / ``minOffset`` it heard, reports back over a DEALER to the broker's
internal ROUTER (``ipc://STORE/broker.ipc``), and maps the CommitLog as a reader
(nothing readable until announced).  Subclasses override ``topics``,
``on_started`` and ``on_append_announce``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import zmq

from rmq import protocol as P
from rmq.actors.actor import Actor
from rmq.actors.broker_endpoints import (ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK, announce_endpoint,
                                         internal_endpoint, store_config_from_settings)
from rmq.broker_conf import actor_settings
from rmq.protocol import Frame, ProtocolError, RequestCode
from rmq.store.config import MessageStoreConfig
from rmq.store.mapped_file_queue import MappedFileQueue

__all__ = ["FollowerActor", "ANNOUNCE_APPEND", "ANNOUNCE_DURABLE", "ANNOUNCE_TICK", "settings_from_args",
           "run_follower"]


class FollowerActor(Actor):
    """Base of reput, flush and cleaner."""

    topics: tuple = (ANNOUNCE_TICK,)      # PUB topics to subscribe to

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config.store_path_root_dir, supervisor_endpoint)
        self.config = config
        self.end = 0               # CommitLog end the broker announced (bytes)
        self.flushed = 0           # durable offset (bytes)
        self.dispatched = 0        # reput's dispatched offset (bytes)
        self.min_offset = 0        # CommitLog min offset (bytes)
        self.exit_code = 0

    def open_commitlog(self) -> MappedFileQueue:
        """The CommitLog files as a reader: mapped, nothing readable until announced."""
        root = os.path.abspath(self.config.store_path_root_dir)
        q = MappedFileQueue(self.config.store_path_commit_log or os.path.join(root, "commitlog"),
                            self.config.mapped_file_size_commit_log)
        q.load(drop_tmp=False)       # the broker's allocator may be creating the next file (NAME.tmp)
        for mf in q.files:
            mf.wrote_position = 0
            mf.flushed_position = 0
        return q

    def on_start(self) -> None:
        self.on_started()
        self.sub = self.socket(zmq.SUB, connect=announce_endpoint(self.store_path))
        for t in self.topics:
            self.sub.setsockopt(zmq.SUBSCRIBE, t)
        self.add_socket(self.sub, self._on_announce)
        self.out = self.socket(zmq.DEALER, connect=internal_endpoint(self.store_path))
        print("ready", internal_endpoint(self.store_path), flush=True)

    def on_started(self) -> None:
        """Open files and timers (before the sockets)."""

    def _on_announce(self, parts: list) -> None:
        try:
            f = P.decode(parts[1:])      # parts[0]: the PUB topic
        except ProtocolError as e:
            self.log.warning("bad announcement: %s", e)
            return
        if f.code != RequestCode.APPEND_ANNOUNCE:
            return
        fields = f.fields
        self.end = max(self.end, int(fields.get("end", 0)))
        self.flushed = max(self.flushed, int(fields.get("flushed", 0)))
        self.dispatched = max(self.dispatched, int(fields.get("dispatched", 0)))
        min_offset = int(fields.get("minOffset", 0))
        self.on_append_announce(fields)
        if min_offset > self.min_offset:
            self.min_offset = min_offset
            self.on_min_offset(min_offset)

    def on_append_announce(self, fields: dict) -> None:
        """A new announcement was applied to end / flushed / dispatched."""

    def on_min_offset(self, min_offset: int) -> None:
        """The CommitLog min offset grew (the cleaner deleted files)."""

    def drain_announcements(self, deadline_s: float) -> None:
        """On stop: apply announcements still queued (the broker stopped first)."""
        import time
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self.sub.poll(100):
            self._on_announce(self.sub.recv_multipart(copy=False))

    def tell_broker(self, code: int, fields: dict, bodies: Optional[list] = None) -> None:
        """One-way message to the broker; dropped (with a warning) if its queue is full."""
        try:
            self.out.send_multipart(P.encode(Frame(code, flag=P.FLAG_ONEWAY, fields=fields, bodies=bodies or [])),
                                    flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.warning("broker queue full: %s dropped", RequestCode(code).name)


def settings_from_args(argv: Optional[list], prog: str, name: str) -> tuple[MessageStoreConfig, Optional[str]]:
    """``-c broker.conf --store-path DIR --supervisor EP`` -> (MessageStoreConfig, supervisor endpoint)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("-c", "--config", default=None, help="broker.conf (RocketMQ key=value form)")
    p.add_argument("--store-path", default=None, help="storePathRootDir")
    p.add_argument("--supervisor", default=None, help="supervisor endpoint for liveness beats")
    args = p.parse_args(argv)
    overrides = {"storePathRootDir": args.store_path} if args.store_path else {}
    settings = actor_settings(args.config, overrides, name)
    return store_config_from_settings(settings), args.supervisor


def run_follower(cls, argv: Optional[list] = None) -> int:
    """``main()`` of a follower actor module: parse, run, return its exit code."""
    config, supervisor = settings_from_args(argv, f"python -m rmq.actors.{cls.name}", cls.name)
    actor = cls(config, supervisor)
    actor.run()
    return actor.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run one of rmq.actors.reput / flush / cleaner")
