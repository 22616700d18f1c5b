"""``rmq bench latency``: one message at a time, paced, through the public API with its defaults.

For each rate (msgs/s), body size and consumer, a fresh topic: one process sends with
``Producer.send_async`` (defaults) at the rate, stamping each message with its send time
(property ``BENCH_T0_NS``, ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every
process of the machine); another process consumes it and records *delivery* latency, send call
-> listener called (``PushConsumer``, ``rmq.aio``'s ``AsyncPushConsumer``) or -> returned by
``PullConsumer.poll`` (long polling).  The producer records send call -> SEND_OK (the future's
callback), and each row also gives delivery measured from that SEND_OK (``after_ack``, signed:
a pull answered ahead of the send's ack delivers before the producer sees it).  Beside them, in the same run and at the same rates: a raw pyzmq relay (PUSH -> a
relay process -> PULL, the transport with nothing on top) and Redis Streams XADD -> XREAD BLOCK
(``appendfsync everysec``; when ``redis-server`` and redis-py are present).

Figures are p50 / p99 / p99.9 / max (us) from :class:`rmq.bench.hist.Histogram` (1 % buckets).
Latency is counted from the actual send call, and the achieved rate is reported beside the
asked one: a rate the sender cannot keep shows as a lower achieved rate, not as queueing
delay in the histogram.

``trace=True`` (``--trace``) turns on :mod:`rmq.latency_trace` in every process of the run (the
embedded cluster is started with ``RMQ_LATENCY_TRACE=1``; an external ``--namesrv`` cluster must
have been) and adds, per rmq row, where the time went hop by hop (:mod:`rmq.bench.trace`).  The
stamps cost a little on every hop, so a traced run's totals are a little above an untraced one's.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from typing import Optional

from rmq import latency_trace as _lt
from rmq.bench.hist import Histogram, time_calls

T0_PROP = "BENCH_T0_NS"
WARMUP_PROP = "BENCH_WARMUP"
RATES = (200, 5_000, 50_000)                 # msgs/s (issue 12)
SIZES = (100, 1024)                          # body bytes
CONSUMERS = ("push", "poll", "aio")
PEERS = ("zmq", "redis")
DURATION_S = 3.0                             # paced sending per scenario
READY_TIMEOUT_S = 60.0                       # consumer up and assigned (warm-up message delivered)
DRAIN_TIMEOUT_S = 30.0                       # after the last send: every message delivered
SPIN_S = 0.0                                 # pacing: sleep until this close to the send time, then spin
                                             # (0: never spin -- a spinning sender holds the GIL that the
                                             # producer's I/O thread and callbacks need; latency counts
                                             # from the actual send call, so a late wake only shifts it)
PATH_NAMES = {"push": "PushConsumer listener", "poll": "PullConsumer.poll", "aio": "rmq.aio push listener",
              "zmq": "raw pyzmq relay (PUSH -> relay -> PULL)", "redis": "Redis XADD -> XREAD BLOCK"}


def _now() -> int:
    return time.monotonic_ns()


class _Recorder:
    """Delivery side: latencies of measured messages, the warm-up signal, and the count."""

    def __init__(self, conn):
        self.conn = conn
        self.hist = Histogram()
        self.lock = threading.Lock()
        self.ready = False
        self.got = 0
        self.ids: set = set()
        self.dups = 0
        self.send_lock = threading.Lock()
        self.trace_rows: list = []          # (uniq, topic, queue id, queue offset, t0, delivered), traced runs
        self.delivered: dict = {}           # t0 (the message's send stamp, ns) -> delivered (ns)

    def say(self, *msg) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def on(self, props: dict, now: int, ident, msg=None) -> None:
        if props.get(WARMUP_PROP):
            if not self.ready:
                self.ready = True
                self.say("ready")
            return
        t0 = props.get(T0_PROP)
        if t0 is None:
            return
        with self.lock:
            if ident in self.ids:
                self.dups += 1
                return
            self.ids.add(ident)
            self.hist.record(now - int(t0))
            self.delivered[int(t0)] = now
            self.got += 1
            if msg is not None and _lt.ENABLED:
                self.trace_rows.append((ident, msg.topic, msg.queue_id, msg.queue_offset, int(t0), now))

    def report(self) -> dict:
        with self.lock:
            rep = {"hist": self.hist.to_dict(), "got": self.got, "dups": self.dups,
                   "delivered": list(self.delivered.items())}
            if _lt.ENABLED:
                rep["trace"] = {"rows": self.trace_rows, "events": _lt.take()["events"]}
            return rep


def _consumer_main(conn, mode: str, target: str, topic: str) -> None:
    """Child process: consume ``topic`` (``target``: NameServer or Redis port) until told to stop."""
    rec = _Recorder(conn)
    stop = threading.Event()

    def control():
        while True:
            msg = conn.recv()
            if msg[0] == "count":
                rec.say("count", rec.got)
            else:
                stop.set()
                return
    threading.Thread(target=control, daemon=True).start()
    try:
        from rmq.client.consumer import ConsumeConcurrentlyStatus
        if mode == "push":
            from rmq import PushConsumer
            c = PushConsumer(target, f"lat-{topic}")
            c.subscribe(topic, "*")

            def listener(msgs, ctx):
                now = _now()
                for m in msgs:
                    rec.on(m.properties, now, m.msg_id, m)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
            c.register_message_listener(listener)
            c.start()
            stop.wait()
            c.shutdown()
        elif mode == "aio":
            import asyncio

            from rmq.aio.consumer import AsyncPushConsumer

            async def run():
                c = AsyncPushConsumer(target, f"lat-{topic}")
                c.subscribe(topic, "*")

                async def listener(msgs, ctx):
                    now = _now()
                    for m in msgs:
                        rec.on(m.properties, now, m.msg_id, m)
                    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
                c.register_message_listener(listener)
                await c.start()
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                await c.shutdown()
            asyncio.run(run())
        elif mode == "poll":
            from rmq import PullConsumer
            with PullConsumer(target, f"lat-{topic}") as c:
                c.assign(c.fetch_subscribe_message_queues(topic))
                while not stop.is_set():
                    msgs = c.poll(100)
                    now = _now()
                    for m in msgs:
                        rec.on(m.properties, now, m.msg_id, m)
        elif mode == "redis":
            import redis
            r = redis.Redis(host="127.0.0.1", port=int(target))
            last = "$"
            while not stop.is_set():
                res = r.xread({topic: last}, block=100)
                now = _now()
                for _, entries in res or ():
                    for eid, fields in entries:
                        last = eid
                        props = {k.decode(): v.decode() for k, v in fields.items() if k != b"b"}
                        rec.on(props, now, eid)
        elif mode == "zmq":
            import zmq
            ctx = zmq.Context()
            pull = ctx.socket(zmq.PULL)
            pull.bind(target)
            while not stop.is_set():
                if pull.poll(100):
                    parts = pull.recv_multipart()
                    now = _now()
                    rec.on({WARMUP_PROP: "1"} if parts[0] == b"w" else {T0_PROP: parts[0].decode()}, now,
                           parts[1])
            ctx.destroy(linger=0)
        else:
            raise ValueError(f"unknown consumer {mode!r}")
        rec.say("done", rec.report())
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the row
        rec.say("error", f"{type(e).__name__}: {e}")


def _relay_main(pull_ep: str, push_ep: str) -> None:
    """Child process: PULL -> PUSH, one message at a time (the raw transport hop of a broker)."""
    import zmq
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(pull_ep)
    push.connect(push_ep)
    while True:
        parts = pull.recv_multipart()
        if parts[0] == b"quit":
            break
        push.send_multipart(parts)
    ctx.destroy(linger=0)


BACKGROUND_BATCH = 1000                      # messages per Producer.send_batch of the background load
BACKGROUND_SIZE = 100                        # body bytes of the background load


def _background_main(conn, namesrv: str, rate: float) -> None:
    """Child process: bulk load beside the measured path, ``Producer.send_batch`` of
    BACKGROUND_BATCH x BACKGROUND_SIZE B messages paced to ``rate`` msgs/s, until told to stop;
    reports (messages sent, seconds, failed batches)."""
    from rmq import Message, Producer
    topic = f"lat_background_{os.getpid()}"
    body = b"b" * BACKGROUND_SIZE
    sent = failed = 0
    with Producer(namesrv, group="lat-pg-background") as p:
        p.send(Message(topic, b"create"))
        conn.send(("ready",))
        start = time.perf_counter()
        i = 0
        while not conn.poll(0):
            due = start + i * BACKGROUND_BATCH / rate
            left = due - time.perf_counter()
            if left > 0:
                if conn.poll(left):
                    break
            try:
                p.send_batch([Message(topic, body) for _ in range(BACKGROUND_BATCH)])
                sent += BACKGROUND_BATCH
            except Exception:  # noqa: BLE001 - counted; the measured path is what matters
                failed += 1
            i += 1
        conn.recv()
        conn.send(("done", sent, time.perf_counter() - start, failed))


class _Background:
    """A background bulk load (:func:`_background_main`) for the duration of one row."""

    def __init__(self, namesrv: str, rate: float):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_background_main, args=(child, namesrv, rate), daemon=True)
        self.proc.start()
        if not self.conn.poll(READY_TIMEOUT_S) or self.conn.recv()[0] != "ready":
            self.proc.kill()
            raise RuntimeError("the background load did not start")

    def stop(self) -> dict:
        self.conn.send(("stop",))
        try:
            if not self.conn.poll(60):
                raise RuntimeError("the background load did not report")
            _, sent, secs, failed = self.conn.recv()
        finally:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
        return {"msgs_per_s": sent / secs if secs > 0 else 0.0, "failed_batches": failed}


def _pace(n: int, rate: float, send) -> tuple:
    """Call ``send(i)`` n times at ``rate``/s (sleep, then spin the last SPIN_S); returns
    (seconds taken, achieved rate)."""
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        while True:
            left = due - time.perf_counter()
            if left <= 0:
                break
            if left > SPIN_S:
                time.sleep(left - SPIN_S)
        send(i)
    took = time.perf_counter() - start
    return took, n / took if took > 0 else float("nan")


class _Consumer:
    def __init__(self, mode: str, target: str, topic: str):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_consumer_main, args=(child, mode, target, topic), daemon=True)
        self.proc.start()

    def wait_ready(self, warm, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.05):
            if time.monotonic() > deadline or not self.proc.is_alive():
                raise RuntimeError("the consumer did not get a warm-up message in time")
            warm()
        msg = self.conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"consumer: {msg[1]}")

    def wait_count(self, n: int, timeout_s: float = DRAIN_TIMEOUT_S) -> int:
        """Until the consumer has recorded ``n`` measured messages (or ``timeout_s``); its count."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.conn.send(("count",))
            if not self.conn.poll(30):
                raise RuntimeError("the consumer does not answer")
            msg = self.conn.recv()
            if msg[0] == "error":
                raise RuntimeError(f"consumer: {msg[1]}")
            if msg[0] == "count" and (msg[1] >= n or time.monotonic() > deadline):
                return msg[1]
            time.sleep(0.05)

    def finish(self) -> dict:
        self.conn.send(("stop",))
        if not self.conn.poll(60):
            raise RuntimeError("the consumer did not report")
        msg = self.conn.recv()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
        if msg[0] != "done":
            raise RuntimeError(f"consumer: {msg[1]}")
        return msg[1]

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def after_ack(delivered, acked_at: dict) -> dict:
    """Delivery measured from the message's SEND_OK (issue 12's "delivery after SEND_OK"):
    ``delivered`` (t0, delivered ns) pairs, ``acked_at`` t0 -> SEND_OK ns.  Signed: a message
    delivered before its producer saw the SEND_OK counts negative.  p50 / p99 in us, and how
    many messages were delivered first."""
    from rmq.bench.e2e import pct
    diffs = sorted(d - acked_at[t0] for t0, d in delivered if t0 in acked_at)
    if not diffs:
        return {"n": 0}
    return {"n": len(diffs), "p50_us": pct(diffs, 0.5) / 1e3, "p99_us": pct(diffs, 0.99) / 1e3,
            "delivered_first": sum(1 for d in diffs if d < 0)}


