"""The remoting proxy against rmq's own clients, same run (issue 14's targets): the official C++
client (``rocketmq==0.4.4``) through ``rmq proxy`` beside rmq's ``Producer`` / ``PushConsumer``
with their defaults, and the raw pyzmq request/reply round trip as the transport's ceiling.

Run::

    python bench/bench_proxy.py

One broker group on loopback (the test harness's Cluster), 100 B bodies:

- one at a time: rmq ``Producer.send`` and the C++ ``Producer.send_sync`` through the proxy, SINGLE
  messages each (RMQ_BENCH_PROXY_SINGLE, default 3,000), the same messages both ways (cpp_client.py's:
  a tag, a key, a user property, every 100th body over 4 KiB);
- consume: CONSUME messages (RMQ_BENCH_PROXY_CONSUME, default 50,000) stored with
  ``Producer.send_batch``, read from the first offset by rmq's ``PushConsumer`` and by the C++
  push consumer through the proxy (fresh groups), from start until the last listener call;
- the raw pyzmq DEALER -> ROUTER echo round trip, one at a time (the ceiling of any single send);
- the RocketMQ 5 Python client (gRPC, ``rocketmq-python-client``) through the proxy's gRPC endpoint:
  Producer.send one at a time, SimpleConsumer receive + ack;
- Redis single XADD in the same run (when ``redis-server`` is installed);
- the C++ client's own ceiling: its ``send_sync`` against a remoting server that answers at once
  without storing anything (:func:`zero_work_server`), so what the proxy and the broker add is the
  gap between that row and the proxy's.

Targets: C++ sync send >= 80 % of rmq ``Producer.send``; C++ consumer >= 80 % of ``PushConsumer``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import zmq  # noqa: E402

from rmq import Message, Producer, PushConsumer  # noqa: E402
from rmq.launch import child_env, python_argv  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.cpp_client import body_of  # noqa: E402
from tests.integration.test_consumer import create_topic  # noqa: E402

SINGLE = int(os.environ.get("RMQ_BENCH_PROXY_SINGLE", "3000"))
CONSUME = int(os.environ.get("RMQ_BENCH_PROXY_CONSUME", "50000"))
BODY = b"x" * 100
CPP = os.path.join(ROOT, "tests", "integration", "cpp_client.py")


def cpp(*args) -> dict:
    r = subprocess.run([sys.executable, CPP, *map(str, args)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"C++ client {args[0]} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def zmq_rtt(n: int) -> float:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")

    def echo():
        for _ in range(n):
            router.send_multipart(router.recv_multipart())
    t = threading.Thread(target=echo, daemon=True)
    t.start()
    t0 = time.perf_counter()
    for _ in range(n):
        dealer.send(BODY)
        dealer.recv()
    rate = n / (time.perf_counter() - t0)
    t.join()
    ctx.destroy(0)
    return rate


def redis_single_xadd(n: int):
    """Single XADD round trips of 100 B (redis-py, AOF everysec), or the reason there is no figure."""
    from rmq.bench.peers import RedisServer, redis_missing
    why = redis_missing()
    if why:
        return None, why
    srv = RedisServer("everysec")
    try:
        r = srv.client
        for _ in range(200):
            r.xadd("bench-proxy", {"b": BODY})
        t0 = time.perf_counter()
        for _ in range(n):
            r.xadd("bench-proxy", {"b": BODY})
        return n / (time.perf_counter() - t0), ""
    finally:
        srv.close()


def grpc_rows(endpoint: str, single: int, consume: int, rmq_send: float, rmq_push: float) -> list:
    """The RocketMQ 5 Python client (rocketmq-python-client, gRPC) through the proxy: Producer.send
    one at a time, SimpleConsumer receive (batches of 32) + ack of each, same messages and sizes as
    the C++ rows' (tests/integration/grpc_client.py)."""
    from tests.integration.grpc_helpers import ensure_installed, grpc_client
    ensure_installed()
    out = grpc_client("produce", endpoint, "BenchProxyGrpc", single, timeout=900)
    rows = [("5.x Producer.send through the proxy (gRPC)", single / out["seconds"], rmq_send)]
    out = grpc_client("receive", endpoint, "BenchProxyConsume", "GID-bench-grpc", consume, "--batch", "32",
                      "--timeout-s", "600", "--await-s", "2", timeout=900)
    rows.append((f"5.x SimpleConsumer receive + ack through the proxy ({out['distinct']} distinct)",
                 consume / out["seconds"] if out["seconds"] else 0.0, rmq_push))
    return rows


def same_as_cpp(i: int) -> Message:
    """The message cpp_client.py's producer sends as its i-th (body, tag, key, user property): both
    clients store the same messages (keys cost an IndexFile entry each)."""
    return Message("BenchProxySingle", body_of(i), tags=f"T{i % 3}", keys=f"k{i}", properties={"seq": str(i)})


