"""Prometheus metrics of a real broker group (rmq.metrics): RocketMQ 5's names, exact counts."""
import urllib.request

import msgpack
import re
import subprocess
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rmq._core import commitlog as cl
from rmq.broker_conf import BrokerConfError, broker_settings
from rmq.client.remoting import RemotingClient
from rmq.metrics import (DEFAULT_METRICS_PROM_EXPORTER_PORT, MAX_METRICS_LABELS, MetricsConfigError,
                         lag_rows, message_type, metrics_settings)
from rmq.protocol import Frame, RequestCode, ResponseCode
from rmq.launch import child_env, python_cmd
from rmq.testing import broker_runtime_info
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, send, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("metrics") / "store", with_namesrv=False,
                conf={"metricsExporterType": "PROM", "metricsPromExporterPort": "0",
                      "metricsPromExporterHost": "127.0.0.1", "metricsLabel": "env:test,dc:local"})
    yield c
    c.close()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples, name, **labels):
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


@pytest.fixture(scope="module")
def url(cluster):
    info = broker_runtime_info(cluster.broker)     # brokerStatus shows these too
    assert info["recoveryTimeMs"] > 0 and info["flushBehindBytes"] >= 0
    assert 0 < info["commitLogDiskRatio"] <= 1
    u = info["metricsUrl"]
    assert u.startswith("http://127.0.0.1:") and u.endswith("/metrics")
    return u


def test_counts_are_exact_and_named_as_rocketmq(cluster, url):
    n = 137
    with RemotingClient() as rc:
        for i in range(n):
            assert send(rc, cluster.broker, "MetricsT", b"m%03d" % i, i % 2).code == ResponseCode.SUCCESS
        delayed = rc.invoke(cluster.broker, Frame(RequestCode.SEND_MESSAGE, fields={
            "producerGroup": "pg", "topic": "MetricsT", "queueId": 0, "properties": {"DELAY": "1"}},
            bodies=[b"later"]))
        assert delayed.code == ResponseCode.SUCCESS
        got = 0
        for q in (0, 1):
            off = 0
            while True:
                r = pull(rc, cluster.broker, "MetricsT", q, off)
                if r.code != ResponseCode.SUCCESS:
                    break
                got += len(cl.decode_records(bytes(r.bodies[0])))
                off = r.fields["nextBeginOffset"]
    assert got == n
    m = scrape(url)
    common = {"cluster": "TestCluster", "node_type": "broker", "node_id": "broker-a", "env": "test", "dc": "local"}
    assert value(m, "rocketmq_messages_in_total", topic="MetricsT", message_type="normal", is_system="false",
                 **common) == n
    assert value(m, "rocketmq_messages_in_total", topic="MetricsT", message_type="delay") == 1
    assert value(m, "rocketmq_throughput_in_total", topic="MetricsT", message_type="normal") > n * 4
    assert value(m, "rocketmq_message_size_count", topic="MetricsT", message_type="normal") == n
    assert value(m, "rocketmq_message_size_bucket", topic="MetricsT", message_type="normal", le="1024.0") == n
    assert value(m, "rocketmq_messages_out_total", topic="MetricsT", consumer_group="cg") == n
    assert value(m, "rocketmq_throughput_out_total", topic="MetricsT", consumer_group="cg") > n * 4
    # every send was answered, so observed; protocol_type / result as RocketMQ's RemotingMetricsManager
    assert value(m, "rocketmq_rpc_latency_count", request_code="send_message", response_code="success",
                 protocol_type="remoting", result="success", is_long_polling="false") == n + 1
    assert value(m, "rocketmq_topic_number") >= 1
    assert value(m, "rocketmq_storage_size", storage_type="local") > 0
    assert "rocketmq_storage_dispatch_behind_bytes" in m and "rocketmq_storage_flush_behind_bytes" in m
    assert value(m, "rocketmq_storage_message_reserve_time") >= 0
    actors = {lab["actor"] for lab, _ in m["rocketmq_actor_resident_memory_bytes"]}
    assert {"broker", "reput", "flush"} <= actors
    assert value(m, "rocketmq_actor_cpu_seconds_total", actor="broker") > 0
    # the flush actor's msyncs (flushIntervalCommitLog): latency and bytes per group commit
    m = wait_for(lambda: (lambda s: s if value(s, "rocketmq_storage_group_commit_size_count") >= 1 else None)(
        scrape(url)))
    assert value(m, "rocketmq_storage_flush_latency_count") >= 1
    assert value(m, "rocketmq_storage_group_commit_size_sum") > 0


