"""PySpark connector of rmq: a Python DataSource named ``rmq`` (pyspark >= 4.2, < 5; pyarrow).

::

    import rmq.spark
    rmq.spark.register(spark)
    df = spark.read.format("rmq").option("nameServer", "127.0.0.1:9876").option("topic", "flights").load()

See :class:`RmqDataSource` for the options, the schema and the offsets.
"""
from __future__ import annotations

from rmq.spark.options import RmqOptionError
from rmq.spark.sink import DEDUP_PROPERTY, RmqSinkError
from rmq.spark.source import RmqDataSource
from rmq.spark.wire import RmqDataLossError, RmqSourceError

# Spark's Python data source look-up (pyspark.sql.worker.lookup_data_sources) registers the
# ``DefaultSource`` of every top-level ``pyspark_*`` module; a ``pyspark_rmq`` shim re-exports this.
DefaultSource = RmqDataSource

__all__ = ["register", "RmqDataSource", "DefaultSource", "RmqOptionError", "RmqSourceError", "RmqDataLossError",
           "RmqSinkError", "DEDUP_PROPERTY"]


def register(spark) -> None:
    """Register the ``rmq`` format with ``spark`` (a SparkSession); idempotent."""
    spark.dataSource.register(RmqDataSource)
