"""Driving sans-I/O wire calls, blocking or awaiting (psycopg 3's ``waiting.py`` rule: a call is
written once, as a generator, and each I/O style only waits).

A *call* is a generator that yields ``(addr, frame, timeout_ms)`` for each request it makes and
is sent the answer :class:`rmq.protocol.Frame`, or thrown the exception the request raised
(:class:`rmq.errors.RemotingError` and its subclasses, or what the transport raises when closed);
its return value is the call's result.  No sockets, threads or event loops inside it: the
consumer's route cache, read-address choice, frames and answer parsing
(:class:`rmq.client.consumer_api.ConsumerCalls`) are written that way, and
:class:`rmq.client.consumer_api.ConsumerAPI` (threads) and
:class:`rmq.aio.consumer.AsyncConsumerAPI` (asyncio) only drive them.

Concurrency: a call runs in the thread or task that drives it.
"""
from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, Generator

from rmq.protocol import Frame

#: What a call yields: ``(addr, frame, timeout_ms or None for the client's default)``.
Request = tuple
Call = Generator[Request, Frame, Any]


def drive(call: Call, invoke: Callable[[str, Frame, Any], Frame]) -> Any:
    """Run ``call`` to its end with a blocking ``invoke(addr, frame, timeout_ms) -> Frame``;
    its result, or the exception it did not handle."""
    step, value = call.send, None
    try:
        while True:
            addr, frame, timeout_ms = step(value)
            try:
                value, step = invoke(addr, frame, timeout_ms), call.send
            except Exception as e:  # noqa: BLE001 - handed to the call, which handles it or lets it out
                value, step = e, call.throw
    except StopIteration as stop:
        return stop.value


async def adrive(call: Call, invoke: Callable[[str, Frame, Any], Awaitable[Frame]]) -> Any:
    """:func:`drive` with an awaitable ``invoke``."""
    step, value = call.send, None
    try:
        while True:
            addr, frame, timeout_ms = step(value)
            try:
                value, step = await invoke(addr, frame, timeout_ms), call.send
            except Exception as e:  # noqa: BLE001 - handed to the call, which handles it or lets it out
                value, step = e, call.throw
    except StopIteration as stop:
        return stop.value


def blocking(call_fn: Callable[..., Call]) -> Callable[..., Any]:
    """A method that runs the call method ``call_fn`` with ``self.invoke`` (blocking); same
    signature and docstring."""
    @functools.wraps(call_fn)
    def method(self, *args, **kwargs):
        return drive(call_fn(self, *args, **kwargs), self.invoke)
    return method


def awaitable(call_fn: Callable[..., Call]) -> Callable[..., Awaitable[Any]]:
    """A coroutine method that runs the call method ``call_fn`` with ``await self.invoke``; same
    signature and docstring."""
    @functools.wraps(call_fn)
    async def method(self, *args, **kwargs):
        return await adrive(call_fn(self, *args, **kwargs), self.invoke)
    return method


__all__ = ["Call", "Request", "drive", "adrive", "blocking", "awaitable"]
