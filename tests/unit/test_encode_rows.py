"""send_async_columns' row encoder (rmq._core.client_msg.encode_rows, via
rmq.client.producer_request.encode_columns) and its results (ColumnSendResults), without I/O.

The reference for every row is the Message path: ``Message(topic, body, tags=, keys=,
properties=)`` through prepare_many + many_parts + batch_body (what send_async_many sends).
"""
import re
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq import Message, SendStatus
from rmq._core.client_msg import COLUMNS_REFUSED_PROPERTIES, UNIQ_ID_LENGTH, RowsPart, split_uniq_ids
from rmq._core.layout import BATCH_FIXED_LENGTH, PROPERTIES_MAX_LENGTH
from rmq.client.futures import ColumnOutcomes
from rmq.client.message import ColumnSendResults, MessageQueue
from rmq.client.producer import (MANY_REQUEST_SIZE, ProducerOptions, batch_body_of, many_request_size,
                                 encode_columns, many_parts, message_preparer, prepare_many)
from rmq.errors import MQClientError, SendManyError

PREP = message_preparer(ProducerOptions())
MAX = ProducerOptions().max_message_size
UNIQ = re.compile(rb"UNIQ_KEY\x01([0-9A-F]{32})\x02")


def columns(topic="T", bodies=[], tags=None, keys=None, properties=None, sharding_key=None, sharding_keys=None,
            batch_size=16384):
    return encode_columns(PREP, topic, bodies, tags, keys, properties, sharding_key, sharding_keys, batch_size)


def reference(topic, bodies, tags, keys, properties, sharding_keys, batch_size):
    """The Message path's parts: [(positions, batch body, key)]."""
    n = len(bodies)
    msgs = [Message(topic, bodies[i], tags=tags[i] if tags else None, keys=keys[i] if keys else None,
                    properties=properties[i] if properties else None) for i in range(n)]
    preps = prepare_many(PREP, msgs, sharding_keys)
    return [(list(pos), batch_body_of(part), key) for pos, part, key, _ in many_parts(preps, sharding_keys, batch_size)]


def without_uniq(body: bytes) -> bytes:
    return UNIQ.sub(b"UNIQ_KEY\x01-\x02", body)


# -- the bytes: as the Message path, but the UNIQ_KEY ----------------------------------------------------
ROWS = st.lists(st.tuples(st.binary(min_size=1, max_size=300),
                          st.one_of(st.none(), st.just(""), st.text("abcXYZ_-", min_size=1, max_size=8)),    # tag
                          st.one_of(st.none(), st.text("k1é", min_size=1, max_size=6),                       # keys
                                    st.lists(st.text("k2ü", min_size=1, max_size=5), min_size=1, max_size=3)),
                          st.one_of(st.none(), st.dictionaries(st.text("pqr", min_size=1, max_size=4),
                                                               st.text("vw€ ", max_size=6), max_size=3)),
                          st.one_of(st.none(), st.sampled_from(["a", "b", 7, b"c"]))),                       # sharding key
                min_size=1, max_size=50)


@settings(max_examples=150, deadline=None)
@given(rows=ROWS, batch_size=st.sampled_from([0, 200, 1000, 16384]), ordered=st.booleans())
def test_rows_are_the_bytes_and_parts_of_the_message_path(rows, batch_size, ordered):
    bodies, tags, keys, props, skeys = (list(c) for c in zip(*rows))
    skeys = skeys if ordered else None
    n, parts = columns("T", bodies, tags, keys, props, sharding_keys=skeys, batch_size=batch_size)
    want = reference("T", bodies, tags, keys, props, skeys, batch_size)
    assert n == len(rows) and all(type(p) is RowsPart for p in parts)
    assert [(list(p.positions), p.key) for p in parts] == [(pos, key) for pos, _, key in want]
    for part, (_, body, _) in zip(parts, want):
        assert without_uniq(part.body) == without_uniq(body)
        assert part.nbytes == len(part.body) and len(part) == part.n == len(part.positions)
        assert [u.encode() for u in part.uniq_ids()] == UNIQ.findall(part.body)     # the ids the results report
    ids = [u for p in parts for u in p.uniq_ids()]
    assert len(set(ids)) == len(ids)


