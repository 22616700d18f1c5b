"""The route model (RocketMQ ``common/protocol/route``): what the NameServer keeps and answers to
GET_ROUTEINFO_BY_TOPIC / GET_BROKER_CLUSTER_INFO (SPEC.md §14.1), shared by the NameServer's
tables (:mod:`rmq.actors.route`), the clients' route cache (:mod:`rmq.client.route`) and the admin.

* :class:`QueueData` -- one broker group's queues of a topic and their perm;
* :class:`BrokerData` -- one broker group: cluster, name, broker id -> ``host:port``;
* :class:`TopicRouteData` -- a topic's queue datas and broker datas (immutable: the clients cache it).

Broker ids are ints in memory (:data:`rmq.common.mix_all.MASTER_ID` = 0 is the master); on the
wire the ``brokerAddrs`` keys are the id as a decimal string (``{"0": "127.0.0.1:10911"}``), as in
RocketMQ's JSON and so that msgpack's default ``strict_map_key=True`` decodes them.  ``from_wire``
converts to int, ``to_wire`` back to str: the only places the two forms meet.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Container, Mapping, Optional

from rmq.common.mix_all import MASTER_ID
from rmq.common.perm import is_readable, is_writeable
from rmq.errors import MQClientError

__all__ = ["QueueData", "BrokerData", "TopicRouteData", "broker_id_from_wire", "broker_addrs_from_wire",
           "broker_addrs_to_wire", "find_broker_address_in_subscribe", "find_master_or_slave"]


# -- broker ids ----------------------------------------------------------------------------------------
def broker_id_from_wire(key: object) -> Optional[int]:
    """A ``brokerAddrs`` key as an int broker id: the wire's decimal string (``"0"``) or an int;
    None when it is neither."""
    try:
        return int(key)
    except (TypeError, ValueError):
        return None


def broker_addrs_from_wire(raw: Optional[Mapping]) -> dict:
    """``{"0": addr, "1": addr}`` (or int keys) -> ``{0: addr, 1: addr}``; keys that are not a
    broker id are left out."""
    out = {}
    for k, v in (raw or {}).items():
        bid = broker_id_from_wire(k)
        if bid is not None:
            out[bid] = v
    return out


def broker_addrs_to_wire(addrs: Mapping) -> dict:
    """``{0: addr, 1: addr}`` -> ``{"0": addr, "1": addr}`` in id order."""
    return {str(k): v for k, v in sorted(addrs.items())}


def find_broker_address_in_subscribe(broker_addrs: Mapping, broker_id: int = MASTER_ID,
                                     only_this_broker: bool = False, avoid: Container = ()) -> Optional[tuple]:
    """The broker of a group to read (pull, offsets) from: RocketMQ
    ``MQClientInstance.findBrokerAddressInSubscribe`` as used by ``PullAPIWrapper``.

    Parameters
    ----------
    broker_addrs : mapping
        brokerId -> ``"host:port"`` of one broker group (a route's ``brokerAddrs``; keys may be
        ints or the wire's decimal strings ``"0"``, ``"1"``).
    broker_id : int
        The id wanted: the queue's last ``suggestWhichBrokerId`` (0 = master, >= 1 = a slave).
    only_this_broker : bool
        Only ``broker_id`` will do (None when it is not in the route).
    avoid : container of str
        Addresses that failed lately (a pull or offset call timed out): used only when no other
        address of the group is left.

    Returns
    -------
    (int, str) or None
        ``(broker id, address)``: ``broker_id`` when present, else the master (id 0), else the slave
        with the lowest id; None for an empty group.  ``broker id != 0`` means a slave.
    """
    addrs = broker_addrs_from_wire(broker_addrs)
    if only_this_broker:
        a = addrs.get(int(broker_id))
        return None if a is None else (int(broker_id), a)
    order = [int(broker_id)] if int(broker_id) in addrs else []
    if MASTER_ID in addrs and MASTER_ID not in order:
        order.append(MASTER_ID)
    order.extend(sorted(i for i in addrs if i not in order))
    for bid in order:
        if addrs[bid] not in avoid:
            return bid, addrs[bid]
    return (order[0], addrs[order[0]]) if order else None


def find_master_or_slave(broker_addrs: Mapping, avoid: Container = ()) -> Optional[tuple]:
    """``(broker id, address)`` for offset calls: the master, else the lowest-id slave
    (RocketMQ reads and commits consumer offsets on a slave when the master is gone)."""
    return find_broker_address_in_subscribe(broker_addrs, MASTER_ID, False, avoid)


# -- parsing helpers -----------------------------------------------------------------------------------
def _int(d: dict, name: str, where: str) -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise MQClientError(f"{where}: field {name!r} must be a non-negative int, got {v!r}")
    return v


def _str(d: dict, name: str, where: str) -> str:
    v = d.get(name)
    if not isinstance(v, str) or not v:
        raise MQClientError(f"{where}: field {name!r} must be a non-empty str, got {v!r}")
    return v


# -- the model -----------------------------------------------------------------------------------------
@dataclass
class QueueData:
    """One broker group's queues of a topic (RocketMQ ``QueueData``).

    Mutable as RocketMQ's: the NameServer sets ``perm`` in place (wipe / add write perm); a client
    treats the ones of a cached :class:`TopicRouteData` as read-only.
    """
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def writeable(self) -> bool:
        return is_writeable(self.perm)

    @property
    def readable(self) -> bool:
        return is_readable(self.perm)

    def to_wire(self) -> dict:
        return {"brokerName": self.broker_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm, "topicSysFlag": self.topic_sys_flag}

    @classmethod
    def from_wire(cls, d: object, where: str = "queue data") -> "QueueData":
        """Parse and check one ``queueDatas`` entry.

        Raises
        ------
        MQClientError
            Not a map, or a field missing or of the wrong type (the message names ``where`` and the field).
        """
        if not isinstance(d, dict):
            raise MQClientError(f"{where}: a queueData must be a map")
        return cls(_str(d, "brokerName", where), _int(d, "readQueueNums", where), _int(d, "writeQueueNums", where),
                   _int(d, "perm", where), int(d.get("topicSysFlag", 0) or 0))


@dataclass
class BrokerData:
    """One broker group: cluster, name, broker id -> ``host:port`` (RocketMQ ``BrokerData``).

    ``broker_addrs`` keys are int broker ids (:data:`MASTER_ID` = 0: the master)."""
    cluster: str
    broker_name: str
    broker_addrs: dict = field(default_factory=dict)    # int broker id -> "host:port"

    def master_addr(self) -> Optional[str]:
        return self.broker_addrs.get(MASTER_ID)

    def select_broker_addr(self) -> Optional[str]:
        """The master, else any slave (RocketMQ ``BrokerData.selectBrokerAddr``)."""
        addr = self.broker_addrs.get(MASTER_ID)
        if addr is None and self.broker_addrs:
            addr = random.choice(list(self.broker_addrs.values()))
        return addr

    def find_broker_address_in_subscribe(self, broker_id: int = MASTER_ID, only_this_broker: bool = False,
                                         avoid: Container = ()) -> Optional[tuple]:
        """``(broker id, address)`` to read from; see :func:`find_broker_address_in_subscribe`."""
        return find_broker_address_in_subscribe(self.broker_addrs, broker_id, only_this_broker, avoid)

    def to_wire(self) -> dict:
        return {"cluster": self.cluster, "brokerName": self.broker_name,
                "brokerAddrs": broker_addrs_to_wire(self.broker_addrs)}

    @classmethod
    def from_wire(cls, d: object, where: str = "broker data") -> "BrokerData":
        """Parse and check one ``brokerDatas`` entry (broker ids -> int).

        Raises
        ------
        MQClientError
            Not a map, no broker name, a broker id that is not an int, an address without ``:``.
        """
        if not isinstance(d, dict):
            raise MQClientError(f"{where}: a brokerData must be a map, got {type(d).__name__}")
        addrs_raw = d.get("brokerAddrs") or {}
        if not isinstance(addrs_raw, dict):
            raise MQClientError(f"{where}: brokerAddrs must be a map")
        addrs = {}
        for k, v in addrs_raw.items():
            bid = broker_id_from_wire(k)
            if bid is None:
                raise MQClientError(f"{where}: broker id {k!r} is not an int")
            if not isinstance(v, str) or ":" not in v:
                raise MQClientError(f"{where}: broker address {v!r} is not host:port")
            addrs[bid] = v
        return cls(str(d.get("cluster", "")), _str(d, "brokerName", where), addrs)


@dataclass(frozen=True)
class TopicRouteData:
    """What the NameServer knows of a topic (RocketMQ ``TopicRouteData``): queue datas and broker
    datas, each sorted by broker name."""
    queue_datas: tuple
    broker_datas: tuple
    order_topic_conf: str = ""

    @classmethod
    def from_wire(cls, body: object, topic: str = "?") -> "TopicRouteData":
        """Parse ``{"queueDatas": [...], "brokerDatas": [...]}``.

        Raises
        ------
        MQClientError
            A malformed route (the message names the topic and the field).
        """
        where = f"route of topic {topic!r}"
        if not isinstance(body, dict):
            raise MQClientError(f"{where} must be a map, got {type(body).__name__}")
        qds, bds = body.get("queueDatas") or [], body.get("brokerDatas") or []
        if not isinstance(qds, list) or not isinstance(bds, list):
            raise MQClientError(f"{where}: queueDatas and brokerDatas must be lists")
        queue_datas = [QueueData.from_wire(q, where) for q in qds]
        broker_datas = [BrokerData.from_wire(b, where) for b in bds]
        queue_datas.sort(key=lambda q: q.broker_name)
        broker_datas.sort(key=lambda b: b.broker_name)
        return cls(tuple(queue_datas), tuple(broker_datas), str(body.get("orderTopicConf") or ""))

    def to_wire(self) -> dict:
        """``{"queueDatas": [...], "brokerDatas": [...]}`` (plus ``orderTopicConf`` when set)."""
        out = {"queueDatas": [q.to_wire() for q in self.queue_datas],
               "brokerDatas": [b.to_wire() for b in self.broker_datas]}
        if self.order_topic_conf:
            out["orderTopicConf"] = self.order_topic_conf
        return out

    def broker(self, broker_name: str) -> Optional[BrokerData]:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None
