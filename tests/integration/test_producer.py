"""rmq.Producer and rmq.aio.Producer against a real broker group (nameserver + broker + reput + flush)."""
import asyncio
import os
import signal
import threading
import zlib
from concurrent.futures import Future

import msgpack
import pytest

from rmq import Message, Producer, SendStatus
from rmq.client.message import MessageQueue
from rmq.client.producer import COMPRESSED_FLAG, COMPRESSION_ZLIB_TYPE
from rmq.client.remoting import RemotingClient
from rmq.errors import MQBrokerError, MQClientError, RemotingError
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull_all, wait_for

pytestmark = pytest.mark.integration

WAIT_S = 30.0          # bound of every wait on a future in this module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # tests here SIGSTOP the broker with requests on the wire; a stop that catches it between poll
    # and dispatch would age those past the default 200 ms waitTimeMillsInSendQueue and get them a
    # SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] (not retried, as RocketMQ): flow control is test_broker's
    c = Cluster(tmp_path_factory.mktemp("producer") / "store", conf={"waitTimeMillsInSendQueue": "600000"})
    yield c
    c.close()


def returns_within(fn, seconds):
    """Run ``fn()`` on a thread; its result, or its exception re-raised.  Fails the test if it has
    not returned after ``seconds`` (a generous deadline: what it tells apart is a wait of an hour
    or forever)."""
    out: list = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            out.append((False, e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"{fn} did not return within {seconds} s"
    ok, v = out[0]
    if not ok:
        raise v
    return v


def create_topic(rc, cluster, topic, queues):
    r = rc.invoke(cluster.broker_addr, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6}), 5000)
    assert r.code == ResponseCode.SUCCESS, r.remark


def wait_route(p, topic, queues):
    """Until the NameServer serves the topic's route with ``queues`` queues (the broker registers at once)."""
    def ok():
        try:
            return len(p.fetch_publish_message_queues(topic)) == queues
        except MQClientError:
            return False
    wait_for(ok, 60)


def pull_queue(rc, cluster, topic, queue_id, expect):
    """The records of one queue once ``expect`` of them are dispatched."""
    return wait_for(lambda: (lambda m: m if len(m) >= expect else None)(
        pull_all(rc, cluster.broker_addr, topic, queue_id)[0]), 15.0)


def pull_topic(rc, cluster, topic, queues, expect):
    def all_records():
        out = []
        for q in range(queues):
            out.extend(pull_all(rc, cluster.broker_addr, topic, q)[0])
        return out if len(out) >= expect else None
    return wait_for(all_records, 60)


def broker_put_total(rc, cluster):
    r = rc.invoke(cluster.broker_addr, Frame(RequestCode.GET_BROKER_RUNTIME_INFO), 5000)
    return msgpack.unpackb(bytes(r.bodies[0]), raw=False)["table"]["putMessageTotal"]


# -- sync send -----------------------------------------------------------------------------------
def test_send_round_trip_body_tags_keys_and_ids(cluster, rc):
    with Producer(cluster.namesrv_addr, group="pg") as p:
        msg = Message("Flights", b'{"flight": "UA 1"}', tags="UA", keys=["N14228", "KSFO"],
                      properties={"origin": "SFO"})
        r = p.send(msg)
        assert r.status is SendStatus.SEND_OK
        assert r.msg_id == msg.properties["UNIQ_KEY"] and len(r.msg_id) == 32
        assert len(r.offset_msg_id) == 32 and r.offset_msg_id != r.msg_id
        assert r.queue.topic == "Flights" and r.queue.broker_name == "broker-a"
        assert r.queue_id == r.message_queue.queue_id and r.queue_offset == 0
    [rec] = pull_queue(rc, cluster, "Flights", r.queue_id, 1)
    assert rec.body == b'{"flight": "UA 1"}'
    assert rec.tags == "UA" and rec.keys == ["N14228", "KSFO"]
    assert rec.properties["UNIQ_KEY"] == r.msg_id and rec.msg_id == r.msg_id
    assert rec.properties["origin"] == "SFO"
    assert rec.offset_msg_id == r.offset_msg_id
    assert rec.queue_offset == r.queue_offset and rec.sys_flag & COMPRESSED_FLAG == 0


def test_unknown_topic_is_auto_created_then_route_is_learned(cluster):
    with Producer(cluster.namesrv_addr, group="pg") as p:
        with pytest.raises(MQClientError) as ei:
            p.fetch_publish_message_queues("BrandNew")
        assert ei.value.response_code == ResponseCode.TOPIC_NOT_EXIST
        r = p.send(Message("BrandNew", b"first"))
        assert r.status is SendStatus.SEND_OK and r.queue_id >= 0
        wait_for(lambda: not p.route_cache.publish_info("BrandNew").provisional, 60)
        # auto-created with min(producer defaultTopicQueueNums 4, broker defaultTopicQueueNums 8), as RocketMQ
        assert len(p.fetch_publish_message_queues("BrandNew")) == 4


def test_round_robin_over_queues(cluster, rc):
    create_topic(rc, cluster, "RoundRobin", 4)
    with Producer(cluster.namesrv_addr, group="pg") as p:
        wait_route(p, "RoundRobin", 4)
        qids = [p.send(Message("RoundRobin", b"%d" % i)).queue_id for i in range(12)]
    first = qids[0]
    assert qids == [(first + i) % 4 for i in range(12)]
    assert [p2 for p2 in range(4)] == sorted(set(qids))


