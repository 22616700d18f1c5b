"""Prometheus metrics of a broker group, under RocketMQ 5's names (rocketmq_*).

Settings (broker.conf, RocketMQ 5's BrokerConfig names and defaults):

- ``metricsExporterType``: DISABLE (default) or PROM.  RocketMQ's OTLP_GRPC and LOG are
  refused with a clear error (rmq exports Prometheus text only).
- ``metricsPromExporterPort`` (5557; 0 = any free port, logged) and ``metricsPromExporterHost``
  (default ``brokerIP1``, else 127.0.0.1): where the broker serves ``GET /metrics``.
- ``metricsLabel``: extra labels on every series, ``key:value,key:value`` (RocketMQ's form).

Where the figures come from (ARCHITECTURE.md terms): the broker actor is the one process of the
group that sees every send, pull, heartbeat and the announcements of flush, reput and ha, so it
owns the registry and serves the scrape endpoint for the whole group.  Counters and histograms
(messages and bytes in / out, message size, DLQ, RPC latency, flush latency, group-commit size)
are updated in the broker's loop as requests are answered; prometheus-client's objects are
thread-safe.  Gauges (lag, connections, storage, HA, per-actor CPU and RSS) are computed *at
scrape time inside the broker's loop*: the HTTP server thread hands the scrape to the loop
(:class:`LoopBridge`, an inproc ZeroMQ poke plus a Future) and waits up to
:data:`SCRAPE_TIMEOUT_S`; it never reads the store itself, so a scrape cannot race a cleaner
unmapping a file.  Other actors' processes are found through the pid files each actor writes
(``<store>/run/<actor>.pid``, :func:`rmq.actors.actor.write_pid_file`).

Names, types, labels and histogram buckets: apache/rocketmq ``BrokerMetricsConstant``,
``BrokerMetricsManager``, ``DefaultStoreMetricsConstant`` and ``RemotingMetricsConstant``
(RocketMQ 5).  Counter names are given without ``_total``: the exposition adds it
(``rocketmq_messages_in_total``).  As in RocketMQ, sends to ``%RETRY%`` / ``%DLQ%`` topics are
not counted in messages_in and pulls from them not in messages_out.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional

import zmq

from rmq.actors.actor import RUN_DIR
from rmq.common.mix_all import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# prometheus_client is imported where a registry is built: every actor imports this module (through
# broker_conf's settings check), only the broker and the NameServer export (about 45 ms of import)

log = logging.getLogger("rmq.metrics")

METRICS_EXPORTER_TYPES = ("DISABLE", "OTLP_GRPC", "PROM", "LOG")    # RocketMQ 5 MetricsExporterType
SUPPORTED_EXPORTER_TYPES = ("DISABLE", "PROM")
DEFAULT_METRICS_PROM_EXPORTER_PORT = 5557          # BrokerConfig.metricsPromExporterPort
DEFAULT_NAMESRV_METRICS_PROM_EXPORTER_PORT = 5558  # rmq: namesrvMetricsPromExporterPort (RocketMQ's has none)
SCRAPE_TIMEOUT_S = 5.0          # a scrape waits this long for the broker's loop, then answers without gauges
MAX_METRICS_LABELS = 16         # metricsLabel pairs
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = ("cluster", "node_type", "node_id")

# BrokerMetricsManager.registerMetricsView: 1 KiB, 4 KiB, 512 KiB, 1 MiB, 2 MiB, 4 MiB (bytes)
MESSAGE_SIZE_BUCKETS = (1024.0, 4096.0, 512.0 * 1024, 1024.0 ** 2, 2.0 * 1024 ** 2, 4.0 * 1024 ** 2)
# RemotingMetricsManager.getMetricsView: 1, 3, 5, 7, 10, 100, 1000, 2000, 3000 ms
RPC_LATENCY_BUCKETS_MS = (1.0, 3.0, 5.0, 7.0, 10.0, 100.0, 1000.0, 2000.0, 3000.0)
# rmq's own: flush (msync) latency in ms, bytes per flush (group commit)
FLUSH_LATENCY_BUCKETS_MS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0)
GROUP_COMMIT_BUCKETS = (4096.0, 65536.0, 1024.0 ** 2, 4.0 * 1024 ** 2, 16.0 * 1024 ** 2, 64.0 * 1024 ** 2)

CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"                 # MixAll.CID_RMQ_SYS_PREFIX: system groups
# TopicValidator's system topics (and its rmq_sys_ prefix)
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                           "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "rmq_sys_wheel_timer"})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"


class MetricsConfigError(ValueError):
    """A metrics* property has a bad value; the message names it."""


@dataclass
class MetricsSettings:
    exporter_type: str = "DISABLE"
    host: str = "127.0.0.1"
    port: int = DEFAULT_METRICS_PROM_EXPORTER_PORT
    labels: dict = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.exporter_type == "PROM"


def metrics_settings(settings: Mapping) -> MetricsSettings:
    """The metrics* properties of broker ``settings``, checked.

    Raises
    ------
    MetricsConfigError
        Unknown or unsupported ``metricsExporterType``, a port outside 0..65535, or a
        ``metricsLabel`` that is not ``key:value[,key:value]`` with Prometheus label names
        (at most :data:`MAX_METRICS_LABELS`, none of cluster / node_type / node_id).
    """
    kind = str(settings.get("metricsExporterType", "DISABLE")).strip().upper()
    if kind not in METRICS_EXPORTER_TYPES:
        raise MetricsConfigError(f"metricsExporterType must be one of {', '.join(METRICS_EXPORTER_TYPES)}, "
                                 f"got {kind!r}")
    if kind not in SUPPORTED_EXPORTER_TYPES:
        raise MetricsConfigError(f"metricsExporterType={kind} is not supported by rmq: use PROM (Prometheus "
                                 f"scrape endpoint) or DISABLE")
    raw_port = str(settings.get("metricsPromExporterPort", DEFAULT_METRICS_PROM_EXPORTER_PORT)).strip()
    try:
        port = int(raw_port)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise MetricsConfigError(f"metricsPromExporterPort must be 0..65535, got {raw_port!r}")
    host = str(settings.get("metricsPromExporterHost") or settings.get("brokerIP1") or "127.0.0.1").strip()
    labels: dict = {}
    raw = str(settings.get("metricsLabel") or "").strip()
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        k, sep, v = pair.partition(":")
        k = k.strip()
        if not sep or not LABEL_NAME.match(k) or k in RESERVED_LABELS or k.startswith("__"):
            raise MetricsConfigError(f"metricsLabel entry {pair[:80]!r} must be key:value with a label name "
                                     f"[a-zA-Z_][a-zA-Z0-9_]* other than {', '.join(RESERVED_LABELS)}")
        labels[k] = v.strip()
    if len(labels) > MAX_METRICS_LABELS:
        raise MetricsConfigError(f"metricsLabel has {len(labels)} labels; at most {MAX_METRICS_LABELS}")
    return MetricsSettings(kind, host, port, labels)


def namesrv_metrics_settings(props: Mapping, port: Optional[int] = None, listen_addr: str = "127.0.0.1"
                             ) -> MetricsSettings:
    """A NameServer's metrics settings: ``port`` (``--metrics-port``) turns them on; else the
    properties file's ``metricsExporterType=PROM`` does, on ``namesrvMetricsPromExporterPort``
    (default :data:`DEFAULT_NAMESRV_METRICS_PROM_EXPORTER_PORT`).  Host: ``metricsPromExporterHost``,
    else the NameServer's listen address.

    Raises
    ------
    MetricsConfigError
        As :func:`metrics_settings`; or a port outside 0..65535.
    """
    s = metrics_settings({**props, "metricsPromExporterPort": props.get("namesrvMetricsPromExporterPort",
                                                                        DEFAULT_NAMESRV_METRICS_PROM_EXPORTER_PORT),
                          "metricsPromExporterHost": props.get("metricsPromExporterHost") or listen_addr})
    if port is not None:
        if not 0 <= port <= 65535:
            raise MetricsConfigError(f"--metrics-port must be 0..65535, got {port}")
        s.exporter_type, s.port = "PROM", port
    return s


def is_retry_or_dlq_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def is_system_group(group: str) -> bool:
    return group.lower().startswith(CID_RMQ_SYS_PREFIX.lower())


def message_type(properties: Optional[Mapping], transaction_prepared: bool = False) -> str:
    """RocketMQ's ``message_type`` label (BrokerMetricsManager.getMessageType): transaction, fifo
    (a SHARDING_KEY), delay (a delay level or a deliver time), else normal."""
    if transaction_prepared or (properties and str(properties.get("TRAN_MSG", "")).lower() == "true"):
        return "transaction"
    if not properties:
        return "normal"
    if "__SHARDINGKEY" in properties:
        return "fifo"
    if any(k in properties for k in ("DELAY", "__STARTDELIVERTIME", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
                                     "TIMER_DELAY_MS")):
        return "delay"
    return "normal"


def _bool(v: bool) -> str:
    return "true" if v else "false"


# -- pid files: how the broker finds the other actors of its group ---------------------------------------------
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def actor_processes(store_path: str) -> list:
    """[(actor, pid, cpu seconds, rss bytes)] of the live actors with a pid file in ``store_path``
    (Linux /proc; empty elsewhere)."""
    out = []
    d = os.path.join(store_path, RUN_DIR)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".pid"))
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(d, n)) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if stat[0] == "Z":
            continue
        cpu = (int(stat[11]) + int(stat[12])) / _CLK_TCK       # utime + stime
        rss = int(stat[21]) * _PAGE
        out.append((n[:-len(".pid")], pid, cpu, rss))
    return out


def actor_restarts(store_path: str) -> dict:
    """``{actor: restarts}`` from the supervisor's ``<store>/run/restarts.json`` ({} without one:
    actors started by hand)."""
    try:
        with open(os.path.join(store_path, RUN_DIR, "restarts.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


# -- the scrape hand-off ---------------------------------------------------------------------------------------
class LoopBridge:
    """Runs a function in an actor's loop on behalf of another thread.

    The loop side binds an inproc PULL socket (:attr:`socket`, to poll) and calls :meth:`serve`
    when it is readable; :meth:`call` (any other thread) queues a Future, pokes the socket and
    waits for the result.
    """

    def __init__(self, ctx: zmq.Context, fn: Callable[[], object]):
        self.ctx = ctx
        self.fn = fn
        self.endpoint = f"inproc://rmq-metrics-{id(self):x}"
        self.socket = ctx.socket(zmq.PULL)
        self.socket.bind(self.endpoint)
        self._pending: "queue.SimpleQueue[Future]" = queue.SimpleQueue()

    def serve(self, _parts=None) -> None:
        """Loop side: answer every queued call."""
        while True:
            try:
                self.socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
        while True:
            try:
                fut = self._pending.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self.fn())
            except Exception as e:  # noqa: BLE001 - handed to the scrape, which logs it
                fut.set_exception(e)

    def call(self, timeout_s: float = SCRAPE_TIMEOUT_S):
        """Other thread: ``fn()`` as run by the loop.  Raises TimeoutError when the loop did
        not answer within ``timeout_s``, or what ``fn`` raised."""
        fut: Future = Future()
        self._pending.put(fut)
        s = self.ctx.socket(zmq.PUSH)
        try:
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(self.endpoint)
            s.send(b"", flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        finally:
            s.close()
        try:
            return fut.result(timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise TimeoutError(f"the broker's loop did not answer the scrape within {timeout_s:g} s") from None

    def close(self) -> None:
        self.socket.close(linger=0)


class _BridgedCollector:
    """A prometheus-client collector whose families are computed by the actor's loop."""

    def __init__(self, bridge: LoopBridge, timeout_s: float = SCRAPE_TIMEOUT_S):
        self.bridge = bridge
        self.timeout_s = timeout_s

    def collect(self) -> Iterable:
        try:
            return self.bridge.call(self.timeout_s)
        except Exception as e:  # noqa: BLE001 - a scrape never fails on the gauges: counters still go out
            log.warning("metrics scrape: gauges left out: %s", e)
            return []