def _row(path: str, rate: float, size: int, sent: int, achieved: float, delivered: dict,
         ack: Optional[Histogram], error: str = "") -> dict:
    row = {"path": path, "rate": rate, "size": size, "sent": sent, "achieved_rate": round(achieved, 1),
           "delivered": delivered.get("got", 0) if delivered else 0, "duplicates": delivered.get("dups", 0)
           if delivered else 0, "error": error}
    if delivered:
        h = Histogram.from_dict(delivered["hist"])
        row["delivery"] = h.stats()
        row["delivery_hist"] = h.to_dict()
    if ack is not None and ack.n:
        row["ack"] = ack.stats()
    return row


def _broker_trace(p, topic: str) -> list:
    """The latency-trace events of every broker serving ``topic`` (taken: the brokers' logs are cleared)."""
    from rmq.client.remoting import RemotingClient
    from rmq.protocol import Frame, RequestCode, unpack_body
    names = {mq.broker_name for mq in p.fetch_publish_message_queues(topic)}
    events: list = []
    with RemotingClient() as rc:
        for name in sorted(names):
            addr = p.route_cache.find_broker_addr(name)
            if addr is None:
                raise RuntimeError(f"--trace: no address for broker {name}")
            r = rc.invoke(addr, Frame(RequestCode.GET_LATENCY_TRACE))
            if r.code != 0:
                raise RuntimeError(f"--trace: broker {name} ({addr}): {r.remark}")
            events.extend(unpack_body(r)["events"])
    return events


