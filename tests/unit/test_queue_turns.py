"""rmq.client.message_accumulator.QueueTurns: ordered sends' requests-out-per-queue rule, driven without I/O."""
from types import SimpleNamespace

import pytest

from rmq import Producer
from rmq.client.message_accumulator import QueueTurns
from rmq.client.producer_request import MAX_IN_FLIGHT_PER_QUEUE, ProducerOptions
from rmq.errors import MQClientError


def req(name, size=100, mergeable=True):
    return SimpleNamespace(name=name, size=size, mergeable=mergeable, queue_turn=False)


def names(r):
    return r.name if r is not None else None


def test_one_out_per_queue_the_rest_held_in_order_and_released_one_by_one():
    t = QueueTurns(MAX_IN_FLIGHT_PER_QUEUE)
    a, b, c, d, x = (req(n) for n in "abcdx")
    assert MAX_IN_FLIGHT_PER_QUEUE == 1 and not t
    assert t.take("q0", a) and t.take("q1", x)             # queues are independent
    assert a.queue_turn and x.queue_turn                    # the turn is marked on the request
    assert t.busy("q0") and not t.busy("q2")
    assert not t.take("q0", b) and not t.take("q0", c) and not b.queue_turn
    assert t.held == 2
    assert t.end("q0", a) is b and b.queue_turn and not a.queue_turn    # the turn passes in order
    assert t.end("q0", b) is c
    assert t.end("q0", c) is None and not t.busy("q0")     # nothing held: the queue is free
    assert t.end("q1", x) is None and not t                 # every turn ended: nothing left
    assert t.take("q0", d)


def test_a_wider_limit_pipelines_but_never_overtakes_what_is_held():
    t = QueueTurns(2)
    r1, r2, r3, r4 = (req(n) for n in "1234")
    assert t.take("q", r1) and t.take("q", r2)
    assert not t.take("q", r3)                             # the limit
    assert t.end("q", r1) is r3                             # 3 takes the freed turn
    assert not t.take("q", r4)
    assert t.end("q", r2) is r4 and t.end("q", r3) is None and t.end("q", r4) is None
    assert not t.busy("q") and not t


def test_end_joins_the_mergeable_held_ones_up_to_cap_in_order():
    combined = []

    def combine(first, joined):
        combined.append([first.name] + [j.name for j in joined])
        return req("+".join(combined[-1]), first.size + sum(j.size for j in joined))

    t = QueueTurns(1, 300, lambda r: r.mergeable, lambda r: r.size, combine)
    head = req("h")
    t.take("q", head)
    held = [req("a"), req("b"), req("c"), req("s", mergeable=False), req("d"), req("e")]
    for r in held:
        t.take("q", r)
    ab_c = t.end("q", head)                                # a, b, c: 300 bytes, the cap
    assert names(ab_c) == "a+b+c" and ab_c.queue_turn
    s = t.end("q", ab_c)
    assert names(s) == "s"                                  # not mergeable: it goes alone
    de = t.end("q", s)                                      # s is not joined to what follows either
    assert names(de) == "d+e"
    assert t.end("q", de) is None and not t


def test_a_request_over_the_cap_with_the_next_goes_alone_and_clear_returns_what_is_held():
    t = QueueTurns(1, 300, lambda r: r.mergeable, lambda r: r.size,
                   lambda first, joined: req("+".join([first.name] + [j.name for j in joined])))
    x, y, z, w = req("x"), req("y", size=250), req("z"), req("w")
    t.take("q", x)
    for r in (y, z, w):
        t.take("q", r)
    assert t.end("q", x) is y                               # 250 + 100 > 300: y alone
    assert [r.name for r in t.clear()] == ["z", "w"] and not t
    assert t.end("q", y) is None and not y.queue_turn      # a turn ended after clear(): no one to pass to


@pytest.mark.parametrize("bad", [0, -1, 1.5j, True])
def test_max_in_flight_per_queue_must_be_positive(bad):
    with pytest.raises(MQClientError, match="max_in_flight_per_queue"):
        ProducerOptions(max_in_flight_per_queue=bad)
    with pytest.raises(MQClientError, match="max_in_flight_per_queue"):
        Producer("127.0.0.1:9876", max_in_flight_per_queue=bad)


def _request(mode, n, opts, size=100, queue="q"):
    from rmq import Message
    from rmq.client.message_accumulator import Pending, Request
    from rmq.client.producer_request import message_preparer
    prep = message_preparer(opts).prepare
    preps = [prep(Message("T", b"x" * size)) for _ in range(n)]
    return Request([Pending([p], None, mode, 1e12, 3.0) for p in preps], queue, opts)


def test_held_ordered_requests_join_up_to_batch_size_in_order_and_only_async_ones():
    """The thread producer's QueueTurns (no I/O): when a queue's turn passes, the async batchable
    requests held behind the next one join it, in order, while the request stays within
    batch_size; a sync one is never joined (it is answered alone), nor joined to."""
    from rmq.client.message_accumulator import ASYNC, SYNC
    from rmq.client.sender import Sender
    opts = ProducerOptions(batch_size=1000)
    turns = Sender(["127.0.0.1:9876"], "pg", "client", opts)._queue_turns
    head, a, b, c, d = (_request(ASYNC, 2, opts) for _ in range(5))
    size = sum(p.size for p in a.preps)
    assert 3 * size <= 1000 < 4 * size                     # three fit the bound, four do not
    assert turns.take("q", head) and not any(turns.take("q", r) for r in (a, b, c, d))
    joined = turns.end("q", head)
    assert joined.preps == a.preps + b.preps + c.preps and joined.queue_turn and joined.batch
    assert sum(p.size for p in joined.preps) <= opts.batch_size
    sync, e = _request(SYNC, 1, opts), _request(ASYNC, 2, opts)
    turns.take("q", sync)
    turns.take("q", e)
    assert turns.end("q", joined) is d                      # d alone: the sync one is not joined to it
    assert turns.end("q", d) is sync                        # and the sync one goes alone
    assert turns.end("q", sync) is e and turns.end("q", e) is None and not turns
