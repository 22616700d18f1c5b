"""``rmq.Admin`` and ``rmq admin ...`` against a real NameServer + broker group.

Every command runs twice: by its camelCase name with the table checked, and by its
kebab alias with ``--json`` parsed and checked.  Then ``--help`` for every name, and
the error paths (unknown topic, bad timestamp, unreachable NameServer: exit code 1,
``Error: ...`` on stderr, no traceback).
"""
import datetime as dt
import json
import time

import pytest
from click.testing import CliRunner

from rmq import Admin
from rmq.admin_cli import admin as admin_group, fmt_ts
from rmq.cli import main
from rmq.client.admin import ConsumerProgress, MessageView, QueueStatus, TopicRoute, TopicUpdate
from rmq.client.message import SendStatus
from rmq.errors import MQClientError, RemotingTimeoutError
from tests.integration.cluster import Cluster
from tests.integration.test_broker import wait_for

pytestmark = pytest.mark.integration

COMMANDS = [("updateTopic", "update-topic"), ("deleteTopic", "delete-topic"), ("topicList", "topic-list"),
            ("topicRoute", "topic-route"), ("topicStatus", "topic-status"), ("clusterList", "cluster-list"),
            ("brokerStatus", "broker-status"), ("consumerProgress", "consumer-progress"),
            ("queryMsgById", "query-msg-by-id"), ("queryMsgByKey", "query-msg-by-key"),
            ("queryMsgByOffset", "query-msg-by-offset"), ("resetOffsetByTime", "reset-offset-by-time"),
            ("sendMessage", "send-message"), ("consumeMessage", "consume-message"),
            ("updateBrokerConfig", "update-broker-config"), ("getBrokerConfig", "get-broker-config"),
            ("promoteSlave", "promote-slave"), ("statsAll", "stats-all"), ("resendMessage", "resend-message"),
            ("producerConnection", "producer-connection"), ("queryMsgTraceById", "query-msg-trace-by-id"),
            ("halfMessages", "half-messages"), ("pendingTimers", "timers"),
            ("updateAclConfig", "update-acl-config"), ("deleteAclConfig", "delete-acl-config"),
            ("getSyncStateSet", "get-sync-state-set"), ("getControllerMetaData", "get-controller-metadata"),
            ("electMaster", "elect-master")]
N_SEEDED = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("admin-cli") / "store")
    yield c
    c.close()


def run(cluster, *args, env=None):
    return CliRunner().invoke(main, ["admin", "--timeout-ms", "5000", "-n", cluster.namesrv_addr, *args], env=env)


def ok(cluster, *args, env=None) -> str:
    r = run(cluster, *args, env=env)
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert r.stderr == "" or "warning" in r.stderr
    return r.stdout


def js(cluster, *args) -> dict:
    return json.loads(ok(cluster, *args, "--json"))


def fails(cluster, *args, env=None) -> str:
    r = run(cluster, *args, env=env)
    assert r.exit_code == 1, (r.exit_code, r.stdout, r.stderr)
    assert r.stderr.startswith("Error: ")
    assert "Traceback" not in r.stderr + r.stdout
    return r.stderr


def wait_route(admin, topic):
    return wait_for(lambda: topic in admin.topic_list() and admin.topic_route(topic), 60)


@pytest.fixture(scope="module")
def admin(cluster):
    with Admin(cluster.namesrv_addr, timeout_ms=5000) as a:
        wait_for(lambda: a.cluster_list(), 60)
        yield a


@pytest.fixture(scope="module")
def seeded(admin):
    """Topic AdminT (4 queues) with N_SEEDED messages on queue 1, keys k<i> + 'shared', tag TagA."""
    admin.create_topic("AdminT", 4, 4)
    wait_route(admin, "AdminT")
    sent = []
    for i in range(N_SEEDED):
        r = admin.send_message("AdminT", b"body-%d" % i, tags="TagA", keys=[f"k{i}", "shared"], queue_id=1)
        assert r.status is SendStatus.SEND_OK and r.queue_offset == i
        sent.append(r)
    wait_for(lambda: [s.max_offset for s in admin.topic_status("AdminT")] == [0, N_SEEDED, 0, 0])
    wait_for(lambda: len(admin.query_msg_by_key("AdminT", "shared")) == N_SEEDED)
    return sent


