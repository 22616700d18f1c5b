"""A broker group (nameserver + broker + reput + flush on loopback) holding a filled topic: the
setup shared by ``bench_consumer.py`` and ``bench_spark.py``.

The topic gets ``queues`` queues and ``n_messages`` messages of ``body_size`` bytes, sent with
SEND_BATCH_MESSAGE in batches of :data:`SEND_BATCH` round robin over the queues (SYSTEM_BUSY
answers are retried), and the constructor returns once reput has dispatched them all
(``ends``: queue -> max offset).  The broker lifts its per-pull caps to 1024 messages / 4 MiB
(RocketMQ's defaults, 32 / 256 KiB, would bound every pull-based reader).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable, Optional

from rmq._core import commitlog as cl
from rmq.bench.e2e import BENCH_INDEX_CONF
from rmq.client.consumer_api import ConsumerAPI
from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode

SEND_BATCH = 256                 # messages per SEND_BATCH_MESSAGE while filling
TOPIC = "bench"


class FilledCluster:
    """One broker group with ``n_messages`` stored in ``topic``.

    ``props_of(i)`` gives message ``i``'s properties (default: tag ``t``).  Attributes:
    ``namesrv`` (host:port), ``cluster`` (:class:`tests.integration.cluster.Cluster`),
    ``mqs`` (the topic's MessageQueues), ``ends`` (MessageQueue -> max queue offset).

    Raises
    ------
    AssertionError
        The broker refused the topic or a batch, or dispatch did not finish in ``timeout_s``.
    """

    def __init__(self, prefix: str, n_messages: int, queues: int = 8, body_size: int = 100,
                 props_of: Optional[Callable[[int], dict]] = None, topic: str = TOPIC, timeout_s: float = 600.0):
        from tests.integration.cluster import Cluster
        self.dir = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("RMQ_BENCH_DIR") or None)
        self.cluster = Cluster(os.path.join(self.dir, "store"), conf={
            "mappedFileSizeCommitLog": str(256 << 20), "mappedFileSizeConsumeQueue": str(300_000 * 20),
            "maxTransferCountOnMessageInMemory": "1024", "maxTransferBytesOnMessageInMemory": str(4 << 20),
            **BENCH_INDEX_CONF})
        self.namesrv = self.cluster.namesrv_addr
        self.n = n_messages
        self.topic = topic
        self.queues = queues
        try:
            self._fill(b"x" * body_size, props_of, timeout_s)
        except BaseException:
            self.close()
            raise

    def _fill(self, body: bytes, props_of, timeout_s: float) -> None:
        same = cl.encode_batch([(body, cl.encode_properties({"TAGS": "t"}), 0)] * SEND_BATCH) if props_of is None \
            else None
        with RemotingClient() as c:
            r = c.invoke(self.cluster.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
                "topic": self.topic, "readQueueNums": self.queues, "writeQueueNums": self.queues}))
            assert r.code == ResponseCode.SUCCESS, r.remark
            sent = q = 0
            while sent < self.n:
                k = min(SEND_BATCH, self.n - sent)
                if same is not None and k == SEND_BATCH:
                    batch = same
                else:
                    props = props_of or (lambda i: {"TAGS": "t"})
                    batch = cl.encode_batch([(body, cl.encode_properties(props(sent + i)), 0) for i in range(k)])
                r = c.invoke(self.cluster.broker, Frame(RequestCode.SEND_BATCH_MESSAGE, fields={
                    "topic": self.topic, "queueId": q % self.queues}, bodies=[batch]), 10_000)
                if r.code == ResponseCode.SYSTEM_BUSY:
                    time.sleep(0.01)
                    continue
                assert r.code == ResponseCode.SUCCESS, r.remark
                sent += k
                q += 1
        api = ConsumerAPI(self.namesrv)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                route = api.fetch_route(self.topic)
                if route is not None:
                    self.mqs = route.subscribe_queues()
                    self.ends = {mq: api.max_offset(mq) for mq in self.mqs}
                    if sum(self.ends.values()) >= self.n:
                        return
                assert time.monotonic() < deadline, "dispatch did not finish"
                time.sleep(0.05)
        finally:
            api.close()

    def raw_pull(self, decode: bool) -> int:
        """Read the whole topic with bare PULL_MESSAGE requests (maxMsgNums 1024, queue after queue);
        ``decode``: decode each page with ``decode_records``.  Returns messages read: what the
        broker serves one client, the ceiling of the client-side readers."""
        n = 0
        with RemotingClient() as c:
            for mq in self.mqs:
                off = 0
                while off < self.ends[mq]:
                    r = c.invoke(self.cluster.broker, Frame(RequestCode.PULL_MESSAGE, fields={
                        "consumerGroup": "raw", "topic": self.topic, "queueId": mq.queue_id, "queueOffset": off,
                        "maxMsgNums": 1024, "sysFlag": 0, "subscription": "*"}))
                    assert r.code == ResponseCode.SUCCESS, r.remark
                    nxt = r.fields["nextBeginOffset"]
                    n += len(cl.decode_records(r.bodies[0])) if decode else nxt - off
                    off = nxt
        return n

    def close(self) -> None:
        self.cluster.close()
        shutil.rmtree(self.dir, ignore_errors=True)
