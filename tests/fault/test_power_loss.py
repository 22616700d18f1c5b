"""T1b: simulated power loss under SYNC_FLUSH (RELIABILITY.md §4.2).

Each cycle: the broker group runs with ``RMQ_DURABILITY_TRACE=1`` (the sync wrapper journals
every sync that returned 0 to ``STORE/.durable``); 4 producers x 4 queues send for a seeded
0.3-1.5 s; then every process of the group is SIGKILLed and, in most cycles, the store is
rewritten as a power cut could have left it (tests/fault/harness.py ``power_cut``: durable
bytes kept, every page above independently kept / zeroed / reverted / garbled, one page torn,
files created since their directory's last fsync removed).  Some cycles are a plain kill -9
(page cache kept) so that a later cut also hits data recovery accepted from the page cache.
The group restarts; every acknowledged send must be read back, in order, once.

Per-commit: RMQ_POWER_CUTS (default 5).  Slow (``-m slow``): RMQ_POWER_CUTS_SLOW (default 200).
Replay: ``RMQ_FAULT_SEED=<seed> pytest tests/fault/test_power_loss.py``.
"""
import random
import time

import pytest

from tests.conftest import env_int
from tests.fault.harness import (History, Workload, acked_commitlog_end, check, fault_seed, power_cut, result_line,
                                 snapshot, wait_readable)
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.fault
QUEUES = 4
PRODUCERS = 4
TOPIC = "PowerCut"
COMMITLOG_FILE_SIZE = 64 * 1024


def power_cut_loop(tmp_path, monkeypatch, cuts, seed):
    monkeypatch.setenv("RMQ_DURABILITY_TRACE", "1")
    rng = random.Random(seed)
    store = str(tmp_path / "store")
    history = History()
    work = Workload(history, TOPIC, PRODUCERS, QUEUES, seed=seed, timeout_ms=2000)
    conf = {"flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": str(COMMITLOG_FILE_SIZE),
            "mappedFileSizeConsumeQueue": str(20 * 256), "maxHashSlotNum": "256", "maxIndexNum": "1024"}
    c = Cluster(store, conf=conf, with_namesrv=False)
    totals = {"cuts": 0, "kills_only": 0, "restart_failures": 0, "pages_torn": 0, "pages_garbled": 0,
              "pages_zeroed": 0, "pages_reverted": 0, "files_removed": 0, "untracked_files_damaged": 0,
              "commitlog_pages_past_acked": 0}
    recovery_ms = []
    first_bad = None
    old = None
    res = {}
    try:
        done = cycle = 0
        while done < cuts:
            cycle += 1
            work.start(c.broker)
            time.sleep(rng.uniform(0.3, 1.5))
            c.kill_group()
            work.stop()
            if (cycle % 3 == 2 or rng.random() < 0.15) and done + 1 < cuts:
                totals["kills_only"] += 1          # page cache survives: the next cut tests what recovery kept
            else:
                bound = acked_commitlog_end(store, history, COMMITLOG_FILE_SIZE)
                stats = power_cut(store, rng, old, commitlog_durable=bound)
                for k, v in stats.items():
                    if k in totals:
                        totals[k] += v
                totals["cuts"] += 1
                done += 1
            old = snapshot(store)
            t0 = time.monotonic()
            try:
                c.start_group()
            except RuntimeError as e:
                totals["restart_failures"] += 1
                raise AssertionError(f"restart after cut {done} failed (seed {seed}): {e}")
            reads = wait_readable(c.broker, TOPIC, QUEUES, history, timeout_s=60)
            recovery_ms.append((time.monotonic() - t0) * 1000)
            res = check(history, reads)
            if first_bad is None and (res["lost"] or res["reordered"] or res["unexpected"] or res["dup_acked"]
                                      or res["aborted_reads"]):
                first_bad = {"cut": done, **res}
                break
    finally:
        c.close()
    recovery_ms.sort()
    p = lambda q: round(recovery_ms[min(len(recovery_ms) - 1, int(q * len(recovery_ms)))]) if recovery_ms else 0
    ok = first_bad is None and totals["restart_failures"] == 0
    result_line("T1b", seed, f"acked messages lost after {totals['cuts']} simulated power cuts: {res.get('lost', 0)} "
                             f"({res.get('acked', 0):,} acked)",
                ok, flush="SYNC_FLUSH", **totals, **{k: v for k, v in res.items() if k != "lost_ids"},
                recovery_ms_p50=p(0.5), recovery_ms_p99=p(0.99))
    assert first_bad is None, f"seed {seed}: {first_bad}"
    return res


def test_power_cuts_fast(tmp_path, monkeypatch):
    res = power_cut_loop(tmp_path, monkeypatch, env_int("RMQ_POWER_CUTS", 3), fault_seed(20240801))
    assert res["acked"] > 0


CUTS_PER_STORE = 20     # the checker re-reads the whole store after every cut: fresh stores bound that


@pytest.mark.slow
@pytest.mark.timeout(5400)          # 200 cuts: ~10 stores x 20 cuts, ~3 min each on 2 cores
def test_power_cuts_slow(tmp_path, monkeypatch):
    total = env_int("RMQ_POWER_CUTS_SLOW", 200)
    seed = fault_seed(20240802)
    acked = lost = cuts = 0
    for r in range(-(-total // CUTS_PER_STORE)):
        n = min(CUTS_PER_STORE, total - cuts)
        res = power_cut_loop(tmp_path / f"store{r}", monkeypatch, n, seed + r)   # asserts 0 lost per store
        acked += res.get("acked", 0)
        lost += res.get("lost", 0)
        cuts += n
    print(f"acked messages lost after {cuts} simulated power cuts: {lost} ({acked:,} acked, "
          f"{-(-total // CUTS_PER_STORE)} stores, seeds {seed}..{seed + r})")
