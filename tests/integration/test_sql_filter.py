"""SQL92 property filters against a real broker (enablePropertyFilter=true): the broker's decision
on 10,000 random messages checked against the reference evaluator (rmq.filter.sql92, written
apart from the broker's native one), through PullConsumer, PushConsumer, rmq.aio and long polling;
the broker's refusals (filter disabled, bad expression, unknown expressionType)."""
import asyncio
import random
import threading

import pytest

from rmq import Message, MessageSelector, Producer, PullConsumer
from rmq.client.consumer import ConsumeConcurrentlyStatus, MessageQueue, PullStatus
from rmq.client.consumer_api import SubscriptionData, build_pull_frame
from rmq.client.remoting import RemotingClient
from rmq.errors import FilterExpressionError, MQBrokerError
from rmq.filter import sql92
from rmq.protocol import Frame, RequestCode, ResponseCode, pack_body
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import FAST, create_topic, push_consumer, wait_dispatched, wait_for

pytestmark = pytest.mark.integration

N_MESSAGES = 10_000
QUEUES = 4
REGIONS = ["eu", "us", "ap", "EU", ""]
# each a rule or a quirk of RocketMQ's semantics on the random properties below
EXPRESSIONS = [
    "a > 5 AND region IN ('eu', 'us') AND name IS NOT NULL",
    "a BETWEEN 10 AND 20 OR region = 'ap'",
    "a NOT BETWEEN 10 AND 90",
    "region NOT IN ('eu', 'us') AND a <= 50",
    "price > 10.5 OR name STARTSWITH 'n1'",
    "name IS NULL",
    "TAGS = 'b' AND NOT (a < 30)",
    "name CONTAINS '7' AND name NOT ENDSWITH '7'",
    "a = 5 OR price = 2.0",
    "a > price",
]


def random_props(rng: random.Random, i: int) -> dict:
    p = {}
    r = rng.random()
    if r < 0.75:
        p["a"] = str(rng.randrange(0, 100))
    elif r < 0.85:
        p["a"] = rng.choice(["x", "5.5", " 7", "2147483648", "-3", "+4"])       # strings Integer.valueOf refuses or reads
    if rng.random() < 0.9:
        region = rng.choice(REGIONS)
        if region:
            p["region"] = region
    if rng.random() < 0.7:
        p["name"] = f"n{rng.randrange(0, 200)}"
    if rng.random() < 0.6:
        p["price"] = rng.choice([f"{rng.uniform(0, 30):.2f}", "2", "2.0", "NaN", "1e1", "abc", " 3.5 "])
    return p


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """One cluster with the property filter on and 10,000 random messages in topic SQL."""
    c = Cluster(tmp_path_factory.mktemp("sqlfilter") / "store", conf={"enablePropertyFilter": "true"})
    rng = random.Random(20261125)
    tags = ["a", "b", "c"]
    sent = {}
    try:
        create_topic(c, "SQL", QUEUES)
        msgs = []
        for i in range(N_MESSAGES):
            props = random_props(rng, i)
            m = Message("SQL", b"%d" % i, tags=rng.choice(tags), properties=props)
            sent[b"%d" % i] = {**props, "TAGS": m.properties["TAGS"]}
            msgs.append(m)
        with Producer(c.namesrv_addr, group="pg") as p:
            for k in range(0, N_MESSAGES, 500):
                p.send_batch(msgs[k:k + 500])
        wait_dispatched(c, "SQL", QUEUES, N_MESSAGES)
        yield c, sent
    finally:
        c.close()


def expected(sent: dict, expr: str) -> set:
    tree = sql92.parse(expr)
    return {body for body, props in sent.items() if sql92.matches(tree, props)}


def pull_all(pc: PullConsumer, selector) -> tuple:
    got, pulls = [], 0
    for q in range(QUEUES):
        mq = MessageQueue("SQL", "broker-a", q)
        off = 0
        while True:
            res = pc.pull(mq, selector, offset=off, max_nums=32)
            pulls += 1
            if res.pull_status is PullStatus.FOUND:
                got.extend(m.body for m in res.msg_found_list)
            elif res.pull_status is PullStatus.NO_NEW_MSG:
                break
            assert res.next_begin_offset > off or res.pull_status is PullStatus.NO_NEW_MSG
            off = res.next_begin_offset
    return got, pulls


def test_the_brokers_decision_matches_the_reference_on_10000_random_messages(loaded):
    c, sent = loaded
    with PullConsumer(c.namesrv_addr, group="sqlpull", auto_commit=False) as pc:
        for expr in EXPRESSIONS:
            want = expected(sent, expr)
            got, _ = pull_all(pc, MessageSelector.by_sql(expr))
            assert len(got) == len(set(got)), f"{expr}: a message served twice"
            assert set(got) == want, (f"{expr}: broker and reference differ on "
                                      f"{sorted(set(got) ^ want)[:10]} (broker {len(got)}, reference {len(want)})")
            assert 0 < len(want) < N_MESSAGES, f"{expr}: the data does not exercise it ({len(want)} matches)"


def test_random_expressions_on_the_broker_match_the_reference(loaded):
    """Expressions drawn at random from the grammar (the unit tests' generator), 10,000 messages each."""
    from tests.unit.test_sql92 import random_expression
    c, sent = loaded
    rng = random.Random(7)
    with PullConsumer(c.namesrv_addr, group="sqlpull2", auto_commit=False) as pc:
        checked = 0
        while checked < 6:
            expr = random_expression(rng, names=("a", "region", "name", "price", "TAGS"))
            try:
                sql92.parse(expr)
            except FilterExpressionError:
                continue
            got, _ = pull_all(pc, MessageSelector.by_sql(expr))
            assert set(got) == expected(sent, expr), expr
            checked += 1


