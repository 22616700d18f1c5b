"""The PushConsumer's listener pool: ``min_threads`` .. ``max_threads`` worker threads on one
queue of tasks, grown only while the running workers are blocked.

State (all under ``ConsumePool._lock`` except the task queue): the live workers (each with the
task it runs and the CPU time it had at the last tick), how many are idle, how many are asked to
retire.  Threads: the workers (``<name>_N``) and a monitor (``<name>_monitor``) that wakes only
while tasks wait.

Why not RocketMQ's fixed pool: ``ConsumeMessageConcurrentlyService`` runs listeners on a
ThreadPoolExecutor of consumeThreadMin .. consumeThreadMax = 20 .. 20 threads.  On CPython one
thread at a time runs Python, so 20 threads calling a listener that does not block share one core
and lose time handing the GIL to each other: the PushConsumer with 100 B messages, 4 alternated
runs per pool size, gave 230-283 k msgs/s with 1 thread and 169-218 k with 20
(``bench/results/client.md``, stop 39).  A listener that waits (a database, an HTTP call, a sleep)
still needs many threads, and gets them:

- every ``GROW_CHECK_MS`` while tasks wait and no worker is idle, the monitor sums the CPU time
  the workers used since the last tick (``pthread_getcpuclockid``, Linux and other POSIX
  systems).  Below ``GROW_BELOW_CPU`` of the tick the workers spend their time off a CPU (waiting
  on I/O, a lock or a sleep): the pool doubles, up to ``max_threads``, and the new workers help
  with the requests of the runs already being consumed (:meth:`submit`'s ``shared``).  Without
  per-thread CPU clocks it grows whenever tasks wait, as a fixed pool would.
- unless every Python thread of the process together ran ``GIL_BUSY_CPU`` of the tick: then the
  workers were off a CPU waiting for the GIL (the consumer's pull thread had it), not on I/O,
  and a new worker would wait too.  Without this rule the pool grew to 2 workers in a CPU-bound
  run and lost 15-50 % (PushConsumer, 100 B, 4 alternated rounds of 300,000: 218-545 k msgs/s
  against 454-626 k never growing; bench/results/client.md, stop 40).
- above ``SHRINK_ABOVE_CPU`` with tasks waiting, the workers are CPU-bound and contend for the
  GIL: one worker retires per tick, down to ``min_threads``.
- a worker beyond ``min_threads`` that waited ``keep_alive_s`` (RocketMQ's consume pool: 60 s)
  for a task exits.

Workers are daemon threads, so a listener that never returns cannot keep the interpreter alive
after :meth:`ConsumePool.shutdown` gave up on it.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

log = logging.getLogger("rmq.client.consumer")

CONSUME_THREAD_MAX = 20             # DefaultMQPushConsumer.consumeThreadMax
CONSUME_THREAD_MIN = 1              # rmq: RocketMQ's consumeThreadMin is 20 (see the module docstring)
CONSUME_THREAD_LIMIT = 1000         # DefaultMQPushConsumer.checkConfig: [1, 1000]
KEEP_ALIVE_S = 60.0                 # ConsumeMessageConcurrentlyService's pool: keepAliveTime 60 s
GROW_CHECK_MS = 10                  # the monitor's tick while tasks wait
GROW_BELOW_CPU = 0.5                # workers' CPU share of a tick under which the pool grows
SHRINK_ABOVE_CPU = 0.9              # ... over which one worker retires (tasks waiting, CPU-bound)
GIL_BUSY_CPU = 0.7                  # all Python threads' CPU share of a tick over which the GIL is
                                    # taken: workers that ran less waited for it, not on I/O (no growth)


def pool_decision(waiting_tasks: int, idle: int, cpu_share: Optional[float], live: int, lo: int, hi: int,
                  gil_share: Optional[float] = None) -> int:
    """The monitor's rule for one tick: how many workers to add (> 0) or retire (< 0).

    ``waiting_tasks``: tasks queued plus requests of running runs not taken yet; ``idle``: workers
    waiting for a task; ``cpu_share``: CPU seconds the workers used in the tick / the tick's
    seconds (None: not measurable here); ``live``: workers now; ``lo`` / ``hi``: the bounds;
    ``gil_share``: the same for every Python thread of the process together (None: unknown).
    Workers below ``GROW_BELOW_CPU`` are off a CPU: blocked (the pool grows), unless the Python
    threads together ran ``GIL_BUSY_CPU`` of the tick, when they only waited for the GIL (the pull
    thread had it: more workers would wait too).
    """
    if waiting_tasks <= 0 or idle > 0:
        return 0
    if cpu_share is None or (cpu_share < GROW_BELOW_CPU and (gil_share is None or gil_share < GIL_BUSY_CPU)):
        return min(hi - live, max(1, live), waiting_tasks)
    if cpu_share > SHRINK_ABOVE_CPU and live > lo:
        return -1
    return 0


def _cpu_clock(ident: int) -> Optional[int]:
    try:
        return time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):          # not POSIX, or the thread is gone
        return None


class _Worker:
    __slots__ = ("thread", "clock", "task", "cpu")

    def __init__(self) -> None:
        self.thread: Optional[threading.Thread] = None
        self.clock: Optional[int] = None
        self.task: Optional[tuple] = None     # (fn, args, shared) being run
        self.cpu = 0.0                        # thread CPU seconds at the last tick


class ConsumePool:
    """Listener threads on one SimpleQueue of ``(fn, args, shared)`` tasks (lighter than a
    ThreadPoolExecutor: no Future per task).  See the module docstring for how the thread count
    moves.

    Parameters
    ----------
    max_threads, min_threads : int
        Bounds of the worker count, ``1 <= min_threads <= max_threads``.
    name : str
        Thread name prefix.
    keep_alive_s : float
        How long a worker beyond ``min_threads`` waits for a task before it exits (s).

    Raises
    ------
    ValueError
        Bounds out of order or below 1.
    """

    def __init__(self, max_threads: int, name: str, min_threads: int = CONSUME_THREAD_MIN,
                 keep_alive_s: float = KEEP_ALIVE_S) -> None:
        if not 1 <= min_threads <= max_threads:
            raise ValueError(f"consume pool bounds must satisfy 1 <= min <= max, got {min_threads}, {max_threads}")
        self.min_threads, self.max_threads = min_threads, max_threads
        self.keep_alive_s = keep_alive_s
        self.name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.idle = 0                          # workers waiting for a task (under _lock)
        self._workers: dict[int, _Worker] = {}  # by serial number (under _lock)
        self._serial = 0
        self._retire = 0                       # workers asked to exit after their task
        self.grown = self.retired = 0          # counts of monitor decisions (stats, tests)
        self.peak = 0                          # the most workers live at once
        self._wake = threading.Event()         # tasks wait and no worker is idle
        self._cpu_clocks = _cpu_clock(threading.get_ident()) is not None
        self._thread_cpu: dict = {}         # thread ident -> its CPU seconds at the last tick (_python_cpu)
        with self._lock:
            self._spawn(min_threads)
        self._monitor = threading.Thread(target=self._watch, name=f"{name}_monitor", daemon=True)
        self._monitor.start()

    @property
    def size(self) -> int:
        """Workers live now."""
        return len(self._workers)

    # -- tasks ---------------------------------------------------------------------------------
    def submit(self, fn: Callable, args: tuple, shared: Any = None) -> None:
        """Queue ``fn(*args)``.  ``shared``, when given, is an object with ``left()`` (the requests
        not yet taken): while it is above 0 a worker added by the monitor may run the same task
        too (each call takes its own requests)."""
        if self._closed:
            return
        self._q.put((fn, args, shared))
        if not self.idle and not self._wake.is_set():
            self._wake.set()                    # the monitor looks at the workers while tasks wait

    def waiting(self) -> int:
        """Workers idle now, less the tasks already queued for them (>= 0)."""
        return max(0, self.idle - self._q.qsize())

    def _spawn(self, n: int) -> None:
        """Under ``_lock``: start ``n`` workers."""
        for _ in range(n):
            w = _Worker()
            self._serial += 1
            key = self._serial
            w.thread = threading.Thread(target=self._work, args=(key, w), name=f"{self.name}_{key}", daemon=True)
            self._workers[key] = w
            w.thread.start()
        self.peak = max(self.peak, len(self._workers))

    def _work(self, key: int, w: _Worker) -> None:
        w.clock = _cpu_clock(threading.get_ident())
        get = self._q.get
        lock = self._lock
        wake = self._wake
        while True:
            with lock:
                if self._retire and len(self._workers) > self.min_threads:
                    self._retire -= 1
                    del self._workers[key]
                    return
                self.idle += 1
                timeout = self.keep_alive_s if len(self._workers) > self.min_threads else None
            try:
                item = get(True, timeout)
            except queue.Empty:
                with lock:
                    self.idle -= 1
                    if len(self._workers) > self.min_threads:
                        del self._workers[key]
                        return
                continue
            with lock:
                self.idle -= 1
            if item is None:
                with lock:
                    self._workers.pop(key, None)
                return
            w.task = item
            fn, args, shared = item
            if not wake.is_set() and (shared is not None or self._q.qsize()):
                wake.set()                      # this task may block with others waiting
            try:
                fn(*args)
            except Exception:                   # a consume task must never kill its thread
                log.exception("consume task %s failed", getattr(fn, "__name__", fn))
            w.task = None

    # -- the monitor -----------------------------------------------------------------------------
    def _cpu(self, w: _Worker) -> float:
        try:
            return time.clock_gettime(w.clock) if w.clock is not None else 0.0
        except OSError:                         # exited since
            return w.cpu

    def _watch(self) -> None:
        tick = GROW_CHECK_MS / 1000.0
        while not self._closed:
            self._wake.wait()
            if self._closed:
                return
            with self._lock:
                workers = list(self._workers.values())
            for w in workers:
                w.cpu = self._cpu(w)
            self._python_cpu()
            t_last = time.monotonic()
            while not self._closed:
                time.sleep(tick)
                if self._tick(time.monotonic() - t_last):
                    self._wake.clear()
                    if self._q.qsize() and not self.idle:   # a task queued as the flag was cleared
                        self._wake.set()
                    break
                t_last = time.monotonic()

    def _python_cpu(self) -> Optional[float]:
        """CPU seconds every Python thread of the process used since the last call (threads seen
        for the first time count from now); None without per-thread clocks."""
        if not self._cpu_clocks:
            return None
        last = self._thread_cpu
        now: dict = {}
        used = 0.0
        for t in threading.enumerate():
            ident = t.ident
            clock = _cpu_clock(ident) if ident is not None else None
            if clock is None:
                continue
            try:
                cpu = time.clock_gettime(clock)
            except OSError:                     # exited since
                continue
            now[ident] = cpu
            used += cpu - last.get(ident, cpu)
        self._thread_cpu = now
        return used

    def _tick(self, elapsed: float) -> bool:
        """One monitor step; True when no task waits any more (the monitor sleeps until one does)."""
        with self._lock:
            workers = list(self._workers.values())
            live, idle = len(workers), self.idle
        used = 0.0
        shared = []
        for w in workers:
            now = self._cpu(w)
            used += now - w.cpu
            w.cpu = now
            task = w.task
            if task is not None and task[2] is not None and task[2].left() > 0:
                shared.append(task)
        waiting = self._q.qsize() + sum(t[2].left() for t in shared)
        gil = self._python_cpu()
        if waiting <= 0:
            return True
        share = (used / elapsed if elapsed > 0 else 0.0) if self._cpu_clocks else None
        gil_share = gil / elapsed if gil is not None and elapsed > 0 else None
        step = pool_decision(waiting, idle, share, live, self.min_threads, self.max_threads, gil_share)
        if step > 0 and not self._closed:
            with self._lock:
                step = min(step, self.max_threads - len(self._workers))
                self._retire = 0
                self._spawn(step)
            self.grown += 1
            log.debug("%s: %d -> %d listener threads (workers on CPU %.0f%% of the tick, %d tasks waiting)",
                      self.name, live, live + step, 100 * (share or 0.0), waiting)
            for task in shared[:step]:          # the new workers help with the running runs
                self._q.put(task)
        elif step < 0:
            with self._lock:
                self._retire = 1
            self.retired += 1
        return False

    def shutdown(self, timeout_s: float) -> None:
        """Drop queued tasks, let running ones finish (up to ``timeout_s`` in all), stop the workers."""
        self._closed = True
        self._wake.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            workers = list(self._workers.values())
        for _ in workers:
            self._q.put(None)
        deadline = time.monotonic() + timeout_s
        me = threading.current_thread()
        for w in workers:
            if w.thread is not me:              # shutdown() called from a listener
                w.thread.join(max(0.0, deadline - time.monotonic()))
