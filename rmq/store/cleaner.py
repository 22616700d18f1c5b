"""File expiry and disk protection (RocketMQ CleanCommitLogService / CleanConsumeQueueService, SPEC.md §8).

Pure decisions (``is_time_to_delete``, ``disk_usage_ratio``, ``space_decision``)
plus :class:`StoreCleaner`, which applies them to a MessageStore: CommitLog
files first (oldest to second-newest, never the last, no holes, at most
DELETE_FILES_BATCH_MAX per run), then ConsumeQueue and IndexFiles below the new
CommitLog min offset.  The cleaner actor runs the same code on its timer.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

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


class StoreCleaner:
    """Applies the cleaning rules to a MessageStore.

    Parameters
    ----------
    store : MessageStore
    usage : callable(path) -> float, optional
        Disk usage probe (tests inject one); default :func:`disk_usage_ratio`.
    now_ms : callable() -> int, optional
        Wall clock in ms (file ages are compared with file mtimes, which are wall clock).
    """

    def __init__(self, store, usage: Callable[[str], float] = disk_usage_ratio,
                 now_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.store = store
        self.usage = usage
        self.now_ms = now_ms
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
        space = self.check_space()
        time_up = is_time_to_delete(cfg.delete_when, self.now_ms() / 1000.0)
        manual = self.manual_delete_times > 0
        if manual:
            self.manual_delete_times -= 1
        deleted_cl = 0
        if time_up or space.space_to_delete or manual:
            clean_now = cfg.clean_file_forcibly_enable and space.clean_immediately or manual
            deleted_cl = self.store.delete_expired_commitlog_files(
                cfg.file_reserved_time * HOUR_MS, delete_interval_s, clean_now, DELETE_FILES_BATCH_MAX,
                self.now_ms())
        cq_files = index_files = 0
        min_offset = self.store.commitlog.get_min_offset()
        if min_offset > self.last_commitlog_min_offset:
            cq_files, index_files = self.store.delete_expired_queue_files(min_offset)
            self.last_commitlog_min_offset = min_offset
        return deleted_cl, cq_files, index_files
