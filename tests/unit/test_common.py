"""rmq.common: the layer every other one imports (RocketMQ's ``common`` module).

* the import graph: clients never import the store or the actors; rmq.common imports only the
  standard library, rmq.errors, rmq._core.layout and itself;
* one definition of each shared constant (no module re-assigns them);
* the values against RocketMQ's PermName, PullSysFlag and MixAll;
* the route model: one QueueData / BrokerData / TopicRouteData, int broker ids in memory and
  decimal-string keys on the wire.
"""
from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

import rmq
from rmq.common import mix_all, perm, pull_sys_flag, topic_validator
from rmq.common import route as common_route
from rmq.errors import MessageIllegalError, MQClientError

RMQ = Path(rmq.__file__).resolve().parent


def py_files(*parts: str) -> list:
    return sorted(RMQ.joinpath(*parts).rglob("*.py"))


def module_name(path: Path) -> str:
    rel = path.relative_to(RMQ.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_rmq_module(name: str) -> bool:
    """True when ``name`` is a module or package of rmq (a .py, a Cython extension or a directory)."""
    base = RMQ.parent.joinpath(*name.split("."))
    return base.is_dir() or base.with_suffix(".py").exists() or any(base.parent.glob(base.name + ".*.so")) \
        or base.with_suffix(".pyx").exists()


def imported_modules(path: Path) -> set:
    """Every module ``path`` imports, anywhere in the file (functions and TYPE_CHECKING blocks too).
    ``from pkg import name`` counts as ``pkg.name`` when that is an rmq module, else as ``pkg``."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if mod.split(".")[0] == "rmq" and _is_rmq_module(sub) else mod)
    return out


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


# -- the import graph ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", py_files("client") + py_files("aio"), ids=lambda p: str(p.relative_to(RMQ)))
def test_clients_import_neither_store_nor_actors(path):
    bad = sorted(m for m in imported_modules(path) if _under(m, "rmq.store") or _under(m, "rmq.actors"))
    assert not bad, f"{path.relative_to(RMQ.parent)} imports {bad}: use rmq.common"


def _allowed_in_common(mod: str) -> bool:
    top = mod.split(".")[0]
    if top != "rmq":
        return top in sys.stdlib_module_names or top == "__future__"
    return mod in ("rmq.errors", "rmq._core.layout") or _under(mod, "rmq.common")


@pytest.mark.parametrize("path", py_files("common"), ids=lambda p: str(p.relative_to(RMQ)))
def test_common_imports_only_stdlib_errors_layout_and_itself(path):
    bad = sorted(m for m in imported_modules(path) if not _allowed_in_common(m))
    assert not bad, f"{path.relative_to(RMQ.parent)} imports {bad}"


def test_import_graph_helper_sees_what_it_must():
    # the checks above are only as good as this: nested, relative and "from pkg import module" imports
    src = RMQ / "client" / "route.py"
    mods = imported_modules(src)
    assert {"rmq.common.route", "rmq.common.mix_all", "rmq.client.message", "rmq.protocol"} <= mods
    assert "rmq.errors" in imported_modules(RMQ / "client" / "route.py")          # also inside a function
    assert "rmq.common.topic_validator" in imported_modules(RMQ / "security.py")   # a function-level import


def test_loading_the_clients_loads_no_store_actor_or_proxy_module():
    code = ("import sys\n"
            "import rmq.client.producer, rmq.client.consumer, rmq.client.admin, rmq.client.simple_consumer\n"
            "import rmq.aio.producer, rmq.aio.consumer, rmq.aio.simple_consumer\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('rmq.store', 'rmq.actors', "
            "'rmq.proxy')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == []


def test_loading_common_loads_only_common_errors_and_layout():
    code = ("import sys\n"
            "import rmq.common.topic_validator, rmq.common.perm, rmq.common.mix_all, rmq.common.pull_sys_flag\n"
            "import rmq.common.route\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('rmq'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert {m for m in out.stdout.split() if not m.startswith("rmq.common")} == {
        "rmq", "rmq.errors", "rmq._core", "rmq._core.layout"}


# -- one definition of each constant --------------------------------------------------------------------------
SHARED_NAMES = re.compile(r"^(PULL_FLAG_\w+|MASTER_ID|PERM_(READ|WRITE|PRIORITY|INHERIT|MAX)|RETRY_GROUP_TOPIC_PREFIX|"
                          r"DLQ_GROUP_TOPIC_PREFIX|TOOLS_CONSUMER_GROUP|DEFAULT_NAMESRV_ADDR|RMQ_SYS_TRACE_TOPIC|"
                          r"CLIENT_INNER_PRODUCER_GROUP|DEFAULT_TOPIC_QUEUE_NUMS|AUTO_CREATE_TOPIC_KEY_TOPIC|TBW102|SUB_ALL)$")
SHARED_FUNCTIONS = {"retry_topic", "dlq_topic", "build_sys_flag", "perm_to_string"}
# rmq.proxy.acl.retry_topic takes an Optional group (None -> None) and calls rmq.common's
FUNCTION_WRAPPERS = {("proxy/acl.py", "retry_topic")}


def _module_level_statements(body: list):
    """Top-level statements, including those in top-level if / try / with blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []) or []:
                    if isinstance(child, ast.ExceptHandler):
                        yield from _module_level_statements(child.body)
                    else:
                        yield from _module_level_statements([child])


