"""The actor base as a real process: requests, errors, deferred replies, clean stop."""
import collections
import os
import platform

import msgpack
import pytest

from rmq import protocol as P
from rmq.client.remoting import RemotingClient
from rmq.common.malloc_tuning import MALLOC_MMAP_THRESHOLD_BYTES, MALLOC_TRIM_THRESHOLD_BYTES, TUNING_ENV
from rmq.protocol import Frame, RequestCode, ResponseCode

pytestmark = pytest.mark.integration


def test_request_error_and_stop(actors, tmp_path):
    a = actors("-m", "tests.integration.echo_actor", str(tmp_path))
    with RemotingClient() as c:
        r = c.invoke(a.endpoint, Frame(RequestCode.HEART_BEAT, fields={"x": 1}, bodies=[b"body"]))
        assert r.code == ResponseCode.SUCCESS and r.fields == {"x": 1} and bytes(r.bodies[0]) == b"body"
        r = c.invoke(a.endpoint, Frame(12345))
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "12345" in r.remark
        r = c.invoke(a.endpoint, Frame(RequestCode.QUERY_MESSAGE))
        assert r.code == ResponseCode.SYSTEM_ERROR and "handler exploded" in r.remark
        r = c.invoke(a.endpoint, Frame(RequestCode.PULL_MESSAGE))
        assert r.remark == "later"
        # hostile frames: each answered with an error, the actor keeps serving
        for parts in ([P.PROTOCOL_MAGIC, b"\xc1\xc1"], [P.PROTOCOL_MAGIC, msgpack.packb([1])],
                      [P.PROTOCOL_MAGIC, msgpack.packb({"code": "x"})], [b"GET / HTTP/1.1"],
                      [P.PROTOCOL_MAGIC, msgpack.packb({"code": 34}), *([b"x"] * (P.MAX_BODY_PARTS + 1))]):
            c.send_raw(a.endpoint, parts)
            resp = c.recv_raw(a.endpoint)
            assert resp is not None and resp.code != ResponseCode.SUCCESS and resp.remark
        r = c.invoke(a.endpoint, Frame(RequestCode.HEART_BEAT))
        assert r.code == ResponseCode.SUCCESS
    assert a.terminate() == 0
    with open(os.path.join(tmp_path, "stopped")) as f:
        assert f.read() == "ok"
    assert os.path.exists(os.path.join(tmp_path, "logs", "echo.log"))


def test_poll_timeout_rounds_up_to_whole_ms_so_a_near_timer_does_not_spin():
    from rmq.actors.actor import poll_timeout_ms
    assert poll_timeout_ms(10.0, 10.0003, 1000) == 1          # 0.3 ms ahead: wait 1 ms, not 0 (a spin)
    assert poll_timeout_ms(10.0, 10.0015, 1000) == 2
    assert poll_timeout_ms(10.0, 9.5, 1000) == 0              # overdue: do not wait
    assert poll_timeout_ms(10.0, 20.0, 250) == 250            # bounded by max_wait_ms
    assert poll_timeout_ms(10.0, None, 250.5) == 251
    assert all(isinstance(poll_timeout_ms(10.0, d, 1000), int) for d in (None, 10.0001, 11.0))


