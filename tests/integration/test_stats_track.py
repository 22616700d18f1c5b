"""Broker statistics (VIEW_BROKER_STATS_DATA, ``rmq admin statsAll``), producer connections, message
track (which groups consumed a message) and resend to one group, against a real cluster with the
public Producer / PushConsumer."""
import json
import threading

import pytest
from click.testing import CliRunner

from rmq import Admin, Message, Producer, PushConsumer
from rmq.cli import main
from rmq.client.consumer import ConsumeConcurrentlyStatus
from rmq.errors import MQBrokerError, MQClientError
from rmq.stats import (GROUP_GET_NUMS, IDLE_DROP_MS, MAX_KEYS, MIN_SPAN_MS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE,
                       WINDOWS, StatsItemSet)
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import wait_for

pytestmark = pytest.mark.integration

FAST = dict(rebalance_interval_ms=300, persist_consumer_offset_interval_ms=200, heartbeat_broker_interval_ms=1000,
            poll_name_server_interval_ms=300)
N = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("stats") / "store")
    yield c
    c.close()


@pytest.fixture(scope="module")
def admin(cluster):
    with Admin(cluster.namesrv_addr, timeout_ms=5000) as a:
        wait_for(lambda: a.cluster_list(), 60)
        yield a


def cli(cluster, *args):
    r = CliRunner().invoke(main, ["admin", "--timeout-ms", "5000", "-n", cluster.namesrv_addr, *args])
    return r


@pytest.fixture(scope="module")
def traffic(cluster, admin):
    """N messages to StatsT by producer group spg (kept online), all consumed by group sg1
    (which stays online)."""
    admin.create_topic("StatsT", 4, 4)
    wait_for(lambda: "StatsT" in admin.topic_list(), 30)
    producer = Producer(cluster.namesrv_addr, group="spg")
    ids = [producer.send(Message("StatsT", b"s%02d" % i, tags="TagS", keys=[f"sk{i}"])).msg_id for i in range(N)]
    got, lock = {}, threading.Lock()

    def listener(msgs, ctx):
        with lock:
            for m in msgs:
                got.setdefault(m.body, []).append(m)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c1 = PushConsumer(cluster.namesrv_addr, "sg1", **FAST)
    c1.subscribe("StatsT", "*")
    c1.register_message_listener(listener)
    c1.start()
    wait_for(lambda: len(got) == N, 60, "sg1 consumed everything")
    # the committed offsets reach the broker
    wait_for(lambda: admin.consumer_progress("sg1", "StatsT").total_diff == 0, 30, "sg1 offsets committed")
    yield {"ids": ids, "got": got, "lock": lock, "producer": producer, "consumer": c1}
    c1.shutdown()
    producer.close()


def test_broker_stats_count_puts_and_gets_exactly(cluster, admin, traffic):
    put = admin.broker_stats(cluster.broker, TOPIC_PUT_NUMS, "StatsT")
    assert set(put) == {"statsMinute", "statsHour", "statsDay"}
    for w in put.values():
        assert w["sum"] == N and w["tps"] > 0 and w["avgpt"] == 1.0     # one message a send
    size = admin.broker_stats(cluster.broker, TOPIC_PUT_SIZE, "StatsT")
    assert size["statsDay"]["sum"] > N * 3          # whole records, bytes
    get = admin.broker_stats(cluster.broker, GROUP_GET_NUMS, "StatsT@sg1")
    assert get["statsDay"]["sum"] == N
    every = admin.broker_stats(cluster.broker, TOPIC_PUT_NUMS)
    assert every["StatsT"]["statsDay"]["sum"] == N
    with pytest.raises(MQBrokerError, match="not exist"):
        admin.broker_stats(cluster.broker, TOPIC_PUT_NUMS, "NoSuchTopic")
    with pytest.raises(MQBrokerError, match="unknown"):
        admin.broker_stats(cluster.broker, "NO_SUCH_STATS", "StatsT")


