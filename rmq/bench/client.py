"""``rmq bench client``: what the public client API gives a user (defaults, one Python thread),
beside Redis and the raw bench client measured in the same run (issue 17).

One embedded cluster (:class:`rmq.testing.Cluster`: nameserver, broker, reput, flush on loopback,
ASYNC_FLUSH, the geometry of :func:`rmq.bench.e2e.cluster_conf`, as ``rmq bench produce``'s own
groups); for each body size, every row runs in this process, one client at a time, with the
API's defaults (only ``consume_from_where=CONSUME_FROM_FIRST_OFFSET`` for the consumers, to read
what is already there):

``Producer.send_async``
    N ``Message(topic, body)`` built in the loop and handed over with a callback that counts
    outcomes; then ``flush()``; none may fail.  Timed: first call -> every future done.
``Producer.send_batch x1000``
    lists of 1000 ``Message`` built in the loop, one ``send_batch`` after the other.
``PushConsumer``
    a concurrent listener that only counts, a fresh group, reading the N messages already in a
    topic (filled untimed with ``send_batch``, dispatched before the row starts).  Timed:
    ``start()`` -> the N-th message counted (``first_msg_s``: when the first one came).
``PullConsumer.poll``
    the same N from the first offset: ``assign`` every queue, ``poll()`` until N are returned.
``PullConsumer.poll_arrow``
    as ``poll``, with ``poll_arrow()`` (one ``pyarrow.RecordBatch`` per call) until N rows.
``rmq.aio Producer.send_async``
    as ``Producer.send_async`` on an event loop: N ``await p.send_async(Message(topic, body),
    callback=cb)`` (the same client-side batching, in the loop; the call awaits only when
    ``max_pending_messages`` are unanswered), the callback counting outcomes; then
    ``await p.flush()``; none may fail.  Timed: first call -> every future's callback run.
``rmq.aio PushConsumer``
    as ``PushConsumer``, with a coroutine listener on an event loop.
``rmq.aio PullConsumer.poll`` / ``rmq.aio PullConsumer.poll_arrow``
    as ``PullConsumer.poll`` / ``poll_arrow``, awaited on an event loop.
``Producer.send_async_many x1000`` / ``rmq.aio Producer.send_async_many x1000``
    lists of 1000 ``Message`` built in the loop, each handed over with one
    ``send_async_many(msgs, callback)`` (one future per list, its callback counting the list's
    outcomes); then ``flush()``; none may fail.  Timed: first call -> every outcome counted.
``Producer.send_async_columns x1000`` / ``rmq.aio Producer.send_async_columns x1000``
    the same lists of 1000 bodies as columns (``send_async_columns(topic, bodies, callback)``:
    encoded in C, no ``Message`` / ``SendResult`` per row; the list of bodies is built in the loop
    as the other rows build their messages); counted and timed as ``send_async_many``.
``Producer.send_async sharding_key`` / ``rmq.aio Producer.send_async sharding_key``
    as the ``send_async`` rows, ordered: message ``i`` with sharding key ``i % 8`` (the
    producers' rule for ordered sends: one request out per queue, the next batch filling).

Each row: msgs/s, MB/s (bodies, 10^6 B), issue 17's target (MET / MISSED; ``None`` when there
is none at that size or its reference is missing), and ratios to references measured in the same
run on the same machine: Redis Streams (``redis-server`` with ``appendfsync everysec``, redis-py;
:func:`rmq.bench.peers.bench_redis`) pipelined XADD x1000 for produce rows and XREAD COUNT 1000
for consume rows, and the raw bench client (:mod:`rmq.bench.workers`, through
:class:`rmq.bench.runner.Group`: SEND_BATCH_MESSAGE of 1000 with 4 in flight, and pulls of 1000
with one in flight per queue, in spawned processes) on the same cluster.  A row that raises is a
row with ``error`` set; the run goes on.
"""
from __future__ import annotations

import functools
import gc
import itertools
import os
import shutil
import tempfile
import threading
import time
from typing import Optional

MB = 1e6
SIZES = (100, 1024)
MESSAGES = 200_000                 # at 100 B; larger bodies: half
BATCH = 1000                       # messages per send_batch (and the references' batch)
REDIS_SECONDS = 1.0                # the Redis reference's produce phase (XADD pipelines), per size
AIO_RATIO = 0.80                   # rmq.aio rows: >= 80 % of the thread-based row's figure
ORDERED_RATIO = 0.50               # ordered send_async (one request out per queue): >= 50 % of the unordered row
STALL_S = 60.0                     # a consumer row fails after this long without a new message

SEND_ASYNC = "Producer.send_async"
SEND_BATCH = f"Producer.send_batch x{BATCH}"
PUSH = "PushConsumer"
POLL = "PullConsumer.poll"
POLL_ARROW = "PullConsumer.poll_arrow"
AIO_SEND = "rmq.aio Producer.send_async"
AIO_PUSH = "rmq.aio PushConsumer"
AIO_POLL = "rmq.aio PullConsumer.poll"
AIO_POLL_ARROW = "rmq.aio PullConsumer.poll_arrow"
SEND_ORDERED = "Producer.send_async sharding_key"
AIO_SEND_ORDERED = "rmq.aio Producer.send_async sharding_key"
SEND_MANY = f"Producer.send_async_many x{BATCH}"
AIO_SEND_MANY = f"rmq.aio Producer.send_async_many x{BATCH}"
SEND_COLUMNS = f"Producer.send_async_columns x{BATCH}"
AIO_SEND_COLUMNS = f"rmq.aio Producer.send_async_columns x{BATCH}"
ORDERED_KEYS = 8                   # the ordered rows' sharding keys (message i: key i % 8)
ROWS = (SEND_ASYNC, SEND_BATCH, PUSH, POLL, POLL_ARROW, AIO_SEND, AIO_PUSH, AIO_POLL, AIO_POLL_ARROW, SEND_ORDERED,
        AIO_SEND_ORDERED, SEND_MANY, AIO_SEND_MANY, SEND_COLUMNS, AIO_SEND_COLUMNS)
