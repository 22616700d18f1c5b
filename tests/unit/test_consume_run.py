"""``rmq._core.consume.consume_run``: the PushConsumer's concurrent consume loop, driven here by
a recording owner in place of the PushConsumer (the loop's whole interface to it is the
attributes and methods below), without threads or sockets."""
import sys

import pytest

import rmq._core.consume
from rmq._core.consume import ACK_INDEX_ALL, ConsumeConcurrentlyContext, ConsumeRun, consume_run

SUCCESS, LATER = "CONSUME_SUCCESS", "RECONSUME_LATER"
#: RUN_COMMIT_INTERVAL_S for the tests of the commits at the end of a run: no interval can pass
#: during one, whatever a loaded machine's scheduling gaps (the real 50 ms can: an extra commit)
NO_INTERVAL_S = 3600.0


@pytest.fixture
def long_interval(monkeypatch):
    """The run's commit interval made longer than any test: its consumed messages are committed
    at its end only.  consume_run / ConsumeRun read the module's global at every request (a
    module global of the Cython module, looked up by name), so the patch reaches them."""
    monkeypatch.setattr(rmq._core.consume, "RUN_COMMIT_INTERVAL_S", NO_INTERVAL_S)


class PQ:
    def __init__(self):
        self.dropped = False


class Owner:
    """Records what consume_run asks of its consumer."""

    def __init__(self, trace=False):
        self._state = "RUNNING"
        self._trace = object() if trace else None
        self.events = []

    def _trace_before(self, msgs):
        self.events.append(("before", list(msgs)))
        return ("tr", list(msgs))

    def _trace_after(self, tr, msgs, ok):
        self.events.append(("after", tr, list(msgs), ok))

    def _listener_failed(self, msgs, mq):
        self.events.append(("failed", list(msgs), mq, type(sys.exc_info()[1]).__name__))

    def _dropped_while_consuming(self, mq, n):
        self.events.append(("dropped", mq, n))

    def _commit_consumed(self, msgs, pq, mq):
        self.events.append(("commit", list(msgs), mq))

    def _process_concurrent_result(self, status, ctx, msgs, pq, mq):
        self.events.append(("result", status, ctx.ack_index, list(msgs)))


def normalize(status):
    return SUCCESS if status is None else LATER


def run_of(msgs, size=1, pq=None):
    return ConsumeRun(list(msgs), size, pq or PQ(), "mq")


def test_every_request_reaches_the_listener_with_a_fresh_context_and_all_commit_at_the_end(long_interval):
    seen = []

    def listener(msgs, ctx):
        seen.append((list(msgs), ctx.message_queue, ctx.delay_level_when_next_consume, ctx.ack_index))
        return SUCCESS
    owner = Owner()
    consume_run(run_of(range(5), size=2), owner, listener, SUCCESS, LATER, normalize)
    assert [s[0] for s in seen] == [[0, 1], [2, 3], [4]]
    assert all(s[1:4] == ("mq", 0, ACK_INDEX_ALL) for s in seen)
    # wholly consumed requests are committed together (within RUN_COMMIT_INTERVAL_S: at the end)
    assert owner.events == [("commit", [0, 1, 2, 3, 4], "mq")]


def test_a_raising_listener_is_logged_in_its_except_block_and_counts_as_reconsume_later(long_interval):
    def listener(msgs, ctx):
        if msgs == [1]:
            raise KeyError("boom")
        return SUCCESS
    owner = Owner()
    consume_run(run_of(range(3)), owner, listener, SUCCESS, LATER, normalize)
    assert owner.events == [("failed", [1], "mq", "KeyError"), ("result", LATER, ACK_INDEX_ALL, [1]),
                            ("commit", [0, 2], "mq")]


def test_other_answers_are_normalized_and_a_partial_ack_index_takes_the_result_path(long_interval):
    def listener(msgs, ctx):
        if msgs == [0]:
            return None                        # normalize: success
        if msgs == [1]:
            return "bogus"                     # normalize: later
        ctx.ack_index = 0                      # [2, 3]: the first consumed, the second failed
        return SUCCESS
    owner = Owner()
    consume_run(ConsumeRun([0, 1, 2, 3], 1, PQ(), "mq"), owner, listener, SUCCESS, LATER, normalize)
    owner2 = Owner()
    consume_run(ConsumeRun([2, 3], 2, PQ(), "mq"), owner2, listener, SUCCESS, LATER, normalize)
    assert owner.events == [("result", LATER, ACK_INDEX_ALL, [1]), ("commit", [0, 2, 3], "mq")]
    assert owner2.events == [("result", SUCCESS, 0, [2, 3])]


