"""HA bench: replication throughput and the send latency SYNC_MASTER adds, beside raw ZeroMQ.

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
import multiprocessing as mp
import os
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rmq._core import commitlog as _cl  # noqa: E402
from rmq.client.remoting import RemotingClient  # noqa: E402
from rmq.protocol import Frame, RequestCode, ResponseCode, unpack_body  # noqa: E402
from rmq.store.config import MessageStoreConfig  # noqa: E402
from rmq.store.message_store import MessageStore  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402

FILE = 64 * 1024 * 1024
# one set of store properties for the offline fill and both brokers (the Cluster helper's small
# test geometry would not match a store written with the defaults)
STORE_CONF = {"mappedFileSizeCommitLog": str(FILE), "mappedFileSizeConsumeQueue": str(20 * 300_000),
              "maxHashSlotNum": "100000", "maxIndexNum": "400000"}
CHUNK = 32 * 1024                     # haTransferBatchSize default (SPEC.md §9.2)


def _zmq_pusher(endpoint: str, size: int, seconds: float) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    payload = b"x" * size
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(64):
            s.send(payload, copy=False)
    s.send(b"")
    s.close(linger=-1)
    ctx.term()


def zmq_ceiling(size: int = CHUNK, seconds: float = 3.0) -> dict:
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    p = mp.get_context("spawn").Process(target=_zmq_pusher, args=(f"tcp://127.0.0.1:{port}", size, seconds))
    p.start()
    got, t0 = 0, None
    while True:
        ident, msg = r.recv_multipart(copy=False)
        if t0 is None:
            t0 = time.monotonic()
        if len(msg) == 0:
            break
        got += len(msg)
    dt = time.monotonic() - t0
    p.join()
    r.close(0)
    ctx.term()
    return {"frame_bytes": size, "MBps": got / dt / 1e6}


def runtime(c: RemotingClient, addr: str) -> dict:
    r = c.invoke(addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    return unpack_body(r)["table"]


def fill_master(store: str, mb: int) -> int:
    cfg = MessageStoreConfig.from_properties(STORE_CONF, store_path_root_dir=store)
    batch = _cl.encode_batch([(b"r" * 1024, b"", 0)] * 1000)
    with MessageStore(config=cfg) as s:
        while s.commitlog.get_max_offset() < mb * 1_000_000:
            for q in range(4):
                assert s.put_messages("T", q, batch).ok
        s.dispatch()
        return s.commitlog.get_max_offset()


def replication(tmp: str, mb: int) -> dict:
    end = fill_master(os.path.join(tmp, "m"), mb)
    conf = dict(STORE_CONF)
    master = Cluster(os.path.join(tmp, "m"), conf=conf, with_ha=True)
    slave = None
    try:
        with RemotingClient() as c:
            t0 = time.monotonic()
            slave = Cluster(os.path.join(tmp, "s"), conf={**conf, "brokerRole": "SLAVE", "brokerId": "1"},
                            with_ha=True, namesrv_addr=master.namesrv_addr)
            started = time.monotonic()
            first = None
            while True:
                got = runtime(c, slave.broker_addr)["commitLogMaxOffset"]
                if got and first is None:
                    first = (time.monotonic(), got)
                if got >= end:
                    break
                time.sleep(0.01)
            done = time.monotonic()
            dt = done - first[0]
            moved = end - first[1]
            return {"bytes": end, "seconds": dt, "MBps": moved / dt / 1e6, "slave_start_s": started - t0,
                    "connect_s": first[0] - started}
    finally:
        if slave is not None:
            slave.close()
        master.close()


def send_latency(tmp: str, role: str, sends: int) -> dict:
    master = Cluster(os.path.join(tmp, role), conf={"brokerRole": role}, with_ha=True)
    slave = None
    try:
        with RemotingClient() as c:
            slave = Cluster(os.path.join(tmp, role + "-s"), conf={"brokerRole": "SLAVE", "brokerId": "1"},
                            with_ha=True, namesrv_addr=master.namesrv_addr)
            while not runtime(c, master.broker_addr)["haSlaves"]:
                time.sleep(0.05)
            frame = lambda: Frame(RequestCode.SEND_MESSAGE, fields={  # noqa: E731
                "producerGroup": "pg", "topic": "L", "queueId": 0, "properties": {}}, bodies=[b"l" * 100])
            for _ in range(200):                                     # warm up
                c.invoke(master.broker_addr, frame())
            lat = []
            for _ in range(sends):
                t = time.perf_counter_ns()
                r = c.invoke(master.broker_addr, frame())
                lat.append((time.perf_counter_ns() - t) / 1000.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
            lat.sort()
            return {"p50_us": lat[len(lat) // 2], "p99_us": lat[int(len(lat) * 0.99)], "sends": sends}
    finally:
        if slave is not None:
            slave.close()
        master.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=CHUNK, help="haTransferBatchSize, bytes")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    STORE_CONF["haTransferBatchSize"] = str(a.batch)
    out = {"machine_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="rmq-ha-bench-") as tmp:
        out["zmq_ceiling"] = zmq_ceiling(a.batch)
        out["replication"] = replication(tmp, a.mb)
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
