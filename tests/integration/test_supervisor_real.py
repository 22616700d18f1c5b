"""The supervisor with the real actors (issue 19, item 5), no stand-ins: start order and the
ordered stop; each actor killed with SIGKILL is started again (the broker with its whole group)
and the cluster serves afterwards; repeated crashes are given up and reported; a hung actor
(SIGSTOP) is killed and restarted, and one hung at stop is killed after the stop timeout; the broker's exit 75 after an HA divergence restarts its
group, whose recovery truncates the diverged tail; ``rmq start --slave-store-path`` runs a
replicating pair; ``rmq demo store`` runs end to end.  test_supervisor.py keeps the stand-in
tests for the failures a real actor cannot be made to show (see its docstring)."""
import os
import re
import signal
import subprocess
import time

import pytest

from rmq import Message, Producer, PullConsumer
from rmq.client.consumer import MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.launch import child_env, python_argv
from tests.integration.test_broker import pull_all
from tests.integration.test_ha import commitlog_digests, create_topic, fill, promote, runtime
from tests.integration.test_supervisor import Sup, cluster_info, log_text, wait_for

pytestmark = pytest.mark.integration

DEADLINE_S = 90
ACTORS = ("reput", "flush", "cleaner", "ha", "broker", "nameserver")


def rmq(*args, timeout=180):
    return subprocess.run(python_argv("rmq.cli", *args), capture_output=True, text=True, timeout=timeout,
                          env=child_env())


def spawned(store) -> dict:
    """name -> pid of the latest spawn of each actor, from the supervisor's log."""
    out = {}
    with open(os.path.join(store, "logs", "supervisor.log"), errors="replace") as f:
        for m in re.finditer(r"spawned (\w+) \(pid (\d+)\)", f.read()):
            out[m.group(1)] = int(m.group(2))
    return out


def alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def serves(namesrv, n) -> None:
    """A send through the NameServer's route, then the message read back (long polling)."""
    body = b"after restart %d" % n
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            with Producer(namesrv, group="sup-real-pg") as p:
                r = p.send(Message("SupReal", body))
            break
        except Exception:                      # the route / broker may still be coming back
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert r.status.name == "SEND_OK"
    with PullConsumer(namesrv, group="sup-real-cg") as c:
        mq = MessageQueue("SupReal", r.message_queue.broker_name, r.message_queue.queue_id)
        got = []
        while not got and time.monotonic() < deadline:
            res = c.pull_block_if_not_found(mq, "*", r.queue_offset, 1, timeout_ms=1000)
            got = [m.body for m in res.msg_found_list]
    assert got == [body]


def test_each_killed_actor_is_restarted_and_the_cluster_serves(tmp_path):
    store = str(tmp_path / "store")
    started = rmq("start", "--store-path", store, "--detach", "--namesrv-addr", "127.0.0.1:0", "--listen-port", "0")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        namesrv = re.search(r"^started nameserver pid \d+ tcp://(\S+)$", started.stdout, re.M).group(1)
        assert set(spawned(store)) == set(ACTORS)
        serves(namesrv, 0)
        # the broker group's members die together (their restarts overlap), then the broker, whose
        # death restarts its whole group, then the NameServer: each death is followed by a send
        for n, names in enumerate((("reput", "flush", "cleaner", "ha"), ("broker",), ("nameserver",)), 1):
            before = spawned(store)
            for name in names:
                os.kill(before[name], signal.SIGKILL)
            restarted = names + (("reput", "flush", "cleaner", "ha") if names == ("broker",) else ())
            deadline = time.monotonic() + DEADLINE_S
            for name in restarted:
                while not (spawned(store).get(name, before[name]) != before[name] and alive(spawned(store)[name])):
                    assert time.monotonic() < deadline, f"{name} not restarted"
                    time.sleep(0.1)
            serves(namesrv, n)
        pids = spawned(store)
    finally:
        stopped = rmq("stop", "--store-path", store)
    assert stopped.returncode == 0 and "stopped cleanly" in stopped.stdout, stopped.stdout + stopped.stderr
    assert not any(alive(p) for p in pids.values())
    with open(os.path.join(store, "logs", "supervisor.log"), errors="replace") as f:
        log = f.read()
    for name in ACTORS:
        assert re.search(rf"{name}.*(exited|died|killed|signal)", log, re.I), f"no report of {name}'s death"


