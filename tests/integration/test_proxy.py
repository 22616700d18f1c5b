"""The remoting proxy (``rmq proxy``) against real processes: the official RocketMQ C++ client
(PyPI ``rocketmq==0.4.4``, run by tests/integration/cpp_client.py in its own process) produces
and consumes through it; rmq's own clients see the same store; bad frames get a clear close and
change nothing; every request code it does not serve gets REQUEST_CODE_NOT_SUPPORTED."""
import json
import os
import socket
import struct
import subprocess

import pytest

from rmq import Message, Producer, PullConsumer
from rmq.client.consumer import MessageQueue
from rmq.launch import child_env, python_argv
from rmq.testing import broker_runtime_info
from rmq.proxy.remoting import (MAX_FRAME_BYTES, SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand, decode,
                                encode)
from tests.integration.cluster import Cluster
from tests.integration.cpp_client import BIG_EVERY, body_of
from tests.integration.proxy_helpers import cpp
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))
N = 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("proxy") / "store")
    yield c
    c.close()


@pytest.fixture(scope="module")
def proxy(cluster):
    p = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", cluster.namesrv_addr, "--listen-port", "0",
                                     "--grpc-listen-port", "0"),
                         stdout=subprocess.PIPE, text=True, env=child_env())
    line = p.stdout.readline().split()
    assert line and line[0] == "proxy", f"the proxy did not start: {line}"
    yield line[1]
    p.terminate()
    assert p.wait(10) == 0                                  # SIGTERM: a clean stop
    p.stdout.close()


def rmq_view(cluster, topic, queues) -> dict:
    """(queue id, queue offset) -> message, read by rmq's own PullConsumer."""
    out = {}
    with PullConsumer(cluster.namesrv_addr, group="proxy-rmq-reader", auto_commit=False) as pc:
        for q in range(queues):
            offset = 0
            while True:
                r = pc.pull(MessageQueue(topic, "broker-a", q), "*", offset, 32, timeout_ms=3000)
                if not r.msg_found_list:
                    break
                for m in r.msg_found_list:
                    out[(q, m.queue_offset)] = m
                offset = r.next_begin_offset
    return out


def test_cpp_client_produces_and_consumes_through_the_proxy(cluster, proxy):
    create_topic(cluster, "CPX", 4)
    sent = cpp("produce", proxy, "CPX", N)["sent"]
    assert [s["status"] for s in sent] == [0] * N                      # SEND_OK
    by_id = {s["msg_id"]: s for s in sent}
    assert len(by_id) == N

    def check(messages, what):
        ids = [m["msg_id"] for m in messages]
        assert len(ids) == len(set(ids)) == N, f"{what}: {len(ids)} messages, {len(set(ids))} distinct"
        for m in messages:
            s = by_id[m["msg_id"]]
            i = s["i"]
            assert m["body"].encode("latin-1") == body_of(i), what
            assert (m["tags"], m["keys"], m["seq"], m["topic"]) == (f"T{i % 3}", f"k{i}", str(i), "CPX"), what
            assert m["queue_offset"] == s["offset"], what

    check(cpp("pull", proxy, "CPX", "CID-cpp-pull")["messages"], "C++ pull consumer")
    check(cpp("push", proxy, "CPX", "CID-cpp-push", N, 120)["messages"], "C++ push consumer")
    # one store, two protocols: rmq's own consumer reads the same messages, bodies inflated
    mine = rmq_view(cluster, "CPX", 4)
    assert len(mine) == N
    assert sorted(bytes(m.body) for m in mine.values()) == sorted(body_of(i) for i in range(N))
    big = [m for m in mine.values() if len(m.body) > 4096]
    assert len(big) == N // BIG_EVERY and all(m.properties.get("seq") for m in big)


def test_rmq_producer_reaches_the_cpp_consumer(cluster, proxy):
    create_topic(cluster, "CPY", 2)
    with Producer(cluster.namesrv_addr, group="proxy-rmq-producer") as p:
        for i in range(50):
            p.send(Message("CPY", b"from-rmq-%d" % i, tags="R", keys=f"r{i}", properties={"seq": str(i)}))
    got = cpp("pull", proxy, "CPY", "CID-cpp-from-rmq")["messages"]
    assert sorted(m["body"] for m in got) == sorted(f"from-rmq-{i}" for i in range(50))
    assert {m["tags"] for m in got} == {"R"} and {m["seq"] for m in got} == {str(i) for i in range(50)}


# -- the wire, raw ------------------------------------------------------------------------------------
def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def read_frame(s) -> RemotingCommand:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    n = struct.unpack(">i", head)[0]
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return decode(data)


