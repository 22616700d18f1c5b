"""asyncio consumers: ``AsyncPullConsumer`` and ``AsyncPushConsumer``.

Same behaviour and names as :mod:`rmq.client.consumer` (SPEC.md §12, §13, §15.2), awaitable::

    async with AsyncPullConsumer("127.0.0.1:9876", group="cg") as c:
        mqs = await c.fetch_subscribe_message_queues("flights")
        res = await c.pull(mqs[0], "*", offset=0, max_nums=32)
        c.assign(mqs)
        async for msg in c:            # long polling over every assigned queue
            ...
        batch = await c.poll_arrow()   # or a pyarrow.RecordBatch per poll (rmq[spark])

    c = AsyncPushConsumer("127.0.0.1:9876", "cg")
    c.subscribe("flights", "tagA || tagB")

    @c.register_message_listener
    async def on_msgs(msgs, ctx):      # a plain function runs in a worker thread
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    await c.start(); ...; await c.shutdown()

Design: one event loop, no threads of its own.  :class:`rmq.aio.remoting.AsyncRemoting` keeps
one DEALER per broker address, read from the loop, that resolves futures by opaque, so every
queue's long-polling pull is in flight at once.  The
push consumer runs one task per assigned queue (its pull loop), one service task
(rebalance, heartbeats, offset persistence, lock renewal), concurrent listener
calls bounded by a semaphore (``consume_thread_max``), and in orderly mode one
consume task per queue at a time.  The pure parts (allocation strategies,
ProcessQueue, offset tables, frames, tag filtering, consumeFromWhere) are shared
with the threaded consumer.

Concurrency: use a consumer from the event loop that started it.
"""
from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

from rmq import latency_trace as _lt
from rmq._core.consume import ConsumeRun
from rmq.client.consumer import (BROKER_SUSPEND_MAX_TIME_MS, CONSUME_THREAD_MAX,
                                 HEARTBEAT_BROKER_INTERVAL_MS, MAX_TIME_CONSUME_CONTINUOUSLY_MS,
                                 PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
                                 POLL_NAME_SERVER_INTERVAL_MS, PUSH_PULL_BATCH_SIZE, PULL_THRESHOLD_FOR_QUEUE,
                                 PULL_THRESHOLD_SIZE_FOR_QUEUE_MB, PULL_TIME_DELAY_MS_WHEN_EXCEPTION,
                                 REBALANCE_INTERVAL_MS,
                                 REBALANCE_LOCK_INTERVAL_MS, RECONSUME_LATER_LOCALLY_MS, SHUTDOWN_AWAIT_MS,
                                 SUSPEND_CURRENT_QUEUE_TIME_MS, CONSUME_CONCURRENTLY_MAX_SPAN,
                                 ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeFromWhere,
                                 ConsumeOrderlyContext, ConsumeOrderlyStatus, MessageModel, _concurrent_status,
                                 PullConsumerCalls, PushConsumerCalls, arrow_modules, pages_batch)
from rmq.aio.remoting import AsyncRemoting
from rmq.client.calls import adrive, awaitable
from rmq.client.consumer_api import (CONSUMER_TIMEOUT_MS_WHEN_SUSPEND, ConsumerCalls, SubscriptionData,
                                     build_pull_frame, parse_pull_response)
from rmq.client.consumer_process_queue import ProcessQueue
from rmq.client.message import MessageQueue
from rmq.client.offset_store import LocalFileOffsetStore, OffsetStore
from rmq.client.remoting import DEFAULT_TIMEOUT_MS
from rmq.client import trace as _trace
from rmq.common.malloc_tuning import tune_malloc
from rmq.common.mix_all import retry_topic
from rmq.filter import MessageSelector
from rmq.errors import MQBrokerError, MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode

if TYPE_CHECKING:
    import pyarrow

log = logging.getLogger("rmq.aio.consumer")

__all__ = ["AsyncRemoting", "AsyncConsumerAPI", "AsyncPullConsumer", "AsyncPushConsumer", "PullConsumer",
           "PushConsumer", "ConsumeConcurrentlyStatus", "ConsumeOrderlyStatus", "MessageModel", "ConsumeFromWhere"]