def test_sharding_key_keeps_order_per_key(cluster, rc):
    create_topic(rc, cluster, "Ordered", 4)
    keys = [f"order-{k}" for k in range(8)]
    with Producer(cluster.namesrv_addr, group="pg") as p:
        wait_route(p, "Ordered", 4)
        queue_of = {}
        futs = []
        for i in range(200):
            key = keys[i % len(keys)]
            body = f"{key}:{i}".encode()
            if i % 2:
                r = p.send(Message("Ordered", body), sharding_key=key)
                assert queue_of.setdefault(key, r.queue_id) == r.queue_id
            else:
                futs.append((key, p.send_async(Message("Ordered", body), sharding_key=key)))
        for key, f in futs:
            assert queue_of.setdefault(key, f.result(WAIT_S).queue_id) == f.result().queue_id
        # a selector gets the writable queues and the arg
        seen = []

        def last_queue(mqs, msg, arg):
            seen.append((len(mqs), arg))
            return mqs[-1]
        assert p.send(Message("Ordered", b"sel"), selector=last_queue, arg=7).queue_id == 3
        assert seen == [(4, 7)]
    assert len(set(queue_of.values())) > 1               # 8 keys do not all hash to one queue
    recs = pull_topic(rc, cluster, "Ordered", 4, 201)
    by_key = {}
    for rec in recs:
        if rec.body == b"sel":
            continue
        key, i = rec.body.decode().split(":")
        assert rec.queue_id == queue_of[key]
        assert rec.properties["__SHARDINGKEY"] == key
        by_key.setdefault((rec.queue_id, key), []).append((rec.queue_offset, int(i)))
    for (_, key), seq in by_key.items():
        seq.sort()
        assert [i for _, i in seq] == sorted(i for _, i in seq), f"order broken for {key}"
        assert len(seq) == 25



def test_send_async_sharding_keys_batch_per_key_and_keep_each_keys_order(cluster, rc):
    """send_async with a sharding key joins its key's caller-side batch: 4 threads, 40 keys
    each (str and int, 1 and "1" being two keys), every 5th message of a key sent one-way
    between its async ones (it seals the key's open batch: it may not be overtaken).  Every
    key's messages land in select_by_hash's queue, in the order they were sent."""
    from rmq.client.producer import java_hash
    create_topic(rc, cluster, "OrderedAsync", 4)
    per_key, threads = 12, 4
    with Producer(cluster.namesrv_addr, group="pg-oa", linger_ms=20) as p:
        wait_route(p, "OrderedAsync", 4)
        errors = []

        def sender(t):
            keys = [f"t{t}-{k}" for k in range(20)] + [1000 + t * 100 + k for k in range(20)]
            futs = []
            for i in range(per_key):
                for key in keys:
                    m = Message("OrderedAsync", f"{key!r}|{i}".encode())
                    if i % 5 == 4:
                        p.send_oneway(m, sharding_key=key)
                    else:
                        futs.append(p.send_async(m, sharding_key=key))
            for f in futs:
                if f.exception(WAIT_S) is not None:
                    errors.append(f.exception())

        workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(WAIT_S * 2)
        p.send(Message("OrderedAsync", b"'1'|0"), sharding_key="1")
        p.send(Message("OrderedAsync", b"1|0"), sharding_key=1)
        # a key no caller-side batch is keyed by (a float: _OPEN_KEYS) takes the per-message path
        assert p.send_async(Message("OrderedAsync", b"2.5|0"), sharding_key=2.5).result(WAIT_S).queue_id == \
            abs(java_hash(2.5)) % 4
    assert not errors
    total = threads * 40 * per_key + 3
    by_key: dict = {}
    for rec in pull_topic(rc, cluster, "OrderedAsync", 4, total):
        key, i = rec.body.decode().rsplit("|", 1)
        by_key.setdefault(key, []).append((rec.queue_offset, rec.queue_id, int(i), rec.properties["__SHARDINGKEY"]))
    assert sum(len(v) for v in by_key.values()) == total
    for key, recs in by_key.items():
        k = eval(key)                                           # the repr written above: str or int
        assert {q for _, q, _, _ in recs} == {abs(java_hash(k)) % 4}, key
        assert {sk for _, _, _, sk in recs} == {str(k)}
        assert [i for _, _, i, _ in sorted(recs)] == sorted(i for _, _, i, _ in recs), f"order broken for {key}"
    assert len(by_key["'1'"]) == len(by_key["1"]) == 1


