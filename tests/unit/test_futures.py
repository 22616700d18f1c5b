"""SendFuture: the producer's lazily-conditioned concurrent.futures.Future."""
import gc
import threading
from concurrent.futures import (FIRST_COMPLETED, Future, InvalidStateError, TimeoutError as FutureTimeout,
                                as_completed, wait)

import pytest

from rmq._core.client_msg import new_send_future
from rmq.client.futures import ManyFuture, SendFuture
from rmq.errors import SendManyError


def has_dict(f) -> bool:
    """Whether ``f.__dict__`` was materialised (without materialising it: the cyclic GC's view of
    an object with inline values lists the values, of one with a dict the dict)."""
    return any(type(o) is dict for o in gc.get_referents(f))


def test_is_a_running_future_that_cannot_be_cancelled():
    f = SendFuture()
    assert isinstance(f, Future)
    assert f.running() and not f.done() and not f.cancel()
    with pytest.raises(FutureTimeout):
        f.result(0.01)


def test_state_questions_never_build_the_condition():
    # a done-callback asking cancelled() / running() / done() / result() / exception() must not
    # build a threading.Condition per future: it halved Producer.send_async's rate with such a callback
    f = SendFuture()
    assert not f.cancelled() and f.running() and not f.done()
    f.set_result(5)
    assert not f.cancelled() and not f.running() and f.done()
    assert f.result() == 5 and f.exception() is None
    assert f._cond is None and not has_dict(f)
    g = SendFuture(lambda fut: (fut.cancelled(), fut.exception()))
    g.set_exception(ValueError("x"))
    assert not g.cancelled() and g._cond is None and not has_dict(g)