def _assigned_names(node) -> list:
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.append(n.id)
    return names


def _redefinitions(path: Path) -> list:
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(RMQ).as_posix()
    out = []
    for node in _module_level_statements(tree.body):
        out += [f"{rel}:{node.lineno} assigns {n}" for n in _assigned_names(node) if SHARED_NAMES.match(n)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in SHARED_FUNCTIONS \
                and (rel, node.name) not in FUNCTION_WRAPPERS:
            out.append(f"{rel}:{node.lineno} defines {node.name}()")
    return out


def test_no_module_outside_common_redefines_the_shared_constants():
    found = [r for p in py_files() if not p.relative_to(RMQ).as_posix().startswith("common/") for r in _redefinitions(p)]
    assert not found, "import these from rmq.common:\n" + "\n".join(found)


def test_redefinition_check_catches_assignments():
    # rmq.common itself assigns them: the check must see that
    assert any("PERM_READ" in r for r in _redefinitions(RMQ / "common" / "perm.py"))
    assert any("MASTER_ID" in r for r in _redefinitions(RMQ / "common" / "mix_all.py"))


def test_old_homes_still_export_the_names():
    from rmq.actors import route as actors_route
    from rmq.client import admin, consumer, consumer_api, route
    from rmq.store import config_manager, validators
    assert config_manager.PERM_READ is perm.PERM_READ and config_manager.PERM_WRITE is perm.PERM_WRITE
    assert route.PERM_READ == perm.PERM_READ and route.MASTER_ID is mix_all.MASTER_ID
    assert admin.MASTER_ID is mix_all.MASTER_ID and admin.TOOLS_CONSUMER_GROUP == mix_all.TOOLS_CONSUMER_GROUP
    assert admin.DEFAULT_NAMESRV_ADDR == mix_all.DEFAULT_NAMESRV_ADDR
    assert consumer.retry_topic is consumer_api.retry_topic is mix_all.retry_topic
    assert consumer.dlq_topic is consumer_api.dlq_topic is mix_all.dlq_topic
    assert actors_route.MASTER_ID is mix_all.MASTER_ID
    for name in validators.__all__:
        assert getattr(validators, name) is getattr(topic_validator, name), name


# -- values (RocketMQ PermName, PullSysFlag, MixAll) --------------------------------------------------------------
def test_perm_name_values():
    assert (perm.PERM_PRIORITY, perm.PERM_READ, perm.PERM_WRITE, perm.PERM_INHERIT) == (0x8, 0x4, 0x2, 0x1)
    assert perm.PERM_MAX == 0xF
    assert perm.is_readable(6) and perm.is_writeable(6) and not perm.is_inherited(6) and not perm.is_priority(6)
    assert not perm.is_readable(2) and not perm.is_writeable(4) and perm.is_inherited(1) and perm.is_priority(8)


@pytest.mark.parametrize("value,text", [(0, "---"), (perm.PERM_READ, "R--"), (perm.PERM_WRITE, "-W-"),
                                        (perm.PERM_INHERIT, "--X"), (6, "RW-"), (7, "RWX"), (0xF, "RWX"),
                                        (perm.PERM_PRIORITY, "---")])
def test_perm_to_string_is_perm2string(value, text):
    assert perm.perm_to_string(value) == text


def test_pull_sys_flag_values():
    assert (pull_sys_flag.PULL_FLAG_COMMIT_OFFSET, pull_sys_flag.PULL_FLAG_SUSPEND, pull_sys_flag.PULL_FLAG_SUBSCRIPTION,
            pull_sys_flag.PULL_FLAG_CLASS_FILTER, pull_sys_flag.PULL_FLAG_LITE_PULL) == (0x1, 0x2, 0x4, 0x8, 0x10)
    # what a push consumer sends: commit + suspend + subscription (DefaultMQPushConsumerImpl.pullMessage)
    assert pull_sys_flag.build_sys_flag(True, True, True, False) == 7
    assert pull_sys_flag.build_sys_flag(False, False, False) == 0


@pytest.mark.parametrize("bits", list(itertools.product((False, True), repeat=5)))
def test_build_sys_flag_round_trips(bits):
    f = pull_sys_flag.build_sys_flag(*bits)
    assert (pull_sys_flag.has_commit_offset_flag(f), pull_sys_flag.has_suspend_flag(f),
            pull_sys_flag.has_subscription_flag(f), pull_sys_flag.has_class_filter_flag(f),
            pull_sys_flag.has_lite_pull_flag(f)) == bits
    cleared = pull_sys_flag.clear_commit_offset_flag(f)
    assert not pull_sys_flag.has_commit_offset_flag(cleared) and cleared == pull_sys_flag.build_sys_flag(False, *bits[1:])


def test_pull_frame_carries_the_same_flags():
    from rmq.client.consumer_api import build_pull_frame
    from rmq.client.message import MessageQueue
    mq = MessageQueue("T", "broker-a", 0)
    assert build_pull_frame("g", mq, 0, 32).fields["sysFlag"] == pull_sys_flag.PULL_FLAG_SUBSCRIPTION
    assert build_pull_frame("g", mq, 0, 32, commit_offset=5, suspend_ms=1000).fields["sysFlag"] == 7
    assert build_pull_frame("g", mq, 0, 32, commit_offset=-1, suspend_ms=1000).fields["sysFlag"] == 6


def test_mix_all_values():
    assert mix_all.MASTER_ID == 0 and type(mix_all.MASTER_ID) is int
    assert (mix_all.RETRY_GROUP_TOPIC_PREFIX, mix_all.DLQ_GROUP_TOPIC_PREFIX) == ("%RETRY%", "%DLQ%")
    assert mix_all.TOOLS_CONSUMER_GROUP == "TOOLS_CONSUMER"
    assert mix_all.retry_topic("cg") == "%RETRY%cg" and mix_all.dlq_topic("cg") == "%DLQ%cg"
    assert mix_all.is_retry_topic("%RETRY%cg") and not mix_all.is_retry_topic("%DLQ%cg")
    assert mix_all.is_dlq_topic("%DLQ%cg") and not mix_all.is_dlq_topic("T")
    assert topic_validator.SYSTEM_TOPIC_PREFIXES == ("%RETRY%", "%DLQ%")


def test_acl_retry_topic_keeps_its_none():
    from rmq.proxy import acl
    assert acl.retry_topic("g") == mix_all.retry_topic("g") and acl.retry_topic(None) is None
    assert acl.is_retry_topic("%RETRY%g") and not acl.is_retry_topic(None)


# -- topic_validator ---------------------------------------------------------------------------------------------
def test_retry_and_dlq_topics_pass_check_topic_at_the_system_limit():
    from rmq._core.layout import TOPIC_MAX_LENGTH, TOPIC_MAX_LENGTH_SYSTEM
    group = "g" * (TOPIC_MAX_LENGTH_SYSTEM - len(mix_all.RETRY_GROUP_TOPIC_PREFIX))
    assert topic_validator.check_topic(mix_all.retry_topic(group)) == mix_all.retry_topic(group).encode()
    assert len(mix_all.dlq_topic("g" * TOPIC_MAX_LENGTH)) > TOPIC_MAX_LENGTH
    topic_validator.check_topic(mix_all.dlq_topic("g" * TOPIC_MAX_LENGTH))
    with pytest.raises(ValueError, match=f"over the {TOPIC_MAX_LENGTH_SYSTEM}-character limit"):
        topic_validator.check_topic(mix_all.retry_topic(group + "g"))


@pytest.mark.parametrize("check,value,message", [
    (topic_validator.check_topic, "t" * 128, "128 characters, over the 127-character limit"),
    (topic_validator.check_topic, "", "topic is empty"),
    (topic_validator.check_topic, "a/b", "characters outside"),
    (topic_validator.check_topic, 5, "must be a str"),
    (topic_validator.check_group, "g" * (topic_validator.GROUP_MAX_LENGTH + 1),
     f"over the {topic_validator.GROUP_MAX_LENGTH}-character limit"),
    (topic_validator.check_group, "a.b", "characters outside"),
    (topic_validator.check_group, "", "empty"),
    (topic_validator.check_queue_id, topic_validator.MAX_QUEUE_NUMS, f"outside [0, {topic_validator.MAX_QUEUE_NUMS})"),
    (topic_validator.check_queue_id, True, "must be an int"),
])
def test_checks_raise_a_value_error_naming_the_limit(check, value, message):
    with pytest.raises(ValueError) as e:
        check(value)
    assert isinstance(e.value, MessageIllegalError) and message in str(e.value)


def test_checks_accept_valid_names():
    assert topic_validator.check_topic("ok_topic-1|%") == b"ok_topic-1|%"
    assert topic_validator.check_group("g" * topic_validator.GROUP_MAX_LENGTH)
    assert topic_validator.check_queue_id(topic_validator.MAX_QUEUE_NUMS - 1) == topic_validator.MAX_QUEUE_NUMS - 1


# -- the route model ---------------------------------------------------------------------------------------------
def test_one_route_model():
    from rmq.actors import route as actors_route
    from rmq.client import admin
    from rmq.client import route as client_route
    assert client_route.QueueData is actors_route.QueueData is admin.QueueData is common_route.QueueData
    assert client_route.BrokerData is actors_route.BrokerData is common_route.BrokerData
    assert client_route.TopicRouteData is common_route.TopicRouteData
    # admin keeps its own BrokerData: there ``master_addr`` is a property, here a method
    assert admin.BrokerData is not common_route.BrokerData
    assert admin.BrokerData("c", "b", {0: "h:1"}).master_addr == "h:1"
    assert common_route.BrokerData("c", "b", {0: "h:1"}).master_addr() == "h:1"


def _nameserver_route():
    from rmq.actors.route import RouteInfoManager
    rim = RouteInfoManager(clock=lambda: 0.0)
    cfg = {"T": {"readQueueNums": 4, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0}}
    rim.register_broker("c", "10.0.0.2:10911", "broker-b", 0, "", cfg, (1, 1))
    rim.register_broker("c", "10.0.0.1:10911", "broker-a", 0, "", cfg, (1, 1))
    rim.register_broker("c", "10.0.0.3:10911", "broker-a", 1, "", None, (1, 1))
    return rim


def test_nameserver_wire_form_is_unchanged_and_survives_strict_msgpack():
    body = _nameserver_route().pickup_topic_route_data("T")
    assert body == {
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0},
                       {"brokerName": "broker-b", "readQueueNums": 4, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0}],
        "brokerDatas": [{"cluster": "c", "brokerName": "broker-a",
                         "brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.3:10911"}},
                        {"cluster": "c", "brokerName": "broker-b", "brokerAddrs": {"0": "10.0.0.2:10911"}}]}
    assert msgpack.unpackb(msgpack.packb(body), strict_map_key=True) == body