# -- every command: table + --json ---------------------------------------------------------------
def test_update_topic(cluster, admin):
    out = ok(cluster, "updateTopic", "-t", "UpdT", "-r", "2", "-w", "3", "-p", "6")
    assert "UpdT" in out and cluster.broker_addr in out and "broker-a" in out and "6 (RW)" in out
    route = wait_route(admin, "UpdT")
    assert (route.queue_datas[0].read_queue_nums, route.queue_datas[0].write_queue_nums) == (2, 3)
    d = js(cluster, "update-topic", "-t", "UpdT", "-c", "TestCluster", "-r", "4", "-w", "4", "-p", "4", "-o", "true")
    assert d["topic"] == "UpdT"
    assert d["brokers"] == [{"broker_name": "broker-a", "broker_addr": cluster.broker_addr, "topic": "UpdT",
                             "read_queue_nums": 4, "write_queue_nums": 4, "perm": 4, "order": True}]
    wait_for(lambda: admin.topic_route("UpdT").queue_datas[0].perm == 4)
    d = js(cluster, "update_topic", "-t", "UpdT", "-b", cluster.broker_addr)      # snake alias, -b, defaults
    assert d["brokers"][0]["broker_addr"] == cluster.broker_addr and d["brokers"][0]["read_queue_nums"] == 8
    assert d["brokers"][0]["perm"] == 6


def test_delete_topic(cluster, admin):
    admin.create_topic("DelT", 1, 1)
    wait_route(admin, "DelT")
    out = ok(cluster, "deleteTopic", "-t", "DelT")
    assert "DelT" in out and cluster.broker_addr in out and cluster.namesrv_addr in out
    assert "DelT" not in admin.topic_list()
    with pytest.raises(MQClientError, match="does not exist"):
        admin.topic_route("DelT")
    admin.create_topic("DelT", 1, 1)
    wait_route(admin, "DelT")
    d = js(cluster, "delete-topic", "-t", "DelT", "-c", "TestCluster")
    assert d == {"topic": "DelT", "broker_addrs": [cluster.broker_addr], "namesrv_addrs": [cluster.namesrv_addr]}
    assert "DelT" not in admin.topic_list()


def test_topic_list(cluster, seeded):
    out = ok(cluster, "topicList")
    assert "AdminT" in out and "topics" in out
    d = js(cluster, "topic-list")
    assert "AdminT" in d["topics"] and d["topics"] == sorted(d["topics"])


def test_topic_route(cluster, seeded):
    out = ok(cluster, "topicRoute", "-t", "AdminT")
    for s in ("TestCluster", "broker-a", cluster.broker_addr, "6 (RW)"):
        assert s in out
    d = js(cluster, "topic-route", "-t", "AdminT")
    assert d["topic"] == "AdminT"
    assert d["broker_datas"] == [{"cluster": "TestCluster", "broker_name": "broker-a",
                                  "broker_addrs": {"0": cluster.broker_addr}}]
    assert d["queue_datas"] == [{"broker_name": "broker-a", "read_queue_nums": 4, "write_queue_nums": 4,
                                 "perm": 6, "topic_sys_flag": 0}]


def test_topic_status(cluster, seeded):
    d = js(cluster, "topic-status", "-t", "AdminT")
    assert d["topic"] == "AdminT"
    q = {x["queue_id"]: x for x in d["queues"]}
    assert sorted(q) == [0, 1, 2, 3]
    assert set(q[1]) == {"broker_name", "queue_id", "min_offset", "max_offset", "last_update_timestamp"}
    assert (q[1]["min_offset"], q[1]["max_offset"]) == (0, N_SEEDED)
    assert abs(q[1]["last_update_timestamp"] - time.time() * 1000) < 600_000
    assert q[0]["max_offset"] == 0 and q[0]["last_update_timestamp"] == 0
    out = ok(cluster, "topicStatus", "-t", "AdminT")
    lines = [ln for ln in out.splitlines() if "broker-a" in ln]
    assert len(lines) == 4
    assert [c.strip() for c in lines[1].split("│")[2:6]] == [      # QID, min, max, last updated
        "1", "0", str(N_SEEDED), fmt_ts(q[1]["last_update_timestamp"])]
    assert [c.strip() for c in lines[0].split("│")[2:6]] == ["0", "0", "0", ""]


