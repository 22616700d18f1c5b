"""rmq._core.client_msg: the producer's per-message work in C, against independent references.

The references here are written from RocketMQ's rules (SPEC.md §1.6 properties, §1.8 unique
ids, §1.11 batch encoding), not from the C code: properties as ``name\\x01value\\x02``,
the batch element layout with struct, and the store's own batch decoder
(``rmq._core.commitlog.validate_batch``) accepting what the client encodes.
"""
from __future__ import annotations

import gc
import os
import struct
import time
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from rmq import Message
from rmq._core import client_msg as cm
from rmq._core.commitlog import encode_batch, validate_batch
from rmq.client.producer import ProducerOptions, message_preparer, prepare_batch, prepare_message
from rmq.errors import MQClientError
from rmq.protocol import ResponseCode

ILLEGAL = int(ResponseCode.MESSAGE_ILLEGAL)
names = st.text(st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), min_size=1,
                max_size=12)


def ref_props(props: dict) -> bytes:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items() if v is not None).encode()


def ref_batch(elems) -> bytes:
    out = b""
    for body, props, flag in elems:
        n = 22 + len(body) + len(props)
        out += struct.pack(">iiiii", n, 0, 0, flag, len(body)) + body + struct.pack(">h", len(props)) + props
    return out


def test_uniq_id_layout_ip_pid_time_counter():
    before = time.time()
    a, b = cm.create_uniq_id(), cm.create_uniq_id()
    assert len(a) == cm.UNIQ_ID_LENGTH == 32 and a == a.upper() and int(a, 16) >= 0
    assert a[:20] == b[:20]                                    # IP + pid + per-process random
    assert int(a[8:12], 16) == os.getpid() & 0xFFFF
    assert (int(b[28:], 16) - int(a[28:], 16)) % 0x10000 == 1  # the counter
    lt = time.gmtime(before)
    month = time.mktime((lt.tm_year, lt.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone
    ms = int(a[20:28], 16)
    assert abs(ms - (before - month) * 1000) < 5_000           # ms since the month began (UTC)


def test_uniq_ids_unique_and_message_py_uses_them():
    from rmq.client.message import create_uniq_id
    ids = {create_uniq_id() for _ in range(50_000)}
    assert len(ids) == 50_000


def test_forked_child_ids_carry_its_pid():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                               # child: write one id, leave at once
        os.write(w, cm.create_uniq_id().encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode()
    os.close(r)
    assert int(child[8:12], 16) == pid & 0xFFFF
    assert int(cm.create_uniq_id()[8:12], 16) == os.getpid() & 0xFFFF


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(names, names, max_size=6))
def test_encode_properties_matches_the_reference(props):
    assert cm.encode_properties(props) == ref_props(props)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(names, names, min_size=cm.PROPERTIES_IN_PLACE_MAX - 2, max_size=cm.PROPERTIES_IN_PLACE_MAX + 8))
def test_encode_properties_beyond_the_in_place_path_matches_the_reference(props):
    # up to PROPERTIES_IN_PLACE_MAX str items are read in place, more take the general path: same bytes
    assert cm.encode_properties(props) == ref_props(props)


@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("props", [{"a\x01": "b"}, {"a": "b\x02"}, {"\x02": "x"}, {"k": "v\x01w"}])
def test_encode_properties_refuses_separators(props, many):
    if many:                               # the general path (more items than the in-place one takes)
        props = {**{f"p{i}": "v" for i in range(cm.PROPERTIES_IN_PLACE_MAX)}, **props}
    with pytest.raises(ValueError, match="separator"):
        cm.encode_properties(props)


def test_encode_properties_non_str_and_none():
    assert cm.encode_properties({"a": 5, "b": None, 7: "x"}) == b"a\x015\x027\x01x\x02"
    assert cm.encode_properties({}) == b""


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=300), st.dictionaries(names, names, max_size=4),
                          st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=20))
def test_batch_body_matches_reference_and_store_decoder(elems):
    preps = []
    for body, props, flag in elems:
        m = Message("T", body, properties=props, flag=flag)
        preps.append(prepare_message(m, ProducerOptions()))
    out = cm.batch_body(preps)
    ref = [(p.body, ref_props(p.msg.properties), p.msg.flag) for p in preps]
    assert out == ref_batch(ref) == encode_batch(ref)
    assert validate_batch(out, b"", 1, 0, 4 * 1024 * 1024, False) is not None


def test_batch_body_refuses_oversized_properties():
    m = Message("T", b"x", properties={"p": "v" * 40_000})
    p = prepare_message(m, ProducerOptions())
    with pytest.raises(ValueError, match="32767"):
        cm.batch_body([p])


