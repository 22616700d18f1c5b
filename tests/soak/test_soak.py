"""Soak: RMQ_SOAK_SECONDS (1800) at RMQ_SOAK_LOAD (50 %) of the produce capacity measured in the
same run, with PushConsumers keeping up (issue 16, "Soak and overload").

1. Capacity: one producer process, ``send_async`` with the default options, 100 B bodies, as fast
   as it accepts them, RMQ_SOAK_CAPACITY_SECONDS (10) on a topic of its own; acknowledged msgs/s.
2. Soak: RMQ_SOAK_CONSUMERS (2) PushConsumers of one group (default options, one process), then one
   producer process paced at the share of that capacity (``send_async``, default options), for
   RMQ_SOAK_SECONDS.  Every actor's RSS and open descriptors are sampled every
   RMQ_SOAK_SAMPLE_SECONDS; the consumer lag (acknowledged - consumed, from the workers' counts,
   about every second) and the broker's view of it (``consumerProgress``) are followed.
3. Drain: the producer stops, the consumers finish; every acknowledged (producer, seq) must have
   been consumed (at least once; redeliveries are counted, not failed).

Fails on: a send error or a send left unanswered; an actor exiting; an actor's anonymous RSS or its
descriptors not flat (tolerances in :mod:`tests.soak.harness`); file-backed RSS beyond the store's
size; the consumer lag above LAG_BOUND_S seconds of the paced rate; an acknowledged message never
consumed; the producer unable to keep its pace (below PACE_MIN_SHARE of it).
"""
import time

import pytest

from rmq.client.admin import Admin
from tests.soak.harness import (
    CAPACITY_SECONDS,
    LAG_BOUND_S,
    QUEUES,
    SOAK_CONSUMERS,
    SOAK_LOAD,
    SOAK_SECONDS,
    ActorSampler,
    Bitmap,
    consumer_lag,
    measure_capacity,
    soak_cluster,
    start_all,
    wait_until,
    warmup_seconds,
    workers,
)

