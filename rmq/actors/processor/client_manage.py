"""ClientManageProcessor: HEART_BEAT (34) and UNREGISTER_CLIENT (35), with the producer and consumer
tables they keep (RocketMQ's ProducerManager / ConsumerManager) and the channels the broker reaches
producers on (CHECK_TRANSACTION_STATE) and consumers on (NOTIFY_CONSUMER_IDS_CHANGED, 40: a group's
members changed, every member rebalances at once instead of at its next 20 s round).

Source: RocketMQ ``broker/.../processor/ClientManageProcessor.java``,
``broker/.../client/{ProducerManager,ConsumerManager,ClientHousekeepingService}.java``;
SPEC.md §15.2 (channel expiry).
"""
from __future__ import annotations

import random
import time

import zmq

from rmq.actors.actor import Reply
from rmq.actors.processor import VERSION, RequestProcessor
from rmq import protocol as P
from rmq.common.mix_all import retry_topic
from rmq.common.topic_validator import check_group
from rmq.protocol import Frame, RequestCode, ResponseCode, field_str, unpack_body

CHANNEL_EXPIRED_MS = 120_000                 # idle producer/consumer dropped (SPEC.md §15.2)
CHANNEL_SCAN_MS = 10_000                     # how often expired clients are looked for
CONSUMER_CHANNEL_REFRESH_S = 1.0             # a consumer channel's last-seen time is updated at most this often


