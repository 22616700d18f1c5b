"""Producer.send_async_many (threads and rmq.aio) against a real broker group: one future for
many messages."""
import asyncio
import os
import signal
import zlib
from concurrent.futures import Future

import pytest

from rmq import Message, Producer, SendStatus
from rmq.client.producer import MANY_REQUEST_SIZE, COMPRESSED_FLAG, java_hash
from rmq.errors import MQBrokerError, MQClientError, SendManyError
from tests.integration.cluster import Cluster
from tests.integration.test_producer import create_topic, pull_topic, wait_route

pytestmark = pytest.mark.integration

WAIT_S = 60.0
BROKER_MAX_MESSAGE_SIZE = 64 * 1024      # the broker refuses larger bodies (MESSAGE_ILLEGAL, not retried)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # waitTimeMillsInSendQueue: a test here SIGSTOPs the broker with requests on the wire (as
    # test_producer's module does): no SYSTEM_BUSY for requests that aged in its queue meanwhile
    c = Cluster(tmp_path_factory.mktemp("many") / "store", conf={"maxMessageSize": str(BROKER_MAX_MESSAGE_SIZE),
                                                                  "waitTimeMillsInSendQueue": "600000"})
    yield c
    c.close()


def send_many(client, namesrv, group, topics, msgs, producer_kw=None, **kw):
    """``send_async_many(msgs, **kw)`` with a thread or an asyncio producer, after the topics'
    routes are served: (the outcome: results, or the exception; the producer's stats)."""
    return send_call(client, namesrv, group, topics, lambda p: p.send_async_many(msgs, **kw), producer_kw)


def send_call(client, namesrv, group, topics, call, producer_kw=None):
    """``call(producer)`` (a send_async_many / send_async_columns call: its future, or for the
    asyncio producer an awaitable of it) after the topics' routes are served: (the outcome, or
    the exception; the producer's stats)."""
    producer_kw = producer_kw or {}
    if client == "thread":
        with Producer(namesrv, group=group, **producer_kw) as p:
            for t, q in topics:
                wait_route(p, t, q)
            fut = call(p)
            try:
                out = fut.result(WAIT_S)
            except Exception as e:  # noqa: BLE001 - the test looks at it
                out = e
            assert p.flush(WAIT_S) == 0
            return out, dict(p.stats)
    from rmq.aio import Producer as AioProducer

    async def main():
        async with AioProducer(namesrv, group=group, **producer_kw) as p:
            for t, q in topics:
                while len(await p.fetch_publish_message_queues(t)) != q:
                    await asyncio.sleep(0.05)
            fut = await call(p)
            try:
                out = await fut
            except Exception as e:  # noqa: BLE001
                out = e
            assert await p.flush(WAIT_S) == 0
            return out, dict(p.stats)
    return asyncio.run(asyncio.wait_for(main(), WAIT_S))


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_every_message_stored_once_with_its_result_in_the_order_given_both_clients(cluster, rc, client):
    topics = [f"ManyA-{client}", f"ManyB-{client}"]
    for t in topics:
        create_topic(rc, cluster, t, 2)
    msgs = [Message(topics[i % 2], b"%06d" % i + b"x" * 94) for i in range(2000)] + \
        [Message(topics[0], b"big" + b"y" * 10_000)]
    results, stats = send_many(client, cluster.namesrv_addr, f"pg-many-{client}", [(t, 2) for t in topics], msgs,
                               {"batch_size": 1024})
    assert isinstance(results, list) and len(results) == len(msgs)
    for m, r in zip(msgs, results):
        assert r.status is SendStatus.SEND_OK and r.msg_id == m.properties["UNIQ_KEY"]
        assert r.message_queue.topic == m.topic and r.region_id == "DefaultRegion"   # the field's default, in C
    assert len({(r.message_queue, r.queue_offset) for r in results}) == len(msgs)
    for t in topics:
        stored = [zlib.decompress(x.body) if x.sys_flag & COMPRESSED_FLAG else x.body
                  for x in pull_topic(rc, cluster, t, 2, sum(m.topic == t for m in msgs))]
        assert sorted(stored) == sorted(m.body for m in msgs if m.topic == t)


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_sharding_keys_keep_order_and_a_refused_message_fails_alone_both_clients(cluster, rc, client):
    topic = f"ManyMixed-{client}"
    create_topic(rc, cluster, topic, 4)
    huge = os.urandom(BROKER_MAX_MESSAGE_SIZE + 1024)
    msgs = [Message(topic, b"%06d" % i) for i in range(600)]
    msgs[300] = Message(topic, huge)
    keys = [f"k{i % 3}" if i % 5 else None for i in range(600)]
    err, _ = send_many(client, cluster.namesrv_addr, f"pg-many-m-{client}", [(topic, 4)], msgs,
                       {"batch_size": 2048}, sharding_keys=keys)
    assert isinstance(err, SendManyError) and err.failed == 1 and isinstance(err.results[300], MQBrokerError)
    by_key: dict = {}
    for i, (k, r) in enumerate(zip(keys, err.results)):
        if i == 300:
            continue
        assert r.status is SendStatus.SEND_OK
        if k is not None:
            assert r.queue_id == abs(java_hash(k)) % 4
            by_key.setdefault(k, []).append(r.queue_offset)
    assert all(offs == sorted(offs) for offs in by_key.values())
    assert len(pull_topic(rc, cluster, topic, 4, 599)) == 599


