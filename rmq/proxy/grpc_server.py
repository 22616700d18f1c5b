"""RocketMQ 5's gRPC API (``apache.rocketmq.v2.MessagingService``) in front of rmq: the official
5.x clients (Java, Go, C#, Python ``rocketmq-python-client``) produce and receive through rmq.

Like RocketMQ 5's proxy in cluster mode, the endpoint (``grpcServerPort``, 8081) is the clients'
access point: routes name one broker, :data:`rmq.proxy.server.PROXY_BROKER_NAME`, at this
endpoint, whose queues are the real broker groups' queues end to end (the remoting proxy's
:class:`rmq.proxy.server.Layout`), and every call is forwarded to rmq's NameServer and brokers
over rmq's own protocol.  Receiving is RocketMQ 5's POP (:mod:`rmq.actors.pop`): the receipt
handle a client acks is the broker's ``extraInfo`` (``startOffset popTime invisibleTime reviveQid
retry brokerName queueId queueOffset``), so an ack goes to the group that holds the message.

Served (the rest answers UNIMPLEMENTED): QueryRoute, Heartbeat, SendMessage (NORMAL, FIFO with
its message group as the sharding key, DELAY as a timer message), QueryAssignment,
ReceiveMessage (server stream: a status, the messages, their delivery timestamp),
AckMessage, ChangeInvisibleDuration, Telemetry (the client's Settings, answered with the
server's; the brokers' transaction check-backs go out on it), NotifyClientTermination, and
transactional messages: as RocketMQ 5's proxy, a half message's producer group is its topic
(``SendMessageActivity``), the heartbeat registers each client for the topics it publishes, a
broker's CHECK_TRANSACTION_STATE becomes a ``RecoverOrphanedTransactionCommand`` on the Telemetry
stream of a client publishing that topic, and EndTransaction goes to the group of the half
(:class:`rmq.proxy.transaction.TransactionRoutes`, keyed by message id).

Concurrency: one asyncio event loop (grpc.aio) in a thread of the proxy process, with its own
forwarding sockets (:class:`rmq.aio.remoting.AsyncRemoting`).
"""
from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time
import zlib
from typing import Optional

import grpc

from rmq import protocol as P
from rmq.client.consumer_api import SubscriptionData, consumer_data
from rmq.client.simple_consumer import CONSUME_TYPE_POP, MAX_MESSAGE_NUM, parse_pop_response, pop_frame
from rmq.common.mix_all import CLIENT_INNER_PRODUCER_GROUP, is_retry_topic, retry_topic
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.common.request_header import SendMessageRequestHeader
from rmq.errors import MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.aio.remoting import AsyncRemoting
from rmq.proxy.grpc_v2 import messaging_pb2 as pb
from rmq._core import commitlog as _cl
from rmq.proxy.server import FORWARD_TIMEOUT_MS, PROXY_BROKER_NAME, ProxyServer
from rmq.proxy.transaction import TransactionRoutes, check_message_body

log = logging.getLogger("rmq.proxy.grpc")

GRPC_SERVER_PORT = 8081                    # ProxyConfig.grpcServerPort
SERVICE = "apache.rocketmq.v2.MessagingService"
CLIENT_ID_HEADER = "x-mq-client-id"        # the 5.x clients' metadata (Signature / MetadataUtils)
MAX_BODY_SIZE = 4 * 1024 * 1024            # Publishing.max_body_size sent to producers (maxMessageSize)
MAX_RECEIVE_BATCH = MAX_MESSAGE_NUM        # messages of one ReceiveMessage (POP's maxMsgNums ceiling)
MAX_PENDING_COMMANDS = 1024                # Telemetry commands queued for one client (check-backs beyond: dropped)
MAX_LONG_POLLING_MS = 30_000               # ProxyConfig.grpcClientConsumerMaxLongPollingTimeoutMillis
DEFAULT_INVISIBLE_MS = 30_000              # a receive without invisible_duration
MAX_MESSAGE_SIZE_ON_WIRE = 16 * 1024 * 1024  # grpc max receive length (a 4 MiB body and its properties)
PRODUCER_MAX_ATTEMPTS = 3                  # RocketMQ 5 proxy: producer retry policy
CONSUMER_MAX_ATTEMPTS = 17                 # maxReconsumeTimes 16 + the first delivery
from rmq.common.message_const import PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX as PROPERTY_UNIQ_KEY  # noqa: E402,F401
# properties that are the message's system properties, not the user's (MessageConst.STRING_HASH_SET)
SYSTEM_PROPERTIES = frozenset({
    "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
    "MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TIMER_DELIVER_MS",
    "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
    "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "TRACE_ON", "MSG_REGION", "__SHARDINGKEY",
    "CLUSTER", "__transactionId__", "TRAN_PREPARED_QUEUE_OFFSET", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "__CRC32#",
    "BORN_HOST"})
