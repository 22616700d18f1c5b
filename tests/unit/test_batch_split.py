"""The pure rules of splitting a batch the broker refused as over its maxMessageSize
(rmq.client.producer: refused_batch_limit, split_by_size, QueueTurns.hold_first;
rmq._core.client_msg.RowsPart.split)."""
from types import SimpleNamespace

import pytest

from rmq.client.producer import (ProducerOptions, QueueTurns, encode_columns, message_preparer, refused_batch_limit,
                                 split_by_size)
from rmq.common.request_header import MAX_BATCH_BYTES_FIELD
from rmq.protocol import Frame, ResponseCode


@pytest.mark.parametrize("sizes,limit,want", [
    ([], 10, []),
    ([4, 4, 4], 10, [(0, 2), (2, 3)]),
    ([5, 5, 5, 5], 10, [(0, 2), (2, 4)]),
    ([11, 1, 1], 10, [(0, 1), (1, 3)]),          # an item over the limit goes alone
    ([1, 11, 1], 10, [(0, 1), (1, 2), (2, 3)]),
    ([3] * 7, 100, [(0, 7)]),
])
def test_split_by_size(sizes, limit, want):
    got = split_by_size(sizes, limit)
    assert got == want
    assert all(sum(sizes[a:b]) <= limit or b - a == 1 for a, b in got)


def refusal(code=ResponseCode.MESSAGE_ILLEGAL, limit=1000):
    return Frame(int(code), fields={} if limit is None else {MAX_BATCH_BYTES_FIELD: limit})


@pytest.mark.parametrize("resp,nbytes,n,want", [
    (refusal(), 5000, 10, 1000),
    (refusal(), 5000, 1, 0),                               # one message: its refusal stands
    (refusal(limit=None), 5000, 10, 0),                    # a broker that does not say its limit
    (refusal(limit="1000"), 5000, 10, 0),
    (refusal(limit=0), 5000, 10, 0),
    (refusal(limit=True), 5000, 10, 0),
    (refusal(), 900, 10, 0),                               # refused for another reason
    (refusal(code=ResponseCode.SYSTEM_ERROR), 5000, 10, 0),
])
def test_refused_batch_limit(resp, nbytes, n, want):
    assert refused_batch_limit(resp, nbytes, n) == want


def rows_part(n=50, body=100):
    _, parts = encode_columns(message_preparer(ProducerOptions()), "T", [bytes([65 + i % 26]) * body for i in range(n)],
                              None, None, None, "k", None, 1 << 20)
    assert len(parts) == 1
    return parts[0]


@pytest.mark.parametrize("limit", [1, 164, 165, 1000, 8200, 10 ** 6])
def test_rows_part_split_keeps_every_row_in_order(limit):
    p = rows_part()
    subs = p.split(limit)
    assert b"".join(s.body for s in subs) == p.body and b"".join(s.uniq for s in subs) == p.uniq
    assert [i for s in subs for i in s.positions] == list(p.positions)
    assert all(s.nbytes == len(s.body) and (s.nbytes <= limit or s.n == 1) for s in subs)
    assert {(s.topic, s.key) for s in subs} == {("T", "k")}
    assert sum(s.n for s in subs) == p.n and [u for s in subs for u in s.uniq_ids()] == p.uniq_ids()


def test_rows_part_split_refuses_a_bad_limit():
    with pytest.raises(ValueError, match="limit"):
        rows_part().split(0)


def test_hold_first_puts_a_split_requests_parts_ahead_of_what_waits():
    t = QueueTurns(1)
    q = "q0"
    r1, r1b, r1c, r2 = (SimpleNamespace(name=n, queue_turn=False) for n in ("r1", "r1b", "r1c", "r2"))
    assert t.take(q, r1)
    assert not t.take(q, r2)                     # held behind r1
    t.hold_first(q, [r1b, r1c])                 # r1 was split: its other parts go before r2
    assert t.end(q, r1) is r1b and r1b.queue_turn
    assert t.end(q, r1b) is r1c
    assert t.end(q, r1c) is r2
    assert t.held == 3
    assert t.end(q, r2) is None and not t
    t.hold_first("other", [SimpleNamespace(queue_turn=False)])   # a queue with no turn: nothing held
    assert not t.busy("other")
