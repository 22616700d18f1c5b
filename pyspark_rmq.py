"""Auto-discovery shim: PySpark scans top-level ``pyspark_*`` modules for a ``DefaultSource``
(pyspark.sql.datasource lookup), so ``spark.read.format("rmq")`` works without
``rmq.spark.register(spark)`` once rmq is installed."""
from rmq.spark import RmqDataSource as DefaultSource  # noqa: F401

__all__ = ["DefaultSource"]
