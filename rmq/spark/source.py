"""The ``rmq`` PySpark data source: batch and Structured Streaming reads, batch and streaming writes."""
from __future__ import annotations

import gc
import logging
import math
from typing import Iterator, Optional

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from rmq.client.consumer_api import SubscriptionData
from rmq.client.message import MessageQueue
from rmq.spark.arrow import arrow_schema, pages_to_batch, source_schema_ddl
from rmq.spark.offsets import EARLIEST, LATEST, key_of, queue_of, rate_limit
from rmq.spark.options import RmqOptionError, SinkOptions, SourceOptions
from rmq.spark.wire import ClusterView, RmqSourceError, data_loss, read_range

log = logging.getLogger("rmq.spark")

MAX_BATCH_BYTES = 16 << 20       # a RecordBatch is cut once its bodies reach this many bytes

__all__ = ["RmqDataSource", "QueueRange"]


class RmqDataSource(DataSource):
    """A RocketMQ-style ``rmq`` cluster as a Spark source and sink, over the wire.

    Name: ``rmq``.  Register with ``rmq.spark.register(spark)`` (or install the
    ``pyspark_rmq`` shim module for auto-discovery).  The connector talks to the
    NameServer (routes) and the brokers (pull path, offsets); it never opens store
    files, so executors on other machines work.

    Schema (read)
    -------------
    ``topic STRING, broker_name STRING, queue_id INT, queue_offset BIGINT,
    commitlog_offset BIGINT, msg_id STRING, tags STRING, keys STRING, body BINARY,
    properties MAP<STRING,STRING>, born_timestamp TIMESTAMP, store_timestamp TIMESTAMP,
    reconsume_times INT`` -- timestamps are UTC; ``keys`` is the KEYS property
    (space-separated); ``properties`` holds every stored property (user and system);
    ``body`` is inflated when it was stored compressed.

    Source options (Kafka's names where the meaning is the same)
    ------------------------------------------------------------
    nameServer : str, required
        ``host:port[;host:port...]``.
    topic | topics | topicPattern | assign : exactly one
        ``topic``/``topics``: comma-separated names; ``topicPattern``: a regular
        expression that must match a whole topic name (re-evaluated every micro-batch);
        ``assign``: JSON ``{"t": [0, 1]}`` or ``{"t": {"broker-a": [0, 1]}}``.
    subExpression : str, default ``*``
        Tag filter ``tagA || tagB`` (the broker filters, the client re-checks tags), or with
        ``expressionType=SQL92`` a SQL92 expression over message properties, e.g.
        ``a > 5 AND region IN ('eu', 'us')`` (evaluated by the broker, which needs
        ``enablePropertyFilter=true``; a bad expression fails the query with its position).
    expressionType : ``TAG`` | ``SQL92``, default ``TAG``
        RocketMQ's ExpressionType of ``subExpression``.
    startingOffsets : ``earliest`` | ``latest`` | JSON, default earliest (batch) / latest (stream)
        JSON: ``{"t/broker-a/0": 23}``, ``{"t": {"broker-a": {"0": 23}}}`` or ``{"t": {"0": 23}}``;
        -2 = earliest, -1 = latest; queues not named use the default.  A stream that
        restarts from a checkpoint ignores it.
    endingOffsets : ``latest`` | JSON, batch only, default latest.  Exclusive.
    startingTimestamp / endingTimestamp : int, ms since the epoch
        Per queue, the first message whose store time is >= the timestamp (the
        broker's offset-by-time); takes precedence over the offsets options.
        ``endingTimestamp`` is batch only.
    failOnDataLoss : bool, default true
        Offsets below a queue's min offset (files cleaned) fail the query; with
        false they are skipped with a warning.  Streaming: so does a batch whose start
        was read in a tail that an unclean failover lost (its broker's HA epoch moved
        on; an ASYNC_MASTER's unreplicated messages); with false the batch reads from
        where that tail began, i.e. the messages stored at those offsets since.  The
        epochs are kept in memory: a restarted query's first batch is not checked.
    pullTimeoutMs : int, default 10000 (ms per pull request, 3 attempts)
    pullBatchSize : int, default 1024 (messages per pull, 1..4096; the broker caps it
        with maxTransferCountOnMessageInMemory / maxTransferBytesOnMessageInMemory)
    includeProperties : bool, default true (false drops the ``properties`` column)
    minPartitions : int, optional
        Split queue ranges so that there are at least this many input partitions.
    maxRecordsPerPartition : int, optional
        Split queue ranges so that none has more queue offsets than this.
    maxOffsetsPerTrigger : int, stream only
        Queue offsets admitted per micro-batch, split across queues in proportion to
        their backlog (at least one each when the budget allows).
        ``Trigger.AvailableNow`` honours it over several micro-batches.
    consumerGroup : str, optional
        Group of the pulls; when set, each committed micro-batch's end offsets are
        also reported to the brokers under this group, for lag monitoring only (the
        checkpoint stays the source of truth).  Default ``spark-rmq-source``, not reported.
    arrowBatchSize : int, default 16384 (rows per Arrow batch handed to Spark)

    Sink options
    ------------
    nameServer : str, required
    topic : str, optional -- overrides the ``topic`` column (one of them is required)
    producerGroup : str, default ``spark-rmq-sink``
    sendTimeoutMs : int, default 10000; lingerMs : int, default 5; batchSize : int, default 262144 (bytes)

    Sink columns: ``body`` (BINARY or STRING, required), ``topic`` (STRING), ``tags``
    (STRING), ``keys`` (STRING, space-separated, or ARRAY<STRING>), ``properties``
    (MAP<STRING,STRING>), ``queue_id`` (INT, with ``broker_name`` STRING to pick the
    broker); other columns are ignored.  Delivery is at-least-once; every message
    carries the property ``SPARK_DEDUP_KEY`` = ``queryId/batchId/partitionId/seq``,
    the same for a retried task, so readers can drop duplicates.

    Offsets
    -------
    ``{"topic/brokerName/queueId": next_queue_offset}``; micro-batch ends are exclusive.
    Queues that appear mid-stream are read from offset 0.

    Examples
    --------
    >>> import rmq.spark
    >>> rmq.spark.register(spark)
    >>> df = (spark.read.format("rmq").option("nameServer", "127.0.0.1:9876")
    ...       .option("topic", "flights").load())
    >>> q = (spark.readStream.format("rmq").option("nameServer", "127.0.0.1:9876")
    ...      .option("topic", "flights").option("maxOffsetsPerTrigger", 10000).load()
    ...      .writeStream.format("parquet").option("checkpointLocation", "/tmp/ck").start("/tmp/out"))
    >>> (df.select("body", "tags").write.format("rmq").option("nameServer", "127.0.0.1:9876")
    ...  .option("topic", "flights-copy").mode("append").save())
    """

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def _source_options(self) -> SourceOptions:
        try:
            return SourceOptions.parse(self.options)
        except RmqOptionError:
            raise
        except ValueError as e:
            raise RmqOptionError(str(e)) from None

    def schema(self) -> str:
        return source_schema_ddl(self._source_options().include_properties)

    def reader(self, schema) -> "RmqBatchReader":
        opts = self._source_options()
        opts.check_batch()
        _check_schema(schema, opts)
        return RmqBatchReader(opts)

    def streamReader(self, schema) -> "RmqStreamReader":
        opts = self._source_options()
        opts.check_stream()
        _check_schema(schema, opts)
        return RmqStreamReader(opts)

    def writer(self, schema, overwrite: bool):
        from rmq.spark.sink import RmqBatchWriter, check_sink_schema
        if overwrite:
            raise RmqOptionError("the rmq sink only appends (a message queue cannot be overwritten); "
                                 "use mode('append')")
        opts = SinkOptions.parse(self.options)
        check_sink_schema(schema, opts)
        return RmqBatchWriter(opts)

    def streamWriter(self, schema, overwrite: bool):
        from rmq.spark.sink import RmqStreamWriter, check_sink_schema
        opts = SinkOptions.parse(self.options)
        check_sink_schema(schema, opts)
        return RmqStreamWriter(opts)


