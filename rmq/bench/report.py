"""Presentation of a ``rmq bench`` run: ratios to ceilings / peers / PERF.md targets, the rich
tables, ``--json`` and ``--plot`` (throughput over time, latency CDF)."""
from __future__ import annotations

import json
import math

from rmq.bench import e2e as E
from rmq.bench.ceilings import pyzmq_lookup
from rmq.bench.hist import Histogram

CEILING_FOR = {"produce": "batch", "e2e": "batch", "consume": "pages", "single": "rtt"}


def _peer(peers: dict, peer: str, kind: str, flush: str, size: int):
    k = "produce" if kind == "e2e" else kind
    for r in peers.get("rows", []):
        # nats-server's file store does not fsync each message: a peer of ASYNC_FLUSH only
        if r["peer"] == peer and r.get("kind") == k and r["body_size"] == size and r["flush"] == flush:
            return r
    return None


def annotate(report: dict) -> None:
    """Put ceiling, peer and target figures beside every rmq row (in place)."""
    ceil, peers = report.get("ceilings") or {}, report.get("peers") or {}
    batch = report["opts"]["batch"]
    for row in report["rows"]:
        kind, flush, size = row["kind"], row["flush"], row["body_size"]
        if not row.get("msgs_per_s"):
            continue
        c = pyzmq_lookup(ceil, CEILING_FOR.get(kind, ""), size)
        if c is not None:
            E.attach_ceiling(row, c, f"pyzmq {CEILING_FOR[kind]}")
        if flush == "SYNC_FLUSH" and kind in ("produce", "e2e"):
            group = batch * (size + 119)
            for s in ceil.get("fdatasync", []):
                if s["group_bytes"] == group:
                    row["fsync_bound_msgs_per_s"] = s["syncs_per_s"] * batch
                    row["ratio_to_fsync_bound"] = row["msgs_per_s"] / row["fsync_bound_msgs_per_s"]
        if "memcpy_mmap" in ceil and kind in ("produce", "e2e"):
            row["ratio_to_memcpy"] = row["mb_per_s"] / ceil["memcpy_mmap"]["mb_per_s"]
        for peer in ("redis", "nats"):
            pr = _peer(peers, peer, kind, flush, size)
            if pr is not None and pr["msgs_per_s"]:
                row[f"{peer}_msgs_per_s"] = pr["msgs_per_s"]
                row[f"x_{peer}"] = row["msgs_per_s"] / pr["msgs_per_s"]
        if kind in ("produce", "consume", "single") and not row.get("broker_role"):   # targets: lone broker
            E.attach_target(row, kind, flush, size)
        if kind == "single" and "redis_msgs_per_s" in row:      # T4 / T5: >= 1.0x redis-py single XADD
            t = "T4" if flush == "ASYNC_FLUSH" else "T5"
            row["target_redis"] = f"{t} >= 1.0x redis-py single XADD"
            row["target_redis_met"] = row["x_redis"] >= 1.0


def _f(v, fmt="{:,.0f}") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v)


def _cpu(cpu: dict) -> str:
    if not cpu:
        return "-"
    order = [k for k in ("broker", "reput", "flush") if k in cpu] + \
        sorted(k for k in cpu if k not in ("broker", "reput", "flush", "others", "broker_main")) + ["others"]
    out = []
    for k in order:
        if k in cpu:
            out.append(f"{k} {cpu[k]:.0f}" + (f" (main {cpu['broker_main']:.0f})" if k == "broker" and "broker_main" in cpu else ""))
    return ", ".join(out)


