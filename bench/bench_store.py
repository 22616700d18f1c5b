"""MessageStore throughput beside the memcpy ceiling of the same kind of mapping.

Run::

    python -m pytest bench/bench_store.py --benchmark-only -q   # pytest-benchmark
    python bench/report.py                                      # one-process table (quoted in notes)

Scenarios (see bench/README.md for what each one times):

* ``append``    -- ``MessageStore.put_messages`` of pre-encoded batches (100 B / 1 KiB
  bodies, batches of 1 / 32 / 1024) into a fresh store whose first CommitLog file
  was pre-touched (``MappedFile.warm_up``), like every later file of a store
  with ``warm_mapped_file_enable``;
* ``dispatch``  -- ``MessageStore.dispatch()`` of N records already appended
  (ConsumeQueue units + IndexFile keys);
* ``cq_read``   -- ``ConsumeQueue.read_raw(offset, 1024)`` across the whole queue;
* ``get``       -- ``MessageStore.get_messages(..., max_msgs=1024)`` across the whole queue;
* ``ceiling``   -- memcpy of the same bytes into (write) / out of (read) a
  ``MappedFile`` of the same size, pre-touched the same way, in 1 MiB chunks.

This module is also the scenario library of ``bench/report.py``: the
``Scenario`` objects built here are what both front ends time.
"""
from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest

from rmq._core import commitlog as _cl
from rmq._core.mapped_file import MappedFile
from rmq.store.message_store import MessageStore

# -- parameters ------------------------------------------------------------------------------
TOPIC = "BenchTopic"
QUEUE_ID = 0
BODY_SIZES = (100, 1024)
BATCH_SIZES = (1, 32, 1024)
#: messages per timed round, by body size
N_MSGS = {100: 200_000, 1024: 100_000}
#: batch size used to fill stores for the dispatch / read scenarios (not timed)
FILL_BATCH = 1024
#: entries per read (ConsumeQueue range read, get_messages max_msgs)
READ_BATCH = 1024
#: passes over the queue per timed round of the ConsumeQueue read (one pass is ~0.3 ms)
CQ_PASSES = 20
#: CommitLog file size (bytes) of every store and of the ceiling mapping.  256 MiB, not
#: RocketMQ's 1 GiB: a warm store holds two warmed (dirty) files -- its first and the
#: next one its allocator pre-touches -- and 2 x 1 GiB + the ceiling's 1 GiB goes past
#: vm.dirty_background_ratio (10 % of RAM) on the project VM, which starts kernel
#: writeback (cleaning + write-protecting the pages) during timed parts.  Mapping size
#: does not change memcpy speed on pre-touched pages.  RMQ_BENCH_FILE_SIZE overrides.
FILE_SIZE = int(os.environ.get("RMQ_BENCH_FILE_SIZE", str(256 << 20)))
#: "warm": pre-touch both the store's CommitLog file and the ceiling mapping (default);
#: "cold": both on first-touch pages (fresh fallocated files, no warm-up)
TOUCH = os.environ.get("RMQ_BENCH_TOUCH", "warm")
#: memcpy chunk of the ceiling, bytes
CEILING_CHUNK = 1 << 20
#: where stores and ceiling files go (default: the system temp dir, same ext4 as the work tree)
BENCH_DIR = os.environ.get("RMQ_BENCH_DIR") or None
ROUNDS = int(os.environ.get("RMQ_BENCH_ROUNDS", "3"))

MB = 1e6


# -- targets (the "Done when") -----------------------------------------------------------
@dataclass(frozen=True)
class Target:
    kind: str      # "ratio" (ratio to ceiling >=) or "msgs" (msgs/s >=)
    value: float

    def met(self, msgs_per_s: float, ratio: float) -> bool:
        return (ratio if self.kind == "ratio" else msgs_per_s) >= self.value

    def __str__(self) -> str:
        if self.kind == "ratio":
            return f">= {self.value:.0%} of ceiling"
        return f">= {self.value / 1e6:g}M msgs/s"


def append_target(body: int, batch: int) -> Optional[Target]:
    """Targets apply to *batched* append, taken as the batch-1024 rows."""
    if batch != 1024:
        return None
    return Target("ratio", 0.5) if body == 1024 else Target("msgs", 2_000_000)


DISPATCH_TARGET = Target("msgs", 1_000_000)


# -- helpers -----------------------------------------------------------------------------
def _mkdtemp(tag: str) -> str:
    return tempfile.mkdtemp(prefix=f"rmq-bench-{tag}-", dir=BENCH_DIR)


def body_of(size: int) -> bytes:
    return os.urandom(size)


