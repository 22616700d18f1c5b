"""``rmq bench produce|consume|e2e|all``."""
from __future__ import annotations

import functools
import os
import time

import click
from rich.console import Console

console = Console(width=220)
FLUSH_CHOICES = ("ASYNC_FLUSH", "SYNC_FLUSH")
ROLE_CHOICES = ("ASYNC_MASTER", "SYNC_MASTER")


def _sizes(ctx, param, value):
    try:
        return tuple(int(s) for s in value.split(",") if s)
    except ValueError:
        raise click.BadParameter("comma list of byte counts, e.g. 100,1024") from None


def _flushes(ctx, param, value):
    out = tuple(v.strip().upper() for v in value.split(",") if v.strip())
    bad = [v for v in out if v not in FLUSH_CHOICES]
    if bad:
        raise click.BadParameter(f"{bad}: choose from {FLUSH_CHOICES}")
    return out


def _roles(ctx, param, value):
    out = []
    for v in (v.strip().upper() for v in value.split(",") if v.strip()):
        if v in ("NONE", "STANDALONE"):
            out.append(None)
        elif v in ROLE_CHOICES:
            out.append(v)
        else:
            raise click.BadParameter(f"{v}: choose from {ROLE_CHOICES} or none")
    return tuple(dict.fromkeys(out)) or (None,)


