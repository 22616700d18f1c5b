"""Typed request headers of the codes more than one client builds (RocketMQ's
``common/protocol/header``: ``SendMessageRequestHeader``, ``PullMessageRequestHeader``).

Each is a dataclass with RocketMQ's field names in snake_case; ``to_fields()`` gives the
frame's header fields under RocketMQ's camelCase names (the broker reads them with its own
defaults and checks: :mod:`rmq.actors.processor`).  The producer, the consumers (thread and
asyncio), the admin and the proxy build SEND_MESSAGE / PULL_MESSAGE through these, so a field's
name and default are written once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Union


SUB_ALL = "*"                          # a subscription to every tag (SubscriptionData.SUB_ALL)
TAG = "TAG"                            # ExpressionType.TAG, the default expression type


def now_ms() -> int:
    """Wall-clock milliseconds (bornTimestamp)."""
    return int(time.time() * 1000)


@dataclass(slots=True)
class PullMessageRequestHeader:
    """PULL_MESSAGE (11).  ``sys_flag``: :mod:`rmq.common.pull_sys_flag`; ``commit_offset``
    counts only with PULL_FLAG_COMMIT_OFFSET, ``suspend_timeout_millis`` only with
    PULL_FLAG_SUSPEND (ms the broker may hold the pull); ``subscription`` / ``expression_type``:
    a tag expression (``TAG``) or a ``SQL92`` one.  ``last_epoch`` (rmq, on the wire only when
    > 0): the ``brokerEpoch`` of the pull answer that gave the consumer ``queue_offset``, which a
    broker whose log left that HA epoch behind answers PULL_OFFSET_MOVED (see
    ``PullMessageProcessor.past_epoch_end``)."""
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int                  # entries
    max_msg_nums: int
    sys_flag: int = 0
    commit_offset: int = -1
    suspend_timeout_millis: int = 0
    subscription: str = SUB_ALL
    sub_version: int = 0
    expression_type: str = TAG
    last_epoch: int = 0

    def to_fields(self) -> dict:
        fields = {"consumerGroup": self.consumer_group, "topic": self.topic, "queueId": int(self.queue_id),
                  "queueOffset": int(self.queue_offset), "maxMsgNums": int(self.max_msg_nums),
                  "sysFlag": int(self.sys_flag), "commitOffset": int(self.commit_offset),
                  "suspendTimeoutMillis": int(self.suspend_timeout_millis),
                  "subscription": self.subscription or SUB_ALL, "subVersion": int(self.sub_version),
                  "expressionType": self.expression_type or TAG}
        if self.last_epoch > 0:
            fields["lastEpoch"] = int(self.last_epoch)
        return fields


@dataclass(slots=True)
class SendMessageRequestHeader:
    """SEND_MESSAGE (10) / SEND_BATCH_MESSAGE (320).  ``queue_id`` -1 lets the broker pick;
    ``properties``: a dict, or RocketMQ's encoded string (SPEC.md §1.6).  The optional fields
    go on the wire only when set (the broker's defaults apply otherwise): ``default_topic`` /
    ``default_topic_queue_nums``, the template a missing topic is auto-created from and its
    queues (a producer's send); ``wait_store_msg_ok``; ``max_reconsume_times`` (a consumer's
    send-back); ``born_host`` (the proxy, for its client)."""
    producer_group: str
    topic: str
    queue_id: int = -1
    sys_flag: int = 0
    born_timestamp: int = field(default_factory=now_ms)   # ms
    flag: int = 0
    properties: Union[dict, str] = field(default_factory=dict)
    reconsume_times: int = 0
    default_topic: Optional[str] = None
    default_topic_queue_nums: Optional[int] = None
    wait_store_msg_ok: Optional[bool] = None
    max_reconsume_times: Optional[int] = None
    born_host: Optional[str] = None

    def to_fields(self) -> dict:
        f = {"producerGroup": self.producer_group, "topic": self.topic, "queueId": int(self.queue_id),
             "sysFlag": int(self.sys_flag), "bornTimestamp": int(self.born_timestamp), "flag": int(self.flag),
             "properties": self.properties, "reconsumeTimes": int(self.reconsume_times)}
        if self.default_topic is not None:
            f["defaultTopic"] = self.default_topic
        if self.default_topic_queue_nums is not None:
            f["defaultTopicQueueNums"] = int(self.default_topic_queue_nums)
        if self.wait_store_msg_ok is not None:
            f["waitStoreMsgOK"] = bool(self.wait_store_msg_ok)
        if self.max_reconsume_times is not None:
            f["maxReconsumeTimes"] = int(self.max_reconsume_times)
        if self.born_host is not None:
            f["bornHost"] = self.born_host
        return f


#: bytes: a send answer's ``msgId`` (the offset msg ids, comma-joined for a batch: 33 bytes each) longer
#: than this goes in the answer's body, flagged ``msgIdInBody``; in the header, the 1,986th id of a
#: batch would pass the frame's 64 KiB header limit (rmq.protocol.MAX_HEADER_SIZE), the messages
#: stored and the answer lost
SEND_RESPONSE_MSG_ID_INLINE_MAX = 16 * 1024


# SEND_BATCH_MESSAGE refused as too large to store whole (MESSAGE_ILLEGAL: over maxMessageSize, or
# more than one CommitLog file holds): the response carries the largest batch body (bytes) the
# broker takes in this field, so a producer that made the batch itself can split it into parts that
# fit and send those (rmq; RocketMQ answers the same code without the field)
MAX_BATCH_BYTES_FIELD = "maxBatchBytes"


def send_response_msg_id_parts(msg_id: str) -> tuple[dict, list]:
    """(header fields, bodies) that carry a SEND_MESSAGE / SEND_BATCH_MESSAGE answer's ``msgId``."""
    if len(msg_id) <= SEND_RESPONSE_MSG_ID_INLINE_MAX:
        return {"msgId": msg_id}, []
    return {"msgIdInBody": True}, [msg_id.encode("ascii")]


def send_response_msg_id(fields: dict, bodies) -> str:
    """The ``msgId`` of a send answer (:func:`send_response_msg_id_parts`), "" when it has none."""
    if fields.get("msgIdInBody") and bodies:
        return bytes(bodies[0]).decode("ascii", "replace")
    return str(fields.get("msgId") or "")


__all__ = ["PullMessageRequestHeader", "SendMessageRequestHeader", "SUB_ALL", "TAG", "now_ms",
           "SEND_RESPONSE_MSG_ID_INLINE_MAX", "send_response_msg_id", "send_response_msg_id_parts"]
