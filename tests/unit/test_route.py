"""RouteInfoManager: the NameServer's tables without sockets (SPEC.md §14)."""
from rmq.actors.route import QueueData, RouteInfoManager
from rmq.store.config_manager import PERM_READ, PERM_WRITE

RW = PERM_READ | PERM_WRITE


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def cfg(topic, r=8, w=8, perm=RW, sys_flag=0):
    return {"topicName": topic, "readQueueNums": r, "writeQueueNums": w, "perm": perm, "topicSysFlag": sys_flag,
            "order": False}


def register(rim, name="broker-a", addr="127.0.0.1:10911", bid=0, cluster="DefaultCluster", topics=("T",),
             version=(1, 1), ha="127.0.0.1:10912"):
    table = {t: cfg(t) for t in topics} if not isinstance(topics, dict) else topics
    return rim.register_broker(cluster, addr, name, bid, ha, table, version)


def test_register_master_and_slave_route_data():
    rim = RouteInfoManager(clock=FakeClock())
    r = register(rim, topics={"T": cfg("T", r=4, w=6, sys_flag=3)})
    assert r.master_addr == "" and r.ha_server_addr == ""
    r = register(rim, addr="127.0.0.1:11911", bid=1, ha="", topics={"T": cfg("T", r=1, w=1), "S": cfg("S")})
    assert r.master_addr == "127.0.0.1:10911" and r.ha_server_addr == "127.0.0.1:10912"
    route = rim.pickup_topic_route_data("T")
    assert route == {
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 6, "perm": RW,
                        "topicSysFlag": 3}],
        "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                         "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:11911"}}]}
    # a slave's topic table never becomes queue data
    assert rim.pickup_topic_route_data("S") is None
    assert rim.pickup_topic_route_data("nope") is None
    assert set(rim.broker_live_table) == {"127.0.0.1:10911", "127.0.0.1:11911"}


def test_slave_before_master_learns_nothing_then_master():
    rim = RouteInfoManager(clock=FakeClock())
    r = register(rim, addr="127.0.0.1:11911", bid=1)
    assert r.master_addr == "" and rim.pickup_topic_route_data("T") is None
    register(rim)
    r = register(rim, addr="127.0.0.1:11911", bid=1)
    assert r.master_addr == "127.0.0.1:10911"


def test_unchanged_data_version_does_not_rewrite_queue_data():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics={"T": cfg("T", r=8, w=8)}, version=(5, 1))
    # same dataVersion, different table: ignored (isBrokerTopicConfigChanged is False)
    register(rim, topics={"T": cfg("T", r=2, w=2), "U": cfg("U")}, version=(5, 1))
    assert rim.topic_queue_table["T"]["broker-a"].read_queue_nums == 8
    assert "U" not in rim.topic_queue_table
    # a new dataVersion: rewritten
    register(rim, topics={"T": cfg("T", r=2, w=2), "U": cfg("U")}, version=(6, 2))
    assert rim.topic_queue_table["T"]["broker-a"] == QueueData("broker-a", 2, 2, RW, 0)
    assert "U" in rim.topic_queue_table


def test_topic_dropped_from_broker_table_stays_unless_configured():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics=("T", "U"), version=(1, 1))
    register(rim, topics=("T",), version=(1, 2))
    assert "U" in rim.topic_queue_table            # RocketMQ default: deleteTopicWithBrokerRegistration=false
    rim2 = RouteInfoManager(clock=FakeClock(), delete_topic_with_broker_registration=True)
    register(rim2, topics=("T", "U"), version=(1, 1))
    register(rim2, topics=("T",), version=(1, 2))
    assert "U" not in rim2.topic_queue_table and "T" in rim2.topic_queue_table


def test_same_address_new_broker_id_replaces_old_entry():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, addr="127.0.0.1:11911", bid=1)
    register(rim, addr="127.0.0.1:11911", bid=0)     # promoted to master
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:11911"}
    assert rim.pickup_topic_route_data("T") is not None   # first registration as master writes queue data


def test_unregister():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics=("T",))
    register(rim, addr="127.0.0.1:11911", bid=1)
    register(rim, name="broker-b", addr="127.0.0.1:20911", topics=("T", "B"))
    # the slave leaves: the group and its queue data stay
    assert rim.unregister_broker("DefaultCluster", "127.0.0.1:11911", "broker-a", 1)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:10911"}
    # the master leaves: group empty -> cluster entry and queue data go, the other broker's stay
    assert rim.unregister_broker("DefaultCluster", "127.0.0.1:10911", "broker-a", 0)
    assert "broker-a" not in rim.broker_addr_table
    assert rim.cluster_addr_table == {"DefaultCluster": {"broker-b"}}
    assert [q["brokerName"] for q in rim.pickup_topic_route_data("T")["queueDatas"]] == ["broker-b"]
    assert rim.unregister_broker("DefaultCluster", "127.0.0.1:20911", "broker-b", 0)
    assert rim.topic_queue_table == {} and rim.cluster_addr_table == {} and rim.broker_live_table == {}
    assert not rim.unregister_broker("DefaultCluster", "127.0.0.1:20911", "broker-b", 0)


