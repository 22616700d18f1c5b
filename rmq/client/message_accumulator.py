"""The thread producer's accumulator (Kafka's RecordAccumulator role): what callers hand over
(:class:`Pending`: one message, a user batch, a caller-side batch of ``send_async`` messages, a
``send_async_many`` or ``send_async_columns`` part), the requests made of them (:class:`Request`,
whose attempts follow :class:`rmq.client.send_attempts.SendAttempts`), the per-queue batches being
filled (:class:`Accumulator`), how a batch a broker refused as too large is split, and the
ordered queues' turns (:class:`QueueTurns`, shared with :class:`rmq.aio.Producer`).

State: each object's own; no sockets, threads or clocks (times come in).  Thread: the producer's
I/O thread (:mod:`rmq.client.sender`), and callers under its lock for a caller-side batch.
"""
from __future__ import annotations

import collections
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

from rmq._core.client_msg import RowsPart
from rmq.client.futures import ColumnsPart, ManyPart
from rmq.client.message import MessageQueue
from rmq.client.producer_request import ProducerOptions, split_by_size
from rmq.client.send_attempts import SendAttempts

SYNC, ASYNC, ONEWAY = 0, 1, 2                # how a hand-over was sent: its caller waits, gets a future, or neither


class QueueTurns:
    """Ordered sends' rule, for the thread and asyncio producers: at most ``limit`` requests out per
    queue (``max_in_flight_per_queue``, Kafka's ``max.in.flight.requests.per.connection``), the
    next ones held in order; when a turn passes, the held requests behind the next one that may
    share its SEND_BATCH_MESSAGE are joined to it, up to ``cap`` bytes (the producers pass
    :func:`rmq.client.producer_request.many_request_size`: 256 KiB with the default ``batch_size``).

    No I/O: the producer calls :meth:`take` before it sends an ordered request and :meth:`end`
    when one has its outcome.  Everything that moves a turn is here: a request's ``queue_turn``
    attribute says whether it holds one.  ``held`` counts the requests that had to wait.  The
    producer gives the join its request type's rules: ``mergeable(req)``, ``size_of(req)`` (bytes)
    and ``combine(first, joined) -> req``; without ``combine`` nothing is joined."""

    __slots__ = ("limit", "held", "_turns", "cap", "mergeable", "size_of", "combine")

    def __init__(self, limit: int, cap: int = 0, mergeable: Optional[Callable[[Any], bool]] = None,
                 size_of: Optional[Callable[[Any], int]] = None,
                 combine: Optional[Callable[[Any, list], Any]] = None):
        self.limit = limit
        self.held = 0
        self._turns: dict = {}          # MessageQueue -> [requests out, deque of the requests held]
        self.cap, self.mergeable, self.size_of, self.combine = cap, mergeable, size_of, combine

    def __bool__(self) -> bool:
        return bool(self._turns)

    def busy(self, queue) -> bool:
        """Whether a request for ``queue`` would be held now (its batch may keep filling).  The same
        rule is read in C by ``rmq._core.client_msg.AioAppend.send_keyed`` (from ``_turns`` and
        ``limit``): change both together."""
        t = self._turns.get(queue)
        return t is not None and (t[0] >= self.limit or bool(t[1]))

    def take(self, queue, req) -> bool:
        """True: ``req`` may go now (it holds one of ``queue``'s turns); False: it is held."""
        t = self._turns.get(queue)
        if t is None:
            self._turns[queue] = [1, collections.deque()]
        elif t[0] >= self.limit or t[1]:
            t[1].append(req)
            self.held += 1
            return False
        else:
            t[0] += 1
        req.queue_turn = True
        return True

    def end(self, queue, req):
        """``req`` of ``queue`` has its outcome: the held request that takes its turn (the ones behind
        it joined to it, :meth:`_join`), or None."""
        req.queue_turn = False
        t = self._turns.get(queue)
        if t is None:
            return None                 # cleared (the producer is closing)
        t[0] -= 1
        held = t[1]
        if held and t[0] < self.limit:
            nxt = self._join(held.popleft(), held)
            nxt.queue_turn = True
            t[0] += 1
            return nxt
        if t[0] <= 0 and not held:
            del self._turns[queue]
        return None

    def hold_first(self, queue, reqs: list) -> None:
        """``reqs`` go next for ``queue``, in order, ahead of everything held there: the parts of a
        request split while it held the queue's turn (the turn stays with its first part)."""
        t = self._turns.get(queue)
        if t is None or not reqs:
            return
        t[1].extendleft(reversed(reqs))
        self.held += len(reqs)

    def _join(self, first, held: collections.deque):
        if self.combine is None or not held or not self.mergeable(first):
            return first
        size = self.size_of(first)
        joined: list = []
        while held and self.mergeable(held[0]):
            more = self.size_of(held[0])
            if size + more > self.cap:
                break
            joined.append(held.popleft())
            size += more
        return self.combine(first, joined) if joined else first

    def clear(self) -> list:
        """Forget every turn; the requests that were held, in order (to fail them)."""
        out = [r for t in self._turns.values() for r in t[1]]
        self._turns.clear()
        return out


