"""Shared fixtures.  The compiled core is asserted, so CI cannot silently test a
missing build (STYLE.md §7.7); and on CI (``RMQ_REQUIRE_ALL=1``, set by ``.ci/run``) a skipped
test fails the run, so a CI machine without Java, root or ``ip`` cannot pass by skipping."""
import importlib.machinery
import os

import pytest

#: set to 1 by .ci/run: every skip (a missing prerequisite: Java, root, ip, a package) fails the session
REQUIRE_ALL_ENV = "RMQ_REQUIRE_ALL"


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL_ENV) == "1"


def _skipped(config) -> list:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter.stats.get("skipped", []) if reporter is not None else []


def pytest_sessionfinish(session, exitstatus):
    if require_all() and _skipped(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = _skipped(config) if require_all() else []
    if skipped:
        terminalreporter.write_sep("=", f"{REQUIRE_ALL_ENV}=1: {len(skipped)} skipped test(s) fail this run", red=True)
        for rep in skipped:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            terminalreporter.write_line(f"{rep.nodeid}: {reason}")
        terminalreporter.write_line("install what they need (.ci/run says what CI needs)")


# -- a crashed worker's history ------------------------------------------------------------------
# A pytest-xdist worker that dies (a segfault: faulthandler prints its threads' stacks) is
# reported with the test it was running only; what it ran before (another file's threads,
# pyarrow, Spark's py4j) is often the cause.  Each worker writes the test ids it starts to a
# file of the run's history directory, and the master prints the last ones of a worker that
# went down with an error.
HISTORY_DIR_ENV = "RMQ_TEST_HISTORY_DIR"
HISTORY_TAIL = 40                    # test ids printed for a crashed worker


_worker = ""                         # this process's xdist worker id ("" in the master or without xdist)


def pytest_configure(config):
    global _worker
    if hasattr(config, "workerinput"):
        _worker = config.workerinput.get("workerid", "")
    elif config.pluginmanager.hasplugin("xdist"):
        import tempfile
        os.environ[HISTORY_DIR_ENV] = tempfile.mkdtemp(prefix="rmq-test-history-")   # workers inherit it


def _history_path(worker: str):
    d = os.environ.get(HISTORY_DIR_ENV)
    return os.path.join(d, f"{worker}.log") if d else None


def pytest_runtest_logstart(nodeid, location):
    path = _history_path(_worker) if _worker else None     # the master relays these too: not it
    if path:
        with open(path, "a") as f:
            f.write(nodeid + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if not error:
        return
    path = _history_path(node.gateway.id)
    try:
        with open(path) as f:
            ran = f.read().splitlines()
    except (OSError, TypeError):
        return
    tr = node.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_sep("=", f"worker {node.gateway.id} went down ({error}); tests it started, in order "
                          f"(the last {min(HISTORY_TAIL, len(ran))} of {len(ran)})", red=True)
        for line in ran[-HISTORY_TAIL:]:
            tr.write_line(line)


def pytest_unconfigure(config):
    d = os.environ.get(HISTORY_DIR_ENV)
    if d and not hasattr(config, "workerinput"):
        import shutil
        shutil.rmtree(d, ignore_errors=True)


import rmq._core.commitlog
import rmq._core.consume_queue
import rmq._core.dispatch
import rmq._core.index_file
import rmq._core.mapped_file

for _mod in (rmq._core.commitlog, rmq._core.consume_queue, rmq._core.dispatch,
             rmq._core.index_file, rmq._core.mapped_file):
    assert _mod.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), \
        f"{_mod.__name__} is not the compiled extension: build with `pip install -e .`"

from rmq.store.message_store import MessageStore  # noqa: E402

# Tiny geometry so a few hundred messages roll many files.
SMALL = dict(mapped_file_size_commit_log=16 * 1024, mapped_file_size_consume_queue=20 * 64,
             max_hash_slot_num=64, max_index_num=512)


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    return str(d)


@pytest.fixture
def open_store(store_dir):
    """``open_store(**overrides)`` opens a MessageStore on ``store_dir`` with small files;
    every store opened is shut down at teardown."""
    opened = []

    def _open(path=None, **overrides):
        kw = dict(SMALL)
        kw.update(overrides)
        s = MessageStore(path or store_dir, **kw)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.shutdown()


def crash(store):
    """Simulate kill -9 of the process holding ``store`` (see MessageStore.abandon)."""
    store.abandon()


def env_int(name, default):
    return int(os.environ.get(name, default))