def test_route_parse_converts_broker_ids_to_int_and_back():
    body = _nameserver_route().pickup_topic_route_data("T")
    r = common_route.TopicRouteData.from_wire(body, "T")
    a = r.broker("broker-a")
    assert a.broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.3:10911"}
    assert a.master_addr() == "10.0.0.1:10911" and a.find_broker_address_in_subscribe(1) == (1, "10.0.0.3:10911")
    assert [q.readable and q.writeable for q in r.queue_datas] == [True, True]
    assert r.to_wire() == body
    assert common_route.TopicRouteData.from_wire(r.to_wire(), "T") == r


def test_consumer_route_uses_int_broker_ids():
    from rmq.client.consumer_api import TopicRoute, group_addrs
    body = _nameserver_route().pickup_topic_route_data("T")
    r = TopicRoute.from_wire("T", body)
    assert r.broker_addrs["broker-a"] == {0: "10.0.0.1:10911", 1: "10.0.0.3:10911"}
    assert r.master_addr("broker-a") == "10.0.0.1:10911" and r.master_addr("broker-x") is None
    assert r.all_master_addrs() == ["10.0.0.1:10911", "10.0.0.2:10911"]
    assert group_addrs([r], "broker-b", "T").get(mix_all.MASTER_ID) == "10.0.0.2:10911"
    # int keys on the wire (a msgpack peer) parse the same way
    as_ints = {**body, "brokerDatas": [{**b, "brokerAddrs": {int(k): v for k, v in b["brokerAddrs"].items()}}
                                       for b in body["brokerDatas"]]}
    assert TopicRoute.from_wire("T", as_ints).broker_addrs == r.broker_addrs