def test_aio_send_async_many_refuses_bad_input_and_calls_back_once(cluster):
    from rmq.aio import Producer as AioProducer

    async def main():
        calls = []
        async with AioProducer(cluster.namesrv_addr, group="pg-many-aio-bad") as p:
            msgs = [Message("ManyAioBad", b"x"), Message("bad topic!", b"y")]
            with pytest.raises(MQClientError, match="message 1 of 2"):
                await p.send_async_many(msgs, sharding_keys=["a", "b"])
            assert all("__SHARDINGKEY" not in m.properties for m in msgs) and p.pending == 0
            with pytest.raises(MQClientError, match="ordered sends need the topic|No route info"):
                await p.send_async_many([Message("ManyAioNoSuchTopic", b"x")], sharding_key="k")
            assert p.pending == 0
            fut = await p.send_async_many([Message("ManyAioOk", b"%d" % i) for i in range(50)], calls.append)
            results = await fut
            await asyncio.sleep(0)            # done-callbacks run on the loop's next turn
            empty = await (await p.send_async_many([]))
        return calls, fut, results, empty
    calls, fut, results, empty = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert calls == [fut] and len(results) == 50 and empty == []


def test_every_message_stored_once_with_its_result_in_the_order_given(cluster, rc):
    """3,000 messages of two topics, small batches (1 KiB), one compressed (unbatchable) body among
    them: the future's list has one SEND_OK result per message, in the order given, each with the
    message's UNIQ_KEY; the broker holds every body exactly once, and the callback ran once."""
    topics = ["ManyA", "ManyB"]
    for t in topics:
        create_topic(rc, cluster, t, 2)
    msgs = [Message(topics[i % 2], b"%06d" % i + b"x" * 94) for i in range(3000)]
    big = b"%06d" % 3000 + b"y" * 10_000       # over compress_msg_body_over_howmuch: a message of its own
    msgs.append(Message("ManyA", big))
    calls: list = []
    with Producer(cluster.namesrv_addr, group="pg-many", batch_size=1024) as p:
        for t in topics:
            wait_route(p, t, 2)
        fut = p.send_async_many(msgs, callback=calls.append)
        assert isinstance(fut, Future)
        results = fut.result(WAIT_S)
        assert p.flush(WAIT_S) == 0
        assert p.stats["batch_requests"] >= 3000 * 110 // 1024 // 2      # parts went as ~1 KiB batches
    assert calls == [fut]
    assert len(results) == len(msgs)
    for m, r in zip(msgs, results):
        assert r.status is SendStatus.SEND_OK
        assert r.msg_id == m.properties["UNIQ_KEY"]
        assert r.message_queue.topic == m.topic
    for t in topics:
        stored = [zlib.decompress(x.body) if x.sys_flag & COMPRESSED_FLAG else x.body
                  for x in pull_topic(rc, cluster, t, 2, sum(m.topic == t for m in msgs))]
        mine = [m.body for m in msgs if m.topic == t]
        assert sorted(stored) == sorted(mine)                             # each once, no extra
    # queue offsets are the broker's: per queue, the results' offsets are distinct
    seen = {(r.message_queue, r.queue_offset) for r in results}
    assert len(seen) == len(results)


