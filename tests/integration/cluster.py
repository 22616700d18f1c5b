"""A broker group of real processes on loopback for integration tests: :class:`rmq.testing.Cluster`
(nameserver, broker, reput and flush; cleaner and ha on request; ``namesrv_addr`` joins another
cluster's NameServer, a slave), its children started in the source tree's root like every
actor of the tests."""
from rmq.testing import Cluster as _Cluster
from tests.integration.conftest import ROOT


class Cluster(_Cluster):
    def __init__(self, store_path, conf=None, with_namesrv=True, with_cleaner=False, namesrv_args=(),
                 with_ha=False, namesrv_addr=None, cwd=ROOT, env=None):
        super().__init__(store_path, conf=conf, with_namesrv=with_namesrv, with_cleaner=with_cleaner,
                         namesrv_args=namesrv_args, with_ha=with_ha, namesrv_addr=namesrv_addr, cwd=cwd, env=env)