def common(f):
    opts = [
        click.option("--size", "sizes", default="100,1024", show_default=True, callback=_sizes,
                     help="Message body sizes, bytes (comma list)."),
        click.option("--messages", "-n", type=click.IntRange(1), default=None,
                     help="Messages per scenario (all producers together); default: run for --duration."),
        click.option("--duration", "-d", type=click.FloatRange(0.1), default=5.0, show_default=True,
                     help="Seconds per timed scenario (when --messages is not given)."),
        click.option("--batch", type=click.IntRange(1, 10_000), default=1000, show_default=True,
                     help="Messages per send request (1: SEND_MESSAGE, one per request)."),
        click.option("--linger-ms", type=click.FloatRange(0), default=0.0, show_default=True,
                     help="With --rate: a batch leaves when full or its first message is this old."),
        click.option("--rate", type=click.FloatRange(0), default=0.0, show_default=True,
                     help="Messages/s per producer (0: as fast as acks allow)."),
        click.option("--window", type=click.IntRange(1, 1024), default=4, show_default=True,
                     help="Send requests in flight per producer."),
        click.option("--producers", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="Producer processes."),
        click.option("--consumers", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="Consumer processes."),
        click.option("--queues", type=click.IntRange(1, 1024), default=4, show_default=True,
                     help="Queues of the topic (split among producers / consumers)."),
        click.option("--flush", "flush_types", default="ASYNC_FLUSH,SYNC_FLUSH", show_default=True,
                     callback=_flushes, help="flushDiskType of the broker groups (comma list)."),
        click.option("--broker-role", "broker_roles", default="none", show_default=True, callback=_roles,
                     help="brokerRole of the bench's own broker (comma list): none (a lone broker, no HA), "
                          "ASYNC_MASTER or SYNC_MASTER (the bench starts a slave beside it and reports its CPU "
                          "as slave-*)."),
        click.option("--ha/--no-ha", "ha", default=None,
                     help="The HA section: batched produce and single sends to an ASYNC_MASTER and a SYNC_MASTER "
                          "with a slave (1 KiB), and master -> slave replication MB/s beside raw ZeroMQ "
                          "(default: on for 'all' only)."),
        click.option("--ha-mb", type=click.IntRange(1), default=256, show_default=True,
                     help="MB the HA section's replication figure moves to a fresh slave."),
        click.option("--single-seconds", type=click.FloatRange(0.1), default=1.5, show_default=True,
                     help="Seconds of the single-message (send, wait for the ack) scenario."),
        click.option("--ceiling-seconds", type=click.FloatRange(0.1), default=1.0, show_default=True,
                     help="Seconds per ceiling / peer measurement."),
        click.option("--file-size", type=click.IntRange(1 << 20), default=512 << 20, show_default=True,
                     help="mappedFileSizeCommitLog of the bench's own cluster."),
        click.option("--namesrv", default=None,
                     help="Run against this nameserver's master broker instead of starting a cluster."),
        click.option("--dir", "store_dir", type=click.Path(file_okay=False), default=None,
                     help="Where temporary stores go (default: the system temp dir)."),
        click.option("--ceilings/--no-ceilings", default=None,
                     help="Measure the ceilings in the same run (default: on for 'all' only)."),
        click.option("--peers", "peers", default=None,
                     help="Peers to measure: comma list of redis,nats or 'none' (default: redis,nats for 'all')."),
        click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                     help="Write every figure as JSON to this file."),
        click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                     help="Write throughput over time and the latency CDF to this PNG (matplotlib)."),
        click.option("--no-progress", is_flag=True, help="No live progress line."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.group()
def bench() -> None:
    """Benchmarks: rmq beside the machine's ceilings and peers (Redis Streams, NATS JetStream)."""


def _run(scenarios: tuple, default_extras: bool, **kw) -> None:
    from rmq.bench import ceilings as C
    from rmq.bench import peers as PE
    from rmq.bench import report as R
    from rmq.bench.runner import Opts, opts_dict, run_ha, run_rmq

    o = Opts(sizes=kw["sizes"], flush_types=kw["flush_types"], messages=kw["messages"], duration=kw["duration"],
             batch=kw["batch"], linger_ms=kw["linger_ms"], rate=kw["rate"], window=kw["window"],
             producers=kw["producers"], consumers=kw["consumers"], queues=kw["queues"],
             single_seconds=kw["single_seconds"], ceiling_seconds=kw["ceiling_seconds"], file_size=kw["file_size"],
             namesrv=kw["namesrv"], store_dir=kw["store_dir"], progress=not kw["no_progress"], scenarios=scenarios,
             broker_roles=kw["broker_roles"], ha_mb=kw["ha_mb"])
    o.ha = (default_extras if kw["ha"] is None else kw["ha"]) and not o.namesrv
    if o.namesrv and any(kw["broker_roles"]):
        raise click.UsageError("--broker-role starts a master / slave pair: not with --namesrv")
    want_ceil = default_extras if kw["ceilings"] is None else kw["ceilings"]
    peer_list = kw["peers"] if kw["peers"] is not None else ("redis,nats" if default_extras else "none")
    peer_list = tuple(p for p in peer_list.split(",") if p and p != "none")
    log = functools.partial(console.print, highlight=False)
    t0 = time.monotonic()
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "opts": opts_dict(o), "cpus": os.cpu_count(),
              "loadavg_before": os.getloadavg(), "ceilings": {}, "peers": {}, "rows": []}
    if want_ceil:
        log("[bold]ceilings[/] (memcpy into mmap, append + fdatasync, raw pyzmq loopback):")
        report["ceilings"] = C.measure(o.sizes, o.batch, o.window, o.ceiling_seconds, o.store_dir, log)
    report["rows"] = run_rmq(o, log)
    if o.ha:
        log("[bold]HA[/] (ASYNC_MASTER / SYNC_MASTER with a slave; replication beside raw ZeroMQ):")
        ha = run_ha(o, log)
        report["rows"] += ha.pop("rows")
        report["ha"] = ha
    if peer_list:
        log(f"[bold]peers[/] ({', '.join(peer_list)}):")
        report["peers"] = PE.measure(o.sizes, o.flush_types, o.batch, o.ceiling_seconds, o.single_seconds,
                                     peer_list, o.store_dir, log)
    latency_rates = kw.get("latency_rates") or ()
    if latency_rates:
        from rmq.bench import latency as L
        log(f"[bold]latency[/] (paced, send -> delivery, public API defaults; {', '.join(f'{r:g}' for r in latency_rates)} "
            f"msgs/s):")
        report["latency"] = L.run(rates=latency_rates, sizes=o.sizes, consumers=("push", "poll", "aio"),
                                  peers=("zmq", "redis"), seconds=kw["latency_seconds"], store_dir=o.store_dir,
                                  log=functools.partial(console.print, highlight=False, markup=False))
        report["latency"]["single"] = L.run_single(sizes=o.sizes, peers=("redis",), seconds=kw["latency_seconds"],
                                                   store_dir=o.store_dir,
                                                   log=functools.partial(console.print, highlight=False,
                                                                         markup=False))
    if kw.get("client"):
        from rmq.bench import client as CB
        log(f"[bold]client[/] (the public client API, defaults, one Python thread; {kw['client_messages']:,} messages "
            f"at 100 B, half at larger bodies; beside Redis and the raw bench client):")
        report["client"] = CB.run(messages=kw["client_messages"], sizes=o.sizes, store_dir=o.store_dir,
                                  file_size=o.file_size, redis="redis" in peer_list,
                                  log=functools.partial(console.print, highlight=False, markup=False))
    report["loadavg_after"] = os.getloadavg()
    report["wall_seconds"] = round(time.monotonic() - t0, 1)
    R.annotate(report)
    R.print_report(report, console)
    if report.get("latency"):
        from rmq.bench import latency as L
        L.print_table(report["latency"], console)
    if report.get("client"):
        from rmq.bench import client as CB
        CB.print_table(report["client"], console)
    if kw["json_path"]:
        R.write_json(report, kw["json_path"])
        log(f"wrote {kw['json_path']}")
    if kw["plot_path"]:
        R.plot(report, kw["plot_path"])
        log(f"wrote {kw['plot_path']}")
    failed = [r["scenario"] for r in report["rows"] if r.get("error")] + \
        (["HA replication"] if (report.get("ha") or {}).get("error") else []) + \
        [r["path"] for r in (report.get("latency") or {}).get("rows", [])
         if r.get("error") or r["delivered"] < r["sent"]] + \
        [r["path"] for r in ((report.get("latency") or {}).get("single") or {}).get("rows", []) if r.get("error")]
    if report.get("client"):
        from rmq.bench import client as CB
        failed += CB.failed(report["client"])
    if failed:
        raise SystemExit(1)


