#!/usr/bin/env python
"""End-to-end produce / consume throughput over loopback, beside the raw pyzmq ceiling
measured in the same run.

Run::

    python -m rmq.bench.e2e                     # the table (about 2 minutes on 2 vCPUs)
    python -m rmq.bench.e2e --messages 300000   # smaller
    python -m rmq.bench.e2e --json e2e.json     # ... and the figures as JSON
    python -m rmq.bench.e2e --profile /tmp/prof # py-spy record of the broker during each phase
    python bench/e2e.py ...                     # the same (the source tree's shim)
    python -m pytest bench/bench_e2e.py --benchmark-only -q   # the same scenarios, small sizes

Every load runs in a client process of its own (multiprocessing "spawn"); the benchmark
process only orchestrates and waits on pipes.  The broker group is the real one:
``rmq.testing.Cluster`` starts nameserver, broker, reput and flush as
processes on ephemeral loopback ports.

Ceiling (raw pyzmq, DEALER -> ROUTER, tcp 127.0.0.1, a sink process that only
receives and answers with pre-built frames of the broker's shapes):

* ``stream``: one multipart ``[RMQ1, SEND_MESSAGE header, body]`` per message, up to
  STREAM_WINDOW messages unacknowledged (the sink acknowledges each drained burst
  with one count frame);
* ``batch``: ``[RMQ1, SEND_BATCH_MESSAGE header, encode_batch(1000 messages)]`` per request,
  WINDOW requests in flight, each answered with a frame shaped like SEND_OK (a 1000 msgIds
  header): the very bytes the producer sends and gets back;
* ``rtt``: one ``[RMQ1, header, body]`` at a time, answered at once: round trip p50/p99;
* ``pages``: PULL-shaped requests answered with a real page of 1000 CommitLog records
  (built by a MessageStore), WINDOW in flight: the ceiling of the consume path;
* ``decode``: ``decode_records`` of that page in a loop, no I/O (the consumer's CPU part).

rmq, per flush type (ASYNC_FLUSH, SYNC_FLUSH) and body size (100 B, 1 KiB), one fresh
broker group each (CommitLog files of --file-size, warmMapedFileEnable=true):

* ``produce``: SEND_BATCH_MESSAGE batches of 1000 over one DEALER, WINDOW requests in
  flight, round robin over QUEUES queues; latency = request sent -> SEND_OK;
* ``consume``: everything back with PULL_MESSAGE maxMsgNums=1000, one pull in flight per
  queue (QUEUES in flight), every page decoded into MessageExt objects;
* ``single``: SEND_MESSAGE one at a time, waiting for each ack, for --single-seconds.

MB/s counts payload (message bodies) only; the JSON also has wire bytes.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Optional

import zmq

from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.store.config import MessageStoreConfig

# -- parameters --------------------------------------------------------------------------------
MB = 1e6
BODY_SIZES = (100, 1024)
FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
BATCH = 1000                     # messages per SEND_BATCH_MESSAGE (and per pull page)
WINDOW = 4                       # requests in flight (produce, batch ceiling, pulls / page ceiling)
QUEUES = 4                       # queues the producer round-robins over; one pull in flight per queue
STREAM_WINDOW = 1000             # unacknowledged messages of the one-frame-per-message ceiling
DEFAULT_MESSAGES = 800_000       # messages per produce round for 100 B bodies; 1 KiB: a quarter
DEFAULT_ROUNDS = 3               # rounds of every measurement; the median is reported
#: CommitLog file size.  All rounds of one group fit in its first file (3 x 804k x 219 B,
#: 3 x 204k x 1143 B), so no roll happens while timing; the store warms that file and its
#: allocator pre-touches the next one: 2 x 768 MiB of dirty page cache stays under
#: vm.dirty_background_ratio (10 % of 24 GiB), so no kernel writeback of zero pages starts
DEFAULT_FILE_SIZE = 768 << 20
DEFAULT_SINGLE_SECONDS = 1.5
DEFAULT_CEILING_SECONDS = 1.0
TOPIC = "E2EBench"
SINGLE_TOPIC = "E2ESingle"
IDLE_CPU_FRACTION = 0.15         # the group is "idle" when it uses < 15 % of one core ...
IDLE_WINDOW_S = 0.3              # ... over this long (the allocator pre-touches the next file)
IDLE_MAX_WAIT_S = 10.0
PHASE_TIMEOUT_S = 120.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

# PERF.md section 4 floors (this machine, single producer)
TARGETS = {
    ("produce", "ASYNC_FLUSH", 100): ("T1", 2_500_000), ("produce", "ASYNC_FLUSH", 1024): ("T1", 600_000),
    ("produce", "SYNC_FLUSH", 100): ("T2", 1_200_000), ("produce", "SYNC_FLUSH", 1024): ("T2", 400_000),
    ("consume", "ASYNC_FLUSH", 100): ("T7", 3_000_000), ("consume", "ASYNC_FLUSH", 1024): ("T7", 1_200_000),
    ("consume", "SYNC_FLUSH", 100): ("T7", 3_000_000), ("consume", "SYNC_FLUSH", 1024): ("T7", 1_200_000),
    ("single", "SYNC_FLUSH", 100): ("T5", 4_200), ("single", "SYNC_FLUSH", 1024): ("T5", 4_200),
}
#: T4: single message, async flush: the broker adds <= 10 us to the raw round trip (p50)
T4_ADDED_US = 10.0


def body_of(size: int) -> bytes:
    return bytes((i * 131 + 7) & 0xFF for i in range(size))


def pct(sorted_vals: list, q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))]


def lat_stats(ns: list) -> dict:
    """p50 / p99 / p99.9 / max of latencies given in ns, as microseconds."""
    s = sorted(ns)
    return {"n": len(s), "p50_us": pct(s, 0.5) / 1e3, "p99_us": pct(s, 0.99) / 1e3,
            "p999_us": pct(s, 0.999) / 1e3, "max_us": (s[-1] / 1e3) if s else float("nan")}


# == worker side (runs in spawned processes) ====================================================
_CTX: Optional[zmq.Context] = None


def _ctx() -> zmq.Context:
    global _CTX
    if _CTX is None:
        _CTX = zmq.Context(io_threads=1)
    return _CTX


def _dealer(endpoint: str, hwm: int = 1000) -> zmq.Socket:
    s = _ctx().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, hwm)
    s.setsockopt(zmq.RCVHWM, hwm)
    s.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_SIZE + 1024)
    s.connect(endpoint)
    return s


def _recv(s: zmq.Socket, timeout_s: float = 30.0) -> list:
    if not s.poll(timeout_s * 1000):
        raise TimeoutError(f"no answer within {timeout_s} s")
    return s.recv_multipart(copy=False)


def _ready(conn, info: Any = None) -> None:
    """Setup done: tell the orchestrator, wait for its go."""
    conn.send(("ready", info))
    if conn.recv() != "go":
        raise RuntimeError("expected go")


def send_frame(code: int, fields: dict, body: Optional[bytes], opaque: int = 1) -> list:
    return P.encode(Frame(code, opaque, 0, "", fields, [body] if body is not None else []))


def send_ok_frame(n: int) -> list:
    """A SEND_OK response of the broker's shape for a batch of ``n`` (msgId list of n ids)."""
    return P.encode(Frame(ResponseCode.SUCCESS, 1, P.FLAG_RESPONSE, "", {
        "msgId": ",".join(["7F00000100002A9F" + "%016X" % i for i in range(n)]), "queueId": 0,
        "queueOffset": 0, "storeTimestamp": int(time.time() * 1000), "msgNum": n}))