UNSUPPORTED_TYPES = (pb.LITE, pb.PRIORITY)
TRANSACTION_PREPARED_TYPE = 0x4            # MessageSysFlag
COMMIT_TYPE, ROLLBACK_TYPE = 0x8, 0xC      # MessageSysFlag: END_TRANSACTION's commitOrRollback
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
# rmq / RocketMQ remoting response code -> RocketMQ 5 status code (the proxy's ResponseCode mapping)
CODES = {int(ResponseCode.TOPIC_NOT_EXIST): pb.TOPIC_NOT_FOUND,
         int(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST): pb.CONSUMER_GROUP_NOT_FOUND,
         int(ResponseCode.MESSAGE_ILLEGAL): pb.BAD_REQUEST,
         int(ResponseCode.NO_PERMISSION): pb.FORBIDDEN,
         int(ResponseCode.FLUSH_DISK_TIMEOUT): pb.MASTER_PERSISTENCE_TIMEOUT,
         int(ResponseCode.FLUSH_SLAVE_TIMEOUT): pb.SLAVE_PERSISTENCE_TIMEOUT,
         int(ResponseCode.SLAVE_NOT_AVAILABLE): pb.HA_NOT_AVAILABLE,
         int(ResponseCode.SYSTEM_BUSY): pb.TOO_MANY_REQUESTS,
         int(ResponseCode.SUBSCRIPTION_PARSE_FAILED): pb.ILLEGAL_FILTER_EXPRESSION}


