"""MessagePreparer.encode_user_batch (``Producer.send_batch``'s direct path): a user batch's
SEND_BATCH_MESSAGE body and comma-joined UNIQ_KEYs written in one pass, with prepare_batch's
checks (one scan serves both); the body byte for byte what batch_body makes of prepare_batch's
PreparedMessages, and a refused batch left as it was given."""
import pytest
from hypothesis import given, settings, strategies as st

from rmq import Message
from rmq._core.client_msg import UserBatch, batch_body, join_uniq_ids
from rmq._core.commitlog import validate_batch
from rmq._core.layout import PROPERTIES_MAX_LENGTH
from rmq.client.message import SendStatus
from rmq.client.producer_request import (ProducerOptions, encode_user_batch, prepare_batch, send_request,
                                         user_batch_result)
from rmq.common.request_header import send_response_msg_id_parts
from rmq.errors import MQClientError
from rmq.protocol import Frame, RequestCode, ResponseCode

OPTS = ProducerOptions()
ILLEGAL = int(ResponseCode.MESSAGE_ILLEGAL)
values = st.text(st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), max_size=8)


messages = st.lists(st.tuples(st.binary(min_size=1, max_size=300), st.integers(-2**31, 2**31 - 1),
                              st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "TAGS", "KEYS", "WAIT"]),
                                                                   values, max_size=3))),
                    min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_body_and_ids_are_prepare_batchs(spec):
    msgs = []
    for body, flag, props in spec:
        m = Message("T", body, flag=flag)
        if props is not None:
            m.properties = dict(props)
        msgs.append(m)
    ub = encode_user_batch(msgs, OPTS)
    assert type(ub) is UserBatch and len(ub) == len(msgs) and ub.topic == "T" and ub.msgs == msgs
    ids = ub.uniq_ids.split(",")
    assert ids == [m.properties["UNIQ_KEY"] for m in msgs] and ub.first_uniq_id == ids[0]
    assert len(set(ids)) == len(ids)
    # the ids are set on the messages now: prepare_batch keeps them, so the bodies must be equal
    preps = prepare_batch(msgs, OPTS)
    assert batch_body(preps) == ub.body and join_uniq_ids(preps) == ub.uniq_ids
    assert ub.wait == all(p.wait for p in preps)
    assert validate_batch(ub.body, b"", 1, 0, 1 << 22, False)[0] == len(msgs)     # what the store reads


def test_a_plain_message_gets_its_id_without_a_dict_and_keeps_a_given_one():
    plain, given = Message("T", b"a"), Message("T", b"b", properties={"UNIQ_KEY": "0A" * 16, "WAIT": "false"})
    ub = encode_user_batch([plain, given], OPTS)
    first, second = ub.uniq_ids.split(",")
    assert second == "0A" * 16 and not ub.wait
    assert plain.properties == {"UNIQ_KEY": first}
    again = encode_user_batch([plain, given], OPTS)            # sent again: the same ids and body
    assert again.uniq_ids == ub.uniq_ids and again.body == ub.body


def test_a_non_ascii_uniq_key_is_joined_as_given():
    odd = Message("T", b"a", properties={"UNIQ_KEY": "\u00e9t\u00e9"})
    ub = encode_user_batch([Message("T", b"x"), odd], OPTS)
    assert ub.uniq_ids.split(",")[1] == "\u00e9t\u00e9"
    assert ub.body == batch_body(prepare_batch(ub.msgs, OPTS))


@pytest.mark.parametrize("bad, match", [
    (Message("T", b"x", delay_time_level=2), "TimeDelayLevel is not supported for batching"),
    (Message("T", b"x", delay_time_ms=10), "timer messages"),
    (Message("Other", b"x"), "should be the same"),
    (Message("T", b"x", properties={"k": "\x01"}), "separator"),
    (Message("T", b"x", properties={"k": "v" * PROPERTIES_MAX_LENGTH}),
     f"message 2 of 3: properties are {PROPERTIES_MAX_LENGTH + 45} bytes, over the {PROPERTIES_MAX_LENGTH}-byte"),
    ("nope", "expected an rmq.Message"),
])
def test_a_refused_batch_is_left_as_given(bad, match):
    good = [Message("T", b"a"), Message("T", b"b", tags="t")]
    with pytest.raises(MQClientError, match=match) as e:
        encode_user_batch(good + [bad], OPTS)
    assert e.value.response_code == ILLEGAL
    assert all("UNIQ_KEY" not in m.properties for m in good + ([bad] if isinstance(bad, Message) else []))


