"""tests/conftest.py: a pytest-xdist worker that goes down has the tests it started printed by
the master, in order (at most HISTORY_TAIL); a run without a crash prints nothing of it."""
import os
import subprocess
import sys

from tests.conftest import HISTORY_TAIL

ROOT = __file__.rsplit("/tests/", 1)[0]


def run(tmp_path, body: str) -> str:
    (tmp_path / "test_w.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}   # a run of its own
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        "-n", "1", "--max-worker-restart", "0", "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def test_a_crashed_worker_s_tests_are_printed_in_order(tmp_path):
    body = "import os, signal\n" + "".join(f"def test_{i}(): pass\n" for i in range(HISTORY_TAIL + 5)) \
        + "def test_zcrash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    out = run(tmp_path, body)
    assert "went down" in out, out[-3000:]
    listed = [line.split("::")[1] for line in out.splitlines() if line.startswith("test_w.py::")]
    assert len(listed) == HISTORY_TAIL and listed[-1] == "test_zcrash", listed
    assert listed[0] == "test_6"                 # the last HISTORY_TAIL, in the order they started


def test_a_run_without_a_crash_prints_no_history(tmp_path):
    out = run(tmp_path, "def test_ok(): pass\n")
    assert "1 passed" in out and "went down" not in out, out[-2000:]
