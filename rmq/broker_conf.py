"""RocketMQ ``broker.conf`` files and the broker's effective settings.

A ``broker.conf`` is RocketMQ's key=value properties file with RocketMQ's own
property names (camelCase)::

    # one broker group of the default cluster
    brokerClusterName = DefaultCluster
    brokerName = broker-a
    brokerId = 0
    namesrvAddr = 127.0.0.1:9876;127.0.0.2:9876
    brokerRole = ASYNC_MASTER
    flushDiskType = ASYNC_FLUSH
    mappedFileSizeCommitLog = 1073741824

Format: one ``key=value`` per line; whitespace around key and value is trimmed;
blank lines and lines starting with ``#`` or ``!`` are skipped; the value is
everything after the first ``=`` (so ``namesrvAddr=h:9876`` works) and may be
empty; a key given twice keeps the later value.  Backslash escapes and line
continuations of Java properties are not interpreted.  A line without ``=`` or
with an empty or malformed key is an error naming the file and line number.

:func:`broker_settings` merges a parsed file with command-line overrides
(flags win) and fills RocketMQ's defaults for the broker-level settings; every
other property passes through untouched, for
:meth:`rmq.store.config.MessageStoreConfig.from_properties`.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping, Optional

from rmq.common.mix_all import DEFAULT_NAMESRV_ADDR, MASTER_ID
from rmq.metrics import MetricsConfigError, metrics_settings
from rmq.security import SecurityError, check_auth_properties
from rmq.store.config import BROKER_ROLES, FLUSH_DISK_TYPES

DEFAULT_CLUSTER_NAME = "DefaultCluster"
DEFAULT_BROKER_NAME = "broker-a"
DEFAULT_LISTEN_PORT = 10911                 # RocketMQ's broker port
DEFAULT_STORE_PATH = "./rmq-data"
DEFAULT_DASHBOARD_PORT = 8082               # rocketmq-dashboard's port (rmq.dashboard.app)

# RocketMQ property names: letters, digits, '.', '_' and '-' (no spaces)
KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
# brokerClusterName / brokerName: what the NameServer accepts
NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.-]+$")
# one NameServer address: host:port (IPv4, hostname or [IPv6])
ADDR_PATTERN = re.compile(r"^(?:[a-zA-Z0-9_.-]+|\[[0-9a-fA-F:.]+\]):([0-9]{1,5})$")


class BrokerConfError(ValueError):
    """A broker.conf line or a setting that cannot be used; the message names it."""


def parse_broker_conf(text: str, source: str = "broker.conf") -> dict:
    """Parse the text of a broker.conf into ``{key: value}`` (str values, later keys win).

    Parameters
    ----------
    text : str
        The file's contents.
    source : str
        Name used in error messages (the file path).

    Raises
    ------
    BrokerConfError
        ``"<source>:<line>: ..."`` for a line without ``=`` or with a bad key.
    """
    props: dict = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        if "=" not in line:
            raise BrokerConfError(f"{source}:{lineno}: expected key=value, got {line[:80]!r}")
        key, _, value = line.partition("=")
        key = key.strip()
        if not KEY_PATTERN.match(key):
            raise BrokerConfError(f"{source}:{lineno}: bad property name {key[:80]!r} "
                                  "(letters, digits, '.', '_', '-'; no spaces)")
        props[key] = value.strip()
    return props


def load_broker_conf(path: str) -> dict:
    """Read and parse the broker.conf at ``path`` (UTF-8).

    Raises
    ------
    BrokerConfError
        The file cannot be read or decoded, or has a malformed line (path and line number).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BrokerConfError(f"cannot read broker config {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BrokerConfError(f"{path}: not UTF-8 text ({e})") from None
    return parse_broker_conf(text, path)


def _int(key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise BrokerConfError(f"{key} must be an integer, got {value!r}")
    try:
        v = int(str(value).strip())
    except ValueError:
        raise BrokerConfError(f"{key} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise BrokerConfError(f"{key}={v} outside [{lo}, {hi}]")
    return v


def check_namesrv_addr(value: str, allow_port_zero: bool = False) -> str:
    """``"h:p;h:p"`` (RocketMQ's separator is ';'); entries trimmed, empty entries dropped.

    ``allow_port_zero`` accepts port 0 (ephemeral), which only means something to
    ``rmq start``: the NameServer it runs binds any free port and the broker is told the real one.

    Raises
    ------
    BrokerConfError
        An entry is not ``host:port`` with 1 <= port <= 65535 (0 too if allowed), or nothing is left.
    """
    parts = [p.strip() for p in str(value).split(";") if p.strip()]
    if not parts:
        raise BrokerConfError(f"namesrvAddr must list at least one host:port, got {value!r}")
    for p in parts:
        m = ADDR_PATTERN.match(p)
        lo = 0 if allow_port_zero else 1
        if m is None or not lo <= int(m.group(1)) <= 65535:
            raise BrokerConfError(f"namesrvAddr entry {p!r} must be host:port with a port in [{lo}, 65535]")
    return ";".join(parts)


DEFAULT_REMOTING_LISTEN_PORT = 8080        # RocketMQ 5 ProxyConfig.remotingListenPort
DEFAULT_GRPC_SERVER_PORT = 8081            # RocketMQ 5 ProxyConfig.grpcServerPort


def proxy_settings(s: Mapping[str, Any]) -> dict:
    """The supervisor-run remoting proxy's settings from broker.conf properties: ``enableProxy``
    (false; ``rmq start --enable-proxy``, RocketMQ 5's ``mqbroker --enable-proxy``) and
    ``remotingListenPort`` (8080, 0 = any free port) and ``grpcServerPort`` (8081, RocketMQ 5's gRPC API;
    0 = any free port, logged).  The proxy binds 127.0.0.1 like every other
    listener.  CURVE does not apply to raw TCP, so with ``authEnable=true`` (or ``aclEnable=true``,
    RocketMQ 4.x BrokerConfig's name) the proxy checks its clients with RocketMQ ACL 1.0
    (:mod:`rmq.proxy.acl`) against ``aclPlainFile`` (RocketMQ's ``rocketmq.acl.plain.file``; default
    ``<storePathRootDir>/config/plain_acl.yml``, created empty if missing).  Returns
    ``{"enabled", "port", "grpc_port", "acl_file"}`` (``acl_file`` "" without ACL; with it, both the
    remoting and the gRPC clients are checked).

    Raises
    ------
    BrokerConfError
        A bad boolean or port.
    """
    raw = str(s.get("enableProxy", "false")).strip().lower()
    if raw not in ("true", "false"):
        raise BrokerConfError(f"enableProxy must be true or false, got {s.get('enableProxy')!r}")
    port = _int("remotingListenPort", s.get("remotingListenPort", DEFAULT_REMOTING_LISTEN_PORT), 0, 65535)
    acl = False
    for key in ("authEnable", "aclEnable"):
        v = str(s.get(key, "false")).strip().lower()
        if v not in ("true", "false"):
            raise BrokerConfError(f"{key} must be true or false, got {s.get(key)!r}")
        acl = acl or v == "true"
    acl_file = ""
    if acl:
        acl_file = str(s.get("aclPlainFile", "") or "").strip() or os.path.join(
            str(s.get("storePathRootDir") or DEFAULT_STORE_PATH), "config", "plain_acl.yml")
        acl_file = os.path.abspath(os.path.expanduser(acl_file))
    grpc_port = _int("grpcServerPort", s.get("grpcServerPort", DEFAULT_GRPC_SERVER_PORT), 0, 65535)
    return {"enabled": raw == "true", "port": port, "grpc_port": grpc_port, "acl_file": acl_file}


DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS = 1000      # RocketMQ 5 BrokerConfig.brokerHeartbeatInterval
DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS = 4000   # BrokerConfig.controllerHeartBeatTimeoutMills (RocketMQ: 10 s;
                                                 # rmq: 4 s, so a failover ends within 10 s with defaults)
DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS = 15000  # MessageStoreConfig.haMaxTimeSlaveNotCatchup


DEFAULT_CONTROLLER_PORT = 9878                   # RocketMQ 5's controller (mqcontroller) listen port


DEFAULT_WAIT_TIME_MS_IN_SEND_QUEUE = 200          # waitTimeMillsInSendQueue (SPEC.md §6.3)
DEFAULT_SEND_QUEUE_CAPACITY = 10_000              # sendThreadPoolQueueCapacity (BrokerConfig)
MAX_WAIT_TIME_MS_IN_SEND_QUEUE = 600_000
MAX_SEND_QUEUE_CAPACITY = 1_000_000


def flow_control_settings(s: Mapping[str, Any]) -> dict:
    """The broker's send flow control (RocketMQ's BrokerFastFailure): ``waitTimeMillsInSendQueue``
    (ms, 200: a send that waited longer since the broker read it is answered SYSTEM_BUSY
    [TIMEOUT_CLEAN_QUEUE]) and ``sendThreadPoolQueueCapacity`` (10000: client requests the broker
    reads off its socket per loop round, so their wait is measured; the rest wait in ZeroMQ's
    buffers).  Returns ``{"wait_ms", "queue_capacity"}``.

    Raises
    ------
    BrokerConfError
        Not an integer, or outside [0, MAX_WAIT_TIME_MS_IN_SEND_QUEUE] / [1, MAX_SEND_QUEUE_CAPACITY].
    """
    return {"wait_ms": _int("waitTimeMillsInSendQueue", s.get("waitTimeMillsInSendQueue",
                                                               DEFAULT_WAIT_TIME_MS_IN_SEND_QUEUE),
                            0, MAX_WAIT_TIME_MS_IN_SEND_QUEUE),
            "queue_capacity": _int("sendThreadPoolQueueCapacity", s.get("sendThreadPoolQueueCapacity",
                                                                         DEFAULT_SEND_QUEUE_CAPACITY),
                                   1, MAX_SEND_QUEUE_CAPACITY)}


DEFAULT_APPEND_ANNOUNCE_INTERVAL_MS = 1           # RocketMQ's ReputMessageService: a round every 1 ms
MAX_APPEND_ANNOUNCE_INTERVAL_MS = 100


def append_announce_interval_ms(s: Mapping[str, Any]) -> int:
    """``appendAnnounceIntervalMs`` (ms, default 1; 0 = after every append): how often at most the
    broker tells reput (and an ASYNC_MASTER's HA actor) that the CommitLog grew.  The first append
    after a quiet spell is announced at once, later ones within the interval together at its end:
    RocketMQ's ReputMessageService looks for new CommitLog bytes every 1 ms the same way.  Held
    pulls at a queue's tail are answered from the appends themselves (wakePullOnAppendEnable), so
    the interval does not delay them.  SYNC_FLUSH, SYNC_MASTER and allAckInSyncStateSet announce
    every append at once (a send waits for the flush or the replica that the announcement starts).
    Appends of the POP revive log alone are not announced before the next append or the 200 ms
    tick (:meth:`rmq.actors.broker.BrokerActor.note_quiet_append`), except with 0.

    Raises
    ------
    BrokerConfError
        Not an integer, or outside [0, MAX_APPEND_ANNOUNCE_INTERVAL_MS].
    """
    return _int("appendAnnounceIntervalMs", s.get("appendAnnounceIntervalMs", DEFAULT_APPEND_ANNOUNCE_INTERVAL_MS),
                0, MAX_APPEND_ANNOUNCE_INTERVAL_MS)


def local_controller_settings(s: Mapping[str, Any]) -> dict:
    """A controller run by ``rmq start`` beside its NameServer (``rmq start --controller``):
    ``enableControllerInNamesrv`` (false; RocketMQ 5's NamesrvConfig name) and
    ``controllerListenPort`` (9878; 0 = any free port, resolved by the supervisor).  Returns
    ``{"enabled", "port"}``.

    Raises
    ------
    BrokerConfError
        A bad boolean or port.
    """
    raw = str(s.get("enableControllerInNamesrv", "false")).strip().lower()
    if raw not in ("true", "false"):
        raise BrokerConfError(f"enableControllerInNamesrv must be true or false, got "
                              f"{s.get('enableControllerInNamesrv')!r}")
    return {"enabled": raw == "true",
            "port": _int("controllerListenPort", s.get("controllerListenPort", DEFAULT_CONTROLLER_PORT), 0, 65535)}


def controller_settings(s: Mapping[str, Any], allow_port_zero: bool = False) -> dict:
    """RocketMQ 5 controller mode's broker properties: ``enableControllerMode`` (false),
    ``controllerAddr`` (``h:p;h:p``, the controllers' request addresses; required when enabled),
    ``brokerHeartbeatInterval`` (ms, 1000), ``controllerHeartBeatTimeoutMills`` (ms, 4000: a master
    silent this long is replaced; it stops taking writes itself after 3/4 of it without a
    controller's answer), ``haMaxTimeSlaveNotCatchup`` (ms, 15000: a replica that has not caught up
    this long leaves the SyncStateSet), ``brokerElectionPriority`` (int, lower first, 2**31 - 1).
    Returns ``{"enabled", "addrs" (list), "heartbeat_interval_ms", "heartbeat_timeout_ms",
    "not_catchup_ms", "election_priority"}``.

    Raises
    ------
    BrokerConfError
        A bad boolean, address list or duration, or controller mode without ``controllerAddr``.
    """
    raw = str(s.get("enableControllerMode", "false")).strip().lower()
    if raw not in ("true", "false"):
        raise BrokerConfError(f"enableControllerMode must be true or false, got {s.get('enableControllerMode')!r}")
    addrs: list = []
    if raw == "true":
        value = str(s.get("controllerAddr", "") or "").strip()
        if not value:
            raise BrokerConfError("enableControllerMode=true needs controllerAddr (host:port;host:port)")
        try:
            addrs = check_namesrv_addr(value, allow_port_zero).split(";")
        except BrokerConfError as e:
            raise BrokerConfError(str(e).replace("namesrvAddr", "controllerAddr")) from None
    interval = _int("brokerHeartbeatInterval", s.get("brokerHeartbeatInterval", DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS),
                    10, 60_000)
    timeout = _int("controllerHeartBeatTimeoutMills",
                   s.get("controllerHeartBeatTimeoutMills", DEFAULT_CONTROLLER_HEARTBEAT_TIMEOUT_MS), 100, 600_000)
    if timeout < 2 * interval:
        raise BrokerConfError(f"controllerHeartBeatTimeoutMills={timeout} must be at least twice "
                              f"brokerHeartbeatInterval={interval}")
    not_catchup = _int("haMaxTimeSlaveNotCatchup",
                       s.get("haMaxTimeSlaveNotCatchup", DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS), 100, 3_600_000)
    priority = _int("brokerElectionPriority", s.get("brokerElectionPriority", 2 ** 31 - 1), 0, 2 ** 31 - 1)
    return {"enabled": raw == "true", "addrs": addrs, "heartbeat_interval_ms": interval,
            "heartbeat_timeout_ms": timeout, "not_catchup_ms": not_catchup, "election_priority": priority}


def dashboard_settings(s: Mapping[str, Any]) -> dict:
    """The supervisor-run dashboard's settings from broker.conf properties: ``dashboardEnable``
    (false), ``dashboardPort`` (8082, 0 = any free port), ``dashboardHost`` (127.0.0.1),
    ``dashboardTokenFile`` (none; required when the host is not loopback, as ``rmq dashboard
    --token-file``).  Returns ``{"enabled", "host", "port", "token_file"}``.

    Raises
    ------
    BrokerConfError
        A bad boolean or port, an empty host, a non-loopback host without a token file, or a
        token file that cannot be read.
    """
    import ipaddress

    raw = str(s.get("dashboardEnable", "false")).strip().lower()
    if raw not in ("true", "false"):
        raise BrokerConfError(f"dashboardEnable must be true or false, got {s.get('dashboardEnable')!r}")
    port = _int("dashboardPort", s.get("dashboardPort", DEFAULT_DASHBOARD_PORT), 0, 65535)
    host = str(s.get("dashboardHost", "127.0.0.1")).strip()
    if not host:
        raise BrokerConfError("dashboardHost must not be empty")
    token_file = str(s.get("dashboardTokenFile", "") or "").strip()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if raw == "true":
        if not loopback and not token_file:
            raise BrokerConfError(f"dashboardHost={host} is beyond loopback: set dashboardTokenFile so that the "
                                  f"dashboard asks for a login")
        if token_file and not os.access(os.path.expanduser(token_file), os.R_OK):
            raise BrokerConfError(f"dashboardTokenFile={token_file}: not a readable file")
    return {"enabled": raw == "true", "host": host, "port": port,
            "token_file": os.path.abspath(os.path.expanduser(token_file)) if token_file else ""}


def broker_settings(props: Optional[Mapping[str, Any]] = None,
                    overrides: Optional[Mapping[str, Any]] = None, ephemeral_ports: bool = False) -> dict:
    """The broker's effective settings: file ``props``, then ``overrides`` (flags; None = not given).

    Parameters
    ----------
    props : mapping, optional
        Parsed broker.conf (:func:`load_broker_conf`).
    overrides : mapping, optional
        Command-line values under RocketMQ's property names (``storePathRootDir``,
        ``listenPort``, ``namesrvAddr``, ...); entries whose value is None are ignored.
    ephemeral_ports : bool
        Accept port 0 in ``namesrvAddr`` (``rmq start``'s own NameServer on any free port).

    Returns
    -------
    dict
        Every property given, plus the defaults of ``brokerClusterName`` (DefaultCluster),
        ``brokerName`` (broker-a), ``brokerId`` (0, int), ``listenPort`` (10911, int; 0 =
        ephemeral), ``namesrvAddr`` (127.0.0.1:9876, normalised ``h:p;h:p``),
        ``storePathRootDir`` (./rmq-data, ``~`` expanded), ``brokerRole`` (ASYNC_MASTER),
        ``flushDiskType`` (ASYNC_FLUSH).  ``auth*`` properties are checked (key files
        readable, directories present) when ``authEnable=true``.  As in RocketMQ's BrokerStartup a master's brokerId
        is forced to 0.  Other properties are returned untouched (for
        MessageStoreConfig.from_properties).

    Raises
    ------
    BrokerConfError
        A setting has a bad value (named), or a SLAVE has brokerId <= 0.
    """
    s: dict = {"brokerClusterName": DEFAULT_CLUSTER_NAME, "brokerName": DEFAULT_BROKER_NAME,
               "brokerId": MASTER_ID, "listenPort": DEFAULT_LISTEN_PORT, "namesrvAddr": DEFAULT_NAMESRV_ADDR,
               "storePathRootDir": DEFAULT_STORE_PATH, "brokerRole": "ASYNC_MASTER",
               "flushDiskType": "ASYNC_FLUSH"}
    s.update(props or {})
    s.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key in ("brokerClusterName", "brokerName"):
        v = str(s[key]).strip()
        if not NAME_PATTERN.match(v) or len(v) > 255:
            raise BrokerConfError(f"{key}={v[:80]!r} must be 1..255 characters of [%|a-zA-Z0-9_.-]")
        s[key] = v
    s["brokerId"] = _int("brokerId", s["brokerId"], 0, 2 ** 31 - 1)
    s["listenPort"] = _int("listenPort", s["listenPort"], 0, 65535)
    s["namesrvAddr"] = check_namesrv_addr(s["namesrvAddr"], ephemeral_ports)
    store = str(s["storePathRootDir"]).strip()
    if not store:
        raise BrokerConfError("storePathRootDir must not be empty")
    s["storePathRootDir"] = os.path.expanduser(store)
    for key, allowed in (("brokerRole", BROKER_ROLES), ("flushDiskType", FLUSH_DISK_TYPES)):
        v = str(s[key]).strip()
        if v not in allowed:
            raise BrokerConfError(f"{key} must be one of {', '.join(allowed)}, got {v!r}")
        s[key] = v
    try:     # metricsExporterType / metricsPromExporterPort / metricsPromExporterHost / metricsLabel
        metrics_settings(s)
    except MetricsConfigError as e:
        raise BrokerConfError(str(e)) from None
    dashboard_settings(s)   # dashboardEnable / dashboardPort / dashboardHost / dashboardTokenFile
    if local_controller_settings(s)["enabled"]:       # rmq start --controller: its brokers use it
        s.setdefault("enableControllerMode", "true")
        if str(s.get("enableControllerMode")).strip().lower() == "true" and not s.get("controllerAddr"):
            s["controllerAddr"] = f"127.0.0.1:{local_controller_settings(s)['port']}"
    flow_control_settings(s)      # waitTimeMillsInSendQueue / sendThreadPoolQueueCapacity
    append_announce_interval_ms(s)
    # enableControllerMode / controllerAddr / heartbeat settings
    controller = controller_settings(s, ephemeral_ports)
    try:     # authEnable / authServerKeyFile / authClientKeysDir / authAdminKeysDir (rmq.security)
        check_auth_properties(s)
    except SecurityError as e:
        raise BrokerConfError(str(e)) from None
    if controller["enabled"]:
        pass     # the controller assigns replica ids and decides the role (rmq.actors.controller_client)
    elif s["brokerRole"] == "SLAVE":
        if s["brokerId"] <= 0:
            raise BrokerConfError(f"a SLAVE's brokerId must be > 0, got {s['brokerId']}")
    else:
        s["brokerId"] = MASTER_ID
    return s


def load_optional_conf(path: Optional[str], error: Callable[[str], Any]) -> Optional[dict]:
    """The properties of ``path`` for an actor's ``-c`` (None without one); a bad file goes to
    ``error`` (an argparse parser's ``error``: one line, exit 2)."""
    if not path:
        return None
    try:
        return load_broker_conf(path)
    except BrokerConfError as e:
        return error(str(e))


def actor_settings(config_path: Optional[str], overrides: Mapping[str, Any], actor: str) -> dict:
    """:func:`broker_settings` of an actor's ``-c broker.conf`` (None: no file) and its flags, for
    its ``main()``.

    Raises
    ------
    SystemExit
        The file or a setting is bad: one line, ``"<actor>: refusing to start: <why>"`` (exit
        code 1, as the NameServer says it), not a traceback.
    """
    try:
        return broker_settings(load_broker_conf(config_path) if config_path else {}, overrides)
    except BrokerConfError as e:
        raise SystemExit(f"{actor}: refusing to start: {e}") from None


def format_broker_conf(settings: Mapping[str, Any], header: str = "") -> str:
    """``settings`` as broker.conf text (one ``key=value`` a line, sorted) that
    :func:`parse_broker_conf` reads back to the same strings.

    Raises
    ------
    BrokerConfError
        A key or value cannot be written on one line.
    """
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    for key in sorted(settings):
        value = settings[key]
        if isinstance(value, bool):
            value = "true" if value else "false"
        value = str(value)
        if not KEY_PATTERN.match(key) or "\n" in value or "\r" in value or value != value.strip():
            raise BrokerConfError(f"cannot write property {key!r}={value[:80]!r} as one key=value line")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
