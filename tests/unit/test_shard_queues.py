"""ShardQueues: a sharding key's queue remembered under a route, without I/O."""
import pytest

from rmq import Message
from rmq.client import producer_request as P
from rmq.client.message import MessageQueue
from rmq.client.producer_request import ShardQueues, apply_selector, select_by_hash
from rmq.client.route import TopicPublishInfo
from rmq.errors import MQClientError


def info(n, topic="T"):
    return TopicPublishInfo(topic, [MessageQueue(topic, "broker-a", q) for q in range(n)])


@pytest.mark.parametrize("key", ["order-17", "", 42, -7, 2 ** 40, b"k", True, False, 1.5, ("a", 1)])
def test_the_same_queue_as_select_by_hash(key):
    sq, i, msg = ShardQueues(), info(8), Message("T", b"x")
    want = apply_selector(select_by_hash, i, msg, key)
    assert sq.select(i, msg, key) == want
    assert sq.select(i, msg, key) == want          # remembered (or recomputed for other types)


def test_true_and_1_are_two_keys():
    """``True == 1`` in Python, but Java's hashCodes differ (1231 and 1): their queues may too."""
    sq, i, msg = ShardQueues(), info(7), Message("T", b"x")
    assert sq.select(i, msg, 1) == i.message_queue_list[1]
    assert sq.select(i, msg, True) == i.message_queue_list[1231 % 7]
    assert sq.select(i, msg, 1) == i.message_queue_list[1]


def test_a_new_route_is_seen_at_once():
    sq, msg = ShardQueues(), Message("T", b"x")
    old, new = info(8), info(3)
    assert sq.select(old, msg, "k") == apply_selector(select_by_hash, old, msg, "k")
    assert sq.select(new, msg, "k") == apply_selector(select_by_hash, new, msg, "k")
    assert sq.select(info(8, "U"), msg, "k").topic == "U"


def test_bounded_and_errors_as_apply_selector(monkeypatch):
    monkeypatch.setattr(P, "SHARD_QUEUES_MAX", 4)
    sq, i, msg = ShardQueues(), info(8), Message("T", b"x")
    for k in range(10):
        assert sq.select(i, msg, k) == i.message_queue_list[k % 8]
        assert len(sq._queues) <= 4
    with pytest.raises(MQClientError):
        sq.select(TopicPublishInfo("T", [], provisional=True), msg, "k")
