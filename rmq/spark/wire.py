"""The ``rmq`` Spark connector's side of the wire: queue discovery, queue offsets and range reads.

Everything goes through the NameServer (routes, topic list) and the brokers' request
path (GET_TOPIC_STATS_INFO, SEARCH_OFFSET_BY_TIMESTAMP, PULL_MESSAGE), never through
store files, so executors on other machines read the same way as the driver.

Driver side: :class:`ClusterView` (one per reader; lives in the planner process).
Executor side: :func:`read_range` pulls ``[start, end)`` of one queue, with a
process-wide :class:`ConsumerAPI` per NameServer (Python workers are reused across
tasks, so connections are too).
"""
from __future__ import annotations

import logging
import atexit
import os
import re
import threading
import time
from collections import deque
from typing import Iterator, Optional

from rmq.client.consumer_api import (ConsumerAPI, RequestMux, SubscriptionData, build_pull_frame,
                                     parse_pull_response)
from rmq.client.message import MessageQueue, PullStatus
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RmqError
from rmq.protocol import Frame, RequestCode, ResponseCode, unpack_body
from rmq.spark.offsets import EARLIEST, LATEST, OffsetSpec, key_of
from rmq.spark.options import SourceOptions

log = logging.getLogger("rmq.spark")

PULL_RETRIES = 3                 # attempts of one pull on a timeout / unreachable broker
PULL_RETRY_BACKOFF_S = 0.2       # sleep between attempts (doubles)
MAX_STALLS = 50                  # pulls in a row without progress before giving up (MESSAGE_WAS_REMOVING)
PIPELINE_DEPTH = 4               # pulls in flight per queue range: hides the round trip and the broker's work

__all__ = ["RmqSourceError", "RmqDataLossError", "ClusterView", "read_range", "consumer_api", "data_loss"]


class RmqSourceError(RmqError, RuntimeError):
    """The source cannot plan or read (unknown topic, broker unreachable, bad offsets)."""


class RmqDataLossError(RmqSourceError):
    """Offsets to read are gone (files cleaned, queue truncated) and ``failOnDataLoss`` is true."""


def data_loss(opts: SourceOptions, what: str) -> None:
    """Fail (``failOnDataLoss=true``) or log a warning, as Spark's Kafka source does.

    Raises
    ------
    RmqDataLossError
    """
    if opts.fail_on_data_loss:
        raise RmqDataLossError(f"{what}. Some data may have been lost because it is no longer available "
                               f"in the broker (e.g. expired CommitLog files were cleaned). If you want the "
                               f"query to skip it and go on, set the option 'failOnDataLoss' to 'false'.")
    log.warning("%s. Some data may have been lost; skipping it because failOnDataLoss is false.", what)


# -- executor-side client cache ----------------------------------------------------------------------
_apis: dict = {}
_apis_lock = threading.Lock()


def consumer_api(name_server: str, timeout_ms: int) -> ConsumerAPI:
    """A process-wide :class:`ConsumerAPI` for ``name_server`` (re-created after a fork)."""
    key = (name_server, timeout_ms, os.getpid())
    with _apis_lock:
        api = _apis.get(key)
        if api is None:
            api = _apis[key] = ConsumerAPI(name_server, timeout_ms)
        return api


def _close_apis() -> None:
    """At exit: close this process's cached clients (their sockets would be reported unclosed)."""
    pid = os.getpid()
    with _apis_lock:
        mine = [key for key in _apis if key[2] == pid]
        apis = [_apis.pop(key) for key in mine]
    for api in apis:
        try:
            api.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


atexit.register(_close_apis)


