"""IndexService: the directory of IndexFiles of a store (RocketMQ ``IndexService``, SPEC.md §3.4-§3.5).

Files live in ``<root>/index/`` and are named by their creation time in local
time, ``yyyyMMddHHmmssSSS`` (SPEC.md §0.4); name order is creation order.
Only the last file is written.  When it is full a new one is created whose
header starts at the full file's end phy offset and end timestamp; the full
file is flushed and ``on_file_full(end_timestamp)`` lets the store move the
checkpoint's ``indexMsgTimestamp`` (SPEC.md §4.1).

Concurrency: one writer thread (the dispatch loop calls ``build_index``);
``query_offset`` may run in other threads.  A lock guards the file list, as
RocketMQ's read/write lock does.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Iterable, NamedTuple, Optional

from rmq._core.index_file import IndexFile
from rmq._core.layout import (
    INDEX_MAX_HASH_SLOT_NUM_DEFAULT,
    INDEX_MAX_INDEX_NUM_DEFAULT,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmq._core.mapped_file import TMP_SUFFIX
from rmq.errors import StoreError

log = logging.getLogger(__name__)

MAX_MSGS_NUM_BATCH = 64           # MessageStoreConfig.maxMsgsNumBatch: hits per query
KEY_SEPARATOR = " "               # MessageConst.KEY_SEPARATOR between KEYS tokens
CREATE_RETRY_TIMES = 3            # retryGetAndCreateIndexFile attempts
CREATE_RETRY_INTERVAL_S = 1.0     # seconds between those attempts
FILE_NAME_TIME_DIGITS = 14        # yyyyMMddHHmmss, followed by 3 digits of ms


class QueryOffsetResult(NamedTuple):
    """Result of :meth:`IndexService.query_offset` (RocketMQ ``QueryOffsetResult``)."""

    phy_offsets: list[int]
    """CommitLog offsets of candidate messages, newest first (hash matches only)."""
    index_last_update_timestamp: int
    """ms, end timestamp of the newest index file (0 when there is none)."""
    index_last_update_phyoffset: int
    """end phy offset of the newest index file (0 when there is none)."""


def time_millis_to_file_name(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of ``ms`` (since epoch) in local time (UtilAll.timeMillisToHumanString)."""
    t = time.localtime(ms // 1000)
    return (f"{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}"
            f"{t.tm_hour:02d}{t.tm_min:02d}{t.tm_sec:02d}{ms % 1000:03d}")


def file_name_to_time_millis(name: str) -> Optional[int]:
    """Inverse of :func:`time_millis_to_file_name`; None when ``name`` is not one."""
    if len(name) != FILE_NAME_TIME_DIGITS + 3 or not name.isdigit():
        return None
    try:
        t = time.strptime(name[:FILE_NAME_TIME_DIGITS], "%Y%m%d%H%M%S")
    except ValueError:
        return None
    return int(time.mktime(t)) * 1000 + int(name[FILE_NAME_TIME_DIGITS:])


class IndexService:
    """Builds and queries the message-key index (RocketMQ ``IndexService``).

    Parameters
    ----------
    index_dir : str or PathLike
        Directory of the index files (created on demand).
    max_hash_slot_num : int
        Slots per file (``maxHashSlotNum``, default 5,000,000).
    max_index_num : int
        Entries per file (``maxIndexNum``, default 20,000,000).
    message_index_enable : bool
        ``messageIndexEnable``: when False, ``build_index`` does nothing.
    max_msgs_num_batch : int
        Cap of ``max_num`` in ``query_offset`` (``maxMsgsNumBatch``, 64).
    on_file_full : callable(int), optional
        Called with a full file's end timestamp (ms) after that file was flushed.
    create_retry_times, create_retry_interval_s : int, float
        Attempts (and seconds between them) to create a new file before
        ``write_index_file_error`` is set (RocketMQ: 3 and 1 s).

    Attributes
    ----------
    write_index_file_error : bool
        Sticky: creating an index file failed every retry
        (RocketMQ's ``WRITE_INDEX_FILE_ERROR`` running flag).
    """

    def __init__(self, index_dir: str | os.PathLike[str],
                 max_hash_slot_num: int = INDEX_MAX_HASH_SLOT_NUM_DEFAULT,
                 max_index_num: int = INDEX_MAX_INDEX_NUM_DEFAULT,
                 message_index_enable: bool = True,
                 max_msgs_num_batch: int = MAX_MSGS_NUM_BATCH,
                 on_file_full: Optional[Callable[[int], None]] = None,
                 create_retry_times: int = CREATE_RETRY_TIMES,
                 create_retry_interval_s: float = CREATE_RETRY_INTERVAL_S):
        self.index_dir = os.fsdecode(os.fspath(index_dir))
        self.hash_slot_num = max_hash_slot_num
        self.index_num = max_index_num
        self.message_index_enable = message_index_enable
        self.max_msgs_num_batch = max_msgs_num_batch
        self.on_file_full = on_file_full
        self.create_retry_times = create_retry_times
        self.create_retry_interval_s = create_retry_interval_s
        self.write_index_file_error = False
        self._files: list[IndexFile] = []
        self._lock = threading.RLock()

    @property
    def files(self) -> list[IndexFile]:
        """The index files, oldest first (a copy of the list)."""
        with self._lock:
            return list(self._files)

    # -- startup -----------------------------------------------------------------
    def load(self, last_exit_ok: bool, index_msg_timestamp: int = 0) -> bool:
        """Map the existing files, sorted by name (SPEC.md §5.1 step 2).

        Parameters
        ----------
        last_exit_ok : bool
            False after a dirty shutdown (``abort`` file present): every file
            whose end timestamp is after ``index_msg_timestamp`` is deleted, to
            be rebuilt by dispatch (SPEC.md §4.2).
        index_msg_timestamp : int
            ms, the checkpoint's ``indexMsgTimestamp``.

        Returns
        -------
        bool
            True (errors raise).

        Raises
        ------
        StoreError
            A file cannot be mapped or has the wrong size for the geometry.
        """
        if not os.path.isdir(self.index_dir):
            return True
        with self._lock:
            for name in sorted(os.listdir(self.index_dir)):
                path = os.path.join(self.index_dir, name)
                if not os.path.isfile(path):
                    continue
                if name.endswith(TMP_SUFFIX):
                    os.unlink(path)     # creation cut short by a crash
                    continue
                f = IndexFile(path, self.hash_slot_num, self.index_num, 0, 0)
                if not last_exit_ok and f.end_timestamp > index_msg_timestamp:
                    log.info("abnormal exit: dropping index file %s (end %d > checkpoint %d)",
                             path, f.end_timestamp, index_msg_timestamp)
                    f.destroy()
                    continue
                log.info("loaded index file %s", path)
                self._files.append(f)
        return True

    # -- write path --------------------------------------------------------------
    def _new_file_path(self, last: Optional[IndexFile]) -> str:
        """Path for a new file named by the current time, unique and after ``last``."""
        ms = time.time_ns() // 1_000_000
        last_name = os.path.basename(last.file_name) if last is not None else ""
        last_ms = file_name_to_time_millis(last_name) if last_name else None
        if last_ms is not None and ms <= last_ms:
            ms = last_ms + 1       # same millisecond (or clock step back): keep name order
        while True:
            name = time_millis_to_file_name(ms)
            path = os.path.join(self.index_dir, name)
            if name > last_name and not os.path.exists(path):
                return path
            ms += 1

    def get_and_create_last_index_file(self) -> IndexFile:
        """The last file, or a new one when there is none or the last is full.

        A new file's begin/end phy offset and timestamp start at the full
        file's end values; the full file is then flushed (synchronously) and
        ``on_file_full`` called with its end timestamp.

        Raises
        ------
        StoreError
            The new file cannot be created.
        """
        with self._lock:
            prev: Optional[IndexFile] = None
            last_end_phy_offset = 0
            last_end_timestamp = 0
            if self._files:
                tail = self._files[-1]
                if not tail.is_write_full():
                    return tail
                last_end_phy_offset = tail.end_phy_offset
                last_end_timestamp = tail.end_timestamp
                prev = tail
            try:
                os.makedirs(self.index_dir, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create index directory {self.index_dir}: {e}") from e
            path = self._new_file_path(prev)
            f = IndexFile(path, self.hash_slot_num, self.index_num,
                          last_end_phy_offset, last_end_timestamp)
            self._files.append(f)
        if prev is not None:
            self._flush_file(prev)
        return f

    def _flush_file(self, f: IndexFile) -> None:
        """RocketMQ ``IndexService.flush(f)``: flush, then report a full file's end time."""
        index_msg_timestamp = f.end_timestamp if f.is_write_full() else 0
        f.flush()
        if index_msg_timestamp > 0 and self.on_file_full is not None:
            self.on_file_full(index_msg_timestamp)

    def _retry_get_and_create_index_file(self) -> IndexFile:
        """``get_and_create_last_index_file`` with RocketMQ's retries (SPEC.md §3.4)."""
        if self.write_index_file_error:
            raise StoreError(f"index files in {self.index_dir} cannot be created (sticky error)")
        error: Optional[StoreError] = None
        for attempt in range(self.create_retry_times):
            try:
                return self.get_and_create_last_index_file()
            except StoreError as e:
                error = e
                log.warning("creating an index file in %s failed (attempt %d): %s",
                            self.index_dir, attempt + 1, e)
                if attempt + 1 < self.create_retry_times:
                    time.sleep(self.create_retry_interval_s)
        self.write_index_file_error = True
        raise StoreError(
            f"cannot create an index file in {self.index_dir} after "
            f"{self.create_retry_times} attempts: {error}")

    def _put_key(self, f: IndexFile, topic: str, key: str, phy_offset: int,
                 store_timestamp: int) -> IndexFile:
        while not f.put_key(topic, key, phy_offset, store_timestamp):
            log.info("index file %s is full, creating another one", f.file_name)
            f = self._retry_get_and_create_index_file()
        return f

    def build_index(self, topic: str, keys: Iterable[str] | str | None, uniq_key: Optional[str],
                    phy_offset: int, store_timestamp: int, sys_flag: int = 0) -> None:
        """Index one dispatched message (SPEC.md §3.2).

        Parameters
        ----------
        topic : str
        keys : list of str, or the raw KEYS property (tokens split on one space), or None
            Empty tokens are skipped.
        uniq_key : str or None
            The UNIQ_KEY property; indexed when not None.
        phy_offset : int
            CommitLog offset of the message (bytes).
        store_timestamp : int
            ms.
        sys_flag : int
            Messages of TRANSACTION_ROLLBACK_TYPE are not indexed.

        Raises
        ------
        StoreError
            No index file could be created (``write_index_file_error`` set).
        """
        if not self.message_index_enable:
            return
        f = self._retry_get_and_create_index_file()
        if phy_offset < f.end_phy_offset:
            return    # already indexed (dispatch replays after a restart)
        if sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            return
        if uniq_key is not None:
            f = self._put_key(f, topic, uniq_key, phy_offset, store_timestamp)
        if keys:
            tokens = keys.split(KEY_SEPARATOR) if isinstance(keys, str) else keys
            for key in tokens:
                if key:
                    f = self._put_key(f, topic, key, phy_offset, store_timestamp)

    # -- read path ---------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int,
                     end: int) -> QueryOffsetResult:
        """CommitLog offsets of messages indexed under ``topic``/``key`` (SPEC.md §3.5).

        Parameters
        ----------
        topic, key : str
        max_num : int
            Hits wanted; capped at ``max_msgs_num_batch`` (64).
        begin, end : int
            Store-time window, ms, inclusive.

        Returns
        -------
        QueryOffsetResult
            ``(phy_offsets, index_last_update_timestamp, index_last_update_phyoffset)``;
            offsets newest first.  Only hashes are compared, so a caller must
            re-check topic and key on the messages.
        """
        max_num = min(max_num, self.max_msgs_num_batch)
        phy_offsets: list[int] = []
        last_ts = 0
        last_phy = 0
        with self._lock:
            files = self._files
            for i in range(len(files) - 1, -1, -1):
                f = files[i]
                if i == len(files) - 1:
                    last_ts = f.end_timestamp
                    last_phy = f.end_phy_offset
                if f.is_time_matched(begin, end):
                    f.select_phy_offsets(topic, key, max_num, begin, end, phy_offsets)
                if f.begin_timestamp < begin:
                    break
                if len(phy_offsets) >= max_num:
                    break
        return QueryOffsetResult(phy_offsets, last_ts, last_phy)

    # -- maintenance -------------------------------------------------------------
    def delete_expired_file(self, min_phy_offset: int) -> int:
        """Delete the oldest files whose end phy offset < ``min_phy_offset``.

        Never the last file; stops at the first file still needed.

        Returns
        -------
        int
            Number of files deleted.
        """
        with self._lock:
            if not self._files or self._files[0].end_phy_offset >= min_phy_offset:
                return 0
            expired: list[IndexFile] = []
            for f in self._files[:-1]:
                if f.end_phy_offset < min_phy_offset:
                    expired.append(f)
                else:
                    break
            for f in expired:
                log.info("deleting expired index file %s (end phy %d < %d)",
                         f.file_name, f.end_phy_offset, min_phy_offset)
                f.destroy()
                self._files.remove(f)
            return len(expired)

    def flush(self) -> None:
        """Flush every open file (header, then msync)."""
        with self._lock:
            for f in self._files:
                f.flush()

    def shutdown(self) -> None:
        """Flush and close every file; the service holds no file afterwards."""
        with self._lock:
            try:
                for f in self._files:
                    if not f.closed:
                        f.flush()
            finally:
                for f in self._files:
                    f.close()
                self._files.clear()

    def destroy(self) -> None:
        """Delete every index file."""
        with self._lock:
            for f in self._files:
                f.destroy()
            self._files.clear()
