"""Multipart send and receive on pyzmq sockets without pyzmq's per-part Python layers.

``Socket.send_multipart`` / ``recv_multipart`` go through pyzmq's Python "sugar" for every part
(keyword handling, ``IntFlag`` arithmetic, a ``getsockopt(RCVMORE)`` per part, a ``zmq.Frame``
for every ``copy=False`` part however small).  On this 2-core VM a 3-part reply costs 4.2 us that
way and 0.7 us through the Cython backend's ``send`` with int flags; a 3-part receive 5.1 us
against 3.1 us (``bench``: the numbers are from a loop of 100,000 over loopback TCP).  Every
request the broker answers pays both, so they are on the hot path of a single send (issue 12)
and of flow control's SYSTEM_BUSY answers, which must be cheaper than the sends they shed.

Parts at or above ZERO_COPY_MIN_BYTES go zero-copy (a ``zmq.Frame`` that references the
buffer); smaller ones are copied, which is cheaper than setting up a zero-copy frame (pyzmq's
own ``copy_threshold`` default is the same 64 KiB).

When ``rmq._core.zmqc`` finds libzmq's functions (it does with pyzmq's wheels), both go
straight through libzmq's C API instead: a 3-part send 0.55 us against 1.4 us through the
backend's ``send``, a 4-part receive 1.2 us against 2.8 us (``bench/bench_zmqio.py``); a
non-blocking call keeps the GIL; received parts are ``bytes`` but for the first one and large
ones (``rmq._core.zmqc.Part``: read in place, with ``get()`` for the connection's metadata as
``zmq.Frame``).  ``RMQ_ZMQ_DIRECT=0`` keeps pyzmq's path (:data:`DIRECT` says which is in use).

Concurrency: as the socket (one thread per socket).
"""
from __future__ import annotations

import os
from typing import Sequence

import zmq
from zmq.backend import Socket as _BackendSocket
from zmq.utils.monitor import parse_monitor_message

try:
    from rmq._core import zmqc as _zmqc
except ImportError:        # an install without the built core: pyzmq's path
    _zmqc = None

ZERO_COPY_MIN_BYTES = 64 * 1024      # parts this large are sent zero-copy (pyzmq's copy_threshold)
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)

_send = _BackendSocket.send
_recv = _BackendSocket.recv


def send_parts_pyzmq(sock: zmq.Socket, parts: Sequence, flags: int = NOBLOCK) -> None:
    """Send ``parts`` (bytes, memoryviews or zmq.Frames) as one multipart message.

    Raises
    ------
    zmq.Again
        ``flags`` has NOBLOCK and the peer's queue is full; nothing of the message was sent
        when this comes from the first part (ZeroMQ queues a multipart message atomically).
    zmq.ZMQError
        The socket refused (e.g. EHOSTUNREACH on a ROUTER_MANDATORY socket for a gone peer).
    """
    last = len(parts) - 1
    more = flags | SNDMORE
    for i, p in enumerate(parts):
        _send(sock, p, more if i < last else flags, len(p) < ZERO_COPY_MIN_BYTES)


def recv_parts_pyzmq(sock: zmq.Socket, flags: int = NOBLOCK) -> list:
    """Receive one multipart message as a list of zmq.Frames (zero-copy: ``.bytes`` /
    ``.buffer`` read them).

    Raises
    ------
    zmq.Again
        ``flags`` has NOBLOCK and no message is waiting.
    """
    f = _recv(sock, flags, False)
    parts = [f]
    while f.more:
        f = _recv(sock, flags, False)
        parts.append(f)
    return parts


def recv_waiting_pyzmq(sock: zmq.Socket, limit: int) -> list:
    """Up to ``limit`` queued messages (each as :func:`recv_parts` gives it), without waiting;
    ``[]`` when none is queued.

    Raises
    ------
    zmq.ZMQError
        The socket refused (closed, ...).
    """
    out = []
    try:
        while len(out) < limit:
            out.append(recv_parts_pyzmq(sock))
    except zmq.Again:
        pass
    return out


def closed_pyzmq(sock: zmq.Socket) -> bool:
    """Whether ``sock`` is closed (``zmq.Socket.closed``)."""
    return sock.closed


def events_pyzmq(sock: zmq.Socket) -> int:
    """``sock``'s ZMQ_EVENTS bits (POLLIN | POLLOUT).

    Raises
    ------
    zmq.ZMQError
        The socket is closed or refused.
    """
    return sock.getsockopt(_EVENTS)


_EVENTS = int(zmq.EVENTS)

DIRECT = _zmqc is not None and _zmqc.available() and os.environ.get("RMQ_ZMQ_DIRECT", "1") != "0"
if DIRECT:
    send_parts = _zmqc.send_parts
    recv_parts = _zmqc.recv_parts
    recv_waiting = _zmqc.recv_waiting
    closed = _zmqc.closed
    events = _zmqc.events
else:
    send_parts = send_parts_pyzmq
    recv_parts = recv_parts_pyzmq
    recv_waiting = recv_waiting_pyzmq
    closed = closed_pyzmq
    events = events_pyzmq


MONITOR_DRAIN = 64                   # monitor event messages read per recv_waiting call


def monitor_events(monitor: zmq.Socket) -> list:
    """Every event waiting on a socket monitor's PAIR socket (``Socket.get_monitor_socket``), oldest
    first, as ``zmq.Event`` values; none waiting is an empty list, not a ``zmq.Again`` (a client
    looks at its connections' monitors before each request: the exception cost more than the
    rest of the look).  A malformed event message is skipped.

    Raises
    ------
    zmq.ZMQError
        The monitor socket is closed.
    """
    out: list = []
    while True:
        batch = recv_waiting(monitor, MONITOR_DRAIN)
        for msg in batch:
            try:
                out.append(parse_monitor_message([bytes(p) for p in msg])["event"])
            except Exception:  # noqa: BLE001 - a malformed monitor frame: skipped
                continue
        if len(batch) < MONITOR_DRAIN:
            return out