def test_stale_unregister_does_not_remove_newer_address():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, addr="127.0.0.1:10911")
    register(rim, addr="127.0.0.1:10999")            # master came back on another port
    rim.unregister_broker("DefaultCluster", "127.0.0.1:10911", "broker-a", 0)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:10999"}


def test_expiry_with_injected_clock():
    clock = FakeClock()
    rim = RouteInfoManager(clock=clock)
    register(rim, topics=("T",))
    register(rim, addr="127.0.0.1:11911", bid=1)
    register(rim, name="broker-b", addr="127.0.0.1:20911", cluster="Other", topics=("B",))
    clock.now += 100.0
    register(rim, name="broker-b", addr="127.0.0.1:20911", cluster="Other", topics=("B",))   # b beats
    assert rim.scan_not_active_broker(120_000) == []
    clock.now += 20.0 + 1e-3          # broker-a silent 120.001 s, broker-b 20 s
    assert sorted(rim.scan_not_active_broker(120_000)) == ["127.0.0.1:10911", "127.0.0.1:11911"]
    assert "broker-a" not in rim.broker_addr_table and "T" not in rim.topic_queue_table
    assert rim.cluster_addr_table == {"Other": {"broker-b"}}
    assert rim.pickup_topic_route_data("B") is not None
    clock.now += 121.0
    assert rim.scan_not_active_broker(120_000) == ["127.0.0.1:20911"]
    assert rim.topic_queue_table == {} and rim.broker_addr_table == {} and rim.cluster_addr_table == {}


def test_expiry_of_master_only_keeps_group_for_slave():
    clock = FakeClock()
    rim = RouteInfoManager(clock=clock)
    register(rim, topics=("T",))
    clock.now += 100.0
    register(rim, addr="127.0.0.1:11911", bid=1)
    clock.now += 30.0
    assert rim.scan_not_active_broker(120_000) == ["127.0.0.1:10911"]
    route = rim.pickup_topic_route_data("T")      # slave still serves reads
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": "127.0.0.1:11911"}


def test_wipe_and_add_write_perm():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics=("T", "U"))
    register(rim, name="broker-b", addr="127.0.0.1:20911", topics=("T",))
    assert rim.wipe_write_perm_of_broker("broker-a") == 2
    assert rim.topic_queue_table["T"]["broker-a"].perm == PERM_READ
    assert rim.topic_queue_table["U"]["broker-a"].perm == PERM_READ
    assert rim.topic_queue_table["T"]["broker-b"].perm == RW
    # a re-registration with an unchanged dataVersion keeps the wiped perm
    register(rim, topics=("T", "U"))
    assert rim.topic_queue_table["T"]["broker-a"].perm == PERM_READ
    assert rim.add_write_perm_of_broker("broker-a") == 2
    assert rim.topic_queue_table["T"]["broker-a"].perm == RW
    assert rim.wipe_write_perm_of_broker("nobody") == 0


def test_delete_topic():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics=("T", "U"))
    register(rim, name="broker-b", addr="127.0.0.1:20911", cluster="Other", topics=("T",))
    assert rim.delete_topic("T", cluster_name="Other")
    assert list(rim.topic_queue_table["T"]) == ["broker-a"]
    assert rim.delete_topic("U")
    assert not rim.delete_topic("U")
    assert rim.get_all_topic_list() == ["T"]
    # dataVersion unchanged: the broker's re-registration does not bring it back (RocketMQ)
    register(rim, topics=("T", "U"))
    assert rim.get_all_topic_list() == ["T"]


def test_cluster_info_and_topics_by_cluster():
    rim = RouteInfoManager(clock=FakeClock())
    register(rim, topics=("T", "A"))
    register(rim, addr="127.0.0.1:11911", bid=1)
    register(rim, name="broker-b", addr="127.0.0.1:20911", cluster="Other", topics=("T", "B"))
    info = rim.get_all_cluster_info()
    assert info == {
        "brokerAddrTable": {
            "broker-a": {"cluster": "DefaultCluster", "brokerName": "broker-a",
                         "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:11911"}},
            "broker-b": {"cluster": "Other", "brokerName": "broker-b", "brokerAddrs": {"0": "127.0.0.1:20911"}}},
        "clusterAddrTable": {"DefaultCluster": ["broker-a"], "Other": ["broker-b"]}}
    assert rim.get_topics_by_cluster("DefaultCluster") == ["A", "T"]
    assert rim.get_topics_by_cluster("Other") == ["B", "T"]
    assert rim.get_topics_by_cluster("none") == []
    assert rim.get_all_topic_list() == ["A", "B", "T"]


def test_data_version_query():
    rim = RouteInfoManager(clock=FakeClock())
    assert rim.is_broker_topic_config_changed("127.0.0.1:10911", (1, 1))
    register(rim, version=(7, 3))
    assert not rim.is_broker_topic_config_changed("127.0.0.1:10911", (7, 3))
    assert rim.is_broker_topic_config_changed("127.0.0.1:10911", (7, 4))
    assert rim.query_broker_data_version("127.0.0.1:10911") == (7, 3)
