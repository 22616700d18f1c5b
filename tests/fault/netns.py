"""A network namespace joined to the root namespace by a veth pair, for the partition tests
(needs root and iproute2's ``ip netns``; the CI machine has both)."""
import os
import shutil
import subprocess
import sys
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


class NsGroup:
    """A broker group (broker, reput, flush, ha) inside namespace ``ns``, started at once (and again
    by :meth:`start_group` after :meth:`close`); ``conf``: its broker.conf properties."""

    def __init__(self, ns, store, namesrv_addr, conf):
        self.ns = ns
        self.store = str(store)
        self.namesrv_addr = namesrv_addr
        os.makedirs(self.store, exist_ok=True)
        self.conf_path = os.path.join(self.store, "broker.conf")
        with open(self.conf_path, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in conf.items()))
        self.procs = []
        self.start_group()

    def start_group(self):
        self.procs = []
        common = ["--store-path", self.store, "-c", self.conf_path]
        self.broker = self._start(["rmq.actors.broker", *common, "--listen-port", "0",
                                   "--namesrv-addr", self.namesrv_addr])
        self.broker_addr = self.broker.replace("tcp://", "")
        for name in ("reput", "flush", "ha"):
            self._start([f"rmq.actors.{name}", *common])

    def _start(self, args):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        p = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-m", *args], cwd=root,
                             stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = p.stdout.readline().split()
        if not line or line[0] != "ready":
            self.close()
            raise RuntimeError(f"{args[0]} did not start in {self.ns}: {line}")
        return line[1]

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
