"""Broker tables over the wire: topics and perm, groups, client heartbeats, offsets by time, status."""
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
    c = Cluster(tmp_path_factory.mktemp("admin") / "store", conf={"autoCreateTopicEnable": "false"},
                with_namesrv=False)
    yield c
    c.close()


def invoke(rc, c, code, **fields):
    return rc.invoke(c.broker, Frame(code, fields=fields))


def body(r):
    return msgpack.unpackb(bytes(r.bodies[0]))


def test_topic_lifecycle_and_perm(cluster):
    with RemotingClient() as rc:
        assert send(rc, cluster.broker, "Manual", b"x", 0).code == ResponseCode.TOPIC_NOT_EXIST   # no auto-create
        assert invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="Manual", readQueueNums=2,
                      writeQueueNums=2, perm=6).code == 0
        assert send(rc, cluster.broker, "Manual", b"x", 1).code == 0
        assert send(rc, cluster.broker, "Manual", b"x", 2).code == ResponseCode.SYSTEM_ERROR     # >= writeQueueNums
        topics = body(invoke(rc, cluster, RequestCode.GET_ALL_TOPIC_CONFIG))["topicConfigTable"]
        assert topics["Manual"]["readQueueNums"] == 2
        assert invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="Manual", perm=4).code == 0   # read-only
        assert send(rc, cluster.broker, "Manual", b"x", 0).code == ResponseCode.NO_PERMISSION
        assert pull(rc, cluster.broker, "Manual", 1, 0).code == 0    # read-only still serves pulls
        # the stats name the ConsumeQueues' max offsets: once reput has dispatched (a pull at the tail
        # may be answered from the append before that, so it is no sign of dispatch)
        wait_for(lambda: [s["maxOffset"] for s in body(invoke(rc, cluster, RequestCode.GET_TOPIC_STATS_INFO,
                                                              topic="Manual"))["offsetTable"]][:2] == [0, 1])
        assert invoke(rc, cluster, RequestCode.DELETE_TOPIC_IN_BROKER, topic="Manual").code == 0
        assert pull(rc, cluster.broker, "Manual", 1, 0).code == ResponseCode.TOPIC_NOT_EXIST
        bad = invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="a/b")
        assert bad.code == ResponseCode.SYSTEM_ERROR and "a/b" in bad.remark
        bad = invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="Ok", readQueueNums=0)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "readQueueNums" in bad.remark


def test_subscription_groups_and_consumer_list(cluster):
    with RemotingClient() as rc:
        assert invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, groupName="G1").code == 0
        groups = body(invoke(rc, cluster, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))["subscriptionGroupTable"]
        assert groups["G1"]["retryMaxTimes"] == 16
        for cid in ("c2", "c1"):
            hb = {"clientID": cid, "consumerDataSet": [{"groupName": "G1", "subscriptionDataSet": [
                {"topic": "T", "subString": "*"}]}], "producerDataSet": []}
            r = rc.invoke(cluster.broker, Frame(RequestCode.HEART_BEAT, bodies=[msgpack.packb(hb)]))
            assert r.code == 0
        r = invoke(rc, cluster, RequestCode.GET_CONSUMER_LIST_BY_GROUP, consumerGroup="G1")
        assert body(r)["consumerIdList"] == ["c1", "c2"]
        assert invoke(rc, cluster, RequestCode.UNREGISTER_CLIENT, clientID="c1", consumerGroup="G1").code == 0
        assert body(invoke(rc, cluster, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                           consumerGroup="G1"))["consumerIdList"] == ["c2"]
        assert invoke(rc, cluster, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="G1").code == 0
        bad = rc.invoke(cluster.broker, Frame(RequestCode.HEART_BEAT, bodies=[msgpack.packb([1, 2])]))
        assert bad.code == ResponseCode.SYSTEM_ERROR


def test_offsets_by_time_min_max_view_and_status(cluster):
    with RemotingClient() as rc:
        assert invoke(rc, cluster, RequestCode.UPDATE_AND_CREATE_TOPIC, topic="Timed", readQueueNums=1,
                      writeQueueNums=1).code == 0
        stamps, ids = [], []
        for i in range(5):
            r = send(rc, cluster.broker, "Timed", b"t%d" % i, 0)
            stamps.append(r.fields["storeTimestamp"])
            ids.append(r.fields["msgId"])
            time.sleep(0.01)
        wait_for(lambda: invoke(rc, cluster, RequestCode.GET_MAX_OFFSET, topic="Timed", queueId=0).fields["offset"] == 5)
        assert invoke(rc, cluster, RequestCode.GET_MIN_OFFSET, topic="Timed", queueId=0).fields["offset"] == 0
        for i, ts in enumerate(stamps):
            assert invoke(rc, cluster, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic="Timed", queueId=0,
                          timestamp=ts).fields["offset"] == i
        assert invoke(rc, cluster, RequestCode.GET_EARLIEST_MSG_STORETIME, topic="Timed",
                      queueId=0).fields["timestamp"] == stamps[0]
        _, phys = cl.decode_message_id(ids[3])
        r = invoke(rc, cluster, RequestCode.VIEW_MESSAGE_BY_ID, offset=phys)
        assert cl.decode_records(bytes(r.bodies[0]))[0].body == b"t3"
        table = body(invoke(rc, cluster, RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
        assert table["putMessageTotal"] >= 5 and table["commitLogMaxOffset"] > 0
        assert {"putTps", "getTps", "dispatchBehindBytes", "commitLogMinOffset", "flushedOffset"} <= set(table)
