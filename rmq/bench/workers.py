"""Client worker processes of ``rmq bench``: producers and consumers that report progress
while they run, and send back an HDR-style latency histogram.

They run under the worker loop of :mod:`rmq.bench.e2e` (same ready / go / done protocol, same
helpers: ``_dealer``, ``_ready``, ``_send_retrying_busy``, ``body_of``); the e2e commands
(``single``, ``sink``, ``batch``, ...) are available in the same processes."""
from __future__ import annotations

import math
import time

from rmq.bench import e2e as E
from rmq.bench.hist import Histogram
from rmq.common.pull_sys_flag import PULL_FLAG_SUSPEND

zmq = E.zmq
P = E.P
_cl = E._cl
Frame, RequestCode, ResponseCode = E.Frame, E.RequestCode, E.ResponseCode
TICK_S = 0.25


def _stop_requested(conn) -> bool:
    if conn.poll(0):
        return conn.recv() == "stop"
    return False


def w_produce(conn, endpoint: str, topic: str, body_size: int, n_msgs: int, seconds: float, batch: int,
              window: int, queues: list, linger_ms: float = 0.0, rate: float = 0.0) -> dict:
    """Batches of up to ``batch`` messages (SEND_BATCH_MESSAGE; SEND_MESSAGE when 1), ``window``
    requests in flight, round robin over ``queues``; stops after ``n_msgs`` or ``seconds``.
    ``rate`` > 0 paces message creation (msgs/s); then a batch leaves when full or when its
    first message is ``linger_ms`` old.  Latency = first message of the request created (paced)
    or request sent (unpaced) -> acknowledged, recorded once per message."""
    body = E.body_of(body_size)
    blobs: dict = {}
    s = E._dealer(endpoint)
    opaque = 0

    def request(q: int, n: int) -> list:
        nonlocal opaque
        opaque += 1
        fields = {"producerGroup": "bench_pg", "topic": topic, "queueId": q, "bornTimestamp": int(time.time() * 1000)}
        if n == 1:
            fields["properties"] = {}
            return P.encode(Frame(RequestCode.SEND_MESSAGE, opaque, 0, "", fields, [body]))
        if n not in blobs:
            blobs[n] = _cl.encode_batch([(body, b"", 0)] * n)
        return P.encode(Frame(RequestCode.SEND_BATCH_MESSAGE, opaque, 0, "", fields, [blobs[n]]))

    warm = {q: 0 for q in queues}
    for q in queues:
        E._send_retrying_busy(s, lambda: request(q, batch), warm, q)
    E._ready(conn)
    hist = Histogram()
    per_queue = {q: 0 for q in queues}
    errors: dict = {}
    inflight: dict = {}
    pc = time.perf_counter
    issued = acked = req_no = 0
    t0 = pc()
    deadline = t0 + seconds if seconds else math.inf
    next_tick = t0 + TICK_S
    linger = linger_ms / 1e3
    stopping = False
    while True:
        now = pc()
        if not stopping and (issued >= n_msgs or now >= deadline):
            stopping = True
        timeout = TICK_S
        while not stopping and len(inflight) < window:
            avail = (n_msgs if not rate else min(n_msgs, int(rate * (now - t0)))) - issued
            if avail <= 0:
                if rate:
                    timeout = min(timeout, max(0.0, t0 + (issued + 1) / rate - now))
                break
            n = min(batch, avail)
            born = t0 + issued / rate if rate else now
            if rate and n < batch and now - born < linger:
                # wait for the batch to fill, or for its linger to expire
                timeout = min(timeout, max(0.0, born + linger - now, t0 + (issued + batch) / rate - now))
                break
            q = queues[req_no % len(queues)]
            req_no += 1
            parts = request(q, n)
            inflight[opaque] = (born, n, q)
            s.send_multipart(parts, copy=False)
            issued += n
        if stopping and not inflight:
            break
        if s.poll(max(0, int(timeout * 1000)) if not stopping else 1000):
            while True:
                try:
                    r = P.decode(s.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
                got = inflight.pop(r.opaque, None)
                if got is None:
                    continue
                born, n, q = got
                if r.code == ResponseCode.SUCCESS:
                    hist.record(int((pc() - born) * 1e9), n)
                    per_queue[q] += n
                    acked += n
                else:
                    key = f"{ResponseCode(r.code).name}: {r.remark[:80]}"
                    errors[key] = errors.get(key, 0) + 1
        elif stopping and inflight and pc() - now > 30:
            raise TimeoutError(f"{len(inflight)} requests unanswered for 30 s")
        now = pc()
        if now >= next_tick:
            next_tick = now + TICK_S
            conn.send(("progress", {"t": now - t0, "msgs": acked}))
            if _stop_requested(conn):
                stopping = True
    el = pc() - t0
    s.close(0)
    return {"msgs": acked, "seconds": el, "payload_bytes": acked * body_size,
            "per_queue": {q: per_queue[q] + warm[q] for q in queues}, "warm_msgs": sum(warm.values()),
            "requests": req_no, "errors": errors, "hist": hist.to_dict(), **hist.stats()}


def w_consume(conn, endpoint: str, topic: str, body_size: int, queues: list, max_nums: int,
              suspend_ms: int = 100, drain_timeout_s: float = 60.0, group: str = "bench_cg") -> dict:
    """Pull ``queues`` from offset 0, one pull in flight per queue (long polling when caught
    up), every page decoded into MessageExt objects, until told ``stop`` and caught up with
    every queue.  Lag = the ConsumeQueue's max offset (in each pull response) - next offset."""
    s = E._dealer(endpoint)
    opaque = 0
    offsets = {q: 0 for q in queues}
    caught_up = {q: False for q in queues}
    lag = {q: 0 for q in queues}
    pending: dict = {}
    statuses: dict = {}

    def pull(q: int, n: int = max_nums) -> None:
        nonlocal opaque
        opaque += 1
        pending[opaque] = q
        s.send_multipart(P.encode(Frame(RequestCode.PULL_MESSAGE, opaque, 0, "", {
            "consumerGroup": group, "topic": topic, "queueId": q, "queueOffset": offsets[q], "maxMsgNums": n,
            "sysFlag": PULL_FLAG_SUSPEND, "suspendTimeoutMillis": suspend_ms, "subscription": "*"})), copy=False)

    E._ready(conn)
    pc = time.perf_counter
    got = nbytes = pages = bad = 0
    max_lag = 0
    t0 = t_last = pc()
    next_tick = t0 + TICK_S
    stopping = False
    stop_at = math.inf
    for q in queues:
        pull(q)
    while pending:
        if s.poll(int(TICK_S * 1000)):
            while True:
                try:
                    r = P.decode(s.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
                q = pending.pop(r.opaque, None)
                if q is None:
                    continue
                if r.code == ResponseCode.SUCCESS:
                    msgs = _cl.decode_records(r.bodies[0])
                    got += len(msgs)
                    nbytes += len(r.bodies[0])
                    pages += 1
                    t_last = pc()
                    if msgs[0].queue_offset != offsets[q] or len(msgs[0].body) != body_size:
                        bad += 1
                    offsets[q] = r.fields["nextBeginOffset"]
                    lag[q] = max(0, r.fields.get("maxOffset", offsets[q]) - offsets[q])
                    caught_up[q] = lag[q] == 0
                else:
                    name = ResponseCode(r.code).name
                    statuses[name] = statuses.get(name, 0) + 1
                    if r.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                                      ResponseCode.PULL_OFFSET_MOVED):
                        raise RuntimeError(f"pull of queue {q} at {offsets[q]}: {name} {r.remark}")
                    if r.code != ResponseCode.PULL_NOT_FOUND:
                        offsets[q] = r.fields.get("nextBeginOffset", offsets[q])
                    lag[q] = max(0, r.fields.get("maxOffset", offsets[q]) - offsets[q])
                    caught_up[q] = r.code == ResponseCode.PULL_NOT_FOUND and lag[q] == 0
                if not (stopping and (caught_up[q] or pc() > stop_at)):
                    pull(q)
        now = pc()
        total_lag = sum(lag.values())
        max_lag = max(max_lag, total_lag)
        if now >= next_tick:
            next_tick = now + TICK_S
            conn.send(("progress", {"t": now - t0, "msgs": got, "lag": total_lag}))
            if not stopping and _stop_requested(conn):
                stopping = True
                stop_at = now + drain_timeout_s
    el = max(t_last - t0, 1e-9)
    s.close(0)
    return {"msgs": got, "seconds": el, "payload_bytes": got * body_size, "wire_bytes": nbytes, "pages": pages,
            "bad_pages": bad, "statuses": statuses, "offsets": offsets, "final_lag": sum(lag.values()),
            "max_lag": max_lag}


COMMANDS = {**E.WORKER_COMMANDS, "produce": w_produce, "consume": w_consume}


def worker_main(conn) -> None:
    """:func:`rmq.bench.e2e._worker_main` over :data:`COMMANDS`."""
    E._worker_main(conn, COMMANDS)


class Worker(E.Worker):
    """:mod:`rmq.bench.e2e`'s spawned worker, running :data:`COMMANDS`; progress reports are kept
    (``self.progress``: list of dicts, newest last) instead of being taken for results."""

    def __init__(self, name: str):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.name = name
        self.progress: list = []
        self.done = None
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child,), name=f"bench-{name}", daemon=True)
        self.proc.start()
        child.close()

    def _get(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"worker {self.name}: nothing within {timeout} s")
            kind, val = self.conn.recv()
            if kind == "progress":
                self.progress.append(val)
                continue
            if kind == "error":
                raise RuntimeError(f"worker {self.name} failed:\n{val}")
            return kind, val

    def pump(self) -> bool:
        """Take every report waiting, without blocking; True once the command's result is in."""
        while self.done is None and self.conn.poll(0):
            kind, val = self.conn.recv()
            if kind == "progress":
                self.progress.append(val)
            elif kind == "error":
                raise RuntimeError(f"worker {self.name} failed:\n{val}")
            else:
                self.done = val
        return self.done is not None

    def stop(self) -> None:
        try:
            self.conn.send("stop")
        except (OSError, BrokenPipeError):
            pass