def zero_work_server():
    """A remoting server on 127.0.0.1 in a thread that answers a route (4 queues, itself) and
    SEND_OK to every send, storing nothing: ``(address, stop)``."""
    import asyncio
    import struct

    from rmq.protocol import RequestCode
    from rmq.proxy.remoting import decode, encode
    started, box = threading.Event(), {}

    async def conn(reader, writer):
        port, n = writer.get_extra_info("sockname")[1], 0
        try:
            while True:
                cmd = decode(await reader.readexactly(struct.unpack(">i", await reader.readexactly(4))[0]))
                if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                    doc = {"queueDatas": [{"brokerName": "zero", "readQueueNums": 4, "writeQueueNums": 4,
                                           "perm": 6, "topicSysFlag": 0}],
                           "brokerDatas": [{"cluster": "zero", "brokerName": "zero",
                                            "brokerAddrs": {"0": f"127.0.0.1:{port}"}}]}
                    r = cmd.response(body=json.dumps(doc).encode())
                elif cmd.code == RequestCode.SEND_MESSAGE:
                    n += 1
                    r = cmd.response(0, None, {"msgId": "7F00000100002A9F%016X" % n, "queueOffset": n,
                                               "queueId": cmd.ext_fields.get("queueId", "0")})
                else:
                    r = cmd.response()
                if not cmd.is_oneway:
                    writer.write(encode(r))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def run():
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(conn, "127.0.0.1", 0))
        box["addr"] = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
        box["loop"] = loop
        started.set()
        loop.run_forever()
    threading.Thread(target=run, daemon=True).start()
    started.wait(30)
    return box["addr"], lambda: box["loop"].call_soon_threadsafe(box["loop"].stop)


def main() -> None:
    with Cluster(tempfile.mkdtemp(prefix="rmq-bench-proxy-") + "/store") as c:
        create_topic(c, "BenchProxySingle", 8)
        create_topic(c, "BenchProxyConsume", 8)
        create_topic(c, "BenchProxyGrpc", 8)
        proxy = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", c.namesrv_addr, "--listen-port",
                                             "0", "--grpc-listen-port", "0"), stdout=subprocess.PIPE, text=True,
                                 env=child_env())
        line = proxy.stdout.readline().split()
        addr, grpc_addr = line[1], line[3]
        try:
            rows = []
            rows.append(("raw pyzmq DEALER/ROUTER round trip, one at a time", zmq_rtt(SINGLE), None))
            with Producer(c.namesrv_addr, group="bench-proxy-rmq") as p:
                for i in range(200):
                    p.send(same_as_cpp(i))
                t0 = time.perf_counter()
                for i in range(SINGLE):
                    p.send(same_as_cpp(i))
                mine = SINGLE / (time.perf_counter() - t0)
            rows.append(("rmq Producer.send, one at a time (the C++ messages)", mine, None))
            out = cpp("produce", addr, "BenchProxySingle", SINGLE)
            assert all(s["status"] == 0 for s in out["sent"])
            rows.append(("C++ Producer.send_sync through the proxy", SINGLE / out["seconds"], mine))
            zaddr, zstop = zero_work_server()
            try:
                out = cpp("produce", zaddr, "BenchProxySingle", SINGLE)
            finally:
                zstop()
            rows.append(("C++ Producer.send_sync, zero-work server (client ceiling)", SINGLE / out["seconds"], mine))
            with Producer(c.namesrv_addr, group="bench-proxy-fill") as p:
                for i in range(0, CONSUME, 1000):
                    p.send_batch([Message("BenchProxyConsume", BODY) for _ in range(min(1000, CONSUME - i))])
            got, done, lock = [0], threading.Event(), threading.Lock()

            def listener(msgs, ctx):
                with lock:
                    got[0] += len(msgs)
                    if got[0] >= CONSUME:
                        done.set()
            pc = PushConsumer(c.namesrv_addr, "bench-proxy-push", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
            pc.subscribe("BenchProxyConsume", "*")
            pc.register_message_listener(listener)
            t0 = time.perf_counter()
            pc.start()
            try:
                done.wait(600)
                push = got[0] / (time.perf_counter() - t0)
            finally:
                pc.shutdown()
            rows.append(("rmq PushConsumer (defaults), from the first offset", push, None))
            out = cpp("push-ids", addr, "BenchProxyConsume", "CID-bench-proxy", CONSUME, 600)
            n = len({m["msg_id"] for m in out["messages"]})
            rows.append((f"C++ PushConsumer through the proxy ({n} distinct)", CONSUME / out["seconds"], push))
            rows.extend(grpc_rows(grpc_addr, SINGLE, CONSUME, mine, push))
            xadd, why = redis_single_xadd(SINGLE)
            rows.append(("Redis single XADD (redis-py, AOF everysec)" + (f": {why}" if why else ""), xadd, None))
        finally:
            proxy.terminate()
            proxy.wait(10)
    print(f"bench_proxy: 100 B bodies, single {SINGLE}, consume {CONSUME}, one run, same machine")
    for name, rate, ref in rows:
        if rate is None:
            print(f"  {name}")
            continue
        ratio = f"  {rate / ref:.2f}x of rmq's own" if ref else ""
        print(f"  {name:<62} {rate:>10,.0f} msgs/s{ratio}")


if __name__ == "__main__":
    main()