@pytest.mark.parametrize("client", ["thread", "aio"])
@pytest.mark.parametrize("how", ["sharding_key", "queue"])
def test_ordered_send_async_has_one_request_out_per_queue(cluster, rc, how, client):
    """Ordered sends keep one request out per queue (Kafka's max.in.flight=1 for ordered
    partitions), thread and asyncio producers: 3,000 ordered 100 B sends with 1 KiB batches and
    the default max_in_flight (32) go as batches that waited for their queue's previous request
    (held_for_order > 0); every one is stored in send order, at contiguous queue offsets, and a
    sync send to the same queue made before they are answered goes after them."""
    from rmq.client.producer import java_hash
    topic = f"OrderedTurn-{how}-{client}"
    create_topic(rc, cluster, topic, 2)
    n = 3000
    body = [b"%06d" % i + b"x" * 94 for i in range(n)]
    if client == "thread":
        with Producer(cluster.namesrv_addr, group="pg-ot", batch_size=1024) as p:
            wait_route(p, topic, 2)
            mq = next(q for q in p.fetch_publish_message_queues(topic) if q.queue_id == abs(java_hash("k")) % 2)
            kw = {"sharding_key": "k"} if how == "sharding_key" else {"queue": mq}
            futs = [p.send_async(Message(topic, b), **kw) for b in body]
            last = p.send(Message(topic, b"last"), **kw)
            results = [f.result(WAIT_S) for f in futs]
            held = p.stats["held_for_order"]
    else:
        from rmq.aio import Producer as AioProducer

        async def main():
            async with AioProducer(cluster.namesrv_addr, group="pg-ot", batch_size=1024) as p:
                mq = next(q for q in await p.fetch_publish_message_queues(topic)
                          if q.queue_id == abs(java_hash("k")) % 2)
                kw = {"sharding_key": "k"} if how == "sharding_key" else {"queue": mq}
                futs = [await p.send_async(Message(topic, b), **kw) for b in body]
                last = await p.send(Message(topic, b"last"), **kw)
                return mq, [await f for f in futs], last, p._queue_turns.held
        mq, results, last, held = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert held > 0
    assert {r.queue_id for r in results} == {mq.queue_id}
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(offsets[0], offsets[0] + n))
    assert last.queue_offset == offsets[-1] + 1
    recs = sorted((r for r in pull_topic(rc, cluster, topic, 2, n + 1) if r.queue_id == mq.queue_id),
                  key=lambda r: r.queue_offset)
    assert [r.body[:6] for r in recs] == [b[:6] for b in body] + [b"last"]


def test_ordered_send_to_unknown_topic_is_refused(cluster):
    with Producer(cluster.namesrv_addr, group="pg") as p:
        with pytest.raises(MQClientError, match="ordered sends need the topic"):
            p.send(Message("NoSuchOrderedTopic", b"x"), sharding_key="k")


def test_send_oneway_and_explicit_queue(cluster, rc):
    create_topic(rc, cluster, "OneWay", 2)
    with Producer(cluster.namesrv_addr, group="pg") as p:
        wait_route(p, "OneWay", 2)
        q1 = MessageQueue("OneWay", "broker-a", 1)
        for i in range(5):
            assert p.send_oneway(Message("OneWay", b"o%d" % i), queue=q1) is None
        assert p.send(Message("OneWay", b"direct"), queue=q1).queue_id == 1
    recs = pull_queue(rc, cluster, "OneWay", 1, 6)
    # one-way sends keep their order among themselves; the sync send may overtake them (no ack to wait for)
    assert [r.body for r in recs if r.body != b"direct"] == [b"o0", b"o1", b"o2", b"o3", b"o4"]
    assert sorted(r.body for r in recs).count(b"direct") == 1


def test_send_batch_one_queue(cluster, rc):
    with Producer(cluster.namesrv_addr, group="pg") as p:
        msgs = [Message("Batch1", b"m%d" % i, keys=[f"k{i}"]) for i in range(10)]
        r = p.send_batch(msgs)
        assert r.status is SendStatus.SEND_OK
        ids = r.msg_id.split(",")
        assert ids == [m.properties["UNIQ_KEY"] for m in msgs]
        assert len(r.offset_msg_id.split(",")) == 10
        with pytest.raises(MQClientError, match="same"):
            p.send_batch([Message("Batch1", b"a"), Message("Other", b"b")])
        with pytest.raises(MQClientError, match="TimeDelayLevel"):
            p.send_batch([Message("Batch1", b"a", delay_time_level=2)])
    recs = pull_queue(rc, cluster, "Batch1", r.queue_id, 10)
    assert [x.body for x in recs] == [b"m%d" % i for i in range(10)]
    assert [x.queue_offset for x in recs] == [r.queue_offset + i for i in range(10)]
    assert [x.msg_id for x in recs] == ids and [x.keys for x in recs] == [[f"k{i}"] for i in range(10)]


def test_send_batch_of_thousands_of_messages_gets_every_offset_msg_id_once_stored(cluster, rc):
    """A send_batch of 3,000 small messages: its answer's offset msg ids (99 KB comma-joined) pass
    the 64 KiB header limit, so the broker puts them in the answer's body
    (SEND_RESPONSE_MSG_ID_INLINE_MAX); each id names its own message, each stored once (a lost answer
    was a SYSTEM_ERROR, retried: the batch stored twice)."""
    from rmq._core.commitlog import decode_message_id
    from rmq.common.request_header import SEND_RESPONSE_MSG_ID_INLINE_MAX
    n = 3000
    assert n * 33 > SEND_RESPONSE_MSG_ID_INLINE_MAX
    with Producer(cluster.namesrv_addr, group="pg") as p:
        warm = p.send(Message("BatchBig", b"warm-up"))
        msgs = [Message("BatchBig", b"b%d" % i) for i in range(n)]
        r = p.send_batch(msgs, queue=warm.message_queue)
        assert p.stats["retries"] == 0
    offset_ids = r.offset_msg_id.split(",")
    assert len(offset_ids) == n and r.msg_id.split(",") == [m.properties["UNIQ_KEY"] for m in msgs]
    phys = [decode_message_id(i)[1] for i in offset_ids]
    assert phys == sorted(phys) and len(set(phys)) == n
    recs = pull_queue(rc, cluster, "BatchBig", warm.queue_id, n + 1)
    assert len(recs) == n + 1 and [x.body for x in recs[1:]] == [b"b%d" % i for i in range(n)]
    assert [x.commitlog_offset for x in recs[1:]] == phys