def _check_schema(schema, opts: SourceOptions) -> None:
    names = [f.name for f in schema.fields] if hasattr(schema, "fields") else None
    want = arrow_schema(opts.include_properties).names
    if names is not None and names != want:
        raise RmqOptionError(f"the rmq source has a fixed schema ({source_schema_ddl(opts.include_properties)}); "
                             f"a user schema with columns {names} is not supported, select columns instead")


class QueueRange(InputPartition):
    """Queue offsets ``[start, end)`` of one queue: one Spark task.

    Parameters
    ----------
    topic, broker_name : str
    queue_id : int
    start, end : int
        Queue offsets (entries), ``start < end``; ``end`` exclusive.
    """

    def __init__(self, topic: str, broker_name: str, queue_id: int, start: int, end: int):
        super().__init__(None)
        self.topic = topic
        self.broker_name = broker_name
        self.queue_id = queue_id
        self.start = start
        self.end = end

    @property
    def mq(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def __repr__(self) -> str:
        return f"QueueRange({self.topic}/{self.broker_name}/{self.queue_id} [{self.start}, {self.end}))"


def split_ranges(ranges: list, min_partitions: Optional[int], max_records: Optional[int]) -> list:
    """Split ``(mq, start, end)`` ranges by ``maxRecordsPerPartition`` and ``minPartitions``
    (Kafka's KafkaOffsetRangeCalculator: a range gets parts in proportion to its size, rounded up
    so that there are at least ``min_partitions`` when the ranges hold that many offsets)."""
    if max_records:
        out = []
        for mq, s, e in ranges:
            out.extend((mq, a, min(a + max_records, e)) for a in range(s, e, max_records))
        ranges = out
    if min_partitions and len(ranges) < min_partitions:
        total = sum(e - s for _, s, e in ranges)
        ideal = total / min_partitions
        out = []
        for mq, s, e in ranges:
            size = e - s
            parts = max(math.ceil(size / ideal), 1) if ideal > 0 else 1      # ceil: the sum reaches the minimum
            bounds = [s + size * i // parts for i in range(parts)] + [e]
            out.extend((mq, a, b) for a, b in zip(bounds, bounds[1:]) if b > a)
        ranges = out
    return ranges


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator:
    """RecordBatches of one :class:`QueueRange`, ``arrowBatchSize`` rows (or 16 MiB of bodies) each.

    The cyclic garbage collector is paused while a batch is pulled and built: the
    decoded messages hold no cycles and are freed by reference counting, and collections
    triggered by their allocations cost a third of the read time.  It runs again before
    each batch is handed to Spark.
    """
    if type(partition) is InputPartition and partition.value is None:
        return                                   # Spark's stand-in when there is nothing to read
    assert isinstance(partition, QueueRange), f"expected a QueueRange, got {type(partition).__name__}"
    schema = arrow_schema(opts.include_properties)
    mq = partition.mq
    pages_it = read_range(opts, mq, partition.start, partition.end, raw=True)
    try:
        while True:
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                batch = _next_batch(pages_it, opts, mq, schema)
            except RmqSourceError as e:
                raise type(e)(f"reading {partition!r} from NameServer {opts.name_server}: {e}") from None
            finally:
                if gc_was_on:
                    gc.enable()
            if batch is None:
                return
            yield batch
    finally:
        pages_it.close()                         # closes the range reader's sockets when Spark stops early


def _next_batch(pages_it: Iterator, opts: SourceOptions, mq: MessageQueue, schema) -> Optional[object]:
    """Raw pages (RawPage) -> one RecordBatch with :func:`pages_to_batch` (columnar decode)."""
    sub = None if opts.selector is None else SubscriptionData.build(mq.topic, opts.selector)
    tags = None if sub is None or sub.is_all else sub.tags_set
    while True:
        pages: list = []
        rows = nbytes = 0
        for page in pages_it:
            pages.append(page)
            rows += page.count
            nbytes += page.body_bytes
            if rows >= opts.arrow_batch_size or nbytes >= MAX_BATCH_BYTES:
                break
        if not pages:
            return None
        batch = pages_to_batch(pages, mq, schema, opts.include_properties, tags=tags)
        if batch.num_rows:                       # a tag re-check can drop every row of the pages
            return batch


# -- batch ---------------------------------------------------------------------------------------------
class RmqBatchReader(DataSourceReader):
    """Batch read: one :class:`QueueRange` per queue with data (split further on request)."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts

    def plan(self) -> list:
        """``(mq, start, end)`` of every queue with data between the starting and ending positions.

        Raises
        ------
        RmqSourceError
        """
        o = self.opts
        view = ClusterView(o)
        try:
            mqs = view.queues(strict=True)
            table = view.offset_table(mqs)
            ranges = []
            for mq in mqs:
                lo, hi = table[mq]
                s = view.resolve(mq, o.starting, o.starting_timestamp, EARLIEST, lo, hi, "startingOffsets")
                e = view.resolve(mq, o.ending, o.ending_timestamp, LATEST, lo, hi, "endingOffsets")
                if e < s:
                    raise RmqSourceError(f"{key_of(mq)}: the ending offset {e} is before the starting offset {s}")
                if e > s:
                    ranges.append((mq, s, e))
            return ranges
        finally:
            view.close()

    def partitions(self) -> list:
        ranges = split_ranges(self.plan(), self.opts.min_partitions, self.opts.max_records_per_partition)
        return [QueueRange(mq.topic, mq.broker_name, mq.queue_id, s, e) for mq, s, e in ranges]

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, partition)


# -- streaming -----------------------------------------------------------------------------------------
class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read with offsets ``{"topic/brokerName/queueId": next_offset}``.

    The planning methods run in one long-lived driver-side Python process, which keeps
    a :class:`ClusterView`; :meth:`read` runs on executors and keeps nothing.
    """

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._view: Optional[ClusterView] = None
        self._target: Optional[dict] = None       # AvailableNow: offsets snapshot at the start
        self._latest: Optional[dict] = None       # last latest offsets seen (reportLatestOffset)
        # HA epochs (broker name -> epoch) of the offsets the next batch starts from, and of the
        # latest offsets (the batch's end): :meth:`partitions` checks a start read in an epoch
        # its broker has left.  In memory: a restarted query's first batch is not checked
        self._start_epochs: Optional[dict] = None
        self._latest_epochs: Optional[dict] = None
        self._target_epochs: Optional[dict] = None

    def __getstate__(self) -> dict:
        return {"opts": self.opts, "_view": None, "_target": None, "_latest": None, "_start_epochs": None,
                "_latest_epochs": None, "_target_epochs": None}

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.opts)
        return self._view

    def _fetch(self) -> tuple:
        mqs = self.view.queues(strict=False)
        return mqs, self.view.offset_table(mqs)

    def _latest_now(self) -> dict:
        mqs, table = self._fetch()
        return {key_of(mq): table[mq][1] for mq in mqs}

    def initialOffset(self) -> dict:
        o = self.opts
        mqs, table = self._fetch()
        self._start_epochs = dict(self.view.broker_epochs)
        out = {}
        for mq in mqs:
            lo, hi = table[mq]
            out[key_of(mq)] = self.view.resolve(mq, o.starting, o.starting_timestamp, LATEST, lo, hi,
                                                "startingOffsets")
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_now()
        self._target_epochs = dict(self.view.broker_epochs)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._target is not None:
            latest, self._latest_epochs = self._target, self._target_epochs
        else:
            latest = self._latest_now()
            self._latest_epochs = dict(self.view.broker_epochs)
        self._latest = latest
        gone = sorted(set(start) - set(latest))
        if gone:
            log.warning("queues %s are no longer routed; their offsets are kept", gone)
        if isinstance(limit, ReadMaxRows):
            return rate_limit(start, latest, limit.max_rows)
        return {**start, **latest}

    def reportLatestOffset(self) -> Optional[dict]:
        return self._latest

    def partitions(self, start: dict, end: dict) -> list:
        ranges = []
        moved = self._after_failover(start, end)
        for k in sorted(end):
            e = int(end[k])
            s = int(start.get(k, 0))
            if e < s:
                data_loss(self.opts, f"{k}: the queue's offset went back from {s} to {e} (queue truncated or "
                                     f"recreated)")
                continue
            if k in moved:
                data_loss(self.opts, f"{k}: queue offsets [{moved[k]}, {s}) were read before a failover that "
                                     f"lost them (an ASYNC_MASTER's unreplicated tail); the messages stored "
                                     f"there since are others")
                s = moved[k]            # failOnDataLoss=false: the messages stored there since are read
            if e > s:
                ranges.append((queue_of(k), s, e))
        ranges = split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)
        return [QueueRange(mq.topic, mq.broker_name, mq.queue_id, s, e) for mq, s, e in ranges]

    def _after_failover(self, start: dict, end: dict) -> dict:
        """``{key: queue offset}`` of the queues whose ``start`` was read in a tail a failover lost
        (their broker's HA epoch moved on since ``start`` was seen: :meth:`ClusterView.lost_tail_start`
        asks), where that tail began; the epochs of ``end`` become those of the next start.
        Empty when the epochs are unknown (a restarted query's first batch, brokers without HA)."""
        before, after = self._start_epochs, self._latest_epochs
        self._start_epochs, self._latest_epochs = after, None
        if not before or not after:
            return {}
        moved = {}
        for k in sorted(end):
            s = int(start.get(k, 0))
            mq = queue_of(k)
            old = before.get(mq.broker_name, 0)
            if s > 0 and 0 < old < after.get(mq.broker_name, 0):
                tail = self.view.lost_tail_start(mq, s, old)
                if tail is not None:
                    moved[k] = tail
        return moved

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Report ``end`` to the brokers under ``consumerGroup`` (monitoring only, best effort)."""
        if not self.opts.commit_to_broker:
            return
        for k, off in sorted(end.items()):
            try:
                self.view.api.update_consumer_offset(self.opts.consumer_group, queue_of(k), int(off))
            except Exception as e:  # noqa: BLE001 - monitoring only: never fail the query
                log.warning("cannot report offset %s of %s for group %s: %s", off, k, self.opts.consumer_group, e)

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
