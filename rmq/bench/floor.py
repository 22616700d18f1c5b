"""The Python floor of the client API's per-message calls on this machine: what any
implementation of ``Producer.send_async`` and of a ``PushConsumer`` with RocketMQ's
``consumeMessageBatchMaxSize`` of 1 must spend per message, measured with no I/O at all
(issue 17: a target above this floor cannot be met on this machine, whatever the client does).

``send_async``
    per message, as the ``Producer.send_async`` row's loop and producer do at the least: the
    caller's ``Message(topic, body)``; one future, made in C as the producer makes it
    (:func:`rmq._core.client_msg.new_send_future`, the cheapest future the API allows) and held
    until it completes; then each future completed (:func:`rmq._core.client_msg.finish_future`)
    with one shared :class:`SendResult`, which runs the row's own callback
    (:class:`rmq.bench.client._Outcomes`).  Left out: unique ids, properties, the batch encoding,
    the wire, the broker, one SendResult per message, the I/O thread and its GIL hand-offs.
``push``
    per message, as the ``PushConsumer`` row's consumer does at the least: its ``MessageExt``
    decoded in C from real CommitLog records (:func:`rmq._core.commitlog.decode_records` over
    pages of 1024, as pulls bring them), then one call of the row's own counting listener
    (:meth:`rmq.bench.client._Counter.listener`) with ``[msg]`` and a
    :class:`ConsumeConcurrentlyContext`, its status checked.  Left out: the wire, the process
    queue, offsets, consume threads.

One thread, the cyclic GC on (as users run), best of ``rounds``; msgs/s.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from array import array

FLOOR_ROUNDS = 3                  # best of: the floor is a ceiling, so noise is taken out upward
RECORDS_PER_PAGE = 1024           # records per pull page of the push floor (PUSH_PULL_BATCH_SIZE)
STORE_HOST = bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])     # 127.0.0.1:10911


def record_pages(n: int, body_size: int, topic: str = "floor", per_page: int = RECORDS_PER_PAGE) -> list:
    """``n`` CommitLog records (layout: SPEC.md §CommitLog) of ``body_size``-byte bodies with TAGS
    and UNIQ_KEY, as the broker stores and serves them (with ``__CRC32#``), cut into pull pages of
    ``per_page`` records; a list of bytes-like pages."""
    from rmq._core import commitlog as cl
    from rmq._core.mapped_file import MappedFile
    d = tempfile.mkdtemp(prefix="rmq-bench-records-")
    pages = []
    mf = MappedFile(os.path.join(d, "00000000000000000000"),
                    (n // per_page + 1) * per_page * (body_size + 200) + 4096)
    try:
        body = b"x" * body_size
        for start in range(0, n, per_page):
            k = min(per_page, n - start)
            batch = cl.encode_batch([(body, cl.encode_properties({"TAGS": "t", "UNIQ_KEY": "%032X" % (start + i)}), 0)
                                     for i in range(k)])
            pos = mf.wrote_position
            res = cl.append_batch(mf, batch, topic.encode(), 0, start, 0, 1700000000000, STORE_HOST, STORE_HOST,
                                  1700000000001, b"", True, 0, 0, 4 << 20, array("q", [0] * k))
            pages.append(mf.read(pos, res[2]))
    finally:
        mf.close()
        shutil.rmtree(d, ignore_errors=True)
    return pages


def _best(run, n: int, rounds: int) -> dict:
    """``{"msgs", "seconds", "msgs_per_s"}`` of the best of ``rounds`` calls of ``run() ->
    seconds`` for ``n`` messages."""
    secs = min(run() for _ in range(rounds))
    return {"msgs": n, "seconds": secs, "msgs_per_s": n / secs if secs > 0 else 0.0}


def send_async_floor(size: int, n: int, rounds: int = FLOOR_ROUNDS) -> dict:
    """``{"msgs", "seconds", "msgs_per_s"}`` of the send_async floor (module docstring).

    Raises
    ------
    RuntimeError
        The callback did not count ``n`` outcomes.
    """
    from rmq._core.client_msg import finish_future, new_send_future
    from rmq.bench.client import _Outcomes, body_of
    from rmq.client.futures import SendFuture
    from rmq.client.message import Message, SendResult, SendStatus
    body = body_of(size)
    result = SendResult(SendStatus.SEND_OK, "0" * 32, None, 0, "0" * 32)

    def run():
        cb = _Outcomes(n, threading.Event())
        t0 = time.perf_counter()
        futures = []
        for _ in range(n):
            Message("floor", body)
            futures.append(new_send_future(SendFuture, cb))
        for f in futures:
            finish_future(f, result, None)
        secs = time.perf_counter() - t0
        if cb.seen != n:
            raise RuntimeError(f"send_async floor: {cb.seen:,} of {n:,} outcomes counted")
        return secs
    return _best(run, n, rounds)


def push_floor(size: int, n: int, rounds: int = FLOOR_ROUNDS) -> dict:
    """``{"msgs", "seconds", "msgs_per_s"}`` of the PushConsumer floor (module docstring).

    Raises
    ------
    RuntimeError
        The listener did not count ``n`` messages.
    """
    from rmq._core import commitlog as cl
    from rmq._core.consume import ConsumeConcurrentlyContext
    from rmq.bench.client import _Counter
    from rmq.client.consumer import ConsumeConcurrentlyStatus
    from rmq.client.message import MessageQueue
    pages = record_pages(n, size)
    mq = MessageQueue("floor", "broker-a", 0)
    ok = ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def run():
        cnt = _Counter(n)
        listener = cnt.listener(ok)
        t0 = time.perf_counter()
        for page in pages:
            for m in cl.decode_records(page):
                if listener([m], ConsumeConcurrentlyContext(mq)) is not ok:
                    raise RuntimeError("push floor: the listener did not answer CONSUME_SUCCESS")
        secs = time.perf_counter() - t0
        if cnt.got != n:
            raise RuntimeError(f"push floor: {cnt.got:,} of {n:,} messages counted")
        return secs
    return _best(run, n, rounds)