def test_cluster_list(cluster, seeded):
    out = ok(cluster, "clusterList")
    for s in ("TestCluster", "broker-a", cluster.broker_addr, "rmq-0.1"):
        assert s in out
    d = js(cluster, "cluster-list", "-c", "TestCluster")
    [b] = d["brokers"]
    assert (b["cluster"], b["broker_name"], b["broker_id"], b["broker_addr"]) == (
        "TestCluster", "broker-a", 0, cluster.broker_addr)
    assert b["error"] == "" and b["version"] == "rmq-0.1" and b["put_message_total"] >= N_SEEDED
    assert b["commitlog_max_offset"] > 0 and b["runtime"]["brokerName"] == "broker-a"
    assert fails(cluster, "clusterList", "-c", "NoSuchCluster").count("NoSuchCluster") == 1


def test_broker_status(cluster, seeded):
    out = ok(cluster, "brokerStatus", "-b", cluster.broker_addr)
    for s in (cluster.broker_addr, "putMessageTotal", "commitLogMaxOffset", "brokerName", "broker-a"):
        assert s in out
    d = js(cluster, "broker-status", "-c", "TestCluster")
    [b] = d["brokers"]
    assert b["broker_addr"] == cluster.broker_addr
    assert b["status"]["brokerName"] == "broker-a" and b["status"]["putMessageTotal"] >= N_SEEDED
    assert "-b" in fails(cluster, "brokerStatus")


def test_consumer_progress(cluster, admin, seeded):
    admin.reset_offset_by_time("ProgG", "AdminT", 0)            # every queue at 0
    f = admin.reset_offset_by_time("ProgG", "AdminT", -1, force=True)
    assert [r.reset_offset for r in f] == [0, N_SEEDED, 0, 0]
    # move queue 1 back to 2 with a timestamp between the 2nd and 3rd message
    ts2 = admin.query_msg_by_offset("AdminT", "broker-a", 1, 2).store_timestamp
    admin.reset_offset_by_time("ProgG", "AdminT", ts2)
    off1 = admin.consumer_progress("ProgG").queues[1].consumer_offset
    assert off1 <= 2
    out = ok(cluster, "consumerProgress", "-g", "ProgG")
    assert "AdminT" in out and f"Diff Total: {N_SEEDED - off1}" in out
    row = [ln for ln in out.splitlines() if "broker-a" in ln][1]
    assert [c.strip() for c in row.split("│")[3:7]] == ["1", str(N_SEEDED), str(off1), str(N_SEEDED - off1)]
    d = js(cluster, "consumer-progress", "-g", "ProgG", "-t", "AdminT")
    assert d["group"] == "ProgG" and d["total_diff"] == N_SEEDED - off1
    q1 = [q for q in d["queues"] if q["queue_id"] == 1][0]
    assert q1 == {"topic": "AdminT", "broker_name": "broker-a", "queue_id": 1, "broker_offset": N_SEEDED,
                  "consumer_offset": off1, "diff": N_SEEDED - off1, "last_timestamp": q1["last_timestamp"],
                  "lag_timestamp": q1["lag_timestamp"], "inflight": 0}
    assert (q1["last_timestamp"] > 0) == (off1 > 0)
    # lag in time: the store time of the first message not consumed yet
    assert q1["lag_timestamp"] == admin.query_msg_by_offset("AdminT", "broker-a", 1, off1).store_timestamp
    assert all(q["lag_timestamp"] == 0 for q in d["queues"] if q["diff"] == 0)
    assert "has no consume offsets" in fails(cluster, "consumerProgress", "-g", "NeverConsumed")


