"""The ``sysFlag`` of a PULL_MESSAGE request (RocketMQ ``PullSysFlag``, SPEC.md §13.1)."""
from __future__ import annotations

PULL_FLAG_COMMIT_OFFSET = 0x1 << 0          # the request carries the consumer's offset to commit
PULL_FLAG_SUSPEND = 0x1 << 1                # the broker may hold the request (long polling)
PULL_FLAG_SUBSCRIPTION = 0x1 << 2           # the request carries its subscription expression
PULL_FLAG_CLASS_FILTER = 0x1 << 3           # class filter mode (removed in RocketMQ 5; kept for the bit)
PULL_FLAG_LITE_PULL = 0x1 << 4              # a lite pull consumer's request

__all__ = ["PULL_FLAG_COMMIT_OFFSET", "PULL_FLAG_SUSPEND", "PULL_FLAG_SUBSCRIPTION", "PULL_FLAG_CLASS_FILTER",
           "PULL_FLAG_LITE_PULL", "build_sys_flag", "clear_commit_offset_flag", "has_commit_offset_flag",
           "has_suspend_flag", "has_subscription_flag", "has_class_filter_flag", "has_lite_pull_flag"]


def build_sys_flag(commit_offset: bool, suspend: bool, subscription: bool, class_filter: bool = False,
                   lite_pull: bool = False) -> int:
    """``PullSysFlag.buildSysFlag``."""
    flag = 0
    if commit_offset:
        flag |= PULL_FLAG_COMMIT_OFFSET
    if suspend:
        flag |= PULL_FLAG_SUSPEND
    if subscription:
        flag |= PULL_FLAG_SUBSCRIPTION
    if class_filter:
        flag |= PULL_FLAG_CLASS_FILTER
    if lite_pull:
        flag |= PULL_FLAG_LITE_PULL
    return flag


def clear_commit_offset_flag(sys_flag: int) -> int:
    return sys_flag & ~PULL_FLAG_COMMIT_OFFSET


def has_commit_offset_flag(sys_flag: int) -> bool:
    return (sys_flag & PULL_FLAG_COMMIT_OFFSET) == PULL_FLAG_COMMIT_OFFSET


def has_suspend_flag(sys_flag: int) -> bool:
    return (sys_flag & PULL_FLAG_SUSPEND) == PULL_FLAG_SUSPEND


def has_subscription_flag(sys_flag: int) -> bool:
    return (sys_flag & PULL_FLAG_SUBSCRIPTION) == PULL_FLAG_SUBSCRIPTION


def has_class_filter_flag(sys_flag: int) -> bool:
    return (sys_flag & PULL_FLAG_CLASS_FILTER) == PULL_FLAG_CLASS_FILTER


def has_lite_pull_flag(sys_flag: int) -> bool:
    return (sys_flag & PULL_FLAG_LITE_PULL) == PULL_FLAG_LITE_PULL
