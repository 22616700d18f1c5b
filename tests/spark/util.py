"""Helpers of the Spark tests: topics, producing, offsets over the wire."""
import time

from rmq.client.consumer_api import ConsumerAPI
from rmq.client.message import Message, MessageQueue
from rmq.client.producer import Producer
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.spark.conftest import wait_for

BROKER = "broker-a"


def create_topic(cluster, topic, queues):
    """Create (or widen) ``topic`` on the broker and wait until the NameServer routes all its queues."""
    with RemotingClient() as c:
        r = c.invoke(cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues}))
        assert r.code == ResponseCode.SUCCESS, r.remark
    api = ConsumerAPI(cluster.namesrv_addr)
    try:
        wait_for(lambda: (lambda r: r is not None and len(r.subscribe_queues()) == queues)(api.fetch_route(topic)),
                 what=f"route of {topic} with {queues} queues")
    finally:
        api.close()


def produce(cluster, msgs):
    """Send ``(Message, queue_id)`` pairs in order; returns their SendResults."""
    with Producer(cluster.namesrv_addr, "spark-test-pg") as p:
        futs = [p.send_async(m, queue=MessageQueue(m.topic, BROKER, q)) for m, q in msgs]
        p.flush()
        return [f.result() for f in futs]


def max_offsets(cluster, topic, queues):
    api = ConsumerAPI(cluster.namesrv_addr)
    try:
        api.fetch_route(topic)
        return [api.max_offset(MessageQueue(topic, BROKER, q)) for q in range(queues)]
    finally:
        api.close()


def wait_dispatched(cluster, topic, queues, total):
    wait_for(lambda: sum(max_offsets(cluster, topic, queues)) >= total, what=f"dispatch of {total} to {topic}")


def wait_total(cluster, topic, total):
    """Wait until the routed queues of ``topic`` (however many) hold ``total`` messages."""
    api = ConsumerAPI(cluster.namesrv_addr)

    def count():
        r = api.fetch_route(topic)
        return r is not None and sum(api.max_offset(mq) for mq in r.subscribe_queues()) >= total
    try:
        wait_for(count, what=f"{total} messages in {topic}")
    finally:
        api.close()


def msg(topic, i, tags=None, keys=None, props=None, body=None):
    return Message(topic, body if body is not None else b"body-%06d" % i, tags=tags, keys=keys, properties=props)


def now_ms():
    return int(time.time() * 1000)


CLEANING_FILE_SIZE = 64 * 1024                   # bytes: the cleaning cluster's CommitLog file size


def cleaning_cluster(tmp_path):
    """A broker group whose cleaner deletes every CommitLog file but the newest, every 200 ms, at
    any hour (fileReservedTime 0, 64 KiB files): for data-loss tests."""
    from tests.integration.cluster import Cluster
    conf = {"mappedFileSizeCommitLog": str(CLEANING_FILE_SIZE), "fileReservedTime": "0",
            "deleteWhen": ";".join(f"{h:02d}" for h in range(24)), "cleanResourceInterval": "200",
            "cleanResourceInitialDelay": "0"}
    return Cluster(tmp_path / "store", conf=conf, with_cleaner=True)


def cleaned_min_offset(cluster, topic, above=0, timeout_s=30):
    """Once the cleaner has left only the newest CommitLog file and queue 0's min offset has stayed
    put over 8 looks (reput cleans ConsumeQueue files after the CommitLog's; a file cleaned between
    a read's plan and its pulls would be data loss too), that min offset (> ``above``)."""
    from rmq.testing import broker_runtime_info

    def only_newest_left():
        # the file count alone is not enough: a pre-allocated next file makes "2 files" look done
        # while one full file is still to go, and its later deletion is data loss to a read
        info = broker_runtime_info(cluster.broker_addr)
        lo, hi = int(info["commitLogMinOffset"]), int(info["commitLogMaxOffset"])
        return hi > 0 and lo == (hi - 1) // CLEANING_FILE_SIZE * CLEANING_FILE_SIZE
    wait_for(only_newest_left, timeout_s, what="the cleaner deletes all but the newest CommitLog file")
    api = ConsumerAPI(cluster.namesrv_addr)
    try:
        api.fetch_route(topic)
        mq = MessageQueue(topic, BROKER, 0)
        seen: list = []

        def settled():
            seen.append(api.min_offset(mq))
            return seen[-1] if len(seen) >= 8 and seen[-1] > above and len(set(seen[-8:])) == 1 else None
        return wait_for(lambda: settled() or time.sleep(0.2), timeout_s, what="the min offset settles")
    finally:
        api.close()
