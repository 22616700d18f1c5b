"""``rmq admin``: mqadmin's most used commands over :class:`rmq.client.admin.Admin` (SPEC.md §16).

Each command answers to RocketMQ's camelCase name (``updateTopic``) and to a
kebab alias (``update-topic``; ``update_topic`` works too), takes RocketMQ's
option letters, prints a table (rich) or, with ``--json``, one JSON object with
stable snake_case keys.  ``-n/--namesrv-addr`` is accepted before the command
(``rmq admin -n H:P topicList``) and after it, as with mqadmin
(``rmq admin topicList -n H:P``).  Errors print ``Error: ...`` on stderr and
exit with code 1.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import sys
import time
from typing import Any, Callable, Optional

import click

from rmq.common.mix_all import DEFAULT_NAMESRV_ADDR      # stdlib only: no client module loaded at start-up

DEFAULT_TIMEOUT_MS = 3000
LIST_BODY_CHARS = 80          # body shown per row in message lists (full body with --json / single views)
PIPE_WIDTH = 400              # rich width when stdout is not a terminal: never wrap table cells

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


# -- the group: camelCase names + aliases -------------------------------------------------------
class AliasedGroup(click.Group):
    """A group whose commands also answer to aliases (kebab-case and snake_case of the name)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.aliases: dict[str, str] = {}

    def add_aliased(self, cmd: click.Command, *aliases: str) -> None:
        self.add_command(cmd)
        for a in aliases:
            self.aliases[a] = cmd.name
            self.aliases[a.replace("-", "_")] = cmd.name

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        cmd = super().get_command(ctx, name)
        if cmd is None and name in self.aliases:
            cmd = super().get_command(ctx, self.aliases[name])
        return cmd

    def resolve_command(self, ctx: click.Context, args: list):
        _, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd else None), cmd, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        inverse: dict[str, list] = {}
        for alias, name in self.aliases.items():
            if "_" not in alias:
                inverse.setdefault(name, []).append(alias)
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            label = ", ".join([name] + inverse.get(name, []))
            rows.append((label, cmd.get_short_help_str(limit=90)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group("admin", cls=AliasedGroup, context_settings=CONTEXT)
@click.option("-n", "--namesrv-addr", envvar="NAMESRV_ADDR", default=DEFAULT_NAMESRV_ADDR, show_default=True,
              metavar="HOST:PORT[;HOST:PORT]", help="NameServer address(es); env NAMESRV_ADDR.")
@click.option("--timeout-ms", type=click.IntRange(1, 600_000), default=DEFAULT_TIMEOUT_MS, show_default=True,
              help="Per-request timeout, ms.")
@click.option("--json", "as_json", is_flag=True, help="JSON output for the command (same as its --json).")
@click.option("--auth-key", envvar="RMQ_AUTH_CLIENT_KEY", default=None, metavar="FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="CURVE: this client's NAME.key_secret (an admin key for admin commands); "
                   "env RMQ_AUTH_CLIENT_KEY.")
@click.option("--server-key", envvar="RMQ_AUTH_SERVER_KEY", default=None, metavar="FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="CURVE: the cluster's public NAME.key; env RMQ_AUTH_SERVER_KEY.")
@click.pass_context
def admin(ctx: click.Context, namesrv_addr: str, timeout_ms: int, as_json: bool,
          auth_key: Optional[str] = None, server_key: Optional[str] = None) -> None:
    """mqadmin commands: topics, routes, cluster and broker status, consumer progress and offsets,
    message look-ups, test send and consume.

    Commands answer to RocketMQ's camelCase names and to kebab-case aliases; every command
    takes --json and -h/--help.
    """
    ctx.obj = {"namesrv_addr": namesrv_addr, "timeout_ms": timeout_ms, "json": as_json}
    if bool(auth_key) != bool(server_key):
        raise click.UsageError("--auth-key and --server-key go together (or RMQ_AUTH_CLIENT_KEY + "
                               "RMQ_AUTH_SERVER_KEY)")
    if auth_key:
        # every client this command makes (Admin, test producers / consumers) reads these (rmq.security);
        # set for this command only: an embedding process (or a test runner) gets its environment back
        saved = {k: os.environ.get(k) for k in ("RMQ_AUTH_CLIENT_KEY", "RMQ_AUTH_SERVER_KEY")}
        os.environ["RMQ_AUTH_CLIENT_KEY"] = os.path.abspath(auth_key)
        os.environ["RMQ_AUTH_SERVER_KEY"] = os.path.abspath(server_key)

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        ctx.call_on_close(restore)


# -- plumbing ------------------------------------------------------------------------------------
def _command(name: str, alias: str, **kw) -> Callable:
    """Register ``f`` as ``name`` + ``alias`` with the common -n/--json options and error mapping."""

    def deco(f: Callable) -> click.Command:
        @functools.wraps(f)
        def wrapper(*args, namesrv_addr_override=None, as_json=False, **kwargs):
            ctx = click.get_current_context()
            obj = ctx.find_object(dict) or {}
            ctx.meta["rmq.admin"] = {
                "namesrv_addr": namesrv_addr_override or obj.get("namesrv_addr", DEFAULT_NAMESRV_ADDR),
                "timeout_ms": obj.get("timeout_ms", DEFAULT_TIMEOUT_MS),
                "json": as_json or obj.get("json", False)}
            from rmq.errors import RmqError
            try:
                return f(*args, **kwargs)
            except RmqError as e:
                raise click.ClickException(str(e)) from None

        cmd = click.command(name, context_settings=CONTEXT, **kw)(wrapper)
        cmd.params.append(click.Option(["-n", "--namesrv-addr", "namesrv_addr_override"], default=None,
                                       metavar="HOST:PORT[;HOST:PORT]",
                                       help="NameServer address(es), overrides `rmq admin -n`."))
        cmd.params.append(click.Option(["--json", "as_json"], is_flag=True,
                                       help="Print one JSON object (stable snake_case keys) instead of a table."))
        admin.add_aliased(cmd, alias)
        return cmd

    return deco


def _settings() -> dict:
    return click.get_current_context().meta["rmq.admin"]


def _client():
    from rmq.client.admin import Admin
    s = _settings()
    return Admin(s["namesrv_addr"], s["timeout_ms"])


def _console():
    from rich.console import Console
    out = sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    return Console(file=out, width=None if tty else PIPE_WIDTH, markup=False, highlight=False, emoji=False,
                   soft_wrap=False)


def _table(title: Optional[str], columns: list, rows: list, right: tuple = ()):
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=False, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def _emit(data: Any, render: Callable) -> None:
    """``--json``: ``data`` as JSON; else ``render(console)``."""
    if _settings()["json"]:
        from rmq.client.admin import to_jsonable
        click.echo(json.dumps(to_jsonable(data), indent=2, ensure_ascii=False))
    else:
        render(_console())


def fmt_ts(ms: int) -> str:
    """ms since the epoch -> local ``yyyy-MM-dd HH:mm:ss.SSS`` ("" for 0 / negative)."""
    if not ms or ms <= 0:
        return ""
    return f"{_dt.datetime.fromtimestamp(ms // 1000):%Y-%m-%d %H:%M:%S}.{ms % 1000:03d}"


def parse_timestamp(text: str) -> int:
    """``now`` | ms since the epoch | ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time, RocketMQ) | ISO 8601 -> ms.

    Raises
    ------
    click.ClickException
        Anything else (exit code 1).
    """
    s = text.strip()
    if s.lower() == "now":
        return int(time.time() * 1000)
    if re.fullmatch(r"\d{1,16}", s):
        return int(s)
    for parse in (lambda x: _dt.datetime.strptime(x, "%Y-%m-%d#%H:%M:%S:%f"),
                  lambda x: _dt.datetime.strptime(x, "%Y-%m-%d#%H:%M:%S"), _dt.datetime.fromisoformat):
        try:
            d = parse(s)
        except ValueError:
            continue
        # whole seconds + milliseconds in integers: no float rounding of the ms part
        return int(d.replace(microsecond=0).timestamp()) * 1000 + d.microsecond // 1000
    raise click.ClickException(f"bad timestamp {text!r}: expected 'now', milliseconds since the epoch, "
                               f"or yyyy-MM-dd#HH:mm:ss:SSS (e.g. 2024-05-01#13:45:00:000)")


def _perm_str(perm: int) -> str:
    return f"{perm} ({'R' if perm & 4 else '-'}{'W' if perm & 2 else '-'})"


def _short(text: str, n: int = LIST_BODY_CHARS) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[:n - 1] + "…"


def _render_message(console, m) -> None:
    rows = [("Message ID", m.msg_id), ("Offset Message ID", m.offset_msg_id), ("Topic", m.topic),
            ("Tags", m.tags), ("Keys", " ".join(m.keys)), ("Broker Name", m.broker_name), ("Queue ID", m.queue_id),
            ("Queue Offset", m.queue_offset), ("CommitLog Offset", m.commitlog_offset),
            ("Reconsume Times", m.reconsume_times), ("Born Timestamp", fmt_ts(m.born_timestamp)),
            ("Store Timestamp", fmt_ts(m.store_timestamp)), ("Born Host", m.born_host),
            ("Store Host", m.store_host), ("System Flag", m.sys_flag), ("Store Size", m.store_size),
            ("Properties", json.dumps(m.properties, ensure_ascii=False, sort_keys=True)),
            ("Message Body", m.body_text)]
    console.print(_table(None, ["Field", "Value"], rows))


def _render_messages(console, title: str, msgs: list) -> None:
    console.print(_table(title, ["Message ID", "Broker Name", "QID", "Queue Offset", "Tags", "Keys",
                                 "Store Time", "Body"],
                         [(m.msg_id, m.broker_name, m.queue_id, m.queue_offset, m.tags, " ".join(m.keys),
                           fmt_ts(m.store_timestamp), _short(m.body_text)) for m in msgs],
                         right=("QID", "Queue Offset")))


# -- topics ------------------------------------------------------------------------------------------
@_command("updateTopic", "update-topic")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-c", "--cluster-name", "cluster", default=None,
              help="Create on every master of this cluster (default: the only cluster).")
@click.option("-b", "--broker-addr", default=None, metavar="HOST:PORT",
              help="Create on this broker only (wins over -c).")
@click.option("-r", "--read-queue-nums", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-w", "--write-queue-nums", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-p", "--perm", type=click.IntRange(0, 15), default=6, show_default=True,
              help="Permission: 2 = write, 4 = read, 6 = read + write.")
@click.option("-o", "--order", type=click.BOOL, default=False, show_default=True, metavar="true|false",
              help="Ordered topic.")
def update_topic(topic, cluster, broker_addr, read_queue_nums, write_queue_nums, perm, order) -> None:
    """Create or update a topic on a broker (-b) or on every master of a cluster (-c).

    JSON: {"topic", "brokers": [{"broker_name", "broker_addr", "topic", "read_queue_nums",
    "write_queue_nums", "perm", "order"}]}
    """
    with _client() as a:
        res = a.create_topic(topic, read_queue_nums, write_queue_nums, perm, order, cluster, broker_addr)
    _emit({"topic": topic, "brokers": res}, lambda c: c.print(_table(
        f"topic {topic} created / updated", ["Broker Name", "Broker Addr", "Topic", "Read Queues", "Write Queues",
                                             "Perm", "Order"],
        [(u.broker_name, u.broker_addr, u.topic, u.read_queue_nums, u.write_queue_nums, _perm_str(u.perm),
          str(u.order).lower()) for u in res], right=("Read Queues", "Write Queues"))))


@_command("deleteTopic", "delete-topic")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-c", "--cluster-name", "cluster", default=None,
              help="Delete on every master of this cluster (default: the brokers of the topic's route).")
def delete_topic(topic, cluster) -> None:
    """Delete a topic from its brokers and from every NameServer.

    JSON: {"topic", "broker_addrs": [...], "namesrv_addrs": [...]}
    """
    with _client() as a:
        res = a.delete_topic(topic, cluster)
    _emit(res, lambda c: c.print(_table(f"topic {topic} deleted", ["Where", "Address"],
                                        [("broker", x) for x in res.broker_addrs]
                                        + [("nameserver", x) for x in res.namesrv_addrs])))


@_command("topicList", "topic-list")
def topic_list() -> None:
    """List every topic the NameServer knows.

    JSON: {"topics": [...]}
    """
    with _client() as a:
        topics = a.topic_list()
    _emit({"topics": topics}, lambda c: c.print(_table(f"{len(topics)} topics", ["Topic"], [(t,) for t in topics])))


@_command("topicRoute", "topic-route")
@click.option("-t", "--topic", required=True, help="Topic name.")
def topic_route(topic) -> None:
    """Show a topic's route: its broker groups (addresses) and queue counts / permission.

    JSON: {"topic", "queue_datas": [{"broker_name", "read_queue_nums", "write_queue_nums", "perm",
    "topic_sys_flag"}], "broker_datas": [{"cluster", "broker_name", "broker_addrs": {id: addr}}]}
    """
    with _client() as a:
        r = a.topic_route(topic)

    def render(c):
        c.print(_table(f"brokers of topic {topic}", ["Cluster", "Broker Name", "Broker ID", "Broker Addr"],
                       [(b.cluster, b.broker_name, bid, addr) for b in r.broker_datas
                        for bid, addr in sorted(b.broker_addrs.items())]))
        c.print(_table(f"queues of topic {topic}", ["Broker Name", "Read Queues", "Write Queues", "Perm",
                                                     "Topic Sys Flag"],
                       [(q.broker_name, q.read_queue_nums, q.write_queue_nums, _perm_str(q.perm), q.topic_sys_flag)
                        for q in r.queue_datas], right=("Read Queues", "Write Queues")))
    _emit(r, render)


@_command("topicStatus", "topic-status")
@click.option("-t", "--topic", required=True, help="Topic name.")
def topic_status(topic) -> None:
    """Per broker and queue: min offset, max offset and the store time of the last message.

    JSON: {"topic", "queues": [{"broker_name", "queue_id", "min_offset", "max_offset",
    "last_update_timestamp"}]}
    """
    with _client() as a:
        rows = a.topic_status(topic)
    _emit({"topic": topic, "queues": rows}, lambda c: c.print(_table(
        f"status of topic {topic}", ["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"],
        [(s.broker_name, s.queue_id, s.min_offset, s.max_offset, fmt_ts(s.last_update_timestamp)) for s in rows],
        right=("QID", "Min Offset", "Max Offset"))))


# -- cluster / broker ---------------------------------------------------------------------------------
CLUSTER_COLUMNS = ["Cluster Name", "Broker Name", "BID", "Addr", "Role", "Version", "InTPS", "OutTPS", "Put Total",
                   "Get Total", "CommitLog Max Offset", "HA Ack Offset", "HA Lag (bytes)", "Boot Time", "Error"]
CLUSTER_RIGHT = ("BID", "InTPS", "OutTPS", "Put Total", "Get Total", "CommitLog Max Offset", "HA Ack Offset",
                 "HA Lag (bytes)")
HA_KEYS = ("brokerRole", "brokerId", "haEpoch", "haMasterAddress", "haConnected", "haSlaveAckOffset",
           "commitLogMaxOffset")
HA_SLAVE_COLUMNS = ["Slave Addr", "BID", "Ack Offset", "Lag (bytes)", "Last Ack"]


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def cluster_rows(brokers: list) -> list:
    """Table rows of ``clusterList`` (one per :class:`rmq.client.admin.BrokerInfo`, columns
    :data:`CLUSTER_COLUMNS`); a slave's ack offset and lag are blank when unknown, a master's
    always (its lag is 0 by definition)."""
    rows = []
    for b in brokers:
        slave = getattr(b, "broker_role", "") == "SLAVE"
        ack = getattr(b, "ha_ack_offset", -1)
        lag = getattr(b, "ha_lag_bytes", -1)
        rows.append((b.cluster, b.broker_name, b.broker_id, b.broker_addr, getattr(b, "broker_role", ""), b.version,
                     f"{b.put_tps:.2f}", f"{b.get_tps:.2f}", b.put_message_total, b.get_message_total,
                     b.commitlog_max_offset, ack if slave and ack >= 0 else "", lag if slave and lag >= 0 else "",
                     fmt_ts(b.boot_timestamp), b.error))
    return rows


def ha_rows(status: dict) -> list:
    """``(key, value)`` rows of the HA keys present in a runtime table (:data:`HA_KEYS` order)."""
    return [(k, _fmt_value(status[k])) for k in HA_KEYS if k in status]


def ha_slave_rows(status: dict) -> list:
    """Rows of a master's ``haSlaves`` (columns :data:`HA_SLAVE_COLUMNS`; offsets in bytes)."""
    rows = []
    for e in status.get("haSlaves") or []:
        if isinstance(e, dict):
            rows.append((e.get("slaveAddr", ""), _fmt_value(e.get("brokerId")), _fmt_value(e.get("ackOffset")),
                         _fmt_value(e.get("lagBytes")), fmt_ts(int(e.get("lastAckMs") or 0))))
    return rows


def status_rows(status: dict) -> list:
    """``(key, value)`` rows of a runtime table, sorted, without ``haSlaves`` (its own table)."""
    return sorted((k, _fmt_value(v)) for k, v in status.items() if k != "haSlaves")


def render_broker_status(console, broker_addr: str, status: dict) -> None:
    """brokerStatus of one broker: every key, then the HA keys and the master's slaves."""
    console.print(_table(f"broker {broker_addr}", ["Key", "Value"], status_rows(status)))
    ha = ha_rows(status)
    if ha:
        console.print(_table(f"HA of broker {broker_addr}", ["Key", "Value"], ha))
    slaves = ha_slave_rows(status)
    if slaves or "haSlaves" in status:
        console.print(_table(f"slaves of broker {broker_addr}", HA_SLAVE_COLUMNS, slaves,
                             right=("BID", "Ack Offset", "Lag (bytes)")))


@_command("clusterList", "cluster-list")
@click.option("-c", "--cluster-name", "cluster", default=None, help="Only this cluster.")
def cluster_list(cluster) -> None:
    """List clusters and their brokers with runtime stats (role, TPS, totals, CommitLog size,
    and for a slave the CommitLog bytes its master saw acknowledged and its lag in bytes).

    JSON: {"brokers": [{"cluster", "broker_name", "broker_id", "broker_addr", "version", "put_tps",
    "get_tps", "put_message_total", "get_message_total", "commitlog_max_offset", "boot_timestamp",
    "runtime": {...}, "error", "broker_role", "ha_epoch", "ha_master_address", "ha_connected",
    "ha_ack_offset", "ha_lag_bytes", "ha_slave_count"}]}  (-1 / null when unknown)
    """
    with _client() as a:
        rows = a.cluster_list(cluster)
    _emit({"brokers": rows}, lambda c: c.print(_table("clusters", CLUSTER_COLUMNS, cluster_rows(rows),
                                                      right=CLUSTER_RIGHT)))


@_command("brokerStatus", "broker-status")
@click.option("-b", "--broker-addr", default=None, metavar="HOST:PORT", help="Broker address.")
@click.option("-c", "--cluster-name", "cluster", default=None, help="Every master of this cluster.")
def broker_status(broker_addr, cluster) -> None:
    """Show a broker's runtime info (-b), or that of every master of a cluster (-c), with its HA
    state (brokerRole, brokerId, haEpoch, haMasterAddress, haConnected, haSlaveAckOffset, and a
    master's slaves: ack offset and lag in bytes).

    JSON: {"brokers": [{"broker_addr", "status": {runtime key: value}}]}
    """
    if not broker_addr and not cluster:
        raise click.ClickException("give a broker address (-b HOST:PORT) or a cluster (-c NAME)")
    with _client() as a:
        addrs = [broker_addr] if broker_addr else a.cluster_broker_addrs(cluster)
        res = [{"broker_addr": addr, "status": a.broker_status(addr)} for addr in addrs]

    def render(c):
        for r in res:
            render_broker_status(c, r["broker_addr"], r["status"])
    _emit({"brokers": res}, render)


@_command("updateBrokerConfig", "update-broker-config")
@click.option("-b", "--broker-addr", required=True, metavar="HOST:PORT", help="Broker address.")
@click.option("-k", "--key", required=True, help="Property name (the broker accepts an allow-list at runtime).")
@click.option("-v", "--value", required=True, help="Property value.")
def update_broker_config(broker_addr, key, value) -> None:
    """Set one broker property at runtime (UPDATE_BROKER_CONFIG).  ``-k brokerRole -v ASYNC_MASTER``
    on a slave promotes it (with brokerId 0); promoteSlave checks its role first.

    JSON: {"broker_addr", "updated": {key: value}}
    """
    with _client() as a:
        a.update_broker_config(broker_addr, {key: value})
    _emit({"broker_addr": broker_addr, "updated": {key: value}},
          lambda c: c.print(f"update broker config success, {broker_addr}: {key}={value}"))


@_command("getBrokerConfig", "get-broker-config")
@click.option("-b", "--broker-addr", required=True, metavar="HOST:PORT", help="Broker address.")
def get_broker_config(broker_addr) -> None:
    """Show a broker's configuration (GET_BROKER_CONFIG).

    JSON: {"broker_addr", "config": {key: str value}}
    """
    with _client() as a:
        config = a.get_broker_config(broker_addr)
    _emit({"broker_addr": broker_addr, "config": config},
          lambda c: c.print(_table(f"config of broker {broker_addr}", ["Key", "Value"], sorted(config.items()))))


@_command("promoteSlave", "promote-slave")
@click.option("-b", "--broker-addr", required=True, metavar="HOST:PORT", help="Address of the SLAVE broker.")
@click.option("--role", type=click.Choice(["ASYNC_MASTER", "SYNC_MASTER"], case_sensitive=False),
              default="ASYNC_MASTER", show_default=True, help="Role of the promoted broker.")
@click.option("-w", "--wait-ms", type=click.IntRange(1, 3_600_000), default=60_000, show_default=True,
              help="How long to wait for the broker to catch up and switch, ms.")
def promote_slave(broker_addr, role, wait_ms) -> None:
    """Manual failover: make a SLAVE the master (brokerId 0) of its group.  The broker first
    applies what it received from the old master; it then re-registers with the NameServer and
    clients move to it at their next route refresh.  Fails if the broker is not a SLAVE.

    JSON: {"broker_addr", "role", "status": {runtime key: value after the switch}}
    """
    role = role.upper()
    with _client() as a:
        status = a.promote_slave(broker_addr, role, wait_ms)

    def render(c):
        c.print(f"broker {broker_addr} promoted to {status.get('brokerRole', role)}")
        ha = ha_rows(status)
        if ha:
            c.print(_table(f"HA of broker {broker_addr}", ["Key", "Value"], ha))
    _emit({"broker_addr": broker_addr, "role": role, "status": status}, render)


# -- controller mode (RocketMQ 5) ------------------------------------------------------------------------
_CONTROLLER_OPT = click.option("-a", "--controller-addr", "controller_addr", required=True, metavar="HOST:PORT",
                               help="Address of a controller (rmq controller --listen-port).")


def _replica_rows(name: str, d: dict) -> list:
    rows = []
    for r in sorted(d.get("replicas") or [], key=lambda r: r.get("brokerId", 0)):
        rid = r.get("brokerId")
        rows.append([name, rid, r.get("brokerAddress"), "MASTER" if rid == d.get("masterBrokerId") else "replica",
                     "yes" if r.get("inSyncStateSet") else "no", "yes" if r.get("alive") else "no",
                     r.get("lastHeartbeatAgoMs"), r.get("epoch"), r.get("maxOffset")])
    return rows


@_command("getSyncStateSet", "get-sync-state-set")
@_CONTROLLER_OPT
@click.option("-b", "--broker-name", "broker_names", multiple=True,
              help="Broker set (brokerName); repeatable (default: every set the controller knows).")
def get_sync_state_set(controller_addr, broker_names) -> None:
    """The master, master epoch and SyncStateSet of broker sets, with each replica's liveness, epoch
    and CommitLog end as the controller sees them (CONTROLLER_GET_SYNC_STATE_DATA).

    JSON: {brokerName: {"masterBrokerId", "masterAddress", "masterEpoch", "syncStateSet",
    "syncStateSetEpoch", "replicas": [{"brokerId", "brokerAddress", "alive", "lastHeartbeatAgoMs",
    "epoch", "maxOffset", "inSyncStateSet"}]}}
    """
    with _client() as a:
        data = a.get_sync_state_set(controller_addr, list(broker_names) or None)

    def render(c):
        c.print(_table(f"broker sets of controller {controller_addr}",
                       ["Broker set", "Master id", "Master", "Master epoch", "SyncStateSet", "SyncStateSet epoch"],
                       [[n, d.get("masterBrokerId"), d.get("masterAddress"), d.get("masterEpoch"),
                         ",".join(str(x) for x in d.get("syncStateSet") or []), d.get("syncStateSetEpoch")]
                        for n, d in sorted(data.items())]))
        rows = [row for n, d in sorted(data.items()) for row in _replica_rows(n, d)]
        c.print(_table("replicas", ["Broker set", "Id", "Address", "Role", "In sync", "Alive", "Heartbeat ago ms",
                                    "Epoch", "Max offset"], rows, right=("Heartbeat ago ms", "Epoch", "Max offset")))
    _emit(data, render)


@_command("getControllerMetaData", "get-controller-metadata")
@_CONTROLLER_OPT
def get_controller_metadata(controller_addr) -> None:
    """The controller group as one controller sees it: itself, the Raft leader, the peers
    (CONTROLLER_GET_METADATA_INFO).

    JSON: {"controllerAddress", "leaderAddress", "isLeader", "peers", ...}
    """
    with _client() as a:
        meta = a.get_controller_metadata(controller_addr)
    _emit(meta, lambda c: c.print(_table(f"controller {controller_addr}", ["Key", "Value"],
                                         [[k, ",".join(map(str, v)) if isinstance(v, list) else v]
                                          for k, v in sorted(meta.items())])))


@_command("electMaster", "elect-master")
@_CONTROLLER_OPT
@click.option("-N", "--broker-name", required=True,
              help="Broker set (brokerName; mqadmin's -n, which is --namesrv-addr here).")
@click.option("-b", "--broker-addr", default=None, metavar="HOST:PORT", help="Elect the replica at this address.")
@click.option("-i", "--broker-id", type=click.IntRange(1, 2 ** 31 - 1), default=None,
              help="Elect the replica with this id.")
def elect_master(controller_addr, broker_name, broker_addr, broker_id) -> None:
    """Manual override of controller mode: elect a master of a broker set now, a given replica
    (alive and in the SyncStateSet) or the controller's choice (CONTROLLER_ELECT_MASTER).  The
    brokers switch roles at their next heartbeat.

    JSON: {"masterBrokerId", "masterAddress", "masterEpoch", "syncStateSet", "syncStateSetEpoch", ...}
    """
    with _client() as a:
        info = a.elect_master(controller_addr, broker_name, broker_id=broker_id, broker_addr=broker_addr)
    _emit(info, lambda c: c.print(f"elected master of {broker_name}: replica {info.get('masterBrokerId')} at "
                                  f"{info.get('masterAddress')}, epoch {info.get('masterEpoch')}, SyncStateSet "
                                  f"{info.get('syncStateSet')}"))


# -- consumers -----------------------------------------------------------------------------------------
@_command("consumerProgress", "consumer-progress")
@click.option("-g", "--group", "group", required=True, help="Consumer group.")
@click.option("-t", "--topic", default=None, help="Only this topic (default: every topic the group consumed).")
def consumer_progress(group, topic) -> None:
    """Per queue: broker offset, the group's consumer offset and the difference (lag).

    JSON: {"group", "total_diff", "queues": [{"topic", "broker_name", "queue_id", "broker_offset",
    "consumer_offset", "diff", "last_timestamp", "lag_timestamp", "inflight"}]}  (lag_timestamp: store time of
    the first message not consumed yet, 0 when nothing is behind; inflight: messages a POP group
    (SimpleConsumer) received and has not acked; for POP groups the consumer offset is the pop offset)
    """
    with _client() as a:
        p = a.consumer_progress(group, topic)

    def render(c):
        c.print(_table(f"progress of consumer group {group}",
                       ["Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff", "Inflight",
                        "LastTime"],
                       [(q.topic, q.broker_name, q.queue_id, q.broker_offset, q.consumer_offset, q.diff,
                         q.inflight, fmt_ts(q.last_timestamp)) for q in p.queues],
                       right=("QID", "Broker Offset", "Consumer Offset", "Diff", "Inflight")))
        c.print(f"Diff Total: {p.total_diff}")
    _emit({"group": p.group, "total_diff": p.total_diff, "queues": p.queues}, render)


@_command("resetOffsetByTime", "reset-offset-by-time")
@click.option("-g", "--group", "group", required=True, help="Consumer group.")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-s", "--timestamp", "timestamp", required=True, metavar="now|MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
              help="Reset to the first message stored at or after this time (local time).")