# -- driver side ---------------------------------------------------------------------------------------
class ClusterView:
    """Queues of the subscribed topics and their offsets, as the NameServer and brokers see them now.

    Concurrency: one thread (the planner's).  :meth:`close` releases the sockets.
    """

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.api = ConsumerAPI(opts.name_server, opts.pull_timeout_ms)
        self.broker_epochs: dict = {}      # broker name -> HA epoch of its last offset table (0: none)

    def close(self) -> None:
        self.api.close()

    # -- what to read ----------------------------------------------------------------------------
    def topics(self) -> list:
        """Explicit topics, or the NameServer's topics that ``topicPattern`` fully matches."""
        if self.opts.topic_pattern is None:
            return list(self.opts.topics)
        pat = re.compile(self.opts.topic_pattern)
        last: Optional[Exception] = None
        for addr in self.api.namesrv_addrs:
            try:
                resp = self.api.invoke(addr, Frame(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
            except RemotingError as e:
                last = e
                continue
            if resp.code != ResponseCode.SUCCESS:
                last = MQBrokerError(resp.remark or str(resp.code), resp.code, addr)
                continue
            body = unpack_body(resp)
            names = body.get("topicList") if isinstance(body, dict) else None
            return sorted(t for t in names or [] if isinstance(t, str) and pat.fullmatch(t))
        raise RmqSourceError(f"cannot list topics for 'topicPattern' from NameServer "
                             f"{self.opts.name_server}: {last}")

    def queues(self, strict: bool) -> list:
        """Readable queues of the selection, sorted.

        Parameters
        ----------
        strict : bool
            An explicit topic without a route raises (batch); otherwise it is skipped
            (streaming: the topic may be created later).

        Raises
        ------
        RmqSourceError
            Unknown topic (strict), an assigned queue that does not exist, or no NameServer answer.
        """
        out = []
        for t in self.topics():
            try:
                route = self.api.fetch_route(t)
            except (RemotingError, MQClientError) as e:
                raise RmqSourceError(f"route of topic {t!r} from NameServer {self.opts.name_server}: {e}") from None
            if route is None:
                if strict and self.opts.topic_pattern is None:
                    raise RmqSourceError(f"topic {t!r} does not exist (NameServer {self.opts.name_server} has "
                                         f"no route for it)")
                log.warning("topic %r has no route yet; it is read once it exists", t)
                continue
            mqs = route.subscribe_queues()
            if self.opts.assign is not None:
                wanted = self.opts.assign[t]
                picked = [mq for mq in mqs if (mq.broker_name, mq.queue_id) in wanted or (None, mq.queue_id) in wanted]
                have = {(mq.broker_name, mq.queue_id) for mq in mqs} | {(None, mq.queue_id) for mq in mqs}
                missing = sorted(((b or "*"), q) for b, q in wanted if (b, q) not in have)
                if missing and strict:
                    raise RmqSourceError(f"option 'assign': topic {t!r} has no queue "
                                         + ", ".join(f"{b}/{q}" for b, q in missing)
                                         + f" (it has {', '.join(key_of(mq) for mq in mqs) or 'none'})")
                mqs = picked
            out.extend(mqs)
        return sorted(out)

    # -- offsets ---------------------------------------------------------------------------------
    def offset_table(self, mqs: list) -> dict:
        """``{mq: (min_offset, max_offset)}``, one GET_TOPIC_STATS_INFO per (broker, topic);
        :attr:`broker_epochs` gets each broker's HA epoch of those offsets (``brokerEpoch``).

        Raises
        ------
        RmqSourceError
            A broker did not answer or does not know the topic.
        """
        groups: dict = {}
        for mq in mqs:
            groups.setdefault((mq.broker_name, mq.topic), []).append(mq)
        out = {}
        for (broker, topic), qs in sorted(groups.items()):
            try:
                addr = self.api.broker_addr(broker, topic)
                resp = self.api.invoke(addr, Frame(RequestCode.GET_TOPIC_STATS_INFO, fields={"topic": topic}))
                if resp.code != ResponseCode.SUCCESS:
                    raise MQBrokerError(resp.remark or str(resp.code), resp.code, addr)
                body = unpack_body(resp)
            except (RemotingError, MQClientError) as e:
                raise RmqSourceError(f"offsets of topic {topic!r} on broker {broker!r}: {e}") from None
            epoch = resp.fields.get("brokerEpoch", 0)
            self.broker_epochs[broker] = epoch if type(epoch) is int else 0
            table = {int(r["queueId"]): (int(r["minOffset"]), int(r["maxOffset"]))
                     for r in (body.get("offsetTable") or []) if isinstance(r, dict)}
            for mq in qs:
                out[mq] = table.get(mq.queue_id, (0, 0))
        return out

    def lost_tail_start(self, mq: MessageQueue, offset: int, epoch: int) -> Optional[int]:
        """Where the tail of ``mq`` that a failover lost began, when ``offset`` (read in HA epoch
        ``epoch``) lies in it; None when it does not (or the broker cannot tell).

        One pull of a message at ``offset`` with ``lastEpoch``: a broker whose log left ``epoch``
        behind answers OFFSET_ILLEGAL with the queue offset where its newer epochs begin
        (``PullMessageProcessor.past_epoch_end``).  The messages stored from there on since the
        failover are others than the ones read there before.

        Raises
        ------
        RmqSourceError
            The broker did not answer or refused the pull.
        """
        try:
            res = self.api.pull(self.opts.consumer_group, mq, offset, 1, timeout_ms=self.opts.pull_timeout_ms,
                                last_epoch=epoch)
        except (RemotingError, MQClientError) as e:
            raise RmqSourceError(f"position {offset} of {key_of(mq)} after a failover: {e}") from None
        if res.pull_status is PullStatus.OFFSET_ILLEGAL and res.next_begin_offset < offset:
            return res.next_begin_offset
        return None

    def offset_by_time(self, mq: MessageQueue, ts_ms: int, lo: int, hi: int) -> int:
        """First queue offset whose store time is >= ``ts_ms`` (``hi`` when there is none).

        The broker answers the *nearest* message; when that one is older than
        ``ts_ms`` the next offset is the answer.

        Raises
        ------
        RmqSourceError
        """
        try:
            o = self.api.search_offset(mq, ts_ms)
        except (RemotingError, MQClientError) as e:
            raise RmqSourceError(f"offset by time {ts_ms} of {key_of(mq)}: {e}") from None
        o = min(max(o, lo), hi)
        if o < hi:
            try:
                res = self.api.pull(self.opts.consumer_group, mq, o, 1, timeout_ms=self.opts.pull_timeout_ms)
            except (RemotingError, MQClientError) as e:
                raise RmqSourceError(f"offset by time {ts_ms} of {key_of(mq)}: {e}") from None
            if res.pull_status is PullStatus.FOUND and res.msg_found_list:
                m = res.msg_found_list[0]
                if m.store_timestamp < ts_ms:
                    o = m.queue_offset + 1
        return o

    def resolve(self, mq: MessageQueue, spec: Optional[OffsetSpec], ts_ms: Optional[int], default: int,
                lo: int, hi: int, option: str) -> int:
        """Offset of ``mq`` for a starting / ending option (timestamp first, as Kafka).

        Returns an offset; an explicit one may lie below ``lo`` (data loss is reported
        when it is read).

        Raises
        ------
        RmqSourceError
            An explicit offset beyond the queue's max offset.
        """
        if ts_ms is not None:
            return self.offset_by_time(mq, ts_ms, lo, hi)
        v = spec.resolve(mq) if spec is not None else None
        if v is None:
            v = default
        if v == EARLIEST:
            return lo
        if v == LATEST:
            return hi
        if v > hi:
            raise RmqSourceError(f"option {option!r}: offset {v} of {key_of(mq)} is beyond its max offset {hi}")
        return v


# -- executor side: read one queue range -----------------------------------------------------------
class _Chunk:
    """Queue offsets ``[lo, hi)`` pulled as one unit; ``cursor`` is the next offset to ask for."""
    __slots__ = ("hi", "cursor", "pages", "done", "attempts", "stalls")

    def __init__(self, lo: int, hi: int):
        self.cursor = lo
        self.hi = hi
        self.pages: list = []         # pulled, not yet handed out
        self.done = False
        self.attempts = 0             # failed sends / timeouts in a row
        self.stalls = 0               # answers without progress in a row


class _RangeReader:
    """Pulls ``[start, end)`` of one queue with up to ``PIPELINE_DEPTH`` pulls in flight.

    The range is cut into chunks of about what one pull returns (``pullBatchSize`` at
    first, then the broker's observed cap: maxTransferCount / maxTransferBytes), one
    pull per chunk is outstanding, and chunks are handed out in queue order.  A chunk
    whose pull came back short asks again from ``nextBeginOffset``.  This hides the round
    trip and the broker's work behind the task's Arrow building (about +30 % rows/s with
    1024-message pulls).  With the broker's default caps (32 messages / 256 KiB a pull)
    the broker's cost per pull dominates instead: raise maxTransferCountOnMessageInMemory
    and maxTransferBytesOnMessageInMemory on brokers that serve Spark.

    Concurrency: one thread; the sockets are closed by :meth:`close`.
    """

    def __init__(self, opts: SourceOptions, mq: MessageQueue, start: int, end: int, raw: bool = False):
        self.opts = opts
        self.mq = mq
        self.raw = raw                # pages are RawPage (undecoded records), not MessageExt lists
        self.end = end
        self.next_lo = start
        self.api = consumer_api(opts.name_server, opts.pull_timeout_ms)
        self.sub = None if opts.selector is None else SubscriptionData.build(mq.topic, opts.selector)
        self.chunk_size = opts.pull_batch_size
        self.learned = self.sub is not None       # filtered pulls return matches only: nothing to learn
        self.chunks: deque = deque()
        self.mux = RequestMux()
        self.addr = self._addr(refresh=False)

    def close(self) -> None:
        self.mux.close()

    def _addr(self, refresh: bool) -> str:
        try:
            if refresh:
                self.api.fetch_route(self.mq.topic)
            return self.api.broker_addr(self.mq.broker_name, self.mq.topic)
        except (RemotingError, MQClientError) as e:
            raise RmqSourceError(f"broker of {key_of(self.mq)}: {e}") from None

    def _send(self, c: _Chunk) -> None:
        n = min(self.opts.pull_batch_size, c.hi - c.cursor)
        frame = build_pull_frame(self.opts.consumer_group, self.mq, c.cursor, n,
                                 self.sub if self.sub else "*")
        try:
            self.mux.send(self.addr, frame, self.opts.pull_timeout_ms, c)
        except RemotingError as e:
            self._failed(c, e)

    def _failed(self, c: _Chunk, e: Exception) -> None:
        c.attempts += 1
        if c.attempts >= PULL_RETRIES:
            raise RmqSourceError(f"pull of {key_of(self.mq)} at queue offset {c.cursor} failed {c.attempts} times "
                                 f"(pullTimeoutMs={self.opts.pull_timeout_ms}): {e}")
        time.sleep(PULL_RETRY_BACKOFF_S * 2 ** (c.attempts - 1))
        try:
            self.addr = self._addr(refresh=True)   # the broker may have moved (restart on a new address)
        except RmqSourceError:
            pass
        self._send(c)

    def _fill(self) -> None:
        depth = PIPELINE_DEPTH if self.learned else 1      # learn the broker's cap before fanning out
        while len(self.chunks) < depth and self.next_lo < self.end:
            c = _Chunk(self.next_lo, min(self.next_lo + self.chunk_size, self.end))
            self.next_lo = c.hi
            self.chunks.append(c)
            self._send(c)

    def _stall(self, c: _Chunk, why: str) -> None:
        c.stalls += 1
        if c.stalls > MAX_STALLS:
            raise RmqSourceError(f"{key_of(self.mq)}: the broker makes no progress at queue offset {c.cursor} "
                                 f"({why})")
        time.sleep(0.01)
        self._send(c)

    def _lost_below_min(self, c: _Chunk, min_offset: int) -> None:
        data_loss(self.opts, f"{key_of(self.mq)}: queue offsets [{c.cursor}, {min(min_offset, c.hi)}) are below "
                             f"the queue's min offset {min_offset}")
        self._advance(c, min_offset)

    def _advance(self, c: _Chunk, nxt: int) -> None:
        c.cursor = nxt
        c.stalls = 0
        c.attempts = 0
        if nxt >= c.hi:
            c.done = True
        else:
            self._send(c)

    def _handle(self, c: _Chunk, resp) -> None:
        if isinstance(resp, Exception):
            self._failed(c, resp)
            return
        try:
            res = _parse_raw(resp, self.addr, c.hi) if self.raw else parse_pull_response(resp, self.sub, self.addr)
        except MQClientError as e:
            raise RmqSourceError(f"pull of {key_of(self.mq)} at queue offset {c.cursor}: {e}") from None
        st, nxt, mq = res.pull_status, res.next_begin_offset, self.mq
        if st is PullStatus.OFFSET_ILLEGAL:
            if c.cursor < res.min_offset:
                self._lost_below_min(c, res.min_offset)
            else:
                data_loss(self.opts, f"{key_of(mq)}: queue offsets [{c.cursor}, {c.hi}) are beyond the queue's "
                                     f"max offset {res.max_offset} (the queue was truncated or recreated)")
                c.done = True
            return
        if st is PullStatus.NO_NEW_MSG:
            if c.cursor < res.min_offset:                   # OFFSET_FOUND_NULL of a cleaned file
                self._lost_below_min(c, res.min_offset)
            elif nxt > c.cursor:                            # a missing ConsumeQueue file: rolled past
                data_loss(self.opts, f"{key_of(mq)}: queue offsets [{c.cursor}, {min(nxt, c.hi)}) cannot be read")
                self._advance(c, nxt)
            elif c.cursor < res.max_offset:
                self._stall(c, "NO_NEW_MSG below the max offset")
            else:
                data_loss(self.opts, f"{key_of(mq)}: queue offsets [{c.cursor}, {c.hi}) are beyond the queue's "
                                     f"max offset {res.max_offset}")
                c.done = True
            return
        if st is PullStatus.FOUND and self.raw:
            page = res.msg_found_list          # a RawPage, already cut below c.hi
            if page is not None and self.sub is None and page.count and page.first_queue_offset > c.cursor:
                data_loss(self.opts, f"{key_of(mq)}: queue offsets [{c.cursor}, {page.first_queue_offset}) were "
                                     f"skipped by the broker (their CommitLog records are gone)")
            if page is not None and page.count:
                c.pages.append(page)
            if not self.learned and nxt < c.hi:
                self.chunk_size = max(1, nxt - c.cursor)
            self.learned = True
        elif st is PullStatus.FOUND:
            msgs = res.msg_found_list
            if msgs and self.sub is None and msgs[0].queue_offset > c.cursor:
                data_loss(self.opts, f"{key_of(mq)}: queue offsets [{c.cursor}, {msgs[0].queue_offset}) were "
                                     f"skipped by the broker (their CommitLog records are gone)")
            if msgs and msgs[-1].queue_offset >= c.hi:
                msgs = [m for m in msgs if m.queue_offset < c.hi]
            if msgs:
                c.pages.append(msgs)
            if not self.learned and nxt < c.hi:            # a short answer: the broker's cap per pull
                self.chunk_size = max(1, nxt - c.cursor)
            self.learned = True
        if nxt <= c.cursor:                                 # MESSAGE_WAS_REMOVING or nothing scanned
            self._stall(c, f"status {st.value}")
            return
        self._advance(c, nxt)

    def pages(self) -> Iterator[list]:
        while True:
            self._fill()
            while self.chunks and (self.chunks[0].pages or self.chunks[0].done):
                head = self.chunks[0]
                pages, head.pages = head.pages, []
                if head.done:
                    self.chunks.popleft()
                yield from pages
                self._fill()
            if not self.chunks:
                return
            done, _ = self.mux.poll(self.opts.pull_timeout_ms)
            for c, resp, _addr in done:
                self._handle(c, resp)


def _parse_raw(resp: Frame, addr: str, end: int):
    """PULL_MESSAGE response -> PullResult whose ``msg_found_list`` is a :class:`RawPage` of the
    records below queue offset ``end`` (None when there are none): records are not decoded,
    bodies not inflated, tags not re-checked (``pages_to_batch`` does it)."""
    from rmq.client.consumer_api import _PULL_STATUS
    from rmq.client.message import PullResult
    from rmq.spark.arrow import RawPage
    status = _PULL_STATUS.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.remark or f"pull failed with code {resp.code}", resp.code, addr)
    f = resp.fields
    page = None
    if status is PullStatus.FOUND and resp.bodies:
        try:
            page = RawPage.scan(resp.bodies[0], end)
        except (ValueError, TypeError) as e:
            raise MQClientError(f"pull from {addr}: records do not decode: {e}") from None
    return PullResult(status, int(f.get("nextBeginOffset", 0)), int(f.get("minOffset", 0)),
                      int(f.get("maxOffset", 0)), page)


def read_range(opts: SourceOptions, mq: MessageQueue, start: int, end: int, raw: bool = False) -> Iterator[list]:
    """Pull ``[start, end)`` of ``mq``; yields pages (lists of MessageExt, in queue order).

    Bodies come back inflated and, with a tag subscription, only exact tag matches.
    With ``raw``, pages are :class:`rmq.spark.arrow.RawPage` (undecoded records, for
    :func:`rmq.spark.arrow.pages_to_batch`, which inflates and re-checks tags).
    A gap below the queue's min offset is data loss: :func:`data_loss` fails or skips it.

    Raises
    ------
    RmqDataLossError
        Offsets of the range were cleaned and ``failOnDataLoss`` is true.
    RmqSourceError
        The broker cannot be reached or refuses the pull.
    """
    if start >= end:
        return
    reader = _RangeReader(opts, mq, start, end, raw)
    try:
        yield from reader.pages()
    finally:
        reader.close()
