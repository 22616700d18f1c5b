"""pytest-benchmark wrapper of bench/e2e.py: the same scenarios at small sizes.

Run::

    python -m pytest bench/bench_e2e.py --benchmark-only -q

Each test times one scenario with ``benchmark.pedantic(setup=..., rounds=1, iterations=1)``:
the setup (untimed) readies the client process and waits for the broker group to go
idle; the timed function tells the client to go and waits for its figures, so
pytest-benchmark's own time includes a pipe round trip; the figures quoted are the
ones the client measured, put in ``extra_info`` (``msgs_per_s``, ``mb_per_s``,
``p50_us`` / ``p99_us``, ``ceiling``, ``ceiling_msgs_per_s``, ``ratio``, ``target``,
``cpu``) and printed as a table at the end of the session.

The ceilings run first (``test_ceiling``); the broker-group tests use them for their
ratio, measuring any that did not run.  One broker group per (flush type, body size)
is started for its three tests (module-scoped, parametrized fixture: pytest runs the
tests of one group together, then stops it).

Environment: ``RMQ_E2E_MESSAGES`` (100 B messages per produce run, default 100 000;
1 KiB runs a quarter), ``RMQ_E2E_SECONDS`` (each ceiling and the single-message runs,
default 0.5), ``RMQ_E2E_FILE_SIZE`` (CommitLog file size, default 64 MiB),
``RMQ_BENCH_DIR`` (where the stores go).
"""
from __future__ import annotations

import os

import pytest

import e2e

SECONDS = float(os.environ.get("RMQ_E2E_SECONDS", "0.5"))
PARAMS = e2e.Params(messages=int(os.environ.get("RMQ_E2E_MESSAGES", "100000")), rounds=1, single_seconds=SECONDS,
                    ceiling_seconds=SECONDS, file_size=int(os.environ.get("RMQ_E2E_FILE_SIZE", str(64 << 20))),
                    store_dir=os.environ.get("RMQ_BENCH_DIR") or None)

_ROWS: list = []          # (label, row) for the summary
_CEILINGS: dict = {}      # (kind, size) -> row


class _Summary:
    """Registered once as a plugin: prints msgs/s, MB/s, latency and ratios at the end."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _ROWS:
            return
        tr = terminalreporter
        tr.section("rmq end to end: msgs/s, MB/s, send latency, ratio to the raw pyzmq ceiling (same run)")
        head = (f"{'scenario':<30} {'msgs/s':>12} {'MB/s':>9} {'p50 us':>8} {'p99 us':>8}  "
                f"{'ceiling':<8} {'ceil msgs/s':>12} {'ratio':>7}  target / met  cpu %")
        tr.write_line(head)
        tr.write_line("-" * len(head))
        for label, r in _ROWS:
            tgt = f"{r['target']}: {'MET' if r['target_met'] else 'MISSED'}" if "target" in r else ""
            p50 = f"{r['p50_us']:,.0f}" if "p50_us" in r else "-"
            p99 = f"{r['p99_us']:,.0f}" if "p99_us" in r else "-"
            ceil = r.get("ceiling", "")
            cm = f"{r['ceiling_msgs_per_s']:,.0f}" if "ceiling_msgs_per_s" in r else "-"
            ratio = f"{r['ratio']:.1%}" if "ratio" in r else "-"
            tr.write_line(f"{label:<30} {r['msgs_per_s']:>12,.0f} {r['mb_per_s']:>9,.1f} {p50:>8} {p99:>8}  "
                          f"{ceil:<8} {cm:>12} {ratio:>7}  {tgt}  {r.get('cpu', '')}")


@pytest.fixture(scope="session", autouse=True)
def _e2e_summary(request):
    pm = request.config.pluginmanager
    if pm.get_plugin("rmq-e2e-summary") is None:
        pm.register(_Summary(), "rmq-e2e-summary")
    yield


@pytest.fixture(scope="session")
def ceiling_bench():
    cb = e2e.CeilingBench(PARAMS)
    yield cb
    cb.close()


def _ceilings(ceiling_bench, size: int) -> dict:
    """Every ceiling of ``size``, measuring those no test_ceiling measured yet."""
    for kind in e2e.CEILING_KINDS:
        if (kind, size) not in _CEILINGS:
            _CEILINGS[(kind, size)] = ceiling_bench.measure(kind, size)
    return _CEILINGS


def _record(benchmark, label: str, row: dict) -> None:
    for k, v in row.items():
        if isinstance(v, (int, float, str, bool)) or k == "cpu":
            benchmark.extra_info[k] = v
    _ROWS.append((label, row))


@pytest.mark.parametrize("size", PARAMS.sizes, ids=lambda s: f"{s}B")
@pytest.mark.parametrize("kind", e2e.CEILING_KINDS)
def test_ceiling(benchmark, ceiling_bench, kind, size):
    row = benchmark.pedantic(ceiling_bench.measure, args=(kind, size), rounds=1, iterations=1)
    _CEILINGS[(kind, size)] = row
    assert row["msgs"] > 0
    _record(benchmark, f"ceiling {kind} {size} B", row)


@pytest.fixture(scope="module", params=[(f, s) for f in PARAMS.flush_types for s in PARAMS.sizes],
                ids=lambda fs: f"{fs[0].split('_')[0].lower()}-{fs[1]}B")
def group(request):
    flush, size = request.param
    cb = e2e.ClusterBench(PARAMS, flush, size, log=lambda s: None)
    yield cb
    cb.close()


def _scenario(benchmark, ceiling_bench, group, kind: str) -> dict:
    # untimed setup: the client's warm-up requests, waiting for the group to go idle (and, for
    # consume, producing first if test_produce did not run, and waiting for the dispatch)
    benchmark.pedantic(group.fire, setup=lambda: group.stage(kind), rounds=1, iterations=1)
    row = e2e.finish_row(group.finish(), kind, group.flush, group.size, _ceilings(ceiling_bench, group.size))
    _record(benchmark, row["scenario"], row)
    return row


def test_produce(benchmark, ceiling_bench, group):
    row = _scenario(benchmark, ceiling_bench, group, "produce")
    assert not row["errors"], row["errors"]
    assert row["msgs"] == group.p.n_msgs(group.size)


def test_consume(benchmark, ceiling_bench, group):
    row = _scenario(benchmark, ceiling_bench, group, "consume")
    assert "error" not in row, row["error"]
    assert row["msgs"] == row["expected"]


def test_single(benchmark, ceiling_bench, group):
    row = _scenario(benchmark, ceiling_bench, group, "single")
    assert not row["errors"], row["errors"]
    assert row["msgs"] > 0
