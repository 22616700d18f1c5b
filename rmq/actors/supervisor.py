"""Supervisor: starts, watches, restarts and stops the actor processes of one node.

Responsibility
    What ``rmq start`` runs (RocketMQ has no such process: ``mqnamesrv`` and
    ``mqbroker`` are started by hand or by ``nohup``).  It starts the NameServer
    (unless ``--no-namesrv``) and one broker group, each actor as its own process
    ``python -m rmq.actors.<name> ARGS``, in this order, waiting for each one's
    ``ready <endpoint>`` stdout line (``ready_timeout_s``; on a timeout or an early
    exit it reports, stops what started and exits 1)::

        nameserver  --listen-addr H --listen-port P --store-path S --supervisor EP
        broker      --store-path S -c CONF --listen-port P --namesrv-addr "h:p;h:p" --supervisor EP
        reput       --store-path S -c CONF --supervisor EP
        flush       --store-path S -c CONF --supervisor EP
        cleaner     --store-path S -c CONF --supervisor EP
        ha          --store-path S -c CONF --supervisor EP
        dashboard   --namesrv-addr "h:p" --host H --port P --store-path S --supervisor EP [--token-file F]

    The dashboard (``rmq.dashboard.actor``) runs only with broker.conf ``dashboardEnable=true``
    (or ``rmq start --dashboard``), as a group of its own after the broker group: its failures
    restart it alone, and it is stopped first.

    ``CONF`` is ``S/broker.effective.conf``: the user's broker.conf merged with the
    command-line flags (:func:`rmq.broker_conf.broker_settings`), rewritten whenever
    an ephemeral port (0) is resolved, so every actor reads the same values.  The
    broker recovers the store when it starts; it creates ``S/abort``.

    Stop (SIGTERM / SIGINT, SIGHUP in the foreground, ``rmq stop``): SIGTERM to the broker first and wait for
    it to exit (it stops accepting, drains and flushes), then reput, flush,
    cleaner, and last the NameServer, each waited for ``stop_timeout_s`` (then
    SIGKILL, reported).  When every actor of the broker group exited 0, the store
    was stopped cleanly and ``S/abort`` is removed.

Sockets
    ROUTER bound at ``ipc://S/supervisor.ipc`` (``tcp://127.0.0.1:*`` when the path
    is too long for a unix socket): inbound one-way ACTOR_BEAT ``{name, pid}`` from
    each actor's DEALER, every HEARTBEAT_INTERVAL_MS.  No replies.  The children's
    stdout pipes are polled too: after ``ready`` their lines go to this log, so a
    child never blocks on a full pipe.  Their stderr goes to ``S/logs/<name>.stderr.log``.

Files
    ``S/rmq.pid``: the supervisor's pid, held under an exclusive flock while it runs
    (a second supervisor on the same store is refused; ``rmq stop`` knows it is
    gone when the lock is free); ``S/logs/supervisor.log``; ``S/broker.effective.conf``;
    ``S/run/restarts.json``: ``{actor: restarts}`` since this supervisor started, rewritten at
    every (re)start (served by the broker group's metrics as ``rocketmq_actor_restarts_total``).

Timers
    Main loop polls every 100 ms: exited children, missed beats (HEARTBEAT_LIVENESS
    intervals without a beat after ``ready``), due restarts.

Failure behaviour
    An actor that exits when not asked to, or misses HEARTBEAT_LIVENESS beats
    (then it is SIGKILLed), is restarted after a backoff that starts at
    ``restart_backoff_s`` (0.5 s) and doubles with each restart of its group in
    the window, up to ``restart_backoff_max_s`` (30 s).  A dead broker takes its
    group with it: reput, flush and cleaner are stopped and the group restarts in
    order, so the broker's recovery runs with no other writer.  More than
    ``max_restarts`` (5) restarts of a group within ``restart_window_s`` (60 s):
    the supervisor reports it (log + stderr), stops that group and gives up on it;
    when nothing is left running it exits 1.  Children are in their own process
    groups (a terminal's Ctrl-C reaches only the supervisor, which stops them in
    order) and, on Linux, get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG).

Test hook
    ``RMQ_ACTOR_MODULES="broker=tests.integration.fake_actor,reput=..."`` (test
    only) replaces the module run for the named actors.  Every child gets its
    actor name in the environment variable ``RMQ_ACTOR_NAME``.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import importlib.util
import json
import logging
import logging.handlers
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TextIO

import zmq

from rmq import protocol as P
from rmq.actors.actor import HEARTBEAT_INTERVAL_MS, HEARTBEAT_LIVENESS, LOG_BACKUPS, LOG_MAX_BYTES, RUN_DIR
from rmq.actors.broker_endpoints import MAX_IPC_PATH
from rmq.broker_conf import (BrokerConfError, broker_settings, dashboard_settings, local_controller_settings,
                             proxy_settings, format_broker_conf,
                             load_broker_conf)
from rmq.launch import child_env, python_argv
from rmq.protocol import ProtocolError, RequestCode

DEFAULT_MODULES = {
    "nameserver": "rmq.actors.nameserver",
    "broker": "rmq.actors.broker",
    "reput": "rmq.actors.reput",
    "flush": "rmq.actors.flush",
    "cleaner": "rmq.actors.cleaner",
    "ha": "rmq.actors.ha",
    "dashboard": "rmq.dashboard.actor",
    "proxy": "rmq.proxy.actor",
    "controller": "rmq.controller.actor",
}
NAMESRV_GROUP = ("nameserver",)
BROKER_GROUP = ("broker", "reput", "flush", "cleaner", "ha")   # start order; the first one leads the group
DASHBOARD_GROUP = ("dashboard",)                           # broker.conf dashboardEnable=true
CONTROLLER_GROUP = ("controller",)                         # enableControllerInNamesrv=true (rmq start --controller)
PROXY_GROUP = ("proxy",)                                   # broker.conf enableProxy=true (rmq start --enable-proxy)
ACTOR_MODULES_ENV = "RMQ_ACTOR_MODULES"                    # test only: name=module,name=module
ACTOR_NAME_ENV = "RMQ_ACTOR_NAME"                          # set in every child's environment

PID_FILE = "rmq.pid"
ABORT_FILE = "abort"
SUPERVISOR_IPC = "supervisor.ipc"
EFFECTIVE_CONF = "broker.effective.conf"
RESTARTS_FILE = "restarts.json"         # S/run/restarts.json: {actor: restarts since the supervisor started}
LOG_FILE = "supervisor.log"
STDERR_LOG = "supervisor.stderr.log"    # the detached supervisor's own stderr (tracebacks)

READY_TIMEOUT_S = 120.0         # the broker's recovery of a large store can take a while
STOP_TIMEOUT_S = 60.0           # per actor: the broker drains and flushes
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
MAX_RESTARTS = 5                # per group within RESTART_WINDOW_S
RESTART_WINDOW_S = 60.0
POLL_MS = 100                   # main loop tick
STDERR_TAIL_LINES = 12
MAX_LINE = 64 * 1024            # a child's stdout line longer than this is cut
MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

log = logging.getLogger("rmq.supervisor")


class SupervisorError(Exception):
    """The supervisor cannot start (bad settings, store in use, bad module list)."""


# -- settings and the pid file (shared with `rmq stop`) ------------------------------------------------
def actor_modules(spec: Optional[str] = None) -> dict:
    """Actor name -> module, the defaults with ``spec`` (``"name=module,..."``, test only) applied.

    Raises
    ------
    SupervisorError
        An unknown actor name or a malformed entry.
    """
    modules = dict(DEFAULT_MODULES)
    for entry in (spec or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, module = (s.strip() for s in entry.partition("="))
        if not sep or name not in DEFAULT_MODULES or not MODULE_PATTERN.match(module):
            raise SupervisorError(f"{ACTOR_MODULES_ENV}: bad entry {entry!r}; expected name=module with name in "
                                  f"{', '.join(DEFAULT_MODULES)}")
        modules[name] = module
    return modules


def resolve_settings(conf_path: Optional[str] = None, store_path: Optional[str] = None,
                     namesrv_addr: Optional[str] = None, listen_port: Optional[int] = None,
                     extra: Optional[dict] = None) -> dict:
    """Effective broker settings from ``conf_path`` and flags (flags win), with an absolute
    ``storePathRootDir``.  Ports 0 (ephemeral) are allowed in ``namesrvAddr``.  ``extra``: more
    flag values under their property names (``dashboardEnable``, ``dashboardPort``; None = not given).

    Raises
    ------
    BrokerConfError
        The file cannot be read or parsed, or a setting is invalid.
    """
    props = load_broker_conf(conf_path) if conf_path else {}
    s = broker_settings(props, {"storePathRootDir": store_path, "namesrvAddr": namesrv_addr,
                                "listenPort": listen_port, **(extra or {})}, ephemeral_ports=True)
    s["storePathRootDir"] = os.path.abspath(s["storePathRootDir"])
    return s


def read_pid_file(store_path: str) -> Optional[int]:
    """The pid in ``STORE/rmq.pid``, or None when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(store_path, PID_FILE)) as f:
            return int(f.read().strip() or "0") or None
    except (OSError, ValueError):
        return None


