"""rmq bench client's counters (the send rows' callback, the PushConsumer row's listener):
cheap per message, and exact with callers in several threads."""
import itertools
import threading
from concurrent.futures import Future

import pytest

from rmq.bench.client import _Counter, _counted, _ManyOutcomes, _Outcomes


def done_future(exc=None):
    f = Future()
    if exc is None:
        f.set_result(1)
    else:
        f.set_exception(exc)
    return f


def test_counted_reads_a_count_without_taking_a_value():
    c = itertools.count(1)
    assert _counted(c) == 0
    for _ in range(12345):
        next(c)
    assert _counted(c) == 12345 and _counted(c) == 12345


def test_outcomes_from_four_threads_are_all_counted_and_done_is_set_at_the_nth():
    n_threads, per = 4, 20_000
    cb = _Outcomes(n_threads * per, threading.Event())
    ok, bad = done_future(), done_future(RuntimeError("refused"))

    def run(k):
        for i in range(per):
            cb(bad if (k == 0 and i < 3) else ok)
    ts = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert cb.done.is_set() and cb.missing == 0
    assert (cb.seen, cb.ok, cb.failed) == (n_threads * per, n_threads * per - 3, 3)
    assert isinstance(cb.first_error, RuntimeError)
    try:
        cb.checked()
    except RuntimeError as e:
        assert "3 of 80,000 sends failed" in str(e)
    else:
        raise AssertionError("checked() passed with failures")


def test_outcomes_not_done_before_the_nth_and_a_cancelled_future_counts_as_failed():
    cb = _Outcomes(3, threading.Event())
    cb(done_future())
    f = Future()
    f.cancel()
    cb(f)
    assert not cb.done.is_set() and cb.missing == 1
    cb(done_future())
    assert cb.done.is_set() and (cb.ok, cb.failed) == (2, 1)


def test_many_outcomes_count_whole_lists_and_a_partial_failure():
    """send_async_many's callback: a list's results at once, a SendManyError's stored and failed
    parts apart; any other error ends the wait at once (the row fails)."""
    from rmq.errors import SendManyError
    cb = _ManyOutcomes(5, threading.Event())
    f = Future()
    f.set_result(["r0", "r1", "r2"])
    cb(f)
    assert (cb.ok, cb.failed, cb.missing) == (3, 0, 2) and not cb.done.is_set()
    boom = ValueError("refused")
    g = Future()
    g.set_exception(SendManyError("1 of 2 failed", ["r3", boom], 1))
    cb(g)
    assert (cb.ok, cb.failed, cb.missing) == (4, 1, 0) and cb.done.is_set()
    with pytest.raises(RuntimeError, match="1 of 5 sends failed"):
        cb.checked()
    other = _ManyOutcomes(1000, threading.Event())
    h = Future()
    h.set_exception(RuntimeError("I/O thread gone"))
    other(h)
    assert other.done.is_set() and other.failed == 1 and isinstance(other.first_error, RuntimeError)


def test_the_listener_counts_from_many_threads_and_marks_the_first_and_the_nth():
    cnt = _Counter(40_000)
    listener = cnt.listener("OK")

    def run():
        for _ in range(5_000):
            assert listener([1, 2], None) == "OK"      # two messages a call
    ts = [threading.Thread(target=run) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert cnt.got == 40_000 and cnt.done.is_set()
    assert cnt.first is not None and cnt.last >= cnt.first
    last = cnt.last
    listener([1], None)                               # past the target: counted, the n-th time kept
    assert cnt.got == 40_001 and cnt.last == last
