"""Run the official RocketMQ 5 Python client (PyPI ``rocketmq-python-client==5.1.2``, gRPC) from the
tests, through tests/integration/grpc_client.py in a process of its own.

The 5.x client cannot live in the test venv: it installs a top-level ``rocketmq`` package, the
same name as the C++ client (``rocketmq==0.4.4``) the remoting-proxy tests use.  So it is
installed once per machine, with its dependencies (grpcio, grpcio-tools, protobuf>=6.33.5,
opentelemetry-*), by ``python -m pip install --target DIR``, into::

    $RMQ_TEST_CACHE (default ~/.cache/rmq-tests)/rocketmq-python-client-5.1.2/<cache tag>-<machine>

(e.g. ``.../cpython-311-x86_64``: grpcio is a compiled wheel, so each interpreter gets its own
copy), under an ``fcntl`` lock beside it so parallel runs do not race.  pip writes into a
scratch directory that is checked (``grpc_client.py version`` must import ``rocketmq.v5``,
``grpc`` and ``google.protobuf`` from it) and then renamed into place, with a marker file:
an interrupted install leaves nothing that looks installed.  The driver runs with that
directory first on PYTHONPATH, so its ``rocketmq``, ``grpc`` and ``google.protobuf`` shadow
whatever the venv has.

A failed install FAILS the fixture (``pytest.fail`` with pip's output), never skips: CI runs
with ``RMQ_REQUIRE_ALL=1`` and the registry is reachable there.

    def test_x(grpc_client_path, ...):
        out = grpc_client("produce", endpoint, topic, 10)
        out = grpc_client("produce", "127.0.0.1:1", "T", 1, expect_code=3)
"""
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

import pytest

CLIENT_PACKAGE = "rocketmq-python-client"
CLIENT_VERSION = "5.1.2"
CACHE_ENV = "RMQ_TEST_CACHE"
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "grpc_client.py")
MARKER = ".rmq-installed.json"
INSTALL_TIMEOUT_S = 900
PROBE_TIMEOUT_S = 60
EXIT_CLIENT_ERROR = 3            # grpc_client.py: the client raised


class InstallFailed(Exception):
    """pip failed, or what it installed does not import; the message says what happened."""


def cache_root() -> str:
    """``$RMQ_TEST_CACHE``, else ``~/.cache/rmq-tests``."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "rmq-tests")


def install_dir() -> str:
    """Where this interpreter's copy of the client lives (it may not exist yet)."""
    return os.path.join(cache_root(), f"{CLIENT_PACKAGE}-{CLIENT_VERSION}",
                        f"{sys.implementation.cache_tag}-{platform.machine()}")


def driver_env(target: str, home: Optional[str] = None) -> dict:
    """The driver's environment: ``target`` first on PYTHONPATH (then the caller's entries), no user
    site-packages, safe-path mode, HOME at ``home`` (the client writes its log under ~/logs)."""
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != target]
    env["PYTHONPATH"] = os.pathsep.join([target, *rest])
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONSAFEPATH"] = "1"
    if home is not None:
        env["HOME"] = home
    return env


