"""Broker actor: the write path, the pull path and the broker's tables (RocketMQ BrokerController).

Responsibility
    The broker is the only writer of the CommitLog: it recovers the store at start (normal or
    abnormal recovery, SPEC.md §5) and appends every batch in one Cython call.  ConsumeQueues and
    IndexFiles are written by the reput actor; the broker maps them read-only as reput announces
    them.  Requests are answered by processors (:mod:`rmq.actors.processor`, RocketMQ's
    ``broker/.../processor``), registered by code in one table (:meth:`BrokerActor.register_processors`);
    this class owns the store, the role, the configuration flags, the NameServer registration, the
    announcements to the other actors, and the services with state of their own (POP,
    transactions, timers).  The store is used through ``MessageStore``'s own methods.

Sockets
    ROUTER ``tcp://127.0.0.1:LISTEN_PORT``: clients (send, pull, query, offsets, admin).
    ROUTER ``ipc://STORE/broker.ipc``: internal actors (reput, flush, cleaner, ha) send
    one-way DISPATCH_ANNOUNCE / FLUSH_ANNOUNCE / CLEAN_ANNOUNCE / HA_ANNOUNCE here.
    PUB ``ipc://STORE/broker-pub.ipc``: APPEND_ANNOUNCE {end, flushed} after every
    poll that appended (and every 200 ms), to reput and flush.
    DEALER per NameServer: REGISTER_BROKER every 30 s and on topic changes.

Files
    Writes ``commitlog/*``, ``config/{topics,consumerOffset,subscriptionGroup}.json``
    and the ``abort`` file; reads ``consumequeue/`` and ``index/``.

Timers
    register with NameServers 30 000 ms; consumer offsets persisted every 5 000 ms (broker.conf
    ``flushConsumerOffsetInterval``, ms, at least MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS; the
    JSON and its fsyncs on the store's config-writer thread, not this one); parked pulls and sync-flush sends expired
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
import sys
import time
from typing import Callable, Optional

import zmq
from zmq.utils.monitor import parse_monitor_message

from rmq import metrics as M
from rmq import protocol as P
from rmq.actors.broker_endpoints import (ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK,  # noqa: F401
                                         announce_endpoint, internal_endpoint, release_ipc_dir,
                                         store_config_from_settings)
from rmq.actors.actor import Actor, Reply
from rmq.actors.controller_client import ControllerClient
from rmq.actors.pop import REVIVE_SCAN_MS, PopService
from rmq.actors.processor import VERSION
from rmq.actors.processor.admin import AdminBrokerProcessor
from rmq.actors.processor.client_manage import CHANNEL_EXPIRED_MS, CHANNEL_SCAN_MS, ClientManageProcessor
from rmq.actors.processor.consumer_manage import ConsumerManageProcessor
from rmq.actors.processor.end_transaction import EndTransactionProcessor
from rmq.actors.processor.ha import (EXIT_RESTART_GROUP, FIND_MASTER_INTERVAL_MS, HA_ROLE_FILE, MASTER_ROLES,
                                     SLAVE_SYNC_INTERVAL_MS, HAProcessor)
from rmq.actors.processor.pull import PullMessageProcessor
from rmq.actors.processor.query import QueryMessageProcessor
from rmq.actors.processor.send import SendMessageProcessor
from rmq.actors.processor.store_announce import StoreAnnounceProcessor
from rmq.actors.timer import TimerService
from rmq.actors.transaction import TransactionService
from rmq.broker_conf import (actor_settings, append_announce_interval_ms, controller_settings,
                             flow_control_settings)
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.common.topic_validator import SYSTEM_TOPIC_PREFIXES
from rmq.protocol import Frame, RequestCode, ResponseCode, pack_body
from rmq.stats import WINDOWS, BrokerStats
from rmq.store.config import SYNC_FLUSH, MessageStoreConfig
from rmq.store.epoch import EPOCH_FILE, EpochFile
from rmq.store.message_store import MessageStore
from rmq.zmqio import send_parts

__all__ = ["BrokerActor", "ANNOUNCE_APPEND", "ANNOUNCE_DURABLE", "ANNOUNCE_TICK", "EXIT_RESTART_GROUP", "VERSION",
           "announce_endpoint", "internal_endpoint", "main", "store_config_from_settings"]

REGISTER_NAME_SERVER_PERIOD_MS = 30_000      # registerNameServerPeriod
FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 5_000    # flushConsumerOffsetInterval
MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 10   # below it the broker would spend its time encoding offsets
BROKER_SUSPEND_MAX_TIME_MS = 15_000          # long-poll ceiling (SPEC.md §13.3)
HOLD_CHECK_MS = 10                           # expiry of parked pulls / sends
CLIENT_REPLY_HWM = 100_000                   # answers queued per client connection (ZeroMQ SNDHWM)
APPEND_REANNOUNCE_MS = 200
SYNC_FLUSH_INLINE_MAX_BYTES = 64 * 1024      # SYNC_FLUSH: a loop turn's group up to this size is msynced
                                             # by the broker itself, larger ones by the flush actor
STATS_INTERVAL_MS = 1000
SCHEDULE_DELIVER_INTERVAL_MS = 100           # DELAY_FOR_A_WHILE (SPEC.md §10.3)
FLUSH_DELAY_OFFSET_INTERVAL_MS = 10_000      # flushDelayOffsetInterval

def _true(v) -> bool:
    return str(v).lower() == "true"


class BrokerActor(Actor):
    """RocketMQ's BrokerController as an actor (module docstring)."""
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
        self.auto_create_topic = _true(settings.get("autoCreateTopicEnable", "true"))
        self.auto_create_group = _true(settings.get("autoCreateSubscriptionGroup", "true"))
        self.default_queue_nums = int(settings.get("defaultTopicQueueNums", 8))
        # send flow control; the client socket's backlog is read into this loop each round, up to
        # sendThreadPoolQueueCapacity requests, so a send's wait is seen from the moment it was read
        flow = flow_control_settings(settings)
        self.wait_time_ms_in_send_queue = flow["wait_ms"]
        self.send_queue_capacity = flow["queue_capacity"]
        self.long_polling = _true(settings.get("longPollingEnable", "true"))
        # SQL92 subscriptions are refused unless enabled (BrokerConfig.enablePropertyFilter, default false)
        self.enable_property_filter = _true(settings.get("enablePropertyFilter", "false"))
        # rmq: pulls at a queue's tail are answered from the appends themselves (PullMessageProcessor.from_appends)
        self.wake_pull_on_append = _true(settings.get("wakePullOnAppendEnable", "true"))
        self.suspend_max_ms = int(settings.get("brokerSuspendMaxTimeMillis", BROKER_SUSPEND_MAX_TIME_MS))
        self.broker_permission = int(settings.get("brokerPermission", PERM_READ | PERM_WRITE))
        # a client silent for longer is dropped (ZeroMQ has no per-connection close event)
        self.channel_expired_ms = int(settings.get("channelExpiredTimeout", CHANNEL_EXPIRED_MS))
        # consumer offsets (and the revive offsets of POP) written to consumerOffset.json this often
        self.flush_consumer_offset_interval_ms = int(settings.get("flushConsumerOffsetInterval",
                                                                  FLUSH_CONSUMER_OFFSET_INTERVAL_MS))
        if self.flush_consumer_offset_interval_ms < MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS:
            raise ValueError(f"flushConsumerOffsetInterval={self.flush_consumer_offset_interval_ms} ms: at least "
                             f"{MIN_FLUSH_CONSUMER_OFFSET_INTERVAL_MS} ms")
        self.store: Optional[MessageStore] = None
        self.flushed_offset = 0                  # CommitLog bytes the flush actor reported durable
        self.dispatched_offset = 0               # CommitLog bytes reput reported dispatched
        self.last_announced = -1
        self.last_confirmed = -1
        # appends are announced at most every appendAnnounceIntervalMs (the first one at once)
        self.announce_interval_s = append_announce_interval_ms(settings) / 1000.0
        self.last_announce_at = 0.0              # monotonic s of the last announcement
        self.announce_due = False                # a deferred announcement is on the timer heap
        # the CommitLog end while every record past last_announced is one no reader waits for (the POP
        # revive log: note_quiet_append); such appends go out with the next announcement (-1: none)
        self.quiet_end = -1
        self.stats = {"putMessageTotal": 0, "putBytesTotal": 0, "getMessageTotal": 0, "getBytesTotal": 0}
        self.tps = {"putTps": 0.0, "getTps": 0.0}
        self.broker_stats = BrokerStats()       # VIEW_BROKER_STATS_DATA windows (rmq.stats)
        self._last_stats = (time.monotonic(), 0, 0)
        self._ns_sockets: list[zmq.Socket] = []
        self.listen_endpoint = ""
        # HA (SPEC.md §9): the role may be changed by a promotion, persisted in config/haRole.json
        self.role = store_config.broker_role
        self.slave_read_enable = _true(settings.get("slaveReadEnable", store_config.slave_read_enable))
        self.ha_server_addr = ""                 # master: where our ha actor serves slaves
        self.ha_master_address = str(settings.get("haMasterAddress") or store_config.ha_master_address or "")
        self.ha_master_address_configured = bool(self.ha_master_address)
        self.master_broker_addr = ""             # slave: the master's broker address (from the NameServer)
        self.broker_addr = ""                    # host:port, once the client socket is bound (on_start)
        self.ha_state: dict = {}                 # the ha actor's last HA_ANNOUNCE
        self.ha_ack_offset = -1                  # master: max CommitLog offset acknowledged by a slave
        self.ha_slaves: list = []
        self.fenced_by = 0                       # epoch of the master that replaced this one (0: not fenced)
        self.epochs: Optional[EpochFile] = None
        self.exit_code = 0
        # Prometheus metrics (rmq.metrics; broker.conf metricsExporterType=PROM)
        self.metrics_settings = M.metrics_settings(settings)
        self.metrics: Optional[M.BrokerMetrics] = None
        self.pull_offsets: dict[tuple, int] = {}   # (group, topic, queueId) -> next offset pulled (metrics)
        self.recovery_ms = 0.0
        # processors (rmq.actors.processor) and services
        self.send_processor = SendMessageProcessor(self)
        self.pull_processor = PullMessageProcessor(self)
        self.query_processor = QueryMessageProcessor(self)
        self.admin_processor = AdminBrokerProcessor(self)
        self.client_manager = ClientManageProcessor(self)
        self.consumer_manage_processor = ConsumerManageProcessor(self)
        self.end_transaction_processor = EndTransactionProcessor(self)
        self.ha_processor = HAProcessor(self)
        self.store_announce_processor = StoreAnnounceProcessor(self)
        self.pop: Optional[PopService] = None       # POP consumption (rmq.actors.pop)
        self.tx: Optional[TransactionService] = None   # transactional messages (rmq.actors.transaction)
        self.timer: Optional[TimerService] = None      # timer messages (rmq.actors.timer)
        self.controller: Optional[ControllerClient] = None   # controller mode (rmq.actors.controller_client)

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
        ctl = controller_settings(self.settings)
        if ctl["enabled"]:
            # RocketMQ 5 controller mode: start as a slave, the controllers decide who is master
            self.controller = ControllerClient(self, ctl)
            self.role = self.store_config.broker_role = "SLAVE"
            self.broker_id = self.controller._load_replica_id()
        else:
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
            self.store.warm_last_commit_log_file()   # the file appends go to now, not inside the first send
        self.flushed_offset = self.store.get_max_phy_offset()
        self.dispatched_offset = self.store.reput_from_offset
        host = self.settings.get("brokerIP1", "127.0.0.1")
        # answers queued per client before one is dropped (ROUTER_MANDATORY: EAGAIN): a client
        # that sends faster than it reads its answers still gets them (netty buffers a channel's
        # writes the same way); set before the bind, which is when the pipes take it
        self.client_sock = self.socket(zmq.ROUTER, bind=f"tcp://{host}:{self.listen_port or '*'}",
                                       options={zmq.SNDHWM: CLIENT_REPLY_HWM})
        self.listen_endpoint = self.client_sock.getsockopt_string(zmq.LAST_ENDPOINT)
        port = int(self.listen_endpoint.rsplit(":", 1)[1])
        self.broker_addr = f"{host}:{port}"
        self.store.set_store_host(self.broker_addr)
        self.internal_sock = self.socket(zmq.ROUTER, bind=internal_endpoint(self.store_path))
        self.pub_sock = self.socket(zmq.PUB, bind=announce_endpoint(self.store_path))
        self.serve(self.client_sock, drain_max=self.send_queue_capacity)
        # a send read longer ago than waitTimeMillsInSendQueue is refused before it is decoded
        self.shed_late(self.client_sock, self.wait_time_ms_in_send_queue, self.send_processor.shed_late_send)
        self.serve(self.internal_sock)
        for addr in self.namesrv_addrs:
            s = self.socket(zmq.DEALER, connect=f"tcp://{addr}")
            self._ns_sockets.append(s)
            self.add_socket(s, self._on_namesrv_response)
            # every (re)connection registers at once: a restarted NameServer knows no broker, and
            # the period alone would leave the cluster without routes for up to 30 s
            self.add_socket(s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED), self._on_namesrv_connected)
        self.pop = PopService(self)
        self.tx = TransactionService(self)
        self.timer = TimerService(self)
        self.register_processors()
        if self.controller is not None:
            self.controller.start()
        self.pop.start()
        self.add_timer(REVIVE_SCAN_MS, self.pop.revive)
        self.tx.start()
        self.add_timer(self.tx.check_interval_ms, self.tx.check)
        self.timer.start()
        self.add_timer(self.timer.tick_ms, self.timer.tick)
        ha = self.ha_processor
        self.add_timer(int(self.settings.get("slaveSyncInterval", SLAVE_SYNC_INTERVAL_MS)), ha.sync_from_master,
                       first_ms=1000)
        self.add_timer(FIND_MASTER_INTERVAL_MS, ha.find_master)
        self.add_timer(REGISTER_NAME_SERVER_PERIOD_MS, self.register_broker_all, first_ms=0)
        self.add_timer(self.flush_consumer_offset_interval_ms, self.persist_offsets,
                       first_ms=min(10_000, 2 * self.flush_consumer_offset_interval_ms))
        self.add_timer(HOLD_CHECK_MS, self.check_holds)
        self.add_timer(APPEND_REANNOUNCE_MS, lambda: self.announce_append(force=True))
        self.add_timer(min(CHANNEL_SCAN_MS, max(100, self.channel_expired_ms // 4)), self.client_manager.scan_channels)
        self.add_timer(STATS_INTERVAL_MS, self.update_stats)
        for i, (_, period_ms, _) in enumerate(WINDOWS):
            self.add_timer(period_ms, lambda i=i: self.broker_stats.sample(i, int(time.time() * 1000)))
        self.add_timer(SCHEDULE_DELIVER_INTERVAL_MS, self.deliver_delayed)
        self.add_timer(FLUSH_DELAY_OFFSET_INTERVAL_MS, self.persist_delay_offsets, first_ms=10_000)
        if self.metrics_settings.enabled:
            self._start_metrics()
        print("ready", self.listen_endpoint, flush=True)

    def processor_table(self) -> dict[int, Callable[[Frame, Reply], Optional[Frame]]]:
        """Request code -> handler: every request the broker answers (RocketMQ's
        ``BrokerController.registerProcessor``)."""
        send, pull, query = self.send_processor, self.pull_processor, self.query_processor
        admin, client, consumer = self.admin_processor, self.client_manager, self.consumer_manage_processor
        ha, store, pop, tx, timer = self.ha_processor, self.store_announce_processor, self.pop, self.tx, self.timer
        C = RequestCode
        return {
            # SendMessageProcessor
            C.SEND_MESSAGE: send.on_send,
            C.SEND_MESSAGE_V2: send.on_send,
            C.SEND_BATCH_MESSAGE: send.on_send,
            C.CONSUMER_SEND_MSG_BACK: send.on_send_back,
            # PullMessageProcessor
            C.PULL_MESSAGE: pull.on_pull,
            # QueryMessageProcessor
            C.QUERY_MESSAGE: query.on_query_message,
            C.VIEW_MESSAGE_BY_ID: query.on_view_message_by_id,
            # ClientManageProcessor
            C.HEART_BEAT: client.on_client_heartbeat,
            C.UNREGISTER_CLIENT: client.on_unregister_client,
            # ConsumerManageProcessor
            C.GET_CONSUMER_LIST_BY_GROUP: consumer.on_consumer_list,
            C.QUERY_CONSUMER_OFFSET: consumer.on_query_consumer_offset,
            C.UPDATE_CONSUMER_OFFSET: consumer.on_update_consumer_offset,
            # AdminBrokerProcessor
            C.UPDATE_AND_CREATE_TOPIC: admin.on_update_topic,
            C.DELETE_TOPIC_IN_BROKER: admin.on_delete_topic,
            C.GET_ALL_TOPIC_CONFIG: admin.on_get_all_topic_config,
            C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.on_update_group,
            C.DELETE_SUBSCRIPTIONGROUP: admin.on_delete_group,
            C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.on_get_all_groups,
            C.GET_ALL_CONSUMER_OFFSET: admin.on_get_all_consumer_offset,
            C.GET_ALL_DELAY_OFFSET: admin.on_get_all_delay_offset,
            C.GET_MAX_OFFSET: admin.on_get_max_offset,
            C.GET_MIN_OFFSET: admin.on_get_min_offset,
            C.SEARCH_OFFSET_BY_TIMESTAMP: admin.on_search_offset_by_timestamp,
            C.GET_EARLIEST_MSG_STORETIME: admin.on_earliest_msg_storetime,
            C.GET_TOPIC_STATS_INFO: admin.on_topic_stats,
            C.GET_BROKER_CONFIG: admin.on_get_broker_config,
            C.UPDATE_BROKER_CONFIG: admin.on_update_broker_config,
            C.GET_BROKER_RUNTIME_INFO: admin.on_runtime_info,
            C.VIEW_BROKER_STATS_DATA: admin.on_view_broker_stats,
            C.GET_LATENCY_TRACE: admin.on_latency_trace,
            C.GET_PRODUCER_CONNECTION_LIST: admin.on_producer_connection_list,
            C.GET_ALL_PRODUCER_INFO: admin.on_all_producer_info,
            C.LOCK_BATCH_MQ: admin.on_lock_batch_mq,
            C.UNLOCK_BATCH_MQ: admin.on_unlock_batch_mq,
            # EndTransactionProcessor, and the transaction service's admin listing
            C.END_TRANSACTION: self.end_transaction_processor.on_end_transaction,
            C.GET_HALF_MESSAGES: tx.on_list_half,
            # POP (PopMessageProcessor, AckMessageProcessor, ChangeInvisibleTimeProcessor)
            C.POP_MESSAGE: pop.on_pop,
            C.ACK_MESSAGE: pop.on_ack,
            C.BATCH_ACK_MESSAGE: pop.on_batch_ack,
            C.CHANGE_MESSAGE_INVISIBLETIME: pop.on_change_invisible_time,
            # timers (admin listing)
            C.GET_TIMER_PENDING: timer.on_pending,
            # rmq: the other actors of the group
            C.DISPATCH_ANNOUNCE: store.on_dispatch_announce,
            C.FLUSH_ANNOUNCE: store.on_flush_announce,
            C.CLEAN_ANNOUNCE: store.on_clean_announce,
            C.HA_ANNOUNCE: ha.on_ha_announce,
            C.HA_APPEND: ha.on_ha_append,
            C.HA_TRUNCATE: ha.on_ha_truncate,
        }

    def register_processors(self) -> None:
        for code, handler in self.processor_table().items():
            self.register_processor(code, handler)

    def register_processor(self, code: int, handler: Callable[[Frame, Reply], Optional[Frame]]) -> None:
        """Answer requests of ``code`` with ``handler`` (``registerProcessor``)."""
        self.handle(code, handler)

    def _start_metrics(self) -> None:
        self.metrics = M.BrokerMetrics(self.metrics_settings, self.cluster_name, self.broker_name, self.ctx,
                                       self._metric_gauges)
        self.serve_metrics(self.metrics, self.client_sock, "metricsPromExporterPort")

    def run(self) -> None:
        """The actor's loop; then the private ipc directory of a deep store path goes (its sockets
        were closed with the context: :func:`rmq.actors.broker_endpoints.release_ipc_dir`)."""
        try:
            super().run()
        finally:
            release_ipc_dir(self.store_path)

    def on_stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
            self.rpc_observer = None
        if self.store is None:
            return
        # the followers learn the final CommitLog end (a deferred announcement may be pending) and,
        # under SYNC_FLUSH, what the broker made durable itself: the flush actor's checkpoint follows
        self.announce_append(force=True)
        # answer what is parked: pulls get "not found", sync sends get what flush reported
        self.pull_processor.hold_service.answer_all()
        send = self.send_processor
        deadline = time.monotonic() + self.store_config.sync_flush_timeout / 1000.0
        while send.sync_waits and time.monotonic() < deadline:
            self.announce_append(force=True)
            if self.internal_sock.poll(50):
                for _ in range(256):
                    try:
                        parts = self.internal_sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._on_request(self.internal_sock, parts)
        send.release_sync_waits(force_timeout=True)
        self.persist_offsets()
        self.persist_delay_offsets()
        if self.timer is not None:
            self.timer.close()
        self.unregister_broker_all()
        self.store.persist_tables()
        self.store.close_for_handoff()

    # -- announcements ---------------------------------------------------------------------
    def after_poll(self) -> None:
        hs = self.pull_processor.hold_service
        if hs.appended_queues:
            hs.wake_from_appends()
        if self.send_processor.sync_waits and self.store_config.flush_disk_type == SYNC_FLUSH:
            self.store_announce_processor.group_commit_inline(SYNC_FLUSH_INLINE_MAX_BYTES)
        if self.announce_due:
            return                               # the timer announces what this turn appended
        if self.announce_interval_s <= 0 or self.announce_at_once():
            self.announce_append()
            return
        end = self.store.get_max_phy_offset()
        if end == self.quiet_end:
            return                               # revive-log records only: the next announcement takes them
        wait_s = self.last_announce_at + self.announce_interval_s - time.monotonic()
        if wait_s <= 0:
            self.announce_append()
        elif end != self.last_announced:
            self.announce_due = True
            self.add_timer(wait_s * 1000.0, self._announce_deferred, repeat=False)

    def note_quiet_append(self, wrote_offset: int, wrote_bytes: int) -> None:
        """Records at ``[wrote_offset, +wrote_bytes)`` (bytes) that no reader waits for: the POP
        revive log's checkpoints and acks (the POP service keeps them in memory; only a restart
        reads them back).  While nothing else was appended since the last announcement, they do
        not make one of their own: reput dispatches them with the next announcement, at the
        latest the APPEND_REANNOUNCE_MS tick.  Under appendAnnounceIntervalMs=0, SYNC_FLUSH,
        SYNC_MASTER or controller mode (:meth:`announce_at_once`) they are announced as any append.  Spares reput a
        round, and the broker its DISPATCH_ANNOUNCE, per POP and per ack: on this VM the sync
        SimpleConsumer's receive / ack_batch p50 went from 416-441 / 368-386 us to 321-384 / 290-341
        us (bench/results/client.md, stop 48)."""
        if wrote_offset == self.last_announced or wrote_offset == self.quiet_end:
            self.quiet_end = wrote_offset + wrote_bytes

    def announce_at_once(self) -> bool:
        """Whether this turn's appends are announced at once: a send waits for what the
        announcement starts (SYNC_FLUSH with records not yet durable: the flush actor's msync;
        SYNC_MASTER and allAckInSyncStateSet: the replica), or the role may change to that
        (controller mode)."""
        return (self.role == "SYNC_MASTER" or self.controller is not None
                or (self.store_config.flush_disk_type == SYNC_FLUSH
                    and self.store.get_max_phy_offset() > self.flushed_offset))

    def _announce_deferred(self) -> None:
        self.announce_due = False
        self.announce_append()

    def consumable_end(self) -> int:
        """The CommitLog offset up to which consumers may see records: the end, under SYNC_FLUSH the
        flushed offset, and with allAckInSyncStateSet (controller mode) at most the confirm offset:
        what every member of the SyncStateSet holds (RocketMQ 5's confirmOffset)."""
        base = self.flushed_offset if self.store_config.flush_disk_type == SYNC_FLUSH else \
            self.store.get_max_phy_offset()
        if self.controller is not None and self.controller.read_committed:
            return self.controller.update_confirm(base)
        return base

    def announce_append(self, force: bool = False) -> None:
        """PUB the CommitLog end: topic ANNOUNCE_APPEND after appends (reput, HA; flush under
        SYNC_FLUSH), ANNOUNCE_DURABLE instead under SYNC_FLUSH when the broker's own group commit
        already made them durable (reput, HA: the flush actor has nothing to do), topic
        ANNOUNCE_TICK every 200 ms (everyone, incl. late subscribers).
        ``confirmed`` (-1: no bound) caps what reput dispatches (allAckInSyncStateSet)."""
        store = self.store
        end = store.get_max_phy_offset()
        confirmed = self.consumable_end() if self.controller is not None and self.controller.read_committed else -1
        if end == self.last_announced and confirmed == self.last_confirmed and not force:
            return
        self.last_announced = end
        self.quiet_end = -1
        self.last_confirmed = confirmed
        self.last_announce_at = time.monotonic()
        frame = Frame(RequestCode.APPEND_ANNOUNCE, flag=P.FLAG_ONEWAY,
                      fields={"end": end, "flushed": self.flushed_offset, "dispatched": self.dispatched_offset,
                              "minOffset": store.get_min_phy_offset(),
                              "storeTimestamp": store.get_last_store_timestamp(),
                              "confirmed": confirmed,
                              "brokerRole": self.role, "brokerAddr": self.broker_addr, "brokerId": self.broker_id,
                              "haMasterAddress": self.ha_master_address})
        try:
            topic = ANNOUNCE_TICK if force else ANNOUNCE_DURABLE if (
                self.store_config.flush_disk_type == SYNC_FLUSH and end <= self.flushed_offset) else ANNOUNCE_APPEND
            send_parts(self.pub_sock, [topic, *P.encode(frame)])
        except zmq.Again:
            pass

    def check_holds(self) -> None:
        """Every HOLD_CHECK_MS: expired long polls (pull and POP), parked sync sends, promotions."""
        hs = self.pull_processor.hold_service
        if hs.holds:
            hs.check_holds()
        if self.pop.holds:
            self.pop.expire_holds()
        if self.send_processor.sync_waits:
            self.send_processor.release_sync_waits()
        if self.ha_processor.pending_promotions:
            self.ha_processor.try_promotions()

    # -- delayed messages ------------------------------------------------------------------
    def deliver_delayed(self) -> None:
        if self.store_config.broker_role != "SLAVE":
            self.store.deliver_delayed()

    def persist_delay_offsets(self) -> None:
        self.store.delay_offset_manager.persist_soon()   # the writer's thread fsyncs (and logs a failure)

    # -- NameServer registration ---------------------------------------------------------------
    def topic_table_body(self) -> bytes:
        tcm = self.store.topic_config_manager
        return pack_body({"topicConfigTable": tcm.topic_config_table, "dataVersion": tcm.data_version.to_json()})

    def register_broker_all(self) -> None:
        if self.controller is not None and self.controller.replica_id <= 0:
            return                               # controller mode: no replica id yet, nothing to register as
        frame = Frame(RequestCode.REGISTER_BROKER, fields={
            "clusterName": self.cluster_name, "brokerAddr": self.broker_addr, "brokerName": self.broker_name,
            "brokerId": self.broker_id, "haServerAddr": self.ha_server_addr,
            "epoch": self.epochs.last_epoch() if self.role in MASTER_ROLES else 0}, bodies=[self.topic_table_body()])
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

    def _on_namesrv_connected(self, parts: list) -> None:
        """A NameServer connection completed its handshake (the first, or after a NameServer
        restart): REGISTER_BROKER now rather than at the next REGISTER_NAME_SERVER_PERIOD_MS tick."""
        try:
            event = parse_monitor_message([p.bytes if isinstance(p, zmq.Frame) else p for p in parts])["event"]
        except Exception:  # noqa: BLE001 - a malformed monitor message: the timer registers anyway
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.broker_addr:
            self.register_broker_all()

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

    # -- topics and groups (TopicConfigManager / SubscriptionGroupManager) -----------------------
    def topic_config(self, topic: str, create: bool, requested_queue_nums: int = 0) -> Optional[dict]:
        """The topic's config; with ``create``, a new one when autoCreateTopicEnable (or a %RETRY% /
        %DLQ% topic), with the producer's defaultTopicQueueNums capped by the broker's.  None: no topic."""
        tcm = self.store.topic_config_manager
        cfg = tcm.select_topic_config(topic)
        if cfg is None and create and (self.auto_create_topic or topic.startswith(SYSTEM_TOPIC_PREFIXES)):
            n = 1 if topic.startswith(SYSTEM_TOPIC_PREFIXES) else self.default_queue_nums
            if requested_queue_nums > 0:
                n = min(n, requested_queue_nums)
            cfg = tcm.new_topic_config(topic, n, n)
            tcm.update_topic_config(cfg)
            self.register_broker_all()
        return cfg

    def group_config(self, group: str) -> Optional[dict]:
        """The subscription group's config, created when autoCreateSubscriptionGroup; None: no group."""
        sgm = self.store.subscription_group_manager
        cfg = sgm.find_subscription_group_config(group)
        if cfg is None and self.auto_create_group:
            cfg = sgm.new_group_config(group)
            sgm.update_subscription_group_config(cfg, wait=False)   # no fsync on the request path
        return cfg

    # -- status and metrics ------------------------------------------------------------------------
    def update_stats(self) -> None:
        now = time.monotonic()
        t, puts, gets = self._last_stats
        dt = max(now - t, 1e-6)
        self.tps = {"putTps": (self.stats["putMessageTotal"] - puts) / dt,
                    "getTps": (self.stats["getMessageTotal"] - gets) / dt}
        self._last_stats = (now, self.stats["putMessageTotal"], self.stats["getMessageTotal"])

    def _metric_gauges(self, m: "M.BrokerMetrics") -> list:
        """The gauges of a scrape, computed in the loop (RocketMQ 5 names; rmq.metrics)."""
        now_ms = int(time.time() * 1000)
        out = []
        g = m.gauge("rocketmq_processor_watermark", "Requests waiting in the broker, by processor: pull = "
                    "long-polling pulls held, send = sends waiting for a flush or a slave", ["processor"])
        g.add_metric(m.values("pull"), len(self.pull_processor.hold_service))
        g.add_metric(m.values("send"), len(self.send_processor.sync_waits))
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
        n = sum(len(c) for c in self.client_manager.producer_table.values())
        if n:
            g.add_metric(m.values("python", VERSION.lower(), "remoting"), n)
        out.append(g)
        g = m.gauge("rocketmq_consumer_connections", "Consumer connections",
                    ["consumer_group", "language", "version", "consume_mode", "protocol_type", "is_system"])
        for group, members in self.client_manager.consumer_table.items():
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
                          self.store.get_message_store_timestamp, offsets.TOPIC_GROUP_SEPARATOR)
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
        lag_ms = self.ha_processor.lag_ms(now_ms)
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

    def persist_offsets(self) -> None:
        if self.pop is not None:
            self.pop.commit_revive_offsets()
        self.store.consumer_offset_manager.persist_soon()   # the writer's thread fsyncs (and logs a failure)


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


if __name__ == "__main__":
    sys.exit(main())