def test_contiguous_rows_are_a_range_and_a_row_over_batch_size_is_a_part_of_its_own():
    n, parts = columns("T", [b"x" * 10, b"y" * 5000, b"z" * 10], batch_size=1000)
    assert n == 3 and [p.positions for p in parts] == [range(0, 1), range(1, 2), range(2, 3)]
    assert parts[1].nbytes > 1000
    _, parts = columns("T", [b"a"] * 4, sharding_keys=["k", "j", "k", "k"])
    assert [(p.key, p.positions) for p in parts] == [("k", [0, 2, 3]), ("j", range(1, 2))]
    assert columns("T", []) == (0, [])


def test_bytearray_and_memoryview_bodies_are_sent_as_their_bytes():
    _, [part] = columns("T", [bytearray(b"ba-body"), memoryview(b"mv-body"), b"by-body"])
    _, [ref] = columns("T", [b"ba-body", b"mv-body", b"by-body"])
    assert without_uniq(part.body) == without_uniq(ref.body)


def test_non_str_property_values_and_sharding_keys_are_sent_as_their_str():
    _, [part] = columns("T", [b"a"], properties=[{"n": 5, 7: "x"}], sharding_keys=[42])
    assert b"n\x015\x02" in part.body and b"7\x01x\x02" in part.body and b"__SHARDINGKEY\x0142\x02" in part.body
    assert part.key == 42          # the queue is picked by the key itself (java_hash(42)), as send_async_many's


def test_columns_changed_by_python_code_run_during_the_call_do_not_change_what_is_written():
    """The encoder reads the rows' buffers twice (sizes, then bytes); a sharding key's ``__str__``
    runs Python code in between.  Here it empties every column and collects garbage: the rows are
    written as they were when the call read them (it holds its own references), and the ids stay
    unique."""
    import gc
    bodies, tags, keys, props = [b"b%d" % i * 50 for i in range(6)], ["t%d" % i for i in range(6)], \
        [["k", "x%d" % i] for i in range(6)], [{"p": "v%d" % i} for i in range(6)]
    want = reference("T", list(bodies), list(tags), [list(k) for k in keys], [dict(x) for x in props],
                     [str(i % 2) for i in range(6)], 16384)

    class Shard:
        def __init__(self, i):
            self.i = i

        def __str__(self):
            if self.i == 3:
                for col in (bodies, tags, props):
                    col.clear()
                for k in keys[:4]:
                    k.append("late")             # the keys lists of the rows sized so far grow
                keys.clear()
                gc.collect()
            return str(self.i % 2)

        def __hash__(self):
            return hash(self.i % 2)

        def __eq__(self, other):
            return isinstance(other, Shard) and other.i % 2 == self.i % 2
    n, parts = columns("T", bodies, tags, keys, props, sharding_keys=[Shard(i) for i in range(6)])
    assert n == 6 and [list(p.positions) for p in parts] == [pos for pos, _, _ in want]
    assert [without_uniq(p.body) for p in parts] == [without_uniq(body) for _, body, _ in want]
    ids = [u for p in parts for u in p.uniq_ids()]
    assert len(set(ids)) == 6


def test_the_c_entries_refuse_columns_of_other_lengths_than_the_rows():
    """encode_rows / prepare_many called directly (encode_columns and many_keys check lengths
    first, with MQClientError): a column or key list of another length is a ValueError, nothing
    read past its end."""
    from rmq._core.client_msg import encode_rows
    from rmq.client.producer_request import PROPERTY_SHARDING_KEY, _part_key
    with pytest.raises(ValueError, match="a column has 1 items for 2 bodies"):
        encode_rows(PREP, "T", [b"a", b"b"], ["t"], None, None, None, PROPERTY_SHARDING_KEY, 1024, _part_key)
    with pytest.raises(ValueError, match="1 keys for 2 messages"):
        PREP.prepare_many([Message("T", b"a"), Message("T", b"b")], ["k"], PROPERTY_SHARDING_KEY)


def test_a_large_body_is_sent_as_given_not_compressed():
    body = b"ab" * 5000                        # over compress_msg_body_over_howmuch (4 KiB)
    _, [part] = columns("T", [body])
    assert body in part.body


