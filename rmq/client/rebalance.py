"""Queue allocation strategies of a consumer group (RocketMQ ``consumer/rebalance``, SPEC.md §15.2).

Every strategy answers one question: given all message queues of a topic and
all consumer ids of the group, which queues does *this* consumer take?  The
caller (the rebalance step of :class:`rmq.client.consumer.PushConsumer`) sorts
both lists first, as RocketMQ's ``RebalanceImpl`` does, so that every member
computes the same partition from the same view.

=================================  =====================  ==========================================
class                              name                   rule
=================================  =====================  ==========================================
AllocateMessageQueueAveragely      ``AVG``                consecutive blocks, the first
                                                          ``len(mqs) % len(cids)`` consumers take
                                                          one more (the default)
AllocateMessageQueueAveragelyBy-   ``AVG_BY_CIRCLE``      queue *i* goes to consumer
Circle                                                    ``i % len(cids)``
AllocateMessageQueueConsistentHash ``CONSISTENT_HASH``    MD5 ring of ``virtual_node_cnt`` nodes
                                                          per consumer; a queue goes to the first
                                                          node at or after its hash
AllocateMessageQueueByConfig       ``CONFIG``             a fixed list, whatever the group
AllocateMessageQueueByMachineRoom  ``MACHINE_ROOM``       brokers named ``room@name``; queues of
                                                          the listed rooms, split in blocks
AllocateMachineRoomNearby          ``MACHINE_ROOM_NEARBY``  queues of my room to my room's
                                                          consumers (delegate strategy); queues
                                                          of rooms without consumers to everyone
=================================  =====================  ==========================================

Any callable ``f(consumer_group, current_cid, mq_all, cid_all) -> list`` is
accepted where a strategy is expected (:func:`resolve_strategy`).

Concurrency: strategies are stateless (ByConfig holds an immutable list) and
may be shared between consumers and threads.
"""
from __future__ import annotations

import bisect
import hashlib
import logging
from typing import Callable, Iterable, Optional, Sequence, Union

from rmq.client.message import MessageQueue

log = logging.getLogger("rmq.client.rebalance")

__all__ = ["AllocateMessageQueueStrategy", "AllocateMessageQueueAveragely", "AllocateMessageQueueAveragelyByCircle",
           "AllocateMessageQueueConsistentHash", "AllocateMessageQueueByConfig", "AllocateMessageQueueByMachineRoom",
           "AllocateMachineRoomNearby", "resolve_strategy", "md5_hash", "mq_to_string"]


