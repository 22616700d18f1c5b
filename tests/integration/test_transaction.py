"""Transactional messages against a real broker: commit, rollback, check-back (by the sending
producer and by another producer of the group once the sender is gone), check-back limits,
consumers and pulls never seeing half or op records, END_TRANSACTION refusals, the admin view
of pending transactions, restart recovery (kill -9 cases: tests/fault/test_transaction_kill9.py)."""
import threading
import time

import pytest

from rmq import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer
from rmq.actors.transaction import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_TOPIC, PROPERTY_CHECK_IMMUNITY
from rmq.client.admin import Admin
from rmq.client.consumer import MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.client.transaction import end_transaction_frame
from rmq.errors import MQBrokerError, MQClientError
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
# fast check-backs: a round every 300 ms, a half message is checked once 1 s old
FAST_CHECKS = {"transactionCheckInterval": "300", "transactionTimeOut": "1000", "transactionCheckMax": "4"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("tx") / "store", conf=FAST_CHECKS)
    yield c
    c.close()


def visible(c, topic, queues=1, group="tx-probe"):
    """Every message of ``topic`` a consumer can pull: [(queue id, queue offset, body, sysflag)]."""
    out = []
    with PullConsumer(c.namesrv_addr, group=group, auto_commit=False) as pc:
        for q in range(queues):
            mq = MessageQueue(topic, "broker-a", q)
            offset = 0
            while True:
                try:
                    r = pc.pull(mq, "*", offset, 32, timeout_ms=3000)
                except MQClientError:              # no route yet: the topic is not created
                    return out
                if not r.msg_found_list:
                    break
                out += [(q, m.queue_offset, m.body, m.sys_flag) for m in r.msg_found_list]
                offset = r.next_begin_offset
    return out


def test_commit_is_visible_once_rollback_never(cluster):
    create_topic(cluster, "TX1", 2)
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg1", checker=lambda m: UNKNOW) as p:
        results = []
        for i in range(20):
            state = COMMIT if i % 2 == 0 else ROLLBACK
            r = p.send_message_in_transaction(Message("TX1", b"m-%d" % i, keys=f"k{i}"), lambda m, a: a, state)
            assert r.local_transaction_state is state
            assert r.transaction_id == r.msg_id
            results.append(r)
    want = sorted(b"m-%d" % i for i in range(0, 20, 2))
    got = wait_for(lambda: (lambda v: v if len(v) >= 10 else None)(visible(cluster, "TX1", 2)),
                   what="10 committed messages")
    time.sleep(0.5)                 # a late duplicate would be dispatched by now: look again
    got = visible(cluster, "TX1", 2)
    assert sorted(b for _, _, b, _ in got) == want
    assert all(sf & 0xC == 0x8 for _, _, _, sf in got)         # TRANSACTION_COMMIT_TYPE
    # the committed message keeps its id and keys (query by key finds it, once)
    with Admin(cluster.namesrv_addr) as a:
        assert len(a.query_msg_by_key("TX1", "k0")) == 1
    # half and op records are in their own topics, not in TX1
    assert len(visible(cluster, HALF_TOPIC)) >= 20
    assert len(visible(cluster, OP_TOPIC)) >= 20


