"""SYNC_FLUSH over the wire: group commit by the broker itself for a loop turn's small group, by
the flush actor for a larger one (FLUSH_DISK_TIMEOUT without it)."""
import time

import pytest

from rmq.client.remoting import RemotingClient
from rmq.actors.broker import SYNC_FLUSH_INLINE_MAX_BYTES
from rmq.protocol import ResponseCode
from rmq.testing import broker_runtime_info
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
            # no flush actor: a small send is made durable by the broker's own group commit ...
            assert c.procs.pop("flush").terminate() == 0
            r = send(rc, c.broker, "Sync", b"small", 0)
            assert r.code == ResponseCode.SUCCESS, r.remark
            info = broker_runtime_info(c.broker_addr, rc)
            assert int(info["flushedOffset"]) == int(info["commitLogMaxOffset"]), info
            # ... a group larger than SYNC_FLUSH_INLINE_MAX_BYTES is left to the flush actor: stored,
            # never confirmed durable without it
            big = b"B" * (SYNC_FLUSH_INLINE_MAX_BYTES + 1024)
            t0 = time.monotonic()
            r = send(rc, c.broker, "Sync", big, 0, timeout_ms=SYNC_FLUSH_TIMEOUT_MS + 30_000)
            assert r.code == ResponseCode.FLUSH_DISK_TIMEOUT
            assert time.monotonic() - t0 >= SYNC_FLUSH_TIMEOUT_MS / 1000 * 0.9     # it waited for the flush
            # under SYNC_FLUSH reput dispatches only what is flushed: the small one, not the big one
            got = wait_for(lambda: (lambda r: r if r.code == ResponseCode.SUCCESS else None)(
                pull(rc, c.broker, "Sync", 0, 20)))
            assert got.fields["nextBeginOffset"] == 21
            assert pull(rc, c.broker, "Sync", 0, 21).code == ResponseCode.PULL_NOT_FOUND
            c.procs["flush"] = ActorProcess(["-m", "rmq.actors.flush", "--store-path", c.store_path,
                                             "-c", c.conf_path])
            msgs = wait_for(lambda: (lambda r: r if r.code == ResponseCode.SUCCESS else None)(
                pull(rc, c.broker, "Sync", 0, 21)))
            assert msgs.fields["nextBeginOffset"] == 22
    finally:
        c.close()


def test_a_failed_msync_in_the_broker_group_commit_stops_acknowledgements(tmp_path):
    """The broker's own group commit hits a failing disk (an injected msync EIO, the flush actor
    stopped so only the broker msyncs the CommitLog): the send waiting for it gets
    FLUSH_DISK_TIMEOUT [FLUSH_FAILED] naming the broker's group commit, never SUCCESS, and every
    later send is refused (SERVICE_NOT_AVAILABLE) until a restart."""
    import os
    c = Cluster(tmp_path / "store",
                conf={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": str(SYNC_FLUSH_TIMEOUT_MS)},
                env={**os.environ, "RMQ_FAILPOINT": "msync_eio:after=20:path=/commitlog/"})
    try:
        assert c.procs.pop("flush").terminate() == 0
        with RemotingClient() as rc:
            codes = []
            for i in range(200):
                r = send(rc, c.broker, "SyncEio", b"e%d" % i, 0, timeout_ms=SYNC_FLUSH_TIMEOUT_MS + 30_000)
                codes.append(r.code)
                if r.code != ResponseCode.SUCCESS:
                    failed = r
                    break
            else:
                raise AssertionError("the injected msync EIO never surfaced")
            assert failed.code == ResponseCode.FLUSH_DISK_TIMEOUT, (failed.code, failed.remark)
            assert "[FLUSH_FAILED]" in failed.remark and "group commit in the broker" in failed.remark, failed.remark
            later = [send(rc, c.broker, "SyncEio", b"after", 0).code for _ in range(3)]
            assert later == [ResponseCode.SERVICE_NOT_AVAILABLE] * 3, later
            info = broker_runtime_info(c.broker_addr, rc)
            assert int(info["flushedOffset"]) < int(info["commitLogMaxOffset"]), info
    finally:
        c.close()
