"""T10 security (RELIABILITY.md §3.2, §4 T10), with real processes.

CURVE + ZAP on every client / inter-node socket, allow-listed client keys, admin keys,
revocation, refusal to start without keys, admin commands loopback-only with CURVE off,
runtime-config allow-list, loopback-only default listeners, topic / group names that
cannot leave the store directory, no pickle.

Figures printed: "unauthenticated requests accepted: 0 / M", "admin commands accepted
without credentials: 0 / M", "non-loopback listeners by default: 0".
"""
import ast
import os
import shutil
import stat
import subprocess
import time

import pytest
import zmq
from click.testing import CliRunner

from rmq import protocol as P
from rmq import security as S
from rmq.client.remoting import RemotingClient
from rmq.errors import MQBrokerError
from rmq.launch import python_cmd
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.timeout(180)

NO_ANSWER_WAIT_MS = 1500          # a refused handshake never answers; an accepted one answers in ms
ANSWER_TIMEOUT_MS = 10_000        # generous: a loaded 2-core box
FIGURES = {"unauth": [0, 0], "admin": [0, 0]}     # [accepted, attempted]; every test asserts its own share


@pytest.fixture(scope="module", autouse=True)
def t10_figures():
    """Print the T10 figures of whatever ran of this module (any order, any subset); the
    assertions are in the tests that count."""
    yield
    (ua, un), (aa, an) = FIGURES["unauth"], FIGURES["admin"]
    print(f"\nunauthenticated requests accepted: {ua} / {un}")
    print(f"admin commands accepted without credentials: {aa} / {an}")


ADMIN_ATTEMPTS = [
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "EvilTopic", "readQueueNums": 1, "writeQueueNums": 1}, None),
    (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "SecTopic"}, None),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {"groupName": "EvilGroup"}, None),
    (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "EvilGroup"}, None),
    (RequestCode.UPDATE_BROKER_CONFIG, {}, [P.pack_body({"autoCreateTopicEnable": "false"})]),
    (RequestCode.RESET_CONSUMER_CLIENT_OFFSET, {"topic": "SecTopic", "group": "g", "timestamp": 0}, None),
]
NAMESRV_ADMIN_ATTEMPTS = [
    (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "SecTopic"}, None),
    (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}, None),
    (RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}, None),
    (RequestCode.PUT_KV_CONFIG, {"namespace": "x", "key": "k", "value": "v"}, None),
]


def _env_without_auth():
    return {k: v for k, v in os.environ.items() if k not in (S.ENV_CLIENT_KEY, S.ENV_SERVER_KEY)}


@pytest.fixture(autouse=True)
def _no_auth_env(monkeypatch):
    monkeypatch.delenv(S.ENV_CLIENT_KEY, raising=False)
    monkeypatch.delenv(S.ENV_SERVER_KEY, raising=False)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("server", "client", "admin", "rogue", "temp"):
        out[name] = S.generate_keys(name, str(d / "all"))       # (public, secret)
    clients, admins = d / "clients", d / "admins"
    clients.mkdir()
    admins.mkdir()
    shutil.copy(out["client"][0], clients / "client.key")
    shutil.copy(out["admin"][0], admins / "admin.key")
    out["clients_dir"], out["admins_dir"] = str(clients), str(admins)
    return out


def _auth_conf(keys):
    return {"authEnable": "true", "authServerKeyFile": keys["server"][1],
            "authClientKeysDir": keys["clients_dir"], "authAdminKeysDir": keys["admins_dir"]}


@pytest.fixture(scope="module")
def secure(tmp_path_factory, keys):
    store = tmp_path_factory.mktemp("secure")
    conf_path = os.path.join(str(store), "broker.conf")
    c = Cluster(store, conf=_auth_conf(keys), namesrv_args=("-c", conf_path))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("plain"), with_ha=True)
    try:
        yield c
    finally:
        c.close()


