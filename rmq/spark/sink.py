"""The ``rmq`` sink: batch (``df.write``) and streaming (``df.writeStream``) Arrow writers.

Each Spark task sends its rows with one :class:`rmq.Producer` (client-side batching:
``lingerMs`` / ``batchSize``) and waits for every send result before it reports success,
so a task that returns has all its messages stored.  With the ``topic`` option and no
``queue_id`` column (the common case) each Arrow batch goes as columns
(``Producer.send_async_columns``: encoded in C, no ``Message`` per row); otherwise row by
row (``send_async``, a queue per row).  Delivery is at-least-once: a retried task or a
replayed micro-batch sends its rows again.  Every message carries
``SPARK_DEDUP_KEY`` = ``queryId/batchId/partitionId/seq`` (``seq`` counts the task's
rows from 0), identical across such retries, for dedup downstream.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Iterator, List, Optional

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from rmq._core.client_msg import COLUMNS_REFUSED_PROPERTIES
from rmq.client.message import Message, MessageQueue
from rmq.errors import SendManyError
from rmq.errors import RmqError
from rmq.spark.arrow import column
from rmq.spark.options import RmqOptionError, SinkOptions

log = logging.getLogger("rmq.spark")

DEDUP_PROPERTY = "SPARK_DEDUP_KEY"
QUERY_ID_PROPERTY = "sql.streaming.queryId"      # Spark's StreamExecution.QUERY_ID_KEY (stable across restarts)
BATCH_ID_PROPERTY = "streaming.sql.batchId"      # Spark's MicroBatchExecution.BATCH_ID_KEY
MAX_UNACKED = 20_000                             # results checked once this many sends are outstanding

__all__ = ["RmqBatchWriter", "RmqStreamWriter", "RmqCommitMessage", "check_sink_schema", "DEDUP_PROPERTY",
           "RmqSinkError"]


class RmqSinkError(RmqError, RuntimeError):
    """A row could not be turned into a message, or a send failed."""


@dataclass
class RmqCommitMessage(WriterCommitMessage):
    partition_id: int
    messages: int
    body_bytes: int


def check_sink_schema(schema, opts: SinkOptions) -> None:
    """Column names and types the sink accepts.

    Raises
    ------
    RmqOptionError
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    want = {"body": ("binary", "string"), "topic": ("string",), "tags": ("string",),
            "keys": ("string", "array<string>"), "properties": ("map<string,string>",),
            "queue_id": ("int", "bigint", "smallint", "tinyint"), "broker_name": ("string",)}
    if "body" not in types:
        raise RmqOptionError(f"the rmq sink needs a 'body' column (BINARY or STRING); the DataFrame has "
                             f"{sorted(types)}")
    if opts.topic is None and "topic" not in types:
        raise RmqOptionError("the rmq sink needs the option 'topic' or a 'topic' column")
    for name, ok in want.items():
        if name in types and types[name] not in ok:
            raise RmqOptionError(f"column {name!r} of the rmq sink must be {' or '.join(t.upper() for t in ok)}, "
                                 f"got {types[name].upper()}")
    if "broker_name" in types and "queue_id" not in types:
        raise RmqOptionError("column 'broker_name' of the rmq sink needs a 'queue_id' column")


def _task_context():
    from pyspark import TaskContext
    return TaskContext.get()


def _batch_to_columns(batch, first_seq: int, dedup_prefix: str) -> dict:
    """An Arrow batch as send_async_columns' columns (``bodies``, ``tags``, ``keys``,
    ``properties``), the sink's rules for every row: a null body is an error, a STRING body is
    UTF-8, null / empty keys are dropped, null properties and the names the producer sets
    (``COLUMNS_REFUSED_PROPERTIES``) are dropped, ``SPARK_DEDUP_KEY`` is added.

    Raises
    ------
    RmqSinkError
        A null body (naming the row's sequence number in the partition).
    """
    bodies = []
    for i, b in enumerate(column(batch, "body")):
        if b is None:
            raise RmqSinkError(f"row {first_seq + i} of partition {dedup_prefix}: 'body' is null")
        bodies.append(b.encode("utf-8") if isinstance(b, str) else b)
    keys = column(batch, "keys")
    if keys is not None:
        keys = [([x for x in k if x] or None) if isinstance(k, list) else k for k in keys]
    props = column(batch, "properties")
    properties = []
    for i in range(len(bodies)):
        p = {}
        if props is not None and props[i]:
            p = {str(k): str(v) for k, v in props[i] if v is not None and k not in COLUMNS_REFUSED_PROPERTIES}
        p[DEDUP_PROPERTY] = f"{dedup_prefix}/{first_seq + i}"
        properties.append(p)
    return {"bodies": bodies, "tags": column(batch, "tags"), "keys": keys, "properties": properties}


