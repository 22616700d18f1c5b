"""Orchestration of the rmq scenarios: a broker group per (flush type, body size) -- its own,
in a temporary store, unless ``namesrv`` is given -- driven by producer / consumer worker
processes (:mod:`rmq.bench.workers`), with a live progress line and CPU of every process."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Optional

from rmq.bench import e2e as E
from rmq.bench.hist import Histogram

MB = 1e6


@dataclass
class Opts:
    sizes: tuple = (100, 1024)
    flush_types: tuple = ("ASYNC_FLUSH", "SYNC_FLUSH")
    messages: Optional[int] = None          # per scenario (all producers together); None: duration
    duration: float = 5.0                   # seconds per timed scenario when messages is None
    batch: int = 1000
    linger_ms: float = 0.0
    rate: float = 0.0                       # msgs/s per producer, 0 = as fast as possible
    window: int = 4
    producers: int = 1
    consumers: int = 1
    queues: int = 4
    single_seconds: float = 1.5
    ceiling_seconds: float = 1.0
    file_size: int = 512 << 20
    namesrv: Optional[str] = None
    store_dir: Optional[str] = None
    progress: bool = True
    scenarios: tuple = ("produce", "consume", "e2e", "single")
    broker_roles: tuple = (None,)           # None: a lone broker; ASYNC_MASTER / SYNC_MASTER: + a slave
    ha: bool = False                        # the HA section (master roles' produce + single, replication)
    ha_mb: int = 256                        # MB replicated by the HA section's replication figure

    def phase_limit(self) -> float:
        return (self.duration if self.messages is None else 300.0) + 120.0


ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


def topic_name(kind: str, flush: str, size: int) -> str:
    return f"Bench_{kind}_{flush.split('_')[0]}_{size}_{os.getpid()}_{int(time.time())}"


def actor_pids_on_machine() -> dict:
    """name -> pid of every ``rmq.actors.*`` process on this machine (for an external group)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        for a in argv:
            if a.startswith(b"rmq.actors."):
                name = a.decode()[len("rmq.actors."):]
                out[name if name not in out else f"{name}-{d}"] = int(d)
                break
    return out


