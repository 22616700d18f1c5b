"""Broker actor: the write path, the pull path and the broker's tables (RocketMQ BrokerController).

Responsibility
    Replaces RocketMQ's ``SendMessageProcessor``, ``PullMessageProcessor`` (+
    ``PullRequestHoldService``), ``QueryMessageProcessor``, ``AdminBrokerProcessor``,
    ``ClientManageProcessor`` and ``ConsumerOffsetManager``.  The broker is the
    only writer of the CommitLog: it recovers the store at start (normal or
    abnormal recovery, SPEC.md §5) and appends every batch in one Cython call.
    ConsumeQueues and IndexFiles are written by the reput actor; the broker maps
    them read-only as reput announces them.

Sockets
    ROUTER ``tcp://127.0.0.1:LISTEN_PORT``: clients (send, pull, query, offsets, admin).
    ROUTER ``ipc://STORE/broker.ipc``: internal actors (reput, flush, cleaner) send
    one-way DISPATCH_ANNOUNCE / FLUSH_ANNOUNCE / CLEAN_ANNOUNCE here.
    PUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, flushed} after every
    poll that appended (and every 200 ms), to reput and flush.
    DEALER per NameServer: REGISTER_BROKER every 30 s and on topic changes.

Files
    Writes ``commitlog/*``, ``config/{topics,consumerOffset,subscriptionGroup}.json``
    and the ``abort`` file; reads ``consumequeue/`` and ``index/``.

Timers
    register with NameServers 30 000 ms; consumer offsets persisted 5 000 ms
    (flushConsumerOffsetInterval); parked pulls and sync-flush sends expired
    every 10 ms; client channels idle > 120 s dropped every 10 s; stats every 1 s.

Failure behaviour
    Bad requests get RocketMQ's response codes with a remark and change
    nothing; a handler exception gets SYSTEM_ERROR and the broker keeps serving.
    SYNC_FLUSH sends are answered only once the flush actor reports their end
    offset durable (FLUSH_DISK_TIMEOUT after syncFlushTimeout).  On SIGTERM the
    broker stops serving clients, answers what is parked, persists offsets and
    exits 0; the supervisor then stops reput and flush, which finish their work.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import deque
from typing import Optional

import zmq

from rmq import latency_trace as _lt
from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq.actors.actor import Actor, Reply
from rmq.actors.pop import REVIVE_SCAN_MS, PopService
from rmq.actors.transaction import HALF_TOPIC, TransactionService, half_properties, is_half_request
from rmq.actors.timer import TimerService
from rmq.broker_conf import actor_settings
from rmq import metrics as M
from rmq.errors import FilterExpressionError
from rmq.filter import ExpressionType, compile_sql92
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, field_int, field_str, pack_body, unpack_body
from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.stats import STATS_NAMES, WINDOWS, BrokerStats
from rmq.store.cleaner import disk_usage_ratio
from rmq.store.commitlog import host_to_bytes
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.config_manager import write_file_atomically
from rmq.store.epoch import EPOCH_FILE, EpochEntry, EpochFile
from rmq.store.message_store import write_truncate_marker
from rmq.store.config_manager import DEFAULT_QUEUE_NUMS, PERM_READ, PERM_WRITE
from rmq.store.message_store import MessageStore
from rmq.store.schedule import transform_delay
from rmq.store.timer import TimerMessageError, is_timer_message, transform_timer
from rmq.store.validators import MAX_QUEUE_NUMS, check_group, check_topic
from rmq._core.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_TYPE_MASK

VERSION = "rmq-0.1"
REGISTER_NAME_SERVER_PERIOD_MS = 30_000      # registerNameServerPeriod
FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 5_000    # flushConsumerOffsetInterval
BROKER_SUSPEND_MAX_TIME_MS = 15_000          # long-poll ceiling (SPEC.md §13.3)
CHANNEL_EXPIRED_MS = 120_000                 # idle producer/consumer dropped (SPEC.md §15.2)
CHANNEL_SCAN_MS = 10_000
HOLD_CHECK_MS = 10                           # expiry of parked pulls / sends
APPEND_REANNOUNCE_MS = 200
STATS_INTERVAL_MS = 1000
MAX_PULL_BATCH = 4096                        # maxMsgNums ceiling per pull (rmq limit)
MAX_QUEUE_OFFSET = 2 ** 63 - 1               # queue offsets are Java longs
JAVA_LONG_MIN, JAVA_LONG_MAX = -(2 ** 63), 2 ** 63 - 1   # bounds of a long header field (timestamps)
SCHEDULE_DELIVER_INTERVAL_MS = 100           # DELAY_FOR_A_WHILE (SPEC.md §10.3)
FLUSH_DELAY_OFFSET_INTERVAL_MS = 10_000      # flushDelayOffsetInterval
REBALANCE_LOCK_MAX_LIVE_TIME_MS = 60_000     # rocketmq.broker.rebalance.lockMaxLiveTime (SPEC.md §15.2)
MAX_RECONSUME_TIMES_DEFAULT = 16
SLAVE_SYNC_INTERVAL_MS = 10_000              # SlaveSynchronize: offsets, topics, groups from the master
                                             # (rmq property slaveSyncInterval, ms)
PROMOTE_WAIT_MS = 10_000                     # promotion waits this long for reput to catch up
PROMOTE_MASTER_PROBE_MS = 1_000              # a promotion asks the master itself for its CommitLog end;
                                             # no answer within this long = the master is unreachable
PROBE_OPAQUE_BASE = 1 << 30                  # opaques of promotion probes on the master socket (sync
                                             # requests use their request code as opaque)
HA_ROLE_FILE = "haRole.json"                 # config/haRole.json: role and id set by a promotion
EXIT_RESTART_GROUP = 75                      # broker exit code: restart the group (after HA_TRUNCATE)
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
# broker.conf keys UPDATE_BROKER_CONFIG may change at runtime (RocketMQ CVE-2023-33246 / 37582:
# never filter-server or path settings); brokerRole + brokerId together promote a slave
RUNTIME_CONFIG_KEYS = frozenset({"brokerRole", "brokerId", "brokerPermission", "slaveReadEnable",
                                 "longPollingEnable", "autoCreateTopicEnable", "autoCreateSubscriptionGroup",
                                 "wakePullOnAppendEnable", "enablePropertyFilter"})
RECENT_APPENDS_PER_QUEUE = 256               # appends per queue the broker remembers until reput has
                                             # dispatched them (pulls ahead of the ConsumeQueue are served
                                             # from them); beyond it the oldest are left to reput

# PullSysFlag (SPEC.md §13.1)
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4

GET_STATUS_TO_CODE = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
}

# get_messages outcomes of an offset at or past the ConsumeQueue's end (pulls ahead of reput)
_AT_OR_PAST_CQ_END = frozenset({GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                                GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE})

PUT_STATUS_TO_CODE = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}


ANNOUNCE_APPEND = b"A"    # PUB topic: sent after every poll that appended
ANNOUNCE_TICK = b"T"      # PUB topic: periodic re-announcement


def internal_endpoint(store_path: str) -> str:
    return f"ipc://{os.path.abspath(store_path)}/broker.ipc"


def announce_endpoint(store_path: str) -> str:
    return f"ipc://{os.path.abspath(store_path)}/broker-pub.ipc"


class PullRequest:
    __slots__ = ("frame", "reply", "offset", "deadline", "arrived")

    def __init__(self, frame: Frame, reply: Reply, offset: int, deadline: float, arrived: float):
        self.frame = frame
        self.reply = reply
        self.offset = offset
        self.deadline = deadline
        self.arrived = arrived          # monotonic s the request was read (latency trace)


class BrokerActor(Actor):
    name = "broker"

    def __init__(self, settings: dict, store_config: MessageStoreConfig, namesrv_addrs: list[str],
                 supervisor_endpoint: Optional[str] = None):
        super().__init__(store_config.store_path_root_dir, supervisor_endpoint)
        self.settings = settings
        self.store_config = store_config
        self.namesrv_addrs = namesrv_addrs
        self.cluster_name = settings["brokerClusterName"]
        self.broker_name = settings["brokerName"]
        self.broker_id = int(settings["brokerId"])
        self.listen_port = int(settings["listenPort"])
        self.auto_create_topic = str(settings.get("autoCreateTopicEnable", "true")).lower() == "true"
        self.auto_create_group = str(settings.get("autoCreateSubscriptionGroup", "true")).lower() == "true"
        self.default_queue_nums = int(settings.get("defaultTopicQueueNums", 8))
        self.wait_time_ms_in_send_queue = int(settings.get("waitTimeMillsInSendQueue", 200))
        self.long_polling = str(settings.get("longPollingEnable", "true")).lower() == "true"
        # SQL92 subscriptions are refused unless enabled (BrokerConfig.enablePropertyFilter, default false)
        self.enable_property_filter = str(settings.get("enablePropertyFilter", "false")).lower() == "true"
        # rmq: pulls at a queue's tail are answered from the appends themselves (see _from_appends)
        self.wake_pull_on_append = str(settings.get("wakePullOnAppendEnable", "true")).lower() == "true"
        self.suspend_max_ms = int(settings.get("brokerSuspendMaxTimeMillis", BROKER_SUSPEND_MAX_TIME_MS))
        self.broker_permission = int(settings.get("brokerPermission", PERM_READ | PERM_WRITE))
        # a client silent for longer is dropped (ZeroMQ has no per-connection close event)
        self.channel_expired_ms = int(settings.get("channelExpiredTimeout", CHANNEL_EXPIRED_MS))
        self.store: Optional[MessageStore] = None
        self.pull_holds: dict[tuple, list[PullRequest]] = {}
        # (topic, queueId) -> deque of (first queue offset, count, physical offset, bytes): appends
        # reput has not announced yet; and the queues appended to in this loop turn
        self.recent_appends: dict[tuple, deque] = {}
        self.appended_queues: set = set()
        self.sync_waits: deque = deque()        # (end_offset, deadline, reply, frame) in offset order
        self.flushed_offset = 0
        self.dispatched_offset = 0
        self.last_announced = -1
        self.consumer_table: dict[str, dict[str, dict]] = {}   # group -> clientId -> {seen, subs}
        self.producer_table: dict[str, dict[str, float]] = {}
        self.page_cache_busy_until = 0.0
        self.stats = {"putMessageTotal": 0, "putBytesTotal": 0, "getMessageTotal": 0, "getBytesTotal": 0}
        self._tps = {"putTps": 0.0, "getTps": 0.0}
        self.broker_stats = BrokerStats()       # VIEW_BROKER_STATS_DATA windows (rmq.stats)
        self._last_stats = (time.monotonic(), 0, 0)
        self._ns_sockets: list[zmq.Socket] = []
        self.listen_endpoint = ""
        self.mq_locks: dict[tuple, tuple[str, float]] = {}   # (group, topic, broker, qid) -> (clientId, last renewal)
        # HA (SPEC.md §9): the role may be changed by a promotion, persisted in config/haRole.json
        self.role = store_config.broker_role
        self.slave_read_enable = str(settings.get("slaveReadEnable", store_config.slave_read_enable)).lower() == "true"
        self.ha_server_addr = ""                 # master: where our ha actor serves slaves
        self.ha_master_address = str(settings.get("haMasterAddress") or store_config.ha_master_address or "")
        self.ha_master_address_configured = bool(self.ha_master_address)
        self.master_broker_addr = ""             # slave: the master's broker address (from the NameServer)
        self.broker_addr = ""                    # host:port, once the client socket is bound (on_start)
        self.ha_state: dict = {}                 # the ha actor's last HA_ANNOUNCE
        self.ha_ack_offset = -1                  # master: max CommitLog offset acknowledged by a slave
        self.ha_slaves: list = []
        self.pending_promotions: list = []       # [deadline, reply, frame, new role, props, probe opaque]
        self.promotion_probes: dict = {}         # probe opaque -> master's answer (None: not yet)
        self._probe_seq = 0
        self.fenced_by = 0                       # epoch of the master that replaced this one (0: not fenced)
        self._master_sock: Optional[zmq.Socket] = None
        self.exit_code = 0
        # Prometheus metrics (rmq.metrics; broker.conf metricsExporterType=PROM)
        self.metrics_settings = M.metrics_settings(settings)
        self.metrics: Optional[M.BrokerMetrics] = None
        self.pull_offsets: dict[tuple, int] = {}   # (group, topic, queueId) -> next offset pulled (metrics)
        self.pop: Optional[PopService] = None       # POP consumption (rmq.actors.pop)
        self.tx: Optional[TransactionService] = None   # transactional messages (rmq.actors.transaction)
        self.timer: Optional[TimerService] = None      # timer messages (rmq.actors.timer)
        # producer group -> clientId -> (socket, routing envelope) of its last heartbeat: where
        # CHECK_TRANSACTION_STATE goes (RocketMQ's ProducerManager channels)
        self.producer_channels: dict[str, dict[str, tuple]] = {}
        self.recovery_ms = 0.0

    # -- lifecycle --------------------------------------------------------------------
    def _load_role_override(self) -> None:
        path = os.path.join(self.store_path, "config", HA_ROLE_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read {path}: {e}") from None
        role, bid = data.get("brokerRole"), data.get("brokerId")
        if role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE") or not isinstance(bid, int):
            raise SystemExit(f"{path}: brokerRole / brokerId invalid: {data!r}")
        self.log.info("role %s brokerId %d from %s (a promotion) overrides broker.conf", role, bid, path)
        self.role, self.broker_id = role, bid
        self.store_config.broker_role = role

    def on_start(self) -> None:
        self._load_role_override()
        t0 = time.monotonic()
        self.store = MessageStore(config=self.store_config)     # recovery happens here
        self.recovery_ms = (time.monotonic() - t0) * 1000.0
        self.epochs = EpochFile(os.path.join(self.store_path, EPOCH_FILE))
        self.epochs.load()
        if self.role in MASTER_ROLES and not self.epochs.entries:
            self.epochs.append(1, 0)       # the first master epoch covers the CommitLog from its start
        self.store.sync_flush_inline = False     # the flush actor does group commit
        if self.store_config.warm_mapped_file_enable:
            # warm the file appends go to now, not inside the first send
            self.store.commitlog.mapped_file_queue.get_last_mapped_file(0, need_create=True)
        self.flushed_offset = self.store.commitlog.get_max_offset()
        self.dispatched_offset = self.store.reput_from_offset
        host = self.settings.get("brokerIP1", "127.0.0.1")
        self.client_sock = self.socket(zmq.ROUTER, bind=f"tcp://{host}:{self.listen_port or '*'}")
        self.listen_endpoint = self.client_sock.getsockopt_string(zmq.LAST_ENDPOINT)
        port = int(self.listen_endpoint.rsplit(":", 1)[1])
        self.broker_addr = f"{host}:{port}"
        self.store.commitlog.store_host = host_to_bytes(self.broker_addr)
        self.internal_sock = self.socket(zmq.ROUTER, bind=internal_endpoint(self.store_path))
        self.pub_sock = self.socket(zmq.PUB, bind=announce_endpoint(self.store_path))
        self.serve(self.client_sock)
        self.serve(self.internal_sock)
        for addr in self.namesrv_addrs:
            s = self.socket(zmq.DEALER, connect=f"tcp://{addr}")
            self._ns_sockets.append(s)
            self.add_socket(s, self._on_namesrv_response)
        h = self.handle
        h(RequestCode.SEND_MESSAGE, self.on_send)
        h(RequestCode.SEND_MESSAGE_V2, self.on_send)
        h(RequestCode.SEND_BATCH_MESSAGE, self.on_send)
        h(RequestCode.PULL_MESSAGE, self.on_pull)
        h(RequestCode.QUERY_MESSAGE, self.on_query_message)
        h(RequestCode.VIEW_MESSAGE_BY_ID, self.on_view_message_by_id)
        h(RequestCode.QUERY_CONSUMER_OFFSET, self.on_query_consumer_offset)
        h(RequestCode.UPDATE_CONSUMER_OFFSET, self.on_update_consumer_offset)
        h(RequestCode.GET_ALL_CONSUMER_OFFSET, self.on_get_all_consumer_offset)
        h(RequestCode.GET_MAX_OFFSET, self.on_get_max_offset)
        h(RequestCode.GET_MIN_OFFSET, self.on_get_min_offset)
        h(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.on_search_offset_by_timestamp)
        h(RequestCode.GET_EARLIEST_MSG_STORETIME, self.on_earliest_msg_storetime)
        h(RequestCode.UPDATE_AND_CREATE_TOPIC, self.on_update_topic)
        h(RequestCode.DELETE_TOPIC_IN_BROKER, self.on_delete_topic)
        h(RequestCode.GET_ALL_TOPIC_CONFIG, self.on_get_all_topic_config)
        h(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.on_update_group)
        h(RequestCode.DELETE_SUBSCRIPTIONGROUP, self.on_delete_group)
        h(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.on_get_all_groups)
        h(RequestCode.HEART_BEAT, self.on_client_heartbeat)
        h(RequestCode.UNREGISTER_CLIENT, self.on_unregister_client)
        h(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.on_consumer_list)
        h(RequestCode.GET_PRODUCER_CONNECTION_LIST, self.on_producer_connection_list)
        h(RequestCode.GET_ALL_PRODUCER_INFO, self.on_all_producer_info)
        h(RequestCode.GET_BROKER_RUNTIME_INFO, self.on_runtime_info)
        h(RequestCode.VIEW_BROKER_STATS_DATA, self.on_view_broker_stats)
        h(RequestCode.GET_LATENCY_TRACE, self.on_latency_trace)
        h(RequestCode.GET_TOPIC_STATS_INFO, self.on_topic_stats)
        h(RequestCode.DISPATCH_ANNOUNCE, self.on_dispatch_announce)
        h(RequestCode.FLUSH_ANNOUNCE, self.on_flush_announce)
        h(RequestCode.CLEAN_ANNOUNCE, self.on_clean_announce)
        h(RequestCode.CONSUMER_SEND_MSG_BACK, self.on_send_back)
        h(RequestCode.LOCK_BATCH_MQ, self.on_lock_batch_mq)
        h(RequestCode.UNLOCK_BATCH_MQ, self.on_unlock_batch_mq)
        h(RequestCode.GET_ALL_DELAY_OFFSET, self.on_get_all_delay_offset)
        h(RequestCode.HA_ANNOUNCE, self.on_ha_announce)
        h(RequestCode.HA_APPEND, self.on_ha_append)
        h(RequestCode.HA_TRUNCATE, self.on_ha_truncate)
        h(RequestCode.UPDATE_BROKER_CONFIG, self.on_update_broker_config)
        h(RequestCode.GET_BROKER_CONFIG, self.on_get_broker_config)
        self.pop = PopService(self)
        h(RequestCode.POP_MESSAGE, self.pop.on_pop)
        h(RequestCode.ACK_MESSAGE, self.pop.on_ack)
        h(RequestCode.BATCH_ACK_MESSAGE, self.pop.on_batch_ack)
        h(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, self.pop.on_change_invisible_time)
        self.pop.start()
        self.add_timer(REVIVE_SCAN_MS, self.pop.revive)
        self.tx = TransactionService(self)
        h(RequestCode.END_TRANSACTION, self.tx.on_end_transaction)
        h(RequestCode.GET_HALF_MESSAGES, self.tx.on_list_half)
        self.tx.start()
        self.add_timer(self.tx.check_interval_ms, self.tx.check)
        self.timer = TimerService(self)
        h(RequestCode.GET_TIMER_PENDING, self.timer.on_pending)
        self.timer.start()
        self.add_timer(self.timer.tick_ms, self.timer.tick)
        self.add_timer(int(self.settings.get("slaveSyncInterval", SLAVE_SYNC_INTERVAL_MS)), self.sync_from_master,
                       first_ms=1000)
        self.add_timer(1000, self._find_master)
        self.add_timer(REGISTER_NAME_SERVER_PERIOD_MS, self.register_broker_all, first_ms=0)
        self.add_timer(FLUSH_CONSUMER_OFFSET_INTERVAL_MS, self.persist_offsets, first_ms=10_000)
        self.add_timer(HOLD_CHECK_MS, self.check_holds)
        self.add_timer(APPEND_REANNOUNCE_MS, lambda: self.announce_append(force=True))
        self.add_timer(min(CHANNEL_SCAN_MS, max(100, self.channel_expired_ms // 4)), self.scan_channels)
        self.add_timer(STATS_INTERVAL_MS, self.update_stats)
        for i, (_, period_ms, _) in enumerate(WINDOWS):
            self.add_timer(period_ms, lambda i=i: self.broker_stats.sample(i, int(time.time() * 1000)))
        self.add_timer(SCHEDULE_DELIVER_INTERVAL_MS, self.deliver_delayed)
        self.add_timer(FLUSH_DELAY_OFFSET_INTERVAL_MS, self.persist_delay_offsets, first_ms=10_000)
        if self.metrics_settings.enabled:
            self._start_metrics()
        print("ready", self.listen_endpoint, flush=True)

    def _start_metrics(self) -> None:
        self.metrics = M.BrokerMetrics(self.metrics_settings, self.cluster_name, self.broker_name, self.ctx,
                                       self._metric_gauges)
        self.serve_metrics(self.metrics, self.client_sock, "metricsPromExporterPort")

    def on_stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
            self.rpc_observer = None
        if self.store is None:
            return
        # answer what is parked: pulls get "not found", sync sends get what flush reported
        for reqs in self.pull_holds.values():
            for pr in reqs:
                pr.reply.send(self._pull(pr.frame, allow_suspend=False, reply=pr.reply) or Frame(
                    ResponseCode.PULL_NOT_FOUND, remark="broker stopping"))
        self.pull_holds.clear()
        deadline = time.monotonic() + self.store_config.sync_flush_timeout / 1000.0
        while self.sync_waits and time.monotonic() < deadline:
            self.announce_append(force=True)
            if self.internal_sock.poll(50):
                for _ in range(256):
                    try:
                        parts = self.internal_sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._on_request(self.internal_sock, parts)
        self._release_sync_waits(force_timeout=True)
        self.persist_offsets()
        self.persist_delay_offsets()
        if self.timer is not None:
            self.timer.close()
        self.unregister_broker_all()
        self.store.persist_tables()
        self.store.close_for_handoff()

    # -- announcements ---------------------------------------------------------------------
    def after_poll(self) -> None:
        if self.appended_queues:
            self._wake_pulls_from_appends()
        self.announce_append()

    def announce_append(self, force: bool = False) -> None:
        """PUB the CommitLog end: topic ANNOUNCE_APPEND right after appends (reput; flush under
        SYNC_FLUSH), topic ANNOUNCE_TICK every 200 ms (everyone, incl. late subscribers)."""
        end = self.store.commitlog.get_max_offset()
        if end == self.last_announced and not force:
            return
        self.last_announced = end
        frame = Frame(RequestCode.APPEND_ANNOUNCE, flag=P.FLAG_ONEWAY,
                      fields={"end": end, "flushed": self.flushed_offset, "dispatched": self.dispatched_offset,
                              "minOffset": self.store.commitlog.get_min_offset(),
                              "storeTimestamp": self.store.commitlog.last_store_timestamp,
                              "brokerRole": self.role, "brokerAddr": self.broker_addr, "brokerId": self.broker_id,
                              "haMasterAddress": self.ha_master_address})
        try:
            self.pub_sock.send_multipart([ANNOUNCE_TICK if force else ANNOUNCE_APPEND, *P.encode(frame)],
                                         flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def on_dispatch_announce(self, frame: Frame, reply: Reply) -> None:
        self.dispatched_offset = field_int(frame, "dispatched", lo=0)
        queues = unpack_body(frame) if frame.bodies else []
        if _lt.ENABLED:
            now = time.monotonic_ns()
            r_rx, r_done = frame.fields.get("traceReceivedNs", 0), frame.fields.get("traceDispatchedNs", 0)
            for topic, queue_id, max_offset in queues:
                _lt.event("dispatch", topic, queue_id, max_offset, r_rx, r_done, now)
        for topic, queue_id, max_offset in queues:
            cq = self.store.find_consume_queue(topic, queue_id)
            cq.mapped_file_queue.refresh(max_offset * 20)
            recent = self.recent_appends.get((topic, queue_id))
            if recent is not None:            # in the ConsumeQueue now: normal pulls serve them
                while recent and recent[0][0] + recent[0][1] <= max_offset:
                    recent.popleft()
                if not recent:
                    del self.recent_appends[(topic, queue_id)]
            self.wake_pulls(topic, queue_id, max_offset)
        if not self.tx.ready:
            self.tx.maybe_recover()
        if not self.timer.ready:
            self.timer.maybe_recover()
        if not self.pop.ready:
            self.pop.maybe_recover()
        elif self.pop.holds and queues:          # the ConsumeQueues are refreshed above
            self.pop.on_arrivals({q[0] for q in queues})
        return None

    def on_flush_announce(self, frame: Frame, reply: Reply) -> None:
        err = frame.fields.get("error")
        if err and not self.store.flush_error:
            # a failed msync: never an ack after it; parked SYNC_FLUSH sends not yet durable get
            # FLUSH_DISK_TIMEOUT, later sends SERVICE_NOT_AVAILABLE (store) until a restart
            self.store.flush_error = str(err)[:1000]
            self.log.error("CommitLog flush failed: writes refused until restart: %s", err)
            keep = deque()
            for w in self.sync_waits:
                if w[4] and w[0] > self.flushed_offset:
                    w[3].code = ResponseCode.FLUSH_DISK_TIMEOUT
                    w[3].remark = f"[FLUSH_FAILED] {self.store.flush_error}"
                    w[2].send(w[3])
                else:
                    keep.append(w)
            self.sync_waits = keep
        flushed = field_int(frame, "flushed", lo=0)
        if self.metrics is not None and "flushUs" in frame.fields:
            self.metrics.on_flush(field_int(frame, "flushUs", 0, lo=0) / 1000.0,
                                  max(0, flushed - self.flushed_offset))
        if flushed > self.flushed_offset:
            self.flushed_offset = flushed
            self.store.commitlog.mapped_file_queue.flushed_where = flushed
            self._release_sync_waits()
            if self.recent_appends and self.pull_holds:
                self.appended_queues.update(k for k in self.recent_appends if k in self.pull_holds)
                self._wake_pulls_from_appends()
        return None

    # -- delayed messages, retries, queue locks -------------------------------------------------
    def deliver_delayed(self) -> None:
        if self.store_config.broker_role != "SLAVE":
            self.store.deliver_delayed()

    def persist_delay_offsets(self) -> None:
        try:
            self.store.delay_offset_manager.persist()
        except OSError as e:
            self.log.error("cannot persist delay offsets: %s", e)

    def on_send_back(self, frame: Frame, reply: Reply) -> Frame:
        """CONSUMER_SEND_MSG_BACK (SPEC.md §12.2): a message the consumer failed goes to
        %RETRY%group with a delay level, or to %DLQ%group after maxReconsumeTimes."""
        offset = field_int(frame, "offset", lo=0)
        group = check_group(field_str(frame, "group"))
        delay_level = field_int(frame, "delayLevel", 0)
        gcfg = self._group_config(group)
        if gcfg is None:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        if not self.broker_permission & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{self.broker_name}] sending message is forbidden")
        if int(gcfg.get("retryQueueNums", 1)) <= 0:
            return frame.response()
        rec = self.store.commitlog.get_message(offset, self.store_config.check_crc_on_read)
        if rec is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        m = _cl.decode_records(rec)[0]
        props = {k: v for k, v in m.properties.items() if k not in ("__CRC32#", "DELAY", "REAL_TOPIC", "REAL_QID")}
        props.setdefault("RETRY_TOPIC", m.topic)
        max_times = field_int(frame, "maxReconsumeTimes", int(gcfg.get("retryMaxTimes", MAX_RECONSUME_TIMES_DEFAULT)))
        origin = frame.fields.get("originMsgId") if isinstance(frame.fields.get("originMsgId"), str) else ""
        props["ORIGIN_MESSAGE_ID"] = props.get("ORIGIN_MESSAGE_ID") or origin or m.msg_id
        props["WAIT"] = "false"
        if m.reconsume_times >= max_times or delay_level < 0:
            topic, queue_id = f"%DLQ%{group}", 0
        else:
            topic, queue_id = f"%RETRY%{group}", 0
            props["DELAY"] = str(delay_level if delay_level > 0 else 3 + m.reconsume_times)
        cfg = self._topic_config(topic, create=True)
        if cfg is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"topic[{topic}] not exist")
        topic_s, queue_s, props = transform_delay(topic, queue_id, props, len(self.store_config.delay_levels_ms))
        batch = _cl.encode_batch([(m.body, _cl.encode_properties(props), m.flag)])
        res = self.store.put_encoded(topic_s, queue_s, batch, None, m.sys_flag & ~TRANSACTION_TYPE_MASK, m.born_timestamp,
                              m.born_host, m.reconsume_times + 1, 1)
        if not res.ok:
            return frame.response(PUT_STATUS_TO_CODE.get(res.status, ResponseCode.SYSTEM_ERROR), res.remark)
        if self.metrics is not None and topic.startswith("%DLQ%"):
            self.metrics.on_dlq(props.get("RETRY_TOPIC", m.topic), group)
        return frame.response()

    def _lock_body(self, frame: Frame):
        body = unpack_body(frame)
        if not isinstance(body, dict):
            raise ProtocolError("lock body must be a map", opaque=frame.opaque)
        group = check_group(body.get("consumerGroup"))
        client = body.get("clientId")
        mqs = body.get("mqSet", [])
        if not isinstance(client, str) or not isinstance(mqs, list) or not all(
                isinstance(x, list) and len(x) == 3 for x in mqs):
            raise ProtocolError("lock body needs clientId (str) and mqSet ([[topic, brokerName, queueId]])",
                                opaque=frame.opaque)
        return group, client, [tuple(x) for x in mqs]

    def on_lock_batch_mq(self, frame: Frame, reply: Reply) -> Frame:
        """LOCK_BATCH_MQ: lock queues of a group for one client (orderly consumption, SPEC.md §15.2)."""
        group, client, mqs = self._lock_body(frame)
        now = time.monotonic()
        ok = []
        for mq in mqs:
            key = (group, *mq)
            owner = self.mq_locks.get(key)
            if owner is None or owner[0] == client or now - owner[1] > REBALANCE_LOCK_MAX_LIVE_TIME_MS / 1000.0:
                self.mq_locks[key] = (client, now)
                ok.append(list(mq))
        return frame.response(bodies=[pack_body({"lockOKMQSet": ok})])

    def on_unlock_batch_mq(self, frame: Frame, reply: Reply) -> Frame:
        group, client, mqs = self._lock_body(frame)
        for mq in mqs:
            key = (group, *mq)
            if self.mq_locks.get(key, ("",))[0] == client:
                del self.mq_locks[key]
        return frame.response()

    def on_clean_announce(self, frame: Frame, reply: Reply) -> None:
        self.store.disk_full = bool(frame.fields.get("diskFull", False))
        min_offset = field_int(frame, "minOffset", 0, lo=0)
        mfq = self.store.commitlog.mapped_file_queue
        if mfq.drop_missing_head():
            for cq in self.store.consume_queue_table.values():
                cq.correct_min_offset(min_offset)
        self.announce_append(force=True)      # reput learns the new min offset and cleans its files
        return None

    def _release_sync_waits(self, force_timeout: bool = False) -> None:
        """Answer parked sends whose end offset is durable (SYNC_FLUSH) and acknowledged by a slave
        (SYNC_MASTER); FLUSH_DISK_TIMEOUT after syncFlushTimeout, FLUSH_SLAVE_TIMEOUT after slaveTimeout."""
        now = time.monotonic()
        flush_s = self.store_config.sync_flush_timeout / 1000.0
        slave_s = self.store_config.slave_timeout / 1000.0
        keep = deque()
        while self.sync_waits:
            end, t0, reply, resp, need_flush, need_slave = self.sync_waits.popleft()
            flushed = not need_flush or end <= self.flushed_offset
            acked = not need_slave or end <= self.ha_ack_offset
            if flushed and acked:
                reply.send(resp)
            elif not flushed and (force_timeout or now - t0 >= flush_s):
                resp.code = ResponseCode.FLUSH_DISK_TIMEOUT
                resp.remark = f"not flushed within {self.store_config.sync_flush_timeout} ms"
                reply.send(resp)
            elif not acked and (force_timeout or now - t0 >= slave_s):
                resp.code = ResponseCode.FLUSH_SLAVE_TIMEOUT
                resp.remark = (f"no slave acknowledged offset {end} within {self.store_config.slave_timeout} ms "
                               f"(slave at {self.ha_ack_offset})")
                reply.send(resp)
            else:
                keep.append((end, t0, reply, resp, need_flush, need_slave))
        self.sync_waits = keep

    # -- HA (SPEC.md §9) --------------------------------------------------------------------------
    def on_ha_announce(self, frame: Frame, reply: Reply) -> None:
        """The ha actor's state: master -> slave acknowledgements, slave -> link and master epochs."""
        fields = frame.fields
        self.ha_state = fields
        if fields.get("role") == "MASTER":
            addr = str(fields.get("haServerAddr") or "")
            if addr != self.ha_server_addr:
                self.ha_server_addr = addr
                self.register_broker_all()        # slaves learn the HA address from the NameServer
            slaves = fields.get("slaves") or []
            self.ha_slaves = slaves if isinstance(slaves, list) else []
            ack = int(fields.get("ackOffset", -1))
            if ack != self.ha_ack_offset:
                self.ha_ack_offset = ack
                if self.sync_waits:
                    self._release_sync_waits()
        elif fields.get("role") == "SLAVE" and self.role == "SLAVE":
            self._adopt_master_epochs(fields.get("masterEpochs") or [])
        return None

    def _adopt_master_epochs(self, entries: list) -> None:
        """A slave's epoch history is the master's, up to what the slave holds."""
        end = self.store.commitlog.get_max_offset()
        try:
            wanted = [EpochEntry(int(e), int(o)) for e, o in entries if int(o) <= end]
        except (TypeError, ValueError):
            return
        if wanted and wanted != list(self.epochs.entries):
            self.epochs.entries = wanted
            self.epochs.persist()
            self.log.info("epoch history now %s", [tuple(e) for e in wanted])

    def on_ha_append(self, frame: Frame, reply: Reply) -> Frame:
        """HA_APPEND (slave): CommitLog bytes from the master, appended verbatim at ``offset``."""
        if self.role != "SLAVE":
            return frame.response(ResponseCode.SYSTEM_ERROR, f"replicated bytes refused: this broker is {self.role}")
        offset = field_int(frame, "offset", lo=0)
        if not frame.bodies:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, "no body part")
        if not self.epochs.entries and self.ha_state.get("masterEpochs"):
            self._adopt_master_epochs(self.ha_state["masterEpochs"])   # never hold bytes without their epoch
        try:
            end = self.store.apply_replica(offset, frame.bodies[0])
        except Exception as e:      # ReplicaOffsetMismatch, ReplicaDataError, StoreError: nothing written
            self.log.warning("replicated bytes at %d refused: %s", offset, e)
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        self.stats["putBytesTotal"] += len(frame.bodies[0])
        return frame.response(fields={"maxOffset": end})

    def on_ha_truncate(self, frame: Frame, reply: Reply) -> Frame:
        """HA_TRUNCATE (slave): the CommitLog diverged from the master's.  Write the ``ha_truncate``
        marker and exit EXIT_RESTART_GROUP: the supervisor restarts the group and recovery cuts
        the tail there (no other actor writes while it does)."""
        if self.role != "SLAVE":
            return frame.response(ResponseCode.SYSTEM_ERROR, f"truncation refused: this broker is {self.role}")
        offset = field_int(frame, "offset", lo=0)
        self.log.warning("CommitLog diverged from the master's at %d (end %d): truncating on restart",
                         offset, self.store.commitlog.get_max_offset())
        write_truncate_marker(self.store_path, offset)
        self.exit_code = EXIT_RESTART_GROUP
        self.stop()
        return frame.response()

    def on_update_broker_config(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        """UPDATE_BROKER_CONFIG (25): runtime changes of allow-listed keys (RUNTIME_CONFIG_KEYS).

        ``brokerRole`` = ASYNC_MASTER | SYNC_MASTER with ``brokerId`` = 0 promotes a SLAVE: once
        reput has dispatched everything it holds (up to PROMOTE_WAIT_MS) it opens a new epoch
        at its CommitLog end, persists the role (config/haRole.json), re-registers as brokerId 0
        and answers SUCCESS.  Refused while the master is reachable and ahead of it."""
        props = unpack_body(frame) if frame.bodies else {}
        if not isinstance(props, dict) or not props:
            return frame.response(ResponseCode.SYSTEM_ERROR, "body must be a non-empty map of properties")
        props = {str(k): str(v) for k, v in props.items()}
        bad = sorted(k for k in props if k not in RUNTIME_CONFIG_KEYS)
        if bad:
            return frame.response(ResponseCode.NO_PERMISSION,
                                  f"properties {bad} cannot be changed at runtime (allowed: {sorted(RUNTIME_CONFIG_KEYS)})")
        role = props.pop("brokerRole", None)
        bid = props.pop("brokerId", None)
        if role is not None or bid is not None:
            if role not in MASTER_ROLES or bid != "0":
                return frame.response(ResponseCode.SYSTEM_ERROR,
                                      "only a promotion can change brokerRole/brokerId at runtime: "
                                      "brokerRole=ASYNC_MASTER|SYNC_MASTER with brokerId=0")
            if self.role != "SLAVE":
                if self.role == role:
                    return self._apply_runtime_props(frame, props)
                return frame.response(ResponseCode.SYSTEM_ERROR, f"this broker is already {self.role}")
            if self.ha_state.get("connected") and \
                    int(self.ha_state.get("masterMaxOffset", 0) or 0) > self.store.commitlog.get_max_offset():
                return self._refuse_promotion(frame, int(self.ha_state["masterMaxOffset"]))
            # the ha actor's report may be stale (a hung ha actor, a cut replication link): ask the
            # master itself; only silence for PROMOTE_MASTER_PROBE_MS counts as "unreachable"
            probe = self._probe_master()
            self.pending_promotions.append([time.monotonic() + PROMOTE_WAIT_MS / 1000.0, reply, frame, role, props,
                                            probe])
            self._try_promotions()
            return None
        return self._apply_runtime_props(frame, props)

    def _refuse_promotion(self, frame: Frame, master_end: int) -> Frame:
        behind = master_end - self.store.commitlog.get_max_offset()
        return frame.response(ResponseCode.SYSTEM_ERROR,
                              f"slave not caught up: {behind} bytes behind a reachable master; "
                              f"stop the master first or wait")

    def _probe_master(self) -> Optional[int]:
        """Send GET_BROKER_RUNTIME_INFO to the master over the sync socket; returns the probe's
        opaque (its answer lands in ``promotion_probes``), or None when no master is known."""
        sock = self._master_socket()
        if sock is None:
            return None
        self._probe_seq += 1
        opaque = PROBE_OPAQUE_BASE + self._probe_seq
        self.promotion_probes[opaque] = None
        try:
            sock.send_multipart(P.encode(Frame(RequestCode.GET_BROKER_RUNTIME_INFO, opaque=opaque)), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass                                 # no connection at all: silence, as if unreachable
        return opaque

    def _apply_runtime_props(self, frame: Frame, props: dict) -> Frame:
        for k, v in props.items():
            if k == "brokerPermission":
                self.broker_permission = int(v)
                self.register_broker_all()
            elif k == "slaveReadEnable":
                self.slave_read_enable = v.lower() == "true"
            elif k == "longPollingEnable":
                self.long_polling = v.lower() == "true"
            elif k == "enablePropertyFilter":
                self.enable_property_filter = v.lower() == "true"
            elif k == "wakePullOnAppendEnable":
                self.wake_pull_on_append = v.lower() == "true"
            elif k == "autoCreateTopicEnable":
                self.auto_create_topic = v.lower() == "true"
            elif k == "autoCreateSubscriptionGroup":
                self.auto_create_group = v.lower() == "true"
            self.settings[k] = v
        return frame.response()

    def _try_promotions(self) -> None:
        now = time.monotonic()
        end = self.store.commitlog.get_max_offset()
        for item in list(self.pending_promotions):
            deadline, reply, frame, role, props, probe = item
            if probe is not None and self.role == "SLAVE":
                answer = self.promotion_probes.get(probe)
                if answer is None and now < deadline - (PROMOTE_WAIT_MS - PROMOTE_MASTER_PROBE_MS) / 1000.0:
                    continue                     # still waiting for the master's answer
                self.promotion_probes.pop(probe, None)
                item[5] = None
                master_end = int(answer.get("commitLogMaxOffset", 0) or 0) if answer else 0
                if answer and answer.get("brokerRole") in MASTER_ROLES and master_end > end:
                    self.pending_promotions.remove(item)
                    reply.send(self._refuse_promotion(frame, master_end))
                    continue
                if answer is None:
                    self.log.warning("promotion: the master at %s did not answer within %d ms: taken as down",
                                     self.master_broker_addr, PROMOTE_MASTER_PROBE_MS)
            if self.role != "SLAVE":
                self.pending_promotions.remove(item)
                reply.send(frame.response() if self.role == role else
                           frame.response(ResponseCode.SYSTEM_ERROR, f"this broker is already {self.role}"))
            elif self.dispatched_offset >= end:
                self.pending_promotions.remove(item)
                self._promote(role)
                reply.send(self._apply_runtime_props(frame, props))
            elif now >= deadline:
                self.pending_promotions.remove(item)
                reply.send(frame.response(ResponseCode.SYSTEM_ERROR,
                                          f"reput has not dispatched the CommitLog within {PROMOTE_WAIT_MS} ms "
                                          f"({end - self.dispatched_offset} bytes left); retry"))

    def _promote(self, role: str) -> None:
        old_id = self.broker_id
        end = self.store.commitlog.get_max_offset()
        epoch = self.epochs.last_epoch() + 1
        self.epochs.append(epoch, end)
        write_file_atomically(os.path.join(self.store_path, "config", HA_ROLE_FILE),
                              json.dumps({"brokerRole": role, "brokerId": 0, "epoch": epoch, "startOffset": end}))
        self.store.recover_topic_queue_table()
        self.role = role
        self.pop.start()                         # POP checkpoints in flight, from the replicated revive log
        self.tx.start()                          # pending transactions, from the replicated half / op queues
        self.timer.start()                       # timers, from the replicated rmq_sys_wheel_timer queue
        self.store_config.broker_role = role
        self.broker_id = 0
        self.ha_slaves, self.ha_ack_offset, self.ha_state = [], -1, {}
        self.ha_master_address = ""
        self.unregister_broker_all(old_id)       # the NameServer drops <old id, addr> ...
        self.register_broker_all()               # ... and routes id 0 here
        self.announce_append(force=True)          # the ha actor switches to serving slaves
        self.log.warning("promoted to %s (brokerId 0), epoch %d from CommitLog offset %d", role, epoch, end)

    def on_get_broker_config(self, frame: Frame, reply: Reply) -> Frame:
        cfg = {k: str(v) for k, v in self.settings.items()}
        cfg.update({"brokerRole": self.role, "brokerId": str(self.broker_id),
                    "slaveReadEnable": str(self.slave_read_enable).lower()})
        return frame.response(bodies=[pack_body({"config": cfg})])

    def on_get_all_delay_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[pack_body(self.store.delay_offset_manager.encode())])

    def sync_from_master(self) -> None:
        """SlaveSynchronize (slave, every SLAVE_SYNC_INTERVAL_MS): topics, consumer offsets, delay
        offsets and subscription groups copied from the master; also re-registers until the
        master's HA address is known."""
        if self.role != "SLAVE" or self._master_socket() is None:
            return
        for code in (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET,
                     RequestCode.GET_ALL_DELAY_OFFSET, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG):
            try:
                self._master_sock.send_multipart(P.encode(Frame(code, opaque=int(code))), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _master_socket(self) -> Optional[zmq.Socket]:
        """The DEALER to the master broker (slave only; re-made when the master's address changes)."""
        if not self.master_broker_addr:
            return None
        if self._master_sock is None or getattr(self, "_master_sock_addr", "") != self.master_broker_addr:
            if self._master_sock is not None:
                self.poller.unregister(self._master_sock)
                self._socket_handlers.pop(self._master_sock, None)
                self._master_sock.close(0)
            self._master_sock = self.socket(zmq.DEALER, connect=f"tcp://{self.master_broker_addr}")
            self._master_sock_addr = self.master_broker_addr
            self.add_socket(self._master_sock, self._on_master_sync_response)
        return self._master_sock

    def _find_master(self) -> None:
        """A slave that does not know its master's addresses yet asks the NameServer every second
        (the register-broker answer carries them)."""
        if self.role == "SLAVE" and (not self.ha_master_address or not self.master_broker_addr):
            self.register_broker_all()

    def _on_master_sync_response(self, parts: list) -> None:
        try:
            f = P.decode(parts)
            body = unpack_body(f) if f.bodies else None
        except ProtocolError as e:
            self.log.warning("bad answer from the master: %s", e)
            return
        if f.opaque in self.promotion_probes:
            if f.code == ResponseCode.SUCCESS and isinstance(body, dict) and isinstance(body.get("table"), dict):
                self.promotion_probes[f.opaque] = body["table"]
                self._try_promotions()
            return
        if f.code != ResponseCode.SUCCESS or not isinstance(body, dict) or self.role != "SLAVE":
            return
        manager = {RequestCode.GET_ALL_TOPIC_CONFIG: self.store.topic_config_manager,
                   RequestCode.GET_ALL_CONSUMER_OFFSET: self.store.consumer_offset_manager,
                   RequestCode.GET_ALL_DELAY_OFFSET: self.store.delay_offset_manager,
                   RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.store.subscription_group_manager}.get(f.opaque)
        if manager is None:
            return
        try:
            manager.decode(body)
            manager.persist()
        except (KeyError, TypeError, ValueError, OSError) as e:
            self.log.warning("cannot apply the master's %s: %s", type(manager).__name__, e)

    # -- NameServer registration ---------------------------------------------------------------
    def _topic_table_body(self) -> bytes:
        tcm = self.store.topic_config_manager
        return pack_body({"topicConfigTable": tcm.topic_config_table, "dataVersion": tcm.data_version.to_json()})

    def register_broker_all(self) -> None:
        frame = Frame(RequestCode.REGISTER_BROKER, fields={
            "clusterName": self.cluster_name, "brokerAddr": self.broker_addr, "brokerName": self.broker_name,
            "brokerId": self.broker_id, "haServerAddr": self.ha_server_addr,
            "epoch": self.epochs.last_epoch() if self.role in MASTER_ROLES else 0}, bodies=[self._topic_table_body()])
        self._to_namesrvs(frame)

    def unregister_broker_all(self, broker_id: Optional[int] = None) -> None:
        """UNREGISTER_BROKER (one-way) of this address as ``broker_id`` (default: the current id)."""
        if not self.broker_addr:
            return                               # never bound (a failed start): never registered
        self._to_namesrvs(Frame(RequestCode.UNREGISTER_BROKER, flag=P.FLAG_ONEWAY, fields={
            "clusterName": self.cluster_name, "brokerAddr": self.broker_addr, "brokerName": self.broker_name,
            "brokerId": self.broker_id if broker_id is None else broker_id}))

    def _to_namesrvs(self, frame: Frame) -> None:
        """Send ``frame`` to every NameServer; a full queue skips that one (logged, retried by the timer)."""
        for s in self._ns_sockets:
            try:
                s.send_multipart(P.encode(frame), flags=zmq.NOBLOCK)
            except zmq.Again:
                self.log.warning("NameServer queue full: %s skipped", RequestCode(frame.code).name)

    def _on_namesrv_response(self, parts: list) -> None:
        f = self.decode_or_log(parts, "NameServer response")
        if f is None:
            return
        if f.code != ResponseCode.SUCCESS:
            self.log.warning("NameServer answered %s: %s", f.code, f.remark)
            if f.fields.get("fenced") and self.role in MASTER_ROLES and not self.fenced_by:
                # a slave was promoted over us (a newer epoch): stop taking writes (HA fencing)
                self.fenced_by = int(f.fields.get("epoch", 0) or 0)
                self.log.error("fenced by a master of epoch %d: sends refused from now on", self.fenced_by)
            return
        if self.role == "SLAVE":
            # RegisterBrokerResult: the master's broker and HA addresses (SPEC.md §9.1)
            master = f.fields.get("masterAddr")
            if isinstance(master, str) and master and master != self.master_broker_addr:
                self.master_broker_addr = master
                self.log.info("master broker is %s", master)
            ha = f.fields.get("haServerAddr")
            if not self.ha_master_address_configured and isinstance(ha, str) and ha and ha != self.ha_master_address:
                self.ha_master_address = ha
                self.log.info("master HA address is %s", ha)
                self.announce_append(force=True)

    # -- topics -----------------------------------------------------------------------------
    def _topic_config(self, topic: str, create: bool, requested_queue_nums: int = 0) -> Optional[dict]:
        tcm = self.store.topic_config_manager
        cfg = tcm.select_topic_config(topic)
        if cfg is None and create and (self.auto_create_topic or topic.startswith(("%RETRY%", "%DLQ%"))):
            n = 1 if topic.startswith(("%RETRY%", "%DLQ%")) else self.default_queue_nums
            if requested_queue_nums > 0:       # the producer's defaultTopicQueueNums, capped by the broker's
                n = min(n, requested_queue_nums)
            cfg = tcm.new_topic_config(topic, n, n)
            tcm.update_topic_config(cfg)
            self.register_broker_all()
        return cfg

    def on_update_topic(self, frame: Frame, reply: Reply) -> Frame:
        topic = field_str(frame, "topic")
        try:
            check_topic(topic)
        except ValueError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        r = field_int(frame, "readQueueNums", DEFAULT_QUEUE_NUMS, lo=1, hi=MAX_QUEUE_NUMS)
        w = field_int(frame, "writeQueueNums", DEFAULT_QUEUE_NUMS, lo=1, hi=MAX_QUEUE_NUMS)
        perm = field_int(frame, "perm", PERM_READ | PERM_WRITE, lo=0, hi=15)
        order = bool(frame.fields.get("order", False))
        tcm = self.store.topic_config_manager
        tcm.update_topic_config(tcm.new_topic_config(topic, r, w, perm, order))
        self.register_broker_all()
        return frame.response()

    def on_delete_topic(self, frame: Frame, reply: Reply) -> Frame:
        topic = field_str(frame, "topic")
        self.store.topic_config_manager.delete_topic_config(topic)
        self._forget_pull_offsets(lambda k: k[1] == topic)
        self.register_broker_all()
        return frame.response()

    def _forget_pull_offsets(self, match) -> None:
        """Drop the metrics' pull offsets of a deleted topic or group (keys (group, topic, queueId))."""
        for k in [k for k in self.pull_offsets if match(k)]:
            del self.pull_offsets[k]

    def on_get_all_topic_config(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[self._topic_table_body()])

    # -- subscription groups ------------------------------------------------------------------
    def _group_config(self, group: str) -> Optional[dict]:
        sgm = self.store.subscription_group_manager
        cfg = sgm.find_subscription_group_config(group)
        if cfg is None and self.auto_create_group:
            cfg = sgm.new_group_config(group)
            sgm.update_subscription_group_config(cfg)
        return cfg

    def on_update_group(self, frame: Frame, reply: Reply) -> Frame:
        body = unpack_body(frame) if frame.bodies else {}
        group = check_group(field_str(frame, "groupName", body.get("groupName") if isinstance(body, dict) else None))
        sgm = self.store.subscription_group_manager
        cfg = sgm.new_group_config(group)
        if isinstance(body, dict):
            for k in ("consumeEnable", "consumeBroadcastEnable", "retryQueueNums", "retryMaxTimes",
                      "brokerId", "whichBrokerWhenConsumeSlowly", "consumeFromMinEnable"):
                if k in body:
                    cfg[k] = body[k]
        sgm.update_subscription_group_config(cfg)
        return frame.response()

    def on_delete_group(self, frame: Frame, reply: Reply) -> Frame:
        group = field_str(frame, "groupName")
        self.store.subscription_group_manager.delete_subscription_group_config(group)
        self._forget_pull_offsets(lambda k: k[0] == group)
        return frame.response()

    def on_get_all_groups(self, frame: Frame, reply: Reply) -> Frame:
        sgm = self.store.subscription_group_manager
        return frame.response(bodies=[pack_body({"subscriptionGroupTable": sgm.subscription_group_table})])

    # -- send ------------------------------------------------------------------------------
    def on_send(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        t_handler = time.monotonic_ns() if _lt.ENABLED else 0     # read from the socket (latency trace)
        waited_ms = (time.monotonic() - self.poll_returned_at) * 1000.0
        if waited_ms > self.wait_time_ms_in_send_queue:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                                  f"period in queue: {waited_ms:.0f}ms")
        if time.monotonic() < self.page_cache_busy_until:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  "[PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a while")
        if not self.broker_permission & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{self.broker_name}] sending message is forbidden")
        if self.fenced_by:
            return frame.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  f"this master was replaced by a promoted slave (epoch {self.fenced_by}): "
                                  f"sends refused; restart it as a slave")
        topic = field_str(frame, "topic")
        try:
            check_topic(topic)
        except ValueError as e:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        cfg = self._topic_config(topic, create=True,
                                 requested_queue_nums=field_int(frame, "defaultTopicQueueNums", 0, lo=0,
                                                                hi=MAX_QUEUE_NUMS))
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST,
                                  f"topic[{topic}] not exist, apply first please!")
        if not cfg["perm"] & PERM_WRITE:
            return frame.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = field_int(frame, "queueId", -1, lo=-1, hi=MAX_QUEUE_NUMS)
        if queue_id < 0:
            queue_id = random.randrange(cfg["writeQueueNums"])
        if queue_id >= cfg["writeQueueNums"]:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"request queueId[{queue_id}] is illegal, topic writeQueueNums {cfg['writeQueueNums']}")
        if not frame.bodies:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, "no message body part")
        sys_flag = field_int(frame, "sysFlag", 0, lo=0, hi=0x7FF)
        born_ts = field_int(frame, "bornTimestamp", int(time.time() * 1000))
        born_host = None
        if "bornHost" in frame.fields:
            try:
                born_host = host_to_bytes(field_str(frame, "bornHost", max_len=64))
            except ValueError:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'bornHost' is not ip:port")
        reconsume = field_int(frame, "reconsumeTimes", 0, lo=0)
        t0 = time.monotonic()
        store_topic, store_queue_id = topic, queue_id
        is_half = False
        if frame.code == RequestCode.SEND_BATCH_MESSAGE:
            if (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be transactional")
            batch = frame.bodies[0]
            props = frame.fields.get("properties") or None
            if props is not None and not isinstance(props, dict):
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'properties' must be a map")
            sent_props = props
            res = self.store.put_messages(topic, queue_id, batch, properties=props, sys_flag=sys_flag,
                                          born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume)
        else:
            props = frame.fields.get("properties", {})
            if isinstance(props, str):
                props = _cl.decode_properties(props.encode("utf-8"))
            if not isinstance(props, dict):
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, "header field 'properties' must be a map or str")
            sent_props = props
            if is_half_request(sys_flag, props):
                if self.tx.reject:
                    return frame.response(ResponseCode.NO_PERMISSION,
                                          f"the broker[{self.broker_name}] sending transaction message is forbidden")
                # SPEC.md §11.2: parked in the half topic, invisible until END_TRANSACTION commits it
                is_half = True
                store_topic, store_queue_id = HALF_TOPIC, 0
                props = half_properties(topic, queue_id, props)
                sys_flag &= ~TRANSACTION_TYPE_MASK
            elif "DELAY" in props and (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
                # parked in SCHEDULE_TOPIC_XXXX; the reply still names the queue the producer chose
                # (RocketMQ's SendMessageProcessor answers with the request's queueId)
                store_topic, store_queue_id, props = transform_delay(topic, queue_id, props,
                                                                     len(self.store_config.delay_levels_ms))
            elif is_timer_message(props) and (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
                # SPEC.md §10.4: parked in rmq_sys_wheel_timer until its deliver time
                refused = self._timer_refusal(frame, props)
                if refused is not None:
                    return refused
                try:
                    store_topic, store_queue_id, props = transform_timer(
                        topic, queue_id, props, self.store_config.timer_precision_ms,
                        self.store_config.timer_max_delay_sec)
                except TimerMessageError as e:
                    return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
                if store_topic != topic and self.timer.timer_store is not None \
                        and self.timer.timer_store.is_reject(int(props["TIMER_OUT_MS"])):
                    cap = self.store_config.timer_congest_num_each_slot
                    return frame.response(ResponseCode.SYSTEM_ERROR,
                                          f"timer message is under flow control, max num limit is {cap} "
                                          f"timers per slot (timerCongestNumEachSlot)")
            try:
                props_bytes = _cl.encode_properties(props)
            except ValueError as e:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            flag = field_int(frame, "flag", 0)
            try:
                batch = _cl.encode_batch([(frame.bodies[0], props_bytes, flag)])
            except ValueError as e:
                return frame.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            res = self.store.put_encoded(store_topic, store_queue_id, batch, None, sys_flag, born_ts, born_host,
                                         reconsume, 1)
        elapsed_ms = (time.monotonic() - t0) * 1000.0
        if elapsed_ms > self.store_config.os_page_cache_busy_time_out_mills:
            self.page_cache_busy_until = time.monotonic() + elapsed_ms / 1000.0
        code = PUT_STATUS_TO_CODE.get(res.status, ResponseCode.SYSTEM_ERROR)
        if res.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and res.remark.startswith("[DISK_FULL]"):
            code = ResponseCode.SERVICE_NOT_AVAILABLE     # ENOSPC: a clear refusal, as RocketMQ's DISK_FULL
        if res.status is PutMessageStatus.OS_PAGE_CACHE_BUSY:
            return frame.response(code, "[PC_SYNCHRONIZED]broker busy, start flow control for a while")
        if not res.ok:
            return frame.response(code, res.remark or res.status.value)
        a = res.append
        if is_half:
            self.tx.on_half_stored(props, a.queue_offset, a.wrote_offset)
        elif (sys_flag & TRANSACTION_TYPE_MASK) in (0, TRANSACTION_COMMIT_TYPE):
            self.note_append(store_topic, store_queue_id, res)
        if _lt.ENABLED:
            _lt.event("append", store_topic, store_queue_id, a.queue_offset, a.msg_num, t_handler,
                      time.monotonic_ns())
        self.stats["putMessageTotal"] += a.msg_num
        self.stats["putBytesTotal"] += a.wrote_bytes
        self.broker_stats.put.add(topic, a.msg_num, a.wrote_bytes, int(time.time() * 1000))
        if self.metrics is not None:
            self.metrics.on_put(topic, M.message_type(sent_props, is_half or (sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_PREPARED_TYPE),
                                a.msg_num, a.wrote_bytes)
        resp = frame.response(ResponseCode.SUCCESS, fields={
            "msgId": res.msg_id, "queueId": queue_id, "queueOffset": a.queue_offset,
            "storeTimestamp": a.store_timestamp, "msgNum": a.msg_num})
        wait = str(frame.fields.get("waitStoreMsgOK", "true")).lower() != "false"
        if not wait:
            return resp
        end = a.wrote_offset + a.wrote_bytes
        need_flush = self.store_config.flush_disk_type == SYNC_FLUSH and end > self.flushed_offset
        need_slave = False
        if self.role == "SYNC_MASTER":
            # SPEC.md §9.3 (4.9): the record is written; without a slave in reach the sender is told so
            if not self.slave_ok(end):
                resp.code = ResponseCode.SLAVE_NOT_AVAILABLE
                resp.remark = ("no slave connected" if not self.ha_slaves else
                               f"slave behind by {end - self.ha_ack_offset} bytes "
                               f"(haSlaveFallbehindMax {self.store_config.ha_slave_fallbehind_max})")
                return resp
            need_slave = end > self.ha_ack_offset
        if need_flush or need_slave:
            self.sync_waits.append((end, time.monotonic(), reply, resp, need_flush, need_slave))
            return None
        return resp

    def _timer_refusal(self, frame: Frame, props: dict) -> Optional[Frame]:
        """WHEEL_TIMER_NOT_ENABLE (RocketMQ: SYSTEM_ERROR) when this broker keeps no timers."""
        if not self.store_config.timer_wheel_enable:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  "accurate timer message is not enabled, timerWheelEnable is false")
        return None

    def note_append(self, topic: str, queue_id: int, res) -> None:
        """Remember an append of a consumable record (a send, a commit record) so that pulls held at
        that queue's tail are answered before reput has dispatched it (see _from_appends)."""
        if not self.wake_pull_on_append:
            return
        a = res.append
        key = (topic, queue_id)
        recent = self.recent_appends.get(key)
        if recent is None:
            recent = self.recent_appends[key] = deque(maxlen=RECENT_APPENDS_PER_QUEUE)
        recent.append((a.queue_offset, a.msg_num, a.wrote_offset, a.wrote_bytes))
        if key in self.pull_holds:
            self.appended_queues.add(key)

    def send_to_producer(self, group: str, parts: list) -> bool:
        """Send a request (encoded ``parts``) one-way to a live producer of ``group``, over the
        connection of its last heartbeat; producers are tried in random order, the gone ones
        (ROUTER_MANDATORY: EHOSTUNREACH) and the expired ones dropped.  False: nobody to send to."""
        channels = self.producer_channels.get(group)
        if not channels:
            return False
        cutoff = time.monotonic() - self.channel_expired_ms / 1000.0
        seen = self.producer_table.get(group, {})
        clients = list(channels)
        random.shuffle(clients)
        for client in clients:
            sock, envelope = channels[client]
            if seen.get(client, 0.0) < cutoff:
                del channels[client]
                continue
            try:
                sock.send_multipart(envelope + parts, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                continue                          # its queue is full: another producer, or the next round
            except zmq.ZMQError:
                del channels[client]              # the producer is gone
        return False

    def slave_ok(self, end: int) -> bool:
        """A slave is connected and less than haSlaveFallbehindMax bytes behind ``end`` (HAService.isSlaveOK)."""
        return bool(self.ha_slaves) and end - self.ha_ack_offset < self.store_config.ha_slave_fallbehind_max

    # -- pull -------------------------------------------------------------------------------
    def on_pull(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        return self._pull(frame, allow_suspend=True, reply=reply)

    def _pull(self, frame: Frame, allow_suspend: bool, reply: Reply, arrived: Optional[float] = None) -> Optional[Frame]:
        """One PULL_MESSAGE; ``arrived`` (monotonic s) is set for a held pull woken or expired."""
        if not self.broker_permission & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the broker[{self.broker_name}] pulling message is forbidden")
        group = field_str(frame, "consumerGroup")
        try:
            check_group(group)
        except ValueError as e:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, str(e))
        gcfg = self._group_config(group)
        if gcfg is None:
            return frame.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                  f"subscription group [{group}] does not exist")
        if not gcfg.get("consumeEnable", True):
            return frame.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        topic = field_str(frame, "topic")
        cfg = self.store.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg["perm"] & PERM_READ:
            return frame.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        if queue_id >= cfg["readQueueNums"]:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                  f"[{cfg['readQueueNums']}]")
        offset = field_int(frame, "queueOffset", lo=0)
        max_nums = field_int(frame, "maxMsgNums", 32, lo=1, hi=MAX_PULL_BATCH)
        sys_flag = field_int(frame, "sysFlag", 0, lo=0)
        subscription = frame.fields.get("subscription", "*")
        if not isinstance(subscription, str):
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "header field 'subscription' must be a str")
        sql_filter = self.subscription_filter(frame, group, frame.fields.get("expressionType"), subscription)
        if isinstance(sql_filter, Frame):
            return sql_filter
        res = self.store.get_messages(group, topic, queue_id, offset, max_nums,
                                      None if sql_filter is not None else subscription, sql_filter=sql_filter)
        code = GET_STATUS_TO_CODE.get(res.status)
        if code is None:      # NO_MESSAGE_IN_QUEUE / NO_MATCHED_LOGIC_QUEUE
            code = ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED
        if allow_suspend and sys_flag & PULL_FLAG_COMMIT_OFFSET and self.role != "SLAVE":
            commit = field_int(frame, "commitOffset", -1)
            if commit >= 0:
                self.store.consumer_offset_manager.commit_offset(group, topic, queue_id, commit)
        next_begin = res.next_begin_offset
        if res.status in _AT_OR_PAST_CQ_END and res.max_offset <= offset <= \
                self.store.topic_queue_table.get((topic, queue_id), 0):
            # at or past the ConsumeQueue's end but within what was appended: reput has not announced
            # it yet.  Served from the appends (a consumer served that way pulls on before reput's
            # announcement), else nothing new yet -- never a moved offset
            served = self._from_appends(topic, queue_id, offset, max_nums,
                                        subscription if sql_filter is None else None)
            if served is not None:
                return self._appends_response(frame, topic, queue_id, offset, served, gcfg, arrived)
            code, next_begin = ResponseCode.PULL_NOT_FOUND, offset
        # SPEC.md §13.1/§13.2: with slaveReadEnable a consumer far behind (its data no longer
        # in memory) is sent to the slave, others to the group's brokerId; without it, to the master
        suggest = 0
        if self.slave_read_enable:
            suggest = int(gcfg.get("whichBrokerWhenConsumeSlowly", 1)) if res.suggest_pulling_from_slave \
                else int(gcfg.get("brokerId", 0))
        fields = {"nextBeginOffset": next_begin, "minOffset": res.min_offset,
                  "maxOffset": res.max_offset, "suggestWhichBrokerId": suggest}
        if code == ResponseCode.SUCCESS:
            if _lt.ENABLED:
                _lt.event("pull", topic, queue_id, offset, res.next_begin_offset,
                          int((arrived or self.poll_returned_at) * 1e9), time.monotonic_ns(), arrived is not None)
            self.stats["getMessageTotal"] += res.message_count
            self.stats["getBytesTotal"] += len(res.records)
            self.broker_stats.get.add(f"{topic}@{group}", res.message_count, len(res.records),
                                      int(time.time() * 1000))
            if self.metrics is not None:
                self.metrics.on_get(topic, group, res.message_count, len(res.records))
                self.pull_offsets[(group, topic, queue_id)] = res.next_begin_offset
            return frame.response(code, fields=fields, bodies=[res.records])
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
            suspend_ms = min(field_int(frame, "suspendTimeoutMillis", self.suspend_max_ms, lo=0),
                             self.suspend_max_ms) if self.long_polling else 1000
            self.pull_holds.setdefault((topic, queue_id), []).append(
                PullRequest(frame, reply, offset, time.monotonic() + suspend_ms / 1000.0, self.poll_returned_at))
            return None
        return frame.response(code, fields=fields)

    def subscription_filter(self, frame: Frame, group: str, expression_type, expression: str):
        """The compiled SQL92 filter of a subscription, None for a tag expression, or the error
        response (PULL_MESSAGE and POP_MESSAGE).  PullMessageProcessor: a non-tag expression needs
        enablePropertyFilter; it is compiled once per distinct expression (compile_sql92's cache)."""
        if ExpressionType.is_tag_type(expression_type):
            return None
        if expression_type != ExpressionType.SQL92:
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                  f"unsupported expression type {expression_type!r} (TAG or SQL92)")
        if not self.enable_property_filter:
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  f"The broker does not support consumer to filter message by {expression_type}")
        try:
            return compile_sql92(expression)
        except FilterExpressionError as e:
            return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                  f"parse the consumer's subscription[{expression}] failed, group: {group}: {e}")

    def _from_appends(self, topic: str, queue_id: int, offset: int, max_nums: int, subscription) -> Optional[tuple]:
        """The records of queue offsets ``offset``.. from appends reput has not announced yet:
        ``(records, count, bytes)``, or None (rmq; ``wakePullOnAppendEnable``, default true).

        RocketMQ serves a pull from the ConsumeQueue, which its in-process reput fills and then wakes
        held pulls (NotifyMessageArrivingListener).  Here reput is another process, two process hops
        away.  The broker wrote these records and assigned their queue offsets itself, so it gives the
        very reply a pull gets once the ConsumeQueue has the entries: the records byte for byte,
        whole appends in queue-offset order from ``offset``, at most ``max_nums`` messages.  Only what
        a consumer may see: under SYNC_FLUSH only flushed bytes (SPEC.md header: only flushed data is
        dispatched); half (prepared) messages are never recorded.  Whole appends only: a pull that
        starts inside a batch or wants fewer messages than the next append holds, one with a tag
        filter, or one older than what is remembered goes the normal way.
        """
        recent = self.recent_appends.get((topic, queue_id))
        if not recent or subscription not in ("*", "") or offset < recent[0][0]:     # None: a SQL92 filter
            return None
        limit = self.flushed_offset if self.store_config.flush_disk_type == SYNC_FLUSH \
            else self.store.commitlog.get_max_offset()
        mfq = self.store.commitlog.mapped_file_queue
        parts, count, size, want = [], 0, 0, offset
        for first, n, phys, nbytes in recent:
            if first + n <= want:
                continue
            # whole appends only: a batch is never cut (bulk producers' batches go the normal way,
            # where one ConsumeQueue read serves any part of them)
            if first != want or count + n > max_nums or phys + nbytes > limit:
                break
            mf = mfq.find_mapped_file_by_offset(phys)
            if mf is None:                 # cleaned meanwhile: the normal path answers
                break
            parts.append(mf.read(phys - mf.file_from_offset, nbytes))
            count += n
            size += nbytes
            want += n
        if not count:
            return None
        return (parts[0] if len(parts) == 1 else b"".join(parts)), count, size

    def _appends_response(self, frame: Frame, topic: str, queue_id: int, offset: int, served: tuple,
                          gcfg: dict, arrived: Optional[float]) -> Frame:
        records, count, size = served
        cq = self.store.consume_queue_table.get((topic, queue_id))
        suggest = int(gcfg.get("brokerId", 0)) if self.slave_read_enable else 0
        self.stats["getMessageTotal"] += count
        self.stats["getBytesTotal"] += size
        group = field_str(frame, "consumerGroup")
        self.broker_stats.get.add(f"{topic}@{group}", count, size, int(time.time() * 1000))
        if self.metrics is not None:
            self.metrics.on_get(topic, group, count, size)
            self.pull_offsets[(group, topic, queue_id)] = offset + count
        if _lt.ENABLED:
            _lt.event("pull", topic, queue_id, offset, offset + count,
                      int((arrived or self.poll_returned_at) * 1e9), time.monotonic_ns(), arrived is not None)
        return frame.response(ResponseCode.SUCCESS, fields={
            "nextBeginOffset": offset + count, "minOffset": cq.get_min_offset_in_queue() if cq else 0,
            "maxOffset": self.store.topic_queue_table.get((topic, queue_id), offset + count),
            "suggestWhichBrokerId": suggest}, bodies=[records])

    def _wake_pulls_from_appends(self) -> None:
        """Answer pulls held on the queues appended to in this turn from those appends
        (:meth:`_from_appends`); the others stay held for reput's announcement."""
        queues, self.appended_queues = self.appended_queues, set()
        for key in queues:
            reqs = self.pull_holds.get(key)
            if not reqs:
                continue
            keep = []
            for pr in reqs:
                f = pr.frame.fields
                served = self._from_appends(key[0], key[1], pr.offset,
                                            field_int(pr.frame, "maxMsgNums", 32, lo=1, hi=MAX_PULL_BATCH),
                                            f.get("subscription", "*")
                                            if ExpressionType.is_tag_type(f.get("expressionType")) else None)
                if served is None:
                    keep.append(pr)
                    continue
                gcfg = self._group_config(field_str(pr.frame, "consumerGroup")) or {}
                pr.reply.send(self._appends_response(pr.frame, key[0], key[1], pr.offset, served, gcfg, pr.arrived))
            if keep:
                self.pull_holds[key] = keep
            else:
                del self.pull_holds[key]

    def wake_pulls(self, topic: str, queue_id: int, max_offset: int) -> None:
        reqs = self.pull_holds.get((topic, queue_id))
        if not reqs:
            return
        keep = []
        for pr in reqs:
            if max_offset > pr.offset:
                resp = self._pull(pr.frame, allow_suspend=False, reply=pr.reply, arrived=pr.arrived)
                if resp is not None:
                    pr.reply.send(resp)
            else:
                keep.append(pr)
        if keep:
            self.pull_holds[(topic, queue_id)] = keep
        else:
            del self.pull_holds[(topic, queue_id)]

    def check_holds(self) -> None:
        now = time.monotonic()
        for key in list(self.pull_holds):
            keep = []
            for pr in self.pull_holds[key]:
                if now >= pr.deadline:
                    resp = self._pull(pr.frame, allow_suspend=False, reply=pr.reply, arrived=pr.arrived)
                    if resp is not None:
                        pr.reply.send(resp)
                else:
                    keep.append(pr)
            if keep:
                self.pull_holds[key] = keep
            else:
                del self.pull_holds[key]
        if self.pop.holds:
            self.pop.expire_holds()
        if self.sync_waits:
            self._release_sync_waits()
        if self.pending_promotions:
            self._try_promotions()

    # -- queries ---------------------------------------------------------------------------
    def on_query_message(self, frame: Frame, reply: Reply) -> Frame:
        topic = field_str(frame, "topic")
        key = field_str(frame, "key")
        max_num = field_int(frame, "maxNum", 32, lo=1, hi=64)
        begin = field_int(frame, "beginTimestamp", 0)
        end = field_int(frame, "endTimestamp", int(time.time() * 1000) + 1000)
        self.store.reload_index_for_read()
        res = self.store.query_message(topic, key, max_num, begin, end)
        if not res.records:
            return frame.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        return frame.response(fields={"indexLastUpdateTimestamp": res.index_last_update_timestamp,
                                      "indexLastUpdatePhyoffset": res.index_last_update_phyoffset},
                              bodies=[b"".join(res.records)])

    def on_view_message_by_id(self, frame: Frame, reply: Reply) -> Frame:
        offset = field_int(frame, "offset", lo=0)
        rec = self.store.commitlog.get_message(offset, self.store_config.check_crc_on_read)
        if rec is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return frame.response(bodies=[rec])

    # -- offsets -------------------------------------------------------------------------------
    def on_query_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        group, topic = field_str(frame, "consumerGroup"), field_str(frame, "topic")
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        off = self.store.consumer_offset_manager.query_offset(group, topic, queue_id)
        if off >= 0:
            return frame.response(fields={"offset": off})
        # RocketMQ: no committed offset yet and the queue still starts at 0 -> 0, else QUERY_NOT_FOUND
        if self.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return frame.response(fields={"offset": 0})
        return frame.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def on_update_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        group, topic = field_str(frame, "consumerGroup"), field_str(frame, "topic")
        check_group(group)
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        off = field_int(frame, "commitOffset", lo=0, hi=MAX_QUEUE_OFFSET)
        check_topic(topic)
        self.store.consumer_offset_manager.commit_offset(group, topic, queue_id, off)
        return frame.response()

    def on_get_all_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        body = self.store.consumer_offset_manager.encode()
        inflight: dict = {}
        for (group, topic, qid), n in self.pop.inflight().items():      # POP groups: popped, not acked
            inflight.setdefault(f"{topic}@{group}", {})[str(qid)] = n
        body["popInflightTable"] = inflight
        return frame.response(bodies=[pack_body(body)])

    def on_get_max_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.store.get_max_offset_in_queue(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1))})

    def on_get_min_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.store.get_min_offset_in_queue(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1))})

    def on_search_offset_by_timestamp(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.store.get_offset_in_queue_by_time(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1),
            field_int(frame, "timestamp", lo=JAVA_LONG_MIN, hi=JAVA_LONG_MAX))})

    def on_earliest_msg_storetime(self, frame: Frame, reply: Reply) -> Frame:
        topic, queue_id = field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        res = self.store.get_messages("%EARLIEST%", topic, queue_id,
                                      self.store.get_min_offset_in_queue(topic, queue_id), 1)
        msgs = res.messages()
        return frame.response(fields={"timestamp": msgs[0].store_timestamp if msgs else -1})

    # -- clients ------------------------------------------------------------------------------
    def on_client_heartbeat(self, frame: Frame, reply: Reply) -> Frame:
        body = unpack_body(frame)
        if not isinstance(body, dict) or not isinstance(body.get("clientID"), str):
            return frame.response(ResponseCode.SYSTEM_ERROR, "heartbeat body must be a map with a clientID")
        client = body["clientID"]
        now = time.monotonic()
        changed_groups = []
        for c in body.get("consumerDataSet", []) or []:
            group = check_group(c.get("groupName"))
            self._group_config(group)
            if c.get("messageModel", "CLUSTERING") == "CLUSTERING":
                self._topic_config(f"%RETRY%{group}", create=True)
            members = self.consumer_table.setdefault(group, {})
            if client not in members:
                changed_groups.append(group)
            members[client] = {"seen": now, "data": c}
        for pdata in body.get("producerDataSet", []) or []:
            pgroup = check_group(pdata.get("groupName"))
            self.producer_table.setdefault(pgroup, {})[client] = now
            if reply.envelope:
                self.producer_channels.setdefault(pgroup, {})[client] = (reply.socket, list(reply.envelope))
        return frame.response()

    def on_unregister_client(self, frame: Frame, reply: Reply) -> Frame:
        client = field_str(frame, "clientID")
        group = frame.fields.get("consumerGroup")
        if isinstance(group, str):
            self.consumer_table.get(group, {}).pop(client, None)
        pgroup = frame.fields.get("producerGroup")
        if isinstance(pgroup, str):
            self.producer_table.get(pgroup, {}).pop(client, None)
            self.producer_channels.get(pgroup, {}).pop(client, None)
        return frame.response()

    def _producer_rows(self, group: str) -> list:
        now_wall, now = time.time(), time.monotonic()
        return [{"clientId": c, "language": "PYTHON", "version": VERSION,
                 "lastUpdateTimestamp": int((now_wall - (now - seen)) * 1000)}
                for c, seen in sorted(self.producer_table.get(group, {}).items())]

    def on_producer_connection_list(self, frame: Frame, reply: Reply) -> Frame:
        """GET_PRODUCER_CONNECTION_LIST: the producers of ``producerGroup`` that sent a heartbeat
        within ``channelExpiredTimeout``; body ``{"connectionSet": [{clientId, language, version,
        lastUpdateTimestamp (ms)}]}``, SYSTEM_ERROR when there is none (RocketMQ's answer)."""
        group = field_str(frame, "producerGroup")
        rows = self._producer_rows(group)
        if not rows:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return frame.response(bodies=[pack_body({"connectionSet": rows})])

    def on_all_producer_info(self, frame: Frame, reply: Reply) -> Frame:
        """GET_ALL_PRODUCER_INFO: ``{"producerTable": {group: [connection]}}`` (see
        :meth:`on_producer_connection_list`) of every producer group with a live producer."""
        table = {g: self._producer_rows(g) for g in sorted(self.producer_table) if self.producer_table[g]}
        return frame.response(bodies=[pack_body({"producerTable": table})])

    def on_consumer_list(self, frame: Frame, reply: Reply) -> Frame:
        group = field_str(frame, "consumerGroup")
        members = self.consumer_table.get(group)
        if not members:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return frame.response(bodies=[pack_body({"consumerIdList": sorted(members)})])

    def scan_channels(self) -> None:
        cutoff = time.monotonic() - self.channel_expired_ms / 1000.0
        for table in (self.consumer_table,):
            for group in list(table):
                for client, info in list(table[group].items()):
                    if info["seen"] < cutoff:
                        del table[group][client]
                        self.log.info("consumer %s of %s expired", client, group)
        for group in list(self.producer_table):
            for client, seen in list(self.producer_table[group].items()):
                if seen < cutoff:
                    del self.producer_table[group][client]

    # -- status -------------------------------------------------------------------------------
    def update_stats(self) -> None:
        now = time.monotonic()
        t, puts, gets = self._last_stats
        dt = max(now - t, 1e-6)
        self._tps = {"putTps": (self.stats["putMessageTotal"] - puts) / dt,
                     "getTps": (self.stats["getMessageTotal"] - gets) / dt}
        self._last_stats = (now, self.stats["putMessageTotal"], self.stats["getMessageTotal"])

    def runtime_info(self) -> dict:
        clog = self.store.commitlog
        return {**self.stats, **self._tps, "commitLogMinOffset": clog.get_min_offset(),
                "commitLogMaxOffset": clog.get_max_offset(), "flushedOffset": self.flushed_offset,
                "dispatchedOffset": self.dispatched_offset,
                "dispatchBehindBytes": max(0, clog.get_max_offset() - self.dispatched_offset),
                "flushDiskType": self.store_config.flush_disk_type,
                "brokerName": self.broker_name, "brokerAddr": self.broker_addr,
                "clusterName": self.cluster_name, "bootTimestamp": int(self.started_at * 1000),
                "version": VERSION, "parkedPulls": sum(len(v) for v in self.pull_holds.values()),
                "parkedSyncSends": len(self.sync_waits), "brokerRole": self.role, "brokerId": self.broker_id,
                "haEpoch": self.epochs.last_epoch(), "haServerAddr": self.ha_server_addr,
                "haMasterAddress": self.ha_master_address if self.role == "SLAVE" else "",
                "masterAddr": self.master_broker_addr if self.role == "SLAVE" else "",
                "haConnected": bool(self.ha_state.get("connected", False)),
                "haMasterMaxOffset": int(self.ha_state.get("masterMaxOffset", 0) or 0),
                "haSlaves": self.ha_slaves, "haSlaveAckOffset": self.ha_ack_offset,
                "haLagMs": self._ha_lag_ms(int(time.time() * 1000)),
                "slaveReadEnable": self.slave_read_enable, "fencedByEpoch": self.fenced_by,
                "flushBehindBytes": max(0, clog.get_max_offset() - self.flushed_offset),
                "recoveryTimeMs": round(self.recovery_ms, 3),
                # used / (used + available) of the store's file system, RocketMQ's way (-1: unknown)
                "commitLogDiskRatio": disk_usage_ratio(self.store_path),
                "metricsUrl": (f"http://{self.metrics_settings.host}:{self.metrics.port}/metrics"
                               if self.metrics is not None else ""),
                # replication counters of the ha actor: bytes pushed / applied, handshakes, link
                # resets, and sends ZeroMQ refused (ROUTER_MANDATORY: counted, never silent)
                "haStats": {k: int(self.ha_state.get(k, 0) or 0)
                            for k in ("pushedBytes", "appliedBytes", "handshakes", "resets", "dropped")}}

    # -- metrics (rmq.metrics) ------------------------------------------------------------------
    def _store_time(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """Store timestamp (ms) of the message at ``queue_offset``, 0 when it is not there."""
        cq = self.store.consume_queue_table.get((topic, queue_id))
        entry = cq.get_entry(queue_offset) if cq is not None else None
        if entry is None:
            return 0
        try:
            return int(self.store.commitlog.pickup_store_timestamp(entry[0], entry[1]))
        except Exception:  # noqa: BLE001 - a record the cleaner took: no figure
            return 0

    def _ha_lag_ms(self, now_ms: int) -> int:
        """Master: now minus the store time of the first message no slave has acknowledged (the
        acked offset is a record boundary: the ha actor ships whole records); 0 when a slave has
        everything, -1 without a slave or when the record cannot be read."""
        if self.role == "SLAVE" or not self.ha_slaves:
            return -1
        clog = self.store.commitlog
        ack = max(self.ha_ack_offset, clog.get_min_offset())
        if ack >= clog.get_max_offset():
            return 0
        try:
            ts = int(clog.store_timestamp_from(ack))     # past a file's end padding if ack sits on it
        except Exception:  # noqa: BLE001 - a file being deleted under us: no figure
            return -1
        return max(0, now_ms - ts) if ts > 0 else -1

    def _metric_gauges(self, m: "M.BrokerMetrics") -> list:
        """The gauges of a scrape, computed in the loop (RocketMQ 5 names; rmq.metrics)."""
        now_ms = int(time.time() * 1000)
        out = []
        g = m.gauge("rocketmq_processor_watermark", "Requests waiting in the broker, by processor: pull = "
                    "long-polling pulls held, send = sends waiting for a flush or a slave", ["processor"])
        g.add_metric(m.values("pull"), sum(len(v) for v in self.pull_holds.values()))
        g.add_metric(m.values("send"), len(self.sync_waits))
        out.append(g)
        g = m.gauge("rocketmq_broker_permission", "Broker permission (RocketMQ perm bits: 4 read, 2 write)")
        g.add_metric(m.values(), self.broker_permission)
        out.append(g)
        topics = self.store.topic_config_manager.topic_config_table
        groups = self.store.subscription_group_manager.subscription_group_table
        for name, doc, n in (("rocketmq_topic_number", "Active topic number", len(topics)),
                             ("rocketmq_consumer_group_number", "Active subscription group number", len(groups))):
            g = m.gauge(name, doc)
            g.add_metric(m.values(), n)
            out.append(g)
        labels = ["language", "version", "protocol_type"]
        g = m.gauge("rocketmq_producer_connections", "Producer connections", labels)
        n = sum(len(c) for c in self.producer_table.values())
        if n:
            g.add_metric(m.values("python", VERSION.lower(), "remoting"), n)
        out.append(g)
        g = m.gauge("rocketmq_consumer_connections", "Consumer connections",
                    ["consumer_group", "language", "version", "consume_mode", "protocol_type", "is_system"])
        for group, members in self.consumer_table.items():
            modes: dict = {}
            for info in members.values():
                kind = str((info.get("data") or {}).get("consumeType", "CONSUME_PASSIVELY"))
                mode = "pull" if kind == "CONSUME_ACTIVELY" else "push"
                modes[mode] = modes.get(mode, 0) + 1
            for mode, count in modes.items():
                g.add_metric(m.values(group, "python", VERSION.lower(), mode, "remoting",
                                      M._bool(M.is_system_group(group))), count)
        out.append(g)
        lag_labels = ["consumer_group", "topic", "is_retry", "is_system"]
        lag = m.gauge("rocketmq_consumer_lag_messages", "Consumer lag messages", lag_labels)
        lag_ms = m.gauge("rocketmq_consumer_lag_latency", "Consumer lag time (milliseconds)", lag_labels)
        inflight = m.gauge("rocketmq_consumer_inflight_messages", "Consumer inflight messages", lag_labels)
        queueing = m.gauge("rocketmq_consumer_queueing_latency", "Consumer queueing time (milliseconds)", lag_labels)
        ready = m.gauge("rocketmq_consumer_ready_messages", "Consumer ready messages", lag_labels)
        offsets = self.store.consumer_offset_manager
        rows = M.lag_rows(offsets.offset_table, self.pull_offsets, self.store.get_max_offset_in_queue,
                          self._store_time, offsets.TOPIC_GROUP_SEPARATOR)
        for group, topic, n, t_unconsumed, n_inflight, n_ready, t_unpulled in rows:
            v = m.values(group, topic, M._bool(topic.startswith(M.RETRY_GROUP_TOPIC_PREFIX)),
                         M._bool(M.is_system_topic(topic) or M.is_system_group(group)))
            lag.add_metric(v, n)
            lag_ms.add_metric(v, max(0, now_ms - t_unconsumed) if t_unconsumed else 0)
            inflight.add_metric(v, n_inflight)
            ready.add_metric(v, n_ready)
            queueing.add_metric(v, max(0, now_ms - t_unpulled) if t_unpulled else 0)
        out += [lag, lag_ms, inflight, queueing, ready]
        clog = self.store.commitlog
        max_phy = clog.get_max_offset()
        g = m.gauge("rocketmq_storage_size", "Broker storage size: used bytes of the store's file system",
                    ["storage_type", "storage_medium"])
        try:
            st = os.statvfs(self.store_path)
            g.add_metric(m.values("local", "disk"), (st.f_blocks - st.f_bfree) * st.f_frsize)
        except OSError:
            pass
        out.append(g)
        for name, doc, v in (
                ("rocketmq_storage_flush_behind_bytes", "Broker flush behind bytes", max(0, max_phy - self.flushed_offset)),
                ("rocketmq_storage_dispatch_behind_bytes", "Broker dispatch behind bytes",
                 max(0, max_phy - self.dispatched_offset)),
                ("rocketmq_storage_recovery_time", "Time the store took to load and recover at the broker's "
                                                   "start (milliseconds)", round(self.recovery_ms, 3))):
            g = m.gauge(name, doc, ["storage_type"])
            g.add_metric(m.values("local"), v)
            out.append(g)
        g = m.gauge("rocketmq_storage_message_reserve_time", "Broker message reserve time: age of the oldest "
                    "stored message (milliseconds)", ["storage_type"])
        min_phy = clog.get_min_offset()
        if max_phy > min_phy:
            try:
                earliest = int(clog.pickup_store_timestamp(min_phy))
            except Exception:  # noqa: BLE001 - the first file is being deleted: no figure this scrape
                earliest = 0
            if earliest > 0:
                g.add_metric(m.values("local"), max(0, now_ms - earliest))
        out.append(g)
        # HA (rmq's own, in RocketMQ's style)
        g = m.gauge("rocketmq_ha_replication_lag_bytes", "Master: bytes the furthest-ahead slave has not "
                    "acknowledged; slave: bytes behind the master", ["broker_role"])
        if self.role == "SLAVE":
            master_max = int(self.ha_state.get("masterMaxOffset", 0) or 0)
            g.add_metric(m.values("slave"), max(0, master_max - max_phy) if master_max else 0)
        elif self.ha_slaves:
            g.add_metric(m.values("master"), max(0, max_phy - max(self.ha_ack_offset, 0)))
        out.append(g)
        g = m.gauge("rocketmq_ha_replication_lag_latency", "Master: age of the oldest message the furthest-ahead "
                    "slave has not acknowledged, 0 when it has them all (milliseconds)", ["broker_role"])
        lag_ms = self._ha_lag_ms(now_ms)
        if lag_ms >= 0:                  # -1: no slave, or the record could not be read
            g.add_metric(m.values("master"), lag_ms)
        out.append(g)
        g = m.gauge("rocketmq_ha_slave_connections", "Slaves connected to this master")
        g.add_metric(m.values(), len(self.ha_slaves) if self.role != "SLAVE" else 0)
        out.append(g)
        cpu = m.counter("rocketmq_actor_cpu_seconds", "CPU time of each actor process of the group (user + "
                        "system, seconds)", ["actor", "pid"])
        rss = m.gauge("rocketmq_actor_resident_memory_bytes", "Resident memory of each actor process (bytes)",
                      ["actor", "pid"])
        for actor, pid, cpu_s, rss_b in M.actor_processes(self.store_path):
            cpu.add_metric(m.values(actor, pid), cpu_s)
            rss.add_metric(m.values(actor, pid), rss_b)
        restarts = m.counter("rocketmq_actor_restarts", "Restarts of each actor process by the supervisor since "
                             "it started (a group restart counts for every member)", ["actor"])
        for actor, n in sorted(M.actor_restarts(self.store_path).items()):
            restarts.add_metric(m.values(actor), n)
        out += [cpu, rss, restarts]
        return out

    def on_runtime_info(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[pack_body({"table": self.runtime_info()})])

    def on_view_broker_stats(self, frame: Frame, reply: Reply) -> Frame:
        """VIEW_BROKER_STATS_DATA: fields ``statsName`` (rmq.stats.STATS_NAMES) and ``statsKey``
        (topic, or topic@group); body: BrokerStatsData ``{statsMinute, statsHour, statsDay}``, each
        ``{sum, tps, avgpt}``.  Without ``statsKey`` (rmq's extension) the body is
        ``{"statsTable": {key: BrokerStatsData}}`` for every key, one request instead of one a key."""
        name = field_str(frame, "statsName")
        try:
            items = self.broker_stats.set_of(name)
        except KeyError:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"statsName {name!r} unknown; one of "
                                                             f"{', '.join(STATS_NAMES)}")
        now_ms = int(time.time() * 1000)
        key = frame.fields.get("statsKey")
        if key is None:
            return frame.response(bodies=[pack_body({"statsTable": items.stats(name, None, now_ms)})])
        data = items.stats(name, str(key), now_ms)
        if data is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return frame.response(bodies=[pack_body(data)])

    def on_latency_trace(self, frame: Frame, reply: Reply) -> Frame:
        """The broker's latency-trace events since the last call (rmq.latency_trace); SYSTEM_ERROR
        when the broker was not started with RMQ_LATENCY_TRACE=1."""
        if not _lt.ENABLED:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"latency trace is off: start the broker with "
                                                             f"{_lt.ENV}=1")
        return frame.response(bodies=[pack_body(_lt.take())])

    def on_topic_stats(self, frame: Frame, reply: Reply) -> Frame:
        topic = field_str(frame, "topic")
        cfg = self.store.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = []
        for q in range(cfg["readQueueNums"]):
            table.append({"queueId": q, "minOffset": self.store.get_min_offset_in_queue(topic, q),
                          "maxOffset": self.store.get_max_offset_in_queue(topic, q)})
        return frame.response(bodies=[pack_body({"offsetTable": table})])

    def persist_offsets(self) -> None:
        if self.pop is not None:
            self.pop.commit_revive_offsets()
        try:
            self.store.consumer_offset_manager.persist()
        except OSError as e:
            self.log.error("cannot persist consumer offsets: %s", e)


