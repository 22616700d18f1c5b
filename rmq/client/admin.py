"""``Admin``: the mqadmin operations as Python methods (SPEC.md §16).

Every method talks to the NameServer(s) for routes and cluster membership and
to the brokers for the rest, over :class:`rmq.client.remoting.RemotingClient`;
``rmq admin ...`` (:mod:`rmq.admin_cli`) is a thin layer over this class.

=================================  ====================================================
method                             returns
=================================  ====================================================
``create_topic``                   list of :class:`TopicUpdate` (one per broker)
``delete_topic``                   :class:`TopicDeletion`
``topic_list``                     sorted list of topic names
``topic_route``                    :class:`TopicRoute`
``topic_status``                   list of :class:`QueueStatus`
``cluster_list``                   list of :class:`BrokerInfo`
``broker_status``                  dict, the broker's runtime table (RocketMQ key names)
``update_broker_config``           None (UPDATE_BROKER_CONFIG of some properties)
``get_broker_config``              dict str -> str, the broker's configuration
``promote_slave``                  dict, the promoted broker's runtime table
``consumer_progress``              :class:`ConsumerProgress`
``consumer_connection``            sorted list of online client ids of a group
``query_msg_by_id``                list of :class:`MessageView`
``query_msg_by_key``               list of :class:`MessageView`
``query_msg_by_offset``            :class:`MessageView`
``reset_offset_by_time``           list of :class:`OffsetReset`
``send_message``                   :class:`rmq.client.message.SendResult`
``consume_message``                list of :class:`MessageView`
``broker_stats``                   dict, BrokerStatsData (VIEW_BROKER_STATS_DATA)
``stats_all``                      list of :class:`StatsRow`
``message_track(s)``               list of :class:`MessageTrack` (a list of them)
``resend_to_group``                :class:`rmq.client.message.SendResult`
``producer_list``                  list of :class:`ProducerConnection`
=================================  ====================================================

Results are dataclasses; :func:`to_jsonable` turns any of them into plain
JSON-able dicts and lists (the ``--json`` output of the CLI, stable keys).

Errors: :class:`rmq.errors.MQBrokerError` when a broker or NameServer answers
with an error code (its remark and code in the message),
:class:`rmq.errors.RemotingTimeoutError` when nobody answers in ``timeout_ms``,
:class:`rmq.errors.MQClientError` for bad arguments and unknown topics, clusters,
brokers or messages.

Concurrency: one ``Admin`` per thread (one DEALER socket per address).
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import ipaddress
import random
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from rmq._core import commitlog as _cl
from rmq.client.message import MessageQueue, SendResult, SendStatus, create_uniq_id
from rmq.client.remoting import DEFAULT_TIMEOUT_MS, RemotingClient
from rmq.common.mix_all import (DEFAULT_NAMESRV_ADDR, DEFAULT_TOPIC_QUEUE_NUMS, MASTER_ID, TOOLS_CONSUMER_GROUP,
                                is_dlq_topic, is_retry_topic, retry_topic)
from rmq.common.perm import PERM_MAX, PERM_READ, PERM_WRITE
from rmq.common.request_header import PullMessageRequestHeader, SendMessageRequestHeader
from rmq.client.route import parse_cluster_tables
from rmq.common.route import QueueData, TopicRouteData
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group, check_topic
from rmq.errors import MQBrokerError, MQClientError, RemotingTimeoutError, RmqError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, pack_body, unpack_body

__all__ = ["Admin", "TopicUpdate", "TopicDeletion", "QueueData", "BrokerData", "TopicRoute", "QueueStatus",
           "BrokerInfo", "QueueProgress", "ConsumerProgress", "MessageView", "OffsetReset", "to_jsonable",
           "TOOLS_CONSUMER_GROUP", "TOOLS_PRODUCER_GROUP", "DEFAULT_NAMESRV_ADDR", "fill_ha_info", "BROKER_ROLES",
           "MASTER_ROLES", "StatsRow", "MessageTrack", "ProducerConnection"]

TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"     # producer group of sendMessage
QUERY_MAX_NUM = 64                          # the broker's ceiling for QUERY_MESSAGE maxNum
PULL_BATCH = 32                             # pullBatchSize
MAX_PULL_BATCH = 4096                       # the broker's maxMsgNums ceiling
SYSFLAG_COMPRESSED = 0x1                    # MessageSysFlag.COMPRESSED_FLAG
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
PROMOTE_TIMEOUT_MS = 60_000                 # a slave answers the promotion once caught up and re-registered


# -- result types ----------------------------------------------------------------------------
@dataclass
class MessageTraceView:
    """One step in a message's life from its trace (RocketMQ's MessageTraceView).

    ``trace_type``: ``Pub`` (sent), ``Sub`` (one listener call: SubBefore with its SubAfter) or
    ``EndTransaction``.  ``time_ms``: when (send time / consume start); ``cost_ms``: send round trip
    or listener time; ``status``: ``success`` / ``failed`` / ``consuming`` (a SubBefore whose SubAfter
    has not arrived).
    """
    trace_type: str
    group: str
    client_host: str
    time_ms: int
    cost_ms: int
    status: str
    topic: str = ""
    msg_id: str = ""
    offset_msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    retry_times: int = 0
    request_id: str = ""


@dataclass
class TopicUpdate:
    """A topic config written to one broker (``updateTopic``)."""
    broker_name: str
    broker_addr: str
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool


@dataclass
class TopicDeletion:
    """Where a topic was deleted (``deleteTopic``)."""
    topic: str
    broker_addrs: list
    namesrv_addrs: list


@dataclass
class BrokerData:
    """One broker group (RocketMQ ``BrokerData``); ``broker_addrs``: broker id (0 = master) -> "host:port".

    Not :class:`rmq.common.route.BrokerData`: here ``master_addr`` is a property (a str), there a method."""
    cluster: str
    broker_name: str
    broker_addrs: dict

    @property
    def master_addr(self) -> Optional[str]:
        return self.broker_addrs.get(MASTER_ID)


@dataclass
class TopicRoute:
    """A topic's route (RocketMQ ``TopicRouteData``)."""
    topic: str
    queue_datas: list
    broker_datas: list


@dataclass
class QueueStatus:
    """One queue of ``topicStatus``: offsets in entries; last update = store time (ms) of the
    last message, 0 if none."""
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass
class BrokerInfo:
    """One broker of ``clusterList``; ``runtime`` is its whole runtime table, ``error`` set when it did not answer."""
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    version: str = ""
    put_tps: float = 0.0
    get_tps: float = 0.0
    put_message_total: int = 0
    get_message_total: int = 0
    commitlog_max_offset: int = 0
    boot_timestamp: int = 0
    runtime: dict = field(default_factory=dict)
    error: str = ""
    broker_role: str = ""          # ASYNC_MASTER | SYNC_MASTER | SLAVE ("" when unknown)
    ha_epoch: int = -1             # the broker's HA epoch (-1 when not reported)
    ha_master_address: str = ""    # slave: the master's HA address it replicates from
    ha_connected: Optional[bool] = None   # slave: connected to a master (None for a master / unknown)
    ha_ack_offset: int = -1        # slave: CommitLog bytes acknowledged to its master (-1 when unknown)
    ha_lag_bytes: int = -1         # slave: master's CommitLog max offset - ha_ack_offset, bytes (-1 when unknown)
    ha_slave_count: int = 0        # master: slaves connected for replication


@dataclass
class QueueProgress:
    """One queue of ``consumerProgress``: offsets in entries, ``diff`` = broker - consumer offset,
    ``last_timestamp`` = store time (ms) of the last consumed message, 0 if none;
    ``lag_timestamp`` = store time (ms) of the first message not consumed yet, 0 when nothing is
    behind (now - lag_timestamp is the lag in time, RocketMQ's consumer_lag_latency);
    ``inflight`` = messages a POP group received and has not acked (their invisible time running)."""
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    diff: int
    last_timestamp: int = 0
    lag_timestamp: int = 0
    inflight: int = 0              # POP groups: messages received and not acked yet (rmq.SimpleConsumer)


@dataclass
class ConsumerProgress:
    """``consumerProgress`` of a group: per-queue rows and the total lag (messages)."""
    group: str
    queues: list
    total_diff: int