def test_sharding_keys_keep_each_keys_order_on_its_queue(cluster, rc):
    """One key per message (None: unordered): every message of a key lands on the queue
    select_by_hash picks for it, in the order given, at increasing queue offsets, after a
    send_async of the same key made before the call."""
    topic = "ManyOrdered"
    create_topic(rc, cluster, topic, 4)
    keys = [None if i % 7 == 0 else f"k{i % 5}" for i in range(2000)]
    msgs = [Message(topic, b"%06d" % i + b"z" * 50) for i in range(2000)]
    with Producer(cluster.namesrv_addr, group="pg-many-o", batch_size=2048) as p:
        wait_route(p, topic, 4)
        first = p.send_async(Message(topic, b"first-k1"), sharding_key="k1")
        results = p.send_async_many(msgs, sharding_keys=keys).result(WAIT_S)
        before = first.result(WAIT_S)
    by_key: dict = {}
    for k, m, r in zip(keys, msgs, results):
        if k is None:
            assert "__SHARDINGKEY" not in m.properties
            continue
        assert m.properties["__SHARDINGKEY"] == k
        assert r.queue_id == abs(java_hash(k)) % 4
        by_key.setdefault(k, []).append(r.queue_offset)
    for k, offsets in by_key.items():
        assert offsets == sorted(offsets), f"order of {k} broken"
    assert before.queue_id == abs(java_hash("k1")) % 4 and before.queue_offset < by_key["k1"][0]
    assert len(pull_topic(rc, cluster, topic, 4, 2001)) == 2001


def test_one_sharding_key_orders_every_message_and_batching_off_still_works(cluster, rc):
    topic = "ManyOneKey"
    create_topic(rc, cluster, topic, 3)
    msgs = [Message(topic, b"%04d" % i) for i in range(300)]
    with Producer(cluster.namesrv_addr, group="pg-many-1", batch_size=0) as p:
        wait_route(p, topic, 3)
        results = p.send_async_many(msgs, sharding_key=42).result(WAIT_S)
    assert {r.queue_id for r in results} == {abs(java_hash(42)) % 3}
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(offsets[0], offsets[0] + 300))


def test_an_invalid_message_refuses_the_call_naming_it_and_changes_nothing(cluster):
    msgs = [Message("ManyBad", b"ok-%d" % i) for i in range(5)]
    msgs[3] = Message("bad topic name!", b"x")
    with Producer(cluster.namesrv_addr, group="pg-many-bad") as p:
        with pytest.raises(MQClientError, match="message 3 of 5"):
            p.send_async_many(msgs, sharding_keys=["a", "b", "c", "d", "e"])
        assert p.pending == 0 and p.stats["requests"] == 0
        assert all("__SHARDINGKEY" not in m.properties for m in msgs)   # the keys set are taken back
        with pytest.raises(MQClientError, match="message 1 of 2: expected a Message"):
            p.send_async_many([Message("ManyBad", b"x"), b"not a message"])
        with pytest.raises(MQClientError, match="either sharding_key or sharding_keys"):
            p.send_async_many(msgs[:1], sharding_key="a", sharding_keys=["a"])
        with pytest.raises(MQClientError, match="2 keys for 1 messages"):
            p.send_async_many(msgs[:1], sharding_keys=["a", "b"])
        with pytest.raises(MQClientError, match="timeout_ms must be positive"):
            p.send_async_many(msgs[:1], timeout_ms=0)
        assert p.pending == 0 and p.stats["requests"] == 0
        empty = p.send_async_many([])
        assert empty.done() and empty.result() == []


