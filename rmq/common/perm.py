"""Topic permissions (RocketMQ ``PermName``): the ``perm`` of a TopicConfig / QueueData and of a
broker (``brokerPermission``)."""
from __future__ import annotations

PERM_PRIORITY = 0x1 << 3
PERM_READ = 0x1 << 2
PERM_WRITE = 0x1 << 1
PERM_INHERIT = 0x1 << 0
PERM_MAX = PERM_PRIORITY | PERM_READ | PERM_WRITE | PERM_INHERIT     # rmq: the largest valid perm (0xF)

__all__ = ["PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "PERM_INHERIT", "PERM_MAX", "is_readable", "is_writeable",
           "is_inherited", "is_priority", "perm_to_string"]


def is_readable(perm: int) -> bool:
    return (perm & PERM_READ) == PERM_READ


def is_writeable(perm: int) -> bool:
    return (perm & PERM_WRITE) == PERM_WRITE


def is_inherited(perm: int) -> bool:
    return (perm & PERM_INHERIT) == PERM_INHERIT


def is_priority(perm: int) -> bool:
    return (perm & PERM_PRIORITY) == PERM_PRIORITY


def perm_to_string(perm: int) -> str:
    """``"RWX"`` style, ``-`` for a missing bit: read, write, inherit (``PermName.perm2String``;
    the priority bit is not shown, as in RocketMQ)."""
    return (("R" if is_readable(perm) else "-") + ("W" if is_writeable(perm) else "-")
            + ("X" if is_inherited(perm) else "-"))
