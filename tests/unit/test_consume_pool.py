"""The PushConsumer's listener pool (rmq.client.consume_pool): its grow / retire rule, and real
threads growing while tasks block, helping with a shared run, and exiting after keep-alive."""
from __future__ import annotations

import threading
import time

import pytest

from rmq import PushConsumer
from rmq.client import consume_pool as CP
from rmq.client.consume_pool import ConsumePool, pool_decision
from rmq.errors import MQClientError


def wait_for(cond, timeout=30.0, what="condition"):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def in_threads(fn, n, timeout=60):
    """Run ``fn`` on ``n`` threads at once and wait for them all."""
    threads = [threading.Thread(target=fn) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"{fn} still running after {timeout} s"


def test_limits_are_named():
    assert (CP.CONSUME_THREAD_MAX, CP.CONSUME_THREAD_MIN, CP.CONSUME_THREAD_LIMIT) == (20, 1, 1000)
    assert CP.KEEP_ALIVE_S == 60.0
    assert 0 < CP.GROW_BELOW_CPU < CP.SHRINK_ABOVE_CPU <= 1
    assert CP.GROW_BELOW_CPU < CP.GIL_BUSY_CPU <= 1


@pytest.mark.parametrize("waiting, idle, share, live, expect", [
    (0, 0, 0.0, 1, 0),          # nothing waits
    (5, 1, 0.0, 1, 0),          # a worker is idle: it takes the task
    (5, 0, 0.0, 1, 1),          # blocked workers: doubles
    (50, 0, 0.1, 4, 4),
    (50, 0, 0.1, 16, 4),        # up to the maximum (20)
    (50, 0, 0.1, 20, 0),
    (2, 0, 0.1, 8, 2),          # never more than the tasks waiting
    (5, 0, None, 2, 2),         # no CPU clocks: grows whenever tasks wait
    (5, 0, 0.7, 4, 0),          # between the thresholds: holds
    (5, 0, 0.95, 4, -1),        # CPU-bound with tasks waiting: one retires
    (5, 0, 0.95, 1, 0),         # ... not below the minimum
])
def test_pool_decision(waiting, idle, share, live, expect):
    assert pool_decision(waiting, idle, share, live, 1, 20) == expect


@pytest.mark.parametrize("share, gil, live, expect", [
    (0.1, 0.15, 1, 1),          # workers off a CPU and the GIL free: blocked on I/O, grows
    (0.45, 0.65, 2, 2),         # ... below GIL_BUSY_CPU
    (0.45, 0.9, 1, 0),          # the GIL taken (the pull thread had it): waiting for it, holds
    (0.1, 0.75, 4, 0),
    (0.95, 0.98, 4, -1),        # CPU-bound workers still retire one
    (None, 0.95, 2, 2),         # no per-thread clocks: as before
])
def test_pool_decision_tells_a_gil_wait_from_a_block(share, gil, live, expect):
    assert pool_decision(5, 0, share, live, 1, 20, gil) == expect


def test_python_cpu_sums_every_python_thread():
    """_python_cpu counts the CPU time of threads that are not workers (a pull thread), from
    per-thread CPU clocks: a thread that burns 50 ms of its own CPU shows at least that much."""
    pool = ConsumePool(2, "gil", 1)
    try:
        if pool._python_cpu() is None:
            pytest.skip("no per-thread CPU clocks on this platform")
        started, go, burnt, done = (threading.Event() for _ in range(4))

        def burn():
            started.set()
            go.wait(30)
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.05:
                pass
            burnt.set()
            done.wait(30)                       # alive while it is measured
        t = threading.Thread(target=burn)
        t.start()
        try:
            assert started.wait(30)
            pool._python_cpu()                  # the baseline: the thread is known now
            go.set()
            assert burnt.wait(30)
            assert pool._python_cpu() >= 0.05
        finally:
            done.set()
            t.join(30)
    finally:
        pool.shutdown(5)


def test_bounds_are_checked():
    for lo, hi in ((0, 4), (5, 4)):
        with pytest.raises(ValueError, match="1 <= min <= max"):
            ConsumePool(hi, "t", lo)
    with pytest.raises(MQClientError, match="consume_thread_min must be in"):
        PushConsumer("127.0.0.1:1", "g", consume_thread_max=4, consume_thread_min=5)
    with pytest.raises(MQClientError, match="consume_thread_max must be in"):
        PushConsumer("127.0.0.1:1", "g", consume_thread_max=CP.CONSUME_THREAD_LIMIT + 1)


def test_blocked_tasks_grow_the_pool_to_its_maximum_and_extras_exit_after_keep_alive():
    pool = ConsumePool(6, "grow", 1, keep_alive_s=0.3)
    barrier = threading.Barrier(6, timeout=30)
    passed = []
    try:
        assert pool.size == 1
        for _ in range(6):          # each waits until all 6 run at once: only a grown pool gets there
            pool.submit(lambda: passed.append(barrier.wait()), ())
        wait_for(lambda: len(passed) == 6, what="6 tasks running at once")
        assert pool.peak == 6 and pool.grown >= 1
        wait_for(lambda: pool.size == 1, what="the extra workers to exit after keep-alive")
    finally:
        pool.shutdown(5)


class _Run:
    """A shared task's state: ``n`` requests, each taken by one caller (as _ConsumeRun)."""

    def __init__(self, n):
        self.n, self.taken, self.lock = n, 0, threading.Lock()

    def take(self):
        with self.lock:
            if self.taken >= self.n:
                return False
            self.taken += 1
            return True

    def left(self):
        return self.n - self.taken


def test_added_workers_help_with_a_shared_run():
    pool = ConsumePool(4, "share", 1)
    run = _Run(4)
    barrier = threading.Barrier(4, timeout=30)
    done = []

    def consume_run(r):
        while r.take():
            done.append(barrier.wait())     # each request waits for 3 others: needs 4 workers on one run

    try:
        pool.submit(consume_run, (run,), run)     # one task for the whole run, as for a busy pool
        wait_for(lambda: len(done) == 4, what="the run's 4 requests running at once")
        assert pool.peak == 4
    finally:
        pool.shutdown(5)


def test_a_failing_task_keeps_its_worker_and_shutdown_drops_queued_tasks():
    pool = ConsumePool(1, "fail", 1)
    ran = []
    gate = threading.Event()
    try:
        pool.submit(lambda: 1 / 0, ())
        pool.submit(ran.append, (1,))
        wait_for(lambda: ran == [1], what="the task after a failing one")
        pool.submit(gate.wait, (30,))
        wait_for(lambda: pool.idle == 0, what="the worker to block")
        pool.submit(ran.append, (2,))            # queued behind the blocked task
    finally:
        threading.Timer(0.2, gate.set).start()
        pool.shutdown(10)
    assert ran == [1] and pool.size == 0


# -- the per-message objects in C (rmq._core.consume) -------------------------------------------
def test_consume_run_cuts_requests_when_taken_and_each_once_across_threads():
    from rmq._core.consume import ConsumeRun
    msgs = list(range(10))
    run = ConsumeRun(msgs, 4, "pq", "mq")
    assert (run.count, run.size, run.left(), run.pq, run.mq) == (3, 4, 3, "pq", "mq")
    assert [run.take(), run.take(), run.take(), run.take()] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], None]
    assert run.left() == 0 and ConsumeRun([], 1, None, None).take() is None
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        ConsumeRun(msgs, 0, None, None)

    big = ConsumeRun(list(range(20_000)), 1, None, None)
    got: list = []

    def worker():
        mine = []
        while (r := big.take()) is not None:
            mine.extend(r)
        got.append(mine)
    in_threads(worker, 8)
    assert sorted(x for mine in got for x in mine) == list(range(20_000))