def test_a_refused_message_fails_alone_and_the_error_lists_every_outcome(cluster, rc):
    """A body the broker refuses (over its maxMessageSize: MESSAGE_ILLEGAL, not retried) fails
    its own part; the others are stored, and the future's SendManyError holds each message's
    SendResult or exception in the order given."""
    topic = "ManyPartial"
    create_topic(rc, cluster, topic, 2)
    huge = os.urandom(BROKER_MAX_MESSAGE_SIZE + 1024)       # incompressible: still too big once zipped
    msgs = [Message(topic, b"a-%d" % i) for i in range(50)] + [Message(topic, huge)] + \
           [Message(topic, b"b-%d" % i) for i in range(50)]
    with Producer(cluster.namesrv_addr, group="pg-many-part") as p:
        wait_route(p, topic, 2)
        fut = p.send_async_many(msgs)
        with pytest.raises(SendManyError, match="1 of 101 message") as ei:
            fut.result(WAIT_S)
    err = ei.value
    assert err.failed == 1 and len(err.results) == 101
    assert isinstance(err.results[50], MQBrokerError) and err.__cause__ is err.results[50]
    assert all(r.status is SendStatus.SEND_OK for i, r in enumerate(err.results) if i != 50)
    assert sorted(r.body for r in pull_topic(rc, cluster, topic, 2, 100)) == \
        sorted(m.body for i, m in enumerate(msgs) if i != 50)


def test_a_closed_producer_refuses_the_call(cluster):
    p = Producer(cluster.namesrv_addr, group="pg-many-closed")
    p.close()
    with pytest.raises(MQClientError, match="closed"):
        p.send_async_many([Message("ManyClosed", b"x")])


def test_room_that_never_comes_for_a_later_part_fails_the_rest_in_the_error(cluster, rc):
    """max_pending_messages 100 and the broker stopped: the first parts (100 messages) go out
    unanswered, the next waits send_msg_timeout_ms for room in vain; send_async_many returns,
    and once the broker runs again the future's SendManyError holds SEND_OK for the parts that
    went and "producer buffer full" for every message from the first part that found no room."""
    topic = "ManyRoom"
    create_topic(rc, cluster, topic, 2)
    msgs = [Message(topic, b"%04d" % i) for i in range(300)]
    broker = cluster.pids()["broker"]
    with Producer(cluster.namesrv_addr, group="pg-many-room", max_pending_messages=100, batch_size=1024,
                  send_msg_timeout_ms=500, delivery_timeout_ms=60_000) as p:
        wait_route(p, topic, 2)
        p.send(Message(topic, b"warm-up"))           # connected: the first parts go on the wire
        os.kill(broker, signal.SIGSTOP)
        try:
            fut = p.send_async_many(msgs)
            assert not fut.done()
        finally:
            os.kill(broker, signal.SIGCONT)
        with pytest.raises(SendManyError) as ei:
            fut.result(WAIT_S)
    results = ei.value.results
    full = [i for i, r in enumerate(results) if isinstance(r, MQClientError) and "buffer full" in str(r)]
    assert full and 0 < full[0] <= 100 and full == list(range(full[0], len(msgs)))
    assert all(r.status is SendStatus.SEND_OK for r in results[:full[0]])
    assert ei.value.failed == len(full)