@click.option("-f", "--force", type=click.BOOL, default=True, show_default=True, metavar="true|false",
              help="false: only move offsets backwards.")
def reset_offset_by_time(group, topic, timestamp, force) -> None:
    """Reset a consumer group's offsets of a topic to a point in time (stop its consumers first).

    JSON: {"group", "topic", "timestamp", "force", "online_consumers": [...], "queues": [{"topic",
    "broker_name", "queue_id", "broker_offset", "consumer_offset", "timestamp_offset", "reset_offset",
    "updated"}]}
    """
    ts = parse_timestamp(timestamp)
    with _client() as a:
        online = a.consumer_connection(group)
        rows = a.reset_offset_by_time(group, topic, ts, force)
    if online:
        click.echo(f"warning: consumer group {group} has online consumers ({', '.join(online)}); they may "
                   f"commit their in-memory offsets over the reset; restart them", err=True)

    def render(c):
        c.print(_table(f"offsets of {group} on {topic} reset to {ts} ms ({fmt_ts(ts) or 'epoch'})",
                       ["Broker Name", "QID", "Broker Offset", "Consumer Offset", "Timestamp Offset",
                        "Reset Offset", "Updated"],
                       [(r.broker_name, r.queue_id, r.broker_offset, r.consumer_offset, r.timestamp_offset,
                         r.reset_offset, str(r.updated).lower()) for r in rows],
                       right=("QID", "Broker Offset", "Consumer Offset", "Timestamp Offset", "Reset Offset")))
    _emit({"group": group, "topic": topic, "timestamp": ts, "force": force, "online_consumers": online,
           "queues": rows}, render)


