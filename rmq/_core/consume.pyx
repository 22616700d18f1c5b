# cython: language_level=3, embedsignature=True
"""The PushConsumer's per-message objects in C: what a consume run builds for every listener call.

* :class:`ConsumeConcurrentlyContext` -- RocketMQ's ``ConsumeConcurrentlyContext``, one per
  listener call (with the defaults, one per message): a C type, built without a Python frame;
* :class:`ConsumeRun` -- the ConsumeRequests of one pull result, cut when a worker takes one
  (:meth:`ConsumeRun.take` runs without releasing the GIL, so workers sharing a run never get
  the same request);
* :func:`consume_run` -- a concurrent consume task's loop over a run's requests: the listener
  call and its bookkeeping for every message, without a Python frame of its own.

This module imports no client, store or actor module.
"""
cimport cython
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from rmq._core.commitlog cimport MessageExt

ACK_INDEX_ALL = 2 ** 31 - 1      # ConsumeConcurrentlyContext.ackIndex = Integer.MAX_VALUE
RUN_COMMIT_INTERVAL_S = 0.05     # a run's consumed messages are committed at least this often


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


@cython.freelist(64)
cdef class ConsumeConcurrentlyContext:
    """Passed to a concurrent listener (RocketMQ ``ConsumeConcurrentlyContext``).

    ``delay_level_when_next_consume``: 0 lets the broker pick ``3 + reconsumeTimes``; -1 sends
    failed messages straight to the DLQ; 1..18 a level.  ``ack_index``: with CONSUME_SUCCESS,
    the messages after this index still count as failed (partial success).
    """
    cdef public object message_queue
    cdef public object delay_level_when_next_consume
    cdef public object ack_index

    def __init__(self, message_queue, delay_level_when_next_consume=0, ack_index=ACK_INDEX_ALL):
        self.message_queue = message_queue
        self.delay_level_when_next_consume = delay_level_when_next_consume
        self.ack_index = ack_index

    def __repr__(self):
        return (f"ConsumeConcurrentlyContext(message_queue={self.message_queue!r}, delay_level_when_next_consume="
                f"{self.delay_level_when_next_consume!r}, ack_index={self.ack_index!r})")

    def __eq__(self, other):
        if type(other) is not ConsumeConcurrentlyContext:
            return NotImplemented
        o = <ConsumeConcurrentlyContext>other
        return (self.message_queue, self.delay_level_when_next_consume, self.ack_index) == \
            (o.message_queue, o.delay_level_when_next_consume, o.ack_index)

    __hash__ = None


cdef class ConsumeRun:
    """The ConsumeRequests (slices of at most ``size`` = ``consume_message_batch_max_size``
    messages) of one pull result ``msgs`` of ``mq``, taken by the workers that get the run
    (RocketMQ's ``submitConsumeRequest`` makes one task of each).  A request's list is cut when a
    worker takes it, not before: a pull result of 256 messages is not 256 lists alive at once
    for the cyclic GC to walk."""
    cdef readonly list msgs
    cdef readonly Py_ssize_t size, count
    cdef readonly object pq, mq
    cdef Py_ssize_t _next
    cdef list _done                  # wholly consumed messages not committed yet (every worker's)
    cdef double _last                # when they were last handed out for a commit (CLOCK_MONOTONIC s)

    def __init__(self, list msgs, Py_ssize_t size, pq, mq):
        if size < 1:
            raise ValueError(f"consume batch size must be >= 1, got {size}")
        self.msgs = msgs
        self.size = size
        self.count = (len(msgs) + size - 1) // size       # requests
        self.pq = pq
        self.mq = mq
        self._next = 0
        self._done = []
        self._last = _monotonic()

    def take(self):
        """The next request's messages (a new list), or None when every request is taken."""
        return self._take()

    cdef inline object _take(self):
        cdef Py_ssize_t k = self._next
        if k >= self.count:
            return None
        self._next = k + 1
        return self.msgs[k * self.size:(k + 1) * self.size]

    def left(self):
        """How many requests are not taken yet."""
        return self.count - self._next

    def consumed(self, list msgs):
        """Request ``msgs`` was wholly consumed: it joins the run's messages to commit.  Returns
        them all (a list to commit now) once RUN_COMMIT_INTERVAL_S passed since the last time,
        else None; the workers sharing the run share the list (committing any consumed message
        is right whoever consumed it)."""
        return self._consumed(msgs)

    cdef inline object _consumed(self, list msgs):
        self._done.extend(msgs)
        cdef double now = _monotonic()
        if now - self._last < RUN_COMMIT_INTERVAL_S:
            return None
        self._last = now
        out = self._done
        self._done = []
        return out

    def settle(self, bint ok, ctx, list msgs):
        """Judge request ``msgs`` after its listener call (RocketMQ's ``processConsumeResult``
        ackIndex rule, written once for both push consumers' loops): ``ok`` is the status was
        CONSUME_SUCCESS.  False when the request was not wholly consumed (not ok, or
        ``ctx.ack_index`` before its last message): the caller takes the per-request path.
        Otherwise as :meth:`consumed`: None, or the run's messages to commit now."""
        return self._settle(ok, ctx, msgs)

    cdef inline object _settle(self, bint ok, ctx, list msgs):
        if not ok or not ctx.ack_index >= len(msgs) - 1:
            return False
        return self._consumed(msgs)

    def rest(self):
        """The consumed messages not handed out yet (a worker leaving the run commits them)."""
        out, self._done = self._done, []
        return out


