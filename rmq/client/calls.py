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


def _named(method, call_fn):
    # the call of public method ``x`` is ``_x``: the method takes its docstring, signature and name
    functools.update_wrapper(method, call_fn)
    method.__name__ = call_fn.__name__.lstrip("_")
    method.__qualname__ = call_fn.__qualname__.rpartition(".")[0] + "." + method.__name__
    return method


def blocking(call_fn: Callable[..., Call], invoke: str = "invoke") -> Callable[..., Any]:
    """The method ``x`` that runs the call method ``_x`` (``call_fn``) with the blocking method
    named ``invoke`` of the same object; same signature and docstring."""
    def method(self, *args, **kwargs):
        return drive(call_fn(self, *args, **kwargs), getattr(self, invoke))
    return _named(method, call_fn)


def awaitable(call_fn: Callable[..., Call], invoke: str = "invoke") -> Callable[..., Awaitable[Any]]:
    """The coroutine method ``x`` that runs the call method ``_x`` (``call_fn``) with the coroutine
    method named ``invoke`` of the same object; same signature and docstring."""
    async def method(self, *args, **kwargs):
        return await adrive(call_fn(self, *args, **kwargs), getattr(self, invoke))
    return _named(method, call_fn)


__all__ = ["Call", "Request", "drive", "adrive", "blocking", "awaitable"]