# -- messages ----------------------------------------------------------------------------------------
@_command("queryMsgById", "query-msg-by-id")
@click.option("-i", "--msg-id", "msg_id", required=True,
              help="Offset message id or unique key (UNIQ_KEY); several separated by commas.")
@click.option("-t", "--topic", default=None, help="Topic of a unique key (default: search every topic).")
def query_msg_by_id(msg_id, topic) -> None:
    """Look a message up by id: an offset id is decoded to broker + CommitLog offset; a unique
    key is searched in the index.

    Each message is followed by its track: which groups consumed it (RocketMQ's MessageTrack).

    JSON: {"messages": [{"topic", "msg_id", "offset_msg_id", "broker_name", "queue_id", "queue_offset",
    "commitlog_offset", "tags", "keys", "body", "body_base64", "properties", "born_timestamp",
    "store_timestamp", "born_host", "store_host", "reconsume_times", "sys_flag", "flag", "store_size",
    "body_crc"}], "tracks": [[{"consumer_group", "track_type", "online", "consumer_offset"}], one list a
    message]}
    """
    ids = [x.strip() for x in msg_id.split(",") if x.strip()]
    if not ids:
        raise click.ClickException("no message id given")
    with _client() as a:
        msgs = [m for i in ids for m in a.query_msg_by_id(i, topic)]
        tracks = a.message_tracks(msgs)

    def render(c):
        for m, tr in zip(msgs, tracks):
            _render_message(c, m)
            c.print(_table(f"message track of {m.msg_id}", ["Consumer Group", "Track Type", "Online",
                                                             "Consumer Offset"],
                           [(t.consumer_group, t.track_type, str(t.online).lower(), t.consumer_offset) for t in tr]
                           or [("-", "no group consumes this topic", "", "")], right=("Consumer Offset",)))
    _emit({"messages": msgs, "tracks": tracks}, render)


