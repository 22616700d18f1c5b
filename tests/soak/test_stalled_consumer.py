"""A consumer that stops reading for RMQ_STALL_SECONDS (300) under a steady load (issue 16).

Two consumer groups, A and B, one PushConsumer each (default options, a process each), on one topic;
one producer process paced at RMQ_STALL_RATE (5,000) msgs/s (``send_async``, default options).
After a warm-up, B's listener blocks (its consume threads wait, its process queues fill to
``pull_threshold_for_queue``, it stops pulling: a consumer that stopped reading but stays
connected) for RMQ_STALL_SECONDS; then it resumes.

Checked and printed:

* the broker's memory during the stall: its anonymous RSS and descriptors flat (the tolerances of
  :mod:`tests.soak.harness`); a backlog lives in the CommitLog, not in the broker;
* B's lag as the broker reports it (``consumerProgress``) grows by about what was acknowledged
  during the stall: within STALL_LAG_SLACK_S seconds of the rate (offsets are committed every 5 s);
* A unaffected: its lag (acknowledged - consumed) stays under LAG_BOUND_S seconds of the rate;
* B catches up once resumed: its lag back under that bound within CATCHUP_TIMEOUT_S;
* at the end both groups consumed every acknowledged message; no send error; no actor exited.
"""
import time

import pytest

from rmq.client.admin import Admin
from tests.soak.harness import (
    LAG_BOUND_S,
    QUEUES,
    STALL_RATE,
    STALL_SECONDS,
    ActorSampler,
    Bitmap,
    consumer_lag,
    mib,
    soak_cluster,
    start_all,
    wait_until,
    warmup_seconds,
    workers,
)

STALL_LAG_SLACK_S = 10                        # B's lag growth = acked during the stall +- this many s of rate
CATCHUP_TIMEOUT_S = max(300, STALL_SECONDS)   # B back under the lag bound within this after resuming
DRAIN_TIMEOUT_S = 300
TOPIC = "Stall"
GROUPS = ("stall-a", "stall-b")
PRODUCER_ID = 2