def test_unknow_is_checked_back_and_checker_decides(cluster):
    create_topic(cluster, "TX2", 1)
    asked = []
    # the checker answers UNKNOW until the test has seen that nothing is visible before a decision:
    # a check-back comes once a half message is 1 s old, which a scheduling gap of a loaded machine
    # can reach before that look (a decision then would be visible, rightly).  Its UNKNOWs are
    # counted against transactionCheckMax (4), far from reached within the first round or two
    decide = threading.Event()

    def checker(m):
        if not decide.is_set():
            return UNKNOW
        asked.append((m.topic, m.body, m.properties.get("UNIQ_KEY")))
        return COMMIT if m.body.endswith(b"c") else ROLLBACK

    with TransactionProducer(cluster.namesrv_addr, group="tx-pg2", checker=checker) as p:
        r1 = p.send_message_in_transaction(Message("TX2", b"later-c"), lambda m, a: UNKNOW)
        r2 = p.send_message_in_transaction(Message("TX2", b"later-r"), lambda m, a: 1 / 0)     # raises: UNKNOW
        assert r1.local_transaction_state is UNKNOW and r2.local_transaction_state is UNKNOW
        assert visible(cluster, "TX2") == []
        decide.set()
        wait_for(lambda: {b for _, b, _ in asked} >= {b"later-c", b"later-r"}, timeout_s=20,
                 what="both checked back and decided")
        wait_for(lambda: len(visible(cluster, "TX2")) == 1, timeout_s=10, what="the checked commit")
    assert {(t, b) for t, b, _ in asked} >= {("TX2", b"later-c"), ("TX2", b"later-r")}
    assert {u for _, _, u in asked} >= {r1.msg_id, r2.msg_id}
    time.sleep(1.5)                 # more rounds: nothing committed twice, the rollback stays out
    assert [b for _, _, b, _ in visible(cluster, "TX2")] == [b"later-c"]


def test_check_back_reaches_another_producer_of_the_group(cluster):
    create_topic(cluster, "TX3", 1)
    asked_b = []
    a = TransactionProducer(cluster.namesrv_addr, group="tx-pg3", checker=lambda m: pytest.fail("a is closed"))
    b = TransactionProducer(cluster.namesrv_addr, group="tx-pg3",
                            checker=lambda m: asked_b.append(m.body) or COMMIT)
    try:
        b.producer.send(Message("TX3-warm", b"x"))        # b has a connection to the broker
        a.send_message_in_transaction(Message("TX3", b"from-a"), lambda m, arg: UNKNOW)
        a.close()                                          # the sender is gone before the check
        wait_for(lambda: asked_b, timeout_s=20, what="a check-back at the other producer")
        wait_for(lambda: [x for _, _, x, _ in visible(cluster, "TX3")] == [b"from-a"], timeout_s=10,
                 what="the commit answered by the other producer")
    finally:
        a.close()
        b.close()


def test_check_max_discards_to_trans_check_max_time_topic(cluster):
    create_topic(cluster, "TX4", 1)
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg4", checker=lambda m: UNKNOW) as p:
        r = p.send_message_in_transaction(Message("TX4", b"never-decided"), lambda m, a: UNKNOW)
        wait_for(lambda: any(x == b"never-decided" for _, _, x, _ in visible(cluster, CHECK_MAX_TIME_TOPIC)),
                 timeout_s=30, what="the discard after transactionCheckMax checks")
    with Admin(cluster.namesrv_addr) as a:
        rows = a.half_messages("broker-a")["halfMessages"]
    assert r.transaction_id not in {row["transactionId"] for row in rows}
    assert visible(cluster, "TX4") == []


def test_checks_nobody_can_answer_are_not_counted(cluster):
    """With no live producer of its group, a half message waits, renewed each round with its check
    count unchanged (never discarded after transactionCheckMax = 4 rounds); the first producer of the
    group that comes back is asked and decides."""
    create_topic(cluster, "TX8", 1)
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg8", checker=lambda m: UNKNOW) as p:
        # not checked back before 2 s (CHECK_IMMUNITY_TIME_IN_SECONDS, not the module's 1 s): the
        # producer is closed, and the broker has taken its unregister, before its group's rounds may
        # ask it (each ask counted: transactionCheckMax of them would discard the message)
        r = p.send_message_in_transaction(Message("TX8", b"orphan", properties={PROPERTY_CHECK_IMMUNITY: "2"}),
                                          lambda m, a: UNKNOW)

    def row_of(a):
        row = next((x for x in a.half_messages("broker-a")["halfMessages"]
                    if x["transactionId"] == r.transaction_id), None)
        assert row is not None, "the orphaned transaction was dropped"
        return row

    with Admin(cluster.namesrv_addr) as a:
        # from the moment the broker knows no live producer of the group (the unregister of the
        # close above taken: a check-back of every round after it has nobody to ask) ...
        wait_for(lambda: not a.producer_list("tx-pg8"), what="the producer of tx-pg8 gone from the broker")
        checks = row_of(a)["checkTimes"]                # ... the check count stays as it is now
    seen = set()                                   # queue offsets of its renewed copies: one per round

    def renewed_rounds():
        with Admin(cluster.namesrv_addr) as a:
            row = row_of(a)
        assert row["checkTimes"] == checks, (row, checks)     # rounds nobody can answer: not counted
        seen.add(row["queueOffset"])
        return len(seen) >= 8                          # twice transactionCheckMax rounds

    wait_for(renewed_rounds, timeout_s=60, what="8 check rounds without a producer")
    assert not any(x == b"orphan" for _, _, x, _ in visible(cluster, CHECK_MAX_TIME_TOPIC))
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg8", checker=lambda m: COMMIT):
        wait_for(lambda: [x for _, _, x, _ in visible(cluster, "TX8")] == [b"orphan"], timeout_s=30,
                 what="the commit decided by the producer that came back")