def test_broker_id_conversion_helpers():
    assert common_route.broker_addrs_from_wire({"0": "a:1", "1": "b:1", "x": "c:1"}) == {0: "a:1", 1: "b:1"}
    assert common_route.broker_addrs_from_wire(None) == {}
    assert common_route.broker_addrs_to_wire({1: "b:1", 0: "a:1"}) == {"0": "a:1", "1": "b:1"}
    assert list(common_route.broker_addrs_to_wire({1: "b:1", 0: "a:1"})) == ["0", "1"]
    for addrs in ({"0": "a:1", "2": "c:1"}, {0: "a:1", 2: "c:1"}):
        assert common_route.find_broker_address_in_subscribe(addrs, 2) == (2, "c:1")
        assert common_route.find_master_or_slave(addrs, avoid={"a:1"}) == (2, "c:1")


def test_route_parse_errors_name_the_field():
    with pytest.raises(MQClientError, match="broker id 'x' is not an int"):
        common_route.BrokerData.from_wire({"brokerName": "b", "brokerAddrs": {"x": "h:1"}}, "route of topic 'T'")
    with pytest.raises(MQClientError, match="field 'perm' must be a non-negative int"):
        common_route.QueueData.from_wire({"brokerName": "b", "readQueueNums": 1, "writeQueueNums": 1, "perm": -1})
    with pytest.raises(MQClientError, match="queueDatas and brokerDatas must be lists"):
        common_route.TopicRouteData.from_wire({"queueDatas": {"brokerName": "b"}}, "T")


