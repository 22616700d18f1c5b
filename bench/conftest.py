"""Shared fixtures of the benchmarks under bench/.

* ``bench_*.py`` files are collected as test modules (the project's pytest
  config only collects ``test_*.py`` under ``tests/``), so
  ``python -m pytest bench --benchmark-only`` runs every benchmark here;
* ``ceiling_mb_s(kind, nbytes, span=None)``: the memcpy ceiling (MB/s, median of the
  rounds) of ``nbytes`` into ("write") / out of ("read") a same-kind mapping,
  measured once per (kind, size) in this session;
* a terminal summary of the store benchmarks as msgs/s, MB/s and ratio to
  the ceiling (pytest-benchmark's own table only shows times).
"""
from __future__ import annotations

import statistics

import pytest


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session")
def ceiling_mb_s():
    import bench_store as bs

    cache: dict = {}

    def get(kind: str, nbytes: int, span=None) -> float:
        key = (kind, nbytes, span)
        if key not in cache:
            sc = bs.ceiling_scenario(kind, nbytes, span)
            secs = [bs.time_round(sc) for _ in range(bs.ROUNDS)]
            cache[key] = nbytes / statistics.median(secs) / bs.MB
        return cache[key]

    return get


@pytest.fixture(scope="session")
def shared_read_stores():
    """The filled + dispatched stores the read benchmarks share; closed at session end."""
    import bench_store as bs

    yield bs._SharedStore
    bs._SharedStore.close_all()


_RESULTS: list = []


@pytest.fixture(scope="session")
def store_bench_results():
    return _RESULTS


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    tr = terminalreporter
    tr.section("rmq store: msgs/s, MB/s, ratio to the memcpy ceiling (median of rounds)")
    head = f"{'scenario':<44} {'msgs/s':>12} {'MB/s':>9} {'ceiling MB/s':>13} {'ratio':>7}  target / met"
    tr.write_line(head)
    tr.write_line("-" * len(head))
    for label, d in _RESULTS:
        msgs = f"{d['msgs_per_s']:,}" if d.get("msgs_per_s") else "-"
        tgt = ""
        if "target" in d:
            tgt = f"{d['target']}: {'MET' if d['target_met'] else 'MISSED'}"
        tr.write_line(f"{label:<44} {msgs:>12} {d['mb_per_s']:>9,.1f} "
                      f"{d['ceiling_mb_per_s']:>9,.1f} ({d['ceiling'][0]}) {d['ratio_to_ceiling']:>7.1%}  {tgt}")