class AsyncConsumerAPI(ConsumerCalls):
    """Awaitable twin of :class:`rmq.client.consumer_api.ConsumerAPI`: the same calls
    (:class:`rmq.client.consumer_api.ConsumerCalls`), driven with an awaitable :meth:`invoke` over
    :class:`rmq.aio.remoting.AsyncRemoting`.

    Concurrency: one event loop.
    """

    def __init__(self, namesrv_addr: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, auth=None):
        super().__init__(namesrv_addr, timeout_ms)
        tune_malloc()                               # pull pages: rmq.common.malloc_tuning
        self.auth = auth
        self.remoting = AsyncRemoting(auth=self.auth)

    async def invoke(self, addr: str, frame: Frame, timeout_ms: Optional[int] = None) -> Frame:
        """Send ``frame``, await the answer; a RemotingError makes ``addr`` avoided by the read
        choices for a while (see :class:`PullFromWhichNode`), an answer clears that."""
        try:
            resp = await self.remoting.invoke(addr, frame, timeout_ms or self.timeout_ms)
        except RemotingError as e:
            self._answered(addr, e)
            raise
        self._answered(addr, resp)
        return resp

    async def close(self) -> None:
        await self.remoting.close()

    fetch_route = awaitable(ConsumerCalls._fetch_route)
    route = awaitable(ConsumerCalls._route)
    refresh_route_if_stale = awaitable(ConsumerCalls._refresh_route_if_stale)
    refresh_doubtful_routes = awaitable(ConsumerCalls._refresh_doubtful_routes)
    group_addrs = awaitable(ConsumerCalls._group_addrs)
    broker_addr = awaitable(ConsumerCalls._broker_addr)
    read_broker_addr = awaitable(ConsumerCalls._read_broker_addr)
    pull_broker_addr = awaitable(ConsumerCalls._pull_broker_addr)
    pull = awaitable(ConsumerCalls._pull)
    max_offset = awaitable(ConsumerCalls._max_offset)
    min_offset = awaitable(ConsumerCalls._min_offset)
    search_offset = awaitable(ConsumerCalls._search_offset)
    query_consumer_offset = awaitable(ConsumerCalls._query_consumer_offset)
    update_consumer_offset = awaitable(ConsumerCalls._update_consumer_offset)
    heartbeat = awaitable(ConsumerCalls._heartbeat)
    unregister = awaitable(ConsumerCalls._unregister)
    consumer_id_list = awaitable(ConsumerCalls._consumer_id_list)
    lock_batch_mq = awaitable(ConsumerCalls._lock_batch_mq)
    unlock_batch_mq = awaitable(ConsumerCalls._unlock_batch_mq)
    send_message_back = awaitable(ConsumerCalls._send_message_back)


