"""HA actor: master -> slave replication of the CommitLog (RocketMQ HAService / HAClient).

Responsibility
    One ``ha`` process runs beside every broker of a group; its mode follows the
    broker's role, which it hears in the broker's announcements (``brokerRole``):

    * master (ASYNC_MASTER / SYNC_MASTER): binds a ROUTER on ``haListenPort``
      (0 = listenPort + 1, as RocketMQ; ephemeral when that port is taken and the
      port was not configured) and streams CommitLog bytes to every slave that
      handshakes, from the offset the slave reports, in whole-record chunks of at
      most ``haTransferBatchSize`` bytes that never cross a file, with at most
      HA_WINDOW_BYTES sent beyond the slave's last acknowledgement.  It reports
      each slave's acknowledged offset to the broker (HA_ANNOUNCE), which releases
      SYNC_MASTER sends and answers ``clusterList`` / ``brokerStatus``.
    * slave (SLAVE): a DEALER connected to the master's HA address (the broker's
      ``haMasterAddress``, or the one the NameServer returned at registration),
      handshakes with its epoch history and max offset, forwards every chunk to
      its own broker (HA_APPEND; the broker stays the only writer of the
      CommitLog and appends the bytes verbatim) and reports the applied offset
      back to the master after every append and every ``haSendHeartbeatInterval``.

    The handshake (SPEC.md §9.2, 5.x AutoSwitchHA) carries the epoch history, so
    a slave whose CommitLog diverged from the master's (a former master with an
    unreplicated tail) is told the common prefix; it then asks its broker to
    truncate there (HA_TRUNCATE: the broker writes the ``ha_truncate`` marker and
    restarts its group; recovery cuts the tail) and replicates again.  A slave
    that connects empty starts at the master's min offset.

Sockets
    SUB ``ipc://STORE/broker-pub.ipc`` (APPEND_ANNOUNCE: end, brokerRole,
    haMasterAddress); DEALER ``ipc://STORE/broker.ipc`` (HA_ANNOUNCE one-way,
    HA_APPEND / HA_TRUNCATE requests); master: ROUTER ``tcp://brokerIP1:haListenPort``;
    slave: DEALER to the master's HA address.

Frames (rmq.protocol, codes 9010-9015)
    slave -> master HA_HANDSHAKE {maxOffset, minOffset, epochs [[epoch, startOffset]], brokerAddr, brokerId,
                     brokerName, brokerClusterName, logId}
    master -> slave response {startOffset, truncateTo (-1: none), epoch, epochs, masterMinOffset, masterMaxOffset,
                     brokerName, brokerClusterName, logId}

    Both sides check that the other is of the same broker set and CommitLog lineage (rmq): a
    master refuses (SYSTEM_ERROR) a slave of another broker name, cluster or lineage id, and a
    slave drops the link to such a master before acting on its answer.  The lineage id
    (``<store>/haLogId``, :func:`rmq.store.epoch.read_log_id`; Kafka's ``cluster.id`` is the model)
    is made by a master when it first serves replicas and taken by a slave from its master at its
    first handshake, so a promoted slave and a returning old master share it.  A slave pointed at
    the wrong address (a stale ``haMasterAddress``, or a port another broker took after a crash:
    two test clusters on one host, both ``broker-a``, met this way, and the slave cut its CommitLog
    to the foreign log's prefix) would otherwise truncate to a common prefix with a foreign log or
    append foreign records.  A peer that does not send a field (an older rmq) is not checked on it.
    master -> slave HA_PUSH {offset, epoch, masterMaxOffset, confirmOffset} + body (empty body = heartbeat;
                     one also goes when the confirm offset moved: allAckInSyncStateSet)
    slave -> master HA_REPORT {offset} (one-way)

Timers
    pump / announce after every poll; slave report + master heartbeat every
    haSendHeartbeatInterval (5 000 ms); housekeeping (a silent peer dropped /
    reconnected) haHousekeepingInterval (20 000 ms).

Failure behaviour
    A slave that acknowledges beyond the master's end, or reports an offset the
    master cannot serve, is dropped (it reconnects and handshakes again).  An
    HA_APPEND the broker refuses (offset mismatch, bad bytes) resets the link.
    Nothing here writes store files, so a kill -9 loses nothing: the next
    handshake resumes from the slave's max offset.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

import zmq

from rmq import protocol as P
from rmq._core.commitlog import replica_chunk_end
from rmq.actors.follower import ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK, FollowerActor, run_follower
from rmq.broker_conf import DEFAULT_BROKER_NAME, DEFAULT_CLUSTER_NAME
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode
from rmq.store.config import MessageStoreConfig
from rmq.store.epoch import (EPOCH_FILE, EpochEntry, EpochFile, find_consistent_point, new_log_id, read_log_id,
                             write_log_id)

MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
HA_WINDOW_BYTES = 8 * 1024 * 1024        # bytes streamed beyond a slave's last acknowledgement
HANDSHAKE_TIMEOUT_MS = 5000              # slave: no handshake answer -> reconnect
RECONNECT_INTERVAL_MS = 1000             # slave: pause before reconnecting (RocketMQ: 5 s)
ANNOUNCE_INTERVAL_MS = 1000              # state re-announced to the broker


class SlaveLink:
    """Master side: one connected slave."""

    __slots__ = ("identity", "broker_addr", "broker_id", "ack", "next_offset", "last_seen", "last_sent",
                 "first_ack_ms", "confirm_sent")

    def __init__(self, identity: bytes, broker_addr: str, broker_id: int, start: int):
        self.identity = identity
        self.broker_addr = broker_addr
        self.broker_id = broker_id
        self.ack = start               # bytes the slave holds (its max offset)
        self.next_offset = start       # next byte to stream
        now = time.monotonic()
        self.last_seen = now
        self.last_sent = now
        self.first_ack_ms = int(time.time() * 1000)
        self.confirm_sent = -1         # the master's confirm offset last told this slave


class HAActor(FollowerActor):
    name = "ha"
    topics = (ANNOUNCE_APPEND, ANNOUNCE_DURABLE, ANNOUNCE_TICK)

    def __init__(self, config: MessageStoreConfig, supervisor_endpoint: Optional[str] = None):
        super().__init__(config, supervisor_endpoint)
        extra = config.extra
        self.host = str(extra.get("brokerIP1", "127.0.0.1"))
        self.listen_port = int(extra.get("listenPort", 10911) or 0)
        self.broker_name = str(extra.get("brokerName", DEFAULT_BROKER_NAME))
        self.cluster_name = str(extra.get("brokerClusterName", DEFAULT_CLUSTER_NAME))
        self.log_id = read_log_id(self.store_path)     # the CommitLog lineage ("": none yet)
        self.role = ""                 # learned from the broker's announcements
        self.broker_addr = ""
        self.broker_id = 0
        self.batch = config.ha_transfer_batch_size
        self.heartbeat_s = config.ha_send_heartbeat_interval / 1000.0
        self.housekeeping_s = config.ha_housekeeping_interval / 1000.0
        self.epochs = EpochFile(f"{self.store_path}/{EPOCH_FILE}")
        # master side
        self.server: Optional[zmq.Socket] = None
        self.ha_server_addr = ""
        self.slaves: dict[bytes, SlaveLink] = {}
        self.dirty = False
        self._refreshed_end = -1
        # slave side
        self.master_ha_addr = ""
        self.link: Optional[zmq.Socket] = None
        self.link_state = "IDLE"       # IDLE | HANDSHAKING | STREAMING | TRUNCATING
        self.link_since = 0.0
        self.link_last_recv = 0.0
        self.expected = 0              # next offset the master will push
        self.applied = 0               # slave CommitLog end its broker confirmed
        self.reported = -1
        self.appends_in_flight = 0
        self.generation = 0            # link generation: HA_APPEND answers of an old link are ignored
        self.master_max = 0
        self.confirmed = -1            # master: the broker's confirm offset (allAckInSyncStateSet; -1: none)
        self.master_confirm = -1       # slave: the master's confirm offset, from its pushes
        self.master_epochs: list = []
        self.next_connect = 0.0
        self.stats = {"pushedBytes": 0, "appliedBytes": 0, "handshakes": 0, "resets": 0, "dropped": 0,
                      "refusedHandshakes": 0}

    # -- lifecycle ---------------------------------------------------------------------------
    def on_started(self) -> None:
        self.clog = self.open_commitlog()
        self.add_timer(min(1000.0, self.config.ha_send_heartbeat_interval), self.housekeeping)
        self.add_timer(ANNOUNCE_INTERVAL_MS, lambda: self.announce(force=True))

    def on_start(self) -> None:
        super().on_start()
        self.add_socket(self.out, self._on_broker_response)

    def on_stop(self) -> None:
        self._stop_server()
        self._reset_link("stopping", reconnect=False)
        self.clog.shutdown()

    # -- announcements from the broker ---------------------------------------------------------
    def on_append_announce(self, fields: dict) -> None:
        self.confirmed = int(fields.get("confirmed", -1))
        role = str(fields.get("brokerRole") or "")
        if fields.get("brokerAddr"):
            self.broker_addr = str(fields["brokerAddr"])
            self.broker_id = int(fields.get("brokerId", 0))
        if role and role != self.role:
            self.log.info("broker role %s -> %s", self.role or "-", role)
            self.role = role
            if role in MASTER_ROLES:
                self._reset_link("promoted to master", reconnect=False)
                self._start_server()
            else:
                self._stop_server()
        if self.role == "SLAVE":
            addr = str(fields.get("haMasterAddress") or "")
            if addr != self.master_ha_addr:
                self.master_ha_addr = addr
                self._reset_link(f"master HA address is now {addr or 'unknown'}")
            if self.link_state == "IDLE" or self.applied < self.end:
                self.applied = max(self.applied, self.end)

    def on_min_offset(self, min_offset: int) -> None:
        self.clog.drop_missing_head()

    def after_poll(self) -> None:
        if self.server is not None:
            self.pump()
        elif self.role == "SLAVE":
            if self.link is None and self.master_ha_addr and time.monotonic() >= self.next_connect:
                self._connect()
            if self.link_state == "STREAMING" and self.applied != self.reported:
                self._report()
        self.announce()

    def announce(self, force: bool = False) -> None:
        if not (self.dirty or force) or not self.role:
            return
        self.dirty = False
        if self.server is not None:
            now_ms = int(time.time() * 1000)
            slaves = [{"slaveAddr": s.broker_addr, "brokerId": s.broker_id, "ackOffset": s.ack,
                       "lagBytes": max(0, self.end - s.ack),
                       "lastAckMs": now_ms - int((time.monotonic() - s.last_seen) * 1000)}
                      for s in self.slaves.values()]
            fields = {"role": "MASTER", "haServerAddr": self.ha_server_addr, "slaves": slaves,
                      "ackOffset": max((s.ack for s in self.slaves.values()), default=-1), **self.stats}
        else:
            fields = {"role": "SLAVE", "connected": self.link_state == "STREAMING",
                      "linkState": self.link_state, "masterHaAddr": self.master_ha_addr,
                      "masterMaxOffset": self.master_max, "masterEpochs": self.master_epochs,
                      "masterConfirmOffset": self.master_confirm,
                      "applied": self.applied, **self.stats}
        self.tell_broker(RequestCode.HA_ANNOUNCE, fields)

    # -- master side -----------------------------------------------------------------------------
    def _start_server(self) -> None:
        if self.server is not None:
            return
        if not self.log_id:              # a master's first replicas: this store starts a lineage
            self.log_id = new_log_id()
            write_log_id(self.store_path, self.log_id)
            self.log.info("CommitLog lineage id %s (new)", self.log_id)
        port = self.config.ha_listen_port or (self.listen_port + 1 if self.listen_port else 0)
        try:
            s = self.socket(zmq.ROUTER, bind=f"tcp://{self.host}:{port}")
        except zmq.ZMQError as e:
            if self.config.ha_listen_port:
                raise
            self.log.warning("HA port %d (listenPort + 1) unavailable (%s): using an ephemeral port", port, e)
            s = self.socket(zmq.ROUTER, bind=f"tcp://{self.host}:0")
        s.setsockopt(zmq.SNDHWM, 0)        # the window bounds what is queued
        self.server = s
        self.ha_server_addr = s.getsockopt_string(zmq.LAST_ENDPOINT).split("//", 1)[1]
        self.add_socket(s, self._on_slave_message)
        self.dirty = True
        self.log.info("HA master serving on %s", self.ha_server_addr)

    def _stop_server(self) -> None:
        if self.server is None:
            return
        self.poller.unregister(self.server)
        self._socket_handlers.pop(self.server, None)
        self.server.close(0)
        self.server = None
        self.slaves.clear()
        self.dirty = True

    def _on_slave_message(self, parts: list) -> None:
        identity = parts[0].bytes
        try:
            f = P.decode(parts[1:])
        except ProtocolError as e:
            self.log.warning("bad frame from a slave: %s", e)
            return
        policy = self._sock_policy.get(self.server) if self._sock_policy else None
        if policy is not None:           # rmq.security: with CURVE on only the cluster node key replicates
            denied = self._denied(policy, f.code, parts[0])
            if denied:
                self.log.warning("replication request %s refused: %s", f.code, denied)
                if f.code == RequestCode.HA_HANDSHAKE:
                    self._send_slave(identity, f.response(ResponseCode.NO_PERMISSION, denied))
                return
        if f.code == RequestCode.HA_HANDSHAKE:
            self._on_handshake(identity, f)
        elif f.code == RequestCode.HA_REPORT:
            link = self.slaves.get(identity)
            if link is None:
                return           # not (or no longer) handshaken: it will time out and handshake again
            ack = int(f.fields.get("offset", -1))
            link.last_seen = time.monotonic()
            if ack > self.end or ack < 0:
                self.log.warning("slave %s acknowledged %d beyond the CommitLog end %d: dropped",
                                 link.broker_addr, ack, self.end)
                self._drop(identity)
                return
            if ack != link.ack:
                link.ack = ack
                self.dirty = True
            if link.next_offset < ack:
                link.next_offset = ack

    def _on_handshake(self, identity: bytes, f: Frame) -> None:
        fields = f.fields
        try:
            slave_max = int(fields["maxOffset"])
            slave_epochs = [EpochEntry(int(e), int(s)) for e, s in fields.get("epochs", [])]
            broker_addr = str(fields.get("brokerAddr", "?"))
            broker_id = int(fields.get("brokerId", 1))
        except (KeyError, TypeError, ValueError) as e:
            self._send_slave(identity, f.response(ResponseCode.SYSTEM_ERROR, f"bad handshake: {e}"))
            return
        other = self._other_broker_set(fields)
        if other is not None:
            self.stats["refusedHandshakes"] += 1
            self.log.warning("handshake of slave %s refused: %s", broker_addr, other)
            self._send_slave(identity, f.response(ResponseCode.SYSTEM_ERROR, f"handshake refused: {other}"))
            return
        self.stats["handshakes"] += 1
        for ident in [i for i, s in self.slaves.items() if s.broker_addr == broker_addr]:
            del self.slaves[ident]       # a reconnecting slave replaces its old link
        self.clog.refresh(self.end)
        self.epochs.load()
        master_entries = list(self.epochs.entries)
        master_min = self.clog.get_min_offset() if self.clog.files else 0
        truncate_to = -1
        if slave_max > 0:
            point = find_consistent_point(master_entries, self.end, slave_epochs, slave_max)
            if point < slave_max:
                truncate_to = max(point, 0)
            elif slave_max < master_min:
                truncate_to = 0          # the master no longer holds what follows the slave's end
        start = slave_max if truncate_to < 0 else -1
        if start == 0:
            start = master_min
        resp = f.response(fields={
            "startOffset": start, "truncateTo": truncate_to, "masterMinOffset": master_min,
            "masterMaxOffset": self.end, "epoch": master_entries[-1][0] if master_entries else 0,
            "epochs": [list(e) for e in master_entries], **self._identity()})
        if truncate_to >= 0:
            self.log.warning("slave %s (max offset %d) diverges from this CommitLog: truncate to %d",
                             broker_addr, slave_max, truncate_to)
            self._send_slave(identity, resp)
            return
        self.slaves[identity] = SlaveLink(identity, broker_addr, broker_id, start)
        self.log.info("slave %s (brokerId %d) replicates from offset %d", broker_addr, broker_id, start)
        self.dirty = True
        self._send_slave(identity, resp)

    def _send_slave(self, identity: bytes, frame: Frame) -> bool:
        if frame.flag & P.FLAG_RESPONSE == 0 and frame.code != RequestCode.HA_PUSH:
            frame.flag |= P.FLAG_RESPONSE
        try:
            self.server.send_multipart([identity, *P.encode(frame)], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as e:       # gone (ROUTER_MANDATORY: EHOSTUNREACH) or queue full: counted
            self.stats["dropped"] += 1
            self.log.warning("slave %r unreachable (%s): dropped", identity[:8], e)
            self._drop(identity)
            return False

    def _drop(self, identity: bytes) -> None:
        if self.slaves.pop(identity, None) is not None:
            self.dirty = True

    def pump(self) -> None:
        """Stream what each slave lacks, within its window."""
        if not self.slaves:
            return
        end = self.end
        if end != self._refreshed_end:
            self.clog.refresh(end)
            self._refreshed_end = end
        now = time.monotonic()
        for link in list(self.slaves.values()):
            sent = False
            while link.next_offset < end and link.next_offset - link.ack < HA_WINDOW_BYTES:
                mf = self.clog.find_mapped_file_by_offset(link.next_offset)
                if mf is None:
                    self.log.warning("slave %s needs offset %d the master does not hold: dropped",
                                     link.broker_addr, link.next_offset)
                    self._drop(link.identity)
                    break
                pos = link.next_offset - mf.file_from_offset
                readable = min(end - mf.file_from_offset, mf.file_size)
                stop = replica_chunk_end(mf, pos, readable, self.batch)
                if stop <= pos:
                    break
                data = mf.read(pos, stop - pos)
                frame = Frame(RequestCode.HA_PUSH, flag=P.FLAG_ONEWAY,
                              fields={"offset": link.next_offset, "masterMaxOffset": end,
                                      "confirmOffset": self.confirmed}, bodies=[data])
                if not self._send_slave(link.identity, frame):
                    break
                link.next_offset = mf.file_from_offset + stop
                link.confirm_sent = self.confirmed
                self.stats["pushedBytes"] += len(data)
                sent = True
            if sent:
                link.last_sent = now
            elif link.identity in self.slaves and (now - link.last_sent >= self.heartbeat_s or
                                                   link.confirm_sent != self.confirmed):
                # a heartbeat, or the confirm offset moved (allAckInSyncStateSet: the slave's reput
                # dispatches up to it)
                link.last_sent = now
                link.confirm_sent = self.confirmed
                self._send_slave(link.identity, Frame(RequestCode.HA_PUSH, flag=P.FLAG_ONEWAY, fields={
                    "offset": link.next_offset, "masterMaxOffset": end, "confirmOffset": self.confirmed}))

    # -- slave side ------------------------------------------------------------------------------
    def _identity(self) -> dict:
        """This broker set's names and CommitLog lineage, which the handshake carries both ways."""
        return {"brokerName": self.broker_name, "brokerClusterName": self.cluster_name, "logId": self.log_id}

    def _other_broker_set(self, fields: dict) -> Optional[str]:
        """Why the peer of a handshake is of another broker set (its brokerName / brokerClusterName
        differ from this one's) or CommitLog lineage (both have a ``logId``, and they differ), or
        None (the same, or not sent: an older peer, a store without a lineage yet)."""
        name, cluster = fields.get("brokerName"), fields.get("brokerClusterName")
        if (name is not None and str(name) != self.broker_name) or \
                (cluster is not None and str(cluster) != self.cluster_name):
            return f"the peer is {cluster}/{name}, this broker set is {self.cluster_name}/{self.broker_name}"
        theirs = str(fields.get("logId") or "")
        if theirs and self.log_id and theirs != self.log_id:
            return f"the peer's CommitLog lineage is {theirs}, this store's is {self.log_id}"
        return None

    def _connect(self) -> None:
        addr = self.master_ha_addr
        self.link = self.socket(zmq.DEALER, connect=f"tcp://{addr}")
        self.add_socket(self.link, self._on_master_message)
        self.link_state = "HANDSHAKING"
        now = time.monotonic()
        self.link_since = self.link_last_recv = now
        self.epochs.load()
        self.applied = max(self.applied, self.end)
        self.clog.refresh(self.end)
        fields = {"maxOffset": self.applied, "minOffset": self.clog.get_min_offset() if self.clog.files else 0,
                  "epochs": [list(e) for e in self.epochs.entries], "brokerAddr": self.broker_addr,
                  "brokerId": self.broker_id, **self._identity()}
        self.link.send_multipart(P.encode(Frame(RequestCode.HA_HANDSHAKE, fields=fields)), flags=zmq.NOBLOCK)
        self.log.info("connecting to master %s with max offset %d", addr, self.applied)

    def _reset_link(self, why: str, reconnect: bool = True) -> None:
        if self.link is not None:
            self.poller.unregister(self.link)
            self._socket_handlers.pop(self.link, None)
            self.link.close(0)
            self.link = None
            self.stats["resets"] += 1
            self.log.info("replication link reset: %s", why)
        if self.link_state != "TRUNCATING":
            self.link_state = "IDLE"
        self.appends_in_flight = 0
        self.generation += 1
        self.reported = -1
        self.next_connect = time.monotonic() + (RECONNECT_INTERVAL_MS / 1000.0 if reconnect else 0)
        self.dirty = True

    def _on_master_message(self, parts: list) -> None:
        try:
            f = P.decode(parts)
        except ProtocolError as e:
            self._reset_link(f"bad frame from the master: {e}")
            return
        self.link_last_recv = time.monotonic()
        if f.flag & P.FLAG_RESPONSE:
            self._on_handshake_response(f)
        elif f.code == RequestCode.HA_PUSH and self.link_state == "STREAMING":
            offset = int(f.fields.get("offset", -1))
            self.master_max = max(self.master_max, int(f.fields.get("masterMaxOffset", 0)))
            confirm = int(f.fields.get("confirmOffset", -1))
            if confirm > self.master_confirm:
                self.master_confirm = confirm
                self.dirty = True
            if not f.bodies or not len(f.bodies[0]):
                return               # heartbeat
            if offset != self.expected:
                self._reset_link(f"push at {offset}, expected {self.expected}")
                return
            data = f.bodies[0]
            self.expected = offset + len(data)
            self.appends_in_flight += 1
            try:
                self.out.send_multipart(P.encode(Frame(RequestCode.HA_APPEND, opaque=self.generation,
                                                       fields={"offset": offset}, bodies=[data])),
                                        flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._reset_link("broker queue full")

    def _on_handshake_response(self, f: Frame) -> None:
        if f.code != ResponseCode.SUCCESS:
            self.log.warning("master refused the handshake: %s", f.remark)
            self._reset_link("handshake refused")
            return
        fields = f.fields
        other = self._other_broker_set(fields)
        if other is not None:                # before anything of its answer is acted on (truncateTo)
            self.stats["refusedHandshakes"] += 1
            self.log.error("the HA server at %s is not this broker set's master: %s", self.master_ha_addr, other)
            self._reset_link("master of another broker set")
            return
        theirs = str(fields.get("logId") or "")
        if theirs and not self.log_id:       # first handshake: this store joins the master's lineage
            try:
                write_log_id(self.store_path, theirs)
            except (ValueError, OSError) as e:
                self.log.error("cannot take the master's CommitLog lineage id: %s", e)
                self._reset_link("lineage id not stored")
                return
            self.log_id = theirs
            self.log.info("CommitLog lineage id %s (the master's)", theirs)
        self.master_epochs = [list(e) for e in fields.get("epochs", [])]
        self.master_max = int(fields.get("masterMaxOffset", 0))
        truncate_to = int(fields.get("truncateTo", -1))
        if truncate_to >= 0:
            self.log.warning("CommitLog diverged from the master's: truncating to %d (the broker restarts)",
                             truncate_to)
            self.link_state = "TRUNCATING"
            self.dirty = True
            self.announce()
            self.out.send_multipart(P.encode(Frame(RequestCode.HA_TRUNCATE, fields={"offset": truncate_to})),
                                    flags=zmq.NOBLOCK)
            return
        self.expected = int(fields["startOffset"])
        self.link_state = "STREAMING"
        self.dirty = True
        # tell the broker the master's epochs now, ahead of the first HA_APPEND on the same socket:
        # a slave that holds bytes of an epoch must have that epoch on disk, or after a crash its
        # next handshake could not prove a common prefix and would have to start from empty
        self.announce()
        self.log.info("replicating from %s at offset %d (master end %d)", self.master_ha_addr, self.expected,
                      self.master_max)

    def _on_broker_response(self, parts: list) -> None:
        f = self.decode_or_log(parts, "broker response")
        if f is None:
            return
        if f.opaque != self.generation:
            return                   # an answer to an append of a link since reset
        if self.appends_in_flight > 0:
            self.appends_in_flight -= 1
        if f.code != ResponseCode.SUCCESS:
            self.log.warning("broker refused replicated bytes: %s", f.remark)
            self._reset_link("append refused")
            return
        applied = int(f.fields.get("maxOffset", self.applied))
        if applied > self.applied:
            self.stats["appliedBytes"] += applied - self.applied
            self.applied = applied

    def _report(self) -> None:
        if self.link is None:
            return
        try:
            self.link.send_multipart(P.encode(Frame(RequestCode.HA_REPORT, flag=P.FLAG_ONEWAY,
                                                    fields={"offset": self.applied})), flags=zmq.NOBLOCK)
            self.reported = self.applied
        except zmq.Again:
            pass

    # -- timers -----------------------------------------------------------------------------------
    def housekeeping(self) -> None:
        now = time.monotonic()
        if self.server is not None:
            for link in list(self.slaves.values()):
                if now - link.last_seen > self.housekeeping_s:
                    self.log.warning("slave %s silent for %.0f s: dropped", link.broker_addr, now - link.last_seen)
                    self._drop(link.identity)
        elif self.link is not None:
            if self.link_state == "HANDSHAKING" and now - self.link_since > HANDSHAKE_TIMEOUT_MS / 1000.0:
                self._reset_link("no handshake answer")
            elif now - self.link_last_recv > self.housekeeping_s:
                self._reset_link(f"master silent for {now - self.link_last_recv:.0f} s")
            elif self.link_state == "STREAMING":
                self._report()


def main(argv: Optional[list] = None) -> int:
    return run_follower(HAActor, argv)


if __name__ == "__main__":
    sys.exit(main())
