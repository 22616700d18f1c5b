"""A broker group of real processes on loopback for integration tests: nameserver,
broker, reput and flush (cleaner and ha on request), started in order (the supervisor's
order) on ephemeral ports.  ``namesrv_addr`` joins another cluster's NameServer (a slave)."""
import os

from tests.integration.conftest import ActorProcess


class Cluster:
    GROUP = ("broker", "reput", "flush", "cleaner", "ha")

    def __init__(self, store_path, conf=None, with_namesrv=True, with_cleaner=False, namesrv_args=(),
                 with_ha=False, namesrv_addr=None):
        self.store_path = str(store_path)
        self.conf_path = os.path.join(self.store_path, "broker.conf")
        os.makedirs(self.store_path, exist_ok=True)
        self.conf = {"brokerClusterName": "TestCluster", "brokerName": "broker-a",
                     "mappedFileSizeCommitLog": str(1024 * 1024), "mappedFileSizeConsumeQueue": str(20 * 1000),
                     "maxHashSlotNum": "1000", "maxIndexNum": "4000",
                     "maxTransferCountOnMessageInMemory": "1024",
                     "maxTransferBytesOnMessageInMemory": str(4 * 1024 * 1024)}
        self.conf.update(conf or {})
        with open(self.conf_path, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in self.conf.items()))
        self.with_cleaner = with_cleaner
        self.with_ha = with_ha
        if namesrv_addr:
            with_namesrv = False
        self.namesrv = ActorProcess(["-m", "rmq.actors.nameserver", "--listen-port", "0",
                                     "--store-path", self.store_path, *namesrv_args]) if with_namesrv else None
        self.namesrv_addr = self.namesrv.endpoint.replace("tcp://", "") if self.namesrv else (namesrv_addr or "")
        self.procs = {}
        self.start_group()

    def start_group(self):
        common = ["--store-path", self.store_path, "-c", self.conf_path]
        args = ["-m", "rmq.actors.broker", *common, "--listen-port", "0"]
        if self.namesrv_addr:
            args += ["--namesrv-addr", self.namesrv_addr]
        self.procs["broker"] = ActorProcess(args)
        self.broker = self.procs["broker"].endpoint
        self.broker_addr = self.broker.replace("tcp://", "")
        self.procs["reput"] = ActorProcess(["-m", "rmq.actors.reput", *common])
        self.procs["flush"] = ActorProcess(["-m", "rmq.actors.flush", *common])
        if self.with_cleaner:
            self.procs["cleaner"] = ActorProcess(["-m", "rmq.actors.cleaner", *common])
        if self.with_ha:
            self.procs["ha"] = ActorProcess(["-m", "rmq.actors.ha", *common])

    def stop_group(self):
        codes = {}
        for name in self.GROUP:
            p = self.procs.pop(name, None)
            if p is not None:
                codes[name] = p.terminate()
        return codes

    def kill_group(self):
        for name in self.GROUP:
            p = self.procs.pop(name, None)
            if p is not None:
                p.kill()

    def close(self):
        self.kill_group()
        if self.namesrv is not None:
            self.namesrv.kill()
