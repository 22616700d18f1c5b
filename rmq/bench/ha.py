"""HA figures: master -> slave replication throughput beside raw ZeroMQ, and the send latency
SYNC_MASTER adds (``rmq bench all``'s HA section; ``bench/ha.py`` is its stand-alone CLI).

* :func:`zmq_ceiling`: raw pyzmq loopback throughput, one DEALER process pushing frames of
  haTransferBatchSize bytes to a ROUTER in this process over tcp (no window, no disk): the
  ceiling of what the master -> slave stream can move.
* :func:`replication`: a master holding ``mb`` MB of 1 KiB messages (written offline with
  MessageStore) and an empty slave started next to it; MB/s = CommitLog bytes the slave
  applied (its broker's ``commitLogMaxOffset``) / seconds until it equals the master's,
  counted from the first byte applied (after the slave found the master and handshook; when
  everything arrived between two polls -- a small ``mb`` -- from the slave's start: a lower
  bound, ``includes_connect``).
  Replication crosses 3 processes (master ha -> slave ha -> slave broker, which CRC-checks
  every record before appending) and the slave's reput dispatches meanwhile.
* :func:`send_latency`: sequential single-message sends (100 B) to a master of ``role``
  with a slave attached: p50 / p99 in microseconds.
* :func:`start_slave`: a slave group beside a master :class:`rmq.testing.Cluster`, once the
  master lists it (used by ``rmq bench --broker-role``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time

import zmq

FILE = 64 * 1024 * 1024
CHUNK = 32 * 1024                     # haTransferBatchSize default (SPEC.md §9.2)
# one set of store properties for the offline fill and both brokers (the Cluster helper's small
# test geometry would not match a store written with the defaults)
STORE_CONF = {"mappedFileSizeCommitLog": str(FILE), "mappedFileSizeConsumeQueue": str(20 * 300_000),
              "maxHashSlotNum": "100000", "maxIndexNum": "400000"}
MB = 1e6


def slave_conf(master_conf: dict) -> dict:
    return {**master_conf, "brokerRole": "SLAVE", "brokerId": "1"}


def start_slave(master, store_path: str, timeout_s: float = 60.0):
    """A slave :class:`rmq.testing.Cluster` (with ha) on ``master``'s NameServer, returned once
    the master's runtime info lists it (``haSlaves``)."""
    from rmq.testing import Cluster, wait_for_slave

    slave = Cluster(store_path, conf=slave_conf(master.conf), with_ha=True, namesrv_addr=master.namesrv_addr)
    try:
        wait_for_slave(master, timeout_s)
    except BaseException:
        slave.close()
        raise
    return slave


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
    """Raw pyzmq loopback MB/s with ``size``-byte frames, one pushing process, no window."""
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    p = mp.get_context("spawn").Process(target=_zmq_pusher, args=(f"tcp://127.0.0.1:{port}", size, seconds))
    p.start()
    got, t0 = 0, None
    try:
        while True:
            ident, msg = r.recv_multipart(copy=False)
            if t0 is None:
                t0 = time.monotonic()
            if len(msg) == 0:
                break
            got += len(msg)
        dt = time.monotonic() - t0
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
        r.close(0)
        ctx.term()
    return {"frame_bytes": size, "seconds": round(dt, 4), "MBps": got / dt / MB}


def fill_master(store: str, mb: int, conf: dict) -> int:
    """Write ``mb`` MB of 1 KiB messages (4 queues of topic T) into a store, offline."""
    from rmq._core import commitlog as _cl
    from rmq.store.config import MessageStoreConfig
    from rmq.store.message_store import MessageStore

    cfg = MessageStoreConfig.from_properties(conf, store_path_root_dir=store)
    batch = _cl.encode_batch([(b"r" * 1024, b"", 0)] * 1000)
    with MessageStore(config=cfg) as s:
        while s.commitlog.get_max_offset() < mb * 1_000_000:
            for q in range(4):
                assert s.put_messages("T", q, batch).ok
        s.dispatch()
        return s.commitlog.get_max_offset()


