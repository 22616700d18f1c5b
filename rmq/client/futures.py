"""A ``concurrent.futures.Future`` that costs less to create and complete.

``Future()`` builds a ``threading.Condition`` (a Python-level object around an RLock) for
every instance, and ``set_running_or_notify_cancel`` takes it once more: about 4 µs of the
~15 µs a batched ``Producer.send_async`` spent per message (py-spy, 100 B bodies).  Most
send futures are never waited on (a callback or ``flush()`` is how streaming producers
learn outcomes), so :class:`SendFuture` creates its condition only when something needs
one (``result()``, ``exception()``, ``wait()``/``as_completed()``, ``cancel()``) and
completes without it otherwise.

Correctness without a lock on the completing path (the GIL orders these steps): a
completion (1) publishes FINISHED, then (2) looks for a condition and, if one exists,
notifies its waiters under it, then (3) runs the callbacks.  A waiter (or a late
``add_done_callback``) creates the condition first (under ``_CREATE``) and then checks the
state under it: if it was created after (2) looked, the state it sees is already FINISHED;
if before, (2) takes the condition, so it either waits (and is notified) or has appended
its callback before (3).  Callbacks run exactly once, in the completing thread, or at once
in the adding thread if the future is already done, as the standard class does.  A
completion that finds a condition already there takes the standard path.  The future
starts RUNNING (it cannot be cancelled).

No ``__dict__``: every name the future's code stores is a slot (``__slots__``), read and
written as an attribute, never through ``self.__dict__``.  A future is touched by two threads
(the caller's, the producer's I/O thread), and on CPython 3.11 two threads materialising the
same object's ``__dict__`` can each make one: the dict's allocation may run the cyclic GC,
whose finalizers run Python code and so may switch threads before the object records its
dict.  The two dicts then share one values array, which the first to go frees under the other:
a later collection crashed on it (``dict_traverse`` reading freed memory; bench/results/client.md,
stop 45).  Reading ``__dict__`` is one way to materialise it; storing a name is another once the
class's shared keys table stops growing (3.11 takes one slot of its room per instance made, so
after some dozens of futures a name no instance had stored yet makes a dict wherever it is
first stored: stop 46).  Slots are neither: they live in the object itself.

Not tracked by the cyclic GC while pending: a stream of ``send_async`` calls makes futures faster
than they complete, and CPython's collections (one gen-0 pass per 700 new objects, survivors
carried into gens 1 and 2) walked every one in flight: 0.65 s of GC in 600,000 ``send_async``
calls, ~1 µs a message (bench/results/client.md, stop 46).  A pending future is held by its
producer, so it cannot be cyclic garbage; :func:`rmq._core.client_msg.finish_future` tracks it
again before it publishes the outcome or runs a callback, so a done future in a cycle (a
callback that holds it) is collected as any other object.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, RUNNING

from rmq._core.client_msg import finish_future, untrack_pending
from rmq.client.message import ColumnSendResults
from rmq.errors import SendManyError

_CREATE = threading.Lock()


class SendFuture(Future):
    """A RUNNING ``concurrent.futures.Future`` whose condition is created on first need."""

    # slots, not instance-dict entries: every name the future's two threads store (module
    # docstring, "No __dict__"); ``_cond``: the Condition, ``_w``: the waiters' list, ``_cbs``:
    # the callbacks' list, each made on first need
    __slots__ = ("_state", "_result", "_exception", "_cb", "_cond", "_w", "_cbs")

    def __init__(self, callback: Optional[Callable[[Future], Any]] = None) -> None:
        # no super().__init__(): it builds the Condition.  ``callback`` is a done-callback added
        # before any other thread can see the future (no lock needed).  Every object the cyclic
        # GC tracks costs the sending thread (the collections run in it): the waiters' and the
        # callbacks' lists exist only once something asks for them.
        self._state = RUNNING
        self._result = self._exception = self._cond = self._w = self._cbs = None
        self._cb = callback
        untrack_pending(self)      # out of the cyclic GC until it completes (module docstring)

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        c = self._cond
        if c is None:
            with _CREATE:
                c = self._cond
                if c is None:
                    c = self._cond = threading.Condition()
        return c

    # Future's methods reach these under the condition (add_done_callback, wait, as_completed),
    # or after FINISHED (the completion's step 3): never two threads creating one at once
    @property
    def _waiters(self) -> list:  # type: ignore[override]
        w = self._w
        if w is None:
            w = self._w = []
        return w

    @property
    def _done_callbacks(self) -> list:  # type: ignore[override]
        cbs = self._cbs
        if cbs is None:
            cb = self._cb
            cbs = self._cbs = [cb] if cb is not None else []
            self._cb = None
        return cbs

    def _finish(self, result, exception) -> None:
        finish_future(self, result, exception)     # steps (1)-(3) above, in C (rmq._core.client_msg)

    # it starts RUNNING, and Future.cancel() refuses a RUNNING future: never CANCELLED, and the
    # state questions need no condition (a callback asking ``cancelled()`` used to build one per
    # future: half of Producer.send_async's rate, bench/results/client.md stop 35)
    def done(self) -> bool:
        return self._state == FINISHED

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._state == RUNNING

    # FINISHED is final and _result/_exception are set before it: a finished future answers
    # without its condition (callbacks typically ask for result() / exception())
    def result(self, timeout=None):
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def exception(self, timeout=None):
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def set_result(self, result) -> None:
        self._finish(result, None)

    def set_exception(self, exception) -> None:
        self._finish(None, exception)


class _Tally:
    """How many of ``n`` messages still lack an outcome, how many failed, the first failure."""

    __slots__ = ("left", "failed", "first")

    def __init__(self, n: int) -> None:
        self.left = n
        self.failed = 0
        self.first: Optional[BaseException] = None

    def _counted(self, n: int, exc: Optional[BaseException]) -> bool:
        """``n`` more outcomes (failures with ``exc`` when not None); True at the last."""
        if exc is not None:
            self.failed += n
            if self.first is None:
                self.first = exc
        self.left -= n
        return self.left == 0


class ManyOutcomes(_Tally):
    """The outcomes of ``n`` messages of one ``send_async_many`` call, gathered part by part
    (I/O-free: the thread and asyncio producers both use it; the caller serialises calls).
    ``fill`` returns True when the last outcome arrives; ``outcome()`` then gives ``(list of
    SendResult, None)``, or ``(None, SendManyError)`` when any message failed."""

    __slots__ = ("slots",)

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.slots: list = [None] * n

    def fill(self, positions: Sequence[int], results: Optional[Sequence], exc: Optional[BaseException]) -> bool:
        """Message ``positions[j]`` gets ``results[j]``, or each gets ``exc`` (``results`` None).
        ``positions`` ascend (a part lists its messages in the call's order: ``many_parts``), so
        when they span exactly ``len(positions)`` messages they are a run, filled as one slice."""
        slots = self.slots
        if results is not None:
            n = len(positions)
            first = positions[0] if n else 0
            if n and positions[-1] - first == n - 1 and n == len(results):
                slots[first:first + n] = results     # a run of the call's messages (positions ascend)
            else:
                for i, r in zip(positions, results):
                    slots[i] = r
            return self._counted(n, None)
        for i in positions:
            slots[i] = exc
        return self._counted(len(positions), exc)

    def outcome(self) -> tuple:
        if not self.failed:
            return self.slots, None
        err = SendManyError(f"{self.failed} of {len(self.slots)} message(s) failed; first: {self.first}",
                            self.slots, self.failed)
        err.__cause__ = self.first
        return None, err


class ManyFuture(SendFuture):
    """The future of one ``Producer.send_async_many`` call over ``n`` messages: its result is the
    list of their ``SendResult`` objects in the order given, once every message has its outcome; if any
    failed, its exception is a :class:`rmq.errors.SendManyError` whose ``results`` hold each
    message's result or exception.  The producer hands the messages over in parts (one per
    request-sized batch), each completed by :meth:`part`'s sink: no object per message."""

    __slots__ = ("_outcomes", "_lock")    # ColumnsFuture's too (SendFuture's "No __dict__")

    def __init__(self, n: int, callback: Optional[Callable[[Future], Any]] = None) -> None:
        super().__init__(callback)
        self._outcomes = ManyOutcomes(n)
        self._lock = threading.Lock()      # parts complete in the I/O thread, or in a caller's
        if n == 0:                         # (an I/O thread that died); one lock per part, not per message
            self._finish([], None)

    def part(self, positions: Sequence[int]) -> "ManyPart":
        """The sink of the messages at ``positions`` (in the order they are sent)."""
        return ManyPart(self, positions)

    def _fill(self, *outcome) -> None:
        """Its outcomes' ``fill(*outcome)``; the future finishes with the last."""
        with self._lock:
            last = self._outcomes.fill(*outcome)
        if last:
            self._finish(*self._outcomes.outcome())


