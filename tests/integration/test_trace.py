"""Message trace end to end: a traced producer and a traced push consumer (one failed listener
call, then a retry that succeeds), read back with Admin.query_msg_trace_by_id and
`rmq admin queryMsgTraceById`; a custom trace topic; an untraced client writes nothing."""
import json
import threading

import pytest
from click.testing import CliRunner

from rmq import Admin, Message, Producer
from rmq.cli import main
from rmq.client.consumer import ConsumeConcurrentlyStatus
from rmq.client.trace import TRACE_TOPIC
from rmq.errors import MQClientError
from tests.integration.test_consumer import DELAY_LEVELS, create_topic, push_consumer, wait_for
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("trace") / "store", conf={"messageDelayLevel": DELAY_LEVELS})
    yield c
    c.close()


def test_the_whole_life_of_a_message(cluster):
    create_topic(cluster, "TR", 2)
    calls, lock = [], threading.Lock()

    def listener(msgs, ctx):
        with lock:
            calls.append(msgs[0].reconsume_times)
            first = len(calls) == 1
        return ConsumeConcurrentlyStatus.RECONSUME_LATER if first else ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = push_consumer(cluster, "trace-cg", listener, topic="TR", enable_msg_trace=True,
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.start()
    try:
        with Producer(cluster.namesrv_addr, group="trace-pg", enable_msg_trace=True) as p:
            res = p.send(Message("TR", b"hello", tags="tg", keys=["order-1"]))
        wait_for(lambda: len(calls) >= 2, 60, "the retry was consumed")
        assert consumer.trace_dispatcher.flush(20)
    finally:
        consumer.shutdown()
    with Admin(cluster.namesrv_addr) as a:
        def complete():
            v = a.query_msg_trace_by_id(res.msg_id)
            return v if len([x for x in v if x.trace_type == "Sub" and x.status != "consuming"]) >= 2 else None
        views = wait_for(complete, 30, "trace records indexed")
    pub = [v for v in views if v.trace_type == "Pub"]
    subs = [v for v in views if v.trace_type == "Sub"]
    assert len(pub) == 1
    p0 = pub[0]
    assert (p0.group, p0.topic, p0.tags, p0.keys, p0.status, p0.msg_id, p0.offset_msg_id) == \
        ("trace-pg", "TR", "tg", "order-1", "success", res.msg_id, res.offset_msg_id)
    assert p0.store_host.endswith(f":{cluster.broker.rsplit(':', 1)[1]}") and p0.cost_ms >= 0 and p0.client_host
    assert [(s.group, s.status, s.retry_times) for s in subs] == [("trace-cg", "failed", 0), ("trace-cg", "success", 1)]
    assert all(s.client_host == consumer.client_id for s in subs)
    assert subs[0].time_ms >= p0.time_ms - 1000

    # the CLI shows the same, as JSON and as tables
    r = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "queryMsgTraceById", "-i", res.msg_id,
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [t["trace_type"] for t in out["trace"]] == ["Pub", "Sub", "Sub"]
    r = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "queryMsgTraceById", "-i", res.msg_id])
    assert r.exit_code == 0 and "trace-pg" in r.stdout and "trace-cg" in r.stdout and "failed" in r.stdout


def test_custom_trace_topic_and_untraced_clients(cluster):
    create_topic(cluster, "TR2", 1)
    with Producer(cluster.namesrv_addr, group="pg2", enable_msg_trace=True, custom_trace_topic="MY_TRACE") as p:
        res = p.send(Message("TR2", b"x"))
        batch = p.send_batch([Message("TR2", b"b%d" % i) for i in range(3)])
        fut = p.send_async(Message("TR2", b"async"))
        fut.result(10)
        assert p.trace_dispatcher.flush(20)
        assert p.trace_dispatcher.sent_records == 5 and p.trace_dispatcher.dropped == 0
    with Admin(cluster.namesrv_addr) as a:
        views = wait_for(lambda: a.query_msg_trace_by_id(res.msg_id, "MY_TRACE"), 30, "custom topic trace")
        assert [(v.trace_type, v.group) for v in views] == [("Pub", "pg2")]
        second = batch.msg_id.split(",")[1]
        views = wait_for(lambda: a.query_msg_trace_by_id(second, "MY_TRACE"), 30, "batch member trace")
        assert views[0].msg_id == second
        views = wait_for(lambda: a.query_msg_trace_by_id(fut.result().msg_id, "MY_TRACE"), 30, "async trace")
        assert views[0].status == "success"
        # an untraced producer adds nothing
        with Producer(cluster.namesrv_addr, group="pg3") as p:
            plain = p.send(Message("TR2", b"plain"))
            assert p.trace_dispatcher is None
        assert a.query_msg_trace_by_id(plain.msg_id, "MY_TRACE") == []
        with pytest.raises(MQClientError, match="no trace topic"):
            a.query_msg_trace_by_id(plain.msg_id, "NO_SUCH_TRACE_TOPIC")
    r = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "queryMsgTraceById", "-i", res.msg_id,
                                  "-t", TRACE_TOPIC + "_NONE"])
    assert r.exit_code == 1 and "no trace topic" in r.stderr


