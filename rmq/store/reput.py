"""Dispatcher: the reput step, CommitLog -> ConsumeQueues + IndexFiles (SPEC.md §7).

Used in process by :class:`rmq.store.message_store.MessageStore` and, in the
multi-process layout, by the reput actor (the only writer of ConsumeQueues and
IndexFiles there).  Records are scanned by the Cython ``scan_dispatch`` one
file at a time; runs of one (topic, queueId) go to ``ConsumeQueue.put_batch``
in one call, keys to the IndexFile in one nogil loop.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from rmq._core.dispatch import build_index, run_is_dispatched, scan_dispatch
from rmq.store.mapped_file_queue import MappedFileQueue
from rmq.store.schedule import SCHEDULE_TOPIC, parse_delay_levels

log = logging.getLogger(__name__)

DISPATCH_BATCH_RECORDS = 8192      # records per scan_dispatch call (bounded memory per step)


class Dispatcher:
    """Dispatch state: where reput is (``reput_from_offset``) and what it touched.

    Parameters
    ----------
    commitlog : MappedFileQueue
        The CommitLog files (read).
    consume_queue : callable (topic, queue_id) -> ConsumeQueue
        Finds or creates the ConsumeQueue of a queue.
    index_service : callable () -> IndexService or None
        The current IndexService (None: messageIndexEnable off).
    """

    def __init__(self, commitlog: MappedFileQueue, consume_queue: Callable, index_service: Callable,
                 reput_from_offset: int = 0, delay_levels_ms: Optional[list] = None):
        self.commitlog = commitlog
        self.consume_queue = consume_queue
        self.index_service = index_service
        self.reput_from_offset = reput_from_offset
        self.dispatched_store_timestamp = 0          # ms, last record dispatched
        self.arrivals: dict[tuple[str, int], int] = {}  # (topic, queue_id) -> max queue offset, since last take
        self.delay_levels_ms = delay_levels_ms or parse_delay_levels()

    def take_arrivals(self) -> dict:
        """Queues that got entries since the last call, with their new max offsets (entries)."""
        a, self.arrivals = self.arrivals, {}
        return a

    def dispatch(self, end: int, max_records: Optional[int] = None) -> int:
        """Dispatch records from ``reput_from_offset`` up to ``end`` (bytes).

        Returns
        -------
        int
            Records dispatched.
        """
        total = 0
        mfq = self.commitlog
        while self.reput_from_offset < end and (max_records is None or total < max_records):
            if self.reput_from_offset < mfq.get_min_offset():
                log.warning("reput offset %d below CommitLog min offset %d: expired before dispatch",
                            self.reput_from_offset, mfq.get_min_offset())
                self.reput_from_offset = mfq.get_min_offset()
            mf = mfq.find_mapped_file_by_offset(self.reput_from_offset)
            if mf is None:
                break
            pos = self.reput_from_offset - mf.file_from_offset
            file_end = min(mf.wrote_position, end - mf.file_from_offset)
            cap = DISPATCH_BATCH_RECORDS if max_records is None else min(DISPATCH_BATCH_RECORDS, max_records - total)
            db = scan_dispatch(mf, pos, file_end, cap)
            if db.count:
                self._dispatch_batch(db)
                total += db.count
            if db.result == "BLANK":
                self.reput_from_offset = mfq.roll_next_file(self.reput_from_offset)
                continue
            self.reput_from_offset = mf.file_from_offset + db.end_position
            if db.count == 0:
                if db.end_position >= mf.file_size:
                    self.reput_from_offset = mfq.roll_next_file(self.reput_from_offset - 1)
                    continue
                break
        return total

    def _delivery_times(self, db, start: int, n: int) -> None:
        """SCHEDULE_TOPIC_XXXX tagsCode = store time + delay of the level (SPEC.md §2.2)."""
        levels = self.delay_levels_ms
        for i in range(start, start + n):
            level = db.delay_levels[i]
            delay = levels[min(level, len(levels)) - 1] if level > 0 else 1000
            db.tags_codes[i] = db.store_timestamps[i] + delay

    def _dispatch_batch(self, db) -> None:
        runs = db.runs
        for k in range(0, len(runs), 2):
            start, n = runs[k], runs[k + 1]
            if not run_is_dispatched(db, start):
                continue
            key = (db.topics[db.topic_ids[start]], db.queue_ids[start])
            if key[0] == SCHEDULE_TOPIC:
                self._delivery_times(db, start, n)
            cq = self.consume_queue(*key)
            cq.put_batch(db.physical_offsets, db.sizes, db.tags_codes, db.queue_offsets[start], start, n)
            self.arrivals[key] = cq.get_max_offset_in_queue()
        index_service = self.index_service()
        if index_service is not None:
            row, key = 0, 0
            while row < db.count:
                index_file = index_service.get_and_create_last_index_file()
                row, key = build_index(db, index_file, row, key)
        self.dispatched_store_timestamp = db.store_timestamps[db.count - 1]
