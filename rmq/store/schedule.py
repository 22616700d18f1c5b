"""Delayed messages by level (RocketMQ ScheduleMessageService, SPEC.md §10).

A message with the DELAY property (level 1..18) is stored in topic
``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with REAL_TOPIC / REAL_QID
properties; its ConsumeQueue tagsCode is the delivery time (store time + the
level's delay).  The broker's schedule service re-puts due messages to their
real topic and queue with DELAY removed.  Offsets per level persist in
``config/delayOffset.json``.
"""
from __future__ import annotations

import re
from typing import Optional

from rmq.store.config_manager import ConfigManager

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
MESSAGE_DELAY_LEVEL_DEFAULT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str = MESSAGE_DELAY_LEVEL_DEFAULT) -> list[int]:
    """``"1s 5s ..."`` -> delays in ms by level (index 0 = level 1).  Units s, m, h, d
    (RocketMQ) and ms (rmq, for tests).  Raises ValueError naming the bad token."""
    out = []
    for token in text.split():
        m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", token)
        if not m:
            raise ValueError(f"messageDelayLevel: bad token {token!r} (expected e.g. 10s, 2m, 1h)")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise ValueError("messageDelayLevel is empty")
    return out


def transform_delay(topic: str, queue_id: int, props: dict, max_level: int) -> tuple[str, int, dict]:
    """The topic / queue / properties a message is stored under (SPEC.md §10.2).

    Level clamped to ``max_level``; REAL_TOPIC / REAL_QID record where it goes.
    A message without a positive DELAY is returned unchanged.
    """
    d = props.get("DELAY")
    try:
        level = int(d) if d is not None else 0
    except ValueError:
        level = 0
    if level <= 0:
        return topic, queue_id, props
    level = min(level, max_level)
    props = dict(props)
    props["DELAY"] = str(level)
    props["REAL_TOPIC"] = topic
    props["REAL_QID"] = str(queue_id)
    return SCHEDULE_TOPIC, level - 1, props


def restore_delayed(props: dict) -> Optional[tuple[str, int, dict]]:
    """Where a due message goes back to: (REAL_TOPIC, REAL_QID, properties without DELAY)."""
    topic = props.get("REAL_TOPIC")
    qid = props.get("REAL_QID")
    if not topic or qid is None or not qid.isdigit():
        return None
    props = {k: v for k, v in props.items() if k not in ("DELAY", "__CRC32#")}
    props["WAIT"] = "false"
    return topic, int(qid), props


class DelayOffsetManager(ConfigManager):
    """``delayOffset.json``: ``{"offsetTable": {level: next queue offset}}`` (SPEC.md §4.4)."""

    file_name = "delayOffset.json"
    encode_is_snapshot = True

    def __init__(self, config_dir: str):
        super().__init__(config_dir)
        self.offset_table: dict[int, int] = {}

    def encode(self) -> dict:
        return {"offsetTable": {str(k): v for k, v in self.offset_table.items()}}

    def decode(self, data: dict) -> None:
        self.offset_table = {int(k): int(v) for k, v in data.get("offsetTable", {}).items()}
