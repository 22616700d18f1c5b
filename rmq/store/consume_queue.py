"""ConsumeQueue: the per-(topic, queueId) logical index into the CommitLog (SPEC.md §2).

Each entry is a 20-byte big-endian store unit ``commitLogOffset 8 | size 4 |
tagsCode 8`` (``CQ_STORE_UNIT_SIZE``).  Queue offset *k* (entries) lives at
byte ``k * CQ_STORE_UNIT_SIZE`` of the queue; files are named by the 20-digit
byte offset of their first entry, under ``<root>/consumequeue/<topic>/<queueId>/``.

Two offset spaces meet here and every name says which one it is in:

* ``physical_offset`` / ``phy_offset``: bytes of the CommitLog;
* ``queue_offset`` / ``cq_offset``: entries of this queue; ``*_logic_offset``
  and ``expect_logic_offset`` are the same position in **bytes** of the queue.

Concurrency: one writer (the reput/dispatch actor) calls the ``put_*``,
``recover``, ``truncate_*``, ``correct_min_offset`` and ``delete_*`` methods;
readers in the same process may call the ``get_*``/``read_raw`` methods.
Entries are written first and ``wrote_position`` is published after, so a
reader never sees a half-written entry below the max offset.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional

from rmq._core.consume_queue import (fill_blank_entries, lower_bound_physical_offset,
                                     load_entry, put_entries, put_entry, scan_valid)
from rmq._core.layout import CQ_ENTRIES_PER_FILE_DEFAULT, CQ_STORE_UNIT_SIZE
from rmq._core.mapped_file import MappedFile
from rmq.errors import StoreError
from rmq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

#: INT64 upper bound used as "no limit" for physical offsets while scanning
_NO_PHY_LIMIT = (1 << 63) - 1

#: RocketMQ recovers a ConsumeQueue from its third-last file (SPEC.md §5.3)
_RECOVER_FROM_LAST_FILES = 3


def round_up_mapped_file_size(mapped_file_size: int) -> int:
    """``mapped_file_size`` (bytes) rounded UP to a whole number of store units (SPEC.md §2.1)."""
    return -(-mapped_file_size // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


class ConsumeQueue:
    """The logical queue of one (topic, queueId) (RocketMQ ``ConsumeQueue``, SPEC.md §2).

    Parameters
    ----------
    root_dir : str
        Store root (``storePathRootDir``); files go to
        ``<root_dir>/consumequeue/<topic>/<queue_id>/``.
    topic : str
        Topic name.
    queue_id : int
        Queue id within the topic.
    mapped_file_size : int
        Size of each file, bytes; rounded UP to a multiple of
        ``CQ_STORE_UNIT_SIZE`` (default 300,000 entries = 6,000,000 bytes).

    Attributes
    ----------
    min_logic_offset : int
        Byte position (in the queue) of the first readable entry.
    max_physic_offset : int
        ``offset + size`` (CommitLog bytes) of the last entry written or
        recovered; -1 for a new queue.  Dispatch skips anything ending at or
        below it (SPEC.md §2.1).

    Raises
    ------
    StoreError
        ``mapped_file_size`` is not positive.
    """

    def __init__(self, root_dir: str, topic: str, queue_id: int,
                 mapped_file_size: int = CQ_STORE_UNIT_SIZE * CQ_ENTRIES_PER_FILE_DEFAULT):
        if mapped_file_size <= 0:
            raise StoreError(f"consume queue file size must be > 0, got {mapped_file_size}")
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = round_up_mapped_file_size(mapped_file_size)   # bytes
        self.store_path = os.path.join(root_dir, "consumequeue", topic, str(queue_id))
        self.mapped_file_queue = MappedFileQueue(self.store_path, self.mapped_file_size)
        self.max_physic_offset = -1     # CommitLog bytes (RocketMQ starts at -1)
        self.min_logic_offset = 0       # queue bytes
        self._repeat_logged_at = -1.0   # monotonic s of the last "repeatedly" warning
        self._repeats = 0

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic!r}, {self.queue_id}, "
                f"offsets=[{self.get_min_offset_in_queue()}, {self.get_max_offset_in_queue()}), "
                f"max_physic_offset={self.max_physic_offset})")

    @property
    def entries_per_file(self) -> int:
        """Store units per file (``mapped_file_size // CQ_STORE_UNIT_SIZE``)."""
        return self.mapped_file_size // CQ_STORE_UNIT_SIZE

    # -- loading and recovery (SPEC.md §5.1, §5.3) -----------------------------------
    def load(self, drop_tmp: bool = True) -> bool:
        """Map every file of the queue directory (positions at full size until :meth:`recover`);
        ``drop_tmp``: see :meth:`MappedFileQueue.load` (False for a reader of a queue another
        process writes).

        Returns
        -------
        bool
            True (RocketMQ's contract); failures raise.

        Raises
        ------
        StoreError
            A file has the wrong size, a bad name, or the files leave a hole.
        """
        self.mapped_file_queue.load(drop_tmp)
        return True

    def recover(self) -> int:
        """Find the end of the valid entries and truncate there (SPEC.md §5.3).

        The scan starts at the third-last file and walks entries while
        ``offset >= 0 and size > 0``; a fully valid file continues into the
        next, the first invalid entry ends the data.  Everything after it is
        zeroed (that file) or deleted (later files).  ``max_physic_offset``
        becomes ``offset + size`` of the last valid entry, and
        ``min_logic_offset`` skips leading pre-blank entries of the first file.

        Returns
        -------
        int
            Max physical end offset (``offset + size``, CommitLog bytes) of the
            entries scanned; -1 when there are none.  Pre-blank entries
            ``(0, INT32_MAX, 0)`` count as valid but never as an offset (they
            point at no message), unlike RocketMQ where they could.

        Raises
        ------
        StoreError
            Zeroing the torn tail failed (msync).
        """
        mfq = self.mapped_file_queue
        files = mfq.files
        if not files:
            return -1
        index = max(0, len(files) - _RECOVER_FROM_LAST_FILES)
        last_end = max_end = -1
        process_offset = files[index].file_from_offset
        while True:
            mf = files[index]
            n_valid, file_last_end, file_max_end = scan_valid(mf, 0, mf.file_size, _NO_PHY_LIMIT)
            if file_last_end >= 0:
                last_end = file_last_end
            max_end = max(max_end, file_max_end)
            valid_bytes = n_valid * CQ_STORE_UNIT_SIZE
            process_offset = mf.file_from_offset + valid_bytes
            if valid_bytes < mf.file_size or index + 1 >= len(files):
                break
            index += 1
        truncated = mfq.get_max_offset() - process_offset
        mfq.flushed_where = process_offset
        mfq.truncate_dirty_files(process_offset)
        if truncated > 0:
            log.info("consume queue %s/%d: recovered to byte %d, %d bytes truncated",
                     self.topic, self.queue_id, process_offset, truncated)
        if last_end >= 0:
            self.max_physic_offset = last_end
        self.correct_min_offset(0)
        return max_end

    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Drop every entry pointing at/after CommitLog byte ``phy_offset`` (SPEC.md §5.3).

        Repeatedly looks at the last file: when its first entry is at/after
        ``phy_offset`` (or it is empty) the whole file is deleted; otherwise
        the leading valid entries below ``phy_offset`` are kept and the rest
        of the file is zeroed.  ``max_physic_offset`` becomes the end of the
        last kept entry (or ``phy_offset`` when none is kept, as RocketMQ).

        Unlike RocketMQ, the first file is emptied rather than deleted, so
        the max offset stays at its start instead of falling back to 0 and
        later queue offsets stay consistent; and an empty last file is
        dropped (RocketMQ would keep one zero entry of it as data).

        Parameters
        ----------
        phy_offset : int
            CommitLog byte offset where the CommitLog was cut.

        Raises
        ------
        StoreError
            Zeroing the dropped tail failed (msync).
        """
        mfq = self.mapped_file_queue
        self.max_physic_offset = phy_offset
        while True:
            mf = mfq.get_last_mapped_file()
            if mf is None:
                break
            kept, last_end, _ = scan_valid(mf, 0, mf.wrote_position, phy_offset)
            # the only file left is emptied, never deleted: its name keeps the
            # queue's offset base, so the max offset does not fall back to 0
            if kept == 0 and len(mfq.files) > 1:
                log.info("consume queue %s/%d: delete %s (no entry below %d)",
                         self.topic, self.queue_id, mf.file_name, phy_offset)
                mfq.delete_last_mapped_file()
                continue
            pos = kept * CQ_STORE_UNIT_SIZE
            if pos < mf.wrote_position:
                mf.zero_from(pos)
            mf.wrote_position = pos
            mf.flushed_position = min(mf.flushed_position, pos)
            if last_end >= 0:
                self.max_physic_offset = last_end
            break
        mfq.flushed_where = min(mfq.flushed_where, mfq.get_max_offset())

    # -- flushing (SPEC.md §2.4) ----------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """msync dirty pages (at least ``least_pages`` 4 KiB pages per file, 0 = all).

        Returns
        -------
        bool
            True when new bytes became durable.

        Raises
        ------
        StoreError
            msync failed (sticky for that file).
        """
        return self.mapped_file_queue.flush(least_pages)

    # -- put path (SPEC.md §2.1) ---------------------------------------------------------------
    def _start_run(self, cq_offset: int, count: int) -> int:
        """Apply the position rules to a run of ``count`` entries starting at queue offset ``cq_offset``.

        Creates the first file (with pre-blank fill) when the queue has none.

        Returns
        -------
        int
            Number of leading entries of the run to skip as duplicates
            (already at a position below the write position); ``count`` when
            the whole run is a duplicate.
        """
        mfq = self.mapped_file_queue
        expect_logic_offset = cq_offset * CQ_STORE_UNIT_SIZE
        if not mfq.files:
            self._create_first_file(expect_logic_offset, cq_offset)
        current_logic_offset = mfq.get_max_offset()
        if expect_logic_offset < current_logic_offset:
            skip = min(count, -(-(current_logic_offset - expect_logic_offset) // CQ_STORE_UNIT_SIZE))
            # expected after an abnormal recovery re-dispatches: logged at most once a second per
            # queue (a re-dispatch of a large store would otherwise log every entry)
            now = time.monotonic()
            self._repeats += 1
            if now - self._repeat_logged_at >= 1.0:
                log.warning("build consume queue repeatedly, expectLogicOffset: %d currentLogicOffset: %d "
                            "Topic: %s QID: %d Diff: %d (%d run(s) skipped since the last report)",
                            expect_logic_offset, current_logic_offset, self.topic, self.queue_id,
                            expect_logic_offset - current_logic_offset, self._repeats)
                self._repeat_logged_at, self._repeats = now, 0
            return skip
        if expect_logic_offset > current_logic_offset:
            log.warning("[BUG]logic queue order maybe wrong, expectLogicOffset: %d currentLogicOffset: %d "
                        "Topic: %s QID: %d Diff: %d", expect_logic_offset, current_logic_offset,
                        self.topic, self.queue_id, expect_logic_offset - current_logic_offset)
        return 0

    def _create_first_file(self, expect_logic_offset: int, cq_offset: int) -> MappedFile:
        """Create the queue's first file for byte ``expect_logic_offset``; pre-blank fill (SPEC.md §2.1)."""
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file(expect_logic_offset, True)
        if cq_offset != 0 and mf.wrote_position == 0:
            self.min_logic_offset = expect_logic_offset
            mfq.flushed_where = expect_logic_offset
            until = expect_logic_offset % self.mapped_file_size
            mf.wrote_position = fill_blank_entries(mf, 0, until // CQ_STORE_UNIT_SIZE)
            log.info("consume queue %s/%d: first file %s created for offset %d, %d pre-blank entries",
                     self.topic, self.queue_id, mf.file_name, cq_offset, until // CQ_STORE_UNIT_SIZE)
        return mf

    def put_message_position_info(self, phy_offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """Append one entry for queue offset ``cq_offset`` with RocketMQ's idempotency rules (SPEC.md §2.1).

        * ``phy_offset + size <= max_physic_offset``: already built, skipped;
        * expected byte position ``cq_offset * 20`` below the write position:
          duplicate, skipped;
        * above it: ``[BUG]`` warning, appended at the write position anyway;
        * first file of an empty queue with ``cq_offset != 0``: pre-blank fill.

        Parameters
        ----------
        phy_offset : int
            CommitLog byte offset of the record.
        size : int
            Record TOTALSIZE, bytes.
        tags_code : int
            Tag hash / delivery time (SPEC.md §2.2), int64.
        cq_offset : int
            Queue offset (entries) the CommitLog assigned to the record.

        Returns
        -------
        bool
            True when written or skipped as already present; False when no
            file could be created (logged; the caller retries, SPEC.md §2.1).

        Durability: page cache only, until :meth:`flush`.
        """
        if phy_offset + size <= self.max_physic_offset:
            log.debug("maybe try to build consume queue repeatedly maxPhysicOffset=%d phyOffset=%d",
                        self.max_physic_offset, phy_offset)
            return True
        try:
            if self._start_run(cq_offset, 1):
                return True
            mf = self.mapped_file_queue.get_last_mapped_file(0, True)
        except StoreError:
            log.exception("consume queue %s/%d: cannot get a file for offset %d",
                          self.topic, self.queue_id, cq_offset)
            return False
        mf.wrote_position = put_entry(mf, mf.wrote_position, phy_offset, size, tags_code)
        self.max_physic_offset = phy_offset + size
        return True

    def put_batch(self, phys, sizes, tags, first_cq_offset: int, start: int = 0,
                  count: Optional[int] = None) -> int:
        """Append a run of entries for consecutive queue offsets (the batch form of
        :meth:`put_message_position_info`, SPEC.md §2.1).

        The rules apply to the run as a whole: leading entries ending at or
        below ``max_physic_offset`` are skipped, then leading entries whose
        expected position is below the write position (duplicates); the rest
        is appended at the write position, split across file boundaries
        (files are created as needed), one :func:`put_entries` call per file.

        Parameters
        ----------
        phys : int64 buffer (``array('q')``, numpy int64)
            CommitLog byte offsets, ascending.
        sizes : int32 buffer
            Record sizes, bytes.
        tags : int64 buffer
            tagsCodes.
        first_cq_offset : int
            Queue offset (entries) of ``phys[start]``; entry ``start + i`` has
            queue offset ``first_cq_offset + i``.
        start : int
            First index of the arrays to use.
        count : int, optional
            Entries to use; default: to the end of ``phys``.

        Returns
        -------
        int
            Number of entries written (skipped ones and pre-blanks not counted).

        Raises
        ------
        ValueError
            ``start``/``count`` outside an array.
        StoreError
            A file could not be created (e.g. ``StoreDiskFullError``); the
            entries before it are written and counted in ``max_physic_offset``.

        Concurrency: single writer; the GIL is released during each copy.
        Durability: page cache only, until :meth:`flush`.
        """
        if count is None:
            count = len(phys) - start
        if start < 0 or count < 0 or start + count > min(len(phys), len(sizes), len(tags)):
            raise ValueError(f"entries [{start}, {start + count}) outside the arrays "
                             f"(lengths {len(phys)}, {len(sizes)}, {len(tags)})")
        if count == 0:
            return 0
        end = start + count
        max_physic_offset = self.max_physic_offset
        if phys[end - 1] + sizes[end - 1] <= max_physic_offset:
            log.debug("maybe try to build consume queue repeatedly maxPhysicOffset=%d phyOffset=%d..%d",
                        max_physic_offset, phys[start], phys[end - 1])
            return 0
        i = start
        while phys[i] + sizes[i] <= max_physic_offset:
            i += 1
        i += self._start_run(first_cq_offset + (i - start), end - i)
        mfq = self.mapped_file_queue
        written = 0
        while i < end:
            mf = mfq.get_last_mapped_file(0, True)
            pos = mf.wrote_position
            n = min(end - i, (mf.file_size - pos) // CQ_STORE_UNIT_SIZE)
            mf.wrote_position = put_entries(mf, pos, phys, sizes, tags, i, n)
            i += n
            written += n
            self.max_physic_offset = int(phys[i - 1]) + int(sizes[i - 1])
        return written

    # -- offsets (SPEC.md §2.1) -------------------------------------------------------------------
    def get_min_offset_in_queue(self) -> int:
        """First readable queue offset, entries (``min_logic_offset / 20``)."""
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_max_offset_in_queue(self) -> int:
        """Queue offset the next entry gets, entries (``(lastFileStart + wrotePosition) / 20``)."""
        return self.mapped_file_queue.get_max_offset() // CQ_STORE_UNIT_SIZE

    def get_max_physic_offset(self) -> int:
        """End (``offset + size``, CommitLog bytes) of the last entry written; -1 if none."""
        return self.max_physic_offset

    def offset_of_physical_offset(self, physical_offset: int) -> int:
        """Queue offset (entries) of the first entry whose CommitLog offset is ``>= physical_offset``
        (bytes), or :meth:`get_max_offset_in_queue` when every entry points below it: how many of
        this queue's messages were stored before that CommitLog byte.  Binary search per file (the
        entries are in CommitLog order); used to find where an HA epoch ends in a queue."""
        for mf in self.mapped_file_queue.files:
            end = mf.wrote_position
            if end <= 0:
                continue
            pos = lower_bound_physical_offset(mf, 0, end, physical_offset)
            if pos < end:
                return max((mf.file_from_offset + pos) // CQ_STORE_UNIT_SIZE, self.get_min_offset_in_queue())
        return self.get_max_offset_in_queue()

    def roll_next_file(self, queue_offset: int) -> int:
        """First queue offset (entries) of the file after the one holding ``queue_offset``."""
        per_file = self.entries_per_file
        return queue_offset + per_file - queue_offset % per_file

    # -- reads ----------------------------------------------------------------------------------
    def read_raw(self, queue_offset: int, max_entries: int) -> bytes:
        """Raw store units from ``queue_offset`` (RocketMQ ``getIndexBuffer``).

        Parameters
        ----------
        queue_offset : int
            First entry, queue offset (entries).
        max_entries : int
            At most this many entries.

        Returns
        -------
        bytes
            ``20 * n`` bytes, ``n <= max_entries``, never past the written end
            and never crossing the end of the file holding ``queue_offset``;
            ``b""`` when ``queue_offset`` is below the min offset, at/after the
            max offset, or its file is gone.  Decode with
            :func:`rmq._core.consume_queue.decode_entries`.
        """
        offset = queue_offset * CQ_STORE_UNIT_SIZE
        if max_entries <= 0 or queue_offset < 0 or offset < self.min_logic_offset:
            return b""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return b""
        pos = offset - mf.file_from_offset
        end = min(mf.wrote_position, pos + max_entries * CQ_STORE_UNIT_SIZE)
        if end <= pos:
            return b""
        return mf.read(pos, end - pos)

    def get_entry(self, queue_offset: int) -> Optional[tuple[int, int, int]]:
        """The entry at ``queue_offset`` (entries) as ``(phy_offset, size, tags_code)``, or None."""
        offset = queue_offset * CQ_STORE_UNIT_SIZE
        if queue_offset < 0 or offset < self.min_logic_offset:
            return None
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None or offset - mf.file_from_offset >= mf.wrote_position:
            return None
        return load_entry(mf, offset - mf.file_from_offset)

    # -- min offset and deletion (SPEC.md §2.3) --------------------------------------------------
    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move ``min_logic_offset`` to the first entry of the first file at/after ``commitlog_min_offset``.

        Parameters
        ----------
        commitlog_min_offset : int
            CommitLog min offset, bytes.

        Pre-blank entries never qualify.  When no entry of the first file
        does, ``min_logic_offset`` moves past its written end (RocketMQ 5.x;
        4.9 left it unchanged).  Entries are searched by binary search (they
        are in CommitLog order).
        """
        mf = self.mapped_file_queue.get_first_mapped_file()
        if mf is None:
            return
        pos = lower_bound_physical_offset(mf, 0, mf.wrote_position, commitlog_min_offset)
        new_min = mf.file_from_offset + pos
        if new_min != self.min_logic_offset:
            log.info("consume queue %s/%d: min logic offset %d -> %d (commitlog min %d)",
                     self.topic, self.queue_id, self.min_logic_offset, new_min, commitlog_min_offset)
        self.min_logic_offset = new_min

    def delete_expired_file(self, commitlog_min_offset: int) -> int:
        """Delete leading files whose LAST entry points below ``commitlog_min_offset`` (SPEC.md §2.3).

        The last file is never deleted; deletion stops at the first file
        still needed; then :meth:`correct_min_offset`.

        Returns
        -------
        int
            Number of files deleted.
        """
        def last_entry_offset(mf: MappedFile) -> int:
            return load_entry(mf, mf.file_size - CQ_STORE_UNIT_SIZE)[0]

        deleted = self.mapped_file_queue.delete_expired_file_by_offset(commitlog_min_offset,
                                                                        last_entry_offset)
        self.correct_min_offset(commitlog_min_offset)
        return deleted

    # -- search by time (SPEC.md §2.3) -------------------------------------------------------------
    def get_offset_in_queue_by_time(self, timestamp_ms: int, store_time_of: Callable[[int, int], int],
                                    commitlog_min_offset: int = 0) -> int:
        """Queue offset (entries) of the message stored at ``timestamp_ms``, or its nearest neighbour.

        Binary search over the whole queue (not RocketMQ's file-mtime pick):
        entries pointing below ``commitlog_min_offset`` are skipped; the
        first entry with store time == ``timestamp_ms`` is returned; else the
        neighbour closer in time (left on a tie, the left one if there is no
        right one, the right one if there is no left one).

        Parameters
        ----------
        timestamp_ms : int
            Store time searched for, ms since epoch.
        store_time_of : callable (phy_offset: int, size: int) -> int
            Store timestamp (ms) of the CommitLog record; negative when it
            cannot be read.
        commitlog_min_offset : int
            CommitLog min offset, bytes.

        Returns
        -------
        int
            Queue offset, entries.  0 for a queue without files or when a
            record cannot be read (RocketMQ returns 0 then); the max offset
            when no readable entry is left (all below the min offsets).
        """
        first = self.mapped_file_queue.get_first_mapped_file()
        if first is None:
            return 0
        lo = max(self.get_min_offset_in_queue(), first.file_from_offset // CQ_STORE_UNIT_SIZE)
        hi = self.get_max_offset_in_queue()
        if hi <= lo:
            return hi
        # first entry still in the CommitLog (entries are in CommitLog order)
        a, b = lo, hi
        while a < b:
            mid = (a + b) // 2
            entry = self.get_entry(mid)
            if entry is None or entry[0] < commitlog_min_offset:
                a = mid + 1
            else:
                b = mid
        lo = a
        if lo >= hi:
            return hi
        # lower bound of timestamp_ms over [lo, hi)
        a, b = lo, hi
        found_time = -1
        while a < b:
            mid = (a + b) // 2
            phy, size, _ = self.get_entry(mid)
            store_time = store_time_of(phy, size)
            if store_time < 0:
                return 0
            if store_time < timestamp_ms:
                a = mid + 1
            else:
                b = mid
                found_time = store_time
        if a < hi and found_time == timestamp_ms:
            return a
        if a == lo:         # no left neighbour
            return a
        if a == hi:         # no right neighbour
            return hi - 1
        left_time = store_time_of(*self.get_entry(a - 1)[:2])
        right_time = found_time
        if left_time < 0:
            return 0
        return a if abs(timestamp_ms - left_time) > abs(timestamp_ms - right_time) else a - 1

    # -- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Unmap every file (no flush: call :meth:`flush` first)."""
        self.mapped_file_queue.shutdown()

    def destroy(self) -> None:
        """Delete every file and reset the offsets (RocketMQ ``destroy``)."""
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.mapped_file_queue.destroy()