def consume_run(ConsumeRun run, consumer, listener, success, later, normalize):
    """A concurrent consume task's loop (``PushConsumer._consume_run``): take the requests of
    ``run`` one after the other until none is left or ``consumer._state`` is no longer
    "RUNNING", calling ``listener(msgs, ConsumeConcurrentlyContext)`` for each.

    ``success`` / ``later``: the CONSUME_SUCCESS / RECONSUME_LATER statuses; ``normalize``
    turns any other answer into one of them.  Wholly consumed requests join the run's
    messages to commit, handed to ``consumer._commit_consumed(msgs, pq, mq)`` at least every
    RUN_COMMIT_INTERVAL_S and when the loop ends; any other outcome goes to
    ``consumer._process_concurrent_result(status, ctx, msgs, pq, mq)`` at once.  A listener
    that raises is logged (``consumer._listener_failed(msgs, mq)``, in the except block, so
    the traceback is there) and counts as RECONSUME_LATER.  With ``consumer._trace`` set,
    ``_trace_before`` / ``_trace_after`` run around each call.  A dropped process queue ends
    the loop at once (the queue's new owner redelivers what is left;
    ``consumer._dropped_while_consuming(mq, n)`` logs a request it interrupted).

    One C loop instead of a Python frame's bytecode: with the defaults (one message per
    listener call) this is the path of every message a PushConsumer delivers."""
    cdef object pq = run.pq, mq = run.mq
    cdef object msgs, status, tr = None, now, rest
    cdef ConsumeConcurrentlyContext ctx
    cdef bint traced = consumer._trace is not None      # set from start() to shutdown()
    while consumer._state == "RUNNING":
        msgs = run._take()
        if msgs is None:
            break
        if pq.dropped:
            return
        ctx = ConsumeConcurrentlyContext.__new__(ConsumeConcurrentlyContext)
        ctx.message_queue = mq
        ctx.delay_level_when_next_consume = 0
        ctx.ack_index = ACK_INDEX_ALL
        if traced:
            tr = consumer._trace_before(msgs)
        try:
            status = listener(msgs, ctx)
        except Exception:
            consumer._listener_failed(msgs, mq)
            status = later
        else:
            if status is not success:
                status = normalize(status)
        if traced:
            consumer._trace_after(tr, msgs, status is success)
        if pq.dropped:
            consumer._dropped_while_consuming(mq, len(msgs))
            return
        now = run._settle(status is success, ctx, msgs)
        if now is False:
            consumer._process_concurrent_result(status, ctx, msgs, pq, mq)
        elif now is not None:
            consumer._commit_consumed(now, pq, mq)
    rest = run.rest()
    if rest:
        consumer._commit_consumed(rest, pq, mq)


