"""The controller group's consensus: :class:`rmq.controller.state.ControllerState` replicated
with pysyncobj (Raft), never a home-made protocol.

Why pysyncobj: a pure-Python Raft (leader election, log replication, snapshots /
log compaction, a file journal that keeps term and vote) with no daemon to run
beside the controller and no dependency beyond the standard library; it is what
the issue names.  It must be >= 0.3.16: earlier versions did not keep the term and
the vote in the journal, so a restarted member could vote twice in one term.

Its limits, accepted here: the journal is written through mmap and not fsynced per
entry (a controller survives its own crash, kill -9, but a power loss of a majority
at once may lose the last acknowledged entries), and its peer protocol is pickle over
TCP: bind it to loopback or a private network, or give every controller the same
``password`` (Fernet-encrypted and authenticated frames).

Threads
    pysyncobj ticks on its own thread (``autoTick``): it applies committed entries
    there, under :attr:`RaftNode.lock`, and calls the result callbacks of
    :meth:`RaftNode.propose` there.  Readers on other threads take the same lock.
    The callback must not block: the actor hands results over to its own loop.

Files (``STORE/controller/``)
    ``raft.journal`` (+ ``.meta``: term, vote, commit index), the Raft log;
    ``raft.dump``, the snapshot written at log compaction (every SNAPSHOT_MIN_ENTRIES
    entries or SNAPSHOT_MIN_TIME_S); ``lock``, held (flock) while a controller uses the
    directory.  A restarted controller reloads both, then
    catches up from the leader.

Membership is static (``dynamicMembershipChange=False``): every controller is
started with the same peer list.
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import threading
import time
from typing import Callable, Optional

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from rmq.controller.state import ControllerState, InputError, Result
from rmq.protocol import ResponseCode

__all__ = ["RAFT_PORT_OFFSET", "RaftNode", "ReplicatedState", "raft_address", "fail_reason_name"]

RAFT_PORT_OFFSET = 1               # a controller's Raft port = its request port + 1
RAFT_DIR = "controller"            # under the store path
JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"
LOCK_FILE = "lock"                 # flock()ed while a controller runs on the store
# pysyncobj timings (its defaults unless said): an election starts after 0.4-1.4 s without a leader
RAFT_MIN_TIMEOUT_S = 0.4
RAFT_MAX_TIMEOUT_S = 1.4
APPEND_ENTRIES_PERIOD_S = 0.1      # leader heartbeat; must stay < RAFT_MIN_TIMEOUT_S / 3
# a leader hearing from no majority for this long steps down (pysyncobj's 30 s would let an isolated
# leader keep answering "leader" to brokers and admin for half a minute)
LEADER_FALLBACK_TIMEOUT_S = 4.0
CONNECTION_TIMEOUT_S = 3.5         # no data from a peer for this long: connection dead (>= RAFT_MAX_TIMEOUT_S)
CONNECTION_RETRY_S = 1.0           # reconnect a lost peer this often (pysyncobj: 5 s; a restarted peer rejoins sooner)
SNAPSHOT_MIN_ENTRIES = 5000        # log compaction after this many entries ...
SNAPSHOT_MIN_TIME_S = 300          # ... or this long since the last snapshot
TICK_JOIN_TIMEOUT_S = 5.0          # close(): wait this long for the tick thread to flush and stop

log = logging.getLogger("rmq.controller")


def raft_address(request_address: str) -> str:
    """``host:port`` of a controller's request socket -> ``host:port+RAFT_PORT_OFFSET`` (its Raft peer)."""
    host, port = request_address.rsplit(":", 1)
    return f"{host}:{int(port) + RAFT_PORT_OFFSET}"


def fail_reason_name(err) -> str:
    """pysyncobj's FAIL_REASON value -> its name ("MISSING_LEADER"), for remarks and logs."""
    for k, v in vars(FAIL_REASON).items():
        if not k.startswith("_") and v == err:
            return k
    return str(err)


def _apply(method: str, fn: Callable[[], Result]) -> Result:
    """Run one state operation on the apply thread.  An exception must not escape: pysyncobj
    would retry the same entry on every tick, forever.  It is the same bug on every controller,
    so the answer (SYSTEM_ERROR) is still the same everywhere."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        log.exception("controller state: %s failed", method)
        return Result(int(ResponseCode.SYSTEM_ERROR), f"{method}: {type(e).__name__}: {e}")


class ReplicatedState(SyncObjConsumer):
    """The Raft state machine: the three operations of :class:`ControllerState`, applied on
    pysyncobj's thread under ``lock``; snapshots are :meth:`ControllerState.to_dict`."""

    def __init__(self, lock: threading.RLock):
        super().__init__()
        self.lock = lock
        self.state = ControllerState()
        self.load_error: Optional[str] = None       # a snapshot that could not be read (set by _deserialize)

    @replicated
    def register_broker(self, cluster_name, broker_name, broker_address, broker_id):
        with self.lock:
            return _apply("register_broker", lambda: self.state.register_broker(
                cluster_name, broker_name, broker_address, broker_id))

    @replicated
    def elect_master(self, broker_name, candidates, preferred_id, unclean):
        with self.lock:
            return _apply("elect_master", lambda: self.state.elect_master(
                broker_name, candidates, preferred_id, unclean))

    @replicated
    def alter_sync_state_set(self, broker_name, master_broker_id, master_epoch, sync_state_set_epoch, new_set):
        with self.lock:
            return _apply("alter_sync_state_set", lambda: self.state.alter_sync_state_set(
                broker_name, master_broker_id, master_epoch, sync_state_set_epoch, new_set))

    # pysyncobj's snapshot hooks (log compaction, a follower too far behind)
    def _serialize(self):
        with self.lock:
            return {"controllerState": self.state.to_dict()}

    def _deserialize(self, data):
        try:
            state = ControllerState.from_dict(data.get("controllerState") if isinstance(data, dict) else None)
        except InputError as e:
            self.load_error = f"controller snapshot unreadable: {e}"
            log.critical("%s", self.load_error)
            return
        with self.lock:
            self.state = state