KIND = {SEND_COLUMNS: "produce", AIO_SEND_COLUMNS: "produce", SEND_ASYNC: "produce", SEND_BATCH: "produce", AIO_SEND: "produce", SEND_ORDERED: "produce",
        AIO_SEND_ORDERED: "produce", SEND_MANY: "produce", AIO_SEND_MANY: "produce",
        PUSH: "consume", POLL: "consume", POLL_ARROW: "consume", AIO_PUSH: "consume", AIO_POLL: "consume",
        AIO_POLL_ARROW: "consume"}
TOPIC_OF = {SEND_ASYNC: "send_async", SEND_BATCH: "send_batch", AIO_SEND: "aio_send",   # produce rows' topics
            SEND_ORDERED: "send_ordered", AIO_SEND_ORDERED: "aio_send_ordered", SEND_MANY: "send_many",
            AIO_SEND_MANY: "aio_send_many", SEND_COLUMNS: "send_columns", AIO_SEND_COLUMNS: "aio_send_columns"}
AIO_OF = {AIO_SEND: SEND_ASYNC, AIO_PUSH: PUSH, AIO_POLL: POLL, AIO_POLL_ARROW: POLL_ARROW,  # aio row -> its thread row
          AIO_SEND_ORDERED: SEND_ORDERED, AIO_SEND_MANY: SEND_MANY, AIO_SEND_COLUMNS: SEND_COLUMNS}
# row -> (the row of the same run it is held to, the share of that row's figure it must reach)
HELD_TO = {**{row: (base, AIO_RATIO) for row, base in AIO_OF.items()}, SEND_ORDERED: (SEND_ASYNC, ORDERED_RATIO)}

# issue 17: (row, body size) -> msgs/s floor; and (row, body size) -> floor as a multiple of Redis
# (send_async_many and send_async_columns are the "produce then flush" paths: held to send_async's targets)
TARGETS = {(SEND_ASYNC, 100): 1_000_000, (SEND_ASYNC, 1024): 500_000, (SEND_BATCH, 100): 1_500_000,
           (SEND_MANY, 100): 1_000_000, (SEND_MANY, 1024): 500_000,
           (SEND_COLUMNS, 100): 1_000_000, (SEND_COLUMNS, 1024): 500_000,
           (PUSH, 100): 1_000_000, (POLL, 100): 2_000_000, (POLL_ARROW, 100): 3_000_000}
REDIS_TARGETS = {(SEND_BATCH, 100): 8.0, (SEND_BATCH, 1024): 5.0}
REF_NAMES = {("redis", "produce"): f"Redis XADD pipeline x{BATCH}", ("redis", "consume"): f"Redis XREAD COUNT {BATCH}",
             ("raw", "produce"): f"raw client SEND_BATCH x{BATCH}, 4 in flight",
             ("raw", "consume"): f"raw client PULL x{BATCH}, 1 per queue",
             ("floor", "produce"): "Python floor of send_async, no I/O",
             ("floor", "consume"): "Python floor of PushConsumer, no I/O"}
REFS = ("redis", "raw", "floor")
# rows held to the Python floor of their per-message calls (rmq.bench.floor): one Message, future
# and callback per message; one listener call per message
FLOOR_ROWS = frozenset((SEND_ASYNC, AIO_SEND, SEND_ORDERED, AIO_SEND_ORDERED, PUSH, AIO_PUSH))