def test_result_exception_and_double_completion():
    f = SendFuture()
    f.set_result(7)
    assert f.done() and f.result() == 7 and f.exception() is None
    with pytest.raises(InvalidStateError):
        f.set_result(8)
    g = SendFuture()
    g.set_exception(ValueError("boom"))
    assert isinstance(g.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        g.result()
    with pytest.raises(InvalidStateError):
        g.set_exception(ValueError("again"))
    # a waiter created the condition first: the standard path, same answers
    h = SendFuture()
    assert not h.done()
    h.set_result(1)
    with pytest.raises(InvalidStateError):
        h.set_result(2)
    assert h.result() == 1


def test_callbacks_run_once_whether_given_at_creation_added_before_or_after():
    calls = []
    f = SendFuture(lambda fut: calls.append(("ctor", fut.result())))
    f.add_done_callback(lambda fut: calls.append(("before", fut.result())))
    f.set_result(3)
    f.add_done_callback(lambda fut: calls.append(("after", fut.result())))
    assert calls == [("ctor", 3), ("before", 3), ("after", 3)]


def test_a_raising_callback_does_not_stop_the_others(caplog):
    seen = []
    f = SendFuture(lambda fut: 1 / 0)
    f.add_done_callback(lambda fut: seen.append(fut.result()))
    f.set_result("ok")
    assert seen == ["ok"]
    assert "exception calling callback" in caplog.text


@pytest.mark.parametrize("make", [SendFuture, lambda: new_send_future(SendFuture, None)], ids=["class", "C"])
@pytest.mark.parametrize("waiter", ["result", "wait", "as_completed", "callback"])
def test_completion_racing_a_waiter_in_another_thread_never_loses_a_wakeup(waiter, make):
    """The lock-free completion against every way of waiting, many times (a lost wake-up
    would hang result() until its timeout and fail the assertion).  Neither thread makes the
    future's ``__dict__``: on CPython 3.11 two threads materialising it at once can each make
    one, sharing one values array that the first to go frees under the other (the segfaults
    of a later GC that stop 45 traced; rmq.client.futures' docstring)."""
    for i in range(2000):
        f = make()              # made by its class, or in C through its slots (new_send_future)
        got = []
        done = threading.Event()

        def wait_for_it():
            if waiter == "result":
                got.append(f.result(5))
            elif waiter == "wait":
                d, _ = wait([f], 5, return_when=FIRST_COMPLETED)
                got.append(next(iter(d)).result())
            elif waiter == "as_completed":
                got.extend(x.result() for x in as_completed([f], 5))
            else:
                f.add_done_callback(lambda fut: got.append(fut.result()))
            done.set()

        t = threading.Thread(target=wait_for_it)
        t.start()
        f.set_result(i)
        t.join(10)
        assert not t.is_alive()
        if waiter == "callback":
            assert done.wait(5)
        assert got == [i], (waiter, i, got)
        assert not has_dict(f), (waiter, i)


def test_no_dict_even_once_the_class_keys_stop_growing():
    """CPython 3.11 shares one keys table among a class's instances and stops growing it as
    instances are made (each creation takes one slot of room): a name stored later than that,
    on any instance, makes that instance's dict -- in whichever thread stores it, the race that
    crashed the GC (module docstring).  A fresh subclass starts with an empty table: freeze it
    with many instances first, then complete, wait on and call back futures from two threads."""
    class Fresh(SendFuture):
        pass

    frozen = [Fresh() for _ in range(100)]
    fs = [Fresh(print if i % 2 else None) for i in range(50)]
    done = threading.Event()

    def complete():
        done.wait(5)
        for i, f in enumerate(fs):
            if i % 3:
                f.set_result(i)
            else:
                f.set_exception(RuntimeError(i))

    t = threading.Thread(target=complete)
    t.start()
    fs[0].add_done_callback(lambda f: None)
    done.set()
    assert isinstance(fs[0].exception(5), RuntimeError)
    t.join()
    wait(fs, 5)
    assert [i for i, f in enumerate(fs) if has_dict(f)] == []
    assert not any(has_dict(f) for f in frozen)


def test_a_send_future_and_a_prepared_message_give_the_cyclic_gc_little_to_track():
    """The GC's collections run in the thread that allocates (the sender's, per send_async): a
    pending future is not tracked at all, nor is anything it makes for itself (no dict, no
    waiters' or callbacks' list until asked for), and a PreparedMessage is not tracked; the
    lazily made lists still serve add_done_callback and wait(), and completion tracks the
    future again."""
    from rmq import Message
    from rmq.client.producer import ProducerOptions, message_preparer
    cb = print
    f = SendFuture(cb)
    assert not gc.is_tracked(f)
    assert [o for o in gc.get_referents(f) if gc.is_tracked(o) and o is not cb and o is not SendFuture] == []
    assert not gc.is_tracked(message_preparer(ProducerOptions()).prepare(Message("T", b"x")))
    f.set_result(1)
    assert gc.is_tracked(f)
    calls = []
    f = SendFuture(lambda fut: calls.append(1))
    f.add_done_callback(lambda fut: calls.append(2))       # materialises the list, with the first one
    t = threading.Timer(0.05, f.set_result, (7,))
    t.start()
    d, _ = wait([f], 5)
    t.join()
    assert next(iter(d)).result() == 7 and calls == [1, 2] and gc.is_tracked(f)


@pytest.mark.parametrize("outcome", ["result", "exception", "late callback"])
def test_a_done_future_in_a_reference_cycle_is_collected(outcome):
    """Untracked while pending, tracked again by its completion: a done future in a cycle (its
    callbacks' list -> the user's object -> the future; its exception's traceback -> a frame
    -> the future) is freed by the cyclic GC, not leaked."""
    import weakref

    class Holder:                       # the user's object: keeps its futures, is their callback
        def __init__(self):
            self.futures = []

        def done(self, fut):
            self.futures.append(fut)

    def refuse(fut):
        try:
            raise RuntimeError("refused")
        except RuntimeError as e:
            fut.set_exception(e)        # e.__traceback__ -> this finished frame -> fut

    h = Holder()
    f = SendFuture(h.done if outcome == "result" else None)
    h.futures.append(f)
    if outcome == "late callback":
        f.add_done_callback(h.done)     # kept in the future's callbacks list
    if outcome == "exception":
        refuse(f)
    else:
        f.set_result(1)
    ref = weakref.ref(f)
    del f, h
    gc.collect()
    assert ref() is None


def test_the_untrack_helpers_of_pending_send_state():
    """rmq.aio's send_async keeps a pending future and its callback entry (future, callback,
    context) out of the cyclic GC: the entry's tuple untracked, the future by untrack_pending;
    track_done puts one back (once: tracking twice is harmless).  The context stays tracked
    (CPython frees a Context assuming it is: pending_callback)."""
    import asyncio
    import contextvars

    from rmq._core.client_msg import pending_callback, track_done, untrack_pending
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        untrack_pending(fut)
        ctx = contextvars.copy_context()
        entry = pending_callback(fut, print, ctx)
        assert entry == (fut, print, ctx)
        assert not gc.is_tracked(fut) and gc.is_tracked(ctx) and not gc.is_tracked(entry)
        track_done(fut)
        track_done(fut)
        assert gc.is_tracked(fut) and gc.is_tracked(ctx)
        untrack_pending(1)              # not of a GC type: nothing to do either way
        track_done(1)
    finally:
        loop.close()


def test_many_outcomes_fill_runs_and_scattered_positions_alike():
    """A part's positions ascend: a run of them is filled as one slice, scattered ones (a
    sharding key's part) one by one; both give message i its own result."""
    from rmq.client.futures import ManyOutcomes
    o = ManyOutcomes(8)
    assert not o.fill([0, 2, 4], ["r0", "r2", "r4"], None)     # one key's messages
    assert not o.fill([5, 6, 7], ["r5", "r6", "r7"], None)     # a run
    assert not o.fill([1], ["r1"], None)
    assert o.fill([3], ["r3"], None)
    assert o.outcome() == ([f"r{i}" for i in range(8)], None)


@pytest.mark.parametrize("track", [True, False])
def test_set_results_of_an_aio_request(track):
    """rmq.aio's completion of a request: each future its own result, a None slot (a
    send_async_many message) skipped, a future its owner cancelled left cancelled; tracked by
    the GC again first when asked (else its callback entry does it as the callback runs)."""
    import asyncio

    from rmq._core.client_msg import set_results, untrack_pending
    loop = asyncio.new_event_loop()
    try:
        futs = [loop.create_future() for _ in range(3)]
        for f in futs:
            untrack_pending(f)
        futs[1].cancel()
        set_results([futs[0], None, futs[1], futs[2]], ["r0", "skip", "r1", "r2"], track)
        assert futs[0].result() == "r0" and futs[1].cancelled() and futs[2].result() == "r2"
        assert [gc.is_tracked(f) for f in futs] == [track] * 3
    finally:
        loop.close()


def test_a_many_future_gathers_its_parts_in_the_order_given_and_calls_back_once():
    calls = []
    f = ManyFuture(5, calls.append)
    f.part([3, 4]).set_result(["d", "e"])
    f.part([0, 2]).set_result(["a", "c"])
    assert not f.done() and calls == []
    f.part([1]).set_result(["b"])
    assert f.result() == ["a", "b", "c", "d", "e"] and calls == [f]
    assert f._cond is None and not has_dict(f)
    empty = ManyFuture(0)
    assert empty.done() and empty.result() == []


def test_a_many_future_with_a_failed_part_raises_every_outcome():
    f = ManyFuture(4)
    boom = ValueError("refused")
    f.part([0, 1]).set_result(["a", "b"])
    f.part([2, 3]).set_exception(boom)
    with pytest.raises(SendManyError, match="2 of 4 message") as ei:
        f.result()
    assert ei.value.results == ["a", "b", boom, boom] and ei.value.failed == 2 and ei.value.__cause__ is boom