REAL = {"RMQ_ACTOR_MODULES": ""}           # Sup's default injects the stand-ins: the real ones here
GROUP = ("broker", "reput", "flush", "cleaner", "ha")


@pytest.fixture
def real_supervisor(tmp_path):
    started = []

    def start(store, *args):
        s = Sup(tmp_path, ["--store-path", store, "--namesrv-addr", "127.0.0.1:0", "--listen-port", "0", *args],
                env=REAL, name=f"real{len(started)}")
        started.append(s)
        return s
    yield start
    for s in started:
        s.cleanup()


def test_real_group_starts_in_order_and_stops_in_reverse(real_supervisor, tmp_path):
    store = str(tmp_path / "store")
    sup = real_supervisor(store)
    started = sup.ready()
    assert list(started) == ["nameserver", *GROUP]
    text = log_text(store)
    order = [text.index(f"{n} ready (pid {started[n][0]})") for n in ("nameserver", *GROUP)]
    assert order == sorted(order)                       # each started once the previous was ready
    info = cluster_info(started["nameserver"][1])
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": started["broker"][1][len("tcp://"):]}
    assert os.path.exists(os.path.join(store, "abort"))
    serves(started["nameserver"][1][len("tcp://"):], 0)
    assert sup.stop(timeout=120) == 0
    assert sup.lines[-1] == "stopped cleanly"
    text = log_text(store)
    order = [text.index(f"stopped {n} (pid {started[n][0]}): exit code 0") for n in (*GROUP, "nameserver")]
    assert order == sorted(order)                       # the broker first (no new writes), the NameServer last
    assert not any(alive(pid) for pid, _ in started.values())
    assert not os.path.exists(os.path.join(store, "abort"))      # a clean stop: the next start is normal
    assert "died" not in text


def _kill_next(store, name, prev_pid):
    """SIGKILL ``name`` once its current process is ready and is not ``prev_pid``; returns its pid."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        pid = spawned(store).get(name)
        if pid and pid != prev_pid and alive(pid) and f"{name} ready (pid {pid})" in log_text(store):
            os.kill(pid, signal.SIGKILL)
            return pid
        assert time.monotonic() < deadline, f"{name} not running again"
        time.sleep(0.05)


def test_real_repeated_crashes_are_given_up_and_reported(real_supervisor, tmp_path):
    """flush SIGKILLed three times (as an OOM killer would): with --max-restarts 2 the third death
    gives the group up, stops it, says so on stdout and in the log; the NameServer keeps serving
    and the supervisor's exit code says a group was given up."""
    store = str(tmp_path / "store")
    sup = real_supervisor(store, "--max-restarts", "2", "--restart-backoff-ms", "100")
    started = sup.ready()
    pid = None
    for _ in range(3):
        pid = _kill_next(store, "flush", pid)
    line = sup.wait_line("gave up ", timeout=DEADLINE_S)
    assert line.startswith("gave up broker: 2 restarts within 60 s; last failure: flush: killed by SIGKILL"), line
    assert "giving up on the broker group" in sup.stderr()
    wait_for(lambda: not any(alive(p) for n, p in spawned(store).items() if n != "nameserver"), DEADLINE_S,
             what="the group to stop")
    assert alive(started["nameserver"][0]) and sup.proc.poll() is None
    # the broker stopped in order and unregistered: clients are not routed to a group that is gone
    # (the stand-in broker of test_supervisor.py never unregisters, so it cannot show this)
    assert cluster_info(started["nameserver"][1])["clusterAddrTable"] == {}
    assert len(re.findall(r"flush \(pid \d+\) died: killed by SIGKILL", log_text(store))) == 3
    assert sup.stop(timeout=120) == 1                  # a group was given up
    assert os.path.exists(os.path.join(store, "abort"))


def test_real_hung_actor_is_killed_and_restarted(real_supervisor, tmp_path):
    """reput stopped with SIGSTOP (a hang: no beats, no exit) is SIGKILLed after --heartbeat-liveness
    missed beats and started again; the cluster serves afterwards."""
    store = str(tmp_path / "store")
    sup = real_supervisor(store, "--heartbeat-liveness", "3", "--restart-backoff-ms", "100")
    started = sup.ready()
    hung = started["reput"][0]
    os.kill(hung, signal.SIGSTOP)
    wait_for(lambda: spawned(store)["reput"] != hung and alive(spawned(store)["reput"]), DEADLINE_S,
             what="reput restarted")
    assert not alive(hung)
    assert re.search(r"reput \(pid %d\): no beat for [\d.]+ s \(liveness 3 s\): SIGKILL" % hung, log_text(store))
    serves(started["nameserver"][1][len("tcp://"):], 1)
    assert sup.stop(timeout=120) == 0


