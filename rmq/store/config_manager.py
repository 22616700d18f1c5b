"""JSON metadata under ``<root>/config/`` (SPEC.md §4.4).

Written as standard JSON, atomically: new content to ``FILE.tmp`` (fsync'd),
the previous file kept as ``FILE.bak``, then ``FILE.tmp`` renamed over
``FILE`` and the directory fsync'd.  Loading falls back to ``FILE.bak`` when
``FILE`` is missing, empty or unparsable.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable, Optional

from rmq._core.mapped_file import fsync_dir, fsync_file
from rmq.common.perm import PERM_INHERIT, PERM_PRIORITY, PERM_READ, PERM_WRITE   # noqa: F401 (re-exported: PermName)

log = logging.getLogger(__name__)


def write_file_atomically(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old or the new content."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        fsync_file(f.fileno(), tmp)
    if os.path.exists(path):
        shutil.copyfile(path, path + ".bak")
    os.replace(tmp, path)
    fsync_dir(d)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(text: str) -> Any:
    """``json.loads`` without Python's NaN / Infinity extensions (ValueError on them)."""
    return json.loads(text, parse_constant=_no_constants)


def read_json_with_backup(path: str, decode: Optional[Any] = None) -> Optional[Any]:
    """Parse ``path``, else ``path.bak``; None when neither exists (or both are empty).

    ``decode(data)``, when given, must accept the parsed value (it raises ValueError,
    TypeError, KeyError, AttributeError or OverflowError on a bad shape); a file it refuses
    counts as damaged, like unparseable JSON, and the ``.bak`` is tried.

    Raises
    ------
    StoreError
        A file exists but neither it nor its ``.bak`` holds a usable table (the store must
        not start with, e.g., consumer offsets silently reset).
    """
    errors = []
    for p in (path, path + ".bak"):
        try:
            with open(p, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            errors.append(f"{p}: {e}")
            continue
        if not raw.strip():
            continue
        try:
            data = loads_strict(raw.decode("utf-8"))
            if decode is not None:
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON object expected, got {type(data).__name__}")
                decode(data)
            return data
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            log.warning("cannot load %s: %s", p, e)
            errors.append(f"{p}: {e}")
    if errors:
        from rmq.errors import StoreError
        raise StoreError(f"cannot load {path} nor its .bak: {'; '.join(errors)}")
    return None


class DataVersion:
    """``{"timestamp": ms, "counter": n}``: bumped on every change (SPEC.md §4.4)."""

    def __init__(self, timestamp: int = 0, counter: int = 0):
        self.timestamp = timestamp or int(time.time() * 1000)
        self.counter = counter

    def next_version(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter += 1

    def to_json(self) -> dict:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_json(cls, d: Optional[dict]) -> "DataVersion":
        d = d or {}
        return cls(int(d.get("timestamp", 0)), int(d.get("counter", 0)))


def dumps_config(data: dict) -> str:
    """The on-disk text of a config table: standard JSON, indented, keys sorted."""
    return json.dumps(data, indent=2, sort_keys=True)


class ConfigWriter:
    """Writes JSON config files on a thread of its own, so that the broker's main thread never
    waits on their fsyncs (RocketMQ persists its ConfigManagers from scheduled executors, not
    from the threads that serve requests).

    A file submitted again before its previous text was written is written once, with the
    newest text (seq numbers order the texts of one path).  The thread starts at the first
    :meth:`submit`.  A failed write is logged and raised to whoever waits for it.
    """

    def __init__(self, name: str = "config-writer"):
        self.name = name
        self._cond = threading.Condition()
        self._pending: dict = {}          # path -> (seq, text): not written yet
        self._written: dict = {}          # path -> the newest seq written (or failed)
        self._errors: dict = {}           # path -> (seq, OSError) of the newest failed write
        self._writing: dict = {}          # path -> seq: taken by the thread, being written
        self._seq = 0
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def submit(self, path: str, text) -> int:
        """Queue ``text`` for ``path`` (a str, or a dict nobody else holds, dumped by the thread
        with :func:`dumps_config`); returns its seq (for :meth:`wait`).

        Raises RuntimeError after :meth:`close`."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed: {path} not written")
            self._seq += 1
            self._pending[path] = (self._seq, text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self._seq

    def wait(self, path: str, seq: int) -> None:
        """Until ``path``'s text ``seq`` (or a newer one) is written; raises its OSError."""
        with self._cond:
            while self._written.get(path, 0) < seq:
                if self._closed and path not in self._pending and path not in self._writing:
                    raise RuntimeError(f"{self.name} was closed without writing {path}")
                self._cond.wait()
            err = self._errors.get(path)
            if err is not None and err[0] >= seq:
                raise err[1]

    def flush(self) -> None:
        """Until everything submitted so far is written (failures logged, not raised)."""
        with self._cond:
            while self._pending or self._writing:
                self._cond.wait()

    def close(self, drop: bool = False) -> None:
        """Write what is queued (``drop``: forget it, as a killed process would; a write under
        way still ends), then stop the thread.  Idempotent."""
        with self._cond:
            self._closed = True
            if drop:
                self._pending.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return                                   # closed, nothing left
                batch, self._pending = self._pending, {}
                self._writing = {p: s for p, (s, _) in batch.items()}
            for path, (seq, text) in batch.items():
                err = None
                try:
                    write_file_atomically(path, text if isinstance(text, str) else dumps_config(text))
                except OSError as e:
                    err = e
                    log.error("cannot write %s: %s", path, e)
                with self._cond:
                    if err is not None:
                        self._errors[path] = (seq, err)
                    else:
                        self._errors.pop(path, None)
                    self._written[path] = max(seq, self._written.get(path, 0))
                    self._writing.pop(path, None)
                    self._cond.notify_all()


class ConfigManager:
    """Base of the JSON tables: ``encode()`` / ``decode()`` and atomic ``persist()``.

    ``writer`` (set by the MessageStore that owns the table): a :class:`ConfigWriter` that
    :meth:`persist_soon` hands the file to, and that :meth:`persist` waits on (so that an
    older text queued there can never overwrite a newer one).  Without one, both write here."""

    file_name = ""
    # encode() builds new containers (no live table inside): persist_soon hands them to the
    # writer, whose thread does the JSON (20 ms for 16,000 consumer offsets, 3.5 ms of it encode)
    encode_is_snapshot = False

    def __init__(self, config_dir: str):
        self.path = os.path.join(config_dir, self.file_name)
        self._lock = threading.RLock()
        self.writer: Optional[ConfigWriter] = None

    def load(self) -> None:
        read_json_with_backup(self.path, self.decode)      # decodes the first usable copy

    def _text(self) -> str:
        with self._lock:
            return dumps_config(self.encode())

    def persist(self) -> None:
        """Write the table now; durable (fsync'd) on return.  Raises OSError."""
        text = self._text()
        if self.writer is None:
            write_file_atomically(self.path, text)
        else:
            self.writer.wait(self.path, self.writer.submit(self.path, text))

    def persist_soon(self) -> None:
        """The table as it is now, written by ``writer``'s thread (the periodic persists and
        the slave's copies of its master's tables); written here when there is no writer.
        A failure is logged by the writer."""
        if self.writer is None:
            self.persist()
        elif self.encode_is_snapshot:
            with self._lock:
                data = self.encode()
            self.writer.submit(self.path, data)
        else:
            self.writer.submit(self.path, self._text())

    def encode(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, data: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


DEFAULT_QUEUE_NUMS = 8          # mqadmin updateTopic -r/-w default


class TopicConfigManager(ConfigManager):
    """``topics.json``: ``{"topicConfigTable": {name: TopicConfig}, "dataVersion": {...}}``."""

    file_name = "topics.json"

    def __init__(self, config_dir: str):
        super().__init__(config_dir)
        self.topic_config_table: dict[str, dict] = {}
        self.data_version = DataVersion()

    @staticmethod
    def new_topic_config(topic: str, read_queue_nums: int = DEFAULT_QUEUE_NUMS,
                         write_queue_nums: int = DEFAULT_QUEUE_NUMS, perm: int = PERM_READ | PERM_WRITE,
                         order: bool = False) -> dict:
        return {"topicName": topic, "readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums,
                "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": order}

    def update_topic_config(self, cfg: dict) -> None:
        with self._lock:
            self.topic_config_table[cfg["topicName"]] = cfg
            self.data_version.next_version()
        self.persist()

    def delete_topic_config(self, topic: str) -> bool:
        with self._lock:
            found = self.topic_config_table.pop(topic, None) is not None
            if found:
                self.data_version.next_version()
        if found:
            self.persist()
        return found

    def select_topic_config(self, topic: str) -> Optional[dict]:
        return self.topic_config_table.get(topic)

    def encode(self) -> dict:
        return {"topicConfigTable": self.topic_config_table, "dataVersion": self.data_version.to_json()}

    def decode(self, data: dict) -> None:
        self.topic_config_table = dict(data.get("topicConfigTable", {}))
        self.data_version = DataVersion.from_json(data.get("dataVersion"))


class ConsumerOffsetManager(ConfigManager):
    """``consumerOffset.json``: ``{"offsetTable": {"topic@group": {queueId: offset}}}``.

    Offsets are queue offsets (entries).  Queue ids are JSON object keys, so
    strings on disk; fastjson's unquoted integer keys are accepted on load.
    """

    file_name = "consumerOffset.json"
    TOPIC_GROUP_SEPARATOR = "@"
    encode_is_snapshot = True

    def __init__(self, config_dir: str):
        super().__init__(config_dir)
        self.offset_table: dict[str, dict[int, int]] = {}
        self.data_version = DataVersion()

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int,
                      increase_only: bool = False) -> bool:
        """Store ``offset`` (a queue offset) as the group's committed offset of the queue.

        ``increase_only``: store it only when it is not below the stored one (the offset a
        PULL_MESSAGE carries: a pull sent before a consumer's last UPDATE_CONSUMER_OFFSET, on
        another connection, can arrive after it and must not move the offset back).
        UPDATE_CONSUMER_OFFSET and admin resets move it either way.  Returns whether it was stored.
        """
        with self._lock:
            table = self.offset_table.setdefault(f"{topic}{self.TOPIC_GROUP_SEPARATOR}{group}", {})
            if increase_only and table.get(queue_id, -1) > offset:
                return False
            table[queue_id] = offset
            self.data_version.next_version()
            return True

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one."""
        return self.offset_table.get(f"{topic}{self.TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id, -1)

    def clamp_to_queue_ends(self, max_offset: Callable[[str, int], int]) -> list:
        """Lower every committed offset past its queue's end, ``max_offset(topic, queue_id)``
        (entries), to that end; returns ``[(topic@group, queue_id, old, new)]`` of those lowered.

        A slave promoted after an unclean failover: offsets the old master committed for messages
        it never replicated would make the group skip as many of the messages stored at those
        queue offsets from now on (rmq; see ``PullMessageProcessor.past_epoch_end`` for the
        consumers' in-memory positions)."""
        lowered = []
        with self._lock:
            for key, table in self.offset_table.items():
                topic = key.split(self.TOPIC_GROUP_SEPARATOR, 1)[0]
                for queue_id, offset in table.items():
                    end = max_offset(topic, queue_id)
                    if offset > end:
                        table[queue_id] = end
                        lowered.append((key, queue_id, offset, end))
            if lowered:
                self.data_version.next_version()
        return lowered

    def encode(self) -> dict:
        return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self.offset_table.items()},
                "dataVersion": self.data_version.to_json()}

    def decode(self, data: dict) -> None:
        self.offset_table = {k: {int(q): int(o) for q, o in v.items()}
                             for k, v in data.get("offsetTable", {}).items()}
        self.data_version = DataVersion.from_json(data.get("dataVersion"))


class SubscriptionGroupManager(ConfigManager):
    """``subscriptionGroup.json``: ``{"subscriptionGroupTable": {group: config}}`` (SPEC.md §4.4)."""

    file_name = "subscriptionGroup.json"

    def __init__(self, config_dir: str):
        super().__init__(config_dir)
        self.subscription_group_table: dict[str, dict] = {}
        self.data_version = DataVersion()

    @staticmethod
    def new_group_config(group: str) -> dict:
        return {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
                "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16,
                "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}

    def update_subscription_group_config(self, cfg: dict, wait: bool = True) -> None:
        """Add or replace a group; ``wait=False``: written by the writer's thread (an
        auto-created group, made again at its next heartbeat if a crash loses it)."""
        with self._lock:
            self.subscription_group_table[cfg["groupName"]] = cfg
            self.data_version.next_version()
        if wait:
            self.persist()
        else:
            self.persist_soon()

    def delete_subscription_group_config(self, group: str) -> bool:
        with self._lock:
            found = self.subscription_group_table.pop(group, None) is not None
            if found:
                self.data_version.next_version()
        if found:
            self.persist()
        return found

    def find_subscription_group_config(self, group: str) -> Optional[dict]:
        return self.subscription_group_table.get(group)

    def encode(self) -> dict:
        return {"subscriptionGroupTable": self.subscription_group_table,
                "dataVersion": self.data_version.to_json()}

    def decode(self, data: dict) -> None:
        self.subscription_group_table = dict(data.get("subscriptionGroupTable", {}))
        self.data_version = DataVersion.from_json(data.get("dataVersion"))
