"""asyncio producer: :class:`rmq.Producer`'s behaviour with ``await``.

::

    from rmq import Message
    from rmq.aio import Producer

    async with Producer("127.0.0.1:9876", group="pg") as p:
        r = await p.send(Message("orders", b"x", tags="created"))
        rs = await asyncio.gather(*(p.send(Message("orders", b"%d" % i)) for i in range(1000)))
        await p.send_batch([Message("orders", b"a"), Message("orders", b"b")])

Same options, defaults, unique ids, compression, queue selection, latency
fault strategy and retries as :class:`rmq.client.producer.Producer` (the
message preparation, request encoding, response parsing and route handling
are shared).  Concurrent ``send`` calls are pipelined on one DEALER per broker;
there is no client-side batching (gather sends, or use :meth:`Producer.send_batch`).

Sockets
    ``zmq.asyncio`` DEALERs, one per NameServer and one per broker address
    (``IMMEDIATE``), each with a reader task that resolves the waiting request by
    ``opaque``.  Everything runs on the event loop that called :meth:`Producer.start`;
    the producer is not thread-safe.

Failure behaviour
    As the sync producer: retries on another broker for timeouts, unreachable
    brokers and retryable codes, then the last error's type with RocketMQ's
    "Send [N] times, still failed" description.
"""
from __future__ import annotations

import asyncio
import time
import itertools
import logging
from typing import Any, Iterable, Optional

import zmq
import zmq.asyncio

from rmq import protocol as P
from rmq import security
from rmq.client import trace as _trace
from rmq.client.message import Message, MessageQueue, SendResult
from rmq.client.producer import (ROUTE_REFRESH_ON_FAILURE_MS, ProducerOptions, Selector, apply_selector, batch_body_of,
                                 check_group, client_id, final_error, heartbeat_request, merge_results,
                                 parse_send_response, prepare_batch, prepare_message, route_suspect, selector_for,
                                 send_request)
from rmq.client.route import (MQFaultStrategy, RouteCache, TopicPublishInfo, cluster_info_request, parse_cluster_info,
                              parse_route_response, route_request, split_namesrv_addr)
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import Frame, ProtocolError, RequestCode, ResponseCode

log = logging.getLogger("rmq.aio.producer")

PROVISIONAL_REFRESH_S = 0.1        # min gap between route look-ups of an auto-created topic
PROVISIONAL_POLL_S = 0.5           # route look-up period while a topic's route is provisional


def _send_nowait(sock: zmq.asyncio.Socket, parts: list) -> bool:
    """Best-effort non-blocking send on an asyncio socket; the outcome is consumed (never an
    unretrieved future exception)."""
    try:
        fut = sock.send_multipart(parts, flags=zmq.NOBLOCK)
    except zmq.ZMQError:
        return False
    if not fut.done():
        fut.cancel()
        return False
    return not fut.cancelled() and fut.exception() is None


class _Conn:
    __slots__ = ("addr", "sock", "reader")

    def __init__(self, addr: str, sock: zmq.asyncio.Socket, reader: asyncio.Task):
        self.addr = addr
        self.sock = sock
        self.reader = reader


