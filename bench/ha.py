"""HA bench (the logic is :mod:`rmq.bench.ha`; ``rmq bench all`` measures the same replication): replication throughput and the send latency SYNC_MASTER adds, beside raw ZeroMQ.

    python bench/ha.py [--mb 256] [--sends 2000] [--json bench/results/ha.json]

Scenarios (one run, same machine, figures compared as ratios):

* ``zmq_ceiling``: raw pyzmq loopback throughput, one DEALER process pushing frames of
  haTransferBatchSize bytes to a ROUTER in this process over tcp (no window, no disk):
  the ceiling of what the master -> slave stream can move.
* ``replication``: a master holding ``--mb`` MB of 1 KiB messages (written offline with
  MessageStore) and an empty slave started next to it; MB/s = CommitLog bytes the slave
  applied (its broker's ``commitLogMaxOffset``) / seconds until it equals the master's.
  Replication crosses 3 processes (master ha -> slave ha -> slave broker, which CRC-checks
  every record before appending) and the slave's reput dispatches meanwhile.
* ``send_latency``: one producer connection, ``--sends`` sequential single-message sends
  (100 B) to an ASYNC_MASTER with a slave attached, then to a SYNC_MASTER with a slave;
  p50 / p99 in microseconds and the difference.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # rmq without installing

from rmq.bench.ha import CHUNK, replication, send_latency, zmq_ceiling  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=CHUNK, help="haTransferBatchSize, bytes")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {"machine_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="rmq-ha-bench-") as tmp:
        out["zmq_ceiling"] = zmq_ceiling(a.batch)
        out["replication"] = replication(tmp, a.mb, a.batch)
        out["send_latency"] = {r: send_latency(tmp, r, a.sends) for r in ("ASYNC_MASTER", "SYNC_MASTER")}
    rep, ceil = out["replication"], out["zmq_ceiling"]
    lat = out["send_latency"]
    print(f"raw ZeroMQ loopback, {ceil['frame_bytes']} B frames: {ceil['MBps']:.0f} MB/s")
    print(f"replication: {rep['bytes'] / 1e6:.0f} MB, streaming {rep['seconds']:.2f} s (after {rep['connect_s']:.2f} s "
          f"to find the master and handshake) = {rep['MBps']:.0f} MB/s "
          f"({100 * rep['MBps'] / ceil['MBps']:.0f} % of raw ZeroMQ)")
    for r, v in lat.items():
        print(f"single send, {r} with a slave: p50 {v['p50_us']:.0f} us, p99 {v['p99_us']:.0f} us")
    print(f"SYNC_MASTER adds p50 {lat['SYNC_MASTER']['p50_us'] - lat['ASYNC_MASTER']['p50_us']:.0f} us, "
          f"p99 {lat['SYNC_MASTER']['p99_us'] - lat['ASYNC_MASTER']['p99_us']:.0f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
