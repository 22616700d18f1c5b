"""The ``rmq`` data source in batch mode against a real broker group on loopback: reads equal what
was produced (every message once, every column), tag filter, timestamps, partition splits,
the Arrow writer's round trip, failOnDataLoss both ways, and clear errors for bad options."""
import datetime as dt
import json
import time

import pytest

from tests.spark.util import (BROKER, cleaned_min_offset, cleaning_cluster, create_topic, max_offsets, msg, now_ms,
                              produce, wait_dispatched, wait_total)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

N = 600                    # messages of topic "flights" (4 queues)
QUEUES = 4
BIG = b"big-body " * 1000  # >= 4 KiB: the producer stores it zlib-compressed


@pytest.fixture(scope="module")
def flights(cluster):
    """600 messages over 4 queues (tags A/B, keys, a user property, one compressed body), sent
    in two halves around a timestamp boundary; returns (send results, messages, boundary ms)."""
    create_topic(cluster, "flights", QUEUES)
    msgs = []
    for i in range(N):
        body = BIG if i == 7 else None
        msgs.append((msg("flights", i, tags="A" if i % 3 == 0 else "B", keys=[f"k{i}", "x"],
                         props={"seq": str(i)}, body=body), i % QUEUES))
    first = produce(cluster, msgs[:N // 2])
    time.sleep(0.05)
    boundary = now_ms()
    time.sleep(0.05)
    second = produce(cluster, msgs[N // 2:])
    wait_dispatched(cluster, "flights", QUEUES, N)
    return first + second, [m for m, _ in msgs], boundary


def reader(spark, cluster, **opts):
    r = spark.read.format("rmq").option("nameServer", cluster.namesrv_addr)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_auto_discovery_then_register(spark, cluster, flights):
    # the pyspark_rmq shim on the workers' path registers "rmq" without any call
    assert reader(spark, cluster, topic="flights").count() == N
    import rmq.spark
    rmq.spark.register(spark)              # explicit registration works too (and is idempotent)
    rmq.spark.register(spark)
    assert reader(spark, cluster, topic="flights").count() == N


def test_batch_read_equals_what_was_produced(spark, cluster, flights):
    results, msgs, _ = flights
    t0 = time.time()
    df = reader(spark, cluster, topic="flights")
    assert df.rdd.getNumPartitions() == QUEUES          # one input partition per queue
    rows = df.collect()
    assert len(rows) == N
    by_id = {r.msg_id: r for r in rows}
    assert len(by_id) == N                               # every message once
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == N
    assert len({r.commitlog_offset for r in rows}) == N
    for i, (res, m) in enumerate(zip(results, msgs)):
        r = by_id[res.msg_id]
        assert r.topic == "flights" and r.broker_name == BROKER
        assert r.queue_id == res.queue_id == i % QUEUES
        assert r.queue_offset == res.queue_offset
        assert bytes(r.body) == m.body                   # the compressed one comes back inflated
        assert r.tags == ("A" if i % 3 == 0 else "B")
        assert r.keys == f"k{i} x"
        assert r.properties["seq"] == str(i) and r.properties["UNIQ_KEY"] == res.msg_id
        assert "__CRC32#" not in r.properties
        assert r.reconsume_times == 0
        assert r.born_timestamp.tzinfo is None            # Spark returns naive datetimes in the session zone (UTC)
        assert r.born_timestamp <= r.store_timestamp + dt.timedelta(seconds=1)
        assert abs(r.store_timestamp.replace(tzinfo=dt.timezone.utc).timestamp() - t0) < 120
    # offsets are contiguous per queue
    for q in range(QUEUES):
        offs = sorted(r.queue_offset for r in rows if r.queue_id == q)
        assert offs == list(range(N // QUEUES))


def test_partition_splits_and_offset_ranges(spark, cluster, flights):
    df = reader(spark, cluster, topic="flights", maxRecordsPerPartition=40)
    assert df.rdd.getNumPartitions() == 4 * 4
    assert sorted(r.queue_offset for r in df.where("queue_id = 1").select("queue_offset").collect()) == \
        list(range(N // QUEUES))
    assert reader(spark, cluster, topic="flights", minPartitions=10).rdd.getNumPartitions() >= 10
    # JSON offsets, both shapes; ends are exclusive; queues not named keep the defaults
    start = json.dumps({"flights/broker-a/0": 10, "flights": {"1": 140}})
    end = json.dumps({"flights": {"broker-a": {"0": 20, "2": 5}}})
    rows = reader(spark, cluster, topic="flights", startingOffsets=start, endingOffsets=end).select(
        "queue_id", "queue_offset").collect()
    got = {}
    for r in rows:
        got.setdefault(r.queue_id, []).append(r.queue_offset)
    assert sorted(got[0]) == list(range(10, 20))
    assert sorted(got[1]) == list(range(140, 150))
    assert sorted(got[2]) == list(range(5))
    assert sorted(got[3]) == list(range(150))
    # assign reads only the named queues; includeProperties=false drops the column
    df = reader(spark, cluster, assign=json.dumps({"flights": [1, 3]}), includeProperties="false")
    assert "properties" not in df.columns
    assert sorted(r.queue_id for r in df.select("queue_id").distinct().collect()) == [1, 3]


def test_pipelined_range_reads_in_order(cluster, flights):
    """read_range with several pulls in flight: small pulls, a range inside a queue, a tag filter."""
    from rmq.client.message import MessageQueue
    from rmq.spark.options import SourceOptions
    from rmq.spark.wire import read_range

    mq = MessageQueue("flights", BROKER, 1)
    for batch in ("7", "1024"):
        opts = SourceOptions.parse({"nameServer": cluster.namesrv_addr, "topic": "flights", "pullBatchSize": batch})
        offs = [m.queue_offset for page in read_range(opts, mq, 3, 140) for m in page]
        assert offs == list(range(3, 140))
        opts = SourceOptions.parse({"nameServer": cluster.namesrv_addr, "topic": "flights", "pullBatchSize": batch,
                                    "subExpression": "A"})
        got = [m for page in read_range(opts, mq, 3, 140) for m in page]
        assert [m.queue_offset for m in got] == [o for o in range(3, 140) if (o * QUEUES + 1) % 3 == 0]
        assert {m.tags for m in got} == {"A"}


def test_tag_filter_and_timestamps_select_the_right_rows(spark, cluster, flights):
    results, msgs, boundary = flights
    rows = reader(spark, cluster, topic="flights", subExpression="A").select("msg_id", "tags").collect()
    want = {res.msg_id for i, res in enumerate(results) if i % 3 == 0}
    assert {r.msg_id for r in rows} == want and len(rows) == len(want)
    rows = reader(spark, cluster, topic="flights", subExpression="A || B").count()
    assert rows == N
    assert reader(spark, cluster, topic="flights", subExpression="nope").count() == 0
    # startingTimestamp: exactly the second half (the broker's nearest answer is corrected)
    rows = reader(spark, cluster, topic="flights", startingTimestamp=boundary).select("msg_id").collect()
    assert {r.msg_id for r in rows} == {res.msg_id for res in results[N // 2:]}
    rows = reader(spark, cluster, topic="flights", endingTimestamp=boundary).select("msg_id").collect()
    assert {r.msg_id for r in rows} == {res.msg_id for res in results[:N // 2]}
    assert reader(spark, cluster, topic="flights", startingTimestamp=now_ms() + 60_000).count() == 0
    # tag filter and timestamp together
    rows = reader(spark, cluster, topic="flights", subExpression="B", startingTimestamp=boundary).collect()
    assert {r.msg_id for r in rows} == {res.msg_id for i, res in enumerate(results) if i >= N // 2 and i % 3}


def test_sql92_filter_is_applied_by_the_broker(spark, cluster, flights):
    """expressionType=SQL92: the broker evaluates the expression on each message's properties."""
    results, msgs, _ = flights
    rows = reader(spark, cluster, topic="flights", expressionType="SQL92",
                  subExpression="seq >= 300 AND (TAGS = 'A' OR seq BETWEEN 590 AND 599)").select("msg_id").collect()
    want = {res.msg_id for i, res in enumerate(results) if i >= 300 and (i % 3 == 0 or 590 <= i <= 599)}
    assert {r.msg_id for r in rows} == want and len(rows) == len(want)
    assert reader(spark, cluster, topic="flights", expressionType="sql92", subExpression="seq > 100000").count() == 0


def test_writer_round_trips_a_dataframe(spark, cluster, flights):
    from pyspark.sql import functions as F

    create_topic(cluster, "copy", 2)
    src = spark.createDataFrame(
        [(b"w-%d" % i, f"t{i % 2}", f"key{i} other", {"n": str(i)}, i % 2) for i in range(300)],
        "body BINARY, tags STRING, keys STRING, properties MAP<STRING,STRING>, queue_id INT")
    (src.repartition(3).write.format("rmq").option("nameServer", cluster.namesrv_addr).option("topic", "copy")
     .option("lingerMs", "2").option("batchSize", str(64 << 10)).mode("append").save())
    wait_dispatched(cluster, "copy", 2, 300)
    back = reader(spark, cluster, topic="copy").collect()
    assert len(back) == 300
    for r in back:
        i = int(bytes(r.body)[2:])
        assert r.tags == f"t{i % 2}" and r.keys == f"key{i} other" and r.queue_id == i % 2
        assert r.properties["n"] == str(i)
    keys = [r.properties["SPARK_DEDUP_KEY"] for r in back]
    assert len(set(keys)) == 300
    qids = {k.split("/")[0] for k in keys}
    assert len(qids) == 1                                     # one write, one query id
    assert {k.split("/")[1] for k in keys} == {"0"}           # batch id 0
    assert {k.split("/")[2] for k in keys} == {"0", "1", "2"}  # partition ids
    # a DataFrame read from rmq writes back as is (topic column, string body, array keys)
    df = reader(spark, cluster, topic="flights").where("queue_id = 2")
    (df.select("topic", F.col("body"), "tags", "properties").withColumn("topic", F.lit("copy2"))
     .write.format("rmq").option("nameServer", cluster.namesrv_addr).mode("append").save())
    (spark.createDataFrame([("text body", ["a", "b"])], "body STRING, keys ARRAY<STRING>")
     .write.format("rmq").option("nameServer", cluster.namesrv_addr).option("topic", "copy2").mode("append").save())
    wait_total(cluster, "copy2", N // QUEUES + 1)
    rows = reader(spark, cluster, topic="copy2").collect()
    orig = {bytes(r.body): r for r in df.collect()}
    for r in rows:
        if r.keys == "a b":
            assert bytes(r.body) == b"text body"
            continue
        o = orig[bytes(r.body)]
        assert r.tags == o.tags and r.properties["seq"] == o.properties["seq"]
        assert r.msg_id != o.msg_id                          # a new message, not the old UNIQ_KEY
    # the columns path (a topic option, no queue_id column): each Arrow batch in one send_async_columns;
    # null / empty keys and the names the producer sets are dropped as on the row path
    create_topic(cluster, "copy3", 2)
    src = spark.createDataFrame(
        [(b"c-%d" % i, f"t{i % 3}", [f"k{i}", "", None] if i % 2 else None,
          {"n": str(i), "UNIQ_KEY": "mine", "__SHARDINGKEY": "s", "TAGS": "no", "skip": None}) for i in range(500)],
        "body BINARY, tags STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>")
    (src.repartition(2).write.format("rmq").option("nameServer", cluster.namesrv_addr).option("topic", "copy3")
     .mode("append").save())
    wait_dispatched(cluster, "copy3", 2, 500)
    back = reader(spark, cluster, topic="copy3").collect()
    assert len(back) == 500 and len({r.properties["SPARK_DEDUP_KEY"] for r in back}) == 500
    for r in back:
        i = int(bytes(r.body)[2:])
        assert r.tags == f"t{i % 3}" and r.keys == (f"k{i}" if i % 2 else None) and r.properties["n"] == str(i)
        assert r.properties["UNIQ_KEY"] == r.msg_id != "mine" and "__SHARDINGKEY" not in r.properties
        assert "skip" not in r.properties


def test_fail_on_data_loss_both_ways(spark, tmp_path):
    c = cleaning_cluster(tmp_path)
    try:
        create_topic(c, "Exp", 1)
        produce(c, [(msg("Exp", i, body=b"e" * 600), 0) for i in range(400)])
        lo = cleaned_min_offset(c, "Exp")
        hi = max_offsets(c, "Exp", 1)[0]
        assert 0 < lo < hi == 400
        from0 = json.dumps({"Exp/broker-a/0": 0})
        with pytest.raises(Exception, match="failOnDataLoss"):
            reader(spark, c, topic="Exp", startingOffsets=from0).count()
        rows = reader(spark, c, topic="Exp", startingOffsets=from0, failOnDataLoss="false").select(
            "queue_offset").collect()
        offs = sorted(r.queue_offset for r in rows)
        assert offs and offs[0] >= lo and offs == list(range(offs[0], 400))
        assert reader(spark, c, topic="Exp").count() == 400 - offs[0]       # earliest: no loss to report
    finally:
        c.close()


BAD = [
    ({"topic": "flights", "nameServer": None}, "nameServer"),
    ({"nameServer": "nohost"}, "nameServer"),
    ({}, "exactly one of the options 'topic'"),
    ({"topic": "flights", "topics": "a,b"}, "exactly one of the options"),
    ({"topic": "bad topic!"}, "'topic'"),
    ({"topicPattern": "fl(ights"}, "topicPattern"),
    ({"assign": "[0, 1]"}, "assign"),
    ({"topic": "flights", "startingOffsets": "sometime"}, "startingOffsets"),
    ({"topic": "flights", "startingOffsets": '{"flights/broker-a/0": -3}'}, "startingOffsets"),
    ({"topic": "flights", "endingOffsets": "earliest"}, "endingOffsets"),
    ({"topic": "flights", "startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({"topic": "flights", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"topic": "flights", "pullBatchSize": "0"}, "pullBatchSize"),
    ({"topic": "flights", "pullTimeoutMs": "-5"}, "pullTimeoutMs"),
    ({"topic": "flights", "includeProperties": "yes"}, "includeProperties"),
    ({"topic": "flights", "startingOffset": "earliest"}, "did you mean 'startingOffsets'?"),
    ({"topic": "flights", "subExpression": "||"}, "subExpression"),
    ({"topic": "flights", "expressionType": "SQL92", "subExpression": "seq > AND"}, "line 1, column 7"),
    ({"topic": "flights", "expressionType": "SQL92"}, "'subExpression' is not set"),
    ({"topic": "flights", "expressionType": "JAVA"}, "expressionType"),
]


@pytest.mark.parametrize("opts,needle", BAD, ids=[n for _, n in BAD])
def test_bad_options_fail_fast_naming_the_option(spark, cluster, flights, opts, needle):
    r = spark.read.format("rmq")
    if opts.get("nameServer", "") is not None:
        r = r.option("nameServer", opts.get("nameServer", cluster.namesrv_addr))
    for k, v in opts.items():
        if k != "nameServer":
            r = r.option(k, v)
    with pytest.raises(Exception) as ei:
        r.load()                                   # fails at definition time, before any job
    assert needle in str(ei.value)


def test_bad_options_at_planning(spark, cluster, flights):
    ns = cluster.namesrv_addr
    cases = [
        ({"topic": "flights", "maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger"),
        ({"topic": "flights", "startingOffsets": "latest"}, "startingOffsets"),
        ({"topic": "flights", "startingOffsets": '{"other": {"0": 1}}'}, "not subscribed"),
        ({"topic": "no-such-topic"}, "does not exist"),
        ({"assign": '{"flights": [9]}'}, "assign"),
        ({"topic": "flights", "endingOffsets": '{"flights/broker-a/0": 100000}'}, "beyond its max offset"),
    ]
    for opts, needle in cases:
        with pytest.raises(Exception) as ei:
            reader(spark, cluster, **opts).count()
        assert needle in str(ei.value), (opts, str(ei.value)[:2000])
    # sink: body is required, a topic from the option or a column, and the types are checked
    w = spark.createDataFrame([("x",)], "value STRING").write.format("rmq").option("nameServer", ns)
    with pytest.raises(Exception, match="'body' column"):
        w.option("topic", "copy").mode("append").save()
    w = spark.createDataFrame([("x",)], "body STRING").write.format("rmq").option("nameServer", ns)
    with pytest.raises(Exception, match="option 'topic' or a 'topic' column"):
        w.mode("append").save()
    w = spark.createDataFrame([("x", 1)], "body STRING, tags INT").write.format("rmq").option("nameServer", ns)
    with pytest.raises(Exception, match="column 'tags'"):
        w.option("topic", "copy").mode("append").save()
    w = spark.createDataFrame([("x",)], "body STRING").write.format("rmq").option("nameServer", ns)
    with pytest.raises(Exception, match="only appends"):
        w.option("topic", "copy").mode("overwrite").save()


def test_transactions_only_committed_messages_are_read(spark, cluster):
    """Half messages and op records live in their own topics: Spark reads a transactional topic's
    committed messages only (rolled back and undecided ones never appear)."""
    from rmq import LocalTransactionState, Message, TransactionProducer
    create_topic(cluster, "sparktx", 2)
    states = {0: LocalTransactionState.COMMIT_MESSAGE, 1: LocalTransactionState.ROLLBACK_MESSAGE,
              2: LocalTransactionState.UNKNOW}
    with TransactionProducer(cluster.namesrv_addr, group="spark-tx",
                             checker=lambda m: LocalTransactionState.UNKNOW) as p:
        for i in range(30):
            p.send_message_in_transaction(Message("sparktx", b"t-%d" % i), lambda m, a: a, states[i % 3])
    wait_dispatched(cluster, "sparktx", 2, 10)
    rows = reader(spark, cluster, topic="sparktx").collect()
    assert sorted(bytes(r["body"]) for r in rows) == sorted(b"t-%d" % i for i in range(0, 30, 3))
