"""Soak and overload tests (issue 16, "Soak and overload"), slow tier only.

One command runs them all::

    python -m pytest -q -s -m slow tests/soak

Four scenarios, each against a real broker group (nameserver, broker, reput, flush, cleaner as
processes on 127.0.0.1, :class:`rmq.testing.Cluster`) driven through the public client API by a
few worker processes (:mod:`tests.soak.worker`); each prints its figures in a few ``soak:`` /
``connections:`` / ``stall:`` / ``overload:`` lines and fails on any bad outcome:

* ``test_soak.py``: the produce capacity measured in the same run, then RMQ_SOAK_SECONDS at
  RMQ_SOAK_LOAD of it with PushConsumers keeping up: every actor's RSS and descriptors flat,
  no send error, consumer lag bounded, every acknowledged message consumed;
* ``test_connections.py``: RMQ_SOAK_CONNECTIONS client instances (Producers and PullConsumers,
  each its own connection) in RMQ_SOAK_CONNECTION_PROCS processes, all connected at once;
* ``test_stalled_consumer.py``: one of two consumer groups stops reading for
  RMQ_STALL_SECONDS under a steady load, then resumes and catches up;
* ``test_overload.py``: requests offered at RMQ_OVERLOAD_FACTOR times the capacity measured in
  the same run: SYSTEM_BUSY fast, accepted sends' p99 bounded, nothing acknowledged lost,
  recovery when the load drops.

The environment variables and their defaults (the issue's values) are listed in
:mod:`tests.soak.harness`; a short run validates the harness, e.g.
``RMQ_SOAK_SECONDS=60 RMQ_STALL_SECONDS=30 RMQ_OVERLOAD_SECONDS=20``.
"""