@_command("queryMsgTraceById", "query-msg-trace-by-id")
@click.option("-i", "--msg-id", "msg_id", required=True, help="Message id (the UNIQ_KEY clients report).")
@click.option("-t", "--trace-topic", "trace_topic", default=None,
              help="Trace topic (default: RMQ_SYS_TRACE_TOPIC).")
def query_msg_trace_by_id(msg_id, trace_topic) -> None:
    """The life of a message from its trace (producers and consumers with enable_msg_trace):
    when and by whom it was sent, where it was stored and how long that took; which groups and
    clients consumed it, when, how long the listener took, with what result, on which retry.

    JSON: {"msg_id", "trace": [{"trace_type", "group", "client_host", "time_ms", "cost_ms", "status",
    "topic", "msg_id", "offset_msg_id", "tags", "keys", "store_host", "retry_times", "request_id"}]}
    """
    with _client() as a:
        views = a.query_msg_trace_by_id(msg_id.strip(), trace_topic)

    def render(c):
        pubs = [v for v in views if v.trace_type != "Sub"]
        subs = [v for v in views if v.trace_type == "Sub"]
        c.print(_table(f"message trace of {msg_id}: sent",
                       ["Type", "Producer Group", "Client Host", "Send Time", "Cost (ms)", "Status", "Topic",
                        "Tags", "Keys", "Store Host"],
                       [(v.trace_type, v.group, v.client_host, fmt_ts(v.time_ms), v.cost_ms, v.status, v.topic,
                         v.tags, v.keys, v.store_host) for v in pubs] or [("-", "no send traced", "", "", "", "", "",
                                                                            "", "", "")],
                       right=("Cost (ms)",)))
        c.print(_table(f"message trace of {msg_id}: consumed",
                       ["Consumer Group", "Client Host", "Consume Time", "Cost (ms)", "Status", "Retry Times"],
                       [(v.group, v.client_host, fmt_ts(v.time_ms), v.cost_ms, v.status, v.retry_times)
                        for v in subs] or [("-", "no consumption traced", "", "", "", "")],
                       right=("Cost (ms)", "Retry Times")))
    _emit({"msg_id": msg_id, "trace": views}, render)


