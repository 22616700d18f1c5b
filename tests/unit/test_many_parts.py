"""send_async_many's split into hand-overs (rmq.client.producer_request.many_parts), without I/O."""
from rmq import Message
from rmq.client.producer import ProducerOptions, java_hash, many_parts, message_preparer

PREPARE = message_preparer(ProducerOptions()).prepare


def preps(bodies, topic="T"):
    return [PREPARE(Message(topic, b)) for b in bodies]


def test_unordered_messages_fill_parts_up_to_batch_size_in_order():
    ps = preps([b"x" * 100] * 10)
    size = ps[0].size
    parts = many_parts(ps, None, 3 * size)
    assert [list(pos) for pos, _, _, _ in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(key is None for _, _, key, _ in parts)
    assert [nbytes for *_, nbytes in parts] == [3 * size] * 3 + [size]
    assert [p for _, part, _, _ in parts for p in part] == ps


def test_batching_off_and_unbatchable_messages_go_alone():
    ps = preps([b"a", b"b" * 5000, b"c"])                  # 5000 B: compressed, not batchable
    assert not ps[1].batchable
    assert [list(pos) for pos, *_ in many_parts(ps, None, 0)] == [[0], [1], [2]]
    assert [list(pos) for pos, *_ in many_parts(ps, None, 16384)] == [[0, 2], [1]]


def test_topics_and_keys_get_parts_of_their_own_and_a_key_keeps_its_order():
    ps = preps([b"m%d" % i for i in range(6)]) + preps([b"u"], topic="U")
    keys = ["a", "b", "a", None, "b", "a", "a"]
    parts = many_parts(ps, keys, 16384)
    got = {(part[0].msg.topic, key): list(pos) for pos, part, key, _ in parts}
    assert got == {("T", "a"): [0, 2, 5], ("T", "b"): [1, 4], ("T", None): [3], ("U", "a"): [6]}


def test_interleaved_topics_without_keys_keep_each_topics_positions_in_order():
    # runs of one topic, then a topic's part taking a message after another topic's came between
    ps = preps([b"a", b"b"]) + preps([b"u"], topic="U") + preps([b"c"]) + preps([b"v", b"w"], topic="U")
    parts = many_parts(ps, None, 16384)
    assert [(part[0].msg.topic, pos) for pos, part, _, _ in parts] == [("T", [0, 1, 3]), ("U", [2, 4, 5])]
    assert all(type(pos) is list for pos, *_ in parts)


def test_a_key_after_an_unbatchable_message_of_that_key_opens_a_new_part():
    ps = preps([b"a", b"z" * 5000, b"c"])
    parts = many_parts(ps, ["k", "k", "k"], 16384)
    assert [list(pos) for pos, *_ in parts] == [[0], [1], [2]]     # 2 may not join 0's part and overtake 1


def test_keys_that_are_not_hashable_group_by_their_queue_hash():
    ps = preps([b"a", b"b", b"c"])
    keys = [["x"], ["x"], ["y"]]
    parts = many_parts(ps, keys, 16384)
    assert [list(pos) for pos, *_ in parts] == ([[0, 1], [2]] if java_hash(["x"]) != java_hash(["y"])
                                                 else [[0, 1, 2]])


# -- properties of the split, over random calls ----------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MESSAGES = st.lists(st.tuples(st.sampled_from(["T", "U"]),                       # topic
                              st.integers(1, 6000),                               # body size (>= 4096: compressed)
                              st.one_of(st.none(), st.sampled_from(["a", "b", 7, b"c"]))),   # sharding key
                    max_size=60)


@settings(max_examples=150, deadline=None)
@given(MESSAGES, st.sampled_from([0, 300, 2048, 16384]))
def test_the_split_keeps_every_message_once_in_its_keys_order_within_batch_size(spec, batch_size):
    ps = [PREPARE(Message(topic, b"x" * size)) for topic, size, _ in spec]
    keys = [key for *_, key in spec] if any(k is not None for *_, k in spec) else None
    parts = many_parts(ps, keys, batch_size)
    seen = [i for pos, *_ in parts for i in pos]
    assert sorted(seen) == list(range(len(ps)))                                   # each message once
    last: dict = {}
    for pos, part, key, nbytes in parts:
        assert [ps[i] for i in pos] == part and nbytes == sum(p.size for p in part)
        assert len({p.msg.topic for p in part}) == 1
        assert all((keys[i] if keys else None) == key for i in pos)               # one key per part
        if len(part) > 1:                                                         # a shared part: all batchable,
            assert batch_size > 0 and all(p.batchable for p in part) and nbytes <= batch_size
        group = (part[0].msg.topic, key)
        if key is not None:                                                       # a key's messages in order
            assert pos == sorted(pos) and pos[0] > last.get(group, -1)
            last[group] = pos[-1]
