"""rmq bench latency's delivery-after-SEND_OK figure (rmq.bench.latency.after_ack): signed, joined
per message on its send stamp, messages without a SEND_OK left out."""
from rmq.bench.latency import after_ack


def test_signed_per_message_and_unacked_left_out():
    # t0 -> SEND_OK seen at t0 + 1000 ns; deliveries 500 ns before to 3000 ns after it
    acked = {t0: t0 + 1000 for t0 in range(0, 100_000, 1000)}
    delivered = [(t0, t0 + 1000 + d) for t0, d in zip(range(0, 100_000, 1000), range(-500, 3000, 35))]
    delivered.append((123_456_789, 0))              # never acknowledged: not counted
    r = after_ack(delivered, acked)
    diffs = sorted(range(-500, 3000, 35))[:100]
    assert r["n"] == 100
    assert r["delivered_first"] == sum(1 for d in diffs if d < 0) > 0
    assert r["p50_us"] == diffs[50] / 1e3 and r["p99_us"] == diffs[98] / 1e3
    assert r["p50_us"] <= r["p99_us"]


def test_nothing_to_join():
    assert after_ack([], {1: 2}) == {"n": 0}
    assert after_ack([(1, 5)], {}) == {"n": 0}
