"""The broker's statistics windows: RocketMQ's BrokerStatsManager / StatsItemSet, for
``VIEW_BROKER_STATS_DATA`` (315), ``rmq admin statsAll`` and the dashboard.

Each key of a :class:`StatsItemSet` (a topic for ``TOPIC_PUT_NUMS``, ``topic@group`` for
``GROUP_GET_NUMS``) keeps exact running totals (messages, bytes, calls) and samples them into three
windows, as RocketMQ's StatsItem does: every 10 s for the last minute, every 10 min for the last
hour, every hour for the last day.  A window's figures are the current totals minus its oldest
sample, so they are exact from the first message on (RocketMQ reports 0 until a window has two
samples):

- ``sum``: messages in the window;
- ``tps``: ``sum`` per second over the window's span (at least :data:`MIN_SPAN_MS`);
- ``avgpt``: messages per call (a batch send counts once) over the window.

The stats names and their keys are RocketMQ's (``BrokerStatsManager``): TOPIC_PUT_NUMS /
TOPIC_PUT_SIZE keyed by topic, GROUP_GET_NUMS / GROUP_GET_SIZE keyed by ``topic@group``.  The
``*_SIZE`` names give bytes in ``sum`` and bytes per second in ``tps``.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE)

# (window name, sampling period ms, samples kept): RocketMQ StatsItem's minute / hour / day windows
WINDOWS = (("statsMinute", 10_000, 7), ("statsHour", 600_000, 7), ("statsDay", 3_600_000, 25))
MIN_SPAN_MS = 1000              # a tps is never computed over less than a second
MAX_KEYS = 100_000              # keys per set; beyond it the quietest ones are dropped at the next day sample
IDLE_DROP_MS = 86_400_000       # a key with no update for a day is dropped at the day sample


class StatsItem:
    """Running totals of one key and its three sample windows (``(t_ms, nums, bytes, calls)``)."""

    __slots__ = ("nums", "size", "calls", "updated_ms", "windows")

    def __init__(self, now_ms: int):
        self.nums = 0
        self.size = 0
        self.calls = 0
        self.updated_ms = now_ms
        self.windows = tuple(deque([(now_ms, 0, 0, 0)], maxlen=kept) for _, _, kept in WINDOWS)

    def snapshot(self, now_ms: int, size: bool = False) -> dict:
        """``{statsMinute|statsHour|statsDay: {"sum", "tps", "avgpt"}}`` at ``now_ms``."""
        out = {}
        cur = self.size if size else self.nums
        for (name, _, _), w in zip(WINDOWS, self.windows):
            t0, n0, b0, c0 = w[0]
            s = cur - (b0 if size else n0)
            calls = self.calls - c0
            out[name] = {"sum": s, "tps": round(s * 1000.0 / max(now_ms - t0, MIN_SPAN_MS), 3),
                         "avgpt": round((self.nums - n0) / calls, 3) if calls else 0.0}
        return out


class StatsItemSet:
    """Keys -> :class:`StatsItem` for one pair of stats names (nums and size of the same events)."""

    def __init__(self, nums_name: str, size_name: str):
        self.nums_name = nums_name
        self.size_name = size_name
        self.items: dict[str, StatsItem] = {}

    def add(self, key: str, nums: int, size: int, now_ms: int) -> None:
        """Count one call of ``nums`` messages and ``size`` bytes under ``key``."""
        item = self.items.get(key)
        if item is None:
            item = self.items[key] = StatsItem(now_ms)
        item.nums += nums
        item.size += size
        item.calls += 1
        item.updated_ms = now_ms

    def sample(self, window: int, now_ms: int) -> None:
        """Append the current totals to window ``window`` (0 minute, 1 hour, 2 day) of every key;
        the day sample also drops keys idle for :data:`IDLE_DROP_MS` and, past :data:`MAX_KEYS`,
        the least recently updated."""
        for item in self.items.values():
            item.windows[window].append((now_ms, item.nums, item.size, item.calls))
        if window == 2:
            idle = [k for k, it in self.items.items() if now_ms - it.updated_ms > IDLE_DROP_MS]
            for k in idle:
                del self.items[k]
            if len(self.items) > MAX_KEYS:
                for k in sorted(self.items, key=lambda k: self.items[k].updated_ms)[:len(self.items) - MAX_KEYS]:
                    del self.items[k]

    def stats(self, name: str, key: Optional[str], now_ms: int) -> Optional[dict]:
        """BrokerStatsData of ``key`` under stats ``name`` (None: no such key); ``key`` None: every
        key's, as ``{key: data}``."""
        size = name == self.size_name
        if key is None:
            return {k: it.snapshot(now_ms, size) for k, it in self.items.items()}
        item = self.items.get(key)
        return item.snapshot(now_ms, size) if item is not None else None


class BrokerStats:
    """The broker's two sets: topic puts and ``topic@group`` gets."""

    def __init__(self):
        self.put = StatsItemSet(TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)
        self.get = StatsItemSet(GROUP_GET_NUMS, GROUP_GET_SIZE)

    def set_of(self, name: str) -> StatsItemSet:
        """The set serving stats ``name``.  Raises KeyError for a name not in :data:`STATS_NAMES`."""
        if name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
            return self.put
        if name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
            return self.get
        raise KeyError(name)

    def sample(self, window: int, now_ms: int) -> None:
        self.put.sample(window, now_ms)
        self.get.sample(window, now_ms)
