"""AsyncRemoting (rmq.aio's consumers and the proxy): answers matched by opaque in any order; a
broker's own request goes to on_request, never to a pending request; a connection that drops
fails its requests at once (answers already queued first), and a request to an address still
down gives up after RECONNECT_WAIT_MS, not its own (long-poll) timeout; close fails what is in
flight."""
import asyncio
import time

import pytest
import zmq

from rmq import protocol as P
from rmq.aio.remoting import AsyncRemoting
from rmq.client.consumer_api import RECONNECT_WAIT_MS
from rmq.errors import MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, RequestCode, ResponseCode

LONG_POLL_MS = 60_000


class _Broker:
    """A ROUTER on loopback standing for a broker: reads requests, answers when told."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.addr = f"127.0.0.1:{self.port}"

    async def request(self, deadline_s: float = 10.0) -> tuple:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
                return parts[0], P.decode(parts[1:])
            except zmq.Again:
                await asyncio.sleep(0.005)
        raise AssertionError("no request reached the broker")

    def answer(self, ident: bytes, req: Frame, remark: str) -> None:
        self.sock.send_multipart([ident] + P.encode(Frame(ResponseCode.SUCCESS, req.opaque, P.FLAG_RESPONSE, remark)))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.destroy(0)


def test_answers_in_any_order_and_broker_requests_go_to_on_request():
    async def main():
        broker = _Broker()
        notified = []
        r = AsyncRemoting(on_request=lambda frame, addr: notified.append((frame.code, addr)))
        try:
            calls = [asyncio.ensure_future(r.invoke(broker.addr, Frame(RequestCode.GET_MAX_OFFSET,
                                                                       fields={"n": i}), 10_000))
                     for i in range(3)]
            got = [await broker.request() for _ in range(3)]
            # a broker's own request carrying a pending request's opaque is not its answer
            ident, first = got[0]
            broker.sock.send_multipart([ident] + P.encode(Frame(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, first.opaque,
                                                                P.FLAG_ONEWAY, "", {"consumerGroup": "g"})))
            for ident, req in reversed(got):
                broker.answer(ident, req, f"answer {req.fields['n']}")
            results = await asyncio.wait_for(asyncio.gather(*calls), 10)
            assert [f.remark for f in results] == ["answer 0", "answer 1", "answer 2"]
            assert notified == [(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, broker.addr)]
            with pytest.raises(RemotingTimeoutError, match="within 50 ms"):
                await r.invoke(broker.addr, Frame(RequestCode.GET_MAX_OFFSET), 50)
        finally:
            await r.close()
            broker.close()

    asyncio.run(main())


def test_dropped_connection_fails_requests_then_later_ones_give_up_after_the_reconnect_wait():
    async def main():
        broker = _Broker()
        r = AsyncRemoting()
        try:
            held = asyncio.ensure_future(r.invoke(broker.addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS))
            answered = asyncio.ensure_future(r.invoke(broker.addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS))
            (_, _), (ident, req) = await broker.request(), await broker.request()
            broker.answer(ident, req, "before the crash")       # queued before the connection drops
            broker.sock.close(0)                                # the broker dies with the other request held
            with pytest.raises(RemotingError, match="closed with the request in flight"):
                await asyncio.wait_for(held, 10)
            assert (await answered).remark == "before the crash"
            t0 = time.monotonic()
            with pytest.raises(RemotingTimeoutError):           # still down: RECONNECT_WAIT_MS, not 60 s
                await r.invoke(broker.addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS)
            waited = time.monotonic() - t0
            assert waited < LONG_POLL_MS / 1000.0 / 2, f"gave up after {waited:.1f} s, not RECONNECT_WAIT_MS"
            assert RECONNECT_WAIT_MS < LONG_POLL_MS / 2
        finally:
            await r.close()
            broker.ctx.destroy(0)

    asyncio.run(main())


def test_close_fails_requests_in_flight_and_refuses_new_ones():
    async def main():
        broker = _Broker()
        r = AsyncRemoting()
        try:
            pending = asyncio.ensure_future(r.invoke(broker.addr, Frame(RequestCode.PULL_MESSAGE), LONG_POLL_MS))
            await broker.request()
            await r.close()
            with pytest.raises(RemotingError, match="closed with a request"):
                await asyncio.wait_for(pending, 10)
            with pytest.raises(MQClientError, match="closed"):
                await r.invoke(broker.addr, Frame(RequestCode.PULL_MESSAGE), 1000)
            assert r.closed
        finally:
            broker.close()

    asyncio.run(main())


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_immediate_requests_wait_parked_for_the_peer_then_go_after_the_first_frame():
    async def main():
        port = _free_port()
        addr = f"127.0.0.1:{port}"
        r = AsyncRemoting(immediate=True, connect_timeout_ms=10_000,
                          on_connect=lambda a: Frame(RequestCode.HEART_BEAT, fields={"to": a}))
        broker = None
        try:
            call = asyncio.ensure_future(r.invoke(addr, Frame(RequestCode.SEND_MESSAGE), 10_000))
            for _ in range(5):
                await asyncio.sleep(0)                           # the loop runs the request's first steps
            assert not call.done()                               # parked: nobody listens yet
            broker = _Broker.__new__(_Broker)
            broker.ctx = zmq.Context()
            broker.sock = broker.ctx.socket(zmq.ROUTER)
            broker.sock.bind(f"tcp://{addr}")
            broker.addr = addr
            (_, first), (ident, req) = await broker.request(), await broker.request()
            assert first.code == RequestCode.HEART_BEAT and first.fields == {"to": addr}
            assert req.code == RequestCode.SEND_MESSAGE
            broker.answer(ident, req, "stored")
            assert (await asyncio.wait_for(call, 10)).remark == "stored"
        finally:
            await r.close()
            if broker is not None:
                broker.close()

    asyncio.run(main())


def test_an_immediate_request_nobody_takes_fails_after_the_connect_timeout():
    async def main():
        addr = f"127.0.0.1:{_free_port()}"
        r = AsyncRemoting(immediate=True, connect_timeout_ms=200)
        try:
            with pytest.raises(RemotingError, match="cannot connect"):
                await asyncio.wait_for(r.invoke(addr, Frame(RequestCode.SEND_MESSAGE), 60_000), 30)
            assert r.oneway(addr, Frame(RequestCode.HEART_BEAT)) is False     # nothing takes it: dropped
        finally:
            await r.close()

    asyncio.run(main())