def test_push_and_asyncio_consumers_receive_exactly_the_matches(loaded):
    from rmq.aio.consumer import AsyncPushConsumer
    c, sent = loaded
    expr = EXPRESSIONS[0]
    want = expected(sent, expr)
    seen, lock = [], threading.Lock()

    def listener(msgs, ctx):
        with lock:
            seen.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = push_consumer(c, "sqlpush", listener, topic="SQL", expr=MessageSelector.by_sql(expr),
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.start()
    try:
        wait_for(lambda: len(set(seen)) >= len(want), 60, "push consumer got every match")
    finally:
        consumer.shutdown()
    assert set(seen) == want

    async def aio_side():
        got = set()
        done = asyncio.Event()

        async def alistener(msgs, ctx):
            got.update(m.body for m in msgs)
            if len(got) >= len(want2):
                done.set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        ac = AsyncPushConsumer(c.namesrv_addr, "sqlaio", **FAST, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        ac.subscribe("SQL", MessageSelector.by_sql(EXPRESSIONS[1]))
        ac.register_message_listener(alistener)
        await ac.start()
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await ac.shutdown()
        return got

    want2 = expected(sent, EXPRESSIONS[1])
    assert asyncio.run(aio_side()) == want2


def test_a_held_pull_wakes_for_a_match_only(loaded):
    """Long polling with a SQL92 subscription: messages that do not match never come back; the
    one that does is delivered to the waiting pull."""
    c, _ = loaded
    create_topic(c, "SQLT", 1)
    mq = MessageQueue("SQLT", "broker-a", 0)
    sel = MessageSelector.by_sql("kind = 'hit'")
    with Producer(c.namesrv_addr, group="pgt") as p, \
            PullConsumer(c.namesrv_addr, group="sqltail", auto_commit=False) as pc:
        p.send(Message("SQLT", b"first", properties={"kind": "miss"}))
        wait_dispatched(c, "SQLT", 1, 1, group="probe2")
        result = {}

        def waiter():
            result["r"] = pc.pull_block_if_not_found(mq, sel, offset=0, max_nums=32)
        t = threading.Thread(target=waiter)
        t.start()
        for i in range(5):
            p.send(Message("SQLT", b"miss%d" % i, properties={"kind": "miss"}))
        p.send(Message("SQLT", b"hit", properties={"kind": "hit"}))
        t.join(30)
        assert not t.is_alive()
        res = result["r"]
        # the first pull may end at a miss (NO_MATCHED_MSG advances the offset): pull on from there
        off, bodies = 0, []
        while True:
            if res.pull_status is PullStatus.FOUND:
                bodies.extend(m.body for m in res.msg_found_list)
                break
            assert res.pull_status in (PullStatus.NO_MATCHED_MSG, PullStatus.NO_NEW_MSG), res.pull_status
            off = res.next_begin_offset
            res = pc.pull_block_if_not_found(mq, sel, offset=off, max_nums=32)
        assert bodies == [b"hit"]


def test_the_broker_refuses_what_it_cannot_filter(loaded, tmp_path):
    c, _ = loaded
    mq = MessageQueue("SQL", "broker-a", 0)
    with RemotingClient() as rc:
        # a bad expression that bypasses the client's check: RocketMQ's SUBSCRIPTION_PARSE_FAILED,
        # with the position
        bad = SubscriptionData("SQL", "a > 5 AND", expression_type="SQL92")
        r = rc.invoke(c.broker, build_pull_frame("g", mq, 0, 32, bad))
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "line 1, column 10" in r.remark and "unexpected end" in r.remark
        f = build_pull_frame("g", mq, 0, 32, "a > 5")
        f.fields["expressionType"] = "JAVA_CLASS"
        r = rc.invoke(c.broker, f)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "JAVA_CLASS" in r.remark
    # the client refuses a bad expression before anything is sent
    with pytest.raises(FilterExpressionError, match=r"column 7"):
        MessageSelector.by_sql("a > 5 ) ")

    # enablePropertyFilter defaults to false: RocketMQ's error, nothing served
    plain = Cluster(tmp_path / "plain")
    try:
        create_topic(plain, "P", 1)
        with Producer(plain.namesrv_addr, group="pg") as p:
            p.send(Message("P", b"x", properties={"a": "9"}))
        with PullConsumer(plain.namesrv_addr, group="g", auto_commit=False) as pc:
            with pytest.raises(MQBrokerError) as e:
                pc.pull(MessageQueue("P", "broker-a", 0), MessageSelector.by_sql("a > 5"), offset=0)
            assert e.value.response_code == ResponseCode.SYSTEM_ERROR
            assert "does not support consumer to filter message by SQL92" in str(e.value)
            # switched on at runtime (UPDATE_BROKER_CONFIG), the same pull is served
            with RemotingClient() as rc:
                r = rc.invoke(plain.broker, Frame(RequestCode.UPDATE_BROKER_CONFIG,
                                                  bodies=[pack_body({"enablePropertyFilter": "true"})]))
                assert r.code == ResponseCode.SUCCESS, r.remark
            # (served once reput has dispatched the send: wait for it, the pull does not hold)
            got = wait_for(lambda: pc.pull(MessageQueue("P", "broker-a", 0), MessageSelector.by_sql("a > 5"),
                                           offset=0).msg_found_list, what="the filtered pull served")
            assert [m.body for m in got] == [b"x"]
    finally:
        plain.close()
