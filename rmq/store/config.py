"""MessageStoreConfig: the store's settings, with RocketMQ's names and defaults.

Field names are RocketMQ's ``MessageStoreConfig`` names in snake_case
(``mappedFileSizeCommitLog`` -> ``mapped_file_size_commit_log``); a
``broker.conf`` in RocketMQ's camelCase key=value form loads through
:meth:`MessageStoreConfig.from_properties`.  Defaults: SPEC.md §0.6.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from rmq._core.layout import CQ_ENTRIES_PER_FILE_DEFAULT, CQ_STORE_UNIT_SIZE, MAX_MESSAGE_SIZE_DEFAULT

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
FLUSH_DISK_TYPES = (ASYNC_FLUSH, SYNC_FLUSH)
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
HA_TRANSFER_BATCH_SIZE_MAX = 4 * 1024 * 1024   # bytes; rmq's cap of haTransferBatchSize
TIMER_PRECISION_CANDIDATES_MS = (100, 200, 500, 1000)   # MessageStoreConfig.setTimerPrecisionMs
# rmq's cap of timerMaxDelaySec (RocketMQ has none): a timer beyond the roll window is re-enqueued
# ("rolled") until due, so any bound works; a year keeps TIMER_OUT_MS arithmetic far from overflow
TIMER_MAX_DELAY_SEC_LIMIT = 365 * 86_400

# RocketMQ keeps a few misspellings in its property names; both spellings load.
_ALIASES = {"warm_maped_file_enable": "warm_mapped_file_enable",
            "destroy_maped_file_interval_forcibly": "destroy_mapped_file_interval_forcibly"}


def camel_to_snake(name: str) -> str:
    """``mappedFileSizeCommitLog`` -> ``mapped_file_size_commit_log``."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    return s.lower()