def test_admin_lists_pending_half_messages_with_check_counts(cluster):
    create_topic(cluster, "TX5", 1)
    gate = threading.Event()

    def checker(m):
        return COMMIT if gate.is_set() else UNKNOW

    with TransactionProducer(cluster.namesrv_addr, group="tx-pg5", checker=checker) as p:
        r = p.send_message_in_transaction(Message("TX5", b"pending"), lambda m, a: UNKNOW)
        with Admin(cluster.namesrv_addr) as a:
            row = wait_for(lambda: next((x for x in a.half_messages("broker-a")["halfMessages"]
                                         if x["transactionId"] == r.transaction_id and x["checkTimes"] >= 1), None),
                           timeout_s=20, what="a pending half message checked once")
        assert row["topic"] == "TX5" and row["producerGroup"] == "tx-pg5" and row["queueId"] == 0
        # the CLI: rmq admin halfMessages (table and JSON)
        from click.testing import CliRunner

        from rmq.cli import main
        out = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "--json", "halfMessages", "-b", "broker-a"])
        assert out.exit_code == 0, out.output
        import json
        doc = json.loads(out.stdout)
        mine = [x for x in doc["half_messages"] if x["transaction_id"] == r.transaction_id]
        assert mine and mine[0]["topic"] == "TX5" and mine[0]["check_times"] >= 1 and doc["pending"] >= 1
        table = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "half-messages"])
        assert table.exit_code == 0 and r.transaction_id in table.stdout and "pending transactions" in table.stdout
        bad = CliRunner().invoke(main, ["admin", "-n", cluster.namesrv_addr, "halfMessages", "-b", "no-such-broker"])
        assert bad.exit_code != 0 and "no master broker" in bad.output
        gate.set()
        wait_for(lambda: len(visible(cluster, "TX5")) == 1, timeout_s=20, what="commit after the gate")


def test_end_transaction_refusals_change_nothing(cluster):
    create_topic(cluster, "TX6", 1)
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg6", checker=lambda m: UNKNOW) as p:
        r = p.send_message_in_transaction(Message("TX6", b"x"), lambda m, a: UNKNOW)
    from rmq.client.transaction import commitlog_offset_of
    phys = commitlog_offset_of(r)
    with RemotingClient() as c:
        def end(group, state, qo, off, oneway=False):
            f = end_transaction_frame(group, state, qo, off, "", r.msg_id, False)
            f.flag = 0                                   # as a request, to see the answer
            return c.invoke(cluster.broker, f)
        assert end("other-group", COMMIT, r.queue_offset, phys).remark == "The producer group wrong"
        assert end("tx-pg6", COMMIT, r.queue_offset, phys + 1).code == ResponseCode.SYSTEM_ERROR
        assert end("tx-pg6", COMMIT, r.queue_offset + 7, phys).code == ResponseCode.SYSTEM_ERROR
        bad = Frame(RequestCode.END_TRANSACTION, fields={"producerGroup": "tx-pg6", "commitLogOffset": phys,
                                                         "tranStateTableOffset": r.queue_offset,
                                                         "commitOrRollback": 5})
        assert c.invoke(cluster.broker, bad).code == ResponseCode.SYSTEM_ERROR
        assert visible(cluster, "TX6") == []
        # the real END, twice: one commit
        assert end("tx-pg6", COMMIT, r.queue_offset, phys).code == ResponseCode.SUCCESS
        again = end("tx-pg6", ROLLBACK, r.queue_offset, phys)
        assert again.code == ResponseCode.SUCCESS and "already ended" in again.remark
    wait_for(lambda: len(visible(cluster, "TX6")) == 1, what="the commit")
    time.sleep(0.3)
    assert len(visible(cluster, "TX6")) == 1


