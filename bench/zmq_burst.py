"""What one ZeroMQ message costs the thread that sends it, alone and in bursts.

A DEALER in this process sends 100 B requests to a ROUTER in a child process that answers each
at once (loopback TCP, pyzmq's Cython backend, as rmq's clients and actors use it).  For bursts
of 1, 2, 8 and 32 requests (the next burst after every answer of the last came back) it prints
the sending thread's CPU time a message (``time.thread_time_ns``: its ``send()`` calls and its
``recv()`` calls, pyzmq releasing the GIL around each) and the wall time a message.

Why it matters: a message alone wakes ZeroMQ's I/O thread (an eventfd write to a thread asleep
in epoll on the other core), and that wake is most of the cost on this 2-core VM; messages sent
back to back share one wake.  Every rmq request / response pays it on both sides.

Run: ``python bench/zmq_burst.py [N]`` (N messages per burst size, default 20,000).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time

import zmq

BODY = b"x" * 100
BURSTS = (1, 2, 8, 32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(port: int, ready) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    while True:
        peer, body = s.recv_multipart()
        if body == b"STOP":
            break
        s.send_multipart([peer, BODY])
    s.close(0)
    ctx.term()


def measure(port: int, burst: int, n: int) -> dict:
    """``{"burst", "cpu_us", "send_us", "wall_us"}``: the sending thread's CPU a message (all of
    it, and its ``send()`` calls alone) and the wall time a message, for ``n`` messages."""
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send(BODY)
    d.recv()                                    # connected and warm
    tc = time.thread_time_ns
    send_ns = 0
    rounds = max(1, n // burst)
    w0, c0 = time.perf_counter(), tc()
    for _ in range(rounds):
        a = tc()
        for _ in range(burst):
            d.send(BODY)
        send_ns += tc() - a
        for _ in range(burst):
            d.recv()
    cpu_ns, wall = tc() - c0, time.perf_counter() - w0
    d.close(0)
    ctx.term()
    m = rounds * burst
    return {"burst": burst, "cpu_us": cpu_ns / m / 1000, "send_us": send_ns / m / 1000, "wall_us": wall / m * 1e6}


def main(n: int = 20_000) -> list:
    port = _free_port()
    ready = mp.Event()
    p = mp.Process(target=_server, args=(port, ready), daemon=True)
    p.start()
    if not ready.wait(10):
        raise SystemExit("the ROUTER process did not start")
    rows = []
    try:
        for b in BURSTS:
            r = measure(port, b, n)
            rows.append(r)
            print(f"burst {b:3d}: sender thread CPU {r['cpu_us']:5.1f} us/msg (send() {r['send_us']:4.1f} us), "
                  f"wall {r['wall_us']:6.1f} us/msg", flush=True)
    finally:
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.connect(f"tcp://127.0.0.1:{port}")
        d.send(b"STOP")
        p.join(5)
        d.close(0)
        ctx.term()
    return rows


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
    os._exit(0)
