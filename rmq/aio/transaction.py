"""asyncio transactional producer: :class:`rmq.TransactionProducer` with ``await``.

::

    from rmq import LocalTransactionState, Message
    from rmq.aio import TransactionProducer

    async def execute(msg, arg):          # or a plain function
        await db.insert_order(arg)
        return LocalTransactionState.COMMIT_MESSAGE

    async def check(msg_ext):             # or a plain function (run in a worker thread)
        return LocalTransactionState.COMMIT_MESSAGE if await db.has_order(msg_ext.keys) else \\
            LocalTransactionState.ROLLBACK_MESSAGE

    async with TransactionProducer("127.0.0.1:9876", group="orders", checker=check) as p:
        r = await p.send_message_in_transaction(Message("Orders", b"..."), execute, arg=order)

Semantics, record formats and the sans-I/O helpers are :mod:`rmq.client.transaction`'s: a half
message, the local transaction (a coroutine function is awaited, a plain one called on the loop;
an exception counts as UNKNOW), END_TRANSACTION one-way; the broker's check-backs arrive on this
producer's broker connections and ``checker`` answers them (a coroutine function is awaited on
the loop; a plain one runs in the loop's default executor, so a blocking check does not stall
sends).  At most ``MAX_CHECK_REQUESTS`` checks run at once; more are dropped (asked again at the
next check round).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable, Optional

from rmq.aio.producer import Producer
from rmq.client.message import Message
from rmq.client.transaction import (MAX_CHECK_REQUESTS, STATE_STAT, LocalTransactionState, TransactionSendResult,
                                    check_fields, checked_message, end_for_result, end_transaction_frame,
                                    half_message, to_state, transaction_result)
from rmq.errors import MQClientError, RmqError
from rmq.protocol import Frame, RequestCode

log = logging.getLogger("rmq.aio.transaction")

END_TIMEOUT_S = 3.0          # budget to queue a one-way END_TRANSACTION on the broker connection


class TransactionProducer:
    """An asyncio producer of transactional messages (RocketMQ ``TransactionMQProducer``).

    Parameters
    ----------
    namesrv_addr : str
    group : str
        Producer group: the broker checks back with any live producer of it.
    checker : callable(MessageExt) -> LocalTransactionState, or a coroutine function
    **options
        Any :class:`rmq.aio.Producer` option.

    Raises
    ------
    MQClientError
        ``checker`` is not callable, or a bad option.
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", *, checker: Callable[..., Any],
                 **options: Any):
        if not callable(checker):
            raise MQClientError("checker must be a callable(MessageExt) -> LocalTransactionState")
        self.checker = checker
        self.group = group
        self._producer = Producer(namesrv_addr, group, **options)
        self._producer.request_handler = self._on_broker_request
        self._producer.discover_brokers = True          # check-backs reach it before its first send
        self._checks: set = set()
        self.stats = {"sent": 0, "commit": 0, "rollback": 0, "unknow": 0, "checks": 0, "checksDropped": 0}

    @property
    def producer(self) -> Producer:
        """The underlying :class:`rmq.aio.Producer` (plain sends share its connections)."""
        return self._producer

    async def start(self) -> "TransactionProducer":
        await self._producer.start()
        return self

    async def close(self) -> None:
        """Cancel the checks in progress, close the producer."""
        for t in list(self._checks):
            t.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await self._producer.close()

    async def __aenter__(self) -> "TransactionProducer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._producer.closed

    async def send_message_in_transaction(self, msg: Message, execute_local_transaction: Callable[..., Any],
                                          arg: Any = None, *, timeout_ms: Optional[int] = None
                                          ) -> TransactionSendResult:
        """Send the half message, run the local transaction, send its outcome.

        Raises
        ------
        MQClientError, MQBrokerError, RemotingError, RemotingTimeoutError
            The half message was not stored; the local transaction was not executed.
        """
        if not callable(execute_local_transaction):
            raise MQClientError("execute_local_transaction must be a callable(msg, arg)")
        half_message(msg, self.group)
        result = await self._producer.send(msg, timeout_ms=timeout_ms)
        try:
            value = execute_local_transaction(msg, arg)
            if inspect.isawaitable(value):
                value = await value
            state = to_state(value)
        except Exception:  # noqa: BLE001 - RocketMQ: an exception is UNKNOW, the broker checks back
            log.exception("local transaction of message %s raised: UNKNOW (the broker will check back)",
                          result.msg_id)
            state = LocalTransactionState.UNKNOW
        self.stats["sent"] += 1
        self.stats[STATE_STAT[state]] += 1
        if state is not LocalTransactionState.UNKNOW:
            addr = self._producer.route_cache.find_broker_addr(result.message_queue.broker_name)
            if addr is None:
                log.warning("no address for broker %s: transaction %s ends by check-back",
                            result.message_queue.broker_name, result.msg_id)
            else:
                await self._end(addr, end_for_result(self.group, state, result))
        return transaction_result(result, state)

    async def _end(self, addr: str, frame: Frame) -> None:
        try:
            await self._producer._invoke(addr, frame, END_TIMEOUT_S, oneway=True, what="broker")
        except RmqError as e:
            log.warning("END_TRANSACTION not sent (%s): the broker will check back", e)

    # -- check-back ---------------------------------------------------------------------------
    def _on_broker_request(self, addr: str, frame: Frame) -> None:
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        if len(self._checks) >= MAX_CHECK_REQUESTS:
            self.stats["checksDropped"] += 1
            return
        t = asyncio.get_running_loop().create_task(self._check(addr, frame))
        self._checks.add(t)
        t.add_done_callback(self._checks.discard)

    async def _check(self, addr: str, frame: Frame) -> None:
        msg = checked_message(frame)
        if msg is None:
            return
        _group, qo, phys, _msg_id, tx_id = check_fields(frame)
        try:
            if inspect.iscoroutinefunction(self.checker):
                value = await self.checker(msg)
            else:
                value = await asyncio.get_running_loop().run_in_executor(None, self.checker, msg)
                if inspect.isawaitable(value):
                    value = await value
            state = to_state(value)
        except Exception:  # noqa: BLE001
            log.exception("transaction checker raised for %s: UNKNOW", tx_id)
            state = LocalTransactionState.UNKNOW
        self.stats["checks"] += 1
        if state is LocalTransactionState.UNKNOW or self.closed:
            return
        await self._end(addr, end_transaction_frame(self.group, state, qo, phys,
                                                    str(frame.fields.get("offsetMsgId", "")), tx_id, True))

    def __repr__(self) -> str:
        return f"aio.TransactionProducer(group={self.group!r})"


__all__ = ["TransactionProducer"]
