"""The controller's replicated state: RocketMQ 5's ``ReplicasInfoManager`` (SPEC.md §9.5).

Per broker set (key: brokerName) the controller group agrees on::

    clusterName         the cluster the set belongs to (fixed by its first registration)
    brokers             {brokerId: brokerAddress}; ids assigned here, first id 1, never reused,
                        stable per (brokerName, brokerAddress)
    masterBrokerId      the master's id, NO_MASTER (-1) when none
    masterEpoch         0 before the first master; +1 (at least) per elected master
    syncStateSet        ids of the replicas in sync with the master (RocketMQ's SyncStateSet)
    syncStateSetEpoch   +1 per change of the SyncStateSet

The masterAddress is ``brokers[masterBrokerId]``: ids are stable per address, so it
is derived, never stored apart.

This module is pure and deterministic: no I/O, no clock, no randomness.  Every
controller of the group applies the same operations in the same order (the Raft log,
:mod:`rmq.controller.raft`) and so reaches the same state.  What depends on time
(which replicas are alive) is decided by the Raft leader *before* it proposes an
operation and travels inside it (``candidates`` of :meth:`ControllerState.elect_master`).

Every operation validates all its input first: a bad request returns an error
:class:`Result` and changes nothing.

Concurrency
    Not thread-safe: the Raft apply thread mutates it, the actor thread reads it; the
    caller (:class:`rmq.controller.raft.RaftNode`) holds one lock around both.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple, Optional

from rmq.broker_conf import ADDR_PATTERN, NAME_PATTERN  # noqa: F401 - re-exported for the controller
from rmq.protocol import ResponseCode

__all__ = ["ControllerState", "Result", "NO_MASTER", "FIRST_BROKER_ID", "check_name", "check_address",
           "SNAPSHOT_VERSION"]

NO_MASTER = -1                     # masterBrokerId of a broker set without a master (RocketMQ: null)
FIRST_BROKER_ID = 1                # the first replica registered in a broker set gets id 1
BROKER_ID_MAX = 2 ** 63 - 1        # Java long
EPOCH_MAX = 2 ** 31 - 1            # Java int: RocketMQ's masterEpoch / syncStateSetEpoch
OFFSET_MIN = -1                    # a replica that does not know its offset yet reports -1
OFFSET_MAX = 2 ** 63 - 1           # Java long
PRIORITY_MIN = -2 ** 31            # brokerElectionPriority is a Java int; lower = preferred
PRIORITY_MAX = 2 ** 31 - 1
NAME_MAX_LENGTH = 255              # clusterName / brokerName, characters (as the NameServer)
ADDR_MAX_LENGTH = 255              # "host:port", characters
MAX_BROKERS_PER_SET = 256          # replicas of one broker set (RocketMQ runs 2-3); bounds a request's lists
MAX_BROKER_SETS = 65536            # broker sets of the whole controller group: bounds its memory
SNAPSHOT_VERSION = 1               # ``to_dict()["version"]``
# the NameServer's and broker.conf's rules: RocketMQ's name charset plus '.'; "host:port"

_OK = int(ResponseCode.SUCCESS)
_INVALID_REQUEST = int(ResponseCode.CONTROLLER_INVALID_REQUEST)
_NOT_EXIST = int(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST)


class Result(NamedTuple):
    """What an operation answers.

    Attributes
    ----------
    code : int
        ResponseCode: SUCCESS or a CONTROLLER_* error.
    remark : str
        Why, on an error (and a short note on some successes).
    info : dict or None
        The broker set's replica info after the operation (see :meth:`ControllerState.replica_info`),
        None when the broker set is unknown or the request could not be read.
    changed : bool
        Whether the state changed.
    """
    code: int
    remark: str = ""
    info: Optional[dict] = None
    changed: bool = False


class InputError(ValueError):
    """A request value that cannot be used; the remark names it."""


def _int(value, what: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{what} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InputError(f"{what}={value} outside [{lo}, {hi}]")
    return value


def check_name(value, what: str) -> str:
    """A clusterName / brokerName: non-empty str, <= NAME_MAX_LENGTH, NAME_PATTERN.

    Raises
    ------
    InputError
        Naming ``what``.
    """
    if not isinstance(value, str):
        raise InputError(f"{what} must be a str, got {type(value).__name__}")
    if len(value) > NAME_MAX_LENGTH or not NAME_PATTERN.match(value):
        raise InputError(f"{what}={value[:64]!r} must be 1-{NAME_MAX_LENGTH} characters of [%|a-zA-Z0-9_.-]")
    return value


def check_address(value, what: str) -> str:
    """A broker address ``host:port`` (1 <= port <= 65535).

    Raises
    ------
    InputError
        Naming ``what``.
    """
    if not isinstance(value, str):
        raise InputError(f"{what} must be a str, got {type(value).__name__}")
    m = ADDR_PATTERN.match(value) if len(value) <= ADDR_MAX_LENGTH else None
    if m is None or not 1 <= int(m.group(1)) <= 65535:
        raise InputError(f"{what}={value[:64]!r} must be an address 'host:port'")
    return value


def check_broker_id(value, what: str = "brokerId", allow_none: bool = False) -> int:
    """A broker id: FIRST_BROKER_ID..BROKER_ID_MAX, or NO_MASTER (-1, "none") when ``allow_none``."""
    v = _int(value, what, NO_MASTER if allow_none else FIRST_BROKER_ID, BROKER_ID_MAX)
    if v == 0:
        raise InputError(f"{what}=0: controller-assigned ids start at {FIRST_BROKER_ID}")
    return v


def check_candidates(candidates) -> dict:
    """The alive replicas of an election -> {brokerId: (epoch, maxOffset, electionPriority)}.

    ``candidates``: a list of ``{"brokerId", "epoch", "maxOffset", "electionPriority"}`` maps,
    at most MAX_BROKERS_PER_SET, each id once.

    Raises
    ------
    InputError
        Naming the first bad entry.
    """
    if not isinstance(candidates, (list, tuple)):
        raise InputError(f"candidates must be a list, got {type(candidates).__name__}")
    if len(candidates) > MAX_BROKERS_PER_SET:
        raise InputError(f"{len(candidates)} candidates exceed {MAX_BROKERS_PER_SET}")
    out: dict = {}
    for i, c in enumerate(candidates):
        if not isinstance(c, dict):
            raise InputError(f"candidates[{i}] must be a map, got {type(c).__name__}")
        bid = check_broker_id(c.get("brokerId"), f"candidates[{i}].brokerId")
        if bid in out:
            raise InputError(f"candidates list broker id {bid} twice")
        out[bid] = (_int(c.get("epoch"), f"candidates[{i}].epoch", 0, EPOCH_MAX),
                    _int(c.get("maxOffset"), f"candidates[{i}].maxOffset", OFFSET_MIN, OFFSET_MAX),
                    _int(c.get("electionPriority"), f"candidates[{i}].electionPriority", PRIORITY_MIN, PRIORITY_MAX))
    return out


def check_id_set(ids, what: str = "syncStateSet") -> frozenset:
    """A SyncStateSet as sent: a non-empty list of distinct broker ids."""
    if not isinstance(ids, (list, tuple)):
        raise InputError(f"{what} must be a list of broker ids, got {type(ids).__name__}")
    if not ids:
        raise InputError(f"{what} must not be empty")
    if len(ids) > MAX_BROKERS_PER_SET:
        raise InputError(f"{what} lists {len(ids)} ids, over {MAX_BROKERS_PER_SET}")
    out = set()
    for i, v in enumerate(ids):
        bid = check_broker_id(v, f"{what}[{i}]")
        if bid in out:
            raise InputError(f"{what} lists broker id {bid} twice")
        out.add(bid)
    return frozenset(out)


class _BrokerSet:
    """One broker set's replicated record (see the module docstring)."""

    __slots__ = ("cluster_name", "brokers", "master_broker_id", "master_epoch", "sync_state_set",
                 "sync_state_set_epoch")

    def __init__(self, cluster_name: str):
        self.cluster_name = cluster_name
        self.brokers: dict[int, str] = {}
        self.master_broker_id = NO_MASTER
        self.master_epoch = 0
        self.sync_state_set: frozenset = frozenset()
        self.sync_state_set_epoch = 0

    def id_of(self, address: str) -> int:
        if not address:
            return NO_MASTER
        for bid, addr in self.brokers.items():
            if addr == address:
                return bid
        return NO_MASTER

    @property
    def master_address(self) -> str:
        return self.brokers.get(self.master_broker_id, "")