@_command("queryMsgByKey", "query-msg-by-key")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-k", "--msg-key", "key", required=True, help="Message key (KEYS).")
@click.option("-m", "--max-num", type=click.IntRange(1, 64), default=32, show_default=True)
@click.option("-b", "--begin-timestamp", default=None, metavar="TIME", help="Stored at or after (default: 0).")
@click.option("-e", "--end-timestamp", default=None, metavar="TIME", help="Stored at or before (default: now).")
def query_msg_by_key(topic, key, max_num, begin_timestamp, end_timestamp) -> None:
    """Look messages up by key in the index of every broker of the topic.

    JSON: {"topic", "key", "messages": [message, see queryMsgById]}
    """
    begin = parse_timestamp(begin_timestamp) if begin_timestamp else 0
    end = parse_timestamp(end_timestamp) if end_timestamp else None
    with _client() as a:
        msgs = a.query_msg_by_key(topic, key, max_num, begin, end)
    _emit({"topic": topic, "key": key, "messages": msgs},
          lambda c: _render_messages(c, f"{len(msgs)} messages of topic {topic} with key {key}", msgs))


@_command("queryMsgByOffset", "query-msg-by-offset")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-b", "--broker-name", required=True, help="Broker name.")
@click.option("-i", "--queue-id", type=click.IntRange(0, 1023), required=True, help="Queue id.")
@click.option("-o", "--offset", type=click.IntRange(0), required=True, help="Queue offset.")
def query_msg_by_offset(topic, broker_name, queue_id, offset) -> None:
    """Read the message at a queue offset of a topic / broker / queue.

    JSON: {"messages": [message, see queryMsgById]}
    """
    with _client() as a:
        m = a.query_msg_by_offset(topic, broker_name, queue_id, offset)
    _emit({"messages": [m]}, lambda c: _render_message(c, m))


