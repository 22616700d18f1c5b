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
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, RUNNING

from rmq._core.client_msg import finish_future

_CREATE = threading.Lock()


class SendFuture(Future):
    """A RUNNING ``concurrent.futures.Future`` whose condition is created on first need."""

    def __init__(self, callback: Optional[Callable[[Future], Any]] = None) -> None:
        # no super().__init__(): it builds the Condition.  ``callback`` is a done-callback added
        # before any other thread can see the future (no lock needed).  Every object the cyclic
        # GC tracks costs the sending thread (the collections run in it): the waiters' and the
        # callbacks' lists exist only once something asks for them.
        self._state = RUNNING
        self._result = None
        self._exception = None
        self._cb = callback

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        c = self.__dict__.get("_cond")
        if c is None:
            with _CREATE:
                c = self.__dict__.get("_cond")
                if c is None:
                    c = self.__dict__["_cond"] = threading.Condition()
        return c

    # Future's methods reach these under the condition (add_done_callback, wait, as_completed),
    # or after FINISHED (the completion's step 3): never two threads creating one at once
    @property
    def _waiters(self) -> list:  # type: ignore[override]
        w = self.__dict__.get("_w")
        if w is None:
            w = self.__dict__["_w"] = []
        return w

    @property
    def _done_callbacks(self) -> list:  # type: ignore[override]
        cbs = self.__dict__.get("_cbs")
        if cbs is None:
            cb = self._cb
            cbs = self.__dict__["_cbs"] = [cb] if cb is not None else []
            self._cb = None
        return cbs

    def _finish(self, result, exception) -> None:
        finish_future(self, result, exception)     # steps (1)-(3) above, in C (rmq._core.client_msg)

    # FINISHED is final and _result/_exception are set before it: a finished future answers
    # without its condition (callbacks typically ask for result() / exception())
    # it starts RUNNING, and Future.cancel() refuses a RUNNING future: never CANCELLED, and the
    # state questions need no condition (a callback asking ``cancelled()`` used to build one per
    # future: half of Producer.send_async's rate, bench/results/client.md stop 35)
    def done(self) -> bool:
        return self._state == FINISHED

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._state == RUNNING

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


__all__ = ["SendFuture"]