# -- send_async_columns: rows given as columns ---------------------------------------------------------------
def send_columns(client, namesrv, group, topic, queues, producer_kw=None, **kw):
    """``send_async_columns(topic, **kw)`` as :func:`send_call` runs it."""
    return send_call(client, namesrv, group, [(topic, queues)], lambda p: p.send_async_columns(topic, **kw),
                     producer_kw)


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_columns_rows_are_stored_as_their_messages_with_results_per_row_both_clients(cluster, rc, client):
    """1,200 rows with tags, keys (a str or a list), user properties and sharding keys (some None),
    in requests of up to max_message_size (64 KiB here, the broker's maxMessageSize: what bounds a
    columns request below MANY_REQUEST_SIZE): each row is stored once with its body, tags, keys, properties and the
    UNIQ_KEY its result names, at the queue and offset its result gives; a key's rows keep
    their order on the queue select_by_hash picks; last_offsets() is each queue's highest."""
    from rmq.client.message import ColumnSendResults
    topic = f"Columns-{client}"
    create_topic(rc, cluster, topic, 4)
    n = 1200
    bodies = [b"%06d" % i + b"c" * (i % 90) for i in range(n)]
    tags = [None if i % 4 == 0 else f"T{i % 3}" for i in range(n)]
    keys = [None if i % 5 == 0 else (f"id{i}" if i % 2 else [f"id{i}", f"alt{i}"]) for i in range(n)]
    props = [None if i % 6 == 0 else {"row": str(i), "city": "Zürich"} for i in range(n)]
    skeys = [None if i % 7 == 0 else f"k{i % 5}" for i in range(n)]
    results, stats = send_columns(client, cluster.namesrv_addr, f"pg-cols-{client}", topic, 4,
                                  {"max_message_size": BROKER_MAX_MESSAGE_SIZE}, bodies=bodies, tags=tags, keys=keys,
                                  properties=props, sharding_keys=skeys)
    assert isinstance(results, ColumnSendResults) and len(results) == n and results.failed == 0
    assert stats["messages"] == n and stats["batch_requests"] >= n * 100 // BROKER_MAX_MESSAGE_SIZE + 1
    by_key: dict = {}
    for i, r in enumerate(results):
        assert r.status is SendStatus.SEND_OK and r.msg_id == results.msg_ids[i] and len(r.msg_id) == 32
        assert (r.queue_id, r.queue_offset) == (results.queue_ids[i], results.queue_offsets[i])
        if skeys[i] is not None:
            assert r.queue_id == abs(java_hash(skeys[i])) % 4
            by_key.setdefault(skeys[i], []).append(r.queue_offset)
    assert all(offs == sorted(offs) for offs in by_key.values())
    stored = {rec.msg_id: rec for rec in pull_topic(rc, cluster, topic, 4, n)}
    assert len(stored) == n
    for i in range(n):
        rec = stored[results.msg_ids[i]]
        assert rec.body == bodies[i] and (rec.queue_id, rec.queue_offset) == (results.queue_ids[i],
                                                                              results.queue_offsets[i])
        assert rec.tags == tags[i]
        want_keys = [] if keys[i] is None else ([keys[i]] if isinstance(keys[i], str) else keys[i])
        assert rec.keys == want_keys
        assert {k: v for k, v in rec.properties.items() if k in ("row", "city")} == (props[i] or {})
        assert rec.properties.get("__SHARDINGKEY") == skeys[i] and rec.offset_msg_id == results[i].offset_msg_id
    last = results.last_offsets()
    assert {mq.queue_id: off for mq, off in last.items()} == \
        {q: max(o for qq, o in zip(results.queue_ids, results.queue_offsets) if qq == q) for q in set(results.queue_ids)}


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_columns_a_row_the_broker_refuses_fails_alone_both_clients(cluster, rc, client):
    """A row over the broker's maxMessageSize (but within the client's) and over
    MANY_REQUEST_SIZE is a request of its own: it alone fails (SendManyError, its entry the
    MQBrokerError, -1 in the columns); the other rows are stored."""
    topic = f"ColumnsRefused-{client}"
    create_topic(rc, cluster, topic, 2)
    bodies = [b"%05d" % i for i in range(400)]
    bodies[123] = os.urandom(MANY_REQUEST_SIZE + 1024)
    err, stats = send_columns(client, cluster.namesrv_addr, f"pg-cols-r-{client}", topic, 2, bodies=bodies)
    assert stats["batch_requests"] == 3                  # rows 0-122, row 123, rows 124-399
    assert isinstance(err, SendManyError) and err.failed == 1
    res = err.results
    assert set(res.exceptions) == {123} and isinstance(res[123], MQBrokerError) and res[123].response_code == 13
    assert res.queue_offsets[123] == -1 and res.queue_ids[123] == -1 and res.message_queues[123] is None
    assert all(res[i].status is SendStatus.SEND_OK for i in range(400) if i != 123)
    stored = pull_topic(rc, cluster, topic, 2, 399)
    assert sorted(x.body for x in stored) == sorted(b for i, b in enumerate(bodies) if i != 123)


