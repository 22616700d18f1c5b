"""Client-side routes and broker fault avoidance, shared by producers and consumers.

* :class:`TopicRouteData` -- a NameServer answer to GET_ROUTEINFO_BY_TOPIC
  (``queueDatas`` + ``brokerDatas``, SPEC.md §14.1), parsed and checked (the route model,
  with :class:`QueueData` and :class:`BrokerData`, lives in :mod:`rmq.common.route`; imported here);
* :class:`TopicPublishInfo` -- the writable queues of a topic with the
  producer's round-robin counter (RocketMQ ``TopicPublishInfo``);
* :class:`RouteCache` -- topic -> route, broker name -> addresses, publish and
  subscribe queue lists (RocketMQ ``MQClientInstance`` tables);
* :class:`LatencyFaultTolerance` and :class:`MQFaultStrategy` -- RocketMQ's
  latency-based broker isolation (``LatencyFaultToleranceImpl``,
  ``MQFaultStrategy``) with the 4.9 tables by default (SPEC.md §15.1);
* request builders / response parsers for the NameServer (no sockets here:
  the caller owns its I/O, blocking, threaded or asyncio).

Everything is thread-safe (one lock per object) and takes an injectable
``clock`` (milliseconds, monotonic) so tests can move time.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Callable, Iterable, Optional, Sequence

from rmq.client.message import MessageQueue
from rmq.common.mix_all import MASTER_ID
from rmq.common.perm import PERM_INHERIT, PERM_PRIORITY, PERM_READ, PERM_WRITE   # PermName (SPEC.md §14.3)
from rmq.common.route import (BrokerData, QueueData, TopicRouteData, find_broker_address_in_subscribe,
                              find_master_or_slave)
from rmq.errors import MQClientError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, unpack_body

# A request that failed on a broker (no answer, connection lost, SERVICE_NOT_AVAILABLE: a dead or
# fenced master) refetches the topic's route at most this often, so a master elected in its place
# (controller mode, promoteSlave) is used within about a second rather than at the next 30 s poll
# (Kafka's clients refresh metadata on NOT_LEADER_OR_FOLLOWER the same way; RocketMQ's wait for the poll).
ROUTE_REFRESH_ON_FAILURE_MS = 1000
ROUTE_SUSPECT_CODES = frozenset({int(ResponseCode.SERVICE_NOT_AVAILABLE), int(ResponseCode.NO_PERMISSION),
                                 int(ResponseCode.TOPIC_NOT_EXIST)})

# MQFaultStrategy tables (SPEC.md §15.1), milliseconds
LATENCY_MAX_49 = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_49 = (0, 0, 30000, 60000, 120000, 180000, 600000)
LATENCY_MAX_5 = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_DURATION_5 = (0, 0, 2000, 5000, 6000, 10000, 30000)
ISOLATION_LATENCY_MS_49 = 30000                 # pseudo latency of a failed send (4.9) -> last bucket, 600 s
ISOLATION_LATENCY_MS_5 = 10000                  # 5.x -> bucket 5, 10 s

Clock = Callable[[], float]


def monotonic_ms() -> float:
    """Default clock of this module: monotonic milliseconds."""
    return time.monotonic() * 1000.0


def split_namesrv_addr(namesrv_addr: str) -> list:
    """``"a:9876;b:9876"`` -> ``["a:9876", "b:9876"]`` (RocketMQ's separator; blanks and ``tcp://`` dropped).

    Raises
    ------
    MQClientError
        No address, or an address without ``host:port``.
    """
    if not isinstance(namesrv_addr, str):
        raise MQClientError(f"namesrv_addr must be a str like '127.0.0.1:9876', got {type(namesrv_addr).__name__}")
    out = []
    for a in namesrv_addr.replace(",", ";").split(";"):
        a = a.strip()
        if a.startswith("tcp://"):
            a = a[len("tcp://"):]
        if not a:
            continue
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MQClientError(f"NameServer address {a!r} is not host:port")
        out.append(a)
    if not out:
        raise MQClientError(f"no NameServer address in {namesrv_addr!r}")
    return out


def namesrv_attempt_s(left_s: float, left_to_try: int) -> float:
    """How long one NameServer is waited for: an equal share of what is left of the budget for
    each NameServer still to try, so that one that never answers (down, unreachable: ZeroMQ
    queues the request and says nothing) still leaves the next ones the time to answer within the
    caller's budget.  Seconds (or any unit ``left_s`` comes in)."""
    return left_s / max(1, left_to_try)



class TopicPublishInfo:
    """The queues a producer may write, plus the round-robin index (RocketMQ ``TopicPublishInfo``).

    Parameters
    ----------
    topic : str
    message_queue_list : sequence of MessageQueue
        In route order (broker name, then queue id).
    order_topic : bool
    provisional : bool
        True when the NameServer had no route yet and the list was made up
        from the cluster's brokers (the topic is auto-created by the broker on
        the first send; ``queue_id == -1`` lets the broker pick the queue).
    start_index : int, optional
        Initial round-robin value (random by default, like RocketMQ's ThreadLocalIndex).
    """

    def __init__(self, topic: str, message_queue_list: Sequence[MessageQueue], order_topic: bool = False,
                 provisional: bool = False, start_index: Optional[int] = None,
                 route: Optional[TopicRouteData] = None):
        self.topic = topic
        self.message_queue_list = list(message_queue_list)
        self.order_topic = order_topic
        self.provisional = provisional
        self.route = route
        self._index = random.randrange(1 << 16) if start_index is None else start_index
        self._lock = threading.Lock()

    @property
    def ok(self) -> bool:
        """Has at least one queue (RocketMQ ``ok()``)."""
        return bool(self.message_queue_list)

    def next_index(self) -> int:
        """The round-robin counter, post-incremented (``sendWhichQueue.incrementAndGet``)."""
        with self._lock:
            self._index += 1
            return self._index

    @property
    def index(self) -> int:
        return self._index

    def select_one_message_queue(self, last_broker_name: Optional[str] = None) -> MessageQueue:
        """Round robin; on a retry prefer a queue of another broker than ``last_broker_name``.

        Raises
        ------
        MQClientError
            No queue at all.
        """
        mqs = self.message_queue_list
        if not mqs:
            raise MQClientError(f"No route info of this topic: {self.topic} (no writable queue)")
        if last_broker_name is not None:
            for _ in range(len(mqs)):
                mq = mqs[self.next_index() % len(mqs)]
                if mq.broker_name != last_broker_name:
                    return mq
        return mqs[self.next_index() % len(mqs)]

    def write_queue_nums_of(self, broker_name: str) -> int:
        """Number of writable queues of ``broker_name`` (RocketMQ ``getQueueIdByBroker``)."""
        return sum(1 for mq in self.message_queue_list if mq.broker_name == broker_name)

    def __repr__(self) -> str:
        return (f"TopicPublishInfo({self.topic!r}, {len(self.message_queue_list)} queues"
                f"{', provisional' if self.provisional else ''})")


def route_to_publish_info(topic: str, route: TopicRouteData, start_index: Optional[int] = None) -> TopicPublishInfo:
    """Writable queues: every writable QueueData of a broker group with a master,
    ``writeQueueNums`` queues each (RocketMQ ``topicRouteData2TopicPublishInfo``)."""
    mqs = []
    for qd in route.queue_datas:
        if not qd.writeable:
            continue
        bd = route.broker(qd.broker_name)
        if bd is None or bd.master_addr() is None:
            continue
        mqs.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return TopicPublishInfo(topic, mqs, bool(route.order_topic_conf), start_index=start_index, route=route)


def route_to_subscribe_info(topic: str, route: TopicRouteData) -> list:
    """Readable queues: ``readQueueNums`` queues of every readable QueueData
    (RocketMQ ``topicRouteData2TopicSubscribeInfo``)."""
    mqs = []
    for qd in route.queue_datas:
        if qd.readable:
            mqs.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return mqs


class RouteCache:
    """topic -> TopicRouteData, plus what producers and consumers derive from it.

    Concurrency: every method takes the cache's lock; safe from any thread.
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._routes: dict = {}          # topic -> TopicRouteData
        self._publish: dict = {}         # topic -> TopicPublishInfo
        self._brokers: dict = {}         # broker name -> BrokerData (latest seen)

    def update(self, topic: str, route: TopicRouteData) -> bool:
        """Store ``route``; returns True when it differs from the cached one (or the cached one was provisional)."""
        with self._lock:
            old = self._routes.get(topic)
            pub = self._publish.get(topic)
            for bd in route.broker_datas:
                self._brokers[bd.broker_name] = bd
            if old == route and pub is not None and not pub.provisional:
                return False
            self._routes[topic] = route
            self._publish[topic] = route_to_publish_info(topic, route, None if pub is None else pub.index)
            return True

    def set_provisional(self, topic: str, brokers: Iterable[BrokerData]) -> TopicPublishInfo:
        """Publish info for a topic the NameServer does not know yet: one ``queue_id = -1``
        entry per broker group with a master (the broker picks the queue and creates the topic)."""
        with self._lock:
            mqs = []
            for bd in sorted(brokers, key=lambda b: b.broker_name):
                self._brokers[bd.broker_name] = bd
                if bd.master_addr() is not None:
                    mqs.append(MessageQueue(topic, bd.broker_name, -1))
            old = self._publish.get(topic)
            info = TopicPublishInfo(topic, mqs, provisional=True, start_index=None if old is None else old.index)
            self._publish[topic] = info
            return info

    def remove(self, topic: str) -> None:
        with self._lock:
            self._routes.pop(topic, None)
            self._publish.pop(topic, None)

    def route(self, topic: str) -> Optional[TopicRouteData]:
        with self._lock:
            return self._routes.get(topic)

    def publish_info(self, topic: str) -> Optional[TopicPublishInfo]:
        # no lock: one dict read is atomic, and writers replace an entry whole (every send asks this)
        return self._publish.get(topic)

    def subscribe_info(self, topic: str) -> Optional[list]:
        with self._lock:
            r = self._routes.get(topic)
            return None if r is None else route_to_subscribe_info(topic, r)

    def topics(self) -> list:
        with self._lock:
            return sorted(self._publish)

    def update_brokers(self, brokers: Iterable[BrokerData]) -> None:
        with self._lock:
            for bd in brokers:
                self._brokers[bd.broker_name] = bd

    def brokers(self) -> list:
        with self._lock:
            return list(self._brokers.values())

    def master_addrs(self) -> list:
        """The master address of every broker group seen in a route (groups without one left out)."""
        with self._lock:
            return sorted({a for a in (bd.master_addr() for bd in self._brokers.values()) if a})

    def find_broker_addr(self, broker_name: str, master_only: bool = True) -> Optional[str]:
        """Address of ``broker_name``: its master, or (``master_only=False``) any address."""
        with self._lock:
            bd = self._brokers.get(broker_name)
            if bd is None:
                return None
            return bd.master_addr() if master_only else bd.select_broker_addr()


# -- NameServer requests ----------------------------------------------------------------------------------
def route_request(topic: str) -> Frame:
    """GET_ROUTEINFO_BY_TOPIC for ``topic``."""
    return Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})


def parse_route_response(frame: Frame, topic: str) -> Optional[TopicRouteData]:
    """The route in a GET_ROUTEINFO_BY_TOPIC response; None for TOPIC_NOT_EXIST.

    Raises
    ------
    MQClientError
        Any other error code (``response_code`` set), or a malformed body.
    """
    if frame.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    if frame.code != ResponseCode.SUCCESS:
        raise MQClientError(f"route of topic {topic!r}: {frame.remark or 'error'}", frame.code)
    try:
        body = unpack_body(frame)
    except ProtocolError as e:
        raise MQClientError(f"route of topic {topic!r}: {e.remark}") from None
    return TopicRouteData.from_wire(body, topic)


def cluster_info_request() -> Frame:
    """GET_BROKER_CLUSTER_INFO."""
    return Frame(RequestCode.GET_BROKER_CLUSTER_INFO)


def parse_cluster_info(frame: Frame) -> list:
    """The broker groups (list of BrokerData) in a GET_BROKER_CLUSTER_INFO response.

    Raises
    ------
    MQClientError
        Error code or malformed body.
    """
    return parse_cluster_tables(frame)[0]


def parse_cluster_tables(frame: Frame) -> tuple:
    """``(broker groups, clusters)`` of a GET_BROKER_CLUSTER_INFO response: the BrokerData of
    ``brokerAddrTable`` sorted by name, and ``clusterAddrTable`` as ``{cluster: [brokerName]}``
    (names sorted; {} when the table is absent).

    Raises
    ------
    MQClientError
        Error code or malformed body (the message names the table).
    """
    if frame.code != ResponseCode.SUCCESS:
        raise MQClientError(f"cluster info: {frame.remark or 'error'}", frame.code)
    try:
        body = unpack_body(frame)
    except ProtocolError as e:
        raise MQClientError(f"cluster info: {e.remark}") from None
    table = body.get("brokerAddrTable") if isinstance(body, dict) else None
    if not isinstance(table, dict):
        raise MQClientError("cluster info: brokerAddrTable missing")
    brokers = sorted((BrokerData.from_wire(bd, "cluster info") for bd in table.values()), key=lambda b: b.broker_name)
    clusters = body.get("clusterAddrTable") or {}
    if not isinstance(clusters, dict) or not all(isinstance(v, (list, tuple)) for v in clusters.values()):
        raise MQClientError(f"cluster info: clusterAddrTable must map cluster -> [brokerName], got {clusters!r:.200}")
    return brokers, {str(c): sorted(str(n) for n in names) for c, names in clusters.items()}


# -- latency fault tolerance ------------------------------------------------------------------------------
class FaultItem:
    """One broker's last latency and when it becomes available again (RocketMQ ``FaultItem``)."""

    __slots__ = ("name", "current_latency", "start_timestamp")

    def __init__(self, name: str, current_latency: float, start_timestamp: float):
        self.name = name
        self.current_latency = current_latency      # ms
        self.start_timestamp = start_timestamp      # clock ms when the broker is available again

    def is_available(self, now_ms: float) -> bool:
        return now_ms - self.start_timestamp >= 0

    def __repr__(self) -> str:
        return f"FaultItem({self.name!r}, latency={self.current_latency}, until={self.start_timestamp})"


class LatencyFaultTolerance:
    """Broker name -> FaultItem (RocketMQ ``LatencyFaultToleranceImpl``).

    Parameters
    ----------
    clock : callable, optional
        Returns monotonic milliseconds (default :func:`monotonic_ms`).
    """

    def __init__(self, clock: Optional[Clock] = None):
        self.clock = clock or monotonic_ms
        self._items: dict = {}
        self._which_item_worst = random.randrange(1 << 16)
        self._lock = threading.Lock()

    def update_fault_item(self, name: str, current_latency: float, not_available_duration: float) -> None:
        """Record ``current_latency`` (ms); ``name`` is unavailable for ``not_available_duration`` ms from now."""
        with self._lock:
            self._items[name] = FaultItem(name, current_latency, self.clock() + not_available_duration)

    def is_available(self, name: str) -> bool:
        with self._lock:
            item = self._items.get(name)
            return item is None or item.is_available(self.clock())

    def remove(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)

    def items(self) -> dict:
        """A copy of the table (for status and tests)."""
        with self._lock:
            return {k: FaultItem(v.name, v.current_latency, v.start_timestamp) for k, v in self._items.items()}

    def pick_one_at_least(self) -> Optional[str]:
        """A broker to use when none is available: available ones first, then by lowest latency,
        then soonest available; round robin over the better half (RocketMQ ``pickOneAtLeast``)."""
        with self._lock:
            if not self._items:
                return None
            now = self.clock()
            items = list(self._items.values())
            random.shuffle(items)
            items.sort(key=lambda it: (not it.is_available(now), it.current_latency, it.start_timestamp))
            half = len(items) // 2
            if half <= 0:
                return items[0].name
            self._which_item_worst += 1
            return items[self._which_item_worst % half].name


class MQFaultStrategy:
    """Latency-based queue selection (RocketMQ ``MQFaultStrategy``, SPEC.md §15.1).

    Parameters
    ----------
    enabled : bool
        ``sendLatencyFaultEnable`` (RocketMQ's default False: plain round robin
        that avoids the last failed broker on a retry).
    latency_max, not_available_duration : sequence of int, ms
        The bucket tables; 4.9's by default (``LATENCY_MAX_5`` /
        ``NOT_AVAILABLE_DURATION_5`` for 5.x behaviour).
    isolation_latency_ms : int
        Pseudo latency recorded for a failed send (30 000 in 4.9, 10 000 in 5.x).
    clock : callable, optional
        Monotonic milliseconds.
    """

    def __init__(self, enabled: bool = False, latency_max: Sequence[int] = LATENCY_MAX_49,
                 not_available_duration: Sequence[int] = NOT_AVAILABLE_DURATION_49,
                 isolation_latency_ms: int = ISOLATION_LATENCY_MS_49, clock: Optional[Clock] = None):
        if len(latency_max) != len(not_available_duration) or not latency_max:
            raise ValueError(f"latency_max ({len(latency_max)}) and not_available_duration "
                             f"({len(not_available_duration)}) must have the same non-zero length")
        if list(latency_max) != sorted(latency_max):
            raise ValueError(f"latency_max must be ascending, got {list(latency_max)}")
        self.enabled = enabled
        self.latency_max = tuple(latency_max)
        self.not_available_duration = tuple(not_available_duration)
        self.isolation_latency_ms = isolation_latency_ms
        self.latency_fault_tolerance = LatencyFaultTolerance(clock)
        self._lock = threading.Lock()    # select / update may come from several threads

    def compute_not_available_duration(self, current_latency: float) -> int:
        """``notAvailableDuration[i]`` for the largest ``i`` with ``latency >= latencyMax[i]``, else 0."""
        for i in range(len(self.latency_max) - 1, -1, -1):
            if current_latency >= self.latency_max[i]:
                return self.not_available_duration[i]
        return 0

    def update_fault_item(self, broker_name: str, current_latency: float, isolation: bool) -> None:
        """After a send to ``broker_name`` took ``current_latency`` ms (``isolation``: it failed).
        No effect unless the strategy is enabled (as RocketMQ)."""
        if not self.enabled:
            return
        latency = self.isolation_latency_ms if isolation else current_latency
        with self._lock:
            self.latency_fault_tolerance.update_fault_item(
                broker_name, latency, self.compute_not_available_duration(latency))

    def is_available(self, broker_name: str) -> bool:
        return self.latency_fault_tolerance.is_available(broker_name)

    def select_one_message_queue(self, info: TopicPublishInfo, last_broker_name: Optional[str] = None
                                 ) -> MessageQueue:
        """The queue for the next attempt (RocketMQ ``selectOneMessageQueue``).

        Enabled: the first queue in round-robin order whose broker is available
        (and, on a retry, is not ``last_broker_name`` when another is available);
        if none is, a "not best" broker from :meth:`LatencyFaultTolerance.pick_one_at_least`.
        Disabled: round robin avoiding ``last_broker_name``.

        Raises
        ------
        MQClientError
            The topic has no writable queue.
        """
        if not self.enabled:
            return info.select_one_message_queue(last_broker_name)
        with self._lock:          # the I/O thread and callers' threads (synchronous sends) share the table
            return self._select_enabled(info, last_broker_name)

    def _select_enabled(self, info: TopicPublishInfo, last_broker_name: Optional[str]) -> MessageQueue:
        mqs = info.message_queue_list
        if not mqs:
            raise MQClientError(f"No route info of this topic: {info.topic} (no writable queue)")
        lft = self.latency_fault_tolerance
        index = info.next_index()
        fallback = None
        for i in range(len(mqs)):
            mq = mqs[(index + i) % len(mqs)]
            if lft.is_available(mq.broker_name):
                if last_broker_name is None or mq.broker_name != last_broker_name:
                    return mq
                if fallback is None:
                    fallback = mq
        if fallback is not None:
            return fallback
        not_best = lft.pick_one_at_least()
        if not_best is not None:
            n = info.write_queue_nums_of(not_best)
            if n > 0:
                queues = [mq for mq in mqs if mq.broker_name == not_best]
                return queues[info.next_index() % n]
            lft.remove(not_best)
        return info.select_one_message_queue()


__all__ = ["QueueData", "BrokerData", "TopicRouteData", "TopicPublishInfo", "RouteCache", "FaultItem",
           "LatencyFaultTolerance", "MQFaultStrategy", "route_to_publish_info", "route_to_subscribe_info",
           "route_request", "parse_route_response", "cluster_info_request", "parse_cluster_info",
           "split_namesrv_addr", "monotonic_ms", "LATENCY_MAX_49", "NOT_AVAILABLE_DURATION_49",
           "LATENCY_MAX_5", "NOT_AVAILABLE_DURATION_5", "ISOLATION_LATENCY_MS_49", "ISOLATION_LATENCY_MS_5",
           "PERM_READ", "PERM_WRITE", "PERM_INHERIT", "PERM_PRIORITY", "MASTER_ID", "find_broker_address_in_subscribe",
           "find_master_or_slave"]


def route_suspect(exc: object) -> bool:
    """Whether a failed request (an exception or an answer Frame) puts the topic's route in doubt,
    to be refetched within ROUTE_REFRESH_ON_FAILURE_MS: no answer or a lost connection
    (:class:`rmq.errors.RemotingError`), or a code in ROUTE_SUSPECT_CODES (a slave, a fenced master,
    a topic gone); never a refusal of the message itself."""
    from rmq.errors import MQBrokerError, RemotingError
    if isinstance(exc, Frame):
        return exc.code in ROUTE_SUSPECT_CODES
    if isinstance(exc, MQBrokerError):
        return exc.response_code in ROUTE_SUSPECT_CODES
    return isinstance(exc, RemotingError)