# -- MessagePreparer ------------------------------------------------------------------------------
def ref_prepared(m: Message, opts: ProducerOptions):
    """RocketMQ sendKernelImpl's preparation, written out: (body, sysFlag, wait, batchable)."""
    body, flag = m.body, 0
    if len(body) >= opts.compress_msg_body_over_howmuch:
        body, flag = zlib.compress(body, opts.compress_level), 0x1 | 0x300
    props = m.properties
    batchable = flag == 0 and not {"DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"} & set(props)
    if props.get("TRAN_MSG") == "true":
        flag |= 0x4
        batchable = False
    return body, flag, props.get("WAIT", "true") != "false", batchable


@settings(max_examples=80, deadline=None)
@given(body=st.binary(min_size=1, max_size=6000), delay=st.integers(0, 3), wait=st.booleans(),
       props=st.dictionaries(names.filter(lambda s: s not in ("UNIQ_KEY", "WAIT", "DELAY")), names, max_size=3),
       timer=st.sampled_from([None, "deliver", "delay"]), tran=st.booleans(), tags=st.sampled_from([None, "a"]))
def test_prepare_matches_the_reference(body, delay, wait, props, timer, tran, tags):
    opts = ProducerOptions()
    kw = {}
    if timer == "deliver" and not delay:                      # a timer and a delay level are exclusive
        kw["deliver_time_ms"] = 1
    elif timer == "delay" and not delay:
        kw["delay_time_ms"] = 5
    if tran:
        props = dict(props, TRAN_MSG="true")
    m = Message("Topic_1", body, tags=tags, properties=props, delay_time_level=delay, wait_store_msg_ok=wait, **kw)
    p = prepare_message(m, opts)
    want_body, want_flag, want_wait, want_batchable = ref_prepared(m, opts)
    assert (p.body, p.sys_flag, p.wait, p.batchable) == (want_body, want_flag, want_wait, want_batchable)
    assert p.uniq_id == m.properties["UNIQ_KEY"] and len(p.uniq_id) == 32
    assert p.props == ref_props(m.properties)
    assert p.size == len(p.body) + len(p.props) + cm.BATCH_ELEMENT_OVERHEAD
    assert p.msg is m


def test_prepare_keeps_a_given_uniq_key():
    m = Message("T", b"x", properties={"UNIQ_KEY": "ABC"})
    assert prepare_message(m, ProducerOptions()).uniq_id == "ABC"


@pytest.mark.parametrize("bad", [b"not a message", None, {"topic": "T", "body": b"x"}])
def test_prepare_refuses_a_non_message(bad):
    with pytest.raises(MQClientError, match="expected an rmq.Message") as e:
        prepare_message(bad, ProducerOptions())
    assert e.value.response_code == ILLEGAL


@pytest.mark.parametrize("topic", ["", "a b", "a/b", "x" * 128, "tab\t"])
def test_prepare_refuses_bad_topics(topic):
    m = Message("T", b"x")
    m.topic = topic
    with pytest.raises(MQClientError) as e:
        prepare_message(m, ProducerOptions())
    assert e.value.response_code == ILLEGAL
    assert "UNIQ_KEY" not in m.properties                      # refused: left as given


def test_prepare_body_limits():
    opts = ProducerOptions(max_message_size=1000)
    prepare_message(Message("T", b"x" * 1000), opts)           # at the limit: accepted
    with pytest.raises(MQClientError, match="body size over max value, MAX: 1000") as e:
        prepare_message(Message("T", b"x" * 1001), opts)
    assert e.value.response_code == ILLEGAL
    m = Message("T", b"x")
    m.body = b""
    with pytest.raises(MQClientError, match="length is zero"):
        prepare_message(m, opts)


def test_prepare_refuses_separator_in_a_property_and_changes_nothing():
    m = Message("T", b"x", properties={"k": "a\x02b"})
    with pytest.raises(MQClientError, match="separator") as e:
        prepare_message(m, ProducerOptions())
    assert e.value.response_code == ILLEGAL
    assert m.properties == {"k": "a\x02b"}                     # no UNIQ_KEY left behind


def test_prepare_non_bytes_body_and_properties():
    m = Message("T", bytearray(b"abc"))
    assert prepare_message(m, ProducerOptions()).body == b"abc"
    m.body = memoryview(b"xyz")
    assert prepare_message(m, ProducerOptions()).body == b"xyz"
    m.properties = None
    with pytest.raises(MQClientError, match="properties must be a dict"):
        prepare_message(m, ProducerOptions())