def encode(body_size: int, batch: int, props: bytes = b"") -> bytes:
    """One pre-encoded batch (RocketMQ batch encoding) of ``batch`` messages."""
    return _cl.encode_batch([(body_of(body_size), props, 0)] * batch)


def record_bytes(batch_bytes: bytes, prop_crc: bool = True) -> int:
    """CommitLog bytes the batch becomes (V1 topic, IPv4 hosts, with/without the __CRC32# property)."""
    _n, total = _cl.validate_batch(batch_bytes, b"", len(TOPIC.encode()), 0, 1 << 30, prop_crc)
    return total


def open_store(path: str, **overrides) -> MessageStore:
    cfg = dict(mapped_file_size_commit_log=FILE_SIZE,
               warm_mapped_file_enable=(TOUCH == "warm"),
               max_transfer_count_on_message_in_memory=READ_BATCH,
               max_transfer_bytes_on_message_in_memory=4 * 1024 * 1024)
    cfg.update(overrides)
    return MessageStore(path, **cfg)


def wait_allocator(store: MessageStore) -> None:
    """Join the AllocateMappedFileService threads (pre-allocation + warm-up of the *next*
    CommitLog file), so they never run during a timed part."""
    alloc = store.commitlog.mapped_file_queue.allocator
    if alloc is None:
        return
    with alloc._lock:
        threads = list(alloc._pending.values())
    for t in threads:
        t.join()


def prime_store(store: MessageStore, warm: Optional[bool] = None) -> None:
    """Create the first CommitLog file now (not in the timed part) and, in ``warm``
    mode, pre-touch it: the store itself only warms files it pre-allocates in the
    background (file 2 on), so this puts file 1 in the same state as every later
    file of a warm store, and the same state as the ceiling mapping."""
    mf = store.commitlog.mapped_file_queue.get_last_mapped_file(0, need_create=True)
    if (TOUCH == "warm") if warm is None else warm:
        mf.warm_up()
    wait_allocator(store)


def close_store(store: Optional[MessageStore], path: Optional[str]) -> None:
    if store is not None:
        store.shutdown()
    if path:
        shutil.rmtree(path, ignore_errors=True)