def status(code=pb.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def _status_of(e: Exception) -> pb.Status:
    if isinstance(e, MQClientError):
        code = CODES.get(int(getattr(e, "response_code", 0) or 0), pb.INTERNAL_ERROR)
        return status(code, str(e))
    if isinstance(e, RemotingError):
        return status(pb.PROXY_TIMEOUT, str(e))
    return status(pb.INTERNAL_ERROR, str(e))


def _ms(d) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def _ts(ms: int):
    from google.protobuf.timestamp_pb2 import Timestamp
    t = Timestamp()
    t.FromMilliseconds(int(ms))
    return t


def _dur(ms: int):
    from google.protobuf.duration_pb2 import Duration
    d = Duration()
    d.FromMilliseconds(int(ms))
    return d


def _props_string(props: dict) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def _peer(context) -> str:
    """The client's ``ip:port`` (a 5.x client's ``born_host`` is its host name, not an address)."""
    peer = context.peer() or ""
    if peer.startswith("ipv4:"):
        return peer[5:]
    return "127.0.0.1:0"


def _host(h) -> str:
    if isinstance(h, (bytes, bytearray)) and len(h) == 8:
        return f"{h[0]}.{h[1]}.{h[2]}.{h[3]}:{int.from_bytes(h[4:8], 'big')}"
    return str(h or "")


class ReceiptHandle:
    """rmq's POP receipt handle (the broker's extraInfo, see the module docstring), parsed.

    Raises
    ------
    ValueError
        Not eight space-separated fields with integers where integers belong.
    """
    __slots__ = ("start_offset", "pop_time", "invisible_time", "revive_qid", "retry", "broker_name", "queue_id",
                 "queue_offset")

    def __init__(self, text: str):
        parts = (text or "").split(" ")
        if len(parts) != 8:
            raise ValueError(f"receipt handle {text!r} is not rmq's (8 fields)")
        so, pt, it, rq, self.retry, self.broker_name, qid, qo = parts
        self.start_offset, self.pop_time, self.invisible_time = int(so), int(pt), int(it)
        self.revive_qid, self.queue_id, self.queue_offset = int(rq), int(qid), int(qo)

    def renewed(self, pop_time: int, invisible_time: int, revive_qid: int) -> str:
        return (f"{self.queue_offset} {pop_time} {invisible_time} {revive_qid} {self.retry} {self.broker_name} "
                f"{self.queue_id} {self.queue_offset}")


class _CheckView:
    """A checked half message in the shape :meth:`MessagingService._message` takes (no receipt handle)."""
    receipt_handle = ""

    def __init__(self, message):
        self.message = message


class _IdLayout:
    """A layout whose only queue id is the one already mapped."""

    def __init__(self, gid: int):
        self.gid = gid

    def global_id(self, broker_name: str, queue_id: int) -> int:
        return self.gid


class MessagingService:
    """The handlers (one per RPC) over a :class:`ProxyServer` used as the forwarding backend."""

    def __init__(self, backend: ProxyServer, endpoint: tuple, acl=None):
        self.b = backend
        self.acl = acl                             # rmq.proxy.acl.PlainAccessValidator, or None
        self.endpoint = endpoint                   # (host, port) clients are sent back to
        self.settings: dict = {}                   # client id -> its last Settings (Telemetry)
        self._rr: dict = {}                        # topic -> next round-robin position
        self.streams: dict = {}                    # client id -> asyncio.Queue of its Telemetry commands
        self.tx = TransactionRoutes()              # message / transaction id -> (addr, group, phys, queue offset)
        self.stats = {"checksRelayed": 0, "checksUnrelayed": 0}

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def client_id(context) -> str:
        for k, v in context.invocation_metadata() or ():
            if k == CLIENT_ID_HEADER:
                return v
        return ""

    def endpoints(self) -> pb.Endpoints:
        host, port = self.endpoint
        return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=port)])

    def broker(self) -> pb.Broker:
        return pb.Broker(name=PROXY_BROKER_NAME, id=0, endpoints=self.endpoints())

    @staticmethod
    def permission(perm: int):
        r, w = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
        return pb.READ_WRITE if r and w else pb.READ if r else pb.WRITE if w else pb.NONE

    async def _layout(self, topic: str):
        lay = await self.b.layout(topic)
        if lay is None:
            raise MQClientError(f"topic {topic} does not exist", int(ResponseCode.TOPIC_NOT_EXIST))
        return lay

    def denied(self, context, need: dict) -> Optional[pb.Status]:
        """None when the call may go on (no ACL, or the client's signature and permissions check:
        :meth:`rmq.proxy.acl.PlainAccessValidator.check_grpc`), else its status: UNAUTHORIZED
        (no / unknown access key, bad signature) or FORBIDDEN (a missing permission)."""
        if self.acl is None:
            return None
        from rmq.proxy.acl import AclError
        try:
            self.acl.check_grpc(dict(context.invocation_metadata() or ()), context.peer() or "", need)
        except AclError as e:
            text = str(e)
            code = pb.FORBIDDEN if text.startswith(("No default permission", "Need admin")) else pb.UNAUTHORIZED
            return status(code, text)
        return None

    # -- routes, heartbeats, settings ------------------------------------------------------------------
    async def QueryRoute(self, request, context):
        topic = request.topic
        try:
            lay = await self._layout(topic.name)
        except Exception as e:  # noqa: BLE001 - answered as a status
            return pb.QueryRouteResponse(status=_status_of(e))
        queues, base = [], 0
        types = list(ACCEPTED_TYPES)
        for g in lay.groups:
            for q in range(g.span):
                queues.append(pb.MessageQueue(topic=topic, id=base + q, permission=self.permission(g.perm),
                                              broker=self.broker(), accept_message_types=types))
            base += g.span
        return pb.QueryRouteResponse(status=status(), message_queues=queues)

    async def QueryAssignment(self, request, context):
        """One assignment per broker group (its first queue): POP receives from all its queues."""
        try:
            lay = await self._layout(request.topic.name)
        except Exception as e:  # noqa: BLE001
            return pb.QueryAssignmentResponse(status=_status_of(e))
        out, base = [], 0
        for g in lay.groups:
            if g.perm & PERM_READ:
                out.append(pb.Assignment(message_queue=pb.MessageQueue(
                    topic=request.topic, id=base, permission=self.permission(g.perm), broker=self.broker(),
                    accept_message_types=list(ACCEPTED_TYPES))))
            base += g.span
        return pb.QueryAssignmentResponse(status=status(), assignments=out)

    def _heartbeat_body(self, client_id: str, client_type: int, group: str) -> Optional[bytes]:
        if client_type == pb.PRODUCER:
            # a half message's producer group is its topic (RocketMQ 5 proxy): the client is a
            # producer of every topic it publishes, where the brokers' check-backs look for it
            s = self.settings.get(client_id)
            groups = [t.name for t in s.publishing.topics] if s is not None and s.HasField("publishing") else []
            return P.pack_body({"clientID": client_id, "consumerDataSet": [],
                                "producerDataSet": [{"groupName": g} for g in (groups or [group or
                                                                                       "CLIENT_INNER_PRODUCER"])]})
        if client_type in (pb.SIMPLE_CONSUMER, pb.PUSH_CONSUMER) and group:
            subs = []
            s = self.settings.get(client_id)
            if s is not None and s.HasField("subscription"):
                for e in s.subscription.subscriptions:
                    subs.append(SubscriptionData.build(e.topic.name, self._selector(e.expression)))
            data = consumer_data(group, CONSUME_TYPE_POP, "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", subs)
            return P.pack_body({"clientID": client_id, "consumerDataSet": [data], "producerDataSet": []})
        return None

    async def Heartbeat(self, request, context):
        cid = self.client_id(context)
        if not cid:
            return pb.HeartbeatResponse(status=status(pb.CLIENT_ID_REQUIRED, f"no {CLIENT_ID_HEADER} metadata"))
        body = self._heartbeat_body(cid, request.client_type, request.group.name if request.HasField("group") else "")
        if body is not None:
            resps = await self.b._to_masters(lambda: Frame(RequestCode.HEART_BEAT, bodies=[body]))
            for r in resps:
                if r.code != ResponseCode.SUCCESS:
                    return pb.HeartbeatResponse(status=status(CODES.get(int(r.code), pb.INTERNAL_ERROR), r.remark or ""))
        return pb.HeartbeatResponse(status=status())

    def _server_settings(self, s) -> pb.Settings:
        """The settings a client gets back (RocketMQ 5 proxy: its retry policy, body limit, and the
        client's own subscription / publishing)."""
        out = pb.Settings()
        out.CopyFrom(s)
        if s.client_type == pb.PRODUCER:
            out.backoff_policy.CopyFrom(pb.RetryPolicy(max_attempts=PRODUCER_MAX_ATTEMPTS, exponential_backoff=pb.ExponentialBackoff(
                initial=_dur(10), max=_dur(1000), multiplier=2.0)))
            out.publishing.max_body_size = MAX_BODY_SIZE       # a reply without it: every send fails
        else:
            levels = [1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
                      480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000]
            out.backoff_policy.CopyFrom(pb.RetryPolicy(max_attempts=CONSUMER_MAX_ATTEMPTS,
                                                       customized_backoff=pb.CustomizedBackoff(
                                                           next=[_dur(ms) for ms in levels])))
            if s.HasField("subscription"):
                out.subscription.receive_batch_size = min(out.subscription.receive_batch_size or MAX_RECEIVE_BATCH,
                                                          MAX_RECEIVE_BATCH)
                if not out.subscription.HasField("long_polling_timeout"):
                    out.subscription.long_polling_timeout.CopyFrom(_dur(20_000))
        return out

    async def Telemetry(self, request_iterator, context):
        """The client's settings in, the server's settings and transaction check-backs out."""
        cid = self.client_id(context)
        out: asyncio.Queue = asyncio.Queue(maxsize=MAX_PENDING_COMMANDS)
        self.streams[cid] = out

        async def read():
            try:
                async for cmd in request_iterator:
                    if cmd.HasField("settings"):
                        refused = self.denied(context, settings_needs(cmd.settings))
                        if refused is not None:
                            out.put_nowait(pb.TelemetryCommand(status=refused))
                            break
                        self.settings[cid] = cmd.settings
                        out.put_nowait(pb.TelemetryCommand(status=status(), settings=self._server_settings(cmd.settings)))
                    # thread stack traces / verify results the proxy never asked for: nothing to answer
            finally:
                done.set()
        done = asyncio.Event()
        reader = asyncio.get_running_loop().create_task(read())
        ended = asyncio.get_running_loop().create_task(done.wait())
        try:
            while True:
                getter = asyncio.ensure_future(out.get())
                await asyncio.wait((getter, ended), return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                await context.write(getter.result())
        finally:
            reader.cancel()
            ended.cancel()
            if self.streams.get(cid) is out:
                # the client is gone (or reconnects and sends its settings again): forget them, so a
                # proxy that outlives many clients keeps no state of theirs
                del self.streams[cid]
                self.settings.pop(cid, None)

    async def NotifyClientTermination(self, request, context):
        cid = self.client_id(context)
        s = self.settings.pop(cid, None)
        fields = {"clientID": cid}
        group = request.group.name if request.HasField("group") else ""
        if group:
            fields["producerGroup" if s is not None and s.client_type == pb.PRODUCER else "consumerGroup"] = group
        await self.b._to_masters(lambda: Frame(RequestCode.UNREGISTER_CLIENT, fields=dict(fields)))
        return pb.NotifyClientTerminationResponse(status=status())

    # -- sending ------------------------------------------------------------------------------------------
    async def SendMessage(self, request, context):
        entries = []
        for m in request.messages:
            try:
                entries.append(await self._send_one(m, context))
            except Exception as e:  # noqa: BLE001 - one status per message
                entries.append(pb.SendResultEntry(status=_status_of(e)))
        first_bad = next((e.status for e in entries if e.status.code != pb.OK), None)
        return pb.SendMessageResponse(status=first_bad or status(), entries=entries)

    async def _send_one(self, m, context) -> pb.SendResultEntry:
        sp = m.system_properties
        if sp.message_type in UNSUPPORTED_TYPES:
            return pb.SendResultEntry(status=status(pb.UNSUPPORTED, f"message type {pb.MessageType.Name(sp.message_type)}"
                                                    " is not served by rmq's gRPC endpoint"))
        body = m.body
        if sp.body_encoding == pb.GZIP:
            try:
                body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else zlib.decompress(body)
            except (OSError, zlib.error, EOFError) as e:
                return pb.SendResultEntry(status=status(pb.MESSAGE_CORRUPTED, f"body is not GZIP: {e}"))
        if not body:
            return pb.SendResultEntry(status=status(pb.MESSAGE_BODY_EMPTY, "message body is empty"))
        if not sp.message_id.strip():
            return pb.SendResultEntry(status=status(pb.ILLEGAL_MESSAGE_ID, "message id cannot be empty"))
        if len(body) > MAX_BODY_SIZE:
            return pb.SendResultEntry(status=status(pb.MESSAGE_BODY_TOO_LARGE,
                                                    f"body of {len(body)} bytes is over {MAX_BODY_SIZE}"))
        props = {}
        for k, v in m.user_properties.items():
            if k in SYSTEM_PROPERTIES or "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
                return pb.SendResultEntry(status=status(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {k!r} is reserved "
                                                        "or holds a separator character"))
            props[k] = v
        if sp.HasField("tag"):
            props["TAGS"] = sp.tag
        if sp.keys:
            props["KEYS"] = " ".join(sp.keys)
        if sp.message_id:
            props[PROPERTY_UNIQ_KEY] = sp.message_id
        if sp.HasField("message_group"):
            props[PROPERTY_SHARDING_KEY] = sp.message_group
        if sp.message_type == pb.DELAY or sp.HasField("delivery_timestamp"):
            props[PROPERTY_TIMER_DELIVER_MS] = str(sp.delivery_timestamp.ToMilliseconds())
        topic = m.topic.name
        sys_flag = 0
        if sp.message_type == pb.TRANSACTION:
            sys_flag = TRANSACTION_PREPARED_TYPE
            props["TRAN_MSG"] = "true"
            props["PGROUP"] = topic                 # the producer group of a half (SendMessageActivity)
            if sp.HasField("orphaned_transaction_recovery_duration"):
                props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = str(sp.orphaned_transaction_recovery_duration.seconds)
        lay = await self._layout(topic)
        group, qid = lay.locate(self._select_queue(topic, lay, sp))
        h = SendMessageRequestHeader(CLIENT_INNER_PRODUCER_GROUP, topic, qid, sys_flag, properties=_props_string(props),
                                     default_topic_queue_nums=group.span, born_host=_peer(context))
        h.born_timestamp = sp.born_timestamp.ToMilliseconds() or h.born_timestamp
        resp = await self.b._invoke(group.addr, Frame(RequestCode.SEND_MESSAGE, fields=h.to_fields(), bodies=[body]))
        if resp.code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                             ResponseCode.SLAVE_NOT_AVAILABLE):
            raise MQClientError(resp.remark or f"send failed with code {resp.code}", int(resp.code))
        st = status() if resp.code == ResponseCode.SUCCESS else status(CODES.get(int(resp.code), pb.INTERNAL_ERROR),
                                                                       resp.remark or "")
        if sys_flag:
            try:
                phys = _cl.decode_message_id(str(resp.fields.get("msgId", "")))[1]
            except (ValueError, TypeError):
                phys = -1
            self.tx.remember(sp.message_id, (group.addr, topic, phys, int(resp.fields.get("queueOffset", -1))))
        return pb.SendResultEntry(status=st, message_id=sp.message_id or str(resp.fields.get("msgId", "")),
                                  transaction_id=str(resp.fields.get("transactionId", "") or ""),
                                  offset=int(resp.fields.get("queueOffset", 0)))

    def _select_queue(self, topic: str, lay, sp) -> int:
        """The global queue id a message goes to: a FIFO message group always to the same queue
        (CRC32 of the group), the rest round robin over the writable queues (RocketMQ 5 proxy's
        SendMessageQueueSelector; a 5.x client does not send the queue it chose)."""
        writable, base = [], 0
        for g in lay.groups:
            if g.perm & PERM_WRITE:
                writable.extend(range(base, base + g.span))
            base += g.span
        if not writable:
            raise MQClientError(f"topic {topic} has no writable queue", int(ResponseCode.NO_PERMISSION))
        if sp.HasField("message_group"):
            return writable[zlib.crc32(sp.message_group.encode("utf-8")) % len(writable)]
        n = self._rr.get(topic, zlib.crc32(topic.encode("utf-8")))
        self._rr[topic] = n + 1
        return writable[n % len(writable)]

    async def EndTransaction(self, request, context):
        """COMMIT / ROLLBACK of a half message (``source`` SOURCE_SERVER_CHECK: the answer to a
        check-back) as END_TRANSACTION to the broker group that holds it."""
        route = self.tx.lookup(request.message_id, request.transaction_id)
        if route is None:
            return pb.EndTransactionResponse(status=status(pb.INVALID_TRANSACTION_ID, (
                f"transaction {request.transaction_id or request.message_id!r} is not known here (sent through "
                "another proxy, or already ended); the broker's check-back will settle it")))
        if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
            return pb.EndTransactionResponse(status=status(pb.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK"))
        addr, group, phys, queue_offset = route
        fields = {"producerGroup": group, "tranStateTableOffset": queue_offset, "commitLogOffset": phys,
                  "commitOrRollback": COMMIT_TYPE if request.resolution == pb.COMMIT else ROLLBACK_TYPE,
                  "fromTransactionCheck": request.source == pb.SOURCE_SERVER_CHECK,
                  "msgId": request.message_id, "transactionId": request.transaction_id or request.message_id}
        try:
            resp = await self.b._invoke(addr, Frame(RequestCode.END_TRANSACTION, fields=fields))
        except Exception as e:  # noqa: BLE001
            return pb.EndTransactionResponse(status=_status_of(e))
        if resp.code != ResponseCode.SUCCESS:
            return pb.EndTransactionResponse(status=status(CODES.get(int(resp.code), pb.INTERNAL_ERROR),
                                                           resp.remark or f"end transaction failed ({resp.code})"))
        self.tx.forget(request.message_id, request.transaction_id)
        return pb.EndTransactionResponse(status=status())

    def on_broker_request(self, frame: Frame, addr: str) -> None:
        """A broker's CHECK_TRANSACTION_STATE for a producer group (a topic): a
        RecoverOrphanedTransactionCommand on the Telemetry stream of a client publishing it."""
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE or not frame.bodies:
            return
        f = frame.fields
        group = str(f.get("producerGroup", ""))
        clients = [cid for cid, s in self.settings.items() if cid in self.streams and s.HasField("publishing")
                   and any(t.name == group for t in s.publishing.topics)]
        try:
            (m,) = _cl.decode_records(check_message_body(bytes(frame.bodies[0])))
        except ValueError as e:
            log.warning("check-back of %s: %s", f.get("transactionId"), e)
            clients = []
        if not clients:
            self.stats["checksUnrelayed"] += 1
            return
        msg_id = (m.properties or {}).get(PROPERTY_UNIQ_KEY) or str(f.get("msgId", ""))
        self.tx.remember(msg_id, (addr, group, int(f.get("commitLogOffset", -1)), int(f.get("tranStateTableOffset", -1))))
        self._rr[("check", group)] = n = self._rr.get(("check", group), 0) + 1
        cid = clients[n % len(clients)]
        lay = self.b._layouts.get(m.topic)
        gid = m.queue_id
        if lay is not None:
            g = next((g for g in lay.groups if g.addr == addr), None)
            if g is not None:
                gid = lay.global_id(g.broker_name, m.queue_id)
        view = _CheckView(m)
        msg = self._message(pb.Resource(name=m.topic), _IdLayout(gid), None, view, 0)
        try:
            self.streams[cid].put_nowait(pb.TelemetryCommand(
                recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                    message=msg, transaction_id=str(f.get("transactionId", "") or msg_id))))
            self.stats["checksRelayed"] += 1
        except asyncio.QueueFull:
            self.stats["checksUnrelayed"] += 1

    # -- receiving -------------------------------------------------------------------------------------------
    @staticmethod
    def _selector(expr) -> str:
        if expr.type == pb.SQL:
            from rmq.filter import MessageSelector
            return MessageSelector.by_sql(expr.expression)
        return expr.expression or "*"

    async def ReceiveMessage(self, request, context):
        group = request.group.name
        topic = request.message_queue.topic.name
        try:
            if not group:
                raise MQClientError("ReceiveMessage needs a consumer group", int(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST))
            lay = await self._layout(topic)
            sub = SubscriptionData.build(topic, self._selector(request.filter_expression))
            n = request.batch_size or MAX_RECEIVE_BATCH
            if not 1 <= n <= MAX_RECEIVE_BATCH:
                yield pb.ReceiveMessageResponse(status=status(pb.BAD_REQUEST, f"batch_size {n} is outside "
                                                                              f"1..{MAX_RECEIVE_BATCH}"))
                return
            invisible = _ms(request.invisible_duration) if request.HasField("invisible_duration") else \
                DEFAULT_INVISIBLE_MS
            poll = min(_ms(request.long_polling_timeout), MAX_LONG_POLLING_MS) \
                if request.HasField("long_polling_timeout") else 0
            mq_id = request.message_queue.id
            groups = [lay.locate(mq_id)[0]] if 0 <= mq_id < lay.total else list(lay.groups)
            views = []
            for i, g in enumerate(groups):
                wait = poll if i == len(groups) - 1 else 0
                resp = await self.b._invoke(g.addr, pop_frame(group, sub, n, invisible, wait), wait + FORWARD_TIMEOUT_MS)
                got, dropped = parse_pop_response(resp, sub, g.addr)
                for v in dropped:                    # a tag-hash collision: not this subscription's
                    await self._ack(group, topic, v.receipt_handle)
                if got:
                    views = [(g, v) for v in got]
                    break
        except Exception as e:  # noqa: BLE001 - a status on the stream
            yield pb.ReceiveMessageResponse(status=_status_of(e))
            return
        if not views:
            yield pb.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield pb.ReceiveMessageResponse(status=status())
        now = int(time.time() * 1000)
        for g, v in views:
            yield pb.ReceiveMessageResponse(message=self._message(request.message_queue.topic, lay, g, v, invisible))
        yield pb.ReceiveMessageResponse(delivery_timestamp=_ts(now))

    def _message(self, topic, lay, g, v, invisible_ms: int) -> pb.Message:
        m = v.message
        props = m.properties or {}
        body = bytes(m.body)
        sp = pb.SystemProperties(
            keys=[k for k in (props.get("KEYS") or "").split(" ") if k],
            message_id=props.get(PROPERTY_UNIQ_KEY) or m.offset_msg_id,
            body_digest=pb.Digest(type=pb.CRC32, checksum=format(zlib.crc32(body) & 0xFFFFFFFF, "08X")),
            body_encoding=pb.IDENTITY,
            message_type=pb.FIFO if PROPERTY_SHARDING_KEY in props else
            pb.DELAY if PROPERTY_TIMER_DELIVER_MS in props else pb.NORMAL,
            born_timestamp=_ts(m.born_timestamp), born_host=_host(m.born_host),
            store_timestamp=_ts(m.store_timestamp), store_host=_host(m.store_host),
            receipt_handle=v.receipt_handle, queue_id=lay.global_id(g.broker_name if g else "", m.queue_id),
            queue_offset=m.queue_offset, invisible_duration=_dur(invisible_ms),
            delivery_attempt=m.reconsume_times + 1)
        if props.get("TAGS"):
            sp.tag = props["TAGS"]
        if PROPERTY_SHARDING_KEY in props:
            sp.message_group = props[PROPERTY_SHARDING_KEY]
        if PROPERTY_TIMER_DELIVER_MS in props and str(props[PROPERTY_TIMER_DELIVER_MS]).isdigit():
            sp.delivery_timestamp.CopyFrom(_ts(int(props[PROPERTY_TIMER_DELIVER_MS])))
        user = {k: str(val) for k, val in props.items() if k not in SYSTEM_PROPERTIES}
        return pb.Message(topic=topic, user_properties=user, system_properties=sp, body=body)

    async def _broker_addr(self, broker_name: str) -> str:
        for name, addr in await self.b.masters():
            if name == broker_name:
                return addr
        raise MQClientError(f"no master of broker group {broker_name!r}", int(ResponseCode.SYSTEM_ERROR))

    async def _ack(self, group: str, topic: str, handle_text: str) -> pb.Status:
        try:
            h = ReceiptHandle(handle_text)
        except ValueError as e:
            return status(pb.INVALID_RECEIPT_HANDLE, str(e))
        try:
            addr = await self._broker_addr(h.broker_name)
            resp = await self.b._invoke(addr, Frame(RequestCode.ACK_MESSAGE, fields={
                "consumerGroup": group, "topic": topic, "queueId": h.queue_id, "offset": h.queue_offset,
                "extraInfo": handle_text}))
        except Exception as e:  # noqa: BLE001
            return _status_of(e)
        if resp.code != ResponseCode.SUCCESS:
            return status(pb.INVALID_RECEIPT_HANDLE if resp.code == ResponseCode.NO_MESSAGE else
                          CODES.get(int(resp.code), pb.INTERNAL_ERROR), resp.remark or f"ack failed ({resp.code})")
        return status()

    async def AckMessage(self, request, context):
        group, topic = request.group.name, request.topic.name
        results = await asyncio.gather(*(self._ack(group, topic, e.receipt_handle) for e in request.entries))
        entries = [pb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=s)
                   for e, s in zip(request.entries, results)]
        first_bad = next((s for s in results if s.code != pb.OK), None)
        return pb.AckMessageResponse(status=first_bad or status(), entries=entries)

    async def ChangeInvisibleDuration(self, request, context):
        try:
            h = ReceiptHandle(request.receipt_handle)
        except ValueError as e:
            return pb.ChangeInvisibleDurationResponse(status=status(pb.INVALID_RECEIPT_HANDLE, str(e)))
        invisible = _ms(request.invisible_duration)
        try:
            addr = await self._broker_addr(h.broker_name)
            resp = await self.b._invoke(addr, Frame(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields={
                "consumerGroup": request.group.name, "topic": request.topic.name, "queueId": h.queue_id,
                "offset": h.queue_offset, "extraInfo": request.receipt_handle, "invisibleTime": invisible}))
        except Exception as e:  # noqa: BLE001
            return pb.ChangeInvisibleDurationResponse(status=_status_of(e))
        if resp.code != ResponseCode.SUCCESS:
            return pb.ChangeInvisibleDurationResponse(status=status(
                pb.INVALID_RECEIPT_HANDLE if resp.code == ResponseCode.NO_MESSAGE else
                CODES.get(int(resp.code), pb.INTERNAL_ERROR), resp.remark or f"failed ({resp.code})"))
        f = resp.fields
        return pb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=h.renewed(
            int(f["popTime"]), int(f["invisibleTime"]), int(f["reviveQid"])))


