"""The machine's ceilings, measured in the same run as rmq:

* ``memcpy_mmap``: memcpy into a pre-touched mmap'd file (``bench/bench_store.py``'s
  ceiling scenario when importable -- a source checkout -- else the same loop here);
* ``fdatasync``: append + fdatasync, 4 KiB groups (one small group commit) and groups of
  ``batch`` x body bytes (a batch's CommitLog bytes): syncs/s, p50 / p99 per sync, MB/s;
* the raw pyzmq loopback ceilings of :mod:`rmq.bench.e2e` (``frame``, ``stream``, ``batch``,
  ``rtt``, ``pages``, ``decode``) with the same frame sizes and shapes as the broker."""
from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time

from rmq.bench import e2e as E
from rmq.bench.hist import time_calls

MB = 1e6


def memcpy_mmap(nbytes: int = 256 << 20, store_dir=None) -> dict:
    try:
        os.environ.setdefault("RMQ_BENCH_FILE_SIZE", str(nbytes))
        if store_dir:
            os.environ.setdefault("RMQ_BENCH_DIR", store_dir)
        from bench import bench_store as bs       # a source checkout on sys.path; imports pytest

        n = min(nbytes, bs.FILE_SIZE)
        secs = bs.time_round(bs.ceiling_scenario("write", n))
        return {"what": "memcpy write, 1 MiB chunks into a pre-touched MappedFile (bench_store)",
                "bytes": n, "seconds": secs, "mb_per_s": n / secs / MB}
    except ImportError:
        pass
    d = tempfile.mkdtemp(prefix="rmq-bench-memcpy-", dir=store_dir)
    try:
        path = os.path.join(d, "f")
        with open(path, "w+b") as f:
            f.truncate(nbytes)
            m = mmap.mmap(f.fileno(), nbytes)
        chunk = b"\x5a" * (1 << 20)
        mv = memoryview(m)
        for off in range(0, nbytes, 1 << 20):      # pre-touch
            mv[off:off + (1 << 20)] = chunk
        t0 = time.perf_counter()
        for off in range(0, nbytes, 1 << 20):
            mv[off:off + (1 << 20)] = chunk
        secs = time.perf_counter() - t0
        mv.release()
        m.close()
        return {"what": "memcpy write, 1 MiB chunks into a pre-touched mmap", "bytes": nbytes, "seconds": secs,
                "mb_per_s": nbytes / secs / MB}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fdatasync_rate(group_bytes: int, seconds: float, store_dir=None) -> dict:
    """Append ``group_bytes`` + fdatasync in a loop for ``seconds``: syncs/s, latency per sync."""
    d = tempfile.mkdtemp(prefix="rmq-bench-sync-", dir=store_dir)
    try:
        fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        buf = b"\xa5" * group_bytes
        def append_and_sync():
            os.write(fd, buf)
            os.fdatasync(fd)
        for _ in range(5):
            append_and_sync()
        n, el, h = time_calls(append_and_sync, seconds)
        os.close(fd)
        return {"what": f"append {group_bytes:,} B + fdatasync", "group_bytes": group_bytes, "syncs": n,
                "seconds": el, "syncs_per_s": n / el, "mb_per_s": n * group_bytes / el / MB, **h.stats()}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def measure(sizes, batch: int, window: int, seconds: float, store_dir=None, log=print) -> dict:
    out: dict = {"memcpy_mmap": memcpy_mmap(store_dir=store_dir)}
    log(f"  memcpy into mmap: {out['memcpy_mmap']['mb_per_s']:,.0f} MB/s")
    out["fdatasync"] = []
    for gb in sorted({4096, *(batch * (s + 119) for s in sizes)}):   # ~ a batch's CommitLog bytes
        r = fdatasync_rate(gb, seconds, store_dir)
        out["fdatasync"].append(r)
        log(f"  append {gb:>9,} B + fdatasync: {r['syncs_per_s']:,.0f} syncs/s {r['mb_per_s']:,.0f} MB/s "
            f"p50 {r['p50_us']:.0f} us p99 {r['p99_us']:.0f} us")
    p = E.Params(rounds=1, sizes=tuple(sizes), ceiling_seconds=seconds, batch=batch, window=window,
                 store_dir=store_dir)
    z = E.measure_ceilings(p, log=log)
    out["pyzmq"] = [{"kind": k, "body_size": s, **v} if isinstance(v, dict) else {"kind": k, "body_size": s, "value": v}
                    for (k, s), v in z.items()]
    return out


def pyzmq_lookup(ceilings: dict, kind: str, size: int):
    for c in ceilings.get("pyzmq", []):
        if c["kind"] == kind and c["body_size"] == size:
            return c
    return None
