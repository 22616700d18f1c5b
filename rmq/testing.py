"""Launch a real broker group for tests, benchmarks and demos.

:class:`Cluster` starts a NameServer, a broker, reput and flush (cleaner and ha on request)
as real processes (``python -m rmq.actors.<name>``, the supervisor's order) on ephemeral
loopback ports, in a store directory of your choosing; :class:`ActorProcess` is one such
child process.  Nothing here needs a source checkout: the actors are imported from the
installed ``rmq`` package.

    from rmq.testing import Cluster

    c = Cluster("/tmp/store", conf={"flushDiskType": "SYNC_FLUSH"})
    try:
        ...                            # c.broker ("tcp://127.0.0.1:port"), c.namesrv_addr
    finally:
        c.close()

A master / slave pair (HA)::

    master = Cluster("/tmp/m", conf={"brokerRole": "SYNC_MASTER"}, with_ha=True)
    slave = Cluster("/tmp/s", conf={"brokerRole": "SLAVE", "brokerId": "1"}, with_ha=True,
                    namesrv_addr=master.namesrv_addr)
    wait_for_slave(master)             # until the master's runtime info lists the slave

The default store geometry is small (1 MiB CommitLog files, tests' sizes); pass the
``mappedFileSize*`` properties in ``conf`` for realistic figures.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import Optional

from rmq.launch import child_env, python_cmd

__all__ = ["ActorProcess", "Cluster", "broker_runtime_info", "wait_for_slave"]


class ActorProcess:
    """A child ``python -P <args>`` process (:func:`rmq.launch.python_cmd`: the installed
    ``rmq`` whatever ``cwd`` holds) that prints ``ready <endpoint>`` once it serves.

    ``cwd``: working directory of the child (default: the caller's); ``env``: variables
    added to this process's environment for the child; ``stderr_path``: a file its standard
    error is appended to (a crash's traceback; default: this process's standard error)."""

    def __init__(self, args, cwd: Optional[str] = None, env: Optional[dict] = None, timeout: float = 30,
                 wait: bool = True, stderr_path: Optional[str] = None):
        self.args = list(args)
        self.endpoint = ""
        err = None
        if stderr_path is not None:
            os.makedirs(os.path.dirname(stderr_path), exist_ok=True)
            err = open(stderr_path, "ab")
        try:
            self.proc = subprocess.Popen(python_cmd(*self.args), cwd=cwd, stdout=subprocess.PIPE, text=True,
                                         env=child_env(env), stderr=err)
        finally:
            if err is not None:
                err.close()           # the child holds its own descriptor
        if wait:
            self.wait_ready()

    def wait_ready(self) -> "ActorProcess":
        """Read the ``ready <endpoint>`` line (``wait=False`` processes: started side by side, then
        waited for).  Raises RuntimeError, the process killed, on any other line or none."""
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.kill()
            raise RuntimeError(f"actor {self.args} did not start: {line}")
        self.endpoint = line[1]
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def terminate(self, timeout: float = 20):
        """SIGTERM (a clean shutdown) and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc.stdout.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


class Cluster:
    """A broker group of real processes on loopback: nameserver, broker, reput and flush
    (cleaner and ha on request), started in order on ephemeral ports.

    ``conf``: broker properties over the small default geometry (written to
    ``<store_path>/broker.conf``); ``namesrv_addr``: join another cluster's NameServer
    instead of starting one (a slave); ``cwd`` / ``env``: for every child process.
    Attributes: ``broker`` (``tcp://host:port``), ``broker_addr`` (``host:port``),
    ``namesrv_addr``, ``procs`` (name -> :class:`ActorProcess` of the group), ``namesrv``."""

    GROUP = ("broker", "reput", "flush", "cleaner", "ha")

    def __init__(self, store_path, conf=None, with_namesrv=True, with_cleaner=False, namesrv_args=(),
                 with_ha=False, namesrv_addr=None, cwd: Optional[str] = None, env: Optional[dict] = None):
        self.cwd, self.env = cwd, env
        self.store_path = str(store_path)
        self.conf_path = os.path.join(self.store_path, "broker.conf")
        os.makedirs(self.store_path, exist_ok=True)
        self.conf = {"brokerClusterName": "TestCluster", "brokerName": "broker-a",
                     "mappedFileSizeCommitLog": str(1024 * 1024), "mappedFileSizeConsumeQueue": str(20 * 1000),
                     "maxHashSlotNum": "1000", "maxIndexNum": "4000",
                     "maxTransferCountOnMessageInMemory": "1024",
                     "maxTransferBytesOnMessageInMemory": str(4 * 1024 * 1024)}
        self.conf.update(conf or {})
        with open(self.conf_path, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in self.conf.items()))
        self.with_cleaner = with_cleaner
        self.with_ha = with_ha
        if namesrv_addr:
            with_namesrv = False
        self.namesrv = self._actor(["-m", "rmq.actors.nameserver", "--listen-port", "0",
                                    "--store-path", self.store_path, *namesrv_args],
                                   name="nameserver") if with_namesrv else None
        self.namesrv_addr = self.namesrv.endpoint.replace("tcp://", "") if self.namesrv else (namesrv_addr or "")
        self.procs: dict = {}
        try:
            self.start_group()
        except BaseException:
            self.close()
            raise

    def _actor(self, args, wait: bool = True, name: str = "") -> ActorProcess:
        """An actor of the group; its standard error (a crash's traceback) goes to
        ``<store>/logs/<name>.stderr.log``, as under the supervisor."""
        path = os.path.join(self.store_path, "logs", f"{name}.stderr.log") if name else None
        return ActorProcess(args, cwd=self.cwd, env=self.env, wait=wait, stderr_path=path)

    def start_group(self) -> None:
        common = ["--store-path", self.store_path, "-c", self.conf_path]
        args = ["-m", "rmq.actors.broker", *common, "--listen-port", "0"]
        if self.namesrv_addr:
            args += ["--namesrv-addr", self.namesrv_addr]
        self.procs["broker"] = self._actor(args, name="broker")
        self.broker = self.procs["broker"].endpoint
        self.broker_addr = self.broker.replace("tcp://", "")
        # the broker's followers only need it serving: they start side by side
        followers = ["reput", "flush"] + ["cleaner"] * self.with_cleaner + ["ha"] * self.with_ha
        for name in followers:
            self.procs[name] = self._actor(["-m", f"rmq.actors.{name}", *common], wait=False, name=name)
        for name in followers:
            self.procs[name].wait_ready()

    def pids(self) -> dict:
        """name -> pid of the group's processes (nameserver included when started here)."""
        d = {n: ap.proc.pid for n, ap in self.procs.items()}
        if self.namesrv is not None:
            d["nameserver"] = self.namesrv.proc.pid
        return d

    def stop_group(self) -> dict:
        """SIGTERM the group (not the nameserver), in order; name -> exit code."""
        codes = {}
        for name in self.GROUP:
            p = self.procs.pop(name, None)
            if p is not None:
                codes[name] = p.terminate()
        return codes

    def kill_group(self) -> None:
        """SIGKILL the group (not the nameserver); the sockets the broker leaves go with their
        private directory (:func:`rmq.actors.broker_endpoints.release_ipc_dir`)."""
        from rmq.actors.broker_endpoints import release_ipc_dir
        killed = False
        for name in self.GROUP:
            p = self.procs.pop(name, None)
            if p is not None:
                p.kill()
                killed = True
        if killed:
            release_ipc_dir(self.store_path)

    def close(self) -> None:
        self.kill_group()
        if self.namesrv is not None:
            self.namesrv.kill()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def broker_runtime_info(addr: str, client=None) -> dict:
    """GET_BROKER_RUNTIME_INFO's table of the broker at ``addr`` (``host:port``)."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode, ResponseCode, unpack_body

    own = client is None
    c = RemotingClient() if own else client
    try:
        r = c.invoke(addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
        if r.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"GET_BROKER_RUNTIME_INFO {addr}: {r.code} {r.remark}")
        return unpack_body(r)["table"]
    finally:
        if own:
            c.close()


def wait_for_slave(master: Cluster, timeout_s: float = 60.0, client=None) -> float:
    """Until ``master``'s runtime info lists a slave (``haSlaves`` non-empty); seconds waited."""
    from rmq.client.remoting import RemotingClient

    t0 = time.monotonic()
    own = client is None
    c = RemotingClient() if own else client
    try:
        while True:
            if broker_runtime_info(master.broker_addr, c).get("haSlaves"):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no slave attached to {master.broker_addr} within {timeout_s} s")
            time.sleep(0.05)
    finally:
        if own:
            c.close()