def run_rmq(namesrv: str, mode: str, rate: float, size: int, seconds: float, trace: bool = False,
            background: float = 0.0) -> dict:
    """One rmq row; ``background`` (msgs/s, 0 = none): a bulk load from another process meanwhile."""
    from rmq import Message, Producer
    topic = f"lat_{mode}_{size}_{int(rate)}_{os.getpid()}"
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    n = max(1, int(rate * seconds))
    ack = Histogram()
    lock = threading.Lock()
    done = threading.Event()
    acked = [0]
    failed = [0]
    acked_at: dict = {}                  # t0 (ns) -> SEND_OK seen by the callback (ns)
    with Producer(namesrv, group=f"lat-pg-{mode}") as p:
        p.send(Message(topic, b"create", properties={WARMUP_PROP: "1"}))     # auto-create the topic
        c = _Consumer(mode, namesrv, topic)
        try:
            c.wait_ready(lambda: p.send(Message(topic, b"w", properties={WARMUP_PROP: "1"})))
            if trace:                    # what warm-up left in this process's and the broker's logs
                _lt.take()
                _broker_trace(p, topic)

            def cb(t0, fut):
                now = _now()
                with lock:
                    if fut.exception() is None:
                        ack.record(now - t0)
                        acked_at[t0] = now
                        acked[0] += 1
                    else:
                        failed[0] += 1
                    if acked[0] + failed[0] == n:
                        done.set()

            def send(i):
                t0 = _now()
                p.send_async(Message(topic, body, properties={T0_PROP: str(t0)}), callback=functools.partial(cb, t0))
            bg = _Background(namesrv, background) if background > 0 else None
            try:
                _, achieved = _pace(n, rate, send)
            finally:
                bg_report = bg.stop() if bg is not None else None
            done.wait(DRAIN_TIMEOUT_S)
            c.wait_count(acked[0])
            rep = c.finish()
            broker_events = _broker_trace(p, topic) if trace else []
        except BaseException:
            c.kill()
            raise
    err = f"{failed[0]} sends failed" if failed[0] else ""
    row = _row(PATH_NAMES[mode], rate, size, n, achieved, rep, ack, err)
    if bg_report is not None:
        row["background"] = {"asked_msgs_per_s": background, **bg_report}
    row["after_ack"] = after_ack(rep.get("delivered", ()), acked_at)
    if trace:
        from rmq.bench.trace import breakdown
        t = rep.get("trace") or {}
        row["trace"] = breakdown(t.get("rows", []), _lt.take()["events"] + t.get("events", []), broker_events,
                                 mode)
    return row


