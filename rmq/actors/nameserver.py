"""NameServer actor: the route registry and broker liveness (SPEC.md §14).

Responsibility
    Replaces RocketMQ's ``NamesrvController`` + ``DefaultRequestProcessor``; the
    tables live in :class:`rmq.actors.route.RouteInfoManager`.  Brokers register
    (and re-register every 30 s) with every NameServer; producers, consumers and
    admin tools ask it for topic routes and cluster membership.  NameServers do
    not talk to each other: each holds only what brokers told it.

Sockets
    ROUTER, bound at ``tcp://LISTEN_ADDR:LISTEN_PORT`` (default 127.0.0.1:9876;
    port 0 = ephemeral), inbound requests, one response each:

    ====================================  =====  ==========================================
    request                               code   fields -> response
    ====================================  =====  ==========================================
    REGISTER_BROKER                       103    clusterName, brokerAddr, brokerName,
                                                 brokerId, haServerAddr; body 0 =
                                                 {topicConfigTable, dataVersion}
                                                 -> fields masterAddr, haServerAddr
    UNREGISTER_BROKER                     104    clusterName, brokerAddr, brokerName, brokerId
    GET_ROUTEINFO_BY_TOPIC                105    topic -> body 0 = TopicRouteData
                                                 (TOPIC_NOT_EXIST when unknown)
    GET_BROKER_CLUSTER_INFO               106    -> body 0 = ClusterInfo
    WIPE_WRITE_PERM_OF_BROKER             205    brokerName -> field wipeTopicCount
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER    206    -> body 0 = {topicList}
    DELETE_TOPIC_IN_NAMESRV               216    topic [, clusterName]
    GET_TOPICS_BY_CLUSTER                 224    cluster -> body 0 = {topicList}
    QUERY_DATA_VERSION                    322    clusterName, brokerAddr, brokerName, brokerId;
                                                 body 0 = dataVersion -> field changed,
                                                 body 0 = the NameServer's dataVersion
    ADD_WRITE_PERM_OF_BROKER              327    brokerName -> field addTopicCount
    ====================================  =====  ==========================================

    Bodies are msgpack maps (RocketMQ's JSON bodies, same key names).  DEALER to
    the supervisor (``--supervisor``), outbound one-way ACTOR_BEAT (actor base).

Files
    None but its log, ``STORE/logs/nameserver.log`` when ``--store-path`` is given.
    Routes live in memory only: a restarted NameServer learns them again from the
    brokers' next registration (as RocketMQ).

Timers
    ``scan_not_active_broker_interval_ms`` (default 10 000 ms): drop brokers not
    refreshed for more than ``broker_channel_expired_time_ms`` (default 120 000 ms,
    monotonic clock), with their addresses, their group's cluster entry and queue
    data when the group empties, and topics left without queue data.  ZeroMQ has
    no per-peer channel, so this scan is the only way a silent broker leaves
    (RocketMQ also reacts to a closed channel).

Failure behaviour
    Every header field and body is validated before any table changes; a bad
    request gets SYSTEM_ERROR with a remark naming the field and nothing changes.
    A handler exception gets SYSTEM_ERROR (actor base) and the actor keeps serving.
    SIGTERM / SIGINT stop the loop; the process exits 0.  Nothing is persisted, so
    a crash loses nothing that the brokers do not re-send within 30 s.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Optional

import zmq

from rmq.actors.actor import Actor
from rmq.actors.route import BROKER_CHANNEL_EXPIRED_TIME_MS, SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS, RouteInfoManager
from rmq.clock import SYSTEM_CLOCK, Clock
from rmq.common.perm import PERM_MAX
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_topic
from rmq.errors import MessageIllegalError
from rmq import metrics as M
from rmq.protocol import (Frame, ProtocolError, RequestCode, ResponseCode, field_int, field_str, pack_body,
                          unpack_body)

DEFAULT_LISTEN_PORT = 9876           # NamesrvStartup default
NAME_MAX_LENGTH = 255                # clusterName / brokerName, characters
ADDR_MAX_LENGTH = 255                # "host:port", characters
BROKER_ID_MAX = 2 ** 63 - 1          # Java long
TOPIC_SYS_FLAG_MAX = 2 ** 31 - 1     # Java int
# clusterName / brokerName: RocketMQ's name charset plus '.', no path or control characters
NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.-]+$")
# broker address as RocketMQ writes it: "host:port" (IPv4, hostname or [IPv6])
ADDR_PATTERN = re.compile(r"^(?:[a-zA-Z0-9_.-]+|\[[0-9a-fA-F:.]+\]):([0-9]{1,5})$")
# msgpack limits for request bodies: a topic table may hold many topics, nothing needs bin/ext
def field_name(frame: Frame, name: str) -> str:
    """A clusterName / brokerName header field: non-empty, <= 255 characters, NAME_PATTERN."""
    v = field_str(frame, name, max_len=NAME_MAX_LENGTH)
    if not NAME_PATTERN.match(v):
        raise ProtocolError(f"header field {name!r}={v[:64]!r} must be non-empty and only use [%|a-zA-Z0-9_.-]",
                            opaque=frame.opaque)
    return v


def field_addr(frame: Frame, name: str, allow_empty: bool = False) -> str:
    """A broker address header field: ``host:port`` with 1 <= port <= 65535 (or "" if allowed)."""
    v = field_str(frame, name, default="" if allow_empty else None, max_len=ADDR_MAX_LENGTH)
    if allow_empty and v == "":
        return v
    m = ADDR_PATTERN.match(v)
    if m is None or not 1 <= int(m.group(1)) <= 65535:
        raise ProtocolError(f"header field {name!r}={v[:64]!r} must be an address 'host:port'", opaque=frame.opaque)
    return v


def field_topic(frame: Frame, name: str = "topic") -> str:
    """A topic header field, checked with :func:`rmq.store.validators.check_topic`."""
    v = field_str(frame, name, max_len=1024)
    try:
        check_topic(v)
    except MessageIllegalError as e:
        raise ProtocolError(f"header field {name!r}: {e}", opaque=frame.opaque) from None
    return v


def _body_int(frame: Frame, where: str, obj: dict, key: str, lo: int, hi: int, default: Optional[int] = None) -> int:
    v = obj.get(key, default)
    if v is None:
        raise ProtocolError(f"body {where}.{key} is missing", opaque=frame.opaque)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"body {where}.{key} must be an int, got {type(v).__name__}", opaque=frame.opaque)
    if not lo <= v <= hi:
        raise ProtocolError(f"body {where}.{key}={v} outside [{lo}, {hi}]", opaque=frame.opaque)
    return v


def decode_data_version(frame: Frame, obj: object, where: str = "dataVersion") -> tuple:
    """``{"timestamp": int ms, "counter": int}`` -> (timestamp, counter)."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"body {where} must be a map, got {type(obj).__name__}", opaque=frame.opaque)
    return (_body_int(frame, where, obj, "timestamp", 0, 2 ** 63 - 1),
            _body_int(frame, where, obj, "counter", 0, 2 ** 63 - 1))


