"""send_async throughput by default batch size: the rows behind ``DEFAULT_BATCH_SIZE``
(rmq/client/producer_request.py; results in bench/results/client.md, "Stop 40" and "Stop 57").

One embedded cluster (ASYNC_FLUSH, 512 MiB CommitLog files); for each round, body size and batch
size (KiB) in turn: ``rmq.bench.client.send_async`` and ``aio_send`` (rmq.aio), unordered and ordered (sharding
keys), with the module default patched (``ProducerOptions`` reads it when a producer is made), so
every other option is the public default.  Rounds alternate the
sizes, so a VM that speeds up or slows down during the run shows in every column alike.

    python bench/batch_size_rows.py [messages=200000] [bodies=100,1024] [batch KiB=16,64,256] [rounds=3]
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import rmq.client.producer_request as producer_module
from rmq.bench import client as C
from rmq.bench import e2e as E
from rmq.testing import Cluster


def main(argv: list) -> None:
    n = int(argv[0]) if argv else 200_000
    sizes = [int(x) for x in (argv[1] if len(argv) > 1 else "100,1024").split(",")]
    batches = [int(x) for x in (argv[2] if len(argv) > 2 else "16,64,256").split(",")]
    rounds = int(argv[3]) if len(argv) > 3 else 3
    tmp = tempfile.mkdtemp(prefix="rmq-bench-batch-")
    atexit.register(shutil.rmtree, tmp, True)
    conf = E.cluster_conf(E.Params(file_size=512 << 20, batch=1000), "ASYNC_FLUSH")
    default = producer_module.DEFAULT_BATCH_SIZE
    try:
        with Cluster(os.path.join(tmp, "store"), conf=conf) as cl:
            for r in range(rounds):
                for size in sizes:
                    for kib in batches:
                        producer_module.DEFAULT_BATCH_SIZE = kib * 1024
                        x = C.send_async(cl.namesrv_addr, f"SA{size}", size, n)
                        o = C.send_async(cl.namesrv_addr, f"SO{size}", size, n, ordered=True)
                        ax = C.aio_send(cl.namesrv_addr, f"AA{size}", size, n)
                        ao = C.aio_send(cl.namesrv_addr, f"AO{size}", size, n, ordered=True)
                        print(f"round {r} body {size} B batch {kib} KiB: send_async "
                              f"{x['msgs'] / x['seconds']:,.0f} msgs/s, ordered {o['msgs'] / o['seconds']:,.0f}; "
                              f"rmq.aio {ax['msgs'] / ax['seconds']:,.0f}, ordered {ao['msgs'] / ao['seconds']:,.0f}",
                              flush=True)
    finally:
        producer_module.DEFAULT_BATCH_SIZE = default


if __name__ == "__main__":
    main(sys.argv[1:])