@_command("sendMessage", "send-message")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-p", "--body", required=True, help="Message body (UTF-8 text).")
@click.option("-k", "--keys", default=None, help="Message keys, space separated.")
@click.option("-c", "--tags", default=None, help="Message tag.")
@click.option("-b", "--broker-name", default=None, help="Send to this broker.")
@click.option("-i", "--queue-id", type=click.IntRange(0, 1023), default=None, help="Send to this queue.")
def send_message(topic, body, keys, tags, broker_name, queue_id) -> None:
    """Send one test message.

    JSON: {"status", "msg_id", "offset_msg_id", "topic", "broker_name", "queue_id", "queue_offset"}
    """
    with _client() as a:
        r = a.send_message(topic, body, tags=tags, keys=keys.split() if keys else None, broker_name=broker_name,
                           queue_id=queue_id)
    _emit(r, lambda c: c.print(_table(f"sent to {topic}", ["Broker Name", "QID", "Queue Offset", "Send Result",
                                                          "MsgId", "Offset MsgId"],
                                      [(r.message_queue.broker_name, r.queue_id, r.queue_offset, r.status.value,
                                        r.msg_id, r.offset_msg_id)], right=("QID", "Queue Offset"))))


@_command("consumeMessage", "consume-message")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-g", "--group", "group", default=None,
              help="Consumer group: start at its offsets (default: the min offsets, as TOOLS_CONSUMER).")