def test_wipe_write_perm_still_changes_the_nameserver_table():
    rim = _nameserver_route()
    assert rim.wipe_write_perm_of_broker("broker-a") == 1
    assert rim.topic_queue_table["T"]["broker-a"].perm == perm.PERM_READ
    assert perm.perm_to_string(rim.topic_queue_table["T"]["broker-a"].perm) == "R--"
    assert rim.add_write_perm_of_broker("broker-a") == 1
    assert rim.topic_queue_table["T"]["broker-a"].writeable


# -- typed request headers ----------------------------------------------------------------------------------
def test_request_headers_give_rocketmqs_field_names_and_leave_unset_options_out():
    from rmq.common.request_header import PullMessageRequestHeader, SendMessageRequestHeader
    assert PullMessageRequestHeader("g", "T", 3, 10, 32).to_fields() == {
        "consumerGroup": "g", "topic": "T", "queueId": 3, "queueOffset": 10, "maxMsgNums": 32, "sysFlag": 0,
        "commitOffset": -1, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0, "expressionType": "TAG"}
    f = SendMessageRequestHeader("pg", "T", born_timestamp=5, properties={"a": "b"}).to_fields()
    assert f == {"producerGroup": "pg", "topic": "T", "queueId": -1, "sysFlag": 0, "bornTimestamp": 5, "flag": 0,
                 "properties": {"a": "b"}, "reconsumeTimes": 0}
    f = SendMessageRequestHeader("pg", "T", 2, default_topic=topic_validator.AUTO_CREATE_TOPIC_KEY_TOPIC,
                                 default_topic_queue_nums=mix_all.DEFAULT_TOPIC_QUEUE_NUMS, wait_store_msg_ok=False,
                                 max_reconsume_times=16, born_host="1.2.3.4:5").to_fields()
    assert (f["defaultTopic"], f["defaultTopicQueueNums"], f["waitStoreMsgOK"], f["maxReconsumeTimes"],
            f["bornHost"]) == ("TBW102", 4, False, 16, "1.2.3.4:5")
    msgpack.packb(f)                                          # plain wire types only