OPERATIONS = ("register_broker", "elect_master", "alter_sync_state_set")


class RaftNode:
    """One controller's member of the Raft group.

    Parameters
    ----------
    self_address : str
        This controller's Raft ``host:port`` (its id in the group).
    peer_addresses : list of str
        Raft ``host:port`` of every member (self may be listed; static membership).
    store_dir : str
        Directory of the journal and the snapshot (created).
    on_result : callable(token, result, error)
        Called on pysyncobj's thread (or the caller's, for a full queue) with a proposal's
        :class:`Result` (``error`` == FAIL_REASON.SUCCESS) or None and the FAIL_REASON.
    bind_address : str, optional
        ``host:port`` to bind (default ``self_address``; pysyncobj would bind 0.0.0.0).
    password : str, optional
        Shared secret of the group: pysyncobj encrypts and authenticates peer traffic.
    snapshot_min_entries : int
        Log compaction threshold (entries).

    Raises
    ------
    OSError
        The Raft port cannot be bound.
    """

    def __init__(self, self_address: str, peer_addresses: list, store_dir: str,
                 on_result: Callable[[int, Optional[Result], int], None], bind_address: Optional[str] = None,
                 password: Optional[str] = None, snapshot_min_entries: int = SNAPSHOT_MIN_ENTRIES):
        os.makedirs(store_dir, exist_ok=True)
        # one controller per store: two journals written through one file would corrupt both
        self._lock_fd = os.open(os.path.join(store_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise OSError(f"{store_dir} is in use by another controller") from None
        self.self_address = self_address
        self.on_result = on_result
        self.lock = threading.RLock()
        self.replicated = ReplicatedState(self.lock)
        conf = SyncObjConf(
            journalFile=os.path.join(store_dir, JOURNAL_FILE), fullDumpFile=os.path.join(store_dir, DUMP_FILE),
            dynamicMembershipChange=False, bindAddress=bind_address or self_address, maxBindRetries=1,
            # fail at once without a leader (the actor answers CONTROLLER_NOT_LEADER) rather than
            # queue a command that might apply long after its request was answered
            commandsWaitLeader=False,
            appendEntriesUseBatch=False,          # send each entry at once: commit in ~1 round trip
            useFork=False,                        # no fork() of a process holding zmq threads; state is small
            raftMinTimeout=RAFT_MIN_TIMEOUT_S, raftMaxTimeout=RAFT_MAX_TIMEOUT_S,
            appendEntriesPeriod=APPEND_ENTRIES_PERIOD_S, leaderFallbackTimeout=LEADER_FALLBACK_TIMEOUT_S,
            connectionTimeout=CONNECTION_TIMEOUT_S, connectionRetryTime=CONNECTION_RETRY_S,
            logCompactionMinEntries=max(2, snapshot_min_entries), logCompactionMinTime=SNAPSHOT_MIN_TIME_S,
            password=password)
        others = [p for p in peer_addresses if p != self_address]
        self.sync = SyncObj(self_address, others, conf, consumers=[self.replicated])
        try:
            self.sync.waitBinded()
        except SyncObjException:
            self.sync.destroy()
            os.close(self._lock_fd)
            raise OSError(f"cannot bind the Raft port {bind_address or self_address}") from None

    @property
    def state(self) -> ControllerState:
        """The applied state; read it under :attr:`lock`."""
        return self.replicated.state

    def propose(self, op: str, args: tuple, token: int) -> None:
        """Replicate ``op(*args)`` (one of OPERATIONS); ``on_result(token, ...)`` follows, once.
        A follower forwards it to the leader (pysyncobj); nothing here blocks."""
        if op not in OPERATIONS:
            raise ValueError(f"unknown controller operation {op!r}")
        getattr(self.replicated, op)(*args, callback=functools.partial(self._done, token))

    def _done(self, token: int, result, err) -> None:
        self.on_result(token, result, err)

    def is_leader(self) -> bool:
        return self.sync._isLeader()

    def leader(self) -> Optional[str]:
        """Raft address of the leader this node knows, None during an election."""
        node = self.sync._getLeader()
        return node.address if node is not None else None

    def is_ready(self) -> bool:
        """Whether this node has applied what the leader had committed when it first heard of it."""
        return self.sync.isReady()

    @property
    def term(self) -> int:
        return self.sync.raftCurrentTerm

    @property
    def has_quorum(self) -> bool:
        return self.sync.hasQuorum

    @property
    def load_error(self) -> Optional[str]:
        return self.replicated.load_error

    def alive(self) -> bool:
        """Whether pysyncobj's tick thread still runs (it is this node's whole Raft participation)."""
        return self.sync.tick_thread_alive()

    def close(self) -> None:
        """Stop the tick thread (it closes the peer connections and flushes the journal)."""
        self.sync.destroy()
        deadline = time.monotonic() + TICK_JOIN_TIMEOUT_S
        while self.sync.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.close(self._lock_fd)
