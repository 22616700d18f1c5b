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

from rmq._core.commitlog import MessageExt
# Property names (SPEC.md §1.6, MessageConst), and the Message type: in C (rmq._core.client_msg)
from rmq._core.client_msg import (KEY_SEPARATOR, MAX_DELAY_LEVEL, PROPERTY_DELAY_TIME_LEVEL,  # noqa: F401
                                  PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC,
                                  PROPERTY_TIMER_DELIVER_MS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                                  PROPERTY_WAIT_STORE_MSG_OK, RESERVED_PROPERTIES, TIMER_PROPERTIES, Message,
                                  create_uniq_id)

from rmq.common.message_const import (PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_ORIGIN_MESSAGE_ID,  # noqa: F401
                                      PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_RECONSUME_TIME,
                                      PROPERTY_RETRY_TOPIC, PROPERTY_SHARDING_KEY)


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