def decode_register_body(frame: Frame) -> tuple:
    """REGISTER_BROKER body part 0 -> (topic_config_table, data_version), every entry checked.

    Body: ``{"topicConfigTable": {topic: {"topicName", "readQueueNums", "writeQueueNums", "perm",
    "topicSysFlag", "order"}}, "dataVersion": {"timestamp", "counter"}}``; ``topicName`` (if
    given) must equal the key, ``topicSysFlag`` defaults to 0, ``order`` to False.

    Raises
    ------
    ProtocolError
        Naming the first bad entry.
    """
    body = unpack_body(frame, 0)
    if not isinstance(body, dict):
        raise ProtocolError(f"body must be a map, got {type(body).__name__}", opaque=frame.opaque)
    table = body.get("topicConfigTable")
    if not isinstance(table, dict):
        raise ProtocolError("body topicConfigTable must be a map of topic -> TopicConfig", opaque=frame.opaque)
    if "dataVersion" not in body:
        raise ProtocolError("body dataVersion is missing", opaque=frame.opaque)
    data_version = decode_data_version(frame, body["dataVersion"])
    configs = {}
    for topic, cfg in table.items():
        try:
            check_topic(topic)
        except MessageIllegalError as e:
            raise ProtocolError(f"body topicConfigTable key: {e}", opaque=frame.opaque) from None
        where = f"topicConfigTable[{topic!r}]"
        if not isinstance(cfg, dict):
            raise ProtocolError(f"body {where} must be a map, got {type(cfg).__name__}", opaque=frame.opaque)
        name = cfg.get("topicName", topic)
        if name != topic:
            raise ProtocolError(f"body {where}.topicName={str(name)[:64]!r} differs from its key",
                                opaque=frame.opaque)
        order = cfg.get("order", False)
        if not isinstance(order, bool):
            raise ProtocolError(f"body {where}.order must be a bool, got {type(order).__name__}",
                                opaque=frame.opaque)
        configs[topic] = {
            "topicName": topic,
            "readQueueNums": _body_int(frame, where, cfg, "readQueueNums", 0, MAX_QUEUE_NUMS),
            "writeQueueNums": _body_int(frame, where, cfg, "writeQueueNums", 0, MAX_QUEUE_NUMS),
            "perm": _body_int(frame, where, cfg, "perm", 0, PERM_MAX),
            "topicSysFlag": _body_int(frame, where, cfg, "topicSysFlag", 0, TOPIC_SYS_FLAG_MAX, default=0),
            "order": order,
        }
    return configs, data_version


