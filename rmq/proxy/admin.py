"""The admin codes of RocketMQ's ``mqadmin`` answered by the remoting proxy (issue 14): topic and
subscription group create / list / delete, topic and consume stats, consumer connections, the
cluster and the broker's runtime info, answered as a RocketMQ 4.9 NameServer / broker would and
forwarded to rmq's NameServer and brokers (:mod:`rmq.proxy.server` for the virtual broker).

Sources (apache/rocketmq, tag ``rocketmq-all-4.9.7``):

- codes: ``common/.../protocol/RequestCode.java``; CONSUMER_NOT_ONLINE (206):
  ``common/.../protocol/ResponseCode.java``
- request headers: ``common/.../protocol/header/{CreateTopicRequestHeader,DeleteTopicRequestHeader,
  GetTopicStatsInfoRequestHeader,GetConsumeStatsRequestHeader,GetConsumerConnectionListRequestHeader,
  DeleteSubscriptionGroupRequestHeader}.java``, ``.../header/namesrv/DeleteTopicFromNamesrvRequestHeader.java``
- the broker's answers: ``broker/.../processor/AdminBrokerProcessor.java``; the NameServer's:
  ``namesrv/.../processor/DefaultRequestProcessor.java``, ``namesrv/.../routeinfo/RouteInfoManager.java``
- bodies: ``common/.../TopicConfig.java``, ``common/.../DataVersion.java``,
  ``common/.../protocol/body/{TopicList,ClusterInfo,SubscriptionGroupWrapper,TopicConfigSerializeWrapper,
  ConsumerConnection,Connection,KVTable}.java``, ``common/.../subscription/SubscriptionGroupConfig.java``,
  ``common/.../admin/{TopicStatsTable,TopicOffset,ConsumeStats,OffsetWrapper}.java``,
  ``common/.../message/MessageQueue.java``, ``common/.../protocol/heartbeat/SubscriptionData.java``,
  ``common/.../protocol/route/BrokerData.java``

**Bodies as fastjson writes them** (``remoting/.../protocol/RemotingSerializable.java``:
``JSON.toJSONString``; fastjson 1.2.69 ``serializer/MapSerializer.java``): a bean's properties in
alphabetical order, null ones left out, enums by name; a map whose keys are not strings writes
each key as its JSON value, unquoted, so ``HashMap<MessageQueue, TopicOffset>`` reads
``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}`` and ``HashMap<Long, String>`` reads
``{0:"host:port"}``.  That is not JSON; Java's fastjson reads it back (see :func:`to_json`).

**The virtual broker.**  Every broker-side answer speaks for the one broker group clients see,
:data:`rmq.proxy.server.PROXY_BROKER_NAME`: a topic created through it is created on every master
(or on the real group named by the rmq extension field ``brokerName``), stats name the global
queue ids of :class:`rmq.proxy.server.Layout`, lists are the union over the masters.

Not served the RocketMQ way (rmq has no equivalent): DELETE_SUBSCRIPTIONGROUP's ``removeOffset``
(offsets stay); GET_CONSUMER_CONNECTION_LIST knows the language, version, address and
subscriptions of the consumers that send their heartbeats through this proxy (the others: client
id only, language PYTHON); GET_BROKER_RUNTIME_INFO gives the counters rmq keeps (the
``...Morning`` totals are 0: the totals count since the brokers started).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Optional

from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq.common.mix_all import TOOLS_CONSUMER_GROUP
from rmq.common.request_header import PullMessageRequestHeader
from rmq.errors import MQClientError, RmqError
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.proxy.remoting import SERVER_VERSION, RemotingCommand
from rmq.proxy.server import (CONSUME_FROM, CONSUME_TYPES, MESSAGE_MODELS, PROXY_BROKER_NAME, PROXY_CLUSTER_NAME,
                              Layout, _enum, _field, _int)

CONSUMER_NOT_ONLINE = 206                # ResponseCode.CONSUMER_NOT_ONLINE
VERSION_DESC = "V4_9_7"                  # MQVersion.getVersionDesc(SERVER_VERSION)
CONSUMER_EXPIRED_S = 120.0               # BrokerConfig.channelExpiredTimeout: a silent consumer is gone
MAX_CACHED_CONSUMERS = 100_000           # consumers whose heartbeats are remembered (the rest: ids only)
GROUP_CONFIG_KEYS = ("consumeEnable", "consumeFromMinEnable", "consumeBroadcastEnable", "retryQueueNums",
                     "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly")
# SubscriptionGroupConfig's defaults (the properties a config from rmq may lack)
GROUP_DEFAULTS = {"consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                  "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
                  "notifyConsumerIdsChangedEnable": True}


# -- fastjson's text ----------------------------------------------------------------------------------
class JMap(list):
    """A Java map whose keys are not strings, as ``[(key, value), ...]``: :func:`to_json` writes each
    key as its JSON value (an object for a MessageQueue, a bare number for a Long)."""


def to_json(v) -> str:
    """``v`` as fastjson writes it: dict keys in the order given (build beans with :func:`bean`),
    None values of a dict left out, :class:`JMap` keys unquoted, no spaces, non-ASCII as is."""
    if isinstance(v, JMap):
        return "{" + ",".join(f"{to_json(k)}:{to_json(x)}" for k, x in v if x is not None) + "}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{to_json(x)}"
                              for k, x in v.items() if x is not None) + "}"
    if isinstance(v, (list, tuple, set, frozenset)):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v, ensure_ascii=False)


def bean(**props) -> dict:
    """A Java bean's properties as fastjson orders them: alphabetically (None ones are dropped)."""
    return {k: props[k] for k in sorted(props) if props[k] is not None}


