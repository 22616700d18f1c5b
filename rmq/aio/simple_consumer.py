"""asyncio SimpleConsumer: POP consumption with awaitable ``receive`` / ``ack`` /
``change_invisible_duration`` (same names, limits and errors as :class:`rmq.SimpleConsumer`)::

    from rmq.aio import SimpleConsumer
    async with SimpleConsumer("127.0.0.1:9876", "cg", subscriptions={"orders": "*"}) as c:
        for view in await c.receive(16, invisible_duration_s=30):
            await c.ack(view)

Any number of receives and acks may be in flight at once (one DEALER per broker, read from the
event loop, answers matched by opaque: :class:`rmq.aio.remoting.AsyncRemoting`): run several
receive loops as tasks of one consumer to keep a broker busy.  ``ack_batch`` calls of several
tasks to one broker are merged (:class:`rmq.client.simple_consumer.AckLane`): one
BATCH_ACK_MESSAGE in flight per broker, the calls that came meanwhile go together next.  The calls, frames and response parsing are those of
:mod:`rmq.client.simple_consumer`; this module only awaits them.

Concurrency: use a consumer from the event loop that started it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from rmq.aio.consumer import AsyncConsumerAPI
from rmq.client.calls import adrive, awaitable
from rmq.client.simple_consumer import (MAX_BATCH_ACK, AckError, AckLane, MessageView, SimpleConsumerCalls,
                                        ack_frame, batch_ack_failures, batch_ack_frame, check_ack_response,
                                        group_by_broker)
from rmq.errors import MQBrokerError, MQClientError
from rmq.protocol import ResponseCode

log = logging.getLogger("rmq.aio.simple_consumer")


class _Waiter:
    """A caller of :meth:`SimpleConsumer.ack` / ``ack_batch`` on an AckLane: the future its
    outcome goes to, and whether it is a single ``ack`` (ACK_MESSAGE when sent alone)."""
    __slots__ = ("fut", "single")

    def __init__(self, fut: asyncio.Future, single: bool):
        self.fut, self.single = fut, single


class SimpleConsumer(SimpleConsumerCalls):
    """Awaitable POP consumer; parameters, limits and errors as :class:`rmq.SimpleConsumer`
    (the same calls, :class:`rmq.client.simple_consumer.SimpleConsumerCalls`, awaited)."""

    _NOT_STARTED = "SimpleConsumer not started: await start()"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lanes: dict = {}              # broker address -> AckLane
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
        refused, addr = await self._lane_ack([message_view], True)
        if refused:
            v = message_view
            raise MQBrokerError(f"message {v.topic}/{v.queue_id}@{v.queue_offset} is not in flight: already "
                                f"acked, or its invisible time passed and it was revived", ResponseCode.NO_MESSAGE,
                                addr)

    async def ack_batch(self, message_views: Sequence[MessageView]) -> None:
        """Acknowledge many messages (as :meth:`rmq.SimpleConsumer.ack_batch`: AckError names the
        ones no longer in flight; MQBrokerError, RemotingError).  Acks of other tasks to the
        same broker made while one is in flight are sent with it as one request."""
        views = list(message_views)
        failed, _ = await self._lane_ack(views, False)
        if failed:
            raise AckError(f"{len(failed)} of {len(views)} acks refused: no longer in flight "
                           f"(their invisible time passed)", failed)

    async def _lane_ack(self, views: list, single: bool) -> tuple:
        """``(refused views, last broker address)``: ``views`` queued on their brokers' lanes
        (at most MAX_BATCH_ACK per entry), a lane's pump started when idle, every entry awaited."""
        api = self._started()
        failed: list = []
        addr = ""
        loop = asyncio.get_running_loop()
        for name, group_views in group_by_broker(views).items():
            addr = await adrive(api._broker_addr(name, group_views[0].topic), self._invoke)
            lane = self._lanes.get(addr)
            if lane is None or lane.broker_name != name:
                lane = self._lanes[addr] = AckLane(name)
            waiters = []
            for i in range(0, len(group_views), MAX_BATCH_ACK):
                w = _Waiter(loop.create_future(), single)
                lane.add(group_views[i:i + MAX_BATCH_ACK], w)
                waiters.append(w)
            if not lane.busy:
                lane.busy = True
                pump = loop.create_task(self._pump(addr, lane))
                self._pumps.add(pump)
                pump.add_done_callback(self._pumps.discard)
            for w in waiters:
                refused, exc = await w.fut
                if exc is not None:
                    raise exc
                failed += refused
        return failed, addr

    async def _pump(self, addr: str, lane: AckLane) -> None:
        """Send ``lane``'s requests one after the other until none waits; each waiter gets
        ``(refused views, None)`` or ``(None, exception)``.  An entry alone goes as before
        (ACK_MESSAGE for a single ack, its refusal an MQBrokerError); a merged request the broker
        refuses as a whole goes again entry by entry, so one call's refusal is its own."""
        taken: list = []
        try:
            while True:
                nxt = lane.take(self.group, live=lambda w: not w.fut.done())
                if nxt is None:
                    return
                frame, index, taken = nxt
                if len(taken) == 1:
                    outcomes = [(taken[0][1], await self._ack_alone(addr, lane.broker_name, *taken[0]))]
                else:
                    try:
                        failed = batch_ack_failures(await self._invoke(addr, frame, None), index, addr)
                        outcomes = [(w, (refused, None)) for w, refused in AckLane.outcomes(taken, failed)]
                    except MQBrokerError:
                        outcomes = [(w, await self._ack_alone(addr, lane.broker_name, vs, w)) for vs, w in taken]
                    except Exception as e:  # noqa: BLE001 - every waiter of the request gets it
                        outcomes = [(w, (None, e)) for _, w in taken]
                for w, outcome in outcomes:
                    if not w.fut.done():
                        w.fut.set_result(outcome)
                taken = []
        finally:
            lane.busy = False
            gone = MQClientError("SimpleConsumer closed while an ack was waiting to be sent")
            for _, w in list(taken) + list(lane.waiting):
                if not w.fut.done():
                    w.fut.set_result((None, gone))
            lane.waiting.clear()

    async def _ack_alone(self, addr: str, broker_name: str, views: list, w: _Waiter) -> tuple:
        """One entry as a request of its own (ACK_MESSAGE for a single ack, else
        BATCH_ACK_MESSAGE): ``(refused views, None)`` or ``(None, exc)``."""
        try:
            if w.single:
                check_ack_response(await self._invoke(addr, ack_frame(self.group, views[0]), None), views[0], addr)
                return [], None
            frame, index = batch_ack_frame(self.group, broker_name, views)
            return batch_ack_failures(await self._invoke(addr, frame, None), index, addr), None
        except Exception as e:  # noqa: BLE001 - the caller's outcome
            return None, e

    change_invisible_duration = awaitable(SimpleConsumerCalls._change_invisible_duration, "_invoke")


AsyncSimpleConsumer = SimpleConsumer

__all__ = ["SimpleConsumer", "AsyncSimpleConsumer", "MessageView", "AckError"]
