"""AdminBrokerProcessor: topics, subscription groups, offsets, the broker's config, runtime info,
stats, producer connections and the queue locks of orderly consumption.

Source: RocketMQ ``broker/.../processor/AdminBrokerProcessor.java`` (and its
``RebalanceLockManager`` for LOCK_BATCH_MQ / UNLOCK_BATCH_MQ); SPEC.md §15 (admin), §9 (promotion:
:mod:`rmq.actors.processor.ha`).
"""
from __future__ import annotations

import time
from typing import Optional

from rmq import latency_trace as _lt
from rmq.actors.actor import Reply
from rmq.actors.processor import VERSION, RequestProcessor
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group, check_topic
from rmq.protocol import Frame, ProtocolError, ResponseCode, field_int, field_str, pack_body, unpack_body
from rmq.stats import STATS_NAMES
from rmq.store.cleaner import disk_usage_ratio
from rmq.store.config_manager import DEFAULT_QUEUE_NUMS

JAVA_LONG_MIN, JAVA_LONG_MAX = -(2 ** 63), 2 ** 63 - 1   # bounds of a long header field (timestamps)
REBALANCE_LOCK_MAX_LIVE_TIME_MS = 60_000     # rocketmq.broker.rebalance.lockMaxLiveTime (SPEC.md §15.2)
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
# broker.conf keys UPDATE_BROKER_CONFIG may change at runtime (RocketMQ CVE-2023-33246 / 37582:
# never filter-server or path settings); brokerRole + brokerId together promote a slave
RUNTIME_CONFIG_KEYS = frozenset({"brokerRole", "brokerId", "brokerPermission", "slaveReadEnable",
                                 "longPollingEnable", "autoCreateTopicEnable", "autoCreateSubscriptionGroup",
                                 "wakePullOnAppendEnable", "enablePropertyFilter"})
GROUP_CONFIG_KEYS = ("consumeEnable", "consumeBroadcastEnable", "retryQueueNums", "retryMaxTimes",
                     "brokerId", "whichBrokerWhenConsumeSlowly", "consumeFromMinEnable")


