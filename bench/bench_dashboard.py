"""Dashboard pages on a large cluster: 1,000 topics and 1,000 consumer groups (rocketmq-dashboard
#281 timed out at 900 topics / 2,300 groups).  Prints the median time of each page, served by the
app in-process (Starlette's TestClient), against a real broker group and NameServer.

    python bench/bench_dashboard.py [--topics 1000] [--groups 1000]
"""
import argparse
import statistics
import sys
import tempfile
import time

from starlette.testclient import TestClient

from rmq.client.remoting import RemotingClient
from rmq.dashboard import create_app
from rmq.protocol import Frame, RequestCode
from rmq.testing import Cluster


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--groups", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq-dash-bench-") as tmp, Cluster(f"{tmp}/store") as c:
        t0 = time.monotonic()
        with RemotingClient() as rc:
            for i in range(a.topics):
                assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
                    "topic": f"BenchTopic{i:05d}", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}),
                    30_000).code == 0
            for i in range(a.groups):
                assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                                 fields={"groupName": f"BenchGroup{i:05d}"})).code == 0
            # traffic: a message on each topic; each group has an offset on its own topic and on
            # BenchTopic00500 (1,000 groups consume that one: its statsAll rows, its message track)
            for i in range(a.topics):
                assert rc.invoke(c.broker, Frame(RequestCode.SEND_MESSAGE, fields={
                    "producerGroup": "bench", "topic": f"BenchTopic{i:05d}", "queueId": 0,
                    "properties": {"KEYS": f"k{i}"}}, bodies=[b"x" * 100])).code == 0
            for i in range(a.groups):
                for t in (f"BenchTopic{i % a.topics:05d}", "BenchTopic00500"):
                    assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
                        "consumerGroup": f"BenchGroup{i:05d}", "topic": t, "queueId": 0, "commitOffset": 1})).code == 0
        print(f"created {a.topics} topics and {a.groups} groups in {time.monotonic() - t0:.1f} s")
        with TestClient(create_app(c.namesrv_addr, sample=False)) as client:
            deadline = time.monotonic() + 60      # the broker re-registers its topic table with the NameServer
            while time.monotonic() < deadline and f"{a.topics} of" not in client.get("/topics?kind=normal").text:
                time.sleep(0.5)
            for path in ("/topics?kind=all", "/topics?kind=normal&q=BenchTopic009", "/groups", "/groups?system=1",
                         "/cluster", "/topics/BenchTopic00500", "/groups/BenchGroup00500", "/producers",
                         "/messages?topic=BenchTopic00500&key=k500", "/messages?topic=BenchTopic00500", "/actors"):
                times = []
                for _ in range(a.repeat):
                    t = time.perf_counter()
                    r = client.get(path)
                    times.append(time.perf_counter() - t)
                    assert r.status_code == 200, (path, r.status_code, r.text[-500:])
                print(f"{path:40s} median {statistics.median(times) * 1000:8.1f} ms  max {max(times) * 1000:8.1f} ms  "
                      f"({len(r.content):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