def _group(name: str) -> str:
    return retry_topic(name)


def settings_needs(s) -> dict:
    """ACL resources of a client's Settings: PUB on the topics it publishes, SUB on the topics it
    subscribes and on its group."""
    from rmq.proxy.acl import PUB, SUB
    need = {}
    if s.HasField("publishing"):
        for t in s.publishing.topics:
            need[t.name] = PUB
    if s.HasField("subscription"):
        if s.subscription.HasField("group"):
            need[_group(s.subscription.group.name)] = SUB
        for e in s.subscription.subscriptions:
            need[e.topic.name] = SUB
    return need


def _needs() -> dict:
    """RPC name -> the ACL resources of its request (RocketMQ 5 ``PlainAccessResource.parse`` of the
    gRPC requests: PUB to send / end a transaction, SUB and the group's SUB to receive / ack /
    change the invisible time / query assignments, ANY to read a route)."""
    from rmq.proxy.acl import ANY, PUB, SUB

    def sends(r):
        return {m.topic.name: SUB if is_retry_topic(m.topic.name) else PUB for m in r.messages}

    def consume(topic, group):
        return {topic: SUB, _group(group): SUB}
    return {
        "QueryRoute": lambda r: {r.topic.name: ANY},
        "Heartbeat": lambda r: {_group(r.group.name): SUB} if r.HasField("group") and r.group.name and
        r.client_type != pb.PRODUCER else {},
        "SendMessage": sends,
        "QueryAssignment": lambda r: consume(r.topic.name, r.group.name),
        "ReceiveMessage": lambda r: consume(r.message_queue.topic.name, r.group.name),
        "AckMessage": lambda r: consume(r.topic.name, r.group.name),
        "ChangeInvisibleDuration": lambda r: consume(r.topic.name, r.group.name),
        "EndTransaction": lambda r: {r.topic.name: PUB},
        "NotifyClientTermination": lambda r: {},
    }