class ManyPart:
    """What the producer completes for one part of a :class:`ManyFuture` (its ``future``):
    ``set_result(list of SendResult)`` in the part's order, or ``set_exception(exc)`` for all."""

    __slots__ = ("many", "positions")

    def __init__(self, many: ManyFuture, positions: Sequence[int]) -> None:
        self.many = many
        self.positions = positions

    def set_result(self, results: list) -> None:
        self.many._fill(self.positions, results, None)

    def set_exception(self, exc: BaseException) -> None:
        self.many._fill(self.positions, None, exc)


class ColumnOutcomes(_Tally):
    """The outcomes of the ``n`` rows of one ``send_async_columns`` call, one record per request
    (I/O-free: the thread and asyncio producers both use it; the caller serialises calls).
    ``fill`` returns True when the last row has its outcome; ``outcome()`` then gives
    ``(ColumnSendResults, None)``, or ``(None, SendManyError)`` (its ``results`` the same
    ColumnSendResults) when any row failed."""

    __slots__ = ("n", "parts")

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.n = n
        self.parts: list = []

    def fill(self, positions: Sequence[int], uniq: bytes, record: Optional[tuple],
             exc: Optional[BaseException]) -> bool:
        """Rows ``positions`` (UNIQ_KEYs ``uniq``) stored as ``record`` = (status, MessageQueue,
        base queue offset, [offset msg id per row]), or each failed with ``exc`` (``record`` None)."""
        self.parts.append((positions, uniq, record, exc))
        return self._counted(len(positions), exc if record is None else None)

    def outcome(self) -> tuple:
        results = ColumnSendResults(self.n, self.parts, self.failed)
        if not self.failed:
            return results, None
        err = SendManyError(f"{self.failed} of {self.n} row(s) failed; first: {self.first}", results, self.failed)
        err.__cause__ = self.first
        return None, err