@click.option("-b", "--broker-name", default=None, help="Only this broker.")
@click.option("-i", "--queue-id", type=click.IntRange(0, 1023), default=None, help="Only this queue.")
@click.option("-o", "--offset", type=click.IntRange(0), default=None, help="Start at this queue offset.")
@click.option("-c", "--count", "count", type=click.IntRange(1, 100_000), default=128, show_default=True,
              help="Messages to read at most.")
def consume_message(topic, group, broker_name, queue_id, offset, count) -> None:
    """Read messages of a topic (nothing is committed).

    JSON: {"topic", "group", "messages": [message, see queryMsgById]}
    """
    with _client() as a:
        msgs = a.consume_message(topic, group, queue_id, offset, count, broker_name)
    _emit({"topic": topic, "group": group, "messages": msgs},
          lambda c: _render_messages(c, f"{len(msgs)} messages of topic {topic}", msgs))


@_command("resendMessage", "resend-message")
@click.option("-i", "--msg-id", "msg_id", required=True, help="Offset message id or unique key (UNIQ_KEY).")
@click.option("-g", "--group", "group", required=True, help="The consumer group to deliver it to again.")
@click.option("-t", "--topic", default=None, help="Topic of a unique key (default: search every topic).")
def resend_message(msg_id, group, topic) -> None:
    """Deliver a stored message again to one consumer group only (through its %RETRY% topic, as a
    consumer's send-back does, without the delay); other groups are not touched.

    JSON: {"group", "msg_id", "result": {"status", "msg_id", "offset_msg_id", "topic", "broker_name",
    "queue_id", "queue_offset"}}
    """
    with _client() as a:
        found = a.query_msg_by_id(msg_id, topic)
        r = a.resend_to_group(found[0], group)
    _emit({"group": group, "msg_id": msg_id, "result": r},
          lambda c: c.print(f"resent {msg_id} to group {group}: {r.status.value}, {r.message_queue.topic} "
                            f"queue {r.message_queue.queue_id} offset {r.queue_offset}"))


# -- statistics ----------------------------------------------------------------------------------------
@_command("statsAll", "stats-all")
@click.option("-a", "--active-topic", "active", is_flag=True, help="Only topics with traffic in the last 24 hours.")
@click.option("-t", "--topic", default=None, help="Only this topic.")
def stats_all(active, topic) -> None:
    """Per topic and consuming group: accumulation, in / out TPS (last minute) and in / out messages
    (last 24 hours), summed over the masters (RocketMQ's statsAll columns).

    JSON: {"rows": [{"topic", "consumer_group", "accumulation", "in_tps", "out_tps", "in_msg_24h",
    "out_msg_24h"}]}
    """
    with _client() as a:
        rows = a.stats_all(topic, active)
    _emit({"rows": rows}, lambda c: c.print(_table(
        None, ["#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"],
        [(r.topic, r.consumer_group, r.accumulation, f"{r.in_tps:.2f}", f"{r.out_tps:.2f}", r.in_msg_24h,
          r.out_msg_24h) for r in rows],
        right=("#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"))))


@_command("producerConnection", "producer-connection")
@click.option("-g", "--producer-group", "group", default=None, help="Only this producer group.")
def producer_connection(group) -> None:
    """Producers online on the masters (a heartbeat within channelExpiredTimeout), by group.

    JSON: {"producers": [{"producer_group", "client_id", "broker_name", "language", "version",
    "last_update_timestamp"}]}
    """
    with _client() as a:
        rows = a.producer_list(group)
    _emit({"producers": rows}, lambda c: c.print(_table(
        None, ["#Group", "#ClientId", "#Broker", "#Language", "#Version", "#LastHeartbeat"],
        [(p.producer_group, p.client_id, p.broker_name, p.language, p.version, fmt_ts(p.last_update_timestamp))
         for p in rows])))


# -- transactions ----------------------------------------------------------------------------------------
@_command("halfMessages", "half-messages")
@click.option("-b", "--broker", "broker", default=None, help="Only this broker (name or address).")
@click.option("--max-rows", "max_rows", type=click.IntRange(1, 10_000), default=1000, show_default=True,
              help="Rows per broker, oldest first.")
def half_messages(broker, max_rows) -> None:
    """Pending transactions: half messages with no outcome yet, and how often each was checked back.

    JSON: {"pending", "ready", "half_messages": [{"broker_name", "transaction_id", "producer_group",
    "topic", "queue_id", "born_timestamp", "check_times", "queue_offset", "commit_log_offset"}],
    "stats": {broker name: {"halves", "commits", "rollbacks", "discards", "checks", "checksUnsent",
    "endsIgnored", "recommitted"}}}  (ready: false while a broker rebuilds its state after a start)
    """
    with _client() as a:
        h = a.half_messages(broker, max_rows)
    rows = [{"broker_name": r["brokerName"], "transaction_id": r["transactionId"],
             "producer_group": r["producerGroup"], "topic": r["topic"], "queue_id": r["queueId"],
             "born_timestamp": r["bornTimestamp"], "check_times": r["checkTimes"],
             "queue_offset": r["queueOffset"], "commit_log_offset": r["commitLogOffset"]} for r in h["halfMessages"]]

    def render(c):
        c.print(_table(f"pending transactions: {h['pending']}" + ("" if h["ready"] else " (state being rebuilt)"),
                       ["#Broker", "#TransactionId", "#ProducerGroup", "#Topic", "#QID", "#BornTime", "#Checks"],
                       [(r["broker_name"], r["transaction_id"], r["producer_group"], r["topic"], r["queue_id"],
                         fmt_ts(r["born_timestamp"]), r["check_times"]) for r in rows],
                       right=("#QID", "#Checks")))
    _emit({"pending": h["pending"], "ready": h["ready"], "half_messages": rows, "stats": h["stats"]}, render)