def print_report(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=220)
    ceil = report.get("ceilings") or {}
    if ceil:
        t = Table(title="Ceilings (measured in this run)", title_justify="left")
        for col in ("ceiling", "body", "msgs/s", "MB/s", "p50 µs", "p99 µs", "CPU % of a core"):
            t.add_column(col, justify="left" if col == "ceiling" else "right")
        m = ceil.get("memcpy_mmap")
        if m:
            t.add_row("memcpy into mmap (pre-touched)", "-", "-", _f(m["mb_per_s"]), "-", "-", "-")
        for s in ceil.get("fdatasync", []):
            t.add_row(f"append {s['group_bytes']:,} B + fdatasync ({s['syncs_per_s']:,.0f} syncs/s)", "-", "-",
                      _f(s["mb_per_s"]), _f(s["p50_us"]), _f(s["p99_us"]), "-")
        for c in ceil.get("pyzmq", []):
            if c["kind"] == "record_bytes":
                continue
            t.add_row(f"pyzmq {c['kind']}", f"{c['body_size']} B", _f(c["msgs_per_s"]), _f(c["mb_per_s"], "{:,.1f}"),
                      _f(c.get("p50_us")), _f(c.get("p99_us")), _cpu(c.get("cpu", {})))
        console.print(t)
    peers = report.get("peers") or {}
    if peers.get("rows") or peers.get("missing"):
        t = Table(title="Peers (started by the bench on loopback, same run)", title_justify="left")
        for col in ("peer", "flush", "body", "test", "msgs/s", "MB/s", "p50 µs", "p99 µs", "p99.9 µs", "max µs",
                    "CPU %"):
            t.add_column(col, justify="left" if col in ("peer", "test", "flush") else "right")
        for r in peers.get("rows", []):
            fl = {"ASYNC_FLUSH": "everysec", "SYNC_FLUSH": "always"}[r["flush"]] if r["peer"] == "redis" else "file"
            t.add_row(r["peer"], fl, f"{r['body_size']} B", r["test"], _f(r["msgs_per_s"]), _f(r["mb_per_s"], "{:,.1f}"),
                      _f(r.get("p50_us")), _f(r.get("p99_us")), _f(r.get("p999_us")), _f(r.get("max_us")),
                      _cpu(r.get("cpu", {})) if r.get("cpu") else "-")
        for name, why in peers.get("missing", {}).items():
            t.add_row(name, "", "", f"[yellow]MISSING: {why}[/]", "-", "-", "-", "-", "-", "-", "-")
        console.print(t)
    ha = report.get("ha") or {}
    if ha.get("replication") or ha.get("error"):
        t = Table(title="HA: master -> slave replication (a fresh slave catching up; same run)", title_justify="left")
        for col in ("figure", "MB", "seconds", "MB/s", "raw ZeroMQ MB/s", "ratio"):
            t.add_column(col, justify="left" if col == "figure" else "right")
        z, rep = ha.get("zmq_ceiling") or {}, ha.get("replication")
        if z:
            t.add_row(f"raw ZeroMQ loopback, {z['frame_bytes']:,} B frames, one pusher", "-", _f(z.get("seconds"), "{:.2f}"),
                      _f(z["MBps"]), "-", "-")
        if rep:
            how = "slave start included: a lower bound" if rep.get("includes_connect") else \
                f"{rep['connect_s']:.2f} s to handshake"
            t.add_row(f"replication ({rep['batch']:,} B haTransferBatchSize; {how})",
                      _f(rep["bytes"] / 1e6), _f(rep["seconds"], "{:.2f}"), _f(rep["MBps"]),
                      _f(z.get("MBps")), f"{rep['ratio_to_zmq']:.1%}" if "ratio_to_zmq" in rep else "-")
        if ha.get("error"):
            t.add_row(f"[red]{ha['error'][:200]}[/]", "-", "-", "-", "-", "-")
        console.print(t)
    t = Table(title="rmq (broker group: nameserver, broker, reput, flush; clients in their own processes)",
              title_justify="left")
    for col in ("scenario", "msgs/s", "MB/s", "send p50/p99/p99.9/max µs", "consumed/s, max lag", "ceiling",
                "ratio", "× redis", "× nats", "target (PERF.md §4)", "CPU % of a core per process"):
        t.add_column(col, justify="left" if col in ("scenario", "target (PERF.md §4)", "CPU % of a core per process",
                                                    "ceiling") else "right")
    for r in report["rows"]:
        lat = "/".join(_f(r.get(k)) for k in ("p50_us", "p99_us", "p999_us", "max_us")) if "p50_us" in r else "-"
        cons = "-"
        if "consume_msgs_per_s" in r:
            cons = f"{r['consume_msgs_per_s']:,.0f}, lag {r['max_lag']:,}"
        elif "max_lag" in r:
            cons = f"lag {r['max_lag']:,} at start"
        ceil_s, ratio = "-", "-"
        if "ceiling" in r:
            ceil_s = f"{r['ceiling']} {_f(r['ceiling_msgs_per_s'])}"
            ratio = f"{r['ratio']:.1%}"
            if "ceiling_p50_us" in r and r["kind"] == "single":
                ceil_s += f" (p50 {r['ceiling_p50_us']:.0f} µs)"
        if "fsync_bound_msgs_per_s" in r:
            ceil_s += f"\n1 fdatasync per batch {_f(r['fsync_bound_msgs_per_s'])}"
            ratio += f"\n{r['ratio_to_fsync_bound']:.1%}"
        if "ratio_to_memcpy" in r:
            ceil_s += f"\nmemcpy {_f(report['ceilings']['memcpy_mmap']['mb_per_s'])} MB/s"
            ratio += f"\n{r['ratio_to_memcpy']:.1%}"
        tgt = []
        for k, m in (("target", "target_met"), ("target_redis", "target_redis_met")):
            if k in r:
                tgt.append(r[k] + (" [green]MET[/]" if r.get(m) else " [red]MISSED[/]"))
        name = r["scenario"] + (" [red](error)[/]" if r.get("error") or r.get("errors") else "")
        t.add_row(name, _f(r.get("msgs_per_s")), _f(r.get("mb_per_s"), "{:,.1f}"), lat, cons, ceil_s, ratio,
                  _f(r.get("x_redis"), "{:.2f}×"), _f(r.get("x_nats"), "{:.2f}×"), "\n".join(tgt) or "-",
                  _cpu(r.get("cpu", {})))
    console.print(t)
    for r in report["rows"]:
        if r.get("error") or r.get("errors"):
            console.print(f"[red]{r['scenario']}: {r.get('error') or r.get('errors')}[/]")
    o = report["opts"]
    console.print(f"batch {o['batch']}, window {o['window']}, linger {o['linger_ms']} ms, producers {o['producers']}, "
                  f"consumers {o['consumers']}, queues {o['queues']}, "
                  + (f"{o['messages']:,} messages" if o["messages"] else f"{o['duration']} s") + " per scenario; "
                  f"load average {report['loadavg_before'][0]:.2f} -> {report['loadavg_after'][0]:.2f}; "
                  f"wall {report['wall_seconds']:.0f} s on {report['cpus']} CPUs. MB = 10^6 B of payload. "
                  "Latency: request sent (or first message created, when paced) -> ack, per message; "
                  "'others' = every other process on the machine.", highlight=False)


