"""Pure-Python parts of the Spark connector (no Spark session, no JVM, no cluster): offsets and
their JSON shapes, the rate limiter, option parsing, range splitting, and Arrow batches from
messages.  Not marked ``spark``: they need the spark extra's packages (installed by the README's
test command), not Java, so they run wherever the suite runs."""
import json

import pyarrow  # noqa: F401  (the extra must be installed: fail here, not skip)
import pytest

from rmq._core import commitlog as cl
from rmq.client.message import MessageQueue
from rmq.spark.arrow import arrow_schema, messages_to_batch, source_schema_ddl
from rmq.spark.offsets import EARLIEST, LATEST, key_of, parse_offset_spec, queue_of, rate_limit
from rmq.spark.options import RmqOptionError, SinkOptions, SourceOptions
from rmq.spark.source import QueueRange, split_ranges

NS = "127.0.0.1:9876"


def test_offset_keys_round_trip():
    mq = MessageQueue("flights", "broker-a", 3)
    assert key_of(mq) == "flights/broker-a/3" == mq.key()
    assert queue_of("flights/broker-a/3") == mq
    for bad in ("flights/3", "a/b/c", "a/b/-1", "/b/1"):
        with pytest.raises(ValueError):
            queue_of(bad)


def test_offset_spec_shapes():
    mq0, mq1 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)
    assert parse_offset_spec("o", "earliest").resolve(mq0) == EARLIEST
    assert parse_offset_spec("o", " LATEST ").resolve(mq0) == LATEST
    s = parse_offset_spec("o", json.dumps({"t/b/0": 5, "t": {"1": -2}}))
    assert s.resolve(mq0) == 5 and s.resolve(mq1) == EARLIEST and s.resolve(MessageQueue("t", "b", 2)) is None
    s = parse_offset_spec("o", json.dumps({"t": {"b": {"1": 7}, "0": 3}}))
    assert s.resolve(mq1) == 7 and s.resolve(mq0) == 3 and s.topics() == {"t"}
    for bad in ("soon", "[1]", '{"t": 3}', '{"t/b/0": "x"}', '{"t/b/0": -3}', '{"t": {"x": 1}}', '{"t/b": 1}'):
        with pytest.raises(ValueError, match="'o'"):
            parse_offset_spec("o", bad)
    with pytest.raises(ValueError, match="earliest"):
        parse_offset_spec("endingOffsets", "earliest", allow_earliest=False)
    with pytest.raises(ValueError, match="-2"):
        parse_offset_spec("endingOffsets", '{"t/b/0": -2}', allow_earliest=False)


def test_rate_limit_is_exact_proportional_and_starves_no_queue():
    start = {"a": 0, "b": 100, "c": 10}
    latest = {"a": 1000, "b": 110, "c": 10, "new": 50}
    end = rate_limit(start, latest, 100)
    taken = {k: end[k] - start.get(k, 0) for k in end}
    assert sum(taken.values()) == 100
    assert taken["c"] == 0 and taken["b"] >= 1 and taken["new"] >= 1 and taken["a"] > taken["new"]
    assert all(start.get(k, 0) <= end[k] <= latest[k] for k in latest)
    # under the limit: everything; keys only in start are kept
    assert rate_limit({"x": 5, "gone": 3}, {"x": 9}, 100) == {"x": 9, "gone": 3}
    # a budget smaller than the number of queues still never exceeds it
    end = rate_limit({}, {f"q{i}": 10 for i in range(5)}, 3)
    assert sum(end.values()) == 3
    # every budget: exact sum, bounded per queue
    for limit in range(1, 60):
        end = rate_limit({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 20, "c": 37}, limit)
        assert sum(end.values()) == min(limit, 58)
        assert end["a"] <= 1 and end["b"] <= 20 and end["c"] <= 37
        if limit >= 3:
            assert min(end.values()) >= 1