def test_consumer_lag_inflight_and_ready(cluster, url):
    with RemotingClient() as rc:
        for i in range(10):
            assert send(rc, cluster.broker, "LagT", b"x" * 10, 0).code == ResponseCode.SUCCESS
        # committed 3, pulled up to 7: lag 7, inflight 4, ready 3 (once reput dispatched all 10)
        wait_for(lambda: rc.invoke(cluster.broker, Frame(RequestCode.GET_MAX_OFFSET, fields={
            "topic": "LagT", "queueId": 0})).fields.get("offset") == 10)
        r = pull(rc, cluster.broker, "LagT", 0, 0, max_nums=7)
        assert r.code == ResponseCode.SUCCESS and r.fields["nextBeginOffset"] == 7
        assert rc.invoke(cluster.broker, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
            "consumerGroup": "cg", "topic": "LagT", "queueId": 0, "commitOffset": 3})).code == 0
        labels = {"consumer_group": "cg", "topic": "LagT", "is_retry": "false", "is_system": "false"}
        m = wait_for(lambda: (lambda s: s if value(s, "rocketmq_consumer_lag_messages", **labels) == 7 else None)(
            scrape(url)))
        assert value(m, "rocketmq_consumer_inflight_messages", **labels) == 4
        assert value(m, "rocketmq_consumer_ready_messages", **labels) == 3
        assert value(m, "rocketmq_consumer_lag_latency", **labels) >= 0
        # a consumer registered by heartbeat is counted, with its consume mode
        hb = {"clientID": "c-metrics", "consumerDataSet": [{"groupName": "cg", "consumeType": "CONSUME_ACTIVELY",
                                                            "subscriptionDataSet": []}], "producerDataSet": []}
        assert rc.invoke(cluster.broker, Frame(RequestCode.HEART_BEAT, bodies=[msgpack.packb(hb)])).code == 0
        m = scrape(url)
        assert value(m, "rocketmq_consumer_connections", consumer_group="cg", consume_mode="pull") == 1


def test_held_pull_is_observed_as_long_polling(cluster, url):
    with RemotingClient() as rc:
        assert send(rc, cluster.broker, "HoldT", b"a", 0).code == ResponseCode.SUCCESS
        r = pull(rc, cluster.broker, "HoldT", 0, 1, suspend_ms=300, timeout_ms=5000)
        assert r.code == ResponseCode.PULL_NOT_FOUND
    m = scrape(url)
    assert value(m, "rocketmq_rpc_latency_count", request_code="pull_message", is_long_polling="true") >= 1
    # the held pull waited its suspend time: its latency is in a bucket above 100 ms
    assert value(m, "rocketmq_rpc_latency_bucket", request_code="pull_message", is_long_polling="true",
                 le="100.0") == 0


