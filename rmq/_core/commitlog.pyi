from array import array
from typing import Optional, Sequence

from rmq._core.mapped_file import MappedFile

PUT_OK: int
END_OF_FILE: int
GATHER_FOUND: int
GATHER_NO_MATCHED_MESSAGE: int
GATHER_MESSAGE_WAS_REMOVING: int
GATHER_CORRUPT: int
CHECK_RESULT_NAMES: dict[int, str]

def encode_properties(properties: dict) -> bytes: ...
def decode_properties(data: bytes) -> dict[str, str]: ...
def encode_batch(messages: Sequence[tuple[bytes, bytes, int]]) -> bytes: ...
def validate_batch(batch: bytes, extra_props: bytes, topic_len: int, sys_flag: int,
                   max_body_size: int, prop_crc: bool) -> tuple[int, int]: ...
def append_batch(mf: MappedFile, batch: bytes, topic: bytes, queue_id: int, queue_offset: int, sys_flag: int,
                 born_timestamp: int, born_host: bytes, store_host: bytes, store_timestamp: int,
                 extra_props: bytes, prop_crc: bool, reconsume_times: int, prepared_transaction_offset: int,
                 max_body_size: int, out_physical_offsets: array) -> tuple[int, int, int, int]: ...
def check_message(data: bytes, pos: int = 0, check_crc: bool = True,
                  require_prop_crc: bool = False) -> tuple[str, int]: ...
def scan_valid(mf: MappedFile, pos: int, check_crc: bool,
               require_prop_crc: bool = False) -> tuple[int, str, int, int]: ...
def first_store_timestamp(mf: MappedFile) -> int: ...
def store_timestamp_at(mf: MappedFile, pos: int) -> int: ...
def create_message_id(store_host: bytes, physical_offset: int) -> str: ...
def decode_message_id(msg_id: str) -> tuple[bytes, int]: ...
def decode_records(data: bytes, read_body: bool = True, check_crc: bool = False,
                   require_prop_crc: bool = False) -> list[MessageExt]: ...
def read_record(mf: MappedFile, pos: int, check_crc: bool = True,
                require_prop_crc: bool = False) -> Optional[bytes]: ...
def gather_records(files: list[MappedFile], file_size: int, cq_units: bytes, codes: Optional[array],
                   max_msgs: int, max_bytes: int, min_physical_offset: int, max_physical_offset: int,
                   check_crc: bool, require_prop_crc: bool = False) -> tuple[bytes, int, int, int, int]: ...
def tags_string_to_tags_code(tags: str) -> int: ...

class MessageExt:
    topic: str
    body: Optional[bytes]
    flag: int
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_size: int
    body_crc: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    @property
    def tags(self) -> Optional[str]: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def uniq_key(self) -> Optional[str]: ...
    @property
    def msg_id(self) -> str: ...
