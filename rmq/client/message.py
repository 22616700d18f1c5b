"""Client-side message types, named after RocketMQ's Java client in snake_case.

``Message`` (what a producer sends), ``SendResult`` / ``SendStatus``,
``MessageQueue``, ``PullResult`` / ``PullStatus``.  Consumed messages are
:class:`rmq._core.commitlog.MessageExt` objects decoded in C (body, tags,
keys, properties, queue_id, queue_offset, msg_id, store_timestamp,
born_timestamp, reconsume_times, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Optional, Union

from rmq._core.client_msg import create_uniq_id
from rmq._core.commitlog import MessageExt
from rmq.errors import MQClientError

# Property names (SPEC.md §1.6, MessageConst)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
# RocketMQ 5 timer messages (MessageConst; SPEC.md §10.4)
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC)
KEY_SEPARATOR = " "
MAX_DELAY_LEVEL = 18          # messageDelayLevel has 18 levels (SPEC.md §10.1)
RESERVED_PROPERTIES = (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELAY_TIME_LEVEL,
                       PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK) + TIMER_PROPERTIES


class Message:
    """A message to send (RocketMQ ``Message``).

    Parameters
    ----------
    topic : str
    body : bytes
        At most the producer's ``max_message_size`` (4 MiB by default).
    tags : str, optional
        One tag (hashed into the ConsumeQueue tagsCode for server-side filtering).
    keys : str or list of str, optional
        Indexed keys (look-up with ``query_message``); no spaces inside a key.
    properties : dict, optional
        User properties (str -> str).
    delay_time_level : int
        0 (none) or 1..18 (SPEC.md §10.1).
    flag : int
        Opaque user int stored in the record.
    deliver_time_ms : int, optional
        Timer message (RocketMQ 5 ``setDeliverTimeMs``; property ``TIMER_DELIVER_MS``): deliver
        at this time, epoch ms.  A time not ahead delivers at once; more than the broker's
        ``timerMaxDelaySec`` (3 days) ahead is refused (MQBrokerError, MESSAGE_ILLEGAL).  Delivery
        is never early and at most ``timerPrecisionMs`` (1 000 ms) late, plus the broker's work.
    delay_time_ms : int, optional
        Timer message, relative (``setDelayTimeMs``; ``TIMER_DELAY_MS``): deliver this many ms
        after the broker stores it.

    Raises
    ------
    MQClientError
        A body that is not bytes, a bad delay level or timer value, or a timer together with a
        delay level or with another timer property.
    """

    __slots__ = ("topic", "body", "properties", "flag")

    def __init__(self, topic: str, body: bytes, tags: Optional[str] = None,
                 keys: Union[None, str, Iterable[str]] = None, properties: Optional[dict] = None,
                 delay_time_level: int = 0, flag: int = 0, wait_store_msg_ok: bool = True,
                 deliver_time_ms: Optional[int] = None, delay_time_ms: Optional[int] = None):
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise MQClientError(f"message body must be bytes, got {type(body).__name__}")
        self.topic = topic
        self.body = body if type(body) is bytes else bytes(body)
        self.properties: dict = {str(k): str(v) for k, v in properties.items()} if properties else {}
        self.flag = flag
        if tags:
            self.tags = tags
        if keys:
            self.keys = keys
        if delay_time_level:
            self.delay_time_level = delay_time_level
        if not wait_store_msg_ok:
            self.properties[PROPERTY_WAIT_STORE_MSG_OK] = "false"
        if deliver_time_ms is not None:
            self.deliver_time_ms = deliver_time_ms
        if delay_time_ms is not None:
            self.delay_time_ms = delay_time_ms

    @property
    def tags(self) -> Optional[str]:
        return self.properties.get(PROPERTY_TAGS)

    @tags.setter
    def tags(self, value: Optional[str]) -> None:
        if value:
            self.properties[PROPERTY_TAGS] = value
        else:
            self.properties.pop(PROPERTY_TAGS, None)

    @property
    def keys(self) -> list:
        k = self.properties.get(PROPERTY_KEYS)
        return [x for x in k.split(KEY_SEPARATOR) if x] if k else []

    @keys.setter
    def keys(self, value: Union[None, str, Iterable[str]]) -> None:
        if not value:
            self.properties.pop(PROPERTY_KEYS, None)
            return
        items = [value] if isinstance(value, str) else [str(v) for v in value]
        self.properties[PROPERTY_KEYS] = KEY_SEPARATOR.join(items)

    @property
    def delay_time_level(self) -> int:
        d = self.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        return int(d) if d else 0

    @delay_time_level.setter
    def delay_time_level(self, level: int) -> None:
        if not isinstance(level, int) or not 0 <= level <= MAX_DELAY_LEVEL:
            raise MQClientError(f"delay_time_level must be 0..{MAX_DELAY_LEVEL}, got {level!r}")
        if level and any(p in self.properties for p in TIMER_PROPERTIES):
            raise MQClientError("delay_time_level and a timer (deliver_time_ms / delay_time_ms) are exclusive")
        if level:
            self.properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        else:
            self.properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)

    def _timer(self, name: str) -> Optional[int]:
        v = self.properties.get(name)
        return int(v) if v else None

    def _set_timer(self, name: str, value: Optional[int], what: str) -> None:
        if value is None:
            self.properties.pop(name, None)
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MQClientError(f"{what} must be an int >= 0 (ms), got {value!r}")
        others = [p for p in TIMER_PROPERTIES if p != name and p in self.properties]
        if others:
            raise MQClientError(f"a message takes one timer: {what} given, {others[0]} already set")
        if self.properties.get(PROPERTY_DELAY_TIME_LEVEL):
            raise MQClientError(f"{what} and delay_time_level are exclusive (RocketMQ: the level wins)")
        self.properties[name] = str(value)

    @property
    def deliver_time_ms(self) -> Optional[int]:
        """Timer deliver time, epoch ms (``TIMER_DELIVER_MS``), or None."""
        return self._timer(PROPERTY_TIMER_DELIVER_MS)

    @deliver_time_ms.setter
    def deliver_time_ms(self, value: Optional[int]) -> None:
        self._set_timer(PROPERTY_TIMER_DELIVER_MS, value, "deliver_time_ms")

    @property
    def delay_time_ms(self) -> Optional[int]:
        """Timer delay after the broker stores the message, ms (``TIMER_DELAY_MS``), or None."""
        return self._timer(PROPERTY_TIMER_DELAY_MS)

    @delay_time_ms.setter
    def delay_time_ms(self, value: Optional[int]) -> None:
        self._set_timer(PROPERTY_TIMER_DELAY_MS, value, "delay_time_ms")

    def put_user_property(self, name: str, value: str) -> None:
        if name in RESERVED_PROPERTIES:
            raise MQClientError(f"the property {name!r} is used by the system")
        self.properties[name] = str(value)

    def __repr__(self) -> str:
        return f"Message(topic={self.topic!r}, body={len(self.body)} bytes, properties={self.properties})"


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (RocketMQ ``MessageQueue``)."""
    topic: str
    broker_name: str
    queue_id: int

    def key(self) -> str:
        """``topic/brokerName/queueId`` (the Spark connector's offset key)."""
        return f"{self.topic}/{self.broker_name}/{self.queue_id}"


class SendStatus(str, Enum):
    """RocketMQ ``SendStatus``: every one means the message is stored."""
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass
class SendResult:
    """Outcome of a send (RocketMQ ``SendResult``).

    ``msg_id`` is the client-generated unique id (UNIQ_KEY); ``offset_msg_id`` the
    broker's (store host + physical offset).  For a batch both are comma-joined.
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


__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "PullResult", "PullStatus",
           "create_uniq_id"]
