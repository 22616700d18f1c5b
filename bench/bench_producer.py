"""Producer throughput through the client library: batching vs pipelined send_async vs sync send.

Run::

    python -m pytest bench/bench_producer.py --benchmark-only -q

Scenarios, for 100 B and 1 KiB bodies, against one broker group (nameserver +
broker + reput + flush processes on loopback, ASYNC_FLUSH, 64 MiB CommitLog files)
started once for the module:

* ``batch``: ``Producer(linger_ms=5, batch_size=64 KiB)``, ``send_async`` per message,
  then ``flush()`` -- every message's future resolved;
* ``async``: the default options (linger 0, batch_size 16 KiB): ``send_async`` per
  message; a message leaves at once while fewer than ``max_in_flight`` requests are out,
  and those queued meanwhile leave together, then ``flush()``;
* ``unbatched``: ``batch_size=0``: one SEND_MESSAGE per message, ``max_in_flight``
  requests pipelined, then ``flush()``;
* ``sync``: ``send`` per message, each waiting for its answer;
* ``many``: the default options, lists of ``MANY_LIST`` (1,000) messages each handed over
  with one ``send_async_many`` (one future per list, its callback counting the outcomes),
  then ``flush()``.

The timed part builds each :class:`rmq.Message` (as an application would), hands it
over and waits until every result is in (async modes count outcomes in a callback
rather than holding every future); the producer is created and has learned the
route before timing.  ``rounds`` rounds (median reported) of ``N`` messages each:
``RMQ_BENCH_PRODUCER_MESSAGES`` (default 50 000 for batch and async, a fifth of that for
unbatched, a fiftieth for sync; 1 KiB runs half) and ``RMQ_BENCH_ROUNDS`` (default 3).
``extra_info`` holds ``msgs_per_s``, ``mb_per_s`` (bodies), ``requests_per_round``
and ``msgs_per_request``; a table is printed at the end of the session.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import pytest

from rmq import Message, Producer, SendStatus
from rmq.bench.e2e import BENCH_INDEX_CONF
from tests.integration.cluster import Cluster

BASE_MESSAGES = int(os.environ.get("RMQ_BENCH_PRODUCER_MESSAGES", "50000"))
ROUNDS = int(os.environ.get("RMQ_BENCH_ROUNDS", "3"))
SIZES = (100, 1024)
MODES = {
    # mode: (producer options, share of BASE_MESSAGES)
    "batch": (dict(linger_ms=5, batch_size=64 * 1024), 1.0),
    "async": (dict(), 1.0),                      # the default: batches form while requests are in flight
    "unbatched": (dict(batch_size=0), 0.2),      # one SEND_MESSAGE per message (RocketMQ's sendAsync)
    "sync": (dict(), 0.02),
    "many": (dict(), 1.0),                       # send_async_many of lists of MANY_LIST
}
MANY_LIST = 1000
TOPIC = "BenchProducer"

_ROWS: list = []


class _Summary:
    def pytest_terminal_summary(self, terminalreporter):
        if not _ROWS:
            return
        tr = terminalreporter
        tr.section("rmq producer: msgs/s through the client library (median of rounds)")
        head = f"{'scenario':<28} {'msgs/s':>10} {'MB/s':>8} {'min':>10} {'max':>10} {'msgs/request':>13}"
        tr.write_line(head)
        tr.write_line("-" * len(head))
        for label, r in _ROWS:
            tr.write_line(f"{label:<28} {r['msgs_per_s']:>10,.0f} {r['mb_per_s']:>8,.1f} {r['min_msgs_per_s']:>10,.0f} "
                          f"{r['max_msgs_per_s']:>10,.0f} {r['msgs_per_request']:>13,.1f}")


@pytest.fixture(scope="session", autouse=True)
def _producer_summary(request):
    pm = request.config.pluginmanager
    if pm.get_plugin("rmq-producer-summary") is None:
        pm.register(_Summary(), "rmq-producer-summary")
    yield


@pytest.fixture(scope="module")
def cluster():
    d = tempfile.mkdtemp(prefix="rmq-bench-producer-", dir=os.environ.get("RMQ_BENCH_DIR") or None)
    c = Cluster(os.path.join(d, "store"), conf={"mappedFileSizeCommitLog": str(64 * 1024 * 1024),
                                                "mappedFileSizeConsumeQueue": str(20 * 300_000), **BENCH_INDEX_CONF})
    yield c
    c.close()


def n_messages(mode: str, size: int) -> int:
    n = int(BASE_MESSAGES * MODES[mode][1])
    return max(100, n // 2 if size >= 1024 else n)


def run_round(p: Producer, mode: str, body: bytes, n: int) -> float:
    """Send ``n`` messages; seconds until every one is answered.  Async modes count outcomes
    in a callback instead of holding ``n`` futures (as a streaming application would)."""
    t0 = time.perf_counter()
    if mode == "sync":
        for _ in range(n):
            p.send(Message(TOPIC, body))
        return time.perf_counter() - t0
    outcome = {"ok": 0, "bad": []}

    def on_done(f):
        e = f.exception()
        if e is None and f.result().status is SendStatus.SEND_OK:
            outcome["ok"] += 1
        else:
            outcome["bad"].append(e or f.result().status)

    if mode == "many":
        def on_list(f):
            e = f.exception()
            if e is not None:
                outcome["bad"].append(e)
                return
            for r in f.result():
                if r.status is SendStatus.SEND_OK:
                    outcome["ok"] += 1
                else:
                    outcome["bad"].append(r.status)

        for k in range(0, n, MANY_LIST):
            p.send_async_many([Message(TOPIC, body) for _ in range(min(MANY_LIST, n - k))], on_list)
    else:
        for _ in range(n):
            p.send_async(Message(TOPIC, body), on_done)
    left = p.flush(120.0)
    dt = time.perf_counter() - t0
    assert left == 0, f"{left} messages unanswered"
    assert not outcome["bad"], f"{len(outcome['bad'])} failed, first: {outcome['bad'][0]!r}"
    assert outcome["ok"] == n
    return dt


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s}B")
@pytest.mark.parametrize("mode", list(MODES))
def test_producer_throughput(benchmark, cluster, mode, size):
    opts, _ = MODES[mode]
    n = n_messages(mode, size)
    body = os.urandom(size // 2).hex().encode()[:size]      # below the compression threshold
    times = []
    with Producer(cluster.namesrv_addr, group="bench", **opts) as p:
        p.send(Message(TOPIC, b"warm-up"))
        before = p.stats

        def timed():
            times.append(run_round(p, mode, body, n))

        benchmark.pedantic(timed, rounds=ROUNDS, iterations=1)
        st = p.stats
    requests = (st["requests"] - before["requests"]) / ROUNDS
    rates = [n / t for t in times]
    row = {"msgs": n, "size": size, "msgs_per_s": statistics.median(rates), "min_msgs_per_s": min(rates),
           "max_msgs_per_s": max(rates), "mb_per_s": statistics.median(rates) * size / 1e6,
           "requests_per_round": requests, "msgs_per_request": n / max(requests, 1)}
    benchmark.extra_info.update(row)
    _ROWS.append((f"{mode} {size} B", row))
    if mode == "batch":
        assert row["msgs_per_request"] > 10, row
