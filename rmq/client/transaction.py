"""Transactional messages, client side (RocketMQ's ``TransactionMQProducer``; broker side and
record formats: :mod:`rmq.actors.transaction`, SPEC.md §11).

A transaction::

    def execute(msg, arg):               # the local transaction, after the half message is stored
        db.insert_order(arg)
        return rmq.LocalTransactionState.COMMIT_MESSAGE

    def check(msg_ext):                  # the broker asks: how did the transaction of msg_ext end?
        return (rmq.LocalTransactionState.COMMIT_MESSAGE if db.has_order(msg_ext.keys)
                else rmq.LocalTransactionState.ROLLBACK_MESSAGE)

    with rmq.TransactionProducer("127.0.0.1:9876", group="orders", checker=check) as p:
        r = p.send_message_in_transaction(rmq.Message("Orders", b"..."), execute, arg=order)

1. The message goes as a *half message* (property ``TRAN_MSG=true``, ``PGROUP``; sysflag
   TRANSACTION_PREPARED_TYPE): stored, invisible to consumers.
2. ``execute_local_transaction(msg, arg)`` runs on the caller's thread.  What it returns is sent
   one-way as END_TRANSACTION (COMMIT_MESSAGE: the message becomes visible in its topic and queue;
   ROLLBACK_MESSAGE: it never will; UNKNOW: the broker asks later).  A function that raises
   counts as UNKNOW.  A half message that was not stored (the send failed) is not executed:
   the exception propagates.
3. A transaction the broker has no outcome for after ``transactionTimeOut`` (6 s) is checked
   back: CHECK_TRANSACTION_STATE reaches a live producer of the group (this one, or another
   of the same group after this one died) over its own connection, and ``checker(msg_ext)``
   answers, on the producer's check thread pool.  Its answer is sent as END_TRANSACTION with
   ``fromTransactionCheck=true``; UNKNOW (or an exception) leaves it for the next check, up to
   ``transactionCheckMax`` (15) checks.

The sans-I/O pieces (:func:`end_transaction_frame`, :func:`checked_message`, :func:`to_state`)
are shared with :class:`rmq.aio.TransactionProducer`.
"""
from __future__ import annotations

import enum
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rmq import protocol as P
from rmq._core import commitlog as _cl
from rmq.client.message import Message, MessageExt, SendResult
from rmq.errors import MQClientError
from rmq.protocol import Frame, RequestCode

log = logging.getLogger(__name__)

from rmq.common.message_const import (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_PRODUCER_GROUP,  # noqa: E402,F401
                                      PROPERTY_REAL_TOPIC, PROPERTY_TRANSACTION_ID, PROPERTY_TRANSACTION_PREPARED)
from rmq.common.message_const import PROPERTY_REAL_QUEUE_ID as PROPERTY_REAL_QID  # noqa: E402,F401
CHECK_THREAD_POOL_SIZE = 1                        # TransactionMQProducer checkThreadPoolMinSize
MAX_CHECK_REQUESTS = 2_000                        # TransactionMQProducer checkRequestHoldMax


class LocalTransactionState(str, enum.Enum):
    """RocketMQ's ``LocalTransactionState`` (its spelling, UNKNOW included)."""
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


# MessageSysFlag transaction types sent as END_TRANSACTION's commitOrRollback
_COMMIT_OR_ROLLBACK = {LocalTransactionState.COMMIT_MESSAGE: 8, LocalTransactionState.ROLLBACK_MESSAGE: 12,
                       LocalTransactionState.UNKNOW: 0}


@dataclass
class TransactionSendResult(SendResult):
    """A :class:`SendResult` plus the local transaction's outcome (RocketMQ ``TransactionSendResult``).

    ``transaction_id`` is the message's unique id (UNIQ_KEY), which check-backs name too.
    """
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW
    transaction_id: str = ""


def to_state(value: Any) -> LocalTransactionState:
    """What a local-transaction or checker function returned, as a state (a bad value: UNKNOW, logged)."""
    if isinstance(value, LocalTransactionState):
        return value
    try:
        return LocalTransactionState(value)
    except ValueError:
        log.warning("a transaction function returned %r, not a LocalTransactionState: counted as UNKNOW", value)
        return LocalTransactionState.UNKNOW