def test_real_stop_timeout_kills_a_hung_actor_and_keeps_abort(real_supervisor, tmp_path):
    """reput hung (SIGSTOP) when the supervisor is told to stop: after --stop-timeout-s it is
    SIGKILLed, the others stop in order, the exit code is 1 and the abort marker stays, so the
    next start recovers."""
    store = str(tmp_path / "store")
    sup = real_supervisor(store, "--stop-timeout-s", "3", "--heartbeat-liveness", "1000")
    started = sup.ready()
    os.kill(started["reput"][0], signal.SIGSTOP)
    assert sup.stop(timeout=120) == 1
    assert "reput (pid %d) did not stop within 3 s: SIGKILL" % started["reput"][0] in sup.stderr()
    assert not any(alive(pid) for pid, _ in started.values())
    assert os.path.exists(os.path.join(store, "abort"))


def _rmq_ok(*args):
    r = rmq(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _broker_addr(stdout):
    return re.search(r"^started broker pid \d+ tcp://(\S+)$", stdout, re.M).group(1)


def _write_conf(path, **props):
    with open(path, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))


@pytest.mark.slow
def test_broker_exit_75_restarts_its_group_and_recovery_truncates(tmp_path, actors):
    """The old master of a failover comes back as a slave (under its supervisor) with 50 messages
    the new master never had: its ha actor finds the divergence, the broker writes the truncate
    marker and exits 75, the supervisor restarts the whole group, recovery cuts the tail, and the
    replica catches up byte for byte.  (test_ha.py does the same with the group restarted by hand.)"""
    ns = actors("-m", "rmq.actors.nameserver", "--listen-port", "0", "--store-path", str(tmp_path / "ns"))
    nsaddr = ns.endpoint[len("tcp://"):]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    conf_a, conf_b = str(tmp_path / "a.conf"), str(tmp_path / "b.conf")
    ha = {"mappedFileSizeCommitLog": 128 * 1024, "haSendHeartbeatInterval": 500, "haHousekeepingInterval": 3000,
          "slaveTimeout": 2000}
    _write_conf(conf_a, brokerRole="ASYNC_MASTER", brokerId=0, **ha)
    _write_conf(conf_b, brokerRole="SLAVE", brokerId=1, **ha)

    def start(store, conf):
        return _broker_addr(_rmq_ok("start", "-c", conf, "--store-path", store, "--no-namesrv", "--namesrv-addr",
                                    nsaddr, "--listen-port", "0", "--detach").stdout)
    try:
        with RemotingClient() as c:
            addr_a = start(a, conf_a)
            create_topic(c, addr_a, "T")
            addr_b = start(b, conf_b)
            wait_for(lambda: runtime(c, addr_a)["haSlaves"], DEADLINE_S, what="the slave to connect")
            fill(c, addr_a, "T", 100, prefix=b"common")

            def replicated():
                end = runtime(c, addr_a)["commitLogMaxOffset"]
                return runtime(c, addr_b)["commitLogMaxOffset"] == end == runtime(c, addr_a)["haSlaveAckOffset"]
            wait_for(replicated, DEADLINE_S, what="replication")
            _rmq_ok("stop", "--store-path", b)
            fill(c, addr_a, "T", 50, prefix=b"lost")             # never replicated
            _rmq_ok("stop", "--store-path", a)
            addr_b = start(b, conf_b)
            r = promote(c, addr_b)
            assert r.code == 0, r.remark
            fill(c, addr_b, "T", 80, prefix=b"new")             # the new epoch writes over the old tail's offsets
            _write_conf(conf_a, brokerRole="SLAVE", brokerId=2, **ha)
            first = _broker_addr(_rmq_ok("start", "-c", conf_a, "--store-path", a, "--no-namesrv", "--namesrv-addr",
                                         nsaddr, "--listen-port", "0", "--detach").stdout)
            first_pids = spawned(a)
            wait_for(lambda: re.search(r"broker \(pid %d\) died: exit code 75" % first_pids["broker"], log_text(a)),
                     DEADLINE_S, what="the broker's exit 75")
            wait_for(lambda: "restarting the broker group" in log_text(a), DEADLINE_S, what="the group restart")
            wait_for(lambda: all(spawned(a)[n] != first_pids[n] and alive(spawned(a)[n]) for n in GROUP),
                     DEADLINE_S, what="the whole group restarted")
            end = runtime(c, addr_b)["commitLogMaxOffset"]
            wait_for(lambda: (lambda t: t["commitLogMaxOffset"] == end and t["dispatchedOffset"] >= end)(
                runtime(c, first)), DEADLINE_S, what="catch-up, dispatched (the pulls read ConsumeQueues)")
            assert commitlog_digests(a) == commitlog_digests(b)
            bodies = []
            for q in range(4):
                msgs, _ = pull_all(c, first, "T", q, deadline_s=30)
                bodies += [m.body for m in msgs]
            assert not any(x.startswith(b"lost") for x in bodies)
            assert sum(x.startswith(b"common") for x in bodies) == 100
            assert sum(x.startswith(b"new") for x in bodies) == 80
    finally:
        for store in (a, b):
            rmq("stop", "--store-path", store)


