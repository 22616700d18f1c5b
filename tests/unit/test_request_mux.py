"""RequestMux (the pull engine's connections): a broker connection that drops fails its requests
at once, and a request to an address still down gives up after RECONNECT_WAIT_MS, not its own
(long-poll) timeout; a broker's own request goes to on_request, never to a pending request."""
import time

import zmq

from rmq import protocol as P
from rmq.client.consumer_api import RECONNECT_WAIT_MS, RequestMux
from rmq.errors import RemotingConnectionClosedError, RemotingError
from rmq.protocol import Frame, RequestCode

LONG_POLL_MS = 60_000


def _poll_until(mux, n, deadline_s):
    done, end = [], time.monotonic() + deadline_s
    while len(done) < n and time.monotonic() < end:
        got, _ = mux.poll(100)
        done += got
    return done


def test_dropped_connection_fails_requests_then_later_ones_give_up_after_the_reconnect_wait():
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    addr = f"127.0.0.1:{port}"
    mux = RequestMux(ctx)
    notified = []
    mux.on_request = lambda frame, a: notified.append((frame.code, a))
    try:
        mux.send(addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS, "held")
        parts = server.recv_multipart()                       # the broker holds it (a long poll)
        ident, req = parts[0], P.decode(parts[1:])
        # a broker's own request with the held request's opaque is not taken for its answer
        server.send_multipart([ident] + P.encode(Frame(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, req.opaque,
                                                       P.FLAG_ONEWAY, "", {"consumerGroup": "g"})))
        assert _poll_until(mux, 1, 1.0) == [] and notified == [(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, addr)]
        server.close(0)                                       # the broker dies with the request held
        done = _poll_until(mux, 1, 10.0)
        assert [(t, type(e)) for t, e, _ in done] == [("held", RemotingConnectionClosedError)]
        assert "closed with the request in flight" in str(done[0][1])
        t0 = time.monotonic()
        mux.send(addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS, "later")   # still down
        done = _poll_until(mux, 1, LONG_POLL_MS / 1000.0)
        waited = time.monotonic() - t0
        assert [t for t, _, _ in done] == ["later"] and isinstance(done[0][1], RemotingError)
        assert waited < LONG_POLL_MS / 1000.0 / 2, f"gave up after {waited:.1f} s, not RECONNECT_WAIT_MS"
        assert RECONNECT_WAIT_MS < LONG_POLL_MS / 2
    finally:
        mux.close()
        ctx.destroy(0)
