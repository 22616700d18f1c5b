"""broker.conf parsing (RocketMQ key=value property files) and the effective broker settings."""
import pytest

from rmq.broker_conf import (BrokerConfError, broker_settings, check_namesrv_addr, format_broker_conf,
                             load_broker_conf, parse_broker_conf)
from rmq.store.config import MessageStoreConfig

ROCKETMQ_2M_2S_ASYNC = """\
# from RocketMQ's conf/2m-2s-async/broker-a.properties
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
deleteWhen=04
fileReservedTime=48
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH
"""


def test_parses_rocketmq_sample():
    props = parse_broker_conf(ROCKETMQ_2M_2S_ASYNC)
    assert props == {"brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0",
                     "deleteWhen": "04", "fileReservedTime": "48", "brokerRole": "ASYNC_MASTER",
                     "flushDiskType": "ASYNC_FLUSH"}


def test_comments_blanks_whitespace_and_later_keys_win():
    text = ("\n   \n# comment = not a key\n  ! also a comment\n"
            "  brokerName   =   broker-b  \n"
            "namesrvAddr=127.0.0.1:9876;127.0.0.2:9876\n"
            "storePathRootDir=\n"
            "messageDelayLevel=1s 5s 10s\n"
            "brokerName=broker-c\r\n"
            "\tmappedFileSizeCommitLog = 1073741824\t\n")
    props = parse_broker_conf(text)
    assert props == {"brokerName": "broker-c", "namesrvAddr": "127.0.0.1:9876;127.0.0.2:9876",
                     "storePathRootDir": "", "messageDelayLevel": "1s 5s 10s",
                     "mappedFileSizeCommitLog": "1073741824"}
    # the value is everything after the first '='
    assert parse_broker_conf("a=b=c") == {"a": "b=c"}


@pytest.mark.parametrize("line", ["brokerName broker-a", "=value", "broker name=x", "brokerName:broker-a",
                                  "1key=x", "key\u00e9=x"])
def test_malformed_line_names_line_number(line):
    text = "# header\nbrokerId=0\n\n" + line + "\nflushDiskType=SYNC_FLUSH\n"
    with pytest.raises(BrokerConfError, match=r"^my\.conf:4: "):
        parse_broker_conf(text, "my.conf")


def test_load_file_errors(tmp_path):
    p = tmp_path / "broker.conf"
    p.write_text("brokerName=broker-x\nnot a property\n")
    with pytest.raises(BrokerConfError, match=f"{p}:2: expected key=value"):
        load_broker_conf(str(p))
    p.write_bytes(b"\xef\xbb\xbfbrokerName=broker-x\n")     # a BOM is accepted
    assert load_broker_conf(str(p)) == {"brokerName": "broker-x"}
    p.write_bytes(b"brokerName=\xff\n")
    with pytest.raises(BrokerConfError, match="not UTF-8"):
        load_broker_conf(str(p))
    with pytest.raises(BrokerConfError, match="cannot read"):
        load_broker_conf(str(tmp_path / "missing.conf"))


def test_defaults():
    assert broker_settings() == {
        "brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": 0, "listenPort": 10911,
        "namesrvAddr": "127.0.0.1:9876", "storePathRootDir": "./rmq-data", "brokerRole": "ASYNC_MASTER",
        "flushDiskType": "ASYNC_FLUSH"}


def test_file_values_then_flags_win_and_others_untouched():
    props = parse_broker_conf("brokerName=broker-b\nlistenPort=20911\nnamesrvAddr= 10.0.0.1:9876 ; 10.0.0.2:9876 \n"
                              "storePathRootDir=/data/file\nflushDiskType=SYNC_FLUSH\n"
                              "fileReservedTime=48\nautoCreateTopicEnable=false\n")
    s = broker_settings(props, {"storePathRootDir": "/data/flag", "listenPort": 30911, "namesrvAddr": None})
    assert s["brokerName"] == "broker-b"
    assert s["listenPort"] == 30911
    assert s["storePathRootDir"] == "/data/flag"
    assert s["namesrvAddr"] == "10.0.0.1:9876;10.0.0.2:9876"     # None = flag not given
    assert s["flushDiskType"] == "SYNC_FLUSH"
    assert s["fileReservedTime"] == "48" and s["autoCreateTopicEnable"] == "false"
    # what is left goes to the store config unchanged
    cfg = MessageStoreConfig.from_properties(s)
    assert cfg.file_reserved_time == 48 and cfg.flush_disk_type == "SYNC_FLUSH"
    assert cfg.store_path_root_dir == "/data/flag"
    assert cfg.extra["autoCreateTopicEnable"] == "false"
    assert props["listenPort"] == "20911"       # inputs are not modified


