"""Controller actor: RocketMQ 5's controller (controller mode, SPEC.md §9.5).

Responsibility
    Replaces RocketMQ's ``ControllerManager`` + ``ControllerRequestProcessor`` with the
    Raft flavour of its ``controllerType``: a group of controllers (one, or three to
    survive the loss of one) keeps, per broker set, the replicas, the master, its
    epoch and the SyncStateSet (:mod:`rmq.controller.state`, replicated by
    :mod:`rmq.controller.raft`).  Brokers register and heartbeat (every controller);
    when a master's heartbeats stop, the Raft leader elects a new master from the
    SyncStateSet and bumps the epoch; brokers learn it from their next heartbeat's
    answer and change role themselves.

Sockets
    ROUTER, bound at ``tcp://LISTEN_ADDR:LISTEN_PORT`` (default 127.0.0.1:9878), inbound
    requests, one response each.  "Replica info" = fields brokerName, brokerId,
    masterBrokerId, masterAddress, masterEpoch, syncStateSetEpoch, syncStateSet (list),
    plus leader (bool: this controller leads) and leaderAddress (request address or "").

    ===============================  =====  ===============================================
    request                          code   fields -> response
    ===============================  =====  ===============================================
    BROKER_HEARTBEAT                 904    clusterName, brokerName, brokerAddress, brokerId
                                            (-1: by address), epoch, maxOffset,
                                            confirmOffset, electionPriority,
                                            heartbeatTimeoutMillis -> replica info (this
                                            controller's copy); unregistered:
                                            CONTROLLER_BROKER_METADATA_NOT_EXIST
    CONTROLLER_ALTER_SYNC_STATE_SET  1001   brokerName, masterBrokerId, masterEpoch,
                                            syncStateSetEpoch, syncStateSet (list)
                                            -> replica info after the change (replicated)
    CONTROLLER_ELECT_MASTER          1002   brokerName [, brokerId: the preferred one]
                                            -> replica info (replicated)
    CONTROLLER_REGISTER_BROKER       1003   clusterName, brokerName, brokerAddress
                                            [, brokerId] -> replica info, brokerId = the
                                            broker's (replicated unless already known)
    CONTROLLER_GET_REPLICA_INFO      1004   brokerName [, brokerAddress] -> replica info
    CONTROLLER_GET_METADATA_INFO     1005   -> controllerAddress, leaderAddress, isLeader,
                                            peers, raftTerm, hasQuorum
    CONTROLLER_GET_SYNC_STATE_DATA   1006   body 0 = {brokerNames: [..]}; none or [] = all
                                            -> body 0 = {brokerName: {masterBrokerId, ...,
                                            replicas: [{brokerId, brokerAddress, alive,
                                            lastHeartbeatAgoMs, epoch, maxOffset, ...}]}}
    ===============================  =====  ===============================================

    A replicated request made on a follower is forwarded to the Raft leader (pysyncobj)
    and answered here once this controller applied it.  Raft peers talk on
    ``host:port+RAFT_PORT_OFFSET`` (pysyncobj's own TCP).  An inproc PAIR carries
    wake-ups from pysyncobj's thread to this loop.  DEALER to the supervisor
    (``--supervisor``), outbound one-way ACTOR_BEAT (actor base).

Files
    ``STORE/controller/raft.journal`` (+ ``.meta``) and ``raft.dump``: the Raft log and
    snapshot (pysyncobj), a restarted controller keeps its state; ``STORE/logs/controller.log``.
    Heartbeats live in memory only (each controller counts its own, as RocketMQ's
    DefaultBrokerHeartbeatManager).

Timers
    ``--scan-interval-ms`` (SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS, 1000 ms), Raft leader only:
    every broker set whose master sent no heartbeat within that broker's
    heartbeatTimeoutMillis (DEFAULT_HEARTBEAT_TIMEOUT_MS when it does not say), or that
    has no master while some replica is eligible, gets an election (replicated).  A
    controller that started less than one heartbeat timeout ago declares nobody dead, nor
    does one whose scan comes more than OWN_STALL_MS (1 s) after its interval (the process
    did not run meanwhile: stopped, starved, a paused VM; the heartbeats sent in that time
    are still unread in its socket): it counts one heartbeat timeout again from then.
    PENDING_CHECK_INTERVAL_MS (100 ms): replicated requests not applied within
    REPLICATION_TIMEOUT_MS are answered CONTROLLER_NOT_LEADER.

Failure behaviour
    Every field is validated before anything is proposed; a bad request gets
    CONTROLLER_INVALID_REQUEST with a remark naming the field.  No Raft leader (an
    election, no quorum): replicated requests get CONTROLLER_NOT_LEADER at once, or
    after REPLICATION_TIMEOUT_MS at the latest (the outcome is then unknown: the broker
    retries, every operation is idempotent or fenced by epoch).  A snapshot that cannot
    be read, or pysyncobj's thread dying, stops the controller (exit 1) rather than
    serve a wrong state.  A store directory in use by another controller, or a port
    taken: refusing to start (exit 1).  SIGTERM / SIGINT stop the loop and Raft
    (journal flushed); the process exits 0.  Also heartbeat-driven: a heartbeat from a
    broker set without a master makes the leader try an election at once.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import zmq
from pysyncobj import FAIL_REASON

from rmq.actors.actor import Actor
from rmq.clock import SYSTEM_CLOCK, Clock
from rmq.controller.heartbeat import (DEFAULT_ELECTION_PRIORITY, DEFAULT_HEARTBEAT_TIMEOUT_MS,
                                      HEARTBEAT_TIMEOUT_MAX_MS, BrokerHeartbeatManager)
from rmq.controller.raft import (RAFT_DIR, RAFT_PORT_OFFSET, SNAPSHOT_MIN_ENTRIES, RaftNode, fail_reason_name,
                                 raft_address)
from rmq.controller.state import (EPOCH_MAX, NO_MASTER, OFFSET_MAX, OFFSET_MIN, PRIORITY_MAX,
                                  PRIORITY_MIN, InputError, Result, check_address, check_broker_id, check_id_set,
                                  check_name)
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, pack_body, unpack_body

__all__ = ["ControllerActor", "main", "resolve_peers", "parse_peers", "DEFAULT_LISTEN_PORT",
           "SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS", "OWN_STALL_MS", "REPLICATION_TIMEOUT_MS"]

DEFAULT_LISTEN_PORT = 9878                   # RocketMQ's quick-start controller address (127.0.0.1:9878)
SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS = 1000    # leader's liveness scan (RocketMQ scanNotActiveBrokerInterval)
OWN_STALL_MS = 1000          # a scan this much later than its interval: the controller did not run meanwhile
REPLICATION_TIMEOUT_MS = 3000                # a replicated request not applied by then: CONTROLLER_NOT_LEADER
PENDING_CHECK_INTERVAL_MS = 100              # how often those deadlines are checked
ONE_NODE_LEADER_WAIT_MS = 10000              # a one-node group elects itself (Raft timeout 0.4-1.4 s) before "ready"
MAX_BROKER_NAMES = 4096                      # brokerNames of one GET_SYNC_STATE_DATA
WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")


def parse_peers(text: str) -> list:
    """``"h1:p1;h2:p2,h3:p3"`` (';' or ',' separated) -> ``["h1:p1", "h2:p2", "h3:p3"]``, duplicates dropped.

    Raises
    ------
    ValueError
        An entry that is not ``host:port`` or whose Raft port (port + RAFT_PORT_OFFSET) is over 65535.
    """
    out: list = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            check_address(part, "peer")
        except InputError as e:
            raise ValueError(str(e)) from None
        if int(part.rsplit(":", 1)[1]) + RAFT_PORT_OFFSET > 65535:
            raise ValueError(f"peer {part}: its Raft port (port + {RAFT_PORT_OFFSET}) is over 65535")
        if part not in out:
            out.append(part)
    return out


def resolve_peers(listen_addr: str, listen_port: int, peers: list) -> tuple:
    """This controller's request address and the group's, self included (appended if missing).

    Self is the peer ``listen_addr:listen_port``; with a wildcard ``listen_addr`` (0.0.0.0), the
    only peer with that port.  Returns ``(self_address, peers)``.

    Raises
    ------
    ValueError
        Port 0 in a group of several; a wildcard address that no peer (or several) matches.
    """
    if listen_port == 0:
        if peers:
            raise ValueError("--listen-port 0 is only for a one-node group (no --peers): "
                             "the other controllers must know this one's port")
        return "", []
    if listen_addr in WILDCARD_HOSTS:
        mine = [p for p in peers if int(p.rsplit(":", 1)[1]) == listen_port]
        if len(mine) == 1:
            return mine[0], list(peers)
        if peers and len(mine) != 1:
            raise ValueError(f"--listen-addr {listen_addr}: --peers must list this controller (port {listen_port}) "
                             f"exactly once, found {mine}")
        me = f"127.0.0.1:{listen_port}"
        return me, [me]
    me = f"{listen_addr}:{listen_port}"
    return me, (list(peers) if me in peers else [*peers, me])


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]


def _bad(frame: Frame, remark: str) -> ProtocolError:
    return ProtocolError(remark, ResponseCode.CONTROLLER_INVALID_REQUEST, frame.opaque)


def field_int(frame: Frame, name: str, lo: int, hi: int, default: Optional[int] = None) -> int:
    """An int header field in [lo, hi]; CONTROLLER_INVALID_REQUEST naming it otherwise."""
    v = frame.fields.get(name, default)
    if v is None:
        raise _bad(frame, f"missing header field {name!r}")
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(frame, f"header field {name!r} must be an int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise _bad(frame, f"header field {name!r}={v} outside [{lo}, {hi}]")
    return v


def field_checked(frame: Frame, name: str, check: Callable, *args, default=None):
    """A header field passed through a :mod:`rmq.controller.state` check; CONTROLLER_INVALID_REQUEST
    naming it when missing or rejected."""
    v = frame.fields.get(name, default)
    if v is None:
        raise _bad(frame, f"missing header field {name!r}")
    try:
        return check(v, f"header field {name!r}", *args)
    except InputError as e:
        raise _bad(frame, str(e)) from None


@dataclass
class _Pending:
    """A proposal waiting for Raft: ``done(result)`` once applied, ``fail(code, remark)`` else."""
    op: str
    deadline: float                     # monotonic s
    done: Callable[[Result], None]
    fail: Callable[[int, str], None]


class ControllerActor(Actor):
    """The controller process (see the module docstring)."""

    name = "controller"

    def __init__(self, listen_addr: str = "127.0.0.1", listen_port: int = DEFAULT_LISTEN_PORT,
                 peers: Optional[list] = None, store_path: Optional[str] = None,
                 supervisor_endpoint: Optional[str] = None,
                 scan_interval_ms: int = SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
                 enable_elect_unclean_master: bool = False, snapshot_min_entries: int = SNAPSHOT_MIN_ENTRIES,
                 raft_password: Optional[str] = None, log_level: int = logging.INFO, clock: Clock = SYSTEM_CLOCK):
        super().__init__(store_path, supervisor_endpoint, log_level)
        self.listen_addr = listen_addr
        self.listen_port = listen_port
        self.address, self.peers = resolve_peers(listen_addr, listen_port, list(peers or []))
        self.scan_interval_ms = scan_interval_ms
        self.enable_elect_unclean_master = enable_elect_unclean_master
        self.snapshot_min_entries = snapshot_min_entries
        self.raft_password = raft_password
        self.clock = clock
        self.heartbeats = BrokerHeartbeatManager(clock)
        self._last_scan_at: Optional[float] = None     # monotonic s of the last liveness scan (OWN_STALL_MS)
        self.raft: Optional[RaftNode] = None
        self.endpoint = ""
        self.failed = ""                               # why the controller stopped itself (exit 1)
        self._raft_to_request: dict[str, str] = {}
        self._pending: dict[int, _Pending] = {}
        self._tokens = itertools.count(1)
        self._results: collections.deque = collections.deque()   # (token, result, err) from pysyncobj's thread
        self._electing: set[str] = set()               # broker sets with an election in flight
        self._was_leader = False
        self._wake_rx: Optional[zmq.Socket] = None
        self._wake_tx: Optional[zmq.Socket] = None
        self._wake_lock = threading.Lock()             # _wake_tx is used from pysyncobj's thread

    # -- lifecycle ------------------------------------------------------------------------------
    def on_start(self) -> None:
        port = "*" if self.listen_port == 0 else str(self.listen_port)
        try:
            self.sock = self.socket(zmq.ROUTER, bind=f"tcp://{self.listen_addr}:{port}")
        except zmq.ZMQError as e:
            self.log.error("refusing to start: cannot listen on %s:%s: %s", self.listen_addr, port, e)
            raise SystemExit(f"controller: cannot listen on {self.listen_addr}:{port}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        raft_bind = None
        if self.listen_port == 0:       # a one-node group: any free Raft port
            host = "127.0.0.1" if self.listen_addr in WILDCARD_HOSTS else self.listen_addr
            self.address = f"{host}:{self.endpoint.rsplit(':', 1)[1]}"
            self.peers = [self.address]
            raft_self = f"{host}:{_free_port(host)}"
            self._raft_to_request = {raft_self: self.address}
        else:
            raft_self = raft_address(self.address)
            self._raft_to_request = {raft_address(p): p for p in self.peers}
        if self.listen_addr in WILDCARD_HOSTS:
            raft_bind = f"{'::' if ':' in self.listen_addr else '0.0.0.0'}:{raft_self.rsplit(':', 1)[1]}"
        self._wake_rx = self.ctx.socket(zmq.PAIR)
        self._wake_rx.setsockopt(zmq.LINGER, 0)
        wake = f"inproc://controller-wake-{id(self)}"
        self._wake_rx.bind(wake)
        self._wake_tx = self.ctx.socket(zmq.PAIR)
        self._wake_tx.setsockopt(zmq.LINGER, 0)
        self._wake_tx.connect(wake)
        self.add_socket(self._wake_rx, self._drain_results)
        logging.getLogger("pysyncobj").setLevel(logging.WARNING)
        for h in self.log.handlers:
            logging.getLogger("pysyncobj").addHandler(h)
        try:
            self.raft = RaftNode(raft_self, list(self._raft_to_request), self._raft_dir(), self._on_raft_result,
                                 bind_address=raft_bind, password=self.raft_password,
                                 snapshot_min_entries=self.snapshot_min_entries)
        except OSError as e:
            self.log.error("refusing to start: %s", e)
            raise SystemExit(f"controller: {e}") from None
        if not self.raft_password and self.listen_addr not in ("127.0.0.1", "localhost", "::1"):
            self.log.warning("Raft peers on %s without --raft-password-file: pysyncobj's peer protocol is pickle "
                             "over TCP, anyone reaching that port can run code here", raft_self)
        self.serve(self.sock)
        for code, fn in ((RequestCode.BROKER_HEARTBEAT, self.on_broker_heartbeat),
                         (RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, self.on_alter_sync_state_set),
                         (RequestCode.CONTROLLER_ELECT_MASTER, self.on_elect_master),
                         (RequestCode.CONTROLLER_REGISTER_BROKER, self.on_register_broker),
                         (RequestCode.CONTROLLER_GET_REPLICA_INFO, self.on_get_replica_info),
                         (RequestCode.CONTROLLER_GET_METADATA_INFO, self.on_get_metadata_info),
                         (RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, self.on_get_sync_state_data)):
            self.handle(code, fn)
        self.add_timer(self.scan_interval_ms, self.scan_not_active_broker)
        self.add_timer(PENDING_CHECK_INTERVAL_MS, self.expire_pending)
        if len(self.peers) == 1:
            # a one-node group leads at once: be leader with the journal applied before "ready"
            deadline = time.monotonic() + ONE_NODE_LEADER_WAIT_MS / 1000.0
            while not (self.raft.is_leader() and self.raft.is_ready()) and time.monotonic() < deadline:
                time.sleep(0.01)
        self.log.info("controller %s listening on %s, Raft %s, group %s (scan every %d ms, unclean election %s)",
                      self.address, self.endpoint, raft_self, self.peers, self.scan_interval_ms,
                      "on" if self.enable_elect_unclean_master else "off")
        print("ready", self.endpoint, flush=True)

    def _raft_dir(self) -> str:
        return os.path.join(self.store_path or ".", RAFT_DIR)

    def on_stop(self) -> None:
        if self.raft is not None:
            with self.raft.lock:
                sets = len(self.raft.state.broker_names())
            self.raft.close()
            self.log.info("controller stopping: %d broker sets, Raft term %d", sets, self.raft.term)
        for p in self._pending.values():
            p.fail(ResponseCode.CONTROLLER_NOT_LEADER, "controller stopping")
        self._pending.clear()

    # -- Raft hand-off -------------------------------------------------------------------------------
    def _on_raft_result(self, token: int, result: Optional[Result], err: int) -> None:
        """pysyncobj's thread: queue the outcome and wake the loop (never blocks)."""
        self._results.append((token, result, err))
        with self._wake_lock:
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:         # queue full (the loop will drain it all) or closed (stopping)
                pass

    def _drain_results(self, _parts) -> None:
        while self._results:
            token, result, err = self._results.popleft()
            p = self._pending.pop(token, None)
            if p is None:                 # answered already (timed out): the outcome is known now
                if err == FAIL_REASON.SUCCESS and result is not None and result.changed:
                    self.log.info("a timed-out proposal was applied after all: %s", result.info)
                continue
            if err == FAIL_REASON.SUCCESS and result is not None:
                p.done(result)
            elif err == FAIL_REASON.QUEUE_FULL:
                p.fail(ResponseCode.SYSTEM_BUSY, "the Raft command queue is full")
            else:
                p.fail(ResponseCode.CONTROLLER_NOT_LEADER, f"{p.op} not committed: {fail_reason_name(err)} "
                                                           f"(leader {self._leader_address() or 'unknown'})")

    def _propose(self, op: str, args: tuple, done: Callable[[Result], None], fail: Callable[[int, str], None]) -> None:
        token = next(self._tokens)
        self._pending[token] = _Pending(op, time.monotonic() + REPLICATION_TIMEOUT_MS / 1000.0, done, fail)
        self.raft.propose(op, args, token)

    def _propose_for(self, frame: Frame, reply, op: str, args: tuple,
                     then: Optional[Callable[[Result], None]] = None) -> None:
        """Propose on behalf of a request: its response is the result's replica info."""
        def done(result: Result) -> None:
            if then is not None:
                then(result)
            reply.send(self._info_response(frame, result.code, result.remark, result.info))

        def fail(code: int, remark: str) -> None:
            reply.send(frame.response(code, remark, fields=self._leader_fields()))
        self._propose(op, args, done, fail)

    def expire_pending(self) -> None:
        now = time.monotonic()
        late = [t for t, p in self._pending.items() if p.deadline <= now]
        for t in late:
            p = self._pending.pop(t)
            p.fail(ResponseCode.CONTROLLER_NOT_LEADER,
                   f"{p.op} not committed within {REPLICATION_TIMEOUT_MS} ms (no Raft leader or no quorum; "
                   f"outcome unknown, retry)")

    # -- leader, responses ---------------------------------------------------------------------------
    def _leader_address(self) -> str:
        leader = self.raft.leader() if self.raft is not None else None
        return self._raft_to_request.get(leader, "") if leader else ""

    def _leader_fields(self) -> dict:
        return {"leader": self.raft.is_leader(), "leaderAddress": self._leader_address()}

    def _info_response(self, frame: Frame, code: int, remark: str, info: Optional[dict]) -> Frame:
        fields = dict(info) if info else {}
        fields.update(self._leader_fields())
        return frame.response(code, remark, fields=fields)

    def _replica_info(self, broker_name: str, broker_id: int = NO_MASTER) -> Optional[dict]:
        with self.raft.lock:
            return self.raft.state.replica_info(broker_name, broker_id)

    # -- timers -------------------------------------------------------------------------------------
    def scan_not_active_broker(self) -> None:
        """Leader only: elect where the master is dead or missing (see Timers)."""
        now = self.clock.monotonic()
        last, self._last_scan_at = self._last_scan_at, now
        if last is not None and (now - last) * 1000.0 > self.scan_interval_ms + OWN_STALL_MS:
            self.heartbeats.restart_count(now)
            self.log.warning("this controller did not run for %.0f ms (its scan every %d ms came late): nobody is "
                             "declared dead before a heartbeat timeout from now", (now - last) * 1000.0,
                             self.scan_interval_ms)
        if self.raft.load_error or not self.raft.alive():
            self.failed = self.raft.load_error or "the Raft thread stopped (see the pysyncobj errors above)"
            self.log.critical("stopping: %s", self.failed)
            self.stop()
            return
        leader = self.raft.is_leader()
        if leader != self._was_leader:
            self._was_leader = leader
            self.log.info("Raft: this controller is %s (term %d)", "the leader" if leader else "a follower",
                          self.raft.term)
        if not leader or not self.raft.is_ready():
            return
        with self.raft.lock:
            names = self.raft.state.broker_names()
        now = self.clock.monotonic()
        for name in names:
            self._check_broker_set(name, now)

    def _check_broker_set(self, broker_name: str, now: Optional[float] = None) -> None:
        if broker_name in self._electing:
            return
        now = self.clock.monotonic() if now is None else now
        with self.raft.lock:
            master = self.raft.state.master_of(broker_name)
            brokers = self.raft.state.brokers(broker_name)
        hb = self.heartbeats
        if master != NO_MASTER:
            if hb.is_alive(broker_name, master, brokers.get(master), now):
                return
            timeout_ms = hb.timeout_ms(broker_name, master)
            if not hb.covers(timeout_ms, now):
                return          # this table has not counted long enough to call anyone dead
            ago = hb.last_ago_ms(broker_name, master, now)
            why = (f"master {master} ({brokers.get(master)}) of {broker_name} silent for "
                   f"{'ever' if ago < 0 else f'{ago} ms'} (timeout {timeout_ms} ms)")
        else:
            why = f"{broker_name} has no master"
        candidates = hb.alive_candidates(broker_name, brokers, now)
        if master == NO_MASTER:
            with self.raft.lock:
                eligible = self.raft.state.eligible_ids(broker_name, [c["brokerId"] for c in candidates],
                                                        self.enable_elect_unclean_master)
            if not eligible:
                return          # nothing would change: no journal entry per scan
        self.log.info("%s: electing among %s", why, [c["brokerId"] for c in candidates])
        self._electing.add(broker_name)

        def done(result: Result) -> None:
            self._electing.discard(broker_name)
            self._log_election(broker_name, result)

        def fail(code: int, remark: str) -> None:
            self._electing.discard(broker_name)
            self.log.warning("election of %s not done: %s", broker_name, remark)
        self._propose("elect_master", (broker_name, candidates, NO_MASTER, self.enable_elect_unclean_master),
                      done, fail)

    def _log_election(self, broker_name: str, result: Result) -> None:
        info = result.info or {}
        if result.code == ResponseCode.SUCCESS and result.changed:
            self.log.info("%s: master %s (%s) elected, epoch %s, SyncStateSet %s", broker_name,
                          info.get("masterBrokerId"), info.get("masterAddress"), info.get("masterEpoch"),
                          info.get("syncStateSet"))
        elif result.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE:
            self.log.warning("%s: %s%s", broker_name, result.remark, ": master cleared" if result.changed else "")
        elif result.code != ResponseCode.SUCCESS:
            self.log.warning("%s: election refused (%d): %s", broker_name, result.code, result.remark)

    # -- broker requests ----------------------------------------------------------------------------
    def on_register_broker(self, frame: Frame, reply) -> Optional[Frame]:
        cluster_name = field_checked(frame, "clusterName", check_name)
        broker_name = field_checked(frame, "brokerName", check_name)
        broker_address = field_checked(frame, "brokerAddress", check_address)
        broker_id = field_checked(frame, "brokerId", check_broker_id, True, default=NO_MASTER)
        with self.raft.lock:
            known = self.raft.state.resolve_broker(cluster_name, broker_name, broker_address, broker_id)
            info = self.raft.state.replica_info(broker_name, known) if known != NO_MASTER else None
        if info is not None:        # registered already (committed: registrations are never undone)
            return self._info_response(frame, ResponseCode.SUCCESS, "", info)
        if broker_id != NO_MASTER:
            with self.raft.lock:
                old = self.raft.state.brokers(broker_name).get(broker_id)
            if old and old != broker_address and self.heartbeats.is_alive(broker_name, broker_id, old):
                return frame.response(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                      f"broker id {broker_id} of {broker_name} is alive at {old}: "
                                      f"{broker_address} cannot take it", fields=self._leader_fields())

        def then(result: Result) -> None:
            if result.changed:
                self.log.info("broker registered: cluster=%s name=%s id=%s addr=%s", cluster_name, broker_name,
                              (result.info or {}).get("brokerId"), broker_address)
        self._propose_for(frame, reply, "register_broker", (cluster_name, broker_name, broker_address, broker_id),
                          then)
        return None

    def on_broker_heartbeat(self, frame: Frame, reply) -> Frame:
        cluster_name = field_checked(frame, "clusterName", check_name)
        broker_name = field_checked(frame, "brokerName", check_name)
        broker_address = field_checked(frame, "brokerAddress", check_address)
        broker_id = field_checked(frame, "brokerId", check_broker_id, True, default=NO_MASTER)
        epoch = field_int(frame, "epoch", 0, EPOCH_MAX, default=0)
        max_offset = field_int(frame, "maxOffset", OFFSET_MIN, OFFSET_MAX, default=0)
        confirm_offset = field_int(frame, "confirmOffset", OFFSET_MIN, OFFSET_MAX, default=0)
        priority = field_int(frame, "electionPriority", PRIORITY_MIN, PRIORITY_MAX, default=DEFAULT_ELECTION_PRIORITY)
        timeout_ms = field_int(frame, "heartbeatTimeoutMillis", 1, HEARTBEAT_TIMEOUT_MAX_MS,
                               default=DEFAULT_HEARTBEAT_TIMEOUT_MS)
        with self.raft.lock:
            bid = self.raft.state.resolve_broker(cluster_name, broker_name, broker_address, broker_id)
            info = self.raft.state.replica_info(broker_name, bid) if bid != NO_MASTER else None
        if info is None:
            return frame.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                  f"broker {broker_address} (id {broker_id}) of cluster {cluster_name} is not "
                                  f"registered in broker set {broker_name} here: register it",
                                  fields=self._leader_fields())
        self.heartbeats.on_heartbeat(cluster_name, broker_name, broker_address, bid, epoch, max_offset,
                                     confirm_offset, priority, timeout_ms)
        if info["masterBrokerId"] == NO_MASTER and self.raft.is_leader() and self.raft.is_ready():
            self._check_broker_set(broker_name)     # a first master (or one again) without waiting for the scan
        return self._info_response(frame, ResponseCode.SUCCESS, "", info)

    def on_get_replica_info(self, frame: Frame, reply) -> Frame:
        broker_name = field_checked(frame, "brokerName", check_name)
        broker_id = NO_MASTER
        if frame.fields.get("brokerAddress") is not None:
            address = field_checked(frame, "brokerAddress", check_address)
            with self.raft.lock:
                brokers = self.raft.state.brokers(broker_name)
            broker_id = next((i for i, a in brokers.items() if a == address), NO_MASTER)
        info = self._replica_info(broker_name, broker_id)
        if info is None:
            return frame.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                  f"broker set {broker_name} is not registered", fields=self._leader_fields())
        return self._info_response(frame, ResponseCode.SUCCESS, "", info)

    def on_alter_sync_state_set(self, frame: Frame, reply) -> Optional[Frame]:
        broker_name = field_checked(frame, "brokerName", check_name)
        master_id = field_checked(frame, "masterBrokerId", check_broker_id)
        master_epoch = field_int(frame, "masterEpoch", 0, EPOCH_MAX)
        sss_epoch = field_int(frame, "syncStateSetEpoch", 0, EPOCH_MAX)
        ids = field_checked(frame, "syncStateSet", check_id_set)
        with self.raft.lock:
            brokers = self.raft.state.brokers(broker_name)
        now = self.clock.monotonic()
        # RocketMQ checks every replica is alive; the master is the one asking
        dead = sorted(i for i in ids if i != master_id and i in brokers
                      and not self.heartbeats.is_alive(broker_name, i, brokers[i], now))
        if dead:
            return self._info_response(frame, ResponseCode.CONTROLLER_INVALID_REPLICAS,
                                       f"broker ids {dead} of {broker_name} are not alive",
                                       self._replica_info(broker_name, master_id if master_id in brokers
                                                          else NO_MASTER))

        def then(result: Result) -> None:
            if result.changed:
                self.log.info("%s: SyncStateSet %s (epoch %s)", broker_name, (result.info or {}).get("syncStateSet"),
                              (result.info or {}).get("syncStateSetEpoch"))
        self._propose_for(frame, reply, "alter_sync_state_set",
                          (broker_name, master_id, master_epoch, sss_epoch, sorted(ids)), then)
        return None

    # -- admin requests -----------------------------------------------------------------------------
    def on_elect_master(self, frame: Frame, reply) -> Optional[Frame]:
        broker_name = field_checked(frame, "brokerName", check_name)
        preferred = field_checked(frame, "brokerId", check_broker_id, True, default=NO_MASTER)
        with self.raft.lock:
            known = self.raft.state.has_broker_set(broker_name)
            brokers = self.raft.state.brokers(broker_name)
        if not known:
            return frame.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                  f"broker set {broker_name} is not registered", fields=self._leader_fields())
        candidates = self.heartbeats.alive_candidates(broker_name, brokers)
        self.log.info("electMaster %s requested (preferred %s, alive %s)", broker_name, preferred,
                      [c["brokerId"] for c in candidates])
        self._propose_for(frame, reply, "elect_master",
                          (broker_name, candidates, preferred, self.enable_elect_unclean_master),
                          lambda result: self._log_election(broker_name, result))
        return None

    def on_get_metadata_info(self, frame: Frame, reply) -> Frame:
        return frame.response(fields={"controllerAddress": self.address, "leaderAddress": self._leader_address(),
                                      "isLeader": self.raft.is_leader(), "peers": list(self.peers),
                                      "raftTerm": self.raft.term, "hasQuorum": self.raft.has_quorum})

    def on_get_sync_state_data(self, frame: Frame, reply) -> Frame:
        names = None
        if frame.bodies and len(frame.bodies[0]):
            body = unpack_body(frame, 0)
            if not isinstance(body, dict):
                raise _bad(frame, f"body must be a map, got {type(body).__name__}")
            names = body.get("brokerNames")
            if names is not None:
                if not isinstance(names, list) or len(names) > MAX_BROKER_NAMES:
                    raise _bad(frame, f"body brokerNames must be a list of at most {MAX_BROKER_NAMES} names")
                try:
                    names = [check_name(n, f"body brokerNames[{i}]") for i, n in enumerate(names)] or None
                except InputError as e:
                    raise _bad(frame, str(e)) from None
        now = self.clock.monotonic()
        out = {}
        with self.raft.lock:
            st = self.raft.state
            for name in (st.broker_names() if names is None else names):
                info = st.replica_info(name)
                if info is None:
                    continue
                sss = set(info["syncStateSet"])
                replicas = []
                for bid, addr in sorted(st.brokers(name).items()):
                    hb = self.heartbeats.get(name, bid)
                    replicas.append({"brokerId": bid, "brokerAddress": addr,
                                     "alive": self.heartbeats.is_alive(name, bid, addr, now),
                                     "lastHeartbeatAgoMs": self.heartbeats.last_ago_ms(name, bid, now),
                                     "epoch": hb.epoch if hb else -1, "maxOffset": hb.max_offset if hb else -1,
                                     "confirmOffset": hb.confirm_offset if hb else -1,
                                     "electionPriority": hb.election_priority if hb else -1,
                                     "inSyncStateSet": bid in sss})
                out[name] = {k: info[k] for k in ("masterBrokerId", "masterAddress", "masterEpoch", "syncStateSet",
                                                  "syncStateSetEpoch")}
                out[name]["replicas"] = replicas
        return frame.response(bodies=[pack_body(out)])