def _client(keys, who):
    return RemotingClient(zmq.Context.instance(), auth=(keys[who][1], keys["server"][0]) if who else None)


def _answered(rc, addr, frames, wait_ms=NO_ANSWER_WAIT_MS):
    """Send every frame at once; responses seen within ``wait_ms``."""
    s = rc._socket(addr)
    for i, f in enumerate(frames, 1):
        f.opaque = i
        s.send_multipart(P.encode(f))
    got = []
    deadline = time.monotonic() + wait_ms / 1000.0
    while len(got) < len(frames):
        left = deadline - time.monotonic()
        if left <= 0 or not s.poll(left * 1000):
            break
        got.append(P.decode(s.recv_multipart()))
    return got


def _frames():
    return [Frame(RequestCode.GET_BROKER_RUNTIME_INFO), Frame(RequestCode.GET_ALL_TOPIC_CONFIG),
            Frame(RequestCode.GET_BROKER_CLUSTER_INFO), Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "X"}),
            Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={"topic": "NullTopic"})]


def _invoke(rc, addr, code, fields=None, bodies=None):
    return rc.invoke(addr, Frame(int(code), fields=dict(fields or {}), bodies=list(bodies or [])), ANSWER_TIMEOUT_MS)


# -- CURVE: authentication ------------------------------------------------------------------------
def test_right_key_accepted_and_cluster_works(secure, keys):
    rc = _client(keys, "client")
    try:
        r = _invoke(rc, secure.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        assert r.code == ResponseCode.SUCCESS
        # the broker registered with the NameServer over CURVE (node key): it shows in the cluster info
        deadline = time.monotonic() + 20
        while True:
            r = _invoke(rc, secure.namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
            assert r.code == ResponseCode.SUCCESS
            if "broker-a" in str(P.unpack_body(r)):
                break
            assert time.monotonic() < deadline, "broker never registered over CURVE"
            time.sleep(0.2)
    finally:
        rc.close()


def test_controller_mode_over_curve(tmp_path, keys):
    """A controller run with the brokers' auth properties (``rmq controller -c``, as ``rmq start
    --controller`` runs it) serves CURVE only: its broker is elected over it (node key), an admin
    key reads its metadata, a null or unknown key is never answered."""
    from tests.integration.test_controller_failover import STEADY_TIMEOUT_MS, Controller, controlled_conf

    conf_path = tmp_path / "controller.conf"
    conf_path.write_text("".join(f"{k}={v}\n" for k, v in _auth_conf(keys).items()))
    ctl = Controller(str(tmp_path / "controller"), "-c", str(conf_path))
    store = tmp_path / "b0"
    c = None
    rc, admin = _client(keys, "client"), _client(keys, "admin")
    try:
        # one election, the first: a heartbeat timeout no stall reaches (with controlled_conf's 2 s, a
        # broker stalled that long is declared dead, the set left without a master, the broker demoted)
        c = Cluster(store, conf={**controlled_conf(ctl, STEADY_TIMEOUT_MS), **_auth_conf(keys)},
                    namesrv_args=("-c", os.path.join(str(store), "broker.conf")), with_ha=True)
        deadline = time.monotonic() + 60
        while True:
            r = _invoke(rc, c.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
            if P.unpack_body(r)["table"]["brokerRole"] == "ASYNC_MASTER":
                break
            assert time.monotonic() < deadline, "the broker was never elected over CURVE"
            time.sleep(0.2)
        r = _invoke(admin, ctl.addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, bodies=[P.pack_body({"brokerNames": ["broker-a"]})])
        assert r.code == ResponseCode.SUCCESS and P.unpack_body(r)["broker-a"]["masterAddress"] == c.broker_addr
        for who in (None, "rogue"):
            other = _client(keys, who)
            try:
                frames = [Frame(RequestCode.CONTROLLER_GET_METADATA_INFO),
                          Frame(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, bodies=[P.pack_body({"brokerNames": ["broker-a"]})])]
                got = _answered(other, ctl.addr, frames)
                FIGURES["unauth"][0] += len(got)
                FIGURES["unauth"][1] += len(frames)
                assert got == [], f"the controller answered a {who or 'null'} key: {got}"
            finally:
                other.close()
    finally:
        rc.close()
        admin.close()
        if c is not None:
            c.close()
        ctl.close()


@pytest.mark.parametrize("who", [None, "rogue"])
def test_null_and_unknown_keys_never_answered(secure, keys, who):
    for addr in (secure.broker_addr, secure.namesrv_addr):
        rc = _client(keys, who)
        try:
            frames = _frames()
            got = _answered(rc, addr, frames)
            FIGURES["unauth"][0] += len(got)
            FIGURES["unauth"][1] += len(frames)
            assert got == [], f"{who or 'NULL'} client answered by {addr}: {got}"
        finally:
            rc.close()


def test_client_wrong_server_key_never_answered(secure, keys):
    rc = RemotingClient(zmq.Context.instance(), auth=(keys["client"][1], keys["rogue"][0]))
    try:
        frames = _frames()
        got = _answered(rc, secure.broker_addr, frames)
        FIGURES["unauth"][0] += len(got)
        FIGURES["unauth"][1] += len(frames)
        assert got == []
    finally:
        rc.close()


def test_env_vars_used_by_clients(secure, keys, monkeypatch):
    monkeypatch.setenv(S.ENV_CLIENT_KEY, keys["client"][1])
    monkeypatch.setenv(S.ENV_SERVER_KEY, keys["server"][0])
    rc = RemotingClient(zmq.Context.instance())
    try:
        assert _invoke(rc, secure.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
    finally:
        rc.close()


def test_revoked_key_refused(secure, keys):
    path = os.path.join(keys["clients_dir"], "temp.key")
    shutil.copy(keys["temp"][0], path)
    time.sleep(0.05)
    rc = _client(keys, "temp")
    try:
        assert _invoke(rc, secure.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
        os.unlink(path)
        # the open connection: NO_PERMISSION once the key ring was re-read (<= KEYRING_TTL_S + a timer tick)
        deadline = time.monotonic() + 30
        while True:
            r = _invoke(rc, secure.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
            if r.code == ResponseCode.NO_PERMISSION:
                break
            assert time.monotonic() < deadline, "revoked key still served on its open connection"
            time.sleep(0.2)
    finally:
        rc.close()
    rc = _client(keys, "temp")       # reconnect: the ZAP handler refuses the handshake
    try:
        frames = _frames()
        got = _answered(rc, secure.broker_addr, frames)
        FIGURES["unauth"][0] += len(got)
        FIGURES["unauth"][1] += len(frames)
        assert got == []
    finally:
        rc.close()


def test_revoked_admin_key_loses_admin_commands_only(secure, keys):
    """A key in both directories, removed from authAdminKeysDir: its admin commands get
    NO_PERMISSION on the open connection (README: "within about 2 s", printed as a figure, not
    asserted), its client requests are still served."""
    client_path = os.path.join(keys["clients_dir"], "temp-admin.key")
    admin_path = os.path.join(keys["admins_dir"], "temp-admin.key")
    shutil.copy(keys["temp"][0], client_path)
    shutil.copy(keys["temp"][0], admin_path)
    rc = _client(keys, "temp")
    try:
        deadline = time.monotonic() + 30
        while _invoke(rc, secure.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                      {"groupName": "RevokeG"}).code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, "the new admin key was never accepted"
            time.sleep(0.2)
        os.unlink(admin_path)
        t0 = time.monotonic()
        while True:
            r = _invoke(rc, secure.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {"groupName": "RevokeG"})
            if r.code == ResponseCode.NO_PERMISSION:
                break
            assert r.code == ResponseCode.SUCCESS, r
            assert time.monotonic() - t0 < 30, "revoked admin key still allowed admin commands"
            time.sleep(0.05)
        print(f"\nadmin key revoked: admin commands refused after {time.monotonic() - t0:.2f} s")
        assert "admin" in r.remark
        assert _invoke(rc, secure.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
    finally:
        rc.close()
        for path in (client_path, admin_path):
            if os.path.exists(path):
                os.unlink(path)


# -- CURVE: authorization ----------------------------------------------------------------------------
def test_admin_commands_need_admin_key(secure, keys):
    rc = _client(keys, "client")
    try:
        for addr, attempts in ((secure.broker_addr, ADMIN_ATTEMPTS), (secure.namesrv_addr, NAMESRV_ADMIN_ATTEMPTS)):
            for code, fields, bodies in attempts:
                r = _invoke(rc, addr, code, fields, bodies)
                FIGURES["admin"][1] += 1
                FIGURES["admin"][0] += r.code != ResponseCode.NO_PERMISSION
                assert r.code == ResponseCode.NO_PERMISSION, (code, r)
        # node-only: a client key cannot register a broker (route hijack) nor handshake as a slave
        r = _invoke(rc, secure.namesrv_addr, RequestCode.REGISTER_BROKER,
                    {"clusterName": "C", "brokerAddr": "10.0.0.1:1", "brokerName": "evil", "brokerId": 0})
        assert r.code == ResponseCode.NO_PERMISSION
        r = _invoke(rc, secure.broker_addr, RequestCode.HA_TRUNCATE, {"offset": 0})
        assert r.code == ResponseCode.NO_PERMISSION
    finally:
        rc.close()
    rc = _client(keys, "admin")
    try:
        r = _invoke(rc, secure.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                    {"topic": "SecTopic", "readQueueNums": 2, "writeQueueNums": 2})
        assert r.code == ResponseCode.SUCCESS, r
        r = _invoke(rc, secure.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {"groupName": "SecGroup"})
        assert r.code == ResponseCode.SUCCESS, r
    finally:
        rc.close()


def test_replication_listener_needs_the_node_key(tmp_path, keys):
    """With CURVE on, the master's HA listener reads the key from the request's connection (the
    first part's metadata): a client key's handshake is answered NO_PERMISSION; an admin key's
    is taken (node codes are the node and admin keys', rmq.actors.actor.Actor._denied), so the
    refusal is the key's, not the listener's."""
    import socket
    with socket.socket() as probe:                      # a free port for the HA listener
        probe.bind(("127.0.0.1", 0))
        ha_port = probe.getsockname()[1]
    c = Cluster(tmp_path / "ha", conf={**_auth_conf(keys), "brokerRole": "ASYNC_MASTER", "haListenPort": str(ha_port)},
                with_ha=True)
    try:
        handshake = {"maxOffset": 0, "minOffset": 0, "epochs": [], "brokerAddr": "127.0.0.1:1", "brokerId": 1}
        for who, code in (("client", ResponseCode.NO_PERMISSION), ("admin", ResponseCode.SUCCESS)):
            rc = _client(keys, who)
            try:
                deadline = time.monotonic() + 30          # the HA actor binds after the broker starts
                while True:
                    try:
                        r = _invoke(rc, f"127.0.0.1:{ha_port}", RequestCode.HA_HANDSHAKE, handshake)
                        break
                    except Exception:  # noqa: BLE001 - not listening yet
                        if time.monotonic() > deadline:
                            raise
                assert r.code == code, (who, r)
                assert code == ResponseCode.SUCCESS or "node key" in r.remark, r.remark
            finally:
                rc.close()
    finally:
        c.close()


def test_clients_with_auth_parameter(secure, keys):
    from rmq.client.admin import Admin
    from rmq.client.message import Message
    from rmq.client.producer import Producer
    with Admin(secure.namesrv_addr, auth=(keys["admin"][1], keys["server"][0])) as adm:
        adm.create_topic("AuthTopic", read_queue_nums=1, write_queue_nums=1, cluster="TestCluster")
    with Producer(secure.namesrv_addr, group="secpg", auth=(keys["client"][1], keys["server"][0])) as p:
        assert p.send(Message("AuthTopic", b"hello")).msg_id
    with Admin(secure.namesrv_addr, auth=(keys["client"][1], keys["server"][0])) as adm:
        with pytest.raises(MQBrokerError, match="needs an admin key") as ei:
            adm.create_topic("AuthTopic2", cluster="TestCluster")
        assert ei.value.response_code == ResponseCode.NO_PERMISSION


def test_admin_cli_auth_options(secure, keys):
    from rmq.admin_cli import admin
    ok = CliRunner().invoke(admin, ["-n", secure.namesrv_addr, "--auth-key", keys["admin"][1],
                                    "--server-key", keys["server"][0], "updateTopic", "-t", "CliTopic",
                                    "-c", "TestCluster"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(admin, ["-n", secure.namesrv_addr, "--timeout-ms", "3000", "--auth-key",
                                     keys["client"][1], "--server-key", keys["server"][0], "updateTopic",
                                     "-t", "CliTopic2", "-c", "TestCluster"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert f"CODE: {int(ResponseCode.NO_PERMISSION)} " in bad.output and "needs an admin key" in bad.output


# -- refusal to start ---------------------------------------------------------------------------------
def _start_fails(args, timeout=60):
    p = subprocess.run(python_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=_env_without_auth())
    assert p.returncode == 1 and "ready" not in p.stdout, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr           # one clear line, not a crash
    return p.stderr


@pytest.mark.parametrize("case", ["missing_key_file", "public_key_only", "no_key_property", "bad_dir"])
def test_broker_and_nameserver_refuse_to_start_without_keys(tmp_path, keys, case):
    conf = _auth_conf(keys)
    if case == "missing_key_file":
        conf["authServerKeyFile"] = str(tmp_path / "nope.key_secret")
    elif case == "public_key_only":
        conf["authServerKeyFile"] = keys["server"][0]
    elif case == "no_key_property":
        del conf["authServerKeyFile"]
    else:
        conf["authClientKeysDir"] = str(tmp_path / "no-such-dir")
    why = {"missing_key_file": f"cannot read secret key file {tmp_path / 'nope.key_secret'}",
           "public_key_only": "holds no secret key (use the NAME.key_secret file)",
           "no_key_property": "authEnable=true needs authServerKeyFile",
           "bad_dir": f"authClientKeysDir={tmp_path / 'no-such-dir'}: not a directory"}[case]
    path = tmp_path / "broker.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    err = _start_fails(["-m", "rmq.actors.broker", "--store-path", str(tmp_path / "store"), "-c", str(path),
                        "--listen-port", "0", "--namesrv-addr", "127.0.0.1:1"])
    assert "broker: refusing to start: " in err and why in err, err
    err = _start_fails(["-m", "rmq.actors.nameserver", "--listen-port", "0", "-c", str(path)])
    assert "nameserver: refusing to start: " in err and why in err, err
    err = _start_fails(["-m", "rmq.actors.reput", "--store-path", str(tmp_path / "store"), "-c", str(path)])
    assert "reput: refusing to start: " in err and why in err, err          # the followers say it the same way


def test_curve_server_refused_without_running_authenticator(keys):
    ctx = zmq.Context()
    try:
        sec = S.ServerSecurity(S.AuthConfig.from_properties(_auth_conf(keys)), ctx)
        s = ctx.socket(zmq.ROUTER)
        sec.secure_server(s)                                  # running: fine
        assert s.getsockopt(zmq.ZAP_DOMAIN) == S.ZAP_DOMAIN.encode()
        s.close(0)
        sec.stop()
        s = ctx.socket(zmq.ROUTER)
        with pytest.raises(S.SecurityError, match="authenticator"):
            sec.secure_server(s)
        s.close(0)
    finally:
        ctx.destroy(linger=0)


def test_no_curve_allow_any_and_no_pickle():
    rmq_dir = os.path.join(ROOT, "rmq")
    offenders = []
    for dirpath, _, files in os.walk(rmq_dir):
        for f in files:
            if not f.endswith((".py", ".pyx")):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                src = fh.read()
            if f.endswith(".pyx"):
                if "import pickle" in src or "cPickle" in src:
                    offenders.append((path, "pickle"))
                continue
            for node in ast.walk(ast.parse(src, path)):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    names = []
                if any(n.split(".")[0] in ("pickle", "cPickle", "_pickle", "dill", "cloudpickle") for n in names):
                    offenders.append((path, "pickle"))
                if isinstance(node, (ast.Name, ast.Attribute)):
                    ident = node.id if isinstance(node, ast.Name) else node.attr
                    if ident in ("CURVE_ALLOW_ANY", "allow_any"):
                        offenders.append((path, ident))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "configure_curve":
                    offenders.append((path, "configure_curve (use the KeyRing callback)"))
    assert offenders == []


# -- CURVE off (default): loopback, admin from loopback only, allow-list, names ---------------------
def _listeners(pids):
    """Local addresses (hex, /proc/net/tcp*) of the TCP sockets in LISTEN state owned by ``pids``."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    listeners = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:       # LISTEN, ours
                    listeners.append(cols[1].rsplit(":", 1)[0])
    return listeners


def test_default_listeners_loopback_only(plain):
    pids = [plain.namesrv.proc.pid] + [p.proc.pid for p in plain.procs.values()]
    deadline = time.monotonic() + 30          # the ha actor listens once it learned its role
    while len(_listeners(pids)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    listeners = _listeners(pids)
    loopback = {"0100007F", "00000000000000000000000001000000"}
    public = [a for a in listeners if a not in loopback]
    print(f"\nnon-loopback listeners by default: {len(public)} (of {len(listeners)} listeners)")
    assert len(listeners) >= 3          # nameserver, broker, ha
    assert public == []


def test_store_dir_and_ipc_files_private(plain):
    mode = stat.S_IMODE(os.stat(plain.store_path).st_mode)
    assert mode & 0o077 == 0, oct(mode)
    for name in ("broker.ipc", "broker-pub.ipc"):
        st = os.stat(os.path.join(plain.store_path, name))
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0, (name, oct(st.st_mode))


def test_admin_commands_loopback_only_without_curve(tmp_path):
    host = _non_loopback_ipv4()
    if host is None:
        pytest.skip("no non-loopback IPv4 address on this host")
    c = Cluster(tmp_path, conf={"brokerIP1": "0.0.0.0"})      # all interfaces: loopback and ``host``
    rc = RemotingClient(zmq.Context.instance())
    try:
        addr = f"{host}:{c.broker_addr.rsplit(':', 1)[1]}"
        assert _invoke(rc, addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
        for code, fields, bodies in ADMIN_ATTEMPTS:
            r = _invoke(rc, addr, code, fields, bodies)
            FIGURES["admin"][1] += 1
            FIGURES["admin"][0] += r.code != ResponseCode.NO_PERMISSION
            assert r.code == ResponseCode.NO_PERMISSION, (code, r)
        # the same command from loopback is served (the default deployment)
        lo = f"127.0.0.1:{addr.rsplit(':', 1)[1]}"
        r = _invoke(rc, lo, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "LoTopic"})
        assert r.code == ResponseCode.SUCCESS, r
        with open(os.path.join(str(tmp_path), "logs", "broker.log")) as f:
            assert "non-loopback" in f.read()
    finally:
        rc.close()
        c.close()


def _non_loopback_ipv4():
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))            # no packet is sent: picks the outgoing address
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if S.is_loopback_host(ip) else ip


def test_internal_codes_refused_on_tcp(plain):
    rc = RemotingClient(zmq.Context.instance())
    try:
        for code in sorted(S.LOCAL_CODES):
            r = _invoke(rc, plain.broker_addr, code, {"offset": 0})
            assert r.code == ResponseCode.NO_PERMISSION, (code, r)
    finally:
        rc.close()


PATH_LIKE_KEYS = ["storePathRootDir", "storePathCommitLog", "rocketmqHome", "kvConfigPath", "configStorePath",
                  "abortFilePath", "storeCheckpoint", "logDir", "brokerConfigPath", "filterServerNums",
                  "haMasterAddress", "authServerKeyFile", "authClientKeysDir", "authAdminKeysDir", "authEnable"]


def test_runtime_config_allow_list(plain):
    rc = RemotingClient(zmq.Context.instance())
    try:
        for key in PATH_LIKE_KEYS:
            r = _invoke(rc, plain.broker_addr, RequestCode.UPDATE_BROKER_CONFIG,
                        bodies=[P.pack_body({key: "/tmp/evil"})])
            assert r.code == ResponseCode.NO_PERMISSION, (key, r)
        r = _invoke(rc, plain.broker_addr, RequestCode.UPDATE_BROKER_CONFIG,
                    bodies=[P.pack_body({"longPollingEnable": "true"})])
        assert r.code == ResponseCode.SUCCESS, r
    finally:
        rc.close()


BAD_NAMES = ["../evil", "..", ".", "a/b", "/etc/passwd", "a\\b", "x\x00y", "", "a" * 300, "..%2f..", "a b",
             "~root", "con\n"]


def test_topic_and_group_names_cannot_escape_store(plain):
    before = set(os.listdir(os.path.dirname(plain.store_path)))
    rc = RemotingClient(zmq.Context.instance())
    try:
        for name in BAD_NAMES:
            for code, fields in ((RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": name}),
                                 (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {"groupName": name}),
                                 (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": name}),
                                 (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": name}),
                                 (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": name})):
                addr = plain.namesrv_addr if code == RequestCode.GET_ROUTEINFO_BY_TOPIC else plain.broker_addr
                r = _invoke(rc, addr, code, fields)
                assert r.code != ResponseCode.SUCCESS, (code, name, r)
            # read-only look-ups may answer (0 / not found) but must not touch the disk (checked below)
            for code, fields in ((RequestCode.GET_MAX_OFFSET, {"topic": name, "queueId": 0}),
                                 (RequestCode.QUERY_CONSUMER_OFFSET, {"topic": name, "consumerGroup": name,
                                                                      "queueId": 0})):
                _invoke(rc, plain.broker_addr, code, fields)
    finally:
        rc.close()
    assert set(os.listdir(os.path.dirname(plain.store_path))) == before
    for dirpath, dirnames, filenames in os.walk(plain.store_path):
        for n in dirnames + filenames:
            assert "evil" not in n and n not in ("..", "passwd"), os.path.join(dirpath, n)


# -- keys CLI, config validation -------------------------------------------------------------------
def test_keys_generate_cli(tmp_path):
    from rmq.cli import main
    r = CliRunner().invoke(main, ["keys", "generate", "alice", "--dir", str(tmp_path / "k")])
    assert r.exit_code == 0, r.output
    pub, sec = tmp_path / "k" / "alice.key", tmp_path / "k" / "alice.key_secret"
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) & 0o077 == 0
    assert S.load_public_key(str(pub)) == S.load_secret_key(str(sec))[0]
    again = CliRunner().invoke(main, ["keys", "generate", "alice", "--dir", str(tmp_path / "k")])
    assert again.exit_code != 0 and "exists" in again.output


def test_broker_conf_auth_validation(keys):
    from rmq.broker_conf import BrokerConfError, broker_settings
    assert broker_settings(_auth_conf(keys))["authEnable"] == "true"
    with pytest.raises(BrokerConfError, match="authEnable"):
        broker_settings({"authEnable": "maybe"})
    with pytest.raises(BrokerConfError, match="authServerKeyFile"):
        broker_settings({"authEnable": "true"})
    assert S.AuthConfig.from_properties({}).enable is False