def n_for(messages: int, size: int) -> int:
    """Messages of a row: ``messages`` for bodies up to 100 B, half for larger ones."""
    return max(1, messages if size <= 100 else messages // 2)


def body_of(size: int) -> bytes:
    return bytes((i * 131 + 7) & 0xFF for i in range(size))


def _timeout_s(n: int) -> float:
    return 120.0 + n / 1000.0


# -- rows ---------------------------------------------------------------------------------------
def send_async(namesrv: str, topic: str, size: int, n: int, ordered: bool = False) -> dict:
    from rmq import Message, Producer
    body = body_of(size)
    cb = _Outcomes(n, threading.Event())
    keys = [f"key-{k}" for k in range(ORDERED_KEYS)]

    with Producer(namesrv, group="bench-client-pg") as p:
        p.send(Message(topic, b"warm-up"))              # untimed: the topic, its route, the connection
        if ordered:
            _until_route(lambda: p.fetch_publish_message_queues(topic))   # ordered sends need it
        t0 = time.perf_counter()
        if ordered:
            for i in range(n):
                p.send_async(Message(topic, body), callback=cb, sharding_key=keys[i % ORDERED_KEYS])
        else:
            for _ in range(n):
                p.send_async(Message(topic, body), callback=cb)
        left = p.flush()
        if not cb.done.wait(_timeout_s(n)):
            raise TimeoutError(f"{cb.missing:,} futures not done ({left:,} unanswered)")
        el = time.perf_counter() - t0
    return {"msgs": cb.checked(), "seconds": el}


def _many_call(topic: str, body: bytes, columns: bool):
    """``call(p, k, cb)``: hand ``k`` messages to producer ``p`` in one call with callback ``cb``:
    a list of ``Message`` to ``send_async_many``, or a list of bodies to ``send_async_columns``
    (built in the loop either way; the aio producer's returns an awaitable)."""
    from rmq import Message
    if columns:
        return lambda p, k, cb: p.send_async_columns(topic, [body] * k, cb)
    return lambda p, k, cb: p.send_async_many([Message(topic, body) for _ in range(k)], cb)


def send_many(namesrv: str, topic: str, size: int, n: int, columns: bool = False) -> dict:
    from rmq import Message, Producer
    call = _many_call(topic, body_of(size), columns)
    cb = _ManyOutcomes(n, threading.Event())
    with Producer(namesrv, group="bench-client-pg") as p:
        p.send(Message(topic, b"warm-up"))
        t0 = time.perf_counter()
        for s in range(0, n, BATCH):
            call(p, min(BATCH, n - s), cb)
        left = p.flush()
        if not cb.done.wait(_timeout_s(n)):
            raise TimeoutError(f"{cb.missing:,} outcomes missing ({left:,} unanswered)")
        el = time.perf_counter() - t0
    return {"msgs": cb.checked(), "seconds": el}


def _until_route(fetch, timeout_s: float = 30.0):
    """``fetch()`` (a topic's queues from the NameServer) until it succeeds: an auto-created
    topic's route is registered by the broker shortly after its first message."""
    from rmq.errors import MQClientError
    end = time.monotonic() + timeout_s
    while True:
        try:
            return fetch()
        except MQClientError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.05)


def _counted(seq: "itertools.count") -> int:
    """How many values ``seq`` (an ``itertools.count(1)``) gave so far, without taking one: its
    repr is ``count(next value)``.  The bench's counters count with ``next()`` because it is
    atomic under the GIL (no lock per message in a callback or listener)."""
    r = repr(seq)
    return int(r[r.index("(") + 1:-1]) - 1


class _Tally:
    """What the send rows' callbacks share: ``n`` outcomes awaited, ``done`` (an Event of either
    kind) set when they are in, the failures and the first error, :meth:`checked`.  Subclasses
    count the outcomes (``ok``, ``missing``)."""

    ok: int

    def __init__(self, n: int, done) -> None:
        self.n, self.done = n, done
        self.failed = 0
        self.first_error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def checked(self) -> int:
        """The sends that succeeded; raises RuntimeError when any failed."""
        if self.failed:
            raise RuntimeError(f"{self.failed:,} of {self.n:,} sends failed, first: {self.first_error!r}")
        return self.ok


class _Outcomes(_Tally):
    """A send callback counting ``n`` outcomes (thread or event loop).  The rows measure the
    producer, not this callback: an outcome costs an ``exception()`` and a ``next()`` of an
    ``itertools.count`` (atomic under the GIL), the lock only for a failure (0.45 -> ~0.15 us a
    message, stop 44)."""

    def __init__(self, n: int, done) -> None:
        super().__init__(n, done)
        self._seen = itertools.count(1)

    @property
    def seen(self) -> int:
        """Outcomes so far."""
        return _counted(self._seen)

    @property
    def ok(self) -> int:  # type: ignore[override]
        return self.seen - self.failed

    def __call__(self, fut) -> None:
        try:
            exc = fut.exception()
        except BaseException as e:  # noqa: BLE001 - a cancelled asyncio future raises CancelledError
            exc = e
        if exc is not None:
            with self._lock:
                self.failed += 1
                self.first_error = self.first_error or exc
        if next(self._seen) == self.n:
            self.done.set()

    @property
    def missing(self) -> int:
        return self.n - self.seen


class _ManyOutcomes(_Tally):
    """A send_async_many callback: counts a whole list's outcomes per call (an error that is not
    a SendManyError ends the wait at once: the row fails)."""

    def __init__(self, n: int, done) -> None:
        super().__init__(n, done)
        self.ok = 0

    def __call__(self, fut) -> None:
        from rmq.errors import SendManyError
        exc = fut.exception()
        with self._lock:
            if exc is None:
                self.ok += len(fut.result())
            else:
                self.first_error = self.first_error or exc
                if isinstance(exc, SendManyError):
                    self.failed += exc.failed
                    self.ok += len(exc.results) - exc.failed
                else:
                    self.failed += 1
                    self.done.set()
            if self.ok + self.failed >= self.n:
                self.done.set()

    @property
    def missing(self) -> int:
        return self.n - self.ok - self.failed


def send_batch(namesrv: str, topic: str, size: int, n: int) -> dict:
    """``send_batch`` of BATCH messages, one call after the other, on a topic whose route the
    producer has from the NameServer (untimed: the warm-up send creates the topic, then its route
    is fetched).  A user's topic exists; an auto-created one is sent to on a provisional route
    for its first ~PROVISIONAL_REFRESH_MS, through the I/O thread, which would otherwise be a
    part of this row that differs from run to run."""
    from rmq import Message, Producer
    body = body_of(size)
    with Producer(namesrv, group="bench-client-pg") as p:
        p.send(Message(topic, b"warm-up"))
        _until_route(lambda: p.fetch_publish_message_queues(topic))
        sent = 0
        t0 = time.perf_counter()
        while sent < n:
            k = min(BATCH, n - sent)
            p.send_batch([Message(topic, body) for _ in range(k)])
            sent += k
        el = time.perf_counter() - t0
    return {"msgs": sent, "seconds": el}


