"""RocketMQ ACL 1.0 on the remoting proxy (``rmq proxy --acl-file``) against real processes: the
official C++ client (``set_session_credentials``, run by tests/integration/cpp_client.py) with the
right keys produces and consumes; a wrong secret or an account without PUB is refused with
NO_PERMISSION and RocketMQ's message, and nothing is written (max offsets read by rmq's own
Admin client); ``rmq admin updateAclConfig`` / ``deleteAclConfig`` on the running proxy's file
take effect without a restart."""
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from rmq.client.admin import Admin
from rmq.launch import child_env, python_argv
from rmq.proxy.acl import sign_fields
from rmq.proxy.remoting import RemotingCommand, encode
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import create_topic, wait_for
from tests.integration.test_proxy import HERE, connect, read_frame

pytestmark = pytest.mark.integration
TOPIC = "AclTopic"
PUB_AK, PUB_SK = "rmqPublisher", "publisher-secret"        # PUB|SUB on TOPIC
SUB_AK, SUB_SK = "subOnlyUser", "subonly-secret"            # SUB on every topic, no PUB
G_TOPIC = "AclGrpcTopic"
G_PUB_AK, G_PUB_SK = "grpcPublisher", "grpc-pub-secret"     # the gRPC test's: PUB|SUB on G_TOPIC
G_SUB_AK, G_SUB_SK = "grpcSubOnly", "grpc-sub-secret"       # the gRPC test's: SUB only
N = 20
NO_PERMISSION = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("proxy-acl") / "store")
    create_topic(c, TOPIC, 2)
    create_topic(c, G_TOPIC, 2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def acl_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("acl") / "plain_acl.yml")
    doc = {"accounts": [
        {"accessKey": PUB_AK, "secretKey": PUB_SK, "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
         "topicPerms": [f"{TOPIC}=PUB|SUB"]},
        {"accessKey": SUB_AK, "secretKey": SUB_SK, "defaultTopicPerm": "SUB", "defaultGroupPerm": "SUB"},
        {"accessKey": G_PUB_AK, "secretKey": G_PUB_SK, "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
         "topicPerms": [f"{G_TOPIC}=PUB|SUB"]},
        {"accessKey": G_SUB_AK, "secretKey": G_SUB_SK, "defaultTopicPerm": "SUB", "defaultGroupPerm": "SUB"}]}
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return path


@pytest.fixture(scope="module")
def proxy_addrs(cluster, acl_file):
    """(remoting address, gRPC endpoint) of ``rmq proxy --acl-file``."""
    p = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", cluster.namesrv_addr, "--listen-port", "0",
                                     "--grpc-listen-port", "0", "--acl-file", acl_file),
                         stdout=subprocess.PIPE, text=True, env=child_env())
    line = p.stdout.readline().split()
    assert line and line[0] == "proxy" and line[2] == "grpc", f"the proxy did not start: {line}"
    assert line[1].startswith("127.0.0.1:") and line[3].startswith("127.0.0.1:")    # loopback by default
    yield line[1], line[3]
    p.terminate()
    assert p.wait(10) == 0
    p.stdout.close()


@pytest.fixture(scope="module")
def proxy(proxy_addrs):
    return proxy_addrs[0]


