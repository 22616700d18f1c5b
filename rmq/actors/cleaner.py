"""Cleaner actor: CommitLog expiry and disk protection (RocketMQ CleanCommitLogService, SPEC.md §8).

Responsibility
    Every cleanResourceInterval (10 s; first run after cleanResourceInitialDelay,
    60 s, an rmq setting) it deletes expired CommitLog files: when the hour is
    in deleteWhen, or disk usage is above diskMaxUsedSpaceRatio, or an admin
    asked; a file goes when it is older than fileReservedTime hours, or
    regardless of age above the clean-forcibly ratio (85 %); oldest first, never
    the newest file, never a file reput has not dispatched, at most 10 a run.
    Every 10 s it checks disk usage: above 90 % it tells the broker DISK_FULL
    (writes refused with SERVICE_NOT_AVAILABLE) until usage falls again.
    After deleting it announces the new CommitLog min offset; the broker relays
    it, reput deletes ConsumeQueue and IndexFiles below it (their writer), and
    every process unmaps the deleted files.

Sockets
    SUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, dispatched, ...}.
    DEALER ``ipc://STORE/broker.ipc``: one-way CLEAN_ANNOUNCE {minOffset, diskFull, diskRatio}.

Files
    Deletes ``commitlog/*`` files.

Timers
    cleanResourceInterval (10 000 ms), disk check 10 000 ms.

Failure behaviour
    A file that cannot be deleted stops the run (no holes); the next run retries.
    Wall-clock ages come from file mtimes; nothing unconsumed by reput is ever deleted.
    A wall-clock step of more than 10 min (seen against the monotonic clock) skips
    time-based deletion for that cycle with a warning, and file ages are corrected
    by forward steps afterwards, so a +73 h jump deletes nothing
    (:class:`rmq.store.cleaner.RetentionGuard`).
"""
from __future__ import annotations

import sys
from typing import Optional

from rmq.actors.follower import FollowerActor, run_follower
from rmq.clock import SYSTEM_CLOCK, Clock
from rmq.protocol import RequestCode
from rmq.store.cleaner import (DELETE_FILES_BATCH_MAX, HOUR_MS, RetentionGuard, disk_usage_ratio,
                               is_time_to_delete, space_decision)
from rmq.store.config import MessageStoreConfig

CLEAN_RESOURCE_INTERVAL_MS = 10_000
CLEAN_RESOURCE_INITIAL_DELAY_MS = 60_000
DISK_CHECK_INTERVAL_MS = 10_000


class CleanerActor(FollowerActor):
    name = "cleaner"

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None,
                 usage=disk_usage_ratio, clock: Clock = SYSTEM_CLOCK):
        super().__init__(config, supervisor_endpoint)
        self.usage = usage
        self.clock = clock
        self.guard = RetentionGuard(clock, logger=self.log)
        extra = config.extra
        self.interval_ms = int(extra.get("cleanResourceInterval", CLEAN_RESOURCE_INTERVAL_MS))
        self.initial_delay_ms = int(extra.get("cleanResourceInitialDelay", CLEAN_RESOURCE_INITIAL_DELAY_MS))
        self.disk_check_ms = int(extra.get("diskCheckInterval", DISK_CHECK_INTERVAL_MS))
        self.disk_full = False
        self.last_ratio = 0.0

    def on_started(self) -> None:
        self.commitlog = self.open_commitlog()
        self.add_timer(self.interval_ms, self.clean, first_ms=self.initial_delay_ms)
        self.add_timer(self.disk_check_ms, self.check_disk, first_ms=0)

    def announce(self) -> None:
        self.tell_broker(RequestCode.CLEAN_ANNOUNCE, {"minOffset": self.commitlog.get_min_offset(),
                                                      "diskFull": self.disk_full, "diskRatio": self.last_ratio})

    def check_disk(self):
        d = space_decision(self.usage(self.commitlog.store_path), self.config.disk_max_used_space_ratio)
        self.last_ratio = d.ratio
        if d.disk_full != self.disk_full:
            self.log.warning("disk usage %.2f: DISK_FULL %s", d.ratio, "set" if d.disk_full else "cleared")
            self.disk_full = d.disk_full
            self.announce()
        return d

    def clean(self) -> int:
        self.commitlog.refresh(self.end)
        time_trusted = self.guard.begin_cycle()      # every cycle, so a wall step is seen when it happens
        d = self.check_disk()
        now = self.clock.now_ms()
        if not (is_time_to_delete(self.config.delete_when, now / 1000.0) or d.space_to_delete):
            return 0
        clean_now = self.config.clean_file_forcibly_enable and d.clean_immediately
        expired_ms = self.config.file_reserved_time * HOUR_MS
        if clean_now:
            k = DELETE_FILES_BATCH_MAX
        elif time_trusted:
            k = self.guard.expired_count(self.commitlog, expired_ms, now, DELETE_FILES_BATCH_MAX, self.dispatched)
        else:
            k = 0
        if not k:
            return 0
        n = self.commitlog.delete_expired_file_by_time(expired_ms, 0.1, True, k, now,
                                                       max_end_offset=self.dispatched)
        if n:
            self.log.info("deleted %d expired CommitLog file(s); min offset now %d", n,
                          self.commitlog.get_min_offset())
            self.announce()
        return n

    def on_stop(self) -> None:
        for mf in self.commitlog.files:
            mf.close()


def main(argv: Optional[list] = None) -> int:
    return run_follower(CleanerActor, argv)


if __name__ == "__main__":
    sys.exit(main())