def main(argv: Optional[list] = None) -> int:
    """``python -m rmq.controller.actor [options]`` (or ``rmq controller``); prints ``ready ENDPOINT``."""
    p = argparse.ArgumentParser(prog="rmq controller", description=__doc__.split("\n")[0])
    p.add_argument("--listen-addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--listen-port", type=int, default=DEFAULT_LISTEN_PORT,
                   help=f"request port (default {DEFAULT_LISTEN_PORT}); Raft uses port + {RAFT_PORT_OFFSET}; "
                        "0 = ephemeral, one-node group only")
    p.add_argument("--peers", default="", metavar="HOST:PORT[;HOST:PORT...]",
                   help="request addresses of every controller of the group, this one included (';' or ',' "
                        "separated); none: a one-node group")
    p.add_argument("--store-path", required=True, help="directory of the Raft journal / snapshot and the log")
    p.add_argument("--scan-interval-ms", type=int, default=SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
                   help=f"leader's scan for dead masters, ms (default {SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS})")
    p.add_argument("--enable-elect-unclean-master", action="store_true",
                   help="with no alive replica of the SyncStateSet, elect any alive replica (may lose messages)")
    p.add_argument("--snapshot-min-entries", type=int, default=SNAPSHOT_MIN_ENTRIES,
                   help=f"Raft log compaction after this many entries (default {SNAPSHOT_MIN_ENTRIES})")
    p.add_argument("--raft-password-file", default=None,
                   help="file holding the group's shared secret (first line): Raft peer traffic encrypted and "
                        "authenticated; needed when the Raft ports are reachable from untrusted hosts")
    p.add_argument("--supervisor", default=None, help="supervisor endpoint for liveness beats")
    p.add_argument("-c", "--config", default=None,
                   help="properties file (key=value): authEnable, authServerKeyFile, authClientKeysDir, "
                        "authAdminKeysDir (rmq.security: CURVE on the request port, as the brokers')")
    args = p.parse_args(argv)
    from rmq.broker_conf import load_optional_conf
    props = load_optional_conf(args.config, p.error)     # auth hooks: the actor base enforces them (rmq.security)
    if not 0 <= args.listen_port <= 65535 - RAFT_PORT_OFFSET:
        p.error(f"--listen-port {args.listen_port} outside [0, {65535 - RAFT_PORT_OFFSET}]")
    if args.scan_interval_ms <= 0:
        p.error("--scan-interval-ms must be positive")
    if args.snapshot_min_entries < 2:
        p.error("--snapshot-min-entries must be at least 2")
    try:
        peers = parse_peers(args.peers)
        resolve_peers(args.listen_addr, args.listen_port, peers)
    except ValueError as e:
        p.error(str(e))
    password = None
    if args.raft_password_file:
        try:
            with open(args.raft_password_file) as f:
                password = f.readline().strip()
        except OSError as e:
            p.error(f"--raft-password-file: {e}")
        if not password:
            p.error("--raft-password-file: the first line is empty")
    actor = ControllerActor(args.listen_addr, args.listen_port, peers, args.store_path, args.supervisor,
                            args.scan_interval_ms, args.enable_elect_unclean_master, args.snapshot_min_entries,
                            password)
    if props is not None:
        actor.auth_props = props
    actor.run()
    return 1 if actor.failed else 0


if __name__ == "__main__":
    sys.exit(main())
