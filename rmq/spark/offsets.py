"""Offsets of the ``rmq`` Spark source: JSON-safe dicts keyed ``"topic/brokerName/queueId"``.

A source offset (what Spark writes to the checkpoint) is::

    {"flights/broker-a/0": 1200, "flights/broker-a/1": 1187, ...}

Each value is the **next** queue offset to read (entries, not bytes), so a micro-batch
``(start, end)`` reads ``[start[k], end[k])`` of queue ``k``: ends are exclusive, as in
Spark's Kafka source.  A key missing from ``start`` is a queue discovered mid-stream;
it is read from queue offset 0 (a cleaned queue then reports data loss, as Kafka does
for a new partition that does not start at 0).

``startingOffsets`` / ``endingOffsets`` JSON accepts three shapes (values: an offset,
``-2`` = earliest, ``-1`` = latest)::

    {"flights/broker-a/0": 23}                       # the checkpoint's own shape
    {"flights": {"broker-a": {"0": 23, "1": -2}}}    # topic -> broker -> queue id
    {"flights": {"0": 23, "1": -1}}                  # topic -> queue id (every broker)
"""
from __future__ import annotations

import json
from typing import Mapping, Optional

from rmq.client.message import MessageQueue

EARLIEST = -2          # Kafka's sentinels in offset JSON
LATEST = -1

__all__ = ["EARLIEST", "LATEST", "key_of", "queue_of", "OffsetSpec", "parse_offset_spec", "rate_limit"]


def key_of(mq: MessageQueue) -> str:
    """``topic/brokerName/queueId``."""
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"


def queue_of(key: str) -> MessageQueue:
    """Inverse of :func:`key_of`.

    Raises
    ------
    ValueError
        ``key`` is not ``topic/brokerName/queueId`` with an integer queue id.
    """
    parts = key.split("/")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ValueError(f"offset key {key!r} is not 'topic/brokerName/queueId'")
    try:
        qid = int(parts[2])
    except ValueError:
        raise ValueError(f"offset key {key!r}: queue id {parts[2]!r} is not an integer") from None
    if qid < 0:
        raise ValueError(f"offset key {key!r}: queue id is negative")
    return MessageQueue(parts[0], parts[1], qid)


class OffsetSpec:
    """Where to start or stop, per queue: ``earliest``, ``latest`` or a JSON table.

    ``resolve(mq)`` gives an offset >= 0, :data:`EARLIEST`, :data:`LATEST`, or None when
    the JSON table does not name the queue (the caller applies its default).
    """

    def __init__(self, kind: str, table: Optional[dict] = None):
        self.kind = kind                       # "earliest" | "latest" | "json"
        self.exact: dict = {}                  # (topic, broker, qid) -> offset
        self.any_broker: dict = {}             # (topic, qid) -> offset
        for k, v in (table or {}).items():
            if len(k) == 3:
                self.exact[k] = v
            else:
                self.any_broker[k] = v

    def resolve(self, mq: MessageQueue) -> Optional[int]:
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        v = self.exact.get((mq.topic, mq.broker_name, mq.queue_id))
        if v is None:
            v = self.any_broker.get((mq.topic, mq.queue_id))
        return v

    def topics(self) -> set:
        return {k[0] for k in self.exact} | {k[0] for k in self.any_broker}

    def __repr__(self) -> str:
        return f"OffsetSpec({self.kind!r}, exact={self.exact}, any_broker={self.any_broker})"


def _offset_value(option: str, where: str, v: object, allow_earliest: bool) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"option {option!r}: offset of {where} must be an integer, got {v!r}")
    lo = EARLIEST if allow_earliest else LATEST
    if v < lo:
        allowed = "-2 (earliest), -1 (latest)" if allow_earliest else "-1 (latest)"
        raise ValueError(f"option {option!r}: offset of {where} is {v}; use an offset >= 0, or {allowed}")
    return v


def _queue_id(option: str, topic: str, s: str) -> int:
    try:
        q = int(s)
    except ValueError:
        raise ValueError(f"option {option!r}: queue id {s!r} of topic {topic!r} is not an integer") from None
    if q < 0:
        raise ValueError(f"option {option!r}: queue id {q} of topic {topic!r} is negative")
    return q


def parse_offset_spec(option: str, text: str, allow_earliest: bool = True) -> OffsetSpec:
    """Parse ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON.

    Raises
    ------
    ValueError
        Anything else; the message names ``option`` and the offending part.
    """
    s = text.strip()
    low = s.lower()
    if low == "latest":
        return OffsetSpec("latest")
    if low == "earliest":
        if not allow_earliest:
            raise ValueError(f"option {option!r}: 'earliest' is not allowed here (use 'latest' or JSON)")
        return OffsetSpec("earliest")
    try:
        doc = json.loads(s)
    except ValueError as e:
        raise ValueError(f"option {option!r} must be 'earliest', 'latest' or a JSON object; "
                         f"{text!r} does not parse: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"option {option!r} must be a JSON object, got {type(doc).__name__}")
    table: dict = {}
    for k, v in doc.items():
        if "/" in k:
            mq = queue_of(k) if k.count("/") == 2 else None
            if mq is None:
                raise ValueError(f"option {option!r}: key {k!r} is not 'topic/brokerName/queueId'")
            table[(mq.topic, mq.broker_name, mq.queue_id)] = _offset_value(option, k, v, allow_earliest)
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, dict):          # topic -> broker -> queue -> offset
                    for k3, v3 in v2.items():
                        table[(k, k2, _queue_id(option, k, k3))] = _offset_value(
                            option, f"{k}/{k2}/{k3}", v3, allow_earliest)
                else:                             # topic -> queue -> offset
                    table[(k, _queue_id(option, k, k2))] = _offset_value(option, f"{k}/*/{k2}", v2,
                                                                         allow_earliest)
        else:
            raise ValueError(f"option {option!r}: the value of {k!r} must be an object of queue offsets, "
                             f"got {v!r}")
    return OffsetSpec("json", table)


def rate_limit(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int) -> dict:
    """End offsets admitting at most ``max_rows`` queue entries in total (``maxOffsetsPerTrigger``).

    The budget is split across the queues with a backlog in proportion to their backlog
    (Kafka's ``rateLimit``), but exactly: every queue with a backlog first gets one entry
    when the budget allows (no queue starves), the rest is shared by largest remainder,
    and the sum never exceeds ``max_rows``.  Keys of ``latest`` missing from ``start``
    start at 0; keys of ``start`` missing from ``latest`` keep their start.

    Returns
    -------
    dict
        ``{key: end}`` with ``start[k] <= end[k] <= latest[k]`` for every key with a backlog.
    """
    end = {**start, **latest}
    backlog = {k: latest[k] - start.get(k, 0) for k in sorted(latest) if latest[k] > start.get(k, 0)}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    give = dict.fromkeys(backlog, 0)
    budget = max_rows
    if budget >= len(backlog):                 # one each first, so small queues always move
        for k in give:
            give[k] = 1
        budget -= len(backlog)
    rest = {k: n - give[k] for k, n in backlog.items()}
    rest_total = sum(rest.values())
    if budget > 0 and rest_total > 0:
        shares = {k: budget * n / rest_total for k, n in rest.items()}
        floors = {k: int(v) for k, v in shares.items()}
        left = budget - sum(floors.values())
        for k in sorted(shares, key=lambda k: (floors[k] - shares[k], k))[:left]:
            floors[k] += 1
        for k in give:
            give[k] += min(floors[k], rest[k])
    for k, n in give.items():
        end[k] = start.get(k, 0) + n
    return end