def run_zmq(rate: float, size: int, seconds: float) -> dict:
    """The transport alone: PUSH -> relay process -> PULL in the consumer process, same pacing."""
    import zmq

    from rmq.bench.peers import _free_port
    relay_in = f"tcp://127.0.0.1:{_free_port()}"
    out = f"tcp://127.0.0.1:{_free_port()}"
    c = _Consumer("zmq", out, "zmq")
    ctx = mp.get_context("spawn")
    relay = ctx.Process(target=_relay_main, args=(relay_in, out), daemon=True)
    relay.start()
    zctx = zmq.Context()
    push = zctx.socket(zmq.PUSH)
    push.connect(relay_in)
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    n = max(1, int(rate * seconds))
    try:
        c.wait_ready(lambda: push.send_multipart([b"w", b"w"]))

        def send(i):
            push.send_multipart([str(_now()).encode(), b"%d" % i, body])
        _, achieved = _pace(n, rate, send)
        c.wait_count(n)
        rep = c.finish()
    except BaseException:
        c.kill()
        raise
    finally:
        push.send_multipart([b"quit"])
        relay.join(10)
        if relay.is_alive():
            relay.kill()
        zctx.destroy(linger=0)
    return _row(PATH_NAMES["zmq"], rate, size, n, achieved, rep, None)


