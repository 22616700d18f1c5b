"""rmq.aio send_async's common case in C (rmq._core.client_msg.AioAppend), on a Producer that is
not started: its state (``_pending``, ``_accs``, ``_ready``, ``_batch_size``) set as the event loop
would have it.  The call either appends to the open batch or hands back the prepared message and
changes nothing (the Python path goes on from there)."""
import asyncio
import contextvars
import gc
import subprocess
import sys
import textwrap

import pytest

from rmq import Message
from rmq._core.client_msg import AioAppend, PreparedMessage
from rmq.aio import Producer
from rmq.errors import MQClientError

VAR = contextvars.ContextVar("VAR", default="unset")


@pytest.fixture
def setup():
    loop = asyncio.new_event_loop()
    p = Producer("127.0.0.1:9876", max_pending_messages=3)
    p._loop = loop
    yield p, AioAppend(p, p._preparer, asyncio.Future, loop)
    loop.close()


def test_a_message_joins_its_topics_open_batch_with_its_callback_in_its_context(setup):
    p, c = setup
    b = p._open_batch(("T", None), None, None)
    seen = []
    VAR.set("caller's")
    fut = c.send(Message("T", b"x" * 100), lambda f: seen.append(VAR.get()))
    VAR.set("later")
    assert type(fut) is asyncio.Future and not fut.done() and not gc.is_tracked(fut)
    assert b.futures == [fut] and len(b.preps) == 1 and b.nbytes == b.preps[0].size and p._pending == 1
    (f, cb, ctx), = b.callbacks
    assert f is fut and gc.is_tracked(ctx)            # a Context is freed assuming it is tracked
    ctx.run(cb, fut)
    assert seen == ["caller's"]                       # the context of the call, not of the completion
    fut2 = c.send(Message("T", b"y"), None)           # no callback: no entry
    assert b.futures == [fut, fut2] and len(b.callbacks) == 1 and p._pending == 2


def test_a_batch_that_reaches_batch_size_is_sealed(setup):
    p, c = setup
    b = p._open_batch(("T", None), None, None)
    size = p._preparer.prepare(Message("T", b"x" * 50)).size
    p._batch_size = 2 * size
    f1 = c.send(Message("T", b"x" * 50), None)
    assert p._accs[("T", None)] is b and not p._ready
    f2 = c.send(Message("T", b"x" * 50), None)
    assert ("T", None) not in p._accs and list(p._ready) == [b]          # full: sealed, waits its turn
    assert b.futures == [f1, f2] and b.nbytes == 2 * size and p._pending == 2
    out = c.send(Message("T", b"x" * 50), None)                           # no open batch now: Python's
    assert type(out) is PreparedMessage and p._pending == 2


@pytest.mark.parametrize("why", ["no batch", "batch full", "pending at max", "not batchable", "batching off"])
def test_outside_the_common_case_the_prepared_message_is_handed_back_and_nothing_changes(setup, why):
    p, c = setup
    b = p._open_batch(("T", None), None, None)
    msg = Message("T", b"x" * 10)
    if why == "no batch":
        p._accs.clear()
    elif why == "batch full":
        b.nbytes = p._batch_size
    elif why == "pending at max":
        p._pending = p._max_pending
    elif why == "not batchable":
        msg = Message("T", b"x", delay_time_level=3)
    else:
        p._batch_size = 0
    pending, nbytes = p._pending, b.nbytes
    out = c.send(msg, print)
    assert type(out) is PreparedMessage and out.msg is msg
    assert p._pending == pending and b.nbytes == nbytes and not b.preps and not b.futures and b.callbacks is None
    assert not p._ready


def test_a_refused_message_raises_and_changes_nothing(setup):
    p, c = setup
    b = p._open_batch(("T", None), None, None)
    with pytest.raises(MQClientError):
        c.send(Message("T", b""), None)               # an empty body
    assert p._pending == 0 and not b.preps