def fill_store(store: MessageStore, body_size: int, n: int, batch: int = FILL_BATCH,
               props_fn: Optional[Callable[[int], bytes]] = None) -> int:
    """Append ``n`` messages (rounded down to whole batches); returns messages appended."""
    n_batches = max(1, n // batch)
    if props_fn is None:
        b = encode(body_size, batch)
        batches = [b] * n_batches
    else:
        body = body_of(body_size)
        batches = [_cl.encode_batch([(body, props_fn(k * batch + i), 0) for i in range(batch)])
                   for k in range(n_batches)]
    for b in batches:
        r = store.put_messages(TOPIC, QUEUE_ID, b, count_hint=batch)
        assert r.ok, r
    return n_batches * batch


# -- scenarios ---------------------------------------------------------------------------
@dataclass
class Scenario:
    """One timed thing.  ``setup()`` -> state (not timed), ``run(state)`` (timed),
    ``check(state)`` (asserts, not timed), ``teardown(state)``.

    ``msgs`` / ``nbytes`` per round give msgs/s and MB/s; ``ceiling`` names the
    memcpy ceiling it is compared with ("write" or "read") over ``nbytes``.
    """
    key: str
    label: str
    group: str
    msgs: int
    nbytes: int
    ceiling: str
    setup: Callable[[], Any]
    run: Callable[[Any], Any]
    check: Callable[[Any, Any], None] = lambda state, out: None
    teardown: Callable[[Any], None] = lambda state: None
    target: Optional[Target] = None
    params: dict = field(default_factory=dict)
    #: distinct bytes behind ``nbytes`` (a read that passes k times over a region); the
    #: ceiling copies the same span the same number of times.  Default: ``nbytes``.
    span: Optional[int] = None


def append_scenario(body: int, batch: int, prop_crc: bool = True) -> Scenario:
    """``prop_crc=False``: the store runs with ``enabled_append_prop_crc=False`` (no
    whole-record ``__CRC32#`` property: one CRC per record instead of two; RocketMQ's
    default), to show what the second CRC costs.  No target on that variant."""
    b = encode(body, batch)
    n_batches = N_MSGS[body] // batch
    msgs = n_batches * batch
    nbytes = record_bytes(b, prop_crc) * n_batches

    def setup():
        path = _mkdtemp("append")
        store = open_store(path, enabled_append_prop_crc=prop_crc)
        prime_store(store)
        return (store, path)

    def run(state):
        put = state[0].put_messages
        for _ in range(n_batches):
            put(TOPIC, QUEUE_ID, b, count_hint=batch)

    def check(state, _out):
        store = state[0]
        assert store.get_max_phy_offset() == nbytes, (store.get_max_phy_offset(), nbytes)
        assert store.topic_queue_table[(TOPIC, QUEUE_ID)] == msgs

    def teardown(state):
        close_store(*state)

    if not prop_crc:
        return Scenario(f"append-{body}B-b{batch}-no-prop-crc", f"append {_size(body)}, batch {batch}, no __CRC32#",
                        "append", msgs, nbytes, "write", setup, run, check, teardown, None,
                        {"body": body, "batch": batch, "enabled_append_prop_crc": False})
    return Scenario(f"append-{body}B-b{batch}", f"append {_size(body)}, batch {batch}", "append",
                    msgs, nbytes, "write", setup, run, check, teardown, append_target(body, batch),
                    {"body": body, "batch": batch})


def _uniq_props(i: int) -> bytes:
    # what a RocketMQ producer sets on every message: a 32-hex-digit UNIQ_KEY; plus a tag
    return b"TAGS\x01TagA\x02UNIQ_KEY\x01" + b"%032X" % (0x0A000001 << 96 | i) + b"\x02"


def dispatch_scenario(body: int, keys: bool = False) -> Scenario:
    n = N_MSGS[body] // FILL_BATCH * FILL_BATCH
    props_fn = _uniq_props if keys else None
    sample = _cl.encode_batch([(body_of(body), props_fn(0) if keys else b"", 0)])
    nbytes = record_bytes(sample) * n

    def setup():
        path = _mkdtemp("dispatch")
        store = open_store(path)
        prime_store(store)
        fill_store(store, body, n, props_fn=props_fn)
        # the IndexFile exists in steady state (one per 20M keys): create it now, not in the timed part
        store.index_service.get_and_create_last_index_file()
        return (store, path)

    def run(state):
        return state[0].dispatch()

    def check(state, out):
        assert out == n, (out, n)
        assert state[0].get_max_offset_in_queue(TOPIC, QUEUE_ID) == n

    def teardown(state):
        close_store(*state)

    tag = "-keys" if keys else ""
    label = f"dispatch {_size(body)}" + (" +UNIQ_KEY/TAGS (IndexFile)" if keys else "")
    return Scenario(f"dispatch-{body}B{tag}", label, "dispatch", n, nbytes, "read",
                    setup, run, check, teardown, DISPATCH_TARGET if not keys else None,
                    {"body": body, "keys": keys})


class _SharedStore:
    """A filled + dispatched store shared by the read scenarios (reads do not change it)."""
    _cache: dict = {}

    @classmethod
    def get(cls, body: int):
        st = cls._cache.get(body)
        if st is None:
            path = _mkdtemp("read")
            # lives for the whole run: no warmed (dirty) spare pages, and the data is flushed,
            # so the kernel has no writeback to do for it while other scenarios are timed
            store = open_store(path, warm_mapped_file_enable=False)
            prime_store(store, warm=False)
            n = fill_store(store, body, N_MSGS[body])
            store.dispatch()
            store.flush()
            st = cls._cache[body] = (store, path, n)
        return st

    @classmethod
    def close_all(cls) -> None:
        for store, path, _n in cls._cache.values():
            close_store(store, path)
        cls._cache.clear()


atexit.register(_SharedStore.close_all)     # safety net for scripts that forget


def cq_read_scenario(body: int = 100, passes: int = CQ_PASSES) -> Scenario:
    n = N_MSGS[body] // FILL_BATCH * FILL_BATCH

    def setup():
        store, _path, _n = _SharedStore.get(body)
        return store.find_consume_queue(TOPIC, QUEUE_ID, create=False)

    def run(cq):
        rr = cq.read_raw
        total = 0
        for _ in range(passes):
            for off in range(0, n, READ_BATCH):
                total += len(rr(off, READ_BATCH))
        return total

    def check(_cq, out):
        assert out == 20 * n * passes, (out, 20 * n * passes)

    return Scenario(f"cq_read-{body}B", f"ConsumeQueue read_raw x{READ_BATCH} ({passes} passes)", "read",
                    n * passes, 20 * n * passes, "read", setup, run, check, target=None,
                    params={"body": body, "passes": passes}, span=20 * n)


def get_scenario(body: int) -> Scenario:
    n = N_MSGS[body] // FILL_BATCH * FILL_BATCH
    nbytes = record_bytes(encode(body, 1)) * n

    def setup():
        store, _path, _n = _SharedStore.get(body)
        return store

    def run(store):
        gm = store.get_messages
        off = count = size = 0
        while off < n:
            r = gm("bench", TOPIC, QUEUE_ID, off, READ_BATCH)
            count += r.message_count
            size += len(r.records)
            off = r.next_begin_offset
        return count, size

    def check(_store, out):
        assert out == (n, nbytes), (out, n, nbytes)

    return Scenario(f"get-{body}B", f"get_messages {_size(body)}, max {READ_BATCH}", "read", n, nbytes,
                    "read", setup, run, check, params={"body": body})


def _size(body: int) -> str:
    return "1 KiB" if body == 1024 else f"{body} B"


def all_scenarios() -> list[Scenario]:
    out = [append_scenario(b, k) for b in BODY_SIZES for k in BATCH_SIZES]
    out += [append_scenario(b, 1024, prop_crc=False) for b in BODY_SIZES]
    out += [dispatch_scenario(b) for b in BODY_SIZES]
    out.append(dispatch_scenario(100, keys=True))
    out.append(cq_read_scenario(100))
    out += [get_scenario(b) for b in BODY_SIZES]
    return out


# -- the ceiling: raw memcpy into / out of the same kind of mapping ------------------------------
class CeilingMapping:
    """A MappedFile of FILE_SIZE bytes, pre-touched like the store's (TOUCH mode)."""

    def __init__(self):
        self.dir = _mkdtemp("ceiling")
        self.mf = MappedFile(os.path.join(self.dir, "00000000000000000000"), FILE_SIZE, True)
        if TOUCH == "warm":
            self.mf.warm_up()
        self.mv = memoryview(self.mf)

    def close(self) -> None:
        self.mv.release()
        self.mf.destroy()
        shutil.rmtree(self.dir, ignore_errors=True)


_SRC = os.urandom(CEILING_CHUNK)


def memcpy_in(mv: memoryview, nbytes: int) -> None:
    """Copy ``nbytes`` into the mapping in CEILING_CHUNK pieces (slice assignment = memcpy)."""
    src = memoryview(_SRC)
    a = 0
    while a + CEILING_CHUNK <= nbytes:
        mv[a:a + CEILING_CHUNK] = src
        a += CEILING_CHUNK
    if a < nbytes:
        mv[a:nbytes] = src[:nbytes - a]


def memcpy_out(mv: memoryview, dst: bytearray, nbytes: int, span: int) -> None:
    """Copy ``nbytes`` out of ``mv[:span]`` (wrapping around) into a warm buffer, in
    CEILING_CHUNK pieces."""
    d = memoryview(dst)
    a = done = 0
    while done < nbytes:
        k = min(CEILING_CHUNK, nbytes - done, span - a)
        d[:k] = mv[a:a + k]
        done += k
        a = a + k if a + k < span else 0


def ceiling_scenario(kind: str, nbytes: int, span: Optional[int] = None) -> Scenario:
    """memcpy of ``nbytes`` into ("write") or out of ("read") a fresh, same-kind mapping.
    A read copies from the first ``span`` bytes over and over (default: all ``nbytes``)."""
    span = min(span or nbytes, nbytes)

    def setup():
        cm = CeilingMapping()
        dst = None
        if kind == "read":
            memcpy_in(cm.mv, span)            # the data the read copies out, page-cache resident
            dst = bytearray(CEILING_CHUNK)
        return (cm, dst)

    def run(state):
        cm, dst = state
        if kind == "write":
            memcpy_in(cm.mv, nbytes)
        else:
            memcpy_out(cm.mv, dst, nbytes, span)

    def teardown(state):
        state[0].close()

    return Scenario(f"ceiling-{kind}-{nbytes}-{span}", f"memcpy {kind} ceiling, {nbytes / MB:.0f} MB", "ceiling",
                    0, nbytes, kind, setup, run, teardown=teardown, span=span)


def time_round(sc: Scenario) -> float:
    """One round: setup, gc, timed run, check, teardown.  Returns seconds."""
    state = sc.setup()
    try:
        gc.collect()
        t0 = time.perf_counter()
        out = sc.run(state)
        dt = time.perf_counter() - t0
        sc.check(state, out)
    finally:
        sc.teardown(state)
    return dt


def derived(sc: Scenario, seconds: float, ceiling_mb_s: float) -> dict:
    msgs_s = sc.msgs / seconds if sc.msgs else 0.0
    mb_s = sc.nbytes / seconds / MB
    ratio = mb_s / ceiling_mb_s if ceiling_mb_s else 0.0
    d = {"msgs_per_s": round(msgs_s), "mb_per_s": round(mb_s, 1),
         "ceiling": sc.ceiling, "ceiling_mb_per_s": round(ceiling_mb_s, 1),
         "ratio_to_ceiling": round(ratio, 4), "msgs": sc.msgs, "bytes": sc.nbytes,
         "touch": TOUCH, "file_size": FILE_SIZE}
    if sc.target is not None:
        d["target"] = str(sc.target)
        d["target_met"] = sc.target.met(msgs_s, ratio)
    return d


# == pytest-benchmark front end ==============================================================
_NOT_RUN = object()


def _bench(benchmark, sc: Scenario, ceiling_mb_s: Callable[[str, int], float], results: list) -> None:
    """Time ``sc.run`` with ``benchmark.pedantic``: a fresh ``setup()`` each round."""
    states: list = []    # the live round: [state, out]

    def finish():
        # check the round just timed, then tear its store/file down (neither is timed)
        while states:
            state, out = states.pop()
            try:
                if out is not _NOT_RUN:
                    sc.check(state, out)
            finally:
                sc.teardown(state)

    def setup():
        finish()
        states.append([sc.setup(), _NOT_RUN])
        gc.collect()
        return (states[-1],), {}

    def run(slot):
        slot[1] = sc.run(slot[0])

    benchmark.group = sc.group
    try:
        benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    finally:
        finish()
    stats = getattr(benchmark, "stats", None)
    if stats is None:                      # --benchmark-disable: nothing to derive
        return
    ceil = ceiling_mb_s(sc.ceiling, sc.nbytes, sc.span) if sc.ceiling else 0.0
    info = derived(sc, stats.stats.median, ceil)
    benchmark.extra_info.update(info)
    results.append((sc.label, info))


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda k: f"batch{k}")
@pytest.mark.parametrize("body", BODY_SIZES, ids=lambda b: f"{b}B")
def test_append(benchmark, body, batch, ceiling_mb_s, store_bench_results):
    _bench(benchmark, append_scenario(body, batch), ceiling_mb_s, store_bench_results)