# -- bad input: a clear error naming the row, nothing encoded ------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"bodies": [b"a", "text"]}, "message 1 of 2: message body must be bytes, got str"),
    ({"bodies": [b"a", b""]}, "message 1 of 2: the message body length is zero"),
    ({"bodies": [b"a", b"x" * (MAX + 1)]}, "message 1 of 2: the message body size over max value"),
    ({"tags": ["t", 5]}, "message 1 of 2: a tag must be a str, got int"),
    ({"tags": ["t", "a\x01b"]}, "message 1 of 2: .*separator"),
    ({"keys": ["k", ["a", 3]]}, "message 1 of 2: a key must be a str, got int"),
    ({"keys": ["k", 3]}, "message 1 of 2: keys must be a str or a list of str, got int"),
    ({"keys": ["k", "a\x02"]}, "message 1 of 2: .*separator"),
    ({"properties": [None, ["a"]]}, "message 1 of 2: message properties must be a dict, got list"),
    ({"properties": [None, {"a": "x\x01"}]}, "message 1 of 2: .*separator"),
    ({"properties": [None, {"DELAY": "3"}]}, "message 1 of 2: property 'DELAY' is set by the producer"),
    ({"properties": [None, {"__SHARDINGKEY": "k"}]}, "message 1 of 2: property '__SHARDINGKEY'"),
    ({"tags": ["t"]}, "tags has 1 items for 2 messages"),
    ({"keys": "k"}, "keys must be a sequence with one item per message, got str"),
    ({"bodies": b"ab"}, "bodies must be a sequence with one item per message, got bytes"),
    ({"properties": 5}, "properties must be a sequence with one item per message, got int"),
    ({"sharding_keys": ["a"]}, "sharding_keys has 1 keys for 2 messages"),
    ({"sharding_key": "a", "sharding_keys": ["a", "b"]}, "either sharding_key or sharding_keys"),
    ({"topic": "bad topic!"}, "topic"),
    ({"topic": 5}, "topic must be a str, got int"),
])
def test_bad_input_is_refused_with_the_row_named(kw, match):
    args = {"topic": "T", "bodies": [b"a", b"b"]}
    args.update(kw)
    with pytest.raises(MQClientError, match=match) as e:
        columns(**args)
    if match.startswith("message "):          # a bad row: MESSAGE_ILLEGAL, as the Message path's
        assert e.value.response_code == 13


def test_every_refused_property_name_is_refused():
    for name in sorted(COLUMNS_REFUSED_PROPERTIES):
        with pytest.raises(MQClientError, match=f"property '{name}' is set by the producer"):
            columns("T", [b"a"], properties=[{name: "1"}])


def test_properties_up_to_the_limit_pass_and_one_byte_more_is_refused():
    # a row's properties: user ones, then UNIQ_KEY \x01 <32> \x02 (42 bytes); "p" \x01 value \x02 is 3 + len
    fill = PROPERTIES_MAX_LENGTH - 42 - 3
    n, [part] = columns("T", [b"a"], properties=[{"p": "v" * fill}])
    assert part.nbytes == BATCH_FIXED_LENGTH + 1 + PROPERTIES_MAX_LENGTH
    with pytest.raises(MQClientError, match=f"message 0 of 1: properties are {PROPERTIES_MAX_LENGTH + 1} bytes"):
        columns("T", [b"a"], properties=[{"p": "v" * (fill + 1)}])


# -- the results of a call, one record per request -----------------------------------------------------------
MQ = MessageQueue("T", "broker-a", 3)
MQ2 = MessageQueue("T", "broker-a", 5)


def uniq(n, first=0):
    return b"".join(b"%032X" % (first + i) for i in range(n))