def half_message(msg: Message, group: str) -> Message:
    """Mark ``msg`` as a half message of ``group`` (in place; returned).

    Raises
    ------
    MQClientError
        ``msg`` is not a Message, or has a delay level (RocketMQ clears it; rmq refuses, since a
        delayed transaction is not what the caller would get).
    """
    if not isinstance(msg, Message):
        raise MQClientError(f"expected an rmq.Message, got {type(msg).__name__}")
    if int(msg.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") or 0) > 0:
        raise MQClientError("a transactional message cannot have a delay level")
    msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    msg.properties[PROPERTY_PRODUCER_GROUP] = group
    return msg


def end_transaction_frame(group: str, state: LocalTransactionState, queue_offset: int, commitlog_offset: int,
                          msg_id: str, transaction_id: str, from_check: bool) -> Frame:
    """END_TRANSACTION (37), one-way (EndTransactionRequestHeader, SPEC.md §11.3)."""
    return Frame(RequestCode.END_TRANSACTION, 0, P.FLAG_ONEWAY, "", {
        "producerGroup": group, "tranStateTableOffset": int(queue_offset), "commitLogOffset": int(commitlog_offset),
        "commitOrRollback": _COMMIT_OR_ROLLBACK[state], "fromTransactionCheck": bool(from_check),
        "msgId": msg_id, "transactionId": transaction_id})


STATE_STAT = {LocalTransactionState.COMMIT_MESSAGE: "commit", LocalTransactionState.ROLLBACK_MESSAGE: "rollback",
              LocalTransactionState.UNKNOW: "unknow"}      # the producers' stats key of each outcome


def end_for_result(group: str, state: LocalTransactionState, result: SendResult) -> Frame:
    """The END_TRANSACTION that ends the transaction whose half message ``result`` stored."""
    return end_transaction_frame(group, state, result.queue_offset, commitlog_offset_of(result),
                                 result.offset_msg_id, result.msg_id, False)


def transaction_result(result: SendResult, state: LocalTransactionState) -> TransactionSendResult:
    """``result`` (the half message's) with the local state and the transaction id (its UNIQ_KEY)."""
    return TransactionSendResult(result.status, result.msg_id, result.message_queue, result.queue_offset,
                                 result.offset_msg_id, result.region_id, state, result.msg_id)


def commitlog_offset_of(result: SendResult) -> int:
    """The half message's physical offset, from the offset message id (store host + offset)."""
    try:
        return _cl.decode_message_id(result.offset_msg_id)[1]
    except (ValueError, TypeError):
        raise MQClientError(f"the broker's answer has no usable offset message id: {result.offset_msg_id!r}") from None


def checked_message(frame: Frame) -> Optional[MessageExt]:
    """The message of a CHECK_TRANSACTION_STATE request, with its real topic and queue restored
    (as the broker's ``sendCheckMessage`` does) and ``transaction_id`` set; None if undecodable."""
    if not frame.bodies:
        return None
    try:
        msgs = _cl.decode_records(bytes(frame.bodies[0]))
    except Exception:  # noqa: BLE001 - a bad record from a broker is logged, not raised
        log.warning("undecodable CHECK_TRANSACTION_STATE body")
        return None
    if not msgs:
        return None
    m = msgs[0]
    props = m.properties
    if props.get(PROPERTY_REAL_TOPIC):
        m.topic = props[PROPERTY_REAL_TOPIC]
    if str(props.get(PROPERTY_REAL_QID, "")).isdigit():
        m.queue_id = int(props[PROPERTY_REAL_QID])
    return m


def check_fields(frame: Frame) -> tuple:
    """(producer group or "", queue offset, commitlog offset, msgId, transactionId) of a check request."""
    f = frame.fields
    return (str(f.get("producerGroup", "")), int(f.get("tranStateTableOffset", -1)),
            int(f.get("commitLogOffset", -1)), str(f.get("msgId", "")), str(f.get("transactionId", "")))


class TransactionProducer:
    """A producer of transactional messages (RocketMQ ``TransactionMQProducer``), thread-safe.

    Parameters
    ----------
    namesrv_addr : str
        ``"host:port"`` (several separated by ``;``).
    group : str
        Producer group: the broker checks back with any live producer of it.
    checker : callable(MessageExt) -> LocalTransactionState
        RocketMQ's ``checkLocalTransaction``: the outcome of a transaction the broker did not
        hear about.  Runs on the check pool (``check_thread_pool_size`` threads, 1).
    check_thread_pool_size : int
        Threads running ``checker`` (1).
    **options
        Any :class:`rmq.Producer` option (``send_msg_timeout_ms``, ``auth``, ...).

    Raises
    ------
    MQClientError
        ``checker`` is not callable, or a bad option (see :class:`rmq.Producer`).
    """

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", *,
                 checker: Callable[[MessageExt], Any], check_thread_pool_size: int = CHECK_THREAD_POOL_SIZE,
                 **options: Any):
        from rmq.client.producer import Producer
        if not callable(checker):
            raise MQClientError("checker must be a callable(MessageExt) -> LocalTransactionState")
        if not isinstance(check_thread_pool_size, int) or not 1 <= check_thread_pool_size <= 64:
            raise MQClientError(f"check_thread_pool_size must be 1..64, got {check_thread_pool_size!r}")
        options.setdefault("batch_size", 0)
        self.checker = checker
        self._producer = Producer(namesrv_addr, group, **options)
        self._producer._use_direct = False
        self.group = group
        self._pool = ThreadPoolExecutor(check_thread_pool_size, thread_name_prefix="rmq-tx-check")
        self._checks_in_flight = 0
        self._lock = threading.Lock()
        self.stats = {"sent": 0, "commit": 0, "rollback": 0, "unknow": 0, "checks": 0, "checksDropped": 0}
        self._producer._sender.request_handler = self._on_broker_request
        self._producer._sender.enable_broker_discovery()    # check-backs reach it before its first send

    @property
    def producer(self):
        """The underlying :class:`rmq.Producer` (plain sends share its connections)."""
        return self._producer

    @property
    def client_id(self) -> str:
        return self._producer.client_id

    def send_message_in_transaction(self, msg: Message, execute_local_transaction: Callable[[Message, Any], Any],
                                    arg: Any = None, *, timeout_ms: Optional[int] = None) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``execute_local_transaction(msg, arg)``, send its outcome.

        Returns
        -------
        TransactionSendResult
            The half message's send result, the local state and the transaction id.

        Raises
        ------
        MQClientError, MQBrokerError, RemotingError, RemotingTimeoutError
            The half message was not stored (as :meth:`rmq.Producer.send`); the local transaction
            was not executed.
        """
        if not callable(execute_local_transaction):
            raise MQClientError("execute_local_transaction must be a callable(msg, arg)")
        half_message(msg, self.group)
        result = self._producer.send(msg, timeout_ms=timeout_ms)
        try:
            state = to_state(execute_local_transaction(msg, arg))
        except Exception:  # noqa: BLE001 - RocketMQ: an exception is UNKNOW, the broker checks back
            log.exception("local transaction of message %s raised: UNKNOW (the broker will check back)",
                          result.msg_id)
            state = LocalTransactionState.UNKNOW
        self._end(result, state)
        return transaction_result(result, state)

    def _end(self, result: SendResult, state: LocalTransactionState) -> None:
        with self._lock:
            self.stats["sent"] += 1
            self.stats[STATE_STAT[state]] += 1
        if state is LocalTransactionState.UNKNOW:
            return                       # nothing to say: the broker checks back (END with 0 is a no-op)
        sender = self._producer._sender
        addr = sender.route_cache.find_broker_addr(result.message_queue.broker_name)
        if addr is None:
            log.warning("no address for broker %s: transaction %s ends by check-back",
                        result.message_queue.broker_name, result.msg_id)
            return
        frame = end_for_result(self.group, state, result)
        sender.call(lambda: sender.send_frame(addr, frame)).add_done_callback(_log_end_failure)

    # -- check-back ---------------------------------------------------------------------------
    def _on_broker_request(self, addr: str, frame: Frame) -> None:
        """I/O thread: a broker's request; CHECK_TRANSACTION_STATE goes to the check pool."""
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            log.debug("request %s from broker %s ignored", frame.code, addr)
            return
        with self._lock:
            if self._checks_in_flight >= MAX_CHECK_REQUESTS:
                self.stats["checksDropped"] += 1      # the broker asks again next round
                return
            self._checks_in_flight += 1
        try:
            self._pool.submit(self._check, addr, frame)
        except RuntimeError:                          # closing
            with self._lock:
                self._checks_in_flight -= 1

    def _check(self, addr: str, frame: Frame) -> None:
        try:
            msg = checked_message(frame)
            if msg is None:
                return
            _group, qo, phys, _msg_id, tx_id = check_fields(frame)
            try:
                msg.transaction_id = tx_id
            except AttributeError:
                pass
            try:
                state = to_state(self.checker(msg))
            except Exception:  # noqa: BLE001
                log.exception("transaction checker raised for %s: UNKNOW", tx_id)
                state = LocalTransactionState.UNKNOW
            with self._lock:
                self.stats["checks"] += 1
            if state is LocalTransactionState.UNKNOW:
                return
            end = end_transaction_frame(self.group, state, qo, phys, str(frame.fields.get("offsetMsgId", "")),
                                        tx_id, True)
            sender = self._producer._sender
            if not self._producer.closed:
                sender.call(lambda: sender.send_frame(addr, end)).add_done_callback(_log_end_failure)
        finally:
            with self._lock:
                self._checks_in_flight -= 1

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._producer.closed

    def close(self, timeout: Optional[float] = None) -> None:
        """Finish the checks in progress, then close the producer (see :meth:`rmq.Producer.close`)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._producer.close(timeout)

    def __enter__(self) -> "TransactionProducer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TransactionProducer(group={self.group!r}, client_id={self.client_id!r})"


def _log_end_failure(fut) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("END_TRANSACTION not sent (%s): the broker will check back", exc)


__all__ = ["LocalTransactionState", "TransactionProducer", "TransactionSendResult", "end_transaction_frame",
           "checked_message", "check_fields", "half_message", "to_state", "commitlog_offset_of"]
