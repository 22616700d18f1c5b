"""One store, two protocols, and Spark: messages the official RocketMQ C++ client (PyPI
``rocketmq==0.4.4``, tests/integration/cpp_client.py) sends through ``rmq proxy`` are read by the
``rmq`` Spark source with every field the client set: body (the client zlib-compresses bodies over
4 KiB; the source inflates them), tag, keys, user property, the message id and the queue offset
the send reported (issue 14: "the same messages are visible ... to the Spark source")."""
import pytest

from tests.integration.cpp_client import BIG_EVERY, body_of
from tests.integration.proxy_helpers import cpp, running_proxy
from tests.spark.util import BROKER, create_topic, wait_total

pytestmark = [pytest.mark.spark, pytest.mark.integration]

N = 400
QUEUES = 4


def test_spark_reads_what_the_cpp_client_sent_through_the_proxy(spark, cluster):
    create_topic(cluster, "CPPSPARK", QUEUES)
    with running_proxy(cluster.namesrv_addr) as proxy:
        sent = cpp("produce", proxy, "CPPSPARK", N)["sent"]
    assert [s["status"] for s in sent] == [0] * N                      # SEND_OK
    wait_total(cluster, "CPPSPARK", N)
    rows = (spark.read.format("rmq").option("nameServer", cluster.namesrv_addr).option("topic", "CPPSPARK")
            .load().collect())
    assert len(rows) == N
    by_id = {r.msg_id: r for r in rows}
    assert len(by_id) == N, "every message once"
    assert {r.queue_id for r in rows} == set(range(QUEUES))          # the client spread them over the queues
    for s in sent:
        i, r = s["i"], by_id[s["msg_id"]]
        assert (r.topic, r.broker_name) == ("CPPSPARK", BROKER)
        assert r.queue_offset == s["offset"], f"message {i}: the offset the send reported"
        assert bytes(r.body) == body_of(i), f"message {i}: body"
        assert (r.tags, r.keys) == (f"T{i % 3}", f"k{i}")
        assert r.properties["seq"] == str(i)
    assert sum(len(bytes(r.body)) > 4096 for r in rows) == N // BIG_EVERY   # the compressed ones, inflated
