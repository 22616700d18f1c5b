#!/usr/bin/env python
"""Shim: the end-to-end bench lives in the package, :mod:`rmq.bench.e2e` (so ``rmq bench`` works
from an installed wheel).  ``import e2e`` / ``import bench.e2e`` give that very module (every
name, private helpers included), and ``python bench/e2e.py [options]`` runs its CLI::

    python bench/e2e.py --messages 300000 --json e2e.json    # = python -m rmq.bench.e2e ...
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # rmq without installing
    from rmq.bench.e2e import main

    sys.exit(main())
else:
    import rmq.bench.e2e as _e2e

    sys.modules[__name__] = _e2e
