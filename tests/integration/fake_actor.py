"""Test-only stand-in for the broker, reput, flush and cleaner actors (supervisor tests).

Run by the supervisor as ``python -m tests.integration.fake_actor ARGS`` when
``RMQ_ACTOR_MODULES`` names it; it plays the actor named in ``RMQ_ACTOR_NAME``
and takes exactly that actor's arguments (the supervisor contract):

    broker:                 --store-path S -c CONF --listen-port P --namesrv-addr "h:p;h:p" --supervisor EP
    reput, flush, cleaner:  --store-path S -c CONF --supervisor EP

It beats to the supervisor (actor base), prints ``ready <endpoint>``, exits 0 on
SIGTERM.  The broker creates ``S/abort`` (as the real one does when it recovers
the store) and registers itself with the first NameServer.  Every start, stop,
crash and hang is appended to ``S/fake-events.log`` as ``<event> <name> <pid>``;
the arguments of the latest start go to ``S/fake-<name>.args.json``.

Behaviour switches (environment, ``name:seconds[:once]`` entries separated by ','):

    FAKE_ACTOR_CRASH      exit with code 3 after ``seconds`` (``once``: only the first time)
    FAKE_ACTOR_HANG       block the event loop after ``seconds`` (no beats, SIGTERM ignored)
    FAKE_ACTOR_SLOW_STOP  take ``seconds`` to stop after SIGTERM
    FAKE_ACTOR_NO_READY   names that never print ``ready``
    FAKE_ACTOR_SLOW_START sleep ``seconds`` before the actor installs its signal handlers (a real
                          actor's imports and recovery: SIGTERM kills it then); ``restart``: every
                          start but the first
"""
import argparse
import json
import os
import sys
import time

import msgpack
import zmq

from rmq.actors.actor import Actor
from rmq.broker_conf import broker_settings, load_broker_conf
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode

EVENTS = "fake-events.log"


def behaviour(var, name):
    """(seconds, once) for ``name`` in ``$var``, or None."""
    for entry in os.environ.get(var, "").split(","):
        parts = entry.strip().split(":")
        if parts[0] == name:
            return float(parts[1]) if len(parts) > 1 else 0.0, len(parts) > 2 and parts[2] == "once"
    return None


def record(store, event, name):
    fd = os.open(os.path.join(store, EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {name} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


class FakeActor(Actor):

    def __init__(self, name, args):
        self.name = name
        super().__init__(args.store_path, args.supervisor)
        self.args = args

    def once(self, what):
        """True the first time ``what`` happens to this actor name in this store."""
        marker = os.path.join(self.store_path, f"fake-{self.name}.{what}")
        if os.path.exists(marker):
            return False
        open(marker, "w").close()
        return True

    def on_start(self):
        store, args = self.store_path, self.args
        settings = broker_settings(load_broker_conf(args.config), {
            "storePathRootDir": store, "listenPort": getattr(args, "listen_port", None),
            "namesrvAddr": getattr(args, "namesrv_addr", None)})
        with open(os.path.join(store, f"fake-{self.name}.args.json"), "w") as f:
            json.dump({"argv": sys.argv[1:], "settings": settings}, f)
        record(store, "start", self.name)
        port = getattr(args, "listen_port", 0) or "*"
        self.sock = self.socket(zmq.ROUTER, bind=f"tcp://127.0.0.1:{port}")
        self.serve(self.sock)
        endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.name == "broker":
            with open(os.path.join(store, "abort"), "wb"):
                pass
            self.register(settings, endpoint.rsplit(":", 1)[1])
        for var, fn in (("FAKE_ACTOR_CRASH", self.crash), ("FAKE_ACTOR_HANG", self.hang)):
            b = behaviour(var, self.name)
            if b is not None and (not b[1] or self.once(var)):
                self.add_timer(b[0] * 1000, fn, repeat=False)
        if self.name not in os.environ.get("FAKE_ACTOR_NO_READY", "").split(","):
            print("ready", endpoint, flush=True)

    def register(self, settings, port):
        ns = settings["namesrvAddr"].split(";")[0]
        frame = Frame(RequestCode.REGISTER_BROKER, fields={
            "clusterName": settings["brokerClusterName"], "brokerAddr": f"127.0.0.1:{port}",
            "brokerName": settings["brokerName"], "brokerId": settings["brokerId"], "haServerAddr": ""},
            bodies=[msgpack.packb({"topicConfigTable": {}, "dataVersion": {"timestamp": 1, "counter": 1}})])
        try:
            with RemotingClient(self.ctx) as c:
                r = c.invoke(ns, frame, 3000)
            record(self.store_path, f"registered-{r.code}", self.name)
        except Exception as e:  # noqa: BLE001 - reported through the events log
            record(self.store_path, f"register-failed-{type(e).__name__}", self.name)

    def crash(self):
        record(self.store_path, "crash", self.name)
        os._exit(3)

    def hang(self):
        record(self.store_path, "hang", self.name)
        while True:
            time.sleep(1)

    def on_stop(self):
        b = behaviour("FAKE_ACTOR_SLOW_STOP", self.name)
        if b is not None:
            time.sleep(b[0])
        record(self.store_path, "stop", self.name)


def main(argv=None):
    name = os.environ.get("RMQ_ACTOR_NAME", "")
    if name not in ("broker", "reput", "flush", "cleaner", "ha"):
        print(f"fake_actor: RMQ_ACTOR_NAME={name!r} is not a broker-group actor", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog=f"fake_actor ({name})")
    p.add_argument("--store-path", required=True)
    p.add_argument("-c", dest="config", required=True)
    p.add_argument("--supervisor", required=True)
    if name == "broker":
        p.add_argument("--listen-port", type=int, required=True)
        p.add_argument("--namesrv-addr", required=True)
    args = p.parse_args(argv)
    for entry in os.environ.get("FAKE_ACTOR_SLOW_START", "").split(","):
        parts = entry.strip().split(":")
        if parts[0] != name:
            continue
        marker = os.path.join(args.store_path, f"fake-{name}.spawned")
        if parts[2:] != ["restart"] or os.path.exists(marker):
            record(args.store_path, "slow-start", name)
            time.sleep(float(parts[1]))
        open(marker, "w").close()
    FakeActor(name, args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
