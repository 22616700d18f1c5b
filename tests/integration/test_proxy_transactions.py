"""Transactional messages through the remoting proxy, with the frames RocketMQ 4.9's Java client
sends (the C++ client of PyPI ``rocketmq==0.4.4`` has no transaction API): a half message
(SEND_MESSAGE_V2, sysFlag TRANSACTION_PREPARED, ``TRAN_MSG`` / ``PGROUP``), END_TRANSACTION
one-way to the proxy, and the broker's CHECK_TRANSACTION_STATE relayed to the producer's
connection with the real topic restored, answered by an END_TRANSACTION ``fromTransactionCheck``.
Source: RocketMQ ``DefaultMQProducerImpl.sendMessageInTransaction`` / ``endTransaction``,
``ClientRemotingProcessor.checkTransactionState``, ``Broker2Client.checkProducerTransactionState``."""
import json
import time

import pytest

from rmq import PullConsumer
from rmq._core import commitlog as _cl
from rmq.client.consumer import MessageQueue
from rmq.protocol import RequestCode as C
from rmq.proxy.remoting import FLAG_ONEWAY, SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand, encode
from tests.integration.cluster import Cluster
from tests.integration.proxy_helpers import connect, properties, read_frame, running_proxy
from tests.integration.test_consumer import create_topic, wait_for

pytestmark = pytest.mark.integration
FAST_CHECKS = {"transactionCheckInterval": "300", "transactionTimeOut": "1000", "transactionCheckMax": "30"}
COMMIT, ROLLBACK = 8, 12                 # MessageSysFlag.TRANSACTION_COMMIT_TYPE / ROLLBACK_TYPE
GROUP = "PG-java-tx"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("proxy-tx") / "store", conf=FAST_CHECKS)
    yield c
    c.close()


@pytest.fixture(scope="module")
def proxy(cluster):
    with running_proxy(cluster.namesrv_addr) as addr:
        yield addr


class JavaProducer:
    """One connection, as a Java TransactionMQProducer keeps: answers read by opaque, the proxy's
    own requests (CHECK_TRANSACTION_STATE) collected."""

    def __init__(self, addr, stype):
        self.s = connect(addr)
        self.stype = stype
        self.opaque = 0
        self.checks = []

    def request(self, code, fields, body=b"", oneway=False):
        self.opaque += 1
        self.s.sendall(encode(RemotingCommand(code, self.opaque, FLAG_ONEWAY if oneway else 0, None,
                                              {k: str(v) for k, v in fields.items()}, body, "JAVA", 407,
                                              self.stype)))
        if oneway:
            return None
        while True:
            r = read_frame(self.s)
            if not r.is_response:
                self.checks.append(r)
                continue
            assert r.opaque == self.opaque, r
            return r

    def next_check(self, timeout_s=30.0):
        if self.checks:
            return self.checks.pop(0)
        self.s.settimeout(timeout_s)
        r = read_frame(self.s)
        assert not r.is_response, r
        return r

    def close(self):
        self.s.close()


def half_message(p, topic, i):
    uniq = f"UNIQ-{p.stype}-{i}"
    props = {"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": uniq, "KEYS": f"k{i}", "WAIT": "true"}
    r = p.request(C.SEND_MESSAGE_V2, {"a": GROUP, "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 4,
                                      "g": int(time.time() * 1000), "h": 0, "i": properties(props), "j": 0,
                                      "k": "false", "l": 16, "m": "false", "n": "rmq-proxy"}, b"tx-%d" % i)
    assert r.code == 0, (r.code, r.remark)
    return uniq, r.ext_fields


