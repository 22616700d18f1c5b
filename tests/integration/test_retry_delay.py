"""Delayed messages, consumer send-back to %RETRY% / %DLQ%, and queue locks over the wire."""
import time

import msgpack
import pytest

from rmq._core import commitlog as cl
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, send, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("retry") / "store",
                conf={"messageDelayLevel": " ".join(["100ms"] * 18)}, with_namesrv=False)
    yield c
    c.close()


def pulled(rc, c, topic, queue_id=0, offset=0):
    r = pull(rc, c.broker, topic, queue_id, offset)
    return cl.decode_records(bytes(r.bodies[0])) if r.code == ResponseCode.SUCCESS else []


def test_delay_level_message_arrives_later(cluster):
    with RemotingClient() as rc:
        t0 = time.monotonic()
        r = rc.invoke(cluster.broker, Frame(RequestCode.SEND_MESSAGE, fields={
            "topic": "Delayed", "queueId": 1, "properties": {"DELAY": "3"}}, bodies=[b"soon"]))
        assert r.code == ResponseCode.SUCCESS
        msgs = wait_for(lambda: pulled(rc, cluster, "Delayed", 1), 60)
        assert time.monotonic() - t0 >= 0.09
        assert msgs[0].body == b"soon" and "DELAY" not in msgs[0].properties


def test_send_back_to_retry_then_dlq(cluster):
    with RemotingClient() as rc:
        assert send(rc, cluster.broker, "Work", b"job", 0, keys=["job1"]).code == 0
        m = wait_for(lambda: pulled(rc, cluster, "Work"))[0]
        r = rc.invoke(cluster.broker, Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields={
            "offset": m.commitlog_offset, "group": "Workers", "delayLevel": 0, "originMsgId": m.msg_id,
            "maxReconsumeTimes": 1}))
        assert r.code == ResponseCode.SUCCESS, r.remark
        retry = wait_for(lambda: pulled(rc, cluster, "%RETRY%Workers"), 60)[0]
        assert retry.body == b"job" and retry.reconsume_times == 1
        assert retry.properties["RETRY_TOPIC"] == "Work" and retry.properties["ORIGIN_MESSAGE_ID"] == m.msg_id
        r = rc.invoke(cluster.broker, Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields={
            "offset": retry.commitlog_offset, "group": "Workers", "delayLevel": 0, "maxReconsumeTimes": 1}))
        assert r.code == ResponseCode.SUCCESS
        dlq = wait_for(lambda: pulled(rc, cluster, "%DLQ%Workers"), 60)[0]
        assert dlq.body == b"job" and dlq.reconsume_times == 2 and dlq.properties["ORIGIN_MESSAGE_ID"] == m.msg_id
        bad = rc.invoke(cluster.broker, Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields={
            "offset": 10**12, "group": "Workers"}))
        assert bad.code == ResponseCode.SYSTEM_ERROR and "offset" in bad.remark


def test_queue_locks(cluster):
    def lock(rc, client, code=RequestCode.LOCK_BATCH_MQ):
        body = {"consumerGroup": "Ord", "clientId": client, "mqSet": [["T", "broker-a", 0], ["T", "broker-a", 1]]}
        r = rc.invoke(cluster.broker, Frame(code, bodies=[msgpack.packb(body)]))
        return msgpack.unpackb(bytes(r.bodies[0]))["lockOKMQSet"] if r.bodies else r.code
    with RemotingClient() as rc:
        assert len(lock(rc, "c1")) == 2
        assert lock(rc, "c2") == []                      # held by c1
        assert len(lock(rc, "c1")) == 2                  # renewal
        assert lock(rc, "c1", RequestCode.UNLOCK_BATCH_MQ) == ResponseCode.SUCCESS
        assert len(lock(rc, "c2")) == 2
        bad = rc.invoke(cluster.broker, Frame(RequestCode.LOCK_BATCH_MQ, bodies=[msgpack.packb({"x": 1})]))
        assert bad.code == ResponseCode.SYSTEM_ERROR


def test_heartbeat_creates_retry_topic(cluster):
    with RemotingClient() as rc:
        hb = {"clientID": "x1", "consumerDataSet": [{"groupName": "HB", "messageModel": "CLUSTERING",
                                                      "subscriptionDataSet": []}]}
        assert rc.invoke(cluster.broker, Frame(RequestCode.HEART_BEAT, bodies=[msgpack.packb(hb)])).code == 0
        r = rc.invoke(cluster.broker, Frame(RequestCode.GET_ALL_TOPIC_CONFIG))
        assert "%RETRY%HB" in msgpack.unpackb(bytes(r.bodies[0]))["topicConfigTable"]
