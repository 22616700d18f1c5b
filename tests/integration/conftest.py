"""Helpers to run actors as real processes on loopback."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ActorProcess:
    """A child process that prints ``ready <endpoint>`` once it serves."""

    def __init__(self, args, cwd=ROOT, env=None, timeout=30):
        self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.kill()
            raise RuntimeError(f"actor {args} did not start: {line}")
        self.endpoint = line[1]

    def terminate(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc.stdout.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def actors():
    started = []

    def start(*args, **kw):
        a = ActorProcess(list(args), **kw)
        started.append(a)
        return a

    yield start
    for a in started:
        if a.proc.poll() is None:
            a.kill()
        elif not a.proc.stdout.closed:
            a.proc.stdout.close()