def test_columns_bad_input_is_refused_whole_and_nothing_is_queued(cluster):
    from rmq.aio import Producer as AioProducer
    calls: list = []
    with Producer(cluster.namesrv_addr, group="pg-cols-bad") as p:
        with pytest.raises(MQClientError, match="message 1 of 3: the message body length is zero"):
            p.send_async_columns("ColumnsBad", [b"a", b"", b"c"], calls.append)
        with pytest.raises(MQClientError, match="tags has 2 items for 3 messages"):
            p.send_async_columns("ColumnsBad", [b"a", b"b", b"c"], tags=["x", "y"])
        with pytest.raises(MQClientError, match="timeout_ms must be positive"):
            p.send_async_columns("ColumnsBad", [b"a"], timeout_ms=0)
        assert p.pending == 0 and calls == []
        empty = p.send_async_columns("ColumnsBad", [], calls.append).result(WAIT_S)
        assert len(empty) == 0 and len(calls) == 1
        many = p.send_async_columns("ColumnsBad", [b"x" * 100] * 300, calls.append)    # one callback, once
        assert len(many.result(WAIT_S)) == 300 and calls[1:] == [many]
    with pytest.raises(MQClientError, match="producer pg-cols-bad is closed"):
        p.send_async_columns("ColumnsBad", [b"a"])

    async def aio():
        async with AioProducer(cluster.namesrv_addr, group="pg-cols-bad-aio") as ap:
            with pytest.raises(MQClientError, match="message 0 of 1: property 'TAGS' is set by the producer"):
                await ap.send_async_columns("ColumnsBad", [b"a"], properties=[{"TAGS": "x"}])
            with pytest.raises(MQClientError, match="ordered sends need the topic|No route info"):
                await ap.send_async_columns("ColumnsNoSuchTopic", [b"a"], sharding_key="k")
            assert ap.pending == 0
            return len(await (await ap.send_async_columns("ColumnsBad", [])))
    assert asyncio.run(asyncio.wait_for(aio(), WAIT_S)) == 0


@pytest.mark.parametrize("client", ["thread", "aio"])
def test_send_async_many_requests_take_many_request_size_unless_batch_size_is_given(cluster, rc, client):
    """With batch_size left to its default a send_async_many request holds up to MANY_REQUEST_SIZE,
    within max_message_size (64 KiB here, the broker's maxMessageSize); a given batch_size is kept.
    2,000 x 100 B messages are 164 B each in a batch (header + body + UNIQ_KEY): 6 requests of up to
    64 KiB, 21 of up to 16 KiB."""
    topic = f"ManySize-{client}"
    create_topic(rc, cluster, topic, 1)
    msgs = lambda: [Message(topic, b"%06d" % i + b"s" * 94) for i in range(2000)]   # noqa: E731
    results, stats = send_many(client, cluster.namesrv_addr, f"pg-many-size-{client}", [(topic, 1)], msgs(),
                               {"max_message_size": BROKER_MAX_MESSAGE_SIZE})
    assert len(results) == 2000 and stats["batch_requests"] == 6
    results, stats = send_many(client, cluster.namesrv_addr, f"pg-many-size-{client}", [(topic, 1)], msgs(),
                               {"batch_size": 16 * 1024})
    assert len(results) == 2000 and stats["batch_requests"] == 21