@bench.command("produce")
@common
def produce_cmd(**kw) -> None:
    """Produce as fast as acks allow (or at --rate): msgs/s, MB/s, send latency, CPU."""
    _run(("produce",), False, **kw)


@bench.command("consume")
@common
def consume_cmd(**kw) -> None:
    """Fill a topic (untimed), then consume it all: msgs/s, MB/s, lag, CPU."""
    _run(("consume",), False, **kw)


@bench.command("e2e")
@common
def e2e_cmd(**kw) -> None:
    """Producers and consumers at once (consume lag), then single-message round trips."""
    _run(("e2e", "single"), False, **kw)


@bench.command("all")
@common
@click.option("--latency-rates", default="200,5000", show_default=True, callback=lambda c, p, v: _csv(float)(c, p, v),
              help="Paced rates of the latency section (`rmq bench latency` on its own cluster: send -> "
                   "delivery through PushConsumer, PullConsumer.poll, rmq.aio, beside a raw pyzmq relay and "
                   "Redis); 'none' skips it.")
@click.option("--latency-seconds", type=click.FloatRange(0.1), default=3.0, show_default=True,
              help="Seconds of paced sending per latency row.")
@click.option("--client/--no-client", "client", default=True, show_default=True,
              help="The client section (`rmq bench client` on its own cluster: Producer.send_async, send_batch, "
                   "PushConsumer, PullConsumer.poll and rmq.aio, defaults, beside Redis and the raw bench client).")
@click.option("--client-messages", type=click.IntRange(1), default=200_000, show_default=True,
              help="Messages per row of the client section at 100 B (larger bodies: half).")
def all_cmd(**kw) -> None:
    """Ceilings, every rmq scenario (produce, consume, e2e, single) per flush type and size, peers;
    the HA section (ASYNC_MASTER / SYNC_MASTER with a slave, replication MB/s); the latency
    section (one message at a time, send -> delivery); the client section (the public client
    API with its defaults, beside Redis and the raw bench client)."""
    _run(("produce", "consume", "e2e", "single"), True, **kw)