class Producer:
    """An asyncio producer (RocketMQ ``DefaultMQProducer`` semantics).

    Parameters
    ----------
    namesrv_addr : str
        ``"host:port"``, or several separated by ``;``.
    group : str
        Producer group.
    **options
        :class:`rmq.client.producer.ProducerOptions` fields (``send_msg_timeout_ms``,
        ``retry_times_when_send_failed``, ``compress_msg_body_over_howmuch``,
        ``max_message_size``, ``send_latency_fault_enable``, ...); the batching
        options (``linger_ms``, ``batch_size``) are not used here.

    Raises
    ------
    MQClientError
        A bad address, group or option.
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", auth=None, *,
                 enable_msg_trace: bool = False, custom_trace_topic: Optional[str] = None, **options: Any):
        self._auth = security.client_auth(auth)   # CURVE client keys (rmq.security); None: environment / plain
        # message trace, as rmq.Producer: Pub records sent by a background dispatcher
        self._trace = _trace.TraceDispatcher(namesrv_addr, group, custom_trace_topic) if enable_msg_trace else None
        try:
            check_group(group)
        except ValueError as e:
            raise MQClientError(f"producer group: {e}") from None
        try:
            self.options = ProducerOptions(**options)
        except TypeError as e:
            raise MQClientError(f"unknown producer option: {e}") from None
        self.namesrv_addr = namesrv_addr
        self.namesrv_addrs = split_namesrv_addr(namesrv_addr)
        self.group = group
        self.client_id = client_id()
        self.route_cache = RouteCache()
        self.fault_strategy = MQFaultStrategy(self.options.send_latency_fault_enable, self.options.latency_max,
                                              self.options.not_available_duration,
                                              self.options.isolation_latency_ms)
        self.stats = {"requests": 0, "batch_requests": 0, "messages": 0, "retries": 0, "route_requests": 0}
        self._ctx: Optional[zmq.asyncio.Context] = None
        self._ns: list = []                 # _Conn per NameServer
        self._ns_next = 0
        self._conns: dict = {}              # broker addr -> _Conn
        self._waiters: dict = {}            # opaque -> asyncio.Future[Frame]
        self._opaque = itertools.count(1)
        self._route_locks: dict = {}        # topic -> asyncio.Lock
        self._last_fetch: dict = {}         # topic -> loop time
        self._tasks: set = set()
        self._started = False
        self._closed = False
        # called on the loop with (broker address, Frame) for requests a broker sends
        # (CHECK_TRANSACTION_STATE to an rmq.aio.TransactionProducer); None: ignored
        self.request_handler = None
        # True (an rmq.aio.TransactionProducer): learn every broker of the cluster at start and at each
        # route poll, so that each master gets heartbeats (and can check back) before the first send
        self.discover_brokers = False

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> "Producer":
        """Open the NameServer sockets and start the route / heartbeat timers (idempotent)."""
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        if self._started:
            return self
        self._ctx = zmq.asyncio.Context()
        security.register_context(self._ctx, self._auth)
        for addr in self.namesrv_addrs:
            self._ns.append(self._open(addr, immediate=False))
        self._spawn(self._timer_loop())
        self._started = True
        return self

    async def close(self) -> None:
        """Stop the timers and readers, fail what is waiting, close the sockets (idempotent).
        Sends in progress end with :class:`RemotingError`."""
        if self._closed:
            return
        self._closed = True
        if self._trace is not None:
            await asyncio.to_thread(self._trace.close)
        for conn in self._conns.values():
            _send_nowait(conn.sock, P.encode(Frame(RequestCode.UNREGISTER_CLIENT, flag=P.FLAG_ONEWAY, fields={
                "clientID": self.client_id, "producerGroup": self.group})))
        conns = list(self._ns) + list(self._conns.values())
        tasks = [c.reader for c in conns] + list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(RemotingError(f"producer {self.group} closed while waiting for a response"))
        self._waiters.clear()
        for c in conns:
            c.sock.close(linger=100 if c in self._conns.values() else 0)
        self._conns.clear()
        self._ns.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"aio.Producer(group={self.group!r}, namesrv={self.namesrv_addr!r}, closed={self._closed})"

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, msg: Message, *, timeout_ms: Optional[int] = None, selector: Optional[Selector] = None,
                   arg: Any = None, sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> SendResult:
        """Send and await the broker's answer; same parameters, result and errors as
        :meth:`rmq.Producer.send`."""
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = prepare_message(msg, self.options)
        t0 = time.monotonic()
        results = await self._send([prep], False, timeout_ms, sel, arg, queue, oneway=False)
        if self._trace is not None:
            self._trace.append_pub(prep.msg, results[0], int((time.monotonic() - t0) * 1000), self.client_id,
                                   sel is not None)
        return results[0]

    async def send_batch(self, msgs: Iterable[Message], *, timeout_ms: Optional[int] = None,
                         queue: Optional[MessageQueue] = None) -> SendResult:
        """One SEND_BATCH_MESSAGE of messages of one topic; as :meth:`rmq.Producer.send_batch`."""
        preps = prepare_batch(msgs, self.options)
        t0 = time.monotonic()
        results = await self._send(preps, True, timeout_ms, None, None, queue, oneway=False)
        if self._trace is not None:
            cost = int((time.monotonic() - t0) * 1000)
            for p, r in zip(preps, results):
                self._trace.append_pub(p.msg, r, cost, self.client_id)
        return merge_results(results)

    async def send_oneway(self, msg: Message, *, selector: Optional[Selector] = None, arg: Any = None,
                          sharding_key: Any = None, queue: Optional[MessageQueue] = None) -> None:
        """Send without waiting for an answer (returns once the request is queued on a connected socket)."""
        sel, arg = selector_for(selector, arg, sharding_key, msg)
        prep = prepare_message(msg, self.options)
        await self._send([prep], False, None, sel, arg, queue, oneway=True)

    async def fetch_publish_message_queues(self, topic: str) -> list:
        """Writable queues of ``topic`` read from the NameServer.

        Raises
        ------
        MQClientError
            Unknown topic (TOPIC_NOT_EXIST) or NameServer unreachable.
        """
        await self._ensure_started()
        deadline = self._loop_time() + self.options.send_msg_timeout_ms / 1000.0
        route = await self._fetch_route(topic, deadline)
        if route is None:
            raise MQClientError(f"No route info of this topic: {topic}", int(ResponseCode.TOPIC_NOT_EXIST))
        return list(self.route_cache.publish_info(topic).message_queue_list)

    async def _send(self, preps: list, batch: bool, timeout_ms: Optional[int], selector, arg,
                    queue: Optional[MessageQueue], oneway: bool) -> list:
        """RocketMQ ``sendDefaultImpl`` / ``sendSelectImpl``: attempts within the time budget."""
        await self._ensure_started()
        if queue is not None and (not isinstance(queue, MessageQueue) or queue.topic != preps[0].msg.topic):
            raise MQClientError(f"queue must be a MessageQueue of topic {preps[0].msg.topic}, got {queue!r}")
        budget_ms = timeout_ms if timeout_ms is not None else self.options.send_msg_timeout_ms
        if budget_ms <= 0:
            raise MQClientError(f"timeout_ms must be positive, got {budget_ms}")
        topic = preps[0].msg.topic
        begin = self._loop_time()
        deadline = begin + budget_ms / 1000.0
        info = await self._publish_info(topic, deadline)
        fixed = queue
        if fixed is None and selector is not None:
            fixed = apply_selector(selector, info, preps[0].msg, arg)
        max_attempts = 1 if (fixed is not None or oneway) else 1 + self.options.retry_times_when_send_failed
        body = batch_body_of(preps) if batch else None
        last_broker: Optional[str] = None
        brokers_sent: list = []
        last_exc: Optional[BaseException] = None
        attempts = 0
        for _ in range(max_attempts):
            now = self._loop_time()
            if now >= deadline:
                break
            mq = fixed if fixed is not None else self.fault_strategy.select_one_message_queue(info, last_broker)
            addr = self.route_cache.find_broker_addr(mq.broker_name)
            if addr is None:
                raise MQClientError(f"The broker[{mq.broker_name}] not exist (no master address)")
            if mq.broker_name not in brokers_sent:
                brokers_sent.append(mq.broker_name)
            attempts += 1
            if attempts > 1:
                self.stats["retries"] += 1
            frame = send_request(preps, mq.queue_id, self.group, batch, oneway, body,
                                 self.options.default_topic_queue_nums)
            t0 = self._loop_time()
            try:
                resp = await self._invoke(self._conn(addr), frame, deadline - now, oneway, mq.broker_name)
                if oneway:
                    self.stats["messages"] += len(preps)
                    return []
                results = parse_send_response(resp, topic, mq.broker_name, addr, preps)
            except MQBrokerError as e:
                self.fault_strategy.update_fault_item(mq.broker_name, (self._loop_time() - t0) * 1000, True)
                last_exc = e
                self._refresh_suspect(topic, e)
                if fixed is not None or e.response_code not in self.options.retry_response_codes:
                    raise
                last_broker = mq.broker_name
                continue
            except RemotingError as e:
                self.fault_strategy.update_fault_item(mq.broker_name, (self._loop_time() - t0) * 1000, True)
                last_exc = e
                self._refresh_suspect(topic, e)
                if fixed is not None:
                    raise
                last_broker = mq.broker_name
                continue
            self.fault_strategy.update_fault_item(mq.broker_name, (self._loop_time() - t0) * 1000, False)
            self.stats["messages"] += len(preps)
            if info.provisional and self._loop_time() - self._last_fetch.get(topic, 0.0) >= PROVISIONAL_REFRESH_S:
                self._last_fetch[topic] = self._loop_time()
                self._spawn(self._refresh(topic))
            return results
        if last_exc is None:
            last_exc = RemotingTimeoutError(f"send to topic {topic} timed out after {budget_ms} ms")
        if attempts <= 1 and max_attempts == 1:
            raise last_exc
        raise final_error(last_exc, attempts, (self._loop_time() - begin) * 1000, topic, brokers_sent)

    # -- wire ------------------------------------------------------------------------------------
    async def _invoke(self, conn: _Conn, frame: Frame, timeout_s: float, oneway: bool = False,
                      what: str = "") -> Optional[Frame]:
        """Send ``frame`` on ``conn`` and await the response with its opaque.

        Raises
        ------
        RemotingError
            Not connected within ``connect_timeout_ms`` (IMMEDIATE sockets), or closed.
        RemotingTimeoutError
            No response within ``timeout_s``.
        """
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        frame.opaque = next(self._opaque)
        try:
            parts = P.encode(frame)
        except ProtocolError as e:
            raise MQClientError(f"cannot encode the request: {e.remark}", int(ResponseCode.MESSAGE_ILLEGAL)) from None
        loop = asyncio.get_running_loop()
        fut = None
        if not oneway:
            fut = loop.create_future()
            self._waiters[frame.opaque] = fut
        t0 = loop.time()
        connect_s = min(timeout_s, self.options.connect_timeout_ms / 1000.0)
        try:
            try:
                await asyncio.wait_for(conn.sock.send_multipart(parts, copy=False), connect_s)
            except asyncio.TimeoutError:
                raise RemotingError(f"cannot connect to {what or 'peer'} at {conn.addr} "
                                    f"(waited {connect_s * 1000:.0f} ms)") from None
            self.stats["requests"] += 1
            if frame.code == RequestCode.SEND_BATCH_MESSAGE:
                self.stats["batch_requests"] += 1
            if fut is None:
                return None
            left = timeout_s - (loop.time() - t0)
            try:
                return await asyncio.wait_for(fut, max(left, 0.0))
            except asyncio.TimeoutError:
                raise RemotingTimeoutError(f"wait response from {what or 'peer'} at {conn.addr} timed out after "
                                           f"{(loop.time() - t0) * 1000:.0f} ms (request code {frame.code})"
                                           ) from None
        finally:
            if fut is not None:
                self._waiters.pop(frame.opaque, None)

    def _open(self, addr: str, immediate: bool) -> _Conn:
        s = P.dealer(self._ctx)
        if immediate:
            s.setsockopt(zmq.IMMEDIATE, 1)     # before connect: only queue to a live peer
        s.connect(P.endpoint(addr))
        conn = _Conn(addr, s, None)
        conn.reader = asyncio.get_running_loop().create_task(self._reader(conn), name=f"rmq-aio-reader-{addr}")
        return conn

    def _conn(self, addr: str) -> _Conn:
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = self._open(addr, immediate=True)
            self._spawn(self._heartbeat(conn))
        return conn

    async def _reader(self, conn: _Conn) -> None:
        while True:
            try:
                parts = await conn.sock.recv_multipart(copy=False)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                log.warning("receive from %s failed: %s", conn.addr, e)
                return
            try:
                frame = P.decode(parts)
            except ProtocolError as e:
                log.warning("undecodable response from %s: %s", conn.addr, e)
                continue
            if not frame.is_response:          # a broker's request (CHECK_TRANSACTION_STATE)
                if self.request_handler is not None:
                    try:
                        self.request_handler(conn.addr, frame)
                    except Exception:  # noqa: BLE001 - a handler's bug must not stop the reader
                        log.exception("handling request %s from %s failed", frame.code, conn.addr)
                continue
            fut = self._waiters.pop(frame.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)

    async def _heartbeat(self, conn: _Conn) -> None:
        try:
            await asyncio.wait_for(conn.sock.send_multipart(P.encode(heartbeat_request(self.client_id, self.group))),
                                   self.options.send_msg_timeout_ms / 1000.0)
        except (asyncio.TimeoutError, zmq.ZMQError):
            pass

    async def _timer_loop(self) -> None:
        interval = self.options.poll_name_server_interval_ms / 1000.0
        hb_interval = self.options.heartbeat_broker_interval_ms / 1000.0
        loop = asyncio.get_running_loop()
        next_refresh, next_hb = loop.time() + interval, loop.time() + hb_interval
        if self.discover_brokers:
            await self._discover()
            next_hb = loop.time()
        while True:
            await asyncio.sleep(max(0.0, min(next_refresh, next_hb, loop.time() + PROVISIONAL_POLL_S) - loop.time()))
            now = loop.time()
            for topic in self.route_cache.topics():
                info = self.route_cache.publish_info(topic)
                if (info is not None and info.provisional
                        and now - self._last_fetch.get(topic, 0.0) >= PROVISIONAL_POLL_S):
                    self._last_fetch[topic] = now
                    self._spawn(self._refresh(topic))
            if now >= next_refresh:
                next_refresh = now + interval
                for topic in self.route_cache.topics():
                    self._spawn(self._refresh(topic))
                if self.discover_brokers:
                    self._spawn(self._discover())
            if now >= next_hb:
                next_hb = now + hb_interval
                fresh = [a for a in self.route_cache.master_addrs() if a not in self._conns]
                for conn in list(self._conns.values()):
                    self._spawn(self._heartbeat(conn))
                for addr in fresh:          # sendHeartbeatToAllBroker: every master, connected or not
                    self._conn(addr)        # opens it and sends its first heartbeat

    def _spawn(self, coro) -> None:
        if self._closed:
            coro.close()
            return
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)

    def _task_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("background task failed: %s", t.exception())

    async def _ensure_started(self) -> None:
        if self._closed:
            raise MQClientError(f"producer {self.group} is closed")
        if not self._started:
            await self.start()

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()

    # -- routes ------------------------------------------------------------------------------------
    async def _ns_invoke(self, frame_factory, deadline: float) -> Frame:
        """A NameServer request, failing over to the next NameServer on errors."""
        last: Optional[BaseException] = None
        for i in range(len(self._ns)):
            idx = (self._ns_next + i) % len(self._ns)
            left = deadline - self._loop_time()
            if left <= 0:
                break
            self.stats["route_requests"] += 1
            try:
                resp = await self._invoke(self._ns[idx], frame_factory(), left, what="NameServer")
                self._ns_next = idx
                return resp
            except RemotingError as e:
                last = e
        raise last or RemotingTimeoutError("NameServer request timed out")

    async def _fetch_route(self, topic: str, deadline: float):
        """Ask the NameServer; cache and return the route (None: TOPIC_NOT_EXIST)."""
        self._last_fetch[topic] = self._loop_time()
        resp = await self._ns_invoke(lambda: route_request(topic), deadline)
        route = parse_route_response(resp, topic)
        if route is not None:
            self.route_cache.update(topic, route)
        return route

    async def _discover(self) -> None:
        """The cluster's brokers from the NameServer into the route table (their masters get heartbeats)."""
        try:
            resp = await self._ns_invoke(cluster_info_request, self._loop_time() + self.options.send_msg_timeout_ms / 1000.0)
            self.route_cache.update_brokers(parse_cluster_info(resp))
        except MQClientError as e:
            log.debug("cluster info refresh failed: %s", e)

    def _refresh_suspect(self, topic: str, exc: BaseException) -> None:
        """A send failed: refetch the route in the background when the failure puts it in doubt
        (:func:`rmq.client.producer.route_suspect`), at most every ROUTE_REFRESH_ON_FAILURE_MS."""
        now = self._loop_time()
        if isinstance(exc, MQBrokerError) and exc.response_code in (ResponseCode.TOPIC_NOT_EXIST,
                                                                    ResponseCode.NO_PERMISSION):
            self._spawn(self._refresh(topic))       # the route is wrong for sure: at once
        elif route_suspect(exc) and now - self._last_fetch.get(topic, -1e18) >= ROUTE_REFRESH_ON_FAILURE_MS / 1000.0:
            self._last_fetch[topic] = now
            self._spawn(self._refresh(topic))

    async def _refresh(self, topic: str) -> None:
        try:
            await self._fetch_route(topic, self._loop_time() + self.options.send_msg_timeout_ms / 1000.0)
        except MQClientError as e:
            log.debug("route refresh of %s failed: %s", topic, e)

    async def _publish_info(self, topic: str, deadline: float) -> TopicPublishInfo:
        info = self.route_cache.publish_info(topic)
        if info is not None and info.ok:
            return info
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            info = self.route_cache.publish_info(topic)
            if info is not None and info.ok:
                return info
            try:
                route = await self._fetch_route(topic, deadline)
                if route is None:
                    resp = await self._ns_invoke(cluster_info_request, deadline)
                    brokers = parse_cluster_info(resp)
                    if not any(b.master_addr() for b in brokers):
                        raise MQClientError(f"No route info of this topic: {topic}, and the NameServer knows no "
                                            f"broker with a master", int(ResponseCode.TOPIC_NOT_EXIST))
                    self.route_cache.set_provisional(topic, brokers)
            except MQClientError as e:
                if isinstance(e, RemotingError) or e.response_code < 0:
                    raise MQClientError(f"No route info of this topic: {topic}: {e}") from e
                raise
            info = self.route_cache.publish_info(topic)
            if info is None or not info.ok:
                raise MQClientError(f"No route info of this topic: {topic} (no writable queue on a broker with "
                                    f"a master)", int(ResponseCode.TOPIC_NOT_EXIST))
            return info


AsyncProducer = Producer       # the name ECOSYSTEM.md's sketch uses

__all__ = ["Producer", "AsyncProducer"]
