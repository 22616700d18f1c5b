"""rmq.client.producer.QueueTurns: ordered sends' requests-out-per-queue rule, driven without I/O."""
import pytest

from rmq import Producer
from rmq.client.producer import MAX_IN_FLIGHT_PER_QUEUE, ProducerOptions, QueueTurns
from rmq.errors import MQClientError


def test_one_out_per_queue_the_rest_held_in_order_and_released_one_by_one():
    t = QueueTurns(MAX_IN_FLIGHT_PER_QUEUE)
    assert MAX_IN_FLIGHT_PER_QUEUE == 1 and not t
    assert t.take("q0", "a") and t.take("q1", "x")         # queues are independent
    assert t.busy("q0") and not t.busy("q2")
    assert not t.take("q0", "b") and not t.take("q0", "c")
    assert t.held == 2
    assert t.end("q0") == "b"                               # the turn passes in order
    assert t.end("q0") == "c"
    assert t.end("q0") is None and not t.busy("q0")         # nothing held: the queue is free
    assert t.end("q1") is None and not t                    # every turn ended: nothing left
    assert t.take("q0", "d")


def test_a_wider_limit_pipelines_but_never_overtakes_what_is_held():
    t = QueueTurns(2)
    assert t.take("q", 1) and t.take("q", 2)
    assert not t.take("q", 3)                              # the limit
    assert t.end("q") == 3                                  # 3 takes the freed turn
    assert not t.take("q", 4)
    assert t.end("q") == 4 and t.end("q") is None and t.end("q") is None
    assert not t.busy("q") and not t


def test_end_merges_the_held_ones_behind_the_next_and_clear_returns_what_is_held():
    t = QueueTurns(1)
    t.take("q", [1])
    for r in ([2], [3], [4]):
        t.take("q", r)

    def merge(first, held):                                 # join two at most, as a size cap would
        out = first + held.popleft()
        return out

    assert t.end("q", merge) == [2, 3]
    assert t.clear() == [[4]] and not t
    assert t.end("q") is None                              # a turn ended after clear(): no one to pass to


@pytest.mark.parametrize("bad", [0, -1, 1.5j, True])
def test_max_in_flight_per_queue_must_be_positive(bad):
    with pytest.raises(MQClientError, match="max_in_flight_per_queue"):
        ProducerOptions(max_in_flight_per_queue=bad)
    with pytest.raises(MQClientError, match="max_in_flight_per_queue"):
        Producer("127.0.0.1:9876", max_in_flight_per_queue=bad)


def _request(mode, n, opts, size=100, queue="q"):
    from rmq import Message
    from rmq.client.producer import _Pending, _Request, message_preparer
    prep = message_preparer(opts).prepare
    preps = [prep(Message("T", b"x" * size)) for _ in range(n)]
    return _Request([_Pending([p], None, mode, 1e12, 3.0) for p in preps], queue, opts)


def test_held_ordered_requests_join_up_to_batch_size_in_order_and_only_async_ones():
    """The thread producer's join of the requests held for a queue (_Sender._merge_held, no I/O):
    async batchable ones join, in order, while the request stays within batch_size; a sync one
    stops the join (it is answered alone)."""
    import collections

    from rmq.client.producer import ASYNC, SYNC, _Sender
    opts = ProducerOptions(batch_size=1000)
    s = _Sender(["127.0.0.1:9876"], "pg", "client", opts)
    first, a, b, c = (_request(ASYNC, 2, opts) for _ in range(4))
    size = sum(p.size for p in first.preps)
    assert 3 * size <= 1000 < 4 * size                     # three fit the bound, four do not
    held = collections.deque([a, b, c])
    joined = s._merge_held(first, held)
    assert joined.preps == first.preps + a.preps + b.preps and list(held) == [c]
    assert sum(p.size for p in joined.preps) <= opts.batch_size and joined.batch
    sync = _request(SYNC, 1, opts)
    held = collections.deque([sync, a])
    assert s._merge_held(first, held) is first and list(held) == [sync, a]
    assert s._merge_held(sync, collections.deque([a])) is sync