def test_roles_and_broker_id():
    # as RocketMQ's BrokerStartup: a master's brokerId is forced to 0, a slave needs brokerId > 0
    assert broker_settings({"brokerId": "3", "brokerRole": "SYNC_MASTER"})["brokerId"] == 0
    assert broker_settings({"brokerId": "1", "brokerRole": "SLAVE"})["brokerId"] == 1
    with pytest.raises(BrokerConfError, match="SLAVE's brokerId must be > 0"):
        broker_settings({"brokerRole": "SLAVE"})


@pytest.mark.parametrize("props,match", [
    ({"brokerRole": "MASTER"}, "brokerRole must be one of"),
    ({"flushDiskType": "SYNC"}, "flushDiskType must be one of"),
    ({"brokerId": "x"}, "brokerId must be an integer"),
    ({"brokerId": "-1"}, r"brokerId=-1 outside"),
    ({"listenPort": "65536"}, "listenPort=65536 outside"),
    ({"listenPort": "http"}, "listenPort must be an integer"),
    ({"namesrvAddr": ""}, "at least one host:port"),
    ({"namesrvAddr": "127.0.0.1"}, "must be host:port"),
    ({"namesrvAddr": "127.0.0.1:9876,127.0.0.2:9876"}, "must be host:port"),
    ({"namesrvAddr": "127.0.0.1:0"}, r"port in \[1, 65535\]"),
    ({"brokerName": "broker a"}, "brokerName="),
    ({"brokerClusterName": ""}, "brokerClusterName="),
    ({"storePathRootDir": "  "}, "storePathRootDir must not be empty"),
])
def test_bad_values_named(props, match):
    with pytest.raises(BrokerConfError, match=match):
        broker_settings(props)


def test_ephemeral_namesrv_port_only_when_allowed():
    assert check_namesrv_addr("127.0.0.1:0", allow_port_zero=True) == "127.0.0.1:0"
    assert broker_settings({}, {"namesrvAddr": "127.0.0.1:0"}, ephemeral_ports=True)["namesrvAddr"] == "127.0.0.1:0"
    assert check_namesrv_addr("[::1]:9876;ns.example.com:9876") == "[::1]:9876;ns.example.com:9876"
    assert broker_settings({"listenPort": "0"})["listenPort"] == 0      # 0 = any free port


def test_storepath_expands_user(monkeypatch):
    monkeypatch.setenv("HOME", "/home/rmq")
    assert broker_settings({"storePathRootDir": "~/store"})["storePathRootDir"] == "/home/rmq/store"


def test_format_round_trip():
    s = broker_settings(parse_broker_conf("brokerName=broker-b\nmessageDelayLevel=1s 5s\nflag=true\n"))
    text = format_broker_conf(s, header="generated\nby a test")
    assert text.startswith("# generated\n# by a test\n")
    back = parse_broker_conf(text)
    assert back == {k: str(v) for k, v in s.items()}
    assert broker_settings(back) == s
    with pytest.raises(BrokerConfError):
        format_broker_conf({"k": "two\nlines"})
    with pytest.raises(BrokerConfError):
        format_broker_conf({"bad key": "v"})


# -- controller mode (RocketMQ 5) ---------------------------------------------------------------------
def test_controller_settings_defaults_and_refusals():
    from rmq.broker_conf import (DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS, DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS,
                                 DEFAULT_CONTROLLER_PORT, DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS,
                                 controller_settings, local_controller_settings)
    off = controller_settings({})
    assert off["enabled"] is False and off["addrs"] == []
    on = controller_settings({"enableControllerMode": "true", "controllerAddr": " 127.0.0.1:9878;h2:9878 "})
    assert on["addrs"] == ["127.0.0.1:9878", "h2:9878"]
    assert (on["heartbeat_interval_ms"], on["heartbeat_timeout_ms"], on["not_catchup_ms"]) == (
        DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS, DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS,
        DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS)
    for props, words in (({"enableControllerMode": "yes"}, "enableControllerMode"),
                         ({"enableControllerMode": "true"}, "needs controllerAddr"),
                         ({"enableControllerMode": "true", "controllerAddr": "nohost"}, "controllerAddr entry"),
                         ({"enableControllerMode": "true", "controllerAddr": "h:0"}, "controllerAddr entry"),
                         ({"brokerHeartbeatInterval": "5"}, "brokerHeartbeatInterval"),
                         ({"brokerHeartbeatInterval": "1000", "controllerHeartBeatTimeoutMills": "1500"},
                          "at least twice"),
                         ({"haMaxTimeSlaveNotCatchup": "x"}, "haMaxTimeSlaveNotCatchup"),
                         ({"brokerElectionPriority": "-1"}, "brokerElectionPriority")):
        with pytest.raises(BrokerConfError, match=words):
            controller_settings(props)
    # port 0 only where an ephemeral port is resolved (rmq start --controller --controller-port 0)
    assert controller_settings({"enableControllerMode": "true", "controllerAddr": "127.0.0.1:0"},
                               allow_port_zero=True)["addrs"] == ["127.0.0.1:0"]
    assert local_controller_settings({}) == {"enabled": False, "port": DEFAULT_CONTROLLER_PORT}
    with pytest.raises(BrokerConfError, match="enableControllerInNamesrv"):
        local_controller_settings({"enableControllerInNamesrv": "1"})


