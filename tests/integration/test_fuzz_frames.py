"""Random and hostile frames against a running broker (hypothesis): every one gets an
error reply (or is dropped by ZeroMQ's size limit), the broker keeps serving and the
store is unchanged."""

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq import protocol as P
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("fuzz") / "store", with_namesrv=False)
    yield c
    c.close()


def runtime(rc, ep):
    r = rc.invoke(ep, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    return msgpack.unpackb(bytes(r.bodies[0]))["table"]


values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() |
                      st.text(max_size=50) | st.binary(max_size=50),
                      lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10),
                                                                                        children, max_size=5),
                      max_leaves=20)
codes = st.sampled_from([int(c) for c in RequestCode if c < 9000]) | st.integers(-5, 100_000)
field_names = st.sampled_from(["topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "consumerGroup",
                               "properties", "subscription", "commitOffset", "key", "offset", "timestamp",
                               "bornHost", "flag", "readQueueNums", "perm", "groupName", "clientID"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(code=codes, fields=st.dictionaries(field_names, values, max_size=6), bodies=st.lists(st.binary(max_size=200),
                                                                                             max_size=3))
def test_random_requests_get_answers_and_broker_survives(broker, code, fields, bodies):
    with RemotingClient() as rc:
        before = runtime(rc, broker.broker)["commitLogMaxOffset"]
        try:
            r = rc.invoke(broker.broker, Frame(code, fields=fields, bodies=bodies), 3000)
        except P.ProtocolError:
            return
        assert r.is_response
        if r.code != ResponseCode.SUCCESS:
            assert r.remark
            assert runtime(rc, broker.broker)["commitLogMaxOffset"] == before


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.binary(max_size=64), min_size=1, max_size=6))
def test_random_raw_frames(broker, parts):
    with RemotingClient() as rc:
        rc.send_raw(broker.broker, parts)
        resp = rc.recv_raw(broker.broker, 10_000)
        assert resp is not None, f"no reply to {parts!r}"                 # never silently ignored
        assert resp.code != ResponseCode.SUCCESS and resp.remark
        assert rc.invoke(broker.broker, Frame(RequestCode.GET_BROKER_RUNTIME_INFO)).code == 0


def test_hostile_frames(broker):
    hostile = [
        [P.PROTOCOL_MAGIC, b"\xdf\xff\xff\xff\xff"],                                  # map claiming 4G entries
        [P.PROTOCOL_MAGIC, b"\xdd\xff\xff\xff\xff"],                                  # array bomb
        [P.PROTOCOL_MAGIC, msgpack.packb({"code": 10, "fields": {"topic": b"\xff\xfe".decode("latin1")}})],
        [P.PROTOCOL_MAGIC, b"\xa3\xff\xfe\xfd"],                                      # bad UTF-8 str
        [P.PROTOCOL_MAGIC, msgpack.packb({"code": 10, "fields": {"topic": "../../etc", "queueId": 0}}), b"x"],
        [P.PROTOCOL_MAGIC, msgpack.packb({"code": 10}), *([b"x"] * 10_000)],         # 10k parts
        [P.PROTOCOL_MAGIC, b"\x81" * 100_000],                                       # deep nesting
    ]
    with RemotingClient() as rc:
        before = runtime(rc, broker.broker)["commitLogMaxOffset"]
        for parts in hostile:
            rc.send_raw(broker.broker, parts)
            resp = rc.recv_raw(broker.broker, 3000)
            assert resp is not None and resp.code != ResponseCode.SUCCESS and resp.remark, parts[1][:20]
        # an oversized message is dropped by libzmq (MAXMSGSIZE) and the peer disconnected
        rc.send_raw(broker.broker, [P.PROTOCOL_MAGIC, msgpack.packb({"code": 10}), b"x" * (P.MAX_MESSAGE_SIZE + 4096)])
        assert rc.recv_raw(broker.broker, 2000) is None
    with RemotingClient() as rc:
        t = runtime(rc, broker.broker)
        assert t["commitLogMaxOffset"] == before and t["putMessageTotal"] == 0
        r = rc.invoke(broker.broker, Frame(RequestCode.SEND_MESSAGE, fields={"topic": "Fine", "queueId": 0},
                                           bodies=[b"still serving"]))
        assert r.code == ResponseCode.SUCCESS