def fill(namesrv: str, topic: str, size: int, n: int) -> None:
    """Untimed: ``n`` messages into a fresh ``topic`` with ``send_batch``, then wait until the
    ConsumeQueues list all of them (reput has dispatched them)."""
    from rmq import Message, Producer, PullConsumer
    body = body_of(size)
    with Producer(namesrv, group="bench-client-fill") as p:
        sent = 0
        while sent < n:
            k = min(BATCH, n - sent)
            p.send_batch([Message(topic, body) for _ in range(k)])
            sent += k
    with PullConsumer(namesrv, "bench-client-probe") as c:
        mqs = c.fetch_subscribe_message_queues(topic)
        deadline = time.monotonic() + 60
        while True:
            have = sum(c.max_offset(mq) for mq in mqs)
            if have >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fill of {topic}: {have:,} of {n:,} dispatched after 60 s")
            time.sleep(0.05)


_GROUP_SEQ = itertools.count()


def _group(row: str, size: int) -> str:
    """A consumer group of its own for each consumer row run (every round reads from the first offset)."""
    return f"bench-client-{row}-{size}-{os.getpid()}-{next(_GROUP_SEQ)}"


class _Counter:
    """Counts the messages a listener saw, at the least cost a listener can have: one ``next()``
    of an ``itertools.count`` per message (atomic under the GIL, so no lock however many
    consume threads call it) and a clock read only for the first and the n-th message.  The
    PushConsumer row measures the consumer, not its listener: a lock and a clock per call cost
    0.32 us of the ~1.6 us a message took in all (stop 44, ``timeit`` on this VM).
    ``wait(n)`` until n, failing when nothing new came for STALL_S."""

    def __init__(self, target: int):
        self.seq = itertools.count(1)
        self.target = target
        self.first: Optional[float] = None
        self.last = 0.0
        self.done = threading.Event()

    @property
    def got(self) -> int:
        """Messages counted so far."""
        return _counted(self.seq)

    def mark(self, seen: int, k: int) -> None:
        """The listener's rare path: ``seen`` messages counted, the last ``k`` in this call."""
        now = time.perf_counter()
        if seen <= k and self.first is None:
            self.first = now
        if seen >= self.target and not self.done.is_set():
            self.last = now
            self.done.set()

    def listener(self, ok):
        """A concurrent listener that counts and returns ``ok``."""
        nxt, target, mark = next, self.target, self.mark
        seq = self.seq

        def listener(msgs, ctx):
            for _ in msgs:
                seen = nxt(seq)
            if seen >= target or seen <= len(msgs):
                mark(seen, len(msgs))
            return ok
        return listener

    def wait(self, n: int, t0: float) -> None:
        seen, since = -1, time.monotonic()
        while not self.done.wait(0.2):
            got = self.got
            if got != seen:
                seen, since = got, time.monotonic()
            elif time.monotonic() - since > STALL_S:
                raise TimeoutError(f"consumed {got:,} of {n:,}, nothing new for {STALL_S:.0f} s")


