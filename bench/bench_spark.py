"""Spark connector read throughput against a real broker group, beside the broker's raw consume
throughput measured in the same run.

Run::

    python bench/bench_spark.py                          # a table of rows/s and MB/s
    RMQ_SPARK_BENCH_MESSAGES=1000000 python bench/bench_spark.py
    python -m pytest bench/bench_spark.py -q -s          # the same, as a test (asserts the counts)
    python bench/bench_spark.py --micro                  # Arrow batch building only: old path vs pages_to_batch
    python bench/bench_spark.py --sink                   # the sink only: df.write.format("rmq")

Setup (untimed): one broker group (nameserver + broker + reput + flush on loopback), topic
``bench`` with ``RMQ_SPARK_BENCH_QUEUES`` (default 8) queues filled with
``RMQ_SPARK_BENCH_MESSAGES`` (default 2 000 000: a Spark job has a fixed cost of about a second
on 2 cores, which made 400 000 rows read at 0.2 M rows/s and 2 M at 1 M rows/s) messages of ``RMQ_SPARK_BENCH_BODY`` (default
100) bytes with a tag and a UNIQ_KEY (as producers send them), in SEND_BATCH_MESSAGE batches
of 256; a local[2] SparkSession (UI off, loopback), warmed up with one read of the topic.

Scenarios (MB/s counts message bodies; rows/s counts messages):

================================  ==========================================================================
``raw pull (broker)``             RemotingClient PULL_MESSAGE, maxMsgNums 1024, queue after queue, records
                                  not decoded: what the broker serves to one client
``raw pull + decode``             the same, each page decoded with ``decode_records``: the client ceiling
``spark rmq -> noop``             ``spark.read.format("rmq")...load().write.format("noop")``: every queue
                                  a task, pulls + Arrow batches (16 k rows) on 2 cores
``spark rmq -> noop, no props``   the same with ``includeProperties=false``
``spark rmq count(body)``         ``select(sum(length(body)))``: Arrow batches cross into the JVM
``spark df -> rmq (sink)``        ``df.write.format("rmq")`` of ``RMQ_SPARK_BENCH_SINK_ROWS`` (500 000) rows
                                  (body of ``RMQ_SPARK_BENCH_BODY`` bytes, a tag, a key) from
                                  ``spark.range`` in 2 partitions to a topic of its own per round, with
                                  the ``topic`` option: what a task's producer sends (rows/s of the write)
================================  ==========================================================================

Each scenario runs ``RMQ_SPARK_BENCH_ROUNDS`` (default 3) times and the best round is reported
(the machine has 2 cores shared by the broker, Spark's JVM and its Python workers).
"""
from __future__ import annotations

import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rmq._core import commitlog as cl  # noqa: E402
from rmq.bench.floor import record_pages  # noqa: E402
from rmq.launch import use_safe_path_for_children  # noqa: E402
from filled import FilledCluster  # noqa: E402

N_MESSAGES = int(os.environ.get("RMQ_SPARK_BENCH_MESSAGES", "2000000"))
QUEUES = int(os.environ.get("RMQ_SPARK_BENCH_QUEUES", "8"))
BODY_SIZE = int(os.environ.get("RMQ_SPARK_BENCH_BODY", "100"))
ROUNDS = int(os.environ.get("RMQ_SPARK_BENCH_ROUNDS", "3"))
TOPIC = "bench"
SEND_BATCH = 256
SINK_ROWS = int(os.environ.get("RMQ_SPARK_BENCH_SINK_ROWS", "500000"))
TIMEOUT_S = 600.0


class BenchCluster(FilledCluster):
    """A broker group holding N_MESSAGES over QUEUES queues, each with a tag and a UNIQ_KEY."""

    def __init__(self, n_messages: int = N_MESSAGES):
        super().__init__("rmq-bench-spark-", n_messages, QUEUES, BODY_SIZE,
                         props_of=lambda i: {"TAGS": "t", "UNIQ_KEY": "%032X" % i}, timeout_s=TIMEOUT_S)


# -- scenarios -------------------------------------------------------------------------------------------
def raw_pull(bc: BenchCluster, decode: bool) -> int:
    return bc.raw_pull(decode)


