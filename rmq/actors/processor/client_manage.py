"""ClientManageProcessor: HEART_BEAT (34) and UNREGISTER_CLIENT (35), with the producer and consumer
tables they keep (RocketMQ's ProducerManager / ConsumerManager) and the channels the broker reaches
producers on (CHECK_TRANSACTION_STATE).

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
from rmq.protocol import Frame, ResponseCode, field_str, unpack_body
from rmq.store.validators import check_group

CHANNEL_EXPIRED_MS = 120_000                 # idle producer/consumer dropped (SPEC.md §15.2)
CHANNEL_SCAN_MS = 10_000                     # how often expired clients are looked for


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

    def on_client_heartbeat(self, frame: Frame, reply: Reply) -> Frame:
        """Body ``{clientID, consumerDataSet: [{groupName, messageModel, ...}], producerDataSet:
        [{groupName}]}``; a consumer group gets its config and (CLUSTERING) its %RETRY% topic."""
        b = self.b
        body = unpack_body(frame)
        if not isinstance(body, dict) or not isinstance(body.get("clientID"), str):
            return frame.response(ResponseCode.SYSTEM_ERROR, "heartbeat body must be a map with a clientID")
        client = body["clientID"]
        now = time.monotonic()
        for c in body.get("consumerDataSet", []) or []:
            group = check_group(c.get("groupName"))
            b.group_config(group)
            if c.get("messageModel", "CLUSTERING") == "CLUSTERING":
                b.topic_config(f"%RETRY%{group}", create=True)
            self.consumer_table.setdefault(group, {})[client] = {"seen": now, "data": c}
        for pdata in body.get("producerDataSet", []) or []:
            pgroup = check_group(pdata.get("groupName"))
            self.producer_table.setdefault(pgroup, {})[client] = now
            if reply.envelope:
                self.producer_channels.setdefault(pgroup, {})[client] = (reply.socket, list(reply.envelope))
        return frame.response()

    def on_unregister_client(self, frame: Frame, reply: Reply) -> Frame:
        client = field_str(frame, "clientID")
        group = frame.fields.get("consumerGroup")
        if isinstance(group, str):
            self.consumer_table.get(group, {}).pop(client, None)
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
        for group in list(self.producer_table):
            for client, seen in list(self.producer_table[group].items()):
                if seen < cutoff:
                    del self.producer_table[group][client]

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