def main(argv: Optional[list] = None) -> int:
    """``python -m rmq.actors.broker [options]``; prints ``ready ENDPOINT`` once serving."""
    p = argparse.ArgumentParser(prog="python -m rmq.actors.broker", description=__doc__.split("\n")[0])
    p.add_argument("-c", "--config", default=None, help="broker.conf (RocketMQ key=value form)")
    p.add_argument("--store-path", default=None, help="storePathRootDir")
    p.add_argument("--listen-port", type=int, default=None, help="listenPort, 0 = ephemeral")
    p.add_argument("--namesrv-addr", default=None, help="NameServer addresses, host:port;host:port")
    p.add_argument("--supervisor", default=None, help="supervisor endpoint for liveness beats")
    args = p.parse_args(argv)
    overrides = {}
    if args.store_path is not None:
        overrides["storePathRootDir"] = args.store_path
    if args.listen_port is not None:
        overrides["listenPort"] = str(args.listen_port)
    if args.namesrv_addr is not None:
        overrides["namesrvAddr"] = args.namesrv_addr
    settings = actor_settings(args.config, overrides, "broker")
    store_config = store_config_from_settings(settings)
    namesrv = [a.strip() for a in (settings.get("namesrvAddr") or "").split(";") if a.strip()]
    actor = BrokerActor(settings, store_config, namesrv, args.supervisor)
    actor.run()
    return actor.exit_code


def store_config_from_settings(settings: dict) -> MessageStoreConfig:
    """MessageStoreConfig from broker settings (RocketMQ property names; unknown keys kept in ``extra``)."""
    props = dict(settings)
    props["storeHost"] = f"{settings.get('brokerIP1', '127.0.0.1')}:{settings.get('listenPort', 10911)}"
    return MessageStoreConfig.from_properties(props)


if __name__ == "__main__":
    sys.exit(main())