def run_redis(rate: float, size: int, seconds: float, store_dir=None) -> dict:
    """Redis Streams (appendfsync everysec): XADD, one per call, -> XREAD BLOCK in another process."""
    from rmq.bench.peers import RedisServer
    srv = RedisServer("everysec", store_dir)
    key = f"lat{size}_{int(rate)}"
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    n = max(1, int(rate * seconds))
    ack = Histogram()
    acked_at: dict = {}                 # t0 -> when XADD's reply (Redis' SEND_OK) was read
    c = _Consumer("redis", str(srv.port), key)
    try:
        r = srv.client
        c.wait_ready(lambda: r.xadd(key, {"b": b"w", WARMUP_PROP: "1"}))

        def send(i):
            t0 = _now()
            r.xadd(key, {"b": body, T0_PROP: str(t0)})
            acked_at[t0] = now = _now()
            ack.record(now - t0)
        _, achieved = _pace(n, rate, send)
        c.wait_count(n)
        rep = c.finish()
    except BaseException:
        c.kill()
        raise
    finally:
        srv.close()
    row = _row(PATH_NAMES["redis"], rate, size, n, achieved, rep, ack)
    row["after_ack"] = after_ack(rep.get("delivered", ()), acked_at)    # as the rmq rows: comparable
    return row


def run(rates=RATES, sizes=SIZES, consumers=CONSUMERS, peers=PEERS, seconds: float = DURATION_S,
        namesrv: Optional[str] = None, store_dir=None, log=print, trace: bool = False,
        background: float = 0.0) -> dict:
    """Every (rate, size) for each consumer and peer; starts an embedded cluster unless ``namesrv``.

    ``background`` (msgs/s, 0 = none): during each rmq row another process sends bulk
    (``Producer.send_batch`` of 1000 x 100 B) at that rate to a topic of its own (issue 12: the
    paced p99 under 50 % of the measured produce capacity); the row reports what it achieved.

    ``trace``: hop-by-hop breakdown per rmq row (module docstring); an external cluster must run
    with ``RMQ_LATENCY_TRACE=1`` (else each row fails with the broker's "latency trace is off").

    Returns ``{"rows": [...], "skipped": {peer: why}}``; a row with ``error`` failed (the run goes on).
    """
    from rmq.bench.peers import redis_missing
    rows, skipped = [], {}
    was_tracing = _lt.ENABLED
    if trace:
        _lt.enable()               # this process, and through the environment the cluster and consumers
    if "redis" in peers and redis_missing():
        skipped["redis"] = redis_missing()
    cluster = tmp = None
    if namesrv is None and consumers:
        from rmq.bench.e2e import BENCH_INDEX_CONF
        from rmq.testing import Cluster
        tmp = tempfile.mkdtemp(prefix="rmq-bench-latency-", dir=store_dir)
        cluster = Cluster(os.path.join(tmp, "store"), conf=BENCH_INDEX_CONF)
        namesrv = cluster.namesrv_addr
    try:
        for size in sizes:
            for rate in rates:
                jobs = [(m, functools.partial(run_rmq, namesrv, m, rate, size, seconds, trace, background))
                        for m in consumers]
                if "zmq" in peers:
                    jobs.append(("zmq", functools.partial(run_zmq, rate, size, seconds)))
                if "redis" in peers and "redis" not in skipped:
                    jobs.append(("redis", functools.partial(run_redis, rate, size, seconds, store_dir)))
                for name, job in jobs:
                    try:
                        row = job()
                    except Exception as e:  # noqa: BLE001 - one failed row does not stop the run
                        row = _row(PATH_NAMES[name], rate, size, 0, float("nan"), {}, None,
                                   f"{type(e).__name__}: {e}")
                    rows.append(row)
                    log(_line(row))
                    if row.get("trace"):
                        from rmq.bench.trace import format_breakdown
                        for line in format_breakdown(row["path"], row["trace"], row["delivered"]):
                            log(line)
    finally:
        if trace and not was_tracing:
            _lt.enable(False)
        if cluster is not None:
            cluster.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "skipped": skipped}


