"""Names and limits checked before anything is written (SPEC.md §1.9; RocketMQ ``TopicValidator`` and the
client's ``Validators``).

Every limit is a named constant; each has a test in tests/unit/test_limits.py.  The checks raise
:class:`rmq.errors.MessageIllegalError`, a ``ValueError``.
"""
from __future__ import annotations

import re

from rmq._core.layout import TOPIC_MAX_LENGTH, TOPIC_MAX_LENGTH_SYSTEM
from rmq.common.mix_all import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from rmq.errors import MessageIllegalError

__all__ = ["VALID_NAME_PATTERN", "GROUP_MAX_LENGTH", "MAX_QUEUE_NUMS", "SYSTEM_TOPIC_PREFIXES", "RMQ_SYS_TRACE_TOPIC",
           "AUTO_CREATE_TOPIC_KEY_TOPIC",
           "check_topic", "check_group", "check_queue_id"]

# TopicValidator's charset: ^[%|a-zA-Z0-9_-]+$ -- no '.', '/' or '\0', so a topic
# or group name can never leave the store directory.
VALID_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+\Z")   # \Z, not $: "$" also matches before a final "\n"
GROUP_MAX_LENGTH = 255           # client Validators
MAX_QUEUE_NUMS = 1024            # queue ids are 0..MAX_QUEUE_NUMS-1 (rmq limit; RocketMQ's admin default is 8)
SYSTEM_TOPIC_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"           # the template a topic auto-created by a send copies
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"     # the default message trace topic


def check_topic(topic: object) -> bytes:
    """Validate a topic name; return its UTF-8 bytes.

    Rules (TopicValidator, SPEC.md §1.9): non-empty, charset ``[%|a-zA-Z0-9_-]``,
    at most 127 characters (255 for ``%RETRY%`` / ``%DLQ%`` topics).

    Raises
    ------
    MessageIllegalError
    """
    if not isinstance(topic, str):
        raise MessageIllegalError(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise MessageIllegalError("topic is empty")
    limit = TOPIC_MAX_LENGTH_SYSTEM if topic.startswith(SYSTEM_TOPIC_PREFIXES) else TOPIC_MAX_LENGTH
    if len(topic) > limit:
        raise MessageIllegalError(f"topic is {len(topic)} characters, over the {limit}-character limit")
    if not VALID_NAME_PATTERN.match(topic):
        raise MessageIllegalError(
            f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-] (TopicValidator)")
    return topic.encode("ascii")


def check_group(group: object) -> str:
    """Validate a consumer/producer group name (same charset, <= 255 characters)."""
    if not isinstance(group, str) or not group:
        raise MessageIllegalError("group name is empty or not a str")
    if len(group) > GROUP_MAX_LENGTH:
        raise MessageIllegalError(f"group is {len(group)} characters, over the {GROUP_MAX_LENGTH}-character limit")
    if not VALID_NAME_PATTERN.match(group):
        raise MessageIllegalError(f"group {group!r} has characters outside [%|a-zA-Z0-9_-]")
    return group


def check_queue_id(queue_id: object) -> int:
    """Validate a queue id: an int in ``[0, MAX_QUEUE_NUMS)``."""
    if not isinstance(queue_id, int) or isinstance(queue_id, bool):
        raise MessageIllegalError(f"queue id must be an int, got {type(queue_id).__name__}")
    if not 0 <= queue_id < MAX_QUEUE_NUMS:
        raise MessageIllegalError(f"queue id {queue_id} outside [0, {MAX_QUEUE_NUMS})")
    return queue_id
