"""Client-side message types, named after RocketMQ's Java client in snake_case.

``Message`` (what a producer sends), ``SendResult`` / ``SendStatus``,
``MessageQueue``, ``PullResult`` / ``PullStatus``.  Consumed messages are
:class:`rmq._core.commitlog.MessageExt` objects decoded in C (body, tags,
keys, properties, queue_id, queue_offset, msg_id, store_timestamp,
born_timestamp, reconsume_times, ...).
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from rmq._core.commitlog import MessageExt
# Property names (SPEC.md §1.6, MessageConst), and the Message type: in C (rmq._core.client_msg)
from rmq._core.client_msg import (KEY_SEPARATOR, MAX_DELAY_LEVEL, PROPERTY_DELAY_TIME_LEVEL,  # noqa: F401
                                  PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC,
                                  PROPERTY_TIMER_DELIVER_MS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                                  PROPERTY_WAIT_STORE_MSG_OK, RESERVED_PROPERTIES, TIMER_PROPERTIES, Message,
                                  create_uniq_id, split_uniq_ids)

from rmq.common.message_const import (PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_ORIGIN_MESSAGE_ID,  # noqa: F401
                                      PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_RECONSUME_TIME,
                                      PROPERTY_RETRY_TOPIC, PROPERTY_SHARDING_KEY)


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (RocketMQ ``MessageQueue``).

    Its hash is computed once (it keys the clients' per-queue tables: an ordered send looks its
    queue up three times); it is never pickled, as str hashes differ between processes: a copy is
    built again from the three fields (``__reduce__``)."""
    topic: str
    broker_name: str
    queue_id: int

    def __post_init__(self) -> None:      # not a field: asdict, astuple, repr and order ignore it
        object.__setattr__(self, "_hash", hash((self.topic, self.broker_name, self.queue_id)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return MessageQueue, (self.topic, self.broker_name, self.queue_id)

    def key(self) -> str:
        """``topic/brokerName/queueId`` (the Spark connector's offset key)."""
        return f"{self.topic}/{self.broker_name}/{self.queue_id}"


class SendStatus(str, Enum):
    """RocketMQ ``SendStatus``: every one means the message is stored."""
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)
class SendResult:
    """Outcome of a send (RocketMQ ``SendResult``).

    ``msg_id`` is the client-generated unique id (UNIQ_KEY); ``offset_msg_id`` the
    broker's (store host + physical offset).  For a batch both are comma-joined.
    (``slots``: one object per result, built field by field in C for a batch's messages by
    ``rmq._core.client_msg.complete_send_batch``.)
    """
    status: SendStatus
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    offset_msg_id: str = ""
    region_id: str = "DefaultRegion"

    @property
    def queue_id(self) -> int:
        return self.message_queue.queue_id

    @property
    def queue(self) -> MessageQueue:
        return self.message_queue


class ColumnSendResults(Sequence):
    """The outcome of one ``Producer.send_async_columns`` call of ``n`` rows: a sequence of
    ``n`` entries in the order given -- row ``i``'s :class:`SendResult`, or the exception it
    failed with -- kept as one record per request (not an object per row), with columnar views.

    The views are lists / ``array`` objects built on first use; a failed row is ``-1`` in the
    arrays and None in ``message_queues``:

    * ``queue_ids`` (``array('i')``), ``queue_offsets`` (``array('q')``), ``message_queues``;
    * ``msg_ids``: every row's UNIQ_KEY (a failed row's too: it was sent with it);
    * ``exceptions``: ``{row: exception}`` of the failed rows; ``failed``: how many;
    * :meth:`last_offsets`: the highest queue offset stored per queue (``{MessageQueue: int}``).

    ``results[i]`` builds row ``i``'s :class:`SendResult` (``offset_msg_id`` included).
    """

    __slots__ = ("n", "failed", "_parts", "_cache")

    def __init__(self, n: int, parts: list, failed: int) -> None:
        # parts: (positions, UNIQ_KEYs as 32 ASCII bytes per row, record, exception): record =
        # (status, MessageQueue, base queue offset, [offset msg id per row]), or None with the exception
        self.n = n
        self.failed = failed
        self._parts = parts
        self._cache: dict = {}

    def __len__(self) -> int:
        return self.n

    def _rows(self) -> list:
        """Every entry, in the order given (built once)."""
        rows = self._cache.get("rows")
        if rows is None:
            rows = [None] * self.n
            ids = self.msg_ids
            for positions, _, rec, exc in self._parts:
                if rec is None:
                    for i in positions:
                        rows[i] = exc
                    continue
                status, mq, base, offset_ids = rec        # offset_ids: one per row (send_response_fields)
                for j, i in enumerate(positions):
                    rows[i] = SendResult(status, ids[i], mq, base + j, offset_ids[j])
            self._cache["rows"] = rows
        return rows

    def __getitem__(self, i):
        return self._rows()[i]

    def __iter__(self):
        return iter(self._rows())

    def _column(self, name: str, make, value_of, failed_value):
        col = self._cache.get(name)
        if col is None:
            col = make(self.n)
            for positions, _, rec, _ in self._parts:
                if rec is None:
                    for i in positions:
                        col[i] = failed_value
                    continue
                values = value_of(rec, len(positions))
                if type(positions) is range and positions.step == 1:
                    col[positions.start:positions.stop] = values
                else:
                    for i, v in zip(positions, values):
                        col[i] = v
            self._cache[name] = col
        return col

    @property
    def queue_offsets(self) -> "array":
        return self._column("queue_offsets", lambda n: array("q", bytes(8 * n)),
                            lambda rec, m: array("q", range(rec[2], rec[2] + m)), -1)

    @property
    def queue_ids(self) -> "array":
        return self._column("queue_ids", lambda n: array("i", bytes(4 * n)),
                            lambda rec, m: array("i", [rec[1].queue_id]) * m, -1)

    @property
    def message_queues(self) -> list:
        return self._column("message_queues", lambda n: [None] * n, lambda rec, m: [rec[1]] * m, None)

    @property
    def msg_ids(self) -> list:
        ids = self._cache.get("msg_ids")
        if ids is None:
            ids = [""] * self.n
            for positions, uniq, _, _ in self._parts:
                part_ids = split_uniq_ids(uniq)
                if type(positions) is range and positions.step == 1:
                    ids[positions.start:positions.stop] = part_ids
                else:
                    for i, u in zip(positions, part_ids):
                        ids[i] = u
            self._cache["msg_ids"] = ids
        return ids

    @property
    def exceptions(self) -> dict:
        return {i: exc for positions, _, rec, exc in self._parts if rec is None for i in positions}

    def last_offsets(self) -> dict:
        """``{MessageQueue: highest queue offset stored there by this call}`` (one entry per queue
        written; what a reader needs to read these rows back up to: that offset + 1)."""
        out: dict = {}
        for positions, _, rec, _ in self._parts:
            if rec is not None and len(positions):
                last = rec[2] + len(positions) - 1
                if last > out.get(rec[1], -1):
                    out[rec[1]] = last
        return out

    def __repr__(self) -> str:
        return f"ColumnSendResults(n={self.n}, failed={self.failed}, requests={len(self._parts)})"


class PullStatus(str, Enum):
    """RocketMQ ``PullStatus``."""
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass
class PullResult:
    """Outcome of a pull (RocketMQ ``PullResult``); ``msg_found_list`` holds MessageExt objects."""
    pull_status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msg_found_list: list = field(default_factory=list)


# unique message ids (MessageClientIDSetter, SPEC.md §1.8): create_uniq_id, made in C by
# rmq._core.client_msg


__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "ColumnSendResults", "PullResult",
           "PullStatus", "create_uniq_id"]
