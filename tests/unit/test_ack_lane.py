"""AckLane (the merge rule of rmq.aio's ack_batch), driven without I/O: what one request takes,
in which order, and whose failed views are whose."""
from types import SimpleNamespace

import msgpack
import pytest

from rmq.client.simple_consumer import (MAX_BATCH_ACK, AckLane, MessageView, batch_ack_failures, batch_ack_frame,
                                        group_by_broker)
from rmq.protocol import Frame, ResponseCode


def views(n, start=0, so=0, qid=0, topic="T"):
    """n views of one checkpoint (start offset ``so``) of queue ``qid``."""
    ck = (so, 1_000, 30_000, 3, "0")
    return [MessageView(SimpleNamespace(queue_id=qid, queue_offset=so + start + i), topic, ck, "broker-a")
            for i in range(n)]


def set_bits(bitset: bytes) -> list:
    """The set bits of RocketMQ's BitSet.toByteArray() form, ascending."""
    m = int.from_bytes(bitset, "little")
    return [d for d in range(m.bit_length()) if m >> d & 1]


def bits(entries):
    """The BatchAck bit lists of the request these entries make."""
    frame, _ = batch_ack_frame("cg", "broker-a", [v for vs, _ in entries for v in vs])
    return [set_bits(a["b"]) for a in msgpack.unpackb(frame.bodies[0])["acks"]]


def test_everything_waiting_goes_as_one_request_in_order():
    lane = AckLane("broker-a")
    a, b, c = views(3, so=0), views(2, so=10), views(4, so=20, qid=1)
    for vs, w in ((a, "A"), (b, "B"), (c, "C")):
        lane.add(vs, w)
    entries = lane.take()
    assert [w for _, w in entries] == ["A", "B", "C"]
    assert bits(entries) == [[0, 1, 2], [0, 1], [0, 1, 2, 3]]
    assert lane.take() is None and not lane.waiting


def test_a_request_holds_at_most_max_batch_ack_views():
    lane = AckLane("broker-a")
    big, small = views(MAX_BATCH_ACK - 1, so=0), views(2, so=5_000)
    lane.add(big, "big")
    lane.add(small, "small")
    first = lane.take()
    second = lane.take()
    assert [w for _, w in first] == ["big"] and [w for _, w in second] == ["small"]
    lane.add(views(MAX_BATCH_ACK), "full")       # a full entry alone is fine
    assert len(lane.take()) == 1
    for bad in ([], views(MAX_BATCH_ACK + 1)):
        with pytest.raises(ValueError):
            lane.add(bad, "x")
    assert not lane.waiting


def test_cancelled_callers_are_dropped_unsent():
    lane = AckLane("broker-a")
    for w in ("gone", "live", "gone2"):
        lane.add(views(1, so=len(w)), w)
    entries = lane.take(live=lambda w: w == "live")
    assert [w for _, w in entries] == ["live"]
    assert lane.take(live=lambda w: False) is None and not lane.waiting


def test_a_view_acked_twice_goes_in_the_next_request():
    """One bit per view a request: the second ack of a view is the broker's to refuse, as
    two calls one after the other would have it."""
    lane = AckLane("broker-a")
    a = views(3)
    lane.add(a, "first")
    lane.add(a[1:2], "again")
    lane.add(views(1, so=50), "other")
    one = lane.take()
    two = lane.take()
    assert [w for _, w in one] == ["first"] and [w for _, w in two] == ["again", "other"]


def test_a_view_twice_in_a_later_entry_waits_and_every_take_starts_afresh():
    """An entry that repeats one of its own views goes alone (as its first entry it is taken
    whole); a view taken by one request can be taken by the next (the marks of a take are its
    own)."""
    lane = AckLane("broker-a")
    a, b = views(2, so=0), views(3, so=10)
    lane.add(a, "A")
    lane.add(b + b[:1], "B-dup")
    lane.add(views(1, so=20), "C")
    assert [w for _, w in lane.take()] == ["A"]
    assert [w for _, w in lane.take()] == ["B-dup", "C"]     # first of its request: taken whole
    for w in ("again", "and again"):                          # the same views, in later requests
        lane.add(a, w)
        assert [x for _, x in lane.take()] == [w]