def test_query_msg_by_id(cluster, seeded):
    s = seeded[3]
    for mid in (s.msg_id, s.offset_msg_id):               # unique key, then offset message id
        out = ok(cluster, "queryMsgById", "-i", mid)
        for x in (s.msg_id, s.offset_msg_id, "AdminT", "TagA", "k3 shared", "body-3", "broker-a"):
            assert x in out
        d = js(cluster, "query-msg-by-id", "-i", mid)
        [m] = d["messages"]
        assert (m["msg_id"], m["offset_msg_id"], m["topic"], m["queue_id"], m["queue_offset"]) == (
            s.msg_id, s.offset_msg_id, "AdminT", 1, 3)
        assert m["body"] == "body-3" and m["tags"] == "TagA" and m["keys"] == ["k3", "shared"]
        assert m["store_host"] == cluster.broker_addr and m["properties"]["UNIQ_KEY"] == s.msg_id
    d = js(cluster, "queryMsgById", "-i", f"{seeded[0].msg_id},{seeded[1].offset_msg_id}", "-t", "AdminT")
    assert [m["body"] for m in d["messages"]] == ["body-0", "body-1"]
    assert "no message with id" in fails(cluster, "queryMsgById", "-i", "00" * 16)


def test_query_msg_by_key(cluster, seeded):
    out = ok(cluster, "queryMsgByKey", "-t", "AdminT", "-k", "k2")
    assert seeded[2].msg_id in out and "body-2" in out and "k2 shared" in out
    assert "body-1" not in out
    d = js(cluster, "query-msg-by-key", "-t", "AdminT", "-k", "shared")
    assert d["topic"] == "AdminT" and d["key"] == "shared"
    assert [m["body"] for m in d["messages"]] == [f"body-{i}" for i in range(N_SEEDED)]
    assert [m["msg_id"] for m in d["messages"]] == [s.msg_id for s in seeded]
    d = js(cluster, "query-msg-by-key", "-t", "AdminT", "-k", "shared", "-m", "2")
    assert len(d["messages"]) == 2
    assert js(cluster, "queryMsgByKey", "-t", "AdminT", "-k", "nope")["messages"] == []


def test_query_msg_by_offset(cluster, seeded):
    out = ok(cluster, "queryMsgByOffset", "-t", "AdminT", "-b", "broker-a", "-i", "1", "-o", "4")
    assert seeded[4].msg_id in out and "body-4" in out and "Queue Offset" in out
    d = js(cluster, "query-msg-by-offset", "-t", "AdminT", "-b", "broker-a", "-i", "1", "-o", "0")
    [m] = d["messages"]
    assert (m["msg_id"], m["queue_offset"], m["body"], m["broker_name"]) == (seeded[0].msg_id, 0, "body-0",
                                                                             "broker-a")
    err = fails(cluster, "queryMsgByOffset", "-t", "AdminT", "-b", "broker-a", "-i", "1", "-o", "99")
    assert "no message at offset 99" in err
    assert "broker-x" in fails(cluster, "queryMsgByOffset", "-t", "AdminT", "-b", "broker-x", "-i", "1", "-o", "0")


