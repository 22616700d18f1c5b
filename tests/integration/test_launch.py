"""Every process rmq starts imports the *installed* ``rmq``, whatever the current directory holds.

Issue 19: ``pip install ".[spark]" && rmq demo flights`` typed in the repository root failed,
because children started with ``python -m rmq...`` put the current directory first on
``sys.path`` and imported the checkout's ``rmq/`` (no compiled ``rmq._core`` after a
non-editable install).  Here the current directory holds a decoy ``rmq/`` package whose import
raises; every launcher (rmq.testing's actors, ``rmq start --detach`` and its supervisor's
actors, ``rmq demo flights`` and its Spark workers) must start from it all the same.  No
install is needed to reproduce the failure: the decoy shadows the editable install the same way
the source tree shadowed the installed package.
"""
import os
import re
import subprocess
import sys
import time

import pytest

from rmq import Message, Producer, PullConsumer
from rmq.launch import SAFE_PATH_ENV, child_env, python_argv
from rmq.testing import Cluster
from tests.test_flights import _missing as spark_stack_missing

pytestmark = pytest.mark.integration

DECOY = "raise ImportError('decoy rmq imported from the current directory: ' + __file__)\n"


@pytest.fixture
def decoy_cwd(tmp_path):
    """A directory holding ``rmq/__init__.py`` that raises on import."""
    d = tmp_path / "cwd"
    (d / "rmq").mkdir(parents=True)
    (d / "rmq" / "__init__.py").write_text(DECOY)
    return str(d)