def test_rmq_start_controller_puts_the_broker_in_controller_mode():
    s = broker_settings({"enableControllerInNamesrv": "true", "controllerListenPort": "0"}, ephemeral_ports=True)
    assert (s["enableControllerMode"], s["controllerAddr"]) == ("true", "127.0.0.1:0")
    # a broker in controller mode may be a SLAVE without a brokerId: the controllers assign it
    s = broker_settings({"enableControllerMode": "true", "controllerAddr": "127.0.0.1:9878", "brokerRole": "SLAVE"})
    assert s["brokerRole"] == "SLAVE"


def test_flow_control_settings_defaults_limits_and_refusals():
    from rmq.broker_conf import (DEFAULT_SEND_QUEUE_CAPACITY, DEFAULT_WAIT_TIME_MS_IN_SEND_QUEUE,
                                 MAX_SEND_QUEUE_CAPACITY, MAX_WAIT_TIME_MS_IN_SEND_QUEUE, flow_control_settings)
    assert flow_control_settings({}) == {"wait_ms": DEFAULT_WAIT_TIME_MS_IN_SEND_QUEUE,
                                         "queue_capacity": DEFAULT_SEND_QUEUE_CAPACITY}
    assert (DEFAULT_WAIT_TIME_MS_IN_SEND_QUEUE, DEFAULT_SEND_QUEUE_CAPACITY) == (200, 10_000)   # RocketMQ's
    edges = flow_control_settings({"waitTimeMillsInSendQueue": str(MAX_WAIT_TIME_MS_IN_SEND_QUEUE),
                                   "sendThreadPoolQueueCapacity": str(MAX_SEND_QUEUE_CAPACITY)})
    assert edges == {"wait_ms": MAX_WAIT_TIME_MS_IN_SEND_QUEUE, "queue_capacity": MAX_SEND_QUEUE_CAPACITY}
    assert flow_control_settings({"waitTimeMillsInSendQueue": "0", "sendThreadPoolQueueCapacity": "1"}) == {
        "wait_ms": 0, "queue_capacity": 1}
    for props, words in (({"waitTimeMillsInSendQueue": "-1"}, "waitTimeMillsInSendQueue"),
                         ({"waitTimeMillsInSendQueue": str(MAX_WAIT_TIME_MS_IN_SEND_QUEUE + 1)},
                          "waitTimeMillsInSendQueue"),
                         ({"waitTimeMillsInSendQueue": "fast"}, "waitTimeMillsInSendQueue"),
                         ({"sendThreadPoolQueueCapacity": "0"}, "sendThreadPoolQueueCapacity"),
                         ({"sendThreadPoolQueueCapacity": str(MAX_SEND_QUEUE_CAPACITY + 1)},
                          "sendThreadPoolQueueCapacity")):
        with pytest.raises(BrokerConfError, match=words):
            flow_control_settings(props)
        with pytest.raises(BrokerConfError, match=words):      # rmq start refuses before launching anything
            broker_settings(props)


def test_append_announce_interval_default_limits_and_refusals():
    from rmq.broker_conf import (DEFAULT_APPEND_ANNOUNCE_INTERVAL_MS, MAX_APPEND_ANNOUNCE_INTERVAL_MS,
                                 append_announce_interval_ms)
    assert append_announce_interval_ms({}) == DEFAULT_APPEND_ANNOUNCE_INTERVAL_MS == 1   # ReputMessageService's round
    assert append_announce_interval_ms({"appendAnnounceIntervalMs": "0"}) == 0
    assert append_announce_interval_ms({"appendAnnounceIntervalMs": str(MAX_APPEND_ANNOUNCE_INTERVAL_MS)}) == \
        MAX_APPEND_ANNOUNCE_INTERVAL_MS
    for bad in ("-1", str(MAX_APPEND_ANNOUNCE_INTERVAL_MS + 1), "soon"):
        with pytest.raises(BrokerConfError, match="appendAnnounceIntervalMs"):
            append_announce_interval_ms({"appendAnnounceIntervalMs": bad})
        with pytest.raises(BrokerConfError, match="appendAnnounceIntervalMs"):
            broker_settings({"appendAnnounceIntervalMs": bad})