@pytest.mark.parametrize("body", BODY_SIZES, ids=lambda b: f"{b}B")
def test_append_no_prop_crc(benchmark, body, ceiling_mb_s, store_bench_results):
    _bench(benchmark, append_scenario(body, 1024, prop_crc=False), ceiling_mb_s, store_bench_results)


@pytest.mark.parametrize("body", BODY_SIZES, ids=lambda b: f"{b}B")
def test_dispatch(benchmark, body, ceiling_mb_s, store_bench_results):
    _bench(benchmark, dispatch_scenario(body), ceiling_mb_s, store_bench_results)


def test_dispatch_with_keys(benchmark, ceiling_mb_s, store_bench_results):
    _bench(benchmark, dispatch_scenario(100, keys=True), ceiling_mb_s, store_bench_results)


def test_cq_read_raw(benchmark, ceiling_mb_s, store_bench_results, shared_read_stores):
    _bench(benchmark, cq_read_scenario(100), ceiling_mb_s, store_bench_results)


@pytest.mark.parametrize("body", BODY_SIZES, ids=lambda b: f"{b}B")
def test_get_messages(benchmark, body, ceiling_mb_s, store_bench_results, shared_read_stores):
    _bench(benchmark, get_scenario(body), ceiling_mb_s, store_bench_results)


@pytest.mark.parametrize("kind", ("write", "read"))
@pytest.mark.parametrize("body", BODY_SIZES, ids=lambda b: f"{b}B")
def test_memcpy_ceiling(benchmark, kind, body, store_bench_results):
    """The ceiling itself, over the bytes of one append round of ``body``-sized messages."""
    nbytes = record_bytes(encode(body, 1)) * N_MSGS[body]
    sc = ceiling_scenario(kind, nbytes)
    benchmark.group = "ceiling"
    states: list = []

    def setup():
        while states:
            sc.teardown(states.pop())
        states.append(sc.setup())
        return (states[-1],), {}

    try:
        benchmark.pedantic(sc.run, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    finally:
        while states:
            sc.teardown(states.pop())
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        mb_s = nbytes / stats.stats.median / MB
        benchmark.extra_info.update({"mb_per_s": round(mb_s, 1), "bytes": nbytes, "touch": TOUCH})
        store_bench_results.append((sc.label, {"msgs_per_s": 0, "mb_per_s": round(mb_s, 1),
                                               "ceiling": kind, "ceiling_mb_per_s": round(mb_s, 1),
                                               "ratio_to_ceiling": 1.0}))