class Pending:
    """What one caller handed over: one message, or a user batch (one future, one merged result)."""

    __slots__ = ("preps", "future", "mode", "deadline", "attempt_timeout", "selector", "arg", "queue", "whole",
                 "started", "futures", "nbytes", "open_key", "rows")

    def __init__(self, preps: list, future: Future, mode: int, deadline: float, attempt_timeout: float,
                 selector=None, arg=None, queue: Optional[MessageQueue] = None, whole: bool = False,
                 started: Optional[float] = None):
        self.preps = preps
        self.future = future
        self.mode = mode
        self.deadline = deadline          # time.monotonic() seconds: the send fails after this
        self.attempt_timeout = attempt_timeout  # seconds one attempt waits for the broker
        self.selector = selector
        self.arg = arg
        self.queue = queue
        self.whole = whole
        self.started = time.monotonic() if started is None else started
        # a caller-side batch (Producer.send_async's common case): one future per message, filled
        # by callers under the sender's lock until the I/O thread seals it (Sender.open)
        self.futures: Optional[list] = None
        self.nbytes = 0
        self.open_key = None              # its key in Sender.open: the topic, or (topic, sharding key)
        self.rows: Optional[RowsPart] = None   # send_async_columns: ``preps`` is this part (encoded already)

    @property
    def topic(self) -> str:
        return self.rows.topic if self.rows is not None else self.preps[0].msg.topic


class Request(SendAttempts):
    """One request on the wire (a message, a user batch, or an accumulated batch); its attempts
    follow :class:`rmq.client.send_attempts.SendAttempts`."""

    __slots__ = ("items", "mode", "batch", "attempt_timeout", "opaque", "batch_body", "park_deadline", "preps",
                 "queue_turn", "split")

    def __init__(self, items: list, fixed: Optional[MessageQueue], opts: ProducerOptions):
        self.items = items
        first = items[0]
        self.mode = first.mode
        if first.rows is not None:        # a send_async_columns part: a request of its own
            self.preps = first.rows
            self.batch = True
        else:
            self.preps = [p for it in items for p in it.preps]
            self.batch = first.whole or len(self.preps) > 1
        if fixed is not None or self.mode == ONEWAY:
            max_attempts = 1
        elif self.mode == SYNC:
            max_attempts = 1 + opts.retry_times_when_send_failed
        else:
            max_attempts = 1 + opts.retry_times_when_send_async_failed
        SendAttempts.__init__(self, first.topic, len(self.preps), fixed, max_attempts,
                              min(it.started for it in items), min(it.deadline for it in items))
        self.attempt_timeout = min(it.attempt_timeout for it in items)
        self.opaque = 0
        self.batch_body: Optional[bytes] = first.rows.body if first.rows is not None else None
        self.park_deadline = 0.0
        self.queue_turn = False          # holds its fixed queue's turn (Sender._pump): ordered sends
        self.split = False               # a part of a batch the broker refused as too large: never joined


def mergeable(req: Request) -> bool:
    """Whether ``req`` may share a SEND_BATCH_MESSAGE with its neighbours: send_async messages that
    can be batched (not a user batch, delayed, compressed or transactional one), never attempted."""
    return req.attempt == 0 and not req.split and all(it.mode == ASYNC and not it.whole and it.rows is None and it.preps[0].batchable
                                    for it in req.items)


def pending_bytes(p: Pending) -> int:
    """Bytes of one caller's hand-over that is not a user batch: a caller-side batch or one message."""
    return p.nbytes if p.nbytes else p.preps[0].size     # nbytes: a caller-side batch, a send_async_many part


def request_bytes(req: Request) -> int:
    """Bytes of a mergeable request (:func:`mergeable`), item by item."""
    return sum(pending_bytes(it) for it in req.items)


def split_pending(it: Pending, limit: int) -> list:
    """``it`` as hand-overs of at most ``limit`` bytes each, in order, each completing its own
    messages' futures (a caller-side batch's futures, a send_async_many part's or a
    send_async_columns part's sink, cut to its messages); ``[it]`` when it fits or is one message."""
    if pending_bytes(it) <= limit or len(it.preps) < 2:
        return [it]
    if it.rows is not None:
        pieces = [(part, ColumnsPart(it.future.many, part.positions, part.uniq), None, part.nbytes)
                  for part in it.rows.split(limit)]
    else:
        sizes = [p.size for p in it.preps]
        pieces = []
        for a, b in split_by_size(sizes, limit):
            if it.futures is not None:
                sink, futures = None, it.futures[a:b]
            elif type(it.future) is ManyPart:
                sink, futures = ManyPart(it.future.many, it.future.positions[a:b]), None
            else:
                return [it]               # not a kind of hand-over that is split
            pieces.append((it.preps[a:b], sink, futures, sum(sizes[a:b])))
    out = []
    for preps, sink, futures, nbytes in pieces:
        p = Pending(preps, sink, it.mode, it.deadline, it.attempt_timeout, it.selector, it.arg, it.queue,
                     False, it.started)
        p.futures = futures
        p.nbytes = nbytes
        if it.rows is not None:
            p.rows = preps
        out.append(p)
    return out


class Accumulator:
    __slots__ = ("items", "nbytes", "created")

    def __init__(self, now: float):
        self.items: list = []
        self.nbytes = 0
        self.created = now
