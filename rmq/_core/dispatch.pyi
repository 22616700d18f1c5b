from array import array

from rmq._core.index_file import IndexFile
from rmq._core.mapped_file import MappedFile

class DispatchBatch:
    count: int
    end_position: int
    result: str
    topics: list[str]
    physical_offsets: array
    sizes: array
    tags_codes: array
    queue_ids: array
    queue_offsets: array
    store_timestamps: array
    sys_flags: array
    topic_ids: array
    uniq_pos: array
    uniq_len: array
    keys_pos: array
    keys_len: array
    topic_pos: array
    topic_len: array
    runs: array
    delay_levels: array
    mapped_file: MappedFile
    def row(self, i: int) -> dict: ...

def scan_dispatch(mf: MappedFile, pos: int, end: int, max_records: int) -> DispatchBatch: ...
def run_is_dispatched(db: DispatchBatch, row: int) -> bool: ...
def build_index(db: DispatchBatch, index_file: IndexFile, row: int, key: int) -> tuple[int, int]: ...
