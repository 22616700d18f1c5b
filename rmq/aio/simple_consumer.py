"""asyncio SimpleConsumer: POP consumption with awaitable ``receive`` / ``ack`` /
``change_invisible_duration`` (same names, limits and errors as :class:`rmq.SimpleConsumer`)::

    from rmq.aio import SimpleConsumer
    async with SimpleConsumer("127.0.0.1:9876", "cg", subscriptions={"orders": "*"}) as c:
        for view in await c.receive(16, invisible_duration_s=30):
            await c.ack(view)

Any number of receives and acks may be in flight at once (one DEALER per broker, read from the
event loop, answers matched by opaque: :class:`rmq.aio.remoting.AsyncRemoting`): run several receive loops as tasks of one
consumer to keep a broker busy.  The frames and response parsing are those of
:mod:`rmq.client.simple_consumer`.

Concurrency: use a consumer from the event loop that started it.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Mapping, Optional, Sequence, Union

from rmq.aio.consumer import AsyncConsumerAPI
from rmq.client.consumer_api import SubscriptionData, consumer_data, default_client_id, heartbeat_body
from rmq.client.remoting import DEFAULT_TIMEOUT_MS
from rmq.client.simple_consumer import (AWAIT_DURATION_S, CONSUME_TYPE_POP, HEARTBEAT_INTERVAL_S, MAX_BATCH_ACK,
                                        AckError, MessageView, ack_frame, apply_change_invisible, batch_ack_failures,
                                        batch_ack_frame, build_subscriptions, change_invisible_frame,
                                        check_ack_response, check_consumer_args, check_invisible, check_receive_args, group_by_broker,
                                        parse_pop_response, pop_frame, pop_targets)
from rmq.errors import MQClientError, RemotingError
from rmq.filter import MessageSelector
from rmq.protocol import Frame, RequestCode

log = logging.getLogger("rmq.aio.simple_consumer")


class SimpleConsumer:
    """Awaitable POP consumer; parameters as :class:`rmq.SimpleConsumer`."""

    def __init__(self, namesrv_addr: str, group: str, subscriptions: Optional[Mapping] = None, *,
                 await_duration_s: float = AWAIT_DURATION_S, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 init_mode: str = "MAX", client_id: Optional[str] = None, auth=None):
        check_consumer_args(group, init_mode, await_duration_s)
        self.namesrv_addr = namesrv_addr
        self.group = group
        self.await_ms = int(await_duration_s * 1000)
        self.timeout_ms = timeout_ms
        self.init_mode = init_mode
        self.client_id = client_id or default_client_id()
        self._subs = build_subscriptions(subscriptions)
        self._auth = auth
        self._api: Optional[AsyncConsumerAPI] = None
        self._rotate = itertools.count()
        self._last_heartbeat = 0.0

    async def start(self) -> "SimpleConsumer":
        """Connect and look the subscribed topics up (MQClientError for a topic without a route)."""
        if self._api is None:
            self._api = AsyncConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self._auth)
        try:
            for topic in self._subs:
                await self._route(topic)
        except BaseException:
            api, self._api = self._api, None
            await api.close()
            raise
        await self._heartbeat(force=True)
        return self

    def _started(self) -> AsyncConsumerAPI:
        if self._api is None:
            raise MQClientError("SimpleConsumer not started: await start()")
        return self._api

    async def shutdown(self) -> None:
        api, self._api = self._api, None
        if api is None:
            return
        for addr in api.all_broker_addrs():
            try:
                await api.unregister(addr, self.client_id, self.group)
            except (RemotingError, MQClientError):
                pass
        await api.close()

    close = shutdown

    async def __aenter__(self) -> "SimpleConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    async def subscribe(self, topic: str, expression: "Union[str, MessageSelector]" = "*") -> None:
        sub = SubscriptionData.build(topic, expression)
        if self._api is not None:
            await self._route(topic)
        self._subs[topic] = sub

    def unsubscribe(self, topic: str) -> None:
        self._subs.pop(topic, None)

    async def _route(self, topic: str):
        r = await self._started().route(topic)
        if r is None:
            raise MQClientError(f"no route for topic {topic!r}: does it exist?")
        return r

    async def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < HEARTBEAT_INTERVAL_S:
            return
        self._last_heartbeat = now
        api = self._started()
        data = consumer_data(self.group, CONSUME_TYPE_POP, "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                             list(self._subs.values()))
        for addr in api.heartbeat_addrs():
            try:
                await api.invoke(addr, Frame(RequestCode.HEART_BEAT, bodies=[heartbeat_body(self.client_id, [data])]))
            except (RemotingError, MQClientError) as e:
                log.debug("heartbeat to %s failed: %s", addr, e)

    async def receive(self, max_message_num: int, invisible_duration_s: float) -> list:
        """As :meth:`rmq.SimpleConsumer.receive`, awaitable."""
        invisible_ms = check_receive_args(max_message_num, invisible_duration_s)
        api = self._started()
        if not self._subs:
            raise MQClientError("no subscription: call subscribe() first")
        await self._heartbeat()
        for topic in self._subs:
            await api.refresh_route_if_stale(topic)
        targets = pop_targets(api.cached_routes(), self._subs)
        if not targets:
            raise MQClientError(f"no readable broker for topics {sorted(self._subs)}")
        start = next(self._rotate) % len(targets)
        order = targets[start:] + targets[:start]
        for sub, _name, addr in (order if len(order) > 1 else ()):
            views = await self._pop(api, sub, addr, max_message_num, invisible_ms, 0)
            if views:
                return views
        sub, _name, addr = order[0]
        return await self._pop(api, sub, addr, max_message_num, invisible_ms, self.await_ms)

    async def _pop(self, api: AsyncConsumerAPI, sub: SubscriptionData, addr: str, n: int, invisible_ms: int,
                   poll_ms: int) -> list:
        resp = await api.invoke(addr, pop_frame(self.group, sub, n, invisible_ms, poll_ms, self.init_mode),
                                poll_ms + self.timeout_ms)
        views, dropped = parse_pop_response(resp, sub, addr)
        if dropped:
            try:
                await self._batch_ack(api, dropped)
            except (MQClientError, RemotingError) as e:
                log.warning("ack of %d messages the tag filter dropped failed: %s", len(dropped), e)
        return views

    async def ack(self, message_view: MessageView) -> None:
        """As :meth:`rmq.SimpleConsumer.ack`, awaitable."""
        api = self._started()
        addr = await api.broker_addr(message_view.broker_name, message_view.topic)
        check_ack_response(await api.invoke(addr, ack_frame(self.group, message_view)), message_view, addr)

    async def ack_batch(self, message_views: Sequence[MessageView]) -> None:
        """As :meth:`rmq.SimpleConsumer.ack_batch`, awaitable (AckError names the refused)."""
        failed = await self._batch_ack(self._started(), list(message_views))
        if failed:
            raise AckError(f"{len(failed)} of {len(message_views)} acks refused: no longer in flight "
                           f"(their invisible time passed)", failed)

    async def _batch_ack(self, api: AsyncConsumerAPI, views: list) -> list:
        failed = []
        for name, group_views in group_by_broker(views).items():
            addr = await api.broker_addr(name, group_views[0].topic)
            for i in range(0, len(group_views), MAX_BATCH_ACK):
                frame, index = batch_ack_frame(self.group, name, group_views[i:i + MAX_BATCH_ACK])
                failed += batch_ack_failures(await api.invoke(addr, frame), index, addr)
        return failed

    async def change_invisible_duration(self, message_view: MessageView, invisible_duration_s: float) -> None:
        """As :meth:`rmq.SimpleConsumer.change_invisible_duration`, awaitable."""
        ms = check_invisible(invisible_duration_s)
        api = self._started()
        addr = await api.broker_addr(message_view.broker_name, message_view.topic)
        apply_change_invisible(await api.invoke(addr, change_invisible_frame(self.group, message_view, ms)),
                               message_view, addr)


AsyncSimpleConsumer = SimpleConsumer

__all__ = ["SimpleConsumer", "AsyncSimpleConsumer", "MessageView", "AckError"]