class ClientManageProcessor(RequestProcessor):
    """Client heartbeats.  ZeroMQ has no per-connection close event, so a client silent for longer
    than ``channelExpiredTimeout`` (ms) is dropped by :meth:`scan_channels`."""

    def __init__(self, broker):
        super().__init__(broker)
        self.consumer_table: dict[str, dict[str, dict]] = {}   # group -> clientId -> {seen, data}
        self.producer_table: dict[str, dict[str, float]] = {}  # group -> clientId -> monotonic s seen
        # producer group -> clientId -> (socket, routing envelope) of its last heartbeat: where
        # CHECK_TRANSACTION_STATE goes (RocketMQ's ProducerManager channels)
        self.producer_channels: dict[str, dict[str, tuple]] = {}
        # consumer group -> routing identity -> (socket, envelope, monotonic s last seen) of the
        # connections its members pull on: where NOTIFY_CONSUMER_IDS_CHANGED goes (a push consumer's
        # pull connection is the one it listens on all the time)
        self.consumer_channels: dict[str, dict[bytes, list]] = {}
        self.notify_consumer_ids_changed_enable = \
            str(broker.settings.get("notifyConsumerIdsChangedEnable", "true")).strip().lower() == "true"
        self._notify_opaque = 0
        self.notifications_sent = 0

    def on_client_heartbeat(self, frame: Frame, reply: Reply) -> Frame:
        """Body ``{clientID, consumerDataSet: [{groupName, messageModel, ...}], producerDataSet:
        [{groupName}]}``; a consumer group gets its config and (CLUSTERING) its %RETRY% topic."""
        b = self.b
        body = unpack_body(frame)
        if not isinstance(body, dict) or not isinstance(body.get("clientID"), str):
            return frame.response(ResponseCode.SYSTEM_ERROR, "heartbeat body must be a map with a clientID")
        client = body["clientID"]
        now = time.monotonic()
        changed = []
        for c in body.get("consumerDataSet", []) or []:
            group = check_group(c.get("groupName"))
            b.group_config(group)
            if c.get("messageModel", "CLUSTERING") == "CLUSTERING":
                b.topic_config(retry_topic(group), create=True)
            members = self.consumer_table.setdefault(group, {})
            if client not in members:
                changed.append(group)
            members[client] = {"seen": now, "data": c}
        for group in changed:                      # a new member: the others rebalance now (ConsumerManager)
            self.notify_consumer_ids_changed(group)
        for pdata in body.get("producerDataSet", []) or []:
            pgroup = check_group(pdata.get("groupName"))
            self.producer_table.setdefault(pgroup, {})[client] = now
            if reply.envelope:
                self.producer_channels.setdefault(pgroup, {})[client] = (reply.socket, list(reply.envelope))
        return frame.response()

    def on_unregister_client(self, frame: Frame, reply: Reply) -> Frame:
        client = field_str(frame, "clientID")
        group = frame.fields.get("consumerGroup")
        if isinstance(group, str) and self.consumer_table.get(group, {}).pop(client, None) is not None:
            self.notify_consumer_ids_changed(group)   # a member left: the others take its queues now
        pgroup = frame.fields.get("producerGroup")
        if isinstance(pgroup, str):
            self.producer_table.get(pgroup, {}).pop(client, None)
            self.producer_channels.get(pgroup, {}).pop(client, None)
        return frame.response()

    def scan_channels(self) -> None:
        """Drop the clients silent for longer than ``channelExpiredTimeout`` (ClientHousekeepingService)."""
        cutoff = time.monotonic() - self.b.channel_expired_ms / 1000.0
        for group in list(self.consumer_table):
            members = self.consumer_table[group]
            for client, info in list(members.items()):
                if info["seen"] < cutoff:
                    del members[client]
                    self.log.info("consumer %s of %s expired", client, group)
                    self.notify_consumer_ids_changed(group)
        for group in list(self.consumer_channels):
            chans = self.consumer_channels[group]
            for key in [k for k, ch in chans.items() if ch[2] < cutoff]:
                del chans[key]
            if not chans:
                del self.consumer_channels[group]
        for group in list(self.producer_table):
            for client, seen in list(self.producer_table[group].items()):
                if seen < cutoff:
                    del self.producer_table[group][client]

    def note_consumer_channel(self, group: str, reply: Reply) -> None:
        """A member of ``group`` pulled over ``reply``'s connection: remember it (refreshed at most
        every CONSUMER_CHANNEL_REFRESH_S) for :meth:`notify_consumer_ids_changed`."""
        if not reply.envelope:
            return
        key = reply.envelope[0]
        key = key.bytes if hasattr(key, "bytes") else bytes(key)
        chans = self.consumer_channels.get(group)
        if chans is None:
            chans = self.consumer_channels[group] = {}
        ch = chans.get(key)
        now = time.monotonic()
        if ch is None:
            chans[key] = [reply.socket, list(reply.envelope), now]
        elif now - ch[2] >= CONSUMER_CHANNEL_REFRESH_S:
            ch[2] = now

    def notify_consumer_ids_changed(self, group: str) -> int:
        """NOTIFY_CONSUMER_IDS_CHANGED (40) one-way to every connection members of ``group`` pulled on
        (RocketMQ's Broker2Client.notifyConsumerIdsChanged, ``notifyConsumerIdsChangedEnable``,
        default true); gone connections (ROUTER_MANDATORY: EHOSTUNREACH) are dropped, a full queue
        skipped.  Returns the number of connections notified."""
        if not self.notify_consumer_ids_changed_enable:
            return 0
        chans = self.consumer_channels.get(group)
        if not chans:
            return 0
        self._notify_opaque += 1
        parts = P.encode(Frame(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._notify_opaque, P.FLAG_ONEWAY, "",
                               {"consumerGroup": group}))
        sent = 0
        for key, (sock, envelope, _) in list(chans.items()):
            try:
                sock.send_multipart(envelope + parts, flags=zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:
                continue                          # its queue is full: it rebalances at its next round
            except zmq.ZMQError:
                del chans[key]                    # the consumer is gone
        self.notifications_sent += sent
        return sent

    def producer_rows(self, group: str) -> list:
        """``[{clientId, language, version, lastUpdateTimestamp (ms)}]`` of a producer group."""
        now_wall, now = time.time(), time.monotonic()
        return [{"clientId": c, "language": "PYTHON", "version": VERSION,
                 "lastUpdateTimestamp": int((now_wall - (now - seen)) * 1000)}
                for c, seen in sorted(self.producer_table.get(group, {}).items())]

    def has_live_producer(self, group: str) -> bool:
        """Whether a producer of ``group`` has sent a heartbeat within ``channelExpiredTimeout``."""
        cutoff = time.monotonic() - self.b.channel_expired_ms / 1000.0
        seen = self.producer_table.get(group, {})
        return any(seen.get(client, 0.0) >= cutoff for client in self.producer_channels.get(group, ()))

    def send_to_producer(self, group: str, parts: list) -> bool:
        """Send a request (encoded ``parts``) one-way to a live producer of ``group``, over the
        connection of its last heartbeat; producers are tried in random order, the gone ones
        (ROUTER_MANDATORY: EHOSTUNREACH) and the expired ones dropped.  False: nobody to send to."""
        channels = self.producer_channels.get(group)
        if not channels:
            return False
        cutoff = time.monotonic() - self.b.channel_expired_ms / 1000.0
        seen = self.producer_table.get(group, {})
        clients = list(channels)
        random.shuffle(clients)
        for client in clients:
            sock, envelope = channels[client]
            if seen.get(client, 0.0) < cutoff:
                del channels[client]
                continue
            try:
                sock.send_multipart(envelope + parts, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                continue                          # its queue is full: another producer, or the next round
            except zmq.ZMQError:
                del channels[client]              # the producer is gone
        return False
