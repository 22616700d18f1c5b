"""RemotingClient (the blocking transport of ConsumerAPI, Admin and Producer.send's direct path):
a connection that drops with a request in flight fails it at once with
RemotingConnectionClosedError (a RemotingTimeoutError), and later requests to the address still
down give up after RECONNECT_WAIT_MS, not their own timeout; an immediate client writes its
first frame before the first request and gives up on a peer that never connects."""
import socket
import threading
import time

import pytest
import zmq

from rmq import protocol as P
from rmq.client.remoting import RECONNECT_WAIT_MS, RemotingClient
from rmq.errors import RemotingConnectionClosedError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, RequestCode, ResponseCode

LONG_MS = 60_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recv(sock: zmq.Socket, deadline_s: float = 10.0) -> tuple:
    assert sock.poll(deadline_s * 1000), "no request reached the broker"
    parts = sock.recv_multipart()
    return parts[0], P.decode(parts[1:])


def test_a_dropped_connection_fails_the_request_at_once_then_later_ones_wait_the_reconnect_time():
    ctx = zmq.Context()
    broker = ctx.socket(zmq.ROUTER)
    port = broker.bind_to_random_port("tcp://127.0.0.1")
    addr = f"127.0.0.1:{port}"
    rc = RemotingClient(ctx)
    try:
        # a broker that reads the request and dies without answering
        def die():
            _recv(broker)
            broker.close(0)
        t = threading.Thread(target=die)
        t.start()
        t0 = time.monotonic()
        with pytest.raises(RemotingConnectionClosedError, match="closed with the request in flight"):
            rc.invoke(addr, Frame(RequestCode.PULL_MESSAGE), LONG_MS)
        t.join(10)
        assert time.monotonic() - t0 < LONG_MS / 1000.0 / 2
        assert issubclass(RemotingConnectionClosedError, RemotingTimeoutError)   # "no answer" handlers catch it
        t0 = time.monotonic()
        with pytest.raises(RemotingTimeoutError):                 # still down: RECONNECT_WAIT_MS, not 60 s
            rc.invoke(addr, Frame(RequestCode.PULL_MESSAGE), LONG_MS)
        assert time.monotonic() - t0 < LONG_MS / 1000.0 / 2 and RECONNECT_WAIT_MS < LONG_MS / 2
    finally:
        rc.close()
        ctx.destroy(0)


def test_an_immediate_client_sends_its_first_frame_first_and_gives_up_on_a_peer_that_never_connects():
    ctx = zmq.Context()
    broker = ctx.socket(zmq.ROUTER)
    port = broker.bind_to_random_port("tcp://127.0.0.1")
    addr = f"127.0.0.1:{port}"
    rc = RemotingClient(ctx, immediate=True, on_connect=lambda a: Frame(RequestCode.HEART_BEAT, fields={"to": a}))
    try:
        def answer():
            _, first = _recv(broker)
            ident, req = _recv(broker)
            broker.send_multipart([ident] + P.encode(Frame(ResponseCode.SUCCESS, req.opaque, P.FLAG_RESPONSE,
                                                           f"after {first.code} to {first.fields['to']}")))
        t = threading.Thread(target=answer)
        t.start()
        resp = rc.invoke(addr, Frame(RequestCode.SEND_MESSAGE), 10_000)
        t.join(10)
        assert resp.remark == f"after {int(RequestCode.HEART_BEAT)} to {addr}"
        nobody = f"127.0.0.1:{_free_port()}"
        with pytest.raises(RemotingError, match="not connected within the connect timeout"):
            rc.invoke(nobody, Frame(RequestCode.SEND_MESSAGE), LONG_MS, connect_timeout_ms=200)
    finally:
        rc.close()
        broker.close(0)
        ctx.destroy(0)