def test_stats_all_rows_and_cli(cluster, admin, traffic):
    rows = {(r.topic, r.consumer_group): r for r in admin.stats_all()}
    r = rows[("StatsT", "sg1")]
    assert r.accumulation == 0 and r.in_msg_24h == N and r.out_msg_24h == N and r.in_tps > 0 and r.out_tps > 0
    assert not any(t.startswith(("%RETRY%", "%DLQ%")) for t, _ in rows)
    assert [x.consumer_group for x in admin.stats_all("StatsT")] == ["sg1"]
    out = cli(cluster, "statsAll", "-t", "StatsT")
    assert out.exit_code == 0, out.output
    assert "#InMsg24Hour" in out.stdout and "sg1" in out.stdout
    data = json.loads(cli(cluster, "stats-all", "--active-topic", "--json").stdout)
    row = next(x for x in data["rows"] if x["topic"] == "StatsT")
    assert row == {"topic": "StatsT", "consumer_group": "sg1", "accumulation": 0, "in_tps": row["in_tps"],
                   "out_tps": row["out_tps"], "in_msg_24h": N, "out_msg_24h": N}
    # a topic nobody sent to in 24 h is left out of the active rows, kept in the full list
    admin.create_topic("QuietT", 2, 2)
    wait_for(lambda: "QuietT" in admin.topic_list(), 30)
    assert "QuietT" in {x.topic for x in admin.stats_all()}
    assert "QuietT" not in {x.topic for x in admin.stats_all(active_only=True)}
    both = admin.stats_all(["StatsT", "QuietT"])          # several topics, one pass over the masters
    assert [(x.topic, x.consumer_group) for x in both] == [("StatsT", "sg1"), ("QuietT", "")]
    with pytest.raises(MQClientError, match="does not exist"):
        admin.stats_all(["StatsT", "NoSuchTopic"])
    bad = cli(cluster, "statsAll", "-t", "NoSuchTopic")
    assert bad.exit_code == 1 and "Traceback" not in bad.output


def test_producer_connections(cluster, admin, traffic):
    rows = wait_for(lambda: admin.producer_list("spg"), 30, "producer heartbeat")
    assert rows[0].producer_group == "spg" and rows[0].broker_name == "broker-a"
    assert rows[0].client_id == traffic["producer"].client_id and rows[0].last_update_timestamp > 0
    assert admin.producer_list("nobody") == []
    data = json.loads(cli(cluster, "producerConnection", "-g", "spg", "--json").stdout)
    assert [p["client_id"] for p in data["producers"]] == [traffic["producer"].client_id]