class ColumnsFuture(ManyFuture):
    """The future of one ``Producer.send_async_columns`` call: its result is a
    :class:`~rmq.client.message.ColumnSendResults` once every row has its outcome; if any
    failed, its exception is a :class:`rmq.errors.SendManyError` whose ``results`` is that
    ColumnSendResults.  Completed one request at a time through :meth:`part`'s sinks."""

    def __init__(self, n: int, callback: Optional[Callable[[Future], Any]] = None) -> None:
        SendFuture.__init__(self, callback)
        self._outcomes = ColumnOutcomes(n)
        self._lock = threading.Lock()
        if n == 0:
            self._finish(*self._outcomes.outcome())

    def part(self, positions: Sequence[int], uniq: bytes) -> "ColumnsPart":
        """The sink of the rows at ``positions`` (in the order sent), UNIQ_KEYs ``uniq``."""
        return ColumnsPart(self, positions, uniq)


class ColumnsPart:
    """What the producer completes for one request of a :class:`ColumnsFuture`:
    ``set_result((status, MessageQueue, base queue offset, [offset msg id per row]))`` or
    ``set_exception(exc)`` for all its rows."""

    __slots__ = ("many", "positions", "uniq")

    def __init__(self, many: ColumnsFuture, positions: Sequence[int], uniq: bytes) -> None:
        self.many = many
        self.positions = positions
        self.uniq = uniq

    def set_result(self, record: tuple) -> None:
        self.many._fill(self.positions, self.uniq, record, None)

    def set_exception(self, exc: BaseException) -> None:
        self.many._fill(self.positions, self.uniq, None, exc)


__all__ = ["SendFuture", "ManyFuture", "ManyOutcomes", "ManyPart", "ColumnOutcomes", "ColumnsFuture", "ColumnsPart"]
