"""Cleaner actor expiry over the wire, and NameServer registration / expiry of a real broker."""
import os

import msgpack
import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import Frame, RequestCode, ResponseCode
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, send, wait_for

pytestmark = pytest.mark.integration


def test_cleaner_deletes_expired_files_and_reads_move(tmp_path):
    # waitTimeMillsInSendQueue: the raw sends below are never retried; under load a scheduling gap of
    # the broker could age one past the default 200 ms and get it SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE]
    conf = {"mappedFileSizeCommitLog": str(64 * 1024), "fileReservedTime": "0",
            "deleteWhen": ";".join(f"{h:02d}" for h in range(24)), "cleanResourceInterval": "200",
            "cleanResourceInitialDelay": "0", "waitTimeMillsInSendQueue": "600000"}
    c = Cluster(tmp_path / "store", conf=conf, with_cleaner=True)
    try:
        with RemotingClient() as rc:
            for i in range(400):
                assert send(rc, c.broker, "Exp", b"e" * 600, 0).code == ResponseCode.SUCCESS
            commitlog = os.path.join(c.store_path, "commitlog")
            # everything but the newest file goes (fileReservedTime 0 h, every hour is deleteWhen)
            wait_for(lambda: len([n for n in os.listdir(commitlog) if not n.endswith(".tmp")]) <= 2, 60)

            def read_after_move():
                # offset 0 is gone: the broker says where the queue starts now, and a read from
                # there succeeds (retried: the cleaner may still be deleting the next file)
                r = pull(rc, c.broker, "Exp", 0, 0)
                if r.code != ResponseCode.PULL_OFFSET_MOVED:
                    return None
                nxt = r.fields["nextBeginOffset"]
                assert nxt > 0 and r.fields["minOffset"] == nxt
                r = pull(rc, c.broker, "Exp", 0, nxt)
                return r if r.code == ResponseCode.SUCCESS else None
            wait_for(read_after_move, 60)
            cq_dir = os.path.join(c.store_path, "consumequeue", "Exp", "0")
            assert wait_for(lambda: len(os.listdir(cq_dir)) >= 1)
    finally:
        c.close()


def route(rc, namesrv, topic):
    return rc.invoke(namesrv, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic}))


def test_broker_registers_and_expires_when_killed(tmp_path):
    c = Cluster(tmp_path / "store", namesrv_args=("--scan-interval-ms", "100", "--broker-expired-ms", "1500"))
    try:
        ns = c.namesrv.endpoint
        with RemotingClient() as rc:
            assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={
                "topic": "Routed", "readQueueNums": 4, "writeQueueNums": 4})).code == 0
            r = wait_for(lambda: (lambda r: r if r.code == 0 else None)(route(rc, ns, "Routed")))
            data = msgpack.unpackb(bytes(r.bodies[0]))
            assert data["queueDatas"][0]["writeQueueNums"] == 4
            assert data["brokerDatas"][0]["brokerAddrs"]["0"] == c.broker_addr
            c.kill_group()
            wait_for(lambda: route(rc, ns, "Routed").code == ResponseCode.TOPIC_NOT_EXIST, 60)
    finally:
        c.close()


def test_clean_stop_unregisters(tmp_path):
    c = Cluster(tmp_path / "store")
    try:
        with RemotingClient() as rc:
            assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={"topic": "Gone"})).code == 0
            wait_for(lambda: route(rc, c.namesrv.endpoint, "Gone").code == 0)
            assert c.stop_group()["broker"] == 0
            wait_for(lambda: route(rc, c.namesrv.endpoint, "Gone").code == ResponseCode.TOPIC_NOT_EXIST, 60)
    finally:
        c.close()


def test_a_restarted_nameserver_has_the_brokers_routes_again_within_half_the_register_period(tmp_path):
    """A NameServer keeps no state: after a restart it knows no broker until the broker registers
    again.  The broker registers on every (re)connection's handshake, not only every
    REGISTER_NAME_SERVER_PERIOD_MS (30 s), so routes are back well before the period."""
    from rmq.actors.broker import REGISTER_NAME_SERVER_PERIOD_MS
    c = Cluster(tmp_path / "store")
    try:
        with RemotingClient() as rc:
            assert rc.invoke(c.broker, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, fields={"topic": "Back"})).code == 0
            wait_for(lambda: route(rc, c.namesrv.endpoint, "Back").code == 0)
            port = c.namesrv_addr.rsplit(":", 1)[1]
            c.namesrv.kill()
            c.namesrv = c._actor(["-m", "rmq.actors.nameserver", "--listen-port", port, "--store-path", c.store_path])
            assert c.namesrv.endpoint.endswith(":" + port)
            wait_for(lambda: route(rc, c.namesrv.endpoint, "Back").code == 0, REGISTER_NAME_SERVER_PERIOD_MS / 2000)
    finally:
        c.close()
