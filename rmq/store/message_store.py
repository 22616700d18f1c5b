"""MessageStore: the embedded, in-process store (RocketMQ ``DefaultMessageStore``).

Layout under ``store_path`` (SPEC.md §0.5)::

    commitlog/00000000000000000000 ...   CommitLog files
    consumequeue/TOPIC/QUEUEID/...       ConsumeQueue files
    index/yyyyMMddHHmmssSSS              IndexFiles
    checkpoint  abort  lock              StoreCheckpoint, dirty-exit marker, process lock
    config/topics.json consumerOffset.json subscriptionGroup.json   (+ .bak)

No network: the broker actor wraps the same class.  Appends, ``dispatch()``
(the reput step), reads and ``flush()`` are called by their owners; in a test
or a script one object does all of it.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from rmq._core import commitlog as _cl
from rmq._core.layout import (CQ_STORE_UNIT_SIZE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE,
                              TRANSACTION_TYPE_MASK)
from rmq._core.mapped_file import MappedFile, fsync_dir, fsync_file
from rmq.errors import (CorruptRecordError, MessageIllegalError, StoreClosedError, StoreDiskFullError,
                        StoreError, StoreLockedError)
from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.store.checkpoint import StoreCheckpoint
from rmq.store.commitlog import AppendResult, CommitLog, ReplicaDataError, ReplicaOffsetMismatch  # noqa: F401
from rmq.store.commitlog import host_to_bytes as _host_to_bytes
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.config_manager import ConfigWriter, ConsumerOffsetManager, SubscriptionGroupManager, TopicConfigManager
from rmq.store.consume_queue import ConsumeQueue
from rmq.store.epoch import EPOCH_FILE, EpochFile
from rmq.store.index_service import IndexService
from rmq.store.reput import Dispatcher
from rmq.store.schedule import SCHEDULE_TOPIC, DelayOffsetManager, restore_delayed, transform_delay
from rmq.store.validators import check_queue_id, check_topic

log = logging.getLogger(__name__)

HA_TRUNCATE_FILE = "ha_truncate"      # <root>/ha_truncate: decimal offset to cut the CommitLog at on open
KNOWN_SYS_FLAG_BITS = 0x7FF          # MessageSysFlag bits 0..10 (SPEC.md §1.5)
MIN_CQ_UNITS_PER_READ = 16000 // 20  # RocketMQ reads max(16000 B, maxMsgNums*20) of CQ per getMessage (rmq: when filtering)


def _total_physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024 ** 3


def _fsync_dir(path: str) -> None:
    fsync_dir(path)     # the one sync helper (rmq._core.mapped_file): journaled under RMQ_DURABILITY_TRACE


def write_truncate_marker(store_root: str, offset: int) -> str:
    """Ask the next open of the store at ``store_root`` to cut its tail at ``offset``.

    Writes ``STORE_ROOT/ha_truncate`` (:data:`HA_TRUNCATE_FILE`) holding the
    decimal physical offset (bytes), atomically (tmp + fsync + rename + fsync
    of the directory).  The next :class:`MessageStore` open truncates the
    CommitLog, ConsumeQueues, IndexFiles and the epoch file to it (see
    ``MessageStore._truncate_for_marker``), recovers as after a crash, then
    removes the marker; a crash in between redoes it on the following open.

    ``offset`` should be a record boundary (an epoch start or a max offset, as
    :func:`rmq.store.epoch.find_consistent_point` returns); otherwise recovery
    cuts further, back to the last whole record.  An offset at or below the
    first CommitLog file's start empties the CommitLog.

    Returns the marker's path.  Raises ValueError for a negative offset.
    """
    offset = int(offset)
    if offset < 0:
        raise ValueError(f"truncate offset must be >= 0, got {offset}")
    root = os.path.abspath(store_root)
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, HA_TRUNCATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(f"{offset}\n".encode("ascii"))
        f.flush()
        fsync_file(f.fileno(), tmp)
    os.replace(tmp, path)
    _fsync_dir(root)
    return path


def read_truncate_marker(store_root: str) -> Optional[int]:
    """The offset in ``STORE_ROOT/ha_truncate``, None when there is no marker.

    Raises
    ------
    StoreError
        The marker is not one non-negative decimal integer (the file is named).
    """
    path = os.path.join(os.path.abspath(store_root), HA_TRUNCATE_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(64)
    except FileNotFoundError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit():
        raise StoreError(f"truncate marker {path} is malformed: expected a decimal offset, got {raw[:32]!r}")
    return int(text)


@dataclass
class PutMessageResult:
    """Outcome of a put: status (PutMessageStatus), remark, and where the records went."""
    status: PutMessageStatus
    remark: str = ""
    append: Optional[AppendResult] = None
    max_body: int = 0       # a batch refused as too large to store whole: the largest body it takes (bytes)

    @property
    def ok(self) -> bool:
        return self.status.is_stored

    @property
    def queue_offset(self) -> int:
        return self.append.queue_offset if self.append else -1

    @property
    def wrote_offset(self) -> int:
        return self.append.wrote_offset if self.append else -1

    @property
    def msg_ids(self) -> list[str]:
        return self.append.msg_ids if self.append else []

    @property
    def msg_id(self) -> str:
        """Offset message id(s), comma-joined for a batch (SPEC.md §1.8)."""
        return self.append.msg_id if self.append else ""


@dataclass
class GetMessageResult:
    """Outcome of ``get_messages`` (RocketMQ ``GetMessageResult``).

    ``records`` holds the raw CommitLog records concatenated (what a pull reply
    carries); :meth:`messages` decodes them.
    """
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""
    message_count: int = 0
    suggest_pulling_from_slave: bool = False

    def messages(self) -> list:
        return _cl.decode_records(self.records) if self.records else []


@dataclass
class QueryMessageResult:
    """Records found by key (``query_message``): raw records and index freshness."""
    records: list = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0

    def messages(self) -> list:
        return [_cl.decode_records(r)[0] for r in self.records]


def tag_codes(tags: Union[None, str, Iterable[str]]) -> Optional[array]:
    """tagsCode set of a subscription: None for ``*`` / empty, else the hashes of
    ``"a || b"`` tokens or of an iterable of tags (SPEC.md §2.2)."""
    if tags is None:
        return None
    if isinstance(tags, str):
        s = tags.strip()
        if s in ("", "*"):
            return None
        items = [t.strip() for t in s.split("||")]
    else:
        items = [str(t).strip() for t in tags]
    items = [t for t in items if t]
    if not items:
        return None
    return array("i", sorted({_cl.tags_string_to_tags_code(t) for t in items}))


class MessageStore:
    """An embedded RocketMQ-style message store.

    Parameters
    ----------
    store_path : str, optional
        Root directory (``storePathRootDir``); overrides ``config``'s.
    config : MessageStoreConfig, optional
    **overrides
        Any MessageStoreConfig field, e.g. ``mapped_file_size_commit_log=65536``.

    Raises
    ------
    StoreLockedError
        Another MessageStore (this process or another) has the directory open.
    StoreError
        Files of the wrong size, holes between files.

    Opening loads and recovers (SPEC.md §5): normal recovery after a clean
    shutdown, abnormal recovery (the ``abort`` file is present) otherwise, then
    dispatches whatever the ConsumeQueues miss.  ``shutdown()`` flushes,
    writes the checkpoint, removes ``abort`` and releases the lock.
    """

    def __init__(self, store_path: Optional[str] = None, config: Optional[MessageStoreConfig] = None,
                 **overrides):
        config = config or MessageStoreConfig()
        if store_path is not None:
            overrides["store_path_root_dir"] = store_path
        if overrides:
            config = config.replace(**overrides)
        self.config = config
        self.root = os.path.abspath(config.store_path_root_dir)
        os.makedirs(self.root, exist_ok=True)
        self._lock_fd = self._take_lock()
        self._shutdown = False
        self.disk_full = False          # set by the cleaner's disk check (RunningFlags DISK_FULL)
        self._cq_min_corrected_to = 0   # CommitLog min offset the ConsumeQueues' min offsets last followed
        self.flush_error = ""           # a CommitLog msync failed in the flush actor: no writes until restart
        self.dispatched_store_timestamp = 0   # ms, store time of the last record dispatched
        self.sync_flush_inline = True         # SYNC_FLUSH puts msync before returning (embedded use)
        self._mutex = threading.RLock()
        self.total_physical_memory = _total_physical_memory()
        try:
            self._open()
        except BaseException:
            self._release_lock()
            raise

    # -- paths -------------------------------------------------------------------
    @property
    def commitlog_dir(self) -> str:
        return self.config.store_path_commit_log or os.path.join(self.root, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.root, "consumequeue")

    @property
    def abort_file(self) -> str:
        return os.path.join(self.root, "abort")

    # -- lock (SPEC.md §4.3) -------------------------------------------------------------
    def _take_lock(self) -> int:
        path = os.path.join(self.root, "lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreLockedError(f"store {self.root} is locked: another MessageStore (broker) has it open "
                                   f"(lock file {path})") from None
        os.ftruncate(fd, 0)
        os.write(fd, b"lock")
        fsync_file(fd, path)
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- load + recover (SPEC.md §5) ----------------------------------------------------------
    def _open(self) -> None:
        cfg = self.config
        self.last_exit_ok = not os.path.exists(self.abort_file)
        config_dir = os.path.join(self.root, "config")
        self.topic_config_manager = TopicConfigManager(config_dir)
        self.consumer_offset_manager = ConsumerOffsetManager(config_dir)
        self.subscription_group_manager = SubscriptionGroupManager(config_dir)
        self.delay_offset_manager = DelayOffsetManager(config_dir)
        self.config_writer = ConfigWriter(f"config-writer:{self.root}")   # persist_soon's thread
        for m in self._tables():
            m.load()
            m.writer = self.config_writer
        self.commitlog = CommitLog(cfg, self.commitlog_dir)
        self.commitlog.load()
        truncate_at = read_truncate_marker(self.root)    # malformed: raises before anything changes
        self.consume_queue_table: dict[tuple[str, int], ConsumeQueue] = {}
        self._load_consume_queues()
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))
        self.index_service = self._new_index_service()
        self.index_service.load(self.last_exit_ok, self.checkpoint.index_msg_timestamp)
        if truncate_at is None:
            self._recover()
        else:
            reindex_from = self._truncate_for_marker(truncate_at)
            self.last_exit_ok = False        # recover as after a crash
            self._recover(reindex_from)
            self.flush()
            self._remove_truncate_marker()
        # the abort file marks "running": a crash from here on means abnormal recovery
        with open(self.abort_file, "wb") as f:
            fsync_file(f.fileno(), self.abort_file)
        fsync_dir(self.root)

    # -- truncation to a common prefix (HA) ---------------------------------------------------
    request_truncate = staticmethod(write_truncate_marker)

    def _truncate_for_marker(self, offset: int) -> int:
        """Cut CommitLog, ConsumeQueues, IndexFiles and epoch file at ``offset`` (bytes).

        Runs at open, before recovery, when ``ha_truncate`` exists; idempotent
        (a crash before the marker is removed redoes it).  Returns the
        physical offset dispatch must start from at the latest to rebuild the
        IndexFiles dropped here.
        """
        mfq = self.commitlog.mapped_file_queue
        files = mfq.files
        end = files[-1].file_from_offset + mfq.mapped_file_size if files else 0
        log.warning("truncate marker %s: cutting the store at physical offset %d (CommitLog files end at %d)",
                    os.path.join(self.root, HA_TRUNCATE_FILE), offset, end)
        if offset < end:
            self.commitlog.truncate(offset)
            _fsync_dir(self.commitlog_dir)
        if self.checkpoint.master_flushed_offset > offset:
            # what is cut here was durable on purpose: recovery must not take it for corruption
            self.checkpoint.master_flushed_offset = offset
            self.checkpoint.flush()
        for cq in self.consume_queue_table.values():
            cq.recover()
            cq.truncate_dirty_logic_files(offset)
            cq.flush(0)
        # IndexFiles: drop the suffix that indexes a record at/after the cut (dispatch rebuilds it)
        reindex_from = 1 << 62
        index_files = self.index_service.files
        keep = len(index_files)
        while keep > 0 and index_files[keep - 1].end_phy_offset >= offset:
            keep -= 1
        if keep < len(index_files):
            reindex_from = index_files[keep].begin_phy_offset
            with self.index_service._lock:
                for f in index_files[keep:]:
                    log.info("truncate: dropping index file %s (end phy offset %d >= %d)",
                             f.file_name, f.end_phy_offset, offset)
                    f.destroy()
                    self.index_service._files.remove(f)
            # abnormal recovery keeps IndexFiles ending by this time: never past what is kept now
            self.checkpoint.index_msg_timestamp = min(self.checkpoint.index_msg_timestamp,
                                                      index_files[keep - 1].end_timestamp if keep else 0)
            self.checkpoint.flush()
        epoch_path = os.path.join(self.root, EPOCH_FILE)
        if os.path.exists(epoch_path) or os.path.exists(epoch_path + ".bak"):
            EpochFile(epoch_path).load().truncate_from(offset)
        return reindex_from

    def _remove_truncate_marker(self) -> None:
        os.unlink(os.path.join(self.root, HA_TRUNCATE_FILE))
        _fsync_dir(self.root)

    def _new_index_service(self) -> IndexService:
        cfg = self.config
        return IndexService(os.path.join(self.root, "index"), cfg.max_hash_slot_num, cfg.max_index_num,
                            cfg.message_index_enable, cfg.max_msgs_num_batch,
                            on_file_full=self._on_index_file_full)

    def _on_index_file_full(self, end_timestamp: int) -> None:
        # a full IndexFile was flushed: abnormal recovery may keep it (SPEC.md §3.4, §4.1)
        self.checkpoint.index_msg_timestamp = end_timestamp
        self.checkpoint.flush()

    def _load_consume_queues(self) -> None:
        root = self.consume_queue_dir
        if not os.path.isdir(root):
            return
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in sorted(os.listdir(tdir)):
                if not qid.isdigit():
                    continue     # RocketMQ skips names that are not a queue id
                cq = ConsumeQueue(self.root, topic, int(qid), self.config.mapped_file_size_consume_queue)
                # their writer is reput (it drops stale NAME.tmp files at its own start), or this store's
                # dispatch, which creates a file over a stale NAME.tmp (O_TRUNC): a broker restarted
                # alone must not delete the file a running reput is creating
                cq.load(drop_tmp=False)
                self.consume_queue_table[(topic, int(qid))] = cq

    def _recover(self, reindex_from: Optional[int] = None) -> None:
        # the CommitLog is durable up to here (written only after a successful msync): a bad
        # record below it is corruption (StoreCorruptionError), never a torn tail to cut
        durable = max(0, self.checkpoint.master_flushed_offset)
        max_phy_of_cq = 0
        for cq in self.consume_queue_table.values():
            cq.recover()
            max_phy_of_cq = max(max_phy_of_cq, cq.get_max_physic_offset())
        if not self.commitlog.mapped_file_queue.files:
            for cq in self.consume_queue_table.values():
                cq.destroy()
            self.consume_queue_table.clear()
            self.index_service.destroy()
            self.index_service = self._new_index_service()
            self.reput_from_offset = 0
        elif self.last_exit_ok:
            end = self.commitlog.recover_normally(durable)
            self.reput_from_offset = min(max(max_phy_of_cq, self.commitlog.get_min_offset()), end)
        else:
            start, end = self.commitlog.recover_abnormally(self.checkpoint.get_min_timestamp(), durable)
            # ConsumeQueue entries pointing into the re-scanned range may be stale: a CQ page above
            # its durable point can come back from before an earlier crash (a power cut keeps,
            # zeroes or reverts it), with entries whose CommitLog bytes were since rewritten by
            # other records.  Kept, they would make the re-dispatch skip the real entries as
            # "repeated" and hide acknowledged messages.  Drop them; the dispatch below rebuilds
            # every entry from the CommitLog (T1b finding, RELIABILITY.md §4).
            for cq in self.consume_queue_table.values():
                cq.truncate_dirty_logic_files(start)
            max_phy_of_cq = min(max_phy_of_cq, start)      # nothing points at/after ``start`` now
            self.reput_from_offset = min(max(start, self.commitlog.get_min_offset()), end)
        max_offset = self.commitlog.get_max_offset()
        if reindex_from is not None:
            # the IndexFiles from there were dropped: re-dispatch (CQ entries are skipped as present)
            self.reput_from_offset = min(self.reput_from_offset,
                                         max(reindex_from, self.commitlog.get_min_offset()))
        if max_phy_of_cq > max_offset:
            for cq in self.consume_queue_table.values():
                cq.truncate_dirty_logic_files(max_offset)
            self.reput_from_offset = min(self.reput_from_offset, max_offset)
        self.dispatcher = Dispatcher(self.commitlog.mapped_file_queue, self.find_consume_queue,
                                     lambda: self.index_service if self.config.message_index_enable else None,
                                     self.reput_from_offset,
                                     delay_levels_ms=self.config.delay_levels_ms)
        # like RocketMQ's start(): block until reput caught up with the CommitLog, then
        # rebuild the topic queue table from the ConsumeQueues
        self.topic_queue_table = {}
        self.dispatch()
        self._recover_topic_queue_table()
        self.commitlog.mapped_file_queue.flushed_where = self.commitlog.get_max_offset()
        if not self.last_exit_ok:
            # entries rebuilt (or kept from the page cache) by this recovery count as flushed from
            # here on, and the checkpoint will soon say so: make them durable first
            for cq in self.consume_queue_table.values():
                for mf in cq.mapped_file_queue.files:
                    if mf.wrote_position > 0:
                        mf.sync_range(0, mf.wrote_position)

    def _recover_topic_queue_table(self) -> None:
        min_phy = self.commitlog.get_min_offset()
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        for key, cq in self.consume_queue_table.items():
            self.topic_queue_table[key] = cq.get_max_offset_in_queue()
            cq.correct_min_offset(min_phy)

    def recover_topic_queue_table(self) -> dict:
        """Rebuild ``topic_queue_table`` (next queue offset of every queue) from the
        ConsumeQueues; for a SLAVE being promoted, once dispatch reached the CommitLog end.

        ConsumeQueues another process (the reput actor) created or extended are
        (re)mapped read-only first: new queue directories are loaded and each
        queue's readable end is found by scanning its entries (no file is
        changed).  Returns the table.
        """
        with self._mutex:
            self._refresh_consume_queue_views()
            self._recover_topic_queue_table()
            return self.topic_queue_table

    def _refresh_consume_queue_views(self) -> None:
        from rmq._core.consume_queue import scan_valid as cq_scan_valid
        root = self.consume_queue_dir
        if os.path.isdir(root):
            for topic in os.listdir(root):
                tdir = os.path.join(root, topic)
                if not os.path.isdir(tdir):
                    continue
                for qid in os.listdir(tdir):
                    if qid.isdigit() and (topic, int(qid)) not in self.consume_queue_table:
                        cq = ConsumeQueue(self.root, topic, int(qid), self.config.mapped_file_size_consume_queue)
                        cq.load(drop_tmp=False)          # reput may be creating a file there now
                        self.consume_queue_table[(topic, int(qid))] = cq
        for cq in self.consume_queue_table.values():
            mfq = cq.mapped_file_queue
            mfq.drop_missing_head()
            known = {os.path.basename(mf.file_name) for mf in mfq.files}
            if os.path.isdir(mfq.store_path):
                for name in sorted(os.listdir(mfq.store_path)):
                    if len(name) == 20 and name.isdigit() and name not in known and (
                            not mfq.files or int(name) == mfq.files[-1].file_from_offset + mfq.mapped_file_size):
                        mf = MappedFile(os.path.join(mfq.store_path, name), mfq.mapped_file_size, False)
                        mf.wrote_position = mfq.mapped_file_size
                        mfq.files.append(mf)
            # readable end: the first file not full of valid entries ends the queue
            end_found = False
            for mf in mfq.files:
                if end_found:
                    mf.wrote_position = 0
                    continue
                n_valid, last_end, _ = cq_scan_valid(mf, 0, mf.file_size, (1 << 63) - 1)
                mf.wrote_position = n_valid * CQ_STORE_UNIT_SIZE
                if last_end >= 0:
                    cq.max_physic_offset = last_end
                if mf.wrote_position < mf.file_size:
                    end_found = True

    # -- consume queues ----------------------------------------------------------------
    def find_consume_queue(self, topic: str, queue_id: int, create: bool = True) -> Optional[ConsumeQueue]:
        key = (topic, queue_id)
        cq = self.consume_queue_table.get(key)
        if cq is None and create:
            cq = ConsumeQueue(self.root, topic, queue_id, self.config.mapped_file_size_consume_queue)
            # a queue first seen while running: reput (another process) may be creating one of its
            # files this instant, as NAME.tmp; only a writer's start deletes those
            cq.load(drop_tmp=False)
            self.consume_queue_table[key] = cq
        return cq

    # -- replication (SLAVE side) --------------------------------------------------------
    def apply_replica(self, offset: int, data) -> int:
        """Append bytes streamed by the master to the CommitLog verbatim
        (:meth:`CommitLog.append_replica`: same rules and errors); no role check.

        Dispatch (``dispatch()`` or the reput actor) then builds ConsumeQueues and
        IndexFiles from them as usual.  Returns the new max physical offset (bytes).

        Raises
        ------
        ReplicaOffsetMismatch, ReplicaDataError, ValueError, StoreError
            Nothing written.
        StoreClosedError
            The store is shut down.
        """
        if self._shutdown:
            raise StoreClosedError("message store is shut down")
        with self._mutex:
            clog = self.commitlog
            rebase = len(data) > 0 and offset != clog.get_max_offset()
            end = clog.append_replica(offset, data)
            if rebase:
                # an empty CommitLog was re-based at the master's offset: nothing below it to dispatch
                self.reput_from_offset = max(self.reput_from_offset, clog.get_min_offset())
            return end

    # -- put ---------------------------------------------------------------------
    def _check_store_status(self) -> Optional[PutMessageResult]:
        if self._shutdown:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, "message store is shut down")
        if self.config.broker_role == "SLAVE":
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, "a SLAVE store is read-only")
        if any(mf.write_error for mf in self.commitlog.mapped_file_queue.files[-1:]):
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    "a CommitLog flush failed; the store is not writeable until restart")
        if self.flush_error:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    f"a CommitLog flush failed; the store is not writeable until restart: "
                                    f"{self.flush_error}")
        if self.disk_full:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    "disk usage above the warning level (DISK_FULL): writes refused until space returns")
        if self.commitlog.is_os_page_cache_busy():
            return PutMessageResult(PutMessageStatus.OS_PAGE_CACHE_BUSY, "[PC_SYNCHRONIZED]broker busy")
        return None

    def put_message(self, topic: str, body: bytes, queue_id: int = 0, *, tags: Optional[str] = None,
                    keys: Union[None, str, Iterable[str]] = None, properties: Optional[dict] = None,
                    flag: int = 0, sys_flag: int = 0, born_timestamp: Optional[int] = None,
                    born_host: Optional[bytes] = None, reconsume_times: int = 0) -> PutMessageResult:
        """Store one message (a batch of one).

        Parameters
        ----------
        topic : str
            TopicValidator rules (SPEC.md §1.9).
        body : bytes
            At most ``max_message_size`` bytes.
        queue_id : int
            ``0 <= queue_id < MAX_QUEUE_NUMS``.
        tags, keys, properties
            Stored in the properties string as TAGS, KEYS (space-joined) and the rest.

        Returns
        -------
        PutMessageResult
            ``status`` PUT_OK (SYNC_FLUSH: durable), or the reason nothing was
            written (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED,
            CREATE_MAPPED_FILE_FAILED, SERVICE_NOT_AVAILABLE, ...).
        """
        props = dict(properties or {})
        if tags:
            props["TAGS"] = tags
        if keys:
            props["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
        if "DELAY" in props and (sys_flag & TRANSACTION_TYPE_MASK) in (0, 0x8):
            topic, queue_id, props = transform_delay(topic, queue_id, props, len(self.config.delay_levels_ms))
        try:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise MessageIllegalError(f"body must be bytes, got {type(body).__name__}")
            batch = _cl.encode_batch([(body, _cl.encode_properties(props), flag)])
        except MessageIllegalError as e:
            return PutMessageResult(PutMessageStatus(e.status), str(e))
        return self.put_encoded(topic, queue_id, batch, None, sys_flag, born_timestamp, born_host, reconsume_times, 1)

    def put_messages(self, topic: str, queue_id: int, batch: bytes, *, properties: Optional[dict] = None,
                     sys_flag: int = 0, born_timestamp: Optional[int] = None, born_host: Optional[bytes] = None,
                     reconsume_times: int = 0, count_hint: int = 0) -> PutMessageResult:
        """Store a batch in RocketMQ's batch encoding (SPEC.md §1.11) for one topic and queue.

        The batch is written whole or not at all, in one CommitLog file, with
        consecutive queue offsets.  ``properties`` are added to every message.
        Transactions and delay levels are refused for batches (MESSAGE_ILLEGAL).
        """
        if len(batch) > self.config.max_message_size:
            # DefaultMessageStore.checkMessages: a batch body is at most maxMessageSize
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL,
                                    f"batch is {len(batch)} bytes, over maxMessageSize {self.config.max_message_size}",
                                    max_body=self.config.max_message_size)
        return self.put_encoded(topic, queue_id, batch, properties, sys_flag, born_timestamp, born_host,
                         reconsume_times, count_hint)

    def put_encoded(self, topic: str, queue_id: int, batch, properties: Optional[dict], sys_flag: int,
                    born_timestamp: Optional[int], born_host: Optional[bytes], reconsume_times: int,
                    count_hint: int, prepared_transaction_offset: int = 0,
                    born_timestamps=None) -> PutMessageResult:
        """Store messages already in RocketMQ's batch encoding (one or many), without the
        batch-size check of :meth:`put_messages` (a single message may be a whole
        ``maxMessageSize`` body).  The broker's send path and the schedule service use it.
        ``prepared_transaction_offset``: the PREPARED TRANSACTION OFFSET field (bytes; the half
        message's physical offset on a transaction's COMMIT record, SPEC.md §1.1 field 14).
        ``born_timestamps``: an ``array("q")`` of one BORNTIMESTAMP (ms) per message, instead of
        ``born_timestamp`` for all (the timer service's re-puts).
        Same result contract as :meth:`put_message`."""
        status = self._check_store_status()
        if status is not None:
            return status
        try:
            tb = check_topic(topic)
            check_queue_id(queue_id)
            if sys_flag & ~KNOWN_SYS_FLAG_BITS:
                raise MessageIllegalError(f"sys flag {sys_flag:#x} has unknown bits")
            extra = _cl.encode_properties(properties) if properties else b""
            if properties and "DELAY" in properties:
                raise MessageIllegalError("delay levels are not supported for batches")
        except MessageIllegalError as e:
            return PutMessageResult(PutMessageStatus(e.status), str(e))
        with self._mutex:
            key = (topic, queue_id)
            qo = self.topic_queue_table.get(key, 0)
            try:
                res = self.commitlog.append(
                    tb, queue_id, qo, batch, sys_flag=sys_flag,
                    born_timestamp=born_timestamp if born_timestamp is not None else int(time.time() * 1000),
                    born_host=born_host, extra_props=extra, reconsume_times=reconsume_times,
                    prepared_transaction_offset=prepared_transaction_offset, count_hint=count_hint,
                    born_timestamps=born_timestamps)
            except MessageIllegalError as e:
                return PutMessageResult(PutMessageStatus(e.status), str(e), max_body=getattr(e, "max_body", 0))
            except StoreDiskFullError as e:
                return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, f"[DISK_FULL] {e}")
            except StoreError as e:
                return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, str(e))
            if (sys_flag & TRANSACTION_TYPE_MASK) not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
                self.topic_queue_table[key] = qo + res.msg_num
        result = PutMessageResult(PutMessageStatus.PUT_OK, "", res)
        if self.config.flush_disk_type == SYNC_FLUSH and self.sync_flush_inline:
            try:
                self.commitlog.flush(0)
            except StoreError as e:
                result = PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, str(e), res)
        return result

    # -- reput / dispatch (SPEC.md §7) ---------------------------------------------------------
    def reput_end_offset(self) -> int:
        """Dispatch bound: under SYNC_FLUSH only what is flushed (5.x confirm offset)."""
        if self.config.flush_disk_type == SYNC_FLUSH:
            return self.commitlog.flushed_offset
        return self.commitlog.get_max_offset()

    def dispatch_behind_bytes(self) -> int:
        return max(0, self.reput_end_offset() - self.reput_from_offset)

    def dispatch(self, max_records: Optional[int] = None) -> int:
        """Build ConsumeQueues and IndexFiles from the CommitLog, from the reput offset on
        (in process; the reput actor does it in the multi-process layout).

        Returns
        -------
        int
            Records dispatched.
        """
        with self._mutex:
            self.dispatcher.reput_from_offset = self.reput_from_offset
            n = self.dispatcher.dispatch(self.reput_end_offset(), max_records)
            self.reput_from_offset = self.dispatcher.reput_from_offset
            if n:
                self.dispatched_store_timestamp = self.dispatcher.dispatched_store_timestamp
            self.dispatcher.arrivals.clear()
            return n

    # -- get (SPEC.md §13) -------------------------------------------------------------------
    def get_messages(self, group: str, topic: str, queue_id: int, queue_offset: int, max_msgs: int,
                     tags: Union[None, str, Iterable[str]] = None, sql_filter=None) -> GetMessageResult:
        """Read up to ``max_msgs`` messages of a queue from ``queue_offset`` (entries).

        ``tags``: ``None`` / ``"*"`` for all, ``"a || b"`` or an iterable of tags;
        matched on tagsCode as RocketMQ's broker does (exact tags are re-checked
        by clients).  ``sql_filter``: a compiled SQL92 expression
        (:func:`rmq.filter.compile_sql92`) evaluated on each message's properties;
        messages it rejects are skipped and count toward ``next_begin_offset`` like
        tag misses (RocketMQ's getMessage with an ExpressionMessageFilter).  ``group``
        names the consumer (for statistics; reads do not depend on it).

        Returns
        -------
        GetMessageResult
            ``status`` from GetMessageStatus and ``next_begin_offset`` as
            RocketMQ's ``getMessage`` (SPEC.md §13.1 table).

        Raises
        ------
        StoreClosedError
        CorruptRecordError
            The first record to serve fails its CRC: it is never served.
        """
        if self._shutdown:
            raise StoreClosedError("message store is shut down")
        cfg = self.config
        clog = self.commitlog
        min_phy = clog.get_min_offset()
        max_phy = clog.get_max_offset()
        cq = self.consume_queue_table.get((topic, queue_id))
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0 if queue_offset else queue_offset,
                                    0, 0)
        min_off = cq.get_min_offset_in_queue()
        max_off = cq.get_max_offset_in_queue()
        if max_off == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if queue_offset < min_off:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if queue_offset == max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, queue_offset, min_off, max_off)
        if queue_offset > max_off:
            nxt = min_off if min_off == 0 else max_off
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)
        codes = tag_codes(tags)
        # a filter may skip entries: read RocketMQ's window; without one, the entries it can take
        raw = cq.read_raw(queue_offset, max_msgs if codes is None and sql_filter is None
                          else max(MIN_CQ_UNITS_PER_READ, max_msgs))
        if not raw:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, cq.roll_next_file(queue_offset),
                                    min_off, max_off)
        first_phy = int.from_bytes(raw[:8], "big", signed=True)
        memory = self.total_physical_memory * cfg.access_message_in_memory_max_ratio // 100
        in_disk = (max_phy - first_phy) > memory
        max_bytes = cfg.max_transfer_bytes_on_message_in_disk if in_disk else cfg.max_transfer_bytes_on_message_in_memory
        max_count = cfg.max_transfer_count_on_message_in_disk if in_disk else cfg.max_transfer_count_on_message_in_memory
        records, count, scanned, outcome, detail = _cl.gather_records(
            clog.mapped_file_queue.files, clog.file_size, raw, codes, min(max_msgs, max_count),
            max_bytes, min_phy, max_phy, cfg.check_crc_on_read, cfg.require_prop_crc, sql_filter)
        if outcome == _cl.GATHER_CORRUPT and count == 0:
            mf = clog.mapped_file_queue.find_mapped_file_by_offset(detail)
            where = f"{mf.file_name} at {detail - mf.file_from_offset}" if mf else f"offset {detail}"
            raise CorruptRecordError(
                f"record of {topic}/{queue_id} queue offset {queue_offset} fails its checks: {where}")
        if count:
            status = GetMessageStatus.FOUND
        elif outcome == _cl.GATHER_MESSAGE_WAS_REMOVING:
            status = GetMessageStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
        last_phy = int.from_bytes(raw[(scanned - 1) * 20:(scanned - 1) * 20 + 8], "big") if scanned else first_phy
        return GetMessageResult(status, queue_offset + scanned, min_off, max_off, records, count,
                                (max_phy - last_phy) > memory)

    # -- look-ups ------------------------------------------------------------------------------
    def look_message_by_offset(self, physical_offset: int):
        """The message (MessageExt) stored at ``physical_offset`` (bytes), or None."""
        rec = self.commitlog.get_message(physical_offset, self.config.check_crc_on_read)
        return _cl.decode_records(rec)[0] if rec else None

    def look_message_by_msg_id(self, msg_id: str):
        """The message of an offset message id (store host + physical offset), or None.

        Raises ValueError for a malformed id.
        """
        _host, offset = _cl.decode_message_id(msg_id)
        return self.look_message_by_offset(offset)

    def query_message(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                      end_ms: Optional[int] = None) -> QueryMessageResult:
        """Messages of ``topic`` whose UNIQ_KEY or one of whose KEYS is ``key``, stored in
        ``[begin_ms, end_ms]`` (IndexFile look-up, SPEC.md §3.5; hash collisions removed)."""
        end_ms = end_ms if end_ms is not None else int(time.time() * 1000) + 1000
        res = self.index_service.query_offset(topic, key, min(max_num, self.config.max_msgs_num_batch),
                                              begin_ms, end_ms)
        phys, last_ts, last_phy = res[0], res[1], res[2]
        out = QueryMessageResult([], last_ts, last_phy)
        # a record re-dispatched after recovery may be indexed twice: serve it once
        for phy in dict.fromkeys(phys):
            rec = self.commitlog.get_message(phy, self.config.check_crc_on_read)
            if rec is None:
                continue
            m = _cl.decode_records(rec, False)[0]
            if m.topic == topic and (m.uniq_key == key or key in m.keys):
                out.records.append(rec)
        return out

    # -- offsets ------------------------------------------------------------------------------
    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue_table.get((topic, queue_id))
        return cq.get_min_offset_in_queue() if cq else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue_table.get((topic, queue_id))
        return cq.get_max_offset_in_queue() if cq else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Queue offset (entries) of the first message stored at ``timestamp_ms`` or nearest (SPEC.md §2.3)."""
        cq = self.consume_queue_table.get((topic, queue_id))
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(timestamp_ms, self.commitlog.pickup_store_timestamp,
                                              self.commitlog.get_min_offset())

    def get_min_phy_offset(self) -> int:
        return self.commitlog.get_min_offset()

    def get_max_phy_offset(self) -> int:
        return self.commitlog.get_max_offset()

    # -- what the broker actor reads and sets (it uses the store through these only) ---------------
    def get_current_queue_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset the CommitLog will assign in ``(topic, queue_id)`` (entries): past
        what was appended, which may be ahead of the ConsumeQueue reput has built (RocketMQ 5's
        ``QueueOffsetOperator.currentQueueOffset``)."""
        return self.topic_queue_table.get((topic, queue_id), 0)

    def select_one_message_by_offset(self, physical_offset: int, check_crc: Optional[bool] = None) -> Optional[bytes]:
        """The stored record at ``physical_offset`` (bytes), or None when it is not held (RocketMQ's
        ``selectOneMessageByOffset``); its CRC is checked when ``check_crc`` (default:
        checkCRCOnRead)."""
        return self.commitlog.get_message(physical_offset,
                                          self.config.check_crc_on_read if check_crc is None else check_crc)

    def get_commit_log_data(self, physical_offset: int, size: int):
        """``size`` bytes of the CommitLog from ``physical_offset`` (a buffer of the mapped file), or
        None when that file is gone; the range must lie in one file."""
        mf = self.commitlog.mapped_file_queue.find_mapped_file_by_offset(physical_offset)
        if mf is None:
            return None
        return mf.read(physical_offset - mf.file_from_offset, size)

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """Store time (ms) of the message at ``queue_offset`` of a queue; 0 when it is not there
        (RocketMQ's ``getMessageStoreTimeStamp``)."""
        cq = self.consume_queue_table.get((topic, queue_id))
        entry = cq.get_entry(queue_offset) if cq is not None else None
        if entry is None:
            return 0
        try:
            return int(self.commitlog.pickup_store_timestamp(entry[0], entry[1]))
        except Exception:  # noqa: BLE001 - a record the cleaner took: no figure
            return 0

    def get_store_timestamp_at(self, physical_offset: int) -> int:
        """Store time (ms) of the first record at or after ``physical_offset`` (a record boundary,
        past a file's end padding); -1 when it cannot be read."""
        return int(self.commitlog.store_timestamp_from(physical_offset))

    def get_earliest_message_time(self) -> int:
        """Store time (ms) of the oldest stored message, -1 without one (``getEarliestMessageTime``)."""
        lo = self.commitlog.get_min_offset()
        if self.commitlog.get_max_offset() <= lo:
            return -1
        return int(self.commitlog.pickup_store_timestamp(lo))

    def get_last_store_timestamp(self) -> int:
        """Store time (ms) of the last record appended (0 before any)."""
        return self.commitlog.last_store_timestamp

    def set_store_host(self, addr: str) -> None:
        """``host:port`` written as the storeHost of every record from now on (the broker's bound
        address).  Raises ValueError when ``addr`` is not ip:port."""
        self.commitlog.store_host = _host_to_bytes(addr)

    def warm_last_commit_log_file(self) -> None:
        """Create and map the CommitLog file appends go to now (warmMapedFileEnable)."""
        self.commitlog.mapped_file_queue.get_last_mapped_file(0, need_create=True)

    def set_flushed_offset(self, flushed: int) -> None:
        """The CommitLog is durable up to ``flushed`` (bytes; another process, flush, msyncs)."""
        self.commitlog.mapped_file_queue.flushed_where = flushed

    def refresh_consume_queue(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Map what reput (another process) wrote to a ConsumeQueue, up to ``max_offset`` entries."""
        self.find_consume_queue(topic, queue_id).mapped_file_queue.refresh(max_offset * CQ_STORE_UNIT_SIZE)

    def drop_deleted_commit_log_files(self, min_offset: int) -> int:
        """Unmap leading CommitLog files the cleaner (another process) deleted and move every
        ConsumeQueue's min offset to the CommitLog's min offset (bytes: ``min_offset``, the
        cleaner's announcement, or further when more files went since it was sent); returns
        files dropped.

        The ConsumeQueues are corrected whenever that min offset passed the one they were last
        corrected to, not only when this call dropped a file: an announcement handled after the
        cleaner deleted more files drops them all, and the next one finds none to drop (the
        ConsumeQueues then kept a min offset in deleted files: pulls from it got
        PULL_RETRY_IMMEDIATELY forever instead of the first stored message)."""
        n = self.commitlog.mapped_file_queue.drop_missing_head()
        target = max(min_offset, self.commitlog.get_min_offset())
        if n or target > self._cq_min_corrected_to:
            for cq in self.consume_queue_table.values():
                cq.correct_min_offset(target)
            self._cq_min_corrected_to = target
        return n

    min_offset = get_min_offset_in_queue
    max_offset = get_max_offset_in_queue
    offset_by_time = get_offset_in_queue_by_time

    # -- expiry (SPEC.md §8; decisions in rmq.store.cleaner) -----------------------------------
    def delete_expired_commitlog_files(self, expired_ms: int, delete_interval_s: float, clean_immediately: bool,
                                       max_files: int, now_ms: Optional[int] = None) -> int:
        """Delete CommitLog files older than ``expired_ms`` (or all but the last when
        ``clean_immediately``), oldest first, never the last file.  Returns files deleted."""
        with self._mutex:
            # never delete what reput has not dispatched yet
            return self.commitlog.mapped_file_queue.delete_expired_file_by_time(
                expired_ms, delete_interval_s, clean_immediately, max_files, now_ms,
                max_end_offset=self.reput_from_offset)

    def delete_expired_queue_files(self, commitlog_min_offset: int) -> tuple[int, int]:
        """Delete ConsumeQueue and IndexFiles wholly below ``commitlog_min_offset`` (SPEC.md §8.3)."""
        with self._mutex:
            cq_files = sum(cq.delete_expired_file(commitlog_min_offset)
                           for cq in self.consume_queue_table.values())
            index_files = self.index_service.delete_expired_file(commitlog_min_offset)
        return cq_files, index_files

    # -- flush / shutdown --------------------------------------------------------------------
    def flush(self) -> None:
        """Flush CommitLog, ConsumeQueues and IndexFiles, then write the checkpoint."""
        with self._mutex:
            self.commitlog.flush(0)
            logics_ts = self.dispatched_store_timestamp
            for cq in list(self.consume_queue_table.values()):
                cq.flush(0)
            self.index_service.flush()
            self.checkpoint.physic_msg_timestamp = self.commitlog.flushed_store_timestamp or \
                self.checkpoint.physic_msg_timestamp
            if logics_ts:
                self.checkpoint.logics_msg_timestamp = logics_ts
            self.checkpoint.master_flushed_offset = self.commitlog.flushed_offset
            self.checkpoint.flush()

    def shutdown(self) -> None:
        """Clean stop: dispatch what is left, flush everything, checkpoint, remove ``abort``, unlock."""
        if self._shutdown:
            return
        try:
            self.dispatch()
            self.flush()
            for m in self._tables():
                m.persist()                  # after (through the writer) any queued persist_soon
            clean = self.dispatch_behind_bytes() == 0 and not any(
                mf.write_error for mf in self.commitlog.mapped_file_queue.files)
            self._shutdown = True
            self.index_service.shutdown()
            for cq in self.consume_queue_table.values():
                cq.shutdown()
            self.commitlog.shutdown()
            self.checkpoint.shutdown()
            if clean and os.path.exists(self.abort_file):
                os.unlink(self.abort_file)
        finally:
            self._shutdown = True
            writer = getattr(self, "config_writer", None)
            if writer is not None:
                writer.close()               # what is queued is written; the thread ends
            self._release_lock()

    close = shutdown

    def _tables(self) -> tuple:
        return (self.topic_config_manager, self.consumer_offset_manager, self.subscription_group_manager,
                self.delay_offset_manager)

    def persist_tables(self) -> None:
        """Write topics, consumer, delay offsets and subscription groups (atomic, with .bak)."""
        for m in self._tables():
            m.persist()

    # -- delayed messages (SPEC.md §10.3) ------------------------------------------------------
    def deliver_delayed(self, now_ms: Optional[int] = None, max_per_level: int = 1000) -> int:
        """Re-put due messages of SCHEDULE_TOPIC_XXXX to their real topic and queue.

        One pass of RocketMQ's per-level DeliverDelayedMessageTimerTask: for each
        level, from its stored offset, every entry whose delivery time (the CQ
        tagsCode) has come is rebuilt without DELAY and stored again; the pass
        stops at the first entry not yet due.  A delivery time further ahead than
        the level's delay (a clock jump) counts as due now.  Returns messages moved.
        """
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        levels = self.config.delay_levels_ms
        moved = 0
        for level in range(1, len(levels) + 1):
            cq = self.consume_queue_table.get((SCHEDULE_TOPIC, level - 1))
            if cq is None:
                continue
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            off = min(max(self.delay_offset_manager.offset_table.get(level, lo), lo), hi)
            done = 0
            while off < hi and done < max_per_level:
                entry = cq.get_entry(off)
                if entry is None:
                    break
                phy, _size, deliver_ts = entry
                if deliver_ts > now + levels[level - 1]:
                    deliver_ts = now
                if deliver_ts > now:
                    break
                rec = self.commitlog.get_message(phy, self.config.check_crc_on_read)
                if rec is not None:
                    m = _cl.decode_records(rec)[0]
                    target = restore_delayed(m.properties)
                    if target is not None:
                        topic, qid, props = target
                        batch = _cl.encode_batch([(m.body, _cl.encode_properties(props), m.flag)])
                        res = self.put_encoded(topic, qid, batch, None, m.sys_flag & ~TRANSACTION_TYPE_MASK,
                                        m.born_timestamp, m.born_host, m.reconsume_times, 1)
                        if not res.ok:
                            log.warning("delayed message at %d not delivered: %s %s", phy, res.status, res.remark)
                            break
                        moved += 1
                off += 1
                done += 1
            self.delay_offset_manager.offset_table[level] = off
        return moved

    def reload_index_for_read(self) -> None:
        """Re-map the IndexFiles from disk (another process, reput, writes them)."""
        old = self.index_service
        fresh = self._new_index_service()
        fresh.load(True, 0)
        self.index_service = fresh
        for f in old.files:
            f.close()

    def close_for_handoff(self) -> None:
        """Broker stop in the multi-process layout: flush the CommitLog, unmap, unlock.

        The ``abort`` file stays: reput and flush still finish their work, and the
        supervisor removes it after every actor stopped cleanly.
        """
        if self._shutdown:
            return
        try:
            self.config_writer.close()           # what persist_soon queued is written
            self.commitlog.flush(0)
        finally:
            self._shutdown = True
            self.commitlog.shutdown()
            for cq in self.consume_queue_table.values():
                cq.shutdown()
            for f in self.index_service.files:
                f.close()
            self.checkpoint._file.close()
            self._release_lock()

    def abandon(self) -> None:
        """Drop the store as a killed process would: no flush, no checkpoint, ``abort`` stays.

        Written bytes stay in the page cache (MAP_SHARED), exactly as after
        ``kill -9``; the next open runs abnormal recovery.  For tests and demos.
        """
        if self._shutdown:
            return
        self._shutdown = True
        self.config_writer.close(drop=True)      # a killed process writes nothing it had queued
        self.commitlog.mapped_file_queue.allocator.shutdown()
        for mf in self.commitlog.mapped_file_queue.files:
            mf.close()
        for cq in self.consume_queue_table.values():
            for mf in cq.mapped_file_queue.files:
                mf.close()
        for f in self.index_service.files:
            f.close()
        self._release_lock()

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
