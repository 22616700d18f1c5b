"""Claims of README.md's HA section that had no test (issue 19, item 10), with real processes and
the ``rmq admin`` CLI: the broker-side ``slaveReadEnable`` redirect of lagging consumers (and
``updateBrokerConfig`` / ``getBrokerConfig`` of it at runtime), a promotion refused while a
reachable master is ahead, and the promoted role kept in ``config/haRole.json`` across a
restart of the group."""
import json
import os
import signal

import pytest
from click.testing import CliRunner

from rmq import PullConsumer
from rmq.cli import main
from rmq.client.consumer import MessageQueue
from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from tests.integration.test_broker import pull, wait_for
from tests.integration.test_ha import create_topic, fill, runtime, wait_replicated
from tests.integration.test_ha import pair  # noqa: F401  (the master / slave fixture)

pytestmark = pytest.mark.integration

WAIT_S = 60


def admin(ns, *args):
    r = CliRunner().invoke(main, ["admin", "-n", ns, "--json", *args])
    return r.exit_code, r.output, r.stderr if hasattr(r, "stderr") else ""


def replicated_pair(pair, c, topic, n, queues, **master_conf):  # noqa: F811
    """A master and its slave, ``n`` messages of ``topic`` on the master, replicated, and the
    topic served by the slave (it syncs the master's topic configs as RocketMQ's
    SlaveSynchronize does; until then a consumer sent there gets TOPIC_NOT_EXIST)."""
    master = pair(**master_conf)
    slave = pair(master=master, slaveSyncInterval="500")   # the new topic reaches it in 0.5 s, not 10 s
    wait_for(lambda: runtime(c, master.broker_addr)["haSlaves"], WAIT_S)
    create_topic(c, master.broker_addr, topic, queues)
    fill(c, master.broker_addr, topic, n, queues=queues)
    wait_replicated(c, master, slave, WAIT_S)
    wait_for(lambda: pull(c, slave.broker_addr, topic, 0, 0).code == ResponseCode.SUCCESS, WAIT_S)
    return master, slave


def test_slave_read_enable_sends_a_lagging_consumer_to_the_slave(pair):  # noqa: F811
    with RemotingClient() as c:
        # accessMessageInMemoryMaxRatio=0: every read below the CommitLog's end counts as "not in memory"
        master, slave = replicated_pair(pair, c, "Lag", 50, 1, slaveReadEnable="true",
                                        accessMessageInMemoryMaxRatio="0")
        r = pull(c, master.broker_addr, "Lag", 0, 0)
        assert r.code == ResponseCode.SUCCESS and r.fields["suggestWhichBrokerId"] == 1
        # the client follows the suggestion: its next pulls are served by the slave
        with PullConsumer(master.namesrv_addr, group="lagging") as pc:
            mq = MessageQueue("Lag", "broker-a", 0)
            before = runtime(c, slave.broker_addr)["getMessageTotal"]
            offset, pulls = 0, 0
            while offset < 50 and pulls < 200:
                offset = pc.pull(mq, "*", offset=offset, max_nums=10).next_begin_offset
                pulls += 1
            assert offset == 50
            assert runtime(c, slave.broker_addr)["getMessageTotal"] > before
        # turned off at runtime through the CLI: the master keeps the consumer
        code, out, _ = admin(master.namesrv_addr, "updateBrokerConfig", "-b", master.broker_addr,
                             "-k", "slaveReadEnable", "-v", "false")
        assert code == 0, out
        code, out, _ = admin(master.namesrv_addr, "getBrokerConfig", "-b", master.broker_addr)
        assert code == 0 and json.loads(out)["config"]["slaveReadEnable"] == "false", out
        r = pull(c, master.broker_addr, "Lag", 0, 0)
        assert r.code == ResponseCode.SUCCESS and r.fields["suggestWhichBrokerId"] == 0
        # a key outside the runtime allow-list is refused and changes nothing
        code, out, _ = admin(master.namesrv_addr, "updateBrokerConfig", "-b", master.broker_addr,
                             "-k", "storePathRootDir", "-v", "/tmp/elsewhere")
        assert code != 0
        code, out, _ = admin(master.namesrv_addr, "getBrokerConfig", "-b", master.broker_addr)
        assert json.loads(out)["config"]["storePathRootDir"] == master.store_path


def test_promotion_refused_while_a_reachable_master_is_ahead(pair):  # noqa: F811
    """The slave's ha actor is hung (SIGSTOP), so its last report says "caught up" while the live
    master moves on: the broker asks the master itself before promoting (found by this test: it
    used to trust the stale report and promoted a slave 20 messages behind a live master)."""
    with RemotingClient() as c:
        master, slave = replicated_pair(pair, c, "Ahead", 20, 2)
        ha = slave.procs["ha"].pid
        os.kill(ha, signal.SIGSTOP)                 # the slave stops receiving; the master moves on
        try:
            fill(c, master.broker_addr, "Ahead", 20, queues=2, prefix=b"n")
            assert runtime(c, master.broker_addr)["commitLogMaxOffset"] > \
                runtime(c, slave.broker_addr)["commitLogMaxOffset"]
            code, out, err = admin(master.namesrv_addr, "promoteSlave", "-b", slave.broker_addr, "-w", "5000")
        finally:
            os.kill(ha, signal.SIGCONT)
        assert code != 0, out
        assert runtime(c, slave.broker_addr)["brokerRole"] == "SLAVE"
        assert runtime(c, master.broker_addr)["brokerRole"] == "ASYNC_MASTER"
        print(f"\npromotion refused: {(out + err).strip()[-300:]}")


def test_promoted_role_is_kept_in_ha_role_json_across_a_restart(pair):  # noqa: F811
    with RemotingClient() as c:
        master, slave = replicated_pair(pair, c, "Kept", 30, 2)
        master.kill_group()
        code, out, _ = admin(master.namesrv_addr, "promoteSlave", "-b", slave.broker_addr, "--role", "SYNC_MASTER")
        assert code == 0, out
        status = json.loads(out)["status"]
        assert status["brokerRole"] == "SYNC_MASTER"
        epoch = runtime(c, slave.broker_addr)["haEpoch"]
        role_file = os.path.join(slave.store_path, "config", "haRole.json")
        assert os.path.exists(role_file)
        slave.stop_group()
        slave.start_group()                         # same broker.conf: brokerRole=SLAVE, brokerId=1
        t = runtime(c, slave.broker_addr)
        assert (t["brokerRole"], t["brokerId"], t["haEpoch"]) == ("SYNC_MASTER", 0, epoch), t
        r = pull(c, slave.broker_addr, "Kept", 0, 0)
        assert r.code == ResponseCode.SUCCESS