def spark_session():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    use_safe_path_for_children()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("rmq-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import rmq.spark
    rmq.spark.register(spark)
    return spark


def spark_noop(spark, bc: BenchCluster, **opts) -> int:
    r = spark.read.format("rmq").option("nameServer", bc.namesrv).option("topic", TOPIC)
    for k, v in opts.items():
        r = r.option(k, v)
    r.load().write.format("noop").mode("overwrite").save()
    return bc.n


def spark_sum_body(spark, bc: BenchCluster) -> int:
    from pyspark.sql import functions as F
    df = spark.read.format("rmq").option("nameServer", bc.namesrv).option("topic", TOPIC).load()
    total = df.select(F.count("*").alias("n"), F.sum(F.length("body")).alias("b")).collect()[0]
    assert total.n == bc.n and total.b == bc.n * BODY_SIZE, total
    return bc.n


def spark_sink(spark, bc: BenchCluster, n: int = SINK_ROWS) -> int:
    """``n`` rows written with the sink to a new topic (auto-created by its first request)."""
    from pyspark.sql import functions as F
    spark_sink.round = getattr(spark_sink, "round", 0) + 1
    pad = max(BODY_SIZE - 12, 0)
    df = spark.range(n, numPartitions=2).select(
        F.concat(F.lit("x" * pad), F.lpad(F.col("id").cast("string"), 12, "0")).cast("binary").alias("body"),
        F.lit("t").alias("tags"), F.col("id").cast("string").alias("keys"))
    (df.write.format("rmq").option("nameServer", bc.namesrv).option("topic", f"sink{spark_sink.round}")
     .mode("append").save())
    return n


def best_of(fn, rounds: int = ROUNDS) -> dict:
    secs = []
    n = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = fn()
        secs.append(time.perf_counter() - t0)
    dt = min(secs)
    return {"rows": n, "seconds": dt, "rows_per_s": n / dt, "mb_per_s": n * BODY_SIZE / dt / 1e6,
            "rounds": [round(s, 3) for s in secs]}


def run(write=print) -> dict:
    bc = BenchCluster()
    spark = None
    try:
        results = {}
        results["raw pull (broker)"] = best_of(lambda: raw_pull(bc, decode=False))
        results["raw pull + decode"] = best_of(lambda: raw_pull(bc, decode=True))
        spark = spark_session()
        spark_noop(spark, bc)                                # warm-up: Python workers, planner, routes
        results["spark rmq -> noop"] = best_of(lambda: spark_noop(spark, bc))
        results["spark rmq -> noop, no props"] = best_of(lambda: spark_noop(spark, bc, includeProperties="false"))
        results["spark rmq count(body)"] = best_of(lambda: spark_sum_body(spark, bc))
        results["spark df -> rmq (sink)"] = best_of(lambda: spark_sink(spark, bc))
        results["raw pull (broker) again"] = best_of(lambda: raw_pull(bc, decode=False))
        raw = max(results["raw pull (broker)"]["rows_per_s"], results["raw pull (broker) again"]["rows_per_s"])
        write(f"\n{bc.n} messages x {BODY_SIZE} B over {QUEUES} queues, local[2], best of {ROUNDS}")
        write(f"{'scenario':32} {'rows/s':>12} {'MB/s':>9} {'vs raw pull':>12}  rounds (s)")
        for name, r in results.items():
            write(f"{name:32} {r['rows_per_s']:12,.0f} {r['mb_per_s']:9.1f} {r['rows_per_s'] / raw:12.2f}  "
                  f"{r['rounds']}")
        return results
    finally:
        if spark is not None:
            spark.stop()
        bc.close()


def sink_only(write=print) -> dict:
    """The sink scenario alone (an empty broker group)."""
    bc = BenchCluster(0)
    spark = None
    try:
        spark = spark_session()
        spark_sink(spark, bc, 20_000)                        # warm-up: Python workers, planner, routes
        r = best_of(lambda: spark_sink(spark, bc))
        write(f"spark df -> rmq (sink): {r['rows_per_s']:,.0f} rows/s, {r['mb_per_s']:.1f} MB/s, rounds {r['rounds']}")
        return r
    finally:
        if spark is not None:
            spark.stop()
        bc.close()


# -- micro-benchmark: Arrow batch building, no broker, no Spark ---------------------------------------------
def arrow_micro(sizes=(100, 1024), n: int = None, batch_rows: int = 16384, rounds: int = ROUNDS, write=print) -> dict:
    """Rows/s of building the source's RecordBatches from pull pages: the old path
    (``decode_records`` + ``post_process_messages`` + ``messages_to_batch``) against
    ``pages_to_batch`` (columnar decode), with and without the properties column; one core,
    best of ``rounds``."""
    import gc

    from rmq.client.consumer_api import post_process_messages
    from rmq.client.message import MessageQueue
    from rmq.spark.arrow import arrow_schema, messages_to_batch, pages_to_batch
    n = n or int(os.environ.get("RMQ_SPARK_MICRO_MESSAGES", "200000"))
    mq = MessageQueue(TOPIC, "broker-a", 0)
    per_batch = max(1, batch_rows // 1024)
    results = {}
    for size in sizes:
        pages = record_pages(n, size, TOPIC)
        groups = [pages[i:i + per_batch] for i in range(0, len(pages), per_batch)]
        for props in (True, False):
            schema = arrow_schema(props)

            def old():
                return sum(messages_to_batch([post_process_messages(cl.decode_records(p)) for p in g], mq,
                                             schema).num_rows for g in groups)

            def new():
                return sum(pages_to_batch(g, mq, schema, props).num_rows for g in groups)

            for name, fn in (("old", old), ("new", new)):
                secs = []
                for _ in range(rounds):
                    gc.disable()                       # as read_partition does
                    try:
                        t0 = time.perf_counter()
                        rows = fn()
                        secs.append(time.perf_counter() - t0)
                    finally:
                        gc.enable()
                assert rows == n
                results[(size, props, name)] = n / min(secs)
            write(f"{size:5d} B  props={str(props):5}  old {results[(size, props, 'old')]:12,.0f} rows/s   "
                  f"new {results[(size, props, 'new')]:12,.0f} rows/s   x{results[(size, props, 'new')] / results[(size, props, 'old')]:.1f}")
    return results


def test_arrow_micro_benchmark():
    r = arrow_micro(n=20000, rounds=1)
    assert all(v > 0 for v in r.values())


def test_spark_connector_throughput():
    import pytest
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("java is missing")
    results = run()
    assert all(r["rows"] == (SINK_ROWS if "sink" in name else N_MESSAGES) for name, r in results.items())


if __name__ == "__main__":
    if "--micro" in sys.argv:
        arrow_micro()
    elif "--sink" in sys.argv:
        sink_only()
    else:
        run()
