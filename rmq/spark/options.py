"""Option parsing and validation of the ``rmq`` Spark source and sink.

Options arrive as a case-insensitive map of strings.  Every check happens on the
driver when the DataFrame is defined (``load()`` / ``save()`` / ``start()``), and a
bad value raises :class:`RmqOptionError` naming the option, the value and what is
allowed.  The parsed result is a frozen dataclass that pickles to the executors.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from rmq.errors import FilterExpressionError, RmqError
from rmq.filter import MessageSelector, sql92
from rmq.spark.offsets import OffsetSpec, parse_offset_spec

__all__ = ["RmqOptionError", "SourceOptions", "SinkOptions", "SOURCE_OPTIONS", "SINK_OPTIONS"]

DEFAULT_PULL_TIMEOUT_MS = 10_000        # one PULL_MESSAGE round trip, ms
DEFAULT_PULL_BATCH_SIZE = 1024          # maxMsgNums per pull (the broker also caps by count and bytes)
MAX_PULL_BATCH_SIZE = 4096              # the broker's MAX_PULL_BATCH
DEFAULT_ARROW_BATCH_ROWS = 16_384       # rows per RecordBatch handed to Spark (>= 10 k is the sweet spot)
DEFAULT_CONSUMER_GROUP = "spark-rmq-source"
DEFAULT_PRODUCER_GROUP = "spark-rmq-sink"
DEFAULT_SEND_TIMEOUT_MS = 10_000        # budget of one send, retries included, ms
DEFAULT_LINGER_MS = 5                   # producer batching: wait for companions, ms
DEFAULT_BATCH_BYTES = 256 << 10         # producer batching: ship at this many bytes

# name (lower case) -> canonical spelling, for the error listing
SOURCE_OPTIONS = {n.lower(): n for n in (
    "nameServer", "topic", "topics", "topicPattern", "assign", "subExpression", "expressionType",
    "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp", "failOnDataLoss",
    "pullTimeoutMs", "pullBatchSize", "includeProperties", "minPartitions", "maxRecordsPerPartition",
    "maxOffsetsPerTrigger", "consumerGroup", "arrowBatchSize")}
SINK_OPTIONS = {n.lower(): n for n in (
    "nameServer", "topic", "producerGroup", "sendTimeoutMs", "lingerMs", "batchSize",
    "checkpointLocation")}       # Spark passes writeStream's checkpointLocation to the sink too

_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")     # topic / group charset of the broker


class RmqOptionError(RmqError, ValueError):
    """A missing, unknown or malformed option of the ``rmq`` data source."""


def _get(options: Mapping[str, str], name: str) -> Optional[str]:
    v = options.get(name)
    if v is None:
        v = options.get(name.lower())
    if v is None:
        return None
    v = str(v).strip()
    return v if v else None


def _int(options, name: str, default: Optional[int], lo: int, hi: Optional[int] = None,
         unit: str = "") -> Optional[int]:
    s = _get(options, name)
    if s is None:
        return default
    try:
        v = int(s)
    except ValueError:
        raise RmqOptionError(f"option {name!r} must be an integer{unit}, got {s!r}") from None
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise RmqOptionError(f"option {name!r} must be {rng}{unit}, got {v}")
    return v


def _bool(options, name: str, default: bool) -> bool:
    s = _get(options, name)
    if s is None:
        return default
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    raise RmqOptionError(f"option {name!r} must be 'true' or 'false', got {s!r}")


def _check_known(options: Mapping[str, str], known: dict, what: str) -> None:
    for k in options:
        if str(k).lower() not in known:
            close = difflib.get_close_matches(str(k).lower(), list(known), n=1)
            hint = f" (did you mean {known[close[0]]!r}?)" if close else ""
            raise RmqOptionError(f"unknown {what} option {k!r}{hint}; the rmq {what} takes (case-insensitive): "
                                 + ", ".join(sorted(known.values())))


def _name_server(options) -> str:
    ns = _get(options, "nameServer")
    if ns is None:
        raise RmqOptionError("option 'nameServer' is required (host:port[;host:port...] of the NameServers)")
    for a in ns.split(";"):
        a = a.strip()
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RmqOptionError(f"option 'nameServer': {a!r} is not host:port (in {ns!r})")
    return ns


def _topic(option: str, t: str) -> str:
    if not _NAME.match(t) or len(t) > 127:
        raise RmqOptionError(f"option {option!r}: {t!r} is not a valid topic name "
                             f"(1-127 characters of [%|a-zA-Z0-9_-])")
    return t


@dataclass(frozen=True)
class SourceOptions:
    """Parsed source options (see :class:`rmq.spark.RmqDataSource` for the manual)."""
    name_server: str
    topics: tuple = ()                       # explicit topics (topic / topics / assign)
    topic_pattern: Optional[str] = None      # full-match regex over the NameServer's topic list
    assign: Optional[dict] = None            # topic -> frozenset of (broker or None, queue id)
    sub_expression: str = "*"
    expression_type: str = "TAG"             # TAG or SQL92 (RocketMQ's ExpressionType)
    starting: Optional[OffsetSpec] = None    # None: the mode's default
    ending: Optional[OffsetSpec] = None
    starting_timestamp: Optional[int] = None  # ms since epoch (store time)
    ending_timestamp: Optional[int] = None
    fail_on_data_loss: bool = True
    pull_timeout_ms: int = DEFAULT_PULL_TIMEOUT_MS
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    include_properties: bool = True
    min_partitions: Optional[int] = None
    max_records_per_partition: Optional[int] = None
    max_offsets_per_trigger: Optional[int] = None
    consumer_group: str = DEFAULT_CONSUMER_GROUP
    commit_to_broker: bool = False           # consumerGroup given: commit() reports offsets
    arrow_batch_size: int = DEFAULT_ARROW_BATCH_ROWS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        """Parse and check every source option.

        Raises
        ------
        RmqOptionError
        """
        _check_known(options, SOURCE_OPTIONS, "source")
        ns = _name_server(options)
        given = [n for n in ("topic", "topics", "topicPattern", "assign") if _get(options, n) is not None]
        if len(given) != 1:
            raise RmqOptionError("exactly one of the options 'topic', 'topics', 'topicPattern', 'assign' "
                                 f"must be set, got {given or 'none'}")
        topics: tuple = ()
        pattern = None
        assign = None
        sel = given[0]
        text = _get(options, sel)
        if sel in ("topic", "topics"):
            names = [t.strip() for t in text.split(",") if t.strip()]
            if not names:
                raise RmqOptionError(f"option {sel!r} names no topic")
            topics = tuple(dict.fromkeys(_topic(sel, t) for t in names))
        elif sel == "topicPattern":
            try:
                re.compile(text)
            except re.error as e:
                raise RmqOptionError(f"option 'topicPattern': {text!r} is not a valid regular expression: "
                                     f"{e}") from None
            pattern = text
        else:
            assign = _parse_assign(text)
            topics = tuple(sorted(assign))
        expression_type = (_get(options, "expressionType") or "TAG").strip().upper()
        if expression_type not in ("TAG", "SQL92"):
            raise RmqOptionError(f"option 'expressionType': {_get(options, 'expressionType')!r} is not TAG or SQL92")
        if expression_type == "SQL92":
            sub = _get(options, "subExpression")
            if not sub or not sub.strip():
                raise RmqOptionError("option 'expressionType' is SQL92 but 'subExpression' is not set")
            try:
                sql92.parse(sub)
            except FilterExpressionError as e:
                raise RmqOptionError(f"option 'subExpression': {e}") from None
        else:
            sub = _get(options, "subExpression") or "*"
            if sub != "*" and not [t for t in sub.split("||") if t.strip()]:
                raise RmqOptionError(f"option 'subExpression': {sub!r} names no tag (use '*' or 'tagA || tagB')")
        starting = ending = None
        try:
            if _get(options, "startingOffsets") is not None:
                starting = parse_offset_spec("startingOffsets", _get(options, "startingOffsets"))
            if _get(options, "endingOffsets") is not None:
                ending = parse_offset_spec("endingOffsets", _get(options, "endingOffsets"), allow_earliest=False)
        except ValueError as e:
            raise RmqOptionError(str(e)) from None
        st = _int(options, "startingTimestamp", None, 0, unit=" (ms since the epoch)")
        et = _int(options, "endingTimestamp", None, 0, unit=" (ms since the epoch)")
        if st is not None and et is not None and et < st:
            raise RmqOptionError(f"option 'endingTimestamp' ({et}) is before 'startingTimestamp' ({st})")
        group = _get(options, "consumerGroup")
        if group is not None and (not _NAME.match(group) or len(group) > 255):
            raise RmqOptionError(f"option 'consumerGroup': {group!r} is not a valid group name "
                                 f"(1-255 characters of [%|a-zA-Z0-9_-])")
        return cls(
            name_server=ns, topics=topics, topic_pattern=pattern, assign=assign,
            sub_expression=sub, expression_type=expression_type, starting=starting, ending=ending, starting_timestamp=st, ending_timestamp=et,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            pull_timeout_ms=_int(options, "pullTimeoutMs", DEFAULT_PULL_TIMEOUT_MS, 1, unit=" (ms)"),
            pull_batch_size=_int(options, "pullBatchSize", DEFAULT_PULL_BATCH_SIZE, 1, MAX_PULL_BATCH_SIZE,
                                 unit=" (messages per pull)"),
            include_properties=_bool(options, "includeProperties", True),
            min_partitions=_int(options, "minPartitions", None, 1),
            max_records_per_partition=_int(options, "maxRecordsPerPartition", None, 1),
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None, 1),
            consumer_group=group or DEFAULT_CONSUMER_GROUP, commit_to_broker=group is not None,
            arrow_batch_size=_int(options, "arrowBatchSize", DEFAULT_ARROW_BATCH_ROWS, 1, unit=" (rows)"))

    @property
    def selector(self):
        """The subscription as clients take it: None for everything, else a tag string or a
        :class:`rmq.MessageSelector` for SQL92."""
        if self.expression_type == "SQL92":
            return MessageSelector.by_sql(self.sub_expression)
        return None if self.sub_expression == "*" else self.sub_expression

    def check_batch(self) -> None:
        """Options that make no sense in a batch query.

        Raises
        ------
        RmqOptionError
        """
        if self.max_offsets_per_trigger is not None:
            raise RmqOptionError("option 'maxOffsetsPerTrigger' applies to streaming queries only")
        if self.starting is not None and self.starting.kind == "latest" and self.starting_timestamp is None:
            raise RmqOptionError("option 'startingOffsets' = 'latest' is not valid in a batch query "
                                 "(it would read nothing); use 'earliest', JSON or 'startingTimestamp'")
        for t in self.starting.topics() if self.starting else ():
            self._named_topic("startingOffsets", t)
        for t in self.ending.topics() if self.ending else ():
            self._named_topic("endingOffsets", t)

    def check_stream(self) -> None:
        """Options that make no sense in a streaming query (Kafka rejects them too).

        Raises
        ------
        RmqOptionError
        """
        for name, v in (("endingOffsets", self.ending), ("endingTimestamp", self.ending_timestamp)):
            if v is not None:
                raise RmqOptionError(f"option {name!r} is not valid in a streaming query "
                                     f"(a stream has no end; use a batch read)")
        for t in self.starting.topics() if self.starting else ():
            self._named_topic("startingOffsets", t)

    def _named_topic(self, option: str, t: str) -> None:
        if self.topic_pattern is not None:
            if not re.fullmatch(self.topic_pattern, t):
                raise RmqOptionError(f"option {option!r} names topic {t!r}, which 'topicPattern' "
                                     f"{self.topic_pattern!r} does not match")
        elif t not in self.topics:
            raise RmqOptionError(f"option {option!r} names topic {t!r}, which is not subscribed "
                                 f"(subscribed: {', '.join(self.topics)})")


def _parse_assign(text: str) -> dict:
    """``{"t": [0, 1]}`` (every broker) or ``{"t": {"broker-a": [0, 1]}}``."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise RmqOptionError(f"option 'assign' must be JSON like {{\"topic\": [0, 1]}}; {text!r} does not "
                             f"parse: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise RmqOptionError(f"option 'assign' must be a non-empty JSON object like {{\"topic\": [0, 1]}}, "
                             f"got {text!r}")
    out = {}
    for topic, v in doc.items():
        _topic("assign", topic)
        pairs = []
        items = [(None, v)] if isinstance(v, list) else list(v.items()) if isinstance(v, dict) else None
        if items is None:
            raise RmqOptionError(f"option 'assign': topic {topic!r} must map to a list of queue ids or to "
                                 f"{{broker: [queue ids]}}, got {v!r}")
        for broker, qids in items:
            if not isinstance(qids, list) or not all(isinstance(q, int) and not isinstance(q, bool) and q >= 0
                                                     for q in qids):
                raise RmqOptionError(f"option 'assign': queue ids of topic {topic!r} must be a list of "
                                     f"integers >= 0, got {qids!r}")
            pairs.extend((broker, q) for q in qids)
        if not pairs:
            raise RmqOptionError(f"option 'assign': topic {topic!r} has no queue")
        out[topic] = frozenset(pairs)
    return out


@dataclass(frozen=True)
class SinkOptions:
    """Parsed sink options."""
    name_server: str
    topic: Optional[str]                     # overrides the topic column
    producer_group: str = DEFAULT_PRODUCER_GROUP
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    linger_ms: int = DEFAULT_LINGER_MS
    batch_size: int = DEFAULT_BATCH_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SinkOptions":
        """Raises :class:`RmqOptionError`."""
        _check_known(options, SINK_OPTIONS, "sink")
        ns = _name_server(options)
        topic = _get(options, "topic")
        if topic is not None:
            _topic("topic", topic)
        group = _get(options, "producerGroup") or DEFAULT_PRODUCER_GROUP
        if not _NAME.match(group) or len(group) > 255:
            raise RmqOptionError(f"option 'producerGroup': {group!r} is not a valid group name")
        return cls(ns, topic, group,
                   send_timeout_ms=_int(options, "sendTimeoutMs", DEFAULT_SEND_TIMEOUT_MS, 1, unit=" (ms)"),
                   linger_ms=_int(options, "lingerMs", DEFAULT_LINGER_MS, 0, unit=" (ms)"),
                   batch_size=_int(options, "batchSize", DEFAULT_BATCH_BYTES, 0, unit=" (bytes)"))