def test_a_uniq_key_that_is_not_a_str_is_refused():
    m = Message("T", b"a", properties={"x": "y"})
    m.properties["UNIQ_KEY"] = 5
    for encode in (encode_user_batch, prepare_batch):
        with pytest.raises(MQClientError, match="UNIQ_KEY property must be a str, got int"):
            encode([Message("T", b"ok"), m], OPTS)


def test_limits():
    with pytest.raises(MQClientError, match="at least one message"):
        encode_user_batch([], OPTS)
    with pytest.raises(MQClientError, match="Retry Group is not supported"):
        encode_user_batch([Message("%RETRY%g", b"x")], OPTS)
    opts = ProducerOptions(max_message_size=1000)
    msgs = [Message("T", b"x" * 100) for _ in range(6)]
    assert len(encode_user_batch(msgs, opts).body) == 6 * (100 + 22 + 42) <= 1000
    more = msgs + [Message("T", b"x" * 100)]
    with pytest.raises(MQClientError, match="the batch size over max value, MAX: 1000"):
        encode_user_batch(more, opts)
    assert "UNIQ_KEY" not in more[-1].properties


def test_an_iterable_and_a_bytearray_body():
    m = Message("T", b"a")
    m.body = bytearray(b"changed")
    ub = encode_user_batch(iter([m, Message("T", b"z")]), OPTS)
    assert len(ub) == 2 and ub.body == batch_body(prepare_batch(ub.msgs, OPTS))


def test_the_request_and_the_result():
    msgs = [Message("T", b"m%d" % i) for i in range(3)]
    ub = encode_user_batch(msgs, OPTS)
    req = send_request(ub, 2, "g", True)
    assert req.code == RequestCode.SEND_BATCH_MESSAGE and req.bodies == [ub.body]
    assert req.fields["topic"] == "T" and req.fields["queueId"] == 2 and req.fields["waitStoreMsgOK"] is True
    other = send_request(prepare_batch(msgs, OPTS), 2, "g", True).fields
    born, other_born = req.fields.pop("bornTimestamp"), other.pop("bornTimestamp")
    assert req.fields == other and 0 <= other_born - born < 60_000    # ms clock reads, made one after the other
    for ids, want in ((["A", "B", "C"], "A,B,C"), (["A", "B"], ",,"), (["A"] * 4, ",,")):
        fields, bodies = send_response_msg_id_parts(",".join(ids))
        resp = Frame(ResponseCode.SUCCESS, fields=dict(fields, queueId=2, queueOffset=7), bodies=bodies)
        got = user_batch_result(resp, "T", "broker-a", "127.0.0.1:1", ub)
        assert got.status is SendStatus.SEND_OK and got.queue_offset == 7 and got.queue_id == 2
        assert got.msg_id == ub.uniq_ids and got.offset_msg_id == want
        assert got == user_batch_result(resp, "T", "broker-a", "127.0.0.1:1", prepare_batch(msgs, OPTS))
    one = encode_user_batch([Message("T", b"x")], OPTS)
    fields, bodies = send_response_msg_id_parts("A,B")
    resp = Frame(ResponseCode.SUCCESS, fields=dict(fields, queueId=0, queueOffset=1), bodies=bodies)
    assert user_batch_result(resp, "T", "b", "a", one).offset_msg_id == "A"


def test_ids_of_a_batch_larger_than_the_id_counter_are_unique():
    """An id is a time field (ms) and a 16-bit counter: a batch of more than 65,536 messages
    (possible with max_message_size up to the wire's limit) reads the clock again every
    UNIQ_IDS_PER_CLOCK_READ new ids, so no two of its ids are equal."""
    from rmq._core.client_msg import UNIQ_IDS_PER_CLOCK_READ
    assert 0 < UNIQ_IDS_PER_CLOCK_READ <= 65536 // 8
    opts = ProducerOptions(max_message_size=15 * 1024 * 1024)
    msgs = [Message("T", b"x") for _ in range(70_000)]
    ids = encode_user_batch(msgs, opts).uniq_ids.split(",")
    assert len(ids) == 70_000 and len(set(ids)) == 70_000
    more = [Message("T", b"y") for _ in range(70_000)]
    assert len({p.uniq_id for p in prepare_batch(more, opts)}) == 70_000
