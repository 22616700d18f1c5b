"""asyncio SimpleConsumer: POP consumption with awaitable ``receive`` / ``ack`` /
``change_invisible_duration`` (same names, limits and errors as :class:`rmq.SimpleConsumer`)::

    from rmq.aio import SimpleConsumer
    async with SimpleConsumer("127.0.0.1:9876", "cg", subscriptions={"orders": "*"}) as c:
        for view in await c.receive(16, invisible_duration_s=30):
            await c.ack(view)

Any number of receives and acks may be in flight at once (one DEALER per broker, read from the
event loop, answers matched by opaque: :class:`rmq.aio.remoting.AsyncRemoting`): run several
receive loops as tasks of one consumer to keep a broker busy.  ``ack`` / ``ack_batch`` calls
of several tasks to one broker are merged (:class:`rmq.client.simple_consumer.AckLane`): at most
ACK_REQUESTS_IN_FLIGHT (2) ack requests in flight per broker, the calls made meanwhile go
together as the next BATCH_ACK_MESSAGE.  The calls, frames and response parsing are those of
:mod:`rmq.client.simple_consumer`; this module only awaits them.

Concurrency: use a consumer from the event loop that started it.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Sequence

from rmq.aio.consumer import AsyncConsumerAPI
from rmq.client.calls import adrive, awaitable
from rmq.client.simple_consumer import (ACK_REQUESTS_IN_FLIGHT, MAX_BATCH_ACK, AckError, AckLane, AckWaiter,
                                        MessageView, SimpleConsumerCalls, ack_request_call, group_by_broker)
from rmq.errors import MQClientError

log = logging.getLogger("rmq.aio.simple_consumer")


class SimpleConsumer(SimpleConsumerCalls):
    """Awaitable POP consumer; parameters, limits and errors as :class:`rmq.SimpleConsumer`
    (the same calls, :class:`rmq.client.simple_consumer.SimpleConsumerCalls`, awaited)."""

    _NOT_STARTED = "SimpleConsumer not started: await start()"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lanes: dict = {}              # broker name -> AckLane
        self._pumps: set = set()            # the lanes' sending tasks

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
        if self._pumps:                     # acks already asked for go out first
            await asyncio.gather(*self._pumps, return_exceptions=True)
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

    async def ack(self, message_view: MessageView) -> None:
        """Acknowledge one message (as :meth:`rmq.SimpleConsumer.ack`: MQBrokerError NO_MESSAGE when
        it is no longer in flight; RemotingError).  Alone it goes as ACK_MESSAGE; acks of other
        tasks to the same broker made while one is in flight go with it as one BATCH_ACK_MESSAGE."""
        if not isinstance(message_view, MessageView):
            raise MQClientError(f"expected a MessageView, got {type(message_view).__name__}")
        self._started()
        w = AckWaiter(asyncio.get_running_loop().create_future(), True)
        self._enqueue(message_view.broker_name, [message_view], w)
        _, exc = await w.fut                    # a refusal comes as NO_MESSAGE's error (single)
        if exc is not None:
            raise exc

    async def ack_batch(self, message_views: Sequence[MessageView]) -> None:
        """Acknowledge many messages (as :meth:`rmq.SimpleConsumer.ack_batch`: AckError names the
        ones no longer in flight; MQBrokerError, RemotingError).  Acks of other tasks to the
        same broker made while one is in flight are sent with it as one request."""
        views = list(message_views)
        failed = await self._lane_ack(views)
        if failed:
            raise AckError(f"{len(failed)} of {len(views)} acks refused: no longer in flight "
                           f"(their invisible time passed)", failed)

    async def _lane_ack(self, views: list) -> list:
        """The views the brokers refused: ``views`` queued on their brokers' lanes (at most
        MAX_BATCH_ACK per entry, :meth:`_enqueue`), every entry awaited; the first failure raised."""
        self._started()
        failed: list = []
        loop = asyncio.get_running_loop()
        waiters = []
        for name, group_views in group_by_broker(views).items():
            for i in range(0, len(group_views), MAX_BATCH_ACK):
                w = AckWaiter(loop.create_future(), False)
                self._enqueue(name, group_views[i:i + MAX_BATCH_ACK], w)
                waiters.append(w)
        for w in waiters:
            refused, exc = await w.fut
            if exc is not None:
                raise exc
            failed += refused
        return failed

    def _enqueue(self, broker_name: str, views: list, w: AckWaiter) -> None:
        """Queue ``views`` (1..MAX_BATCH_ACK of ``broker_name``'s) for ``w`` on the broker's lane,
        and start one of its pumps if fewer than its limit are at work."""
        lane = self._lanes.get(broker_name)
        if lane is None:
            lane = self._lanes[broker_name] = AckLane(broker_name, ACK_REQUESTS_IN_FLIGHT)
        lane.add(views, w)
        if lane.sending < lane.limit:
            lane.sending += 1
            pump = asyncio.get_running_loop().create_task(self._pump(lane))
            self._pumps.add(pump)
            pump.add_done_callback(functools.partial(self._pump_done, lane))

    async def _pump(self, lane: AckLane) -> None:
        """One of ``lane``'s senders (at most ``lane.limit``): its requests one after the other
        (:func:`ack_request_call`) until none waits; each waiter's future gets ``(refused views,
        exception or None)``; the waiters left when the last sender stops (cancelled, closed) get
        an MQClientError."""
        entries: list = []
        gone: BaseException = MQClientError("SimpleConsumer closed while an ack was waiting to be sent")
        try:
            while True:
                entries = lane.take(live=lambda w: not w.fut.done()) or []
                if not entries:
                    return
                for w, refused, exc in await adrive(ack_request_call(self._started(), self.group, lane, entries),
                                                    self._invoke):
                    if not w.fut.done():
                        w.fut.set_result((refused, exc))
        except Exception as e:  # noqa: BLE001 - e.g. closed under it: the waiters left get it
            gone = e
        finally:
            self._pumps.discard(asyncio.current_task())
            self._sender_gone(lane, entries, gone)

    def _pump_done(self, lane: AckLane, task: asyncio.Task) -> None:
        """A pump cancelled before it ran (its ``finally`` never did): count it out, as it would."""
        if task in self._pumps:
            self._pumps.discard(task)
            self._sender_gone(lane, [], MQClientError("SimpleConsumer closed while an ack was waiting to be sent"))

    @staticmethod
    def _sender_gone(lane: AckLane, entries: list, gone: BaseException) -> None:
        lane.sending -= 1
        left = list(entries)                  # a request cut short (cancelled, failed): its waiters
        if not lane.sending:                  # no sender left for what waits
            left += lane.waiting
            lane.waiting.clear()
        for _, w in left:
            if not w.fut.done():
                w.fut.set_result((None, gone))

    change_invisible_duration = awaitable(SimpleConsumerCalls._change_invisible_duration, "_invoke")


AsyncSimpleConsumer = SimpleConsumer

__all__ = ["SimpleConsumer", "AsyncSimpleConsumer", "MessageView", "AckError"]
