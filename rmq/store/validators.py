"""Re-export of :mod:`rmq.common.topic_validator`, where the name checks and limits live now
(SPEC.md §1.9): store code and older imports keep working."""
from __future__ import annotations

from rmq.common.topic_validator import (GROUP_MAX_LENGTH, MAX_QUEUE_NUMS, SYSTEM_TOPIC_PREFIXES, VALID_NAME_PATTERN,
                                        check_group, check_queue_id, check_topic)

__all__ = ["VALID_NAME_PATTERN", "GROUP_MAX_LENGTH", "MAX_QUEUE_NUMS", "SYSTEM_TOPIC_PREFIXES", "check_topic",
           "check_group", "check_queue_id"]