def test_consume_concurrently_context_is_rocketmqs():
    from rmq.client.consumer import ConsumeConcurrentlyContext
    ctx = ConsumeConcurrentlyContext("mq")
    assert (ctx.message_queue, ctx.delay_level_when_next_consume, ctx.ack_index) == ("mq", 0, 2 ** 31 - 1)
    ctx.ack_index, ctx.delay_level_when_next_consume = 3, -1
    assert ctx == ConsumeConcurrentlyContext("mq", -1, 3) != ConsumeConcurrentlyContext("mq")
    assert repr(ctx) == "ConsumeConcurrentlyContext(message_queue='mq', delay_level_when_next_consume=-1, ack_index=3)"
    with pytest.raises(AttributeError):
        ctx.other = 1                          # no per-object dict


def _ext(topic, body, offset):
    from rmq._core.commitlog import MessageExt
    m = MessageExt()
    m.topic, m.body, m.queue_offset = topic, body, offset
    return m


def test_process_queue_loops_in_c_keep_counts_order_and_skip_duplicates():
    from collections import OrderedDict

    from rmq._core.consume import tree_put, tree_remove
    msgs = [_ext("T", b"x" * (i + 1), 10 + i) for i in range(4)]
    msgs[2].body = None                            # a body not read counts 0 bytes
    tree = OrderedDict()
    assert tree_put(tree, msgs[:3]) == (3, 1 + 2, 12)
    assert tree_put(tree, msgs[1:]) == (1, 4, 13)  # 11 and 12 were there already
    assert list(tree) == [10, 11, 12, 13] and tree_put(tree, []) == (0, 0, -1)
    assert tree_remove(tree, [msgs[1], msgs[1], msgs[3]]) == (2, 2 + 4)
    assert list(tree) == [10, 12]