def _run_driver(target: str, args, timeout: float, home: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", DRIVER, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=driver_env(target, home), stdin=subprocess.DEVNULL)


def probe(target: str) -> dict:
    """``grpc_client.py version`` against ``target``; raises :class:`InstallFailed` unless the client,
    grpc and protobuf all import from ``target``.  Returns the driver's JSON."""
    with tempfile.TemporaryDirectory(prefix="rmq-grpc-home-") as home:
        try:
            r = _run_driver(target, ["version"], PROBE_TIMEOUT_S, home)
        except subprocess.TimeoutExpired:
            raise InstallFailed(f"`grpc_client.py version` hung for {PROBE_TIMEOUT_S} s against {target}") from None
    try:
        out = json.loads(r.stdout)
    except ValueError:
        out = None
    if r.returncode != 0 or not isinstance(out, dict) or "error" in out:
        raise InstallFailed(f"the client installed in {target} does not import (exit {r.returncode}): "
                            f"{r.stdout[-1500:]} {r.stderr[-1500:]}")
    real = os.path.realpath(target) + os.sep
    strays = {m: f for m, f in out["files"].items() if not os.path.realpath(f).startswith(real)}
    if strays or out["client_version"] != CLIENT_VERSION:
        raise InstallFailed(f"the driver did not load the client from {target}: version {out['client_version']}, "
                            f"modules from elsewhere: {strays}")
    return out


def _pip_install(into: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_TARGET", "PIP_PREFIX", "PIP_USER")}
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--no-warn-script-location", "--target", into, f"{CLIENT_PACKAGE}=={CLIENT_VERSION}"]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InstallFailed(f"`{' '.join(cmd)}` did not finish in {INSTALL_TIMEOUT_S} s") from None
    if r.returncode != 0:
        raise InstallFailed(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return time.monotonic() - t0


def _installed(target: str) -> bool:
    try:
        with open(os.path.join(target, MARKER)) as f:
            return json.load(f).get("version") == CLIENT_VERSION
    except (OSError, ValueError):
        return False


def ensure_installed(verify: bool = True) -> str:
    """Install the client into :func:`install_dir` unless it is there; returns that directory.

    Holds an exclusive ``fcntl`` lock (``<dir>.lock``) while it checks and installs, so concurrent
    test runs install once.  ``verify``: also probe an existing install (about 0.3 s); a broken
    one is removed and installed again.  Raises :class:`InstallFailed`.
    """
    target = install_dir()
    if _installed(target) and not verify:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(target):
            try:
                probe(target)
                return target
            except InstallFailed:
                pass                                    # broken: install again below
        scratch = f"{target}.tmp-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            seconds = _pip_install(scratch)
            out = probe(scratch)
            with open(os.path.join(scratch, MARKER), "w") as f:
                json.dump({"version": CLIENT_VERSION, "install_seconds": round(seconds, 1), "python": sys.version,
                           "grpc": out["grpc"], "protobuf": out["protobuf"], "installed_at": time.time()}, f)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        probe(target)                                   # the files moved: check the final place too
    return target


def install_info(target: Optional[str] = None) -> dict:
    """The marker written at install: version, install_seconds, python, grpc, protobuf, installed_at."""
    with open(os.path.join(target or install_dir(), MARKER)) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def grpc_client_path() -> str:
    """The directory holding ``rocketmq-python-client`` 5.1.2 and its dependencies (installed on
    first use, once per machine).  Fails, never skips, when it cannot be installed."""
    try:
        return ensure_installed()
    except InstallFailed as e:
        why = str(e)                                    # failed outside the handler: no chained traceback
    pytest.fail(f"cannot install {CLIENT_PACKAGE}=={CLIENT_VERSION} for the gRPC tests "
                f"(into {install_dir()}; set {CACHE_ENV} to move it): {why}", pytrace=False)


def grpc_client(*args, timeout: float = 180, expect_code: int = 0, target: Optional[str] = None) -> dict:
    """Run ``grpc_client.py *args`` (its modes: produce, receive, change-invisible, transaction,
    version) and return its JSON; asserts its exit code is ``expect_code`` (0, or 3 for a client
    error), with the driver's stderr and the client's log in the message otherwise.

    ``timeout`` (s) bounds the whole process.  ``target`` defaults to :func:`ensure_installed`
    (request the ``grpc_client_path`` fixture so the install happens, or fails, at setup)."""
    target = target or ensure_installed(verify=False)
    with tempfile.TemporaryDirectory(prefix="rmq-grpc-home-") as home:
        try:
            r = _run_driver(target, args, timeout, home)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise AssertionError(f"rocketmq 5.x client {args[0]} ran past {timeout} s: {err[-2000:]}\n"
                                 f"{_log_tail(home)}") from None
        log = _log_tail(home) if r.returncode != expect_code else ""
    assert r.returncode == expect_code, (f"rocketmq 5.x client {args[0]} exited {r.returncode}, expected "
                                         f"{expect_code}: {r.stderr[-2000:]}\nstdout: {r.stdout[-2000:]}\n{log}")
    return json.loads(r.stdout.strip().splitlines()[-1])      # the JSON is the last line


def _log_tail(home: str, lines: int = 60) -> str:
    path = os.path.join(home, "logs", "rocketmq_python", "rocketmq_client.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "client log:\n" + "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return "(no client log)"