class Progress:
    """One live line (carriage return on a terminal; one line every 2 s otherwise)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        elif now - self.last >= 2.0:
            self.last = now
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


class Group:
    """A broker group (started here, or found through ``namesrv``) and the client workers."""

    def __init__(self, o: Opts, flush: str, size: int, log=print, role: Optional[str] = None):
        self.o, self.flush, self.size, self.log, self.role = o, flush, size, log, role
        self.cluster = self.slave = None
        self.dir = None
        self.producers, self.consumers = [], []
        if o.namesrv:
            from rmq.client.admin import Admin

            adm = Admin(o.namesrv)
            try:
                masters = [b for b in adm.cluster_list() if b.broker_id == 0 and not b.error]
            finally:
                adm.close()
            if not masters:
                raise RuntimeError(f"no master broker registered with {o.namesrv}")
            self.endpoint = "tcp://" + masters[0].broker_addr
            self.group_pids = actor_pids_on_machine()
        else:
            from rmq.testing import Cluster

            self.dir = tempfile.mkdtemp(prefix=f"rmq-bench-{flush[:4].lower()}-{size}-", dir=o.store_dir)
            p = E.Params(file_size=o.file_size, batch=max(o.batch, 32))
            conf = E.cluster_conf(p, flush)
            if role:
                conf["brokerRole"] = role
            try:
                self.cluster = Cluster(os.path.join(self.dir, "store"), conf=conf, with_ha=bool(role))
                self.endpoint = self.cluster.broker
                self.group_pids = {n: ap.proc.pid for n, ap in self.cluster.procs.items()}
                if role:                 # a slave beside it (its CPU is reported as slave-*)
                    from rmq.bench.ha import start_slave

                    self.slave = start_slave(self.cluster, os.path.join(self.dir, "slave"))
                    self.group_pids.update({f"slave-{n}": ap.proc.pid for n, ap in self.slave.procs.items()})
            except BaseException:
                self.close()
                raise
        from rmq.bench.workers import Worker

        try:
            self.producers = [Worker(f"producer{i + 1}") for i in range(o.producers)]
            self.consumers = [Worker(f"consumer{i + 1}") for i in range(o.consumers)]
        except BaseException:
            self.close()
            raise

    def slave_view(self):
        """An object :meth:`rmq.bench.e2e.ClusterBench.diagnose` reads the slave group from."""
        class _V:
            cluster = self.slave
        return _V()

    def client_pids(self, producers=True, consumers=True) -> dict:
        d = {}
        if producers:
            d.update({w.name: w.pid for w in self.producers})
        if consumers:
            d.update({w.name: w.pid for w in self.consumers})
        return d

    def close(self) -> None:
        for w in self.producers + self.consumers:
            w.close()
        if self.slave is not None:
            self.slave.close()
        if self.cluster is not None:
            self.cluster.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- scenarios --------------------------------------------------------------------------
    def _split(self, n: int, parts: int) -> list:
        return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]

    def _queues_of(self, i: int, parts: int) -> list:
        qs = [q for q in range(self.o.queues) if q % parts == i]
        return qs or [i % self.o.queues]

    def _stage_producers(self, topic: str) -> None:
        o = self.o
        total = o.messages if o.messages is not None else 10 ** 12
        for i, (w, n) in enumerate(zip(self.producers, self._split(total, len(self.producers)))):
            w.progress, w.done = [], None
            w.start("produce", endpoint=self.endpoint, topic=topic, body_size=self.size, n_msgs=n,
                    seconds=o.duration if o.messages is None else 0.0, batch=o.batch, window=o.window,
                    queues=self._queues_of(i, len(self.producers)), linger_ms=o.linger_ms, rate=o.rate)

    def _stage_consumers(self, topic: str) -> None:
        for i, w in enumerate(self.consumers):
            w.progress, w.done = [], None
            w.start("consume", endpoint=self.endpoint, topic=topic, body_size=self.size,
                    queues=self._queues_of(i, len(self.consumers)), max_nums=max(1, min(self.o.batch, 1000)))

    def _run(self, label: str, prods: list, cons: list, stop_consumers_when_producers_done: bool,
             progress: Progress) -> dict:
        """Go every staged worker, pump progress until all are done; timeseries + CPU."""
        pids = dict(self.group_pids)
        pids.update({w.name: w.pid for w in prods + cons})
        if self.cluster is not None:
            E.wait_idle(list(self.group_pids.values()))
        meter = E.CpuMeter(pids)
        meter.start()
        t0 = time.monotonic()
        for w in prods + cons:
            w.go()
        if cons and not prods:
            for w in cons:
                w.stop()             # consume what is there, then finish
        series = []
        stopped = not prods
        limit = t0 + self.o.phase_limit()
        while True:
            done_p = all(w.pump() for w in prods)
            done_c = all(w.pump() for w in cons)
            if done_p and not stopped and stop_consumers_when_producers_done:
                stopped = True
                for w in cons:
                    w.stop()
            now = time.monotonic() - t0
            p_msgs = sum(w.progress[-1]["msgs"] if w.progress else 0 for w in prods)
            c_msgs = sum(w.progress[-1]["msgs"] if w.progress else 0 for w in cons)
            lag = sum(w.progress[-1].get("lag", 0) if w.progress else 0 for w in cons)
            if not series or now - series[-1]["t"] >= 0.25:
                series.append({"t": round(now, 3), "produced": p_msgs, "consumed": c_msgs, "lag": lag})
                prev = series[-5] if len(series) >= 5 else series[0]
                dt = max(series[-1]["t"] - prev["t"], 1e-9)
                txt = f"{label}: {now:5.1f} s"
                if prods:
                    txt += f"  produced {p_msgs:,} ({(p_msgs - prev['produced']) / dt:,.0f}/s)"
                if cons:
                    txt += f"  consumed {c_msgs:,} ({(c_msgs - prev['consumed']) / dt:,.0f}/s)  lag {lag:,}"
                progress.show(txt)
            if done_p and done_c:
                break
            if time.monotonic() > limit:
                raise TimeoutError(f"{label}: not done within {self.o.phase_limit():.0f} s")
            time.sleep(0.05)
        cpu = meter.stop()
        progress.end()
        return {"series": series, "cpu": cpu, "prod": [w.done for w in prods], "cons": [w.done for w in cons]}

    def scenario(self, kind: str, progress: Progress) -> dict:
        o, label = self.o, scenario_label(kind, self.flush, self.size, self.role)
        row: dict = {"kind": kind, "flush": self.flush, "body_size": self.size, "scenario": label,
                     "broker_role": self.role or "",
                     "producers": o.producers if kind != "consume" else 0,
                     "consumers": o.consumers if kind in ("consume", "e2e") else 0,
                     "queues": o.queues, "batch": o.batch, "linger_ms": o.linger_ms, "rate": o.rate}
        if kind == "single":
            w = self.producers[0]
            w.start("single", endpoint=self.endpoint, topic=topic_name("single", self.flush, self.size),
                    body_size=self.size, seconds=o.single_seconds)
            meter = E.CpuMeter({**self.group_pids, w.name: w.pid})
            meter.start()
            w.go()
            res = w.result(o.single_seconds + 120)
            row.update(E.rate_row(res), cpu=meter.stop(), producers=1, batch=1,
                       errors={"not SEND_OK": res["errors"]} if res["errors"] else {})
            return row
        topic = topic_name("produce" if kind == "consume" else kind, self.flush, self.size)
        if kind in ("produce", "e2e", "consume"):
            self._stage_producers(topic)
        if kind == "consume":            # fill the topic first (untimed), then read it all
            r = self._run(f"fill {label}", self.producers, [], False, progress)
            self._wait_dispatched(topic, r["prod"])
            self._stage_consumers(topic)
            r = self._run(label, [], self.consumers, False, progress)
        elif kind == "e2e":
            self._stage_consumers(topic)
            r = self._run(label, self.producers, self.consumers, True, progress)
        else:
            r = self._run(label, self.producers, [], False, progress)
        row["series"], row["cpu"] = r["series"], r["cpu"]
        if r["prod"] and kind != "consume":
            hist = Histogram()
            for res in r["prod"]:
                hist.merge(Histogram.from_dict(res["hist"]))
            msgs = sum(x["msgs"] for x in r["prod"])
            el = max(x["seconds"] for x in r["prod"])
            errs: dict = {}
            for x in r["prod"]:
                for k, v in x["errors"].items():
                    errs[k] = errs.get(k, 0) + v
            row.update(msgs=msgs, seconds=round(el, 4), msgs_per_s=msgs / el, mb_per_s=msgs * self.size / el / MB,
                       errors=errs, hist=hist.to_dict(), **hist.stats())
        if r["cons"]:
            msgs = sum(x["msgs"] for x in r["cons"])
            el = max(x["seconds"] for x in r["cons"])
            key = "" if kind == "consume" else "consume_"
            row.update({f"{key}msgs": msgs, f"{key}seconds": round(el, 4), f"{key}msgs_per_s": msgs / el,
                        f"{key}mb_per_s": msgs * self.size / el / MB,
                        "max_lag": max(x["max_lag"] for x in r["cons"]),
                        "final_lag": sum(x["final_lag"] for x in r["cons"]),
                        "bad_pages": sum(x["bad_pages"] for x in r["cons"])})
            expected = sum(x["msgs"] + x["warm_msgs"] for x in (r["prod"] or self._filled))
            if kind == "consume":
                row["expected"] = expected
            if msgs < expected or row["bad_pages"]:
                row["error"] = f"consumed {msgs:,} of {expected:,}, {row['bad_pages']} bad pages"
        return row

    def _wait_dispatched(self, topic: str, prod: list, timeout_s: float = 60.0) -> None:
        self._filled = prod
        want: dict = {}
        for res in prod:
            for q, n in res["per_queue"].items():
                want[int(q)] = want.get(int(q), 0) + n
        ctx = E.zmq.Context()
        s = ctx.socket(E.zmq.DEALER)
        s.setsockopt(E.zmq.LINGER, 0)
        s.connect(self.endpoint)
        t0 = time.monotonic()
        opaque = 0
        try:
            while time.monotonic() - t0 < timeout_s:
                ok = True
                for q, n in want.items():
                    opaque += 1
                    s.send_multipart(E.P.encode(E.Frame(E.RequestCode.GET_MAX_OFFSET, opaque, 0, "",
                                                        {"topic": topic, "queueId": q})))
                    while True:
                        r = E.P.decode(E._recv(s, 10))
                        if r.opaque == opaque:
                            break
                    ok = ok and r.fields.get("offset", 0) >= n
                if ok:
                    return
                time.sleep(0.05)
        finally:
            s.close(0)
            ctx.term()
        raise TimeoutError(f"dispatch of {topic} did not reach {want} within {timeout_s} s")


def scenario_label(kind: str, flush: str, size: int, role: Optional[str] = None) -> str:
    return f"{kind} {flush} {role + ' + slave ' if role else ''}{size} B"


def _group_rows(o: Opts, flush: str, size: int, role: Optional[str], scenarios: tuple, progress: Progress,
                log) -> list:
    rows = []
    log(f"rmq broker group {flush}{', ' + role + ' with a slave' if role else ''}, {size} B bodies"
        + (f" (namesrv {o.namesrv})" if o.namesrv else " (own cluster, temporary store)"))
    try:
        g = Group(o, flush, size, log, role)
    except (RuntimeError, TimeoutError) as e:
        progress.end()
        return [{"kind": kind, "flush": flush, "body_size": size, "broker_role": role or "",
                 "scenario": scenario_label(kind, flush, size, role), "error": f"group did not start: {e}",
                 "msgs_per_s": 0.0, "mb_per_s": 0.0} for kind in scenarios]
    try:
        for kind in scenarios:
            try:
                row = g.scenario(kind, progress)
            except (RuntimeError, TimeoutError) as e:
                progress.end()
                diag = E.ClusterBench.diagnose(g) if g.cluster is not None else ""
                if g.slave is not None:
                    diag += "\nslave:\n" + E.ClusterBench.diagnose(g.slave_view())
                row = {"kind": kind, "flush": flush, "body_size": size, "broker_role": role or "",
                       "scenario": scenario_label(kind, flush, size, role),
                       "error": f"{e}\n{diag}", "msgs_per_s": 0.0, "mb_per_s": 0.0}
            rows.append(row)
            lat = f"  p50 {row['p50_us']:.0f} p99 {row['p99_us']:.0f} p99.9 {row.get('p999_us', float('nan')):.0f} " \
                  f"max {row.get('max_us', float('nan')):.0f} us" if "p50_us" in row else ""
            extra = f"  consume {row['consume_msgs_per_s']:,.0f}/s max lag {row['max_lag']:,}" \
                if "consume_msgs_per_s" in row else ""
            log(f"  {kind:<8} {row['msgs_per_s']:>12,.0f} msgs/s {row['mb_per_s']:>8,.1f} MB/s{lat}{extra}"
                + (f"  [red]{row['error'][:200]}[/]" if row.get("error") else ""))
    finally:
        g.close()
    return rows


def run_rmq(o: Opts, log=print) -> list:
    """Every scenario per broker role, flush type and body size (a fresh group each)."""
    rows = []
    progress = Progress(o.progress)
    if o.namesrv:
        for size in o.sizes:
            rows += _group_rows(o, "external", size, None, o.scenarios, progress, log)
        return rows
    for role in o.broker_roles:
        for flush in o.flush_types:
            for size in o.sizes:
                rows += _group_rows(o, flush, size, role, o.scenarios, progress, log)
    return rows


def ha_size(o: Opts) -> int:
    """Body size of the HA section's rows: 1 KiB when asked for, else the largest size."""
    return 1024 if 1024 in o.sizes else max(o.sizes)


def run_ha(o: Opts, log=print) -> dict:
    """The HA section of ``rmq bench all``: batched produce and single sends to an ASYNC_MASTER
    and a SYNC_MASTER, each with a slave (rows, ``broker_role`` set; ASYNC_FLUSH unless only
    SYNC_FLUSH was asked for), and the replication of ``ha_mb`` MB beside raw ZeroMQ."""
    from rmq.bench import ha

    progress = Progress(o.progress)
    flush = "ASYNC_FLUSH" if "ASYNC_FLUSH" in o.flush_types else o.flush_types[0]
    rows = []
    for role in ROLES:
        rows += _group_rows(o, flush, ha_size(o), role, ("produce", "single"), progress, log)
    out: dict = {"rows": rows}
    try:
        out.update(ha.measure_replication(o.ha_mb, ha.CHUNK, o.ceiling_seconds, o.store_dir, log))
    except (RuntimeError, TimeoutError, OSError) as e:
        out["error"] = f"replication: {e}"
        log(f"  [red]replication failed: {e}[/]")
    return out


def opts_dict(o: Opts) -> dict:
    return asdict(o)