def needs_post_processing(list msgs, long compressed_flag, retry_topic):
    """True when a pulled message has a compressed body (``sys_flag & compressed_flag``) or is a
    copy from ``retry_topic`` (None: none is): the cases ``post_process_messages`` changes.  One
    C loop over the attributes, so a pull result with neither is handed on untouched."""
    cdef object m
    for m in msgs:
        if <long>m.sys_flag & compressed_flag:
            return True
        if retry_topic is not None and m.topic == retry_topic:
            return True
    return False


def tree_put(tree, list msgs):
    """ProcessQueue.put_message's loop: each of ``msgs`` not in ``tree`` (queue offset ->
    message, a mapping kept in arrival order) is added.  Returns ``(added, body bytes added, the
    highest offset added or -1)``.  A MessageExt's fields are read as C fields (any other object
    with ``queue_offset`` and ``body`` goes through getattr)."""
    cdef Py_ssize_t added = 0, size = 0
    cdef long long hi = -1, off
    cdef object m, k, body
    cdef MessageExt x
    for m in msgs:
        if type(m) is MessageExt:
            x = <MessageExt>m
            off = x.queue_offset
            k = off
            body = x.body
        else:
            k = m.queue_offset
            off = k
            body = m.body
        if k in tree:
            continue
        tree[k] = m
        added += 1
        if body is not None:
            size += len(body)
        if off > hi:
            hi = off
    return added, size, hi


def tree_remove(tree, list msgs):
    """ProcessQueue.remove_message's loop: ``msgs`` out of ``tree`` (those still in it).
    Returns ``(removed, body bytes removed)``."""
    cdef Py_ssize_t removed = 0, size = 0
    cdef object m, old, body
    pop = tree.pop
    for m in msgs:
        old = pop((<MessageExt>m).queue_offset if type(m) is MessageExt else m.queue_offset, None)
        if old is not None:
            removed += 1
            body = (<MessageExt>old).body if type(old) is MessageExt else old.body
            if body is not None:
                size += len(body)
    return removed, size


# -- POP consumption (rmq.client.simple_consumer) ---------------------------------------------
@cython.no_gc          # holds a message, strs and a tuple of ints / strs: no cycle runs through it
@cython.final
cdef class MessageView:
    """A received message (RocketMQ 5's MessageView): the stored message plus its receipt handle.

    ``topic`` is the topic subscribed to (also for a redelivery stored in the group's POP retry
    topic); ``delivery_attempt`` is 1 for a first delivery (``reconsume_times + 1``).  ``_ck`` is
    the checkpoint the message was popped under, ``(startOffset, popTime, invisibleTime,
    reviveQid, retry)``: the views of one receive and one queue share the tuple.

    A C type the cyclic GC does not track (a receive builds one per message: stop 48,
    ``bench/results/client.md``).
    """
    cdef public object message              # rmq._core.commitlog.MessageExt
    cdef public str topic
    cdef public tuple _ck
    cdef public object _handle              # the receipt handle, built on first use (None: not yet)
    cdef public str broker_name
    cdef long long _taken                   # the last lane_take that took it (0: none)

    def __init__(self, message, str topic, tuple ck, str broker_name):
        self.message = message
        self.topic = topic
        self._ck = ck
        self._handle = None
        self.broker_name = broker_name

    @property
    def receipt_handle(self):
        """RocketMQ's extraInfo of the message: ``"startOffset popTime invisibleTime reviveQid retry
        brokerName queueId queueOffset"`` (ExtraInfoUtil); what ack / change_invisible_duration send."""
        if self._handle is None:
            so, pt, it, rq, retry = self._ck
            m = self.message
            self._handle = f"{so} {pt} {it} {rq} {retry} {self.broker_name} {m.queue_id} {m.queue_offset}"
        return self._handle

    @property
    def message_id(self):
        return self.message.msg_id

    @property
    def body(self):
        return self.message.body

    @property
    def properties(self):
        return self.message.properties

    @property
    def tag(self):
        return self.message.tags

    @property
    def keys(self):
        return self.message.keys

    @property
    def queue_id(self):
        return self.message.queue_id

    @property
    def queue_offset(self):
        return self.message.queue_offset

    @property
    def born_timestamp(self):
        return self.message.born_timestamp

    @property
    def store_timestamp(self):
        return self.message.store_timestamp

    @property
    def delivery_attempt(self):
        return self.message.reconsume_times + 1

    @property
    def invisible_until_ms(self):
        """When the broker redelivers the message unless it is acked (epoch ms)."""
        return self._ck[1] + self._ck[2]

    def __repr__(self):
        return (f"MessageView(topic={self.topic!r}, message_id={self.message_id!r}, "
                f"delivery_attempt={self.delivery_attempt}, receipt_handle={self.receipt_handle!r})")