@pytest.mark.slow
@pytest.mark.timeout(STALL_SECONDS + 1500)
def test_consumer_that_stops_reading(tmp_path):
    log_dir = tmp_path / "workers"
    out = tmp_path / "out"
    out.mkdir()
    problems = []
    rate = STALL_RATE
    bound = LAG_BOUND_S * rate
    with soak_cluster(tmp_path / "store", topics=(TOPIC,)) as c, workers() as started, \
            Admin(c.namesrv_addr) as admin:
        sampler = ActorSampler(c)
        sampler.start()
        ca, cb = start_all(started, [(g, {"role": "consumer", "namesrv": c.namesrv_addr, "topic": TOPIC,
                                          "group": g, "n": 1, "out": str(out)}) for g in GROUPS], log_dir)
        for w in (ca, cb):
            wait_until(lambda w=w: w.last.get("union") == QUEUES, 120, f"{w.name} owns every queue")
        (producer,) = start_all(started, [("producer", {"role": "producer", "namesrv": c.namesrv_addr,
                                                         "topic": TOPIC, "pid": PRODUCER_ID, "rate": rate,
                                                         "seconds": 0, "out": str(out),
                                                         "group": "stall-producer"})], log_dir)
        producer.send("go")
        max_lag = {"a": 0, "b": 0}

        def watch(seconds: float, track=("a", "b")) -> None:
            """Follow both groups' lags for ``seconds`` (a check every second, not a fixed wait)."""
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                assert producer.wait("done", 1.0, required=False) is None, "the producer stopped early"
                assert not sampler.dead, f"actors exited: {sampler.dead}"
                for key, w in zip(("a", "b"), (ca, cb)):
                    if key in track:
                        max_lag[key] = max(max_lag[key], consumer_lag(producer, w, rate))

        # warm-up: both groups keep up
        watch(warmup_seconds(STALL_SECONDS))
        pre = dict(max_lag)
        broker_lag_b0 = admin.consumer_progress(GROUPS[1], TOPIC).total_diff
        acked0 = producer.last["acked"]
        cb.send("stall")
        t_stall = time.monotonic()
        sampler.sample()
        wait_until(lambda: cb.last.get("blocked", 0) > 0, 60, "group B's listener blocked")
        max_lag["a"] = 0
        watch(STALL_SECONDS - (time.monotonic() - t_stall), track=("a",))
        acked1 = producer.last["acked"]
        broker_lag_b1 = admin.consumer_progress(GROUPS[1], TOPIC).total_diff
        broker_lag_a1 = admin.consumer_progress(GROUPS[0], TOPIC).total_diff
        sampler.sample()
        t_resume = time.monotonic()
        consumed_b_stalled = cb.last["distinct"]
        cb.send("resume")
        catchup = wait_until(lambda: consumer_lag(producer, cb, rate) <= bound, CATCHUP_TIMEOUT_S,
                             f"group B's lag back under {bound:,} messages after it resumed")
        # the load stops; both groups must have everything
        producer.send("stop")
        pdone = producer.wait("done", 300)
        for w in (ca, cb):
            wait_until(lambda w=w: w.last.get("distinct", 0) >= pdone["acked"], DRAIN_TIMEOUT_S,
                       f"{w.name} reaches the {pdone['acked']:,} acknowledged messages")
        sampler.finish()
        cdone = {}
        for w in (ca, cb):
            w.send("stop")
            cdone[w.name] = w.wait("done", 120)

    stalled = t_resume - t_stall
    produced = acked1 - acked0
    growth = broker_lag_b1 - broker_lag_b0
    print(f"\nstall: group {GROUPS[1]} stopped reading for {stalled:,.0f} s under {rate:,} msgs/s "
          f"({produced:,} acked meanwhile); its lag (consumerProgress) {broker_lag_b0:,} -> {broker_lag_b1:,} "
          f"(+{growth:,}; {consumed_b_stalled:,} consumed before it blocked)")
    print(f"stall: group {GROUPS[0]} kept reading: max lag {max_lag['a']:,} during the stall (bound {bound:,}), "
          f"{pre['a']:,} before; consumerProgress at the end of the stall {broker_lag_a1:,}")
    print(f"stall: group {GROUPS[1]} caught up {catchup:.1f} s after resuming: its lag back under {bound:,} "
          f"(a backlog of {broker_lag_b1:,} at about {(broker_lag_b1 / catchup) if catchup else 0:,.0f} msgs/s, "
          f"beside the ongoing load)")
    problems += sampler.report("stall", t_stall, t_resume, only=("broker",))
    summary = sampler.summary(t_stall, t_resume).get("broker")
    if summary:
        print(f"stall: broker RSS during the stall {mib(summary['rss'][0])} -> {mib(summary['rss'][1])} MiB "
              f"(anonymous {mib(summary['anon'][0])} -> {mib(summary['anon'][1])} MiB)")
    for w in (ca, cb):
        bm = cdone[w.name]["bitmaps"].get(str(PRODUCER_ID))
        missing, first = (Bitmap.load(bm) if bm else Bitmap()).missing_from(Bitmap.load(pdone["bitmap"]))
        d = cdone[w.name]
        print(f"stall: {w.name}: consumed {d['distinct']:,} distinct of {pdone['acked']:,} acked "
              f"({d['deliveries'] - d['distinct']:,} redeliveries), never consumed {missing}")
        if missing:
            problems.append(f"{w.name}: {missing} acknowledged messages never consumed, first {first}")
    print(f"stall: producer: {pdone['sent']:,} sent, {pdone['acked']:,} acked, {pdone['errors']} send errors")

    if pdone["errors"] or pdone["unresolved"]:
        problems.append(f"send errors {pdone['errors']} {pdone['error_kinds']}, unanswered {pdone['unresolved']}: "
                        f"{pdone['first_errors'][:2]}")
    if abs(growth - produced) > STALL_LAG_SLACK_S * rate:
        problems.append(f"group B's lag grew by {growth:,} while {produced:,} were acknowledged "
                        f"(tolerance {STALL_LAG_SLACK_S * rate:,})")
    if max_lag["a"] > bound or pre["a"] > bound:
        problems.append(f"group A's lag reached {max(max_lag['a'], pre['a']):,} (bound {bound:,})")
    if pre["b"] > bound:
        problems.append(f"group B's lag reached {pre['b']:,} before it stalled (bound {bound:,})")
    assert not problems, "\n".join(problems)
