"""What the broker's followers (reput, flush, ha) need of the broker without importing it: the
internal endpoints it binds in its store directory, the announcement topics it publishes, and the
store configuration from broker settings.  Importing :mod:`rmq.actors.broker` (every processor,
the POP, timer and transaction services) cost each follower process about 0.3 s at start."""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from typing import Optional

from rmq.store.config import MessageStoreConfig

ANNOUNCE_APPEND = b"A"    # PUB topic: appends (at most one per appendAnnounceIntervalMs)
ANNOUNCE_TICK = b"T"      # PUB topic: periodic re-announcement
ANNOUNCE_DURABLE = b"D"   # PUB topic: appends the broker already made durable itself (SYNC_FLUSH group
                          # commit in the broker): for reput and HA, not for the flush actor


MAX_IPC_PATH = 100        # bytes; a Unix socket path must fit sockaddr_un.sun_path (108 on Linux)


def _private_dir(root: str) -> Optional[str]:
    """``<tmp>/rmq-<uid>-<16 hex of sha256(root)>`` when ``root``'s own socket paths are too long, else None."""
    if len(os.path.join(root, "broker-pub.ipc").encode()) <= MAX_IPC_PATH:
        return None
    return os.path.join(tempfile.gettempdir(), f"rmq-{os.getuid()}-{hashlib.sha256(root.encode()).hexdigest()[:16]}")


def ipc_dir(store_path: str) -> str:
    """Where the store's ipc sockets live: the store directory itself, or, when a socket path there
    would not fit MAX_IPC_PATH (a deep store directory), a private directory named after the
    store's absolute path: ``<tmp>/rmq-<uid>-<16 hex of its sha256>``, created 0700.  Every actor
    of the store computes the same one.

    Raises
    ------
    OSError
        That private directory exists but is not a directory of this user (refused: another user
        could listen on it), or cannot be created.
    """
    root = os.path.abspath(store_path)
    d = _private_dir(root)
    if d is None:
        return root
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"{d} (ipc sockets of the store {root}, whose own path is too long for them) is not a "
                      f"directory owned by uid {os.getuid()}: refusing to use it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)
    return d


def release_ipc_dir(store_path: str) -> None:
    """Remove the private directory :func:`ipc_dir` made for ``store_path``, with the broker's two
    socket files in it (libzmq leaves a bound ipc socket's file behind when it closes, and a
    killed broker leaves them too).  For the broker after its sockets are closed, or for whoever
    knows the broker is dead (a test harness after SIGKILL).  Nothing happens for a store that
    keeps its sockets in itself, for a directory that holds anything else, or for one that is not
    there; it never raises."""
    d = _private_dir(os.path.abspath(store_path))
    if d is None:
        return
    for name in ("broker.ipc", "broker-pub.ipc"):
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass
    try:
        os.rmdir(d)
    except OSError:
        pass


def internal_endpoint(store_path: str) -> str:
    """The broker's ROUTER for its own actors: ``ipc://<store>/broker.ipc`` (see :func:`ipc_dir`)."""
    return f"ipc://{ipc_dir(store_path)}/broker.ipc"


def announce_endpoint(store_path: str) -> str:
    """The broker's PUB of CommitLog-end announcements: ``ipc://<store>/broker-pub.ipc`` (see
    :func:`ipc_dir`)."""
    return f"ipc://{ipc_dir(store_path)}/broker-pub.ipc"


def store_config_from_settings(settings: dict) -> MessageStoreConfig:
    """MessageStoreConfig from broker settings (RocketMQ property names; unknown keys kept in ``extra``)."""
    props = dict(settings)
    props["storeHost"] = f"{settings.get('brokerIP1', '127.0.0.1')}:{settings.get('listenPort', 10911)}"
    return MessageStoreConfig.from_properties(props)


__all__ = ["ANNOUNCE_APPEND", "ANNOUNCE_DURABLE", "ANNOUNCE_TICK", "MAX_IPC_PATH", "announce_endpoint",
           "internal_endpoint", "ipc_dir", "release_ipc_dir",
           "store_config_from_settings"]
