"""The proxy's side of rmq's own protocol: requests to NameServers and brokers over plain ZeroMQ
DEALER sockets driven straight from the event loop.

:class:`rmq.aio.consumer.AsyncRemoting` (``zmq.asyncio``) costs a future, a send event and a
``wait_for`` task per request; a proxy forwards every request a RocketMQ client makes, so this
transport keeps only what forwarding needs: one DEALER per address, its file descriptor watched
with ``loop.add_reader``, responses matched to futures by opaque, one timer handle per request.
Same frames (:mod:`rmq.protocol`), same CURVE keys (:mod:`rmq.security`).

ZeroMQ's descriptor is edge-triggered and only reading ``EVENTS`` clears it: the reader drains
while ``EVENTS`` has POLLIN (a bare recv raising Again would leave the descriptor readable and the
loop spinning on it), and after every send ``EVENTS`` is checked again, or a response that came
during the send would wait for the next edge.

Concurrency: one event loop.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Optional

import zmq

from rmq import protocol as P
from rmq import security
from rmq.errors import MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError

log = logging.getLogger("rmq.proxy.forward")

SEND_RETRY_S = 0.001          # a full send queue (SNDHWM) is retried this often until the request's timeout


class _Channel:
    __slots__ = ("addr", "sock", "fd")

    def __init__(self, addr: str, sock):
        self.addr, self.sock = addr, sock
        self.fd = sock.getsockopt(zmq.FD)


class Forwarder:
    """Request / response to rmq addresses (``host:port``), many in flight per socket.

    Parameters
    ----------
    auth : optional
        CURVE client keys as :func:`rmq.security.client_auth` takes them (None: plain, or the
        ``RMQ_AUTH_*`` environment).
    on_request : callable, optional
        ``on_request(addr, frame)`` for a frame a broker sends that is not a response (its
        one-way CHECK_TRANSACTION_STATE to a producer); None: such frames are dropped.
    """

    def __init__(self, auth=None, on_request=None):
        self.ctx = zmq.Context.instance()
        self.auth = security.client_auth(auth)
        self._channels: dict = {}
        self._futures: dict = {}
        self._opaque = itertools.count(1)
        self._closed = False
        self.on_request = on_request
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _channel(self, addr: str) -> _Channel:
        ch = self._channels.get(addr)
        if ch is None:
            if self._closed:
                raise MQClientError("the proxy's forwarder is closed")
            ch = _Channel(addr, P.dealer(self.ctx, addr, auth=self.auth))
            self._channels[addr] = ch
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(ch.fd, self._drain, ch)
        return ch

    def _drain(self, ch: _Channel) -> None:
        sock = ch.sock
        while True:
            try:
                # reading EVENTS is what clears the descriptor's signal: a recv that only raises
                # Again leaves it readable, and the loop's level-triggered poll would spin on it
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return
            try:
                resp = P.decode(parts)
            except ProtocolError as e:
                log.warning("undecodable response from %s: %s", ch.addr, e)
                continue
            if not resp.is_response:
                if self.on_request is not None:
                    try:
                        self.on_request(ch.addr, resp)
                    except Exception:  # noqa: BLE001 - one bad request never stops the reader
                        log.exception("request code %d from %s failed", resp.code, ch.addr)
                continue
            fut = self._futures.pop(resp.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(resp)

    async def invoke(self, addr: str, frame: Frame, timeout_ms: int) -> Frame:
        """Send ``frame`` to ``addr`` and await its response.

        Raises
        ------
        RemotingTimeoutError
            No response within ``timeout_ms``.
        MQClientError
            The forwarder is closed.
        """
        ch = self._channel(addr)
        loop = self._loop
        opaque = frame.opaque = next(self._opaque)
        frame.flag &= ~P.FLAG_ONEWAY
        fut = loop.create_future()
        self._futures[opaque] = fut
        timer = loop.call_later(timeout_ms / 1000.0, _expire, fut)
        try:
            parts = P.encode(frame)
            while True:
                try:
                    ch.sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:              # SNDHWM reached: wait for room, within the timeout
                    if fut.done():
                        break
                    await asyncio.sleep(SEND_RETRY_S)
            if ch.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._drain(ch)
            try:
                return await fut
            except asyncio.TimeoutError:
                raise RemotingTimeoutError(
                    f"no response from {addr} to request code {frame.code} within {timeout_ms} ms") from None
        finally:
            timer.cancel()
            self._futures.pop(opaque, None)

    def oneway(self, addr: str, frame: Frame) -> bool:
        """Send ``frame`` with the ONEWAY flag (no response is awaited); False when the socket's
        send queue is full (the frame is dropped, as RocketMQ's oneway under pressure)."""
        ch = self._channel(addr)
        frame.opaque = next(self._opaque)
        frame.flag |= P.FLAG_ONEWAY
        try:
            ch.sock.send_multipart(P.encode(frame), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        if ch.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._drain(ch)
        return True

    async def close(self) -> None:
        self._closed = True
        for ch in self._channels.values():
            if self._loop is not None:
                self._loop.remove_reader(ch.fd)
            ch.sock.close(0)
        for f in self._futures.values():
            if not f.done():
                f.set_exception(RemotingError("the proxy's forwarder closed"))
        self._channels.clear()
        self._futures.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


__all__ = ["Forwarder", "SEND_RETRY_S"]
