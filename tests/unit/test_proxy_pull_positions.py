"""The remoting proxy's memory of each connection's last pull answer per queue (its HA epoch and
next offset), which it sends as ``lastEpoch`` for RocketMQ's clients (rmq.proxy.server.on_pull)."""
from rmq.proxy.server import MAX_PULL_POSITIONS_PER_CONNECTION, remember_pull


def test_a_queue_keeps_its_last_answer_and_the_longest_unanswered_queue_goes_at_the_limit():
    positions: dict = {}
    remember_pull(positions, ("g", "broker-a", "T", 0), 3, 10)
    remember_pull(positions, ("g", "broker-a", "T", 0), 4, 12)
    assert positions == {("g", "broker-a", "T", 0): (4, 12)}
    for q in range(1, MAX_PULL_POSITIONS_PER_CONNECTION):
        remember_pull(positions, ("g", "broker-a", "T", q), 4, q)
    assert len(positions) == MAX_PULL_POSITIONS_PER_CONNECTION
    remember_pull(positions, ("g", "broker-a", "T", 0), 5, 13)     # answered again: now the newest
    remember_pull(positions, ("g", "broker-a", "U", 0), 5, 1)      # one queue more: the oldest goes
    assert len(positions) == MAX_PULL_POSITIONS_PER_CONNECTION
    assert ("g", "broker-a", "T", 1) not in positions
    assert positions[("g", "broker-a", "T", 0)] == (5, 13) and positions[("g", "broker-a", "U", 0)] == (5, 1)
