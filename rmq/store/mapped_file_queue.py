"""MappedFileQueue: a directory of fixed-size MappedFiles forming one log (SPEC.md §1.1).

Files are named by the 20-digit, zero-padded offset of their first byte
(SPEC.md §0.4).  The CommitLog and every ConsumeQueue are a MappedFileQueue.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional

from rmq._core.mapped_file import TMP_SUFFIX, MappedFile
from rmq.errors import StoreError

FILE_NAME_DIGITS = 20  # SPEC.md §0.4
HEAD_CHECK_INTERVAL_S = 1.0   # refresh() looks for head files another process deleted at most this often


def offset_to_file_name(offset: int) -> str:
    """20-digit zero-padded decimal name of the file starting at ``offset`` (bytes)."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


class AllocateMappedFileService:
    """Creates the next mapped file in a background thread (SPEC.md §6.7).

    ``request(path)`` queues creation (and warm-up) of a file; ``take(path)``
    returns the file if the service already made it, else ``None`` and the
    caller creates it itself.  fallocate, mmap and page touching release the
    GIL, so the writer keeps appending meanwhile.
    """

    def __init__(self, file_size: int, warm: bool = False):
        self.file_size = file_size
        self.warm = warm
        self._ready: dict[str, MappedFile] = {}
        self._pending: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = False

    def request(self, path: str) -> None:
        with self._lock:
            if self._closed or path in self._ready or path in self._pending or os.path.exists(path):
                return
            t = threading.Thread(target=self._create, args=(path,), daemon=True, name="rmq-allocate")
            self._pending[path] = t
        t.start()

    def _create(self, path: str) -> None:
        try:
            mf = MappedFile(path, self.file_size, True)
            if self.warm:
                mf.warm_up()
        except Exception:  # noqa: BLE001 - the writer retries synchronously and reports the error
            mf = None
        with self._lock:
            self._pending.pop(path, None)
            if mf is not None:
                if self._closed:
                    mf.destroy()
                else:
                    self._ready[path] = mf

    def take(self, path: str, wait_s: float = 5.0) -> Optional[MappedFile]:
        with self._lock:
            t = self._pending.get(path)
        if t is not None:
            t.join(wait_s)
        with self._lock:
            return self._ready.pop(path, None)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no creation is under way (files and ``.tmp`` names stop changing).

        Returns ``True`` when idle, ``False`` after ``timeout_s`` seconds.  A tool or test that
        lists or touches the directory calls this first: a creation renames ``NAME.tmp`` to
        ``NAME`` behind the caller's back.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending.values())
            if not pending:
                return True
            for t in pending:
                t.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                with self._lock:
                    return not self._pending

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
        for t in pending:
            t.join(30)
        with self._lock:
            for mf in self._ready.values():
                mf.destroy()   # pre-allocated, never written: not part of the log
            self._ready.clear()


