"""Receipt handles (RocketMQ's ExtraInfoUtil format) and POP names, without a broker."""
import pytest
from hypothesis import given, strategies as st

from rmq.actors.pop import (REVIVE_GROUP, build_extra_info, parse_extra_info, pop_retry_topic, revive_topic)


def test_names_are_rocketmqs():
    assert revive_topic("DefaultCluster") == "rmq_sys_REVIVE_LOG_DefaultCluster"
    assert pop_retry_topic("orders", "cg") == "%RETRY%cg_orders"          # KeyBuilder.buildPopRetryTopicV1
    assert REVIVE_GROUP == "CID_RMQ_SYS_REVIVE_GROUP"


@given(st.integers(0, 2 ** 62), st.integers(0, 2 ** 45), st.integers(1000, 43_200_000), st.integers(0, 7),
       st.sampled_from(["0", "1"]), st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True), st.integers(0, 1023),
       st.integers(0, 2 ** 62))
def test_extra_info_round_trip(so, pt, it, rq, retry, bn, qid, qo):
    text = build_extra_info(so, pt, it, rq, retry, bn, qid, qo)
    assert text.split(" ")[:4] == [str(so), str(pt), str(it), str(rq)]
    assert parse_extra_info(text) == (so, pt, it, rq, retry, bn, qid, qo)


@pytest.mark.parametrize("bad", ["", "1 2 3", "1 2 3 4 0 b 0", "1 2 3 4 0 b 0 1 9", "a 2 3 4 0 b 0 1",
                                 "1 2 3 4 2 b 0 1", "-1 2 3 4 0 b 0 1", "1 2 3 4 0 b -1 1", "1 2 3 4 0 b 0 1.5",
                                 "1  2 3 4 0 b 0 1", "9" * 600, None, 17, b"1 2 3 4 0 b 0 1"])
def test_malformed_handles_are_refused(bad):
    with pytest.raises(ValueError):
        parse_extra_info(bad)


def test_a_checkpoints_offsets_and_its_bitmask_convert_both_ways():
    """rmq.actors.pop's bitmask of a checkpoint's messages (bit = queue offset - startOffset, as
    RocketMQ's BatchAck BitSet): a dense range in one step, sparse offsets, and back, ascending."""
    from rmq.actors.pop import CheckPoint, mask_offsets, offsets_mask
    assert offsets_mask(range(100, 132), 100) == (1 << 32) - 1 == offsets_mask(list(range(100, 132)), 100)
    assert offsets_mask(range(103, 105), 100) == 0b11000 and offsets_mask(range(5, 5), 5) == 0
    assert offsets_mask([100, 107, 102], 100) == 0b10000101
    assert mask_offsets(0b10000101, 100) == [100, 102, 107] and mask_offsets((1 << 32) - 1, 7) == list(range(7, 39))
    assert mask_offsets(0, 100) == []
    ck = CheckPoint(("g", "T", 0, 100, 1), 30_000, 0, 0, [100, 102, 107])
    assert [ck.in_flight(o) for o in (99, 100, 101, 102, 107, 108, 10**9)] == [False, True, False, True, True,
                                                                                False, False]
