"""Helpers to run actors as real processes on loopback (:mod:`rmq.testing`)."""
import os

import pytest

from rmq.testing import ActorProcess as _ActorProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def source_tree_env(env=None) -> dict:
    """``env`` plus the source tree's root on PYTHONPATH: children run in safe-path mode
    (:mod:`rmq.launch`), so the ``tests`` package is importable only through PYTHONPATH."""
    paths = [ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]]
    return {"PYTHONPATH": os.pathsep.join(paths), **(env or {})}


class ActorProcess(_ActorProcess):
    """:class:`rmq.testing.ActorProcess` started in the source tree's root by default, with the
    root on PYTHONPATH (the tests' echo / fake actors are ``tests.integration.*`` modules)."""

    def __init__(self, args, cwd=ROOT, env=None, timeout=30):
        super().__init__(args, cwd=cwd, env=source_tree_env(env), timeout=timeout)


@pytest.fixture
def rc():
    """A RemotingClient for direct requests to the brokers of a test (closed after it)."""
    from rmq.client.remoting import RemotingClient
    with RemotingClient() as c:
        yield c


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

from tests.integration.grpc_helpers import grpc_client_path  # noqa: E402,F401 - the RocketMQ 5 client fixture
