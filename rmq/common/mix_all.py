"""Names shared by clients and brokers (RocketMQ ``MixAll``)."""
from __future__ import annotations

MASTER_ID = 0                               # brokerId of a master; slaves are >= 1 (an int: see rmq.common.route
                                            # for the decimal-string keys of brokerAddrs on the wire)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"        # a consumer group's retry topic: %RETRY%<group>
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"            # its dead letter queue: %DLQ%<group>
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"   # the group of a consumer's send-backs
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"     # the group of pulls made by admin tools
DEFAULT_TOPIC_QUEUE_NUMS = 4                # queues a producer asks for when its send auto-creates a topic
                                            # (DefaultMQProducer.defaultTopicQueueNums)
DEFAULT_NAMESRV_ADDR = "127.0.0.1:9876"     # rmq: the NameServer clients, tools and `rmq start` use by default

__all__ = ["MASTER_ID", "RETRY_GROUP_TOPIC_PREFIX", "DLQ_GROUP_TOPIC_PREFIX", "CLIENT_INNER_PRODUCER_GROUP",
           "TOOLS_CONSUMER_GROUP", "DEFAULT_TOPIC_QUEUE_NUMS", "DEFAULT_NAMESRV_ADDR", "retry_topic", "dlq_topic", "is_retry_topic", "is_dlq_topic"]


def retry_topic(group: str) -> str:
    """``%RETRY%<group>`` (``MixAll.getRetryTopic``)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>`` (``MixAll.getDLQTopic``)."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