def _us(v) -> str:
    return "-" if v is None or v != v else f"{v:,.0f}"


def _line(row: dict) -> str:
    d, a = row.get("delivery") or {}, row.get("ack") or {}
    err = f"  ERROR {row['error']}" if row.get("error") else ""
    bg = row.get("background")
    if bg:
        err = (f"; background {bg['msgs_per_s']:,.0f} msgs/s (asked {bg['asked_msgs_per_s']:,.0f}"
               f"{', %d failed batches' % bg['failed_batches'] if bg['failed_batches'] else ''})") + err
    return (f"{row['path']:<42} {row['size']:>5} B {row['rate']:>7,.0f}/s (got {row['achieved_rate']:>9,.0f}/s) "
            f"delivery p50 {_us(d.get('p50_us'))} p99 {_us(d.get('p99_us'))} p99.9 {_us(d.get('p999_us'))} "
            f"max {_us(d.get('max_us'))} us; ack p50 {_us(a.get('p50_us'))} p99 {_us(a.get('p99_us'))} us; "
            + (f"after SEND_OK p50 {_us(row['after_ack']['p50_us'])} us; " if row.get("after_ack", {}).get("n") else "")
            + f"delivered {row['delivered']:,}/{row['sent']:,}{err}")


def print_table(report: dict, console) -> None:
    from rich.table import Table
    t = Table(title="rmq bench latency: send -> delivery (us), paced, public API defaults")
    for col in ("path", "size", "rate/s", "achieved/s", "p50", "p99", "p99.9", "max", "ack p50", "ack p99",
                "delivered"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for r in report["rows"]:
        d, a = r.get("delivery") or {}, r.get("ack") or {}
        t.add_row(r["path"], str(r["size"]), f"{r['rate']:,.0f}", f"{r['achieved_rate']:,.0f}",
                  _us(d.get("p50_us")), _us(d.get("p99_us")), _us(d.get("p999_us")), _us(d.get("max_us")),
                  _us(a.get("p50_us")), _us(a.get("p99_us")),
                  f"{r['delivered']:,}/{r['sent']:,}" + (f" [red]{r['error']}[/]" if r.get("error") else ""))
    console.print(t)
    for peer, why in report["skipped"].items():
        console.print(f"{peer}: not measured: {why}")
    single = report.get("single")
    if single:
        t = Table(title="rmq bench latency: one send at a time, each waited for (us)")
        for col in ("path", "size", "flush", "msgs/s", "p50", "p99", "p99.9", "max"):
            t.add_column(col, justify="left" if col in ("path", "flush") else "right")
        for r in single["rows"]:
            t.add_row(r["path"], str(r["size"]), r["flush"],
                      f"[red]{r['error']}[/]" if r.get("error") else f"{r['msgs_per_s']:,.0f}",
                      _us(r.get("p50_us")), _us(r.get("p99_us")), _us(r.get("p999_us")), _us(r.get("max_us")))
        console.print(t)
        for c in single["checks"]:
            console.print(f"{'OK  ' if c['ok'] else 'MISS'} {c['what']}: {c['value']:,.2f} (bound {c['bound']:,.2f})",
                          highlight=False, markup=False)


# -- one send at a time (closed loop): Producer.send beside the raw round trip ---------------------

SINGLE_FLUSHES = ("ASYNC_FLUSH", "SYNC_FLUSH")
SINGLE_RATIO_TARGET = 0.80          # issue 12: Producer.send >= 80 % of the raw pyzmq round-trip rate
SINGLE_P50_FACTOR = 1.3             # ... and p50 <= 1.3x the raw round trip's p50
SYNC_FLUSH_ADDED_US = 100.0         # SYNC_FLUSH: p50 <= fdatasync p50 + round trip p50 + this
SINGLE_WARMUP = 200                 # untimed sends first (route, connections, page cache)


def _single_row(path: str, size: int, flush: str, n: int, seconds: float, h: Histogram, **extra) -> dict:
    return {"path": path, "size": size, "flush": flush, "msgs": n, "seconds": round(seconds, 3),
            "msgs_per_s": n / seconds if seconds > 0 else float("nan"), **h.stats(), **extra}


def single_rmq(namesrv: str, size: int, seconds: float, flush: str) -> dict:
    """``Producer.send`` (defaults), one at a time, each waited for, for ``seconds``."""
    from rmq import Message, Producer
    topic = f"lat_single_{flush}_{size}_{os.getpid()}"
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    with Producer(namesrv, group="lat-pg-single") as p:
        for _ in range(SINGLE_WARMUP):
            p.send(Message(topic, body))
        n, el, h = time_calls(lambda: p.send(Message(topic, body)), seconds)
    return _single_row("Producer.send", size, flush, n, el, h)


def single_rtt(size: int, seconds: float) -> dict:
    """The raw pyzmq request / reply round trip with the broker's frame shapes (DEALER -> ROUTER
    answering a pre-built SEND_OK; :mod:`rmq.bench.e2e`'s ``rtt`` ceiling, two processes)."""
    from rmq.bench import e2e as E
    cb = E.CeilingBench(E.Params(rounds=1, sizes=(size,), ceiling_seconds=seconds))
    try:
        r = cb.measure("rtt", size)
    finally:
        cb.close()
    return {"path": "raw pyzmq round trip", "size": size, "flush": "-", "msgs": r.get("msgs"),
            "seconds": r.get("seconds"), "msgs_per_s": r["msgs_per_s"],
            **{k: r[k] for k in ("p50_us", "p99_us", "p999_us", "max_us") if k in r}}


def single_redis(size: int, seconds: float, store_dir=None) -> dict:
    """Redis Streams XADD, one per call (``appendfsync everysec``)."""
    from rmq.bench.peers import RedisServer
    srv = RedisServer("everysec", store_dir)
    body = bytes((i * 131 + 7) & 0xFF for i in range(size))
    try:
        r = srv.client
        for _ in range(SINGLE_WARMUP):
            r.xadd("single", {"b": body})
        n, el, h = time_calls(lambda: r.xadd("single", {"b": body}), seconds)
    finally:
        srv.close()
    return _single_row("Redis XADD, one per call", size, "everysec", n, el, h)


def run_single(sizes=SIZES, flushes=SINGLE_FLUSHES, peers=PEERS, seconds: float = DURATION_S,
               namesrv: Optional[str] = None, store_dir=None, log=print) -> dict:
    """``Producer.send`` one at a time beside its ceilings, measured in the same run: the raw pyzmq
    round trip (target: >= SINGLE_RATIO_TARGET of its rate, p50 <= SINGLE_P50_FACTOR x its p50),
    Redis one XADD per call, and for SYNC_FLUSH append 4 KiB + fdatasync (target: p50 <=
    fdatasync p50 + round trip p50 + SYNC_FLUSH_ADDED_US).  ``namesrv``: measure that cluster
    only (its flush type is what it is, reported as "external"); else one embedded cluster per
    flush type.  Returns ``{"rows": [...], "checks": [...]}``."""
    from rmq.bench.ceilings import fdatasync_rate
    from rmq.bench.peers import redis_missing
    rows, checks = [], []

    def add(row):
        rows.append(row)
        if row.get("error"):
            log(f"{row['path']:<28} {row['size']:>5} B {row['flush']:<11} ERROR {row['error']}")
        else:
            log(f"{row['path']:<28} {row['size']:>5} B {row['flush']:<11} {row['msgs_per_s']:>9,.0f} msgs/s  "
                f"p50 {_us(row.get('p50_us'))} p99 {_us(row.get('p99_us'))} p99.9 {_us(row.get('p999_us'))} "
                f"max {_us(row.get('max_us'))} us")
        return row

    def guarded(path, size, flush, fn):
        try:
            return add(fn())
        except Exception as e:  # noqa: BLE001 - one failed row does not stop the run
            return add({"path": path, "size": size, "flush": flush, "error": f"{type(e).__name__}: {e}"})

    sync = fdatasync_rate(4096, seconds, store_dir) if "SYNC_FLUSH" in flushes and namesrv is None else None
    if sync is not None:
        add({"path": "append 4 KiB + fdatasync", "size": 4096, "flush": "-", "msgs": sync["syncs"],
             "seconds": sync["seconds"], "msgs_per_s": sync["syncs_per_s"],
             **{k: sync[k] for k in ("p50_us", "p99_us", "p999_us", "max_us") if k in sync}})
    for size in sizes:
        rtt = guarded("raw pyzmq round trip", size, "-", functools.partial(single_rtt, size, seconds))
        if "redis" in peers and not redis_missing():
            guarded("Redis XADD, one per call", size, "everysec", functools.partial(single_redis, size, seconds,
                                                                                     store_dir))
        for flush in (("external",) if namesrv else flushes):
            me = guarded("Producer.send", size, flush, functools.partial(_single_cluster, namesrv, size, seconds,
                                                                        flush, store_dir))
            if me.get("error") or rtt.get("error"):
                continue
            if flush == "SYNC_FLUSH" and sync is not None:
                bound = sync["p50_us"] + rtt["p50_us"] + SYNC_FLUSH_ADDED_US
                checks.append({"what": f"SYNC_FLUSH Producer.send {size} B p50 <= fdatasync p50 + rtt p50 + "
                                       f"{SYNC_FLUSH_ADDED_US:.0f} us", "value": me["p50_us"], "bound": bound,
                               "ok": me["p50_us"] <= bound})
            elif flush != "SYNC_FLUSH":
                ratio = me["msgs_per_s"] / rtt["msgs_per_s"]
                checks.append({"what": f"Producer.send {size} B rate / raw round trip rate >= "
                                       f"{SINGLE_RATIO_TARGET:.0%}", "value": ratio, "bound": SINGLE_RATIO_TARGET,
                               "ok": ratio >= SINGLE_RATIO_TARGET})
                pr = me["p50_us"] / rtt["p50_us"]
                checks.append({"what": f"Producer.send {size} B p50 / raw round trip p50 <= "
                                       f"{SINGLE_P50_FACTOR}x", "value": pr, "bound": SINGLE_P50_FACTOR,
                               "ok": pr <= SINGLE_P50_FACTOR})
    for c in checks:
        log(f"  {'OK  ' if c['ok'] else 'MISS'} {c['what']}: {c['value']:,.2f} (bound {c['bound']:,.2f})")
    return {"rows": rows, "checks": checks}


def _single_cluster(namesrv: Optional[str], size: int, seconds: float, flush: str, store_dir=None) -> dict:
    if namesrv is not None:
        return single_rmq(namesrv, size, seconds, flush)
    from rmq.bench.e2e import BENCH_INDEX_CONF
    from rmq.testing import Cluster
    tmp = tempfile.mkdtemp(prefix="rmq-bench-single-", dir=store_dir)
    try:
        with Cluster(os.path.join(tmp, "store"), conf={"flushDiskType": flush, **BENCH_INDEX_CONF}) as cluster:
            return single_rmq(cluster.namesrv_addr, size, seconds, flush)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