@dataclass
class MessageStoreConfig:
    """Settings of one MessageStore.  Units are in the comments (SPEC.md §0.6)."""

    store_path_root_dir: str = "./rmq-data"
    store_path_commit_log: str = ""          # default: <root>/commitlog
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024   # bytes per CommitLog file
    mapped_file_size_consume_queue: int = CQ_ENTRIES_PER_FILE_DEFAULT * CQ_STORE_UNIT_SIZE  # bytes
    max_hash_slot_num: int = 5_000_000       # IndexFile hash slots
    max_index_num: int = 5_000_000 * 4       # IndexFile entries
    max_msgs_num_batch: int = 64             # index query cap (messages)
    message_index_enable: bool = True
    max_message_size: int = MAX_MESSAGE_SIZE_DEFAULT   # bytes of one body (and of one batch)
    flush_disk_type: str = ASYNC_FLUSH
    broker_role: str = "ASYNC_MASTER"
    flush_interval_commit_log: int = 500     # ms
    flush_commit_log_least_pages: int = 4    # 4 KiB pages
    flush_commit_log_thorough_interval: int = 10_000   # ms
    flush_interval_consume_queue: int = 1000   # ms
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000   # ms
    sync_flush_timeout: int = 5000           # ms
    check_crc_on_recover: bool = True
    check_crc_on_read: bool = True           # rmq: every served record is CRC-checked
    enabled_append_prop_crc: bool = True     # rmq default ON (SPEC.md header)
    force_verify_prop_crc: bool = True       # records must carry __CRC32# (when appended with it)
    warm_mapped_file_enable: bool = False
    os_page_cache_busy_time_out_mills: int = 1000   # ms
    file_reserved_time: int = 72             # hours
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75      # percent
    clean_file_forcibly_enable: bool = True
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 1024   # rmq; RocketMQ 32 (a pull costs ~100 us of Python
                                                          # each side; clients ask what they want: RocketMQ's 32)
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40     # percent of RAM
    store_host: str = "127.0.0.1:10911"      # brokerIP1:listenPort, written in every record
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"   # SPEC.md §10.1
    # master/slave replication (SPEC.md §9); RocketMQ's names and defaults
    ha_listen_port: int = 0                  # HA port; 0 = the broker's listenPort + 1
    ha_master_address: str = ""              # "host:port" of the master's HA port (SLAVE)
    ha_send_heartbeat_interval: int = 5000   # ms, slave -> master offset report when idle
    ha_housekeeping_interval: int = 20_000   # ms, connection idle timeout
    ha_transfer_batch_size: int = 32 * 1024  # bytes per transfer chunk, <= HA_TRANSFER_BATCH_SIZE_MAX
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024   # bytes a slave may lag and still count (SYNC_MASTER)
    slave_read_enable: bool = False          # consumers may be redirected to a slave
    slave_timeout: int = 3000                # ms, SYNC_MASTER wait for the slave's ack (SPEC.md §9.3)
    # RocketMQ 5 timer messages (SPEC.md §10.4; MessageStoreConfig 5.x names and defaults)
    timer_wheel_enable: bool = True
    timer_precision_ms: int = 1000           # ms per TimerWheel slot; snapped to 100 / 200 / 500 / 1000
    timer_max_delay_sec: int = 3 * 86_400    # s; a later deliver time is refused (WHEEL_TIMER_MSG_ILLEGAL)
    timer_roll_window_slot: int = 2 * 86_400   # slots; a timer further ahead is re-enqueued ("rolled")
    timer_flush_interval_ms: int = 1000      # ms between TimerLog / timerwheel / timercheck flushes
    timer_congest_num_each_slot: int = 2_147_483_647   # timers per slot before flow control
    mapped_file_size_timer_log: int = 100 * 1024 * 1024   # bytes per TimerLog file
    extra: dict = field(default_factory=dict)   # unknown properties, kept for the broker

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the property when a value is out of range."""
        if self.flush_disk_type not in FLUSH_DISK_TYPES:
            raise ValueError(f"flushDiskType must be one of {FLUSH_DISK_TYPES}, got {self.flush_disk_type!r}")
        if self.broker_role not in BROKER_ROLES:
            raise ValueError(f"brokerRole must be one of {BROKER_ROLES}, got {self.broker_role!r}")
        if self.mapped_file_size_commit_log < 4096:
            raise ValueError(f"mappedFileSizeCommitLog must be >= 4096 bytes, got {self.mapped_file_size_commit_log}")
        if self.mapped_file_size_consume_queue < CQ_STORE_UNIT_SIZE:
            raise ValueError("mappedFileSizeConsumeQueue must hold at least one 20-byte entry")
        # RocketMQ rounds the ConsumeQueue file size up to a multiple of 20 (SPEC.md §2.1)
        rem = self.mapped_file_size_consume_queue % CQ_STORE_UNIT_SIZE
        if rem:
            self.mapped_file_size_consume_queue += CQ_STORE_UNIT_SIZE - rem
        if not 0 < self.max_message_size <= 1024 * 1024 * 1024:
            raise ValueError(f"maxMessageSize must be in (0, 1 GiB], got {self.max_message_size}")
        if self.max_hash_slot_num <= 0 or self.max_index_num <= 1:
            raise ValueError("maxHashSlotNum must be > 0 and maxIndexNum > 1")
        self._validate_ha()
        self._validate_timer()
        self.disk_max_used_space_ratio = min(95, max(10, self.disk_max_used_space_ratio))
        from rmq.store.schedule import parse_delay_levels
        self.delay_levels_ms = parse_delay_levels(self.message_delay_level)

    def _validate_timer(self) -> None:
        # setTimerPrecisionMs: the largest of 100 / 200 / 500 / 1000 not above the value
        p = self.timer_precision_ms
        self.timer_precision_ms = max([c for c in TIMER_PRECISION_CANDIDATES_MS if c <= p] or
                                      [TIMER_PRECISION_CANDIDATES_MS[0]])
        if not 0 < self.timer_max_delay_sec <= TIMER_MAX_DELAY_SEC_LIMIT:
            raise ValueError(f"timerMaxDelaySec must be in (0, {TIMER_MAX_DELAY_SEC_LIMIT}] s, "
                             f"got {self.timer_max_delay_sec}")
        if self.mapped_file_size_timer_log < 4096:
            raise ValueError(f"mappedFileSizeTimerLog must be >= 4096 bytes, got {self.mapped_file_size_timer_log}")
        if not 0 < self.timer_flush_interval_ms <= 3_600_000:
            raise ValueError(f"timerFlushIntervalMs must be in (0, 3600000] ms, got {self.timer_flush_interval_ms}")
        if self.timer_congest_num_each_slot <= 0:
            raise ValueError(f"timerCongestNumEachSlot must be > 0, got {self.timer_congest_num_each_slot}")

    def _validate_ha(self) -> None:
        if not 0 <= self.ha_listen_port <= 65535:
            raise ValueError(f"haListenPort must be in [0, 65535] (0 = listenPort + 1), got {self.ha_listen_port}")
        addr = self.ha_master_address.strip()
        if addr:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"haMasterAddress must be host:port, got {self.ha_master_address!r}")
        if not 0 < self.ha_send_heartbeat_interval <= 3_600_000:
            raise ValueError(f"haSendHeartbeatInterval must be in (0, 3600000] ms, "
                             f"got {self.ha_send_heartbeat_interval}")
        if not 0 < self.ha_housekeeping_interval <= 3_600_000:
            raise ValueError(f"haHousekeepingInterval must be in (0, 3600000] ms, got {self.ha_housekeeping_interval}")
        if not 0 < self.ha_transfer_batch_size <= HA_TRANSFER_BATCH_SIZE_MAX:
            raise ValueError(f"haTransferBatchSize must be in (0, {HA_TRANSFER_BATCH_SIZE_MAX}] bytes, "
                             f"got {self.ha_transfer_batch_size}")
        if self.ha_slave_fallbehind_max < 0:
            raise ValueError(f"haSlaveFallbehindMax must be >= 0 bytes, got {self.ha_slave_fallbehind_max}")
        if not 0 < self.slave_timeout <= 3_600_000:
            raise ValueError(f"slaveTimeout must be in (0, 3600000] ms, got {self.slave_timeout}")

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], **overrides: Any) -> "MessageStoreConfig":
        """Build from RocketMQ-style properties (camelCase names, string values).

        Unknown names are kept in ``extra``.  Raises ValueError for a value that
        does not parse to the field's type.
        """
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, raw in props.items():
            name = camel_to_snake(key)
            name = _ALIASES.get(name, name)
            f = known.get(name)
            if f is None or name == "extra":
                extra[key] = raw
                continue
            kwargs[name] = _coerce(key, raw, f.type if isinstance(f.type, type) else type(f.default))
        kwargs.update(overrides)
        kwargs.setdefault("extra", {}).update(extra)
        return cls(**kwargs)

    @property
    def require_prop_crc(self) -> bool:
        """Reads and recovery demand the whole-record CRC property (forceVerifyPropCRC)."""
        return self.enabled_append_prop_crc and self.force_verify_prop_crc

    def replace(self, **changes: Any) -> "MessageStoreConfig":
        return dataclasses.replace(self, **changes)


def _coerce(key: str, raw: Any, typ: Any) -> Any:
    if typ in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no"):
            return False
        raise ValueError(f"{key}: expected true/false, got {raw!r}")
    if typ in ("int", int):
        try:
            return int(str(raw).strip())
        except ValueError:
            raise ValueError(f"{key}: expected an integer, got {raw!r}") from None
    return str(raw).strip() if not isinstance(raw, (dict, list)) else raw
