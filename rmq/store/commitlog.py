"""CommitLog: the one append-only log of every message (SPEC.md §1, §5.2, §6).

Owns the CommitLog MappedFileQueue: batch append (the Cython ``append_batch``
does the records), roll to the next file, flush, and normal / abnormal
recovery with CRC checks and truncation of a torn tail.
"""
from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Optional

from rmq._core import commitlog as _cl
from rmq._core.layout import BATCH_FIXED_LENGTH
from rmq.errors import StoreCorruptionError, StoreError
from rmq.store.config import MessageStoreConfig
from rmq.store.mapped_file_queue import AllocateMappedFileService, MappedFileQueue

log = logging.getLogger(__name__)


def host_to_bytes(host: str) -> bytes:
    """``"ip:port"`` -> 8 bytes (IPv4) or 20 bytes (IPv6) as stored in records (SPEC.md §1.2)."""
    import ipaddress
    addr, _, port = host.rpartition(":")
    ip = ipaddress.ip_address(addr.strip("[]"))
    return ip.packed + int(port).to_bytes(4, "big", signed=True)


class ReplicaOffsetMismatch(StoreError):
    """Replicated data does not start at the slave CommitLog's end.

    Attributes
    ----------
    expected, got : int
        The slave's max physical offset and the offset the data claims (bytes).
    """

    def __init__(self, expected: int, got: int, reason: str = ""):
        msg = f"replica data at offset {got}, but the CommitLog ends at {expected}"
        super().__init__(f"{msg}: {reason}" if reason else msg)
        self.expected = expected
        self.got = got


class ReplicaDataError(StoreError):
    """Replicated data fails its checks: nothing was written.

    Attributes
    ----------
    offset : int
        Physical offset (bytes) of the first record that fails.
    result : str
        The check result (``BAD_CRC``, ``TRUNCATED``, ``BAD_PHYSICAL_OFFSET``, ...).
    """

    def __init__(self, offset: int, result: str, detail: str = ""):
        super().__init__(f"replica data invalid at physical offset {offset}: {result}"
                         + (f" ({detail})" if detail else ""))
        self.offset = offset
        self.result = result


class AppendResult:
    """Where a batch went: first physical offset, bytes, count and per-record offsets."""

    __slots__ = ("wrote_offset", "wrote_bytes", "msg_num", "queue_offset", "store_timestamp",
                 "physical_offsets", "store_host")

    def __init__(self, wrote_offset, wrote_bytes, msg_num, queue_offset, store_timestamp,
                 physical_offsets, store_host):
        self.wrote_offset = wrote_offset          # physical offset of the first record, bytes
        self.wrote_bytes = wrote_bytes
        self.msg_num = msg_num
        self.queue_offset = queue_offset          # queue offset of the first message, entries
        self.store_timestamp = store_timestamp    # ms
        self.physical_offsets = physical_offsets  # array('q'), one per record
        self.store_host = store_host

    @property
    def msg_id(self) -> str:
        """Offset message ids of the records, comma-joined (SPEC.md §1.8)."""
        return _cl.create_message_ids(self.store_host, self.physical_offsets)

    @property
    def msg_ids(self) -> list[str]:
        """Offset message ids of the records (SPEC.md §1.8)."""
        return self.msg_id.split(",") if self.msg_num else []


