"""Row schema of the ``rmq`` source and column-wise conversion between messages and Arrow.

Read: decoded messages (``rmq._core.commitlog.MessageExt``) -> one ``pyarrow.RecordBatch``
per page group, built column by column (the body column is ``pa.binary()``), with the
exact Arrow types Spark expects for the declared schema (INT -> int32, LONG -> int64,
TIMESTAMP -> timestamp[us, tz=UTC], MAP<STRING,STRING> -> map<string, string>).

Write: a ``pyarrow.RecordBatch`` of the DataFrame -> Python columns for the producer.
"""
from __future__ import annotations

from typing import Optional, Sequence

import pyarrow as pa

from rmq.client.message import MessageQueue

__all__ = ["SCHEMA_DDL", "source_schema_ddl", "arrow_schema", "messages_to_batch", "BODY_BYTES"]

_COLUMNS = [
    ("topic", "STRING", pa.string()),
    ("broker_name", "STRING", pa.string()),
    ("queue_id", "INT", pa.int32()),
    ("queue_offset", "BIGINT", pa.int64()),
    ("commitlog_offset", "BIGINT", pa.int64()),
    ("msg_id", "STRING", pa.string()),
    ("tags", "STRING", pa.string()),
    ("keys", "STRING", pa.string()),
    ("body", "BINARY", pa.binary()),
    ("properties", "MAP<STRING, STRING>", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("reconsume_times", "INT", pa.int32()),
]

SCHEMA_DDL = ", ".join(f"{n} {t}" for n, t, _ in _COLUMNS)
BODY_BYTES = "body"
CRC_PROPERTY = "__CRC32#"      # the store's per-record CRC property: a storage detail, not shown
_TS = pa.timestamp("us", tz="UTC")
_MAP = pa.map_(pa.string(), pa.string())


def source_schema_ddl(include_properties: bool = True) -> str:
    """The DDL schema of the source (without ``properties`` when ``includeProperties`` is false)."""
    return ", ".join(f"{n} {t}" for n, t, _ in _COLUMNS if include_properties or n != "properties")


def arrow_schema(include_properties: bool = True) -> pa.Schema:
    """The Arrow schema matching :func:`source_schema_ddl` as Spark converts it."""
    return pa.schema([pa.field(n, a, nullable=True) for n, _, a in _COLUMNS
                      if include_properties or n != "properties"])


def messages_to_batch(pages: Sequence[list], mq: MessageQueue, schema: pa.Schema) -> pa.RecordBatch:
    """One RecordBatch from pages of MessageExt of queue ``mq`` (in queue order).

    Parameters
    ----------
    pages : sequence of lists of MessageExt, at least one message in all
    mq : MessageQueue
        The queue they were pulled from (topic and broker columns are constants).
    schema : pa.Schema
        :func:`arrow_schema`; decides whether ``properties`` is built.
    """
    msgs = pages[0] if len(pages) == 1 else [m for p in pages for m in p]
    n = len(msgs)
    props = [m.properties for m in msgs]              # parsed once per message (tags, keys, msg_id)
    cols = {
        "topic": pa.repeat(pa.scalar(mq.topic, pa.string()), n),
        "broker_name": pa.repeat(pa.scalar(mq.broker_name, pa.string()), n),
        "queue_id": pa.repeat(pa.scalar(mq.queue_id, pa.int32()), n),
        "queue_offset": pa.array([m.queue_offset for m in msgs], pa.int64()),
        "commitlog_offset": pa.array([m.commitlog_offset for m in msgs], pa.int64()),
        "msg_id": pa.array([m.msg_id for m in msgs], pa.string()),
        "tags": pa.array([p.get("TAGS") for p in props], pa.string()),
        "keys": pa.array([p.get("KEYS") for p in props], pa.string()),
        "body": pa.array([m.body for m in msgs], pa.binary()),
        "born_timestamp": pa.array([m.born_timestamp * 1000 for m in msgs], _TS),
        "store_timestamp": pa.array([m.store_timestamp * 1000 for m in msgs], _TS),
        "reconsume_times": pa.array([m.reconsume_times for m in msgs], pa.int32()),
    }
    if "properties" in schema.names:
        for p in props:
            p.pop(CRC_PROPERTY, None)                 # the messages are ours: drop it in place
        cols["properties"] = pa.array(props, _MAP)    # dicts convert straight to a MapArray
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


def column(batch: pa.RecordBatch, name: str) -> Optional[list]:
    """``batch[name]`` as a Python list, or None when the batch has no such column."""
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i).to_pylist()
