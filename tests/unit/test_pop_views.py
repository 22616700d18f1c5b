"""A POP answer's views (rmq._core.consume.pop_views / MessageView): segments cut in record order,
one checkpoint tuple per segment, the tag re-check's drops, and a view's fields."""
import gc
from types import SimpleNamespace

from rmq._core.consume import MessageView, ack_bits, ack_groups, pop_views


def msg(qid, qo, tags=None):
    return SimpleNamespace(queue_id=qid, queue_offset=qo, tags=tags, reconsume_times=2, msg_id=f"ID{qid}-{qo}",
                           body=b"b%d" % qo, properties={}, keys=[], born_timestamp=1, store_timestamp=2)


def test_segments_share_their_checkpoint_and_keep_record_order():
    msgs = [msg(3, 100 + i) for i in range(3)] + [msg(5, 7 + i) for i in range(2)]
    views, dropped = pop_views(msgs, [(100, 4, "0", 3), (7, 6, "1", 2)], "T", 1000, 30000, "broker-a")
    assert dropped == [] and [v.message for v in views] == msgs
    assert views[0]._ck is views[2]._ck and views[0]._ck == (100, 1000, 30000, 4, "0")
    assert views[3]._ck == (7, 1000, 30000, 6, "1") and views[3]._ck is views[4]._ck
    v = views[4]
    assert v.receipt_handle == "7 1000 30000 6 1 broker-a 5 8"
    assert (v.topic, v.broker_name, v.queue_id, v.queue_offset, v.delivery_attempt, v.invisible_until_ms,
            v.body, v.message_id) == ("T", "broker-a", 5, 8, 3, 31000, b"b8", "ID5-8")
    assert "receipt_handle='7 1000 30000 6 1 broker-a 5 8'" in repr(v)
    assert not gc.is_tracked(v)                          # a C type the cyclic GC leaves alone


def test_tag_recheck_drops_collisions_in_order():
    msgs = [msg(0, i, tags=t) for i, t in enumerate(["a", "x", "b", "a"])]
    views, dropped = pop_views(msgs, [(0, 1, "0", 4)], "T", 1, 1000, "bk", {"a", "b"}, lambda t: t in ("a", "b"))
    assert [v.queue_offset for v in views] == [0, 2, 3] and [v.queue_offset for v in dropped] == [1]


def test_a_renewed_checkpoint_rebuilds_the_handle():
    (v,), _ = pop_views([msg(1, 50)], [(50, 0, "0", 1)], "T", 10, 2000, "bk")
    assert v.receipt_handle.startswith("50 10 2000 ")
    v._ck, v._handle = (50, 99, 5000, 2, "0"), None        # what change_invisible_duration does
    assert v.receipt_handle == "50 99 5000 2 0 bk 1 50"


def test_ack_groups_by_checkpoint_and_queue_in_first_seen_order():
    a, _ = pop_views([msg(0, 10), msg(0, 11)], [(10, 0, "0", 2)], "T", 1, 1000, "bk")
    b, _ = pop_views([msg(2, 5)], [(5, 1, "0", 1)], "T", 2, 1000, "bk")
    groups = ack_groups([a[1], b[0], a[0]])
    assert list(groups) == [("T", a[0]._ck, 0), ("T", b[0]._ck, 2)]
    assert groups[("T", a[0]._ck, 0)] == [a[1], a[0]] and ack_bits(groups[("T", a[0]._ck, 0)], 10) == b"\x03"   # BitSet.toByteArray()
    twin = MessageView(a[0].message, "T", tuple(a[0]._ck), "bk")       # an equal checkpoint, another tuple
    assert list(ack_groups([a[0], twin])) == [("T", a[0]._ck, 0)]


def test_ack_bits_is_rocketmqs_bitset_and_refuses_a_view_outside_its_checkpoint():
    """ack_bits: BitSet.toByteArray() (bit i in byte i // 8, little-endian, no trailing zero byte);
    a view before the start offset, or ACK_BITSET_MAX_BYTES * 8 or more past it, is a ValueError."""
    import pytest

    from rmq._core.consume import ACK_BITSET_MAX_BYTES
    vs, _ = pop_views([msg(0, 100 + i) for i in range(10)], [(100, 0, "0", 10)], "T", 1, 1000, "bk")
    assert ack_bits([vs[0], vs[9]], 100) == b"\x01\x02" and ack_bits([vs[9], vs[9]], 100) == b"\x00\x02"
    assert ack_bits([], 100) == b"" and ack_bits(vs[:8], 100) == b"\xff"
    with pytest.raises(ValueError, match="outside the BatchAck"):
        ack_bits([vs[0]], 101)
    far, _ = pop_views([msg(0, 100 + ACK_BITSET_MAX_BYTES * 8)], [(100, 0, "0", 1)], "T", 1, 1000, "bk")
    with pytest.raises(ValueError, match="outside the BatchAck"):
        ack_bits(far, 100)
    assert len(ack_bits(far, 101)) == ACK_BITSET_MAX_BYTES