def test_column_results_hold_one_record_per_request_and_give_rows_and_columns():
    out = ColumnOutcomes(6)
    assert not out.fill(range(0, 3), uniq(3), (SendStatus.SEND_OK, MQ, 100, ["o0", "o1", "o2"]), None)
    assert out.fill([3, 5, 4], uniq(3, 3), (SendStatus.SEND_OK, MQ2, 7, ["o3", "o5", "o4"]), None)
    results, err = out.outcome()
    assert err is None and isinstance(results, ColumnSendResults) and len(results) == 6 and results.failed == 0
    assert results.queue_offsets == array("q", [100, 101, 102, 7, 9, 8])
    assert results.queue_ids == array("i", [3, 3, 3, 5, 5, 5])
    assert results.message_queues == [MQ] * 3 + [MQ2] * 3
    assert results.msg_ids == ["%032X" % i for i in (0, 1, 2, 3, 5, 4)]
    assert results.last_offsets() == {MQ: 102, MQ2: 9}
    r = results[4]
    assert (r.status, r.msg_id, r.message_queue, r.queue_offset, r.offset_msg_id) == \
        (SendStatus.SEND_OK, "%032X" % 5, MQ2, 9, "o4")
    assert [x.queue_offset for x in results] == [100, 101, 102, 7, 9, 8] and results.exceptions == {}


def test_a_failed_request_fails_its_rows_only_and_the_call_raises_send_many_error():
    out = ColumnOutcomes(4)
    boom = MQClientError("refused")
    out.fill(range(0, 2), uniq(2), (SendStatus.SEND_OK, MQ, 0, ["a", "b"]), None)
    assert out.fill([3, 2], uniq(2, 2), None, boom)
    results, err = out.outcome()
    assert results is None and isinstance(err, SendManyError) and err.failed == 2 and err.__cause__ is boom
    res = err.results
    assert res.failed == 2 and res.exceptions == {3: boom, 2: boom} and res[2] is boom and res[0].queue_offset == 0
    assert res.queue_offsets == array("q", [0, 1, -1, -1]) and res.queue_ids == array("i", [3, 3, -1, -1])
    assert res.message_queues == [MQ, MQ, None, None] and res.last_offsets() == {MQ: 1}
    assert res.msg_ids[2] == "%032X" % 3 and res.msg_ids[3] == "%032X" % 2     # ids of failed rows too


def test_an_empty_call_is_an_empty_result():
    results, err = ColumnOutcomes(0).outcome()
    assert err is None and len(results) == 0 and list(results) == [] and results.last_offsets() == {}


def test_a_bulk_request_is_many_request_size_unless_batch_size_is_given_within_max_message_size():
    assert MANY_REQUEST_SIZE == 256 * 1024
    for columns_ in (True, False):
        assert many_request_size(ProducerOptions(), columns_) == MANY_REQUEST_SIZE       # batch_size defaulted
        assert many_request_size(ProducerOptions(linger_ms=5), columns_) == MANY_REQUEST_SIZE
        assert many_request_size(ProducerOptions(max_message_size=64 << 10), columns_) == 64 << 10
        assert many_request_size(ProducerOptions(batch_size=1 << 20), columns_) == 1 << 20   # given: kept
        assert many_request_size(ProducerOptions(batch_size=2048), columns_) == 2048
    # batching off: send_async_many sends one message per request; columns always go as batches
    assert many_request_size(ProducerOptions(batch_size=0)) == 0
    assert many_request_size(ProducerOptions(batch_size=0), columns=True) == MANY_REQUEST_SIZE
    # within the limit a broker answered a refused batch with (the producer's learned limit)
    assert many_request_size(ProducerOptions(), True, 65536) == 65536
    assert many_request_size(ProducerOptions(batch_size=2048), False, 65536) == 2048
    assert many_request_size(ProducerOptions(batch_size=0), False, 65536) == 0     # still one per request
    _, parts = columns("T", [b"x" * 1000] * 600, batch_size=many_request_size(ProducerOptions(), columns=True))
    per = MANY_REQUEST_SIZE // (BATCH_FIXED_LENGTH + 1000 + 42)     # a row: header, body, UNIQ_KEY property
    assert [p.n for p in parts] == [per, per, 600 - 2 * per] and all(p.nbytes <= MANY_REQUEST_SIZE for p in parts)


def test_split_uniq_ids_cuts_whole_ids_and_refuses_a_partial_one():
    assert split_uniq_ids(uniq(3)) == ["%032X" % i for i in range(3)] and split_uniq_ids(b"") == []
    with pytest.raises(ValueError, match=f"not a whole number of {UNIQ_ID_LENGTH}-digit"):
        split_uniq_ids(uniq(2) + b"ABC")