def mq_to_string(mq: MessageQueue) -> str:
    """Java's ``MessageQueue.toString()``: the key the consistent-hash ring hashes."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def md5_hash(key: str) -> int:
    """RocketMQ's ``ConsistentHashRouter.MD5Hash``: the first 4 bytes of MD5(key), big-endian, unsigned."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class AllocateMessageQueueStrategy:
    """Base class: ``allocate`` returns this consumer's share of ``mq_all``.

    Parameters (of ``allocate``)
    ----------------------------
    consumer_group : str
    current_cid : str
        This consumer's client id; must be in ``cid_all``.
    mq_all : sequence of MessageQueue
        All queues of the topic, sorted.
    cid_all : sequence of str
        All consumer ids of the group, sorted.

    Returns
    -------
    list of MessageQueue
        Empty when the inputs are empty or ``current_cid`` is not in ``cid_all``
        (RocketMQ logs and returns nothing, so a member not yet seen by the
        broker takes no queue rather than a wrong share).

    Raises
    ------
    ValueError
        ``current_cid`` is empty.
    """

    name = "BASE"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list:
        raise NotImplementedError

    def __call__(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list:
        return self.allocate(consumer_group, current_cid, mq_all, cid_all)

    @staticmethod
    def check(consumer_group: str, current_cid: str, mq_all: Sequence, cid_all: Sequence) -> bool:
        if not current_cid:
            raise ValueError("current_cid is empty")
        if not mq_all or not cid_all:
            return False
        if current_cid not in cid_all:
            log.info("[BUG] consumer group %s: current cid %s not in cid_all %s", consumer_group, current_cid,
                     list(cid_all))
            return False
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AllocateMessageQueueAveragely(AllocateMessageQueueStrategy):
    """RocketMQ's default (``AVG``), formula of SPEC.md §15.2::

        index = cid_all.index(current_cid); mod = len(mq_all) % len(cid_all)
        avg   = 1 if len(mq_all) <= len(cid_all) else len(mq_all) // len(cid_all) + (1 if mod and index < mod else 0)
        start = index * avg if mod and index < mod else index * avg + mod
        take mq_all[start : start + min(avg, len(mq_all) - start)]
    """

    name = "AVG"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if not self.check(consumer_group, current_cid, mq_all, cid_all):
            return []
        n_mq, n_cid = len(mq_all), len(cid_all)
        index = list(cid_all).index(current_cid)
        mod = n_mq % n_cid
        if n_mq <= n_cid:
            average = 1
        elif mod > 0 and index < mod:
            average = n_mq // n_cid + 1
        else:
            average = n_mq // n_cid
        start = index * average if (mod > 0 and index < mod) else index * average + mod
        rng = min(average, n_mq - start)
        return [mq_all[(start + i) % n_mq] for i in range(rng)]


class AllocateMessageQueueAveragelyByCircle(AllocateMessageQueueStrategy):
    """``AVG_BY_CIRCLE``: queue *i* goes to consumer ``i % len(cid_all)``."""

    name = "AVG_BY_CIRCLE"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if not self.check(consumer_group, current_cid, mq_all, cid_all):
            return []
        index = list(cid_all).index(current_cid)
        n = len(cid_all)
        return [mq_all[i] for i in range(index, len(mq_all)) if i % n == index]


class AllocateMessageQueueConsistentHash(AllocateMessageQueueStrategy):
    """``CONSISTENT_HASH``: RocketMQ's ``ConsistentHashRouter`` ring.

    Each consumer id ``cid`` puts ``virtual_node_cnt`` nodes on the ring at
    ``hash(f"{cid}-{i}")``; a queue goes to the owner of the first node whose
    hash is >= ``hash(str(mq))`` (wrapping to the first node).  ``hash_function``
    defaults to :func:`md5_hash` (first 4 bytes of MD5, as RocketMQ's MD5Hash).
    Adding or removing one consumer moves only the queues next to its nodes.

    Parameters
    ----------
    virtual_node_cnt : int
        Virtual nodes per consumer (RocketMQ default 10), >= 0.
    hash_function : callable str -> int, optional
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_cnt: int = 10, hash_function: Optional[Callable[[str], int]] = None):
        if virtual_node_cnt < 0:
            raise ValueError(f"illegal virtual_node_cnt: {virtual_node_cnt}")
        self.virtual_node_cnt = virtual_node_cnt
        self.hash_function = hash_function or md5_hash

    def ring(self, cid_all: Iterable[str]) -> tuple[list, dict]:
        """Sorted node hashes and hash -> consumer id (a later node with an equal hash replaces
        the earlier one, as Java's ``TreeMap.put``)."""
        owner: dict = {}
        for cid in cid_all:
            for i in range(self.virtual_node_cnt):
                owner[self.hash_function(f"{cid}-{i}")] = cid
        return sorted(owner), owner

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if not self.check(consumer_group, current_cid, mq_all, cid_all):
            return []
        keys, owner = self.ring(cid_all)
        if not keys:
            return []
        out = []
        for mq in mq_all:
            h = self.hash_function(mq_to_string(mq))
            i = bisect.bisect_left(keys, h)
            node = keys[i] if i < len(keys) else keys[0]
            if owner[node] == current_cid:
                out.append(mq)
        return out

    def __repr__(self) -> str:
        return f"AllocateMessageQueueConsistentHash(virtual_node_cnt={self.virtual_node_cnt})"


class AllocateMessageQueueByConfig(AllocateMessageQueueStrategy):
    """``CONFIG``: always the configured queues (``set_message_queue_list``), whatever the group.

    Note that RocketMQ does not check the configured queues against the topic's
    queues, and neither does this.
    """

    name = "CONFIG"

    def __init__(self, message_queue_list: Iterable[MessageQueue] = ()):
        self.message_queue_list = list(message_queue_list)

    def set_message_queue_list(self, message_queue_list: Iterable[MessageQueue]) -> None:
        self.message_queue_list = list(message_queue_list)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return list(self.message_queue_list)

    def __repr__(self) -> str:
        return f"AllocateMessageQueueByConfig({self.message_queue_list!r})"


class AllocateMessageQueueByMachineRoom(AllocateMessageQueueStrategy):
    """``MACHINE_ROOM``: brokers named ``<room>@<brokerName>``; the queues of the rooms in
    ``consumeridcs`` are split in blocks of ``len // len(cid_all)``, and the remainder goes
    one each to the first consumers."""

    name = "MACHINE_ROOM"

    def __init__(self, consumeridcs: Iterable[str] = ()):
        self.consumeridcs = set(consumeridcs)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if not self.check(consumer_group, current_cid, mq_all, cid_all):
            return []
        current = list(cid_all).index(current_cid)
        pre = []
        for mq in mq_all:
            parts = mq.broker_name.split("@")
            if len(parts) == 2 and parts[0] in self.consumeridcs:
                pre.append(mq)
        n = len(cid_all)
        mod, rem = len(pre) // n, len(pre) % n
        start = mod * current
        out = pre[start:start + mod]
        if rem > current:
            out.append(pre[current + mod * n])
        return out


class AllocateMachineRoomNearby(AllocateMessageQueueStrategy):
    """``MACHINE_ROOM_NEARBY``: a queue is served by consumers of its broker's room (split with
    the delegate strategy); queues of a room with no live consumer are split among all.

    Parameters
    ----------
    delegate : strategy
        Used inside one room (e.g. AllocateMessageQueueAveragely()).
    broker_deploy_in : callable MessageQueue -> str
        The machine room of a queue's broker (non-empty).
    consumer_deploy_in : callable str -> str
        The machine room of a consumer id (non-empty).

    Raises (of ``allocate``)
    ------------------------
    ValueError
        A resolver returned an empty room.
    """

    name = "MACHINE_ROOM_NEARBY"

    def __init__(self, delegate: "StrategyLike", broker_deploy_in: Callable[[MessageQueue], str],
                 consumer_deploy_in: Callable[[str], str]):
        self.delegate = resolve_strategy(delegate)
        self.broker_deploy_in = broker_deploy_in
        self.consumer_deploy_in = consumer_deploy_in

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        if not self.check(consumer_group, current_cid, mq_all, cid_all):
            return []
        mr2mq: dict = {}
        for mq in mq_all:
            room = self.broker_deploy_in(mq)
            if not room:
                raise ValueError(f"machine room is empty for queue {mq}")
            mr2mq.setdefault(room, []).append(mq)
        mr2c: dict = {}
        for cid in cid_all:
            room = self.consumer_deploy_in(cid)
            if not room:
                raise ValueError(f"machine room is empty for consumer {cid}")
            mr2c.setdefault(room, []).append(cid)
        out = []
        mine = self.consumer_deploy_in(current_cid)
        mqs_here = mr2mq.pop(mine, None)
        if mqs_here:
            out.extend(self.delegate(consumer_group, current_cid, mqs_here, mr2c.get(mine, [])))
        for room in sorted(mr2mq):
            if room not in mr2c:
                out.extend(self.delegate(consumer_group, current_cid, mr2mq[room], cid_all))
        return out

    def __repr__(self) -> str:
        return f"AllocateMachineRoomNearby({self.delegate!r})"


StrategyLike = Union[AllocateMessageQueueStrategy, Callable, str, None]

_BY_NAME = {
    "AVG": AllocateMessageQueueAveragely,
    "AVG_BY_CIRCLE": AllocateMessageQueueAveragelyByCircle,
    "CONSISTENT_HASH": AllocateMessageQueueConsistentHash,
}


def resolve_strategy(strategy: StrategyLike) -> Callable:
    """A strategy instance, a callable, or one of the names ``AVG`` / ``AVG_BY_CIRCLE`` /
    ``CONSISTENT_HASH`` (or the Java class names); None means ``AVG``.

    Raises
    ------
    ValueError
        An unknown name.
    TypeError
        Neither a name nor a callable.
    """
    if strategy is None:
        return AllocateMessageQueueAveragely()
    if isinstance(strategy, str):
        key = strategy.strip()
        cls = _BY_NAME.get(key.upper()) or {c.__name__: c for c in _BY_NAME.values()}.get(key)
        if cls is None:
            raise ValueError(f"unknown allocate strategy {strategy!r}; known: {sorted(_BY_NAME)}")
        return cls()
    if callable(strategy):
        return strategy
    raise TypeError(f"allocate strategy must be a name or a callable, got {type(strategy).__name__}")