def test_settings_are_checked():
    s = metrics_settings({})
    assert (s.exporter_type, s.port, s.enabled) == ("DISABLE", DEFAULT_METRICS_PROM_EXPORTER_PORT, False)
    assert metrics_settings({"metricsExporterType": "prom", "brokerIP1": "10.0.0.5"}).host == "10.0.0.5"
    for bad, why in (({"metricsExporterType": "OTLP_GRPC"}, "not supported by rmq"),
                     ({"metricsExporterType": "STATSD"}, "must be one of"),
                     ({"metricsPromExporterPort": "70000"}, "0..65535"),
                     ({"metricsPromExporterPort": "x"}, "0..65535"),
                     ({"metricsLabel": "novalue"}, "key:value"),
                     ({"metricsLabel": "cluster:x"}, "other than"),
                     ({"metricsLabel": "a-b:x"}, "key:value"),
                     ({"metricsLabel": ",".join(f"k{i}:v" for i in range(MAX_METRICS_LABELS + 1))}, "at most")):
        with pytest.raises(MetricsConfigError, match=why):
            metrics_settings(bad)
        with pytest.raises(BrokerConfError, match=why):        # the broker refuses to start on it
            broker_settings(bad)


def test_message_type_and_lag_rows():
    assert message_type(None) == "normal"
    assert message_type({"TRAN_MSG": "true"}) == "transaction"
    assert message_type({}, transaction_prepared=True) == "transaction"
    assert message_type({"__SHARDINGKEY": "k"}) == "fifo"
    assert message_type({"DELAY": "3"}) == "delay"
    rows = lag_rows({"T@g": {0: 2, 1: 5}, "broken": {0: 1}}, {("g", "T", 0): 4},
                    max_offset=lambda t, q: 10, store_time=lambda t, q, o: 1000 + o)
    # queue 0: committed 2 pulled 4; queue 1: committed 5, pulled 5 (nothing pulled since start)
    assert rows == [("g", "T", 8 + 5, 1002, 2, 6 + 5, 1004)]


