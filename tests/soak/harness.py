"""Shared parts of the soak tests: settings, the broker group, worker processes, the actor sampler.

Environment variables (defaults: the issue's values; a short run validates the harness):

===============================  ========  =====================================================
RMQ_SOAK_SECONDS                 1800      soak duration at the paced rate
RMQ_SOAK_LOAD                    0.5       share of the measured capacity the soak producer paces at
RMQ_SOAK_CAPACITY_SECONDS        10        length of each in-run capacity measurement
RMQ_SOAK_WARMUP_SECONDS          120       RSS / FD baselines are taken this long after the load
                                           starts (at most a fifth of the run)
RMQ_SOAK_SAMPLE_SECONDS          5         actor RSS / FD sampling period
RMQ_SOAK_CONSUMERS               2         PushConsumers (one group, one process) of the soak
RMQ_SOAK_CONNECTIONS             1000      client instances of the connections test (half
                                           Producers, half PullConsumers)
RMQ_SOAK_CONNECTION_PROCS        4         processes holding them
RMQ_SOAK_CONNECTION_MSGS         5         messages each of those producers sends
RMQ_SOAK_CONNECTION_ROUNDS       3         connect-all / close-all rounds (new processes each)
RMQ_STALL_SECONDS                300       how long the stalled consumer stops reading
RMQ_STALL_RATE                   5000      msgs/s of the steady load during the stall test
RMQ_OVERLOAD_SECONDS             60        how long the overload is offered
RMQ_OVERLOAD_FACTOR              3         offered load / measured capacity
RMQ_OVERLOAD_PROCS               2         raw sender processes (capacity and overload)
===============================  ========  =====================================================

Tolerances (named here, used by every scenario):

* memory: an actor's *anonymous* RSS (RssAnon: its heap, where a leak shows) at the end is at most
  ``start * RSS_GROWTH_FACTOR + RSS_GROWTH_SLACK`` (1.25 x + 32 MiB), ``start`` taken after the
  warm-up.  Its total RSS also counts the pages of the store files it maps (RssFile: the page
  cache of the mmap'd CommitLog / ConsumeQueues, which grows with the store by design and is
  reclaimable); that part is reported and checked against the store's size:
  ``RssFile <= bytes of the store's files + FILE_RSS_SLACK`` (128 MiB of libraries).
* descriptors: ``end <= start + FD_GROWTH_SLACK`` (16).
* lag: consumer lag at most ``LAG_BOUND_S`` (10) seconds of the paced rate.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

import psutil

from rmq.client.admin import Admin
from tests.integration.cluster import Cluster
from tests.integration.conftest import ROOT, source_tree_env
from tests.soak.worker import Bitmap, pct  # noqa: F401 - re-exported for the tests

MiB = 1 << 20


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


# -- settings ---------------------------------------------------------------------------------------------
SOAK_SECONDS = env_int("RMQ_SOAK_SECONDS", 1800)
SOAK_LOAD = env_float("RMQ_SOAK_LOAD", 0.5)
CAPACITY_SECONDS = env_int("RMQ_SOAK_CAPACITY_SECONDS", 10)
WARMUP_SECONDS = env_int("RMQ_SOAK_WARMUP_SECONDS", 120)
SAMPLE_SECONDS = env_float("RMQ_SOAK_SAMPLE_SECONDS", 5)
SOAK_CONSUMERS = env_int("RMQ_SOAK_CONSUMERS", 2)
CONNECTIONS = env_int("RMQ_SOAK_CONNECTIONS", 1000)
CONNECTION_PROCS = env_int("RMQ_SOAK_CONNECTION_PROCS", 4)
CONNECTION_MSGS = env_int("RMQ_SOAK_CONNECTION_MSGS", 5)
CONNECTION_ROUNDS = env_int("RMQ_SOAK_CONNECTION_ROUNDS", 3)
STALL_SECONDS = env_int("RMQ_STALL_SECONDS", 300)
STALL_RATE = env_int("RMQ_STALL_RATE", 5000)
OVERLOAD_SECONDS = env_int("RMQ_OVERLOAD_SECONDS", 60)
OVERLOAD_FACTOR = env_float("RMQ_OVERLOAD_FACTOR", 3.0)
OVERLOAD_PROCS = env_int("RMQ_OVERLOAD_PROCS", 2)

# -- tolerances -------------------------------------------------------------------------------------------
RSS_GROWTH_FACTOR = 1.25          # anonymous RSS: end <= start * factor + slack
RSS_GROWTH_SLACK = 32 * MiB
FILE_RSS_SLACK = 128 * MiB        # file-backed RSS <= the store's bytes + this (shared libraries)
FD_GROWTH_SLACK = 16              # open descriptors: end <= start + slack
LAG_BOUND_S = 10                  # consumer lag <= this many seconds of the paced rate
QUEUES = 8                        # queues of every test topic

# A realistic store geometry (rmq.testing's default is the tests' tiny one): 256 MiB CommitLog files
# (bench/README.md: why not 1 GiB on this VM), RocketMQ's ConsumeQueue (300,000 entries) and
# IndexFile (5,000,000 slots, 20,000,000 entries) sizes; everything else at the broker's defaults.
SOAK_CONF = {
    "mappedFileSizeCommitLog": str(256 * MiB),
    "mappedFileSizeConsumeQueue": str(300_000 * 20),
    "maxHashSlotNum": "5000000",
    "maxIndexNum": "20000000",
}
BULKY_DIRS = ("commitlog", "consumequeue", "index")     # removed after a run, pass or fail


def warmup_seconds(duration: float) -> float:
    return min(WARMUP_SECONDS, duration / 5.0)


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


def rss_flat(start: float, end: float) -> bool:
    return end <= start * RSS_GROWTH_FACTOR + RSS_GROWTH_SLACK


# -- the broker group -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def soak_cluster(store_path, conf: Optional[dict] = None, topics=()):
    """A broker group (nameserver, broker, reput, flush, cleaner) with :data:`SOAK_CONF` (+ ``conf``),
    ``topics`` created with :data:`QUEUES` queues.  On exit the group is killed and the store's
    bulky directories removed (a 30-minute soak writes gigabytes); its logs stay."""
    c = Cluster(str(store_path), conf={**SOAK_CONF, **(conf or {})}, with_cleaner=True)
    try:
        with Admin(c.namesrv_addr) as admin:
            for t in topics:
                admin.create_topic(t, QUEUES, QUEUES, broker_addr=c.broker_addr)
        yield c
    finally:
        c.close()
        for d in BULKY_DIRS:
            shutil.rmtree(os.path.join(str(store_path), d), ignore_errors=True)


def store_bytes(store_path: str) -> int:
    """Bytes of the store's data files (what the actors map)."""
    total = 0
    for d in BULKY_DIRS:
        for root, _, files in os.walk(os.path.join(store_path, d)):
            for f in files:
                try:
                    total += os.stat(os.path.join(root, f)).st_size
                except OSError:
                    pass
    return total