def _rows_to_messages(batch, opts: SinkOptions, first_seq: int, dedup_prefix: str):
    """Yield ``(Message, queue_id, broker_name)`` for each row of an Arrow batch (the row path:
    a topic column, or a queue per row), its columns as :func:`_batch_to_columns` makes them."""
    cols = _batch_to_columns(batch, first_seq, dedup_prefix)
    topic_col = None if opts.topic is not None else column(batch, "topic")
    tags, keys = cols["tags"], cols["keys"]
    qids = column(batch, "queue_id")
    brokers = column(batch, "broker_name")
    for i, (b, p) in enumerate(zip(cols["bodies"], cols["properties"])):
        topic = opts.topic if topic_col is None else topic_col[i]
        if not topic:
            raise RmqSinkError(f"row {first_seq + i} of partition {dedup_prefix}: 'topic' is null or empty")
        msg = Message(topic, b, tags=tags[i] if tags is not None else None,
                      keys=keys[i] if keys is not None else None, properties=p)
        yield msg, (qids[i] if qids is not None else None), (brokers[i] if brokers is not None else None)


def write_partition(opts: SinkOptions, iterator: Iterator, query_id: str, batch_id: int) -> RmqCommitMessage:
    """Send every row of one task and wait for all results.

    Raises
    ------
    RmqSinkError
        A bad row, or sends that failed (the first error and the count).
    """
    from rmq.client.producer import Producer

    ctx = _task_context()
    pid = ctx.partitionId() if ctx is not None else 0
    prefix = f"{query_id}/{batch_id}/{pid}"
    producer = Producer(opts.name_server, opts.producer_group, send_msg_timeout_ms=opts.send_timeout_ms,
                        linger_ms=opts.linger_ms, batch_size=opts.batch_size)
    queues: dict = {}                 # topic -> {(broker or None, qid): MessageQueue}
    pending: list = []
    sent = nbytes = 0
    failed: list = []

    def settle(futs: list) -> None:
        for f in futs:
            e = f.exception()
            if isinstance(e, SendManyError):          # a batch sent as columns: its failed rows
                failed.extend(e.results.exceptions.values())
            elif e is not None:
                failed.append(e)

    def queue_for(topic: str, qid: int, broker: Optional[str]) -> MessageQueue:
        table = queues.get(topic)
        if table is None:
            table = {}
            for mq in producer.fetch_publish_message_queues(topic):
                table[(mq.broker_name, mq.queue_id)] = mq
                table.setdefault((None, mq.queue_id), mq)
            queues[topic] = table
        mq = table.get((broker, int(qid)))
        if mq is None:
            raise RmqSinkError(f"topic {topic!r} has no writable queue {broker or '*'}/{qid}")
        return mq

    unacked = 0
    try:
        for batch in iterator:
            if opts.topic is not None and batch.schema.get_field_index("queue_id") < 0:
                cols = _batch_to_columns(batch, sent, prefix)
                pending.append(producer.send_async_columns(opts.topic, cols["bodies"], tags=cols["tags"],
                                                           keys=cols["keys"], properties=cols["properties"]))
                sent += batch.num_rows
                unacked += batch.num_rows
                nbytes += sum(map(len, cols["bodies"]))
            else:
                for msg, qid, broker in _rows_to_messages(batch, opts, sent, prefix):
                    q = queue_for(msg.topic, qid, broker) if qid is not None else None
                    pending.append(producer.send_async(msg, queue=q))
                    sent += 1
                    unacked += 1
                    nbytes += len(msg.body)
            if unacked >= MAX_UNACKED:
                producer.flush()
                settle(pending)
                pending = []
                unacked = 0
        producer.flush()
        settle(pending)
    except Exception as e:
        if isinstance(e, RmqSinkError):
            raise
        raise RmqSinkError(f"writing partition {prefix} to NameServer {opts.name_server}: "
                           f"{type(e).__name__}: {e}") from e
    finally:
        producer.close()
    if failed:
        raise RmqSinkError(f"{len(failed)} of {sent} messages of partition {prefix} were not stored; first error: "
                           f"{type(failed[0]).__name__}: {failed[0]}")
    return RmqCommitMessage(pid, sent, nbytes)


class RmqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rmq")``: batch id 0 and a query id drawn when the write is planned."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts
        self.query_id = uuid.uuid4().hex

    def write(self, iterator: Iterator) -> RmqCommitMessage:
        return write_partition(self.opts, iterator, self.query_id, 0)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        n = sum(m.messages for m in messages if m is not None)
        log.info("rmq sink: write %s stored %d messages", self.query_id, n)

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        n = sum(m.messages for m in messages if m is not None)
        log.warning("rmq sink: write %s aborted; %d messages of successful tasks stay stored (at-least-once)",
                    self.query_id, n)


class RmqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("rmq")``: the streaming query's id and micro-batch id go in the dedup key."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts
        self.fallback_query_id = uuid.uuid4().hex

    def write(self, iterator: Iterator) -> RmqCommitMessage:
        ctx = _task_context()
        qid = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None) or self.fallback_query_id
        bid = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        return write_partition(self.opts, iterator, qid, int(bid) if bid is not None else -1)

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        n = sum(m.messages for m in messages if m is not None)
        log.info("rmq sink: micro-batch %d stored %d messages", batchId, n)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        log.warning("rmq sink: micro-batch %d aborted; messages already stored stay (at-least-once)", batchId)
