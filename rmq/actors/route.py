"""The NameServer's route tables (RocketMQ's ``RouteInfoManager``), without sockets.

Tables (SPEC.md §14.1)::

    topic_queue_table    topic -> {broker_name: QueueData}
    broker_addr_table    broker_name -> BrokerData{cluster, broker_name, broker_addrs{broker_id: addr}}
    cluster_addr_table   cluster -> set(broker_name)
    broker_live_table    broker_addr -> BrokerLiveInfo{last_update_timestamp, data_version, ha_server_addr}

``last_update_timestamp`` is read from the injected clock's monotonic reading
(default :data:`rmq.clock.SYSTEM_CLOCK`, seconds), never the wall clock, so a
wall-clock step cannot expire or revive a broker (RELIABILITY.md T7).

QueueData, BrokerData and TopicRouteData are the shared route model of
:mod:`rmq.common.route` (imported here).  Their wire forms (``to_wire``) use RocketMQ's
camelCase names; ``brokerAddrs`` keys are the brokerId as a decimal string
(``{"0": "127.0.0.1:10911"}``), as in RocketMQ's JSON, so a peer can decode them with
msgpack's default ``strict_map_key=True``.

Concurrency: not thread-safe; the nameserver actor is its only user (one event
loop, so RocketMQ's read-write lock is not needed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Union

from rmq.clock import SYSTEM_CLOCK, Clock
from rmq.common.mix_all import MASTER_ID
from rmq.common.perm import PERM_WRITE
from rmq.common.route import BrokerData, QueueData, TopicRouteData

BROKER_CHANNEL_EXPIRED_TIME_MS = 120_000  # RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME
SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS = 10_000  # NamesrvController scan period (4.9)

DataVersion = tuple  # (timestamp ms, counter): compared as a whole, like DataVersion.equals


@dataclass
class BrokerLiveInfo:
    """Liveness of one broker address (RocketMQ ``BrokerLiveInfo``, without the channel)."""
    last_update_timestamp: float        # seconds, from RouteInfoManager.clock (monotonic)
    data_version: DataVersion
    ha_server_addr: str


@dataclass
class RegisterBrokerResult:
    """What a registering broker learns: its group's master and the master's HA address
    (both empty for a master, or while the group has no live master)."""
    master_addr: str = ""
    ha_server_addr: str = ""


class RouteInfoManager:
    """The four route tables and the operations of RocketMQ's RouteInfoManager.

    Parameters
    ----------
    clock : rmq.clock.Clock, or a callable returning float seconds
        Liveness reads only its monotonic reading (``Clock.monotonic``); a plain
        callable is taken as that reading.
    delete_topic_with_broker_registration : bool
        5.x ``deleteTopicWithBrokerRegistration`` (default False): when a master's
        changed topic table no longer lists a topic, drop that broker's queue data of it.
    """

    def __init__(self, clock: Union[Clock, Callable[[], float]] = SYSTEM_CLOCK,
                 delete_topic_with_broker_registration: bool = False):
        self.clock: Callable[[], float] = clock.monotonic if isinstance(clock, Clock) else clock
        self.delete_topic_with_broker_registration = delete_topic_with_broker_registration
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}

    # -- registration ------------------------------------------------------------------------
    def register_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str, topic_config_table: Optional[dict],
                        data_version: DataVersion) -> RegisterBrokerResult:
        """Add or refresh a broker (RouteInfoManager.registerBroker).

        Parameters
        ----------
        topic_config_table : dict or None
            topic -> validated TopicConfig map (``readQueueNums``, ``writeQueueNums``, ``perm``,
            ``topicSysFlag``); used only for a master, and only when its ``data_version``
            changed or this is its first registration.
        data_version : (int, int)
            The broker's (timestamp ms, counter).
        """
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        register_first = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is None:
            register_first = True
            broker_data = BrokerData(cluster_name, broker_name)
            self.broker_addr_table[broker_name] = broker_data
        # the same address registering with another id (slave promoted, id changed) replaces the old entry
        for bid in [b for b, a in broker_data.broker_addrs.items() if a == broker_addr and b != broker_id]:
            del broker_data.broker_addrs[bid]
        old_addr = broker_data.broker_addrs.get(broker_id)
        broker_data.broker_addrs[broker_id] = broker_addr
        register_first = register_first or old_addr is None

        if topic_config_table is not None and broker_id == MASTER_ID:
            if register_first or self.is_broker_topic_config_changed(broker_addr, data_version):
                if self.delete_topic_with_broker_registration:
                    for topic in [t for t in self.topics_of_broker(broker_name) if t not in topic_config_table]:
                        self._remove_queue_data(topic, broker_name)
                for topic, cfg in topic_config_table.items():
                    self._create_and_update_queue_data(broker_name, topic, cfg)

        self.broker_live_table[broker_addr] = BrokerLiveInfo(self.clock(), tuple(data_version), ha_server_addr)
        result = RegisterBrokerResult()
        if broker_id != MASTER_ID:
            master = broker_data.master_addr()
            if master is not None:
                live = self.broker_live_table.get(master)
                if live is not None:
                    result.master_addr = master
                    result.ha_server_addr = live.ha_server_addr
        return result

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        """True unless ``broker_addr`` is live with exactly ``data_version`` (isBrokerTopicConfigChanged)."""
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != tuple(data_version)

    def query_broker_data_version(self, broker_addr: str) -> Optional[DataVersion]:
        live = self.broker_live_table.get(broker_addr)
        return None if live is None else live.data_version

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update_timestamp = self.clock()

    def _create_and_update_queue_data(self, broker_name: str, topic: str, cfg: dict) -> None:
        qd = QueueData(broker_name, cfg["readQueueNums"], cfg["writeQueueNums"], cfg["perm"],
                       cfg.get("topicSysFlag", 0))
        per_broker = self.topic_queue_table.setdefault(topic, {})
        if per_broker.get(broker_name) != qd:
            per_broker[broker_name] = qd

    def unregister_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Remove one broker (RouteInfoManager.unregisterBroker); when its group becomes empty the
        group leaves its cluster and its queue data leaves every topic.  Returns True when the
        broker was known."""
        known = self.broker_live_table.pop(broker_addr, None) is not None
        broker_data = self.broker_addr_table.get(broker_name)
        remove_broker_name = False
        if broker_data is not None:
            # by address, as 5.x: a stale unregister cannot remove the id's newer address
            for bid in [b for b, a in broker_data.broker_addrs.items() if a == broker_addr]:
                del broker_data.broker_addrs[bid]
                known = True
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                remove_broker_name = True
        if remove_broker_name:
            names = self.cluster_addr_table.get(cluster_name)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster_name]
            self.remove_topic_by_broker_name(broker_name)
        return known

    # -- liveness ---------------------------------------------------------------------------
    def scan_not_active_broker(self, expired_ms: float = BROKER_CHANNEL_EXPIRED_TIME_MS) -> list:
        """Drop every broker not refreshed for more than ``expired_ms`` (scanNotActiveBroker);
        returns the dropped addresses."""
        now = self.clock()
        dead = [addr for addr, live in self.broker_live_table.items()
                if (now - live.last_update_timestamp) * 1000.0 > expired_ms]
        for addr in dead:
            self.on_broker_gone(addr)
        return dead

    def on_broker_gone(self, broker_addr: str) -> None:
        """Remove every trace of ``broker_addr`` (onChannelDestroy): its live entry, its address in
        any group, and for a group left empty its cluster entry and queue data (then empty topics)."""
        self.broker_live_table.pop(broker_addr, None)
        for broker_name, bd in list(self.broker_addr_table.items()):
            for bid in [b for b, a in bd.broker_addrs.items() if a == broker_addr]:
                del bd.broker_addrs[bid]
            if not bd.broker_addrs:
                del self.broker_addr_table[broker_name]
                for cluster, names in list(self.cluster_addr_table.items()):
                    names.discard(broker_name)
                    if not names:
                        del self.cluster_addr_table[cluster]
                self.remove_topic_by_broker_name(broker_name)

    # -- topics ----------------------------------------------------------------------------
    def _remove_queue_data(self, topic: str, broker_name: str) -> None:
        per_broker = self.topic_queue_table.get(topic)
        if per_broker is not None:
            per_broker.pop(broker_name, None)
            if not per_broker:
                del self.topic_queue_table[topic]

    def remove_topic_by_broker_name(self, broker_name: str) -> None:
        """Drop ``broker_name``'s queue data from every topic; drop topics left empty."""
        for topic in list(self.topic_queue_table):
            self._remove_queue_data(topic, broker_name)

    def topics_of_broker(self, broker_name: str) -> list:
        return [t for t, per_broker in self.topic_queue_table.items() if broker_name in per_broker]

    def delete_topic(self, topic: str, cluster_name: Optional[str] = None) -> bool:
        """DELETE_TOPIC_IN_NAMESRV: drop the topic (only its queue data on ``cluster_name``'s
        brokers when given, as 5.x).  Returns True when something was removed."""
        per_broker = self.topic_queue_table.get(topic)
        if per_broker is None:
            return False
        if cluster_name is None:
            del self.topic_queue_table[topic]
            return True
        names = self.cluster_addr_table.get(cluster_name, set())
        gone = [b for b in per_broker if b in names]
        for b in gone:
            self._remove_queue_data(topic, b)
        return bool(gone)

    def get_all_topic_list(self) -> list:
        return sorted(self.topic_queue_table)

    def get_topics_by_cluster(self, cluster_name: str) -> list:
        names = self.cluster_addr_table.get(cluster_name, set())
        return sorted(t for t, per_broker in self.topic_queue_table.items() if any(b in names for b in per_broker))

    def _operate_write_perm(self, broker_name: str, wipe: bool) -> int:
        count = 0
        for per_broker in self.topic_queue_table.values():
            qd = per_broker.get(broker_name)
            if qd is not None:
                qd.perm = qd.perm & ~PERM_WRITE if wipe else qd.perm | PERM_WRITE
                count += 1
        return count

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear PERM_WRITE on every topic of ``broker_name``; returns the number of topics touched."""
        return self._operate_write_perm(broker_name, wipe=True)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Set PERM_WRITE on every topic of ``broker_name``; returns the number of topics touched."""
        return self._operate_write_perm(broker_name, wipe=False)

    # -- reads -------------------------------------------------------------------------------
    def pickup_topic_route_data(self, topic: str) -> Optional[dict]:
        """TopicRouteData of ``topic`` in wire form ``{"queueDatas": [...], "brokerDatas": [...]}``,
        or None when the topic has no queue data or none of its brokers is known."""
        per_broker = self.topic_queue_table.get(topic)
        if not per_broker:
            return None
        broker_datas = tuple(self.broker_addr_table[b] for b in sorted(per_broker) if b in self.broker_addr_table)
        if not broker_datas:
            return None
        return TopicRouteData(tuple(per_broker[b] for b in sorted(per_broker)), broker_datas).to_wire()

    def get_all_cluster_info(self) -> dict:
        """ClusterInfo in wire form ``{"brokerAddrTable": {name: BrokerData}, "clusterAddrTable":
        {cluster: [brokerName, ...]}}``."""
        return {"brokerAddrTable": {n: bd.to_wire() for n, bd in sorted(self.broker_addr_table.items())},
                "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())}}

    def live_broker_addrs(self) -> Iterable[str]:
        return list(self.broker_live_table)
