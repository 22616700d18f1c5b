"""The Arrow conversions of the Spark source: :mod:`rmq.arrow` (kept there so that
``PullConsumer.poll_arrow`` needs pyarrow but not pyspark); re-exported under this name."""
from rmq.arrow import (SCHEMA_DDL, source_schema_ddl, arrow_schema, messages_to_batch, pages_to_batch, RawPage, BODY_BYTES, column)

__all__ = ["SCHEMA_DDL", "source_schema_ddl", "arrow_schema", "messages_to_batch", "pages_to_batch", "RawPage", "BODY_BYTES", "column"]
