"""rmq.Message (a C type, rmq._core.client_msg): its API, its validation, and the cyclic GC's view."""
import gc

import pytest

from rmq import Message
from rmq.client.message import (MAX_DELAY_LEVEL, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_TAGS,
                                PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS, PROPERTY_WAIT_STORE_MSG_OK,
                                RESERVED_PROPERTIES)
from rmq.errors import MQClientError


def test_fields_and_properties_as_rocketmq_names_them():
    m = Message("T", bytearray(b"body"), tags="TagA", keys=["k1", "k2"], properties={"n": 5}, flag=7,
                wait_store_msg_ok=False)
    assert m.topic == "T" and m.body == b"body" and type(m.body) is bytes and m.flag == 7
    assert m.properties == {"n": "5", PROPERTY_TAGS: "TagA", PROPERTY_KEYS: "k1 k2", PROPERTY_WAIT_STORE_MSG_OK: "false"}
    assert m.tags == "TagA" and m.keys == ["k1", "k2"] and m.delay_time_level == 0
    m.tags, m.keys = None, "one"
    assert m.tags is None and m.keys == ["one"] and PROPERTY_TAGS not in m.properties
    m.delay_time_level = 3
    assert m.properties[PROPERTY_DELAY_TIME_LEVEL] == "3" and m.delay_time_level == 3
    m.delay_time_level = 0
    assert PROPERTY_DELAY_TIME_LEVEL not in m.properties
    m.put_user_property("region", 1)
    assert m.properties["region"] == "1"
    assert repr(m) == f"Message(topic='T', body=4 bytes, properties={m.properties})"
    m.topic, m.body, m.flag = "U", b"x", 0                  # plain attributes stay assignable
    assert (m.topic, m.body, m.flag) == ("U", b"x", 0)
    with pytest.raises(AttributeError):
        m.other = 1                                          # no attribute beyond the four (as __slots__ was)


def test_timers_and_delay_levels_exclude_each_other():
    m = Message("T", b"x", deliver_time_ms=1_000)
    assert m.deliver_time_ms == 1_000 and m.properties[PROPERTY_TIMER_DELIVER_MS] == "1000"
    with pytest.raises(MQClientError, match="one timer"):
        m.delay_time_ms = 5
    with pytest.raises(MQClientError, match="exclusive"):
        m.delay_time_level = 2
    m.deliver_time_ms = None
    m.delay_time_ms = 5
    assert m.delay_time_ms == 5 and m.properties[PROPERTY_TIMER_DELAY_MS] == "5"
    with pytest.raises(MQClientError, match="exclusive"):
        Message("T", b"x", delay_time_level=1, deliver_time_ms=5)


@pytest.mark.parametrize("bad", [-1, MAX_DELAY_LEVEL + 1, "2", 1.0, True])
def test_a_bad_delay_level_is_refused(bad):
    with pytest.raises(MQClientError, match="delay_time_level must be"):
        Message("T", b"x", delay_time_level=bad)


@pytest.mark.parametrize("kw", [{"deliver_time_ms": -1}, {"delay_time_ms": "5"}, {"delay_time_ms": False}])
def test_a_bad_timer_is_refused(kw):
    with pytest.raises(MQClientError, match="must be an int >= 0"):
        Message("T", b"x", **kw)


def test_a_body_that_is_not_bytes_and_a_reserved_property_are_refused():
    with pytest.raises(MQClientError, match="body must be bytes, got str"):
        Message("T", "text")
    m = Message("T", b"x")
    for name in RESERVED_PROPERTIES:
        with pytest.raises(MQClientError, match="used by the system"):
            m.put_user_property(name, "v")
    assert m.properties == {}


def test_the_cyclic_gc_does_not_track_messages_and_subclasses_still_work():
    m = Message("T", b"x", tags="a", properties={"k": "v"})
    assert not gc.is_tracked(m)           # building many messages triggers no collection

    class Mine(Message):
        pass
    s = Mine("T", b"y", keys="k")
    assert isinstance(s, Message) and s.keys == ["k"]