# -- async, pipelining, batching ----------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [None, 0], ids=["default-batching", "one-request-each"])
def test_send_async_completes_every_future(cluster, rc, batch_size):
    n = 5000
    topic = "Async5k" if batch_size is None else "Async5kSingle"
    done = []
    opts = {} if batch_size is None else {"batch_size": batch_size}
    broker = cluster.pids()["broker"]
    with Producer(cluster.namesrv_addr, group="pg", send_msg_timeout_ms=int(WAIT_S * 1000), **opts) as p:
        warm = p.send(Message(topic, b"warm-up"))
        before = p.stats
        # the broker is stopped while the loop enqueues: max_in_flight requests go out unanswered and
        # every later message waits in the accumulator, whatever the speed of this loop or the machine
        os.kill(broker, signal.SIGSTOP)
        try:
            futs = [p.send_async(Message(topic, b"a%d" % i), callback=done.append) for i in range(n)]
        finally:
            os.kill(broker, signal.SIGCONT)
        results = [f.result(WAIT_S) for f in futs]
        assert p.flush(WAIT_S) == 0
        st = p.stats
        queues = {mq.queue_id for mq in p.fetch_publish_message_queues(topic)}
    assert queues == {0, 1, 2, 3}, queues       # auto-created: min(producer 4, broker 8) queues
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({(r.queue_id, r.queue_offset) for r in results}) == n        # unique offset per queue
    assert len({r.msg_id for r in results}) == n
    assert len(done) == n and all(isinstance(f, Future) for f in done)
    assert st["failed_messages"] == 0
    requests = st["requests"] - before["requests"]
    if batch_size is None:
        # linger 0: messages queued while max_in_flight requests are out leave together (Kafka's
        # batch.size default): at most max_in_flight single requests before the broker stopped, the
        # rest in 16 KiB batches
        assert st["batch_requests"] > 0 and requests < n // 10, st
    else:
        # one request per message, plus one per retry (a send shed with SYSTEM_BUSY, see below)
        assert st["batch_requests"] == 0 and requests == n + st["retries"] - before["retries"], st
    # each queue's offsets are dense (the warm-up took one).  Not every queue need get a request:
    # those the broker read just before its SIGSTOP had waited longer than waitTimeMillsInSendQueue
    # when it ran again, were answered SYSTEM_BUSY and retried on the next queue
    by_queue = {}
    for r in results:
        by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert set(by_queue) <= queues and len(by_queue) >= 2, by_queue
    for q, offsets in by_queue.items():
        first = 1 if q == warm.message_queue.queue_id else 0
        assert sorted(offsets) == list(range(first, first + len(offsets))), (q, sorted(offsets)[:10])
    recs = pull_topic(rc, cluster, topic, 4, n + 1)
    assert len(recs) == n + 1


def test_batching_with_linger_uses_batches_and_gives_each_message_its_result(cluster, rc):
    n = 3000
    before = broker_put_total(rc, cluster)
    # a linger far longer than the test: every batch but the last of each queue leaves because it
    # is full (16 KiB), the rest on flush(), whatever the speed of the loop
    with Producer(cluster.namesrv_addr, group="pg", linger_ms=3_600_000, batch_size=16 * 1024) as p:
        p.send(Message("Lingered", b"warm-up"))
        futs = [p.send_async(Message("Lingered", b"L%05d" % i, tags="t")) for i in range(n)]
        assert p.flush(WAIT_S) == 0
        results = [f.result(WAIT_S) for f in futs]
        st = p.stats
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({(r.queue_id, r.queue_offset) for r in results}) == n
    send_requests = st["requests"] - 1
    assert st["batch_requests"] >= 1 and send_requests <= n // 20, st
    assert broker_put_total(rc, cluster) - before == n + 1
    recs = pull_topic(rc, cluster, "Lingered", 8, n + 1)
    at = {(x.queue_id, x.queue_offset): x for x in recs}
    for i, r in enumerate(results):
        rec = at[(r.queue_id, r.queue_offset)]
        assert rec.body == b"L%05d" % i and rec.msg_id == r.msg_id
        assert rec.offset_msg_id == r.offset_msg_id and rec.tags == "t"


def test_close_delivers_queued_batches(cluster, rc):
    # a linger of an hour: only close() can ship these batches within the test's deadline
    p = Producer(cluster.namesrv_addr, group="pg", linger_ms=3_600_000, batch_size=1024 * 1024)
    p.send(Message("Closing", b"warm-up"))                # learn the route, so nothing waits for it
    futs = [p.send_async(Message("Closing", b"c%d" % i)) for i in range(700)]
    assert not any(f.done() for f in futs)                # waiting for the (long) linger
    returns_within(p.close, WAIT_S)
    assert p.closed and all(f.done() and f.result().status is SendStatus.SEND_OK for f in futs)
    with pytest.raises(MQClientError, match="closed"):
        p.send(Message("Closing", b"late"))
    with pytest.raises(MQClientError, match="closed"):   # send_async's C path refuses it too
        p.send_async(Message("Closing", b"late"))
    p.close()                                             # idempotent
    assert len(pull_topic(rc, cluster, "Closing", 8, 701)) == 701


def test_flush_ships_lingering_batch(cluster):
    with Producer(cluster.namesrv_addr, group="pg", linger_ms=60_000) as p:
        p.send(Message("Flushed", b"warm-up"))
        futs = [p.send_async(Message("Flushed", b"f%d" % i)) for i in range(50)]
        assert p.flush(WAIT_S) == 0
        assert p.pending == 0
        assert all(f.done() and f.exception() is None and f.result().status is SendStatus.SEND_OK for f in futs)