# -- pull consumer -------------------------------------------------------------------------------------
class AsyncPullConsumer(PullConsumerCalls):
    """Awaitable :class:`rmq.client.consumer.PullConsumer` (same parameters, methods and calls,
    :class:`rmq.client.consumer.PullConsumerCalls`, awaited; ``assign`` / ``seek`` are plain calls).
    ``_inflight`` holds each queue's pull as ``(task, offset)``."""

    async def start(self) -> "AsyncPullConsumer":
        if self._closed:
            raise MQClientError("the consumer is shut down")
        self._api()
        return self

    def _api(self) -> AsyncConsumerAPI:
        if self.api is None:
            self.api = AsyncConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self.auth)
        return self.api

    _client = _api

    async def shutdown(self) -> None:
        if self._closed:
            return
        try:
            if self.auto_commit and self.api is not None and self._positions:
                try:
                    await self.commit_sync()
                except MQClientError as e:
                    log.warning("commit on close failed: %s", e)
        finally:
            self._closed = True
            for task, _ in self._inflight.values():
                task.cancel()
            await asyncio.gather(*(t for t, _ in self._inflight.values()), return_exceptions=True)
            self._inflight.clear()
            if self.api is not None:
                await self.api.close()

    close = shutdown

    async def __aenter__(self) -> "AsyncPullConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _forget(self, mq: MessageQueue) -> None:
        entry = self._inflight.pop(mq, None)
        if entry is not None:
            entry[0].cancel()

    fetch_subscribe_message_queues = awaitable(PullConsumerCalls._fetch_subscribe_message_queues, "_invoke")
    pull = awaitable(PullConsumerCalls._pull, "_invoke")
    pull_block_if_not_found = awaitable(PullConsumerCalls._pull_block_if_not_found, "_invoke")
    min_offset = awaitable(PullConsumerCalls._min_offset, "_invoke")
    max_offset = awaitable(PullConsumerCalls._max_offset, "_invoke")
    search_offset = awaitable(PullConsumerCalls._search_offset, "_invoke")
    fetch_consume_offset = awaitable(PullConsumerCalls._fetch_consume_offset, "_invoke")
    committed = fetch_consume_offset
    update_consume_offset = awaitable(PullConsumerCalls._update_consume_offset, "_invoke")
    seek_by_time = awaitable(PullConsumerCalls._seek_by_time, "_invoke")
    seek_to_begin = awaitable(PullConsumerCalls._seek_to_begin, "_invoke")
    seek_to_end = awaitable(PullConsumerCalls._seek_to_end, "_invoke")
    position = awaitable(PullConsumerCalls._position, "_invoke")
    commit_sync = awaitable(PullConsumerCalls._commit_sync, "_invoke")

    async def _pull_one(self, mq: MessageQueue, offset: int, suspend: int) -> tuple:
        api = self._api()
        _, addr = await api.pull_broker_addr(mq)          # suggested broker / master / a slave
        frame = build_pull_frame(self.group, mq, offset, self.pull_batch_size, self._subs[mq.topic], -1,
                                 suspend, api.pull_epoch(mq, offset))
        try:
            resp = await api.invoke(addr, frame, suspend + self.timeout_ms)
        except RemotingError as e:
            e.broker_addr = addr                          # for poll: retry elsewhere when it can
            api.note_pull_outcome(mq, e)
            raise
        api.note_pull_outcome(mq, resp)
        api.pull_from.update_from_response(mq, resp)
        return resp, addr

    async def poll(self, timeout_ms: int = 1000) -> list:
        """Messages from the assigned queues, awaiting up to ``timeout_ms`` (long polling); as
        :meth:`rmq.client.consumer.PullConsumer.poll`."""
        return await self._poll(timeout_ms, self._decode_messages)

    async def poll_arrow(self, timeout_ms: int = 1000, include_properties: bool = False) -> "pyarrow.RecordBatch":
        """As :meth:`poll`, as one ``pyarrow.RecordBatch``; the rows, schema and errors of
        :meth:`rmq.client.consumer.PullConsumer.poll_arrow` (decoded column-wise in C, on the
        event loop's thread).  Zero rows when nothing arrived in time.

        Raises
        ------
        MQClientError
            pyarrow is not installed (``pip install 'rmq[spark]'``; nothing is polled), or as :meth:`poll`.
        MQBrokerError
            As :meth:`poll`.
        """
        modules = arrow_modules()
        return pages_batch(await self._poll(timeout_ms, self._raw_page), include_properties, modules)

    async def _poll(self, timeout_ms: int, decode: Callable) -> list:
        """poll()'s loop; each answer goes through :meth:`PullConsumerCalls._take_answer` with
        ``decode`` (the thread consumer's rules)."""
        new = [mq for mq in self._assigned if mq not in self._positions]
        if len(new) > 1 and not self._closed:     # the start positions of new queues, all at once
            for r in await asyncio.gather(*(adrive(self._initial_position_call(mq), self._invoke) for mq in new),
                                          return_exceptions=True):
                if isinstance(r, BaseException):
                    raise r
        await adrive(self._before_poll_call(), self._invoke)
        if not self._assigned:
            await asyncio.sleep(timeout_ms / 1000.0)
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        out: list = []
        error: Optional[Exception] = None
        failed: set = set()
        taken: set = set()                  # queues this call has a page of
        while True:
            left_ms = int((deadline - loop.time()) * 1000)
            self._send_pulls(loop, min(max(left_ms, 0), BROKER_SUSPEND_MAX_TIME_MS), failed)
            tasks = {t: mq for mq, (t, _) in self._inflight.items() if mq not in taken}
            if out:                             # one more turn of the loop: the answers read meanwhile
                await asyncio.sleep(0)
                done = {t for t in tasks if t.done()}
            elif tasks:
                done, _ = await asyncio.wait(tasks, timeout=max(0.0, left_ms / 1000.0),
                                             return_when=asyncio.FIRST_COMPLETED)
            else:                               # every queue failed in this call (checked below)
                done = set()
            took = False
            for task in done:
                mq = tasks[task]
                entry = self._inflight.get(mq)
                if entry is None or entry[0] is not task:
                    continue                      # superseded (seek, re-assign) while awaited
                del self._inflight[mq]
                try:
                    resp, addr = task.result()
                except MQClientError as e:        # RemotingError carries where it went
                    resp, addr = e, getattr(e, "broker_addr", "")
                items, e = self._take_answer(mq, entry[1], resp, addr, decode, failed)
                if e is not None:
                    error = e
                elif items:
                    out.extend(items)
                    taken.add(mq)
                    took = True
            if out:
                # prefetch (Kafka's fetcher): the next page of each queue answered is asked for at
                # once (the thread consumer's rule), and what else was read in one more turn of the
                # loop joins this call's batch; positions move only when a page is returned
                self._send_pulls(loop, BROKER_SUSPEND_MAX_TIME_MS, failed)
                if took:
                    continue
                return out
            if loop.time() >= deadline or len(failed) == len(self._assigned):
                if error is not None:
                    raise error
                return out

    def _send_pulls(self, loop, suspend_ms: int, failed: set) -> None:
        """A pull task for every assigned queue that has none and has not failed in this poll."""
        for mq in self._assigned:
            if mq in self._inflight or mq in failed:
                continue
            off = self._positions[mq]
            self._inflight[mq] = (loop.create_task(self._pull_one(mq, off, suspend_ms)), off)

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while not self._closed:
            for m in await self.poll(1000):
                yield m