@dataclass
class MessageView:
    """A stored message as the admin commands show it.

    ``msg_id`` is the UNIQ_KEY when the producer set one, else the offset message id;
    ``offset_msg_id`` encodes the store host and ``commitlog_offset`` (bytes);
    ``queue_offset`` is in entries; timestamps are ms since the epoch.
    """
    topic: str
    msg_id: str
    offset_msg_id: str
    broker_name: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    tags: str
    keys: list
    body: bytes
    properties: dict
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int
    store_size: int
    body_crc: int

    @property
    def body_text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["body"] = self.body_text
        d["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return d


@dataclass
class StatsRow:
    """One row of ``statsAll`` (RocketMQ StatsAllSubCommand's columns): a topic and one group that
    consumes it (``consumer_group`` "" when none does).  TPS are messages/s over the last minute,
    the 24-hour figures messages since the broker started, at most 24 h back (rmq.stats)."""
    topic: str
    consumer_group: str
    accumulation: int
    in_tps: float
    out_tps: float
    in_msg_24h: int
    out_msg_24h: int


@dataclass
class MessageTrack:
    """Whether ``consumer_group`` has consumed a message (RocketMQ's MessageTrack): ``track_type``
    CONSUMED (its committed offset on the message's queue is past the message) or NOT_CONSUME_YET;
    ``online`` whether it has a consumer online; ``consumer_offset`` -1 when it has none there."""
    consumer_group: str
    track_type: str
    online: bool
    consumer_offset: int


@dataclass
class ProducerConnection:
    """A producer online on a broker (heartbeat within channelExpiredTimeout)."""
    producer_group: str
    client_id: str
    broker_name: str
    language: str
    version: str
    last_update_timestamp: int


@dataclass
class OffsetReset:
    """One queue of ``resetOffsetByTime`` (RocketMQ ``RollbackStats``): offsets in entries.

    ``timestamp_offset`` is the first message stored at or after the timestamp (the max
    offset if none); ``reset_offset`` the offset now stored for the group (``updated``).
    """
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    timestamp_offset: int
    reset_offset: int
    updated: bool


def to_jsonable(obj: Any) -> Any:
    """Results -> plain dicts / lists / str / numbers (dataclass fields as keys, bytes as UTF-8 text)."""
    if isinstance(obj, MessageView):
        return to_jsonable(obj.to_dict())
    if isinstance(obj, SendResult):
        return {"status": obj.status.value, "msg_id": obj.msg_id, "offset_msg_id": obj.offset_msg_id,
                "topic": obj.message_queue.topic, "broker_name": obj.message_queue.broker_name,
                "queue_id": obj.message_queue.queue_id, "queue_offset": obj.queue_offset}
    if isinstance(obj, MessageQueue):
        return {"topic": obj.topic, "broker_name": obj.broker_name, "queue_id": obj.queue_id}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "replace")
    return obj


def host_to_str(host: bytes) -> str:
    """8-byte (IPv4) or 20-byte (IPv6) store/born host -> ``"ip:port"`` ("" if malformed)."""
    if len(host) == 8:
        return f"{ipaddress.IPv4Address(host[:4])}:{int.from_bytes(host[4:], 'big', signed=True)}"
    if len(host) == 20:
        return f"[{ipaddress.IPv6Address(host[:16])}]:{int.from_bytes(host[16:], 'big', signed=True)}"
    return ""


def _addr_to_host(addr: str) -> Optional[bytes]:
    """``"ip:port"`` -> the host bytes stored in records, None for a hostname or a bad address."""
    ip, _, port = addr.rpartition(":")
    try:
        return ipaddress.ip_address(ip.strip("[]")).packed + int(port).to_bytes(4, "big", signed=True)
    except ValueError:
        return None


def _split_addrs(addrs: Union[str, Iterable[str]]) -> list:
    items = addrs.split(";") if isinstance(addrs, str) else list(addrs)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise MQClientError(f"no NameServer address in {addrs!r}; expected HOST:PORT[;HOST:PORT]")
    return out


def _check_topic(topic: str) -> str:
    try:
        check_topic(topic)
    except (RmqError, ValueError) as e:
        raise MQClientError(f"invalid topic: {e}") from None
    return topic


def _check_addr(addr: str, what: str) -> str:
    """``host:port`` with a port in 1..65535, else MQClientError naming ``what``."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MQClientError(f"invalid {what} {addr!r}: expected HOST:PORT")
    return addr


def _check_group(group: str) -> str:
    try:
        check_group(group)
    except (RmqError, ValueError) as e:
        raise MQClientError(f"invalid consumer group: {e}") from None
    return group


def _config_str(v: Any) -> str:
    """A broker property value as RocketMQ's Properties text (booleans ``true``/``false``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _config_body(props: dict) -> dict:
    """``props`` as the UPDATE_BROKER_CONFIG body map (str -> str).

    Raises
    ------
    MQClientError
        Not a non-empty map, or an empty key.
    """
    if not isinstance(props, dict) or not props:
        raise MQClientError(f"broker config update needs at least one property, got {props!r:.200}")
    out = {}
    for k, v in props.items():
        key = str(k).strip()
        if not key:
            raise MQClientError(f"empty broker config key in {props!r:.200}")
        out[key] = _config_str(v)
    return out