# -- compression and limits -----------------------------------------------------------------------------
def test_compression_round_trip(cluster, rc):
    body = (b'{"seat": "12A", "fare": 123.45, "class": "economy"}' * 220)[:10 * 1024]
    assert len(body) == 10 * 1024
    with Producer(cluster.namesrv_addr, group="pg") as p:
        big = p.send(Message("Zipped", body))
        small = p.send(Message("Zipped", b"s" * 4095), queue=big.queue)
    recs = pull_queue(rc, cluster, "Zipped", big.queue_id, 2)
    rec = next(x for x in recs if x.msg_id == big.msg_id)
    assert rec.sys_flag & COMPRESSED_FLAG and rec.sys_flag & 0x700 == COMPRESSION_ZLIB_TYPE
    assert len(rec.body) < len(body) and zlib.decompress(rec.body) == body
    small_rec = next(x for x in recs if x.msg_id == small.msg_id)
    assert small_rec.sys_flag & COMPRESSED_FLAG == 0 and small_rec.body == b"s" * 4095


def test_oversize_body_refused_before_sending(cluster):
    with Producer(cluster.namesrv_addr, group="pg") as p:
        before = p.stats["requests"]
        with pytest.raises(MQClientError) as ei:
            p.send(Message("TooBig", b"x" * (4 * 1024 * 1024 + 1)))
        assert ei.value.response_code == ResponseCode.MESSAGE_ILLEGAL and "4194304" in str(ei.value)
        with pytest.raises(MQClientError):
            p.send_async(Message("TooBig", b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(MQClientError, match="batch size"):
            p.send_batch([Message("TooBig", b"x" * (1024 * 1024)) for _ in range(5)])
        with pytest.raises(MQClientError, match="length is zero"):
            p.send(Message("TooBig", b""))
        with pytest.raises(MQClientError, match="characters"):
            p.send(Message("bad/topic", b"x"))
        assert p.stats["requests"] == before and p.pending == 0


def test_bad_arguments():
    with pytest.raises(MQClientError):
        Producer("", group="pg")
    with pytest.raises(MQClientError):
        Producer("127.0.0.1:1", group="bad group")
    with pytest.raises(MQClientError, match="unknown producer option"):
        Producer("127.0.0.1:1", group="pg", lingerr_ms=5)


# -- failures -------------------------------------------------------------------------------------------
def test_broker_killed_send_fails_clearly_after_retries(tmp_path):
    c = Cluster(tmp_path / "store")
    try:
        with Producer(c.namesrv_addr, group="pg", send_msg_timeout_ms=3000) as p:
            assert p.send(Message("Doomed", b"ok")).status is SendStatus.SEND_OK
            c.kill_group()
            with pytest.raises(RemotingError) as ei:
                p.send(Message("Doomed", b"lost"))
            text = str(ei.value)
            assert "broker-a" in text and ("Send [" in text or "cannot connect" in text), text
            fut = p.send_async(Message("Doomed", b"lost too"))
            with pytest.raises(RemotingError):
                fut.result(WAIT_S)
    finally:
        c.close()


def test_close_reports_queued_messages_that_failed(tmp_path):
    c = Cluster(tmp_path / "store")
    try:
        p = Producer(c.namesrv_addr, group="pg", linger_ms=3_600_000, connect_timeout_ms=300)
        p.send(Message("Lost", b"ok"))
        c.kill_group()
        futs = [p.send_async(Message("Lost", b"x%d" % i)) for i in range(20)]
        with pytest.raises(MQClientError, match=r"20 message\(s\) queued before close"):
            returns_within(p.close, WAIT_S)         # ships (and fails) them: not the hour's linger
        assert all(f.done() and isinstance(f.exception(), MQClientError) for f in futs)
    finally:
        c.close()


def test_auto_create_disabled_gives_broker_error(tmp_path):
    c = Cluster(tmp_path / "store", conf={"autoCreateTopicEnable": "false"})
    try:
        with Producer(c.namesrv_addr, group="pg") as p:
            with pytest.raises(MQBrokerError) as ei:
                p.send(Message("NotThere", b"x"))
            assert ei.value.response_code == ResponseCode.TOPIC_NOT_EXIST
            assert "Send [3] times" in str(ei.value) and p.stats["retries"] == 2
    finally:
        c.close()


def test_nameserver_unreachable_fails_within_budget():
    with Producer("127.0.0.1:1", group="pg", send_msg_timeout_ms=500) as p:
        with pytest.raises(MQClientError, match="No route info"):
            returns_within(lambda: p.send(Message("T", b"x")), WAIT_S)


def test_a_nameserver_that_does_not_answer_is_failed_over_within_the_send_budget(cluster):
    """The I/O thread's NameServer look-ups (rmq.client.publish_routes' calls driven on its events):
    the first NameServer of the list never answers (ZeroMQ queues the request and says nothing),
    so it is waited for its share of ``send_msg_timeout_ms`` only, the next one answers, and the
    first send still succeeds within its budget; the NameServer that answered is asked first from
    then on."""
    with RemotingClient() as rc:
        create_topic(rc, cluster, "NsFailover", 4)
    dead = "127.0.0.1:1"
    with Producer(f"{dead};{cluster.namesrv_addr}", group="pg", send_msg_timeout_ms=4000) as p:
        r = returns_within(lambda: p.send(Message("NsFailover", b"x")), WAIT_S)
        assert r.status == SendStatus.SEND_OK
        assert p.stats["route_requests"] == 2           # the dead one (2 s of the 4), then the live one
        asked = p.stats["route_requests"]
        assert len(returns_within(lambda: p.fetch_publish_message_queues("NsFailover"), WAIT_S)) == 4
        assert p.stats["route_requests"] == asked + 1   # the live one first now: one request


def test_callbacks_run_and_sync_calls_from_callbacks_are_refused(cluster):
    errors = []
    got = threading.Event()
    with Producer(cluster.namesrv_addr, group="pg") as p:
        def cb(f):
            try:
                p.send(Message("Cb", b"inner"))
            except MQClientError as e:
                errors.append(e)
            got.set()
        p.send_async(Message("Cb", b"outer"), callback=cb).result(WAIT_S)
        assert got.wait(WAIT_S)
    assert errors and "deadlock" in str(errors[0])


# -- asyncio --------------------------------------------------------------------------------------------
def test_aio_producer_round_trip(cluster, rc):
    from rmq.aio import Producer as AioProducer

    async def main():
        async with AioProducer(cluster.namesrv_addr, group="pg") as p:
            r = await p.send(Message("AioTopic", b"hello", tags="a", keys=["k1"]))
            many = await asyncio.gather(*(p.send(Message("AioTopic", b"m%d" % i)) for i in range(200)))
            b = await p.send_batch([Message("AioTopic", b"b%d" % i) for i in range(5)])
            big = await p.send(Message("AioTopic", b"z" * 8192))
            with pytest.raises(MQClientError):
                await p.send(Message("AioTopic", b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(MQClientError, match="closed"):
            await p.send(Message("AioTopic", b"late"))
        return r, many, b, big

    r, many, b, big = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert r.status is SendStatus.SEND_OK and all(m.status is SendStatus.SEND_OK for m in many)
    assert len({(m.queue_id, m.queue_offset) for m in many}) == 200
    recs = pull_topic(rc, cluster, "AioTopic", 8, 207)
    by_id = {x.msg_id: x for x in recs}
    first = by_id[r.msg_id]
    assert first.body == b"hello" and first.tags == "a" and first.keys == ["k1"]
    assert [by_id[i].body for i in b.msg_id.split(",")] == [b"b%d" % i for i in range(5)]
    z = by_id[big.msg_id]
    assert z.sys_flag & COMPRESSED_FLAG and zlib.decompress(z.body) == b"z" * 8192


def test_aio_broker_killed_fails_clearly(tmp_path):
    from rmq.aio import Producer as AioProducer
    c = Cluster(tmp_path / "store")
    try:
        async def main():
            async with AioProducer(c.namesrv_addr, group="pg", connect_timeout_ms=300) as p:
                await p.send(Message("AioDoomed", b"ok"))
                c.kill_group()
                with pytest.raises(RemotingError, match="broker-a"):
                    await p.send(Message("AioDoomed", b"lost"))
        asyncio.run(asyncio.wait_for(main(), WAIT_S))
    finally:
        c.close()


# -- synchronous sends on the caller's thread (rmq.client.direct) ----------------------------------------
def test_sync_sends_run_on_the_callers_thread_once_the_route_is_known(cluster, rc):
    create_topic(rc, cluster, "DirectT", 4)
    with Producer(cluster.namesrv_addr, group="pg") as p:
        wait_route(p, "DirectT", 4)
        before = dict(p._direct.stats)
        results = [p.send(Message("DirectT", b"direct-%d" % i, tags="D", keys=["k%d" % i])) for i in range(40)]
        assert p._direct.stats["messages"] - before["messages"] == 40      # none went through the I/O thread
        assert p._direct.stats["requests"] - before["requests"] == 40
        assert p.stats["messages"] >= 40
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert {r.message_queue.queue_id for r in results} == {0, 1, 2, 3}       # round robin
    recs = pull_topic(rc, cluster, "DirectT", 4, 40)
    assert sorted(m.body for m in recs) == sorted(b"direct-%d" % i for i in range(40))
    by_id = {m.msg_id: m for m in recs}
    assert all(by_id[r.msg_id].queue_offset == r.queue_offset and by_id[r.msg_id].tags == "D" for r in results)


def test_send_batch_runs_on_the_callers_thread_once_the_route_is_known(cluster, rc):
    """The first send_batch of a topic goes through the I/O thread (its route is looked up); the
    next ones are one request on the caller's socket, with the same result: ids comma-joined in
    the batch's order, the first queue offset, one offset msg id per message."""
    create_topic(rc, cluster, "DirectB", 2)
    sent, results = [], []
    with Producer(cluster.namesrv_addr, group="pg") as p:
        for k, n in enumerate((5, 5, 1, 300)):
            msgs = [Message("DirectB", b"b%d-%d" % (k, i), keys=[f"k{k}-{i}"]) for i in range(n)]
            before = dict(p._direct.stats)
            results.append(p.send_batch(msgs))
            went_direct = p._direct.stats["requests"] - before["requests"]
            assert went_direct == (0 if k == 0 else 1), k
            if went_direct:
                assert p._direct.stats["messages"] - before["messages"] == n
                assert p._direct.stats["batch_requests"] - before["batch_requests"] == 1
            sent.append(msgs)
        assert p.stats["retries"] == 0
    recs = pull_topic(rc, cluster, "DirectB", 2, sum(map(len, sent)))
    assert len(recs) == sum(map(len, sent))                 # each batch stored once
    at = {(x.queue_id, x.queue_offset): x for x in recs}
    for msgs, r in zip(sent, results):
        assert r.status is SendStatus.SEND_OK
        assert r.msg_id.split(",") == [m.properties["UNIQ_KEY"] for m in msgs]
        got = [at[r.queue_id, r.queue_offset + i] for i in range(len(msgs))]
        assert [x.body for x in got] == [m.body for m in msgs]
        assert [x.msg_id for x in got] == r.msg_id.split(",")
        assert r.offset_msg_id.split(",") == [x.offset_msg_id for x in got]


def test_sync_sends_from_many_threads_each_get_their_own_answer(cluster, rc):
    create_topic(rc, cluster, "DirectMT", 4)
    results, errors = [], []
    with Producer(cluster.namesrv_addr, group="pg") as p:
        wait_route(p, "DirectMT", 4)

        def worker(t):
            try:
                for i in range(100):
                    r = p.send(Message("DirectMT", b"t%d-%d" % (t, i)))
                    results.append((r.message_queue.queue_id, r.queue_offset, r.msg_id))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert p._direct.stats["messages"] == 800
    assert not errors, errors[:3]
    assert len(results) == 800
    assert len({(q, o) for q, o, _ in results}) == 800          # every answer is its own message's
    recs = pull_topic(rc, cluster, "DirectMT", 4, 800)
    assert {m.msg_id: (m.queue_id, m.queue_offset) for m in recs} == {i: (q, o) for q, o, i in results}


def test_close_waits_for_sync_sends_of_other_threads_then_refuses(cluster, rc):
    create_topic(rc, cluster, "DirectClose", 2)
    p = Producer(cluster.namesrv_addr, group="pg")
    wait_route(p, "DirectClose", 2)
    sent, ended = [], []

    def worker():
        try:
            while True:
                sent.append(p.send(Message("DirectClose", b"x")).status)
        except MQClientError as e:
            ended.append(e)

    t = threading.Thread(target=worker)
    t.start()
    wait_for(lambda: len(sent) > 50, 60)
    p.close()
    t.join(WAIT_S)
    assert not t.is_alive()
    assert set(sent) == {SendStatus.SEND_OK}
    assert len(ended) == 1 and "closed" in str(ended[0])
    with pytest.raises(MQClientError, match="closed"):
        p.send(Message("DirectClose", b"after"))


def test_direct_send_to_a_killed_broker_fails_clearly_after_retries(tmp_path):
    c = Cluster(tmp_path / "store")
    try:
        with RemotingClient() as rc:
            create_topic(rc, c, "DoomedDirect", 2)
        with Producer(c.namesrv_addr, group="pg", send_msg_timeout_ms=3000, connect_timeout_ms=500) as p:
            wait_route(p, "DoomedDirect", 2)
            assert p.send(Message("DoomedDirect", b"ok")).status is SendStatus.SEND_OK
            assert p._direct.stats["messages"] == 1
            c.kill_group()
            with pytest.raises(RemotingError) as ei:
                p.send(Message("DoomedDirect", b"lost"))
            text = str(ei.value)
            assert "broker-a" in text and "Send [" in text, text
            assert p._direct.stats["failed_messages"] == 1 and p._direct.stats["retries"] >= 1
            # a user batch on the same path (encoded once: every attempt sends the same body)
            retries = p._direct.stats["retries"]
            batch = [Message("DoomedDirect", b"lost-%d" % i) for i in range(3)]
            with pytest.raises(RemotingError, match=r"Send \["):
                p.send_batch(batch)
            assert p._direct.stats["failed_messages"] == 4 and p._direct.stats["retries"] > retries
            assert len({m.properties["UNIQ_KEY"] for m in batch}) == 3      # ids given once, kept
    finally:
        c.close()


def test_default_batch_size_is_64_kib_within_max_message_size():
    from rmq.client.producer import DEFAULT_BATCH_SIZE, ProducerOptions
    assert ProducerOptions().batch_size == DEFAULT_BATCH_SIZE == 64 * 1024 and ProducerOptions().batching
    assert ProducerOptions(max_message_size=4096).batch_size == 4096      # never above a message's limit
    assert not ProducerOptions(batch_size=0).batching                       # RocketMQ's one request each
    assert ProducerOptions(batch_size=0, linger_ms=5).batch_size == DEFAULT_BATCH_SIZE
    with pytest.raises(MQClientError, match="batch_size"):
        ProducerOptions(batch_size=-1)


def _stopped_broker_send(c, topic, **send_kw):
    """A producer whose route to ``topic`` is known, and a thread blocked in send() on its own
    (connected) link because the broker process is SIGSTOPped after the thread's first send: the
    request is on the wire, unanswered.  Returns (producer, thread, outcome)."""
    import os
    import signal
    with RemotingClient() as rc:
        create_topic(rc, c, topic, 1)
    p = Producer(c.namesrv_addr, group="pg", connect_timeout_ms=500)
    wait_route(p, topic, 1)
    outcome: list = []
    linked, go = threading.Event(), threading.Event()

    def worker():
        try:
            outcome.append(p.send(Message(topic, b"ok"), **send_kw).status)    # this thread's link is up
            linked.set()
            go.wait(WAIT_S)
            outcome.append(p.send(Message(topic, b"stuck"), **send_kw))
        except Exception as e:  # noqa: BLE001 - checked by the test
            outcome.append(e)
            linked.set()

    t = threading.Thread(target=worker)
    t.start()
    assert linked.wait(WAIT_S) and outcome == [SendStatus.SEND_OK]
    port = int(c.broker_addr.rsplit(":", 1)[1])
    os.kill(c.pids()["broker"], signal.SIGSTOP)
    wait_for(lambda: _proc_state(c.pids()["broker"]) == "T", WAIT_S)
    # the baseline once the broker reads nothing more: taken before the stop, a heartbeat the busy
    # broker had not read yet (then read before the stop) could hide the request's bytes
    queued = _unread_bytes_at(port)
    go.set()
    wait_for(lambda: p._direct._active == 1, WAIT_S)
    wait_for(lambda: _unread_bytes_at(port) > queued, WAIT_S)     # the request is in the stopped broker's socket
    return p, t, outcome


def _proc_state(pid: int) -> str:
    """/proc/PID/stat's state letter (T: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _unread_bytes_at(port: int) -> int:
    """Bytes received by the kernel but not yet read, over the established TCP connections whose
    local end is 127.0.0.1:``port`` (/proc/net/tcp's rx_queue)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                total += int(queues.split(":")[1], 16)
    return total


def test_direct_send_fails_at_once_when_the_connection_closes_with_the_request_in_flight(tmp_path):
    import os
    import signal
    c = Cluster(tmp_path / "store")
    try:
        mq = MessageQueue("InFlight", "broker-a", 0)
        # fixed queue: no retry; a budget of 10 minutes, far beyond the test's deadline
        p, t, outcome = _stopped_broker_send(c, "InFlight", queue=mq, timeout_ms=600_000)
        os.kill(c.pids()["broker"], signal.SIGKILL)    # the kernel closes its sockets: a disconnect event
        t.join(WAIT_S)
        assert not t.is_alive()                        # failed on the disconnect, not after the budget
        assert isinstance(outcome[1], RemotingError) and "closed with the request in flight" in str(outcome[1])
        assert p._direct.stats["failed_messages"] == 1
        p.close()
    finally:
        c.close()


def test_close_waits_a_bounded_time_for_a_blocked_sync_send(tmp_path, monkeypatch, caplog):
    import os
    import signal
    from rmq.client import direct
    monkeypatch.setattr(direct, "CLOSE_WAIT_S", 0.5)
    # the request waits in the stopped broker's socket for longer than the default 200 ms
    # waitTimeMillsInSendQueue: the broker would answer SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE] (as RocketMQ
    # does) whenever the stop caught it between poll and dispatch; this test is about the answer
    # reaching a closed producer's blocked send, so flow control is pushed out of the way
    c = Cluster(tmp_path / "store", conf={"waitTimeMillsInSendQueue": "600000"})
    try:
        p, t, outcome = _stopped_broker_send(c, "Blocked", timeout_ms=600_000)
        try:
            returns_within(p.close, WAIT_S)             # does not hang on the blocked send
        finally:
            os.kill(c.pids()["broker"], signal.SIGCONT)
        assert "synchronous send(s) still in progress at close" in caplog.text
        # the broker (continued above) answers: the send completes on its socket
        t.join(WAIT_S)
        assert not t.is_alive() and outcome[1].status is SendStatus.SEND_OK
        assert p._direct.ctx.closed                     # the last blocked send closed the links and context
        with pytest.raises(MQClientError, match="closed"):
            p.send(Message("Blocked", b"after"))
    finally:
        c.close()


# -- send_async's caller-side batches (Producer._append_async) ---------------------------------------
def test_send_async_from_threads_and_topics_each_future_gets_its_own_message(cluster, rc):
    """Callers of several threads append to the same topics' open batches at once: every
    future completes with the result of its own message (its UNIQ_KEY, its queue offset)."""
    topics = ["CallerA", "CallerB"]
    per_thread = 1500
    with Producer(cluster.namesrv_addr, group="pg") as p:
        for t in topics:
            p.send(Message(t, b"warm-up"))
        sent: list = []
        lock = threading.Lock()

        def work(k):
            mine = []
            for i in range(per_thread):
                m = Message(topics[i % 2], b"t%d-%d" % (k, i))
                mine.append((m, p.send_async(m)))
            with lock:
                sent.extend(mine)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert p.flush(WAIT_S) == 0
        results = [(m, f.result(WAIT_S)) for m, f in sent]
    assert len(results) == 4 * per_thread
    for m, r in results:
        assert r.status is SendStatus.SEND_OK and r.msg_id == m.properties["UNIQ_KEY"]
        assert r.message_queue.topic == m.topic
    assert len({(r.message_queue.topic, r.queue_id, r.queue_offset) for _, r in results}) == len(results)
    recs = {(x.topic, x.queue_id, x.queue_offset): x for t in topics for x in pull_topic(rc, cluster, t, 4,
                                                                                          2 * per_thread + 1)}
    for m, r in results:
        assert recs[(m.topic, r.queue_id, r.queue_offset)].body == m.body


def test_send_async_blocks_at_max_pending_messages_then_fails_clearly(cluster):
    """MAX_PENDING_MESSAGES back-pressure: with the broker stopped, send_async accepts
    max_pending_messages, then blocks send_msg_timeout_ms and raises; nothing is lost."""
    broker = cluster.pids()["broker"]
    with Producer(cluster.namesrv_addr, group="pg", max_pending_messages=50, send_msg_timeout_ms=400) as p:
        p.send(Message("Pending50", b"warm-up"))
        os.kill(broker, signal.SIGSTOP)
        try:
            futs = [p.send_async(Message("Pending50", b"p%d" % i)) for i in range(50)]
            with pytest.raises(MQClientError, match=r"producer buffer full: 50 messages unanswered"):
                p.send_async(Message("Pending50", b"one too many"))
        finally:
            os.kill(broker, signal.SIGCONT)
        assert p.flush(WAIT_S) == 0
        # sends the broker held past their budget may end in a timeout: each has an outcome, and
        # every one answered SEND_OK has its own offset
        ok = [f.result() for f in futs if f.exception() is None]
        assert all(f.done() for f in futs)
        assert len({(r.queue_id, r.queue_offset) for r in ok}) == len(ok)
        p.send_async(Message("Pending50", b"room again")).result(WAIT_S)
