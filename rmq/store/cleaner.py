"""File expiry and disk protection (RocketMQ CleanCommitLogService / CleanConsumeQueueService, SPEC.md §8).

Pure decisions (``is_time_to_delete``, ``disk_usage_ratio``, ``space_decision``)
plus :class:`StoreCleaner`, which applies them to a MessageStore: CommitLog
files first (oldest to second-newest, never the last, no holes, at most
DELETE_FILES_BATCH_MAX per run), then ConsumeQueue and IndexFiles below the new
CommitLog min offset.  The cleaner actor runs the same code on its timer.

Clock jumps (RELIABILITY.md T7).  RocketMQ expires a file when ``now - mtime >=
fileReservedTime`` (72 h), so a forward step of the wall clock by more than
the reserved time (+73 h) deletes every file but the newest, consumed or not.
:class:`RetentionGuard` makes time-based expiry jump-proof within a process:

* every cleaning cycle observes wall and monotonic time
  (:class:`rmq.clock.WallJumpDetector`); a wall step of more than
  ``CLOCK_JUMP_THRESHOLD_MS`` (10 min) either way since the previous cycle skips
  time-based deletion for that cycle, with a warning;
* afterwards a file's wall age is corrected by every forward step detected after
  its mtime (``age = now - mtime - steps``), so files written before a +73 h
  step keep their real age and expire 72 real hours after their last write,
  while files written after it age normally.

Chosen over an expiry rule on store timestamps (file's last store timestamp vs
the CommitLog's newest one) because that rule ignores mtimes (an idle broker
would never expire anything, and ``touch``-aged files would not go).
Deletion forced by disk usage (> 85 %, or an admin request) is not time-based
and is unaffected.  Limit: a step while no cleaner runs (broker down) is not
seen; file ages then follow the wall clock, as in RocketMQ.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

from rmq.clock import CLOCK_JUMP_THRESHOLD_MS, SYSTEM_CLOCK, Clock, WallJumpDetector

log = logging.getLogger(__name__)

DELETE_FILES_BATCH_MAX = 10              # files deleted per run (4.9 DELETE_FILES_BATCH_MAX)
DISK_SPACE_WARNING_LEVEL_RATIO = 0.90    # above: DISK_FULL, writes refused (diskSpaceWarningLevelRatio)
DISK_SPACE_CLEAN_FORCIBLY_RATIO = 0.85   # above: delete regardless of age (diskSpaceCleanForciblyRatio)
MANUAL_DELETE_FILE_TIMES = 20            # admin deleteExpiredCommitLog: runs of forced deletion
HOUR_MS = 3_600_000


def is_time_to_delete(delete_when: str, now_s: Optional[float] = None) -> bool:
    """True when the local hour is one of ``delete_when`` (``"04"`` or ``"04;16"``)."""
    hour = time.localtime(now_s if now_s is not None else time.time()).tm_hour
    for token in delete_when.split(";"):
        token = token.strip()
        if token.isdigit() and int(token) == hour:
            return True
    return False


def disk_usage_ratio(path: str) -> float:
    """Used fraction of the filesystem holding ``path`` as RocketMQ computes it:
    ceil(100 * used / (used + available)) / 100; -1 when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    free = st.f_bfree * st.f_frsize
    used = total - free
    if used + avail <= 0:
        return -1.0
    return math.ceil(100.0 * used / (used + avail)) / 100.0


@dataclass
class SpaceDecision:
    """What the disk usage asks for (DefaultMessageStore.isSpaceToDelete)."""
    ratio: float
    disk_full: bool          # > warning level: writes refused until space returns
    clean_immediately: bool  # > clean-forcibly level: delete regardless of age
    space_to_delete: bool    # > diskMaxUsedSpaceRatio (or unknown usage)


def space_decision(ratio: float, disk_max_used_space_ratio_pct: int) -> SpaceDecision:
    if ratio < 0:
        return SpaceDecision(ratio, False, False, True)
    if ratio > DISK_SPACE_WARNING_LEVEL_RATIO:
        return SpaceDecision(ratio, True, True, True)
    if ratio > DISK_SPACE_CLEAN_FORCIBLY_RATIO:
        return SpaceDecision(ratio, False, True, True)
    return SpaceDecision(ratio, False, False, ratio > disk_max_used_space_ratio_pct / 100.0)


