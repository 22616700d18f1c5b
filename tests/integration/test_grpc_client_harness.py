"""The harness for the official RocketMQ 5 Python client (tests/integration/grpc_helpers.py and
grpc_client.py), without a server: the client installs into its cache directory, the driver
loads it (and its grpcio / protobuf) from there and not the C++ client's ``rocketmq`` from the
venv, and a client that cannot reach its endpoint ends in a bounded time with exit code 3 and
an ``error`` in its JSON."""
import importlib.util
import os
import socket
import time

import pytest

from tests.integration.grpc_helpers import CLIENT_VERSION, EXIT_CLIENT_ERROR, grpc_client, install_info

pytestmark = pytest.mark.integration


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under(path: str, root: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def test_the_client_is_installed_in_the_cache(grpc_client_path):
    info = install_info(grpc_client_path)
    assert info["version"] == CLIENT_VERSION
    assert os.path.isfile(os.path.join(grpc_client_path, "rocketmq", "v5", "producer", "producer.py"))
    # this process still has the venv's rocketmq (the C++ client), not the 5.x one
    spec = importlib.util.find_spec("rocketmq")
    assert spec is None or not under(spec.origin, grpc_client_path)


def test_the_driver_loads_the_5x_client_grpc_and_protobuf_from_the_install(grpc_client_path):
    out = grpc_client("version", timeout=60)
    assert out["client_version"] == CLIENT_VERSION
    for module, path in out["files"].items():
        assert under(path, grpc_client_path), (module, path)
    assert int(out["protobuf"].split(".")[0]) >= 6                  # the client's generated code needs >= 6.33.5


@pytest.mark.parametrize("mode", ["produce", "receive"])
def test_a_client_that_cannot_connect_fails_with_exit_3_and_an_error(grpc_client_path, mode):
    endpoint = f"127.0.0.1:{closed_port()}"
    if mode == "produce":
        args = [endpoint, "TopicHarness", 3]
    else:
        args = [endpoint, "TopicHarness", "GroupHarness", 3, "--timeout-s", 5]
    t0 = time.monotonic()
    out = grpc_client(mode, *args, "--request-timeout-s", 1, timeout=60, expect_code=EXIT_CLIENT_ERROR)
    assert time.monotonic() - t0 < 30
    assert "route" in out["error"], out["error"]                   # "failed to fetch topic:TopicHarness route."
    assert out["sent" if mode == "produce" else "messages"] == []
    assert any("UNAVAILABLE" in line for line in out["client_log"]), out["client_log"]


def test_a_bad_command_line_exits_2(grpc_client_path):
    out = grpc_client("no-such-mode", timeout=60, expect_code=2)
    assert out["error"].startswith("usage")