def test_an_aio_producer_dropped_unclosed_with_queued_callbacks_does_not_crash_the_interpreter():
    """Its open batches' callback entries go with it, contexts and all: freeing an untracked
    Context crashed CPython 3.11 (exit -11) until stop 53 (``pending_callback``)."""
    script = textwrap.dedent("""
        import asyncio, gc
        from rmq import Message
        from rmq.aio import Producer

        async def main():
            p = Producer("127.0.0.1:9", max_in_flight=1, linger_ms=1000)   # nothing listens there
            for i in range(5):
                await p.send_async(Message("T", b"x%d" % i), callback=lambda f: None)

        asyncio.run(main())     # returns with the messages queued, the producer never closed
        gc.collect()
        print("exited")
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "exited" in out.stdout, (out.returncode, out.stderr[-2000:])


def test_callbacks_of_one_context_share_a_snapshot_and_each_runs_in_a_copy_of_it(setup):
    """snapshot_context: one Context per stream of calls from an unchanged context (not a
    tracked copy per message in flight); _run_callbacks runs each callback in a copy, so what
    one callback sets is not what the next sees, as with asyncio's copy per add_done_callback."""
    from rmq._core.client_msg import snapshot_context
    from rmq.aio.producer import _run_callbacks

    p, c = setup
    b = p._open_batch(("T", None), None, None)
    seen = []

    def record(tag, set_to=None):
        def cb(f):
            seen.append((tag, VAR.get()))
            if set_to is not None:
                VAR.set(set_to)
        return cb

    VAR.set("a")
    c.send(Message("T", b"1"), record(1, set_to="set by callback 1"))       # C
    c.send(Message("T", b"2"), record(2))
    p._alone(p._preparer.prepare(Message("T", b"3")), asyncio.Future(loop=p._loop), record(3), None, None, None,
             None)                                       # the Python path: b sealed, a request of its own
    alone = p._ready[-1]
    assert list(p._ready) == [b, alone]
    snap = b.callbacks[0][2]
    assert b.callbacks[1][2] is snap and alone.callbacks[0][2] is snap and snapshot_context() is snap
    VAR.set("b")
    after = snapshot_context()
    assert after is not snap and after[VAR] == "b"
    _run_callbacks(p._loop, b.callbacks + alone.callbacks)
    assert seen == [(1, "a"), (2, "a"), (3, "a")]        # callback 1's set stayed in its own copy
    assert VAR.get() == "b"                              # nothing ran in the caller's context
    assert snap.run(VAR.get) == "a"                      # the snapshot was never entered or changed


def test_add_puts_a_prepared_message_into_its_ordered_queues_open_batch(setup):
    from rmq.client.message import MessageQueue

    p, c = setup
    mq = MessageQueue("T", "broker-a", 3)
    ordered = p._open_batch(("T", mq), None, None)
    plain = p._open_batch(("T", None), None, None)
    prep = p._preparer.prepare(Message("T", b"k"))
    fut = c.add(prep, None, mq)
    assert ordered.futures == [fut] and ordered.preps == [prep] and not plain.preps and p._pending == 1
    other = MessageQueue("T", "broker-a", 4)               # no open batch for that queue: nothing done
    assert c.add(p._preparer.prepare(Message("T", b"k")), None, other) is None and p._pending == 1


def test_send_keyed_adds_to_its_keys_queue_while_the_route_and_the_keys_queue_are_known():
    from rmq.client.message import MessageQueue
    from rmq.common.message_const import PROPERTY_SHARDING_KEY

    class Info:
        ok = True

    loop = asyncio.new_event_loop()
    try:
        p = Producer("127.0.0.1:9876")
        p._loop = loop
        info, pumped = Info(), []
        p.route_cache.publish_info = lambda topic: info if topic == "T" else None
        p._pump = pumped.append
        mq = MessageQueue("T", "broker-a", 2)
        p._shards._queues[("T", str, "k1")] = (info, mq)
        c = AioAppend(p, p._preparer, asyncio.Future, loop)
        b = p._open_batch(("T", mq), None, None)
        m = Message("T", b"x")
        fut = c.send_keyed(m, None, "k1")
        assert type(fut) is asyncio.Future and b.futures == [fut] and p._pending == 1
        assert m.properties[PROPERTY_SHARDING_KEY] == "k1" and pumped == [("T", mq)]
        # not known (another key, another route object, a topic without a route): the prepared
        # message back, its property set, nothing added
        p._shards._queues[("T", str, "k3")] = (Info(), mq)
        for topic, key in (("T", "k2"), ("T", "k3"), ("U", "k1")):
            other = Message(topic, b"y")
            out = c.send_keyed(other, None, key)
            assert type(out) is PreparedMessage and other.properties[PROPERTY_SHARDING_KEY] == key
        p._inflight = p._max_in_flight                    # no room in flight: added, not pumped
        assert type(c.send_keyed(Message("T", b"z"), None, "k1")) is asyncio.Future
        assert len(b.futures) == 2 and pumped == [("T", mq)] and p._pending == 2
    finally:
        loop.close()


def test_run_callbacks_reports_a_raising_callback_to_the_loop_and_runs_the_others():
    from rmq._core.client_msg import pending_callback, run_callbacks, snapshot_context

    loop = asyncio.new_event_loop()
    try:
        reported, seen = [], []
        loop.set_exception_handler(lambda lp, ctx: reported.append(ctx))
        futs = [asyncio.Future(loop=loop) for _ in range(3)]
        VAR.set("sent")
        snap = snapshot_context()

        def bad(f):
            VAR.set("changed")
            raise ValueError("boom")

        entries = [pending_callback(futs[0], bad, snap),
                   pending_callback(futs[1], lambda f: seen.append(VAR.get()), snap),
                   pending_callback(futs[2], lambda f: seen.append(f), snap)]
        VAR.set("later")
        run_callbacks(loop, entries)
        assert seen == ["sent", futs[2]] and VAR.get() == "later"
        (rep,) = reported
        assert isinstance(rep["exception"], ValueError) and rep["future"] is futs[0]
        assert "Exception in send_async callback" in rep["message"]
        assert all(gc.is_tracked(f) for f in futs)

        def interrupt(f):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_callbacks(loop, [pending_callback(asyncio.Future(loop=loop), interrupt, snap)])
        assert VAR.get() == "later"                      # the context was left on the way out
    finally:
        loop.close()


def test_the_context_layout_probe_holds_on_this_cpython_and_without_it_every_call_copies():
    """The snapshot sharing reads CPython's Context struct (probed at import); a CPython where the
    probe fails copies the context every call.  Both ways, a callback sees the values of its call."""
    from rmq._core.client_msg import _probe_context_layout, _use_snapshots, snapshot_context

    assert _probe_context_layout()                       # a new CPython layout shows up here
    prev = _use_snapshots(False)
    try:
        VAR.set("one")
        a, b = snapshot_context(), snapshot_context()
        VAR.set("two")
        c = snapshot_context()
        assert a is not b and a[VAR] == b[VAR] == "one" and c[VAR] == "two"
    finally:
        _use_snapshots(prev)
    VAR.set("three")
    d, e = snapshot_context(), snapshot_context()
    assert d is e and d[VAR] == "three"


def test_a_layout_is_worked_out_per_class_so_alternating_classes_both_keep_theirs():
    """rmq._core.client_msg._Layouts: one layout per class asked about, not one remembered class
    (a SendFuture and another future completing in turn each keep their path)."""
    from rmq._core.client_msg import finish_future, new_send_future
    from rmq.client.futures import SendFuture

    class Sub(SendFuture):                                # its slots are SendFuture's: no layout of its own
        __slots__ = ()

    seen = []
    for i in range(4):
        c = new_send_future(SendFuture, seen.append)     # the slot path
        p = new_send_future(Sub, seen.append)            # the class's __init__, then the attribute path
        assert type(p) is Sub
        finish_future(c, i, None)
        finish_future(p, -i, None)
        assert c.result() == i and p.result() == -i
    assert len(seen) == 8
