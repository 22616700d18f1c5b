"""Consumer offset stores (RocketMQ ``OffsetStore``, SPEC.md §13.4 and §15.2).

An offset is the *next* queue offset to consume (entries).  Two stores:

``RemoteBrokerOffsetStore`` (CLUSTERING)
    Offsets live on the broker of each queue (``ConsumerOffsetManager``).  The
    consumer keeps an in-memory table, updated as messages are processed, and
    writes it back with UPDATE_CONSUMER_OFFSET every
    ``persistConsumerOffsetInterval`` (5 s) and on shutdown or when a queue is
    rebalanced away.  Reads go to the broker (QUERY_CONSUMER_OFFSET);
    QUERY_NOT_FOUND means "no offset yet" (-1).

``LocalFileOffsetStore`` (BROADCASTING)
    Every consumer owns its offsets, in
    ``<offset_store_dir>/<clientId>/<group>/offsets.json`` (default dir
    ``~/.rmq_offsets``, or ``$RMQ_OFFSET_STORE_DIR``; RocketMQ uses
    ``~/.rocketmq_offsets``).  The file is ``{"offsetTable": {"topic/brokerName/queueId": offset}}``,
    written to a temporary file, fsynced and renamed, with the previous
    version kept as ``offsets.json.bak``.

What goes in the table is the consumer's job: the push consumer stores the
lowest offset still in flight in a process queue (or max + 1 when none), so a
crash between processing and commit redelivers instead of losing.

Concurrency: every method is thread-safe (one lock around the table); the
broker I/O of the remote store runs outside the lock.
"""
from __future__ import annotations

import enum
import json
import logging
import os
import threading
from typing import Callable, Iterable, Optional

from rmq.client.message import MessageQueue
from rmq.errors import MQBrokerError, MQClientError, RemotingError

log = logging.getLogger("rmq.client.offset_store")

DEFAULT_OFFSET_STORE_DIR = os.path.join("~", ".rmq_offsets")

__all__ = ["ReadOffsetType", "OffsetStore", "RemoteBrokerOffsetStore", "LocalFileOffsetStore",
           "DEFAULT_OFFSET_STORE_DIR", "mq_from_key"]