def w_sink(conn, mode: str, page: Optional[bytes] = None, batch: int = BATCH) -> dict:
    """ROUTER sink: the ceiling's receiver.  Polls, drains, answers with pre-built frames,
    like the actor loop does; stops on any message from the orchestrator."""
    s = _ctx().socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 10000)
    s.setsockopt(zmq.RCVHWM, 10000)
    s.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_SIZE + 1024)
    s.bind("tcp://127.0.0.1:*")
    endpoint = s.getsockopt_string(zmq.LAST_ENDPOINT)
    if mode == "batch":
        resp = send_ok_frame(batch)
    elif mode == "rtt":
        resp = send_ok_frame(1)
    elif mode == "pages":
        resp = P.encode(Frame(ResponseCode.SUCCESS, 1, P.FLAG_RESPONSE, "", {
            "nextBeginOffset": 0, "minOffset": 0, "maxOffset": 0, "suggestWhichBrokerId": 0}, [page]))
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    poller.register(conn.fileno(), zmq.POLLIN)
    conn.send(("ready", endpoint))
    received = unacked = 0
    ident = None
    ack_every = STREAM_WINDOW // 4
    while True:
        # stream mode: credit goes back every STREAM_WINDOW/4 messages, or after 1 ms of quiet
        events = dict(poller.poll(1 if unacked else 1000))
        if conn.fileno() in events:
            conn.recv()
            break
        if s not in events:
            if unacked:
                s.send_multipart([ident, P.PROTOCOL_MAGIC, unacked.to_bytes(8, "little")])
                unacked = 0
            continue
        drained = 0
        for _ in range(STREAM_WINDOW if mode == "stream" else 256):
            try:
                parts = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            drained += 1
            ident = parts[0]
            if mode != "stream":
                s.send_multipart([ident, *resp], copy=False)
        received += drained
        if mode == "stream":
            unacked += drained
            if unacked >= ack_every:
                s.send_multipart([ident, P.PROTOCOL_MAGIC, unacked.to_bytes(8, "little")])
                unacked = 0
    s.close(0)
    return {"received": received}


def w_stream(conn, endpoint: str, body_size: int, seconds: float, window: int = STREAM_WINDOW,
             bare: bool = False) -> dict:
    """One message per multipart, ``window`` messages unacknowledged (credit acks from the sink).
    ``bare``: a single zmq frame holding the body; else rmq's shape [RMQ1, header, body]."""
    body = body_of(body_size)
    parts = [body] if bare else send_frame(
        RequestCode.SEND_MESSAGE, {"producerGroup": "pg", "topic": TOPIC, "queueId": 0, "properties": {},
                                   "bornTimestamp": int(time.time() * 1000)}, body)
    s = _dealer(endpoint, hwm=10 * window)
    for _ in range(10):                    # connect + warm
        s.send_multipart(parts, copy=False)
    got = 0
    while got < 10:
        got += int.from_bytes(_recv(s)[1].bytes, "little")
    _ready(conn)
    inflight = acked = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    stopping = False
    while True:
        if not stopping:
            while inflight < window:
                s.send_multipart(parts, copy=False)
                inflight += 1
        ack = _recv(s)
        while True:
            n = int.from_bytes(ack[1].bytes, "little")
            inflight -= n
            acked += n
            try:
                ack = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
        if not stopping and time.perf_counter() >= stop_at:
            stopping = True
        if stopping and inflight == 0:
            break
    el = time.perf_counter() - t0
    s.close(0)
    return {"msgs": acked, "seconds": el, "payload_bytes": acked * body_size,
            "wire_bytes": acked * sum(len(p) for p in parts)}


def w_batch(conn, endpoint: str, body_size: int, seconds: float, batch: int = BATCH,
            window: int = WINDOW) -> dict:
    """The producer's exact bytes to the sink, ``window`` requests in flight, per-request latency."""
    body = body_of(body_size)
    blob = _cl.encode_batch([(body, b"", 0)] * batch)
    s = _dealer(endpoint)
    fields = {"producerGroup": "pg", "topic": TOPIC, "queueId": 0, "bornTimestamp": int(time.time() * 1000)}
    parts = send_frame(RequestCode.SEND_BATCH_MESSAGE, fields, blob)
    for _ in range(3):
        s.send_multipart(parts, copy=False)
        _recv(s)
    _ready(conn)
    lat: list = []
    sent_at: list = []
    pc = time.perf_counter_ns
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    done = 0
    while True:
        if time.perf_counter() < stop_at:
            while len(sent_at) < window:
                sent_at.append(pc())
                s.send_multipart(parts, copy=False)
        if not sent_at:
            break
        _recv(s)
        lat.append(pc() - sent_at.pop(0))     # the sink answers in order
        done += 1
    el = time.perf_counter() - t0
    s.close(0)
    return {"msgs": done * batch, "seconds": el, "payload_bytes": done * batch * body_size,
            "wire_bytes": done * sum(len(p) for p in parts), **lat_stats(lat)}


def w_rtt(conn, endpoint: str, body_size: int, seconds: float) -> dict:
    body = body_of(body_size)
    parts = send_frame(RequestCode.SEND_MESSAGE, {"producerGroup": "pg", "topic": TOPIC, "queueId": 0,
                                                  "properties": {}, "bornTimestamp": int(time.time() * 1000)},
                       body)
    s = _dealer(endpoint)
    for _ in range(20):
        s.send_multipart(parts, copy=False)
        _recv(s)
    _ready(conn)
    lat = []
    pc = time.perf_counter_ns
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while time.perf_counter() < stop_at:
        a = pc()
        s.send_multipart(parts, copy=False)
        _recv(s)
        lat.append(pc() - a)
    el = time.perf_counter() - t0
    s.close(0)
    return {"msgs": len(lat), "seconds": el, "payload_bytes": len(lat) * body_size, **lat_stats(lat)}