class CommitLog:
    """The CommitLog of one store (RocketMQ ``CommitLog``).

    Concurrency: one writer (the broker).  Durability: a record is durable once
    ``flushed_offset`` passes its end.
    """

    def __init__(self, config: MessageStoreConfig, store_path: str):
        self.config = config
        self.store_path = store_path
        allocator = AllocateMappedFileService(config.mapped_file_size_commit_log,
                                              warm=config.warm_mapped_file_enable)
        self.mapped_file_queue = MappedFileQueue(store_path, config.mapped_file_size_commit_log, allocator)
        self.store_host = host_to_bytes(config.store_host)
        self.last_store_timestamp = 0         # ms, store time of the last record appended
        self.flushed_store_timestamp = 0      # ms, store time of the last record made durable
        self.begin_time_in_lock = 0.0         # s (monotonic), 0 when no append runs (page-cache busy check)
        self._scratch = array("q")            # physical offsets of the batch being appended

    @property
    def file_size(self) -> int:
        return self.mapped_file_queue.mapped_file_size

    # -- offsets -----------------------------------------------------------------
    def get_min_offset(self) -> int:
        """First physical offset still held, bytes."""
        return self.mapped_file_queue.get_min_offset()

    def get_max_offset(self) -> int:
        """Physical offset just past the last record, bytes."""
        return self.mapped_file_queue.get_max_offset()

    @property
    def flushed_offset(self) -> int:
        return self.mapped_file_queue.flushed_where

    # -- append ------------------------------------------------------------------
    def append(self, topic: bytes, queue_id: int, queue_offset: int, batch: bytes, *,
               sys_flag: int = 0, born_timestamp: int = 0, born_host: Optional[bytes] = None,
               extra_props: bytes = b"", reconsume_times: int = 0,
               prepared_transaction_offset: int = 0, count_hint: int = 0,
               born_timestamps=None) -> AppendResult:
        """Append a batch (RocketMQ batch encoding) as CommitLog records.

        ``born_timestamps``: an ``array("q")`` of one born timestamp (ms) per element, instead of
        ``born_timestamp`` for all.

        Raises
        ------
        MessageIllegalError
            Bad batch / topic / sizes: nothing written.
        StoreDiskFullError, StoreError
            The next file could not be created: nothing written.
        """
        # per-record physical offsets land in a reused scratch array sized by an upper bound on
        # the count (every batch element takes at least BATCH_FIXED_LENGTH bytes): no extra pass
        bound = count_hint if count_hint > 0 else len(batch) // BATCH_FIXED_LENGTH + 1
        if len(self._scratch) < bound:
            self._scratch = array("q", bytes(8 * max(bound, 2 * len(self._scratch))))
        out = self._scratch
        store_ts = max(int(time.time() * 1000), self.last_store_timestamp)
        bh = born_host if born_host is not None else self.store_host
        mfq = self.mapped_file_queue
        self.begin_time_in_lock = time.monotonic()
        try:
            rolls = 0
            while True:
                mf = mfq.get_last_mapped_file(0, need_create=True)
                try:
                    status, count, wrote, qinc = _cl.append_batch(
                        mf, batch, topic, queue_id, queue_offset, sys_flag, born_timestamp, bh,
                        self.store_host, store_ts, extra_props, self.config.enabled_append_prop_crc,
                        reconsume_times, prepared_transaction_offset, self.config.max_message_size, out,
                        born_timestamps)
                except ValueError as e:
                    if "out_physical_offsets" not in str(e):
                        raise
                    # the caller's count was short: size the output exactly and try again
                    n, _ = _cl.validate_batch(batch, extra_props, len(topic), sys_flag,
                                              self.config.max_message_size, self.config.enabled_append_prop_crc)
                    out = self._scratch = array("q", bytes(8 * n))
                    continue
                if status == _cl.PUT_OK:
                    offsets = out[:count]
                    self.last_store_timestamp = store_ts
                    return AppendResult(offsets[0], wrote, count, queue_offset, store_ts, offsets, self.store_host)
                rolls += 1      # END_OF_FILE: a blank record closed the file; the next one takes the batch
                if rolls > 1:
                    raise StoreError("batch did not fit a fresh CommitLog file")   # size is checked first
        finally:
            self.begin_time_in_lock = 0.0

    def append_replica(self, offset: int, data) -> int:
        """Append bytes received from the master verbatim (a slave's CommitLog is a byte
        copy of its master's; record layout: SPEC.md §1.2-§1.3).

        Parameters
        ----------
        offset : int
            Physical offset (bytes) of ``data[0]`` in the master's CommitLog.
            Must equal :meth:`get_max_offset`, except on a CommitLog holding no
            byte (no file, or a single empty file), which takes any offset at a
            file boundary: its first file is (re)created there.  At a file
            boundary the next file is created.
        data : bytes-like
            Whole records, each checking (CRC per ``check_crc_on_recover`` /
            ``require_prop_crc``, as recovery) and carrying its own physical
            offset, optionally ended by the end-of-file BLANK record reaching
            exactly the file end; all within one file
            (``offset % file_size + len(data) <= file_size``).

        Returns
        -------
        int
            The new max offset (bytes).  Empty ``data``: no-op, the max offset.

        Raises
        ------
        ReplicaOffsetMismatch
            ``offset`` is not where the CommitLog ends.
        ValueError
            ``data`` crosses a file end.
        ReplicaDataError
            A record fails its checks (offset and check result in the message).
        StoreDiskFullError, StoreError
            The next file could not be created.

        Nothing is written when an error is raised.  Durability: page cache
        until :meth:`flush`.
        """
        n = len(data)
        mfq = self.mapped_file_queue
        size = self.file_size
        max_offset = self.get_max_offset()
        if n == 0:
            return max_offset
        files = mfq.files
        empty = not files or (len(files) == 1 and files[0].wrote_position == 0)
        if offset != max_offset:
            if not empty:
                raise ReplicaOffsetMismatch(max_offset, offset)
            if offset < 0 or offset % size:
                raise ReplicaOffsetMismatch(max_offset, offset,
                                            f"an empty CommitLog starts at a file boundary (multiple of {size})")
        if offset % size + n > size:
            raise ValueError(f"replica data of {n} bytes at offset {offset} crosses the end of the "
                             f"CommitLog file starting at {offset - offset % size} ({size}-byte files)")
        end, result, count, last_ts = _cl.validate_replica(data, offset, size, self.config.check_crc_on_recover,
                                                           self.config.require_prop_crc)
        if result not in ("OK", "BLANK"):
            raise ReplicaDataError(offset + end, result, f"{count} valid records before it in a chunk of {n} "
                                                         f"bytes at {offset}")
        if offset != max_offset:         # empty log re-based at the master's offset
            for mf in list(files):
                mf.destroy()
            files.clear()
        mf = mfq.get_last_mapped_file(offset, need_create=True)
        if mf.file_from_offset + mf.wrote_position != offset:   # cannot happen: checked above
            raise StoreError(f"CommitLog file {mf.file_name} ends at {mf.file_from_offset + mf.wrote_position}, "
                             f"replica data is for {offset}")
        if offset != max_offset:
            mfq.flushed_where = offset
        mf.append(data)
        if count:
            self.last_store_timestamp = last_ts
        return offset + n

    def is_os_page_cache_busy(self) -> bool:
        """True while an append has run longer than osPageCacheBusyTimeOutMills (SPEC.md §6.3)."""
        begin = self.begin_time_in_lock
        if not begin:
            return False
        diff_ms = (time.monotonic() - begin) * 1000
        return self.config.os_page_cache_busy_time_out_mills < diff_ms < 10_000_000

    # -- read --------------------------------------------------------------------
    def get_message(self, physical_offset: int, check_crc: bool = True) -> Optional[bytes]:
        """The whole record at ``physical_offset`` (bytes) if it is held and checks, else None."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(physical_offset)
        if mf is None or physical_offset >= self.get_max_offset():
            return None
        return _cl.read_record(mf, physical_offset - mf.file_from_offset, check_crc,
                               self.config.require_prop_crc)

    def pickup_store_timestamp(self, physical_offset: int, size: int = 0) -> int:
        """Store timestamp (ms) of the record at ``physical_offset``; -1 if it cannot be read."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(physical_offset)
        if mf is None:
            return -1
        return _cl.store_timestamp_at(mf, physical_offset - mf.file_from_offset)

    def store_timestamp_from(self, physical_offset: int) -> int:
        """Store timestamp (ms) of the first record at or after ``physical_offset`` (a record
        boundary): the record there, or -- when the offset is a file's end padding (the BLANK
        record, SPEC.md §1.3) -- the next file's first record.  -1 when neither can be read."""
        ts = self.pickup_store_timestamp(physical_offset)
        if ts > 0:
            return ts
        size = self.config.mapped_file_size_commit_log
        nxt = (physical_offset // size + 1) * size
        return self.pickup_store_timestamp(nxt) if nxt < self.get_max_offset() else -1

    # -- flush -------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """msync from the flushed offset on; True if something new became durable."""
        ts = self.last_store_timestamp
        flushed = self.mapped_file_queue.flush(least_pages)
        if self.flushed_offset >= self.get_max_offset():
            self.flushed_store_timestamp = ts
        return flushed

    # -- recovery (SPEC.md §5.2) -----------------------------------------------------
    def load(self) -> None:
        self.mapped_file_queue.load()

    def _scan_from(self, index: int, durable_offset: int = 0) -> tuple[int, int]:
        """Walk files from ``index``; return (process_offset, records).

        A bad record (or a missing file) below ``durable_offset`` (bytes: what
        the checkpoint says was msync'd) is corruption, not a torn tail: it
        raises :class:`StoreCorruptionError` naming the file and position,
        and nothing is truncated.
        """
        files = self.mapped_file_queue.files
        check_crc = self.config.check_crc_on_recover
        process_offset = files[index].file_from_offset
        records = 0
        while index < len(files):
            mf = files[index]
            end_pos, result, count, last_ts = _cl.scan_valid(mf, 0, check_crc, self.config.require_prop_crc)
            records += count
            if count:
                self.last_store_timestamp = max(self.last_store_timestamp, last_ts)
            if result == "BLANK":
                process_offset = mf.file_from_offset + self.file_size
                index += 1
                continue
            process_offset = mf.file_from_offset + end_pos
            if process_offset < durable_offset:
                raise StoreCorruptionError(
                    f"CommitLog corrupted below the durable offset: {result} in {mf.file_name} at position "
                    f"{end_pos} (physical offset {process_offset}), but the checkpoint records the log as "
                    f"flushed to disk up to {durable_offset}; refusing to truncate "
                    f"{durable_offset - process_offset} bytes of durable (possibly acknowledged) data. "
                    f"Repair or restore this file (e.g. from a slave) before starting",
                    mf.file_name, end_pos, process_offset, durable_offset)
            if result != "BAD_MAGIC" or not _all_zero_tail(mf, end_pos):
                log.warning("CommitLog recovery stops at %d (%s in %s at %d)",
                            process_offset, result, os.path.basename(mf.file_name), end_pos)
            break
        if process_offset < durable_offset and index >= len(files):
            raise StoreCorruptionError(
                f"CommitLog files missing below the durable offset: the log ends at {process_offset} "
                f"(after {os.path.basename(files[-1].file_name)}), but the checkpoint records it as "
                f"flushed to disk up to {durable_offset}",
                files[-1].file_name, self.file_size, process_offset, durable_offset)
        return process_offset, records

    def _sync_recovered(self, index: int) -> None:
        """msync what recovery accepted from ``files[index]`` on: after a crash it may
        sit only in the page cache, and later acknowledged records are appended after it."""
        for mf in self.mapped_file_queue.files[index:]:
            if mf.wrote_position > 0:
                mf.sync_range(0, mf.wrote_position)

    def recover_normally(self, durable_offset: int = 0) -> int:
        """Clean-exit recovery: scan from the third-last file, truncate after the last whole record.

        ``durable_offset`` (bytes): the checkpoint's flushed offset; damage
        below it raises :class:`StoreCorruptionError`.

        Returns
        -------
        int
            The recovered max physical offset (bytes).
        """
        files = self.mapped_file_queue.files
        if not files:
            return 0
        process_offset, _ = self._scan_from(max(0, len(files) - 3), durable_offset)
        self.truncate(process_offset)
        return process_offset

    def recover_abnormally(self, min_timestamp: int, durable_offset: int = 0) -> tuple[int, int]:
        """Crash recovery: from the newest file whose first record was stored by
        ``min_timestamp`` (ms, the checkpoint's), scan and truncate; then msync
        everything kept from there (it may have been in the page cache only).

        ``durable_offset`` (bytes): the checkpoint's flushed offset; damage
        below it raises :class:`StoreCorruptionError`.

        Returns
        -------
        (redispatch_from, max_offset) : (int, int)
            Physical offsets: where re-dispatch must start, and the recovered end.
        """
        files = self.mapped_file_queue.files
        if not files:
            return 0, 0
        index = len(files) - 1
        while index >= 0:
            ts = _cl.first_store_timestamp(files[index])
            if ts != 0 and ts <= min_timestamp:
                break
            index -= 1
        index = max(index, 0)
        start = files[index].file_from_offset
        process_offset, _ = self._scan_from(index, durable_offset)
        self.truncate(process_offset)
        self._sync_recovered(index)
        return start, process_offset

    def truncate(self, offset: int) -> int:
        """Cut the log at ``offset`` (bytes); returns bytes dropped."""
        dropped = self.mapped_file_queue.truncate_dirty_files(offset)
        self.mapped_file_queue.flushed_where = offset
        return dropped

    def shutdown(self) -> None:
        self.mapped_file_queue.shutdown()


def _all_zero_tail(mf, pos: int) -> bool:
    """True when the 8 bytes at ``pos`` are zero (a clean end, not damage)."""
    if pos + 8 > mf.file_size:
        return True
    return mf.read(pos, 8) == b"\0" * 8