# -- an actor's metrics: registry, scrape endpoint, RPC latency ----------------------------------------------------
class ActorMetrics:
    """The registry of one actor process (the broker for its group, or a NameServer) and its
    scrape endpoint.

    Parameters
    ----------
    settings : MetricsSettings
    node_type : str
        ``broker`` or ``nameserver`` (RocketMQ's ``node_type`` label).
    cluster, node_id : str
        Common labels (``cluster`` = brokerClusterName, ``node_id`` = brokerName or the
        NameServer's address), plus ``settings.labels``.
    ctx : zmq.Context
        The actor's context (for the scrape hand-off).
    gauges : callable
        ``gauges(metrics) -> list`` of prometheus-client metric families, run in the actor's loop
        at each scrape.
    """

    def __init__(self, settings: MetricsSettings, node_type: str, cluster: str, node_id: str, ctx: zmq.Context,
                 gauges: Callable[["ActorMetrics"], list]):
        self.settings = settings
        self.common = {"cluster": cluster, "node_type": node_type, "node_id": node_id, **settings.labels}
        self.common_names = list(self.common)
        self.common_values = [str(v) for v in self.common.values()]
        from prometheus_client import CollectorRegistry, Histogram
        self.registry = CollectorRegistry(auto_describe=False)
        self.rpc_latency = Histogram("rocketmq_rpc_latency", "Request latency in the actor (milliseconds)",
                                     self.common_names + ["protocol_type", "request_code", "response_code",
                                                          "is_long_polling", "result"],
                                     buckets=RPC_LATENCY_BUCKETS_MS, registry=self.registry)
        self._children: dict = {}
        self.bridge = LoopBridge(ctx, lambda: gauges(self))
        self.gauges_collector = _BridgedCollector(self.bridge)
        self.registry.register(self.gauges_collector)
        self.server = None
        self.port = 0

    def start(self) -> int:
        """Serve ``GET /metrics`` on (host, port); returns the bound port.  Raises OSError when the
        address is taken (the actor refuses to start: RocketMQ does the same)."""
        from prometheus_client import start_http_server
        self.server, _thread = start_http_server(self.settings.port, self.settings.host, registry=self.registry)
        self.port = self.server.server_port
        return self.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.bridge.close()

    def _child(self, metric, *values):
        key = (id(metric), values)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*self.common_values, *values)
        return c

    def on_rpc(self, request_code: str, response_code: str, ms: float, long_polling: bool, result: str) -> None:
        self._child(self.rpc_latency, "remoting", request_code, response_code, _bool(long_polling),
                    result).observe(ms)

    # -- gauge helpers (for the gauges callable) ------------------------------------------------------------
    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> "GaugeMetricFamily":
        from prometheus_client.core import GaugeMetricFamily
        return GaugeMetricFamily(name, doc, labels=self.common_names + list(labels))

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> "CounterMetricFamily":
        from prometheus_client.core import CounterMetricFamily
        return CounterMetricFamily(name, doc, labels=self.common_names + list(labels))

    def values(self, *extra) -> list:
        return self.common_values + [str(v) for v in extra]