def _free_port_pair():
    """A port p with p and p + 1 free (the broker and its HA port)."""
    import socket
    for _ in range(100):
        with socket.socket() as s1:
            s1.bind(("127.0.0.1", 0))
            p = s1.getsockname()[1]
            if p >= 65535:
                continue
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
        return p
    raise AssertionError("no free port pair")


def test_slave_store_path_runs_a_replicating_pair(tmp_path):
    """``rmq start --slave-store-path`` (fixed ports, as it requires): the slave replicates what the
    master takes and serves it; each store stops with its own ``rmq stop``."""
    master, slave = str(tmp_path / "m"), str(tmp_path / "s")
    ns_port, port, slave_port = _free_port_pair(), _free_port_pair(), _free_port_pair()
    r = rmq("start", "--store-path", master, "--namesrv-addr", f"127.0.0.1:{ns_port}", "--listen-port", str(port),
            "--slave-store-path", slave, "--slave-listen-port", str(slave_port), "--detach")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        with open(os.path.join(slave, "broker.slave.conf")) as f:
            conf = f.read()
        assert "brokerRole=SLAVE" in conf and "brokerId=1" in conf and f"listenPort={slave_port}" in conf
        namesrv = f"127.0.0.1:{ns_port}"
        addr_m, addr_s = f"127.0.0.1:{port}", f"127.0.0.1:{slave_port}"
        with Producer(namesrv, group="pair-pg") as p:
            results = [p.send(Message("PairT", b"pair-%d" % i)) for i in range(40)]
        assert all(x.status.name == "SEND_OK" for x in results)
        with RemotingClient() as c:
            def replicated():
                end = runtime(c, addr_m)["commitLogMaxOffset"]
                t = runtime(c, addr_s)
                return t["commitLogMaxOffset"] == end and t["dispatchedOffset"] >= end
            wait_for(replicated, DEADLINE_S, what="the slave to replicate")
            assert runtime(c, addr_s)["brokerRole"] == "SLAVE"
            info = cluster_info(f"tcp://{namesrv}")
            assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": addr_m, "1": addr_s}
            got = []
            for q in range(4):
                wait_for(lambda: pull_all(c, addr_s, "PairT", q, deadline_s=30)[1].code != 17, DEADLINE_S,
                         what="the slave to know the topic")
                msgs, _ = pull_all(c, addr_s, "PairT", q, deadline_s=30)
                got += [m.body for m in msgs]
        assert sorted(got) == sorted(b"pair-%d" % i for i in range(40))
    finally:
        stopped_s = rmq("stop", "--store-path", slave)
        stopped_m = rmq("stop", "--store-path", master)
    assert stopped_s.returncode == 0 and "stopped cleanly" in stopped_s.stdout, stopped_s.stdout + stopped_s.stderr
    assert stopped_m.returncode == 0 and "stopped cleanly" in stopped_m.stdout, stopped_m.stdout + stopped_m.stderr