def tcp_connections(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections of process ``pid`` on local port ``port``."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)


# -- actor sampling ------------------------------------------------------------------------------------------
def proc_memory(pid: int) -> dict:
    """rss, anon (RssAnon), file (RssFile + RssShmem) in bytes, and open descriptors, of ``pid``."""
    out = {"rss": 0, "anon": 0, "file": 0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                v = int(rest.split()[0]) * 1024
                if key == "VmRSS":
                    out["rss"] = v
                elif key == "RssAnon":
                    out["anon"] = v
                else:
                    out["file"] += v
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> tuple:
    """(CPU seconds of the process, seconds its main thread waited on a run queue for a CPU)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK          # utime + stime
    with open(f"/proc/{pid}/schedstat") as f:
        wait = int(f.read().split()[1]) / 1e9                  # run_delay, ns
    return cpu, wait


class ActorSampler(threading.Thread):
    """Samples every actor of a :class:`Cluster` (``pids()``) every ``interval`` s: RSS (total,
    anonymous, file-backed), open descriptors, and the store's size.  ``dead`` names actors that
    exited (with their exit codes)."""

    METRICS = ("rss", "anon", "file", "fds")

    def __init__(self, cluster: Cluster, interval: float = SAMPLE_SECONDS):
        super().__init__(name="soak-sampler", daemon=True)
        self.cluster = cluster
        self.pids = cluster.pids()
        self.interval = interval
        self.samples: dict = {name: [] for name in self.pids}     # name -> [(t, {metric: v})]
        self.store: list = []                                       # [(t, bytes)]
        self.dead: dict = {}
        self.stop_evt = threading.Event()
        self.lock = threading.Lock()

    def sample(self) -> None:
        now = time.monotonic()
        procs = dict(self.cluster.procs)
        if self.cluster.namesrv is not None:
            procs["nameserver"] = self.cluster.namesrv
        sb = store_bytes(self.cluster.store_path)
        with self.lock:
            self.store.append((now, sb))
            for name, pid in self.pids.items():
                ap = procs.get(name)
                code = ap.proc.poll() if ap is not None else "gone"
                if code is not None:
                    self.dead[name] = code
                    continue
                try:
                    m = proc_memory(pid)
                    m["cpu"], m["wait"] = proc_cpu(pid)
                    self.samples[name].append((now, m))
                except (OSError, ValueError, IndexError):
                    self.dead[name] = "no /proc entry"

    def run(self) -> None:
        self.sample()
        while not self.stop_evt.wait(self.interval):
            self.sample()

    def finish(self) -> None:
        self.stop_evt.set()
        self.join(30)
        self.sample()

    def summary(self, since: float, until: Optional[float] = None) -> dict:
        """name -> metric -> (start, end, max) over the samples from ``since`` to ``until`` (the end)."""
        out = {}
        until = float("inf") if until is None else until
        with self.lock:
            for name, rows in self.samples.items():
                after = [m for t, m in rows if since <= t <= until] or [m for _, m in rows[-1:]]
                if not after:
                    continue
                out[name] = {k: (after[0][k], after[-1][k], max(m[k] for m in after)) for k in self.METRICS}
        return out

    def cpu(self, name: str, since: float, until: Optional[float] = None) -> tuple:
        """(CPU use, share of time its main thread waited for a CPU, the largest such share over one
        sampling period) of actor ``name`` from ``since`` to ``until``, as fractions of one core."""
        until = float("inf") if until is None else until
        with self.lock:
            rows = [(t, m) for t, m in self.samples.get(name, []) if since <= t <= until]
        if len(rows) < 2:
            return 0.0, 0.0, 0.0
        (t0, m0), (t1, m1) = rows[0], rows[-1]
        worst = max(((b["wait"] - a["wait"]) / (tb - ta) for (ta, a), (tb, b) in itertools.pairwise(rows) if tb > ta),
                    default=0.0)
        return (m1["cpu"] - m0["cpu"]) / (t1 - t0), (m1["wait"] - m0["wait"]) / (t1 - t0), worst

    def store_max(self) -> int:
        with self.lock:
            return max((b for _, b in self.store), default=0)

    def report(self, prefix: str, since: float, until: Optional[float] = None, only=None) -> list:
        """Print one line per actor (``only``: these) from ``since`` to ``until``; returns the
        tolerance violations."""
        problems = []
        store = self.store_max()
        for name, m in sorted(self.summary(since, until).items()):
            if only is not None and name not in only:
                continue
            (r0, r1, rm), (a0, a1, am), (f0, f1, fm), (d0, d1, dm) = (m[k] for k in self.METRICS)
            print(f"{prefix}: {name:<10} RSS MiB start/end/max {mib(r0)}/{mib(r1)}/{mib(rm)} "
                  f"(anonymous {mib(a0)}/{mib(a1)}/{mib(am)}, file-backed {mib(f0)}/{mib(f1)}/{mib(fm)}), "
                  f"open fds {d0}/{d1}/{dm}")
            if not rss_flat(a0, a1):
                problems.append(f"{name}: anonymous RSS grew from {mib(a0)} to {mib(a1)} MiB (tolerance: "
                                f"x{RSS_GROWTH_FACTOR} + {mib(RSS_GROWTH_SLACK)} MiB)")
            if f1 > store + FILE_RSS_SLACK:
                problems.append(f"{name}: file-backed RSS {mib(f1)} MiB is more than the store's "
                                f"{mib(store)} MiB + {mib(FILE_RSS_SLACK)} MiB")
            if d1 > d0 + FD_GROWTH_SLACK:
                problems.append(f"{name}: open descriptors grew from {d0} to {d1} (tolerance +{FD_GROWTH_SLACK})")
        for name in ("broker",) if only is None or "broker" in only else ():
            cpu, wait, worst = self.cpu(name, since, until)
            print(f"{prefix}: {name} CPU {cpu:.0%} of a core, its loop waiting for a CPU {wait:.0%} of the time "
                  f"(at most {worst:.0%} over a {self.interval:g} s sample); load average now "
                  f"{os.getloadavg()[0]:.1f}")
        print(f"{prefix}: store files {mib(store)} MiB at most")
        for name, code in self.dead.items():
            problems.append(f"actor {name} exited during the run (code {code})")
        return problems


# -- worker processes -------------------------------------------------------------------------------------------
class WorkerError(RuntimeError):
    pass


class Worker:
    """A :mod:`tests.soak.worker` process: ``last`` is its latest ``progress`` event, :meth:`wait`
    returns its next event of a kind (or raises with its stderr's tail when it fails)."""

    def __init__(self, name: str, cfg: dict, log_dir):
        self.name = name
        os.makedirs(str(log_dir), exist_ok=True)
        self.stderr_path = os.path.join(str(log_dir), f"{name}.stderr")
        self._stderr = open(self.stderr_path, "w")     # noqa: SIM115 - the child's stderr until close()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.soak.worker", json.dumps(cfg)], cwd=ROOT,
                                     env={**os.environ, **source_tree_env()}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1)
        self.last: dict = {}
        self.ready: Optional[dict] = None             # its "ready" event (start_all)
        self._closed = False
        self.events: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"soak-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith("@@ "):
                continue
            ev = json.loads(line[3:])
            if ev["ev"] == "progress":
                self.last = ev
            else:
                self.events.put(ev)
        self.events.put({"ev": "eof"})

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            with open(self.stderr_path) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def send(self, cmd: str) -> None:
        try:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def wait(self, kind: str, timeout: float, required: bool = True) -> Optional[dict]:
        """The next event of ``kind`` (others are skipped).  Past ``timeout``: WorkerError, or None
        when not ``required``.  A worker that failed or exited raises WorkerError with its stderr."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self.events.get(timeout=max(left, 0.0)) if left > 0 else self.events.get_nowait()
            except queue.Empty:
                if not required:
                    return None
                raise WorkerError(f"worker {self.name}: no {kind!r} event within {timeout:.0f} s\n"
                                  f"{self.stderr_tail()}") from None
            if ev["ev"] == kind:
                return ev
            if ev["ev"] in ("error", "eof"):
                raise WorkerError(f"worker {self.name} failed waiting for {kind!r} ({ev}; exit code "
                                  f"{self.proc.poll()}):\n{self.stderr_tail()}")

    def close(self, timeout: float = 60) -> None:
        """End the process: stdin closed (the worker's "stop"), then killed if it lingers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        for f in (self.proc.stdout, self._stderr):
            try:
                f.close()
            except OSError:
                pass


@contextlib.contextmanager
def workers():
    """A list to append :class:`Worker` s to; all are ended on exit."""
    started: list = []
    try:
        yield started
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in started:
            w.close(10)


def start_all(started: list, specs: list, log_dir, ready_timeout: float = 120) -> list:
    """Start (name, cfg) workers side by side and wait until each is ready."""
    ws = [Worker(name, cfg, log_dir) for name, cfg in specs]
    started.extend(ws)
    for w in ws:
        w.ready = w.wait("ready", ready_timeout)
    return ws


def wait_until(cond, timeout: float, what: str, step: float = 0.2) -> float:
    """Poll ``cond()`` until true; seconds waited; AssertionError naming ``what`` past ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(step)
    return time.monotonic() - t0


def consumer_lag(producer: Worker, consumer: Worker, rate: float) -> int:
    """Messages acknowledged and not yet consumed, from the two workers' latest reports (about a
    second apart at most): the producer's count is brought to the consumer's report time at the
    paced ``rate``."""
    p, q = producer.last, consumer.last
    if not p or not q:
        return 0
    return int(p["acked"] + rate * (q["t"] - p["t"]) - q["distinct"])


def measure_capacity(cluster: Cluster, topic: str, seconds: float, log_dir) -> dict:
    """The produce capacity: one producer process, ``send_async`` with the defaults, 100 B bodies, as
    fast as it accepts them, for ``seconds`` (+1 s not counted); acknowledged msgs/s."""
    out = os.path.join(str(log_dir), "capacity")
    os.makedirs(out, exist_ok=True)
    with workers() as started:
        (w,) = start_all(started, [("capacity", {"role": "producer", "namesrv": cluster.namesrv_addr,
                                                  "topic": topic, "pid": 999, "rate": 0,
                                                  "seconds": seconds + 1.0, "out": out,
                                                  "group": "soak-capacity"})], log_dir)
        w.send("go")
        done = w.wait("done", seconds + 300)
    assert done["errors"] == 0, f"capacity run: {done['errors']} send errors: {done['first_errors']}"
    assert done["capacity"] > 0, f"capacity run measured nothing: {done}"
    return done