@pytest.mark.parametrize("defer", ["1", "0"])
def test_a_burst_of_requests_is_answered_in_order_errors_and_all(actors, tmp_path, defer):
    # requests read in one turn are answered after the turn (the actor's outbox; RMQ_DEFER_REPLIES=0:
    # each at once): every one gets its own answer, in the order handled, a failing handler's
    # included, and a parked one later
    a = actors("-m", "tests.integration.echo_actor", str(tmp_path), env={"RMQ_DEFER_REPLIES": defer})
    kinds = [RequestCode.HEART_BEAT, RequestCode.QUERY_MESSAGE, 12345, RequestCode.HEART_BEAT] * 50
    with RemotingClient() as c:
        assert c.invoke(a.endpoint, Frame(RequestCode.HEART_BEAT)).code == ResponseCode.SUCCESS   # connected
        c.send_raw(a.endpoint, P.encode(Frame(RequestCode.PULL_MESSAGE, opaque=10_000)))          # parked
        for i, code in enumerate(kinds):
            c.send_raw(a.endpoint, P.encode(Frame(code, opaque=i + 1, fields={"i": i})))
        got = []
        while len(got) < len(kinds) + 1:
            r = c.recv_raw(a.endpoint, timeout_ms=10_000)
            assert r is not None, f"{len(got)} of {len(kinds) + 1} answers"
            got.append(r)
    answers = [r for r in got if r.opaque != 10_000]
    assert [r.opaque for r in answers] == list(range(1, len(kinds) + 1))
    for r, code in zip(answers, kinds):
        if code == RequestCode.HEART_BEAT:
            assert r.code == ResponseCode.SUCCESS and r.fields == {"i": r.opaque - 1}
        elif code == RequestCode.QUERY_MESSAGE:
            assert r.code == ResponseCode.SYSTEM_ERROR and "handler exploded" in r.remark
        else:
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert [r.remark for r in got if r.opaque == 10_000] == ["later"]


@pytest.mark.parametrize("env, expected", [
    ({}, {"M_MMAP_THRESHOLD": MALLOC_MMAP_THRESHOLD_BYTES, "M_TRIM_THRESHOLD": MALLOC_TRIM_THRESHOLD_BYTES}),
    ({TUNING_ENV: "0"}, {}),
])
def test_an_actor_tunes_malloc_when_it_starts_unless_told_not_to(actors, tmp_path, env, expected):
    if platform.libc_ver()[0] != "glibc":
        expected = {}                   # nothing to tune elsewhere
    a = actors("-m", "tests.integration.echo_actor", str(tmp_path), env=env)
    with RemotingClient() as c:
        r = c.invoke(a.endpoint, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert r.fields["malloc"] == expected


@pytest.mark.parametrize("defer", ["1", "0"])
def test_at_turn_end_runs_after_the_turns_requests_and_before_their_replies(actors, tmp_path, defer):
    """Actor.at_turn_end (the POP service's group commit): requests of a burst are answered by
    callables run once their turn's requests are handled, each turn's answered together; one that
    raises is logged and the others still run.  Without a turn (RMQ_DEFER_REPLIES=0) the caller is
    told so and answers at once."""
    a = actors("-m", "tests.integration.echo_actor", str(tmp_path), env={"RMQ_DEFER_REPLIES": defer})
    n = 200
    with RemotingClient() as c:
        assert c.invoke(a.endpoint, Frame(RequestCode.HEART_BEAT)).code == ResponseCode.SUCCESS   # connected
        for i in range(n):
            c.send_raw(a.endpoint, P.encode(Frame(RequestCode.QUERY_CONSUMER_OFFSET, opaque=i + 1,
                                                  fields={"boom": i % 7 == 0})))
        got = {}
        while len(got) < n:
            r = c.recv_raw(a.endpoint, timeout_ms=10_000)
            assert r is not None, f"{len(got)} of {n} answers"
            got[r.opaque] = r
    assert sorted(got) == list(range(1, n + 1))
    assert all(r.code == ResponseCode.SUCCESS for r in got.values())
    remarks = [r.remark for r in got.values()]
    if defer == "0":
        assert set(remarks) == {"alone"}
        return
    assert set(remarks) <= {"alone", "turn end"}
    turns = [r for r in got.values() if r.remark == "turn end"]
    assert turns and max(r.fields["n"] for r in turns) > 1, "no burst was handled as one turn"
    sizes = collections.Counter(r.fields["n"] for r in turns)
    assert all(count % size == 0 for size, count in sizes.items()), sizes   # each turn answered whole
    assert a.terminate() == 0
    with open(os.path.join(tmp_path, "logs", "echo.log")) as f:
        log = f.read()
    assert "end of turn" in log and "turn end exploded" in log