def test_message_track_and_resend_to_one_group(cluster, admin, traffic):
    msg_id = traffic["ids"][7]
    [view] = admin.query_msg_by_id(msg_id, "StatsT")
    tracks = {t.consumer_group: t for t in admin.message_track(view)}
    assert tracks["sg1"].track_type == "CONSUMED" and tracks["sg1"].online
    # sg2 has an offset before the message: not consumed yet, and nobody of sg2 is online
    admin.reset_offset_by_time("sg2", "StatsT", 0)
    tracks = {t.consumer_group: t for t in admin.message_track(view)}
    assert tracks["sg2"].track_type == "NOT_CONSUME_YET" and not tracks["sg2"].online
    out = json.loads(cli(cluster, "queryMsgById", "-i", msg_id, "-t", "StatsT", "--json").stdout)
    assert {t["consumer_group"]: t["track_type"] for t in out["tracks"][0]} == {"sg1": "CONSUMED",
                                                                                "sg2": "NOT_CONSUME_YET"}
    # resend to sg1: sg1's listener gets it again, as the original topic, tags, keys and id
    with traffic["lock"]:
        before = len(traffic["got"][b"s07"])
    r = admin.resend_to_group(view, "sg1")
    assert r.message_queue.topic == "%RETRY%sg1"
    wait_for(lambda: len(traffic["got"][b"s07"]) > before, 60, "sg1 got the message again")
    with traffic["lock"]:
        again = traffic["got"][b"s07"][-1]
        assert sum(len(v) for v in traffic["got"].values()) == N + 1      # nothing else was redelivered
    assert again.topic == "StatsT" and again.tags == "TagS" and again.keys == ["sk7"] and again.msg_id == msg_id
    with pytest.raises(MQClientError, match="no retry topic"):
        admin.resend_to_group(view, "never_online")
    res = cli(cluster, "resendMessage", "-i", msg_id, "-t", "StatsT", "-g", "sg1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["result"]["topic"] == "%RETRY%sg1"
    wait_for(lambda: len(traffic["got"][b"s07"]) > before + 1, 60, "the CLI resend arrived")


# -- the windows, without a broker ---------------------------------------------------------------------
def test_stats_windows_are_exact_and_bounded():
    s = StatsItemSet(TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)
    t0 = 1_000_000_000
    s.add("T", 10, 1000, t0)
    s.add("T", 30, 3000, t0 + 500)                 # a batch of 30: avgpt = 40 / 2 calls
    snap = s.stats(TOPIC_PUT_NUMS, "T", t0 + 500)
    assert snap["statsMinute"] == {"sum": 40, "tps": 40.0 * 1000 / MIN_SPAN_MS, "avgpt": 20.0}
    assert s.stats(TOPIC_PUT_SIZE, "T", t0 + 500)["statsDay"]["sum"] == 4000
    minute_ms, kept = WINDOWS[0][1], WINDOWS[0][2]
    for i in range(1, kept + 1):                   # the minute window slides: its oldest sample drops
        s.sample(0, t0 + i * minute_ms)
    s.add("T", 5, 500, t0 + kept * minute_ms)
    snap = s.stats(TOPIC_PUT_NUMS, "T", t0 + kept * minute_ms)
    assert snap["statsMinute"]["sum"] == 5 and snap["statsDay"]["sum"] == 45
    assert s.stats(TOPIC_PUT_NUMS, "other", t0) is None
    # the day sample drops keys idle for a day, and keeps at most MAX_KEYS
    s.add("old", 1, 1, t0)
    s.add("T", 1, 1, t0 + IDLE_DROP_MS)
    s.sample(2, t0 + IDLE_DROP_MS + 1)
    assert set(s.items) == {"T"}


def test_stats_keys_beyond_max_keys_drop_the_least_recently_updated(monkeypatch):
    import rmq.stats
    assert MAX_KEYS == 100_000
    monkeypatch.setattr(rmq.stats, "MAX_KEYS", 3)
    s = StatsItemSet(GROUP_GET_NUMS, "GROUP_GET_SIZE")
    for i in range(5):
        s.add(f"T@g{i}", 1, 1, 1000 + i)
    s.sample(0, 2000)                       # only the day sample trims
    assert len(s.items) == 5
    s.sample(2, 2000)
    assert sorted(s.items) == ["T@g2", "T@g3", "T@g4"]


def test_producer_connection_list_request(cluster, traffic):
    """GET_PRODUCER_CONNECTION_LIST (204): the live producer of a group; RocketMQ's SYSTEM_ERROR
    for a group with none."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode, ResponseCode, unpack_body
    with RemotingClient() as rc:
        r = wait_for(lambda: (x := rc.invoke(cluster.broker, Frame(RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                                                   fields={"producerGroup": "spg"}))).code == 0 and x,
                     30, "producer heartbeat")
        assert [c["clientId"] for c in unpack_body(r)["connectionSet"]] == [traffic["producer"].client_id]
        r = rc.invoke(cluster.broker, Frame(RequestCode.GET_PRODUCER_CONNECTION_LIST, fields={"producerGroup": "none"}))
        assert r.code == ResponseCode.SYSTEM_ERROR and "not exist" in r.remark