# -- push consumer -------------------------------------------------------------------------------------
class _AsyncOffsets:
    """The offset table with awaitable store I/O: on the brokers (CLUSTERING) or in a local file."""

    def __init__(self, table: OffsetStore, api: Optional[AsyncConsumerAPI]):
        self.table = table
        self.api = api
        self._persisted: dict = {}
        self._loaded: dict = {}             # what the store held when this member read it

    async def read_from_store(self, mq: MessageQueue) -> int:
        if self.api is None:
            return self.table.read_memory(mq)
        try:
            off = await self.api.query_consumer_offset(self.table.group, mq)
        except MQBrokerError as e:
            log.warning("query offset of %s: %s", mq, e)
            return -1
        except MQClientError as e:
            log.warning("query offset of %s: %s", mq, e)
            return -2
        if off >= 0:
            self._persisted[mq] = self._loaded[mq] = off
        return off

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all([mq], force=True)

    def forget_persisted(self, mq: MessageQueue) -> None:
        """As :meth:`rmq.client.offset_store.OffsetStore.forget_persisted`."""
        self._persisted.pop(mq, None)

    async def persist_all(self, mqs: Iterable[MessageQueue], force: bool = False) -> None:
        if self.api is None:
            self.table.persist_all(mqs)
            return
        for mq in mqs:
            off = self.table.read_memory(mq)
            # the thread store's rule (RemoteBrokerOffsetStore._to_send)
            if off < 0 or (self._persisted.get(mq) == off and (not force or self._loaded.get(mq) == off)):
                continue
            try:
                await self.api.update_consumer_offset(self.table.group, mq, off)
                self._persisted[mq] = off
            except MQClientError as e:
                log.warning("persist offset %d of %s failed: %s", off, mq, e)

    def remove(self, mq: MessageQueue) -> None:
        self.table.remove_offset(mq)
        self._persisted.pop(mq, None)
        self._loaded.pop(mq, None)