def supervisor_running(store_path: str) -> bool:
    """True while a supervisor holds the lock on ``STORE/rmq.pid``."""
    try:
        fd = os.open(os.path.join(store_path, PID_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)
    return False


class PidFile:
    """``STORE/rmq.pid``: our pid, under an exclusive flock for our lifetime."""

    def __init__(self, store_path: str):
        self.path = os.path.join(store_path, PID_FILE)
        self.fd = -1

    def acquire(self) -> None:
        """Raises SupervisorError when another supervisor holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            other = read_pid_file(os.path.dirname(self.path))
            raise SupervisorError(f"rmq is already running for store {os.path.dirname(self.path)} (pid {other}); "
                                  f"stop it with: rmq stop --store-path {os.path.dirname(self.path)}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)       # closing drops the lock
            self.fd = -1


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _pdeathsig_preexec() -> Optional[Callable[[], None]]:
    """A preexec_fn that asks Linux to SIGTERM the child when we die (None elsewhere).

    The prctl function is resolved here, in the parent, so the child only makes one
    foreign call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(1, sigterm, 0, 0, 0)          # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:          # the supervisor died before prctl took effect
            os._exit(1)
    return preexec


# -- children -----------------------------------------------------------------------------------------
class Child:
    """One incarnation of an actor process."""

    def __init__(self, name: str, group: "Group", proc: subprocess.Popen, stderr_path: str, stderr_offset: int):
        self.name = name
        self.group = group
        self.proc = proc
        self.pid = proc.pid
        self.stderr_path = stderr_path
        self.stderr_offset = stderr_offset
        self.fd = proc.stdout.fileno() if proc.stdout is not None else -1
        self.buf = b""
        self.endpoint: Optional[str] = None       # set by the `ready` line
        self.started_at = time.monotonic()
        self.ready_at: Optional[float] = None
        self.last_beat: Optional[float] = None
        self.beats = 0
        self.stopping = False

    @property
    def ready(self) -> bool:
        return self.endpoint is not None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        """The last lines this incarnation wrote to its stderr log."""
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                start = max(self.stderr_offset, end - 8192)
                f.seek(start)
                data = f.read(end - start)
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass
class Group:
    """Actors restarted together under one restart budget; ``members`` in start order."""
    name: str
    members: tuple
    restarts: collections.deque = field(default_factory=collections.deque)   # monotonic times
    restart_all_at: Optional[float] = None      # whole group due (its leader died)
    pending: dict = field(default_factory=dict)  # member -> due time
    given_up: bool = False
    # members a stop kept from starting during a group restart: never ran against the recovered
    # store, so they leave nothing to recover (the group still stops cleanly without them)
    unstarted: set = field(default_factory=set)


class Supervisor:
    """See the module docstring.  ``run()`` returns the process exit code."""

    def __init__(self, settings: dict, conf_path: Optional[str] = None, start_namesrv: bool = True,
                 modules: Optional[dict] = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S, restart_backoff_s: float = RESTART_BACKOFF_S,
                 restart_backoff_max_s: float = RESTART_BACKOFF_MAX_S, max_restarts: int = MAX_RESTARTS,
                 restart_window_s: float = RESTART_WINDOW_S, heartbeat_liveness: int = HEARTBEAT_LIVENESS,
                 heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS, detached: bool = False,
                 out: Optional[TextIO] = None):
        self.settings = dict(settings)
        self.store = os.path.abspath(self.settings["storePathRootDir"])
        self.settings["storePathRootDir"] = self.store
        self.conf_source = os.path.abspath(conf_path) if conf_path else None
        self.start_namesrv = start_namesrv
        self.modules = ({**DEFAULT_MODULES, **modules} if modules is not None
                        else actor_modules(os.environ.get(ACTOR_MODULES_ENV)))
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.restart_backoff_s = restart_backoff_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.liveness_s = heartbeat_liveness * heartbeat_interval_ms / 1000.0
        self.detached = detached
        self.out = out if out is not None else sys.stdout
        try:
            self.controller = local_controller_settings(self.settings)
        except BrokerConfError as e:
            raise SupervisorError(str(e)) from None
        self.groups = (([Group("namesrv", NAMESRV_GROUP)] if start_namesrv else []) +
                       ([Group("controller", CONTROLLER_GROUP)] if self.controller["enabled"] else []) +
                       [Group("broker", BROKER_GROUP)])
        try:
            self.dashboard = dashboard_settings(self.settings)
        except BrokerConfError as e:
            raise SupervisorError(str(e)) from None
        if self.dashboard["enabled"]:
            self.groups.append(Group("dashboard", DASHBOARD_GROUP))
        try:
            self.proxy = proxy_settings(self.settings)
        except BrokerConfError as e:
            raise SupervisorError(str(e)) from None
        if self.proxy["enabled"]:
            self.groups.append(Group("proxy", PROXY_GROUP))
        self.starts: dict[str, int] = {}        # actor -> processes started (restarts = starts - 1)
        self.children: dict[str, Child] = {}
        self.by_fd: dict[int, Child] = {}
        self.pid_file = PidFile(self.store)
        self.conf_path = os.path.join(self.store, EFFECTIVE_CONF)
        self.endpoint = ""
        self.ctx: Optional[zmq.Context] = None
        self.router: Optional[zmq.Socket] = None
        self.poller = zmq.Poller()
        self.stop_requested = False
        self.failed = False             # a group given up or a start failed: exit 1
        self.unclean = False            # an actor did not stop with exit code 0
        self._conf_written: Optional[str] = None
        self._preexec = _pdeathsig_preexec()
        self._log_handlers: list = []
        self._check_settings()

    def _check_settings(self) -> None:
        addrs = self.settings["namesrvAddr"].split(";")
        zero = [a for a in addrs if a.rsplit(":", 1)[1] == "0"]
        if self.start_namesrv:
            if any(a.rsplit(":", 1)[1] == "0" for a in addrs[1:]):
                raise SupervisorError("namesrvAddr: only the first entry (the NameServer started here) may use "
                                      "port 0")
        elif zero:
            raise SupervisorError(f"--no-namesrv needs the real ports of the running NameServers, got {zero}")
        if self.dashboard["enabled"] and self.modules["dashboard"] == DEFAULT_MODULES["dashboard"]:
            missing = [m for m in ("starlette", "jinja2", "uvicorn", "multipart") if importlib.util.find_spec(m) is None]
            if missing:
                raise SupervisorError(f"dashboardEnable=true needs the 'dashboard' extra (pip install "
                                      f"\"rmq[dashboard]\"): {', '.join(missing)} not installed")

    # -- output ---------------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """A line for the user on stdout (ignored once nobody reads it)."""
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (OSError, ValueError):
            pass

    def _setup_logging(self) -> None:
        logs = os.path.join(self.store, "logs")
        os.makedirs(logs, exist_ok=True)
        log.setLevel(logging.INFO)
        log.propagate = False
        fh = logging.handlers.RotatingFileHandler(os.path.join(logs, LOG_FILE), maxBytes=LOG_MAX_BYTES,
                                                  backupCount=LOG_BACKUPS)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"))
        handlers = [fh]
        if not self.detached:
            sh = logging.StreamHandler(sys.stderr)
            sh.setLevel(logging.WARNING)
            sh.setFormatter(logging.Formatter("rmq supervisor: %(levelname)s %(message)s"))
            handlers.append(sh)
        for h in handlers:
            log.addHandler(h)
        self._log_handlers = handlers

    def _teardown_logging(self) -> None:
        for h in self._log_handlers:
            log.removeHandler(h)
            h.close()
        self._log_handlers = []

    # -- lifecycle ------------------------------------------------------------------------------------
    def run(self) -> int:
        """Start everything, supervise until stopped, stop in order.  Returns the exit code:
        0 after a clean stop, 1 after a failed start, a given-up group or an unclean stop."""
        try:
            os.makedirs(os.path.join(self.store, "logs"), exist_ok=True)
            self.pid_file.acquire()     # raises SupervisorError before anything else changes
        except OSError as e:
            raise SupervisorError(f"cannot use store {self.store}: {e}") from None
        try:
            self._setup_logging()
            # SIGHUP: in the foreground the terminal went away (stop in order); detached, ignore it
            old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
            old[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN if self.detached else self._on_signal)
            try:
                return self._run()
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
        finally:
            self._close()
            self.pid_file.release()
            self._teardown_logging()

    def _run(self) -> int:
        self._bind()
        log.info("supervisor starting: store %s, namesrvAddr %s, listenPort %s, %s, modules %s", self.store,
                 self.settings["namesrvAddr"], self.settings["listenPort"],
                 "with a NameServer" if self.start_namesrv else "no NameServer", self.modules)
        self.say(f"store {self.store}")
        try:
            started = self._start_all()
            if started:
                self.say(f"ready {self.endpoint} pid {os.getpid()}")
                if self.detached:
                    self._detach_stdout()
                else:
                    self.say(self._summary())
                log.info("all actors ready")
                self._loop()
        finally:
            code = self._stop_all()
        return code

    def _summary(self) -> str:
        parts = [f"{n} {c.endpoint}" for n, c in self.children.items()
                 if n in ("nameserver", "controller", "broker", "dashboard", "proxy")]
        return (f"rmq running ({', '.join(parts)}; store {self.store}); "
                f"Ctrl-C or `rmq stop --store-path {self.store}` stops it")

    def _detach_stdout(self) -> None:
        """After `ready` nobody reads our stdout (the `rmq start --detach` parent has left)."""
        try:
            self.out.flush()
        except (OSError, ValueError):
            pass
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)

    def _on_signal(self, signum, _frame) -> None:
        if not self.stop_requested:
            self.stop_requested = True
            log.info("%s received: stopping", signal.Signals(signum).name)

    def _bind(self) -> None:
        self.ctx = zmq.Context(io_threads=1)
        s = self.ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, 64 * 1024)     # beats are tiny
        path = os.path.join(self.store, SUPERVISOR_IPC)
        if len(path) <= MAX_IPC_PATH:
            s.bind(f"ipc://{path}")
        else:
            s.bind("tcp://127.0.0.1:*")
            log.info("store path too long for ipc://%s; beats on tcp", path)
        self.endpoint = s.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = s
        self.poller.register(s, zmq.POLLIN)

    def _close(self) -> None:
        for child in list(self.children.values()):      # only after an internal error
            self._kill(child)
        if self.router is not None:
            self.router.close(linger=0)
            self.router = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
        if self.endpoint.startswith("ipc://"):
            try:
                os.unlink(self.endpoint[len("ipc://"):])
            except OSError:
                pass

    # -- the effective broker.conf ----------------------------------------------------------------------
    def _write_conf(self) -> None:
        header = (f"Written by the rmq supervisor (pid {os.getpid()}): the effective broker settings, from "
                  f"{self.conf_source or 'the defaults'} and the command-line flags.\nRewritten at every start; "
                  "edit your own broker.conf instead.")
        text = format_broker_conf(self.settings, header)
        if text == self._conf_written:
            return
        tmp = self.conf_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.conf_path)
        self._conf_written = text

    def _args(self, name: str) -> list:
        s = self.settings
        if name == "nameserver":
            host, port = s["namesrvAddr"].split(";")[0].rsplit(":", 1)
            return ["--listen-addr", host.strip("[]"), "--listen-port", port, "--store-path", self.store,
                    "-c", self.conf_path, "--supervisor", self.endpoint]      # -c: auth* settings
        if name == "controller":
            return ["--listen-addr", "127.0.0.1", "--listen-port", str(self.controller["port"]),
                    "--store-path", os.path.join(self.store, "controller"), "-c", self.conf_path,   # -c: auth*
                    "--supervisor", self.endpoint]
        if name == "proxy":
            return ["--namesrv-addr", s["namesrvAddr"], "--listen-port", str(self.proxy["port"]),
                    "--store-path", self.store, "--supervisor", self.endpoint,
                    *(["--grpc-listen-port", str(self.proxy["grpc_port"])] if self.proxy.get("grpc_port") is not None
                      else []),
                    *(["--acl-file", self.proxy["acl_file"]] if self.proxy.get("acl_file") else [])]
        if name == "dashboard":
            d = self.dashboard
            return ["--namesrv-addr", s["namesrvAddr"], "--host", d["host"], "--port", str(d["port"]),
                    "--store-path", self.store, "--supervisor", self.endpoint,
                    *(["--token-file", d["token_file"]] if d["token_file"] else [])]
        common = ["--store-path", self.store, "-c", self.conf_path]
        if name == "broker":
            return [*common, "--listen-port", str(s["listenPort"]), "--namesrv-addr", s["namesrvAddr"],
                    "--supervisor", self.endpoint]
        return [*common, "--supervisor", self.endpoint]

    def _pin_port(self, child: Child) -> None:
        """An ephemeral port (0) becomes the one the actor got, so a restart binds the same port."""
        m = re.match(r"^(?:tcp|http)://(.+):(\d+)$", child.endpoint or "")
        if m is None:
            return
        port = m.group(2)
        if child.name == "nameserver":
            addrs = self.settings["namesrvAddr"].split(";")
            host, old = addrs[0].rsplit(":", 1)
            if old == "0":
                addrs[0] = f"{host}:{port}"
                self.settings["namesrvAddr"] = ";".join(addrs)
                log.info("NameServer port 0 resolved: namesrvAddr=%s", self.settings["namesrvAddr"])
        elif child.name == "controller" and self.controller["port"] == 0:
            self.controller["port"] = int(port)
            self.settings["controllerListenPort"] = int(port)
            addrs = [a for a in str(self.settings.get("controllerAddr") or "").split(";") if a]
            self.settings["controllerAddr"] = ";".join(f"127.0.0.1:{port}" if a == "127.0.0.1:0" else a for a in addrs)
            log.info("controller port 0 resolved: controllerAddr=%s", self.settings["controllerAddr"])
            self._write_conf()
        elif child.name == "proxy" and self.proxy["port"] == 0:
            self.proxy["port"] = int(port)
            log.info("proxy port 0 resolved: remotingListenPort=%s", port)
        elif child.name == "dashboard" and self.dashboard["port"] == 0:
            self.dashboard["port"] = int(port)
            log.info("dashboard port 0 resolved: %s", port)
        elif child.name == "broker" and self.settings["listenPort"] == 0:
            self.settings["listenPort"] = int(port)
            log.info("broker port 0 resolved: listenPort=%s", port)
            self._write_conf()

    # -- spawning and waiting -------------------------------------------------------------------------------
    def _group_of(self, name: str) -> Group:
        return next(g for g in self.groups if name in g.members)

    def _spawn(self, name: str) -> Child:
        if name in BROKER_GROUP or name == "nameserver":
            self._write_conf()
        cmd = python_argv(self.modules[name], *self._args(name))
        stderr_path = os.path.join(self.store, "logs", f"{name}.stderr.log")
        env = child_env({ACTOR_NAME_ENV: name})
        with open(stderr_path, "ab") as err:
            offset = err.tell()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
                                    close_fds=True, process_group=0, preexec_fn=self._preexec)
        child = Child(name, self._group_of(name), proc, stderr_path, offset)
        os.set_blocking(child.fd, False)
        self.by_fd[child.fd] = child
        self.poller.register(child.fd, zmq.POLLIN)
        log.info("spawned %s (pid %d): %s", name, child.pid, " ".join(cmd))
        return child

    def _write_restarts(self) -> None:
        """``S/run/restarts.json``: restarts of each actor since this supervisor started (the broker
        group's metrics serve it as rocketmq_actor_restarts_total)."""
        d = os.path.join(self.store, RUN_DIR)
        path = os.path.join(d, RESTARTS_FILE)
        try:
            os.makedirs(d, exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump({n: max(0, c - 1) for n, c in sorted(self.starts.items())}, f)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("cannot write %s: %s", path, e)

    def _start_actor(self, name: str) -> tuple:
        """Spawn ``name`` and wait for its ``ready`` line.  Returns (child, "") or (None, why)."""
        child = self._spawn(name)
        self.starts[name] = self.starts.get(name, 0) + 1
        self._write_restarts()
        deadline = time.monotonic() + self.ready_timeout_s
        why = ""
        told = False
        while not child.ready:
            if self.stop_requested and not told:
                # Not yet ready means no SIGTERM handler yet (imports, recovery): a SIGTERM now kills
                # it mid-recovery.  Let it finish starting (bounded by the ready timeout); the ordered
                # stop then stops it like the others.
                log.info("%s (pid %d) is still starting: the stop waits for it to be ready", name, child.pid)
                told = True
            if child.proc.poll() is not None:
                self._drain(child)
                if not child.ready:
                    why = f"{_describe_exit(child.proc.returncode)} before it was ready"
                break
            if time.monotonic() >= deadline:
                why = f"not ready within {self.ready_timeout_s:g} s"
                break
            self._poll(POLL_MS)
        if child.ready and child.proc.poll() is None:
            self.children[name] = child
            self._pin_port(child)
            log.info("%s ready (pid %d) at %s", name, child.pid, child.endpoint)
            return child, ""
        if not why:
            why = f"{_describe_exit(child.proc.returncode)} right after it was ready"
        tail = child.stderr_tail()
        if child.proc.poll() is None:
            self._stop_child(child)
        else:
            self._reap(child)
        if not self.stop_requested:
            log.error("%s (pid %d) failed to start: %s%s", name, child.pid, why,
                      f"\n--- {child.stderr_path} ---\n{tail}" if tail else "")
        return None, why

    def _start_all(self) -> bool:
        for group in self.groups:
            for name in group.members:
                if self.stop_requested:
                    return False
                child, why = self._start_actor(name)
                if child is None:
                    if not self.stop_requested:
                        self.failed = True
                        self.say(f"failed {name}: {why}")
                    return False
                self.say(f"started {name} pid {child.pid} {child.endpoint}")
        return True

    # -- polling: beats and child output ---------------------------------------------------------------------
    def _poll(self, timeout_ms: float) -> None:
        try:
            events = self.poller.poll(timeout_ms)
        except zmq.ZMQError as e:
            if e.errno == errno.EINTR:
                return
            raise
        for sock, _ in events:
            if sock is self.router:
                self._on_beats()
            else:
                child = self.by_fd.get(sock)
                if child is not None:
                    self._read(child)

    def _on_beats(self) -> None:
        for _ in range(1024):
            try:
                parts = self.router.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                frame = P.decode(parts[1:])
            except ProtocolError as e:
                log.debug("bad frame on the beat socket: %s", e.remark)
                continue
            if frame.code != RequestCode.ACTOR_BEAT:
                continue
            pid = frame.fields.get("pid")
            child = next((c for c in self.children.values() if c.pid == pid), None)
            if child is None:
                child = next((c for c in self.by_fd.values() if c.pid == pid), None)
            if child is not None:
                child.last_beat = time.monotonic()
                child.beats += 1

    def _read(self, child: Child) -> bool:
        """Read what the child wrote; False at end of file (then the pipe is closed)."""
        while True:
            try:
                data = os.read(child.fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                if child.buf:
                    self._line(child, child.buf)
                    child.buf = b""
                self._close_pipe(child)
                return False
            child.buf += data
            while b"\n" in child.buf:
                line, child.buf = child.buf.split(b"\n", 1)
                self._line(child, line)
            if len(child.buf) > MAX_LINE:
                self._line(child, child.buf)
                child.buf = b""

    def _line(self, child: Child, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if child.endpoint is None and (line == "ready" or line.startswith("ready ")):
            child.endpoint = line[len("ready"):].strip()
            child.ready_at = time.monotonic()
            return
        log.info("%s[%d]: %s", child.name, child.pid, line)

    def _drain(self, child: Child) -> None:
        if self.by_fd.get(child.fd) is child:      # (a closed pipe's fd number may be another child's now)
            self._read(child)

    def _close_pipe(self, child: Child) -> None:
        if self.by_fd.get(child.fd) is child:
            self.poller.unregister(child.fd)
            del self.by_fd[child.fd]
        if child.proc.stdout is not None and not child.proc.stdout.closed:
            child.proc.stdout.close()

    def _reap(self, child: Child) -> Optional[int]:
        """Wait for an exited (or killed) child, keep its last output, close its pipe."""
        try:
            code = child.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self._drain(child)
        self._close_pipe(child)
        if self.children.get(child.name) is child:
            del self.children[child.name]
        return code

    def _kill(self, child: Child) -> None:
        try:
            child.proc.kill()
        except ProcessLookupError:
            pass
        self._reap(child)

    # -- stopping -------------------------------------------------------------------------------------------
    def _stop_child(self, child: Child) -> bool:
        """SIGTERM, wait ``stop_timeout_s`` (then SIGKILL).  True when it exited with code 0."""
        child.stopping = True
        if child.proc.poll() is None:
            try:
                child.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.stop_timeout_s
        while child.proc.poll() is None and time.monotonic() < deadline:
            self._poll(min(POLL_MS, max(1.0, (deadline - time.monotonic()) * 1000)))
        killed = child.proc.poll() is None
        if killed:
            log.error("%s (pid %d) did not stop within %g s: SIGKILL", child.name, child.pid, self.stop_timeout_s)
            self.say(f"killed {child.name} pid {child.pid}: not stopped within {self.stop_timeout_s:g} s")
            self._kill(child)
        else:
            self._reap(child)
        code = child.proc.returncode
        clean = not killed and code == 0
        if clean:
            log.info("stopped %s (pid %d): exit code 0", child.name, child.pid)
        else:
            tail = child.stderr_tail()
            log.error("stopped %s (pid %d): %s%s", child.name, child.pid, _describe_exit(code),
                      f"\n--- {child.stderr_path} ---\n{tail}" if tail else "")
        return clean

    def _stop_group(self, group: Group, skip: Optional[Child] = None) -> bool:
        """Stop the running members of ``group`` (leader first, then in start order).
        True when every member was running (or, in a group restart a stop interrupted, not started
        yet: ``group.unstarted``) and exited 0."""
        clean = True
        for name in group.members:
            child = self.children.get(name)
            if child is None or child is skip:
                clean = clean and child is None and name in group.unstarted
                continue
            clean = self._stop_child(child) and clean
        return clean

    def _stop_all(self) -> int:
        """The ordered stop: the broker group (broker first), then the NameServer.  Removes
        ``abort`` when the whole broker group stopped with exit code 0.  Returns the exit code."""
        self.stop_requested = True
        all_clean = True
        for group in reversed(self.groups):            # broker group before the NameServer
            if group.given_up:
                continue
            pending = group.restart_all_at is not None or bool(group.pending)
            running = any(n in self.children for n in group.members)
            clean = self._stop_group(group) if running else False
            clean = clean and not pending
            if group.name == "broker":
                abort = os.path.join(self.store, ABORT_FILE)
                if clean:
                    if os.path.exists(abort):
                        os.unlink(abort)
                    log.info("broker group stopped cleanly; %s removed", abort)
                elif os.path.exists(abort):
                    log.warning("broker group did not stop cleanly: %s stays (the next start recovers)", abort)
            all_clean = all_clean and clean
        code = 0 if all_clean and not self.failed else 1
        if code == 0:
            self.say("stopped cleanly")
            log.info("supervisor stopped cleanly")
        else:
            self.say("stopped, not cleanly (see " + os.path.join(self.store, "logs", LOG_FILE) + ")")
            log.warning("supervisor stopped, not cleanly (exit code 1)")
        return code

    # -- supervision ---------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stop_requested:
            self._poll(POLL_MS)
            self._check_children()
            if not self._anything_left():
                log.error("nothing left running: exiting")
                self.failed = True
                return
            self._run_due_restarts()

    def _anything_left(self) -> bool:
        return any(not g.given_up for g in self.groups)

    def _check_children(self) -> None:
        for group in self.groups:
            for name in group.members:
                child = self.children.get(name)
                if child is None or child.stopping:
                    continue
                code = child.proc.poll()
                if code is not None:
                    self._reap(child)
                    self._on_failure(child, _describe_exit(code))
                    continue
                seen = max(child.ready_at or child.started_at, child.last_beat or 0.0)
                if time.monotonic() - seen > self.liveness_s:
                    why = f"no beat for {time.monotonic() - seen:.1f} s (liveness {self.liveness_s:g} s)"
                    log.error("%s (pid %d): %s: SIGKILL", name, child.pid, why)
                    self._kill(child)
                    self._on_failure(child, why)

    def _on_failure(self, child: Child, why: str) -> None:
        tail = child.stderr_tail()
        log.error("%s (pid %d) died: %s%s", child.name, child.pid, why,
                  f"\n--- {child.stderr_path} ---\n{tail}" if tail else "")
        self._record_failure(child.group, child.name, why)

    def _record_failure(self, group: Group, name: str, why: str) -> None:
        """Apply the restart policy to ``name`` of ``group`` (not running any more)."""
        if group.given_up or self.stop_requested:
            return
        now = time.monotonic()
        while group.restarts and now - group.restarts[0] > self.restart_window_s:
            group.restarts.popleft()
        if len(group.restarts) >= self.max_restarts:
            self._give_up(group, f"{len(group.restarts)} restarts within {self.restart_window_s:g} s; "
                                 f"last failure: {name}: {why}")
            return
        delay = min(self.restart_backoff_s * (2 ** len(group.restarts)), self.restart_backoff_max_s)
        group.restarts.append(now)
        n = len(group.restarts)
        if name == group.members[0]:
            others = [m for m in group.members[1:] if m in self.children]
            if others:
                log.warning("%s died: stopping %s before the %s group restarts (its recovery must run with no "
                            "other writer)", name, ", ".join(others), group.name)
                self._stop_group(group)
            group.pending.clear()
            group.restart_all_at = now + delay
            log.warning("restarting the %s group in %.2f s (restart %d of %d within %g s)", group.name, delay, n,
                        self.max_restarts, self.restart_window_s)
        elif group.restart_all_at is None:
            group.pending[name] = now + delay
            log.warning("restarting %s in %.2f s (restart %d of %d of the %s group within %g s)", name, delay, n,
                        self.max_restarts, group.name, self.restart_window_s)

    def _give_up(self, group: Group, why: str) -> None:
        log.error("giving up on the %s group (%s): stopping it", group.name, why)
        self.say(f"gave up {group.name}: {why}")
        group.given_up = True
        group.pending.clear()
        group.restart_all_at = None
        self._stop_group(group)
        self.failed = True

    def _run_due_restarts(self) -> None:
        for group in self.groups:
            if group.given_up or self.stop_requested:
                continue
            now = time.monotonic()
            if group.restart_all_at is not None and now >= group.restart_all_at:
                group.restart_all_at = None
                group.unstarted.clear()
                for i, name in enumerate(group.members):
                    if name in self.children or name in group.pending:
                        continue
                    self._restart(group, name)      # a member that fails gets its own pending restart
                    if self.stop_requested and group.restart_all_at is None and not group.given_up \
                            and group.members[0] in self.children:
                        group.unstarted = {m for m in group.members[i + 1:]
                                           if m not in self.children and m not in group.pending}
                    if group.restart_all_at is not None or group.given_up or self.stop_requested:
                        break                       # the leader failed again: the group waits its backoff
                continue
            for name, due in sorted(group.pending.items(), key=lambda kv: kv[1]):
                if due > now or self.stop_requested or group.given_up:
                    continue
                del group.pending[name]
                if group.members[0] not in self.children:
                    continue        # the leader is down: the group restart starts it
                self._restart(group, name)

    def _restart(self, group: Group, name: str) -> bool:
        child, why = self._start_actor(name)
        if child is None:
            if not self.stop_requested:
                self._record_failure(group, name, f"restart failed: {why}")
            return False
        log.warning("restarted %s: pid %d at %s", name, child.pid, child.endpoint)
        return True


# -- command line -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rmq.actors.supervisor", description=__doc__.split("\n")[0])
    p.add_argument("-c", "--config", default=None, help="broker.conf (RocketMQ key=value property names)")
    p.add_argument("--store-path", default=None, help="store directory (default: storePathRootDir or ./rmq-data)")
    p.add_argument("--namesrv-addr", default=None,
                   help="NameServer address(es) h:p;h:p (default 127.0.0.1:9876; the one started here listens "
                        "on the first; port 0 = ephemeral)")
    p.add_argument("--listen-port", type=int, default=None, help="broker port (default 10911; 0 = ephemeral)")
    p.add_argument("--no-namesrv", action="store_true", help="start only the broker group")
    p.add_argument("--dashboard", action="store_true", default=None,
                   help="also run the web dashboard (dashboardEnable=true)")
    p.add_argument("--dashboard-port", type=int, default=None, help="dashboardPort (default 8082; 0 = any free)")
    p.add_argument("--enable-proxy", action="store_true", default=None,
                   help="also run the remoting proxy for RocketMQ's own clients (enableProxy=true)")
    p.add_argument("--remoting-listen-port", type=int, default=None,
                   help="remotingListenPort of the proxy (default 8080; 0 = any free)")
    p.add_argument("--grpc-listen-port", type=int, default=None,
                   help="grpcServerPort of the proxy (default 8081; 0 = any free)")
    p.add_argument("--controller", action="store_true", default=None,
                   help="also run a controller beside the NameServer (enableControllerInNamesrv=true)")
    p.add_argument("--controller-port", type=int, default=None,
                   help="controllerListenPort (default 9878; 0 = any free)")
    p.add_argument("--ready-timeout-s", type=float, default=READY_TIMEOUT_S)
    p.add_argument("--stop-timeout-s", type=float, default=STOP_TIMEOUT_S)
    p.add_argument("--max-restarts", type=int, default=MAX_RESTARTS)
    p.add_argument("--restart-window-s", type=float, default=RESTART_WINDOW_S)
    p.add_argument("--restart-backoff-ms", type=float, default=RESTART_BACKOFF_S * 1000)
    p.add_argument("--restart-backoff-max-ms", type=float, default=RESTART_BACKOFF_MAX_S * 1000)
    p.add_argument("--heartbeat-liveness", type=int, default=HEARTBEAT_LIVENESS,
                   help="beats an actor may miss before it is killed and restarted")
    p.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)   # set by `rmq start --detach`
    return p


def main(argv: Optional[list] = None) -> int:
    """``python -m rmq.actors.supervisor [options]``: what ``rmq start`` runs."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.max_restarts < 0 or a.heartbeat_liveness < 1 or min(a.ready_timeout_s, a.stop_timeout_s) <= 0:
        p.error("--max-restarts must be >= 0, --heartbeat-liveness >= 1, timeouts > 0")
    try:
        settings = resolve_settings(a.config, a.store_path, a.namesrv_addr, a.listen_port,
                                    {"dashboardEnable": "true" if a.dashboard else None, "dashboardPort": a.dashboard_port,
                                     "enableProxy": "true" if a.enable_proxy else None,
                                     "remotingListenPort": a.remoting_listen_port,
                                     "grpcServerPort": a.grpc_listen_port,
                                     "enableControllerInNamesrv": "true" if a.controller else None,
                                     "controllerListenPort": a.controller_port})
        sup = Supervisor(settings, a.config, start_namesrv=not a.no_namesrv, ready_timeout_s=a.ready_timeout_s,
                         stop_timeout_s=a.stop_timeout_s, restart_backoff_s=a.restart_backoff_ms / 1000.0,
                         restart_backoff_max_s=a.restart_backoff_max_ms / 1000.0, max_restarts=a.max_restarts,
                         restart_window_s=a.restart_window_s, heartbeat_liveness=a.heartbeat_liveness,
                         detached=a.detached)
        return sup.run()
    except (BrokerConfError, SupervisorError) as e:
        print(f"rmq: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