class RpcObserver:
    """``Reply.observer`` for an actor: request / response codes named as RocketMQ's enums
    (lower case), then :meth:`ActorMetrics.on_rpc`."""

    def __init__(self, metrics: ActorMetrics, request_codes, response_codes):
        self.metrics = metrics
        self.request_codes = request_codes
        self.response_codes = response_codes
        self._names: dict = {}

    def _name(self, enum, code: int) -> str:
        key = (enum, code)
        n = self._names.get(key)
        if n is None:
            try:
                n = enum(code).name.lower()
            except ValueError:
                n = "none" if code < 0 else str(code)
            self._names[key] = n
        return n

    def __call__(self, request_code: int, response_code: int, ms: float, held: bool, result: str) -> None:
        self.metrics.on_rpc(self._name(self.request_codes, request_code),
                            self._name(self.response_codes, response_code), ms, held, result)


class BrokerMetrics(ActorMetrics):
    """:class:`ActorMetrics` of a broker group, with the broker's counters and histograms."""

    def __init__(self, settings: MetricsSettings, cluster: str, node_id: str, ctx: zmq.Context,
                 gauges: Callable[["ActorMetrics"], list]):
        super().__init__(settings, "broker", cluster, node_id, ctx, gauges)
        from prometheus_client import Counter, Histogram
        base = self.common_names
        r = self.registry
        self.messages_in = Counter("rocketmq_messages_in", "Total number of incoming messages",
                                   base + ["topic", "message_type", "is_system"], registry=r)
        self.throughput_in = Counter("rocketmq_throughput_in", "Total traffic of incoming messages (bytes)",
                                     base + ["topic", "message_type", "is_system"], registry=r)
        self.message_size = Histogram("rocketmq_message_size", "Incoming messages size (bytes)",
                                      base + ["topic", "message_type", "is_system"],
                                      buckets=MESSAGE_SIZE_BUCKETS, registry=r)
        self.messages_out = Counter("rocketmq_messages_out", "Total number of outgoing messages",
                                    base + ["topic", "consumer_group", "is_system"], registry=r)
        self.throughput_out = Counter("rocketmq_throughput_out", "Total traffic of outgoing messages (bytes)",
                                      base + ["topic", "consumer_group", "is_system"], registry=r)
        self.send_to_dlq = Counter("rocketmq_send_to_dlq_messages", "Consumer send to DLQ messages",
                                   base + ["topic", "consumer_group", "is_system"], registry=r)
        self.flush_latency = Histogram("rocketmq_storage_flush_latency",
                                       "CommitLog flush (msync) latency of the flush actor (milliseconds)",
                                       base, buckets=FLUSH_LATENCY_BUCKETS_MS, registry=r)
        self.group_commit_size = Histogram("rocketmq_storage_group_commit_size",
                                           "Bytes made durable by one flush (group commit)", base,
                                           buckets=GROUP_COMMIT_BUCKETS, registry=r)

    def on_put(self, topic: str, mtype: str, msgs: int, wrote_bytes: int) -> None:
        """A successful send of ``msgs`` messages, ``wrote_bytes`` stored (SendMessageProcessor)."""
        if msgs <= 0 or is_retry_or_dlq_topic(topic):
            return
        lv = (topic, mtype, _bool(is_system_topic(topic)))
        self._child(self.messages_in, *lv).inc(msgs)
        self._child(self.throughput_in, *lv).inc(wrote_bytes)
        self._child(self.message_size, *lv).observe(wrote_bytes / msgs)

    def on_get(self, topic: str, group: str, msgs: int, nbytes: int) -> None:
        """A pull answered with ``msgs`` messages of ``nbytes`` (DefaultPullMessageResultHandler)."""
        if msgs <= 0 or is_retry_or_dlq_topic(topic):
            return
        lv = (topic, group, _bool(is_system_topic(topic) or is_system_group(group)))
        self._child(self.messages_out, *lv).inc(msgs)
        self._child(self.throughput_out, *lv).inc(nbytes)

    def on_dlq(self, topic: str, group: str) -> None:
        """A message moved to ``%DLQ%group`` after maxReconsumeTimes."""
        self._child(self.send_to_dlq, topic, group, _bool(is_system_topic(topic) or is_system_group(group))).inc()

    def on_flush(self, ms: float, nbytes: int) -> None:
        self._child(self.flush_latency).observe(ms)
        if nbytes > 0:
            self._child(self.group_commit_size).observe(nbytes)


