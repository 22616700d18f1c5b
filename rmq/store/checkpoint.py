"""StoreCheckpoint: one mapped 4 KiB page of timestamps (SPEC.md §4.1)."""
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


class StoreCheckpoint:
    """``<root>/checkpoint``: physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp (ms),
    and the 5.x masterFlushedOffset / confirmPhyOffset longs (bytes).

    Values are kept in memory and written + msync'd by :meth:`flush`.
    """

    FIELDS = {
        "physic_msg_timestamp": CHECKPOINT_PHYSIC_MSG_TIMESTAMP_OFFSET,
        "logics_msg_timestamp": CHECKPOINT_LOGICS_MSG_TIMESTAMP_OFFSET,
        "index_msg_timestamp": CHECKPOINT_INDEX_MSG_TIMESTAMP_OFFSET,
        "master_flushed_offset": CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET,
        "confirm_phy_offset": CHECKPOINT_CONFIRM_PHY_OFFSET_OFFSET,
    }

    def __init__(self, path: str):
        self.path = path
        existed = os.path.exists(path) and os.path.getsize(path) == CHECKPOINT_FILE_SIZE
        if os.path.exists(path) and not existed:
            os.unlink(path)   # a torn checkpoint is worth nothing: recovery falls back to scanning
        self._file = MappedFile(path, CHECKPOINT_FILE_SIZE, True)
        for name, off in self.FIELDS.items():
            setattr(self, name, _LONG.unpack(self._file.read(off, 8))[0] if existed else 0)

    def flush(self) -> None:
        """Write every field and msync the page."""
        for name, off in self.FIELDS.items():
            self._file.write_at(off, _LONG.pack(getattr(self, name)))
        self._file.wrote_position = CHECKPOINT_FILE_SIZE
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