def test_asyncio_producer_and_consumer_trace(cluster):
    import asyncio

    from rmq.aio.consumer import AsyncPushConsumer
    from rmq.aio.producer import Producer as AsyncProducer
    from tests.integration.test_consumer import FAST
    create_topic(cluster, "TR3", 1)

    async def main():
        got = asyncio.Event()

        async def listener(msgs, ctx):
            got.set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        c = AsyncPushConsumer(cluster.namesrv_addr, "trace-acg", **FAST, enable_msg_trace=True,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe("TR3", "*")
        c.register_message_listener(listener)
        await c.start()
        try:
            async with AsyncProducer(cluster.namesrv_addr, "trace-apg", enable_msg_trace=True) as p:
                res = await p.send(Message("TR3", b"aio"))
                batch = await p.send_batch([Message("TR3", b"a%d" % i) for i in range(2)])
            await asyncio.wait_for(got.wait(), 30)
            await asyncio.to_thread(c.trace_dispatcher.flush, 20)
        finally:
            await c.shutdown()
        return res, batch

    res, batch = asyncio.run(main())
    with Admin(cluster.namesrv_addr) as a:
        views = wait_for(lambda: (lambda v: v if {x.trace_type for x in v} == {"Pub", "Sub"} else None)(
            a.query_msg_trace_by_id(res.msg_id)), 30, "aio trace")
        assert [(v.trace_type, v.group, v.status) for v in views] == [("Pub", "trace-apg", "success"),
                                                                        ("Sub", "trace-acg", "success")]
        last = batch.msg_id.split(",")[-1]
        assert wait_for(lambda: a.query_msg_trace_by_id(last), 30, "aio batch trace")[0].msg_id == last


def test_long_keys_split_trace_messages_under_the_property_limit(cluster):
    """Records whose keys would push one trace message's KEYS past MAX_TRACE_KEYS_BYTES go in
    several trace messages; every record is sent and found by its message id."""
    from rmq.client import trace as T
    d = T.TraceDispatcher(cluster.namesrv_addr, "longkeys", "LONG_TRACE")
    ids = [f"{i:032X}" for i in range(40)]
    try:
        for mid in ids:
            d.append(T.TraceContext(T.TraceType.SubBefore, 1, group_name="lk", request_id=mid,
                                    bean=T.TraceBean(msg_id=mid, keys="k" * 1000 + mid)))
        assert d.flush(30)
        assert d.failed == 0 and d.sent_records == 40 and d.sent_messages >= 40 * 1033 // T.MAX_TRACE_KEYS_BYTES
    finally:
        d.close()
    with Admin(cluster.namesrv_addr) as a:
        for mid in (ids[0], ids[-1]):
            views = wait_for(lambda: a.query_msg_trace_by_id(mid, "LONG_TRACE"), 30, "long-key trace")
            assert views[0].request_id == mid and views[0].status == "consuming"


def test_trace_records_that_cannot_be_sent_are_counted_and_the_traffic_goes_on(tmp_path):
    """The trace topic cannot be created (autoCreateTopicEnable=false): the producer's own sends
    succeed, the trace records are counted in ``failed``, nothing raises."""
    c = Cluster(tmp_path / "store", conf={"autoCreateTopicEnable": "false"})
    try:
        create_topic(c, "TF", 1)
        with Producer(c.namesrv_addr, group="pgf", enable_msg_trace=True) as p:
            for i in range(3):
                assert p.send(Message("TF", b"%d" % i)).msg_id
            d = p.trace_dispatcher
            assert d.flush(30)
            assert d.failed == 3 and d.sent_records == 0 and d.dropped == 0
    finally:
        c.close()


def test_the_asyncio_consumer_has_a_trace_dispatcher_only_while_running(cluster):
    import asyncio

    from rmq.aio.consumer import AsyncPushConsumer
    from tests.integration.test_consumer import FAST
    create_topic(cluster, "TR4", 1)

    async def main():
        c = AsyncPushConsumer(cluster.namesrv_addr, "trace-life", **FAST, enable_msg_trace=True)
        c.subscribe("TR4", "*")
        c.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
        assert c.trace_dispatcher is None                # nothing started by the constructor
        await c.start()
        running = c.trace_dispatcher
        await c.shutdown()
        return running, c.trace_dispatcher
    running, after = asyncio.run(main())
    assert running is not None and not running._thread.is_alive() and after is None


@pytest.mark.parametrize("call", ["many", "columns"])
@pytest.mark.parametrize("client", ["thread", "aio"])
def test_bulk_sends_write_a_pub_record_per_message(cluster, client, call):
    """A traced send_async_many (Messages) or send_async_columns (rows): one Pub record per stored
    message, with its tag and keys; the thread producer's dispatcher sends all 20."""
    import asyncio
    topic = f"TR-{call}-{client}"
    create_topic(cluster, topic, 2)
    bodies = [b"m%d" % i for i in range(20)]
    tags = ["TG%d" % (i % 2) for i in range(20)]
    keys = [["K%d" % i, "L%d" % i] for i in range(20)]

    def send(p):
        if call == "many":
            return p.send_async_many([Message(topic, b, tags=t, keys=k) for b, t, k in zip(bodies, tags, keys)])
        return p.send_async_columns(topic, bodies, tags=tags, keys=keys)
    if client == "thread":
        with Producer(cluster.namesrv_addr, group=f"pg-{call}-tr", enable_msg_trace=True,
                      custom_trace_topic="BULK_TRACE") as p:
            results = send(p).result(30)
            assert p.trace_dispatcher.flush(20)
            assert p.trace_dispatcher.sent_records == 20
    else:
        from rmq.aio import Producer as AioProducer

        async def main():
            async with AioProducer(cluster.namesrv_addr, group=f"pg-{call}-tr-aio", enable_msg_trace=True,
                                   custom_trace_topic="BULK_TRACE") as p:
                return await (await send(p))
        results = asyncio.run(asyncio.wait_for(main(), 60))
    with Admin(cluster.namesrv_addr) as a:
        for i in (0, 19):
            r = results[i]
            views = wait_for(lambda: a.query_msg_trace_by_id(r.msg_id, "BULK_TRACE"), 30, f"send_async_{call} trace")
            assert [(v.trace_type, v.msg_id, v.tags, v.keys) for v in views] == \
                [("Pub", r.msg_id, tags[i], f"K{i} L{i}")]