class MappedFileQueue:
    """An ordered list of MappedFiles under one directory (RocketMQ ``MappedFileQueue``).

    Parameters
    ----------
    store_path : str
        Directory of the files (created if missing).
    mapped_file_size : int
        Size of every file, bytes.
    allocator : AllocateMappedFileService, optional
        Pre-allocates the file after the one being created (CommitLog only).
    """

    def __init__(self, store_path: str, mapped_file_size: int,
                 allocator: Optional[AllocateMappedFileService] = None):
        if mapped_file_size <= 0:
            raise StoreError(f"mapped file size must be > 0, got {mapped_file_size}")
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        self.files: list[MappedFile] = []
        self.flushed_where = 0   # physical offset made durable (bytes)
        self._head_checked_at = float("-inf")   # time.monotonic() of refresh's last head check

    # -- loading -----------------------------------------------------------------
    def load(self, drop_tmp: bool = True) -> None:
        """Map every file of the directory, sorted by name; every file must be full size.

        Positions start at the full file size; recovery fixes the tail.  ``*.tmp`` files (a file
        being created: written as NAME.tmp, then renamed) are never mapped; with ``drop_tmp`` they
        are deleted as creations a crash cut short.  Only the queue's writer may do that, at its
        start: a reader (the broker's view of the ConsumeQueues reput writes, the actors' view of
        the broker's CommitLog) would delete a file the writer is creating this instant, and the
        writer's rename then fails (reput died so in a CI run).

        Raises
        ------
        StoreError
            A file has the wrong size or a name that is not a 20-digit offset.
        """
        os.makedirs(self.store_path, exist_ok=True)
        names = sorted(n for n in os.listdir(self.store_path) if not n.startswith("."))
        for name in names:
            path = os.path.join(self.store_path, name)
            if not os.path.isfile(path):
                continue
            if name.endswith(TMP_SUFFIX):
                if drop_tmp:
                    os.unlink(path)     # a creation cut short by a crash: never part of the log
                continue
            if len(name) != FILE_NAME_DIGITS or not name.isdigit():
                raise StoreError(f"unexpected file {path} in a mapped file queue")
            size = os.path.getsize(path)
            if size != self.mapped_file_size:
                raise StoreError(
                    f"{path} is {size} bytes, expected {self.mapped_file_size}; "
                    "check the configured mapped file size")
            mf = MappedFile(path, self.mapped_file_size, False)
            mf.wrote_position = self.mapped_file_size
            mf.flushed_position = self.mapped_file_size
            self.files.append(mf)
        for prev, nxt in zip(self.files, self.files[1:]):
            if nxt.file_from_offset != prev.file_from_offset + self.mapped_file_size:
                raise StoreError(
                    f"hole in {self.store_path}: {os.path.basename(nxt.file_name)} does not follow "
                    f"{os.path.basename(prev.file_name)}")

    def drop_missing_head(self) -> int:
        """Unmap leading files another process (the cleaner) deleted; returns how many."""
        n = 0
        while len(self.files) > 1 and not os.path.exists(self.files[0].file_name):
            self.files.pop(0).close()
            n += 1
        return n

    def refresh(self, readable_end: int) -> None:
        """Reader side of a queue another process writes: map the files it created,
        forget the ones deleted (by the cleaner) and expose bytes up to ``readable_end``.

        ``readable_end`` is a queue offset (bytes) the writer announced.  Deleted head files are
        looked for at most every ``HEAD_CHECK_INTERVAL_S`` (a stat per call was 2-5 % of the broker's
        profile under POP: it refreshes a ConsumeQueue per dispatch announcement); until then
        their mapping stays valid (an unlinked file's pages live while mapped) and every reader
        bounds its reads by the min offset, which the cleaner's announcement moves at once.
        """
        if len(self.files) > 1:
            now = time.monotonic()
            if now - self._head_checked_at >= HEAD_CHECK_INTERVAL_S:
                self._head_checked_at = now
                self.drop_missing_head()
        size = self.mapped_file_size
        if self.files:
            nxt = self.files[-1].file_from_offset + size
        else:
            try:
                names = sorted(n for n in os.listdir(self.store_path)
                               if len(n) == FILE_NAME_DIGITS and n.isdigit())
            except FileNotFoundError:
                names = []
            nxt = int(names[0]) if names else readable_end - readable_end % size
        while nxt < readable_end:
            path = os.path.join(self.store_path, offset_to_file_name(nxt))
            if not os.path.exists(path):
                break
            self.files.append(MappedFile(path, size, False))
            nxt += size
        for mf in self.files:
            pos = min(max(readable_end - mf.file_from_offset, 0), size)
            if pos > mf.wrote_position or mf is self.files[-1]:
                mf.wrote_position = pos

    # -- lookups -----------------------------------------------------------------
    def get_first_mapped_file(self) -> Optional[MappedFile]:
        return self.files[0] if self.files else None

    def get_last_mapped_file(self, start_offset: int = -1, need_create: bool = False) -> Optional[MappedFile]:
        """The last file; with ``need_create``, a new one when there is none or it is full.

        ``start_offset`` (bytes) places the first file when the queue is empty
        (rounded down to a file boundary).
        """
        last = self.files[-1] if self.files else None
        if not need_create or (last is not None and not last.is_full()):
            return last
        if last is None:
            create_offset = max(start_offset, 0)
            create_offset -= create_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        return self._create(create_offset)

    def _create(self, offset: int) -> MappedFile:
        os.makedirs(self.store_path, exist_ok=True)
        path = os.path.join(self.store_path, offset_to_file_name(offset))
        mf = None
        if self.allocator is not None:
            mf = self.allocator.take(path)
        if mf is None:
            mf = MappedFile(path, self.mapped_file_size, True)
            if self.allocator is not None and self.allocator.warm:
                mf.warm_up()      # warmMapedFileEnable covers the first file too
        if self.allocator is not None:
            self.allocator.request(os.path.join(self.store_path,
                                                offset_to_file_name(offset + self.mapped_file_size)))
        self.files.append(mf)
        return mf

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> Optional[MappedFile]:
        """The file holding byte ``offset`` of the queue (SPEC.md §1.1), or None."""
        if not self.files:
            return None
        first = self.files[0]
        index = offset // self.mapped_file_size - first.file_from_offset // self.mapped_file_size
        if 0 <= index < len(self.files):
            mf = self.files[index]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        return first if return_first_on_not_found else None

    def get_min_offset(self) -> int:
        """Offset of the first byte still held (bytes); 0 for an empty queue."""
        return self.files[0].file_from_offset if self.files else 0

    def get_max_offset(self) -> int:
        """Offset just past the last byte written (bytes)."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.file_from_offset + last.wrote_position

    def get_max_flushed_offset(self) -> int:
        return self.flushed_where

    def roll_next_file(self, offset: int) -> int:
        """Start offset of the file after the one holding ``offset``."""
        return offset + self.mapped_file_size - offset % self.mapped_file_size

    # -- flushing ----------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush from ``flushed_where`` on; returns True when something new became durable.

        Raises
        ------
        StoreError
            msync failed; ``flushed_where`` is unchanged.
        """
        before = self.flushed_where
        mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
        while mf is not None:
            pos = mf.flush(least_pages)
            where = mf.file_from_offset + pos
            if where <= self.flushed_where and pos < mf.wrote_position:
                break
            self.flushed_where = max(self.flushed_where, where)
            if pos < self.mapped_file_size:
                break
            mf = self.find_mapped_file_by_offset(mf.file_from_offset + self.mapped_file_size)
        return self.flushed_where > before

    # -- truncation and deletion ------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> int:
        """Cut the queue at ``offset`` (bytes): later files are destroyed, the file
        holding it is zeroed from there (SPEC.md §5.2).

        Returns
        -------
        int
            Bytes dropped (positions past ``offset``).
        """
        dropped = 0
        keep: list[MappedFile] = []
        for mf in self.files:
            end = mf.file_from_offset + self.mapped_file_size
            if end <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                dropped += max(0, mf.wrote_position - pos)
                mf.zero_from(pos)
                mf.wrote_position = pos
                mf.flushed_position = pos
                keep.append(mf)
            else:
                dropped += mf.wrote_position
                mf.destroy()
        self.files = keep
        self.flushed_where = min(self.flushed_where, offset)
        return dropped

    def delete_last_mapped_file(self) -> None:
        if self.files:
            self.files.pop().destroy()

    def delete_expired_file_by_time(self, expired_ms: int, delete_interval_s: float,
                                    clean_immediately: bool, max_files: int = 10,
                                    now_ms: Optional[int] = None, max_end_offset: Optional[int] = None) -> int:
        """Delete old files, oldest first, never the last one (SPEC.md §8.2).

        A file is deleted when its last modification is ``expired_ms`` ago or
        ``clean_immediately``; deletion stops at the first file kept (no holes),
        and at a file that ends after ``max_end_offset`` (bytes; e.g. not yet dispatched).

        Returns
        -------
        int
            Number of files deleted.
        """
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        deleted = 0
        while len(self.files) > 1 and deleted < max_files:
            mf = self.files[0]
            if max_end_offset is not None and mf.file_from_offset + self.mapped_file_size > max_end_offset:
                break
            mtime_ms = int(os.path.getmtime(mf.file_name) * 1000)
            if not (now >= mtime_ms + expired_ms or clean_immediately):
                break
            self.files.pop(0).destroy()
            deleted += 1
            if delete_interval_s > 0 and len(self.files) > 1 and deleted < max_files:
                time.sleep(delete_interval_s)
        return deleted

    def delete_expired_file_by_offset(self, min_offset: int,
                                      last_entry_offset: Callable[[MappedFile], int]) -> int:
        """Delete leading files whose last entry points below ``min_offset`` (SPEC.md §2.3).

        ``last_entry_offset(mf)`` returns the physical offset the file's last
        unit refers to.  The last file is never deleted.
        """
        deleted = 0
        while len(self.files) > 1:
            mf = self.files[0]
            if last_entry_offset(mf) >= min_offset:
                break
            self.files.pop(0).destroy()
            deleted += 1
        return deleted

    def shutdown(self) -> None:
        for mf in self.files:
            mf.close()
        if self.allocator is not None:
            self.allocator.shutdown()

    def destroy(self) -> None:
        """Delete every file of the queue and the directory if it is then empty."""
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.flushed_where = 0
        try:
            os.rmdir(self.store_path)
        except OSError:
            pass
