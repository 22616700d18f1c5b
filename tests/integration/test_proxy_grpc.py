"""RocketMQ 5's gRPC API through ``rmq proxy`` (rmq/proxy/grpc_server.py): the official Python 5.x
client (PyPI ``rocketmq-python-client==5.1.2``, run by tests/integration/grpc_client.py from its
own install directory, tests/integration/grpc_helpers.py) produces and receives (POP) through
rmq; rmq's own clients see the same store; bad requests get RocketMQ 5's status codes and change
nothing."""
import subprocess

import grpc
import pytest

from rmq import Message, Producer, PullConsumer
from rmq.client.consumer import MessageQueue
from rmq.launch import child_env, python_argv
from rmq.proxy import grpc_server as G
from rmq.proxy.grpc_v2 import messaging_pb2 as pb
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.grpc_client import BIG_EVERY, body_of
from tests.integration.grpc_helpers import grpc_client
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration
N = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # fast transaction check-backs (tests/integration/test_transaction.py's settings)
    c = Cluster(tmp_path_factory.mktemp("proxy-grpc") / "store",
                conf={"transactionCheckInterval": "300", "transactionTimeOut": "1000", "transactionCheckMax": "30"})
    yield c
    c.close()


@pytest.fixture(scope="module")
def endpoint(cluster):
    """``rmq proxy`` with its gRPC endpoint on a free port: that endpoint (``host:port``)."""
    p = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", cluster.namesrv_addr, "--listen-port", "0",
                                     "--grpc-listen-port", "0"), stdout=subprocess.PIPE, text=True, env=child_env())
    line = p.stdout.readline().split()
    assert len(line) == 4 and line[0] == "proxy" and line[2] == "grpc", f"the proxy did not start: {line}"
    yield line[3]
    p.terminate()
    assert p.wait(15) == 0
    p.stdout.close()


def rmq_view(cluster, topic, queues) -> dict:
    """UNIQ_KEY -> message, read by rmq's own PullConsumer from every queue."""
    out = {}
    with PullConsumer(cluster.namesrv_addr, group="grpc-rmq-reader", auto_commit=False) as pc:
        for q in range(queues):
            offset = 0
            while True:
                r = pc.pull(MessageQueue(topic, "broker-a", q), "*", offset, 32, timeout_ms=3000)
                if not r.msg_found_list:
                    break
                for m in r.msg_found_list:
                    out[m.properties["UNIQ_KEY"]] = m
                offset = r.next_begin_offset
    return out


def test_rocketmq5_client_produces_and_receives_through_the_proxy(cluster, endpoint, grpc_client_path):
    create_topic(cluster, "G5X", 4)
    sent = grpc_client("produce", endpoint, "G5X", N)["sent"]
    assert len(sent) == N and len({s["msg_id"] for s in sent}) == N
    assert {s["queue"]["id"] for s in sent} == {0, 1, 2, 3}                 # round robin over the queues
    got = grpc_client("receive", endpoint, "G5X", "GID-g5x", N, "--timeout-s", "90", "--await-s", "2")
    assert got["distinct"] == N and len(got["messages"]) == N              # each once, acked
    by_id = {m["msg_id"]: m for m in got["messages"]}
    for s in sent:
        m = by_id[s["msg_id"]]
        i = s["i"]
        assert m["body"].encode("latin-1") == body_of(i)                    # bodies past 4 KiB too
        assert (m["tag"], m["keys"], m["properties"], m["delivery_attempt"]) == (f"T{i % 3}", [f"k{i}"],
                                                                                {"seq": str(i)}, 1)
        assert m["corrupted"] is False                                       # the CRC32 digest checks
    assert any(s["i"] % BIG_EVERY == 0 for s in sent)
    # one store, two protocols: rmq's own consumer reads what the 5.x producer sent
    mine = rmq_view(cluster, "G5X", 4)
    assert set(mine) == set(by_id)
    for s in sent[:20]:
        m = mine[s["msg_id"]]
        assert (bytes(m.body), m.tags, m.properties["seq"]) == (body_of(s["i"]), f"T{s['i'] % 3}", str(s["i"]))
        assert m.queue_offset == s["offset"]                                 # the offset the send reported


def test_rmq_producer_to_rocketmq5_consumer_with_a_tag_filter(cluster, endpoint, grpc_client_path):
    create_topic(cluster, "G5T", 2)
    with Producer(cluster.namesrv_addr, group="grpc-rmq-producer") as p:
        for i in range(40):
            p.send(Message("G5T", b"rmq-%d" % i, tags="A" if i % 4 == 0 else "B", keys=f"r{i}",
                           properties={"n": str(i)}))
    got = grpc_client("receive", endpoint, "G5T", "GID-g5t", 10, "--tag-expression", "A", "--timeout-s", "60",
                      "--await-s", "2")
    assert sorted(m["body"] for m in got["messages"]) == sorted(f"rmq-{i}" for i in range(0, 40, 4))
    assert {m["tag"] for m in got["messages"]} == {"A"}


