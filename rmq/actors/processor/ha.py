"""rmq's HA requests on the broker: HA_ANNOUNCE / HA_APPEND / HA_TRUNCATE from the ha actor, the
promotion of a slave (UPDATE_BROKER_CONFIG brokerRole + brokerId=0), and SlaveSynchronize.

Source: RocketMQ ``store/.../ha/HAService.java`` (isSlaveOK, the acknowledged offset),
``broker/.../slave/SlaveSynchronize.java``, 5.x's epoch file (``EpochFileCache``); SPEC.md §9.
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

import zmq

from rmq import protocol as P
from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.common.perm import PERM_READ, PERM_WRITE
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode, field_int, unpack_body
from rmq.store.config_manager import write_file_atomically
from rmq.store.epoch import EpochEntry
from rmq.store.message_store import write_truncate_marker

SLAVE_SYNC_INTERVAL_MS = 10_000              # SlaveSynchronize: offsets, topics, groups from the master
                                             # (rmq property slaveSyncInterval, ms)
FIND_MASTER_INTERVAL_MS = 1_000              # a slave without its master's addresses asks this often
PROMOTE_WAIT_MS = 10_000                     # promotion waits this long for reput to catch up
PROMOTE_MASTER_PROBE_MS = 1_000              # a promotion asks the master itself for its CommitLog end;
                                             # no answer within this long = the master is unreachable
PROBE_OPAQUE_BASE = 1 << 30                  # opaques of promotion probes on the master socket (sync
                                             # requests use their request code as opaque)
HA_ROLE_FILE = "haRole.json"                 # config/haRole.json: role and id set by a promotion
EXIT_RESTART_GROUP = 75                      # broker exit code: restart the group (after HA_TRUNCATE)
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
SLAVE_SYNC_CODES = (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET,
                    RequestCode.GET_ALL_DELAY_OFFSET, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)


class HAProcessor(RequestProcessor):
    """The broker's side of replication.  The role and HA fields live on the broker actor
    (``role``, ``ha_state``, ``ha_slaves``, ``ha_ack_offset``, ``epochs``...): the send path, the
    NameServer registration and the runtime info read them too."""

    def __init__(self, broker):
        super().__init__(broker)
        self.pending_promotions: list = []       # [deadline, reply, frame, new role, props, probe opaque]
        self.promotion_probes: dict = {}         # probe opaque -> master's answer (None: not yet)
        self._probe_seq = 0
        self._master_sock: Optional[zmq.Socket] = None
        self._master_sock_addr = ""

    # -- the ha actor's reports -----------------------------------------------------------------------
    def on_ha_announce(self, frame: Frame, reply: Reply) -> None:
        """The ha actor's state: master -> slave acknowledgements, slave -> link and master epochs."""
        b = self.b
        fields = frame.fields
        b.ha_state = fields
        if fields.get("role") == "MASTER":
            addr = str(fields.get("haServerAddr") or "")
            if addr != b.ha_server_addr:
                b.ha_server_addr = addr
                b.register_broker_all()        # slaves learn the HA address from the NameServer
            slaves = fields.get("slaves") or []
            b.ha_slaves = slaves if isinstance(slaves, list) else []
            ack = int(fields.get("ackOffset", -1))
            if ack != b.ha_ack_offset:
                b.ha_ack_offset = ack
                if b.send_processor.sync_waits:
                    b.send_processor.release_sync_waits()
        elif fields.get("role") == "SLAVE" and b.role == "SLAVE":
            self.adopt_master_epochs(fields.get("masterEpochs") or [])
        return None

    def adopt_master_epochs(self, entries: list) -> None:
        """A slave's epoch history is the master's, up to what the slave holds."""
        b = self.b
        end = b.store.get_max_phy_offset()
        try:
            wanted = [EpochEntry(int(e), int(o)) for e, o in entries if int(o) <= end]
        except (TypeError, ValueError):
            return
        if wanted and wanted != list(b.epochs.entries):
            b.epochs.entries = wanted
            b.epochs.persist()
            self.log.info("epoch history now %s", [tuple(e) for e in wanted])

    def on_ha_append(self, frame: Frame, reply: Reply) -> Frame:
        """HA_APPEND (slave): CommitLog bytes from the master, appended verbatim at ``offset``."""
        b = self.b
        if b.role != "SLAVE":
            return frame.response(ResponseCode.SYSTEM_ERROR, f"replicated bytes refused: this broker is {b.role}")
        offset = field_int(frame, "offset", lo=0)
        if not frame.bodies:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, "no body part")
        if not b.epochs.entries and b.ha_state.get("masterEpochs"):
            self.adopt_master_epochs(b.ha_state["masterEpochs"])   # never hold bytes without their epoch
        try:
            end = b.store.apply_replica(offset, frame.bodies[0])
        except Exception as e:      # ReplicaOffsetMismatch, ReplicaDataError, StoreError: nothing written
            self.log.warning("replicated bytes at %d refused: %s", offset, e)
            return frame.response(ResponseCode.SYSTEM_ERROR, str(e))
        b.stats["putBytesTotal"] += len(frame.bodies[0])
        return frame.response(fields={"maxOffset": end})

    def on_ha_truncate(self, frame: Frame, reply: Reply) -> Frame:
        """HA_TRUNCATE (slave): the CommitLog diverged from the master's.  Write the ``ha_truncate``
        marker and exit EXIT_RESTART_GROUP: the supervisor restarts the group and recovery cuts
        the tail there (no other actor writes while it does)."""
        b = self.b
        if b.role != "SLAVE":
            return frame.response(ResponseCode.SYSTEM_ERROR, f"truncation refused: this broker is {b.role}")
        offset = field_int(frame, "offset", lo=0)
        self.log.warning("CommitLog diverged from the master's at %d (end %d): truncating on restart",
                         offset, b.store.get_max_phy_offset())
        write_truncate_marker(b.store_path, offset)
        b.exit_code = EXIT_RESTART_GROUP
        b.stop()
        return frame.response()

    def slave_ok(self, end: int) -> bool:
        """A slave is connected and less than haSlaveFallbehindMax bytes behind ``end`` (HAService.isSlaveOK)."""
        b = self.b
        return bool(b.ha_slaves) and end - b.ha_ack_offset < b.store_config.ha_slave_fallbehind_max

    def lag_ms(self, now_ms: int) -> int:
        """Master: now minus the store time of the first message no slave has acknowledged (the
        acked offset is a record boundary: the ha actor ships whole records); 0 when a slave has
        everything, -1 without a slave or when the record cannot be read."""
        b = self.b
        if b.role == "SLAVE" or not b.ha_slaves:
            return -1
        store = b.store
        ack = max(b.ha_ack_offset, store.get_min_phy_offset())
        if ack >= store.get_max_phy_offset():
            return 0
        try:
            ts = store.get_store_timestamp_at(ack)     # past a file's end padding if ack sits on it
        except Exception:  # noqa: BLE001 - a file being deleted under us: no figure
            return -1
        return max(0, now_ms - ts) if ts > 0 else -1

    # -- promotion --------------------------------------------------------------------------------------
    def request_promotion(self, frame: Frame, reply: Reply, role: str, props: dict) -> Optional[Frame]:
        """Promote this SLAVE to ``role``: once reput has dispatched everything it holds (up to
        PROMOTE_WAIT_MS) it opens a new epoch at its CommitLog end, persists the role
        (config/haRole.json), re-registers as brokerId 0 and answers SUCCESS.  Refused while the
        master is reachable and ahead of it."""
        b = self.b
        if b.ha_state.get("connected") and \
                int(b.ha_state.get("masterMaxOffset", 0) or 0) > b.store.get_max_phy_offset():
            return self._refuse_promotion(frame, int(b.ha_state["masterMaxOffset"]))
        # the ha actor's report may be stale (a hung ha actor, a cut replication link): ask the
        # master itself; only silence for PROMOTE_MASTER_PROBE_MS counts as "unreachable"
        probe = self._probe_master()
        self.pending_promotions.append([time.monotonic() + PROMOTE_WAIT_MS / 1000.0, reply, frame, role, props,
                                        probe])
        self.try_promotions()
        return None

    def _refuse_promotion(self, frame: Frame, master_end: int) -> Frame:
        behind = master_end - self.b.store.get_max_phy_offset()
        return frame.response(ResponseCode.SYSTEM_ERROR,
                              f"slave not caught up: {behind} bytes behind a reachable master; "
                              f"stop the master first or wait")

    def _probe_master(self) -> Optional[int]:
        """Send GET_BROKER_RUNTIME_INFO to the master over the sync socket; returns the probe's
        opaque (its answer lands in ``promotion_probes``), or None when no master is known."""
        sock = self._master_socket()
        if sock is None:
            return None
        self._probe_seq += 1
        opaque = PROBE_OPAQUE_BASE + self._probe_seq
        self.promotion_probes[opaque] = None
        try:
            sock.send_multipart(P.encode(Frame(RequestCode.GET_BROKER_RUNTIME_INFO, opaque=opaque)), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass                                 # no connection at all: silence, as if unreachable
        return opaque

    def try_promotions(self) -> None:
        b = self.b
        now = time.monotonic()
        end = b.store.get_max_phy_offset()
        for item in list(self.pending_promotions):
            deadline, reply, frame, role, props, probe = item
            if probe is not None and b.role == "SLAVE":
                answer = self.promotion_probes.get(probe)
                if answer is None and now < deadline - (PROMOTE_WAIT_MS - PROMOTE_MASTER_PROBE_MS) / 1000.0:
                    continue                     # still waiting for the master's answer
                self.promotion_probes.pop(probe, None)
                item[5] = None
                master_end = int(answer.get("commitLogMaxOffset", 0) or 0) if answer else 0
                if answer and answer.get("brokerRole") in MASTER_ROLES and master_end > end:
                    self.pending_promotions.remove(item)
                    reply.send(self._refuse_promotion(frame, master_end))
                    continue
                if answer is None:
                    self.log.warning("promotion: the master at %s did not answer within %d ms: taken as down",
                                     b.master_broker_addr, PROMOTE_MASTER_PROBE_MS)
            if b.role != "SLAVE":
                self.pending_promotions.remove(item)
                reply.send(frame.response() if b.role == role else
                           frame.response(ResponseCode.SYSTEM_ERROR, f"this broker is already {b.role}"))
            elif b.dispatched_offset >= end:
                self.pending_promotions.remove(item)
                self._promote(role)
                reply.send(b.admin_processor.apply_runtime_props(frame, props))
            elif now >= deadline:
                self.pending_promotions.remove(item)
                reply.send(frame.response(ResponseCode.SYSTEM_ERROR,
                                          f"reput has not dispatched the CommitLog within {PROMOTE_WAIT_MS} ms "
                                          f"({end - b.dispatched_offset} bytes left); retry"))

    def promote_to_epoch(self, role: str, epoch: int) -> bool:
        """Controller mode: the controllers elected this SLAVE master at ``epoch``; promote it now
        when reput has dispatched everything it holds (True), else False (the next heartbeat
        answer asks again).  No probe of the old master: the controllers' election is the decision."""
        b = self.b
        if b.role != "SLAVE":
            return False
        end = b.store.get_max_phy_offset()
        if b.dispatched_offset < end:
            self.log.info("elected master at epoch %d: waiting for reput (%d bytes left)", epoch,
                          end - b.dispatched_offset)
            return False
        self._promote(role, epoch)
        return True

    def _promote(self, role: str, epoch: Optional[int] = None) -> None:
        """Make this SLAVE the master: a new epoch from its CommitLog end (``epoch``: the
        controllers' master epoch; one the epoch file already holds continues that reign)."""
        b = self.b
        old_id = b.broker_id
        end = b.store.get_max_phy_offset()
        last = b.epochs.last_epoch()
        if epoch is None:
            epoch = last + 1
        if epoch > last:
            b.epochs.append(epoch, end)
        write_file_atomically(os.path.join(b.store_path, "config", HA_ROLE_FILE),
                              json.dumps({"brokerRole": role, "brokerId": 0, "epoch": epoch, "startOffset": end}))
        b.store.recover_topic_queue_table()
        self._adopt_unsynced_topics()
        self._clamp_unreplicated_offsets()
        b.role = role
        b.pop.start()                         # POP checkpoints in flight, from the replicated revive log
        b.tx.start()                          # pending transactions, from the replicated half / op queues
        b.timer.start()                       # timers, from the replicated rmq_sys_wheel_timer queue
        b.store_config.broker_role = role
        b.broker_id = 0
        b.ha_slaves, b.ha_ack_offset, b.ha_state = [], -1, {}
        b.ha_master_address = ""
        b.unregister_broker_all(old_id)       # the NameServer drops <old id, addr> ...
        b.register_broker_all()               # ... and routes id 0 here
        b.announce_append(force=True)          # the ha actor switches to serving slaves
        self.log.warning("promoted to %s (brokerId 0), epoch %d from CommitLog offset %d", role, epoch, end)

    def _adopt_unsynced_topics(self) -> None:
        """A topic the old master created after the last SlaveSynchronize has replicated messages
        (ConsumeQueues here) but no topic config: give it one (its queue count from the
        ConsumeQueues, read + write), or the promoted broker would answer its pulls TOPIC_NOT_EXIST."""
        b = self.b
        tcm = b.store.topic_config_manager
        queues: dict = {}
        for topic, qid in list(b.store.consume_queue_table):
            queues[topic] = max(queues.get(topic, 0), qid + 1)
        for topic, n in sorted(queues.items()):
            if tcm.select_topic_config(topic) is None:
                tcm.update_topic_config(tcm.new_topic_config(topic, n, n, PERM_READ | PERM_WRITE))
                self.log.warning("promotion: topic %s had messages but no synced config: created with %d queues",
                                 topic, n)

    def _clamp_unreplicated_offsets(self) -> None:
        """Committed offsets (copied by SlaveSynchronize) past a queue's end here point at messages
        the old master stored and never replicated: lowered to the end, or the group would skip as
        many of the messages this broker stores there from now on."""
        b = self.b
        com = b.store.consumer_offset_manager
        lowered = com.clamp_to_queue_ends(b.store.get_max_offset_in_queue)
        if lowered:
            com.persist()
            for key, queue_id, old, new in lowered[:20]:
                self.log.warning("promotion: offset of %s queue %d was %d, past this log's end: now %d "
                                 "(messages lost in a failover)", key, queue_id, old, new)
            if len(lowered) > 20:
                self.log.warning("promotion: %d more committed offsets lowered the same way", len(lowered) - 20)

    # -- SlaveSynchronize ---------------------------------------------------------------------------------
    def sync_from_master(self) -> None:
        """SlaveSynchronize (slave, every SLAVE_SYNC_INTERVAL_MS): topics, consumer offsets, delay
        offsets and subscription groups copied from the master."""
        if self.b.role != "SLAVE" or self._master_socket() is None:
            return
        for code in SLAVE_SYNC_CODES:
            try:
                self._master_sock.send_multipart(P.encode(Frame(code, opaque=int(code))), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _master_socket(self) -> Optional[zmq.Socket]:
        """The DEALER to the master broker (slave only; re-made when the master's address changes)."""
        b = self.b
        if not b.master_broker_addr:
            return None
        if self._master_sock is None or self._master_sock_addr != b.master_broker_addr:
            if self._master_sock is not None:
                b.remove_socket(self._master_sock)
            self._master_sock = b.socket(zmq.DEALER, connect=f"tcp://{b.master_broker_addr}")
            self._master_sock_addr = b.master_broker_addr
            b.add_socket(self._master_sock, self._on_master_sync_response)
        return self._master_sock

    def find_master(self) -> None:
        """A slave that does not know its master's addresses yet asks the NameServer every second
        (the register-broker answer carries them)."""
        b = self.b
        if b.role == "SLAVE" and (not b.ha_master_address or not b.master_broker_addr):
            b.register_broker_all()

    def _on_master_sync_response(self, parts: list) -> None:
        b = self.b
        try:
            f = P.decode(parts)
            body = unpack_body(f) if f.bodies else None
        except ProtocolError as e:
            self.log.warning("bad answer from the master: %s", e)
            return
        if f.opaque in self.promotion_probes:
            if f.code == ResponseCode.SUCCESS and isinstance(body, dict) and isinstance(body.get("table"), dict):
                self.promotion_probes[f.opaque] = body["table"]
                self.try_promotions()
            return
        if f.code != ResponseCode.SUCCESS or not isinstance(body, dict) or b.role != "SLAVE":
            return
        store = b.store
        manager = {RequestCode.GET_ALL_TOPIC_CONFIG: store.topic_config_manager,
                   RequestCode.GET_ALL_CONSUMER_OFFSET: store.consumer_offset_manager,
                   RequestCode.GET_ALL_DELAY_OFFSET: store.delay_offset_manager,
                   RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: store.subscription_group_manager}.get(f.opaque)
        if manager is None:
            return
        try:
            manager.decode(body)
            manager.persist_soon()       # off this thread: its fsyncs stalled requests for seconds on a busy disk
        except (KeyError, TypeError, ValueError, OSError) as e:
            self.log.warning("cannot apply the master's %s: %s", type(manager).__name__, e)