class NameServerActor(Actor):
    """The NameServer process (see the module docstring)."""

    name = "nameserver"

    def __init__(self, listen_addr: str = "127.0.0.1", listen_port: int = DEFAULT_LISTEN_PORT,
                 store_path: Optional[str] = None, supervisor_endpoint: Optional[str] = None,
                 scan_not_active_broker_interval_ms: int = SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
                 broker_channel_expired_time_ms: int = BROKER_CHANNEL_EXPIRED_TIME_MS,
                 delete_topic_with_broker_registration: bool = False, log_level: int = logging.INFO,
                 clock: Clock = SYSTEM_CLOCK):
        super().__init__(store_path, supervisor_endpoint, log_level)
        self.listen_addr = listen_addr
        self.listen_port = listen_port
        self.scan_not_active_broker_interval_ms = scan_not_active_broker_interval_ms
        self.broker_channel_expired_time_ms = broker_channel_expired_time_ms
        self.route = RouteInfoManager(clock, delete_topic_with_broker_registration=delete_topic_with_broker_registration)
        self.master_epochs: dict[str, int] = {}     # brokerName -> highest master epoch registered (HA fencing)
        self.endpoint = ""
        self.metrics_settings: Optional["M.MetricsSettings"] = None    # set by main(): --metrics-port / -c
        self.metrics: Optional["M.ActorMetrics"] = None

    def on_start(self) -> None:
        port = "*" if self.listen_port == 0 else str(self.listen_port)
        self.sock = self.socket(zmq.ROUTER, bind=f"tcp://{self.listen_addr}:{port}")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.serve(self.sock)
        for code, fn in ((RequestCode.REGISTER_BROKER, self.on_register_broker),
                         (RequestCode.UNREGISTER_BROKER, self.on_unregister_broker),
                         (RequestCode.GET_ROUTEINFO_BY_TOPIC, self.on_get_routeinfo_by_topic),
                         (RequestCode.GET_BROKER_CLUSTER_INFO, self.on_get_broker_cluster_info),
                         (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.on_get_all_topic_list),
                         (RequestCode.DELETE_TOPIC_IN_NAMESRV, self.on_delete_topic_in_namesrv),
                         (RequestCode.WIPE_WRITE_PERM_OF_BROKER, self.on_wipe_write_perm_of_broker),
                         (RequestCode.ADD_WRITE_PERM_OF_BROKER, self.on_add_write_perm_of_broker),
                         (RequestCode.GET_TOPICS_BY_CLUSTER, self.on_get_topics_by_cluster),
                         (RequestCode.QUERY_DATA_VERSION, self.on_query_data_version)):
            self.handle(code, fn)
        self.add_timer(self.scan_not_active_broker_interval_ms, self.scan_not_active_broker)
        self.log.info("nameserver listening on %s (scan every %d ms, broker expiry %d ms)", self.endpoint,
                      self.scan_not_active_broker_interval_ms, self.broker_channel_expired_time_ms)
        if self.metrics_settings is not None and self.metrics_settings.enabled:
            self._start_metrics()
        print("ready", self.endpoint, flush=True)

    def _start_metrics(self) -> None:
        self.metrics = M.ActorMetrics(self.metrics_settings, "nameserver", "", self.endpoint.replace("tcp://", ""),
                                      self.ctx, self._metric_gauges)
        self.serve_metrics(self.metrics, self.sock, "--metrics-port / namesrvMetricsPromExporterPort")

    def _metric_gauges(self, m: "M.ActorMetrics") -> list:
        out = []
        r = self.route
        for name, doc, n in (("rocketmq_namesrv_broker_number", "Brokers registered and alive",
                              len(r.broker_live_table)),
                             ("rocketmq_namesrv_cluster_number", "Clusters known", len(r.cluster_addr_table)),
                             ("rocketmq_namesrv_topic_number", "Topics with a route", len(r.topic_queue_table))):
            g = m.gauge(name, doc)
            g.add_metric(m.values(), n)
            out.append(g)
        return out

    def on_stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        self.log.info("nameserver stopping: %d brokers live, %d topics", len(self.route.broker_live_table),
                      len(self.route.topic_queue_table))

    # -- timers ----------------------------------------------------------------------------
    def scan_not_active_broker(self) -> None:
        for addr in self.route.scan_not_active_broker(self.broker_channel_expired_time_ms):
            self.log.warning("broker %s expired: no registration for over %d ms, removed",
                             addr, self.broker_channel_expired_time_ms)

    # -- broker requests ---------------------------------------------------------------------
    def on_register_broker(self, frame: Frame, reply) -> Frame:
        cluster_name = field_name(frame, "clusterName")
        broker_addr = field_addr(frame, "brokerAddr")
        broker_name = field_name(frame, "brokerName")
        broker_id = field_int(frame, "brokerId", lo=0, hi=BROKER_ID_MAX)
        ha_server_addr = field_addr(frame, "haServerAddr", allow_empty=True)
        configs, data_version = decode_register_body(frame)
        # HA fencing: a master registering with an epoch older than one already seen for its
        # broker name was replaced by a promoted slave; it must not take the route back
        epoch = field_int(frame, "epoch", 0, lo=0)
        if broker_id == 0 and epoch:
            current = self.master_epochs.get(broker_name, 0)
            if epoch < current:
                self.log.warning("master %s of %s registers with epoch %d < %d: fenced", broker_addr, broker_name,
                                 epoch, current)
                return frame.response(ResponseCode.SYSTEM_ERROR,
                                      f"fenced: {broker_name} has a master of epoch {current} (yours: {epoch})",
                                      fields={"fenced": True, "epoch": current})
            self.master_epochs[broker_name] = epoch
        first = broker_addr not in self.route.broker_live_table
        result = self.route.register_broker(cluster_name, broker_addr, broker_name, broker_id, ha_server_addr,
                                            configs, data_version)
        if first:
            self.log.info("broker registered: cluster=%s name=%s id=%d addr=%s ha=%s topics=%d dataVersion=%s",
                          cluster_name, broker_name, broker_id, broker_addr, ha_server_addr, len(configs),
                          data_version)
        return frame.response(fields={"masterAddr": result.master_addr, "haServerAddr": result.ha_server_addr})

    def on_unregister_broker(self, frame: Frame, reply) -> Frame:
        cluster_name = field_name(frame, "clusterName")
        broker_addr = field_addr(frame, "brokerAddr")
        broker_name = field_name(frame, "brokerName")
        broker_id = field_int(frame, "brokerId", lo=0, hi=BROKER_ID_MAX)
        known = self.route.unregister_broker(cluster_name, broker_addr, broker_name, broker_id)
        self.log.info("broker unregistered: cluster=%s name=%s id=%d addr=%s (%s)", cluster_name, broker_name,
                      broker_id, broker_addr, "known" if known else "unknown")
        return frame.response()

    def on_query_data_version(self, frame: Frame, reply) -> Frame:
        field_name(frame, "clusterName")
        broker_addr = field_addr(frame, "brokerAddr")
        field_name(frame, "brokerName")
        field_int(frame, "brokerId", lo=0, hi=BROKER_ID_MAX)
        data_version = decode_data_version(frame, unpack_body(frame, 0))
        changed = self.route.is_broker_topic_config_changed(broker_addr, data_version)
        if not changed:
            self.route.update_broker_info_update_timestamp(broker_addr)
        ours = self.route.query_broker_data_version(broker_addr)
        bodies = [] if ours is None else [pack_body({"timestamp": ours[0], "counter": ours[1]})]
        return frame.response(fields={"changed": changed}, bodies=bodies)

    # -- client / admin requests ---------------------------------------------------------------
    def on_get_routeinfo_by_topic(self, frame: Frame, reply) -> Frame:
        topic = field_topic(frame)
        route = self.route.pickup_topic_route_data(topic)
        if route is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST,
                                  f"No topic route info in name server for the topic: {topic}")
        return frame.response(bodies=[pack_body(route)])

    def on_get_broker_cluster_info(self, frame: Frame, reply) -> Frame:
        return frame.response(bodies=[pack_body(self.route.get_all_cluster_info())])

    def on_get_all_topic_list(self, frame: Frame, reply) -> Frame:
        return frame.response(bodies=[pack_body({"topicList": self.route.get_all_topic_list()})])

    def on_get_topics_by_cluster(self, frame: Frame, reply) -> Frame:
        cluster = field_name(frame, "cluster")
        return frame.response(bodies=[pack_body({"topicList": self.route.get_topics_by_cluster(cluster)})])

    def on_delete_topic_in_namesrv(self, frame: Frame, reply) -> Frame:
        topic = field_topic(frame)
        cluster_name = field_name(frame, "clusterName") if frame.fields.get("clusterName") is not None else None
        removed = self.route.delete_topic(topic, cluster_name)
        self.log.info("topic %s deleted%s (%s)", topic, f" on cluster {cluster_name}" if cluster_name else "",
                      "removed" if removed else "was unknown")
        return frame.response()

    def on_wipe_write_perm_of_broker(self, frame: Frame, reply) -> Frame:
        broker_name = field_name(frame, "brokerName")
        count = self.route.wipe_write_perm_of_broker(broker_name)
        self.log.info("write permission of broker %s wiped on %d topics", broker_name, count)
        return frame.response(fields={"wipeTopicCount": count})

    def on_add_write_perm_of_broker(self, frame: Frame, reply) -> Frame:
        broker_name = field_name(frame, "brokerName")
        count = self.route.add_write_perm_of_broker(broker_name)
        self.log.info("write permission of broker %s added on %d topics", broker_name, count)
        return frame.response(fields={"addTopicCount": count})