def _csv(kind, choices=None):
    def cb(ctx, param, value):
        out = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
        if kind is float:
            try:
                out = tuple(float(v) for v in out)
            except ValueError:
                raise click.BadParameter("comma list of numbers") from None
            if any(v <= 0 for v in out):
                raise click.BadParameter("rates must be > 0")
        elif choices is not None:
            bad = [v for v in out if v not in choices]
            if bad:
                raise click.BadParameter(f"{bad}: choose from {choices} (or none)")
        return out
    return cb


@bench.command("timers")
@click.option("--timers", "n", type=click.IntRange(1), default=100_000, show_default=True,
              help="Timer messages due within the same second.")
@click.option("--precision", "precision_ms", type=click.Choice(["100", "200", "500", "1000"]), default="1000",
              show_default=True, help="timerPrecisionMs of the embedded broker.")
@click.option("--namesrv", default=None, help="Use this cluster (default: an embedded one on free ports).")
@click.option("--dir", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary store goes (default: the system temp dir).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report as JSON to this file.")
def timers_cmd(n, precision_ms, namesrv, store_dir, json_path) -> None:
    """Timer accuracy: N timers (deliver_time_ms) due within one second; lateness of the re-put
    (broker) and of the listener call, p50 / p99 / max, and how many were early.  Exit code 1
    when the bar (p99 broker lateness <= timerPrecisionMs + 200 ms, none early) is not met."""
    import json

    from rmq.bench import timers as TB
    report = TB.run(n=n, precision_ms=int(precision_ms), namesrv=namesrv, store_dir=store_dir,
                    log=functools.partial(console.print, highlight=False, markup=False))
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["cpus"] = os.cpu_count()
    for line in TB.format_report(report):
        console.print(line, highlight=False, markup=False)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        console.print(f"wrote {json_path}")
    if not report["bar_met"]:
        raise SystemExit(1)


@bench.command("latency")
@click.option("--rates", default="200,5000,50000", show_default=True, callback=_csv(float),
              help="Paced send rates, msgs/s (comma list).")
@click.option("--size", "sizes", default="100,1024", show_default=True, callback=_sizes,
              help="Message body sizes, bytes (comma list).")
@click.option("--consumers", default="push,poll,aio", show_default=True,
              callback=_csv(str, ("push", "poll", "aio")),
              help="Delivery paths: PushConsumer listener, PullConsumer.poll, rmq.aio push listener.")
@click.option("--peers", default="zmq,redis", show_default=True, callback=_csv(str, ("zmq", "redis")),
              help="Measured beside rmq in the same run: raw pyzmq relay, Redis XADD -> XREAD BLOCK.")
@click.option("--duration", "-d", type=click.FloatRange(0.1), default=3.0, show_default=True,
              help="Seconds of paced sending per scenario.")
@click.option("--namesrv", default=None, help="Use this cluster (default: an embedded one on free ports).")
@click.option("--dir", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Where temporary stores go (default: the system temp dir).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every row (with its histogram) as JSON to this file.")
@click.option("--trace", is_flag=True,
              help="Also print where the time goes, hop by hop (client enqueue ... listener call), from "
                   "CLOCK_MONOTONIC stamps taken at each hop (RMQ_LATENCY_TRACE=1 in every process; "
                   "with --namesrv the cluster must have been started with it).")
@click.option("--background", type=click.FloatRange(0), default=0.0, show_default=True,
              help="A bulk load beside each rmq row, msgs/s (Producer.send_batch of 1000 x 100 B from another "
                   "process; 0 = none). Issue 12 measures the paced p99 with 50 %% of `rmq bench produce`'s "
                   "figure here.")
@click.option("--single/--no-single", default=True, show_default=True,
              help="Also Producer.send one at a time (closed loop), ASYNC_FLUSH and SYNC_FLUSH, beside the raw "
                   "pyzmq round trip, Redis one XADD per call and append + fdatasync, with the issue's targets.")
def latency_cmd(rates, sizes, consumers, peers, duration, namesrv, store_dir, json_path, trace, background,
                single) -> None:
    """One message at a time: paced Producer.send_async (defaults) -> SEND_OK and -> delivery
    (listener called / poll returned), p50 / p99 / p99.9 / max, beside a raw pyzmq relay and
    Redis Streams at the same rates; then Producer.send one at a time beside the raw round trip.
    Exit code 1 when a row failed or lost messages."""
    import json

    from rmq.bench import latency as L
    log = functools.partial(console.print, highlight=False, markup=False)
    report = L.run(rates=rates, sizes=sizes, consumers=consumers, peers=peers, seconds=duration, namesrv=namesrv,
                   store_dir=store_dir, log=log, trace=trace, background=background)
    if single:
        report["single"] = L.run_single(sizes=sizes, peers=peers, seconds=duration, namesrv=namesrv,
                                        store_dir=store_dir, log=log)
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["cpus"] = os.cpu_count()
    L.print_table(report, console)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        console.print(f"wrote {json_path}")
    if any(r.get("error") or r["delivered"] < r["sent"] for r in report["rows"]) or \
            any(r.get("error") for r in (report.get("single") or {}).get("rows", [])):
        raise SystemExit(1)


@bench.command("client")
@click.option("--messages", "-n", type=click.IntRange(1), default=200_000, show_default=True,
              help="Messages per row at 100 B (larger bodies: half).")
@click.option("--sizes", "--size", "sizes", default="100,1024", show_default=True, callback=_sizes,
              help="Message body sizes, bytes (comma list).")
@click.option("--redis/--no-redis", default=True, show_default=True,
              help="Measure Redis (pipelined XADD x1000, XREAD COUNT 1000) in the same run, when redis-server "
                   "is installed.")
@click.option("--raw/--no-raw", default=True, show_default=True,
              help="Measure the raw bench client (rmq bench produce / consume's workers) on the same cluster.")
@click.option("--floor/--no-floor", default=True, show_default=True,
              help="Measure this machine's Python floor of send_async's and PushConsumer's per-message calls "
                   "with no I/O (rmq.bench.floor), and hold those rows to it.")
@click.option("--namesrv", default=None, help="Use this cluster (default: an embedded one on free ports).")
@click.option("--file-size", type=click.IntRange(1 << 20), default=None,
              help="mappedFileSizeCommitLog of the embedded cluster (default: about what the run writes, "
                   "64 MiB .. 1 GiB).")
@click.option("--dir", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Where temporary stores go (default: the system temp dir).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every row and reference as JSON to this file.")
@click.option("--rounds", type=click.IntRange(1), default=1, show_default=True,
              help="Run every row this many times, the rounds interleaved, and report each row's median "
                   "round with the spread (this VM's run-to-run noise is 20-30 %%).")
def client_cmd(messages, sizes, redis, raw, floor, namesrv, file_size, store_dir, json_path, rounds) -> None:
    """The public client API with its defaults, one Python thread (issue 17): Producer.send_async,
    Producer.send_batch of 1000, PushConsumer, PullConsumer.poll and poll_arrow, rmq.aio's producer,
    push consumer and pull consumer, both producers' ordered send_async (8 sharding keys), send_async_many (lists of 1000)
    and send_async_columns (the same lists as columns), msgs/s and MB/s per body size, each against
    its target (MET / MISSED) and beside Redis, the raw bench client and this machine's Python floor
    of those calls (no I/O), measured in the same run.  Exit code 1 when a row failed."""
    import json

    from rmq.bench import client as CB
    log = functools.partial(console.print, highlight=False, markup=False)
    report = CB.run(messages=messages, sizes=sizes, namesrv=namesrv, store_dir=store_dir, file_size=file_size,
                    redis=redis, raw=raw, log=log, rounds=rounds, floor=floor)
    CB.print_table(report, console)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        console.print(f"wrote {json_path}")
    if CB.failed(report):
        raise SystemExit(1)