def lag_rows(offset_table: Mapping[str, Mapping[int, int]], pull_offsets: Mapping[tuple, int],
             max_offset: Callable[[str, int], int], store_time: Callable[[str, int, int], int],
             separator: str = "@") -> list:
    """Per (group, topic): RocketMQ's ConsumerLagCalculator figures from committed offsets.

    Returns [(group, topic, lag, earliest unconsumed store time ms or 0, inflight, ready,
    earliest un-pulled store time ms or 0)]: lag = sum over queues of max offset - committed
    offset; inflight = pulled - committed; ready = max offset - pulled (the pull offset is the
    committed one when nothing was pulled since the broker started).
    """
    rows = []
    for key, queues in offset_table.items():
        topic, sep, group = key.rpartition(separator)
        if not sep:
            continue
        lag = inflight = ready = 0
        earliest_unconsumed = earliest_unpulled = 0
        for qid, committed in dict(queues).items():
            mx = max_offset(topic, qid)
            committed = min(max(committed, 0), mx)
            pulled = min(max(pull_offsets.get((group, topic, qid), committed), committed), mx)
            if mx > committed:
                lag += mx - committed
                t = store_time(topic, qid, committed)
                if t > 0 and (earliest_unconsumed == 0 or t < earliest_unconsumed):
                    earliest_unconsumed = t
            inflight += pulled - committed
            if mx > pulled:
                ready += mx - pulled
                t = store_time(topic, qid, pulled)
                if t > 0 and (earliest_unpulled == 0 or t < earliest_unpulled):
                    earliest_unpulled = t
        rows.append((group, topic, lag, earliest_unconsumed, inflight, ready, earliest_unpulled))
    return rows
