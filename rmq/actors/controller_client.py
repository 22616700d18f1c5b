"""The broker's side of RocketMQ 5 controller mode (``enableControllerMode=true``): replica id,
heartbeats, role changes decided by the controllers, the master's SyncStateSet and its write lease.

Source: RocketMQ 5 ``broker/.../controller/ReplicasManager.java`` (register, heartbeat, changeToMaster /
changeToSlave, the SyncStateSet shrink / expand of ``AutoSwitchHAService``); the controllers are
:mod:`rmq.controller` (request codes 904, 1001-1006).

State (on the broker actor, one thread: the actor's loop)
    ``replica_id``: this broker's id in its broker set, assigned by the controllers at its first
    registration and kept in ``STORE/config/controllerBrokerId.json`` (so a restart on another port
    keeps it).  ``info``: the newest replica info a leading controller answered (master id and
    address, master epoch, SyncStateSet and its epoch).  ``lease_until``: a master takes writes only
    until ``controllerHeartBeatTimeoutMills * LEASE_FRACTION`` after the send of the last heartbeat a
    leading controller answered: cut off from the controllers, it stops acknowledging before they
    can elect another master (which they do only after the whole timeout).

Role changes (only on a leading controller's answer: a follower's copy may lag)
    * the controllers name this broker master, and it is a SLAVE: it is promoted at the master
      epoch the controllers chose (:meth:`rmq.actors.processor.ha.HAProcessor.promote_to_epoch`)
      once reput has dispatched everything it holds;
    * it is a master and they name another broker (or none): it stops taking writes at once
      (``fenced_by``), writes ``config/haRole.json`` as a SLAVE and exits EXIT_RESTART_GROUP; the
      supervisor restarts its group as a slave, whose HA handshake truncates a diverged tail.
    A broker in controller mode always starts as a SLAVE (broker.conf's role only says which master
    role it takes when elected: SYNC_MASTER, else ASYNC_MASTER), as RocketMQ 5's brokers wait for
    the controller's decision.

The master's SyncStateSet (RocketMQ's ``AutoSwitchHAService.maybeShrinkSyncStateSet`` /
``maybeExpandSyncStateSet``): a replica is in sync while it has caught up, within
``haMaxTimeSlaveNotCatchup``, with where the master's CommitLog ended one heartbeat earlier; the
master asks the controllers to change the set (CONTROLLER_ALTER_SYNC_STATE_SET) whenever its view
differs from theirs.
"""
from __future__ import annotations

import json
import os
import time

import zmq

from rmq import protocol as P
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.store.config_manager import write_file_atomically

REPLICA_ID_FILE = "controllerBrokerId.json"   # config/<this>: {"brokerName", "brokerId"}
LEASE_FRACTION = 0.75                          # a master's write lease: this much of the heartbeat timeout
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