def test_a_queue_dropped_during_a_call_ends_the_loop_without_a_commit(long_interval):
    pq = PQ()

    def listener(msgs, ctx):
        if msgs == [1]:
            pq.dropped = True
        return SUCCESS
    owner = Owner()
    run = ConsumeRun([0, 1, 2], 1, pq, "mq")
    consume_run(run, owner, listener, SUCCESS, LATER, normalize)
    assert owner.events == [("dropped", "mq", 1)]
    assert run.left() == 1                     # request [2] never taken: the new owner redelivers it


def test_a_consumer_leaving_running_stops_taking_requests_and_commits_what_was_consumed(long_interval):
    owner = Owner()

    def listener(msgs, ctx):
        owner._state = "STOPPING"
        return SUCCESS
    run = run_of(range(4))
    consume_run(run, owner, listener, SUCCESS, LATER, normalize)
    assert owner.events == [("commit", [0], "mq")]
    assert run.left() == 3


def test_trace_hooks_run_around_each_call_with_the_outcome(long_interval):
    def listener(msgs, ctx):
        return SUCCESS if msgs == [0] else LATER
    owner = Owner(trace=True)
    consume_run(run_of(range(2)), owner, listener, SUCCESS, LATER, normalize)
    assert owner.events == [("before", [0]), ("after", ("tr", [0]), [0], True),
                            ("before", [1]), ("after", ("tr", [1]), [1], False),
                            ("result", LATER, ACK_INDEX_ALL, [1]), ("commit", [0], "mq")]


def test_the_context_a_listener_gets_is_the_public_type():
    got = []
    consume_run(run_of([0]), Owner(), lambda msgs, ctx: got.append(ctx) or SUCCESS, SUCCESS, LATER, normalize)
    assert type(got[0]) is ConsumeConcurrentlyContext


def test_only_a_consume_run_is_accepted():
    with pytest.raises(TypeError):
        consume_run([0, 1], Owner(), lambda m, c: SUCCESS, SUCCESS, LATER, normalize)


def test_a_long_run_commits_at_least_every_run_commit_interval_not_only_at_its_end():
    import time

    from rmq._core.consume import RUN_COMMIT_INTERVAL_S

    owner = Owner()

    def listener(msgs, ctx):
        owner.events.append(("call", list(msgs)))
        if msgs == [1]:
            time.sleep(RUN_COMMIT_INTERVAL_S + 0.02)   # more than the interval has passed after it
        return SUCCESS
    consume_run(run_of(range(4)), owner, listener, SUCCESS, LATER, normalize)
    # the real interval: a scheduling gap elsewhere in the run (a loaded machine) may add a commit,
    # so the commits are checked as a whole: every message once, in order, and what was consumed
    # when the interval had passed (after [1]) committed at once, before the next call
    commits = [e[1] for e in owner.events if e[0] == "commit"]
    assert [m for c in commits for m in c] == [0, 1, 2, 3], owner.events
    assert all(e[2] == "mq" for e in owner.events if e[0] == "commit")
    after_1 = owner.events.index(("call", [1])) + 1
    assert owner.events[after_1][0] == "commit" and owner.events[after_1][1][-1] == 1, owner.events
    assert owner.events.index(("call", [2])) == after_1 + 1, owner.events
    assert owner.events[-1][0] == "commit" and owner.events[-1][1][-1] == 3, owner.events   # the rest at the end


def test_settle_is_the_one_rule_of_both_loops():
    run = ConsumeRun([0, 1, 2], 3, PQ(), "mq")
    ctx = ConsumeConcurrentlyContext("mq")
    assert run.settle(False, ctx, [0, 1, 2]) is False           # not CONSUME_SUCCESS
    ctx.ack_index = 1
    assert run.settle(True, ctx, [0, 1, 2]) is False            # the last message failed
    ctx.ack_index = 2
    assert run.settle(True, ctx, [0, 1, 2]) is None             # consumed, committed later
    assert run.rest() == [0, 1, 2]