def test_client_refusals(cluster):
    with pytest.raises(MQClientError):
        TransactionProducer(cluster.namesrv_addr, group="tx-pg7", checker=None)
    with TransactionProducer(cluster.namesrv_addr, group="tx-pg7", checker=lambda m: UNKNOW) as p:
        with pytest.raises(MQClientError):
            p.send_message_in_transaction(Message("TX7", b"x", delay_time_level=3), lambda m, a: COMMIT)
        with pytest.raises(MQClientError):
            p.send_message_in_transaction(Message("TX7", b"x"), None)


def test_plain_producer_batch_with_prepared_flag_is_refused(cluster):
    with RemotingClient() as c:
        from rmq._core import commitlog as _cl
        batch = _cl.encode_batch([(b"x", b"", 0)])
        r = c.invoke(cluster.broker, Frame(RequestCode.SEND_BATCH_MESSAGE, fields={
            "topic": "TX8", "queueId": 0, "sysFlag": 0x4, "producerGroup": "g"}, bodies=[batch]))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL


def test_pending_transactions_survive_a_restart(tmp_path):
    conf = dict(FAST_CHECKS, transactionCheckInterval="2000", transactionCheckMax="15")
    with Cluster(tmp_path / "store", conf=conf) as c:
        create_topic(c, "TXR", 1)
        with TransactionProducer(c.namesrv_addr, group="tx-pgr", checker=lambda m: UNKNOW) as p:
            rs = [p.send_message_in_transaction(Message("TXR", b"r-%d" % i), lambda m, a: UNKNOW) for i in range(5)]
        c.stop_group()
        c.start_group()
        with Admin(c.namesrv_addr) as a:
            rows = wait_for(lambda: (lambda h: h if h.get("ready") else None)(a.half_messages("broker-a")),
                            what="transaction state recovered")
        assert {r.transaction_id for r in rs} <= {x["transactionId"] for x in rows["halfMessages"]}
        with TransactionProducer(c.namesrv_addr, group="tx-pgr", checker=lambda m: COMMIT) as p2:
            p2.producer.send(Message("TXR-warm", b"x"))
            wait_for(lambda: len(visible(c, "TXR")) == 5, timeout_s=90, what="five commits after restart")
        assert sorted(b for _, _, b, _ in visible(c, "TXR")) == sorted(b"r-%d" % i for i in range(5))


def test_plain_producer_unaffected(cluster):
    create_topic(cluster, "TX9", 1)
    with Producer(cluster.namesrv_addr, group="tx-plain") as p:
        p.send(Message("TX9", b"plain"))
    wait_for(lambda: visible(cluster, "TX9") and [b for _, _, b, _ in visible(cluster, "TX9")] == [b"plain"],
             what="a plain message")