def cpp_as(ak, sk, *args, timeout=120) -> tuple:
    """(exit code, JSON out) of the C++ client signing with ``ak`` / ``sk``."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "cpp_client.py"), *map(str, args),
                        "--access-key", ak, "--secret-key", sk], capture_output=True, text=True, timeout=timeout)
    return r.returncode, (json.loads(r.stdout) if r.stdout else {"error": r.stderr[-2000:]})


def max_offsets(cluster) -> list:
    with Admin(cluster.namesrv_addr) as a:
        return [q.max_offset for q in a.topic_status(TOPIC)]


def wire_send(proxy, ak, sk, body=b"wire") -> RemotingCommand:
    """A SEND_MESSAGE (10) signed as AclClientRPCHook signs it, straight on the wire."""
    fields = {"producerGroup": "PID-acl-wire", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
              "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
              "properties": "", "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
    with connect(proxy) as s:
        s.sendall(encode(RemotingCommand(10, opaque=5, ext_fields=sign_fields(fields, body, ak, sk), body=body)))
        return read_frame(s)


def test_right_keys_produce_and_consume(cluster, proxy):
    rc, out = cpp_as(PUB_AK, PUB_SK, "produce", proxy, TOPIC, N)
    assert rc == 0, out
    assert [s["status"] for s in out["sent"]] == [0] * N
    rc, out = cpp_as(PUB_AK, PUB_SK, "pull", proxy, TOPIC, "CID-acl-pull")
    assert rc == 0, out
    assert sorted(m["seq"] for m in out["messages"]) == sorted(str(i) for i in range(N))
    rc, out = cpp_as(SUB_AK, SUB_SK, "push", proxy, TOPIC, "CID-acl-push", N, 60)   # SUB is enough to consume
    assert rc == 0 and len({m["msg_id"] for m in out["messages"]}) == N, out


def test_wrong_secret_is_refused_and_writes_nothing(cluster, proxy):
    before = max_offsets(cluster)
    rc, out = cpp_as(PUB_AK, "not-the-secret", "produce", proxy, TOPIC, 3)
    assert rc == 3 and out["sent"] == [] and out["error"], out              # a clear failure, nothing sent
    r = wire_send(proxy, PUB_AK, "not-the-secret")
    assert (r.code, r.remark) == (NO_PERMISSION, f"Check signature failed for accessKey={PUB_AK}")
    r = wire_send(proxy, "unknownKey1", "whatever-secret")
    assert (r.code, r.remark) == (NO_PERMISSION, "No acl config for unknownKey1")
    with connect(proxy) as s:                                               # unsigned
        s.sendall(encode(RemotingCommand(105, opaque=9, ext_fields={"topic": TOPIC})))
        r = read_frame(s)
    assert (r.code, r.remark) == (NO_PERMISSION, "No accessKey is configured")
    assert max_offsets(cluster) == before


def test_account_without_pub_cannot_send(cluster, proxy):
    before = max_offsets(cluster)
    r = wire_send(proxy, SUB_AK, SUB_SK)
    assert (r.code, r.remark) == (NO_PERMISSION, f"No default permission for topic:{TOPIC}")
    rc, out = cpp_as(SUB_AK, SUB_SK, "produce", proxy, TOPIC, 2)
    assert rc == 3 and out["sent"] == [], out
    assert max_offsets(cluster) == before


def test_update_acl_config_takes_effect_without_restart(cluster, proxy, acl_file):
    def admin(*args):
        r = subprocess.run(python_argv("rmq.cli", "admin", *args, "--acl-file", acl_file), capture_output=True,
                           text=True, env=child_env(), timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr

    assert wire_send(proxy, SUB_AK, SUB_SK).code == NO_PERMISSION
    admin("updateAclConfig", "-a", SUB_AK, "-t", f"{TOPIC}=PUB|SUB")
    r = wait_for(lambda: (lambda r: r if r.code != NO_PERMISSION else None)(wire_send(proxy, SUB_AK, SUB_SK)),
                 15, "the proxy taking the new permission")
    assert r.code == 0, r.remark
    rc, out = cpp_as(SUB_AK, SUB_SK, "produce", proxy, TOPIC, 2)
    assert rc == 0 and [s["status"] for s in out["sent"]] == [0, 0], out
    admin("deleteAclConfig", "-a", SUB_AK)
    r = wait_for(lambda: (lambda r: r if r.code == NO_PERMISSION else None)(wire_send(proxy, SUB_AK, SUB_SK)),
                 15, "the proxy dropping the account")
    assert r.remark == f"No acl config for {SUB_AK}"


# -- RocketMQ 5 gRPC clients: the same accounts (authorization metadata, MQv2-HMAC-SHA1) ----------------------
def test_grpc_clients_sign_with_the_same_accounts(cluster, proxy_addrs, grpc_client_path):
    from tests.integration.grpc_helpers import grpc_client
    endpoint = proxy_addrs[1]
    sent = grpc_client("produce", endpoint, G_TOPIC, 5, "--access-key", G_PUB_AK, "--secret-key", G_PUB_SK)["sent"]
    assert len(sent) == 5
    got = grpc_client("receive", endpoint, G_TOPIC, "GID-acl-grpc", 5, "--access-key", G_SUB_AK, "--secret-key",
                      G_SUB_SK, "--timeout-s", "60", "--await-s", "2")
    assert {m["msg_id"] for m in got["messages"]} >= {s["msg_id"] for s in sent}
    # a wrong secret: UNAUTHORIZED; no PUB: FORBIDDEN; no keys at all: refused too; nothing sent
    for args, what in ((("--access-key", G_PUB_AK, "--secret-key", "wrong-secret"), "Check signature failed"),
                       (("--access-key", G_SUB_AK, "--secret-key", G_SUB_SK), "No default permission for topic"),
                       ((), "No accessKey is configured")):
        out = grpc_client("produce", endpoint, G_TOPIC, 1, *args, expect_code=3)
        assert not out.get("sent"), out
        assert what in out["error"] + json.dumps(out.get("client_log", "")), (what, out)