def test_anything_but_a_list_of_message_views_is_refused_and_changes_nothing():
    """An ack of something else fails at once with a clear error (in rmq.aio's ack_batch before
    anything is queued, so no other task's ack shares its request); the lane's own check leaves
    what waits as it was."""
    with pytest.raises(TypeError, match="expected a MessageView, got object"):
        group_by_broker([*views(2), object()])
    lane = AckLane("broker-a")
    with pytest.raises(TypeError, match="list of MessageViews, got tuple"):
        lane.add(tuple(views(1)), "tuple")
    a, b = views(2), views(1, so=40)
    lane.add(a, "A")
    lane.add([*b, "not a view"], "bad")
    with pytest.raises(TypeError, match="holds MessageViews, got str"):
        lane.take()
    assert [w for _, w in lane.waiting] == ["A", "bad"]
    lane.waiting.pop()
    assert [w for _, w in lane.take()] == ["A"]


def test_group_by_broker_keeps_first_seen_order():
    a = views(2)
    b = [MessageView(v.message, "T", v._ck, "broker-b") for v in views(2, so=9)]
    out = group_by_broker([a[0], b[0], a[1], b[1]])
    assert list(out) == ["broker-a", "broker-b"]
    assert out["broker-a"] == [a[0], a[1]] and out["broker-b"] == [b[0], b[1]]
    assert group_by_broker([]) == {}


def test_failed_views_go_back_to_their_own_caller():
    lane = AckLane("broker-a")
    a, b, c = views(3, so=0), views(2, so=10), views(2, so=20)
    for vs, w in ((a, "A"), (b, "B"), (c, "C")):
        lane.add(vs, w)
    entries = lane.take()
    _, index = batch_ack_frame("cg", "broker-a", [v for vs, _ in entries for v in vs])
    answer = Frame(ResponseCode.SUCCESS, fields={"failed": [[1, 1], [0, 0], [7, 0], "junk"]})
    failed = batch_ack_failures(answer, index, "addr")      # the views the broker named, in its order
    assert failed == [b[1], a[0]]
    assert batch_ack_failures(Frame(ResponseCode.SUCCESS, fields={}), index, "addr") == []
    assert AckLane.outcomes(entries, failed) == [("A", [a[0]]), ("B", [b[1]]), ("C", [])]
    assert AckLane.outcomes(entries, []) == [("A", []), ("B", []), ("C", [])]
    # a lone call gets the broker's list as it came (a view it repeated, twice)
    lane.add(a + a[:1], "dup")
    alone = lane.take()
    assert AckLane.outcomes(alone, [a[0]]) == [("dup", [a[0]])]


def test_batch_ack_frame_groups_by_checkpoint_whatever_the_order_of_the_views():
    """A request's views in any order, checkpoints interleaved (and one checkpoint's views with
    equal but distinct tuples, as two receives of a redelivered range could give): one BatchAck
    per (topic, checkpoint, queue), its views' bits in one BitSet; the failures map back to the views."""
    a, b = views(4, so=0), views(3, so=10, qid=1)
    twin = [MessageView(v.message, v.topic, tuple(v._ck), v.broker_name) for v in views(2, start=4, so=0)]
    assert twin[0]._ck == a[0]._ck and twin[0]._ck is not a[0]._ck
    mixed = [a[0], b[0], a[1], twin[0], b[1], a[2], b[2], twin[1], a[3]]
    frame, index = batch_ack_frame("cg", "broker-a", mixed)
    acks = msgpack.unpackb(frame.bodies[0])["acks"]
    assert [(x["so"], x["q"], set_bits(x["b"])) for x in acks] == [(0, 0, [0, 1, 2, 3, 4, 5]), (10, 1, [0, 1, 2])]
    assert [x["b"] for x in acks] == [b"\x3f", b"\x07"]
    answer = Frame(ResponseCode.SUCCESS, fields={"failed": [[0, 4], [1, 2], [0, 3]]})
    assert batch_ack_failures(answer, index, "addr") == [twin[0], b[2], a[3]]