def main(argv: Optional[list] = None) -> int:
    """``python -m rmq.actors.nameserver [options]``; prints ``ready ENDPOINT`` once serving."""
    p = argparse.ArgumentParser(prog="python -m rmq.actors.nameserver", description=__doc__.split("\n")[0])
    p.add_argument("--listen-addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--listen-port", type=int, default=DEFAULT_LISTEN_PORT,
                   help=f"port to bind, 0 = ephemeral (default {DEFAULT_LISTEN_PORT})")
    p.add_argument("--store-path", default=None, help="directory for logs/nameserver.log")
    p.add_argument("--scan-interval-ms", type=int, default=SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
                   help=f"scanNotActiveBroker period, ms (default {SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS})")
    p.add_argument("--broker-expired-ms", type=int, default=BROKER_CHANNEL_EXPIRED_TIME_MS,
                   help=f"drop a broker silent for longer, ms (default {BROKER_CHANNEL_EXPIRED_TIME_MS})")
    p.add_argument("--delete-topic-with-broker-registration", action="store_true",
                   help="a master's changed topic table also removes topics it no longer lists")
    p.add_argument("--supervisor", default=None, help="supervisor endpoint for liveness beats")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics (GET /metrics) on this port, 0 = ephemeral (default: "
                        f"namesrvMetricsPromExporterPort, {M.DEFAULT_NAMESRV_METRICS_PROM_EXPORTER_PORT}, when the "
                        "-c file has metricsExporterType=PROM; else off)")
    p.add_argument("-c", "--config", default=None,
                   help="properties file (key=value): authEnable, authServerKeyFile, authClientKeysDir, "
                        "authAdminKeysDir (rmq.security)")
    args = p.parse_args(argv)
    if not 0 <= args.listen_port <= 65535:
        p.error(f"--listen-port {args.listen_port} outside [0, 65535]")
    if args.scan_interval_ms <= 0 or args.broker_expired_ms <= 0:
        p.error("--scan-interval-ms and --broker-expired-ms must be positive")
    from rmq.broker_conf import load_optional_conf
    props = load_optional_conf(args.config, p.error)     # auth hooks: the actor base enforces them (rmq.security)
    try:
        metrics = M.namesrv_metrics_settings(props or {}, args.metrics_port, args.listen_addr)
    except M.MetricsConfigError as e:
        p.error(str(e))
    actor = NameServerActor(args.listen_addr, args.listen_port, args.store_path, args.supervisor,
                            args.scan_interval_ms, args.broker_expired_ms,
                            args.delete_topic_with_broker_registration)
    if props is not None:
        actor.auth_props = props
    actor.metrics_settings = metrics
    actor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
