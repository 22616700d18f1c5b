"""RocketMQ's ``DefaultMQProducerImpl.sendDefaultImpl`` retry rules for one send request, without
I/O: which queue and broker each attempt goes to, when a failure is retried, and what the send
finally raises.  The three ways rmq sends drive the same :class:`SendAttempts`:

- the producer's I/O thread (:class:`rmq.client.sender.Sender`, event-driven: an attempt is
  sent, its answer or timeout arrives later; its ``message_accumulator.Request`` *is* a SendAttempts);
- the direct path of ``Producer.send`` (:mod:`rmq.client.direct`, blocking);
- ``rmq.aio.Producer`` (awaiting).

Rules (SPEC.md §11.1, RocketMQ 4.x/5.x ``sendDefaultImpl``):

- an attempt needs time left before the deadline (the send's budget, ``sendMsgTimeout``);
- a fixed queue (a selector or an explicit queue) is used as is; otherwise the fault strategy
  picks one, avoiding the broker of the previous attempt (``selectOneMessageQueue(tpInfo,
  lastBrokerName)``);
- every answer or failure updates the latency fault item of the broker (isolation on failure);
- a failure is retried while attempts (``1 + retryTimesWhenSendFailed``, one for a fixed queue)
  and time remain and it is retryable (:func:`is_retryable`: no answer, or a code of
  ``retry_response_codes``);
- a send that was retried, or could have been, ends with :func:`final_error` ("Send [N] times,
  still failed, ..."); a first failure that could not be retried is raised as it is.

Concurrency: a SendAttempts belongs to the thread or task that drives its request.
"""
from __future__ import annotations

from typing import Optional

from rmq.client.message import MessageQueue
from rmq.errors import (MQBrokerError, MQClientError, RemotingConnectionClosedError, RemotingError,
                        RemotingTimeoutError)


def is_retryable(exc: BaseException, opts) -> bool:
    """Whether a failed attempt may be retried on another queue (RocketMQ ``sendDefaultImpl``):
    no answer (RemotingError), a broker code in ``opts.retry_response_codes``, or a client-side
    failure with no response code."""
    if isinstance(exc, MQBrokerError):
        return exc.response_code in opts.retry_response_codes
    return isinstance(exc, RemotingError) or (isinstance(exc, MQClientError) and exc.response_code < 0)


def final_error(last: BaseException, attempts: int, cost_ms: float, topic: str, brokers: list) -> BaseException:
    """The error a send ends with after ``attempts`` tries: ``last``'s type, with RocketMQ's
    "Send [N] times, still failed" description (``last`` as the cause)."""
    info = (f"Send [{attempts}] times, still failed, cost [{cost_ms:.0f}]ms, Topic: {topic}, "
            f"BrokersSent: {brokers}: {getattr(last, 'remark', None) or last}")
    if isinstance(last, MQBrokerError):
        err: BaseException = MQBrokerError(info, last.response_code, last.broker_addr)
    elif isinstance(last, MQClientError):
        err = type(last)(info, last.response_code) if type(last) in (
            MQClientError, RemotingError, RemotingTimeoutError, RemotingConnectionClosedError) else last
    else:
        err = MQClientError(info)
    if err is not last:
        err.__cause__ = last
    return err


class SendAttempts:
    """The attempts of one send request of ``n`` messages to ``topic``.

    Parameters
    ----------
    topic : str
    n : int
        Messages in the request (for the error texts).
    fixed : MessageQueue, optional
        The queue every attempt goes to (selector / explicit queue); None: the fault strategy's.
    max_attempts : int
        1 + retryTimesWhenSendFailed (1 for a fixed queue or a one-way send).
    started, deadline : float
        Monotonic seconds: when the send began and when its budget ends.

    State after :meth:`target`: ``mq`` / ``addr`` of the attempt in flight, ``attempt`` (1 for the
    first), ``sent_at``, ``brokers_sent`` (broker names in order), ``last_broker``.
    """

    __slots__ = ("topic", "n", "fixed", "max_attempts", "attempt", "started", "deadline", "mq", "addr",
                 "sent_at", "brokers_sent", "last_broker")

    def __init__(self, topic: str, n: int, fixed: Optional[MessageQueue], max_attempts: int, started: float,
                 deadline: float):
        self.topic, self.n, self.fixed, self.max_attempts = topic, n, fixed, max_attempts
        self.started, self.deadline = started, deadline
        self.attempt = 0
        self.mq: Optional[MessageQueue] = None
        self.addr = ""
        self.sent_at = 0.0
        self.brokers_sent: list = []
        self.last_broker: Optional[str] = None

    def target(self, now: float, route_cache, fault) -> tuple:
        """``(mq, broker address)`` of the next attempt, which counts from here (``sent_at`` = ``now``).

        Raises
        ------
        RemotingTimeoutError
            The deadline passed before the attempt could be sent.
        MQClientError
            No route for the topic, no queue to choose, or no master address for the chosen broker.
        """
        if now >= self.deadline:
            raise RemotingTimeoutError(
                f"send of {self.n} message(s) to topic {self.topic} timed out after "
                f"{(now - self.started) * 1000:.0f} ms before it could be sent"
                f"{' (attempt %d)' % (self.attempt + 1) if self.attempt else ''}")
        mq = self.fixed
        if mq is None:
            info = route_cache.publish_info(self.topic)
            if info is None:
                raise MQClientError(f"No route info of this topic: {self.topic}")
            mq = fault.select_one_message_queue(info, self.last_broker)
        addr = route_cache.find_broker_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist (no master address)")
        self.mq, self.addr, self.sent_at = mq, addr, now
        self.attempt += 1
        if mq.broker_name not in self.brokers_sent:
            self.brokers_sent.append(mq.broker_name)
        return mq, addr

    def answered(self, now: float, fault) -> None:
        """The attempt in flight was answered SEND_OK (or a flush / slave status): its broker's
        latency goes to the fault strategy."""
        fault.update_fault_item(self.mq.broker_name, (now - self.sent_at) * 1000.0, False)

    def failed(self, exc: BaseException, now: float, fault, opts) -> Optional[BaseException]:
        """The attempt in flight failed with ``exc`` (an error answer, no answer, a dropped
        connection): its broker is isolated by the fault strategy.  None when the send goes on
        (call :meth:`target` again: another broker is preferred); else the exception the send
        ends with (:meth:`give_up`)."""
        fault.update_fault_item(self.mq.broker_name, (now - self.sent_at) * 1000.0, True)
        if self.attempt < self.max_attempts and now < self.deadline and is_retryable(exc, opts):
            self.last_broker = self.mq.broker_name
            return None
        return self.give_up(exc, now, opts)

    def give_up(self, exc: BaseException, now: float, opts) -> BaseException:
        """What the send raises when it ends on ``exc``: :func:`final_error` when it was retried or
        could have been, else ``exc`` itself."""
        if self.attempt > 1 or (self.attempt == 1 and self.max_attempts > 1 and is_retryable(exc, opts)):
            return final_error(exc, self.attempt, (now - self.started) * 1000.0, self.topic, self.brokers_sent)
        return exc


__all__ = ["SendAttempts", "is_retryable", "final_error"]
