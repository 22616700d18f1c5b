"""The ``rmq`` data source in Structured Streaming against a real broker group on loopback:
maxOffsetsPerTrigger bounds every micro-batch, a restart from the checkpoint resumes without
loss or duplicates (a queue added mid-stream included), the latest offset is reported, offsets
reach the broker for monitoring, the streaming Arrow writer, and failOnDataLoss both ways when
the cleaner deleted what a checkpoint still needed."""
import json

import pytest

from rmq.client.consumer_api import ConsumerAPI
from rmq.client.message import MessageQueue
from tests.spark.util import BROKER, cleaned_min_offset, cleaning_cluster, create_topic, msg, produce, \
    wait_dispatched

pytestmark = [pytest.mark.spark, pytest.mark.integration]

LIMIT = 100


def stream(spark, cluster, **opts):
    r = spark.readStream.format("rmq").option("nameServer", cluster.namesrv_addr)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df, fmt, path, checkpoint, **opts):
    w = df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
    for k, v in opts.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(str(path)) if path is not None else w.trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert not q.isActive, "the AvailableNow query did not finish"
    if q.exception() is not None:
        raise AssertionError(f"query failed: {q.exception()}")
    return [p for p in q.recentProgress if p["numInputRows"] or p["sources"][0]["endOffset"]]


def test_stream_rate_limit_restart_new_queue_and_stream_sink(spark, cluster, tmp_path):
    create_topic(cluster, "stream", 3)
    first = produce(cluster, [(msg("stream", i), i % 3) for i in range(300)])
    wait_dispatched(cluster, "stream", 3, 300)
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = stream(spark, cluster, topic="stream", startingOffsets="earliest", maxOffsetsPerTrigger=LIMIT,
                consumerGroup="spark-monitor").select("queue_id", "queue_offset", "msg_id", "body")

    progress = run_available_now(df, "parquet", out, ck)
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sizes == [LIMIT] * 3                          # maxOffsetsPerTrigger bounds each micro-batch
    last = progress[-1]["sources"][0]
    assert json.loads(last["endOffset"]) == {f"stream/{BROKER}/{q}": 100 for q in range(3)}
    assert json.loads(last["latestOffset"]) == {f"stream/{BROKER}/{q}": 100 for q in range(3)}
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.msg_id for r in rows) == sorted(r.msg_id for r in first)

    # offsets of committed micro-batches were reported under consumerGroup (monitoring only)
    api = ConsumerAPI(cluster.namesrv_addr)
    try:
        api.fetch_route("stream")
        reported = [api.query_consumer_offset("spark-monitor", MessageQueue("stream", BROKER, q)) for q in range(3)]
    finally:
        api.close()
    assert all(0 < r <= 100 for r in reported), reported

    # more data and a 4th queue while the query is down; restart from the checkpoint
    create_topic(cluster, "stream", 4)
    second = produce(cluster, [(msg("stream", 1000 + i), i % 4) for i in range(160)])
    wait_dispatched(cluster, "stream", 4, 460)
    progress = run_available_now(df, "parquet", out, ck)
    assert sum(p["numInputRows"] for p in progress) == 160
    assert all(0 < p["numInputRows"] <= LIMIT for p in progress if p["numInputRows"])
    first_start = json.loads(progress[0]["sources"][0]["startOffset"])
    assert first_start == {f"stream/{BROKER}/{q}": 100 for q in range(3)}    # resumed where it stopped
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 460 and len({(r.queue_id, r.queue_offset) for r in rows}) == 460
    assert sorted(r.msg_id for r in rows) == sorted(r.msg_id for r in first + second)
    assert {r.queue_offset for r in rows if r.queue_id == 3} == set(range(40))

    # the streaming Arrow writer: mirror the topic, dedup keys carry the query and batch ids
    create_topic(cluster, "mirror", 2)
    src = stream(spark, cluster, topic="stream", startingOffsets="earliest").select("body", "tags")
    run_available_now(src, "rmq", None, tmp_path / "ck-mirror", nameServer=cluster.namesrv_addr, topic="mirror")
    wait_dispatched(cluster, "mirror", 2, 460)
    back = (spark.read.format("rmq").option("nameServer", cluster.namesrv_addr).option("topic", "mirror").load()
            .collect())
    assert sorted(bytes(r.body) for r in back) == sorted(bytes(r.body) for r in rows)
    keys = [r.properties["SPARK_DEDUP_KEY"].split("/") for r in back]
    assert len({tuple(k) for k in keys}) == 460
    assert len({k[0] for k in keys}) == 1 and {k[1] for k in keys} == {"0"}


def test_stream_defaults_to_latest_and_rejects_batch_only_options(spark, cluster, tmp_path):
    create_topic(cluster, "late", 2)
    produce(cluster, [(msg("late", i), i % 2) for i in range(20)])
    wait_dispatched(cluster, "late", 2, 20)
    df = stream(spark, cluster, topic="late")
    progress = run_available_now(df, "parquet", tmp_path / "out", tmp_path / "ck")
    assert sum(p["numInputRows"] for p in progress) == 0    # startingOffsets defaults to latest
    with pytest.raises(Exception, match="endingOffsets"):
        q = stream(spark, cluster, topic="late", endingOffsets="latest").writeStream.format("noop").start()
        q.awaitTermination(60)
        q.stop()


def test_stream_fail_on_data_loss_both_ways(spark, tmp_path):
    """A query checkpointed at offset 100 restarts after the cleaner deleted the CommitLog files
    holding offsets 100.. lo (fileReservedTime=0, small files): by default it fails and says how to
    go on (Spark's Kafka source does the same); with failOnDataLoss=false it skips to the queue's
    min offset, reads the rest once, and what it read before stays."""
    c = cleaning_cluster(tmp_path)
    try:
        create_topic(c, "ExpS", 1)
        # 100 small messages: all in the first 64 KiB file, the newest one, which the cleaner keeps
        produce(c, [(msg("ExpS", i, body=b"s" * 100), 0) for i in range(100)])
        wait_dispatched(c, "ExpS", 1, 100)
        out, ck = tmp_path / "out", tmp_path / "ck"

        def query(**opts):
            return stream(spark, c, topic="ExpS", startingOffsets="earliest", **opts).select("queue_offset")
        run_available_now(query(), "parquet", out, ck)
        assert sorted(r.queue_offset for r in spark.read.parquet(str(out)).collect()) == list(range(100))

        # while the query is down: 300 more, big enough to roll several files; the cleaner deletes
        # every file but the newest, so the checkpoint's offset 100 is gone
        produce(c, [(msg("ExpS", 100 + i, body=b"e" * 600), 0) for i in range(300)])
        wait_dispatched(c, "ExpS", 1, 400)
        lo = cleaned_min_offset(c, "ExpS", above=100)
        assert 100 < lo < 400

        with pytest.raises(Exception, match="failOnDataLoss"):
            run_available_now(query(), "parquet", out, ck)
        assert sorted(r.queue_offset for r in spark.read.parquet(str(out)).collect()) == list(range(100))

        run_available_now(query(failOnDataLoss="false"), "parquet", out, ck)
        offs = sorted(r.queue_offset for r in spark.read.parquet(str(out)).collect())
        assert offs[:100] == list(range(100))                    # what it read before stays, once
        assert offs[100:] and offs[100] >= lo and offs[100:] == list(range(offs[100], 400))
    finally:
        c.close()