class ControllerClient:
    """One broker's link to its controllers (see the module docstring).

    Parameters
    ----------
    broker : rmq.actors.broker.BrokerActor
        The broker actor (its loop thread runs every method here).
    settings : dict
        :func:`rmq.broker_conf.controller_settings` of the broker's properties.
    """

    def __init__(self, broker, settings: dict):
        self.b = broker
        self.log = broker.log
        self.addrs: list = list(settings["addrs"])
        self.interval_ms = int(settings["heartbeat_interval_ms"])
        self.timeout_ms = int(settings["heartbeat_timeout_ms"])
        self.not_catchup_ms = int(settings["not_catchup_ms"])
        self.election_priority = int(settings["election_priority"])
        self.master_role = broker.settings.get("brokerRole") if broker.settings.get("brokerRole") in MASTER_ROLES \
            else "ASYNC_MASTER"
        self.replica_id = -1
        self.info: dict = {}                      # newest replica info from a leading controller
        self.lease_until = 0.0                    # monotonic s: a master takes writes until then
        self._lease_logged = False                # the lease's loss was logged (once per loss)
        self.leader_addr = ""
        self.socks: dict = {}                     # controller address -> DEALER
        self._sent_at: dict = {}                  # opaque -> (monotonic s of the send, code)
        self._opaque = 0
        self.caught_up_ms: dict = {}              # replica id -> wall ms it last caught up
        self._prev_end = -1                       # CommitLog end at the previous heartbeat (master)
        self._alter_pending_until = 0.0
        self.demoting = False
        # allAckInSyncStateSet=true (RocketMQ 5): acknowledged (SYNC_MASTER) and visible only once every
        # member of the SyncStateSet holds it; the confirm offset only grows (AutoSwitchHAService)
        self.read_committed = str(broker.settings.get("allAckInSyncStateSet", "false")).strip().lower() == "true"
        self.confirm_offset = 0
        self.joining: set = set()                 # replicas caught up, not yet in the set (read-committed)
        self.stats = {"heartbeats": 0, "answers": 0, "promotions": 0, "demotions": 0, "alters": 0,
                      "leaseLost": 0}

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.replica_id = self._load_replica_id()
        for addr in self.addrs:
            s = self.b.socket(zmq.DEALER, connect=f"tcp://{addr}")
            self.socks[addr] = s
            self.b.add_socket(s, lambda parts, a=addr: self._on_answer(a, parts))
        self.b.add_timer(self.interval_ms, self.tick, first_ms=0)
        self.log.info("controller mode: controllers %s, replica id %s, heartbeat every %d ms, timeout %d ms",
                      ";".join(self.addrs), self.replica_id if self.replica_id > 0 else "(to be assigned)",
                      self.interval_ms, self.timeout_ms)

    def lease_valid(self, now: float) -> bool:
        """A master may acknowledge writes (its lease from the controllers has not run out)."""
        return now < self.lease_until

    # -- the replica id ------------------------------------------------------------------------------
    def _id_path(self) -> str:
        return os.path.join(self.b.store_path, "config", REPLICA_ID_FILE)

    def _load_replica_id(self) -> int:
        try:
            with open(self._id_path(), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return -1
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read {self._id_path()}: {e}") from None
        if data.get("brokerName") != self.b.broker_name or not isinstance(data.get("brokerId"), int) \
                or data["brokerId"] <= 0:
            raise SystemExit(f"{self._id_path()} is not this broker's ({self.b.broker_name}) replica id: {data!r}")
        return data["brokerId"]

    def _set_replica_id(self, rid: int) -> None:
        if rid == self.replica_id:
            return
        write_file_atomically(self._id_path(), json.dumps({"brokerName": self.b.broker_name, "brokerId": rid}))
        self.log.info("replica id %d assigned by the controllers", rid)
        self.replica_id = rid
        if self.b.role == "SLAVE":
            self.b.broker_id = rid
            self.b.register_broker_all()
            self.b.announce_append(force=True)    # the ha actor handshakes with this id

    # -- requests --------------------------------------------------------------------------------
    def _send(self, addr: str, frame: Frame) -> None:
        self._opaque += 1
        frame.opaque = self._opaque
        self._sent_at[self._opaque] = time.monotonic()
        if len(self._sent_at) > 4096:             # answers that never came (a dead controller)
            cutoff = time.monotonic() - 60.0
            self._sent_at = {k: v for k, v in self._sent_at.items() if v > cutoff}
        try:
            self.socks[addr].send_multipart(P.encode(frame), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass                                  # a controller unreachable for long: its queue is full

    def _base_fields(self) -> dict:
        return {"clusterName": self.b.cluster_name, "brokerName": self.b.broker_name,
                "brokerAddress": self.b.broker_addr, "brokerId": self.replica_id}

    def tick(self) -> None:
        """Every brokerHeartbeatInterval: register (no id yet) or heartbeat every controller; a
        master also checks its lease and its SyncStateSet."""
        b = self.b
        if self.replica_id <= 0:
            for addr in self.addrs:
                self._send(addr, Frame(RequestCode.CONTROLLER_REGISTER_BROKER, fields=self._base_fields()))
            return
        end = b.store.get_max_phy_offset()
        fields = {**self._base_fields(), "epoch": b.epochs.last_epoch(), "maxOffset": end,
                  "confirmOffset": self.confirm_offset if self.read_committed else end,
                  "electionPriority": self.election_priority,
                  "heartbeatTimeoutMillis": self.timeout_ms}
        for addr in self.addrs:
            self._send(addr, Frame(RequestCode.BROKER_HEARTBEAT, fields=dict(fields)))
        self.stats["heartbeats"] += 1
        if b.role in MASTER_ROLES:
            self._check_lease()
            self._maybe_alter_sync_state_set(end)

    def _check_lease(self) -> None:
        if not self.lease_valid(time.monotonic()) and not self._lease_logged:
            self._lease_logged = True
            self.stats["leaseLost"] += 1
            self.log.error("no leading controller answered for %.0f ms: writes refused until one does",
                           self.timeout_ms * LEASE_FRACTION)

    # -- answers ---------------------------------------------------------------------------------
    def _on_answer(self, addr: str, parts: list) -> None:
        f = self.b.decode_or_log(parts, f"controller {addr} answer")
        if f is None:
            return
        sent = self._sent_at.pop(f.opaque, None)
        self.stats["answers"] += 1
        if f.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            # the controllers lost or never had this broker (a new controller group): register again
            self._send(addr, Frame(RequestCode.CONTROLLER_REGISTER_BROKER, fields=self._base_fields()))
            return
        if f.code != ResponseCode.SUCCESS:
            if f.code not in (ResponseCode.CONTROLLER_NOT_LEADER,):
                self.log.warning("controller %s answered %d: %s", addr, f.code, f.remark)
            return
        info = f.fields
        rid = info.get("brokerId")
        if isinstance(rid, int) and rid > 0 and info.get("brokerName") == self.b.broker_name:
            self._set_replica_id(rid)
        if not info.get("leader"):
            return                                # a follower's copy may lag: roles follow the leader only
        self.leader_addr = addr
        if sent is not None:
            self.lease_until = max(self.lease_until, sent + self.timeout_ms * LEASE_FRACTION / 1000.0)
            self._lease_logged = False
        self.apply(info)

    def apply(self, info: dict) -> None:
        """Act on a leading controller's replica info (see the module docstring)."""
        try:
            master_id = int(info.get("masterBrokerId", -1))
            master_epoch = int(info.get("masterEpoch", 0))
            sss = [int(x) for x in info.get("syncStateSet") or []]
            sss_epoch = int(info.get("syncStateSetEpoch", 0))
        except (TypeError, ValueError):
            self.log.warning("controller answer with bad replica info: %r", info)
            return
        old = self.info
        if (old.get("masterEpoch", -1), old.get("syncStateSetEpoch", -1)) > (master_epoch, sss_epoch):
            return                                # older than what we acted on
        self.info = {"masterBrokerId": master_id, "masterAddress": str(info.get("masterAddress") or ""),
                     "masterEpoch": master_epoch, "syncStateSet": sss, "syncStateSetEpoch": sss_epoch}
        b = self.b
        if self.replica_id <= 0 or self.demoting:
            return
        if master_id == self.replica_id:
            if b.role == "SLAVE":
                if b.ha_processor.promote_to_epoch(self.master_role, master_epoch):
                    self.stats["promotions"] += 1
                    self.caught_up_ms.clear()
                    self.joining.clear()
                    self._prev_end = -1
        elif b.role in MASTER_ROLES:
            self._demote(master_id, master_epoch)
        else:
            addr = self.info["masterAddress"]
            if addr and addr != b.master_broker_addr:
                b.master_broker_addr = addr
                self.log.info("master broker is %s (replica %d, epoch %d), from the controllers",
                              addr, master_id, master_epoch)
                b.register_broker_all()           # the NameServer's answer names the master's HA address

    def _demote(self, master_id: int, master_epoch: int) -> None:
        """This master was replaced (or its set has no master now): stop writes, restart as a slave."""
        from rmq.actors.processor.ha import EXIT_RESTART_GROUP, HA_ROLE_FILE
        b = self.b
        self.demoting = True
        self.stats["demotions"] += 1
        b.fenced_by = max(master_epoch, 1)
        self.log.error("the controllers name %s master at epoch %d: this master stops taking writes and restarts "
                       "its group as a slave", f"replica {master_id}" if master_id > 0 else "no broker", master_epoch)
        write_file_atomically(os.path.join(b.store_path, "config", HA_ROLE_FILE),
                              json.dumps({"brokerRole": "SLAVE", "brokerId": self.replica_id}))
        b.exit_code = EXIT_RESTART_GROUP
        b.stop()

    # -- read-committed (allAckInSyncStateSet) -------------------------------------------------------
    def sync_state_set(self) -> list:
        """The SyncStateSet this master works with: the controllers' (committed) one, or itself alone
        before they answered."""
        if self.info.get("masterBrokerId") == self.replica_id and self.replica_id > 0:
            return list(self.info.get("syncStateSet") or [self.replica_id])
        return [self.replica_id]

    def sss_acked(self, joining: bool = False) -> int:
        """Master: the CommitLog offset every other member of the SyncStateSet acknowledged
        (2**63 - 1 when it is alone in the set; -1 for a member with no link); ``joining``: the
        replicas about to join the set count too."""
        acks = {}
        for s in self.b.ha_slaves:
            try:
                acks[int(s.get("brokerId", -1))] = int(s.get("ackOffset", -1))
            except (TypeError, ValueError, AttributeError):
                continue
        members = set(self.sync_state_set()) | (self.joining if joining else set())
        others = [acks.get(rid, -1) for rid in members if rid != self.replica_id]
        return min(others) if others else 2 ** 63 - 1

    def update_confirm(self, base: int) -> int:
        """The confirm offset from ``base`` (what this broker itself may expose: its CommitLog end, or
        its flushed offset under SYNC_FLUSH): a master's is ``base`` capped by what every other
        SyncStateSet member acknowledged; a slave's is ``base`` capped by its master's confirm offset
        (carried by the HA pushes).  Never decreases."""
        b = self.b
        if b.role in MASTER_ROLES or (self.replica_id > 0 and self.info.get("masterBrokerId") == self.replica_id):
            # a master, or a replica just elected one: what it holds is the log now (its reput must
            # dispatch all of it before the promotion, which waits for that)
            # a replica about to join holds the bound still (below), so that it can reach it under load
            c = min(base, self.sss_acked(joining=True))
        else:
            master = int(b.ha_state.get("masterConfirmOffset", -1) or -1) if b.ha_state else -1
            c = min(base, master)
        if c > self.confirm_offset:
            self.confirm_offset = c
        return self.confirm_offset

    # -- the master's SyncStateSet ---------------------------------------------------------------
    def in_sync_replicas(self, now_ms: int, end: int) -> list:
        """Replica ids in sync by this master's view (itself included), sorted."""
        b = self.b
        members = {self.replica_id}
        prev = self._prev_end
        linked = set()
        for s in b.ha_slaves:
            try:
                rid, ack = int(s.get("brokerId", -1)), int(s.get("ackOffset", -1))
            except (TypeError, ValueError, AttributeError):
                continue
            if rid <= 0:
                continue
            linked.add(rid)
            if ack >= end or (prev >= 0 and ack >= prev):
                self.caught_up_ms[rid] = now_ms
            in_set = rid in (self.info.get("syncStateSet") or [])
            if now_ms - self.caught_up_ms.get(rid, -10 ** 12) <= self.not_catchup_ms:
                if in_set or not self.read_committed or ack >= self.confirm_offset:
                    # read-committed: a replica joins only holding everything consumers may have read
                    # (maybeExpandSyncStateSet); until then the confirm offset waits for it
                    members.add(rid)
                    self.joining.discard(rid)
                else:
                    self.joining.add(rid)
            else:
                self.joining.discard(rid)
        self.joining &= linked
        return sorted(members)

    def _maybe_alter_sync_state_set(self, end: int) -> None:
        info = self.info
        now_ms = int(time.time() * 1000)
        wanted = self.in_sync_replicas(now_ms, end)
        self._prev_end = end
        if not info or info.get("masterBrokerId") != self.replica_id or not self.leader_addr:
            return
        if wanted == sorted(info.get("syncStateSet") or []) or time.monotonic() < self._alter_pending_until:
            return
        self._alter_pending_until = time.monotonic() + self.interval_ms * 2 / 1000.0
        self.stats["alters"] += 1
        self.log.info("SyncStateSet %s -> %s (epoch %d)", info.get("syncStateSet"), wanted, info["syncStateSetEpoch"])
        self._send(self.leader_addr, Frame(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, fields={
            "brokerName": self.b.broker_name, "masterBrokerId": self.replica_id, "masterEpoch": info["masterEpoch"],
            "syncStateSetEpoch": info["syncStateSetEpoch"], "syncStateSet": wanted}))


__all__ = ["ControllerClient", "LEASE_FRACTION", "REPLICA_ID_FILE"]
