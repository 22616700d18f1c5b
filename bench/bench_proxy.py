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
- the C++ client's own ceilings: its ``send_sync`` against a remoting server that answers at once
  without storing anything, and its push consumer against the same server replaying the broker's
  pull answers (:func:`zero_work_server`, :func:`canned_pulls`), so what the proxy and the broker
  add is the gap between those rows and the proxy's;
- the single send taken apart (:func:`raw_remoting_sends`, :func:`raw_broker_sends`): the same
  SEND_MESSAGE one at a time from a bare Python socket (no client library) through the proxy and
  straight to the zero-work server, and the same request as one ZeroMQ frame straight to the broker
  (``RemotingClient.invoke``): the proxy's hop is the first minus the third, the C++ client's own
  cost is its zero-work row minus the bare socket's.

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


def _props(i: int) -> str:
    """cpp_client.py's i-th message's properties as the C++ client writes them (RocketMQ's string)."""
    return f"KEYS\x01k{i}\x02TAGS\x01T{i % 3}\x02seq\x01{i}\x02UNIQ_KEY\x01BENCH{i:027d}\x02WAIT\x01true\x02"


def raw_remoting_sends(addr: str, n: int, topic: str) -> float:
    """SEND_MESSAGE (10, JSON header) one at a time from a bare TCP socket to ``addr`` (a proxy or a
    zero-work server), the C++ client's fields and cpp_client.py's messages; returns msgs/s."""
    import socket

    from rmq.proxy.remoting import SERIALIZE_JSON, RemotingCommand, encode
    from tests.integration.proxy_helpers import connect, read_frame
    s = connect(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        t0 = 0.0
        for i in range(-200, n):                       # 200 warm-up sends
            if i == 0:
                t0 = time.perf_counter()
            j = max(i, 0)
            f = {"producerGroup": "bench-proxy-raw", "topic": topic, "defaultTopic": "TBW102",
                 "defaultTopicQueueNums": "4", "queueId": str(j % 8), "sysFlag": "0",
                 "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": _props(j),
                 "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
            s.sendall(encode(RemotingCommand(10, i + 1000, 0, None, f, body_of(j), "CPP", 407, SERIALIZE_JSON)))
            r = read_frame(s)
            if r.code != 0:
                raise RuntimeError(f"raw send answered {r.code}: {r.remark}")
        return n / (time.perf_counter() - t0)
    finally:
        s.close()


def raw_broker_sends(broker_addr: str, n: int, topic: str) -> float:
    """The same sends as one rmq frame each, straight to the broker (``RemotingClient.invoke``, no
    producer library): the broker and the ZeroMQ round trip alone; returns msgs/s."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode
    rc = RemotingClient()
    try:
        t0 = 0.0
        for i in range(-200, n):
            if i == 0:
                t0 = time.perf_counter()
            j = max(i, 0)
            r = rc.invoke(broker_addr, Frame(RequestCode.SEND_MESSAGE, fields={
                "producerGroup": "bench-proxy-raw", "topic": topic, "queueId": j % 8, "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000), "flag": 0, "reconsumeTimes": 0,
                "bornHost": "127.0.0.1:1", "properties": _props(j), "defaultTopicQueueNums": 4},
                bodies=[body_of(j)]), 5000)
            if r.code != 0:
                raise RuntimeError(f"raw send answered {r.code}: {r.remark}")
        return n / (time.perf_counter() - t0)
    finally:
        rc.close()


def same_as_cpp(i: int) -> Message:
    """The message cpp_client.py's producer sends as its i-th (body, tag, key, user property): both
    clients store the same messages (keys cost an IndexFile entry each)."""
    return Message("BenchProxySingle", body_of(i), tags=f"T{i % 3}", keys=f"k{i}", properties={"seq": str(i)})


def canned_pulls(broker_addr: str, topic: str, queues: int) -> dict:
    """Every PULL_MESSAGE answer of ``topic`` as the broker gives it (32 records a pull, from offset
    0): ``{(queue id, offset): (stored records, next offset, max offset)}`` for a zero-work replay."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode
    out, rc = {}, RemotingClient()
    try:
        for q in range(queues):
            offset = 0
            while True:
                r = rc.invoke(broker_addr, Frame(RequestCode.PULL_MESSAGE, fields={
                    "consumerGroup": "bench-proxy-canned", "topic": topic, "queueId": q, "queueOffset": offset,
                    "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
                    "subscription": "*", "subVersion": 0, "expressionType": "TAG"}), 5000)
                if r.code != 0 or not r.bodies:
                    break
                nxt = int(r.fields["nextBeginOffset"])
                out[(q, offset)] = (bytes(r.bodies[0]), nxt, int(r.fields["maxOffset"]))
                offset = nxt
    finally:
        rc.close()
    return out


def zero_work_server(pulls=None, queues: int = 4):
    """A remoting server on 127.0.0.1 in a thread that does no broker work: a route of ``queues``
    queues (itself), SEND_OK to every send, and PULL_MESSAGE answered from ``pulls``
    (:func:`canned_pulls`; nothing there: PULL_NOT_FOUND after the client's suspend time, at most
    1 s); heartbeats, offsets and consumer lists answered as a broker would for one client.
    Returns ``(address, stop)``."""
    import asyncio
    import struct

    from rmq.protocol import RequestCode
    from rmq.proxy.remoting import decode, encode
    started, box = threading.Event(), {}
    pulls = pulls or {}
    clients: set = set()

    async def conn(reader, writer):
        port, n = writer.get_extra_info("sockname")[1], 0
        try:
            while True:
                cmd = decode(await reader.readexactly(struct.unpack(">i", await reader.readexactly(4))[0]))
                f = cmd.ext_fields
                if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                    doc = {"queueDatas": [{"brokerName": "zero", "readQueueNums": queues, "writeQueueNums": queues,
                                           "perm": 6, "topicSysFlag": 0}],
                           "brokerDatas": [{"cluster": "zero", "brokerName": "zero",
                                            "brokerAddrs": {"0": f"127.0.0.1:{port}"}}]}
                    r = cmd.response(body=json.dumps(doc).encode())
                elif cmd.code == RequestCode.SEND_MESSAGE:
                    n += 1
                    r = cmd.response(0, None, {"msgId": "7F00000100002A9F%016X" % n, "queueOffset": n,
                                               "queueId": f.get("queueId", "0")})
                elif cmd.code == RequestCode.HEART_BEAT:
                    cid = json.loads(cmd.body or b"{}").get("clientID")
                    if cid:
                        clients.add(cid)
                    r = cmd.response()
                elif cmd.code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
                    r = cmd.response(body=json.dumps({"consumerIdList": sorted(clients)}).encode())
                elif cmd.code == RequestCode.QUERY_CONSUMER_OFFSET:
                    r = cmd.response(0, None, {"offset": 0})
                elif cmd.code == RequestCode.PULL_MESSAGE:
                    hit = pulls.get((int(f.get("queueId", 0)), int(f.get("queueOffset", 0))))
                    if hit is None:          # held like a broker's long poll, without holding the connection
                        async def not_found(cmd=cmd, f=f):
                            await asyncio.sleep(min(int(f.get("suspendTimeoutMillis", 0) or 0), 1000) / 1000)
                            writer.write(encode(cmd.response(19, None, {
                                "nextBeginOffset": f.get("queueOffset", 0), "minOffset": 0,
                                "maxOffset": f.get("queueOffset", 0), "suggestWhichBrokerId": 0})))
                        asyncio.get_running_loop().create_task(not_found())
                        continue
                    else:
                        body, nxt, mx = hit
                        r = cmd.response(0, None, {"nextBeginOffset": nxt, "minOffset": 0, "maxOffset": mx,
                                                   "suggestWhichBrokerId": 0}, body)
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
            rows.append(("bare socket SEND_MESSAGE through the proxy", raw_remoting_sends(addr, SINGLE,
                                                                                           "BenchProxySingle"), mine))
            zaddr, zstop = zero_work_server()
            try:
                rows.append(("bare socket SEND_MESSAGE, zero-work server", raw_remoting_sends(zaddr, SINGLE,
                                                                                               "BenchProxySingle"),
                             mine))
            finally:
                zstop()
            rows.append(("bare rmq frame straight to the broker (RemotingClient.invoke)",
                         raw_broker_sends(c.broker_addr, SINGLE, "BenchProxySingle"), mine))
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
            zaddr, zstop = zero_work_server(canned_pulls(c.broker_addr, "BenchProxyConsume", 8), queues=8)
            try:
                out = cpp("push-ids", zaddr, "BenchProxyConsume", "CID-bench-zero", CONSUME, 600)
            finally:
                zstop()
            rows.append(("C++ PushConsumer, zero-work replay of the pulls (client ceiling)",
                         CONSUME / out["seconds"] if out["seconds"] else 0.0, push))
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