def write_json(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(16, 6.5))
    for r in report["rows"]:
        s = r.get("series") or []
        if len(s) < 2:
            continue
        key = "consumed" if r["kind"] == "consume" else "produced"
        xs, ys = [], []
        # workers report every 0.25 s and are sampled every 0.25 s: rate over a 1 s window
        for i in range(1, len(s)):
            a, b = s[max(0, i - 4)], s[i]
            dt = b["t"] - a["t"]
            if dt > 0:
                xs.append(b["t"])
                ys.append((b[key] - a[key]) / dt)
        a1.plot(xs, ys, label=f"{r['scenario']} ({key})", lw=1)
    a1.set_xlabel("seconds into the scenario")
    a1.set_ylabel("msgs/s")
    a1.set_yscale("symlog", linthresh=1000)
    a1.set_title("rmq throughput over time")
    a1.legend(fontsize=6)
    for r in report["rows"] + (report.get("peers") or {}).get("rows", []):
        if "hist" not in r:
            continue
        h = Histogram.from_dict(r["hist"])
        if not h.n:
            continue
        pts = h.cdf()
        label = r.get("scenario") or f"{r['peer']} {r['flush']} {r['body_size']} B {r['test'].split(':')[0]}"
        a2.plot([p[0] for p in pts], [p[1] for p in pts], label=label, lw=1,
                ls="-" if "scenario" in r else "--")
    a2.set_xscale("log")
    a2.set_xlabel("send latency, µs (log)")
    a2.set_ylabel("fraction of messages")
    a2.set_title("send latency CDF (dashed: peers)")
    a2.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def has_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
