"""How long a slave broker's main thread stalls while the disk is busy (the CI failure of stop 36:
a GET_BROKER_RUNTIME_INFO to a freshly started slave went unanswered for 3 s).

Starts an ASYNC_MASTER with 20 messages and its slave (real processes, loopback), optionally
``--hogs`` processes that rewrite 256 MiB and fsync it in a loop beside them, then sends
GET_BROKER_RUNTIME_INFO to the slave back to back for ``--seconds`` and prints the latency
percentiles and the five longest answers (ms).  The slave copies its master's config tables every
few seconds (SlaveSynchronize); each copy is an atomic JSON write with two fsyncs.

    python bench/config_stall.py --seconds 20 --hogs 2
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HOG = """
import os, sys
buf = os.urandom(1 << 20)
while True:
    with open(sys.argv[1], "wb") as f:
        for _ in range(256):
            f.write(buf)
        os.fsync(f.fileno())
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--hogs", type=int, default=2, help="fsync-loop processes beside the brokers")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode, ResponseCode
    from rmq.testing import Cluster
    d = tempfile.mkdtemp(prefix="rmq-config-stall-")
    ha = {"mappedFileSizeCommitLog": str(128 * 1024), "haSendHeartbeatInterval": "500",
          "haHousekeepingInterval": "3000"}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, os.path.join(d, f"hog{i}.bin")]) for i in range(a.hogs)]
    master = slave = None
    try:
        master = Cluster(os.path.join(d, "m"), conf={**ha, "brokerRole": "ASYNC_MASTER", "slaveTimeout": "60000"},
                         with_ha=True)
        with RemotingClient() as c:
            r = c.invoke(master.broker_addr, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
                "topic": "T", "readQueueNums": 4, "writeQueueNums": 4}))
            assert r.code == ResponseCode.SUCCESS, r.remark
            for i in range(20):
                r = c.invoke(master.broker_addr, Frame(RequestCode.SEND_MESSAGE, fields={
                    "producerGroup": "g", "topic": "T", "queueId": i % 4, "properties": {},
                    "bornTimestamp": int(time.time() * 1000)}, bodies=[b"m%06d" % i + b"x" * 300]))
                assert r.code == ResponseCode.SUCCESS, r.remark
            slave = Cluster(os.path.join(d, "s"), conf={**ha, "brokerRole": "SLAVE", "brokerId": "1"},
                            with_ha=True, namesrv_addr=master.namesrv_addr)
            lat = []
            end = time.monotonic() + a.seconds
            while time.monotonic() < end:
                t = time.perf_counter()
                r = c.invoke(slave.broker_addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO), timeout_ms=30_000)
                lat.append((time.perf_counter() - t) * 1000)
                assert r.code == ResponseCode.SUCCESS, r.remark
        lat.sort()
        pct = {p: lat[min(len(lat) - 1, int(len(lat) * p / 100))] for p in (50, 99, 99.9)}
        print(f"{len(lat):,} GET_BROKER_RUNTIME_INFO to the slave, {a.hogs} fsync hog(s): "
              f"p50 {pct[50]:.2f} ms, p99 {pct[99]:.2f} ms, p99.9 {pct[99.9]:.1f} ms, max {lat[-1]:.1f} ms; "
              f"longest {[round(x) for x in lat[-5:]]}")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for cl in (slave, master):
            if cl is not None:
                cl.close()
        for i in range(a.hogs):
            try:
                os.unlink(os.path.join(d, f"hog{i}.bin"))
            except OSError:
                pass


if __name__ == "__main__":
    main()