def test_reset_offset_by_time(cluster, admin):
    admin.create_topic("ResetT", 1, 1)
    wait_route(admin, "ResetT")
    for i in range(5):
        admin.send_message("ResetT", b"r%d" % i, queue_id=0)
        time.sleep(0.02)
    msgs = wait_for(lambda: (lambda m: m if len(m) == 5 else None)(admin.consume_message("ResetT")))
    ts = [m.store_timestamp for m in msgs]
    assert ts == sorted(ts) and len(set(ts)) == 5
    out = ok(cluster, "resetOffsetByTime", "-g", "ResetG", "-t", "ResetT", "-s", str(ts[2]))
    row = [ln for ln in out.splitlines() if "broker-a" in ln][0]
    # Broker Name, QID, Broker Offset, Consumer Offset, Timestamp Offset, Reset Offset, Updated
    assert [c.strip() for c in row.split("│")[1:8]] == ["broker-a", "0", "5", "0", "2", "2", "true"]
    assert admin.consumer_progress("ResetG").queues[0].consumer_offset == 2
    # a time between two messages: the first one stored after it
    d = js(cluster, "reset-offset-by-time", "-g", "ResetG", "-t", "ResetT", "-s", str(ts[3] - 1))
    assert (d["group"], d["topic"], d["timestamp"], d["force"]) == ("ResetG", "ResetT", ts[3] - 1, True)
    assert d["queues"] == [{"topic": "ResetT", "broker_name": "broker-a", "queue_id": 0, "broker_offset": 5,
                            "consumer_offset": 2, "timestamp_offset": 3, "reset_offset": 3, "updated": True}]
    assert d["online_consumers"] == []
    # -f false: never forward ...
    d = js(cluster, "resetOffsetByTime", "-g", "ResetG", "-t", "ResetT", "-s", "now", "-f", "false")
    assert d["queues"][0]["timestamp_offset"] == 5 and d["queues"][0]["reset_offset"] == 3
    assert d["queues"][0]["updated"] is False
    # ... but backwards, and RocketMQ's yyyy-MM-dd#HH:mm:ss:SSS form
    local = dt.datetime.fromtimestamp(ts[1] // 1000).strftime("%Y-%m-%d#%H:%M:%S") + f":{ts[1] % 1000:03d}"
    d = js(cluster, "reset_offset_by_time", "-g", "ResetG", "-t", "ResetT", "-s", local, "-f", "false")
    assert d["timestamp"] == ts[1] and d["queues"][0]["reset_offset"] == 1 and d["queues"][0]["updated"]
    assert admin.consumer_progress("ResetG", "ResetT").queues[0].consumer_offset == 1
    d = js(cluster, "reset-offset-by-time", "-g", "ResetG", "-t", "ResetT", "-s", "now")
    assert d["queues"][0]["reset_offset"] == 5


def test_send_message(cluster, admin, seeded):
    out = ok(cluster, "sendMessage", "-t", "AdminT", "-p", "hello table", "-k", "sk1 sk2", "-c", "TagS",
             "-b", "broker-a", "-i", "2")
    assert "SEND_OK" in out and "broker-a" in out
    d = js(cluster, "send-message", "-t", "AdminT", "-p", "hello json", "-i", "3")
    assert set(d) == {"status", "msg_id", "offset_msg_id", "topic", "broker_name", "queue_id", "queue_offset"}
    assert (d["status"], d["topic"], d["broker_name"], d["queue_id"]) == ("SEND_OK", "AdminT", "broker-a", 3)
    assert len(d["msg_id"]) == 32 and len(d["offset_msg_id"]) == 32
    # SEND_OK precedes reput's dispatch into the ConsumeQueue (as in RocketMQ): a pull right after may see nothing yet
    assert wait_for(lambda: d["msg_id"] in ok(cluster, "consumeMessage", "-t", "AdminT", "-i", "3"))
    m = wait_for(lambda: (lambda r: r[0] if r else None)(admin.query_msg_by_key("AdminT", "sk2")))
    assert m.body == b"hello table" and m.tags == "TagS" and m.queue_id == 2 and m.keys == ["sk1", "sk2"]
    # a topic without a route: the broker auto-creates it (autoCreateTopicEnable)
    d = js(cluster, "sendMessage", "-t", "AutoCreatedT", "-p", "x")
    assert d["status"] == "SEND_OK" and d["queue_offset"] == 0
    assert "queue id 7" in fails(cluster, "sendMessage", "-t", "AdminT", "-p", "x", "-i", "7", "-b", "broker-a")


def test_consume_message(cluster, admin, seeded):
    out = ok(cluster, "consumeMessage", "-t", "AdminT", "-i", "1", "-c", "3")
    assert "body-0" in out and "body-2" in out and "body-3" not in out and seeded[1].msg_id in out
    d = js(cluster, "consume-message", "-t", "AdminT", "-b", "broker-a", "-i", "1", "-o", "2")
    assert d["topic"] == "AdminT" and d["group"] is None
    assert [m["body"] for m in d["messages"]] == [f"body-{i}" for i in range(2, N_SEEDED)]
    assert [m["queue_offset"] for m in d["messages"]] == list(range(2, N_SEEDED))
    # with a group: from its committed offsets, committing nothing
    admin.reset_offset_by_time("ConsG", "AdminT", -1)
    admin.reset_offset_by_time("ConsG", "AdminT", 0)
    before = admin.consumer_progress("ConsG", "AdminT").total_diff
    d = js(cluster, "consumeMessage", "-t", "AdminT", "-g", "ConsG", "-c", "2")
    assert d["group"] == "ConsG" and len(d["messages"]) == 2
    assert admin.consumer_progress("ConsG", "AdminT").total_diff == before


# -- names, help, options -------------------------------------------------------------------------
@pytest.mark.parametrize("camel,alias", COMMANDS)
def test_help_for_every_command_and_alias(camel, alias):
    r = CliRunner()
    outs = []
    for name, flag in ((camel, "--help"), (alias, "-h"), (alias.replace("-", "_"), "--help")):
        res = r.invoke(main, ["admin", name, flag], prog_name="rmq")
        assert res.exit_code == 0, (name, res.output)
        assert f"Usage: rmq admin {camel} [OPTIONS]" in res.stdout      # aliases resolve to the command
        assert "--json" in res.stdout and "--namesrv-addr" in res.stdout and "JSON:" in res.stdout
        outs.append(res.stdout)
    assert outs[0] == outs[1] == outs[2]


def test_group_help_lists_every_command_and_alias():
    res = CliRunner().invoke(main, ["admin", "--help"])
    assert res.exit_code == 0
    for camel, alias in COMMANDS:
        assert f"{camel}, {alias}" in res.stdout
    assert "admin" in CliRunner().invoke(main, ["--help"]).stdout
    assert sorted(admin_group.list_commands(None)) == sorted(c for c, _ in COMMANDS)


@pytest.mark.parametrize("camel,option", [
    ("updateTopic", "-t, --topic"), ("updateTopic", "-c, --cluster-name"), ("updateTopic", "-b, --broker-addr"),
    ("updateTopic", "-r, --read-queue-nums"), ("updateTopic", "-w, --write-queue-nums"), ("updateTopic", "-p, --perm"),
    ("updateTopic", "-o, --order"), ("queryMsgByKey", "-k, --msg-key"), ("queryMsgById", "-i, --msg-id"),
    ("queryMsgByOffset", "-b, --broker-name"), ("queryMsgByOffset", "-i, --queue-id"),
    ("queryMsgByOffset", "-o, --offset"), ("resetOffsetByTime", "-g, --group"),
    ("resetOffsetByTime", "-s, --timestamp"), ("resetOffsetByTime", "-f, --force"), ("consumerProgress", "-g, --group"),
    ("sendMessage", "-p, --body"), ("sendMessage", "-k, --keys"), ("sendMessage", "-c, --tags"),
    ("consumeMessage", "-g, --group"), ("consumeMessage", "-c, --count"), ("consumeMessage", "-o, --offset")])
def test_rocketmq_option_letters(camel, option):
    assert option in CliRunner().invoke(main, ["admin", camel, "-h"]).stdout


def test_namesrv_addr_after_command_and_from_env(cluster, seeded):
    r = CliRunner().invoke(main, ["admin", "topicList", "-n", cluster.namesrv_addr, "--json"])
    assert r.exit_code == 0 and "AdminT" in json.loads(r.stdout)["topics"]
    r = CliRunner().invoke(main, ["admin", "topic-list"], env={"NAMESRV_ADDR": cluster.namesrv_addr})
    assert r.exit_code == 0 and "AdminT" in r.stdout
    r = CliRunner().invoke(main, ["admin", "--json", "-n", cluster.namesrv_addr, "topic-list"])   # group --json
    assert "AdminT" in json.loads(r.stdout)["topics"]


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("topicRoute", "-t", "NoSuchTopic"), ("topic-status", "-t", "NoSuchTopic"),
    ("queryMsgByKey", "-t", "NoSuchTopic", "-k", "k"),
    ("queryMsgByOffset", "-t", "NoSuchTopic", "-b", "broker-a", "-i", "0", "-o", "0"),
    ("resetOffsetByTime", "-g", "G", "-t", "NoSuchTopic", "-s", "now"),
    ("consumeMessage", "-t", "NoSuchTopic"), ("deleteTopic", "-t", "NoSuchTopic"),
    ("consumerProgress", "-g", "G", "-t", "NoSuchTopic")])
