"""The remoting proxy as an actor of ``rmq start --enable-proxy`` (broker.conf ``enableProxy=true``;
RocketMQ 5's ``mqbroker --enable-proxy`` local mode).

``python -m rmq.proxy.actor --namesrv-addr H:P[;H:P] [--listen-addr A] [--listen-port P]
[--store-path S] [--supervisor EP] [--acl-file F] [--grpc-listen-port G]``

``--grpc-listen-port``: also serve RocketMQ 5's gRPC API there (:mod:`rmq.proxy.grpc_server`;
broker.conf ``grpcServerPort``, 0 = any free port, logged); the ACL file guards it too.

``--acl-file``: RocketMQ ACL 1.0 for the clients (:mod:`rmq.proxy.acl`; broker.conf
``authEnable`` / ``aclEnable``, ``aclPlainFile``).

Serves :class:`rmq.proxy.server.ProxyServer` and, like every actor: prints ``ready tcp://HOST:PORT``
once it listens, beats ACTOR_BEAT to the supervisor every HEARTBEAT_INTERVAL_MS (from a thread:
the server's asyncio loop is not an Actor loop), writes ``S/run/proxy.pid``, and exits 0 on
SIGTERM / SIGINT.  A port it cannot bind: one line on stderr, exit code 1.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from rmq.actors.actor import serve_as_actor
from rmq.proxy.server import REMOTING_LISTEN_PORT, serve

NAME = "proxy"


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rmq.proxy.actor", description=__doc__.split("\n")[0])
    p.add_argument("--namesrv-addr", required=True)
    p.add_argument("--listen-addr", default="127.0.0.1")
    p.add_argument("--listen-port", type=int, default=REMOTING_LISTEN_PORT)
    p.add_argument("--store-path", default=None)
    p.add_argument("--supervisor", default=None)
    p.add_argument("--acl-file", default=None)
    p.add_argument("--grpc-listen-port", type=int, default=None)
    a = p.parse_args(argv)
    acl = None
    if a.acl_file:
        from rmq.proxy.acl import AclError, PlainAccessValidator
        try:
            acl = PlainAccessValidator(a.acl_file)
        except (AclError, OSError) as e:
            print(f"{NAME}: refusing to start: ACL file {a.acl_file}: {e}", file=sys.stderr)
            return 1
    return serve_as_actor(NAME, lambda: serve(a.namesrv_addr, a.listen_addr, a.listen_port, acl=acl,
                                              grpc_port=a.grpc_listen_port,
                                              ready=lambda s: print(f"ready tcp://{s.advertised_addr}", flush=True)),
                          f"{a.listen_addr}:{a.listen_port}", a.store_path, a.supervisor)


if __name__ == "__main__":
    sys.exit(main())