PACE_MIN_SHARE = 0.9          # the paced producer must achieve at least this share of its target rate
DRAIN_TIMEOUT_S = 300         # after the producer stops, the consumers must have everything by then
BROKER_LAG_PERIOD_S = 15      # consumerProgress every this many seconds
PRINT_PERIOD_S = 60           # a progress line every minute of a long run
TOPIC = "Soak"
GROUP = "soak-consumers"
PRODUCER_ID = 1


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 1200)
def test_soak_at_half_capacity(tmp_path):
    log_dir = tmp_path / "workers"
    out = tmp_path / "out"
    out.mkdir()
    problems = []
    with soak_cluster(tmp_path / "store", topics=("SoakCapacity", TOPIC)) as c, workers() as started:
        cap = measure_capacity(c, "SoakCapacity", CAPACITY_SECONDS, log_dir)
        capacity = cap["capacity"]
        rate = capacity * SOAK_LOAD
        print(f"\nsoak: produce capacity {capacity:,.0f} msgs/s (one process, send_async with the default "
              f"options, 100 B bodies, {CAPACITY_SECONDS} s)")

        sampler = ActorSampler(c)
        sampler.start()
        (consumer,) = start_all(started, [("consumer", {"role": "consumer", "namesrv": c.namesrv_addr,
                                                         "topic": TOPIC, "group": GROUP, "n": SOAK_CONSUMERS,
                                                         "out": str(out)})], log_dir)
        # every queue owned by exactly one consumer (rmq has no NOTIFY_CONSUMER_IDS_CHANGED: the consumer
        # that started first takes every queue until its next periodic rebalance, 20 s by default)
        settled = wait_until(lambda: consumer.last.get("queues") == QUEUES == consumer.last.get("union"), 120,
                             "each queue owned by one consumer")
        print(f"soak: the {SOAK_CONSUMERS} consumers' queue assignment settled after {settled:.1f} s")
        (producer,) = start_all(started, [("producer", {"role": "producer", "namesrv": c.namesrv_addr,
                                                         "topic": TOPIC, "pid": PRODUCER_ID, "rate": rate,
                                                         "seconds": SOAK_SECONDS, "out": str(out),
                                                         "group": "soak-producer"})], log_dir)
        producer.send("go")
        t_go = time.monotonic()
        warm_end = t_go + warmup_seconds(SOAK_SECONDS)
        lag_bound = LAG_BOUND_S * rate
        max_lag = max_lag_at = 0
        max_broker_lag = 0
        next_broker_lag = t_go + BROKER_LAG_PERIOD_S
        next_print = t_go + PRINT_PERIOD_S
        with Admin(c.namesrv_addr) as admin:
            while True:
                done = producer.wait("done", 1.0, required=False)
                now = time.monotonic()
                p, q = producer.last, consumer.last
                if p and q:
                    lag = consumer_lag(producer, consumer, rate)
                    if lag > max_lag:
                        max_lag, max_lag_at = lag, now - t_go
                if now >= next_broker_lag and not done:
                    next_broker_lag += BROKER_LAG_PERIOD_S
                    try:
                        max_broker_lag = max(max_broker_lag, admin.consumer_progress(GROUP, TOPIC).total_diff)
                    except Exception as e:  # noqa: BLE001 - the broker must answer its admin requests
                        problems.append(f"consumerProgress failed at {now - t_go:.0f} s: {e!r}")
                if now >= next_print and p and q:
                    next_print += PRINT_PERIOD_S
                    print(f"soak: {now - t_go:,.0f} s: {p['acked']:,} acked, {q['distinct']:,} consumed, lag "
                          f"{max(0, consumer_lag(producer, consumer, rate)):,}, send errors {p['errors']}")
                if done or sampler.dead:
                    break
        assert not sampler.dead, f"actors exited during the soak: {sampler.dead}"
        acked = done["acked"]
        wait_until(lambda: consumer.last.get("distinct", 0) >= acked, DRAIN_TIMEOUT_S,
                   f"the consumers reach the {acked:,} acknowledged messages")
        sampler.finish()
        consumer.send("stop")
        cdone = consumer.wait("done", 120)

    acked_bm = Bitmap.load(done["bitmap"])
    seen = Bitmap.load(cdone["bitmaps"][str(PRODUCER_ID)]) if str(PRODUCER_ID) in cdone["bitmaps"] else Bitmap()
    missing, first_missing = seen.missing_from(acked_bm)
    print(f"soak: {done['elapsed']:,.0f} s at {SOAK_LOAD:.0%} of {capacity:,.0f} msgs/s: paced {rate:,.0f} msgs/s, "
          f"achieved {done['achieved_rate']:,.0f}; {done['sent']:,} sent, {acked:,} acked, "
          f"{done['errors']} send errors, {done['unresolved']} unanswered")
    print(f"soak: consumed {cdone['distinct']:,} distinct ({cdone['deliveries'] - cdone['distinct']:,} redeliveries) "
          f"by {SOAK_CONSUMERS} PushConsumers; acked but never consumed: {missing}")
    print(f"soak: max consumer lag {max_lag:,} msgs = {max_lag / rate:.1f} s of the paced rate at "
          f"{max_lag_at:,.0f} s (bound {lag_bound:,.0f} = {LAG_BOUND_S} s); broker-side (consumerProgress, "
          f"offsets committed every 5 s) max {max_broker_lag:,}")
    problems += sampler.report("soak", warm_end)

    if done["errors"] or done["unresolved"]:
        bursts = ", ".join(f"{n} at {t - t_go:.1f} s" for t, n in done["error_bursts"])
        problems.append(f"send errors {done['errors']} {done['error_kinds']} ({bursts}), unanswered "
                        f"{done['unresolved']}: {done['first_errors'][:2]}")
    if done["achieved_rate"] < PACE_MIN_SHARE * rate:
        problems.append(f"the producer achieved {done['achieved_rate']:,.0f} msgs/s of the {rate:,.0f} paced "
                        f"(minimum share {PACE_MIN_SHARE})")
    if max_lag > lag_bound:
        problems.append(f"consumer lag reached {max_lag:,} messages at {max_lag_at:.0f} s (bound {lag_bound:,.0f})")
    if missing:
        problems.append(f"{missing} acknowledged messages never consumed, first sequence numbers {first_missing}")
    assert not problems, "\n".join(problems)
