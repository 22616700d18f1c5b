"""The remoting proxy: RocketMQ 4.x clients (Java, C++, Go, Python ``rocketmq``) produce and consume
through rmq unchanged (facts: ``../shared/REMOTING.md``; RocketMQ 5 ``proxy/`` in cluster mode).

The proxy is the clients' NameServer *and* their broker.  It listens on one TCP port
(``remotingListenPort``, 8080 as RocketMQ 5's proxy), answers route look-ups with routes that
point back at itself, and forwards every request to rmq's NameServer and brokers over rmq's own
protocol (ZeroMQ + msgpack frames; the same request codes and field names).

**One virtual broker.**  A 4.x client names a queue by (broker address, queue id) and, in the
C++ client's SEND_MESSAGE and PULL_MESSAGE, sends no broker name.  So a route through the proxy
holds one broker group, :data:`PROXY_BROKER_NAME`, whose queues are the real groups' queues laid
end to end (groups in name order; a group spans ``max(readQueueNums, writeQueueNums)`` ids).
Global queue id ``g`` is, say, queue 1 of ``broker-b`` when ``broker-a`` spans 4; each request is
mapped on the way in and its answer (``queueId``) on the way out.  With one broker group the ids
are the broker's own.  The stored records a pull returns pass through as they are: their
QUEUEID field is the real group's queue id.

What the clients see as RocketMQ's: request and response codes, header fields (every value a
string, as the C++ client needs), JSON bodies (TopicRouteData, ``consumerIdList``), the stored
records of a pull byte for byte (rmq's CommitLog layout is RocketMQ's), and answers in the
request's header type (JSON or RocketMQ's binary).  Unknown codes get REQUEST_CODE_NOT_SUPPORTED.

Limits: :data:`rmq.proxy.remoting.MAX_FRAME_BYTES` per frame (longer: the connection is closed,
as RocketMQ's decoder does), :data:`MAX_IN_FLIGHT_PER_CONNECTION` requests handled at once per
connection (the reader waits), :data:`CHANNEL_MAX_IDLE_S` without a complete frame closes the
connection (``serverChannelMaxIdleTimeSeconds``), :data:`MAX_CONNECTIONS` connections (fewer when the
open-file limit, raised to its hard limit at start, minus :data:`FD_RESERVE` is lower: the extra
connections are closed at once and counted in ``stats["refusedConnections"]``), and the HA epochs
of :data:`MAX_PULL_POSITIONS_PER_CONNECTION` queues' last pull answers per connection (what the
proxy sends as ``lastEpoch`` for the clients, :meth:`ProxyServer.on_pull`).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import Optional

from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq.client.route import cluster_info_request, parse_cluster_info, parse_route_response
from rmq.common.mix_all import DEFAULT_TOPIC_QUEUE_NUMS, MASTER_ID
from rmq.common.request_header import (SUB_ALL, TAG, PullMessageRequestHeader, SendMessageRequestHeader, now_ms,
                                       send_response_msg_id)
from rmq.common.topic_validator import AUTO_CREATE_TOPIC_KEY_TOPIC as TBW102
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.common.pull_epochs import PullEpochs
from rmq.common.route import broker_addrs_to_wire
from rmq.errors import MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.aio.remoting import AsyncRemoting
from rmq.proxy.transaction import TransactionRoutes, check_message_body, uniq_key
from rmq.proxy.remoting import FLAG_ONEWAY, SERIALIZE_JSON, RemotingCommand, RemotingFrameError, check_length, decode, encode

log = logging.getLogger("rmq.proxy")

REMOTING_LISTEN_PORT = 8080              # ProxyConfig.remotingListenPort
PROXY_BROKER_NAME = "rmq-proxy"          # the one broker group clients see (module docstring)
PROXY_CLUSTER_NAME = "rmq-proxy-cluster"
MAX_IN_FLIGHT_PER_CONNECTION = 1024      # requests of one connection handled at once
MAX_PULL_POSITIONS_PER_CONNECTION = 4096  # queues a connection's pull answers are remembered for (HA epochs)
CHANNEL_MAX_IDLE_S = 120.0               # NettyServerConfig.serverChannelMaxIdleTimeSeconds
IDLE_SWEEP_S = 5.0                       # how often idle connections are looked for
MAX_CONNECTIONS = 20_000
FD_RESERVE = 256                         # descriptors kept for the proxy's own sockets and files
ROUTE_CACHE_MS = 3_000                   # a topic's layout is reused this long
AUTO_CREATE_SPAN = 8                     # BrokerConfig.defaultTopicQueueNums: TBW102's queues per group
FORWARD_TIMEOUT_MS = 3_000               # a forwarded request (pulls: their suspend time + this)
TRANSACTION_PREPARED_TYPE = 0x4          # MessageSysFlag: a half message
TRANSACTION_TYPE_MASK = 0xC

# SendMessageRequestHeaderV2's one-letter names (SEND_MESSAGE_V2 310 / SEND_BATCH_MESSAGE 320)
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}
# C++ HeartbeatData writes these enums as ordinals; rmq (and Java) use the names
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
CONSUME_FROM = {0: "CONSUME_FROM_LAST_OFFSET", 1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                2: "CONSUME_FROM_MIN_OFFSET", 3: "CONSUME_FROM_MAX_OFFSET", 4: "CONSUME_FROM_FIRST_OFFSET",
                5: "CONSUME_FROM_TIMESTAMP"}


@dataclass
class _Group:
    broker_name: str
    addr: str                # the master's rmq address
    span: int                # global ids this group takes
    read: int
    write: int
    perm: int


class Layout:
    """A topic's real broker groups laid end to end as one virtual broker's queues."""

    def __init__(self, topic: str, groups: list, cluster: str = PROXY_CLUSTER_NAME):
        self.topic = topic
        self.groups = sorted(groups, key=lambda g: g.broker_name)
        self.cluster = cluster
        self.fetched_at = time.monotonic()
        self.total = sum(g.span for g in self.groups)

    def locate(self, global_id: int) -> tuple:
        """(group, real queue id) of ``global_id``.

        Raises
        ------
        MQClientError
            ``global_id`` outside the layout.
        """
        base = 0
        for g in self.groups:
            if base <= global_id < base + g.span:
                return g, global_id - base
            base += g.span
        raise MQClientError(f"queueId {global_id} is outside topic {self.topic}'s {self.total} queues",
                            int(ResponseCode.SYSTEM_ERROR))

    def global_id(self, broker_name: str, queue_id: int) -> int:
        base = 0
        for g in self.groups:
            if g.broker_name == broker_name:
                return base + queue_id
            base += g.span
        return queue_id

    def route_json(self, proxy_addr: str) -> bytes:
        """TopicRouteData (JSON) of the virtual broker: one queue data, one broker data -> the proxy."""
        perm = 0
        for g in self.groups:
            perm |= g.perm
        doc = {"orderTopicConf": None,
               "queueDatas": [{"brokerName": PROXY_BROKER_NAME, "readQueueNums": self.total,
                               "writeQueueNums": self.total, "perm": perm or (PERM_READ | PERM_WRITE),
                               "topicSysFlag": 0}],
               "brokerDatas": [{"cluster": self.cluster, "brokerName": PROXY_BROKER_NAME,
                                "brokerAddrs": broker_addrs_to_wire({MASTER_ID: proxy_addr})}],
               "filterServerTable": {}}
        return json.dumps(doc, separators=(",", ":")).encode()


class ProxyServer:
    """The remoting listener and its forwarding (see the module docstring).

    Parameters
    ----------
    namesrv_addr : str
        rmq NameServer address(es), ``host:port[;host:port]``.
    listen_addr, listen_port : str, int
        Where to listen (127.0.0.1 and REMOTING_LISTEN_PORT by default; port 0 picks a free one).
    advertised_addr : str, optional
        The ``host:port`` routes point at (default: the bound address).
    acl : rmq.proxy.acl.PlainAccessValidator, optional
        RocketMQ ACL 1.0: every request is checked (AccessKey, Signature, permissions) before it
        is handled; a refusal answers NO_PERMISSION (None: no check).
    """

    def __init__(self, namesrv_addr: str, listen_addr: str = "127.0.0.1", listen_port: int = REMOTING_LISTEN_PORT,
                 advertised_addr: Optional[str] = None, auth=None, acl=None):
        self.acl = acl
        self.grpc_port: Optional[int] = None         # set by run_proxy when it serves gRPC too
        self.namesrv_addrs = [a.strip() for a in (namesrv_addr or "").split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise MQClientError("no NameServer address given")
        self.listen_addr, self.listen_port = listen_addr, int(listen_port)
        self.advertised_addr = advertised_addr
        self._auth = auth
        self.remoting: Optional[AsyncRemoting] = None
        self._conns: set = set()
        self._conn_by_host: dict = {}              # born host -> _Connection
        self._producer_conns: dict = {}            # producer group -> {clientID: _Connection}
        self.tx_routes = TransactionRoutes()
        self._check_rr = 0
        self._out_opaque = itertools.count(1)      # the proxy's own requests to clients
        self._fd_budget = _raise_nofile() - FD_RESERVE
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._sweeper: Optional[asyncio.Task] = None
        self._server: Optional[asyncio.base_events.Server] = None
        self._layouts: dict = {}
        self._masters: tuple = (0.0, [])           # (fetched monotonic s, [(broker name, addr)])
        self._ns_next = 0
        self._rr = 0
        self.connections = 0
        self.stats = {"requests": 0, "unsupported": 0, "badFrames": 0, "errors": 0, "refusedConnections": 0,
                      "checksRelayed": 0, "checksUnrelayed": 0}
        self.handlers = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.on_route,
            RequestCode.HEART_BEAT: self.on_heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.on_unregister,
            RequestCode.SEND_MESSAGE: self.on_send,
            RequestCode.SEND_MESSAGE_V2: self.on_send,
            RequestCode.SEND_BATCH_MESSAGE: self.on_send,
            RequestCode.PULL_MESSAGE: self.on_pull,
            RequestCode.QUERY_CONSUMER_OFFSET: self.on_queue_request,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.on_queue_request,
            RequestCode.GET_MAX_OFFSET: self.on_queue_request,
            RequestCode.GET_MIN_OFFSET: self.on_queue_request,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.on_queue_request,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.on_queue_request,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.on_consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.on_send_back,
            RequestCode.END_TRANSACTION: self.on_end_transaction,
        }
        from rmq.proxy.admin import admin_handlers   # mqadmin's codes (imports this module)
        self.handlers.update(admin_handlers(self))

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> "ProxyServer":
        self._loop = asyncio.get_running_loop()
        self.remoting = AsyncRemoting(auth=self._auth, on_request=self._on_broker_request)
        self._server = await self._loop.create_server(lambda: _Connection(self), self.listen_addr, self.listen_port,
                                                      backlog=1024)
        self._sweeper = self._loop.create_task(self._sweep_idle())
        host, port = self._server.sockets[0].getsockname()[:2]
        self.listen_port = port
        if not self.advertised_addr:
            self.advertised_addr = f"{host}:{port}"
        log.info("remoting proxy listening on %s:%d (routes point at %s), NameServer %s", host, port,
                 self.advertised_addr, ";".join(self.namesrv_addrs))
        return self

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._conns):
            conn.close()
        if self._server is not None:
            self._server.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
        if self.remoting is not None:
            await self.remoting.close()

    # -- connections ----------------------------------------------------------------------------------------
    def _connection_made(self, conn: "_Connection") -> bool:
        if self.connections >= min(MAX_CONNECTIONS, self._fd_budget):
            self.stats["refusedConnections"] += 1
            return False
        self.connections += 1
        self._conns.add(conn)
        self._conn_by_host[conn.born_host] = conn
        return True

    def _connection_lost(self, conn: "_Connection") -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            self.connections -= 1
        if self._conn_by_host.get(conn.born_host) is conn:
            del self._conn_by_host[conn.born_host]
        for group in [g for g, members in self._producer_conns.items() if conn in members.values()]:
            members = self._producer_conns[group]
            for client in [c for c, x in members.items() if x is conn]:
                del members[client]
            if not members:
                del self._producer_conns[group]

    async def _sweep_idle(self) -> None:
        """Close connections without a complete frame for CHANNEL_MAX_IDLE_S (one timer for all)."""
        while True:
            await asyncio.sleep(min(CHANNEL_MAX_IDLE_S / 4, IDLE_SWEEP_S))
            cutoff = time.monotonic() - CHANNEL_MAX_IDLE_S
            for conn in [c for c in self._conns if c.last_frame < cutoff]:
                conn.close()

    def _dispatch(self, cmd: RemotingCommand, conn: "_Connection") -> None:
        t = self._loop.create_task(self._handle(cmd, conn, conn.born_host))
        conn.started(t)

    async def _handle(self, cmd: RemotingCommand, writer: "_Connection", born_host: str) -> None:
        self.stats["requests"] += 1
        handler = self.handlers.get(cmd.code)
        try:
            if self.acl is not None:                   # ACL 1.0: raises AclError (NO_PERMISSION)
                self.acl.check(cmd, born_host)
            if handler is None:
                self.stats["unsupported"] += 1
                resp = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
            else:
                resp = await handler(cmd, born_host)
        except MQClientError as e:
            code = e.response_code if e.response_code and e.response_code > 0 else ResponseCode.SYSTEM_ERROR
            resp = cmd.response(code, str(e))
        except Exception as e:  # noqa: BLE001 - a bug answers SYSTEM_ERROR; the connection stays
            self.stats["errors"] += 1
            log.exception("request code %d failed", cmd.code)
            resp = cmd.response(ResponseCode.SYSTEM_ERROR, f"proxy error: {e}")
        if cmd.is_oneway or writer.is_closing():
            return
        try:
            data = encode(resp)
        except RemotingFrameError as e:
            data = encode(cmd.response(ResponseCode.SYSTEM_ERROR, str(e)))
        writer.write(data)

    # -- rmq side ----------------------------------------------------------------------------------------
    async def _invoke(self, addr: str, frame: Frame, timeout_ms: int = FORWARD_TIMEOUT_MS) -> Frame:
        return await self.remoting.invoke(addr, frame, timeout_ms)

    async def _namesrv(self, frame_factory) -> Frame:
        last: Optional[Exception] = None
        for i in range(len(self.namesrv_addrs)):
            idx = (self._ns_next + i) % len(self.namesrv_addrs)
            try:
                resp = await self._invoke(self.namesrv_addrs[idx], frame_factory())
                self._ns_next = idx
                return resp
            except RemotingError as e:
                last = e
        raise MQClientError(f"no NameServer of {self.namesrv_addrs} answered: {last}", int(ResponseCode.SYSTEM_ERROR))

    async def masters(self) -> list:
        """[(broker name, master address)] of the cluster, cached ROUTE_CACHE_MS."""
        at, masters = self._masters
        if masters and (time.monotonic() - at) * 1000 < ROUTE_CACHE_MS:
            return masters
        brokers = parse_cluster_info(await self._namesrv(cluster_info_request))
        masters = sorted((b.broker_name, b.master_addr()) for b in brokers if b.master_addr())
        self._masters = (time.monotonic(), masters)
        return masters

    async def layout(self, topic: str, auto_create: bool = False) -> Optional[Layout]:
        """The topic's virtual layout (None: no route); ``auto_create``: a topic without a route gets
        the cluster's masters with AUTO_CREATE_SPAN queues each (TBW102's view; the broker creates it)."""
        lay = self._layouts.get(topic)
        if lay is not None and (time.monotonic() - lay.fetched_at) * 1000 < ROUTE_CACHE_MS:
            return lay
        route = parse_route_response(await self._namesrv(lambda: Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                       fields={"topic": topic})), topic)
        if route is not None:
            addrs = {bd.broker_name: bd.master_addr() for bd in route.broker_datas}
            cluster = next((bd.cluster for bd in route.broker_datas if bd.cluster), PROXY_CLUSTER_NAME)
            groups = [_Group(q.broker_name, addrs[q.broker_name], max(q.read_queue_nums, q.write_queue_nums),
                             q.read_queue_nums, q.write_queue_nums, q.perm)
                      for q in route.queue_datas if addrs.get(q.broker_name)]
            if groups:
                lay = Layout(topic, groups, cluster)
                self._layouts[topic] = lay
                return lay
        self._layouts.pop(topic, None)
        if not auto_create:
            return None
        masters = await self.masters()
        if not masters:
            return None
        return Layout(topic, [_Group(name, addr, AUTO_CREATE_SPAN, AUTO_CREATE_SPAN, AUTO_CREATE_SPAN,
                                     PERM_READ | PERM_WRITE) for name, addr in masters])

    async def _locate(self, cmd: RemotingCommand, topic: str, auto_create: bool = False) -> tuple:
        lay = await self.layout(topic, auto_create)
        if lay is None:
            raise MQClientError(f"No topic route info in name server for the topic: {topic}",
                                int(ResponseCode.TOPIC_NOT_EXIST))
        return lay, lay.locate(_int(cmd.ext_fields, "queueId", 0))

    # -- handlers ----------------------------------------------------------------------------------------
    async def on_route(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC (105): the virtual broker's route, pointing at this proxy."""
        topic = _field(cmd, "topic")
        lay = await self.layout(topic, auto_create=(topic == TBW102))
        if lay is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")
        return cmd.response(body=lay.route_json(self.advertised_addr))

    async def on_heartbeat(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """HEART_BEAT (34): the JSON HeartbeatData, enums as names, to every master."""
        try:
            data = json.loads(cmd.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"heartbeat body is not JSON: {e}")
        if not isinstance(data, dict) or not isinstance(data.get("clientID"), str):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "heartbeat body must be an object with a clientID")
        for c in data.get("consumerDataSet") or []:
            if isinstance(c, dict):
                _enum(c, "messageModel", dict(enumerate(MESSAGE_MODELS)))
                _enum(c, "consumeType", dict(enumerate(CONSUME_TYPES)))
                _enum(c, "consumeFromWhere", CONSUME_FROM)
        frame_body = P.pack_body(data)
        resps = await self._to_masters(lambda: Frame(RequestCode.HEART_BEAT, bodies=[frame_body]))
        failed = _first_failure(cmd, resps)
        conn = self._conn_by_host.get(born_host)
        if failed is None and conn is not None:
            # where the brokers' CHECK_TRANSACTION_STATE for these groups is relayed
            conn.serialize_type = cmd.serialize_type
            for p in data.get("producerDataSet") or []:
                group = p.get("groupName") if isinstance(p, dict) else None
                if isinstance(group, str) and group:
                    self._producer_conns.setdefault(group, {})[data["clientID"]] = conn
        return failed or cmd.response()

    async def on_unregister(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """UNREGISTER_CLIENT (35) to every master."""
        fields = {k: cmd.ext_fields[k] for k in ("clientID", "producerGroup", "consumerGroup") if k in cmd.ext_fields}
        members = self._producer_conns.get(fields.get("producerGroup", ""))
        if members is not None:
            members.pop(fields.get("clientID", ""), None)
        resps = await self._to_masters(lambda: Frame(RequestCode.UNREGISTER_CLIENT, fields=dict(fields)))
        return _first_failure(cmd, resps) or cmd.response()

    async def _to_masters(self, frame_factory) -> list:
        masters = await self.masters()
        results = await asyncio.gather(*(self._invoke(addr, frame_factory()) for _, addr in masters),
                                       return_exceptions=True)
        out = []
        for r in results:
            if isinstance(r, BaseException):
                out.append(Frame(ResponseCode.SYSTEM_ERROR, remark=str(r)))
            else:
                out.append(r)
        return out

    async def on_send(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """SEND_MESSAGE (10, the C++ client's batches too: ``batch=true``), SEND_MESSAGE_V2 (310),
        SEND_BATCH_MESSAGE (320) to the real group of the global queue id."""
        f = cmd.ext_fields
        if cmd.code != RequestCode.SEND_MESSAGE:
            f = {V2_NAMES.get(k, k): v for k, v in f.items()}
        topic = f.get("topic") or ""
        batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or str(f.get("batch", "")).lower() in ("true", "1")
        fake = RemotingCommand(cmd.code, ext_fields=f)
        if _int(f, "queueId", -1) < 0:
            lay = await self.layout(topic, auto_create=True)
            if lay is None:
                raise MQClientError(f"no broker to send topic {topic} to", int(ResponseCode.TOPIC_NOT_EXIST))
            self._rr += 1
            group, qid = lay.groups[self._rr % len(lay.groups)], -1
        else:
            lay, (group, qid) = await self._locate(fake, topic, auto_create=True)
        props_str = f.get("properties", "")
        h = SendMessageRequestHeader(
            f.get("producerGroup", ""), topic, qid, _int(f, "sysFlag", 0), _int(f, "bornTimestamp", now_ms()),
            _int(f, "flag", 0), props_str, _int(f, "reconsumeTimes", 0),
            default_topic_queue_nums=min(_int(f, "defaultTopicQueueNums", DEFAULT_TOPIC_QUEUE_NUMS), group.span)
            or DEFAULT_TOPIC_QUEUE_NUMS, born_host=born_host)
        if "maxReconsumeTimes" in f:
            h.max_reconsume_times = _int(f, "maxReconsumeTimes", 16)
        if batch:
            h.properties = (_cl.decode_properties(props_str.encode("utf-8")) if props_str else None) or {}
            code = RequestCode.SEND_BATCH_MESSAGE
        else:
            code = RequestCode.SEND_MESSAGE
            if "WAIT\x01false" in props_str:            # the producer does not wait for the flush
                h.wait_store_msg_ok = False
        resp = await self._invoke(group.addr, Frame(code, fields=h.to_fields(), bodies=[cmd.body]))
        if resp.code != ResponseCode.SUCCESS and resp.code not in (ResponseCode.FLUSH_DISK_TIMEOUT,
                                                                   ResponseCode.FLUSH_SLAVE_TIMEOUT,
                                                                   ResponseCode.SLAVE_NOT_AVAILABLE):
            return cmd.response(resp.code, resp.remark)
        out = {"msgId": send_response_msg_id(resp.fields, resp.bodies), "queueOffset": resp.fields.get("queueOffset"),
               "queueId": lay.global_id(group.broker_name, int(resp.fields.get("queueId", qid))),
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if "transactionId" in resp.fields:
            out["transactionId"] = resp.fields["transactionId"]
        if (h.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE and not batch:
            # a half message: its END_TRANSACTION goes to this group
            self.tx_routes.remember(resp.fields.get("transactionId") or uniq_key(props_str), group.addr)
        return cmd.response(resp.code, resp.remark or None, out)

    async def on_pull(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """PULL_MESSAGE (11): long polling held by the real broker; the stored records pass through.

        RocketMQ's clients send no HA epoch with a pull (rmq's ``lastEpoch``), so the proxy sends it
        for them: a pull from the queue offset this connection's last answer of that queue gave
        (its ``nextBeginOffset``) carries that answer's ``brokerEpoch``.  After an unclean
        failover the broker then moves a position read in the lost tail back to where the new
        epoch begins (PULL_OFFSET_MOVED), as it does for rmq's consumers, instead of letting the
        client skip the messages stored there since.  A position the client took from elsewhere
        (a committed offset, a reset) carries none."""
        f = cmd.ext_fields
        lay, (group, qid) = await self._locate(cmd, _field(cmd, "topic"))
        suspend = _int(f, "suspendTimeoutMillis", 0)
        offset = _int(f, "queueOffset", 0)
        conn = self._conn_by_host.get(born_host)
        key = (f.get("consumerGroup", ""), group.broker_name, lay.topic, qid)
        fields = PullMessageRequestHeader(
            key[0], lay.topic, qid, offset, _int(f, "maxMsgNums", 32),
            _int(f, "sysFlag", 0), _int(f, "commitOffset", 0), suspend, f.get("subscription") or SUB_ALL,
            _int(f, "subVersion", 0), f.get("expressionType") or TAG,
            last_epoch=conn.pull_epochs.for_pull(key, offset) if conn is not None else 0).to_fields()
        resp = await self._invoke(group.addr, Frame(RequestCode.PULL_MESSAGE, fields=fields),
                                  suspend + FORWARD_TIMEOUT_MS)
        if conn is not None:
            conn.pull_epochs.note(key, resp.fields.get("brokerEpoch"), resp.fields.get("nextBeginOffset"))
        out = {k: resp.fields[k] for k in ("nextBeginOffset", "minOffset", "maxOffset") if k in resp.fields}
        out["suggestWhichBrokerId"] = 0
        return cmd.response(resp.code, resp.remark or None, out, bytes(resp.bodies[0]) if resp.bodies else b"")

    QUEUE_FIELDS = {RequestCode.QUERY_CONSUMER_OFFSET: ("consumerGroup",),
                    RequestCode.UPDATE_CONSUMER_OFFSET: ("consumerGroup", "commitOffset"),
                    RequestCode.GET_MAX_OFFSET: (), RequestCode.GET_MIN_OFFSET: (),
                    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: ("timestamp",),
                    RequestCode.GET_EARLIEST_MSG_STORETIME: ()}
    INT_FIELDS = {"commitOffset", "timestamp"}

    async def on_queue_request(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """The per-queue requests (14, 15, 30, 31, 29, 32): topic + global queue id mapped, the
        answer's header fields returned as strings."""
        lay, (group, qid) = await self._locate(cmd, _field(cmd, "topic"))
        fields = {"topic": lay.topic, "queueId": qid}
        for name in self.QUEUE_FIELDS[cmd.code]:
            fields[name] = _int(cmd.ext_fields, name, 0) if name in self.INT_FIELDS else cmd.ext_fields.get(name, "")
        if cmd.code == RequestCode.UPDATE_CONSUMER_OFFSET:
            # a commit within what this connection's last pull answer of the queue gave carries
            # that answer's HA epoch, as rmq's consumers send it (on_pull): the broker stores an
            # offset read in a tail a failover lost where the new epoch begins
            conn = self._conn_by_host.get(born_host)
            epoch = conn.pull_epochs.for_commit((fields["consumerGroup"], group.broker_name, lay.topic, qid),
                                                fields["commitOffset"]) if conn is not None else 0
            if epoch:
                fields["lastEpoch"] = epoch
        resp = await self._invoke(group.addr, Frame(cmd.code, fields=fields))
        return cmd.response(resp.code, resp.remark or None, dict(resp.fields))

    async def on_consumer_list(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_CONSUMER_LIST_BY_GROUP (38): the union over the masters, as JSON."""
        group = _field(cmd, "consumerGroup")
        resps = await self._to_masters(lambda: Frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                     fields={"consumerGroup": group}))
        ids: set = set()
        for r in resps:
            if r.code == ResponseCode.SUCCESS and r.bodies:
                body = P.unpack_body(r)
                if isinstance(body, dict):
                    ids.update(x for x in body.get("consumerIdList") or [] if isinstance(x, str))
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer of group {group} online")
        return cmd.response(body=json.dumps({"consumerIdList": sorted(ids)}).encode())

    async def on_send_back(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK (36): a failed message to its group's %RETRY% topic.  The request
        names a CommitLog offset but no broker: with several broker groups, the one whose store
        host the ``originMsgId`` (an offset message id) names."""
        f = cmd.ext_fields
        masters = await self.masters()
        if not masters:
            raise MQClientError("no master broker", int(ResponseCode.SYSTEM_ERROR))
        addr = masters[0][1]
        if len(masters) > 1:
            addr = None
            try:
                host, _ = _cl.decode_message_id(f.get("originMsgId", ""))
                named = _host_str(host)
                addr = next((a for _, a in masters if a == named), None)
            except (ValueError, TypeError):
                pass
            if addr is None:
                raise MQClientError("cannot tell which broker group holds the message to send back",
                                    int(ResponseCode.SYSTEM_ERROR))
        fields = {"group": f.get("group", ""), "offset": _int(f, "offset", 0), "delayLevel": _int(f, "delayLevel", 0),
                  "originMsgId": f.get("originMsgId", ""), "originTopic": f.get("originTopic", "")}
        if "maxReconsumeTimes" in f:
            fields["maxReconsumeTimes"] = _int(f, "maxReconsumeTimes", 16)
        resp = await self._invoke(addr, Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields=fields))
        return cmd.response(resp.code, resp.remark or None)


    END_FIELDS_INT = ("tranStateTableOffset", "commitLogOffset", "commitOrRollback")

    async def on_end_transaction(self, cmd: RemotingCommand, born_host: str) -> Optional[RemotingCommand]:
        """END_TRANSACTION (37, one-way from RocketMQ's clients): to the broker group of the half
        message (:class:`rmq.proxy.transaction.TransactionRoutes`; with one group, that group).

        Raises
        ------
        MQClientError
            The group cannot be told (several groups and a transaction the proxy never saw; the
            broker's check-back settles it), or a header field is not an integer.
        """
        f = cmd.ext_fields
        keys = (f.get("transactionId"), f.get("msgId"))
        addr = self.tx_routes.lookup(*keys)
        if addr is None:
            masters = await self.masters()
            if len(masters) != 1:
                raise MQClientError(f"cannot tell which broker group holds transaction {keys[0] or keys[1]!r}; "
                                    "the broker's check-back will settle it", int(ResponseCode.SYSTEM_ERROR))
            addr = masters[0][1]
        fields = {name: _int(f, name, -1 if name == "tranStateTableOffset" else 0) for name in self.END_FIELDS_INT}
        fields.update(producerGroup=f.get("producerGroup", ""), msgId=f.get("msgId", ""),
                      transactionId=f.get("transactionId", ""),
                      fromTransactionCheck=str(f.get("fromTransactionCheck", "")).lower() == "true")
        frame = Frame(RequestCode.END_TRANSACTION, fields=fields)
        if fields["commitOrRollback"] != 0:
            self.tx_routes.forget(*keys)
        if cmd.is_oneway:
            self.remoting.oneway(addr, frame)
            return None
        resp = await self._invoke(addr, frame)
        return cmd.response(resp.code, resp.remark or None)

    def _on_broker_request(self, frame: Frame, addr: str) -> None:
        """A broker's own request on a forwarding socket: its one-way CHECK_TRANSACTION_STATE for a
        producer group whose heartbeats came through this proxy, relayed to one of the group's
        connections (round robin) with the real topic restored, as RocketMQ's broker sends it."""
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        f = frame.fields
        group = str(f.get("producerGroup", ""))
        conns = [c for c in self._producer_conns.get(group, {}).values() if not c.is_closing()]
        if not conns or not frame.bodies:
            self.stats["checksUnrelayed"] += 1
            log.warning("check-back of transaction %s: no remoting producer of group %s", f.get("transactionId"), group)
            return
        try:
            body = check_message_body(bytes(frame.bodies[0]))
        except ValueError as e:
            self.stats["checksUnrelayed"] += 1
            log.warning("check-back of transaction %s: %s", f.get("transactionId"), e)
            return
        self._check_rr += 1
        conn = conns[self._check_rr % len(conns)]
        ext = {k: f[k] for k in ("tranStateTableOffset", "commitLogOffset", "msgId", "transactionId", "offsetMsgId")
               if k in f}
        ext["brokerName"] = PROXY_BROKER_NAME
        self.tx_routes.remember(str(f.get("transactionId", "")), addr)
        self.tx_routes.remember(str(f.get("msgId", "")), addr)
        conn.write(encode(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, next(self._out_opaque), FLAG_ONEWAY,
                                          None, ext, body, serialize_type=conn.serialize_type)))
        self.stats["checksRelayed"] += 1


class _Connection(asyncio.Protocol):
    """One remoting client connection: frames cut from the byte stream as they arrive, each request
    handled in a task of its own (a held pull does not stop the sends behind it), answers written
    in completion order (matched by opaque, as RocketMQ's clients do).

    Flow control: at MAX_IN_FLIGHT_PER_CONNECTION requests in flight, or while the socket's send
    buffer is over its high-water mark, the connection stops reading until that clears.
    """

    def __init__(self, server: ProxyServer):
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self.buf = bytearray()
        self.need = 0                        # the current frame's length (0: reading a prefix)
        self.tasks: set = set()
        self.born_host = "0.0.0.0:0"
        self.last_frame = time.monotonic()
        self.paused_reading = False
        self.paused_writing = False
        self.closed = False
        self.serialize_type = SERIALIZE_JSON   # the header type of the client's heartbeats
        # (group, broker, topic, queue id) -> its last pull answer's (epoch, next offset): on_pull
        self.pull_epochs = PullEpochs(MAX_PULL_POSITIONS_PER_CONNECTION)

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("0.0.0.0", 0)
        self.born_host = f"{peer[0]}:{peer[1]}"
        if not self.server._connection_made(self):
            self.closed = True
            transport.abort()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server._connection_lost(self)
        for t in self.tasks:
            t.cancel()
        self.tasks.clear()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._process()

    def _process(self) -> None:
        """Cut and dispatch the complete frames in the buffer; stops at MAX_IN_FLIGHT_PER_CONNECTION
        requests in flight (the rest waits in the buffer, reading paused, until answers go)."""
        buf = self.buf
        pos, end = 0, len(buf)
        try:
            while not self.closed:
                if self.need == 0:
                    if end - pos < 4:
                        break
                    length = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
                    check_length(length)
                    self.need = length
                    pos += 4
                if end - pos < self.need:
                    break
                if len(self.tasks) >= MAX_IN_FLIGHT_PER_CONNECTION:
                    self._flow()
                    break
                cmd = decode(bytes(buf[pos:pos + self.need]))
                pos += self.need
                self.need = 0
                self.last_frame = time.monotonic()
                if not cmd.is_response:          # the proxy sends no requests to clients
                    self.server._dispatch(cmd, self)
        except RemotingFrameError as e:
            self.server.stats["badFrames"] += 1
            log.warning("closing %s: %s", self.born_host, e)
            self.close()
        finally:
            if pos:
                del buf[:pos]

    def eof_received(self):
        return False                         # close our side too

    def pause_writing(self) -> None:
        self.paused_writing = True
        self._flow()

    def resume_writing(self) -> None:
        self.paused_writing = False
        self._flow()

    # the proxy's side
    def started(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._done)
        if len(self.tasks) >= MAX_IN_FLIGHT_PER_CONNECTION:
            self._flow()

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if self.paused_reading:
            self._flow()
            if not self.paused_reading and self.buf:
                self._process()                  # the frames that waited for a free slot

    def _flow(self) -> None:
        if self.closed:
            return
        stop = self.paused_writing or len(self.tasks) >= MAX_IN_FLIGHT_PER_CONNECTION
        if stop and not self.paused_reading:
            self.paused_reading = True
            self.transport.pause_reading()
        elif not stop and self.paused_reading:
            self.paused_reading = False
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def is_closing(self) -> bool:
        return self.closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True


# -- helpers -------------------------------------------------------------------------------------------
def _field(cmd: RemotingCommand, name: str) -> str:
    v = cmd.ext_fields.get(name)
    if not v:
        raise MQClientError(f"the request has no {name!r} header field", int(ResponseCode.SYSTEM_ERROR))
    return v


def _int(fields: dict, name: str, default: int) -> int:
    v = fields.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise MQClientError(f"header field {name!r} is not an integer: {v!r}", int(ResponseCode.SYSTEM_ERROR)) from None


def _enum(d: dict, key: str, names: dict) -> None:
    v = d.get(key)
    if isinstance(v, int) and v in names:
        d[key] = names[v]


def _host_str(host: bytes) -> str:
    if len(host) == 8:
        return f"{host[0]}.{host[1]}.{host[2]}.{host[3]}:{struct.unpack('>i', host[4:8])[0]}"
    return ""


def _run(coro) -> None:
    """``asyncio.run`` on uvloop's event loop (libuv: about half the per-request cost of the
    default loop's transports) when installed and RMQ_PROXY_LOOP is not ``asyncio``."""
    import os
    if os.environ.get("RMQ_PROXY_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            return uvloop.run(coro)
    return asyncio.run(coro)


def _raise_nofile() -> int:
    """Raise this process's open-file limit to its hard limit (a proxy holds one descriptor per
    client) and return it; the proxy takes at most that minus FD_RESERVE connections, so accept
    never fails on EMFILE."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _first_failure(cmd: RemotingCommand, resps: list) -> Optional[RemotingCommand]:
    for r in resps:
        if r.code != ResponseCode.SUCCESS:
            return cmd.response(r.code, r.remark)
    return None


async def run_proxy(namesrv_addr: str, listen_addr: str = "127.0.0.1", listen_port: int = REMOTING_LISTEN_PORT,
                    advertised_addr: Optional[str] = None, ready=None, acl=None,
                    grpc_port: Optional[int] = None) -> None:
    """Run a proxy until cancelled; ``ready(server)`` is called once it listens; ``acl``: see
    :class:`ProxyServer`; ``grpc_port``: also serve RocketMQ 5's gRPC API there
    (:class:`rmq.proxy.grpc_server.GrpcProxy`, 0 = any free port: ``server.grpc_port`` once ready;
    None: no gRPC endpoint).

    Raises
    ------
    OSError
        An address cannot be bound.
    """
    server = ProxyServer(namesrv_addr, listen_addr, listen_port, advertised_addr, acl=acl)
    await server.start()
    grpc_proxy = None
    try:
        if grpc_port is not None:
            from rmq.proxy.grpc_server import GrpcProxy
            grpc_proxy = await asyncio.get_running_loop().run_in_executor(
                None, lambda: GrpcProxy(namesrv_addr, listen_addr, grpc_port, acl=acl).start())
            server.grpc_port = grpc_proxy.port
        if ready is not None:
            ready(server)
        await server.serve_forever()
    finally:
        if grpc_proxy is not None:
            await asyncio.get_running_loop().run_in_executor(None, grpc_proxy.stop)
        await server.close()


def serve(namesrv_addr: str, listen_addr: str = "127.0.0.1", listen_port: int = REMOTING_LISTEN_PORT,
          advertised_addr: Optional[str] = None, ready=None, acl=None, grpc_port: Optional[int] = None) -> None:
    """:func:`run_proxy` in its own event loop until SIGTERM / SIGINT (then a clean return).

    Raises
    ------
    OSError
        An address cannot be bound.
    """
    import signal

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await run_proxy(namesrv_addr, listen_addr, listen_port, advertised_addr, ready, acl, grpc_port)
    try:
        _run(main())
    except asyncio.CancelledError:
        pass


__all__ = ["ProxyServer", "Layout", "run_proxy", "serve", "REMOTING_LISTEN_PORT", "PROXY_BROKER_NAME",
           "MAX_IN_FLIGHT_PER_CONNECTION", "CHANNEL_MAX_IDLE_S", "MAX_CONNECTIONS"]