def test_unknown_topic_is_a_clear_error(cluster, args):
    err = fails(cluster, *args)
    assert "topic [NoSuchTopic] does not exist" in err
    assert "Traceback" not in err
    err = fails(cluster, *args, "--json")
    assert "does not exist" in err


@pytest.mark.parametrize("stamp", ["yesterday", "2024-13-01#00:00:00:000", "12:00", "-5"])
def test_bad_timestamp_is_a_clear_error(cluster, stamp):
    err = fails(cluster, "resetOffsetByTime", "-g", "G", "-t", "AdminT", "-s", stamp)
    assert f"bad timestamp {stamp!r}" in err and "yyyy-MM-dd#HH:mm:ss:SSS" in err


def test_invalid_names_are_clear_errors(cluster):
    assert "invalid topic" in fails(cluster, "updateTopic", "-t", "a/b")
    assert "invalid consumer group" in fails(cluster, "consumerProgress", "-g", "bad group")
    assert "cluster [Nope] not found" in fails(cluster, "updateTopic", "-t", "T", "-c", "Nope")


def test_unreachable_namesrv_times_out_with_a_clear_error():
    r = CliRunner().invoke(main, ["admin", "--timeout-ms", "200", "-n", "127.0.0.1:1", "topicList"])
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "no NameServer answered" in r.stderr and "127.0.0.1:1" in r.stderr and "200 ms" in r.stderr
    with Admin("127.0.0.1:1;127.0.0.1:2", timeout_ms=100) as a:
        with pytest.raises(RemotingTimeoutError, match="127.0.0.1:1;127.0.0.1:2"):
            a.cluster_list()