class AsyncPushConsumer(PushConsumerCalls):
    """Awaitable :class:`rmq.client.consumer.PushConsumer`: same parameters (``consume_thread_max``
    bounds concurrent listener calls), ``await start()`` / ``await shutdown()``.  The listener may
    be a coroutine function (awaited on the loop) or a plain function (run in a worker thread)."""

    def __init__(self, namesrv_addr: str, group: str, message_model: Union[str, MessageModel] = "CLUSTERING",
                 consume_from_where: Union[str, ConsumeFromWhere] = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 allocate_strategy=None, consume_thread_max: int = CONSUME_THREAD_MAX,
                 pull_batch_size: int = PUSH_PULL_BATCH_SIZE, consume_message_batch_max_size: int = 1,
                 max_reconsume_times: int = -1, rebalance_interval_ms: int = REBALANCE_INTERVAL_MS, *,
                 consume_timestamp_ms: Optional[int] = None,
                 pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE,
                 pull_threshold_size_for_queue_mb: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_MB,
                 consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN,
                 suspend_current_queue_time_millis: int = SUSPEND_CURRENT_QUEUE_TIME_MS,
                 persist_consumer_offset_interval_ms: int = PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
                 heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
                 poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
                 lock_interval_ms: int = REBALANCE_LOCK_INTERVAL_MS, instance_name: Optional[str] = None,
                 offset_store_dir: Optional[str] = None, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 shutdown_await_ms: int = SHUTDOWN_AWAIT_MS, auth=None, enable_msg_trace: bool = False,
                 custom_trace_topic: Optional[str] = None):
        self._configure(locals())         # as rmq.PushConsumer's (checked the same way)
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.listener: Optional[Callable] = None
        self.orderly = False
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self._consume_locks: dict = {}            # ProcessQueue -> asyncio.Lock (orderly)
        self._tasks: set = set()
        self._pull_tasks: dict = {}
        self.api: Optional[AsyncConsumerAPI] = None
        self.offsets: Optional[_AsyncOffsets] = None
        self.offset_store: Optional[OffsetStore] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._listener_seen = None               # the listener _listener_async was found for
        self._listener_async = False
        self._running_tasks = 0                 # _consume_run tasks alive (their loop only)
        self._wakeup: Optional[asyncio.Event] = None
        self._service: Optional[asyncio.Task] = None
        self._heartbeats: Optional[asyncio.Task] = None
        self._state = "CREATED"
        self.stats = {"consumed_ok": 0, "consumed_failed": 0, "sent_back": 0, "send_back_failed": 0, "pulls": 0,
                      "flow_control": 0}

    # -- configuration --------------------------------------------------------------------------
    def subscribe(self, topic: str, sub_expression: "str | MessageSelector" = "*") -> None:
        """As :meth:`rmq.PushConsumer.subscribe`: tags or ``MessageSelector.by_sql(...)``."""
        self.subscriptions[topic] = SubscriptionData.build(topic, sub_expression)
        if self._wakeup is not None:
            self._wakeup.set()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self._wakeup is not None:
            self._wakeup.set()

    def _on_broker_request(self, frame: Frame, addr: str) -> None:
        """A broker's request on a consumer connection: NOTIFY_CONSUMER_IDS_CHANGED of this group
        makes it rebalance now (RocketMQ's ClientRemotingProcessor.notifyConsumerIdsChanged)."""
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and \
                frame.fields.get("consumerGroup") == self.group and self._wakeup is not None:
            self._wakeup.set()

    def register_message_listener(self, fn: Callable) -> Callable:
        self.listener, self.orderly = fn, False
        return fn

    def register_message_listener_orderly(self, fn: Callable) -> Callable:
        self.listener, self.orderly = fn, True
        return fn

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    def assigned_message_queues(self, topic: Optional[str] = None) -> list:
        return sorted(mq for mq, pq in self.process_queue_table.items()
                      if not pq.dropped and (topic is None or mq.topic == topic))

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> "AsyncPushConsumer":
        if self._state != "CREATED":
            raise MQClientError(f"the consumer is {self._state}, it can be started once")
        if self.listener is None:
            raise MQClientError("register a message listener before start()")
        if not self.subscriptions:
            raise MQClientError("subscribe to a topic before start()")
        self.api = AsyncConsumerAPI(self.namesrv_addr, self.timeout_ms, auth=self.auth)
        self.api.remoting.on_request = self._on_broker_request
        if self.clustering:
            self.subscriptions.setdefault(retry_topic(self.group), SubscriptionData.build(retry_topic(self.group), "*"))
            self.offset_store = OffsetStore(self.group)
            self.offsets = _AsyncOffsets(self.offset_store, self.api)
        else:
            self.offset_store = LocalFileOffsetStore(self.group, self.client_id, self.offset_store_dir)
            self.offset_store.load()
            self.offsets = _AsyncOffsets(self.offset_store, None)
        if self.consume_timestamp_ms is None:
            self.consume_timestamp_ms = int(time.time() * 1000) - 30 * 60 * 1000
        self._sem = asyncio.Semaphore(self.consume_thread_max)
        self._wakeup = asyncio.Event()
        if self.enable_msg_trace and self._trace is None:
            self._trace = _trace.TraceDispatcher(self.namesrv_addr, self.group, self.custom_trace_topic)
        self._state = "RUNNING"
        await self._heartbeat_all()
        self._service = asyncio.get_running_loop().create_task(self._service_loop())
        # heartbeats as a task of their own (RocketMQ's MQClientInstance schedules them apart from
        # rebalancing): never queued behind a rebalance, an offset commit or a lock round
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        return self

    async def shutdown(self) -> None:
        if self._state != "RUNNING":
            self._state = "SHUTDOWN"
            return
        self._state = "STOPPING"
        self._wakeup.set()
        if self._heartbeats is not None:
            self._heartbeats.cancel()                   # no beat after the unregister below
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        if self._service is not None:
            await asyncio.gather(self._service, return_exceptions=True)
        for t in self._pull_tasks.values():
            t.cancel()
        await asyncio.gather(*self._pull_tasks.values(), return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.shutdown_await_ms / 1000.0)
        for t in list(self._tasks):
            t.cancel()
        items = list(self.process_queue_table.items())
        for _, pq in items:
            pq.dropped = True
        try:
            # every offset, changed or not (see the thread consumer's shutdown)
            await self.offsets.persist_all([mq for mq, _ in items], force=True)
            if self.orderly and self.clustering:
                await self._unlock([mq for mq, _ in items])
            for addr in self.api.heartbeat_addrs():
                try:
                    await self.api.unregister(addr, self.client_id, self.group)
                except MQClientError as e:
                    log.info("unregister from %s: %s", addr, e)
        finally:
            self._state = "SHUTDOWN"
            await self.api.close()
            if self._trace is not None:
                await asyncio.to_thread(self._trace.close)
                self._trace = None

    close = shutdown

    async def __aenter__(self) -> "AsyncPushConsumer":
        if self._state == "CREATED":
            await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # -- service: rebalance, heartbeats, offsets, locks -----------------------------------------------
    async def _service_loop(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        next_rebalance = now
        next_persist = now + self.persist_consumer_offset_interval_ms / 1000.0
        next_lock = now + self.lock_interval_ms / 1000.0
        while self._state == "RUNNING":
            now = loop.time()
            try:
                if self._wakeup.is_set() or now >= next_rebalance:
                    self._wakeup.clear()
                    await self.do_rebalance()
                    next_rebalance = loop.time() + self.rebalance_interval_ms / 1000.0
                if now >= next_persist:
                    await self.offsets.persist_all(self.assigned_message_queues())
                    next_persist = now + self.persist_consumer_offset_interval_ms / 1000.0
                if self.orderly and self.clustering and now >= next_lock:
                    await self._lock_all()
                    next_lock = now + self.lock_interval_ms / 1000.0
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer %s service step failed", self.group)
            if self._state != "RUNNING":
                break
            nxt = min(next_rebalance, next_persist)
            try:
                await asyncio.wait_for(self._wakeup.wait(), max(0.0, min(nxt - loop.time(), 1.0)))
            except asyncio.TimeoutError:
                pass

    async def _heartbeat_loop(self) -> None:
        """Every ``heartbeat_broker_interval_ms`` until shutdown (cancelled by it)."""
        loop = asyncio.get_running_loop()
        interval = self.heartbeat_broker_interval_ms / 1000.0
        next_heartbeat = loop.time() + interval
        while self._state == "RUNNING":
            await asyncio.sleep(max(0.0, next_heartbeat - loop.time()))
            next_heartbeat += interval
            if next_heartbeat < loop.time():            # fell behind (a blocked loop): no burst of beats
                next_heartbeat = loop.time() + interval
            if self._state != "RUNNING":
                break
            try:
                await self._heartbeat_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer %s heartbeat failed", self.group)

    async def _heartbeat_all(self) -> None:
        await adrive(self._heartbeat_all_call(), self.api.invoke)

    async def do_rebalance(self) -> None:
        for topic in list(self.subscriptions):
            try:
                await self._rebalance_by_topic(topic)
            except MQClientError as e:
                log.warning("rebalance of %s for %s: %s", topic, self.group, e)
        for mq, pq in [(mq, pq) for mq, pq in self.process_queue_table.items() if mq.topic not in self.subscriptions]:
            pq.dropped = True
            if await self._remove_unnecessary(mq, pq) and self.process_queue_table.get(mq) is pq:
                del self.process_queue_table[mq]

    async def _rebalance_by_topic(self, topic: str) -> None:
        mq_set = await adrive(self._allocate_call(topic), self.api.invoke)
        if mq_set is not None:
            await self._update_table(topic, mq_set)

    async def _update_table(self, topic: str, mq_set: set) -> None:
        for mq, pq in [(mq, pq) for mq, pq in self.process_queue_table.items() if mq.topic == topic]:
            if mq not in mq_set or pq.dropped or pq.is_pull_expired():
                pq.dropped = True
                if await self._remove_unnecessary(mq, pq) and self.process_queue_table.get(mq) is pq:
                    del self.process_queue_table[mq]
        for mq in sorted(mq_set):
            if mq in self.process_queue_table:
                continue
            locked = False
            if self.orderly and self.clustering:
                if not await self._lock_one(mq):
                    continue
                locked = True
            self.offsets.remove(mq)
            pq = ProcessQueue()
            if locked:
                pq.locked, pq.last_lock_timestamp = True, time.monotonic()
            last = await self.offsets.read_from_store(mq)
            next_offset = await adrive(self._start_offset_call(mq, last), self.api.invoke)
            if next_offset < 0:
                if locked:
                    await self._unlock([mq])
                continue
            self.offset_store.update_offset(mq, next_offset)
            self.process_queue_table[mq] = pq
            self._consume_locks[pq] = asyncio.Lock()
            self._pull_tasks[pq] = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq, next_offset))
            log.info("%s: %s takes %s from offset %d", self.group, self.client_id, mq, next_offset)

    async def _remove_unnecessary(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        t = self._pull_tasks.pop(pq, None)
        if t is not None:
            t.cancel()
        if self.orderly and self.clustering:
            lock = self._consume_locks.get(pq)
            try:
                await asyncio.wait_for(lock.acquire(), 1.0)
            except asyncio.TimeoutError:
                pq.try_unlock_times += 1
                return False
            try:
                await self.offsets.persist(mq)
                self.offsets.remove(mq)
                await self._unlock([mq])
                pq.locked = False
            finally:
                lock.release()
        else:
            await self.offsets.persist(mq)
            self.offsets.remove(mq)
        self._consume_locks.pop(pq, None)
        return True

    async def _lock_one(self, mq: MessageQueue) -> bool:
        return await adrive(self._lock_one_call(mq), self.api.invoke)

    async def _lock_all(self) -> None:
        table = {mq: pq for mq, pq in self.process_queue_table.items() if not pq.dropped}
        await adrive(self._lock_all_call(table), self.api.invoke)

    async def _unlock(self, mqs: list) -> None:
        await adrive(self._unlock_call(mqs), self.api.invoke)

    # -- pulling ----------------------------------------------------------------------------------------
    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int) -> None:
        retry = retry_topic(self.group) if self.clustering else None
        delay = PULL_TIME_DELAY_MS_WHEN_EXCEPTION / 1000.0
        while self._state == "RUNNING" and not pq.dropped:
            wait_ms = self._pull_gate(pq, mq)
            if wait_ms is not None:
                if self._held_for_room(pq, wait_ms):
                    # as the thread consumer's _park: on again once the listeners made room
                    self.stats["flow_control"] += 1
                    room = asyncio.Event()
                    pq.notify_when_below(self.pull_threshold_for_queue, room.set)
                    try:
                        await asyncio.wait_for(room.wait(), wait_ms / 1000.0)
                    except asyncio.TimeoutError:
                        pass
                else:
                    await asyncio.sleep(wait_ms / 1000.0)
                continue
            sub = self.subscriptions.get(mq.topic)
            try:
                # the broker the last answer suggested, else the master, else a slave (PullAPIWrapper)
                broker_id, addr = await self.api.pull_broker_addr(mq)
                frame = self._pull_frame(mq, next_offset, broker_id)
                self.stats["pulls"] += 1
                try:
                    resp = await self.api.invoke(addr, frame, CONSUMER_TIMEOUT_MS_WHEN_SUSPEND)
                except RemotingError as e:
                    self.api.note_pull_outcome(mq, e)
                    raise
                self.api.note_pull_outcome(mq, resp)
                self.api.pull_from.update_from_response(mq, resp)
                res = parse_pull_response(resp, sub, addr, retry)
            except MQClientError as e:
                log.warning("pull of %s failed: %s", mq, e)
                await asyncio.sleep(delay)
                await self.api.refresh_route_if_stale(mq.topic)     # in doubt: a new master within ~1 s
                continue
            if pq.dropped:
                return
            outcome = self._pull_outcome(res, pq, mq, next_offset)
            next_offset = res.next_begin_offset
            if outcome == "found":
                dispatch = pq.put_message(res.msg_found_list)
                if _lt.ENABLED:
                    _lt.stamp_messages("c_submit", res.msg_found_list, time.monotonic_ns())
                self._dispatch(res.msg_found_list, pq, mq, dispatch)
            elif outcome == "illegal":
                self.offset_store.update_offset(mq, next_offset)
                await self.offsets.persist(mq)
                if self.process_queue_table.get(mq) is pq:
                    del self.process_queue_table[mq]
                self._pull_tasks.pop(pq, None)
                self._wakeup.set()
                return

    # -- consuming ----------------------------------------------------------------------------------------
    async def _call(self, msgs: list, ctx):
        if self._trace is None:
            return await self._call_listener(msgs, ctx)
        rid, recs = _trace.sub_contexts(self.group, msgs, self.client_id)
        for r in recs:
            self._trace.append(r)
        t0 = time.monotonic()
        ok = False
        try:
            status = await self._call_listener(msgs, ctx)
            ok = status is None or getattr(status, "value", status) in ("CONSUME_SUCCESS", "SUCCESS")
            return status
        finally:
            for r in _trace.sub_after_contexts(self.group, rid, msgs, int((time.monotonic() - t0) * 1000), ok):
                self._trace.append(r)

    def _listener_is_async(self) -> bool:
        fn = self.listener
        if fn is not self._listener_seen:             # a coroutine function or not: asked once per listener
            self._listener_seen = fn
            self._listener_async = inspect.iscoroutinefunction(fn) or \
                inspect.iscoroutinefunction(getattr(fn, "__call__", None))
        return self._listener_async

    async def _call_listener(self, msgs: list, ctx):
        if self._listener_is_async():
            return await self.listener(msgs, ctx)
        return await asyncio.to_thread(self.listener, msgs, ctx)

    def _commit_carried(self, mq: MessageQueue) -> None:
        if self.offsets is not None:
            self.offsets.forget_persisted(mq)

    def _dispatch(self, msgs: list, pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        if self.orderly:
            if dispatch:
                self._spawn(self._consume_orderly(pq, mq))
            return
        # one task for the pull result; while its listener calls wait, _fan_out adds tasks that
        # take the run's other requests, up to consume_thread_max, as the thread consumer's idle
        # workers do
        self._spawn(self._consume_run(ConsumeRun(msgs, self.consume_message_batch_max_size, pq, mq), pq, mq))

    def _fan_out(self, run: ConsumeRun, pq: ProcessQueue, mq: MessageQueue) -> None:
        """A consume task's callback, one loop iteration after it started: if requests of its run
        are still untaken then, its listener call is waiting, so one more task takes them (and
        schedules the same check): a run of slow listener calls gets a task per free slot within
        as many loop iterations.  A listener that never waits takes its whole run in one task:
        a task per free slot up front (20) cost 70-100 us more per 512-message run than one
        task, 0.14-0.2 us a message, in 19 tasks that found nothing to take (an asyncio
        microbenchmark of the run loop, stop 44)."""
        if run.left() > 0 and self._running_tasks < self.consume_thread_max and self._state == "RUNNING" \
                and not pq.dropped:
            self._spawn(self._consume_run(run, pq, mq))

    async def _consume_run(self, run: ConsumeRun, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consume the requests of one pull result in turn until none is left (other tasks of
        the same run take some too), holding one listener slot throughout, as a worker thread
        of the thread consumer does.  Wholly consumed requests are committed together (out of
        the process queue, offset, counts) at the end and at least every
        ``RUN_COMMIT_INTERVAL_S``; any other outcome takes the per-request path at once."""
        # the loop runs once per message with the defaults: a coroutine listener without a trace is
        # awaited at once (one await per request), anything else through _call
        self._running_tasks += 1
        success = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        try:
            async with self._sem:
                # what the loop calls, looked up once per run: a listener registered, or a trace
                # turned on, meanwhile applies from the next run
                listener = self.listener
                direct = self._trace is None and self._listener_is_async()
                call = listener if direct else self._call
                take = run.take
                if run.left() > 1:
                    asyncio.get_running_loop().call_soon(self._fan_out, run, pq, mq)
                while self._state == "RUNNING":
                    msgs = take()
                    if msgs is None:
                        break
                    if pq.dropped:
                        return                      # dropped: the new owner redelivers them
                    ctx = ConsumeConcurrentlyContext(mq)
                    try:
                        status = await call(msgs, ctx)
                    except Exception:
                        log.exception("listener failed on %d message(s) of %s", len(msgs), mq)
                        status = ConsumeConcurrentlyStatus.RECONSUME_LATER
                    else:
                        if status is not success:
                            status = _concurrent_status(status)
                    if pq.dropped:
                        return
                    now = run.settle(status is success, ctx, msgs)   # the thread loop's rule
                    if now is False:
                        await self._process_result(status, ctx, msgs, pq, mq)
                    elif now is not None:
                        self._commit_consumed(now, pq, mq)
        finally:
            self._running_tasks -= 1
            rest = run.rest()
            if rest and not pq.dropped:
                self._commit_consumed(rest, pq, mq)

    async def _consume_concurrently(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """One ConsumeRequest on its own (a local re-consume): a run of one request, in a listener slot."""
        await self._consume_run(ConsumeRun(msgs, len(msgs), pq, mq), pq, mq)

    def _commit_consumed(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consumed messages out of the process queue, the offset forward, then counted (a reader
        of the count sees the offset)."""
        offset = pq.remove_message(msgs)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(mq, offset, increase_only=True)
        self.stats["consumed_ok"] += len(msgs)

    async def _process_result(self, status, ctx, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """A request's outcome (:meth:`rmq.client.consumer.PushConsumerCalls._concurrent_result_call`);
        the messages whose send-back failed are consumed again here later."""
        again = await adrive(self._concurrent_result_call(status, ctx, msgs, pq, mq), self.api.invoke)
        if again:
            self._spawn(self._consume_later(again, pq, mq))

    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] += n

    async def _consume_later(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        await asyncio.sleep(RECONSUME_LATER_LOCALLY_MS / 1000.0)
        await self._consume_concurrently(msgs, pq, mq)

    async def _consume_orderly(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        lock = self._consume_locks.get(pq)
        begin = time.monotonic()
        while not pq.dropped and lock is not None:
            if self.clustering and (not pq.locked or pq.is_lock_expired()):
                await asyncio.sleep(0.1)
                if await self._lock_one(mq):
                    pq.locked, pq.last_lock_timestamp = True, time.monotonic()
                else:
                    await asyncio.sleep(PULL_TIME_DELAY_MS_WHEN_EXCEPTION / 1000.0)
                continue
            if (time.monotonic() - begin) * 1000 > MAX_TIME_CONSUME_CONTINUOUSLY_MS:
                await asyncio.sleep(0.01)          # let other queues run, then go on
                begin = time.monotonic()
            msgs = pq.take_messages(self.consume_message_batch_max_size)
            if not msgs:
                return
            async with lock:
                if pq.dropped:
                    return
                ctx = ConsumeOrderlyContext(mq)
                async with self._sem:
                    try:
                        status = await self._call(msgs, ctx)
                        status = ConsumeOrderlyStatus.SUCCESS if status is None else \
                            ConsumeOrderlyStatus(status.value if isinstance(status, enum.Enum) else status)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("orderly listener failed on %d message(s) of %s", len(msgs), mq)
                        status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if status is ConsumeOrderlyStatus.SUCCESS:
                    self.stats["consumed_ok"] += len(msgs)
                    commit = pq.commit()
                else:
                    self.stats["consumed_failed"] += len(msgs)
                    suspend = await adrive(self._reconsume_call(msgs, mq), self.api.invoke)
                    if suspend:
                        pq.make_message_to_consume_again(msgs)
                        commit = -1
                    else:
                        commit = pq.commit()
                if commit >= 0:
                    self.offset_store.update_offset(mq, commit)
            if status is not ConsumeOrderlyStatus.SUCCESS and commit < 0:
                d = ctx.suspend_current_queue_time_millis
                await asyncio.sleep((d if d >= 0 else self.suspend_current_queue_time_millis) / 1000.0)


# names of the threaded module, for ``from rmq.aio.consumer import PushConsumer``
PullConsumer = AsyncPullConsumer
PushConsumer = AsyncPushConsumer