def test_commit_cut_after_its_op_is_rewritten_at_start(tmp_path):
    """What a kill -9 between the op and the commit record leaves (the COMMIT op is the CommitLog's
    last record) is repaired at start: the commit record is written, once, and stays once over
    another restart."""
    from rmq._core import commitlog as _cl
    from rmq.actors.broker import store_config_from_settings
    from rmq.actors.transaction import PROPERTY_TRAN_KEY, PROPERTY_TRAN_OUTCOME, REMOVE_TAG
    from rmq.broker_conf import actor_settings
    from rmq.store.message_store import MessageStore
    with Cluster(tmp_path / "store", conf=dict(FAST_CHECKS, transactionCheckInterval="60000")) as c:
        create_topic(c, "TXC", 1)
        with TransactionProducer(c.namesrv_addr, group="tx-pgc", checker=lambda m: ROLLBACK) as p:
            r = p.send_message_in_transaction(Message("TXC", b"cut"), lambda m, a: UNKNOW)
        c.stop_group()
        settings = actor_settings(c.conf_path, {"storePathRootDir": str(tmp_path / "store")}, "broker")
        store = MessageStore(config=store_config_from_settings(settings))
        try:
            props = {"TAGS": REMOVE_TAG, "WAIT": "false", PROPERTY_TRAN_KEY: r.transaction_id,
                     PROPERTY_TRAN_OUTCOME: "COMMIT"}
            batch = _cl.encode_batch([(str(r.queue_offset).encode(), _cl.encode_properties(props), 0)])
            assert store.put_encoded(OP_TOPIC, 0, batch, None, 0, int(time.time() * 1000), None, 0, 1).ok
            store.commitlog.flush(0)
        finally:
            store.shutdown()
        for _ in range(2):
            c.start_group()
            wait_for(lambda: [b for _, _, b, _ in visible(c, "TXC")] == [b"cut"], timeout_s=30,
                     what="the commit record re-written after its op")
            with Admin(c.namesrv_addr) as a:
                h = wait_for(lambda: (lambda x: x if x["ready"] else None)(a.half_messages("broker-a")),
                             what="recovered")
            assert r.transaction_id not in {x["transactionId"] for x in h["halfMessages"]}
            c.stop_group()
        c.start_group()
        time.sleep(0.5)
        assert [b for _, _, b, _ in visible(c, "TXC")] == [b"cut"]


def test_aio_transaction_producer_commit_rollback_and_check_back(cluster):
    import asyncio

    from rmq.aio import TransactionProducer as AioTransactionProducer
    create_topic(cluster, "TXA", 1)
    asked = []

    async def check(m):
        asked.append(m.body)
        return COMMIT

    async def run():
        async def execute(msg, arg):
            await asyncio.sleep(0)
            return arg
        async with AioTransactionProducer(cluster.namesrv_addr, group="tx-aio", checker=check) as p:
            rs = [await p.send_message_in_transaction(Message("TXA", b"a-commit"), execute, COMMIT),
                  await p.send_message_in_transaction(Message("TXA", b"a-rollback"), lambda m, a: a, ROLLBACK),
                  await p.send_message_in_transaction(Message("TXA", b"a-unknown"), execute, UNKNOW)]
            assert [r.local_transaction_state for r in rs] == [COMMIT, ROLLBACK, UNKNOW]
            deadline = time.monotonic() + 20
            while b"a-unknown" not in asked and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            with pytest.raises(MQClientError):
                await p.send_message_in_transaction(Message("TXA", b"x"), None)
    asyncio.run(run())
    assert b"a-unknown" in asked
    wait_for(lambda: sorted(b for _, _, b, _ in visible(cluster, "TXA")) == [b"a-commit", b"a-unknown"],
             timeout_s=20, what="the commit and the checked-back commit")


def test_aio_transaction_producer_that_never_sent_answers_check_backs(cluster):
    """A restarted service's rmq.aio.TransactionProducer is asked about its group's open transaction
    before it sends anything (it heartbeats every master the NameServer knows)."""
    import asyncio

    from rmq.aio import TransactionProducer as AioTransactionProducer
    create_topic(cluster, "TXN", 1)
    with TransactionProducer(cluster.namesrv_addr, group="tx-aio-late", checker=lambda m: UNKNOW) as p:
        p.send_message_in_transaction(Message("TXN", b"left-open"), lambda m, a: UNKNOW)
    asked = []

    async def check(m):
        asked.append(m.body)
        return COMMIT

    async def run():
        async with AioTransactionProducer(cluster.namesrv_addr, group="tx-aio-late", checker=check):
            deadline = time.monotonic() + 30
            while not asked and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    asyncio.run(run())
    assert asked and set(asked) == {b"left-open"}       # asked again only if a round beat its answer
    wait_for(lambda: [b for _, _, b, _ in visible(cluster, "TXN")] == [b"left-open"], timeout_s=20,
             what="the commit the late producer decided")


