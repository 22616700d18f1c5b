"""RemotingClient: request / response over a DEALER socket (one per client thread).

``invoke(addr, frame, timeout_ms)`` sends a request to ``tcp://addr`` and waits
for the response with the same opaque; ``invoke_oneway`` sends without waiting.
Responses that arrive after their request timed out are dropped.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Optional

import zmq

from rmq import protocol as P
from rmq import security
from rmq.errors import RemotingTimeoutError
from rmq.protocol import Frame

DEFAULT_TIMEOUT_MS = 3000

__all__ = ["RemotingClient", "RemotingTimeoutError", "DEFAULT_TIMEOUT_MS"]


class RemotingClient:
    """One DEALER socket per remote address; not thread-safe (one per thread)."""

    def __init__(self, ctx: Optional[zmq.Context] = None, auth=None):
        """``auth``: CURVE client keys, see :func:`rmq.security.client_auth` (None: the
        environment's RMQ_AUTH_CLIENT_KEY / RMQ_AUTH_SERVER_KEY, else plain)."""
        self.ctx = ctx or zmq.Context.instance()
        self.auth = security.client_auth(auth)
        self._sockets: dict[str, zmq.Socket] = {}
        self._opaque = itertools.count(1)
        self._lock = threading.Lock()

    def _socket(self, addr: str) -> zmq.Socket:
        s = self._sockets.get(addr)
        if s is None:
            s = P.dealer(self.ctx, addr, auth=self.auth)
            self._sockets[addr] = s
        return s

    def invoke(self, addr: str, frame: Frame, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Frame:
        """Send ``frame`` and return its response.

        Raises
        ------
        RemotingTimeoutError
            No response in ``timeout_ms``.
        ProtocolError
            The response could not be decoded.
        """
        s = self._socket(addr)
        frame.opaque = next(self._opaque)
        frame.flag &= ~P.FLAG_ONEWAY
        s.send_multipart(P.encode(frame), copy=False)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not s.poll(left * 1000.0):
                raise RemotingTimeoutError(
                    f"no response from {addr} to request code {frame.code} within {timeout_ms} ms")
            parts = s.recv_multipart(copy=False)
            resp = P.decode(parts)
            if resp.opaque == frame.opaque and resp.is_response:   # not a broker's own request (NOTIFY_...)
                return resp

    def invoke_oneway(self, addr: str, frame: Frame) -> None:
        frame.flag |= P.FLAG_ONEWAY
        frame.opaque = next(self._opaque)
        self._socket(addr).send_multipart(P.encode(frame), copy=False)

    def send_raw(self, addr: str, parts: list) -> None:
        """Send arbitrary parts (fuzz tests)."""
        self._socket(addr).send_multipart(parts)

    def recv_raw(self, addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Optional[Frame]:
        s = self._socket(addr)
        if not s.poll(timeout_ms):
            return None
        parts = s.recv_multipart()
        while parts and parts[0] == b"":      # a reply routed back with a REQ-style delimiter
            parts = parts[1:]
        return P.decode(parts)

    def close(self) -> None:
        for s in self._sockets.values():
            s.close(0)
        self._sockets.clear()

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