def message_queue(topic: str, queue_id: int) -> dict:
    """MessageQueue of the virtual broker (``common/.../message/MessageQueue.java``)."""
    return bean(topic=topic, brokerName=PROXY_BROKER_NAME, queueId=int(queue_id))


def topic_config(name: str, read: int, write: int, perm: int, order: bool = False, sys_flag: int = 0,
                 filter_type: str = "SINGLE_TAG") -> dict:
    """TopicConfig (``common/.../TopicConfig.java``)."""
    return bean(topicName=name, readQueueNums=int(read), writeQueueNums=int(write), perm=int(perm),
                topicFilterType=filter_type or "SINGLE_TAG", topicSysFlag=int(sys_flag), order=bool(order))


def group_config(name: str, cfg: dict) -> dict:
    """SubscriptionGroupConfig (``common/.../subscription/SubscriptionGroupConfig.java``)."""
    props = {k: cfg.get(k, d) for k, d in GROUP_DEFAULTS.items()}
    for k in ("consumeEnable", "consumeFromMinEnable", "consumeBroadcastEnable", "notifyConsumerIdsChangedEnable"):
        props[k] = _bool(props[k])
    for k in ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"):
        props[k] = int(props[k])
    return bean(groupName=name, **props)


def _bool(v) -> bool:
    return v.lower() == "true" if isinstance(v, str) else bool(v)


def data_version(timestamp: int, counter: int) -> dict:
    """DataVersion (``common/.../DataVersion.java``; the AtomicLong counter as a number)."""
    return bean(timestamp=int(timestamp), counter=int(counter))


def subscription_data(sd: dict) -> dict:
    """SubscriptionData (``common/.../protocol/heartbeat/SubscriptionData.java``) from a heartbeat's
    subscription (Java and C++ clients; ``filterClassSource`` is never written)."""
    return bean(classFilterMode=_bool(sd.get("classFilterMode", False)), topic=str(sd.get("topic", "")),
                subString=str(sd.get("subString", "*")), tagsSet=list(sd.get("tagsSet") or []),
                codeSet=[int(c) for c in sd.get("codeSet") or []], subVersion=int(sd.get("subVersion") or 0),
                expressionType=str(sd.get("expressionType") or "TAG"))


