"""SYNC_FLUSH over the wire: group commit by the flush actor, FLUSH_DISK_TIMEOUT without it."""
import time

import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.conftest import ActorProcess
from tests.integration.test_broker import pull, pull_all, send, wait_for

pytestmark = pytest.mark.integration


def test_sync_flush_acks_only_durable_and_times_out_without_flush(tmp_path):
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "400"})
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
            r = send(rc, c.broker, "Sync", b"late", 0)
            assert r.code == ResponseCode.FLUSH_DISK_TIMEOUT and time.monotonic() - t0 >= 0.35
            # under SYNC_FLUSH reput dispatches only what is flushed: not visible yet
            assert pull(rc, c.broker, "Sync", 0, 20).code == ResponseCode.PULL_NOT_FOUND
            c.procs["flush"] = ActorProcess(["-m", "rmq.actors.flush", "--store-path", c.store_path,
                                             "-c", c.conf_path])
            msgs = wait_for(lambda: (lambda r: r if r.code == ResponseCode.SUCCESS else None)(
                pull(rc, c.broker, "Sync", 0, 20)))
            assert msgs.fields["nextBeginOffset"] == 21
    finally:
        c.close()