def test_decoy_shadows_without_safe_path(decoy_cwd):
    """The decoy works: a plain ``python -m rmq...`` in that directory imports it (what every
    launcher did before) -- so the tests below can fail."""
    p = subprocess.run([sys.executable, "-m", "rmq.launch"], cwd=decoy_cwd, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "decoy rmq imported" in p.stderr, p.stderr[-2000:]
    ok = subprocess.run(python_argv("rmq.launch"), cwd=decoy_cwd, capture_output=True, text=True, timeout=60,
                        env=child_env())
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_testing_cluster_in_decoy_cwd(tmp_path, decoy_cwd):
    """rmq.testing.Cluster's actors (nameserver, broker, reput, flush, ha) start in the decoy's
    directory and serve a send and a pull."""
    c = Cluster(tmp_path / "store", with_ha=True, cwd=decoy_cwd)
    try:
        with Producer(c.namesrv_addr, group="launch-pg") as p:
            r = p.send(Message("LaunchT", b"from the installed package"))
        assert r.status.name == "SEND_OK"
        with PullConsumer(c.namesrv_addr, group="launch-cg") as pc:
            mq = next(q for q in pc.fetch_subscribe_message_queues("LaunchT") if q.queue_id == r.queue_id)
            bodies = []
            deadline = time.monotonic() + 60           # reput dispatches asynchronously: long-poll until it has
            while not bodies and time.monotonic() < deadline:
                res = pc.pull_block_if_not_found(mq, "*", offset=r.queue_offset, max_nums=1)
                bodies = [m.body for m in res.msg_found_list]
        assert bodies == [b"from the installed package"]
    finally:
        c.close()


def _rmq(args, cwd, timeout=120):
    """``rmq ARGS`` as the console script runs it: ``sys.path[0]`` is the script's directory, not
    ``cwd`` (``-P`` here), and nothing in the environment asks for safe-path mode, so only the
    launchers' own care keeps the supervisor, actors and Spark workers off the decoy."""
    env = {k: v for k, v in os.environ.items() if k != SAFE_PATH_ENV}
    return subprocess.run(python_argv("rmq.cli", *args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_rmq_start_detach_in_decoy_cwd(tmp_path, decoy_cwd):
    """``rmq start --detach`` (a detached supervisor and its actors) in the decoy's directory:
    every actor reports started, the broker takes a message, ``rmq stop`` stops it cleanly."""
    store = str(tmp_path / "store")
    started = _rmq(["start", "--store-path", store, "--detach", "--namesrv-addr", "127.0.0.1:0",
                    "--listen-port", "0"], decoy_cwd)
    try:
        assert started.returncode == 0, f"{started.stdout}\n{started.stderr}\n" + _log_tail(store)
        names = set(re.findall(r"^started (\w+) pid \d+", started.stdout, re.M))
        assert names == {"nameserver", "broker", "reput", "flush", "cleaner", "ha"}, started.stdout
        namesrv = re.search(r"^started nameserver pid \d+ tcp://(\S+)$", started.stdout, re.M).group(1)
        with Producer(namesrv, group="launch-pg") as p:
            assert p.send(Message("LaunchT", b"x")).status.name == "SEND_OK"
    finally:
        stopped = _rmq(["stop", "--store-path", store], decoy_cwd)
    assert stopped.returncode == 0 and "stopped cleanly" in stopped.stdout, stopped.stdout + stopped.stderr
    assert "decoy rmq imported" not in _log_tail(store, 100_000)


def _log_tail(store, n=4000) -> str:
    out = []
    logs = os.path.join(store, "logs")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else ():
        with open(os.path.join(logs, name), errors="replace") as f:
            out.append(f"--- {name}\n{f.read()[-n:]}")
    return "\n".join(out)


@pytest.mark.slow
@pytest.mark.spark
def test_flights_demo_in_decoy_cwd(tmp_path, decoy_cwd):
    """``rmq demo flights`` (a supervisor started by the demo, and Spark's Python workers, which
    the JVM starts as ``python -m pyspark.daemon`` in the driver's directory) in the decoy's
    directory: every check of the demo passes.

    Slow tier (about 85 s on 2 cores): every CI run already runs the whole demo from the
    repository root (README's first command), a directory whose uncompiled ``rmq/`` is exactly
    this decoy; the fast tier keeps the supervisor's side (test_rmq_start_detach_in_decoy_cwd)."""
    missing = spark_stack_missing()
    if missing:
        pytest.fail(f"rmq demo flights needs {', '.join(missing)} (install the spark extra and Java 17)")
    p = _rmq(["demo", "flights", "--limit", "2000", "--output", str(tmp_path / "out"),
              "--store-path", str(tmp_path / "store")], decoy_cwd, timeout=600)
    assert p.returncode == 0, f"exit code {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-4000:]}"
    assert re.search(r"^OK: ", p.stdout, re.M), p.stdout[-4000:]
    assert "decoy rmq imported" not in p.stdout + p.stderr
    # the outputs (tests/test_flights.py's checks): Parquet tables of every flight read, the chart;
    # the store given with --store-path is kept and its supervisor stopped cleanly
    from tests.test_flights import check_outputs
    check_outputs(tmp_path / "out", 2000)
    assert (tmp_path / "store" / "commitlog").is_dir()
    assert not (tmp_path / "store" / "abort").exists()


def test_a_failing_actor_logs_its_traceback_and_the_test_harness_keeps_its_stderr(tmp_path):
    """An actor whose loop raises logs "<name> failed" with the traceback to its own log before
    "stopped" (its stderr was the only record), and rmq.testing.ActorProcess appends the child's
    stderr to ``stderr_path`` (rmq.testing.Cluster: <store>/logs/<name>.stderr.log)."""
    from rmq.testing import ActorProcess
    store = tmp_path / "store"
    code = ("from rmq.actors.actor import Actor\n"
            "class Boom(Actor):\n"
            "    name = 'boom'\n"
            "    def on_start(self):\n"
            "        raise RuntimeError('boom in on_start')\n"
            f"Boom(store_path={str(store)!r}).run()\n")
    err = store / "logs" / "boom.stderr.log"
    with pytest.raises(RuntimeError, match="did not start"):
        ActorProcess(["-c", code], stderr_path=str(err))
    assert "RuntimeError: boom in on_start" in err.read_text()
    log = (store / "logs" / "boom.log").read_text()
    assert "boom failed" in log and "RuntimeError: boom in on_start" in log
    assert log.index("boom failed") < log.index("boom stopped")
