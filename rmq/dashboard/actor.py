"""The dashboard as an actor of ``rmq start`` (broker.conf ``dashboardEnable=true``).

``python -m rmq.dashboard.actor --namesrv-addr H:P[;H:P] [--host H] [--port P] [--token-file F]
[--store-path S] [--supervisor EP]``

Serves :func:`rmq.dashboard.app.serve` and, like every actor: prints ``ready http://HOST:PORT``
once it listens, beats ACTOR_BEAT to the supervisor every HEARTBEAT_INTERVAL_MS (from a thread:
the server's event loop is not an Actor loop), writes ``S/run/dashboard.pid`` (so the broker
group's metrics show its CPU and RSS), and exits 0 on SIGTERM / SIGINT after the server stopped.
A bad token file or a non-loopback host without one: one line on stderr, exit code 1.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional


from rmq.actors.actor import serve_as_actor

NAME = "dashboard"


def read_token_file(path: str) -> str:
    """The token: the first line of ``path``, stripped.  Raises ValueError when it is empty or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise ValueError(f"cannot read the dashboard token file {path}: {e.strerror or e}") from None
    if not token:
        raise ValueError(f"{path}: the first line (the token) is empty")
    return token


def main(argv: Optional[list] = None) -> int:
    from rmq.dashboard.app import DEFAULT_DASHBOARD_PORT, serve

    p = argparse.ArgumentParser(prog="python -m rmq.dashboard.actor", description=__doc__.split("\n")[0])
    p.add_argument("--namesrv-addr", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT)
    p.add_argument("--token-file", default=None)
    p.add_argument("--store-path", default=None)
    p.add_argument("--supervisor", default=None)
    a = p.parse_args(argv)
    try:
        token = read_token_file(a.token_file) if a.token_file else None
    except ValueError as e:
        print(f"{NAME}: refusing to start: {e}", file=sys.stderr)
        return 1
    return serve_as_actor(NAME, lambda: serve(a.namesrv_addr, a.host, a.port, token,
                                              ready=lambda url: print("ready", url, flush=True)),
                          f"{a.host}:{a.port}", a.store_path, a.supervisor)


if __name__ == "__main__":
    sys.exit(main())
