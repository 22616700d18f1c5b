"""rmq.zmqio's multipart send and receive: straight through libzmq (rmq._core.zmqc, the default)
against pyzmq's Cython backend (``RMQ_ZMQ_DIRECT=0``'s path), over loopback TCP.

* ``send``: one 3-part request (magic, a 60-byte header, a 3,000-byte body) from a DEALER;
* ``recv``: receiving a queued 4-part message on the ROUTER (identity + those three parts),
  200 per round, each path's own drain (``recv_waiting``: no exception at the end).

Run: python -m pytest bench/bench_zmqio.py --benchmark-only -q
The ratio of the two paths is what to quote (same run); stop 54, best rounds: send 0.35-0.56 us
against 1.15-1.76 us (3x), receive 1.2-1.3 us against 3.0-3.7 us (2.5-3x) a message.
"""
import time

import pytest
import zmq

from rmq import zmqio
from rmq._core import zmqc

PARTS = [b"RMQ1", b"h" * 60, b"b" * 3000]
BURST = 200
IMPLS = {
    "direct": (zmqc.send_parts, zmqc.recv_waiting),
    "pyzmq": (zmqio.send_parts_pyzmq, zmqio.recv_waiting_pyzmq),
}


@pytest.fixture(scope="module")
def pair():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    zmqc.send_parts(dealer, [b"hello"], 0)
    zmqc.recv_parts(router, 0)
    yield router, dealer
    router.close(0)
    dealer.close(0)
    ctx.term()


def _drain(router, recv_waiting, n):
    got = 0
    deadline = time.monotonic() + 10
    while got < n:
        got += len(recv_waiting(router, 1024))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{got} of {n} messages arrived")


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_send(benchmark, pair, impl):
    router, dealer = pair
    send_parts, _ = IMPLS[impl]
    sent = [0]

    def burst():
        for _ in range(BURST):
            send_parts(dealer, PARTS)
        sent[0] += BURST

    def setup():                                   # the previous burst received: an empty pipe
        _drain(router, zmqc.recv_waiting, sent[0])
        sent[0] = 0

    benchmark.pedantic(burst, setup=setup, rounds=30, iterations=1)
    setup()
    benchmark.extra_info["us_per_message"] = benchmark.stats.stats.min / BURST * 1e6


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_recv(benchmark, pair, impl):
    router, dealer = pair
    _, recv_waiting = IMPLS[impl]

    def setup():
        for _ in range(BURST):
            zmqc.send_parts(dealer, PARTS)
        deadline = time.monotonic() + 10          # all queued at the ROUTER before the timed drain
        while router.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.01)

    def drain():
        _drain(router, recv_waiting, BURST)

    benchmark.pedantic(drain, setup=setup, rounds=30, iterations=1)
    benchmark.extra_info["us_per_message"] = benchmark.stats.stats.min / BURST * 1e6