def test_unacked_message_comes_back_after_its_invisible_time(cluster, endpoint, grpc_client_path):
    create_topic(cluster, "G5R", 1)
    with Producer(cluster.namesrv_addr, group="grpc-rmq-producer") as p:
        p.send(Message("G5R", b"again", tags="X"))
    out = grpc_client("change-invisible", endpoint, "G5R", "GID-g5r", "--invisible-s", "30", "--new-invisible-s", "2",
                      "--timeout-s", "60")
    first, again = out["first"], out["redelivered"]
    assert out["changed"]["receipt_handle_after"] != out["changed"]["receipt_handle_before"]
    assert again is not None, out
    assert (again["msg_id"], again["body"], again["delivery_attempt"]) == (first["msg_id"], "again", 2)


def test_rocketmq5_push_consumer_and_its_retries(cluster, endpoint, grpc_client_path):
    """The 5.x PushConsumer (QueryAssignment, receives on the assigned queue, the listener's result
    acks or, on FAILURE, changes the invisible time to the retry policy's first backoff)."""
    create_topic(cluster, "G5P", 4)
    sent = grpc_client("produce", endpoint, "G5P", 40)["sent"]
    out = grpc_client("push", endpoint, "G5P", "GID-g5p", 40, "--timeout-s", "60")
    assert out["distinct"] == 40 and {m["msg_id"] for m in out["messages"]} == {s["msg_id"] for s in sent}
    out = grpc_client("push", endpoint, "G5P", "GID-g5p-retry", 40, "--fail-first", "--timeout-s", "90")
    assert out["distinct"] == 40                                   # each SUCCEEDED on its second delivery
    attempts = {}
    for m in out["messages"]:
        attempts.setdefault(m["msg_id"], []).append(m["delivery_attempt"])
    assert all(sorted(a)[:2] == [1, 2] for a in attempts.values()), attempts


def test_transactions_commit_rollback_and_check_backs_over_grpc(cluster, endpoint, grpc_client_path):
    """Half messages (producer group = topic, as RocketMQ 5's proxy): even ones committed, odd ones
    rolled back by the client; then odd ones left open, and the broker's check-backs reach the
    client's TransactionChecker through the Telemetry stream, which answers by parity."""
    create_topic(cluster, "G5TX", 2)
    out = grpc_client("transaction", endpoint, "G5TX", 6)
    assert [s["resolution"] for s in out["sent"]] == ["COMMIT", "ROLLBACK"] * 3
    out2 = grpc_client("transaction", endpoint, "G5TX", 6, "--unresolved", "--check-wait-s", "60", timeout=240)
    open_ids = {s["msg_id"] for s in out2["sent"] if s["resolution"] is None}
    assert len(open_ids) == 3 and open_ids <= {c["msg_id"] for c in out2["checked"]}       # every open one checked
    assert {c["resolution"] for c in out2["checked"] if c["msg_id"] in open_ids} == {"ROLLBACK"}  # odd seqs
    committed = {s["msg_id"] for s in out["sent"] + out2["sent"] if s["resolution"] == "COMMIT"}
    want = committed | {c["msg_id"] for c in out2["checked"] if c["resolution"] == "COMMIT"}
    wait_for(lambda: set(rmq_view(cluster, "G5TX", 2)) == want, 60, what="the committed messages visible")
    assert len(want) == 6                                       # 3 + 3 even ones; no rolled-back one shows


# -- the wire, with rmq's own stubs of the same messages ---------------------------------------------------
def stub(endpoint):
    ch = grpc.insecure_channel(endpoint)

    def unary(name, req, resp):
        return ch.unary_unary(f"/{G.SERVICE}/{name}", request_serializer=req.SerializeToString,
                              response_deserializer=resp.FromString)

    def stream(name, req, resp):
        return ch.unary_stream(f"/{G.SERVICE}/{name}", request_serializer=req.SerializeToString,
                               response_deserializer=resp.FromString)
    return ch, unary, stream


MD = [(G.CLIENT_ID_HEADER, "127.0.0.1@test@0")]