def test_unreachable_broker_is_reported_not_fatal(cluster):
    r = CliRunner().invoke(main, ["admin", "--timeout-ms", "200", "-n", cluster.namesrv_addr,
                                  "brokerStatus", "-b", "127.0.0.1:1"])
    assert r.exit_code == 1 and "broker 127.0.0.1:1 did not answer" in r.stderr


# -- the Python API's shapes ----------------------------------------------------------------------------
def test_admin_api_shapes(admin, seeded):
    ups = admin.create_topic("ApiT", 2, 2, broker_addr=admin.cluster_list()[0].broker_addr)
    assert ups and isinstance(ups[0], TopicUpdate) and ups[0].broker_name == "broker-a"
    route = wait_route(admin, "ApiT")
    assert isinstance(route, TopicRoute) and route.broker_datas[0].master_addr == ups[0].broker_addr
    st = admin.topic_status("AdminT")
    assert all(isinstance(s, QueueStatus) for s in st)
    m = admin.query_msg_by_id(seeded[0].offset_msg_id)[0]
    assert isinstance(m, MessageView) and m.body == b"body-0" and m.to_dict()["body_base64"] == "Ym9keS0w"
    p = admin.consumer_progress("ApiG", "AdminT")             # never consumed: offsets 0, lag = everything
    assert isinstance(p, ConsumerProgress) and p.total_diff >= N_SEEDED
    assert [q.consumer_offset for q in p.queues] == [0, 0, 0, 0]
    assert admin.broker_status(ups[0].broker_addr)["brokerName"] == "broker-a"
    assert admin.consumer_connection("NobodyHere") == []
    with pytest.raises(MQClientError, match="read_queue_nums"):
        admin.create_topic("ApiT", 0)
    d = admin.delete_topic("ApiT")
    assert d.broker_addrs == [ups[0].broker_addr]