def check_back_storm(tmp_path, n: int) -> dict:
    """``n`` open transactions checked back at once while a plain producer sends: every send
    succeeds, every transaction is committed once.  Send latencies are printed, not asserted."""
    conf = {"transactionCheckInterval": "500", "transactionTimeOut": "1000", "transactionCheckMax": "100"}
    with Cluster(tmp_path / "store", conf=conf) as c:
        create_topic(c, "TXS", 4)
        create_topic(c, "TXS-plain", 4)
        with TransactionProducer(c.namesrv_addr, group="tx-storm", checker=lambda m: COMMIT,
                                 check_thread_pool_size=2) as tp:
            for i in range(n):
                tp.send_message_in_transaction(Message("TXS", b"s-%06d" % i), lambda m, a: UNKNOW)
            stop = threading.Event()
            lat, failures = [], []

            def plain():
                with Producer(c.namesrv_addr, group="tx-storm-plain") as p:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        try:
                            p.send(Message("TXS-plain", b"p"))
                        except Exception as e:  # noqa: BLE001 - counted
                            failures.append(e)
                        lat.append(time.perf_counter() - t0)
            t = threading.Thread(target=plain, daemon=True)
            t.start()
            try:
                with Admin(c.namesrv_addr) as a:
                    wait_for(lambda: a.half_messages("broker-a")["pending"] == 0, timeout_s=120 + n / 100,
                             what=f"{n} transactions committed by check-back")
            finally:
                stop.set()
                t.join(30)
        got = [b for _, _, b, _ in visible(c, "TXS", 4)]
    lat.sort()
    p99 = lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0
    print(f"\ncheck-back storm: {n} transactions; {len(lat)} plain sends beside it, "
          f"{len(failures)} failed, p99 {p99:.1f} ms, max {lat[-1] * 1000 if lat else 0:.1f} ms")
    assert not failures, failures[:3]
    assert len(got) == n and len(set(got)) == n
    return {"sends": len(lat), "p99_ms": p99}


def test_check_back_storm_does_not_stall_sends(tmp_path):
    assert check_back_storm(tmp_path, 1000)["sends"] > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_check_back_storm_10000(tmp_path):
    assert check_back_storm(tmp_path, 10_000)["sends"] > 0


def test_reject_transaction_message_refuses_half_messages(tmp_path):
    """broker.conf ``rejectTransactionMessage=true``: a half message gets NO_PERMISSION and nothing is
    stored; plain sends go on."""
    with Cluster(tmp_path / "store", conf={"rejectTransactionMessage": "true"}) as c:
        create_topic(c, "TXJ", 1)
        with TransactionProducer(c.namesrv_addr, group="tx-pgj", checker=lambda m: COMMIT) as p:
            with pytest.raises(MQBrokerError) as e:
                p.send_message_in_transaction(Message("TXJ", b"refused"), lambda m, a: COMMIT)
            assert e.value.response_code == ResponseCode.NO_PERMISSION
            p.producer.send(Message("TXJ", b"plain"))
            with Admin(c.namesrv_addr) as a:
                assert a.half_messages("broker-a")["pending"] == 0
        wait_for(lambda: [b for _, _, b, _ in visible(c, "TXJ")] == [b"plain"], what="the plain message only")