def push(namesrv: str, topic: str, size: int, n: int) -> dict:
    from rmq import PushConsumer
    from rmq.client.consumer import ConsumeConcurrentlyStatus
    cnt = _Counter(n)
    c = PushConsumer(namesrv, _group("push", size), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(topic, "*")
    c.register_message_listener(cnt.listener(ConsumeConcurrentlyStatus.CONSUME_SUCCESS))
    t0 = time.perf_counter()
    c.start()
    try:
        cnt.wait(n, t0)
        el = cnt.last - t0
    finally:
        c.shutdown()
    return {"msgs": cnt.got, "seconds": el, "first_msg_s": round(cnt.first - t0, 4)}


class _Polled:
    """What the poll rows count: rows until ``n``, the first one's time, and the stall rule
    (TimeoutError after STALL_S without a row).  The clock starts when it is made."""

    def __init__(self, n: int) -> None:
        self.n, self.got, self.first = n, 0, None
        self.t0 = time.perf_counter()
        self.since = time.monotonic()

    def add(self, k: int) -> None:
        """One poll returned ``k`` rows."""
        if k:
            if self.first is None:
                self.first = time.perf_counter()
            self.got += k
            self.since = time.monotonic()
        elif time.monotonic() - self.since > STALL_S:
            raise TimeoutError(f"polled {self.got:,} of {self.n:,}, nothing new for {STALL_S:.0f} s")

    def result(self) -> dict:
        return {"msgs": self.got, "seconds": time.perf_counter() - self.t0,
                "first_msg_s": round(self.first - self.t0, 4)}


def poll(namesrv: str, topic: str, size: int, n: int, arrow: bool = False) -> dict:
    from rmq import PullConsumer
    if arrow:
        import rmq.arrow  # noqa: F401 - pyarrow's import, once per process, is not part of the rate
    with PullConsumer(namesrv, _group("poll-arrow" if arrow else "poll", size),
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.assign(c.fetch_subscribe_message_queues(topic))
        polled = _Polled(n)
        while polled.got < n:
            polled.add(c.poll_arrow().num_rows if arrow else len(c.poll()))
        res = polled.result()            # timed before the close (its commit)
    return res


def aio_send(namesrv: str, topic: str, size: int, n: int, ordered: bool = False) -> dict:
    import asyncio

    from rmq import Message
    from rmq.aio import Producer
    from rmq.errors import MQClientError
    body = body_of(size)
    keys = [f"key-{k}" for k in range(ORDERED_KEYS)]

    async def go() -> dict:
        cb = _Outcomes(n, asyncio.Event())
        async with Producer(namesrv, group="bench-client-aio-pg") as p:
            await p.send(Message(topic, b"warm-up"))     # untimed: the topic, its route, the connection
            if ordered:                                  # ordered sends need the route
                end = time.monotonic() + 30.0
                while True:
                    try:
                        await p.fetch_publish_message_queues(topic)
                        break
                    except MQClientError:
                        if time.monotonic() >= end:
                            raise
                        await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            for i in range(n):
                if ordered:
                    await p.send_async(Message(topic, body), callback=cb, sharding_key=keys[i % ORDERED_KEYS])
                else:
                    await p.send_async(Message(topic, body), callback=cb)
            left = await p.flush()
            try:
                await asyncio.wait_for(cb.done.wait(), _timeout_s(n))
            except asyncio.TimeoutError:
                raise TimeoutError(f"{cb.missing:,} futures not done ({left:,} unanswered)") from None
            el = time.perf_counter() - t0
        return {"msgs": cb.checked(), "seconds": el}

    return asyncio.run(go())


def aio_send_many(namesrv: str, topic: str, size: int, n: int, columns: bool = False) -> dict:
    import asyncio

    from rmq import Message
    from rmq.aio import Producer
    call = _many_call(topic, body_of(size), columns)

    async def go() -> dict:
        cb = _ManyOutcomes(n, asyncio.Event())
        async with Producer(namesrv, group="bench-client-aio-pg") as p:
            await p.send(Message(topic, b"warm-up"))
            t0 = time.perf_counter()
            for s in range(0, n, BATCH):
                await call(p, min(BATCH, n - s), cb)
            left = await p.flush()
            try:
                await asyncio.wait_for(cb.done.wait(), _timeout_s(n))
            except asyncio.TimeoutError:
                raise TimeoutError(f"{cb.missing:,} outcomes missing ({left:,} unanswered)") from None
            el = time.perf_counter() - t0
        return {"msgs": cb.checked(), "seconds": el}

    return asyncio.run(go())


def aio_poll(namesrv: str, topic: str, size: int, n: int, arrow: bool = False) -> dict:
    import asyncio

    from rmq.aio import PullConsumer
    if arrow:
        import rmq.arrow  # noqa: F401 - as poll(): pyarrow's import is not part of the rate

    async def go() -> dict:
        async with PullConsumer(namesrv, _group("aio-poll-arrow" if arrow else "aio-poll", size),
                                consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
            c.assign(await c.fetch_subscribe_message_queues(topic))
            polled = _Polled(n)
            while polled.got < n:
                polled.add((await c.poll_arrow()).num_rows if arrow else len(await c.poll()))
            res = polled.result()        # timed before the close (its commit)
        return res

    return asyncio.run(go())


def aio_push(namesrv: str, topic: str, size: int, n: int) -> dict:
    import asyncio

    from rmq.aio import PushConsumer
    from rmq.client.consumer import ConsumeConcurrentlyStatus
    ok = ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async def go() -> dict:
        state = {"got": 0, "first": None, "last": 0.0}
        all_done = asyncio.Event()
        c = PushConsumer(namesrv, _group("aio-push", size),
                         consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic, "*")

        def mark(got: int, k: int) -> None:
            now = time.perf_counter()
            if got <= k and state["first"] is None:
                state["first"] = now
            if got >= n and not all_done.is_set():
                state["last"] = now
                all_done.set()

        async def listener(msgs, ctx):
            # one loop: no lock; a clock read only for the first and the n-th message, as push()
            k = len(msgs)
            got = state["got"] = state["got"] + k
            if got >= n or got <= k:
                mark(got, k)
            return ok
        c.register_message_listener(listener)
        t0 = time.perf_counter()
        await c.start()
        try:
            seen, since = -1, time.monotonic()
            while not all_done.is_set():
                try:
                    await asyncio.wait_for(all_done.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
                if state["got"] != seen:
                    seen, since = state["got"], time.monotonic()
                elif time.monotonic() - since > STALL_S:
                    raise TimeoutError(f"consumed {state['got']:,} of {n:,}, nothing new for {STALL_S:.0f} s")
        finally:
            await c.shutdown()
        return {"msgs": state["got"], "seconds": state["last"] - t0, "first_msg_s": round(state["first"] - t0, 4)}

    return asyncio.run(go())


RUNNERS = {SEND_ASYNC: send_async, SEND_BATCH: send_batch, PUSH: push, POLL: poll,
           POLL_ARROW: functools.partial(poll, arrow=True), AIO_SEND: aio_send, AIO_PUSH: aio_push,
           AIO_POLL: aio_poll, AIO_POLL_ARROW: functools.partial(aio_poll, arrow=True),
           SEND_ORDERED: functools.partial(send_async, ordered=True),
           AIO_SEND_ORDERED: functools.partial(aio_send, ordered=True), SEND_MANY: send_many,
           AIO_SEND_MANY: aio_send_many, SEND_COLUMNS: functools.partial(send_many, columns=True),
           AIO_SEND_COLUMNS: functools.partial(aio_send_many, columns=True)}


# -- references -------------------------------------------------------------------------------
def redis_refs(size: int, store_dir=None, seconds: float = REDIS_SECONDS) -> dict:
    """{"produce": row, "consume": row} of :func:`rmq.bench.peers.bench_redis` (everysec, batch 1000)."""
    from rmq.bench.peers import bench_redis
    rows = bench_redis("ASYNC_FLUSH", size, BATCH, seconds, 0.05, store_dir)
    return {r["kind"]: r for r in rows if r.get("kind") in ("produce", "consume")}


def floor_refs(size: int, n: int) -> dict:
    """{"produce": row, "consume": row}: :func:`rmq.bench.floor.send_async_floor` and
    :func:`rmq.bench.floor.push_floor` (this machine's Python floor of those rows' per-message
    calls, no I/O; best of FLOOR_ROUNDS)."""
    from rmq.bench.floor import push_floor, send_async_floor
    out = {}
    for kind, fn in (("produce", send_async_floor), ("consume", push_floor)):
        r = fn(size, n)
        out[kind] = {**r, "mb_per_s": r["msgs_per_s"] * size / MB}
    return out


def raw_refs(namesrv: str, size: int, n: int, store_dir=None, log=print) -> dict:
    """{"produce": row, "consume": row}: ``rmq bench produce`` / ``consume``'s scenarios (the raw
    worker processes of :mod:`rmq.bench.workers`) against this cluster, ``n`` messages each."""
    from rmq.bench.runner import Group, Opts, Progress
    o = Opts(sizes=(size,), flush_types=("ASYNC_FLUSH",), messages=n, batch=BATCH, namesrv=namesrv,
             store_dir=store_dir, progress=False, scenarios=("produce", "consume"))
    g = Group(o, "ASYNC_FLUSH", size, log)
    try:
        out = {}
        for kind in ("produce", "consume"):
            row = g.scenario(kind, Progress(False))
            if row.get("error") or row.get("errors"):
                raise RuntimeError(f"raw {kind}: {row.get('error') or row.get('errors')}")
            out[kind] = {"msgs": row["msgs"], "seconds": row["seconds"], "msgs_per_s": row["msgs_per_s"],
                         "mb_per_s": row["mb_per_s"]}
        return out
    finally:
        g.close()


# -- the run ------------------------------------------------------------------------------------
def median_round(runs: list) -> dict:
    """One row of its rounds (each a row dict): the round with the median rate (the lower middle
    one of an even count), with ``rounds`` (every round's msgs/s, in order) and ``spread``
    ((min, max) msgs/s); a row any round of which failed carries the first failure.  Judged on
    that round alone."""
    ok = [r for r in runs if not r["error"]]
    failed = next((r for r in runs if r["error"]), None)
    if not ok:
        return failed
    row = dict(sorted(ok, key=lambda r: r["msgs_per_s"])[(len(ok) - 1) // 2])
    if len(runs) > 1:
        row["rounds"] = [None if r["error"] else r["msgs_per_s"] for r in runs]
        row["spread"] = (min(r["msgs_per_s"] for r in ok), max(r["msgs_per_s"] for r in ok))
    if failed is not None:
        row["error"] = f"round {runs.index(failed) + 1} of {len(runs)}: {failed['error']}"
    return row


def _row(path: str, size: int, n: int) -> dict:
    return {"path": path, "kind": KIND[path], "api": "aio" if path in AIO_OF else "thread", "size": size,
            "n": n, "msgs": 0, "seconds": None, "msgs_per_s": 0.0, "mb_per_s": 0.0, "target": None,
            "target_met": None, "status": "-", "error": ""}


def judge(row: dict, rows: list, refs: dict) -> None:
    """Ratios to the references of the row's size, and the target (in place)."""
    size, kind = row["size"], row["kind"]
    ref = refs.get(size) or {}
    for who in REFS:
        if who == "floor" and row["path"] not in FLOOR_ROWS:
            continue
        r = (ref.get(who) or {}).get(kind)
        if r and r.get("msgs_per_s") and not row["error"]:
            row[f"{who}_msgs_per_s"] = r["msgs_per_s"]
            row[f"x_{who}"] = row["msgs_per_s"] / r["msgs_per_s"]
    checks = []
    floor = TARGETS.get((row["path"], size))
    if floor is not None:
        checks.append((f">= {floor:,} msgs/s", None if row["error"] else row["msgs_per_s"] >= floor))
    mult = REDIS_TARGETS.get((row["path"], size))
    if mult is not None:
        checks.append((f">= {mult:g}x Redis", None if "x_redis" not in row else row["x_redis"] >= mult))
    base_path, share = HELD_TO.get(row["path"], (None, 0.0))
    if base_path is not None:
        base = next((r for r in rows if r["path"] == base_path and r["size"] == size), None)
        ok = None
        if base is not None and not base["error"] and not row["error"] and base["msgs_per_s"]:
            row["x_base"] = row["msgs_per_s"] / base["msgs_per_s"]
            ok = row["x_base"] >= share
        checks.append((f">= {share:.0%} of {base_path}", ok))
    if not checks:
        return
    row["target"] = ", ".join(c[0] for c in checks)
    got = [c[1] for c in checks]
    row["target_met"] = False if False in got else (None if None in got else True)
    row["status"] = {True: "MET", False: "MISSED", None: "n/a"}[row["target_met"]]


FILE_SIZE_MAX = 1 << 30            # bytes: RocketMQ's default mappedFileSizeCommitLog


def auto_file_size(messages: int, sizes, rows=ROWS, rounds: int = 1) -> int:
    """mappedFileSizeCommitLog for the run: about what it writes (N messages per produce row and
    round, plus the consumer rows' fill and the raw client's reference, per size), 64 MiB ..
    FILE_SIZE_MAX, so that no row pays for a CommitLog file roll the others do not."""
    writers = sum(KIND[r] == "produce" for r in rows) * rounds + 2
    need = sum(writers * n_for(messages, s) * (s + 200) for s in sizes)
    size = 64 << 20
    while size < need and size < FILE_SIZE_MAX:
        size <<= 1
    return size


def run(messages: int = MESSAGES, sizes=SIZES, rows=ROWS, namesrv: Optional[str] = None, store_dir=None,
        file_size: Optional[int] = None, redis: bool = True, raw: bool = True, log=print, rounds: int = 1,
        floor: bool = True) -> dict:
    """Every row of ``rows`` per body size on one embedded cluster (or ``namesrv``'s), with the
    references (``floor``: :mod:`rmq.bench.floor`'s, measured in this process before the rows).
    With ``rounds`` > 1 every row runs that many times, the rounds interleaved (all
    rows once, then all again: a slow minute of the machine is spread over every row), and the
    row reports its median round (:func:`median_round`).  Returns ``{"rows": [...], "refs": {size:
    {"redis"|"raw"|"floor": {kind: row}}}, "skipped": {what: why}, ...}``; a row with ``error`` failed
    (the run goes on).

    Raises
    ------
    ValueError
        ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    from rmq.bench import e2e as E
    from rmq.bench.peers import redis_missing
    t_start = time.monotonic()
    report: dict = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
                    "loadavg_before": os.getloadavg(), "messages": messages, "sizes": list(sizes), "rounds": rounds,
                    "rows": [], "refs": {}, "skipped": {}}
    if redis and redis_missing():
        report["skipped"]["redis"] = f"not installed: {redis_missing()}"
        log(f"redis: not installed ({redis_missing()}); no Redis ratios")
    elif not redis:
        report["skipped"]["redis"] = "not asked for"
    if not raw:
        report["skipped"]["raw"] = "not asked for"
    if not floor:
        report["skipped"]["floor"] = "not asked for"
    cluster = tmp = None
    pids: dict = {}
    if namesrv is None:
        from rmq.testing import Cluster
        tmp = tempfile.mkdtemp(prefix="rmq-bench-client-", dir=store_dir)
        fs = file_size or auto_file_size(messages, sizes, rows, rounds)
        report["file_size"] = fs
        conf = E.cluster_conf(E.Params(file_size=fs, batch=BATCH), "ASYNC_FLUSH")
        cluster = Cluster(os.path.join(tmp, "store"), conf=conf)
        namesrv = cluster.namesrv_addr
        pids = cluster.pids()
    report["cluster"] = "own (ASYNC_FLUSH)" if cluster is not None else f"namesrv {namesrv}"
    me = os.getpid()
    try:
        for size in sizes:
            n = n_for(messages, size)
            tag = f"{size}_{os.getpid()}_{int(time.time())}"
            refs = report["refs"].setdefault(size, {})
            if raw:
                try:
                    refs["raw"] = raw_refs(namesrv, size, n, store_dir, log)
                    for kind, r in refs["raw"].items():
                        log(f"  ref {REF_NAMES[('raw', kind)]:<40} {size:>5} B {r['msgs_per_s']:>12,.0f} msgs/s")
                except Exception as e:  # noqa: BLE001 - a reference that fails is reported, never estimated
                    report["skipped"][f"raw {size} B"] = f"failed: {type(e).__name__}: {e}"
                    log(f"  ref raw bench client {size} B failed: {type(e).__name__}: {e}")
            if floor:
                try:
                    refs["floor"] = floor_refs(size, n)
                    for kind, r in refs["floor"].items():
                        log(f"  ref {REF_NAMES[('floor', kind)]:<40} {size:>5} B {r['msgs_per_s']:>12,.0f} msgs/s")
                except Exception as e:  # noqa: BLE001 - a reference that fails is reported, never estimated
                    report["skipped"][f"floor {size} B"] = f"failed: {type(e).__name__}: {e}"
                    log(f"  ref Python floor {size} B failed: {type(e).__name__}: {e}")
            if "redis" not in report["skipped"]:
                try:
                    refs["redis"] = {k: {"msgs": r["msgs"], "seconds": r["seconds"], "msgs_per_s": r["msgs_per_s"],
                                         "mb_per_s": r["mb_per_s"]}
                                     for k, r in redis_refs(size, store_dir).items()}
                    for kind, r in refs["redis"].items():
                        log(f"  ref {REF_NAMES[('redis', kind)]:<40} {size:>5} B {r['msgs_per_s']:>12,.0f} msgs/s")
                except Exception as e:  # noqa: BLE001
                    report["skipped"][f"redis {size} B"] = f"failed: {type(e).__name__}: {e}"
                    log(f"  ref Redis {size} B failed: {type(e).__name__}: {e}")
            filled = fill_error = None   # the topic the consumer rows read, filled once per size
            runs: dict = {path: [] for path in rows}
            for rnd in range(rounds):
                for path in rows:
                    row = _row(path, size, n)
                    try:
                        if KIND[path] == "consume" and fill_error:
                            raise RuntimeError(f"the fill failed: {fill_error}")
                        if KIND[path] == "consume" and filled is None:
                            filled = f"BenchClient_fill_{tag}"
                            try:
                                fill(namesrv, filled, size, n)
                            except Exception as e:  # noqa: BLE001 - every consumer row of this size fails with it
                                fill_error = f"{type(e).__name__}: {e}"
                                raise
                        topic = filled if KIND[path] == "consume" else f"BenchClient_{TOPIC_OF[path]}_{tag}"
                        gc.collect()
                        if pids:
                            E.wait_idle(list(pids.values()))
                        meter = E.CpuMeter({"client": me, **pids})
                        meter.start()
                        got = RUNNERS[path](namesrv, topic, size, n)
                        row["cpu"] = meter.stop()
                        row.update(got)
                        row["msgs_per_s"] = got["msgs"] / got["seconds"] if got["seconds"] > 0 else 0.0
                        row["mb_per_s"] = row["msgs_per_s"] * size / MB
                        if got["msgs"] < n:
                            row["error"] = f"{got['msgs']:,} of {n:,}"
                    except Exception as e:  # noqa: BLE001 - one failed row does not stop the run
                        row["error"] = f"{type(e).__name__}: {e}"
                    runs[path].append(row)
                    if rounds > 1:
                        log(_line(row) + f"  (round {rnd + 1} of {rounds})")
            for path in rows:
                row = median_round(runs[path])
                report["rows"].append(row)
                judge(row, report["rows"], report["refs"])
                log(_line(row))
    finally:
        if cluster is not None:
            cluster.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    report["loadavg_after"] = os.getloadavg()
    report["wall_seconds"] = round(time.monotonic() - t_start, 1)
    return report


# -- presentation -------------------------------------------------------------------------------
def _f(v, fmt="{:,.0f}") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v)


def _line(row: dict) -> str:
    if row["error"]:
        return f"  {row['path']:<44} {row['size']:>5} B  ERROR {row['error']}"
    x = "".join(f"  {v:.2f}x {k}" for k in REFS if (v := row.get(f"x_{k}")) is not None)
    spread = row.get("spread")
    med = f"  median of {len(row['rounds'])}, {spread[0]:,.0f} .. {spread[1]:,.0f}" if spread else ""
    return (f"  {row['path']:<44} {row['size']:>5} B {row['msgs_per_s']:>12,.0f} msgs/s {row['mb_per_s']:>8,.1f} MB/s"
            f"  {row['status']}{x}{med}")


def print_table(report: dict, console) -> None:
    from rich.table import Table
    t = Table(title="rmq bench client: the public client API, defaults, one Python thread (same run: Redis, raw "
                    "bench client)", title_justify="left")
    rounds = report.get("rounds", 1)
    cols = ["row", "body", "msgs", "msgs/s", "MB/s", "target (issue 17)", "status", "× Redis", "× raw client",
            "× floor", "CPU % client / broker"]
    if rounds > 1:
        cols.insert(4, f"min .. max of {rounds}")
    for col in cols:
        t.add_column(col, justify="left" if col in ("row", "target (issue 17)", "status") else "right")
    for size in report["sizes"]:
        for r in (r for r in report["rows"] if r["size"] == size):
            status = {"MET": "[green]MET[/]", "MISSED": "[red]MISSED[/]"}.get(r["status"], r["status"])
            if r["error"]:
                status = "[red]ERROR[/]"
            cpu = r.get("cpu") or {}
            xr = _f(r.get("x_redis"), "{:.2f}×")
            cells = [r["path"], f"{size} B", _f(r["msgs"]), _f(r["msgs_per_s"]) if not r["error"] else "-",
                     _f(r["mb_per_s"], "{:,.1f}") if not r["error"] else "-", r["target"] or "-", status,
                     xr, _f(r.get("x_raw"), "{:.2f}×"), _f(r.get("x_floor"), "{:.2f}×"),
                     f"{_f(cpu.get('client'))} / {_f(cpu.get('broker'))}" if cpu else "-"]
            if rounds > 1:
                spread = r.get("spread")
                cells.insert(4, f"{_f(spread[0])} .. {_f(spread[1])}" if spread else "-")
            t.add_row(*cells)
        refs = report["refs"].get(size) or report["refs"].get(str(size)) or {}
        for who in REFS:
            for kind in ("produce", "consume"):
                r = (refs.get(who) or {}).get(kind)
                if r:
                    cells = [f"[dim]ref: {REF_NAMES[(who, kind)]}[/]", f"{size} B", _f(r["msgs"]),
                             _f(r["msgs_per_s"]), _f(r["mb_per_s"], "{:,.1f}"), "-", "-", "-", "-", "-", "-"]
                    if rounds > 1:
                        cells.insert(4, "-")
                    t.add_row(*cells)
    console.print(t)
    for r in report["rows"]:
        if r["error"]:
            console.print(f"ERROR {r['path']} {r['size']} B: {r['error']}", highlight=False, markup=False)
    for what, why in report["skipped"].items():
        console.print(f"{what}: {why}", highlight=False, markup=False)
    console.print(f"load average {report['loadavg_before'][0]:.2f} -> {report['loadavg_after'][0]:.2f}; wall "
                  f"{report['wall_seconds']:.0f} s on {report['cpus']} CPUs; {report['cluster']}. MB = 10^6 B of "
                  "bodies. × Redis: produce rows / XADD pipeline x1000, consume rows / XREAD COUNT 1000; × raw "
                  "client: / the raw bench workers' produce or consume figure; × floor: send_async and "
                  "PushConsumer rows / this machine's Python floor of their per-message calls with no I/O "
                  "(rmq.bench.floor: a figure above it cannot be reached here).", highlight=False)


def failed(report: Optional[dict]) -> list:
    """Rows of ``report`` that have an error."""
    return [f"{r['path']} {r['size']} B" for r in (report or {}).get("rows", []) if r.get("error")]