def test_source_options_parse_and_fail_with_the_option_name():
    o = SourceOptions.parse({"nameServer": NS, "topics": "a, b,a", "maxOffsetsPerTrigger": "10",
                             "failOnDataLoss": "FALSE", "consumerGroup": "mon"})
    assert o.topics == ("a", "b") and o.max_offsets_per_trigger == 10 and not o.fail_on_data_loss
    assert o.commit_to_broker and o.consumer_group == "mon" and o.pull_batch_size == 1024
    o = SourceOptions.parse({"nameserver": NS, "assign": '{"t": {"broker-a": [0, 2]}, "u": [1]}'})
    assert o.assign == {"t": frozenset({("broker-a", 0), ("broker-a", 2)}), "u": frozenset({(None, 1)})}
    assert o.topics == ("t", "u") and not o.commit_to_broker
    bad = [
        ({"topic": "t"}, "'nameServer' is required"),
        ({"nameServer": "h:99999", "topic": "t"}, "nameServer"),
        ({"nameServer": NS, "topic": "t", "minPartitions": "0"}, "minPartitions"),
        ({"nameServer": NS, "topic": "t", "maxRecordsPerPartition": "x"}, "maxRecordsPerPartition"),
        ({"nameServer": NS, "topic": "t", "arrowBatchSize": "0"}, "arrowBatchSize"),
        ({"nameServer": NS, "topic": "t", "consumerGroup": "a b"}, "consumerGroup"),
        ({"nameServer": NS, "topic": "t", "startingTimestamp": "5", "endingTimestamp": "4"}, "endingTimestamp"),
        ({"nameServer": NS, "assign": '{"t": [-1]}'}, "assign"),
        ({"nameServer": NS, "assign": '{"t": []}'}, "assign"),
        ({"nameServer": NS, "topic": "t", "pullBatchSize": "5000"}, "pullBatchSize"),
        ({"nameServer": NS, "topic": "t", "colour": "red"}, "unknown source option 'colour'"),
    ]
    for opts, needle in bad:
        with pytest.raises(RmqOptionError, match=needle.replace("(", r"\(")):
            SourceOptions.parse(opts)
    o = SourceOptions.parse({"nameServer": NS, "topic": "t", "endingOffsets": "latest"})
    with pytest.raises(RmqOptionError, match="'endingOffsets' is not valid in a streaming query"):
        o.check_stream()
    o = SourceOptions.parse({"nameServer": NS, "topicPattern": "f.*", "startingOffsets": '{"g/b/0": 1}'})
    with pytest.raises(RmqOptionError, match="does not match"):
        o.check_batch()
    s = SinkOptions.parse({"nameServer": NS, "topic": "t", "lingerMs": "0", "checkpointLocation": "/x"})
    assert s.topic == "t" and s.linger_ms == 0
    with pytest.raises(RmqOptionError, match="sendTimeoutMs"):
        SinkOptions.parse({"nameServer": NS, "sendTimeoutMs": "soon"})


def test_split_ranges():
    a, b = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)
    r = split_ranges([(a, 0, 100), (b, 5, 10)], None, 30)
    assert r == [(a, 0, 30), (a, 30, 60), (a, 60, 90), (a, 90, 100), (b, 5, 10)]
    r = split_ranges([(a, 0, 100), (b, 5, 10)], 8, None)
    assert len(r) >= 8
    for mq, lo, hi in ((a, 0, 100), (b, 5, 10)):
        parts = sorted((s, e) for m, s, e in r if m == mq)
        assert parts[0][0] == lo and parts[-1][1] == hi and all(x[1] == y[0] for x, y in zip(parts, parts[1:]))
    assert split_ranges([(a, 0, 3)], 10, None) == [(a, 0, 1), (a, 1, 2), (a, 2, 3)]
    assert QueueRange("t", "b", 0, 1, 2).mq == a


def test_messages_to_batch_matches_the_declared_schema(open_store):
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql import types as T

    store = open_store()
    for i in range(15):
        store.put_message("t", b"x" * (i % 5 + 1), 2, tags="A", keys=["k1", "k2"], properties={"u": str(i)},
                          born_timestamp=1_700_000_000_000)
    store.dispatch()
    res = store.get_messages("g", "t", 2, 10, 5)
    msgs = cl.decode_records(res.records)
    assert "__CRC32#" in msgs[0].properties          # the store's CRC property, hidden by the connector
    mq = MessageQueue("t", "broker-a", 2)
    cols = [("topic", T.StringType()), ("broker_name", T.StringType()), ("queue_id", T.IntegerType()),
            ("queue_offset", T.LongType()), ("commitlog_offset", T.LongType()), ("msg_id", T.StringType()),
            ("tags", T.StringType()), ("keys", T.StringType()), ("body", T.BinaryType()),
            ("properties", T.MapType(T.StringType(), T.StringType())), ("born_timestamp", T.TimestampType()),
            ("store_timestamp", T.TimestampType()), ("reconsume_times", T.IntegerType())]
    for props in (True, False):
        schema = arrow_schema(props)
        spark_schema = T.StructType([T.StructField(n, t) for n, t in cols if props or n != "properties"])
        assert source_schema_ddl(props).replace("BIGINT", "LONG").lower().replace("map<string, string>", "map") \
            == ", ".join(f"{f.name} {f.dataType.typeName()}" for f in spark_schema.fields).replace(
                "integer", "int")
        assert to_arrow_schema(spark_schema, timezone="UTC").equals(schema)
        rb = messages_to_batch([msgs[:2], msgs[2:]], mq, schema)
        assert rb.schema.equals(schema) and rb.num_rows == 5
        d = rb.to_pydict()
        assert d["topic"] == ["t"] * 5 and d["broker_name"] == ["broker-a"] * 5 and d["queue_id"] == [2] * 5
        assert d["queue_offset"] == list(range(10, 15)) and d["body"] == [b"x" * i for i in range(1, 6)]
        assert d["tags"] == ["A"] * 5 and d["keys"] == ["k1 k2"] * 5
        assert d["born_timestamp"][1].timestamp() == 1_700_000_000.0
        assert [t.timestamp() for t in d["store_timestamp"]] == [m.store_timestamp / 1000 for m in msgs]
        assert d["msg_id"] == [m.msg_id for m in msgs] and len(set(d["msg_id"])) == 5
        if props:
            assert dict(d["properties"][3]) == {"TAGS": "A", "KEYS": "k1 k2", "u": "13"}