def _int_or(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def fill_ha_info(infos: list) -> list:
    """Fill the HA fields of :class:`BrokerInfo` objects (``clusterList``) from their runtime tables.

    * ``broker_role``: the table's ``brokerRole``, else ``ASYNC_MASTER``/``SLAVE`` guessed from the
      broker id of a broker that answered without it (an older broker);
    * a slave's ``ha_ack_offset`` / ``ha_lag_bytes``: from its master's ``haSlaves`` entry (matched
      on ``slaveAddr`` = the slave's address, else on ``brokerId``) when the master answered, else
      from the slave's own ``commitLogMaxOffset`` against the master's;
    * ``ha_connected`` / ``ha_master_address``: the slave's own table; ``ha_slave_count``: the
      master's ``haSlaves`` length.

    Returns ``infos`` (changed in place).
    """
    groups: dict = {}
    for info in infos:
        groups.setdefault((info.cluster, info.broker_name), []).append(info)
    for members in groups.values():
        master = None
        for info in members:
            t = info.runtime or {}
            role = str(t.get("brokerRole") or "").upper()
            if not role and not info.error:
                role = "ASYNC_MASTER" if info.broker_id == MASTER_ID else "SLAVE"
            info.broker_role = role
            info.ha_epoch = _int_or(t.get("haEpoch"), -1)
            if role == "SLAVE":
                info.ha_master_address = str(t.get("haMasterAddress") or "")
                hc = t.get("haConnected")
                info.ha_connected = None if hc is None else bool(hc)
            slaves = t.get("haSlaves")
            if isinstance(slaves, list):
                info.ha_slave_count = len(slaves)
            if info.broker_id == MASTER_ID and not info.error:
                master = info
        slaves_table = [e for e in ((master.runtime or {}).get("haSlaves") or []) if isinstance(e, dict)] \
            if master is not None else []
        for info in members:
            if info is master or info.broker_role != "SLAVE":
                continue
            entry = next((e for e in slaves_table if e.get("slaveAddr") == info.broker_addr), None)
            if entry is None:
                entry = next((e for e in slaves_table if _int_or(e.get("brokerId"), -2) == info.broker_id), None)
            if entry is not None:
                info.ha_ack_offset = _int_or(entry.get("ackOffset"), -1)
                lag = entry.get("lagBytes")
                if lag is None and info.ha_ack_offset >= 0:
                    lag = master.commitlog_max_offset - info.ha_ack_offset
                info.ha_lag_bytes = max(_int_or(lag, -1), -1)
            elif not info.error and info.runtime:
                info.ha_ack_offset = info.commitlog_max_offset
                if master is not None:
                    info.ha_lag_bytes = max(master.commitlog_max_offset - info.commitlog_max_offset, 0)
    return infos


def _body(frame: Frame, what: str) -> Any:
    try:
        return unpack_body(frame)
    except ProtocolError as e:
        raise MQClientError(f"malformed {what} response: {e.remark}") from None


class Admin:
    """The mqadmin operations (see the module docstring for the result shapes).

    Parameters
    ----------
    namesrv_addr : str or list of str
        ``"host:port[;host:port]"``; reads go to the first that answers, deletes to all.
    timeout_ms : int
        Per-request timeout, ms.

    Concurrency: not thread-safe; use one per thread.  A context manager (closes its sockets).
    """

    def __init__(self, namesrv_addr: Union[str, Iterable[str]] = DEFAULT_NAMESRV_ADDR,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS, auth=None):
        self.namesrv_addrs = _split_addrs(namesrv_addr)
        if timeout_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {timeout_ms}")
        self.timeout_ms = int(timeout_ms)
        self._rc = RemotingClient(auth=auth)     # auth: CURVE keys (rmq.security.client_auth)

    def close(self) -> None:
        self._rc.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------
    def _invoke(self, addr: str, code: int, fields: Optional[dict] = None, bodies: Optional[list] = None,
                what: str = "broker", timeout_ms: Optional[int] = None) -> Frame:
        timeout_ms = int(timeout_ms or self.timeout_ms)
        try:
            return self._rc.invoke(addr, Frame(int(code), fields=dict(fields or {}), bodies=list(bodies or [])),
                                   timeout_ms)
        except RemotingTimeoutError:
            raise RemotingTimeoutError(f"{what} {addr} did not answer {RequestCode(code).name} within "
                                       f"{timeout_ms} ms (is it running and reachable?)") from None
        except ProtocolError as e:
            raise MQClientError(f"cannot encode the {RequestCode(code).name} request to {what} {addr}: "
                                f"{e.remark}") from None

    def _broker(self, addr: str, code: int, fields: Optional[dict] = None, bodies: Optional[list] = None,
                ok: tuple = (ResponseCode.SUCCESS,), timeout_ms: Optional[int] = None) -> Frame:
        """A broker request; MQBrokerError unless the response code is in ``ok``."""
        resp = self._invoke(addr, code, fields, bodies, timeout_ms=timeout_ms)
        if resp.code not in ok:
            raise MQBrokerError(f"{resp.remark or ResponseCode(resp.code).name} (broker {addr})", resp.code, addr)
        return resp

    def _namesrv(self, code: int, fields: Optional[dict] = None, ok: tuple = (ResponseCode.SUCCESS,)) -> Frame:
        """A NameServer read: the first NameServer that answers; MQBrokerError on an error code."""
        timeouts = []
        for addr in self.namesrv_addrs:
            try:
                resp = self._invoke(addr, code, fields, what="NameServer")
            except RemotingTimeoutError:
                timeouts.append(addr)
                continue
            if resp.code not in ok:
                raise MQBrokerError(resp.remark or ResponseCode(resp.code).name, resp.code, addr)
            return resp
        raise RemotingTimeoutError(f"no NameServer answered {RequestCode(code).name} within {self.timeout_ms} ms: "
                                   f"{';'.join(timeouts)} (is it running? check --namesrv-addr / NAMESRV_ADDR)")

    # -- routes and membership ---------------------------------------------------------------
    def _find_route(self, topic: str) -> Optional[TopicRoute]:
        """The route of ``topic``, None when the NameServer has none."""
        _check_topic(topic)
        resp = self._namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                             ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        # the clients' one route parser (checked: a malformed route is an MQClientError naming the
        # field, not a KeyError), in the admin's shape (BrokerData.master_addr a property)
        data = TopicRouteData.from_wire(_body(resp, "route"), topic)
        return TopicRoute(topic, list(data.queue_datas),
                          [BrokerData(b.cluster, b.broker_name, b.broker_addrs) for b in data.broker_datas])

    def topic_route(self, topic: str) -> TopicRoute:
        """The route of ``topic`` (queue datas and broker datas, sorted by broker name).

        Raises
        ------
        MQClientError
            Unknown topic (code TOPIC_NOT_EXIST); RemotingTimeoutError when no NameServer answers.
        """
        route = self._find_route(topic)
        if route is None:
            raise MQClientError(f"topic [{topic}] does not exist: no route in the NameServer",
                                ResponseCode.TOPIC_NOT_EXIST)
        return route

    def _cluster_info(self) -> tuple[dict, dict]:
        """(brokerName -> BrokerData, clusterName -> [brokerName])."""
        groups, clusters = parse_cluster_tables(self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO))  # checked
        return {b.broker_name: BrokerData(b.cluster, b.broker_name, b.broker_addrs) for b in groups}, clusters

    def _masters_of_cluster(self, cluster: str) -> list:
        """[(broker_name, master_addr)] of ``cluster``."""
        brokers, clusters = self._cluster_info()
        if cluster not in clusters:
            raise MQClientError(f"cluster [{cluster}] not found; known clusters: {sorted(clusters) or 'none'}")
        return [(n, brokers[n].master_addr) for n in clusters[cluster] if n in brokers and brokers[n].master_addr]

    def _broker_name_of(self, addr: str) -> str:
        brokers, _ = self._cluster_info()
        for b in brokers.values():
            if addr in b.broker_addrs.values():
                return b.broker_name
        return ""

    def _route_queues(self, route: TopicRoute, need_perm: int) -> list:
        """[(broker_name, master_addr, QueueData)] of the route's brokers with a master and ``need_perm``."""
        masters = {b.broker_name: b.master_addr for b in route.broker_datas if b.master_addr}
        return [(q.broker_name, masters[q.broker_name], q) for q in route.queue_datas
                if q.broker_name in masters and q.perm & need_perm == need_perm]

    def _master_of(self, route: TopicRoute, broker_name: str) -> str:
        for b in route.broker_datas:
            if b.broker_name == broker_name:
                if not b.master_addr:
                    raise MQClientError(f"broker [{broker_name}] of topic [{route.topic}] has no master")
                return b.master_addr
        raise MQClientError(f"broker [{broker_name}] does not serve topic [{route.topic}]; it is served by "
                            f"{[b.broker_name for b in route.broker_datas]}")

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, topic: str, read_queue_nums: int = 8, write_queue_nums: int = 8, perm: int = 6,
                     order: bool = False, cluster: Optional[str] = None,
                     broker_addr: Optional[str] = None) -> list:
        """Create or update ``topic`` on one broker (``broker_addr``, wins) or on every master of ``cluster``
        (default: the only cluster).  Returns one :class:`TopicUpdate` per broker written.

        Raises
        ------
        MQClientError
            Bad name or numbers, unknown cluster, several clusters and none chosen; MQBrokerError
            when a broker refuses (the others may already be updated).
        """
        _check_topic(topic)
        for name, v in (("read_queue_nums", read_queue_nums), ("write_queue_nums", write_queue_nums)):
            if not isinstance(v, int) or not 1 <= v <= MAX_QUEUE_NUMS:
                raise MQClientError(f"{name} must be 1..{MAX_QUEUE_NUMS}, got {v!r}")
        if not isinstance(perm, int) or not 0 <= perm <= PERM_MAX:
            raise MQClientError(f"perm must be 2 (W), 4 (R) or 6 (RW), got {perm!r}")
        if broker_addr:
            targets = [(self._broker_name_of(broker_addr), broker_addr)]
        else:
            if cluster is None:
                _, clusters = self._cluster_info()
                if len(clusters) != 1:
                    raise MQClientError(f"choose a cluster or a broker address: the NameServer knows clusters "
                                        f"{sorted(clusters) or 'none'}")
                cluster = next(iter(clusters))
            targets = self._masters_of_cluster(cluster)
            if not targets:
                raise MQClientError(f"cluster [{cluster}] has no master broker")
        out = []
        for name, addr in targets:
            self._broker(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums,
                "perm": perm, "order": bool(order)})
            out.append(TopicUpdate(name, addr, topic, read_queue_nums, write_queue_nums, perm, bool(order)))
        return out

    def delete_topic(self, topic: str, cluster: Optional[str] = None) -> TopicDeletion:
        """Delete ``topic`` on every master of ``cluster`` (default: the masters of its route),
        then on every NameServer.

        Raises
        ------
        MQClientError
            Unknown topic (no cluster given) or cluster; MQBrokerError / RemotingTimeoutError
            when a broker or a NameServer fails (after trying all NameServers).
        """
        _check_topic(topic)
        if cluster:
            targets = [a for _, a in self._masters_of_cluster(cluster)]
        else:
            route = self.topic_route(topic)
            targets = sorted({b.master_addr for b in route.broker_datas if b.master_addr})
        for addr in targets:
            self._broker(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        fields = {"topic": topic}
        if cluster:
            fields["clusterName"] = cluster
        done, failed = [], []
        for addr in self.namesrv_addrs:
            try:
                resp = self._invoke(addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, fields, what="NameServer")
            except RemotingTimeoutError as e:
                failed.append(str(e))
                continue
            if resp.code != ResponseCode.SUCCESS:
                failed.append(f"NameServer {addr}: {resp.remark}")
            else:
                done.append(addr)
        if failed:
            raise MQClientError(f"topic [{topic}] deleted on brokers {targets} but not on every NameServer: "
                                + "; ".join(failed))
        return TopicDeletion(topic, targets, done)

    def topic_list(self) -> list:
        """Every topic the NameServer knows, sorted."""
        body = _body(self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list")
        return sorted(body.get("topicList") or [])

    def topic_status(self, topic: str) -> list:
        """Per broker and queue: min / max offset and the store time of the last message.

        Raises
        ------
        MQClientError
            Unknown topic; MQBrokerError when a broker does not know it.
        """
        route = self.topic_route(topic)
        out = []
        for name, addr, _q in self._route_queues(route, 0):
            body = _body(self._broker(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}), "topic stats")
            for e in sorted(body.get("offsetTable") or [], key=lambda e: e["queueId"]):
                last = e.get("lastUpdateTimestamp")
                if last is None:
                    last = self._store_timestamp(addr, topic, e["queueId"], e["maxOffset"] - 1)
                out.append(QueueStatus(name, e["queueId"], e["minOffset"], e["maxOffset"], max(int(last), 0)))
        return out

    # -- cluster / brokers ---------------------------------------------------------------------
    def cluster_list(self, cluster: Optional[str] = None) -> list:
        """Every broker (or those of ``cluster``) with its runtime stats; a broker that does not
        answer is listed with ``error`` set.  HA fields (see :class:`BrokerInfo` and
        :func:`fill_ha_info`): the role of each broker and, for a slave, the CommitLog bytes its
        master saw acknowledged and the lag in bytes."""
        brokers, clusters = self._cluster_info()
        if cluster is not None and cluster not in clusters:
            raise MQClientError(f"cluster [{cluster}] not found; known clusters: {sorted(clusters) or 'none'}")
        out = []
        for c in sorted(clusters):
            if cluster is not None and c != cluster:
                continue
            for name in clusters[c]:
                bd = brokers.get(name)
                if bd is None:
                    continue
                for bid, addr in sorted(bd.broker_addrs.items()):
                    info = BrokerInfo(c, name, bid, addr)
                    try:
                        t = self.broker_status(addr)
                    except MQClientError as e:
                        info.error = str(e)
                    else:
                        info.runtime = t
                        info.version = str(t.get("version", ""))
                        info.put_tps = float(t.get("putTps", 0.0))
                        info.get_tps = float(t.get("getTps", 0.0))
                        info.put_message_total = int(t.get("putMessageTotal", 0))
                        info.get_message_total = int(t.get("getMessageTotal", 0))
                        info.commitlog_max_offset = int(t.get("commitLogMaxOffset", 0))
                        info.boot_timestamp = int(t.get("bootTimestamp", 0))
                    out.append(info)
        fill_ha_info(out)
        return out

    def broker_status(self, broker_addr: str) -> dict:
        """The broker's runtime table (GET_BROKER_RUNTIME_INFO; RocketMQ key names)."""
        body = _body(self._broker(broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO), "runtime info")
        table = body.get("table") if isinstance(body, dict) else None
        if not isinstance(table, dict):
            raise MQClientError(f"malformed runtime info from broker {broker_addr}")
        return table

    # -- broker configuration and HA -----------------------------------------------------------
    def update_broker_config(self, broker_addr: str, props: dict, timeout_ms: Optional[int] = None) -> None:
        """UPDATE_BROKER_CONFIG (RocketMQ ``mqadmin updateBrokerConfig``): set ``props`` (str -> str,
        other values are turned into str; booleans as ``true``/``false``) on the broker at runtime.

        The broker accepts only an allow-list of keys; ``{"brokerRole": "ASYNC_MASTER", "brokerId":
        "0"}`` promotes a slave (prefer :meth:`promote_slave`, which checks the role first).

        Raises
        ------
        MQClientError
            No property, or an empty key.
        MQBrokerError
            The broker refused (code and remark, e.g. NO_PERMISSION for a key outside the
            allow-list, SYSTEM_ERROR "slave not caught up: ... bytes behind").
        RemotingTimeoutError
            No answer in ``timeout_ms`` (default: the Admin's timeout).
        """
        body = _config_body(props)
        self._broker(broker_addr, RequestCode.UPDATE_BROKER_CONFIG, bodies=[pack_body(body)], timeout_ms=timeout_ms)

    def get_broker_config(self, broker_addr: str) -> dict:
        """GET_BROKER_CONFIG: the broker's configuration, ``{key: str value}`` sorted by key.

        Raises
        ------
        MQBrokerError, RemotingTimeoutError
        MQClientError
            A malformed answer (no ``config`` map).
        """
        body = _body(self._broker(broker_addr, RequestCode.GET_BROKER_CONFIG), "broker config")
        config = body.get("config") if isinstance(body, dict) else None
        if not isinstance(config, dict):
            raise MQClientError(f"malformed broker config from broker {broker_addr}: {body!r:.200}")
        return {str(k): _config_str(v) for k, v in sorted(config.items(), key=lambda kv: str(kv[0]))}

    def promote_slave(self, broker_addr: str, role: str = "ASYNC_MASTER", timeout_ms: int = PROMOTE_TIMEOUT_MS) -> dict:
        """Manual failover (SPEC.md §9): make the SLAVE at ``broker_addr`` the master of its group.

        Checks with GET_BROKER_RUNTIME_INFO that the broker is a SLAVE, then sends
        UPDATE_BROKER_CONFIG ``{"brokerRole": role, "brokerId": "0"}``.  The broker answers once it
        has applied what it received from the old master and switched; it re-registers with the
        NameServer as brokerId 0 (clients pick it up at their next route refresh).

        Parameters
        ----------
        broker_addr : str
            ``host:port`` of the slave broker (its client port, as in ``clusterList``).
        role : str
            ``ASYNC_MASTER`` or ``SYNC_MASTER``.
        timeout_ms : int
            How long to wait for the promotion's answer (default 60 000 ms).

        Returns
        -------
        dict
            The broker's runtime table after the switch (``brokerRole``, ``brokerId``, ``haEpoch``...).

        Raises
        ------
        MQClientError
            ``role`` is not a master role, or the broker is not a SLAVE (its role in the message).
        MQBrokerError
            The broker refused the promotion (its code and remark, e.g. SYSTEM_ERROR
            "slave not caught up: N bytes behind").
        RemotingTimeoutError
            The broker did not answer in time (it may still complete the switch: check
            ``brokerStatus``).
        """
        role = str(role).strip().upper()
        if role not in MASTER_ROLES:
            raise MQClientError(f"role must be one of {', '.join(MASTER_ROLES)}, got {role!r}")
        if int(timeout_ms) <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {timeout_ms}")
        current = str(self.broker_status(broker_addr).get("brokerRole", "")).upper()
        if current != "SLAVE":
            what = current or "of unknown role (no brokerRole in its runtime info)"
            raise MQClientError(f"broker {broker_addr} is {what}, not a SLAVE: nothing to promote")
        self.update_broker_config(broker_addr, {"brokerRole": role, "brokerId": "0"}, timeout_ms=int(timeout_ms))
        return self.broker_status(broker_addr)

    # -- controller mode (RocketMQ 5: mqadmin getSyncStateSet / getControllerMetaData / electMaster) ------
    def _controller(self, addr: str, code: int, fields: Optional[dict] = None, bodies: Optional[list] = None) -> Frame:
        """A controller request; MQBrokerError (its code and remark) unless SUCCESS."""
        _check_addr(addr, "controller address")
        resp = self._invoke(addr, code, fields, bodies, what="controller")
        if resp.code != ResponseCode.SUCCESS:
            name = ResponseCode(resp.code).name if resp.code in ResponseCode._value2member_map_ else str(resp.code)
            raise MQBrokerError(f"{resp.remark or name} (controller {addr})", resp.code, addr)
        return resp

    def get_controller_metadata(self, controller_addr: str) -> dict:
        """CONTROLLER_GET_METADATA_INFO: ``{"controllerAddress", "leaderAddress", "isLeader", "peers",
        ...}`` as the controller at ``controller_addr`` (``host:port``) sees its Raft group.

        Raises
        ------
        MQClientError
            A malformed address. RemotingTimeoutError: no answer in time.
        """
        return dict(self._controller(controller_addr, RequestCode.CONTROLLER_GET_METADATA_INFO).fields)

    def get_sync_state_set(self, controller_addr: str, broker_names: Optional[list] = None) -> dict:
        """CONTROLLER_GET_SYNC_STATE_DATA: ``{brokerName: {"masterBrokerId", "masterAddress",
        "masterEpoch", "syncStateSet", "syncStateSetEpoch", "replicas": [{"brokerId", "brokerAddress",
        "alive", "lastHeartbeatAgoMs", "epoch", "maxOffset", "inSyncStateSet"}]}}`` of the named broker
        sets (None: all the controller knows).

        Raises
        ------
        MQBrokerError
            The controller refused (code and remark). RemotingTimeoutError: no answer in time.
        """
        body = pack_body({"brokerNames": list(broker_names or [])})
        resp = self._controller(controller_addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, bodies=[body])
        data = unpack_body(resp) if resp.bodies else {}
        if not isinstance(data, dict):
            raise MQClientError(f"controller {controller_addr} answered a sync state body that is not a map")
        return data

    def elect_master(self, controller_addr: str, broker_name: str, broker_id: Optional[int] = None,
                     broker_addr: Optional[str] = None) -> dict:
        """CONTROLLER_ELECT_MASTER, the manual override: elect a master of ``broker_name`` now,
        the replica ``broker_id`` (or the one at ``broker_addr``) if given; it must be alive and in
        the SyncStateSet.  Returns the replica info after the election (``masterBrokerId``,
        ``masterAddress``, ``masterEpoch``, ``syncStateSet``...); the brokers switch roles at their
        next heartbeat.

        Raises
        ------
        MQClientError
            Both or a malformed ``broker_id`` / ``broker_addr``, or no replica at ``broker_addr``.
        MQBrokerError
            The controller refused (e.g. CONTROLLER_MASTER_NOT_AVAILABLE: no eligible replica).
        """
        if broker_id is not None and broker_addr is not None:
            raise MQClientError("give a broker id or a broker address, not both")
        if broker_addr is not None:
            _check_addr(broker_addr, "broker address")
            replicas = (self.get_sync_state_set(controller_addr, [broker_name]).get(broker_name) or {}).get(
                "replicas") or []
            match = [r.get("brokerId") for r in replicas if r.get("brokerAddress") == broker_addr]
            if not match:
                raise MQClientError(f"no replica of {broker_name} at {broker_addr} is registered with the controller")
            broker_id = match[0]
        fields = {"brokerName": broker_name}
        if broker_id is not None:
            if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id <= 0:
                raise MQClientError(f"broker id must be a positive integer, got {broker_id!r}")
            fields["brokerId"] = broker_id
        return dict(self._controller(controller_addr, RequestCode.CONTROLLER_ELECT_MASTER, fields).fields)

    def half_messages(self, broker: Optional[str] = None, max_rows: int = 1000) -> dict:
        """Pending transactions (half messages without an outcome) of every master, or of one
        (``broker``: a broker name or address); GET_HALF_MESSAGES, an rmq request.

        Returns
        -------
        dict
            ``{"pending": total, "ready": all brokers have rebuilt their state, "queuedEnds":
            END_TRANSACTIONs held until then (total), "halfMessages":
            [{brokerName, transactionId, producerGroup, topic, queueId, bornTimestamp (ms),
            checkTimes, queueOffset, commitLogOffset}] oldest first per broker (at most
            ``max_rows`` per broker), "stats": {brokerName: counters}}``.

        Raises
        ------
        MQClientError
            ``max_rows`` outside 1..10 000, or no such broker.
        MQBrokerError, RemotingTimeoutError
        """
        masters = self._masters_for_listing(broker, max_rows)
        out: dict = {"pending": 0, "ready": True, "queuedEnds": 0, "halfMessages": [], "stats": {}}
        for name, addr in masters:
            body = _body(self._broker(addr, RequestCode.GET_HALF_MESSAGES, {"maxRows": max_rows}), "half messages")
            if not isinstance(body, dict):
                raise MQClientError(f"malformed half-message list from broker {addr}")
            out["pending"] += int(body.get("pending", 0))
            out["ready"] = out["ready"] and bool(body.get("ready"))
            out["queuedEnds"] += int(body.get("queuedEnds", 0))
            out["stats"][name] = body.get("stats", {})
            out["halfMessages"] += [dict(row, brokerName=name) for row in body.get("halfMessages", [])]
        return out

    def pending_timers(self, broker: Optional[str] = None, max_rows: int = 100) -> dict:
        """Timer messages not yet delivered, of every master or of one (``broker``: a name or an
        address); GET_TIMER_PENDING, an rmq request.

        Returns
        -------
        dict
            ``{"total": timers in the wheels, "ready": every broker has loaded its timer store,
            "timers": [{brokerName, deliverTimeMs, slotTimeMs, topic, queueId, msgId, rolled}]
            soonest first per broker (at most ``max_rows`` per broker), "brokers": {brokerName:
            {precisionMs, readTimeMs, writeTimeMs, queueOffset, queueBehind, slots, total,
            stats}}}``.

        Raises
        ------
        MQClientError
            ``max_rows`` outside 1..10 000, or no such broker.
        MQBrokerError
            A broker with ``timerWheelEnable=false``.
        RemotingTimeoutError
        """
        masters = self._masters_for_listing(broker, max_rows)
        out: dict = {"total": 0, "ready": True, "timers": [], "brokers": {}}
        for name, addr in masters:
            body = _body(self._broker(addr, RequestCode.GET_TIMER_PENDING, {"maxRows": max_rows}), "pending timers")
            if not isinstance(body, dict):
                raise MQClientError(f"malformed pending-timer list from broker {addr}")
            rows = body.pop("rows", [])
            out["total"] += int(body.get("total", 0))
            out["ready"] = out["ready"] and bool(body.get("ready"))
            out["brokers"][name] = body
            out["timers"] += [dict(row, brokerName=name) for row in rows]
        return out

    def _masters_for_listing(self, broker: Optional[str], max_rows: int) -> list:
        """(name, address) of every master, or of ``broker`` (a name or an address), for the
        per-broker listings (half messages, pending timers); ``max_rows`` checked (1..10 000)."""
        if not isinstance(max_rows, int) or not 1 <= max_rows <= 10_000:
            raise MQClientError(f"max_rows must be 1..10000, got {max_rows!r}")
        masters = self._all_masters()
        if broker is not None:
            masters = [(n, a) for n, a in masters if broker in (n, a)]
            if not masters:
                raise MQClientError(f"no master broker {broker!r} in the cluster")
        return masters

    def cluster_broker_addrs(self, cluster: str) -> list:
        """Master addresses of ``cluster``."""
        return [a for _, a in self._masters_of_cluster(cluster)]

    # -- consumers -----------------------------------------------------------------------------
    def _all_masters(self) -> list:
        brokers, _ = self._cluster_info()
        return sorted((n, b.master_addr) for n, b in brokers.items() if b.master_addr)

    def _store_timestamp(self, addr: str, topic: str, queue_id: int, offset: int) -> int:
        """Store time (ms) of the message at queue ``offset``; 0 when there is none or it cannot be read."""
        if offset < 0:
            return 0
        try:
            resp = self._invoke(addr, RequestCode.PULL_MESSAGE,
                                PullMessageRequestHeader(TOOLS_CONSUMER_GROUP, topic, queue_id, offset, 1).to_fields())
        except MQClientError:
            return 0
        if resp.code != ResponseCode.SUCCESS or not resp.bodies:
            return 0
        msgs = _cl.decode_records(bytes(resp.bodies[0]), False)
        return msgs[0].store_timestamp if msgs else 0

    def _offset_table(self, addr: str) -> dict:
        """GET_ALL_CONSUMER_OFFSET of one broker: ``{"topic@group": {queue id: committed offset}}``."""
        return self._offset_body(addr).get("offsetTable") or {}

    def _offset_body(self, addr: str) -> dict:
        """GET_ALL_CONSUMER_OFFSET of one broker: ``offsetTable`` and ``popInflightTable``
        (``{"topic@group": {queue id: messages in flight}}``)."""
        body = _body(self._broker(addr, RequestCode.GET_ALL_CONSUMER_OFFSET), "consumer offsets")
        return body if isinstance(body, dict) else {}

    @staticmethod
    def _queue_offset(queues: dict, queue_id: int) -> int:
        """A queue's committed offset in an offset table entry (its keys may be str or int); -1 if none."""
        v = queues.get(str(queue_id), queues.get(queue_id))
        return int(v) if v is not None else -1

    def _master_addr(self, broker_name: str) -> str:
        brokers, _ = self._cluster_info()
        b = brokers.get(broker_name)
        if b is None or not b.master_addr:
            raise MQClientError(f"broker [{broker_name}] has no master online")
        return b.master_addr

    def search_offset(self, topic: str, broker_name: str, queue_id: int, timestamp_ms: int) -> int:
        """Queue offset of the first message stored at or after ``timestamp_ms`` (RocketMQ's
        searchOffset; SEARCH_OFFSET_BY_TIMESTAMP).  Raises MQClientError for an unknown broker."""
        resp = self._broker(self._master_addr(broker_name), RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                            {"topic": topic, "queueId": queue_id, "timestamp": int(timestamp_ms)})
        return int(resp.fields.get("offset", 0))

    def consumer_progress(self, group: str, topic: Optional[str] = None) -> ConsumerProgress:
        """Per queue: broker (max) offset, the group's offset (0 if none, like RocketMQ) and the diff,
        for ``topic`` or every topic the group has offsets for (incl. its retry topic).

        Raises
        ------
        MQClientError
            Unknown topic; a group without any offset (and no topic given).
        """
        _check_group(group)
        bodies = {name: self._offset_body(addr) for name, addr in self._all_masters()}
        tables = {name: body.get("offsetTable") or {} for name, body in bodies.items()}
        inflight = {name: body.get("popInflightTable") or {} for name, body in bodies.items()}
        if topic is not None:
            topics = [_check_topic(topic)]
        else:
            suffix = f"@{group}"
            topics = sorted({k[:-len(suffix)] for t in tables.values() for k in t if k.endswith(suffix)})
            if not topics:
                raise MQClientError(f"consumer group [{group}] has no consume offsets on any broker: unknown "
                                    f"group, or it has not consumed anything yet")
        rows = []
        for t in topics:
            route = self.topic_route(t) if topic is not None else self._find_route(t)
            if route is None:            # the topic is gone; its offsets linger
                continue
            for name, addr, q in self._route_queues(route, 0):
                offsets = tables.get(name, {}).get(f"{t}@{group}", {})
                for qid in range(q.read_queue_nums):
                    bo = self._broker(addr, RequestCode.GET_MAX_OFFSET, {"topic": t, "queueId": qid}).fields["offset"]
                    co = max(self._queue_offset(offsets, qid), 0)
                    rows.append(QueueProgress(t, name, qid, bo, co, bo - co,
                                              self._store_timestamp(addr, t, qid, co - 1),
                                              self._store_timestamp(addr, t, qid, co) if bo > co else 0,
                                              self._queue_offset(inflight.get(name, {}).get(f"{t}@{group}", {}),
                                                                 qid) if f"{t}@{group}" in inflight.get(name, {})
                                              else 0))
        rows.sort(key=lambda r: (r.topic, r.broker_name, r.queue_id))
        return ConsumerProgress(group, rows, sum(r.diff for r in rows))

    def group_list(self) -> list:
        """Every subscription group any master knows (system groups included), sorted, each as
        ``{"group", "brokers": [broker names], "consume_enable", "retry_max_times"}``."""
        out: dict = {}
        for name, addr in self._all_masters():
            body = _body(self._broker(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), "subscription groups")
            for group, cfg in (body.get("subscriptionGroupTable") or {}).items():
                row = out.setdefault(group, {"group": group, "brokers": [],
                                             "consume_enable": bool(cfg.get("consumeEnable", True)),
                                             "retry_max_times": int(cfg.get("retryMaxTimes", 16))})
                row["brokers"].append(name)
        return [out[g] for g in sorted(out)]

    # -- statistics -----------------------------------------------------------------------------
    def broker_stats(self, broker_addr: str, stats_name: str, stats_key: Optional[str] = None) -> dict:
        """VIEW_BROKER_STATS_DATA of one broker (RocketMQ ``mqadmin statsAll``'s source).

        ``stats_name``: TOPIC_PUT_NUMS / TOPIC_PUT_SIZE (key: topic), GROUP_GET_NUMS /
        GROUP_GET_SIZE (key: ``topic@group``).  Returns BrokerStatsData ``{"statsMinute",
        "statsHour", "statsDay"}``, each ``{"sum", "tps", "avgpt"}``; with ``stats_key`` None,
        ``{key: BrokerStatsData}`` of every key the broker counts (one request).

        Raises
        ------
        MQBrokerError
            Unknown stats name, or no such key (the broker has counted nothing under it).
        """
        fields = {"statsName": stats_name}
        if stats_key is not None:
            fields["statsKey"] = stats_key
        body = _body(self._broker(broker_addr, RequestCode.VIEW_BROKER_STATS_DATA, fields), "broker stats")
        if not isinstance(body, dict):
            raise MQClientError(f"malformed broker stats from {broker_addr}: {body!r:.200}")
        return body if stats_key is not None else (body.get("statsTable") or {})

    def stats_all(self, topic: Union[None, str, Iterable[str]] = None, active_only: bool = False) -> list:
        """``mqadmin statsAll``: for every topic (or ``topic``, or each of a list of topics; retry
        and DLQ topics skipped from the full list, as RocketMQ does) and every group with offsets for it, the accumulation (messages not yet
        consumed), in / out TPS over the last minute and in / out messages over the last 24 hours,
        summed over the masters.  ``active_only``: only rows with traffic in the last 24 hours.

        Returns a list of :class:`StatsRow`, by topic then group.  Raises MQClientError for an
        unknown ``topic``.  The broker figures are fetched once per master whatever the number of
        topics.
        """
        masters = self._all_masters()
        put, get, offsets = {}, {}, {}
        for name, addr in masters:
            put[name] = self.broker_stats(addr, "TOPIC_PUT_NUMS")
            get[name] = self.broker_stats(addr, "GROUP_GET_NUMS")
            offsets[name] = self._offset_table(addr)
        explicit = topic is not None
        if explicit:
            topics = [topic] if isinstance(topic, str) else list(topic)
        else:
            topics = [t for t in self.topic_list() if not (is_retry_topic(t) or is_dlq_topic(t))]
        rows = []
        for t in topics:
            route = self.topic_route(t) if explicit else self._find_route(t)   # a named unknown topic raises
            if route is None:
                continue            # deleted since the list was read
            max_offsets: dict = {}             # (broker, qid) -> max offset
            for name, addr in sorted({(n, a) for n, a, _ in self._route_queues(route, 0)}):
                resp = self._invoke(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": t})
                if resp.code == ResponseCode.SUCCESS:
                    for e in _body(resp, "topic stats").get("offsetTable") or []:
                        max_offsets[(name, int(e["queueId"]))] = int(e["maxOffset"])
            brokers = sorted({b for b, _ in max_offsets})
            in_tps = sum(put.get(b, {}).get(t, {}).get("statsMinute", {}).get("tps", 0.0) for b in brokers)
            in_day = sum(put.get(b, {}).get(t, {}).get("statsDay", {}).get("sum", 0) for b in brokers)
            suffix = f"{t}@"
            groups = sorted({k[len(suffix):] for b in brokers for k in offsets.get(b, {}) if k.startswith(suffix)})
            if not groups:
                if not active_only or in_day > 0:
                    rows.append(StatsRow(t, "", 0, round(in_tps, 2), 0.0, in_day, 0))
                continue
            for g in groups:
                acc = 0
                for (b, qid), mx in max_offsets.items():
                    table = offsets.get(b, {}).get(f"{t}@{g}", {})
                    acc += max(0, mx - max(self._queue_offset(table, qid), 0))
                out_tps = sum(get.get(b, {}).get(f"{t}@{g}", {}).get("statsMinute", {}).get("tps", 0.0)
                              for b in brokers)
                out_day = sum(get.get(b, {}).get(f"{t}@{g}", {}).get("statsDay", {}).get("sum", 0) for b in brokers)
                if not active_only or in_day > 0 or out_day > 0:
                    rows.append(StatsRow(t, g, acc, round(in_tps, 2), round(out_tps, 2), in_day, out_day))
        return rows

    def producer_list(self, group: Optional[str] = None) -> list:
        """Producers online on any master (GET_ALL_PRODUCER_INFO), of ``group`` or of every
        producer group, as :class:`ProducerConnection` sorted by group, client, broker."""
        out = []
        for name, addr in self._all_masters():
            table = _body(self._broker(addr, RequestCode.GET_ALL_PRODUCER_INFO), "producer info")
            for g, conns in ((table or {}).get("producerTable") or {}).items():
                if group is not None and g != group:
                    continue
                for c in conns:
                    out.append(ProducerConnection(g, str(c.get("clientId", "")), name, str(c.get("language", "")),
                                                  str(c.get("version", "")), int(c.get("lastUpdateTimestamp", 0))))
        out.sort(key=lambda p: (p.producer_group, p.client_id, p.broker_name))
        return out

    def consumer_connection(self, group: str) -> list:
        """Client ids of ``group`` online on any master (heartbeats seen in the last 120 s), sorted."""
        _check_group(group)
        ids = set()
        for _, addr in self._all_masters():
            resp = self._invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
            if resp.code == ResponseCode.SUCCESS:
                ids.update(_body(resp, "consumer list").get("consumerIdList") or [])
        return sorted(ids)

    def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int, force: bool = True) -> list:
        """Reset ``group``'s offsets of ``topic`` to the first message stored at or after ``timestamp_ms``
        (-1 = the max offset), on every queue of every master (RocketMQ's resetOffsetByTimestampOld).

        Without ``force`` a queue is only moved backwards (never past the group's offset).  Online
        consumers keep their in-memory offsets and may commit over the reset: stop them first
        (see :meth:`consumer_connection`).

        Returns
        -------
        list of OffsetReset, by broker name and queue id.

        Raises
        ------
        MQClientError
            Unknown topic, bad group; MQBrokerError when a broker refuses.
        """
        _check_group(group)
        if not isinstance(timestamp_ms, int) or timestamp_ms < -1:
            raise MQClientError(f"timestamp must be ms since the epoch (or -1 for now), got {timestamp_ms!r}")
        route = self.topic_route(topic)
        out = []
        for name, addr, q in self._route_queues(route, 0):
            for qid in range(q.read_queue_nums):
                f = {"topic": topic, "queueId": qid}
                max_off = self._broker(addr, RequestCode.GET_MAX_OFFSET, f).fields["offset"]
                resp = self._broker(addr, RequestCode.QUERY_CONSUMER_OFFSET, {**f, "consumerGroup": group},
                                    ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
                consumer = resp.fields.get("offset", -1) if resp.code == ResponseCode.SUCCESS else -1
                if timestamp_ms == -1:
                    ts_off = max_off
                else:
                    ts_off = self._broker(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                                          {**f, "timestamp": timestamp_ms}).fields["offset"]
                    # the store answers the nearest message; step past one stored before the timestamp
                    if ts_off < max_off and 0 < self._store_timestamp(addr, topic, qid, ts_off) < timestamp_ms:
                        ts_off += 1
                    ts_off = min(ts_off, max_off)
                update = force or consumer < 0 or ts_off <= consumer
                new = ts_off if update else consumer
                if update:
                    self._broker(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {**f, "consumerGroup": group,
                                                                            "commitOffset": new})
                out.append(OffsetReset(topic, name, qid, max_off, consumer, ts_off, new, update))
        return out

    # -- messages ---------------------------------------------------------------------------------
    def _view(self, m, broker_name: str = "") -> MessageView:
        body = m.body or b""
        if m.sys_flag & SYSFLAG_COMPRESSED:
            try:
                body = zlib.decompress(body)
            except zlib.error:
                pass
        return MessageView(m.topic, m.msg_id, m.offset_msg_id, broker_name, m.queue_id, m.queue_offset,
                           m.commitlog_offset, m.tags or "", list(m.keys), body, dict(m.properties),
                           m.born_timestamp, m.store_timestamp, host_to_str(m.born_host), host_to_str(m.store_host),
                           m.reconsume_times, m.sys_flag, m.flag, m.store_size, m.body_crc)

    def query_msg_by_id(self, msg_id: str, topic: Optional[str] = None) -> list:
        """Messages with id ``msg_id``: an offset message id is decoded to its broker and CommitLog
        offset (VIEW_MESSAGE_BY_ID); otherwise it is taken as a UNIQ_KEY and looked up in the index
        of every broker of ``topic`` (default: of every topic).

        Raises
        ------
        MQClientError
            Not found (or an unknown ``topic``).
        """
        msg_id = msg_id.strip().upper()
        brokers, _ = self._cluster_info()
        host = None
        if len(msg_id) in (32, 56):
            try:
                host, phys = _cl.decode_message_id(msg_id)
            except ValueError:
                host = None
        if host is not None:
            for b in brokers.values():
                for addr in b.broker_addrs.values():
                    if _addr_to_host(addr) != host:
                        continue
                    resp = self._broker(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phys},
                                        ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
                    if resp.code == ResponseCode.SUCCESS and resp.bodies:
                        msgs = [self._view(m, b.broker_name) for m in _cl.decode_records(bytes(resp.bodies[0]))]
                        if msgs and (topic is None or msgs[0].topic == topic):
                            return msgs[:1]
        routes = [self.topic_route(topic)] if topic else [self._find_route(t) for t in self.topic_list()]
        found = []
        for route in routes:
            if route is not None:
                found += [m for m in self._query_key(route, msg_id, QUERY_MAX_NUM, 0, None)
                          if m.properties.get("UNIQ_KEY", "").upper() == msg_id]
        if not found:
            raise MQClientError(f"no message with id {msg_id}" + (f" in topic [{topic}]" if topic else "")
                                + ": neither an offset id of a known broker nor an indexed unique key")
        return found

    def query_msg_trace_by_id(self, msg_id: str, trace_topic: Optional[str] = None) -> list:
        """The trace of message ``msg_id`` (its UNIQ_KEY, as clients report it): every ``Pub``
        record and one ``Sub`` row per listener call (its SubBefore joined with its SubAfter by
        request id), sorted by time (RocketMQ's queryMsgTraceById).

        Reads the trace topic (default ``RMQ_SYS_TRACE_TOPIC``) through its IndexFile: trace
        messages carry the traced messages' ids as keys.

        Raises
        ------
        MQClientError
            Empty id, or the trace topic does not exist (no client has traced yet).
        """
        from rmq.client import trace as _trace
        if not msg_id:
            raise MQClientError("message id is empty")
        topic = trace_topic or _trace.TRACE_TOPIC
        try:
            route = self.topic_route(topic)
        except MQClientError as e:
            raise MQClientError(f"no trace topic [{topic}]: {e}") from None
        pubs, before, after = [], {}, {}
        for tm in self._query_key(route, msg_id, QUERY_MAX_NUM, 0, None):
            born = tm.born_host
            for ctx in _trace.decode((tm.body or b"").decode("utf-8", "replace")):
                b = ctx.bean
                if b.msg_id != msg_id:
                    continue
                if ctx.trace_type is _trace.TraceType.Pub:
                    pubs.append(MessageTraceView("Pub", ctx.group_name, b.client_host or born, ctx.timestamp,
                                                 ctx.cost_time, "success" if ctx.success else "failed", b.topic,
                                                 b.msg_id, b.offset_msg_id, b.tags, b.keys, b.store_host))
                elif ctx.trace_type is _trace.TraceType.SubBefore:
                    before[ctx.request_id] = (ctx, b.client_host or born)
                elif ctx.trace_type is _trace.TraceType.SubAfter:
                    after[ctx.request_id] = ctx
                elif ctx.trace_type is _trace.TraceType.EndTransaction:
                    pubs.append(MessageTraceView("EndTransaction", ctx.group_name, born, ctx.timestamp, 0,
                                                 b.transaction_state, b.topic, b.msg_id, "", b.tags, b.keys,
                                                 b.store_host))
        subs = []
        for rid, (ctx, client) in before.items():
            done = after.get(rid)
            status = "consuming" if done is None else "success" if done.success else "failed"
            subs.append(MessageTraceView("Sub", ctx.group_name, client, ctx.timestamp,
                                         done.cost_time if done else 0, status, ctx.bean.topic, ctx.bean.msg_id,
                                         keys=ctx.bean.keys, retry_times=ctx.bean.retry_times, request_id=rid))
        return sorted(pubs, key=lambda v: v.time_ms) + sorted(subs, key=lambda v: (v.time_ms, v.group))

    def query_msg_by_key(self, topic: str, key: str, max_num: int = 32, begin_timestamp: int = 0,
                         end_timestamp: Optional[int] = None) -> list:
        """Messages of ``topic`` whose KEYS (or UNIQ_KEY) contain ``key``, stored in
        [``begin_timestamp``, ``end_timestamp``] ms, from every master; sorted by store time.

        Raises
        ------
        MQClientError
            Unknown topic.
        """
        if not key:
            raise MQClientError("key is empty")
        return self._query_key(self.topic_route(topic), key, max_num, begin_timestamp, end_timestamp)

    def _query_key(self, route: TopicRoute, key: str, max_num: int, begin_timestamp: int,
                   end_timestamp: Optional[int]) -> list:
        topic = route.topic
        fields = {"topic": topic, "key": key, "maxNum": max(1, min(int(max_num), QUERY_MAX_NUM)),
                  "beginTimestamp": int(begin_timestamp)}
        if end_timestamp is not None:
            fields["endTimestamp"] = int(end_timestamp)
        out = []
        for name, addr in sorted({(n, a) for n, a, _ in self._route_queues(route, 0)}):
            resp = self._broker(addr, RequestCode.QUERY_MESSAGE, fields,
                                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if resp.code == ResponseCode.SUCCESS and resp.bodies:
                out += [self._view(m, name) for m in _cl.decode_records(bytes(resp.bodies[0]))]
        out.sort(key=lambda m: (m.store_timestamp, m.broker_name, m.commitlog_offset))
        return out[:max_num]

    def _pull(self, addr: str, group: str, topic: str, queue_id: int, offset: int, max_nums: int) -> Frame:
        return self._broker(addr, RequestCode.PULL_MESSAGE,
                            PullMessageRequestHeader(group, topic, queue_id, offset, max_nums).to_fields(),
            ok=(ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                ResponseCode.PULL_OFFSET_MOVED))

    def query_msg_by_offset(self, topic: str, broker_name: str, queue_id: int, offset: int) -> MessageView:
        """The message at queue ``offset`` (entries) of ``topic`` / ``broker_name`` / ``queue_id``.

        Raises
        ------
        MQClientError
            Unknown topic or broker; no message at that offset.
        """
        route = self.topic_route(topic)
        addr = self._master_of(route, broker_name)
        resp = self._pull(addr, TOOLS_CONSUMER_GROUP, topic, int(queue_id), int(offset), 1)
        if resp.code == ResponseCode.SUCCESS and resp.bodies:
            msgs = _cl.decode_records(bytes(resp.bodies[0]))
            if msgs and msgs[0].queue_offset == offset:
                return self._view(msgs[0], broker_name)
        rng = (f"; queue offsets are [{resp.fields['minOffset']}, {resp.fields['maxOffset']})"
               if "minOffset" in resp.fields else "")
        raise MQClientError(f"no message at offset {offset} of {topic}/{broker_name}/{queue_id}{rng}",
                            resp.code if resp.code != ResponseCode.SUCCESS else -1)

    def message_track(self, msg: MessageView) -> list:
        """Which groups have consumed ``msg`` (RocketMQ's messageTrackDetail): every group with an
        offset on the message's topic on its broker, CONSUMED when its committed offset on the
        message's queue is past the message's queue offset, else NOT_CONSUME_YET; ``online`` from
        the broker's consumer table.  A list of :class:`MessageTrack` sorted by group; empty when
        no group consumes the topic."""
        return self.message_tracks([msg])[0]

    def message_tracks(self, msgs: list) -> list:
        """:meth:`message_track` of many messages: one offset table per broker and one consumer
        list per group, whatever the number of messages.  A list of lists, in ``msgs``' order."""
        tables: dict = {}
        online: dict = {}
        out = []
        for msg in msgs:
            addr = self._master_addr(msg.broker_name)
            if addr not in tables:
                tables[addr] = self._offset_table(addr)
            prefix = f"{msg.topic}@"
            tracks = []
            for key, queues in sorted(tables[addr].items()):
                if not key.startswith(prefix):
                    continue
                group = key[len(prefix):]
                co = self._queue_offset(queues, msg.queue_id)
                if (addr, group) not in online:
                    resp = self._invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
                    online[(addr, group)] = resp.code == ResponseCode.SUCCESS
                tracks.append(MessageTrack(group, "CONSUMED" if co > msg.queue_offset else "NOT_CONSUME_YET",
                                           online[(addr, group)], co))
            out.append(tracks)
        return out

    def resend_to_group(self, msg: MessageView, group: str) -> SendResult:
        """Deliver ``msg`` again to ``group`` only: a copy into ``%RETRY%group`` (which only that
        group subscribes to) with RETRY_TOPIC = the original topic, so its consumers see the
        original topic, tags, keys, properties and message id (UNIQ_KEY) — what a consumer's own
        send-back does, without the delay.  A message already in a retry or DLQ topic keeps the
        original topic it names.

        Raises
        ------
        MQClientError
            Bad group, or the group has no retry topic (no clustering consumer of it ever came online).
        """
        _check_group(group)
        retry = retry_topic(group)
        if self._find_route(retry) is None:
            raise MQClientError(f"group [{group}] has no retry topic {retry}: no clustering consumer of it has "
                                f"been online, so nothing would receive the message")
        props = {k: v for k, v in msg.properties.items() if k not in ("DELAY", "WAIT", "REAL_TOPIC", "REAL_QID",
                                                                       "MAX_OFFSET", "MIN_OFFSET")}
        props["RETRY_TOPIC"] = msg.properties.get("RETRY_TOPIC") or msg.topic
        props.setdefault("ORIGIN_MESSAGE_ID", msg.offset_msg_id)
        props["RECONSUME_TIME"] = "0"
        return self.send_message(retry, msg.body, properties=props)

    def send_message(self, topic: str, body: Union[bytes, str], tags: Optional[str] = None,
                     keys: Union[None, str, Iterable[str]] = None, broker_name: Optional[str] = None,
                     queue_id: Optional[int] = None, properties: Optional[dict] = None) -> SendResult:
        """Send one message (with a fresh UNIQ_KEY unless ``properties`` has one) to a queue of
        ``topic``: the given broker / queue, else a random writable one.  A topic without a route
        goes to a master of the cluster, which creates it if its ``autoCreateTopicEnable`` is on.
        ``properties``: message properties (str -> str), ``tags`` / ``keys`` override theirs.

        Raises
        ------
        MQClientError
            Bad topic or queue, unknown broker; MQBrokerError when the broker refuses.
        """
        _check_topic(topic)
        if isinstance(body, str):
            body = body.encode("utf-8")
        route = self._find_route(topic)
        if route is not None:
            candidates = [(n, a, q.write_queue_nums) for n, a, q in self._route_queues(route, PERM_WRITE)]
            if broker_name is not None:
                candidates = [c for c in candidates if c[0] == broker_name]
                if not candidates:
                    raise MQClientError(f"broker [{broker_name}] has no writable queue of topic [{topic}]")
            if not candidates:
                raise MQClientError(f"topic [{topic}] has no writable queue")
        else:
            masters = self._all_masters()
            if broker_name is not None:
                masters = [m for m in masters if m[0] == broker_name]
            if not masters:
                raise MQClientError(f"topic [{topic}] has no route and no broker "
                                    + (f"[{broker_name}] " if broker_name else "") + "is known to the NameServer")
            candidates = [(n, a, DEFAULT_TOPIC_QUEUE_NUMS) for n, a in masters]
        name, addr, nums = random.choice(candidates)
        if queue_id is None:
            queue_id = random.randrange(nums)
        elif not 0 <= queue_id < nums:
            raise MQClientError(f"queue id {queue_id} outside [0, {nums}) of topic [{topic}] on broker [{name}]")
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        uniq = props.get("UNIQ_KEY") or create_uniq_id()
        props.update({"UNIQ_KEY": uniq, "WAIT": "true"})
        if tags:
            props["TAGS"] = tags
        if keys:
            props["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
        resp = self._broker(addr, RequestCode.SEND_MESSAGE,
                            SendMessageRequestHeader(TOOLS_PRODUCER_GROUP, topic, queue_id, properties=props).to_fields(),
            bodies=[bytes(body)], ok=(ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                                      ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE))
        status = {ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT:
                  SendStatus.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
                  ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}[ResponseCode(resp.code)]
        return SendResult(status, uniq, MessageQueue(topic, name, int(resp.fields.get("queueId", queue_id))),
                          int(resp.fields.get("queueOffset", -1)), str(resp.fields.get("msgId", "")))

    def consume_message(self, topic: str, group: Optional[str] = None,
                        queue: Union[None, int, MessageQueue] = None, offset: Optional[int] = None,
                        count: int = 128, broker_name: Optional[str] = None) -> list:
        """Read up to ``count`` messages of ``topic`` without committing anything.

        Queues: ``queue`` (a queue id, or a MessageQueue) of ``broker_name``, else every readable
        queue, in (broker, queue id) order.  Each starts at ``offset`` if given, else at ``group``'s
        committed offset if a group is given, else at the queue's min offset.  Pulls are made as
        ``group`` (default TOOLS_CONSUMER).

        Raises
        ------
        MQClientError
            Unknown topic, broker or queue; MQBrokerError when a broker refuses.
        """
        if isinstance(queue, MessageQueue):
            broker_name, queue = queue.broker_name, queue.queue_id
        if group is not None:
            _check_group(group)
        if count < 1:
            raise MQClientError(f"count must be >= 1, got {count}")
        route = self.topic_route(topic)
        queues = []
        for name, addr, q in self._route_queues(route, PERM_READ):
            if broker_name is not None and name != broker_name:
                continue
            for qid in range(q.read_queue_nums):
                if queue is None or qid == queue:
                    queues.append((name, addr, qid))
        if not queues:
            raise MQClientError(f"topic [{topic}] has no readable queue" + (
                f" {queue}" if queue is not None else "") + (f" on broker [{broker_name}]" if broker_name else ""))
        out = []
        for name, addr, qid in queues:
            if len(out) >= count:
                break
            if offset is not None:
                off = int(offset)
            else:
                off = -1
                if group is not None:
                    resp = self._broker(addr, RequestCode.QUERY_CONSUMER_OFFSET,
                                        {"consumerGroup": group, "topic": topic, "queueId": qid},
                                        ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
                    off = resp.fields.get("offset", -1) if resp.code == ResponseCode.SUCCESS else -1
                if off < 0:
                    off = self._broker(addr, RequestCode.GET_MIN_OFFSET,
                                       {"topic": topic, "queueId": qid}).fields["offset"]
            moved = False
            while len(out) < count:
                resp = self._pull(addr, group or TOOLS_CONSUMER_GROUP, topic, qid, off,
                                  min(count - len(out), MAX_PULL_BATCH))
                nxt = int(resp.fields.get("nextBeginOffset", off))
                if resp.code == ResponseCode.SUCCESS and resp.bodies:
                    out += [self._view(m, name) for m in _cl.decode_records(bytes(resp.bodies[0]))]
                elif resp.code == ResponseCode.PULL_OFFSET_MOVED and not moved and off < resp.fields.get(
                        "minOffset", 0):
                    moved = True          # below the min offset: start at the min offset, once
                elif resp.code != ResponseCode.PULL_RETRY_IMMEDIATELY:
                    break
                if nxt <= off:
                    break
                off = nxt
        return out[:count]
