"""``rmq bench``: produce / consume / end-to-end benchmarks of a real broker group, with the
machine's ceilings (memcpy into mmap, append + fdatasync, raw pyzmq loopback) and peers
(Redis Streams, NATS JetStream) measured in the same run.

Modules: :mod:`rmq.bench.e2e` (the broker-group machinery: client worker processes, the pyzmq
ceilings, CPU meters; also ``python -m rmq.bench.e2e``), :mod:`rmq.bench.workers`
(multi-process producers / consumers with progress reports), :mod:`rmq.bench.hist` (an
HDR-style histogram), :mod:`rmq.bench.ceilings`, :mod:`rmq.bench.peers`, :mod:`rmq.bench.ha`
(master / slave replication and the roles' send cost), :mod:`rmq.bench.runner`,
:mod:`rmq.bench.report` and the ``rmq bench`` command group (:mod:`rmq.bench.cli`).

Everything is in the installed package: the bench starts its own broker group with
:class:`rmq.testing.Cluster` in a temporary store (no source checkout needed), or runs
against an existing one with ``--namesrv``.
"""