def test_transactions_replicate_and_a_slave_refuses_end_transaction(tmp_path):
    """Half, op and commit records are CommitLog records: the slave has them byte for byte (its
    ConsumeQueues serve the commit, never the rollback) and answers END_TRANSACTION with
    SLAVE_NOT_AVAILABLE, changing nothing."""
    from rmq.client.transaction import commitlog_offset_of
    from tests.integration.test_broker import pull_all
    from tests.integration.test_ha import HA_CONF, slave_conf, wait_replicated
    with Cluster(tmp_path / "m", conf={**HA_CONF, "brokerRole": "ASYNC_MASTER"}, with_ha=True) as m, \
            Cluster(tmp_path / "s", conf=slave_conf(), with_ha=True, namesrv_addr=m.namesrv_addr) as s, \
            RemotingClient() as rc:
        create_topic(m, "TXH", 1)
        with TransactionProducer(m.namesrv_addr, group="tx-ha", checker=lambda m_: UNKNOW) as p:
            p.send_message_in_transaction(Message("TXH", b"committed"), lambda msg, a: COMMIT)
            p.send_message_in_transaction(Message("TXH", b"rolled-back"), lambda msg, a: ROLLBACK)
            r = p.send_message_in_transaction(Message("TXH", b"open"), lambda msg, a: UNKNOW)
        wait_for(lambda: [bytes(x.body) for x in pull_all(rc, m.broker, "TXH", 0)[0]] == [b"committed"],
                 what="the commit on the master")
        wait_replicated(rc, m, s)
        # the slave serves TXH once SlaveSynchronize copied its topic config (every few seconds)
        wait_for(lambda: [bytes(x.body) for x in pull_all(rc, s.broker, "TXH", 0)[0]] == [b"committed"],
                 what="the commit, and only it, on the slave")
        assert len(pull_all(rc, s.broker, HALF_TOPIC, 0)[0]) >= 3
        assert len(pull_all(rc, s.broker, OP_TOPIC, 0)[0]) >= 2
        f = end_transaction_frame("tx-ha", COMMIT, r.queue_offset, commitlog_offset_of(r), "", r.msg_id, False)
        f.flag = 0
        assert rc.invoke(s.broker, f).code == ResponseCode.SLAVE_NOT_AVAILABLE
        time.sleep(0.3)
        assert [bytes(x.body) for x in pull_all(rc, s.broker, "TXH", 0)[0]] == [b"committed"]


def test_promoted_slave_checks_back_the_pending_transactions(tmp_path):
    """The master holds open transactions (UNKNOW) and one committed, and is killed (-9); its slave,
    promoted, rebuilds the pending ones from the replicated half / op queues and checks them back
    with the group's live producer (which found the new master through the NameServer): each
    ends as the checker says, once; the earlier commit is not repeated."""
    from tests.integration.test_broker import pull_all
    from tests.integration.test_ha import HA_CONF, promote, runtime, slave_conf, wait_replicated
    decide = threading.Event()

    def checker(m):
        if not decide.is_set():
            return UNKNOW
        return COMMIT if m.body.endswith(b"-c") else ROLLBACK

    with Cluster(tmp_path / "m", conf={**HA_CONF, "brokerRole": "ASYNC_MASTER", **FAST_CHECKS}, with_ha=True) as m, \
            Cluster(tmp_path / "s", conf=slave_conf(**FAST_CHECKS), with_ha=True, namesrv_addr=m.namesrv_addr) as s, \
            RemotingClient() as rc:
        create_topic(m, "TXP", 1)
        with TransactionProducer(m.namesrv_addr, group="tx-promote", checker=checker,
                                 poll_name_server_interval_ms=500, heartbeat_broker_interval_ms=500) as p:
            p.send_message_in_transaction(Message("TXP", b"done-c"), lambda msg, a: COMMIT)
            for i in range(4):
                p.send_message_in_transaction(Message("TXP", b"open%d-%s" % (i, b"c" if i % 2 == 0 else b"r")),
                                              lambda msg, a: UNKNOW)
            wait_for(lambda: [bytes(x.body) for x in pull_all(rc, m.broker, "TXP", 0)[0]] == [b"done-c"],
                     what="the first commit on the master")
            wait_replicated(rc, m, s)
            m.kill_group()
            r = promote(rc, s.broker)
            assert r.code == ResponseCode.SUCCESS, r.remark
            decide.set()
            want = [b"done-c", b"open0-c", b"open2-c"]
            wait_for(lambda: sorted(bytes(x.body) for x in pull_all(rc, s.broker, "TXP", 0)[0]) == want,
                     timeout_s=60, what="the checked commits on the promoted slave")
            with Admin(m.namesrv_addr) as a:          # every transaction ended: nothing left to check
                wait_for(lambda: (lambda v: v["ready"] and v["pending"] == 0)(a.half_messages()), timeout_s=30,
                         what="no open transaction")
        end = runtime(rc, s.broker)["commitLogMaxOffset"]
        wait_for(lambda: runtime(rc, s.broker)["dispatchedOffset"] >= end, what="reput caught up")
        assert sorted(bytes(x.body) for x in pull_all(rc, s.broker, "TXP", 0)[0]) == want