def test_post_processing_is_skipped_only_when_no_message_needs_it():
    from rmq._core.consume import needs_post_processing
    from rmq.client.consumer_api import SYS_FLAG_COMPRESSED
    plain = [_ext("T", b"x", i) for i in range(3)]
    assert not needs_post_processing(plain, SYS_FLAG_COMPRESSED, "%RETRY%g")
    assert not needs_post_processing([], SYS_FLAG_COMPRESSED, None)
    retried = plain + [_ext("%RETRY%g", b"x", 3)]
    assert needs_post_processing(retried, SYS_FLAG_COMPRESSED, "%RETRY%g")
    assert not needs_post_processing(retried, SYS_FLAG_COMPRESSED, None)
    packed = _ext("T", b"x", 4)
    packed.sys_flag = SYS_FLAG_COMPRESSED
    assert needs_post_processing(plain + [packed], SYS_FLAG_COMPRESSED, None)


def test_consume_run_collects_consumed_requests_for_commits_every_interval_and_at_the_end(monkeypatch):
    import rmq._core.consume
    from rmq._core.consume import RUN_COMMIT_INTERVAL_S, ConsumeRun

    def interval(s):
        # the Cython module reads its global RUN_COMMIT_INTERVAL_S at every call: "within the
        # interval" is made certain with an hour (the real 50 ms can pass in a scheduling gap of a
        # loaded machine); the interval passing is waited for with the real one
        monkeypatch.setattr(rmq._core.consume, "RUN_COMMIT_INTERVAL_S", s)
    interval(3600.0)
    run = ConsumeRun(list(range(6)), 2, None, None)
    assert run.consumed(run.take()) is None       # the run was made less than an interval ago
    assert run.rest() == [0, 1]
    assert run.consumed(run.take()) is None       # still within the interval
    interval(RUN_COMMIT_INTERVAL_S)
    end = time.monotonic() + 30
    got = None
    while got is None:                            # the interval passes: all of it, at once
        assert time.monotonic() < end, "consumed() never handed the list out"
        time.sleep(RUN_COMMIT_INTERVAL_S / 5)
        got = run.consumed([])
    assert got == [2, 3] and run.rest() == []
    interval(3600.0)
    assert run.consumed(run.take()) is None       # within the interval of the last hand-out
    assert run.rest() == [4, 5] and run.rest() == [] and run.take() is None


def test_consume_run_commits_every_message_once_across_workers():
    from rmq._core.consume import ConsumeRun
    run = ConsumeRun(list(range(30_000)), 3, None, None)
    handed: list = []

    def worker():
        while (r := run.take()) is not None:
            now = run.consumed(r)
            if now:
                handed.append(now)
        handed.append(run.rest())
    in_threads(worker, 6)
    assert sorted(x for part in handed for x in part) == list(range(30_000))


def test_a_retire_request_makes_one_worker_beyond_the_minimum_exit():
    pool = ConsumePool(4, "retire", 1)
    gate = threading.Event()
    started = []
    try:
        for _ in range(3):                        # blocked tasks: the pool grows to 3 or more
            pool.submit(lambda: (started.append(1), gate.wait(30)), ())
        wait_for(lambda: len(started) == 3, what="3 tasks running at once")
        gate.set()
        wait_for(lambda: pool.idle == pool.size, what="the workers idle again")
        live = pool.size
        with pool._lock:
            pool._retire = 1                      # what a CPU-bound tick sets (pool_decision: -1)
        pool.submit(lambda: None, ())             # the worker that runs it, or an idle one, leaves
        wait_for(lambda: pool.size == live - 1, what="one worker retired")
        assert pool.size >= pool.min_threads
    finally:
        pool.shutdown(5)