# -- the handlers ----------------------------------------------------------------------------------------
class ProxyAdmin:
    """The admin handlers of one :class:`rmq.proxy.server.ProxyServer` (:meth:`handlers`)."""

    def __init__(self, server):
        self.s = server
        # consumers whose heartbeats came through this proxy: group -> clientId -> what they said
        self.consumers: dict = {}
        self._cached = 0

    def handlers(self) -> dict:
        """request code -> handler, to merge into ``ProxyServer.handlers``; HEART_BEAT and
        UNREGISTER_CLIENT are wrapped (the server's handler, then the consumer table here)."""
        s = self.s
        beat, unregister = s.handlers.get(RequestCode.HEART_BEAT), s.handlers.get(RequestCode.UNREGISTER_CLIENT)
        C = RequestCode
        out = {C.UPDATE_AND_CREATE_TOPIC: self.on_create_topic,
               C.DELETE_TOPIC_IN_BROKER: self.on_delete_topic_in_broker,
               C.DELETE_TOPIC_IN_NAMESRV: self.on_delete_topic_in_namesrv,
               C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.on_topic_list,
               C.GET_BROKER_CLUSTER_INFO: self.on_cluster_info,
               C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.on_create_group,
               C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.on_all_groups,
               C.DELETE_SUBSCRIPTIONGROUP: self.on_delete_group,
               C.GET_ALL_TOPIC_CONFIG: self.on_all_topic_config,
               C.GET_TOPIC_STATS_INFO: self.on_topic_stats,
               C.GET_CONSUME_STATS: self.on_consume_stats,
               C.GET_CONSUMER_CONNECTION_LIST: self.on_consumer_connection_list,
               C.GET_BROKER_RUNTIME_INFO: self.on_runtime_info}
        if beat is not None:
            out[C.HEART_BEAT] = self._wrap(beat, self._note_heartbeat)
        if unregister is not None:
            out[C.UNREGISTER_CLIENT] = self._wrap(unregister, self._note_unregister)
        return out

    @staticmethod
    def _wrap(inner, after):
        async def handler(cmd: RemotingCommand, born_host: str) -> RemotingCommand:
            resp = await inner(cmd, born_host)
            if resp.code == ResponseCode.SUCCESS:
                after(cmd, born_host)
            return resp
        handler.__doc__ = inner.__doc__
        return handler

    # -- rmq side ----------------------------------------------------------------------------------------
    async def _each_master(self, frame_factory, targets: Optional[list] = None) -> list:
        """[(broker name, response Frame)] of ``frame_factory()`` sent to each master (or ``targets``);
        a master that does not answer gives a SYSTEM_ERROR frame."""
        targets = await self.s.masters() if targets is None else targets
        results = await asyncio.gather(*(self.s._invoke(addr, frame_factory()) for _, addr in targets),
                                       return_exceptions=True)
        out = []
        for (name, _), r in zip(targets, results):
            if isinstance(r, asyncio.CancelledError):
                raise r
            if isinstance(r, BaseException):
                r = Frame(ResponseCode.SYSTEM_ERROR, remark=f"broker {name}: {r}")
            out.append((name, r))
        return out

    async def _masters_or_named(self, cmd: RemotingCommand) -> list:
        """Every master, or the real group named by the (rmq) ``brokerName`` field."""
        masters = await self.s.masters()
        if not masters:
            raise MQClientError("no master broker online", int(ResponseCode.SYSTEM_ERROR))
        name = cmd.ext_fields.get("brokerName")
        if name and name != PROXY_BROKER_NAME:
            masters = [m for m in masters if m[0] == name]
            if not masters:
                raise MQClientError(f"broker group {name} has no master online", int(ResponseCode.SYSTEM_ERROR))
        return masters

    def _forget(self, topic: str) -> None:
        self.s._layouts.pop(topic, None)

    @staticmethod
    def _failure(cmd: RemotingCommand, results: list) -> Optional[RemotingCommand]:
        for name, r in results:
            if r.code != ResponseCode.SUCCESS:
                return cmd.response(r.code, f"broker {name}: {r.remark}")
        return None

    async def _store_timestamp(self, addr: str, topic: str, queue_id: int, offset: int) -> int:
        """Store time (ms) of the message at ``offset`` (``getMessageStoreTimeStamp``); 0 if none."""
        if offset < 0:
            return 0
        try:
            resp = await self.s._invoke(addr, Frame(RequestCode.PULL_MESSAGE, fields=PullMessageRequestHeader(
                TOOLS_CONSUMER_GROUP, topic, queue_id, offset, 1).to_fields()))
        except (RmqError, OSError):
            return 0
        if resp.code != ResponseCode.SUCCESS or not resp.bodies:
            return 0
        try:
            msgs = _cl.decode_records(bytes(resp.bodies[0]), False)
        except ValueError:
            return 0
        return int(msgs[0].store_timestamp) if msgs else 0

    async def _queue_offsets(self, addr: str, topic: str) -> Optional[list]:
        """rmq's GET_TOPIC_STATS_INFO of one broker: [{queueId, minOffset, maxOffset}] (None: no topic)."""
        resp = await self.s._invoke(addr, Frame(RequestCode.GET_TOPIC_STATS_INFO, fields={"topic": topic}))
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(resp.remark or "topic stats failed", resp.code)
        body = P.unpack_body(resp) if resp.bodies else {}
        rows = body.get("offsetTable") if isinstance(body, dict) else None
        return sorted((r for r in rows or [] if isinstance(r, dict)), key=lambda r: int(r.get("queueId", 0)))

    # -- topics ------------------------------------------------------------------------------------------
    async def on_create_topic(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """UPDATE_AND_CREATE_TOPIC (17; CreateTopicRequestHeader: topic, defaultTopic, readQueueNums,
        writeQueueNums, perm, topicFilterType, topicSysFlag, order) on every master (or the
        ``brokerName`` one); AdminBrokerProcessor.updateAndCreateTopic."""
        f = cmd.ext_fields
        topic = _field(cmd, "topic")
        fields = {"topic": topic, "readQueueNums": _int(f, "readQueueNums", 16),
                  "writeQueueNums": _int(f, "writeQueueNums", 16), "perm": _int(f, "perm", 6),
                  "order": _bool(f.get("order", "false"))}
        targets = await self._masters_or_named(cmd)
        results = await self._each_master(lambda: Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields=dict(fields)),
                                          targets)
        self._forget(topic)
        return self._failure(cmd, results) or cmd.response()

    async def on_delete_topic_in_broker(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """DELETE_TOPIC_IN_BROKER (215; DeleteTopicRequestHeader: topic) on every master (or the
        ``brokerName`` one); AdminBrokerProcessor.deleteTopic."""
        topic = _field(cmd, "topic")
        targets = await self._masters_or_named(cmd)
        results = await self._each_master(lambda: Frame(RequestCode.DELETE_TOPIC_IN_BROKER, fields={"topic": topic}),
                                          targets)
        self._forget(topic)
        return self._failure(cmd, results) or cmd.response()

    async def on_delete_topic_in_namesrv(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216; DeleteTopicFromNamesrvRequestHeader: topic, clusterName) on
        every rmq NameServer; the proxy's own cluster name means all clusters."""
        topic = _field(cmd, "topic")
        fields = {"topic": topic}
        cluster = cmd.ext_fields.get("clusterName")
        if cluster and cluster != PROXY_CLUSTER_NAME:
            fields["clusterName"] = cluster
        results = await asyncio.gather(*(self.s._invoke(a, Frame(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                                                 fields=dict(fields)))
                                         for a in self.s.namesrv_addrs), return_exceptions=True)
        self._forget(topic)
        for addr, r in zip(self.s.namesrv_addrs, results):
            if isinstance(r, BaseException):
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"NameServer {addr}: {r}")
            if r.code != ResponseCode.SUCCESS:
                return cmd.response(r.code, f"NameServer {addr}: {r.remark}")
        return cmd.response()

    async def on_topic_list(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): TopicList ``{"topicList": [...]}``."""
        resp = await self.s._namesrv(lambda: Frame(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        if resp.code != ResponseCode.SUCCESS:
            return cmd.response(resp.code, resp.remark)
        body = P.unpack_body(resp) if resp.bodies else {}
        topics = sorted(str(t) for t in (body.get("topicList") or [] if isinstance(body, dict) else []))
        return cmd.response(body=to_json(bean(topicList=topics)).encode())

    async def cluster_names(self) -> list:
        """The real clusters' names (sorted), from the NameServer."""
        resp = await self.s._namesrv(lambda: Frame(RequestCode.GET_BROKER_CLUSTER_INFO))
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(resp.remark or "cluster info failed", resp.code)
        body = P.unpack_body(resp) if resp.bodies else {}
        table = body.get("clusterAddrTable") if isinstance(body, dict) else None
        return sorted(str(c) for c in (table or {}))

    async def on_cluster_info(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_BROKER_CLUSTER_INFO (106): ClusterInfo whose one broker is the virtual broker at this
        proxy, listed in every real cluster (``brokerAddrs`` is a ``HashMap<Long, String>``)."""
        clusters = await self.cluster_names() or [PROXY_CLUSTER_NAME]
        broker = bean(cluster=clusters[0], brokerName=PROXY_BROKER_NAME,
                      brokerAddrs=JMap([(0, self.s.advertised_addr)]))
        doc = bean(brokerAddrTable={PROXY_BROKER_NAME: broker},
                   clusterAddrTable={c: [PROXY_BROKER_NAME] for c in clusters})
        return cmd.response(body=to_json(doc).encode())

    async def on_all_topic_config(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_ALL_TOPIC_CONFIG (21): TopicConfigSerializeWrapper of the virtual broker, the masters'
        tables merged (a topic on several groups: queue numbers of its virtual layout)."""
        results = await self._each_master(lambda: Frame(RequestCode.GET_ALL_TOPIC_CONFIG))
        fail = self._failure(cmd, results)
        if fail is not None:
            return fail
        per_topic: dict = {}
        stamp, counter = 0, 0
        for _, r in results:
            body = P.unpack_body(r) if r.bodies else {}
            if not isinstance(body, dict):
                continue
            dv = body.get("dataVersion") or {}
            if isinstance(dv, dict):
                stamp = max(stamp, int(dv.get("timestamp", 0) or 0))
                counter += int(dv.get("counter", 0) or 0)
            for name, cfg in (body.get("topicConfigTable") or {}).items():
                if isinstance(cfg, dict):
                    per_topic.setdefault(str(name), []).append(cfg)
        table = {}
        for name in sorted(per_topic):
            cfgs = per_topic[name]
            c0 = cfgs[0]
            if len(cfgs) == 1:
                read, write = int(c0.get("readQueueNums", 0)), int(c0.get("writeQueueNums", 0))
            else:
                read = write = sum(max(int(c.get("readQueueNums", 0)), int(c.get("writeQueueNums", 0)))
                                   for c in cfgs)
            perm = 0
            for c in cfgs:
                perm |= int(c.get("perm", 6))
            table[name] = topic_config(name, read, write, perm, any(_bool(c.get("order", False)) for c in cfgs),
                                       int(c0.get("topicSysFlag", 0) or 0), str(c0.get("topicFilterType") or ""))
        doc = bean(topicConfigTable=table, dataVersion=data_version(stamp or int(time.time() * 1000), counter))
        return cmd.response(body=to_json(doc).encode())

    async def on_topic_stats(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO (202; topic): TopicStatsTable ``{"offsetTable": {MessageQueue:
        TopicOffset}}``, the virtual broker's global queue ids; lastUpdateTimestamp is the store time
        of the queue's last message (AdminBrokerProcessor.getTopicStatsInfo)."""
        topic = _field(cmd, "topic")
        lay = await self.s.layout(topic)
        if lay is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        per_group = await asyncio.gather(*(self._queue_offsets(g.addr, topic) for g in lay.groups))
        if all(rows is None for rows in per_group):
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        entries = []
        for g, rows in zip(lay.groups, per_group):
            for r in rows or []:
                entries.append((g, int(r["queueId"]), max(int(r.get("minOffset", 0)), 0),
                                max(int(r.get("maxOffset", 0)), 0), r.get("lastUpdateTimestamp")))

        async def last_update(g, q, hi, last) -> int:
            return int(last) if last is not None else await self._store_timestamp(g.addr, topic, q, hi - 1)
        stamps = await asyncio.gather(*(last_update(g, q, hi, last) for g, q, _, hi, last in entries))
        table = JMap()
        for (g, q, lo, hi, _), ts in zip(entries, stamps):
            table.append((message_queue(topic, lay.global_id(g.broker_name, q)),
                          bean(minOffset=lo, maxOffset=hi, lastUpdateTimestamp=ts)))
        table.sort(key=lambda kv: kv[0]["queueId"])
        return cmd.response(body=to_json(bean(offsetTable=table)).encode())

    async def on_consume_stats(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_CONSUME_STATS (208; consumerGroup, topic): ConsumeStats ``{"consumeTps", "offsetTable":
        {MessageQueue: OffsetWrapper}}`` of the topic, or of every topic the group has offsets for
        (AdminBrokerProcessor.getConsumeStats): brokerOffset = the queue's max offset,
        consumerOffset = the committed one (0 if none), lastTimestamp = the store time of the
        last consumed message (0 if none)."""
        group = _field(cmd, "consumerGroup")
        topic = cmd.ext_fields.get("topic") or ""
        masters = await self.s.masters()
        results = await self._each_master(lambda: Frame(RequestCode.GET_ALL_CONSUMER_OFFSET), masters)
        offsets: dict = {}                          # broker name -> {"topic@group": {qid: offset}}
        for name, r in results:
            body = P.unpack_body(r) if r.code == ResponseCode.SUCCESS and r.bodies else {}
            offsets[name] = (body.get("offsetTable") or {}) if isinstance(body, dict) else {}
        suffix = f"@{group}"
        if topic:
            topics = [topic]
        else:
            topics = sorted({k[:-len(suffix)] for t in offsets.values() for k in t if k.endswith(suffix)})
        table = JMap()
        tps = 0.0
        for t in topics:
            lay = await self.s.layout(t)
            if lay is None:
                continue
            rows = await asyncio.gather(*(self._queue_offsets(g.addr, t) for g in lay.groups))
            queues = []
            for g, grows in zip(lay.groups, rows):
                committed = offsets.get(g.broker_name, {}).get(f"{t}{suffix}", {})
                for r in grows or []:
                    q = int(r["queueId"])
                    co = committed.get(str(q), committed.get(q))
                    queues.append((g, q, max(int(r.get("maxOffset", 0)), 0), max(int(co), 0) if co is not None else 0))
            stamps = await asyncio.gather(*(self._store_timestamp(g.addr, t, q, co - 1) for g, q, _, co in queues))
            for (g, q, bo, co), ts in zip(queues, stamps):
                table.append((message_queue(t, lay.global_id(g.broker_name, q)),
                              bean(brokerOffset=bo, consumerOffset=co, lastTimestamp=ts)))
            tps += await self._group_tps(lay, t, group)
        table.sort(key=lambda kv: (kv[0]["topic"], kv[0]["queueId"]))
        return cmd.response(body=to_json(bean(offsetTable=table, consumeTps=float(tps))).encode())

    async def _group_tps(self, lay: Layout, topic: str, group: str) -> float:
        """GROUP_GET_NUMS tps of the last minute (``tpsGroupGetNums``), summed over the groups."""
        key = f"{topic}@{group}"
        out = 0.0
        results = await self._each_master(lambda: Frame(RequestCode.VIEW_BROKER_STATS_DATA, fields={
            "statsName": "GROUP_GET_NUMS", "statsKey": key}), [(g.broker_name, g.addr) for g in lay.groups])
        for _, r in results:
            if r.code == ResponseCode.SUCCESS and r.bodies:
                body = P.unpack_body(r)
                minute = body.get("statsMinute") if isinstance(body, dict) else None
                if isinstance(minute, dict):
                    out += float(minute.get("tps", 0.0) or 0.0)
        return out

    # -- subscription groups -----------------------------------------------------------------------------
    async def on_create_group(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200; body: SubscriptionGroupConfig JSON) on every
        master (or the ``brokerName`` one); AdminBrokerProcessor.updateAndCreateSubscriptionGroup."""
        try:
            cfg = json.loads(cmd.body.decode("utf-8")) if cmd.body else None
        except (UnicodeDecodeError, ValueError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"subscription group body is not JSON: {e}")
        if not isinstance(cfg, dict) or not isinstance(cfg.get("groupName"), str) or not cfg["groupName"]:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                "the body must be a SubscriptionGroupConfig with a groupName")
        group = cfg["groupName"]
        body = P.pack_body({k: cfg[k] for k in GROUP_CONFIG_KEYS if k in cfg})
        targets = await self._masters_or_named(cmd)
        results = await self._each_master(lambda: Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                                        fields={"groupName": group}, bodies=[body]), targets)
        return self._failure(cmd, results) or cmd.response()

    async def on_all_groups(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): SubscriptionGroupWrapper ``{"dataVersion",
        "subscriptionGroupTable": {group: SubscriptionGroupConfig}}``, the masters' union."""
        results = await self._each_master(lambda: Frame(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
        fail = self._failure(cmd, results)
        if fail is not None:
            return fail
        table: dict = {}
        for _, r in results:
            body = P.unpack_body(r) if r.bodies else {}
            groups = body.get("subscriptionGroupTable") if isinstance(body, dict) else None
            for name, cfg in (groups or {}).items():
                if isinstance(cfg, dict) and str(name) not in table:
                    table[str(name)] = group_config(str(name), cfg)
        doc = bean(subscriptionGroupTable={k: table[k] for k in sorted(table)},
                   dataVersion=data_version(int(time.time() * 1000), len(table)))
        return cmd.response(body=to_json(doc).encode())

    async def on_delete_group(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """DELETE_SUBSCRIPTIONGROUP (207; groupName, removeOffset) on every master (or the
        ``brokerName`` one).  rmq keeps the group's offsets whatever ``removeOffset`` says."""
        group = _field(cmd, "groupName")
        targets = await self._masters_or_named(cmd)
        results = await self._each_master(lambda: Frame(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                                        fields={"groupName": group}), targets)
        return self._failure(cmd, results) or cmd.response()

    # -- consumers ---------------------------------------------------------------------------------------
    def _note_heartbeat(self, cmd: RemotingCommand, born_host: str) -> None:
        try:
            data = json.loads(cmd.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return
        client = data.get("clientID") if isinstance(data, dict) else None
        if not isinstance(client, str):
            return
        now = time.monotonic()
        for c in data.get("consumerDataSet") or []:
            if not isinstance(c, dict) or not isinstance(c.get("groupName"), str):
                continue
            _enum(c, "messageModel", dict(enumerate(MESSAGE_MODELS)))
            _enum(c, "consumeType", dict(enumerate(CONSUME_TYPES)))
            _enum(c, "consumeFromWhere", CONSUME_FROM)
            members = self.consumers.setdefault(c["groupName"], {})
            if client not in members:
                if self._cached >= MAX_CACHED_CONSUMERS:
                    self._expire(now)
                    if self._cached >= MAX_CACHED_CONSUMERS:
                        continue
                self._cached += 1
            members[client] = {"seen": now, "clientAddr": born_host, "language": cmd.language,
                               "version": cmd.version, "data": c}

    def _note_unregister(self, cmd: RemotingCommand, born_host: str) -> None:
        group, client = cmd.ext_fields.get("consumerGroup"), cmd.ext_fields.get("clientID")
        if group and client and self.consumers.get(group, {}).pop(client, None) is not None:
            self._cached -= 1

    def _expire(self, now: float) -> None:
        cutoff = now - CONSUMER_EXPIRED_S
        for group in list(self.consumers):
            members = self.consumers[group]
            for client in [c for c, info in members.items() if info["seen"] < cutoff]:
                del members[client]
                self._cached -= 1
            if not members:
                del self.consumers[group]

    async def on_consumer_connection_list(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (203; consumerGroup): ConsumerConnection ``{"connectionSet":
        [Connection], "consumeFromWhere", "consumeType", "messageModel", "subscriptionTable"}``
        of the group's consumers online on any master; CONSUMER_NOT_ONLINE when none is."""
        group = _field(cmd, "consumerGroup")
        results = await self._each_master(lambda: Frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                        fields={"consumerGroup": group}))
        ids: set = set()
        for _, r in results:
            if r.code == ResponseCode.SUCCESS and r.bodies:
                body = P.unpack_body(r)
                if isinstance(body, dict):
                    ids.update(x for x in body.get("consumerIdList") or [] if isinstance(x, str))
        if not ids:
            return cmd.response(CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        self._expire(time.monotonic())
        known = self.consumers.get(group, {})
        conns, subs, latest = [], {}, None
        for cid in sorted(ids):
            info = known.get(cid)
            if info is None:
                conns.append(bean(clientId=cid, clientAddr="", language="PYTHON", version=0))
                continue
            conns.append(bean(clientId=cid, clientAddr=info["clientAddr"], language=info["language"],
                              version=int(info["version"])))
            if latest is None or info["seen"] > latest["seen"]:
                latest = info
            for sd in info["data"].get("subscriptionDataSet") or []:
                if isinstance(sd, dict) and sd.get("topic"):
                    subs[str(sd["topic"])] = subscription_data(sd)
        data = latest["data"] if latest else {}
        doc = bean(connectionSet=conns, subscriptionTable={k: subs[k] for k in sorted(subs)},
                   consumeType=data.get("consumeType"), messageModel=data.get("messageModel"),
                   consumeFromWhere=data.get("consumeFromWhere"))
        return cmd.response(body=to_json(doc).encode())

    # -- the broker ------------------------------------------------------------------------------------
    async def on_runtime_info(self, cmd: RemotingCommand, born_host: str) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (28): KVTable ``{"table": {str: str}}`` of the virtual broker,
        the masters' counters summed (AdminBrokerProcessor.prepareRuntimeInfo's names)."""
        results = await self._each_master(lambda: Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
        tables = []
        for name, r in results:
            body = P.unpack_body(r) if r.code == ResponseCode.SUCCESS and r.bodies else {}
            t = body.get("table") if isinstance(body, dict) else None
            if isinstance(t, dict):
                tables.append((name, t))

        def total(key) -> float:
            return sum(float(t.get(key, 0) or 0) for _, t in tables)
        put_tps, get_tps = total("putTps"), total("getTps")
        boot = min((int(t.get("bootTimestamp", 0) or 0) for _, t in tables), default=0)
        ratio = max((float(t.get("commitLogDiskRatio", -1) or -1) for _, t in tables), default=-1.0)
        kv = {"brokerVersionDesc": VERSION_DESC, "brokerVersion": SERVER_VERSION,
              "msgPutTotalYesterdayMorning": 0, "msgPutTotalTodayMorning": 0,
              "msgPutTotalTodayNow": int(total("putMessageTotal")),
              "msgGetTotalYesterdayMorning": 0, "msgGetTotalTodayMorning": 0,
              "msgGetTotalTodayNow": int(total("getMessageTotal")),
              "putTps": " ".join([f"{put_tps:.2f}"] * 3), "getTransferedTps": " ".join([f"{get_tps:.2f}"] * 3),
              "bootTimestamp": boot, "commitLogDiskRatio": ratio,
              "dispatchBehindBytes": int(total("dispatchBehindBytes")),
              "remainHowManyDataToFlush": int(total("flushBehindBytes")),
              "brokerName": PROXY_BROKER_NAME, "rmqBrokers": ",".join(name for name, _ in tables)}
        return cmd.response(body=to_json(bean(table={k: str(v) for k, v in sorted(kv.items())})).encode())


def admin_handlers(server) -> dict:
    """The admin handlers of ``server`` (a ProxyServer), to merge into its ``handlers``."""
    return ProxyAdmin(server).handlers()


__all__ = ["CONSUMER_NOT_ONLINE", "JMap", "ProxyAdmin", "admin_handlers", "bean", "to_json"]