cdef inline MessageView _view(object m, str topic, tuple ck, str broker_name):
    cdef MessageView v = MessageView.__new__(MessageView)
    v.message = m
    v.topic = topic
    v._ck = ck
    v._handle = None
    v.broker_name = broker_name
    return v


def pop_views(list msgs, list segments, str topic, object pop_time, object invisible_time, str broker_name,
              tags_set=None, matches=None):
    """The views of a POP answer: ``msgs`` (its records, decoded) cut by ``segments`` (``[(startOffset,
    reviveQid, retry, count)]``, one per queue popped, in record order), each segment's views
    sharing one checkpoint tuple.  With ``tags_set`` (a TAG subscription), a message whose
    ``matches(tags)`` is false goes to the second list (a tag hash collision: the caller acks
    it).  Returns ``(views, dropped)``."""
    cdef list views = [], dropped = []
    cdef Py_ssize_t i = 0, k, n
    cdef tuple ck
    for so, rq, retry, count in segments:
        n = count
        ck = (so, pop_time, invisible_time, rq, retry)
        if not tags_set:
            for k in range(i, i + n):
                views.append(_view(msgs[k], topic, ck, broker_name))
        else:
            for k in range(i, i + n):
                m = msgs[k]
                (views if matches(m.tags) else dropped).append(_view(m, topic, ck, broker_name))
        i += n
    return views, dropped


def ack_groups(views):
    """The BatchAcks of ``views`` (MessageViews, any order): ``{(topic, ck, queueId): [view, ...]}``
    in first-seen order, each list in the order given (what a BATCH_ACK_MESSAGE body is built
    from: :func:`rmq.client.simple_consumer.batch_ack_frame`)."""
    cdef dict by_ck = {}
    cdef object last = None
    cdef list vs = None
    cdef MessageView v
    for o in views:
        v = <MessageView?>o
        if v._ck is not last:            # a receive's views of one checkpoint share its tuple
            key = (v.topic, v._ck, v.message.queue_id)
            vs = by_ck.get(key)
            if vs is None:
                vs = by_ck[key] = []
            last = v._ck
        vs.append(v)
    return by_ck


def group_by_broker(views):
    """``{broker_name: [view, ...]}`` of ``views`` (MessageViews), names in first-seen order, each
    list in the order given; one C loop that looks a name up only when it changes (a receive's
    views share their broker's name).

    Raises
    ------
    TypeError
        An item is not a MessageView (nothing of an ack is sent then).
    """
    cdef dict out = {}
    cdef list last = None
    cdef object name, last_name = None
    for o in views:
        if type(o) is not MessageView:
            raise TypeError(f"expected a MessageView, got {type(o).__name__}")
        name = (<MessageView>o).broker_name
        if last is None or (name is not last_name and name != last_name):
            last = out.get(name)
            if last is None:
                last = out[name] = []
            last_name = name
        last.append(o)
    return out


cdef long long _take_seq = 0