# -- timers ----------------------------------------------------------------------------------------------
@_command("pendingTimers", "timers")
@click.option("-b", "--broker", "broker", default=None, help="Only this broker (name or address).")
@click.option("--max-rows", "max_rows", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Rows per broker, soonest first.")
def pending_timers(broker, max_rows) -> None:
    """Timer messages (deliver_time_ms / delay_time_ms) not delivered yet, soonest first.

    JSON: {"total", "ready", "timers": [{"broker_name", "deliver_time_ms", "slot_time_ms", "topic",
    "queue_id", "msg_id", "rolled"}], "brokers": {broker name: {"precisionMs", "readTimeMs",
    "writeTimeMs", "queueOffset", "queueBehind", "slots", "total", "stats"}}}
    """
    with _client() as a:
        t = a.pending_timers(broker, max_rows)
    rows = [{"broker_name": r["brokerName"], "deliver_time_ms": r["deliverTimeMs"], "slot_time_ms": r["slotTimeMs"],
             "topic": r["topic"], "queue_id": r["queueId"], "msg_id": r["msgId"], "rolled": r["rolled"]}
            for r in t["timers"]]

    def render(c):
        c.print(_table(f"pending timers: {t['total']}" + ("" if t["ready"] else " (timer store loading)"),
                       ["#Broker", "#DeliverTime", "#Topic", "#QID", "#MsgId", "#Rolled"],
                       [(r["broker_name"], fmt_ts(r["deliver_time_ms"]), r["topic"], r["queue_id"], r["msg_id"],
                         "yes" if r["rolled"] else "") for r in rows],
                       right=("#QID",)))
    _emit({"total": t["total"], "ready": t["ready"], "timers": rows, "brokers": t["brokers"]}, render)


# -- ACL 1.0 accounts of the remoting proxy (plain_acl.yml) -----------------------------------------------
def _perm_list(text: Optional[str]) -> Optional[list]:
    """mqadmin's ``-t topicA=DENY,topicB=PUB|SUB`` -> ``["topicA=DENY", "topicB=PUB|SUB"]``."""
    if text is None:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


@_command("updateAclConfig", "update-acl-config")
@click.option("-a", "--access-key", "access_key", required=True, help="accessKey (longer than 6 characters).")
@click.option("-s", "--secret-key", "secret_key", default=None,
              help="secretKey (longer than 6 characters; required for a new account).")
@click.option("-w", "--white-remote-address", "white", default=None, metavar="ADDR",
              help="Peers from here pass without a signature: 192.168.1.*, 10.0.0.1-20, 1.1.1.{1,2}, a,b.")
@click.option("-i", "--default-topic-perm", "default_topic_perm", default=None, metavar="PERM",
              help="PUB, SUB, PUB|SUB or DENY for topics not in --topic-perms (unset: DENY).")
@click.option("-u", "--default-group-perm", "default_group_perm", default=None, metavar="PERM",
              help="PUB, SUB, PUB|SUB or DENY for groups not in --group-perms (unset: DENY).")
@click.option("-t", "--topic-perms", "topic_perms", default=None, metavar="T=PERM[,T=PERM]",
              help="Per-topic permissions, e.g. topicA=DENY,topicB=PUB|SUB (replaces the list).")
@click.option("-g", "--group-perms", "group_perms", default=None, metavar="G=PERM[,G=PERM]",
              help="Per-group permissions, e.g. groupA=SUB (replaces the list).")
@click.option("-m", "--admin", "is_admin", type=click.BOOL, is_flag=False, flag_value=True, default=None,
              metavar="[true|false]", help="Admin account (may create / delete topics and groups).")
@click.option("--acl-file", "acl_file", required=True, type=click.Path(dir_okay=False), metavar="PATH",
              help="The proxy's plain_acl.yml (rmq proxy --acl-file; rmq start: aclPlainFile, default "
                   "STORE/config/plain_acl.yml).  Written atomically, mode 0600; a running proxy re-reads it.")
def update_acl_config(access_key, secret_key, white, default_topic_perm, default_group_perm, topic_perms,
                      group_perms, is_admin, acl_file) -> None:
    """Create or update an ACL 1.0 account of the remoting proxy (mqadmin updateAclConfig).

    JSON: {"acl_file", "access_key", "action": "created" | "updated"}
    """
    from rmq.proxy.acl import update_account
    action = update_account(acl_file, access_key, secret_key, white_remote_address=white, admin=is_admin,
                            default_topic_perm=default_topic_perm, default_group_perm=default_group_perm,
                            topic_perms=_perm_list(topic_perms), group_perms=_perm_list(group_perms))
    out = {"acl_file": os.path.abspath(acl_file), "access_key": access_key, "action": action}
    _emit(out, lambda c: c.print(f"{action} accessKey {access_key} in {out['acl_file']}"))


@_command("deleteAclConfig", "delete-acl-config")
@click.option("-a", "--access-key", "access_key", required=True, help="accessKey of the account to delete.")
@click.option("--acl-file", "acl_file", required=True, type=click.Path(dir_okay=False), metavar="PATH",
              help="The proxy's plain_acl.yml.")
def delete_acl_config(access_key, acl_file) -> None:
    """Delete an ACL 1.0 account of the remoting proxy (mqadmin deleteAclConfig); exit code 1 when
    there is none.

    JSON: {"acl_file", "access_key", "deleted": true}
    """
    from rmq.proxy.acl import delete_account
    if not delete_account(acl_file, access_key):
        raise click.ClickException(f"no account with accessKey {access_key} in {acl_file}")
    out = {"acl_file": os.path.abspath(acl_file), "access_key": access_key, "deleted": True}
    _emit(out, lambda c: c.print(f"deleted accessKey {access_key} from {out['acl_file']}"))