def test_bad_requests_get_rocketmq5_status_codes_and_write_nothing(cluster, endpoint):
    create_topic(cluster, "G5B", 1)
    ch, unary, stream = stub(endpoint)
    try:
        before = broker_runtime_info(cluster.broker_addr)["commitLogMaxOffset"]
        send = unary("SendMessage", pb.SendMessageRequest, pb.SendMessageResponse)

        def one(body=b"x", props=None, mtype=pb.NORMAL, topic="G5B", msg_id="BAD0"):
            m = pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=props or {},
                           system_properties=pb.SystemProperties(message_id=msg_id, message_type=mtype,
                                                                 body_encoding=pb.IDENTITY))
            r = send(pb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)
            return r.status.code, r.entries[0].status.code
        assert one(body=b"") == (pb.MESSAGE_BODY_EMPTY,) * 2
        assert one(body=b"x" * (G.MAX_BODY_SIZE + 1)) == (pb.MESSAGE_BODY_TOO_LARGE,) * 2
        assert one(props={"UNIQ_KEY": "mine"}) == (pb.ILLEGAL_MESSAGE_PROPERTY_KEY,) * 2   # a system property
        assert one(props={"a\x01b": "c"}) == (pb.ILLEGAL_MESSAGE_PROPERTY_KEY,) * 2        # a separator
        assert one(mtype=pb.LITE) == (pb.UNSUPPORTED,) * 2
        assert one(msg_id=" ") == (pb.ILLEGAL_MESSAGE_ID,) * 2
        assert one(topic="NoSuchTopicG5") == (pb.TOPIC_NOT_FOUND,) * 2
        assert broker_runtime_info(cluster.broker_addr)["commitLogMaxOffset"] == before     # nothing written
        route = unary("QueryRoute", pb.QueryRouteRequest, pb.QueryRouteResponse)(
            pb.QueryRouteRequest(topic=pb.Resource(name="NoSuchTopicG5")), metadata=MD, timeout=10)
        assert route.status.code == pb.TOPIC_NOT_FOUND and not route.message_queues
        ack = unary("AckMessage", pb.AckMessageRequest, pb.AckMessageResponse)(pb.AckMessageRequest(
            group=pb.Resource(name="GID-b"), topic=pb.Resource(name="G5B"),
            entries=[pb.AckMessageEntry(message_id="m", receipt_handle="not a handle")]), metadata=MD, timeout=10)
        assert ack.status.code == ack.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE
        recv = list(stream("ReceiveMessage", pb.ReceiveMessageRequest, pb.ReceiveMessageResponse)(
            pb.ReceiveMessageRequest(group=pb.Resource(name="GID-b"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name="G5B")), batch_size=G.MAX_RECEIVE_BATCH + 1), metadata=MD, timeout=10))
        assert [r.status.code for r in recv] == [pb.BAD_REQUEST]
        hb = unary("Heartbeat", pb.HeartbeatRequest, pb.HeartbeatResponse)(
            pb.HeartbeatRequest(client_type=pb.PRODUCER), timeout=10)               # no client id
        assert hb.status.code == pb.CLIENT_ID_REQUIRED
        with pytest.raises(grpc.RpcError) as e:                                     # not served: UNIMPLEMENTED
            ch.unary_unary(f"/{G.SERVICE}/PullMessage")(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        ch.close()


def test_empty_receive_long_polls_then_says_not_found(cluster, endpoint):
    create_topic(cluster, "G5E", 1)
    ch, unary, stream = stub(endpoint)
    try:
        import time
        t0 = time.monotonic()
        recv = list(stream("ReceiveMessage", pb.ReceiveMessageRequest, pb.ReceiveMessageResponse)(
            pb.ReceiveMessageRequest(group=pb.Resource(name="GID-e"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name="G5E")), batch_size=4, long_polling_timeout=G._dur(1000)),
            metadata=MD, timeout=30))
        assert [r.status.code for r in recv] == [pb.MESSAGE_NOT_FOUND]
        assert time.monotonic() - t0 >= 0.9                                         # it waited (held pop)
    finally:
        ch.close()


def test_receipt_handles_parse_and_refuse():
    h = G.ReceiptHandle("5 1700000000000 30000 2 0 broker-a 3 7")
    assert (h.start_offset, h.pop_time, h.invisible_time, h.revive_qid, h.retry, h.broker_name, h.queue_id,
            h.queue_offset) == (5, 1700000000000, 30000, 2, "0", "broker-a", 3, 7)
    assert h.renewed(1700000001000, 5000, 1) == "7 1700000001000 5000 1 0 broker-a 3 7"
    for bad in ("", "1 2 3", "a b c d e f g h", "1 2 3 4 5 b 6"):
        with pytest.raises(ValueError):
            G.ReceiptHandle(bad)
    assert G.MAX_RECEIVE_BATCH == 32 and G.MAX_BODY_SIZE == 4 * 1024 * 1024 and G.GRPC_SERVER_PORT == 8081