class AdminBrokerProcessor(RequestProcessor):

    def __init__(self, broker):
        super().__init__(broker)
        self.mq_locks: dict[tuple, tuple[str, float]] = {}   # (group, topic, broker, qid) -> (clientId, renewed)

    # -- topics ------------------------------------------------------------------------------------
    def on_update_topic(self, frame: Frame, reply: Reply) -> Frame:
        b = self.b
        topic = field_str(frame, "topic")
        try:
            check_topic(topic)
        except ValueError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        r = field_int(frame, "readQueueNums", DEFAULT_QUEUE_NUMS, lo=1, hi=MAX_QUEUE_NUMS)
        w = field_int(frame, "writeQueueNums", DEFAULT_QUEUE_NUMS, lo=1, hi=MAX_QUEUE_NUMS)
        perm = field_int(frame, "perm", PERM_READ | PERM_WRITE, lo=0, hi=15)
        order = bool(frame.fields.get("order", False))
        tcm = b.store.topic_config_manager
        tcm.update_topic_config(tcm.new_topic_config(topic, r, w, perm, order))
        b.register_broker_all()
        return frame.response()

    def on_delete_topic(self, frame: Frame, reply: Reply) -> Frame:
        b = self.b
        topic = field_str(frame, "topic")
        b.store.topic_config_manager.delete_topic_config(topic)
        self._forget_pull_offsets(lambda k: k[1] == topic)
        b.register_broker_all()
        return frame.response()

    def _forget_pull_offsets(self, match) -> None:
        """Drop the metrics' pull offsets of a deleted topic or group (keys (group, topic, queueId))."""
        offsets = self.b.pull_offsets
        for k in [k for k in offsets if match(k)]:
            del offsets[k]

    def on_get_all_topic_config(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[self.b.topic_table_body()])

    # -- subscription groups -----------------------------------------------------------------------
    def on_update_group(self, frame: Frame, reply: Reply) -> Frame:
        body = unpack_body(frame) if frame.bodies else {}
        group = check_group(field_str(frame, "groupName", body.get("groupName") if isinstance(body, dict) else None))
        sgm = self.b.store.subscription_group_manager
        cfg = sgm.new_group_config(group)
        if isinstance(body, dict):
            for k in GROUP_CONFIG_KEYS:
                if k in body:
                    cfg[k] = body[k]
        sgm.update_subscription_group_config(cfg)
        return frame.response()

    def on_delete_group(self, frame: Frame, reply: Reply) -> Frame:
        group = field_str(frame, "groupName")
        self.b.store.subscription_group_manager.delete_subscription_group_config(group)
        self._forget_pull_offsets(lambda k: k[0] == group)
        return frame.response()

    def on_get_all_groups(self, frame: Frame, reply: Reply) -> Frame:
        sgm = self.b.store.subscription_group_manager
        return frame.response(bodies=[pack_body({"subscriptionGroupTable": sgm.subscription_group_table})])

    # -- offsets ------------------------------------------------------------------------------------
    def on_get_all_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        b = self.b
        body = b.store.consumer_offset_manager.encode()
        inflight: dict = {}
        for (group, topic, qid), n in b.pop.inflight().items():      # POP groups: popped, not acked
            inflight.setdefault(f"{topic}@{group}", {})[str(qid)] = n
        body["popInflightTable"] = inflight
        return frame.response(bodies=[pack_body(body)])

    def on_get_all_delay_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[pack_body(self.b.store.delay_offset_manager.encode())])

    def on_get_max_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.b.store.get_max_offset_in_queue(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1))})

    def on_get_min_offset(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.b.store.get_min_offset_in_queue(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1))})

    def on_search_offset_by_timestamp(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(fields={"offset": self.b.store.get_offset_in_queue_by_time(
            field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1),
            field_int(frame, "timestamp", lo=JAVA_LONG_MIN, hi=JAVA_LONG_MAX))})

    def on_earliest_msg_storetime(self, frame: Frame, reply: Reply) -> Frame:
        store = self.b.store
        topic, queue_id = field_str(frame, "topic"), field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        res = store.get_messages("%EARLIEST%", topic, queue_id, store.get_min_offset_in_queue(topic, queue_id), 1)
        msgs = res.messages()
        return frame.response(fields={"timestamp": msgs[0].store_timestamp if msgs else -1})

    def on_topic_stats(self, frame: Frame, reply: Reply) -> Frame:
        store = self.b.store
        topic = field_str(frame, "topic")
        cfg = store.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = [{"queueId": q, "minOffset": store.get_min_offset_in_queue(topic, q),
                  "maxOffset": store.get_max_offset_in_queue(topic, q)} for q in range(cfg["readQueueNums"])]
        epoch = self.b.epochs.last_epoch()      # rmq: the HA epoch these offsets belong to (the Spark
        fields = {"brokerEpoch": epoch} if epoch > 0 else None     # source checks its positions by it)
        return frame.response(fields=fields, bodies=[pack_body({"offsetTable": table})])

    # -- broker config ------------------------------------------------------------------------------
    def on_get_broker_config(self, frame: Frame, reply: Reply) -> Frame:
        b = self.b
        cfg = {k: str(v) for k, v in b.settings.items()}
        cfg.update({"brokerRole": b.role, "brokerId": str(b.broker_id),
                    "slaveReadEnable": str(b.slave_read_enable).lower()})
        return frame.response(bodies=[pack_body({"config": cfg})])

    def on_update_broker_config(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        """UPDATE_BROKER_CONFIG (25): runtime changes of allow-listed keys (RUNTIME_CONFIG_KEYS).

        ``brokerRole`` = ASYNC_MASTER | SYNC_MASTER with ``brokerId`` = 0 promotes a SLAVE
        (:meth:`rmq.actors.processor.ha.HAProcessor.request_promotion`); answered once done."""
        b = self.b
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
            if b.controller is not None:
                return frame.response(ResponseCode.SYSTEM_ERROR,
                                      "controller mode: the controllers elect the master; use "
                                      "`rmq admin electMaster -a CONTROLLER -N BROKER_NAME -b THIS_ADDR`")
            if b.role != "SLAVE":
                if b.role == role:
                    return self.apply_runtime_props(frame, props)
                return frame.response(ResponseCode.SYSTEM_ERROR, f"this broker is already {b.role}")
            return b.ha_processor.request_promotion(frame, reply, role, props)
        return self.apply_runtime_props(frame, props)

    def apply_runtime_props(self, frame: Frame, props: dict) -> Frame:
        b = self.b
        for k, v in props.items():
            if k == "brokerPermission":
                b.broker_permission = int(v)
                b.register_broker_all()
            elif k == "slaveReadEnable":
                b.slave_read_enable = v.lower() == "true"
            elif k == "longPollingEnable":
                b.long_polling = v.lower() == "true"
            elif k == "enablePropertyFilter":
                b.enable_property_filter = v.lower() == "true"
            elif k == "wakePullOnAppendEnable":
                b.wake_pull_on_append = v.lower() == "true"
            elif k == "autoCreateTopicEnable":
                b.auto_create_topic = v.lower() == "true"
            elif k == "autoCreateSubscriptionGroup":
                b.auto_create_group = v.lower() == "true"
            b.settings[k] = v
        return frame.response()

    # -- status ---------------------------------------------------------------------------------------
    def runtime_info(self) -> dict:
        """GET_BROKER_RUNTIME_INFO's table: counters, offsets (bytes), role and HA state."""
        b = self.b
        store = b.store
        lo, hi = store.get_min_phy_offset(), store.get_max_phy_offset()
        return {**b.stats, **b.tps, "commitLogMinOffset": lo,
                "commitLogMaxOffset": hi, "flushedOffset": b.flushed_offset,
                "dispatchedOffset": b.dispatched_offset,
                "dispatchBehindBytes": max(0, hi - b.dispatched_offset),
                "flushDiskType": b.store_config.flush_disk_type,
                "brokerName": b.broker_name, "brokerAddr": b.broker_addr,
                "clusterName": b.cluster_name, "bootTimestamp": int(b.started_at * 1000),
                "version": VERSION, "parkedPulls": len(b.pull_processor.hold_service),
                "parkedSyncSends": len(b.send_processor.sync_waits), "brokerRole": b.role, "brokerId": b.broker_id,
                # late sends refused SYSTEM_BUSY before being decoded (flow control)
                "sendShedBusy": b.send_processor.shed,
                "haEpoch": b.epochs.last_epoch(), "haServerAddr": b.ha_server_addr,
                "haMasterAddress": b.ha_master_address if b.role == "SLAVE" else "",
                "masterAddr": b.master_broker_addr if b.role == "SLAVE" else "",
                "haConnected": bool(b.ha_state.get("connected", False)),
                "haMasterMaxOffset": int(b.ha_state.get("masterMaxOffset", 0) or 0),
                "haSlaves": b.ha_slaves, "haSlaveAckOffset": b.ha_ack_offset,
                "haLagMs": b.ha_processor.lag_ms(int(time.time() * 1000)),
                "slaveReadEnable": b.slave_read_enable, "fencedByEpoch": b.fenced_by,
                "flushBehindBytes": max(0, hi - b.flushed_offset),
                "recoveryTimeMs": round(b.recovery_ms, 3),
                # used / (used + available) of the store's file system, RocketMQ's way (-1: unknown)
                "commitLogDiskRatio": disk_usage_ratio(b.store_path),
                "metricsUrl": (f"http://{b.metrics_settings.host}:{b.metrics.port}/metrics"
                               if b.metrics is not None else ""),
                # replication counters of the ha actor: bytes pushed / applied, handshakes, link
                # resets, sends ZeroMQ refused (ROUTER_MANDATORY: counted, never silent), and
                # handshakes refused for a peer of another broker set
                "haStats": {k: int(b.ha_state.get(k, 0) or 0)
                            for k in ("pushedBytes", "appliedBytes", "handshakes", "resets", "dropped",
                                      "refusedHandshakes")},
                # POP (rmq.actors.pop): messages popped / acked / revived / to the DLQ, checkpoints,
                # revive-log appends and their records (a turn's group commit), messages in flight
                "popStats": b.pop.runtime_stats() if b.pop is not None else {}}

    def on_runtime_info(self, frame: Frame, reply: Reply) -> Frame:
        return frame.response(bodies=[pack_body({"table": self.runtime_info()})])

    def on_view_broker_stats(self, frame: Frame, reply: Reply) -> Frame:
        """VIEW_BROKER_STATS_DATA: fields ``statsName`` (rmq.stats.STATS_NAMES) and ``statsKey``
        (topic, or topic@group); body: BrokerStatsData ``{statsMinute, statsHour, statsDay}``, each
        ``{sum, tps, avgpt}``.  Without ``statsKey`` (rmq's extension) the body is
        ``{"statsTable": {key: BrokerStatsData}}`` for every key, one request instead of one a key."""
        name = field_str(frame, "statsName")
        try:
            items = self.b.broker_stats.set_of(name)
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

    # -- producers -------------------------------------------------------------------------------------
    def on_producer_connection_list(self, frame: Frame, reply: Reply) -> Frame:
        """GET_PRODUCER_CONNECTION_LIST: the producers of ``producerGroup`` that sent a heartbeat
        within ``channelExpiredTimeout``; body ``{"connectionSet": [{clientId, language, version,
        lastUpdateTimestamp (ms)}]}``, SYSTEM_ERROR when there is none (RocketMQ's answer)."""
        group = field_str(frame, "producerGroup")
        rows = self.b.client_manager.producer_rows(group)
        if not rows:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return frame.response(bodies=[pack_body({"connectionSet": rows})])

    def on_all_producer_info(self, frame: Frame, reply: Reply) -> Frame:
        """GET_ALL_PRODUCER_INFO: ``{"producerTable": {group: [connection]}}`` (see
        :meth:`on_producer_connection_list`) of every producer group with a live producer."""
        cm = self.b.client_manager
        table = {g: cm.producer_rows(g) for g in sorted(cm.producer_table) if cm.producer_table[g]}
        return frame.response(bodies=[pack_body({"producerTable": table})])

    # -- queue locks (orderly consumption) ---------------------------------------------------------------
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