HEADER_KEYS = {"PULL_MESSAGE": {"maxMsgNums", "queueOffset"}, "SEND_MESSAGE": {"producerGroup", "bornTimestamp"}}


def test_pull_and_send_headers_are_built_only_by_rmq_common():
    """PULL_MESSAGE and SEND_MESSAGE header dicts are written once (rmq.common.request_header):
    no dict literal with their keys in the clients, rmq.aio or the proxy.  The raw bench clients
    (rmq/bench) build their own on purpose: they measure the broker with the least client work."""
    found = []
    for path in py_files("client") + py_files("aio") + py_files("proxy"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                found += [f"{path.relative_to(RMQ)}:{node.lineno} builds {code}"
                          for code, need in HEADER_KEYS.items() if need <= keys]
    assert found == []


def test_message_queue_hash_is_kept_and_never_pickled():
    """MessageQueue computes its hash once; a pickled queue (Spark ships them to executors, whose
    str hashes differ) is rebuilt from its fields, and the cached hash is no dataclass field."""
    import copy
    import dataclasses
    import pickle
    import subprocess
    import sys

    from rmq.client.message import MessageQueue
    mq = MessageQueue("orders", "broker-a", 3)
    assert hash(mq) == hash(("orders", "broker-a", 3)) and {mq: 1}[MessageQueue("orders", "broker-a", 3)] == 1
    assert dataclasses.astuple(mq) == ("orders", "broker-a", 3) and dataclasses.asdict(mq)["queue_id"] == 3
    assert repr(mq) == "MessageQueue(topic='orders', broker_name='broker-a', queue_id=3)"
    assert sorted([MessageQueue("orders", "broker-a", 4), mq]) == [mq, MessageQueue("orders", "broker-a", 4)]
    moved = dataclasses.replace(mq, queue_id=5)
    assert hash(moved) == hash(("orders", "broker-a", 5))
    for twin in (pickle.loads(pickle.dumps(mq)), copy.copy(mq), copy.deepcopy(mq)):
        assert twin == mq and hash(twin) == hash(mq)
    # another process (its own str hash seed) unpickles it with its own hash
    code = ("import pickle, sys; from rmq.client.message import MessageQueue; "
            "mq = pickle.loads(sys.stdin.buffer.read()); "
            "print(hash(mq) == hash((mq.topic, mq.broker_name, mq.queue_id)) and {mq: 1}[MessageQueue(*'orders broker-a'.split(), 3)] == 1)")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(mq), capture_output=True,
                         env={**__import__("os").environ, "PYTHONHASHSEED": "12345"}, timeout=60)
    assert out.stdout.strip() == b"True", out.stderr
