"""rmq.common.pull_epochs.PullEpochs: the HA epoch that goes with a pull or a commit (rmq's
consumers, and the remoting proxy for RocketMQ's clients, capped per connection)."""
from rmq.common.pull_epochs import PullEpochs
from rmq.proxy.server import MAX_PULL_POSITIONS_PER_CONNECTION

Q = ("g", "broker-a", "T", 0)


def test_an_epoch_goes_only_from_the_position_its_answer_gave_and_with_commits_within_it():
    e = PullEpochs()
    assert e.for_pull(Q, 10) == 0 and e.for_commit(Q, 0) == 0          # nothing answered yet
    e.note(Q, 3, 10)
    assert e.for_pull(Q, 10) == 3 and e.for_pull(Q, 9) == 0 and e.for_pull(Q, 11) == 0
    assert e.for_commit(Q, 10) == 3 and e.for_commit(Q, 0) == 3 and e.for_commit(Q, 11) == 0
    for epoch, nxt in (("3", 12), (4, None), (None, None), (True, 12)):
        e.note(Q, epoch, nxt)                                             # not both ints: nothing changes
    assert e.last(Q) == (3, 10)
    e.note(Q, 4, 42)
    assert e.for_pull(Q, 42) == 4 and e.for_pull(Q, 10) == 0
    e.forget(Q)
    assert Q not in e and e.for_pull(Q, 42) == 0 and e.for_commit(Q, 0) == 0


def test_at_its_limit_the_queue_answered_longest_ago_goes():
    e = PullEpochs(MAX_PULL_POSITIONS_PER_CONNECTION)      # the proxy's, per connection
    e.note(Q, 3, 10)
    for q in range(1, MAX_PULL_POSITIONS_PER_CONNECTION):
        e.note(("g", "broker-a", "T", q), 4, q)
    assert len(e) == MAX_PULL_POSITIONS_PER_CONNECTION
    e.note(Q, 5, 13)                                       # answered again: now the newest
    e.note(("g", "broker-a", "U", 0), 5, 1)                # one queue more: the oldest goes
    assert len(e) == MAX_PULL_POSITIONS_PER_CONNECTION
    assert ("g", "broker-a", "T", 1) not in e
    assert e.last(Q) == (5, 13) and e.last(("g", "broker-a", "U", 0)) == (5, 1)
    unbounded = PullEpochs()
    for q in range(MAX_PULL_POSITIONS_PER_CONNECTION + 1):
        unbounded.note(("g", "broker-a", "T", q), 1, q)
    assert len(unbounded) == MAX_PULL_POSITIONS_PER_CONNECTION + 1