def test_port_in_use_refuses_to_start(tmp_path, url):
    """A metrics port another process holds: the broker exits 1 with one clear line (as RocketMQ
    fails its start), before it says ready."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    store = tmp_path / "store"
    store.mkdir()
    conf = store / "broker.conf"
    conf.write_text(f"metricsExporterType=PROM\nmetricsPromExporterPort={port}\nmetricsPromExporterHost=127.0.0.1\n"
                    f"mappedFileSizeCommitLog=1048576\nmaxHashSlotNum=1000\nmaxIndexNum=4000\n")
    p = subprocess.run(python_cmd("-m", "rmq.actors.broker", "--store-path", str(store), "-c", str(conf),
                                  "--listen-port", "0"), capture_output=True, text=True, timeout=60,
                       env=child_env(None))
    assert p.returncode == 1, p.stderr
    assert "ready" not in p.stdout
    assert f"cannot serve metrics on 127.0.0.1:{port} (metricsPromExporterPort)" in p.stderr


def test_nameserver_has_its_own_endpoint(tmp_path):
    """The NameServer serves its own /metrics (--metrics-port): brokers, clusters and topics it
    routes, and its request latency, in the same naming."""
    c = Cluster(tmp_path / "store", namesrv_args=("--metrics-port", "0"))
    try:
        log_path = tmp_path / "store" / "logs" / "nameserver.log"
        url = wait_for(lambda: (lambda m: m.group(1) if m else None)(
            re.search(r"metrics: (http://\S+/metrics)", log_path.read_text() if log_path.exists() else "")))
        m = wait_for(lambda: (lambda s: s if value(s, "rocketmq_namesrv_broker_number") == 1 else None)(scrape(url)))
        assert value(m, "rocketmq_namesrv_cluster_number", node_type="nameserver") == 1
        assert value(m, "rocketmq_rpc_latency_count", request_code="register_broker", result="success") >= 1
    finally:
        c.close()
    with pytest.raises(SystemExit):
        from rmq.actors.nameserver import main
        main(["--metrics-port", "70000"])


def test_dlq_counted_and_deleted_group_forgotten(cluster, url):
    """A message sent back past maxReconsumeTimes goes to %DLQ%group and is counted once under its
    original topic; a deleted group leaves no pull offsets behind (its inflight gauge goes)."""
    with RemotingClient() as rc:
        assert send(rc, cluster.broker, "DlqT", b"poison", 0).code == ResponseCode.SUCCESS
        r = wait_for(lambda: (lambda r: r if r.code == ResponseCode.SUCCESS else None)(
            pull(rc, cluster.broker, "DlqT", 0, 0)))
        msg = cl.decode_records(bytes(r.bodies[0]))[0]
        back = rc.invoke(cluster.broker, Frame(RequestCode.CONSUMER_SEND_MSG_BACK, fields={
            "offset": msg.commitlog_offset, "group": "cg", "delayLevel": 0, "maxReconsumeTimes": 0,
            "originMsgId": msg.msg_id}))
        assert back.code == ResponseCode.SUCCESS, back.remark
        m = scrape(url)
        assert value(m, "rocketmq_send_to_dlq_messages_total", topic="DlqT", consumer_group="cg") == 1
        # the DLQ's own append is not an incoming message (RocketMQ leaves %RETRY% / %DLQ% out)
        assert value(m, "rocketmq_messages_in_total", topic="%DLQ%cg") == 0
        assert value(m, "rocketmq_messages_in_total", topic="DlqT") == 1
        assert rc.invoke(cluster.broker, Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={
            "consumerGroup": "gone", "topic": "DlqT", "queueId": 0, "commitOffset": 0})).code == 0
        r = rc.invoke(cluster.broker, Frame(RequestCode.PULL_MESSAGE, fields={
            "consumerGroup": "gone", "topic": "DlqT", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 0}))
        assert r.code == ResponseCode.SUCCESS
        assert value(scrape(url), "rocketmq_consumer_inflight_messages", consumer_group="gone") == 1
        assert rc.invoke(cluster.broker, Frame(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                               fields={"groupName": "gone"})).code == 0
        # the committed offset stays (RocketMQ keeps consumerOffset.json entries too); the pull offset goes
        assert value(scrape(url), "rocketmq_consumer_inflight_messages", consumer_group="gone") == 0


def test_loop_bridge_answers_in_the_loop_or_times_out():
    import threading
    import zmq
    from rmq.metrics import LoopBridge
    ctx = zmq.Context()
    try:
        calls = []
        b = LoopBridge(ctx, lambda: calls.append(threading.get_ident()) or 42)
        with pytest.raises(TimeoutError, match="did not answer the scrape within 0.2 s"):
            b.call(timeout_s=0.2)          # nobody serves: the scrape gives up, nothing runs later
        b.serve()
        assert calls == []
        out = []
        t = threading.Thread(target=lambda: out.append(b.call(timeout_s=30)))
        t.start()
        assert b.socket.poll(30_000)       # the poke arrives; the loop (this thread) answers
        b.serve()
        t.join(30)
        assert out == [42] and calls == [threading.get_ident()]
        b.close()
    finally:
        ctx.term()


def test_scrape_of_a_stuck_loop_still_serves_the_counters():
    """When the actor's loop does not answer within the scrape timeout, the scrape still answers:
    counters and histograms, without the gauges (and a warning), never an error page."""
    import zmq
    from rmq.metrics import ActorMetrics, MetricsSettings
    ctx = zmq.Context()
    m = ActorMetrics(MetricsSettings("PROM", "127.0.0.1", 0), "broker", "C", "b", ctx,
                     lambda m: pytest.fail("the gauges ran though nobody served the loop"))
    try:
        m.gauges_collector.timeout_s = 0.2
        port = m.start()
        m.on_rpc("send_message", "success", 1.5, False, "success")
        s = scrape(f"http://127.0.0.1:{port}/metrics")      # nobody serves the bridge: a stuck loop
        assert value(s, "rocketmq_rpc_latency_count", request_code="send_message") == 1
        assert "rocketmq_topic_number" not in s
    finally:
        m.stop()
        ctx.term()
