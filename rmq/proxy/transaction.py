"""Transactional messages through the remoting proxy: where an END_TRANSACTION goes, and the
message a CHECK_TRANSACTION_STATE carries to a RocketMQ client.

A 4.x client sends END_TRANSACTION (37) one-way to the broker address its half message went to
(the proxy) with no broker name (RocketMQ ``DefaultMQProducerImpl.endTransaction``); the proxy
sends it to the broker group that holds the half message.  It learns that group from the half
message's send (:meth:`TransactionRoutes.remember` keyed by the transaction id, the message's
``UNIQ_KEY``) and from each check-back it relays; both are bounded (MAX_TRACKED_TRANSACTIONS,
oldest forgotten first).  A transaction the proxy has forgotten (or never saw: a proxy restart)
with several broker groups is left to the broker's check-back, which names the group again.

A broker's CHECK_TRANSACTION_STATE carries the half message's CommitLog record, whose topic is
RMQ_SYS_TRANS_HALF_TOPIC; RocketMQ's broker restores the real topic and queue id before it
encodes the message for the client (``AbstractTransactionalMessageCheckListener.sendCheckMessage``,
``MessageDecoder.encode``): :func:`check_message_body` does the same to the record.
"""
from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Optional

from rmq._core import commitlog as _cl

MAX_TRACKED_TRANSACTIONS = 65_536        # transaction id -> broker address entries kept
from rmq.common.message_const import PROPERTY_REAL_TOPIC  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_REAL_QUEUE_ID as PROPERTY_REAL_QID  # noqa: E402,F401
from rmq.common.message_const import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX as PROPERTY_UNIQ_KEY  # noqa: E402,F401
MAGIC_V1 = 0xDAA320A7                    # MessageDecoder.MESSAGE_MAGIC_CODE (1-byte topic length)
MAGIC_V2 = 0xDAA320AB                    # MESSAGE_MAGIC_CODE_V2 (2-byte topic length)
BORNHOST_V6_FLAG = 1 << 4                # MessageSysFlag
STOREHOST_V6_FLAG = 1 << 5
_FIXED = struct.Struct(">iIiiiqqiq")     # size, magic, bodyCRC, queueId, flag, queueOffset, physOffset,
                                         # sysFlag, bornTimestamp


class TransactionRoutes:
    """Transaction id -> the rmq broker address of its half message, the newest
    MAX_TRACKED_TRANSACTIONS kept."""

    def __init__(self, capacity: int = MAX_TRACKED_TRANSACTIONS):
        self.capacity = capacity
        self._routes: OrderedDict = OrderedDict()

    def remember(self, transaction_id: Optional[str], addr: str) -> None:
        if not transaction_id:
            return
        self._routes[transaction_id] = addr
        self._routes.move_to_end(transaction_id)
        while len(self._routes) > self.capacity:
            self._routes.popitem(last=False)

    def lookup(self, *keys: Optional[str]) -> Optional[str]:
        for k in keys:
            if k and k in self._routes:
                return self._routes[k]
        return None

    def forget(self, *keys: Optional[str]) -> None:
        for k in keys:
            if k:
                self._routes.pop(k, None)

    def __len__(self) -> int:
        return len(self._routes)


def uniq_key(properties: str) -> Optional[str]:
    """The ``UNIQ_KEY`` in a properties string (``name\\x01value\\x02`` pairs), or None."""
    for pair in properties.split("\x02"):
        name, sep, value = pair.partition("\x01")
        if sep and name == PROPERTY_UNIQ_KEY:
            return value
    return None


def check_message_body(record: bytes) -> bytes:
    """The half message's CommitLog record re-encoded as RocketMQ's broker sends it in a
    CHECK_TRANSACTION_STATE: topic and queue id are the REAL_TOPIC / REAL_QID properties'
    (the rest as stored), in the v1 layout (1-byte topic length, ``MessageDecoder.encode``).

    Layout: SPEC.md §CommitLog record.

    Raises
    ------
    ValueError
        The record is truncated, has an unknown magic code, or names no real topic.
    """
    mv = memoryview(record)
    try:
        (_size, magic, body_crc, queue_id, flag, queue_offset, phys, sys_flag,
         born_ts) = _FIXED.unpack_from(mv, 0)
        pos = _FIXED.size
        born_host_len = 20 if sys_flag & BORNHOST_V6_FLAG else 8
        store_host_len = 20 if sys_flag & STOREHOST_V6_FLAG else 8
        hosts_start = pos
        pos += born_host_len + 8 + store_host_len + 4 + 8     # bornHost, storeTs, storeHost, reconsume, prepared
        middle = bytes(mv[hosts_start:pos])
        body_len = struct.unpack_from(">i", mv, pos)[0]
        pos += 4
        if body_len < 0 or pos + body_len > len(mv):
            raise ValueError("body past the record")
        body = bytes(mv[pos:pos + body_len])
        pos += body_len
        if magic == MAGIC_V1:
            topic_len = mv[pos]
            pos += 1
        elif magic == MAGIC_V2:
            topic_len = struct.unpack_from(">h", mv, pos)[0]
            pos += 2
        else:
            raise ValueError(f"unknown magic code {magic:#x}")
        pos += topic_len
        props_len = struct.unpack_from(">h", mv, pos)[0]
        pos += 2
        if props_len < 0 or pos + props_len > len(mv):
            raise ValueError("properties past the record")
        props_raw = bytes(mv[pos:pos + props_len])
    except struct.error as e:
        raise ValueError(f"truncated record: {e}") from None
    props = _cl.decode_properties(props_raw) if props_raw else {}
    topic = props.get(PROPERTY_REAL_TOPIC)
    if not topic:
        raise ValueError("the half message has no REAL_TOPIC property")
    real_qid = props.get(PROPERTY_REAL_QID, "")
    if str(real_qid).isdigit():
        queue_id = int(real_qid)
    topic_b = topic.encode("utf-8")
    if len(topic_b) > 255:
        raise ValueError(f"topic of {len(topic_b)} bytes does not fit the v1 layout")
    size = _FIXED.size + len(middle) + 4 + len(body) + 1 + len(topic_b) + 2 + len(props_raw)
    return b"".join((_FIXED.pack(size, MAGIC_V1, body_crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts),
                     middle, struct.pack(">i", len(body)), body, bytes((len(topic_b),)), topic_b,
                     struct.pack(">h", len(props_raw)), props_raw))


__all__ = ["TransactionRoutes", "check_message_body", "uniq_key", "MAX_TRACKED_TRANSACTIONS"]
