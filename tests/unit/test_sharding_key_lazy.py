"""An ordered send of a message without properties keeps it without a properties dict: the
sharding key is held beside its UNIQ_KEY (rmq._core.client_msg.set_sharding_key, what the send
paths call), and the encoded properties are those of the dict the message then shows, byte for
byte."""
import pytest

from rmq import Message, Producer
from rmq._core.client_msg import encode_properties, set_sharding_key
from rmq.client.producer_request import ProducerOptions, message_preparer
from rmq.errors import MQClientError

PREPARER = message_preparer(ProducerOptions())


@pytest.mark.parametrize("key", ["k-1", 42, b"raw", "ключ"])
def test_the_encoded_properties_are_those_the_message_shows(key):
    m = Message("LazyShard", b"x")
    set_sharding_key(m, key)
    prep = PREPARER.prepare(m)
    assert m.properties == {"__SHARDINGKEY": str(key), "UNIQ_KEY": prep.uniq_id}
    assert prep.props == encode_properties(m.properties)
    again = PREPARER.prepare(m)                      # now through its dict: the same bytes, the same id
    assert again.props == prep.props and again.uniq_id == prep.uniq_id


def test_the_size_counts_the_key():
    plain, keyed = Message("LazyShard", b"x"), Message("LazyShard", b"x")
    set_sharding_key(keyed, "abc")
    a, b = PREPARER.prepare(plain), PREPARER.prepare(keyed)
    assert b.size - a.size == len(b.props) - len(a.props) == len("__SHARDINGKEY\x01abc\x02")


def test_a_key_with_a_separator_is_refused_clearly():
    m = Message("LazyShard", b"x")
    set_sharding_key(m, "a\x01b")
    with pytest.raises(MQClientError, match="separator") as e:
        PREPARER.prepare(m)
    assert e.value.response_code == 13


def test_through_the_producer_a_bad_key_queues_nothing():
    with Producer("127.0.0.1:9", group="lazy-shard-bad") as p:
        with pytest.raises(MQClientError, match="separator"):
            p.send_async(Message("LazyShard", b"x"), sharding_key="a\x02b")
        assert p.pending == 0


def test_a_message_sent_with_a_key_then_in_a_batch_keeps_its_key():
    """send_batch's scan reads a lazy message's UNIQ_KEY without a dict; one that holds a sharding
    key from an ordered send is read through its dict, so the key is not lost."""
    m = Message("LazyShard", b"x")
    set_sharding_key(m, "kb")
    uniq = PREPARER.prepare(m).uniq_id
    preps = PREPARER.prepare_batch([m, Message("LazyShard", b"y")])
    assert preps[0].props == encode_properties({"__SHARDINGKEY": "kb", "UNIQ_KEY": uniq})
    assert preps[0].uniq_id == uniq
    m2 = Message("LazyShard", b"z")
    set_sharding_key(m2, "kc")
    batch = PREPARER.encode_user_batch([m2])
    assert b"__SHARDINGKEY\x01kc\x02" in bytes(batch.body)


def test_a_message_with_properties_gets_the_key_in_its_dict_and_setting_properties_drops_a_held_one():
    m = Message("LazyShard", b"x", properties={"a": "1"})
    set_sharding_key(m, 7)
    assert m.properties == {"a": "1", "__SHARDINGKEY": "7"}
    lazy = Message("LazyShard", b"x")
    set_sharding_key(lazy, "k")
    lazy.properties = {"b": "2"}
    assert lazy.properties == {"b": "2"}
    assert b"__SHARDINGKEY" not in PREPARER.prepare(lazy).props
