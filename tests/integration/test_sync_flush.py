"""SYNC_FLUSH over the wire: group commit by the flush actor, FLUSH_DISK_TIMEOUT without it."""
import time

import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.conftest import ActorProcess
from tests.integration.test_broker import pull, pull_all, send, wait_for

pytestmark = pytest.mark.integration


# generous (RocketMQ's default is 5 s): the flush actor, another process on a shared machine, must
# always make it with the actor running; without it every SYNC_FLUSH send waits this long
SYNC_FLUSH_TIMEOUT_MS = 3000


def test_sync_flush_acks_only_durable_and_times_out_without_flush(tmp_path):
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH",
                                          "syncFlushTimeout": str(SYNC_FLUSH_TIMEOUT_MS)})
    try:
        with RemotingClient() as rc:
            for i in range(20):
                r = send(rc, c.broker, "Sync", b"s%d" % i, 0)
                assert r.code == ResponseCode.SUCCESS, r.remark
            msgs = wait_for(lambda: (lambda m: m if len(m) == 20 else None)(pull_all(rc, c.broker, "Sync", 0)[0]))
            assert [m.body for m in msgs] == [b"s%d" % i for i in range(20)]
            # no flush actor: the send is stored but never confirmed durable
            assert c.procs.pop("flush").terminate() == 0
            t0 = time.monotonic()
            r = send(rc, c.broker, "Sync", b"late", 0, timeout_ms=SYNC_FLUSH_TIMEOUT_MS + 30_000)
            assert r.code == ResponseCode.FLUSH_DISK_TIMEOUT
            assert time.monotonic() - t0 >= SYNC_FLUSH_TIMEOUT_MS / 1000 * 0.9     # it waited for the flush
            # under SYNC_FLUSH reput dispatches only what is flushed: not visible yet
            assert pull(rc, c.broker, "Sync", 0, 20).code == ResponseCode.PULL_NOT_FOUND
            c.procs["flush"] = ActorProcess(["-m", "rmq.actors.flush", "--store-path", c.store_path,
                                             "-c", c.conf_path])
            msgs = wait_for(lambda: (lambda r: r if r.code == ResponseCode.SUCCESS else None)(
                pull(rc, c.broker, "Sync", 0, 20)))
            assert msgs.fields["nextBeginOffset"] == 21
    finally:
        c.close()