def test_cached_consumer_apis_of_this_process_are_closed_at_exit():
    from rmq.spark import wire
    api = wire.consumer_api("127.0.0.1:1", 1000)          # created lazily; nothing is contacted
    assert wire.consumer_api("127.0.0.1:1", 1000) is api  # one per (name server, timeout, pid)
    other_pid = ("127.0.0.1:1", 1000, -1)                  # an entry inherited from a parent process
    wire._apis[other_pid] = sentinel = object()
    try:
        wire._close_apis()
        assert api._closed and ("127.0.0.1:1", 1000, wire.os.getpid()) not in wire._apis
        assert wire._apis.get(other_pid) is sentinel        # not this process's: left alone
    finally:
        wire._apis.pop(other_pid, None)


# -- the sink's rows (rmq.spark.sink): one set of rules for the columns path and the row path ---------------
def _sink_batch(**cols):
    import pyarrow as pa
    types = {"body": pa.binary(), "topic": pa.string(), "tags": pa.string(), "keys": pa.list_(pa.string()),
             "properties": pa.map_(pa.string(), pa.string()), "queue_id": pa.int32()}
    return pa.RecordBatch.from_arrays([pa.array(v, type=types[k]) for k, v in cols.items()], names=list(cols))


def test_sink_columns_and_rows_apply_the_same_rules():
    from rmq.spark.sink import _batch_to_columns, _rows_to_messages
    batch = _sink_batch(body=[b"a", b"b"], topic=["T", "U"], tags=["x", None], keys=[["k1", "", None], None],
                        properties=[[("n", "1"), ("UNIQ_KEY", "mine"), ("__SHARDINGKEY", "s"), ("z", None)], None])
    cols = _batch_to_columns(batch, 10, "q/0/3")
    assert cols["bodies"] == [b"a", b"b"] and cols["tags"] == ["x", None] and cols["keys"] == [["k1"], None]
    assert cols["properties"] == [{"n": "1", "SPARK_DEDUP_KEY": "q/0/3/10"}, {"SPARK_DEDUP_KEY": "q/0/3/11"}]
    opts = SinkOptions.parse({"nameServer": NS})
    (m0, q0, b0), (m1, _, _) = list(_rows_to_messages(batch, opts, 10, "q/0/3"))
    assert (m0.topic, m0.body, m0.tags, m0.keys, q0, b0) == ("T", b"a", "x", ["k1"], None, None)
    assert {k: m0.properties[k] for k in ("n", "SPARK_DEDUP_KEY")} == cols["properties"][0]
    assert "UNIQ_KEY" not in m0.properties and "__SHARDINGKEY" not in m0.properties
    assert (m1.topic, m1.tags, m1.keys) == ("U", None, [])


def test_sink_refuses_a_null_body_or_topic_naming_the_row():
    from rmq.spark.sink import RmqSinkError, _batch_to_columns, _rows_to_messages
    with pytest.raises(RmqSinkError, match="row 6 of partition q/0/1: 'body' is null"):
        _batch_to_columns(_sink_batch(body=[b"a", None]), 5, "q/0/1")
    opts = SinkOptions.parse({"nameServer": NS})
    with pytest.raises(RmqSinkError, match="row 0 of partition q/0/1: 'topic' is null or empty"):
        list(_rows_to_messages(_sink_batch(body=[b"a"], topic=[""]), opts, 0, "q/0/1"))
