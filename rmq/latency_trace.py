"""Hop timestamps for ``rmq bench latency --trace`` (issue 12): where a message's time goes.

Off unless the process starts with ``RMQ_LATENCY_TRACE=1`` in its environment (the bench sets it
for the embedded cluster and for its own producer and consumer processes; an external cluster must
be started with it).  Off, every call site costs one module-global truth test.

Each process keeps one bounded event log (at most :data:`MAX_EVENTS` tuples; later events are
counted in ``dropped`` and not kept).  Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one
clock for every process of the machine, so stamps from the producer, the broker, reput and the
consumer compare directly.  Nothing is guessed: a hop with a missing stamp is left out of the
breakdown, not estimated.

Events (tuples, first item the kind):

client side, keyed by the message's unique id (UNIQ_KEY = ``msg_id``)
    ``("p_enq", uniq, ns)``      ``Producer.send_async`` / ``send`` handed the message to the I/O thread
    ``("p_write", uniq, ns)``    the I/O thread wrote its request to the broker's socket
    ``("c_rx", uniq, ns)``       the consumer's pull thread (or ``poll``) got the pull response
    ``("c_submit", uniq, ns)``   the push consumer put the message in its process queue and handed it
                                 to the consume pool
broker side, keyed by (topic, queueId, queue offset range)
    ``("append", topic, queue_id, first_queue_offset, n, received_ns, appended_ns)``: received = the
    send handler started (the request was read from the socket; requests read in one loop turn are
    handled one after another)
    ``("dispatch", topic, queue_id, max_offset, reput_received_ns, reput_dispatched_ns, broker_received_ns)``
    ``("pull", topic, queue_id, offset, next_begin_offset, arrived_ns, replied_ns, held)``
"""
from __future__ import annotations

import os
import threading

ENV = "RMQ_LATENCY_TRACE"
ENABLED = os.environ.get(ENV, "") == "1"
MAX_EVENTS = 1_000_000                 # per process; a bench scenario makes ~10 per message

_lock = threading.Lock()
_events: list = []
_dropped = 0


def event(*ev) -> None:
    """Record one event (callers test :data:`ENABLED` first)."""
    global _dropped
    with _lock:
        if len(_events) < MAX_EVENTS:
            _events.append(ev)
        else:
            _dropped += 1


def stamp_messages(kind: str, msgs, ns: int) -> None:
    """``(kind, msg.msg_id, ns)`` for each message of ``msgs``."""
    global _dropped
    with _lock:
        room = MAX_EVENTS - len(_events)
        if room < len(msgs):
            _dropped += len(msgs) - max(room, 0)
            msgs = msgs[:max(room, 0)]
        _events.extend((kind, m.msg_id, ns) for m in msgs)


def stamp_ids(kind: str, ids, ns: int) -> None:
    """``(kind, uniq, ns)`` for each unique id of ``ids``."""
    global _dropped
    with _lock:
        for u in ids:
            if len(_events) < MAX_EVENTS:
                _events.append((kind, u, ns))
            else:
                _dropped += 1


def take() -> dict:
    """This process's events since the last call: ``{"events": [...], "dropped": n}``; clears them."""
    global _events, _dropped
    with _lock:
        ev, dropped = _events, _dropped
        _events, _dropped = [], 0
    return {"events": ev, "dropped": dropped}


def enable(on: bool = True) -> None:
    """Turn tracing on or off in this process (and, through the environment, in children it starts)."""
    global ENABLED
    ENABLED = on
    if on:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)
