"""asyncio SimpleConsumer: POP consumption with awaitable ``receive`` / ``ack`` /
``change_invisible_duration`` (same names, limits and errors as :class:`rmq.SimpleConsumer`)::

    from rmq.aio import SimpleConsumer
    async with SimpleConsumer("127.0.0.1:9876", "cg", subscriptions={"orders": "*"}) as c:
        for view in await c.receive(16, invisible_duration_s=30):
            await c.ack(view)

Any number of receives and acks may be in flight at once (one DEALER per broker, read from the
event loop, answers matched by opaque: :class:`rmq.aio.remoting.AsyncRemoting`): run several
receive loops as tasks of one consumer to keep a broker busy.  The calls, frames and response parsing are those of
:mod:`rmq.client.simple_consumer`; this module only awaits them.

Concurrency: use a consumer from the event loop that started it.
"""
from __future__ import annotations

import logging

from rmq.aio.consumer import AsyncConsumerAPI
from rmq.client.calls import adrive, awaitable
from rmq.client.simple_consumer import AckError, MessageView, SimpleConsumerCalls

log = logging.getLogger("rmq.aio.simple_consumer")


class SimpleConsumer(SimpleConsumerCalls):
    """Awaitable POP consumer; parameters, limits and errors as :class:`rmq.SimpleConsumer`
    (the same calls, :class:`rmq.client.simple_consumer.SimpleConsumerCalls`, awaited)."""

    _NOT_STARTED = "SimpleConsumer not started: await start()"

    async def start(self) -> "SimpleConsumer":
        """Connect and look the subscribed topics up (MQClientError for a topic without a route)."""
        if self._api is None:
            self._api = AsyncConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self._auth)
        try:
            await adrive(self._start_call(), self._invoke)
        except BaseException:
            api, self._api = self._api, None
            await api.close()
            raise
        return self

    async def shutdown(self) -> None:
        """Unregister from the brokers and close (as :meth:`rmq.SimpleConsumer.shutdown`)."""
        if self._api is None:
            return
        await adrive(self._unregister_call(), self._invoke)
        api, self._api = self._api, None
        await api.close()

    close = shutdown

    async def __aenter__(self) -> "SimpleConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    subscribe = awaitable(SimpleConsumerCalls._subscribe, "_invoke")
    receive = awaitable(SimpleConsumerCalls._receive, "_invoke")
    ack = awaitable(SimpleConsumerCalls._ack, "_invoke")
    ack_batch = awaitable(SimpleConsumerCalls._ack_batch, "_invoke")
    change_invisible_duration = awaitable(SimpleConsumerCalls._change_invisible_duration, "_invoke")


AsyncSimpleConsumer = SimpleConsumer

__all__ = ["SimpleConsumer", "AsyncSimpleConsumer", "MessageView", "AckError"]
