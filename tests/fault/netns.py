"""A network namespace joined to the root namespace by a veth pair, for the partition tests
(needs root and iproute2's ``ip netns``; the CI machine has both)."""
import os
import shutil
import subprocess
from contextlib import contextmanager

import pytest


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextmanager
def veth_namespace(ns: str, root_if: str, ns_if: str, root_ips: tuple, ns_ip: str):
    """Create namespace ``ns`` with ``ns_if`` at ``ns_ip``/24 (and its loopback up), joined to the
    root namespace's ``root_if`` holding every address of ``root_ips`` (/24); yields ``ns`` and
    removes both at exit.  Skips the test without root or ``ip``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip)")
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", root_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        for ip in root_ips:
            sh("ip", "addr", "add", f"{ip}/24", "dev", root_if)
        sh("ip", "link", "set", root_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/24", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", root_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
