"""StoreCheckpoint: one mapped 4 KiB page of timestamps and offsets (SPEC.md §4.1).

Every field is read from and written to the shared mapping directly, so the
actors of one broker (each the single writer of its own fields: flush writes
physicMsgTimestamp, reput logicsMsgTimestamp and indexMsgTimestamp) share one
page without overwriting each other.  ``flush()`` msyncs the page.
"""
from __future__ import annotations

import os
import struct

from rmq._core.layout import (CHECKPOINT_CONFIRM_PHY_OFFSET_OFFSET, CHECKPOINT_FILE_SIZE,
                              CHECKPOINT_INDEX_MSG_TIMESTAMP_OFFSET, CHECKPOINT_LOGICS_MSG_TIMESTAMP_OFFSET,
                              CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET, CHECKPOINT_PHYSIC_MSG_TIMESTAMP_OFFSET)
from rmq._core.mapped_file import MappedFile

_LONG = struct.Struct(">q")
# abnormal recovery starts 3 s before the older of the two timestamps (SC49 getMinTimestamp)
MIN_TIMESTAMP_MARGIN_MS = 3000


def _field(offset: int, doc: str) -> property:
    def get(self) -> int:
        return _LONG.unpack(self._file.read(offset, 8))[0]

    def set(self, value: int) -> None:
        self._file.write_at(offset, _LONG.pack(int(value)))
    return property(get, set, doc=doc)


class StoreCheckpoint:
    """``<root>/checkpoint`` (SPEC.md §4.1).  Values in ms (timestamps) or bytes (offsets)."""

    physic_msg_timestamp = _field(CHECKPOINT_PHYSIC_MSG_TIMESTAMP_OFFSET,
                                  "store time of the last CommitLog record made durable (ms)")
    logics_msg_timestamp = _field(CHECKPOINT_LOGICS_MSG_TIMESTAMP_OFFSET,
                                  "store time of the last record dispatched to a ConsumeQueue (ms)")
    index_msg_timestamp = _field(CHECKPOINT_INDEX_MSG_TIMESTAMP_OFFSET,
                                 "end time of the last full, flushed IndexFile (ms)")
    master_flushed_offset = _field(CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET,
                                   "CommitLog offset known durable (bytes; 5.x field)")
    confirm_phy_offset = _field(CHECKPOINT_CONFIRM_PHY_OFFSET_OFFSET, "confirm offset (bytes; 5.x field)")

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path) and os.path.getsize(path) != CHECKPOINT_FILE_SIZE:
            os.unlink(path)   # a torn checkpoint is worth nothing: recovery falls back to scanning
        self._file = MappedFile(path, CHECKPOINT_FILE_SIZE, True)
        self._file.wrote_position = CHECKPOINT_FILE_SIZE

    def flush(self) -> None:
        """msync the page."""
        self._file.flushed_position = 0
        self._file.flush(0)

    def get_min_timestamp(self) -> int:
        """Where abnormal recovery may start (ms): min(physic, logics) - 3 s, >= 0."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - MIN_TIMESTAMP_MARGIN_MS)

    def get_min_timestamp_index(self) -> int:
        return min(self.get_min_timestamp(), self.index_msg_timestamp)

    def shutdown(self) -> None:
        self.flush()
        self._file.close()