def w_pages(conn, endpoint: str, seconds: float, msgs_per_page: int, body_size: int,
            window: int = WINDOW) -> dict:
    """PULL-shaped requests answered with a real page; raw transport, no decoding."""
    s = _dealer(endpoint)
    parts = send_frame(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": TOPIC, "queueId": 0, "queueOffset": 0, "maxMsgNums": msgs_per_page,
        "sysFlag": 0, "suspendTimeoutMillis": 0, "subscription": "*"}, None)
    for _ in range(3):
        s.send_multipart(parts, copy=False)
        _recv(s)
    _ready(conn)
    inflight = pages = nbytes = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while True:
        if time.perf_counter() < stop_at:
            while inflight < window:
                s.send_multipart(parts, copy=False)
                inflight += 1
        if not inflight:
            break
        r = _recv(s)
        inflight -= 1
        pages += 1
        nbytes += len(r[-1])
    el = time.perf_counter() - t0
    s.close(0)
    n = pages * msgs_per_page
    return {"msgs": n, "seconds": el, "payload_bytes": n * body_size, "wire_bytes": nbytes}


def w_decode(conn, page: bytes, seconds: float, msgs_per_page: int, body_size: int) -> dict:
    """``decode_records`` of one real page in a loop: the consumer's CPU ceiling."""
    assert len(_cl.decode_records(page)) == msgs_per_page
    _ready(conn)
    n = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while time.perf_counter() < stop_at:
        n += len(_cl.decode_records(page))
    el = time.perf_counter() - t0
    return {"msgs": n, "seconds": el, "payload_bytes": n * body_size, "wire_bytes": n // msgs_per_page * len(page)}


def _send_retrying_busy(s: zmq.Socket, make, counts: list, q: int, max_wait_s: float = 60.0) -> None:
    """An untimed warm-up send; SYSTEM_BUSY (e.g. PCBUSY while the broker pre-touches its first
    CommitLog file inside the first append) is retried, as a RocketMQ client would."""
    deadline = time.monotonic() + max_wait_s
    while True:
        s.send_multipart(make(), copy=False)
        r = P.decode(_recv(s, max_wait_s))
        if r.code == ResponseCode.SUCCESS:
            counts[q] += r.fields.get("msgNum", 1)
            return
        if r.code != ResponseCode.SYSTEM_BUSY or time.monotonic() > deadline:
            raise RuntimeError(f"warm-up send refused: {r.code} {r.remark}")
        time.sleep(0.05)


def w_produce(conn, endpoint: str, topic: str, body_size: int, n_msgs: int, batch: int = BATCH,
              window: int = WINDOW, queues: int = QUEUES, max_seconds: float = 60.0) -> dict:
    """SEND_BATCH_MESSAGE batches of ``batch``, ``window`` in flight, round robin over queues.
    One untimed batch per queue first (creates the topic and the first CommitLog file)."""
    body = body_of(body_size)
    blob = _cl.encode_batch([(body, b"", 0)] * batch)
    s = _dealer(endpoint)
    opaque = 0
    per_queue = [0] * queues
    warm = [0] * queues
    errors: dict = {}

    def request(q: int) -> list:
        nonlocal opaque
        opaque += 1
        return P.encode(Frame(RequestCode.SEND_BATCH_MESSAGE, opaque, 0, "", {
            "producerGroup": "pg", "topic": topic, "queueId": q, "bornTimestamp": int(time.time() * 1000)},
            [blob]))

    for q in range(queues):
        _send_retrying_busy(s, lambda: request(q), warm, q)
    _ready(conn)
    n_req = n_msgs // batch
    sent_at: dict = {}
    queue_of: dict = {}
    lat = []
    pc = time.perf_counter_ns
    issued = done = 0
    t0 = time.perf_counter()
    stop_at = t0 + max_seconds
    while done < issued or issued < n_req:
        while len(sent_at) < window and issued < n_req and time.perf_counter() < stop_at:
            q = issued % queues
            parts = request(q)
            sent_at[opaque] = pc()
            queue_of[opaque] = q
            s.send_multipart(parts, copy=False)
            issued += 1
        if not sent_at:
            break
        r = P.decode(_recv(s))
        t = sent_at.pop(r.opaque, None)
        if t is None:
            continue
        q = queue_of.pop(r.opaque)
        done += 1
        if r.code == ResponseCode.SUCCESS:
            lat.append(pc() - t)
            per_queue[q] += r.fields["msgNum"]
        else:
            key = f"{ResponseCode(r.code).name}: {r.remark[:80]}"
            errors[key] = errors.get(key, 0) + 1
    el = time.perf_counter() - t0
    s.close(0)
    acked = sum(per_queue)
    return {"msgs": acked, "seconds": el, "payload_bytes": acked * body_size,
            "wire_bytes": len(lat) * len(blob), "per_queue": [a + b for a, b in zip(per_queue, warm)],
            "warm_msgs": sum(warm), "requests": done, "errors": errors, **lat_stats(lat)}


def w_consume(conn, endpoint: str, topic: str, body_size: int, expected: list, max_nums: int = BATCH,
              max_seconds: float = 60.0) -> dict:
    """Pull every queue from 0 to ``expected[q]``, one pull in flight per queue, decoding
    every page into MessageExt objects."""
    s = _dealer(endpoint)
    body = body_of(body_size)
    opaque = 0
    offsets = [0] * len(expected)
    pending: dict = {}
    statuses: dict = {}

    def pull(q: int) -> None:
        nonlocal opaque
        opaque += 1
        pending[opaque] = q
        s.send_multipart(P.encode(Frame(RequestCode.PULL_MESSAGE, opaque, 0, "", {
            "consumerGroup": "cg", "topic": topic, "queueId": q, "queueOffset": offsets[q],
            "maxMsgNums": max_nums, "sysFlag": 0, "suspendTimeoutMillis": 0, "subscription": "*"})), copy=False)

    # connect + warm: one pull of one message, result dropped
    s.send_multipart(P.encode(Frame(RequestCode.PULL_MESSAGE, 0, 0, "", {
        "consumerGroup": "cg", "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 1,
        "sysFlag": 0, "suspendTimeoutMillis": 0, "subscription": "*"})), copy=False)
    _recv(s)
    _ready(conn)
    got = nbytes = pages = 0
    bad = 0
    t0 = time.perf_counter()
    stop_at = t0 + max_seconds
    for q in range(len(expected)):
        if expected[q]:
            pull(q)
    while pending:
        r = P.decode(_recv(s))
        q = pending.pop(r.opaque, None)
        if q is None:
            continue
        if r.code == ResponseCode.SUCCESS:
            page = r.bodies[0]
            msgs = _cl.decode_records(page)
            got += len(msgs)
            nbytes += len(page)
            pages += 1
            if msgs[0].body != body or msgs[-1].body != body or msgs[0].queue_offset != offsets[q]:
                bad += 1
            offsets[q] = r.fields["nextBeginOffset"]
        else:
            statuses[ResponseCode(r.code).name] = statuses.get(ResponseCode(r.code).name, 0) + 1
            if r.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                raise RuntimeError(f"pull of queue {q} at {offsets[q]}: {r.code} {r.remark}")
            if r.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                offsets[q] = r.fields.get("nextBeginOffset", offsets[q])
        if offsets[q] < expected[q] and time.perf_counter() < stop_at:
            pull(q)
    el = time.perf_counter() - t0
    s.close(0)
    return {"msgs": got, "seconds": el, "payload_bytes": got * body_size, "wire_bytes": nbytes,
            "pages": pages, "bad_pages": bad, "statuses": statuses, "offsets": offsets}


def w_single(conn, endpoint: str, topic: str, body_size: int, seconds: float) -> dict:
    """SEND_MESSAGE one at a time, waiting for each ack."""
    body = body_of(body_size)
    s = _dealer(endpoint)
    opaque = 0

    def request() -> list:
        nonlocal opaque
        opaque += 1
        return P.encode(Frame(RequestCode.SEND_MESSAGE, opaque, 0, "", {
            "producerGroup": "pg", "topic": topic, "queueId": 0, "properties": {},
            "bornTimestamp": int(time.time() * 1000)}, [body]))

    warm = [0]
    for _ in range(20):
        _send_retrying_busy(s, request, warm, 0)
    _ready(conn)
    lat = []
    errors = 0
    pc = time.perf_counter_ns
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while time.perf_counter() < stop_at:
        parts = request()
        a = pc()
        s.send_multipart(parts, copy=False)
        r = P.decode(_recv(s))
        b = pc()
        if r.code == ResponseCode.SUCCESS:
            lat.append(b - a)
        else:
            errors += 1
    el = time.perf_counter() - t0
    s.close(0)
    return {"msgs": len(lat), "seconds": el, "payload_bytes": len(lat) * body_size, "errors": errors,
            **lat_stats(lat)}


WORKER_COMMANDS = {"sink": w_sink, "stream": w_stream, "batch": w_batch, "rtt": w_rtt, "pages": w_pages,
                   "decode": w_decode, "produce": w_produce, "consume": w_consume, "single": w_single}


def _worker_main(conn, commands: Optional[dict] = None) -> None:
    """A spawned worker's loop: run ``(name, kwargs)`` commands from ``commands`` (default
    :data:`WORKER_COMMANDS`) until None or EOF, answering ("done", result) or ("error", traceback)."""
    commands = WORKER_COMMANDS if commands is None else commands
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the orchestrator handles ^C
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        if msg == "stop":                                 # a stop that arrived after the command ended
            continue
        name, kw = msg
        try:
            conn.send(("done", commands[name](conn, **kw)))
        except Exception:  # noqa: BLE001 - reported to the orchestrator
            conn.send(("error", traceback.format_exc()))
    if _CTX is not None:
        _CTX.destroy(0)


# == orchestrator side ==========================================================================
class Worker:
    """A spawned process running commands (``WORKER_COMMANDS``) one at a time."""

    def __init__(self, name: str):
        ctx = mp.get_context("spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), name=f"e2e-{name}", daemon=True)
        self.proc.start()
        child.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _get(self, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker {self.name}: nothing within {timeout} s")
        kind, val = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"worker {self.name} failed:\n{val}")
        return kind, val

    def start(self, command: str, timeout: float = PHASE_TIMEOUT_S, **kw) -> Any:
        """Send a command; return what its setup reports (``ready`` info)."""
        self.conn.send((command, kw))
        kind, val = self._get(timeout)
        if kind != "ready":
            raise RuntimeError(f"worker {self.name}: expected ready, got {kind}")
        return val

    def go(self) -> None:
        self.conn.send("go")

    def stop_sink(self) -> dict:
        self.conn.send("stop")
        return self.result(30)

    def result(self, timeout: float = PHASE_TIMEOUT_S) -> dict:
        kind, val = self._get(timeout)
        if kind != "done":
            raise RuntimeError(f"worker {self.name}: expected done, got {kind}")
        return val

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def cpu_seconds(pid: int, main_thread: bool = False) -> float:
    """CPU seconds (user + system) of a process, all threads, or its main thread alone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy (not idle / iowait) since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK        # user..steal minus idle, iowait
    except (OSError, ValueError, IndexError):
        return 0.0


class CpuMeter:
    """CPU use (% of one core) of named processes between start() and stop(), and
    ``others``: what every other process on the machine used meanwhile (other work
    on a shared 2-vCPU VM moves every figure; see PERF.md section 0)."""

    def __init__(self, pids: dict):
        self.pids = pids

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.m0 = machine_busy_seconds()
        self.c0 = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self.b0 = cpu_seconds(self.pids["broker"], main_thread=True) if "broker" in self.pids else 0.0

    def stop(self) -> dict:
        dt = max(time.monotonic() - self.t0, 1e-6)
        out = {k: round(100.0 * (cpu_seconds(p) - self.c0[k]) / dt, 1) for k, p in self.pids.items()}
        busy = 100.0 * (machine_busy_seconds() - self.m0) / dt
        out["others"] = round(max(0.0, busy - sum(out.values())), 1)
        if "broker" in self.pids:     # the Python thread alone (the rest: zmq I/O + allocator threads)
            out["broker_main"] = round(100.0 * (cpu_seconds(self.pids["broker"], True) - self.b0) / dt, 1)
        return out


def wait_idle(pids: list, max_wait_s: float = IDLE_MAX_WAIT_S) -> float:
    """Wait until the processes together use < IDLE_CPU_FRACTION of a core; seconds waited."""
    t_start = time.monotonic()
    while time.monotonic() - t_start < max_wait_s:
        c0 = sum(cpu_seconds(p) for p in pids)
        time.sleep(IDLE_WINDOW_S)
        if sum(cpu_seconds(p) for p in pids) - c0 < IDLE_CPU_FRACTION * IDLE_WINDOW_S + 1.0 / CLK_TCK:
            break
    return time.monotonic() - t_start


class Profiler:
    """``py-spy record`` of some processes for the duration of a phase (raw collapsed stacks)."""

    def __init__(self, out_dir: Optional[str], native: bool = False, rate: int = 200):
        self.out_dir = out_dir
        self.native = native
        self.rate = rate
        self.procs: list = []
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)

    def start(self, label: str, pids: dict) -> None:
        if not self.out_dir:
            return
        for name, pid in pids.items():
            out = os.path.join(self.out_dir, f"{label}.{name}.txt")
            cmd = ["py-spy", "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw",
                   "--idle", "--output", out]
            # --native cannot sample without pausing the process (py-spy refuses --nonblocking):
            # it shows Cython / libzmq frames but slows the target down
            cmd.append("--native" if self.native else "--nonblocking")
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.3)      # let py-spy attach before the timed part

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


#: leaf frames of a thread that waits (py-spy --idle keeps them): poll, pyzmq's zero-copy
#: garbage-collector thread, the orchestrator pipe, condition waits
IDLE_LEAVES = ("Poller.poll", "GarbageCollectorThread.run", "Connection._recv", "Condition.wait",
               "Connection.poll", "Socket.poll")


def summarize_profile(path: str, top: int = 8) -> list:
    """Lines of text: where a process spent its samples (py-spy raw format), by leaf line,
    waiting leaves set apart; shares are of all samples (every thread, wall clock)."""
    leaf: dict = {}
    total = idle = 0
    with open(path) as f:
        for ln in f:
            ln = ln.rstrip()
            if not ln or " " not in ln:
                continue
            stack, n = ln.rsplit(" ", 1)
            n = int(n)
            total += n
            last = stack.rsplit(";", 1)[-1] or "(no Python frame: native thread)"
            if last.startswith(IDLE_LEAVES):
                idle += n
                continue
            leaf[last] = leaf.get(last, 0) + n
    if not total:
        return [f"{os.path.basename(path)}: no samples"]
    out = [f"{os.path.basename(path)}: {total} samples, {100.0 * idle / total:.0f} % waiting (poll / idle threads)"]
    for fr, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"  {100.0 * n / total:5.1f} %  {fr}")
    return out


@dataclass
class Params:
    messages: int = DEFAULT_MESSAGES          # per produce round, 100 B bodies
    messages_1k: Optional[int] = None         # per produce round, 1 KiB bodies (default messages // 4)
    rounds: int = DEFAULT_ROUNDS
    single_seconds: float = DEFAULT_SINGLE_SECONDS
    ceiling_seconds: float = DEFAULT_CEILING_SECONDS
    file_size: int = DEFAULT_FILE_SIZE
    sizes: tuple = BODY_SIZES
    flush_types: tuple = FLUSH_TYPES
    batch: int = BATCH
    window: int = WINDOW
    queues: int = QUEUES
    store_dir: Optional[str] = None
    profile_dir: Optional[str] = None
    profile_procs: tuple = ("broker",)
    profile_native: bool = False
    max_phase_seconds: float = 60.0

    def n_msgs(self, body_size: int) -> int:
        n = self.messages if body_size <= 100 else (
            self.messages_1k if self.messages_1k is not None else self.messages // 4)
        return max(self.batch * self.queues, n // self.batch * self.batch)


def build_page(body_size: int, n: int = BATCH) -> bytes:
    """A real pull page: ``n`` CommitLog records of ``body_size`` bodies as ``get_messages``
    returns them (same store defaults as the broker: __CRC32# property on)."""
    from rmq.store.message_store import MessageStore

    d = tempfile.mkdtemp(prefix="rmq-e2e-page-")
    try:
        store = MessageStore(d, mapped_file_size_commit_log=16 << 20,
                             max_transfer_count_on_message_in_memory=n,
                             max_transfer_bytes_on_message_in_memory=64 << 20)
        try:
            store.commitlog.store_host = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"
            res = store.put_messages(TOPIC, 0, _cl.encode_batch([(body_of(body_size), b"", 0)] * n))
            assert res.ok, res
            store.dispatch()
            got = store.get_messages("cg", TOPIC, 0, 0, n)
            page = bytes(got.records)
            assert got.message_count == n, got
        finally:
            store.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return page


def rate_row(res: dict) -> dict:
    el = res["seconds"]
    out = {"msgs": res["msgs"], "seconds": round(el, 4), "msgs_per_s": res["msgs"] / el if el else 0.0,
           "mb_per_s": res["payload_bytes"] / el / MB if el else 0.0}
    if "wire_bytes" in res:
        out["wire_mb_per_s"] = res["wire_bytes"] / el / MB if el else 0.0
    for k in ("p50_us", "p99_us", "p999_us", "max_us"):
        if k in res:
            out[k] = res[k]
    return out


def median_row(rows: list) -> dict:
    """Median of each figure over rounds; ``rounds``, ``msgs_per_s_min/max`` and ``spread``
    ((max - min) / median of msgs/s) beside it; errors of every round kept."""
    out = dict(rows[-1])
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            out[k] = statistics.median(vals)
    if isinstance(rows[0].get("cpu"), dict):
        out["cpu"] = {k: round(statistics.median(r["cpu"].get(k, 0.0) for r in rows), 1) for k in rows[0]["cpu"]}
    rates = [r["msgs_per_s"] for r in rows]
    out.update(rounds=len(rows), msgs_per_s_min=min(rates), msgs_per_s_max=max(rates),
               spread=(max(rates) - min(rates)) / out["msgs_per_s"] if out["msgs_per_s"] else 0.0,
               msgs_per_s_rounds=rates)
    errs: dict = {}
    for r in rows:
        for k, v in (r.get("errors") or {}).items():
            errs[k] = errs.get(k, 0) + v
    if "errors" in out:
        out["errors"] = errs
    bad = [r["error"] for r in rows if r.get("error")]
    out.pop("error", None)
    if bad:
        out["error"] = "; ".join(bad)
    return out


CEILING_KINDS = ("frame", "stream", "batch", "rtt", "pages", "decode")


class CeilingBench:
    """The raw pyzmq ceilings: a sink process and a client process, one measurement at a time."""

    def __init__(self, p: Params):
        self.p = p
        self.sink, self.client = Worker("sink"), Worker("client")
        self.pages: dict = {}

    def page(self, size: int) -> bytes:
        if size not in self.pages:
            self.pages[size] = build_page(size, self.p.batch)
        return self.pages[size]

    def measure(self, kind: str, size: int) -> dict:
        p, sink, client = self.p, self.sink, self.client
        if kind == "decode":
            client.start("decode", page=self.page(size), seconds=p.ceiling_seconds, msgs_per_page=p.batch,
                         body_size=size)
            meter = CpuMeter({"client": client.pid})
            meter.start()
            client.go()
            row = rate_row(client.result())
            row["cpu"] = meter.stop()
            return row
        kw: dict = {"mode": "stream" if kind == "frame" else kind}
        ckw: dict = {"seconds": p.ceiling_seconds, "body_size": size}
        if kind == "pages":
            kw["page"] = self.page(size)
            ckw.update(msgs_per_page=p.batch, window=p.window)
        elif kind == "batch":
            kw["batch"] = p.batch
            ckw.update(batch=p.batch, window=p.window)
        elif kind == "frame":
            ckw["bare"] = True
        ckw["endpoint"] = sink.start("sink", **kw)
        client.start("stream" if kind == "frame" else kind, **ckw)
        meter = CpuMeter({"sink": sink.pid, "client": client.pid})
        meter.start()
        client.go()
        try:
            res = client.result()
        finally:
            cpu = meter.stop()
            sink.stop_sink()
        row = rate_row(res)
        row["cpu"] = cpu
        return row

    def close(self) -> None:
        self.sink.close()
        self.client.close()


def measure_ceilings(p: Params, log=print) -> dict:
    """The raw pyzmq ceilings (plus decode-only), keyed (kind, body_size), median of
    ``p.rounds`` rounds taken in turn (round 1 of every kind, then round 2, ...); also
    ("record_bytes", size): CommitLog bytes per message of a real page."""
    out: dict = {}
    runs: dict = {}
    cb = CeilingBench(p)
    try:
        for size in p.sizes:
            out[("record_bytes", size)] = len(cb.page(size)) / p.batch
        for rnd in range(p.rounds):
            for size in p.sizes:
                for kind in CEILING_KINDS:
                    row = cb.measure(kind, size)
                    runs.setdefault((kind, size), []).append(row)
                    log(f"  ceiling round {rnd + 1} {kind:<6} {size:>5} B: {row['msgs_per_s']:>13,.0f} msgs/s "
                        f"{row['mb_per_s']:>8,.1f} MB/s"
                        + (f"  p50 {row['p50_us']:.0f} us p99 {row['p99_us']:.0f} us" if "p50_us" in row else "")
                        + f"  cpu {row['cpu']}")
    finally:
        cb.close()
    for key, rows in runs.items():
        out[key] = median_row(rows)
    return out


# RocketMQ's IndexFile sizes (MessageStoreConfig maxHashSlotNum / maxIndexNum; a 400 MiB file),
# not rmq.testing.Cluster's 1,000 / 4,000: with those, the reput actor rolled to a new IndexFile,
# flushing the full one and the checkpoint, every 4,000 keyed messages (57 % of its py-spy samples
# in a send_batch row, on the 2 cores the client and the broker share)
BENCH_INDEX_CONF = {"maxHashSlotNum": str(MessageStoreConfig.max_hash_slot_num),
                    "maxIndexNum": str(MessageStoreConfig.max_index_num)}


def cluster_conf(p: Params, flush: str) -> dict:
    return {"flushDiskType": flush, "mappedFileSizeCommitLog": str(p.file_size), "warmMapedFileEnable": "true",
            "maxTransferCountOnMessageInMemory": str(p.batch),
            "maxTransferBytesOnMessageInMemory": str(64 << 20),
            "mappedFileSizeConsumeQueue": str(300_000 * 20),       # RocketMQ's default, not the tests' 1000
            **BENCH_INDEX_CONF}


def topic_of(rnd: int) -> str:
    return f"{TOPIC}{rnd}"


class ClusterBench:
    """One broker group (flush type, body size) and a client process driving it.

    A scenario is ``stage(kind, rnd)`` (untimed: client setup and warm-up requests, then
    wait until the group is idle), ``fire()`` (the timed part: go, wait for the client's
    figures) and ``finish()`` (the row).  ``run(kind, rnd)`` does all three.  Round
    ``rnd`` of produce writes topic E2EBench<rnd>, which round ``rnd`` of consume reads.
    """

    def __init__(self, p: Params, flush: str, body_size: int, log=print):
        from rmq.testing import Cluster

        self.p, self.flush, self.size, self.log = p, flush, body_size, log
        self.dir = tempfile.mkdtemp(prefix=f"rmq-e2e-{flush[:4].lower()}-{body_size}-", dir=p.store_dir)
        self.cluster = Cluster(os.path.join(self.dir, "store"), conf=cluster_conf(p, flush))
        self.client = Worker(f"client-{flush}-{body_size}")
        self.produced: dict = {}          # round -> the produce worker's result
        self.profiler = Profiler(p.profile_dir, p.profile_native)
        self.label = f"{flush.split('_')[0].lower()}-{body_size}"
        self._staged: Optional[tuple] = None
        self._fired: Optional[tuple] = None

    def pids(self) -> dict:
        d = {name: ap.proc.pid for name, ap in self.cluster.procs.items()}
        d["client"] = self.client.pid
        return d

    def group_pids(self) -> list:
        return [ap.proc.pid for ap in self.cluster.procs.values()]

    # -- stage / fire / finish -------------------------------------------------------------
    def stage(self, kind: str, rnd: int = 0) -> None:
        p, extra = self.p, {}
        if kind == "produce":
            self.client.start("produce", endpoint=self.cluster.broker, topic=topic_of(rnd), body_size=self.size,
                              n_msgs=p.n_msgs(self.size), batch=p.batch, window=p.window, queues=p.queues,
                              max_seconds=p.max_phase_seconds)
        elif kind == "consume":
            if rnd not in self.produced:
                self.run("produce", rnd)          # untimed here: consume needs something to read
            extra["dispatch_wait_s"] = round(self.wait_dispatched(rnd), 2)
            self.client.start("consume", endpoint=self.cluster.broker, topic=topic_of(rnd), body_size=self.size,
                              expected=self.produced[rnd]["per_queue"], max_nums=p.batch,
                              max_seconds=p.max_phase_seconds)
        elif kind == "single":
            self.client.start("single", endpoint=self.cluster.broker, topic=SINGLE_TOPIC, body_size=self.size,
                              seconds=p.single_seconds)
        else:
            raise ValueError(kind)
        extra["idle_wait_s"] = round(wait_idle(self.group_pids()), 2)
        self._staged = (kind, rnd, extra)

    def fire(self) -> dict:
        kind, rnd, _extra = self._staged
        meter = CpuMeter(self.pids())
        self.profiler.start(f"{kind}-{self.label}-r{rnd + 1}",
                            {k: v for k, v in self.pids().items() if k in self.p.profile_procs})
        meter.start()
        self.client.go()
        try:
            res = self.client.result(PHASE_TIMEOUT_S + self.p.max_phase_seconds)
        finally:
            cpu = meter.stop()
            self.profiler.stop()
        self._fired = (res, cpu)
        return res

    def finish(self) -> dict:
        kind, rnd, extra = self._staged
        res, cpu = self._fired
        self._staged = self._fired = None
        row = rate_row(res)
        row.update(cpu=cpu, round=rnd + 1, **extra)
        if kind == "produce":
            self.produced[rnd] = res
            row.update(errors=res["errors"], requests=res["requests"])
        elif kind == "consume":
            expected = sum(self.produced[rnd]["per_queue"])
            row.update(expected=expected, bad_pages=res["bad_pages"], statuses=res["statuses"])
            if res["msgs"] != expected or res["bad_pages"]:
                row["error"] = f"consumed {res['msgs']} of {expected}, {res['bad_pages']} bad pages"
        else:
            row["errors"] = {"not SEND_OK": res["errors"]} if res["errors"] else {}
        return row

    def run(self, kind: str, rnd: int = 0) -> dict:
        self.stage(kind, rnd)
        self.fire()
        return self.finish()

    def wait_dispatched(self, rnd: int, timeout_s: float = 60.0) -> float:
        """Until every queue's max offset (ConsumeQueue, via the broker) covers what was acked."""
        t0 = time.monotonic()
        want = self.produced[rnd]["per_queue"]
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.cluster.broker)
        opaque = 0
        try:
            while time.monotonic() - t0 < timeout_s:
                have = []
                for q in range(len(want)):
                    opaque += 1
                    s.send_multipart(P.encode(Frame(RequestCode.GET_MAX_OFFSET, opaque, 0, "", {
                        "topic": topic_of(rnd), "queueId": q})))
                    while True:
                        r = P.decode(_recv(s, 10))
                        if r.opaque == opaque:
                            break
                    have.append(r.fields["offset"])
                if all(h >= w for h, w in zip(have, want)):
                    return time.monotonic() - t0
                time.sleep(0.05)
        finally:
            s.close(0)
            ctx.term()
        raise TimeoutError(f"dispatch did not reach {want} within {timeout_s} s")

    def diagnose(self) -> str:
        """Exit codes of the group's processes and the tail of their logs (for a failed phase)."""
        lines = []
        for name, ap in self.cluster.procs.items():
            lines.append(f"{name} pid {ap.proc.pid}: exit code {ap.proc.poll()}")
            log = os.path.join(self.cluster.store_path, "logs", f"{name}.log")
            try:
                with open(log) as f:
                    lines += ["    " + ln.rstrip() for ln in f.readlines()[-8:]]
            except OSError:
                pass
        return "\n".join(lines)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.cluster.close()
            # unlink before the kernel writes the warmed (dirty) zero pages back
            shutil.rmtree(self.dir, ignore_errors=True)


def attach_ceiling(row: dict, ceil: dict, ceil_name: str) -> dict:
    row["ceiling"] = ceil_name
    row["ceiling_msgs_per_s"] = ceil["msgs_per_s"]
    row["ceiling_mb_per_s"] = ceil["mb_per_s"]
    row["ratio"] = row["msgs_per_s"] / ceil["msgs_per_s"] if ceil["msgs_per_s"] else float("nan")
    for k in ("p50_us", "p99_us"):
        if k in ceil:
            row[f"ceiling_{k}"] = ceil[k]
    if "p50_us" in row and "p50_us" in ceil:
        row["p50_ratio"] = row["p50_us"] / ceil["p50_us"]
        row["p99_ratio"] = row["p99_us"] / ceil["p99_us"]
    return row


def attach_target(row: dict, kind: str, flush: str, size: int) -> dict:
    t = TARGETS.get((kind, flush, size))
    if t is not None:
        row["target"] = f"{t[0]} >= {t[1]:,} msgs/s"
        row["target_met"] = row["msgs_per_s"] >= t[1]
    elif kind == "single" and flush == "ASYNC_FLUSH" and "ceiling_p50_us" in row:
        limit = row["ceiling_p50_us"] + T4_ADDED_US
        row["target"] = f"T4 p50 <= rtt p50 + {T4_ADDED_US:.0f} us ({limit:.0f} us)"
        row["target_met"] = row["p50_us"] <= limit
    return row


CEILING_FOR = {"produce": "batch", "consume": "pages", "single": "rtt"}


def finish_row(row: dict, kind: str, flush: str, size: int, ceilings: dict) -> dict:
    """Label a scenario row, put its ceiling and ratio beside it, and its PERF.md target."""
    row.update(kind=kind, flush=flush, body_size=size, scenario=f"{kind} {flush} {size} B")
    attach_ceiling(row, ceilings[(CEILING_FOR[kind], size)], CEILING_FOR[kind])
    if kind == "consume" and ("decode", size) in ceilings:
        row["decode_msgs_per_s"] = ceilings[("decode", size)]["msgs_per_s"]
        row["ratio_to_decode"] = row["msgs_per_s"] / row["decode_msgs_per_s"]
    return attach_target(row, kind, flush, size)


SCENARIO_KINDS = ("produce", "consume", "single")


def run_cluster_scenarios(p: Params, flush: str, size: int, ceilings: dict, log=print) -> list:
    """Every scenario of one broker group, ``p.rounds`` rounds each (produce, consume and
    single in turn), as median rows beside their ceilings."""
    runs: dict = {k: [] for k in SCENARIO_KINDS}
    cb = ClusterBench(p, flush, size, log)
    try:
        for rnd in range(p.rounds):
            for kind in SCENARIO_KINDS:
                try:
                    row = cb.run(kind, rnd)
                except (RuntimeError, TimeoutError) as e:
                    raise RuntimeError(f"{kind} {flush} {size} B failed: {e}\n{cb.diagnose()}") from None
                runs[kind].append(row)
                lat = f"  p50 {row['p50_us']:.0f} us p99 {row['p99_us']:.0f} us" if "p50_us" in row else ""
                err = f"  [{row.get('errors') or row.get('error')}]" if row.get("errors") or row.get("error") else ""
                log(f"  round {rnd + 1} {kind:<7} {row['msgs_per_s']:>12,.0f} msgs/s {row['mb_per_s']:>8,.1f} MB/s"
                    f"{lat}  cpu {row['cpu']}{err}")
    finally:
        cb.close()
    return [finish_row(median_row(runs[kind]), kind, flush, size, ceilings) for kind in SCENARIO_KINDS]


def run_all(p: Params, log=print) -> dict:
    t0 = time.monotonic()
    load_before = os.getloadavg()
    log("ceilings (raw pyzmq loopback, same frame shapes):")
    ceilings = measure_ceilings(p, log)
    rows = []
    for flush in p.flush_types:
        for size in p.sizes:
            log(f"broker group {flush}, {size} B bodies, {p.n_msgs(size):,} messages per produce round:")
            rows += run_cluster_scenarios(p, flush, size, ceilings, log)
    return {"params": {**asdict(p), "n_msgs": {s: p.n_msgs(s) for s in p.sizes}},
            "ceilings": [{"kind": k, "body_size": s, **v} if isinstance(v, dict) else
                         {"kind": k, "body_size": s, "value": v} for (k, s), v in ceilings.items()],
            "rows": rows, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "wall_seconds": round(time.monotonic() - t0, 1), "cpus": os.cpu_count()}


# == presentation ================================================================================
def _f(v, fmt="{:,.0f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, shutil.get_terminal_size((200, 40)).columns))
    prm = report["params"]
    ceil = {(c["kind"], c["body_size"]): c for c in report["ceilings"]}
    t = Table(title=f"Raw pyzmq loopback ceilings (DEALER -> ROUTER, tcp 127.0.0.1, sink in its own process; "
                    f"median of {prm['rounds']})", title_justify="left")
    for col in ("ceiling", "body", "msgs/s", "spread", "MB/s payload", "MB/s wire", "p50 µs", "p99 µs",
                "CPU % sink/client/others", "what"):
        t.add_column(col, justify="left" if col in ("ceiling", "what") else "right")
    what = {"frame": f"1 zmq frame per message (body only), {STREAM_WINDOW} unacked",
            "stream": f"1 multipart per message [RMQ1, header, body], {STREAM_WINDOW} unacked",
            "batch": f"{prm['batch']} msgs per request, {prm['window']} in flight, SEND_OK-shaped replies",
            "rtt": "one request at a time",
            "pages": f"pull pages of {prm['batch']} real records, {prm['window']} in flight",
            "decode": "decode_records of one page in a loop, no I/O"}
    for (kind, size), c in ceil.items():
        if kind == "record_bytes":
            continue
        cp = c.get("cpu", {})
        t.add_row(kind, f"{size} B", _f(c["msgs_per_s"]), _f(c.get("spread"), "{:.0%}"),
                  _f(c["mb_per_s"], "{:,.1f}"), _f(c.get("wire_mb_per_s"), "{:,.1f}"), _f(c.get("p50_us")),
                  _f(c.get("p99_us")), "/".join(_f(cp.get(k)) for k in ("sink", "client", "others")), what[kind])
    console.print(t)
    t = Table(title=f"rmq end to end: broker group (nameserver, broker, reput, flush) + 1 client process; "
                    f"median of {prm['rounds']}; ratio = msgs/s / ceiling msgs/s", title_justify="left")
    for col in ("scenario", "msgs/s", "spread", "MB/s", "p50 µs", "p99 µs", "ceiling msgs/s", "ratio",
                "ceiling p50/p99 µs", "target (PERF.md §4)", "CPU % broker (main)/reput/flush/client/others"):
        t.add_column(col, justify="left" if col in ("scenario", "target (PERF.md §4)") else "right")
    for r in report["rows"]:
        cp = r.get("cpu", {})
        cpu = "/".join(_f(cp.get(k)) for k in ("broker", "reput", "flush", "client", "others"))
        if "broker_main" in cp:
            cpu = cpu.replace("/", f" ({_f(cp['broker_main'])})/", 1)
        ce_lat = f"{r['ceiling_p50_us']:,.0f}/{r['ceiling_p99_us']:,.0f}" if "ceiling_p50_us" in r else "-"
        tgt = r.get("target", "")
        if "target_met" in r:
            tgt += " [green]MET[/]" if r["target_met"] else " [red]MISSED[/]"
        name = r["scenario"] + (" [red](errors)[/]" if r.get("errors") or r.get("error") else "")
        ratio = f"{r['ratio']:.1%}"
        if "ratio_to_decode" in r:
            ratio += f"\n{r['ratio_to_decode']:.0%} of decode"
        t.add_row(name, _f(r["msgs_per_s"]), _f(r.get("spread"), "{:.0%}"), _f(r["mb_per_s"], "{:,.1f}"),
                  _f(r.get("p50_us")), _f(r.get("p99_us")), f"{r['ceiling']} {_f(r['ceiling_msgs_per_s'])}",
                  ratio, ce_lat, tgt, cpu)
    console.print(t)
    for r in report["rows"]:
        if r.get("errors") or r.get("error"):
            console.print(f"[red]{r['scenario']}: {r.get('errors') or r.get('error')}[/]")
    rb = {c["body_size"]: c["value"] for c in report["ceilings"] if c["kind"] == "record_bytes"}
    la, lb = report["loadavg_before"], report["loadavg_after"]
    console.print(f"Messages per produce round: {prm['n_msgs']}; CommitLog bytes per message: {rb}. "
                  f"Load average before {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, after {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}; "
                  f"wall {report['wall_seconds']} s on {report['cpus']} CPUs.  'others' = CPU used by every other "
                  f"process on the machine meanwhile (% of one core).")


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=DEFAULT_MESSAGES,
                    help="messages per produce round with 100 B bodies (1 KiB: a quarter)")
    ap.add_argument("--messages-1k", type=int, default=None, help="messages per produce round with 1 KiB bodies")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds of everything; medians reported")
    ap.add_argument("--single-seconds", type=float, default=DEFAULT_SINGLE_SECONDS)
    ap.add_argument("--ceiling-seconds", type=float, default=DEFAULT_CEILING_SECONDS)
    ap.add_argument("--file-size", type=int, default=DEFAULT_FILE_SIZE, help="mappedFileSizeCommitLog")
    ap.add_argument("--sizes", default=",".join(map(str, BODY_SIZES)), help="body sizes, e.g. 100,1024")
    ap.add_argument("--flush", default=",".join(FLUSH_TYPES), help="ASYNC_FLUSH,SYNC_FLUSH")
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("--queues", type=int, default=QUEUES)
    ap.add_argument("--dir", default=None, help="where the stores go (default: the system temp dir)")
    ap.add_argument("--json", default=None, help="write the figures as JSON to this file")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="py-spy record (raw collapsed stacks, idle included) during every timed phase")
    ap.add_argument("--profile-procs", default="broker", help="comma list of broker,reput,flush,client")
    ap.add_argument("--profile-native", action="store_true",
                    help="py-spy --native (Cython and libzmq frames too; pauses the process at every sample)")
    ap.add_argument("--fail-on-miss", action="store_true", help="exit 1 if a PERF.md target is missed")
    a = ap.parse_args(argv)
    p = Params(messages=a.messages, messages_1k=a.messages_1k, rounds=max(1, a.rounds), single_seconds=a.single_seconds,
               ceiling_seconds=a.ceiling_seconds, file_size=a.file_size,
               sizes=tuple(int(s) for s in a.sizes.split(",")), flush_types=tuple(a.flush.split(",")),
               window=a.window, queues=a.queues, store_dir=a.dir, profile_dir=a.profile,
               profile_procs=tuple(a.profile_procs.split(",")), profile_native=a.profile_native)
    report = run_all(p, log=lambda s: print(s, flush=True))
    print_report(report)
    if a.profile:
        print(f"\npy-spy profiles in {a.profile} (raw collapsed stacks; flamegraph.pl or speedscope read them):")
        for name in sorted(os.listdir(a.profile)):
            if name.endswith(".txt"):
                print("\n".join(summarize_profile(os.path.join(a.profile, name))))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    missed = [r["scenario"] for r in report["rows"] if r.get("target_met") is False]
    # a consume that did not get back exactly what was acknowledged fails the run; refused
    # sends (SYSTEM_BUSY flow control on an overloaded machine) are reported, not fatal
    failed = [r["scenario"] for r in report["rows"] if r.get("error")]
    return 1 if failed or (a.fail_on_miss and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
