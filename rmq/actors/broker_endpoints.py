"""What the broker's followers (reput, flush, ha) need of the broker without importing it: the
internal endpoints it binds in its store directory, the announcement topics it publishes, and the
store configuration from broker settings.  Importing :mod:`rmq.actors.broker` (every processor,
the POP, timer and transaction services) cost each follower process about 0.3 s at start."""
from __future__ import annotations

import os

from rmq.store.config import MessageStoreConfig

ANNOUNCE_APPEND = b"A"    # PUB topic: appends (at most one per appendAnnounceIntervalMs)
ANNOUNCE_TICK = b"T"      # PUB topic: periodic re-announcement
ANNOUNCE_DURABLE = b"D"   # PUB topic: appends the broker already made durable itself (SYNC_FLUSH group
                          # commit in the broker): for reput and HA, not for the flush actor


def internal_endpoint(store_path: str) -> str:
    """The broker's ROUTER for its own actors: ``ipc://<store>/broker.ipc``."""
    return f"ipc://{os.path.abspath(store_path)}/broker.ipc"


def announce_endpoint(store_path: str) -> str:
    """The broker's PUB of CommitLog-end announcements: ``ipc://<store>/broker-pub.ipc``."""
    return f"ipc://{os.path.abspath(store_path)}/broker-pub.ipc"


def store_config_from_settings(settings: dict) -> MessageStoreConfig:
    """MessageStoreConfig from broker settings (RocketMQ property names; unknown keys kept in ``extra``)."""
    props = dict(settings)
    props["storeHost"] = f"{settings.get('brokerIP1', '127.0.0.1')}:{settings.get('listenPort', 10911)}"
    return MessageStoreConfig.from_properties(props)


__all__ = ["ANNOUNCE_APPEND", "ANNOUNCE_DURABLE", "ANNOUNCE_TICK", "announce_endpoint", "internal_endpoint",
           "store_config_from_settings"]