def end(p, uniq, sent_fields, what, from_check=False, table_offset=None, phys=None):
    """END_TRANSACTION one-way, as ``DefaultMQProducerImpl.endTransaction`` (or the check answer) fills it."""
    if phys is None:
        phys = _cl.decode_message_id(sent_fields["msgId"])[1]
    p.request(C.END_TRANSACTION, {"producerGroup": GROUP, "tranStateTableOffset": table_offset
                                  if table_offset is not None else sent_fields["queueOffset"],
                                  "commitLogOffset": phys, "commitOrRollback": what,
                                  "fromTransactionCheck": "true" if from_check else "false",
                                  "msgId": uniq, "transactionId": uniq}, oneway=True)


@pytest.mark.parametrize("stype", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ], ids=["json", "binary"])
def test_commit_rollback_and_a_relayed_check_back(cluster, proxy, stype):
    topic = f"ProxyTx{stype}"
    create_topic(cluster, topic, 1)
    p = JavaProducer(proxy, stype)
    try:
        beat = {"clientID": f"127.0.0.1@java-tx-{stype}", "producerDataSet": [{"groupName": GROUP}],
                "consumerDataSet": []}
        assert p.request(C.HEART_BEAT, {}, json.dumps(beat).encode()).code == 0
        sent = [half_message(p, topic, i) for i in range(3)]
        end(p, *sent[0], COMMIT)
        end(p, *sent[1], ROLLBACK)
        # the third is left open: the broker checks it back through the proxy
        check = p.next_check()
        assert (check.code, check.flag & FLAG_ONEWAY, check.serialize_type) == (C.CHECK_TRANSACTION_STATE,
                                                                                FLAG_ONEWAY, stype)
        assert check.ext_fields["transactionId"] == sent[2][0]
        (m,) = _cl.decode_records(check.body)
        assert (m.topic, m.queue_id, bytes(m.body)) == (topic, 0, b"tx-2")    # the real topic, restored
        assert m.properties["UNIQ_KEY"] == sent[2][0] and m.properties["PGROUP"] == GROUP
        end(p, sent[2][0], None, COMMIT, from_check=True, table_offset=check.ext_fields["tranStateTableOffset"],
            phys=check.ext_fields["commitLogOffset"])
        with PullConsumer(cluster.namesrv_addr, group=f"proxy-tx-reader-{stype}", auto_commit=False) as pc:
            mq = MessageQueue(topic, "broker-a", 0)
            wait_for(lambda: pc.max_offset(mq) >= 2, 30, what="the two commits dispatched")
            got = pc.pull(mq, "*", 0, 32, timeout_ms=3000).msg_found_list
        assert sorted(bytes(x.body) for x in got) == [b"tx-0", b"tx-2"]            # the rollback never shows
        assert {x.properties.get("UNIQ_KEY") for x in got} == {sent[0][0], sent[2][0]}
    finally:
        p.close()


def test_a_check_back_with_no_producer_connection_is_not_relayed(cluster, proxy):
    """The producer's connection is gone: the broker's check-back finds none through the proxy; the
    half stays pending and a new connection of the group gets the next check."""
    topic = "ProxyTxGone"
    create_topic(cluster, topic, 1)
    p = JavaProducer(proxy, SERIALIZE_JSON)
    beat = {"clientID": "127.0.0.1@java-tx-gone", "producerDataSet": [{"groupName": GROUP}], "consumerDataSet": []}
    assert p.request(C.HEART_BEAT, {}, json.dumps(beat).encode()).code == 0
    uniq, fields = half_message(p, topic, 7)
    p.close()
    q = JavaProducer(proxy, SERIALIZE_JSON)
    try:
        beat["clientID"] = "127.0.0.1@java-tx-back"
        assert q.request(C.HEART_BEAT, {}, json.dumps(beat).encode()).code == 0
        while True:                                     # checks of the other test's group members may come first
            check = q.next_check()
            if check.ext_fields["transactionId"] == uniq:
                break
        end(q, uniq, None, ROLLBACK, from_check=True, table_offset=check.ext_fields["tranStateTableOffset"],
            phys=check.ext_fields["commitLogOffset"])
    finally:
        q.close()
