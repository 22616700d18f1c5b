"""``rmq bench``: produce / consume / end-to-end benchmarks of a real broker group, with the
machine's ceilings (memcpy into mmap, append + fdatasync, raw pyzmq loopback) and peers
(Redis Streams, NATS JetStream) measured in the same run.

The broker-group machinery (client worker processes, the pyzmq ceilings, CPU meters) is
``bench/e2e.py`` of the source tree, imported from here (:func:`e2e`); this package adds
multi-process producers / consumers with progress reports, an HDR-style histogram, the
disk ceilings, the peers, and the ``rmq bench`` command group (:mod:`rmq.bench.cli`).
It needs a source checkout (``bench/`` and ``tests/integration/cluster.py``) to start its
own cluster; ``--namesrv`` runs against an existing one.
"""
from __future__ import annotations

import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def e2e():
    """``bench/e2e.py`` of the source tree, as module ``bench.e2e`` (spawned workers import
    it by that name too: multiprocessing passes ``sys.path`` to them)."""
    if not os.path.exists(os.path.join(ROOT, "bench", "e2e.py")):
        raise RuntimeError(f"rmq bench needs the source tree (bench/e2e.py under {ROOT})")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module("bench.e2e")
