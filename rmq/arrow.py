"""Row schema of the ``rmq`` Spark source and of ``PullConsumer.poll_arrow``, and column-wise
conversion between messages and Arrow (no pyspark import: ``rmq.spark.arrow`` re-exports it).

Read: decoded messages (``rmq._core.commitlog.MessageExt``) -> one ``pyarrow.RecordBatch``
per page group, built column by column (the body column is ``pa.binary()``), with the
exact Arrow types Spark expects for the declared schema (INT -> int32, LONG -> int64,
TIMESTAMP -> timestamp[us, tz=UTC], MAP<STRING,STRING> -> map<string, string>).

Fast read path: :func:`pages_to_batch` builds the same RecordBatch straight from the raw
record pages of the pulls (``rmq._core.columnar.decode_columns``: one nogil pass, Arrow
buffers wrapped zero-copy), without a MessageExt per message.

Write: a ``pyarrow.RecordBatch`` of the DataFrame -> Python columns for the producer.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq._core.columnar import decode_columns, scan_page
from rmq.client.message import MessageQueue

__all__ = ["SCHEMA_DDL", "source_schema_ddl", "arrow_schema", "messages_to_batch", "pages_to_batch", "RawPage",
           "BODY_BYTES"]
log = logging.getLogger("rmq.spark")

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


@functools.lru_cache(maxsize=2)
def arrow_schema(include_properties: bool = True) -> pa.Schema:
    """The Arrow schema matching :func:`source_schema_ddl` as Spark converts it (made once per
    ``include_properties``: a schema is immutable, and every poll_arrow batch asks for it)."""
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


class RawPage:
    """The records of one pull, undecoded (concatenated CommitLog records, in queue order).

    ``len(page)`` is the number of records; ``body_bytes`` their stored body bytes.
    """
    __slots__ = ("data", "count", "first_queue_offset", "last_queue_offset", "body_bytes")

    def __init__(self, data, count: int, first_queue_offset: int, last_queue_offset: int, body_bytes: int):
        self.data = data
        self.count = count
        self.first_queue_offset = first_queue_offset
        self.last_queue_offset = last_queue_offset
        self.body_bytes = body_bytes

    @classmethod
    def scan(cls, data, end_queue_offset: int = -1) -> "RawPage":
        """Index ``data`` (no CRC checks), keeping the records below ``end_queue_offset`` (-1: all).

        Raises
        ------
        CorruptRecordError
        """
        nbytes, count, first, last, body = scan_page(data, end_queue_offset)
        if nbytes < len(data):
            data = memoryview(data)[:nbytes]
        return cls(data, count, first, last, body)

    def __len__(self) -> int:
        return self.count


def _buf(a: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(a)


def _var(typ, n: int, offsets: np.ndarray, data: np.ndarray, validity: Optional[np.ndarray] = None,
         nulls: int = 0) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [_buf(validity) if nulls else None, _buf(offsets), _buf(data)],
                                 null_count=nulls)


def _fixed(typ, values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(typ, len(values), [None, _buf(values)], null_count=0)


def _const_str(value: str, n: int) -> pa.Array:
    """``n`` times ``value`` as a string column, from buffers: ``pa.scalar`` / ``pa.array`` of
    Python objects make pyarrow import pandas (about 0.25 s on the first batch of a process)."""
    b = value.encode()
    return _var(pa.string(), n, np.arange(n + 1, dtype=np.int32) * len(b), np.frombuffer(b * n, np.uint8))


def _inflate_rows(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray, sys_flags: np.ndarray,
                  msg_ids: pa.Array) -> tuple:
    """Inflate the compressed bodies ``rows`` (as ``post_process_messages``: a body that does not
    inflate stays as stored, logged); the other bodies are moved as slices, O(len(rows)) Python."""
    from rmq.client.consumer_api import _decompress
    import zlib

    from rmq.errors import MQClientError
    mv = memoryview(data)
    lens = np.diff(offsets).astype(np.int64)
    pieces = []
    prev = 0
    for i in rows.tolist():
        pieces.append(mv[offsets[prev]:offsets[i]])
        stored = bytes(mv[offsets[i]:offsets[i + 1]])
        try:
            body = _decompress(stored, int(sys_flags[i]))
        except (zlib.error, ImportError, MQClientError, RuntimeError, ValueError) as e:
            log.warning("cannot decompress message %s (sysFlag %#x): %s", msg_ids[i].as_py(), int(sys_flags[i]), e)
            body = stored
        pieces.append(body)
        lens[i] = len(body)
        prev = i + 1
    pieces.append(mv[offsets[prev]:offsets[-1]])
    new_off = np.zeros(len(offsets), np.int64)
    np.cumsum(lens, out=new_off[1:])
    if new_off[-1] > 0x7FFFFFFF:
        raise ValueError(f"inflated bodies take {new_off[-1]} bytes, over the 2 GiB of one Arrow binary column")
    return new_off.astype(np.int32), np.frombuffer(b"".join(pieces), np.uint8)


def pages_to_batch(pages: Sequence, mq: Optional[MessageQueue], schema: pa.Schema,
                   include_properties: Optional[bool] = None, *, tags: Optional[set] = None, check_crc: bool = False,
                   mqs: Optional[Sequence[MessageQueue]] = None) -> pa.RecordBatch:
    """One RecordBatch from raw pull pages of queue ``mq``: the fast path of :func:`messages_to_batch`.

    Same schema and values as ``messages_to_batch(post-processed decode_records(page) ...)``:
    compressed bodies are inflated, ``__CRC32#`` is not shown, timestamps are UTC microseconds.

    Parameters
    ----------
    pages : sequence of bytes-like or :class:`RawPage`
        Concatenated CommitLog records (what PULL_MESSAGE answers carry), at least one record in all.
    mq : MessageQueue
        The queue they were pulled from (topic, broker and queue id columns are constants).
    schema : pa.Schema
        :func:`arrow_schema`.
    include_properties : bool, optional
        Build the ``properties`` column; default: whether ``schema`` has it.
    tags : set of str, optional
        Keep only rows whose TAGS is one of these (the client-side re-check of a tag subscription).
    check_crc : bool
        Verify body and ``__CRC32#`` CRCs (the broker already checks what it serves).
    mqs : sequence of MessageQueue, optional
        Instead of ``mq`` (None): the queue of each page, all of one broker group (pages of
        several queues in one batch; topic and queue id then come from the records).

    Raises
    ------
    CorruptRecordError
        A record does not check.

    Rows whose properties are not valid UTF-8 (``decode_records`` replaces those bytes) make
    the whole batch take the slow path (MessageExt + :func:`messages_to_batch`).
    """
    if include_properties is None:
        include_properties = "properties" in schema.names
    raw = [p.data if isinstance(p, RawPage) else p for p in pages]
    d = decode_columns(raw, check_crc, include_properties)
    if d["bad_utf8"]:
        if mqs is None:
            return _slow_batch(raw, mq, schema, tags, check_crc)
        parts = [_slow_batch([r], q, schema, tags, check_crc) for r, q in zip(raw, mqs)]
        return pa.Table.from_batches(parts, schema=schema).combine_chunks().to_batches()[0] \
            if any(b.num_rows for b in parts) else parts[0]
    n = d["n"]
    msg_id = _var(pa.string(), n, d["msg_id_offsets"], d["msg_id_data"])
    body_off, body_data = d["body_offsets"], d["body_data"]
    if len(d["compressed"]):
        body_off, body_data = _inflate_rows(body_off, body_data, d["compressed"], d["sys_flag"], msg_id)
    if mqs is None:
        topic = _const_str(mq.topic, n)
        queue_id = _fixed(pa.int32(), np.full(n, mq.queue_id, np.int32))
        broker_name = mq.broker_name
    else:
        topic = _var(pa.string(), n, d["topic_offsets"], d["topic_data"])
        queue_id = _fixed(pa.int32(), d["queue_id"])
        broker_name = mqs[0].broker_name
    cols = {
        "topic": topic,
        "broker_name": _const_str(broker_name, n),
        "queue_id": queue_id,
        "queue_offset": _fixed(pa.int64(), d["queue_offset"]),
        "commitlog_offset": _fixed(pa.int64(), d["commitlog_offset"]),
        "msg_id": msg_id,
        "tags": _var(pa.string(), n, d["tags_offsets"], d["tags_data"], d["tags_validity"], d["tags_nulls"]),
        "keys": _var(pa.string(), n, d["keys_offsets"], d["keys_data"], d["keys_validity"], d["keys_nulls"]),
        "body": _var(pa.binary(), n, body_off, body_data),
        "born_timestamp": _fixed(_TS, d["born_timestamp"] * 1000),
        "store_timestamp": _fixed(_TS, d["store_timestamp"] * 1000),
        "reconsume_times": _fixed(pa.int32(), d["reconsume_times"]),
    }
    if "properties" in schema.names:
        if include_properties:
            ne = len(d["prop_key_offsets"]) - 1
            keys = _var(pa.string(), ne, d["prop_key_offsets"], d["prop_key_data"])
            values = _var(pa.string(), ne, d["prop_value_offsets"], d["prop_value_data"])
            offsets = _fixed(pa.int32(), d["prop_offsets"])
            cols["properties"] = pa.MapArray.from_arrays(offsets, keys, values, type=_MAP)
        else:
            cols["properties"] = pa.nulls(n, _MAP)
    batch = pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)
    if tags is not None:
        batch = batch.filter(pc.is_in(cols["tags"], value_set=pa.array(sorted(tags), pa.string())))
    return batch


def _slow_batch(raw: list, mq: MessageQueue, schema: pa.Schema, tags: Optional[set], check_crc: bool):
    from rmq._core.commitlog import decode_records
    from rmq.client.consumer_api import post_process_messages
    msgs = [m for p in raw for m in post_process_messages(decode_records(p, True, check_crc))]
    if tags is not None:
        msgs = [m for m in msgs if m.properties.get("TAGS") in tags]
    if not msgs:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return messages_to_batch([msgs], mq, schema)


def column(batch: pa.RecordBatch, name: str) -> Optional[list]:
    """``batch[name]`` as a Python list, or None when the batch has no such column."""
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i).to_pylist()