def closed(s) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_route_points_at_the_proxy_in_the_request_header_type(cluster, proxy):
    create_topic(cluster, "CPR", 3)
    for stype in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        with connect(proxy) as s:
            s.sendall(encode(RemotingCommand(105, opaque=7, ext_fields={"topic": "CPR"}, serialize_type=stype)))
            r = read_frame(s)
        assert (r.code, r.opaque, r.serialize_type, r.is_response) == (0, 7, stype, True)
        route = json.loads(r.body)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": proxy}
        assert route["queueDatas"][0]["readQueueNums"] == 3 and route["queueDatas"][0]["writeQueueNums"] == 3
    with connect(proxy) as s:
        s.sendall(encode(RemotingCommand(105, opaque=8, ext_fields={"topic": "NoSuchTopicHere"})))
        assert read_frame(s).code == 17                                    # TOPIC_NOT_EXIST


def test_unknown_codes_are_refused_and_the_connection_stays(proxy):
    with connect(proxy) as s:
        for code in (12345, 12, 200050):
            s.sendall(encode(RemotingCommand(code, opaque=code)))
            r = read_frame(s)
            assert (r.code, r.opaque) == (3, code) and "not supported" in r.remark   # REQUEST_CODE_NOT_SUPPORTED
        s.sendall(encode(RemotingCommand(105, opaque=1, ext_fields={"topic": "TBW102"})))
        assert read_frame(s).code == 0                                        # still serving


@pytest.mark.parametrize("bad", [
    struct.pack(">i", MAX_FRAME_BYTES + 1),                                   # over the limit
    struct.pack(">i", -5),                                                    # negative length
    struct.pack(">i", 2) + b"xx",                                             # no header-length word
    (lambda h: struct.pack(">i", 4 + len(h)) + struct.pack(">I", len(h)) + h)(b"{not json"),
    (lambda h: struct.pack(">i", 4 + len(h)) + struct.pack(">I", (7 << 24) | len(h)) + h)(b"{}"),  # type 7
    struct.pack(">i", 100) + struct.pack(">I", 500) + b"x" * 96,              # header past the frame
], ids=["over-limit", "negative", "short", "not-json", "unknown-type", "header-past-frame"])
def test_bad_frames_close_the_connection_and_change_nothing(cluster, proxy, bad):
    before = broker_runtime_info(cluster.broker_addr)["commitLogMaxOffset"]
    with connect(proxy) as s:
        s.sendall(bad)
        assert wait_for(lambda: closed(s), what="the connection closed")
    with connect(proxy) as s:                                                 # the proxy is up
        s.sendall(encode(RemotingCommand(105, opaque=2, ext_fields={"topic": "TBW102"})))
        assert read_frame(s).code == 0
    assert broker_runtime_info(cluster.broker_addr)["commitLogMaxOffset"] == before


# -- under the supervisor -----------------------------------------------------------------------------
def test_rmq_start_enable_proxy_runs_it_as_an_actor(tmp_path):
    """`rmq start --enable-proxy`: the proxy is an actor of its own group, started after the broker
    group; the C++ client works through it; killed, it comes back on the same port; it stops with
    exit code 0; a bad enableProxy / remotingListenPort is refused before anything starts."""
    import re
    import signal

    from tests.integration.test_supervisor_real import DEADLINE_S, alive, rmq, spawned
    store = str(tmp_path / "store")
    started = rmq("start", "--store-path", store, "--detach", "--namesrv-addr", "127.0.0.1:0", "--listen-port", "0",
                  "--enable-proxy", "--remoting-listen-port", "0", "--grpc-listen-port", "0")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        addr = re.search(r"^started proxy pid \d+ tcp://(\S+)$", started.stdout, re.M).group(1)
        assert [ln.split()[1] for ln in started.stdout.splitlines() if ln.startswith("started ")][-1] == "proxy"
        sent = cpp("produce", addr, "SupProxy", 20)["sent"]
        assert [s["status"] for s in sent] == [0] * 20
        first = spawned(store)["proxy"]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: spawned(store)["proxy"] != first and alive(spawned(store)["proxy"]), DEADLINE_S)

        def pulled():
            try:
                return len(cpp("pull", addr, "SupProxy", "CID-sup-proxy")["messages"]) == 20
            except AssertionError:             # not listening again yet
                return False
        wait_for(pulled, DEADLINE_S, what="the restarted proxy serving on the same port")
    finally:
        stopped = rmq("stop", "--store-path", store)
    assert stopped.returncode == 0 and "stopped cleanly" in stopped.stdout, stopped.stdout + stopped.stderr
    with open(os.path.join(store, "logs", "supervisor.log"), errors="replace") as f:
        assert re.search(r"stopped proxy \(pid \d+\): exit code 0", f.read())
    conf = tmp_path / "bad.conf"
    for props, why in (("enableProxy=maybe\n", "enableProxy must be true or false"),
                       ("enableProxy=true\nremotingListenPort=70000\n", "remotingListenPort=70000 outside")):
        conf.write_text(props)
        r = rmq("start", "-c", str(conf), "--store-path", str(tmp_path / "bad"), "--detach",
                "--namesrv-addr", "127.0.0.1:0", "--listen-port", "0")
        assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