def replication(tmp: str, mb: int, batch: int = CHUNK, timeout_s: float = 600.0) -> dict:
    """A master with ``mb`` MB and an empty slave started beside it: streaming MB/s."""
    from rmq.client.remoting import RemotingClient
    from rmq.testing import Cluster, broker_runtime_info

    conf = {**STORE_CONF, "haTransferBatchSize": str(batch)}
    end = fill_master(os.path.join(tmp, "m"), mb, conf)
    master = Cluster(os.path.join(tmp, "m"), conf=conf, with_ha=True)
    slave = None
    try:
        with RemotingClient() as c:
            t0 = time.monotonic()
            slave = Cluster(os.path.join(tmp, "s"), conf=slave_conf(conf), with_ha=True,
                            namesrv_addr=master.namesrv_addr)
            started = time.monotonic()
            first = None
            while True:
                got = broker_runtime_info(slave.broker_addr, c)["commitLogMaxOffset"]
                if got and first is None:
                    first = (time.monotonic(), got)
                if got >= end:
                    break
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"slave at {got:,} of {end:,} bytes after {timeout_s} s")
                time.sleep(0.01)
            done = time.monotonic()
            out = {"bytes": end, "batch": batch, "slave_start_s": round(started - t0, 3),
                   "connect_s": round(first[0] - started, 3), "includes_connect": False}
            if first[1] < end:
                dt, moved = max(done - first[0], 1e-6), end - first[1]
            else:                 # all of it between two polls (a small --ha-mb): a lower bound
                dt, moved = max(done - started, 1e-6), end
                out.update(includes_connect=True, connect_s=0.0)
            out.update(seconds=round(dt, 4), MBps=moved / dt / MB)
            return out
    finally:
        if slave is not None:
            slave.close()
        master.close()


def send_latency(tmp: str, role: str, sends: int) -> dict:
    """``sends`` sequential 100 B SEND_MESSAGEs to a ``role`` master with a slave: p50 / p99 µs."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode, ResponseCode
    from rmq.testing import Cluster

    master = Cluster(os.path.join(tmp, role), conf={"brokerRole": role}, with_ha=True)
    slave = None
    try:
        slave = start_slave(master, os.path.join(tmp, role + "-s"))
        with RemotingClient() as c:
            def frame():
                return Frame(RequestCode.SEND_MESSAGE, fields={
                    "producerGroup": "pg", "topic": "L", "queueId": 0, "properties": {}}, bodies=[b"l" * 100])
            for _ in range(200):                                     # warm up
                c.invoke(master.broker_addr, frame())
            lat = []
            for _ in range(sends):
                t = time.perf_counter_ns()
                r = c.invoke(master.broker_addr, frame())
                lat.append((time.perf_counter_ns() - t) / 1000.0)
                if r.code != ResponseCode.SUCCESS:
                    raise RuntimeError(f"send to {role}: {r.code} {r.remark}")
            lat.sort()
            return {"p50_us": lat[len(lat) // 2], "p99_us": lat[int(len(lat) * 0.99)], "sends": sends}
    finally:
        if slave is not None:
            slave.close()
        master.close()


def measure_replication(mb: int, batch: int = CHUNK, ceiling_seconds: float = 3.0, store_dir=None,
                        log=print) -> dict:
    """The raw ZeroMQ ceiling (``batch``-byte frames) and the replication of ``mb`` MB."""
    out: dict = {"zmq_ceiling": zmq_ceiling(batch, ceiling_seconds)}
    log(f"  raw ZeroMQ loopback, {batch:,} B frames: {out['zmq_ceiling']['MBps']:,.0f} MB/s")
    tmp = tempfile.mkdtemp(prefix="rmq-bench-ha-", dir=store_dir)
    try:
        rep = out["replication"] = replication(tmp, mb, batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep["ratio_to_zmq"] = rep["MBps"] / out["zmq_ceiling"]["MBps"]
    log(f"  replication of {rep['bytes'] / MB:,.0f} MB: {rep['MBps']:,.0f} MB/s "
        f"({rep['ratio_to_zmq']:.0%} of raw ZeroMQ; {rep['connect_s']:.2f} s to find the master and handshake)")
    return out
