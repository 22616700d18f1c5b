"""The supervisor as a real process with **stand-in** actors: the real NameServer plus the
test-only fake broker group (tests/integration/fake_actor.py, injected with RMQ_ACTOR_MODULES),
on loopback ephemeral ports.

Why stand-ins here.  test_supervisor_real.py runs the same paths with the real broker, reput,
flush, cleaner and ha: start order and the ordered stop, every actor SIGKILLed and restarted
(the broker with its group), repeated crashes given up, a hung actor (SIGSTOP) killed, a stop
timeout, the broker's exit 75 restarting its group, ``rmq start --detach`` /
``--slave-store-path`` and ``rmq demo store``.  What stays here is what a real actor cannot be
made to show on demand, or what only a stand-in can record:

- an actor that exits *by itself* with an error code after it was ready, once or in a loop
  (``FAKE_ACTOR_CRASH``): a real actor does so only on an I/O fault; the real tests kill instead;
- an actor that stays alive and never says ready (``FAKE_ACTOR_NO_READY``): a real one is
  ready within milliseconds, and stopping it before that is a race;
- an actor that hangs *by itself* after a set time (``FAKE_ACTOR_HANG``) or takes 30 s to stop
  (``FAKE_ACTOR_SLOW_STOP``): exact timing the real tests replace with SIGSTOP;
- the exact order in which each actor *received* its stop and the argv it was given (the stand-in
  writes both to fake-events.log / fake-broker.args.json); the real tests check the order of the
  supervisor's own "stopped" lines.
"""
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from rmq.actors.supervisor import SupervisorError, actor_modules, supervisor_running
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.conftest import ROOT, source_tree_env

pytestmark = pytest.mark.integration     # every wait below is bounded

FAKE = "tests.integration.fake_actor"
GROUP = ("broker", "reput", "flush", "cleaner", "ha")
FAKE_MODULES = ",".join(f"{n}={FAKE}" for n in GROUP)
WAIT_S = 30