class RetentionGuard:
    """Jump-proof time-based expiry of CommitLog files (see the module docstring).

    Parameters
    ----------
    clock : rmq.clock.Clock
        Wall (``now_ms``) and monotonic readings; default the system clock.
    threshold_ms : int
        Wall steps larger than this skip the cycle that sees them.
    logger : logging.Logger, optional
        Where the jump warning goes (the cleaner actor's log); default this module's.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, threshold_ms: int = CLOCK_JUMP_THRESHOLD_MS,
                 logger: Optional[logging.Logger] = None):
        self.clock = clock
        self.log = logger or log
        self.detector = WallJumpDetector(clock, threshold_ms)
        self.skipped_cycles = 0

    def begin_cycle(self) -> bool:
        """Observe the clocks at the start of a cleaning cycle.  False: the wall clock stepped
        since the previous cycle, do no time-based deletion now."""
        j = self.detector.observe()
        if j is None:
            return True
        self.skipped_cycles += 1
        self.log.warning("wall clock jumped %+.1f h since the last cleaning cycle (monotonic time disagrees): "
                    "time-based CommitLog expiry skipped this cycle; ages of older files are corrected",
                    j.delta_ms / HOUR_MS)
        return False

    def file_age_ms(self, mtime_ms: int, now_ms: int) -> int:
        """Wall age of something last modified at ``mtime_ms``, minus forward steps detected since."""
        return now_ms - mtime_ms - self.detector.forward_shift_after(mtime_ms)

    def expired_count(self, mfq, expired_ms: int, now_ms: int, max_files: int,
                      max_end_offset: Optional[int] = None) -> int:
        """How many leading files of ``mfq`` (a MappedFileQueue) are time-expired: oldest first,
        never the last, stopping at the first file kept (no holes) or ending after
        ``max_end_offset`` (not dispatched), at most ``max_files``."""
        n = 0
        for mf in list(mfq.files)[:-1]:
            if n >= max_files:
                break
            if max_end_offset is not None and mf.file_from_offset + mfq.mapped_file_size > max_end_offset:
                break
            try:
                mtime_ms = int(os.path.getmtime(mf.file_name) * 1000)
            except OSError:
                break
            if self.file_age_ms(mtime_ms, now_ms) < expired_ms:
                break
            n += 1
        return n


class StoreCleaner:
    """Applies the cleaning rules to a MessageStore.

    Parameters
    ----------
    store : MessageStore
    usage : callable(path) -> float, optional
        Disk usage probe (tests inject one); default :func:`disk_usage_ratio`.
    now_ms : callable() -> int, optional
        Wall clock in ms (file ages are compared with file mtimes, which are wall clock);
        default ``clock.now_ms``.
    clock : rmq.clock.Clock, optional
        The clock of the jump guard (:class:`RetentionGuard`) and default wall clock.
    """

    def __init__(self, store, usage: Callable[[str], float] = disk_usage_ratio,
                 now_ms: Optional[Callable[[], int]] = None, clock: Clock = SYSTEM_CLOCK):
        self.store = store
        self.usage = usage
        self.clock = clock
        self.now_ms = now_ms if now_ms is not None else clock.now_ms
        self.guard = RetentionGuard(clock)
        self.manual_delete_times = 0
        self.disk_full = False
        self.last_commitlog_min_offset = store.commitlog.get_min_offset()

    def request_manual_delete(self) -> None:
        """Admin ``deleteExpiredCommitLog``: force deletion for the next 20 runs."""
        self.manual_delete_times = MANUAL_DELETE_FILE_TIMES

    def check_space(self) -> SpaceDecision:
        """Probe the CommitLog disk and set / clear the store's DISK_FULL flag."""
        cfg = self.store.config
        d = space_decision(self.usage(self.store.commitlog_dir), cfg.disk_max_used_space_ratio)
        if d.disk_full != self.disk_full:
            log.warning("disk usage %.2f: DISK_FULL %s", d.ratio, "set" if d.disk_full else "cleared")
        self.disk_full = d.disk_full
        self.store.disk_full = d.disk_full
        return d

    def run(self, delete_interval_s: float = 0.0) -> tuple[int, int, int]:
        """One cleaning run.

        Returns
        -------
        (commitlog_files, consume_queue_files, index_files) deleted.
        """
        cfg = self.store.config
        time_trusted = self.guard.begin_cycle()
        space = self.check_space()
        now = self.now_ms()
        time_up = is_time_to_delete(cfg.delete_when, now / 1000.0)
        manual = self.manual_delete_times > 0
        if manual:
            self.manual_delete_times -= 1
        deleted_cl = 0
        if time_up or space.space_to_delete or manual:
            clean_now = cfg.clean_file_forcibly_enable and space.clean_immediately or manual
            expired_ms = cfg.file_reserved_time * HOUR_MS
            if clean_now:
                n = DELETE_FILES_BATCH_MAX
            elif time_trusted:
                n = self.guard.expired_count(self.store.commitlog.mapped_file_queue, expired_ms, now,
                                             DELETE_FILES_BATCH_MAX, self.store.reput_from_offset)
            else:
                n = 0
            if n:
                # the files chosen above (the store re-checks dispatch under its lock)
                deleted_cl = self.store.delete_expired_commitlog_files(expired_ms, delete_interval_s, True, n, now)
        cq_files = index_files = 0
        min_offset = self.store.commitlog.get_min_offset()
        if min_offset > self.last_commitlog_min_offset:
            cq_files, index_files = self.store.delete_expired_queue_files(min_offset)
            self.last_commitlog_min_offset = min_offset
        return deleted_cl, cq_files, index_files