def test_demo_store_runs_end_to_end(tmp_path):
    """``rmq demo store``: write, dispatch, read back, key lookup, crash recovery; exit 0 and OK."""
    r = rmq("demo", "store", "--store-path", str(tmp_path / "demo"), "-n", "20000", "--queues", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and "MISMATCH" not in r.stdout


def test_dashboard_runs_under_the_supervisor_restarts_and_is_counted(tmp_path):
    """`rmq start --dashboard`: the dashboard is an actor of its own group, started last and
    stopped first; killed, it comes back on the same port; its restart shows in
    rocketmq_actor_restarts_total and its CPU / RSS in the broker group's metrics."""
    import urllib.request
    from tests.integration.test_metrics import scrape, value
    store = str(tmp_path / "store")
    conf = tmp_path / "broker.conf"
    conf.write_text("metricsExporterType=PROM\nmetricsPromExporterPort=0\n")
    started = rmq("start", "-c", str(conf), "--store-path", store, "--detach", "--namesrv-addr", "127.0.0.1:0",
                  "--listen-port", "0", "--dashboard", "--dashboard-port", "0")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        url = re.search(r"^started dashboard pid \d+ (http://\S+)$", started.stdout, re.M).group(1)
        broker = re.search(r"^started broker pid \d+ tcp://(\S+)$", started.stdout, re.M).group(1)
        lines = [ln.split()[1] for ln in started.stdout.splitlines() if ln.startswith("started ")]
        assert lines[-1] == "dashboard"                     # after the broker group

        def page(path):
            with urllib.request.urlopen(url + path, timeout=10) as r:
                return r.status, r.read().decode()
        status, html = wait_for(lambda: _try(page, "/cluster"), DEADLINE_S)
        assert status == 200 and broker in html
        first = spawned(store)["dashboard"]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: spawned(store)["dashboard"] != first and alive(spawned(store)["dashboard"]), DEADLINE_S)
        assert wait_for(lambda: _try(page, "/healthz"), DEADLINE_S) == (200, "ok\n")     # the same port
        from rmq.testing import broker_runtime_info
        metrics_url = broker_runtime_info(broker)["metricsUrl"]
        m = scrape(metrics_url)
        assert value(m, "rocketmq_actor_restarts_total", actor="dashboard") == 1
        assert value(m, "rocketmq_actor_restarts_total", actor="broker") == 0
        assert value(m, "rocketmq_actor_resident_memory_bytes", actor="dashboard", pid=str(spawned(store)["dashboard"])) > 0
    finally:
        stopped = rmq("stop", "--store-path", store)
    assert stopped.returncode == 0 and "stopped cleanly" in stopped.stdout, stopped.stdout + stopped.stderr
    with open(os.path.join(store, "logs", "supervisor.log"), errors="replace") as f:
        log = f.read()
    assert re.search(r"stopped dashboard \(pid \d+\): exit code 0", log)
    # the dashboard stops first: before the broker
    assert log.index("stopped dashboard") < log.index("stopped broker")


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError:
        return None


@pytest.mark.parametrize("props,why", [
    ("dashboardEnable=maybe\n", "dashboardEnable must be true or false"),
    ("dashboardEnable=true\ndashboardHost=0.0.0.0\n", "set dashboardTokenFile"),
    ("dashboardEnable=true\ndashboardPort=70000\n", "dashboardPort=70000 outside"),
    ("dashboardEnable=true\ndashboardTokenFile=/nonexistent/token\n", "not a readable file"),
])
def test_bad_dashboard_settings_are_refused_before_anything_starts(tmp_path, props, why):
    conf = tmp_path / "broker.conf"
    conf.write_text(props)
    store = tmp_path / "store"
    r = rmq("start", "-c", str(conf), "--store-path", str(store), "--detach", "--namesrv-addr", "127.0.0.1:0",
            "--listen-port", "0")
    assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert not (store / "rmq.pid").exists()


def test_dashboard_without_its_extra_is_refused(tmp_path, monkeypatch):
    """dashboardEnable=true where the 'dashboard' extra is not installed: a clear error naming the
    extra, before anything starts."""
    import importlib.util
    from rmq.actors.supervisor import Supervisor, SupervisorError, resolve_settings
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    settings = resolve_settings(None, str(tmp_path / "store"), "127.0.0.1:0", 0, {"dashboardEnable": "true"})
    with pytest.raises(SupervisorError, match=r"needs the 'dashboard' extra .*uvicorn not installed"):
        Supervisor(settings)
    assert not (tmp_path / "store" / "rmq.pid").exists()