def _guarded(svc: MessagingService, name: str, fn, resp_cls, stream: bool = False):
    """``fn`` with the ACL check in front (nothing when the service has no ACL)."""
    need_of = _needs().get(name)
    if svc.acl is None or need_of is None:
        return fn
    if stream:
        async def guarded_stream(request, context):
            refused = svc.denied(context, need_of(request))
            if refused is not None:
                yield resp_cls(status=refused)
                return
            async for item in fn(request, context):
                yield item
        return guarded_stream

    async def guarded(request, context):
        refused = svc.denied(context, need_of(request))
        if refused is not None:
            return resp_cls(status=refused)
        return await fn(request, context)
    return guarded


def _handlers(svc: MessagingService) -> grpc.GenericRpcHandler:
    def unary(fn, req, resp):
        fn = _guarded(svc, fn.__name__, fn, resp)
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                   response_serializer=resp.SerializeToString)
    methods = {
        "QueryRoute": unary(svc.QueryRoute, pb.QueryRouteRequest, pb.QueryRouteResponse),
        "Heartbeat": unary(svc.Heartbeat, pb.HeartbeatRequest, pb.HeartbeatResponse),
        "SendMessage": unary(svc.SendMessage, pb.SendMessageRequest, pb.SendMessageResponse),
        "QueryAssignment": unary(svc.QueryAssignment, pb.QueryAssignmentRequest, pb.QueryAssignmentResponse),
        "ReceiveMessage": grpc.unary_stream_rpc_method_handler(
            _guarded(svc, "ReceiveMessage", svc.ReceiveMessage, pb.ReceiveMessageResponse, stream=True),
            request_deserializer=pb.ReceiveMessageRequest.FromString,
            response_serializer=pb.ReceiveMessageResponse.SerializeToString),
        "AckMessage": unary(svc.AckMessage, pb.AckMessageRequest, pb.AckMessageResponse),
        "EndTransaction": unary(svc.EndTransaction, pb.EndTransactionRequest, pb.EndTransactionResponse),
        "Telemetry": grpc.stream_stream_rpc_method_handler(
            svc.Telemetry, request_deserializer=pb.TelemetryCommand.FromString,
            response_serializer=pb.TelemetryCommand.SerializeToString),
        "NotifyClientTermination": unary(svc.NotifyClientTermination, pb.NotifyClientTerminationRequest,
                                         pb.NotifyClientTerminationResponse),
        "ChangeInvisibleDuration": unary(svc.ChangeInvisibleDuration, pb.ChangeInvisibleDurationRequest,
                                         pb.ChangeInvisibleDurationResponse),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


class GrpcProxy:
    """The gRPC endpoint in a thread of its own (its own event loop and forwarding sockets).

    Parameters
    ----------
    namesrv_addr : str
        rmq NameServer address(es).
    listen_addr, listen_port : str, int
        Where to listen (port 0: any free one; :attr:`port` after :meth:`start`).
    acl : rmq.proxy.acl.PlainAccessValidator, optional
        ACL 1.0 for the 5.x clients (their ``authorization`` metadata; the remoting port's accounts).

    Raises
    ------
    OSError
        From :meth:`start`: the port cannot be bound.
    """

    def __init__(self, namesrv_addr: str, listen_addr: str = "127.0.0.1", listen_port: int = GRPC_SERVER_PORT,
                 auth=None, acl=None):
        self.namesrv_addr, self.listen_addr, self.port = namesrv_addr, listen_addr, int(listen_port)
        self.auth = auth
        self.acl = acl
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop: Optional[asyncio.Event] = None
        self.service: Optional[MessagingService] = None

    def start(self, timeout_s: float = 30.0) -> "GrpcProxy":
        ready, box = threading.Event(), {}

        async def main():
            backend = ProxyServer(self.namesrv_addr, auth=self.auth)
            holder = {}
            backend.remoting = AsyncRemoting(auth=self.auth,
                                             on_request=lambda fr, addr: holder["svc"].on_broker_request(fr, addr))
            server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_SIZE_ON_WIRE),
                                              ("grpc.max_send_message_length", MAX_MESSAGE_SIZE_ON_WIRE),
                                              ("grpc.so_reuseport", 0)])
            try:
                port = server.add_insecure_port(f"{self.listen_addr}:{self.port}")
            except RuntimeError as e:
                box["error"] = OSError(f"cannot bind {self.listen_addr}:{self.port}: {e}")
                ready.set()
                return
            self.port = port
            self.service = holder["svc"] = MessagingService(backend, (self.listen_addr, port), self.acl)
            server.add_generic_rpc_handlers((_handlers(self.service),))
            await server.start()
            self._stop = asyncio.Event()
            ready.set()
            try:
                await self._stop.wait()
            finally:
                await server.stop(1.0)
                await backend.remoting.close()

        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            except Exception as e:  # noqa: BLE001 - reported to start()
                box["error"] = e
                ready.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="rmq-proxy-grpc", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise OSError(f"the gRPC endpoint did not start within {timeout_s} s")
        if "error" in box:
            raise box["error"] if isinstance(box["error"], OSError) else OSError(str(box["error"]))
        log.info("gRPC endpoint (apache.rocketmq.v2.MessagingService) listening on %s:%d", self.listen_addr, self.port)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)


__all__ = ["GrpcProxy", "MessagingService", "ReceiptHandle", "GRPC_SERVER_PORT", "MAX_BODY_SIZE",
           "MAX_RECEIVE_BATCH", "MAX_LONG_POLLING_MS", "DEFAULT_INVISIBLE_MS"]