def test_valid_topic_cache_is_bounded():
    mp = cm.MessagePreparer(Message, lambda t: None, MQClientError, ILLEGAL, 1000, 4096, 5)
    for i in range(cm.VALID_TOPICS_CACHE_MAX + 10):
        mp.check(Message(f"T{i}", b"x"))
        assert mp.cached_topics <= cm.VALID_TOPICS_CACHE_MAX
    assert mp.cached_topics == 10                              # cleared when full, then refilled


def test_preparers_are_shared_per_limits():
    a, b = ProducerOptions(), ProducerOptions()
    assert message_preparer(a) is message_preparer(b)
    assert message_preparer(ProducerOptions(max_message_size=10)) is not message_preparer(a)


def test_prepare_batch_uses_the_same_checks():
    with pytest.raises(MQClientError, match="expected an rmq.Message"):
        prepare_batch([Message("T", b"x"), "nope"], ProducerOptions())
    preps = prepare_batch([Message("T", b"x"), Message("T", b"y")], ProducerOptions())
    assert [p.body for p in preps] == [b"x", b"y"] and all(p.batchable for p in preps)


@pytest.mark.parametrize("bad, match", [
    (Message("T", b"x", delay_time_level=2), "TimeDelayLevel is not supported for batching"),
    (Message("T", b"x", delay_time_ms=10), "timer messages"),
    (Message("Other", b"x"), "should be the same"),
    (Message("T", b"x", properties={"k": "\x01"}), "separator"),
])
def test_prepare_batch_refuses_and_leaves_the_batch_as_given(bad, match):
    good = [Message("T", b"a"), Message("T", b"b")]
    with pytest.raises(MQClientError, match=match) as e:
        prepare_batch(good + [bad], ProducerOptions())
    assert e.value.response_code == ILLEGAL
    assert all("UNIQ_KEY" not in m.properties for m in good + [bad])


def test_prepare_batch_keeps_a_given_unique_id_and_wait_flag():
    """A message with properties keeps its UNIQ_KEY and WAIT=false; one without gets a new id
    and waits (WAIT_STORE_MSG_OK), as prepare() does for one message."""
    given = Message("T", b"a", properties={"UNIQ_KEY": "0A" * 16, "WAIT": "false"})
    plain, tagged = Message("T", b"b"), Message("T", b"c", tags="t", keys="k")
    p1, p2, p3 = prepare_batch([given, plain, tagged], ProducerOptions())
    assert (p1.uniq_id, p1.wait) == ("0A" * 16, False)
    assert p2.wait and p3.wait and len({p2.uniq_id, p3.uniq_id}) == 2
    assert plain.properties == {"UNIQ_KEY": p2.uniq_id} and tagged.properties["UNIQ_KEY"] == p3.uniq_id
    assert [prepare_batch([m], ProducerOptions())[0].props for m in (given, plain, tagged)] == \
        [p1.props, p2.props, p3.props]


def test_a_request_waits_for_the_store_only_if_every_message_does():
    from rmq.client.producer_request import send_request
    preps = prepare_batch([Message("T", b"a"), Message("T", b"b")], ProducerOptions())
    assert cm.all_wait([]) and cm.all_wait(preps)
    assert send_request(preps, 0, "g", True).fields["waitStoreMsgOK"] is True
    preps += prepare_batch([Message("T", b"c", properties={"WAIT": "false"})], ProducerOptions())
    assert not cm.all_wait(preps)
    assert send_request(preps, 0, "g", True).fields["waitStoreMsgOK"] is False


def test_prepare_batch_limits():
    with pytest.raises(MQClientError, match="at least one message"):
        prepare_batch([], ProducerOptions())
    retry = Message("%RETRY%g", b"x")
    with pytest.raises(MQClientError, match="Retry Group is not supported"):
        prepare_batch([retry], ProducerOptions())
    opts = ProducerOptions(max_message_size=1000)
    msgs = [Message("T", b"x" * 100) for _ in range(6)]
    total = sum(p.size for p in prepare_batch(msgs, opts))
    assert total == 6 * (100 + 22 + 42) <= 1000                # body + element header + UNIQ_KEY property
    with pytest.raises(MQClientError, match="the batch size over max value, MAX: 1000"):
        prepare_batch(msgs + [Message("T", b"x" * 100)], opts)