cdef bint _mark_new(list vs, long long stamp, bint first) except -1:
    """Stamp the views of ``vs`` as taken by lane_take ``stamp``: True; False (and none
    stamped) when, ``first`` being false, one of them is taken already (another entry's view, or
    one twice in ``vs``).

    Raises
    ------
    TypeError
        An item is not a MessageView (none stamped).
    """
    cdef Py_ssize_t i, j, n = len(vs)
    cdef object o
    for i in range(n):
        o = vs[i]
        if type(o) is not MessageView:
            raise TypeError(f"an ack lane holds MessageViews, got {type(o).__name__}")
        if not first and (<MessageView>o)._taken == stamp:
            return False
    for i in range(n):
        o = vs[i]
        if not first and (<MessageView>o)._taken == stamp:      # twice in vs: undo this entry's stamps
            for j in range(i):
                (<MessageView>vs[j])._taken = 0
            return False
        (<MessageView>o)._taken = stamp
    return True


def lane_take(waiting, Py_ssize_t max_views, live):
    """:meth:`rmq.client.simple_consumer.AckLane.take`: the entries (``(views, waiter)``, ``views``
    a list of MessageViews, taken off the deque ``waiting`` in order) of the next request, up to
    ``max_views`` views (at least one entry), None when none waits; an entry whose waiter fails
    ``live(waiter)`` is dropped; an entry that repeats a view already taken (or one twice) waits
    for the next request.  A view is known as taken by a stamp of this call, so the check costs
    no set of ids.

    Raises
    ------
    TypeError
        An entry's views are not a list of MessageViews; the entries this call had taken are
        put back first, so the deque is as it was but for dropped dead waiters.
    """
    global _take_seq
    _take_seq += 1
    cdef long long stamp = _take_seq
    cdef list entries = []
    cdef Py_ssize_t n = 0, k
    cdef list vs
    while waiting:
        entry = waiting[0]
        if live is not None and not live(entry[1]):
            waiting.popleft()
            continue
        try:
            if type(entry[0]) is not list:
                raise TypeError(f"an ack lane entry holds a list of MessageViews, got {type(entry[0]).__name__}")
            vs = <list>entry[0]
            k = len(vs)
            if entries and n + k > max_views:
                break
            if not _mark_new(vs, stamp, not entries):
                break
        except TypeError:
            for e in reversed(entries):
                waiting.appendleft(e)
            raise
        waiting.popleft()
        entries.append(entry)
        n += k
    return entries or None


ACK_BITSET_MAX_BYTES = 1024     # rmq.actors.pop.MAX_ACK_BITSET_BYTES: the broker's limit on a BatchAck's "b"


def ack_bits(list vs, long long start_offset):
    """A BatchAck's ``b``: RocketMQ's BitSet of views ``vs``'s queue offset - ``start_offset``, as
    ``BitSet.toByteArray()`` gives it (bit i of byte i // 8 little-endian; no trailing zero byte).

    Raises
    ------
    ValueError
        A view before ``start_offset``, or one ACK_BITSET_MAX_BYTES * 8 or more past it.
    """
    cdef long long d, top = -1
    cdef Py_ssize_t i, n = len(vs)
    cdef bytearray out
    cdef unsigned char* p
    for i in range(n):
        d = _view_offset(vs[i]) - start_offset
        if d < 0 or d >= ACK_BITSET_MAX_BYTES * 8:
            raise ValueError(f"queue offset {start_offset + d} is outside the BatchAck of start offset "
                             f"{start_offset} (bits 0..{ACK_BITSET_MAX_BYTES * 8 - 1})")
        if d > top:
            top = d
    if top < 0:
        return b""
    out = bytearray(top // 8 + 1)
    p = out
    for i in range(n):
        d = _view_offset(vs[i]) - start_offset
        p[d >> 3] |= <unsigned char>(1 << (d & 7))
    return bytes(out)


cdef inline long long _view_offset(object o) except? -1:
    """A MessageView's queue offset: a MessageExt's C field, else the attribute."""
    cdef MessageView v = <MessageView?>o
    m = v.message
    if type(m) is MessageExt:
        return (<MessageExt>m).queue_offset
    return m.queue_offset