class ReadOffsetType(enum.Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


def mq_from_key(key: str) -> MessageQueue:
    """``topic/brokerName/queueId`` -> MessageQueue (topics and broker names hold no '/')."""
    topic, broker, qid = key.rsplit("/", 2)
    return MessageQueue(topic, broker, int(qid))


class OffsetStore:
    """The in-memory table shared by both stores.

    ``read_offset`` returns >= 0 (an offset), -1 (none known: apply consumeFromWhere)
    or -2 (the store could not be read: try again later), as RocketMQ's.
    """

    def __init__(self, group: str):
        self.group = group
        self._table: dict[MessageQueue, int] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read what the store keeps (nothing for the remote store)."""

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        """Record ``offset`` (next to consume) for ``mq`` in memory; with ``increase_only`` a
        smaller value than the one held is ignored."""
        with self._lock:
            old = self._table.get(mq)
            if old is None or not increase_only or offset > old:
                self._table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int:
        with self._lock:
            return self._table.get(mq, -1)

    def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType = ReadOffsetType.MEMORY_FIRST_THEN_STORE) -> int:
        return self.read_memory(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        with self._lock:
            self._table.pop(mq, None)

    def clone_offset_table(self, topic: Optional[str] = None) -> dict:
        with self._lock:
            return {mq: off for mq, off in self._table.items() if topic is None or mq.topic == topic}

    def persist(self, mq: MessageQueue) -> None:
        """Write the offset of ``mq`` to the store now."""

    def persist_all(self, mqs: Iterable[MessageQueue], force: bool = False) -> None:
        """Write the offsets of ``mqs`` (the queues still assigned) to the store (``force``: also
        those the store was last given unchanged, as on shutdown, except one this member never
        moved from what it read from the store)."""

    def forget_persisted(self, mq: MessageQueue) -> None:
        """The store's offset of ``mq`` may no longer be the last one persisted (a long-polling
        PULL_MESSAGE carried the offset of its time, and may be applied after a later persist):
        the next :meth:`persist_all` writes it even when unchanged."""


class RemoteBrokerOffsetStore(OffsetStore):
    """Offsets on the brokers (CLUSTERING).

    Parameters
    ----------
    group : str
    query : callable (group, mq) -> int
        QUERY_CONSUMER_OFFSET; returns -1 on QUERY_NOT_FOUND, raises on other failures.
    update : callable (group, mq, offset) -> None
        UPDATE_CONSUMER_OFFSET; raises on failure.
    """

    def __init__(self, group: str, query: Callable[[str, MessageQueue], int],
                 update: Callable[[str, MessageQueue, int], None]):
        super().__init__(group)
        self._query = query
        self._update = update
        self._persisted: dict[MessageQueue, int] = {}
        self._loaded: dict[MessageQueue, int] = {}      # what the store held when this member read it

    def _to_send(self, mq: MessageQueue, off: int, force: bool) -> bool:
        """Whether ``off`` goes to the store: it changed since the last persist, or (``force``)
        since this member read it from the store.  An offset this member never moved from what
        it read is not written even then: another member may have moved it since (a queue
        taken over while its owner was still finishing)."""
        return off >= 0 and (self._persisted.get(mq) != off or (force and self._loaded.get(mq) != off))

    def read_offset(self, mq, read_type=ReadOffsetType.MEMORY_FIRST_THEN_STORE):
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            off = self.read_memory(mq)
            if off >= 0 or read_type is ReadOffsetType.READ_FROM_MEMORY:
                return off
        try:
            off = self._query(self.group, mq)
        except MQBrokerError as e:
            log.warning("query offset of %s for %s: %s", mq, self.group, e)
            return -1
        except MQClientError as e:
            log.warning("query offset of %s for %s: %s", mq, self.group, e)
            return -2
        if off >= 0:
            self.update_offset(mq, off, increase_only=False)
            with self._lock:
                self._persisted[mq] = self._loaded[mq] = off
        return off

    def persist(self, mq: MessageQueue) -> None:
        off = self.read_memory(mq)
        with self._lock:
            if not self._to_send(mq, off, True):
                return
        try:
            self._update(self.group, mq, off)
            with self._lock:
                self._persisted[mq] = off
        except MQClientError as e:
            log.warning("persist offset %d of %s for %s failed: %s", off, mq, self.group, e)

    def persist_all(self, mqs: Iterable[MessageQueue], force: bool = False) -> None:
        wanted = set(mqs)
        with self._lock:
            todo = [(mq, off) for mq, off in self._table.items()
                    if mq in wanted and self._to_send(mq, off, force)]
        unreachable: set = set()          # broker groups that did not answer this round: one timeout each
        for mq, off in todo:
            if mq.broker_name in unreachable:
                continue                      # kept in memory: the next round tries again
            try:
                self._update(self.group, mq, off)
                with self._lock:
                    self._persisted[mq] = off
            except RemotingError as e:
                unreachable.add(mq.broker_name)
                log.warning("persist offset %d of %s for %s failed: %s (the other queues of %s wait for the next "
                            "round)", off, mq, self.group, e, mq.broker_name)
            except MQClientError as e:
                log.warning("persist offset %d of %s for %s failed: %s", off, mq, self.group, e)

    def forget_persisted(self, mq: MessageQueue) -> None:
        with self._lock:
            self._persisted.pop(mq, None)

    def remove_offset(self, mq: MessageQueue) -> None:
        with self._lock:
            self._table.pop(mq, None)
            self._persisted.pop(mq, None)
            self._loaded.pop(mq, None)


class LocalFileOffsetStore(OffsetStore):
    """Offsets in a local JSON file (BROADCASTING): see the module docstring.

    Parameters
    ----------
    group : str
    client_id : str
        Part of the path (characters outside ``[A-Za-z0-9_.@#%-]`` become ``_``).
    store_dir : str, optional
        Root directory; default ``$RMQ_OFFSET_STORE_DIR`` or ``~/.rmq_offsets``.
    """

    def __init__(self, group: str, client_id: str, store_dir: Optional[str] = None):
        super().__init__(group)
        root = os.path.expanduser(store_dir or os.environ.get("RMQ_OFFSET_STORE_DIR") or DEFAULT_OFFSET_STORE_DIR)
        safe = "".join(c if c.isalnum() or c in "_.@#%-" else "_" for c in client_id)
        self.store_path = os.path.join(root, safe, group, "offsets.json")
        self._file_lock = threading.Lock()

    def load(self) -> None:
        """Read ``offsets.json`` (or its ``.bak`` when the main file is unreadable).

        Raises
        ------
        MQClientError
            Both files exist and neither parses.
        """
        for path in (self.store_path, self.store_path + ".bak"):
            if not os.path.exists(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                table = {mq_from_key(k): int(v) for k, v in data.get("offsetTable", {}).items()}
            except (OSError, ValueError, AttributeError) as e:
                log.warning("offset file %s unreadable: %s", path, e)
                continue
            with self._lock:
                self._table.update(table)
            return
        if os.path.exists(self.store_path):
            raise MQClientError(f"cannot load local offsets from {self.store_path} or its .bak")

    def read_offset(self, mq, read_type=ReadOffsetType.MEMORY_FIRST_THEN_STORE):
        return self.read_memory(mq)

    def persist(self, mq: MessageQueue) -> None:
        self._write()

    def persist_all(self, mqs: Iterable[MessageQueue], force: bool = False) -> None:
        self._write()

    def remove_offset(self, mq: MessageQueue) -> None:
        pass   # broadcasting keeps every offset it ever had, as LocalFileOffsetStore does

    def _write(self) -> None:
        with self._lock:
            data = {"offsetTable": {mq.key(): off for mq, off in sorted(self._table.items())}}
        text = json.dumps(data, indent=1, sort_keys=True)
        with self._file_lock:
            try:
                os.makedirs(os.path.dirname(self.store_path), exist_ok=True)
                tmp = self.store_path + ".tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                if os.path.exists(self.store_path):
                    os.replace(self.store_path, self.store_path + ".bak")
                os.replace(tmp, self.store_path)
            except OSError as e:
                log.error("cannot write local offsets %s: %s", self.store_path, e)