def wait_for(cond, timeout=WAIT_S, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive(pid):
    """Running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def events(store):
    try:
        with open(os.path.join(store, "fake-events.log")) as f:
            return [tuple(line.split()) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def of(evs, kind):
    """[(name, pid)] of the events of ``kind``, in order."""
    return [(n, int(p)) for k, n, p in evs if k == kind]


class Sup:
    """A supervisor (or `rmq` CLI) process; stdout lines collected by a thread."""

    def __init__(self, tmp_path, args, env=None, cmd=None, name="sup"):
        self.stderr_path = str(tmp_path / f"{name}.stderr")
        self._err = open(self.stderr_path, "w")
        base = cmd or [sys.executable, "-m", "rmq.actors.supervisor"]
        self.proc = subprocess.Popen([*base, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **source_tree_env(),
                                          "RMQ_ACTOR_MODULES": FAKE_MODULES, **(env or {})})
        self.lines = []
        self._q = queue.Queue()
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self):
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_line(self, prefix, timeout=WAIT_S):
        """The first line starting with ``prefix`` (None when the process closed stdout first)."""
        for line in self.lines:
            if line.startswith(prefix):
                return line
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line within {timeout} s; got {self.lines}; "
                                     f"stderr: {self.stderr()}") from None
            if line is None:
                self._q.put(None)
                return None
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def started(self):
        """{name: (pid, endpoint)} from the `started` lines."""
        out = {}
        for line in self.lines:
            m = re.match(r"^started (\w+) pid (\d+) (\S+)$", line)
            if m:
                out[m.group(1)] = (int(m.group(2)), m.group(3))
        return out

    def ready(self):
        line = self.wait_line("ready ")
        assert line is not None, f"supervisor did not start: {self.lines} {self.stderr()}"
        return self.started()

    def stderr(self):
        with open(self.stderr_path) as f:
            return f.read()

    def wait(self, timeout=WAIT_S):
        code = self.proc.wait(timeout)
        self._t.join(5)
        while True:         # the rest of stdout
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return code

    def stop(self, sig=signal.SIGTERM, timeout=WAIT_S):
        self.proc.send_signal(sig)
        return self.wait(timeout)

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()        # its actors get SIGTERM (PR_SET_PDEATHSIG)
                self.proc.wait()
        self._t.join(5)
        self.proc.stdout.close()
        self._err.close()


@pytest.fixture
def store(tmp_path):
    d = tmp_path / "store"
    return str(d)


@pytest.fixture
def supervisor(tmp_path, store):
    """``supervisor(*args, env=...)`` runs the supervisor on ``store`` with ephemeral ports."""
    started = []

    def start(*args, env=None, ephemeral=True):
        ports = ["--namesrv-addr", "127.0.0.1:0", "--listen-port", "0"] if ephemeral else []
        s = Sup(tmp_path, ["--store-path", store, *ports, *args], env=env, name=f"sup{len(started)}")
        started.append(s)
        return s

    yield start
    for s in started:
        s.cleanup()
    pid = _pid_in(store)
    # a detached supervisor left by a failing test: only while it holds the store's lock (a pid left
    # in a stale rmq.pid may be another test's process by now: pids wrap at 32768 here)
    if pid and alive(pid) and supervisor_running(store):
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), what="the detached supervisor to stop")


def _pid_in(store):
    try:
        with open(os.path.join(store, "rmq.pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def cluster_info(ns_endpoint):
    with RemotingClient() as c:
        r = c.invoke(ns_endpoint, Frame(RequestCode.GET_BROKER_CLUSTER_INFO), 5000)
    assert r.code == ResponseCode.SUCCESS
    return msgpack.unpackb(bytes(r.bodies[0]))


def log_text(store):
    with open(os.path.join(store, "logs", "supervisor.log")) as f:
        return f.read()


# -- tests ------------------------------------------------------------------------------------------------
def test_actor_modules_injection():
    assert actor_modules(None)["broker"] == "rmq.actors.broker"
    m = actor_modules(f" broker={FAKE} , reput={FAKE},")
    assert m["broker"] == m["reput"] == FAKE and m["flush"] == "rmq.actors.flush"
    for bad in ("hq=x.y", "broker", "broker=not a module", "broker=x..y"):
        with pytest.raises(SupervisorError, match="RMQ_ACTOR_MODULES"):
            actor_modules(bad)


def test_starts_in_order_and_sigterm_stops_in_reverse_cleanly(supervisor, store):
    sup = supervisor()
    started = sup.ready()
    assert list(started) == ["nameserver", *GROUP]
    assert sup.lines[0] == f"store {store}"
    ns_endpoint = started["nameserver"][1]
    ns_port = int(ns_endpoint.rsplit(":", 1)[1])
    assert ns_endpoint.startswith("tcp://127.0.0.1:") and ns_port > 0
    broker_port = int(started["broker"][1].rsplit(":", 1)[1])

    # the broker group started in order, each after the previous one was ready
    assert [n for n, _ in of(events(store), "start")] == list(GROUP)
    assert [p for _, p in of(events(store), "start")] == [started[n][0] for n in GROUP]
    # the broker was told the NameServer's real address and registered there
    assert ("registered-0", "broker", str(started["broker"][0])) in events(store)
    info = cluster_info(ns_endpoint)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": f"127.0.0.1:{broker_port}"}
    # the effective broker.conf has the resolved ports; every actor got it
    with open(os.path.join(store, "broker.effective.conf")) as f:
        conf = f.read()
    assert f"namesrvAddr=127.0.0.1:{ns_port}\n" in conf and f"listenPort={broker_port}\n" in conf
    assert f"storePathRootDir={store}\n" in conf

    assert _pid_in(store) == sup.proc.pid
    assert os.path.exists(os.path.join(store, "abort"))
    time.sleep(1.5)         # a few beats go by: nobody is declared dead
    assert all(alive(pid) for pid, _ in started.values())

    assert sup.stop() == 0
    assert sup.lines[-1] == "stopped cleanly"
    assert [n for n, _ in of(events(store), "stop")] == list(GROUP)        # broker first
    assert not any(alive(pid) for pid, _ in started.values())
    text = log_text(store)
    order = [text.index(f"stopped {n} (pid {started[n][0]}): exit code 0") for n in (*GROUP, "nameserver")]
    assert order == sorted(order)                                          # the NameServer last
    assert not os.path.exists(os.path.join(store, "abort"))
    assert not os.path.exists(os.path.join(store, "rmq.pid"))
    assert "died" not in text


def test_sigint_stops_too_and_second_supervisor_is_refused(supervisor, store):
    sup = supervisor()
    sup.ready()
    other = supervisor()
    assert other.wait() == 1
    assert "already running" in other.stderr()
    assert sup.proc.poll() is None
    assert sup.stop(signal.SIGINT) == 0
    assert not os.path.exists(os.path.join(store, "abort"))


def test_crashed_actor_is_restarted(supervisor, store):
    sup = supervisor("--restart-backoff-ms", "100", env={"FAKE_ACTOR_CRASH": "reput:0.5:once"})
    started = sup.ready()
    wait_for(lambda: len([n for n, _ in of(events(store), "start") if n == "reput"]) == 2,
             what="reput to be restarted")
    reputs = [p for n, p in of(events(store), "start") if n == "reput"]
    assert reputs[0] == started["reput"][0] and reputs[1] != reputs[0]
    assert of(events(store), "crash") == [("reput", reputs[0])]
    wait_for(lambda: alive(reputs[1]), what="the new reput")
    # nobody else was touched
    assert [n for n, _ in of(events(store), "start")].count("broker") == 1
    assert of(events(store), "stop") == []
    assert "reput (pid %d) died: exit code 3" % reputs[0] in log_text(store)
    wait_for(lambda: "restarted reput" in log_text(store), what="the restart to be logged")
    assert sup.stop() == 0
    assert [n for n, _ in of(events(store), "stop")] == list(GROUP)
    assert not os.path.exists(os.path.join(store, "abort"))


def test_dead_broker_restarts_its_group_in_order_on_the_same_port(supervisor, store):
    sup = supervisor("--restart-backoff-ms", "100")
    started = sup.ready()
    os.kill(started["broker"][0], signal.SIGKILL)
    wait_for(lambda: [n for n, _ in of(events(store), "start")].count("ha") == 2,
             what="the broker group to be restarted")
    evs = [(k, n) for k, n, _ in events(store) if k in ("start", "stop")]
    assert evs == [("start", "broker"), ("start", "reput"), ("start", "flush"), ("start", "cleaner"), ("start", "ha"),
                   ("stop", "reput"), ("stop", "flush"), ("stop", "cleaner"), ("stop", "ha"),   # no writer left
                   ("start", "broker"), ("start", "reput"), ("start", "flush"), ("start", "cleaner"), ("start", "ha")]
    assert all(p != started[n][0] for n, p in of(events(store), "start")[5:])
    assert "broker (pid %d) died: killed by SIGKILL" % started["broker"][0] in log_text(store)
    # the restarted broker binds the port the first one got, and knows the NameServer
    with open(os.path.join(store, "fake-broker.args.json")) as f:
        argv = json.load(f)["argv"]
    assert argv[argv.index("--listen-port") + 1] == started["broker"][1].rsplit(":", 1)[1]
    assert argv[argv.index("--namesrv-addr") + 1] == started["nameserver"][1][len("tcp://"):]
    assert alive(started["nameserver"][0])
    assert sup.stop() == 0
    assert not os.path.exists(os.path.join(store, "abort"))


@pytest.mark.slow   # the fast tier has test_supervisor_real.py::test_real_repeated_crashes_are_given_up_and_reported
def test_repeated_crashes_are_given_up_and_reported(supervisor, store):
    sup = supervisor("--restart-backoff-ms", "50", "--max-restarts", "2",
                     env={"FAKE_ACTOR_CRASH": "flush:0.3"})
    started = sup.ready()
    line = sup.wait_line("gave up ")
    assert line.startswith("gave up broker: 2 restarts within 60 s; last failure: flush: exit code 3")
    assert "giving up on the broker group" in sup.stderr()
    assert [n for n, _ in of(events(store), "start")].count("flush") == 3
    assert [n for n, _ in of(events(store), "crash")] == ["flush"] * 3
    # the rest of the group was stopped; the NameServer still serves, so the supervisor stays
    wait_for(lambda: not any(alive(p) for n, p in of(events(store), "start")), what="the group to stop")
    time.sleep(0.5)
    assert sup.proc.poll() is None and alive(started["nameserver"][0])
    assert cluster_info(started["nameserver"][1])["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert [n for n, _ in of(events(store), "crash")] == ["flush"] * 3      # not looping
    assert sup.stop() == 1                          # a group was given up
    assert os.path.exists(os.path.join(store, "abort"))
    assert not os.path.exists(os.path.join(store, "rmq.pid"))


def test_no_namesrv_joins_a_cluster_and_exits_when_nothing_is_left(supervisor, store, actors, tmp_path):
    ns = actors("-m", "rmq.actors.nameserver", "--listen-port", "0", "--store-path", str(tmp_path))
    conf = tmp_path / "broker-b.conf"
    conf.write_text("# a second broker group\nbrokerClusterName = ClusterX\nbrokerName = broker-b\n"
                    "namesrvAddr = 127.0.0.1:1\n")
    sup = supervisor("-c", str(conf), "--no-namesrv", "--namesrv-addr", ns.endpoint[len("tcp://"):],
                     "--listen-port", "0", "--restart-backoff-ms", "50", "--max-restarts", "1",
                     env={"FAKE_ACTOR_CRASH": "cleaner:0.5"}, ephemeral=False)
    started = sup.ready()
    assert list(started) == list(GROUP)                         # no NameServer of its own
    info = cluster_info(ns.endpoint)
    assert info["clusterAddrTable"] == {"ClusterX": ["broker-b"]}
    assert sup.wait() == 1                                      # given up, nothing left: exits by itself
    assert "giving up on the broker group" in sup.stderr()
    assert [n for n, _ in of(events(store), "crash")] == ["cleaner"] * 2
    assert not any(alive(p) for _, p in of(events(store), "start"))
    assert ns.proc.poll() is None                               # the other node's NameServer is not ours


@pytest.mark.slow   # the fast tier has test_supervisor_real.py::test_real_hung_actor_is_killed_and_restarted
def test_hung_actor_is_killed_and_restarted(supervisor, store):
    sup = supervisor("--restart-backoff-ms", "100", "--heartbeat-liveness", "3",
                     env={"FAKE_ACTOR_HANG": "flush:0.3:once"})
    started = sup.ready()
    wait_for(lambda: [n for n, _ in of(events(store), "start")].count("flush") == 2, what="flush restarted")
    assert ("hang", "flush", str(started["flush"][0])) in events(store)
    assert not alive(started["flush"][0])
    assert re.search(r"flush \(pid %d\): no beat for [\d.]+ s \(liveness 3 s\): SIGKILL" % started["flush"][0],
                     sup.stderr())
    assert sup.stop() == 0


def test_stop_during_a_restart_waits_for_the_starting_actor(supervisor, store):
    """A stop that lands while a restarted actor is still starting (its SIGTERM handler not yet
    installed) waits for it to be ready, then stops it cleanly: no actor is killed mid-recovery."""
    sup = supervisor("--restart-backoff-ms", "100",
                     env={"FAKE_ACTOR_CRASH": "flush:0.3:once", "FAKE_ACTOR_SLOW_START": "flush:3:restart"})
    started = sup.ready()
    wait_for(lambda: ("slow-start", "flush") in [(k, n) for k, n, _ in events(store)], what="flush restarting")
    assert sup.stop() == 0, sup.stderr()
    assert "is still starting: the stop waits" in log_text(store)
    restarted = [p for n, p in of(events(store), "start") if n == "flush"]
    assert len(restarted) == 2 and restarted[0] == started["flush"][0]
    assert ("flush", restarted[1]) in of(events(store), "stop")
    assert not os.path.exists(os.path.join(store, "abort"))


def test_stop_during_a_group_restart_is_clean_without_the_members_not_started_yet(supervisor, store):
    """The group leader died, the group restarts in order, and a stop lands while a member is
    still starting: that member is waited for and stopped, the members after it are never
    started (they never ran against the recovered store), and the stop is clean (abort removed)."""
    sup = supervisor("--restart-backoff-ms", "100",
                     env={"FAKE_ACTOR_CRASH": "broker:0.3:once", "FAKE_ACTOR_SLOW_START": "flush:3:restart"})
    started = sup.ready()
    wait_for(lambda: ("slow-start", "flush") in [(k, n) for k, n, _ in events(store)], what="flush restarting")
    assert sup.stop() == 0, sup.stderr()
    starts = [n for n, _ in of(events(store), "start")]
    first = starts.index("broker", 1)                                 # the group restart, up to the stop
    assert starts[:first] == ["broker", "reput", "flush", "cleaner", "ha"] and \
        starts[first:] == ["broker", "reput", "flush"], (starts, started)
    assert [n for n, _ in of(events(store), "stop")][-3:] == ["broker", "reput", "flush"]
    assert not os.path.exists(os.path.join(store, "abort"))


def test_actor_not_ready_in_time_stops_what_started(supervisor, store):
    sup = supervisor("--ready-timeout-s", "2", env={"FAKE_ACTOR_NO_READY": "flush"})
    assert sup.wait() == 1
    assert any(line.startswith("failed flush: not ready within 2 s") for line in sup.lines)
    assert "flush (pid" in sup.stderr() and "failed to start: not ready within 2 s" in sup.stderr()
    assert [n for n, _ in of(events(store), "start")] == ["broker", "reput", "flush"]
    assert [n for n, _ in of(events(store), "stop")] == ["flush", "broker", "reput"]
    starts = of(events(store), "start")
    assert not any(alive(p) for _, p in starts)
    assert os.path.exists(os.path.join(store, "abort"))          # the group never ran complete
    assert not os.path.exists(os.path.join(store, "rmq.pid"))


def test_actor_exiting_before_ready_is_reported(supervisor, store):
    sup = supervisor(env={"RMQ_ACTOR_MODULES": FAKE_MODULES.replace(f"cleaner={FAKE}",
                                                                    "cleaner=tests.integration.no_such_actor")})
    assert sup.wait() == 1
    err = sup.stderr()
    assert "cleaner (pid" in err and "exit code 1 before it was ready" in err
    assert "No module named tests.integration.no_such_actor" in err         # the child's stderr tail
    assert [n for n, _ in of(events(store), "stop")] == ["broker", "reput", "flush"]


@pytest.mark.slow   # the fast tier has test_supervisor_real.py::test_real_stop_timeout_kills_a_hung_actor_and_keeps_abort
def test_stop_timeout_kills_and_keeps_abort(supervisor, store):
    sup = supervisor("--stop-timeout-s", "3", env={"FAKE_ACTOR_SLOW_STOP": "reput:30"})  # others stop in < 1.1 s
    started = sup.ready()
    assert sup.stop() == 1
    assert "reput (pid %d) did not stop within 3 s: SIGKILL" % started["reput"][0] in sup.stderr()
    assert [n for n, _ in of(events(store), "stop")] == ["broker", "flush", "cleaner", "ha"]
    assert not alive(started["reput"][0])
    assert os.path.exists(os.path.join(store, "abort"))


def rmq(tmp_path, *args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "rmq.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **source_tree_env(), "RMQ_ACTOR_MODULES": FAKE_MODULES,
                                                **(env or {})})


def test_cli_start_detach_and_stop_round_trip(supervisor, store, tmp_path):
    r = rmq(tmp_path, "stop", "--store-path", store)
    assert r.returncode == 1 and "not running" in r.stderr

    r = rmq(tmp_path, "start", "--detach", "--store-path", store, "--namesrv-addr", "127.0.0.1:0",
            "--listen-port", "0")
    assert r.returncode == 0, r.stderr
    assert f"store {store}" in r.stdout and "started nameserver pid" in r.stdout
    assert "started broker pid" in r.stdout and f"rmq stop --store-path {store}" in r.stdout
    pid = _pid_in(store)
    assert pid and alive(pid)
    m = re.search(r"started nameserver pid \d+ (tcp://\S+)", r.stdout)
    assert cluster_info(m.group(1))["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert os.getsid(pid) == pid                 # its own session: detached from this terminal
    pids = [p for _, p in of(events(store), "start")]

    r2 = rmq(tmp_path, "start", "--detach", "--store-path", store, "--namesrv-addr", "127.0.0.1:0")
    assert r2.returncode == 1 and "already running" in r2.stderr

    r = rmq(tmp_path, "stop", "--store-path", store)
    assert r.returncode == 0, r.stderr
    assert "rmq stopped cleanly" in r.stdout
    # bounded wait: on a loaded machine the last child's /proc entry can outlive the reply briefly
    wait_for(lambda: not alive(pid) and not any(alive(p) for p in pids), 60, what="every actor gone")
    assert not os.path.exists(os.path.join(store, "rmq.pid"))
    assert not os.path.exists(os.path.join(store, "abort"))
    assert [n for n, _ in of(events(store), "stop")] == list(GROUP)


def test_cli_detach_reports_a_failed_start(supervisor, store, tmp_path):
    modules = FAKE_MODULES.replace(f"broker={FAKE}", "broker=tests.integration.no_such_actor")
    r = rmq(tmp_path, "start", "--detach", "--store-path", store, "--namesrv-addr", "127.0.0.1:0",
            "--listen-port", "0", env={"RMQ_ACTOR_MODULES": modules})
    assert r.returncode == 1
    assert "rmq did not start (supervisor exit code 1)" in r.stderr
    assert "failed broker: exit code 1 before it was ready" in r.stdout
    assert not os.path.exists(os.path.join(store, "rmq.pid"))


def test_cli_foreground_ctrl_c_and_bad_config(store, tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-z\nflushDiskType = SYNC_FLUSH\n")
    sup = Sup(tmp_path, ["start", "-c", str(conf), "--store-path", store, "--namesrv-addr", "127.0.0.1:0",
                         "--listen-port", "0"], cmd=[sys.executable, "-m", "rmq.cli"], name="cli")
    try:
        line = sup.wait_line("rmq running")
        assert line and "nameserver tcp://127.0.0.1:" in line and "broker tcp://127.0.0.1:" in line
        assert f"store {store}" in line
        with open(os.path.join(store, "broker.effective.conf")) as f:
            conf_text = f.read()
        assert "brokerName=broker-z\n" in conf_text and "flushDiskType=SYNC_FLUSH\n" in conf_text
        assert sup.stop(signal.SIGINT) == 0         # Ctrl-C reaches only the supervisor: ordered stop
        assert [n for n, _ in of(events(store), "stop")] == list(GROUP)
        assert sup.lines[-1] == "stopped cleanly"
    finally:
        sup.cleanup()

    conf.write_text("brokerName=broker-z\nthis is not a property\n")
    r = rmq(tmp_path, "start", "-c", str(conf), "--store-path", store)
    assert r.returncode == 1 and f"{conf}:2: expected key=value" in r.stderr
