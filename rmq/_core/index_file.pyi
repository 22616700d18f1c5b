"""Python API of rmq._core.index_file (RocketMQ IndexFile, SPEC.md §3)."""
import os
from typing_extensions import Buffer

from rmq._core.mapped_file import MappedFile

_Text = str | bytes

def index_key_hash_py(topic: _Text, key: _Text) -> int:
    """abs(("topic#key").hashCode()) as Java computes it; 0 for Integer.MIN_VALUE."""

def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """40 + hash_slot_num*4 + index_num*20 (bytes)."""

class IndexFile:
    @property
    def mapped_file(self) -> MappedFile: ...
    @property
    def hash_slot_num(self) -> int: ...
    @property
    def index_num(self) -> int: ...
    @property
    def begin_timestamp(self) -> int:
        """ms"""
    @property
    def end_timestamp(self) -> int:
        """ms"""
    @property
    def begin_phy_offset(self) -> int: ...
    @property
    def end_phy_offset(self) -> int: ...
    @property
    def hash_slot_count(self) -> int: ...
    @property
    def index_count(self) -> int: ...
    @property
    def file_name(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def __init__(
        self,
        file_name: str | os.PathLike[str],
        hash_slot_num: int = 5_000_000,
        index_num: int = 20_000_000,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
    ) -> None: ...
    def load(self) -> None: ...
    def put_key(self, topic: _Text, key: _Text, phy_offset: int, store_timestamp: int) -> bool: ...
    def put_hashes(self, key_hashes: Buffer, phy_offsets: Buffer, store_timestamps: Buffer) -> int: ...
    def select_phy_offsets(
        self,
        topic: _Text,
        key: _Text,
        max_num: int,
        begin: int,
        end: int,
        phy_offsets: list[int] | None = None,
    ) -> list[int]: ...
    def select_phy_offsets_by_hash(
        self,
        key_hash: int,
        max_num: int,
        begin: int,
        end: int,
        phy_offsets: list[int] | None = None,
    ) -> list[int]: ...
    def is_time_matched(self, begin: int, end: int) -> bool: ...
    def is_write_full(self) -> bool: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def destroy(self) -> bool: ...