class ControllerState:
    """The broker sets a controller group agrees on (RocketMQ's ReplicasInfoManager).

    The three mutating operations (:meth:`register_broker`, :meth:`elect_master`,
    :meth:`alter_sync_state_set`) are the Raft state machine's; everything else reads.
    """

    def __init__(self):
        self._sets: dict[str, _BrokerSet] = {}

    # -- reads ---------------------------------------------------------------------------------
    def broker_names(self) -> list:
        """Names of the known broker sets, sorted."""
        return sorted(self._sets)

    def has_broker_set(self, broker_name: str) -> bool:
        return broker_name in self._sets

    def brokers(self, broker_name: str) -> dict:
        """{brokerId: brokerAddress} of a broker set (a copy; {} when unknown)."""
        bs = self._sets.get(broker_name)
        return dict(bs.brokers) if bs is not None else {}

    def master_of(self, broker_name: str) -> int:
        """The master's id, NO_MASTER when none or the broker set is unknown."""
        bs = self._sets.get(broker_name)
        return bs.master_broker_id if bs is not None else NO_MASTER

    def resolve_broker(self, cluster_name: str, broker_name: str, broker_address: str, broker_id: int) -> int:
        """The id registered for ``broker_address`` in the broker set (``broker_id``, if not -1,
        must be that id; ``cluster_name`` must match), NO_MASTER (-1) when there is none."""
        bs = self._sets.get(broker_name)
        if bs is None or bs.cluster_name != cluster_name:
            return NO_MASTER
        bid = bs.id_of(broker_address)
        if bid == NO_MASTER or (broker_id != NO_MASTER and broker_id != bid):
            return NO_MASTER
        return bid

    def replica_info(self, broker_name: str, broker_id: int = NO_MASTER) -> Optional[dict]:
        """The fields of a replica info response, None when the broker set is unknown.

        Returns
        -------
        dict
            brokerName, brokerId (``broker_id`` as given), masterBrokerId, masterAddress ("" without a
            master), masterEpoch, syncStateSetEpoch, syncStateSet (sorted list of ids).
        """
        bs = self._sets.get(broker_name)
        if bs is None:
            return None
        return {"brokerName": broker_name, "brokerId": broker_id, "masterBrokerId": bs.master_broker_id,
                "masterAddress": bs.master_address, "masterEpoch": bs.master_epoch,
                "syncStateSetEpoch": bs.sync_state_set_epoch, "syncStateSet": sorted(bs.sync_state_set)}

    def eligible_ids(self, broker_name: str, alive_ids: Iterable[int], unclean: bool = False) -> list:
        """Ids an election may pick among ``alive_ids`` (RocketMQ DefaultElectPolicy), sorted.

        The alive members of the SyncStateSet; every alive registered replica when the broker set
        never had a master (masterEpoch 0) or, with ``unclean`` (enableElectUncleanMaster), when no
        member of the SyncStateSet is alive.  [] for an unknown broker set.
        """
        bs = self._sets.get(broker_name)
        if bs is None:
            return []
        return self._eligible(bs, [i for i in alive_ids if i in bs.brokers], unclean)

    @staticmethod
    def _eligible(bs: _BrokerSet, alive_ids: Iterable[int], unclean: bool) -> list:
        alive = sorted(set(alive_ids))
        if bs.master_epoch == 0:
            return alive
        in_sync = [i for i in alive if i in bs.sync_state_set]
        return in_sync if in_sync or not unclean else alive

    # -- operations (the Raft state machine) ------------------------------------------------------
    def register_broker(self, cluster_name, broker_name, broker_address, broker_id=NO_MASTER) -> Result:
        """Register a replica of a broker set; its id is kept if known, else assigned.

        Parameters
        ----------
        cluster_name, broker_name : str
            NAME_PATTERN; a broker set stays in the cluster of its first registration.
        broker_address : str
            ``host:port`` of the broker's request socket.
        broker_id : int
            The id the broker asks for, or -1: the id already registered for ``broker_address``,
            else the next free one (highest id + 1, FIRST_BROKER_ID for the first).

        Returns
        -------
        Result
            SUCCESS with the replica info (``brokerId``: the broker's id), or
            CONTROLLER_INVALID_REQUEST: bad input, another cluster, too many replicas / broker sets.
            A known id asked for from another address moves to it (see the code's comment).
        """
        try:
            check_name(cluster_name, "clusterName")
            check_name(broker_name, "brokerName")
            check_address(broker_address, "brokerAddress")
            check_broker_id(broker_id, allow_none=True)
        except InputError as e:
            return Result(_INVALID_REQUEST, str(e))
        bs = self._sets.get(broker_name)
        if bs is None:
            if len(self._sets) >= MAX_BROKER_SETS:
                return Result(_INVALID_REQUEST, f"{MAX_BROKER_SETS} broker sets registered already")
            bs = _BrokerSet(cluster_name)
            new_id = FIRST_BROKER_ID if broker_id == NO_MASTER else broker_id
            bs.brokers[new_id] = broker_address
            self._sets[broker_name] = bs
            return Result(_OK, "", self.replica_info(broker_name, new_id), True)
        if bs.cluster_name != cluster_name:
            return Result(_INVALID_REQUEST, f"broker set {broker_name} belongs to cluster {bs.cluster_name}, "
                                            f"not {cluster_name}", self.replica_info(broker_name))
        known = bs.id_of(broker_address)
        if known != NO_MASTER and broker_id in (NO_MASTER, known):
            return Result(_OK, "", self.replica_info(broker_name, known), False)
        if broker_id != NO_MASTER and broker_id in bs.brokers:
            # a known replica on a new address (a restart on another port; it keeps its id on disk:
            # rmq.actors.controller_client): it moves there.  A stale registration of the new address
            # under another id loses the address until that replica registers again.  The leader
            # refuses this while the id is alive at its old address (rmq.controller.actor).
            if known != NO_MASTER:
                bs.brokers[known] = ""
            bs.brokers[broker_id] = broker_address
            return Result(_OK, f"broker id {broker_id} moved to {broker_address}",
                          self.replica_info(broker_name, broker_id), True)
        if known != NO_MASTER:
            return Result(_INVALID_REQUEST, f"{broker_address} is registered in {broker_name} as broker id "
                                            f"{known}, not {broker_id}", self.replica_info(broker_name))
        if len(bs.brokers) >= MAX_BROKERS_PER_SET:
            return Result(_INVALID_REQUEST, f"broker set {broker_name} has {MAX_BROKERS_PER_SET} replicas already",
                          self.replica_info(broker_name))
        new_id = max(bs.brokers) + 1 if broker_id == NO_MASTER else broker_id
        if new_id > BROKER_ID_MAX:
            return Result(_INVALID_REQUEST, f"no broker id left in {broker_name}", self.replica_info(broker_name))
        bs.brokers[new_id] = broker_address
        return Result(_OK, "", self.replica_info(broker_name, new_id), True)

    def elect_master(self, broker_name, candidates, preferred_id=NO_MASTER, unclean=False) -> Result:
        """Elect a master among the alive replicas (RocketMQ ElectMaster + DefaultElectPolicy).

        Parameters
        ----------
        broker_name : str
        candidates : list of dict
            The replicas the proposing leader saw alive, each ``{"brokerId", "epoch", "maxOffset",
            "electionPriority"}`` as last reported in its heartbeat; every id registered.
        preferred_id : int
            -1, or the id to elect (admin's manual override): it must be alive and eligible.
        unclean : bool
            enableElectUncleanMaster: with no alive member of the SyncStateSet, any alive replica.

        Returns
        -------
        Result
            * the current master alive and no other preferred: SUCCESS, nothing changes;
            * a new master, picked by epoch desc, maxOffset desc, electionPriority asc, brokerId asc
              (or the preferred one): masterEpoch = max(masterEpoch, highest candidate epoch) + 1,
              syncStateSet = {new master}, syncStateSetEpoch + 1; SUCCESS;
            * nobody eligible: the master is cleared (masterBrokerId -1, the dead master keeps no
              claim), the SyncStateSet kept; CONTROLLER_MASTER_NOT_AVAILABLE;
            * the preferred id not alive: CONTROLLER_BROKER_NOT_ALIVE; alive but not eligible (out of
              the SyncStateSet): CONTROLLER_INVALID_REQUEST; nothing changes;
            * unknown broker set or id: CONTROLLER_BROKER_METADATA_NOT_EXIST; bad input:
              CONTROLLER_INVALID_REQUEST; nothing changes.
        """
        try:
            check_name(broker_name, "brokerName")
            alive = check_candidates(candidates)
            check_broker_id(preferred_id, "preferred brokerId", allow_none=True)
            if not isinstance(unclean, bool):
                raise InputError(f"unclean must be a bool, got {type(unclean).__name__}")
        except InputError as e:
            return Result(_INVALID_REQUEST, str(e))
        bs = self._sets.get(broker_name)
        if bs is None:
            return Result(_NOT_EXIST, f"broker set {broker_name} is not registered")
        info = self.replica_info(broker_name)
        for bid in alive:
            if bid not in bs.brokers:
                return Result(_NOT_EXIST, f"candidate broker id {bid} is not registered in {broker_name}", info)
        if preferred_id != NO_MASTER and preferred_id not in bs.brokers:
            return Result(_NOT_EXIST, f"broker id {preferred_id} is not registered in {broker_name}", info)
        master = bs.master_broker_id
        if master != NO_MASTER and master in alive and preferred_id in (NO_MASTER, master):
            return Result(_OK, f"master {master} of {broker_name} is alive", info)
        eligible = self._eligible(bs, alive, unclean)
        if preferred_id != NO_MASTER:
            if preferred_id not in alive:
                return Result(int(ResponseCode.CONTROLLER_BROKER_NOT_ALIVE),
                              f"broker id {preferred_id} of {broker_name} is not alive", info)
            if preferred_id not in eligible:
                return Result(_INVALID_REQUEST,
                              f"broker id {preferred_id} of {broker_name} is not in the SyncStateSet "
                              f"{sorted(bs.sync_state_set)} (enableElectUncleanMaster is "
                              f"{'on' if unclean else 'off'})", info)
            new_master = preferred_id
        elif not eligible:
            remark = (f"no alive replica of {broker_name} can be master (SyncStateSet "
                      f"{sorted(bs.sync_state_set)}, alive {sorted(alive)})")
            if master == NO_MASTER:
                return Result(int(ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE), remark, info)
            bs.master_broker_id = NO_MASTER
            return Result(int(ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE), remark,
                          self.replica_info(broker_name), True)
        else:
            # DefaultElectPolicy's comparator: epoch desc, maxOffset desc, electionPriority asc; then id
            new_master = min(eligible, key=lambda i: (-alive[i][0], -alive[i][1], alive[i][2], i))
        # above any epoch a candidate has seen, so no replica holds a log of the new epoch already
        new_epoch = max([bs.master_epoch] + [c[0] for c in alive.values()]) + 1
        if new_epoch > EPOCH_MAX or bs.sync_state_set_epoch + 1 > EPOCH_MAX:
            return Result(_INVALID_REQUEST, f"epochs of {broker_name} exhausted", info)
        bs.master_broker_id = new_master
        bs.master_epoch = new_epoch
        bs.sync_state_set = frozenset((new_master,))
        bs.sync_state_set_epoch += 1
        return Result(_OK, "", self.replica_info(broker_name), True)

    def alter_sync_state_set(self, broker_name, master_broker_id, master_epoch, sync_state_set_epoch,
                             new_set) -> Result:
        """The master changes its SyncStateSet (RocketMQ AlterSyncStateSet).

        The replica info answered has ``brokerId`` = ``master_broker_id`` (the caller) when registered.
        Only the current master at the current epochs may; ``new_set`` must hold the master and only
        registered ids (that they are alive is checked by the proposing leader).  An unchanged set is
        a SUCCESS that changes nothing (RocketMQ refuses it); else syncStateSetEpoch + 1.

        Returns
        -------
        Result
            SUCCESS, or (nothing changed) CONTROLLER_INVALID_MASTER (not the master, or no master),
            CONTROLLER_FENCED_MASTER_EPOCH, CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            CONTROLLER_INVALID_REPLICAS (unknown id, master missing), CONTROLLER_BROKER_METADATA_NOT_EXIST
            (unknown broker set), CONTROLLER_INVALID_REQUEST (bad input).
        """
        try:
            check_name(broker_name, "brokerName")
            check_broker_id(master_broker_id, "masterBrokerId")
            _int(master_epoch, "masterEpoch", 0, EPOCH_MAX)
            _int(sync_state_set_epoch, "syncStateSetEpoch", 0, EPOCH_MAX)
            ids = check_id_set(new_set)
        except InputError as e:
            return Result(_INVALID_REQUEST, str(e))
        bs = self._sets.get(broker_name)
        if bs is None:
            return Result(_NOT_EXIST, f"broker set {broker_name} is not registered")
        caller = master_broker_id if master_broker_id in bs.brokers else NO_MASTER
        info = self.replica_info(broker_name, caller)
        if bs.master_broker_id == NO_MASTER or master_broker_id != bs.master_broker_id:
            return Result(int(ResponseCode.CONTROLLER_INVALID_MASTER),
                          f"broker id {master_broker_id} is not the master of {broker_name} "
                          f"(master: {bs.master_broker_id})", info)
        if master_epoch != bs.master_epoch:
            return Result(int(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH),
                          f"masterEpoch {master_epoch} of {broker_name} is not the current {bs.master_epoch}", info)
        if sync_state_set_epoch != bs.sync_state_set_epoch:
            return Result(int(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
                          f"syncStateSetEpoch {sync_state_set_epoch} of {broker_name} is not the current "
                          f"{bs.sync_state_set_epoch}", info)
        unknown = sorted(i for i in ids if i not in bs.brokers)
        if unknown:
            return Result(int(ResponseCode.CONTROLLER_INVALID_REPLICAS),
                          f"broker ids {unknown} are not registered in {broker_name}", info)
        if bs.master_broker_id not in ids:
            return Result(int(ResponseCode.CONTROLLER_INVALID_REPLICAS),
                          f"the SyncStateSet of {broker_name} must contain its master {bs.master_broker_id}", info)
        if ids == bs.sync_state_set:
            return Result(_OK, "SyncStateSet unchanged", info)
        if bs.sync_state_set_epoch + 1 > EPOCH_MAX:
            return Result(_INVALID_REQUEST, f"syncStateSetEpoch of {broker_name} exhausted", info)
        bs.sync_state_set = ids
        bs.sync_state_set_epoch += 1
        return Result(_OK, "", self.replica_info(broker_name, caller), True)

    # -- snapshot ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The whole state as plain data (str keys, lists, ints, strs): Raft snapshots.

        ``{"version": 1, "brokerSets": {brokerName: {"clusterName", "brokers": [[id, address], ...],
        "masterBrokerId", "masterEpoch", "syncStateSet": [ids], "syncStateSetEpoch"}}}``
        """
        return {"version": SNAPSHOT_VERSION, "brokerSets": {
            name: {"clusterName": bs.cluster_name, "brokers": [[i, a] for i, a in sorted(bs.brokers.items())],
                   "masterBrokerId": bs.master_broker_id, "masterEpoch": bs.master_epoch,
                   "syncStateSet": sorted(bs.sync_state_set), "syncStateSetEpoch": bs.sync_state_set_epoch}
            for name, bs in sorted(self._sets.items())}}

    @classmethod
    def from_dict(cls, data) -> "ControllerState":
        """The state :meth:`to_dict` wrote.

        Raises
        ------
        InputError
            A malformed or unknown-version snapshot, naming the bad entry.
        """
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
            raise InputError(f"controller snapshot of unknown version: "
                             f"{data.get('version') if isinstance(data, dict) else type(data).__name__}")
        sets = data.get("brokerSets")
        if not isinstance(sets, dict):
            raise InputError("controller snapshot: brokerSets must be a map")
        out = cls()
        for name, d in sets.items():
            where = f"brokerSets[{name!r}]"
            check_name(name, where)
            if not isinstance(d, dict):
                raise InputError(f"{where} must be a map")
            bs = _BrokerSet(check_name(d.get("clusterName"), f"{where}.clusterName"))
            pairs = d.get("brokers")
            if not isinstance(pairs, list):
                raise InputError(f"{where}.brokers must be a list")
            for p in pairs:
                if not isinstance(p, (list, tuple)) or len(p) != 2:
                    raise InputError(f"{where}.brokers entries must be [id, address]")
                bid = check_broker_id(p[0], f"{where}.brokers id")
                if bid in bs.brokers:
                    raise InputError(f"{where}.brokers lists id {bid} twice")
                bs.brokers[bid] = check_address(p[1], f"{where}.brokers[{bid}]")
            bs.master_broker_id = check_broker_id(d.get("masterBrokerId"), f"{where}.masterBrokerId", allow_none=True)
            bs.master_epoch = _int(d.get("masterEpoch"), f"{where}.masterEpoch", 0, EPOCH_MAX)
            sss = d.get("syncStateSet")
            bs.sync_state_set = check_id_set(sss, f"{where}.syncStateSet") if sss else frozenset()
            bs.sync_state_set_epoch = _int(d.get("syncStateSetEpoch"), f"{where}.syncStateSetEpoch", 0, EPOCH_MAX)
            if bs.master_broker_id != NO_MASTER and bs.master_broker_id not in bs.brokers:
                raise InputError(f"{where}.masterBrokerId {bs.master_broker_id} is not registered")
            if any(i not in bs.brokers for i in bs.sync_state_set):
                raise InputError(f"{where}.syncStateSet lists an unregistered id")
            out._sets[name] = bs
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, ControllerState) and self.to_dict() == other.to_dict()
