"""Broker liveness as one controller sees it: RocketMQ 5's ``DefaultBrokerHeartbeatManager``.

Heartbeats are not replicated: brokers send them to every controller of the group, and
each keeps, in memory, per (brokerName, brokerId) the last one (monotonic clock) with
what it reported: address, epoch, maxOffset, confirmOffset, electionPriority and the
timeout after which the broker counts as dead.  The Raft leader turns this table into
the ``candidates`` of an election (:meth:`BrokerHeartbeatManager.alive_candidates`)
before proposing it, so the replicated state machine never reads a clock.

A table only knows what it has seen since ``since`` (the process start): a broker with
no heartbeat yet is not alive, but nobody may be *declared dead* before the table has
counted for one heartbeat timeout (:meth:`BrokerHeartbeatManager.covers`).  The same holds
after the controller itself did not run for a while (a stopped or starved process, a paused
VM): the heartbeats sent meanwhile wait unread in its socket, so silence it measured across
that gap says nothing of the brokers; it counts again from when it ran again
(:meth:`BrokerHeartbeatManager.restart_count`).

Concurrency: actor thread only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rmq.clock import SYSTEM_CLOCK, Clock

__all__ = ["BrokerLiveInfo", "BrokerHeartbeatManager", "DEFAULT_HEARTBEAT_TIMEOUT_MS",
           "DEFAULT_ELECTION_PRIORITY", "HEARTBEAT_TIMEOUT_MAX_MS"]

DEFAULT_HEARTBEAT_TIMEOUT_MS = 4000      # a heartbeat that does not say (RocketMQ: controllerHeartBeatTimeoutMills)
HEARTBEAT_TIMEOUT_MAX_MS = 10 * 60 * 1000   # bound on what a heartbeat may ask for
DEFAULT_ELECTION_PRIORITY = 2 ** 31 - 1  # BrokerConfig.brokerElectionPriority default (lower = preferred)


@dataclass
class BrokerLiveInfo:
    """The last heartbeat of one replica (RocketMQ BrokerLiveInfo)."""
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int
    last_update: float            # monotonic seconds
    heartbeat_timeout_ms: int
    epoch: int
    max_offset: int
    confirm_offset: int
    election_priority: int


class BrokerHeartbeatManager:
    """The heartbeat table of one controller (see the module docstring)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK):
        self.clock = clock
        self.since = clock.monotonic()        # when this table started counting
        self.table: dict[tuple, BrokerLiveInfo] = {}

    def on_heartbeat(self, cluster_name: str, broker_name: str, broker_address: str, broker_id: int, epoch: int,
                     max_offset: int, confirm_offset: int, election_priority: int = DEFAULT_ELECTION_PRIORITY,
                     heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS) -> BrokerLiveInfo:
        """Record a heartbeat (the caller checked the broker is registered with this id and address)."""
        info = BrokerLiveInfo(cluster_name, broker_name, broker_address, broker_id, self.clock.monotonic(),
                              heartbeat_timeout_ms, epoch, max_offset, confirm_offset, election_priority)
        self.table[(broker_name, broker_id)] = info
        return info

    def get(self, broker_name: str, broker_id: int) -> Optional[BrokerLiveInfo]:
        return self.table.get((broker_name, broker_id))

    def timeout_ms(self, broker_name: str, broker_id: int) -> int:
        """The broker's own heartbeat timeout, DEFAULT_HEARTBEAT_TIMEOUT_MS before its first heartbeat."""
        info = self.table.get((broker_name, broker_id))
        return info.heartbeat_timeout_ms if info is not None else DEFAULT_HEARTBEAT_TIMEOUT_MS

    def is_alive(self, broker_name: str, broker_id: int, broker_address: Optional[str] = None,
                 now: Optional[float] = None) -> bool:
        """A heartbeat within the broker's timeout (from ``broker_address``, when given)."""
        info = self.table.get((broker_name, broker_id))
        if info is None or (broker_address is not None and info.broker_address != broker_address):
            return False
        now = self.clock.monotonic() if now is None else now
        return (now - info.last_update) * 1000.0 <= info.heartbeat_timeout_ms

    def restart_count(self, now: Optional[float] = None) -> None:
        """Count from ``now`` (monotonic s) again, as a table just made: nobody is declared dead
        before one heartbeat timeout from then (:meth:`covers`).  The heartbeats kept stay: a
        broker heard within its timeout is still alive, and an election's candidates still come
        from them."""
        self.since = self.clock.monotonic() if now is None else now

    def covers(self, timeout_ms: int, now: Optional[float] = None) -> bool:
        """Whether the table has counted for ``timeout_ms`` already: only then may a silent broker be
        declared dead (a controller that just started has not seen its heartbeats yet)."""
        now = self.clock.monotonic() if now is None else now
        return (now - self.since) * 1000.0 >= timeout_ms

    def last_ago_ms(self, broker_name: str, broker_id: int, now: Optional[float] = None) -> int:
        """Milliseconds since the broker's last heartbeat, -1 if none was seen."""
        info = self.table.get((broker_name, broker_id))
        if info is None:
            return -1
        now = self.clock.monotonic() if now is None else now
        return max(0, int((now - info.last_update) * 1000.0))

    def alive_candidates(self, broker_name: str, brokers: dict, now: Optional[float] = None) -> list:
        """The alive replicas of ``brokers`` ({brokerId: brokerAddress}, the registered ones) as the
        ``candidates`` of :meth:`rmq.controller.state.ControllerState.elect_master`, by id."""
        now = self.clock.monotonic() if now is None else now
        out = []
        for bid, addr in sorted(brokers.items()):
            if self.is_alive(broker_name, bid, addr, now):
                info = self.table[(broker_name, bid)]
                out.append({"brokerId": bid, "epoch": info.epoch, "maxOffset": info.max_offset,
                            "electionPriority": info.election_priority})
        return out
