"""The supervisor with the real actors (issue 19, item 5): ``rmq start --detach`` runs the
NameServer, broker, reput, flush, cleaner and ha; each one killed with SIGKILL is started
again (the broker with its whole group), and the cluster serves a send and a read afterwards;
``rmq stop`` stops everything in order."""
import os
import re
import signal
import subprocess
import time

import pytest

from rmq import Message, Producer, PullConsumer
from rmq.client.consumer import MessageQueue
from rmq.launch import child_env, python_argv

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
        for n, name in enumerate(ACTORS, 1):
            before = spawned(store)
            os.kill(before[name], signal.SIGKILL)
            deadline = time.monotonic() + DEADLINE_S
            while not (spawned(store).get(name, before[name]) != before[name] and alive(spawned(store)[name])):
                assert time.monotonic() < deadline, f"{name} not restarted"
                time.sleep(0.1)
            if name == "broker":               # the broker's death restarts its whole group
                for member in ("reput", "flush", "cleaner", "ha"):
                    while not (spawned(store)[member] != before[member] and alive(spawned(store)[member])):
                        assert time.monotonic() < deadline, f"{member} kept across the broker's restart"
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