def test_complete_send_batch_gives_each_future_its_result_once():
    """A caller-side batch's answer: message i gets queue offset base + i, its own UNIQ_KEY and
    broker id, SendResult's default region; callbacks run once; a future already finished (a
    timeout that raced the answer) keeps its outcome; the results are not tracked by the cyclic
    GC, and the batch's list lets go of each future once it is done."""
    from concurrent.futures import InvalidStateError

    from rmq.client.futures import SendFuture
    from rmq.client.message import MessageQueue, SendResult, SendStatus
    mp = message_preparer(ProducerOptions())
    preps = [mp.prepare(Message("T", b"m%d" % i)) for i in range(3)]
    calls = []
    futs = [SendFuture(lambda f: calls.append(f.result().queue_offset)) for _ in preps]
    futs[1].set_exception(TimeoutError("late"))
    mq = MessageQueue("T", "broker-a", 2)
    held = list(futs)
    out = cm.complete_send_batch(futs, SendResult, SendStatus.SEND_OK, preps, mq, 40, ["o0", "o1", "o2"])
    assert futs == [None, None, None]   # let go of as each is done (a future nobody holds is freed at once)
    again = cm.complete_send_batch(futs, SendResult, SendStatus.SEND_OK, preps, mq, 40, ["o0", "o1", "o2"])
    assert [r.queue_offset for r in again] == [40, 41, 42]      # a let-go slot is skipped, not an error
    futs = held
    assert [(r.status, r.msg_id, r.message_queue, r.queue_offset, r.offset_msg_id, r.region_id) for r in out] == \
        [(SendStatus.SEND_OK, p.uniq_id, mq, 40 + i, f"o{i}", "DefaultRegion") for i, p in enumerate(preps)]
    assert out[0] == SendResult(SendStatus.SEND_OK, preps[0].uniq_id, mq, 40, "o0")
    assert futs[0].result() is out[0] and futs[2].result() is out[2]
    assert isinstance(futs[1].exception(), TimeoutError)
    assert calls == [40, 42]            # futs[1]'s callback ran at its failure (and raised on result())
    assert not any(gc.is_tracked(r) for r in out) and all(gc.is_tracked(f) for f in futs)
    with pytest.raises(InvalidStateError):
        cm.finish_future(futs[0], None, None)


# -- a message without properties has no dict until one is read ----------------------------------
def test_a_message_without_properties_gets_its_uniq_key_without_a_dict_and_shows_it_when_read():
    prepare = message_preparer(ProducerOptions()).prepare
    m = Message("T", b"x")
    p = prepare(m)
    assert p.props == cm.encode_properties({"UNIQ_KEY": p.uniq_id})        # the same bytes as the dict path
    assert p.size == len(b"x") + len(p.props) + cm.BATCH_ELEMENT_OVERHEAD and p.wait and p.batchable
    assert prepare(m).uniq_id == p.uniq_id                                  # kept, as a set UNIQ_KEY is
    props = m.properties
    assert props == {"UNIQ_KEY": p.uniq_id} and m.properties is props       # one dict, made on first read
    m.put_user_property("a", "1")
    q = prepare(m)                                                          # the dict path from now on
    assert q.uniq_id == p.uniq_id and m.properties == {"UNIQ_KEY": p.uniq_id, "a": "1"}
    assert Message("T", b"y").properties == {}


def test_a_plain_messages_large_body_is_compressed_and_its_properties_set_later_are_sent():
    prepare = message_preparer(ProducerOptions()).prepare
    m = Message("T", b"z" * 5000)
    p = prepare(m)
    assert not p.batchable and p.sys_flag & cm.COMPRESSED_FLAG and zlib.decompress(p.body) == b"z" * 5000
    fresh = Message("T", b"x")
    fresh.tags = "t"                                                        # set after construction
    assert b"TAGS\x01t\x02" in prepare(fresh).props
    replaced = Message("T", b"x")
    replaced.properties = {"k": "v"}
    assert prepare(replaced).props.startswith(b"k\x01v\x02")


def test_a_refused_batch_leaves_plain_messages_without_a_uniq_key():
    plain = [Message("T", b"a"), Message("T", b"b")]
    with pytest.raises(MQClientError, match="should be the same"):
        prepare_batch(plain + [Message("Other", b"c")], ProducerOptions())
    with pytest.raises(MQClientError, match="batch size over"):
        prepare_batch(plain + [Message("T", b"x" * 1000)] * 5000, ProducerOptions(max_message_size=4000))
    assert all(m.properties == {} for m in plain)
    preps = prepare_batch(plain, ProducerOptions())
    assert [m.properties for m in plain] == [{"UNIQ_KEY": p.uniq_id} for p in preps]
