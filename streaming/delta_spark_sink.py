"""The ``delta-spark`` writer (``storage.writer = "delta-spark"``): each table's rows of a micro-batch
appended by Delta's own Spark writer, exactly once.

Everything before the commit is the ``deltalake`` writer's (:class:`streaming.delta_sink.RoutedDeltaWriter`):
the Kafka readers, the executors or the driver write a batch's rows as Parquet files. Instead of
committing those files with ``deltalake``, this writer hands them to delta-spark as Spark users
write Delta from a stream's ``foreachBatch``: ``df.write.format("delta").mode("append")`` with
the options ``txnAppId`` (the query's app id) and ``txnVersion`` (the micro-batch id). Delta skips a
write whose transaction its log already holds, so a batch replayed after a kill adds nothing twice.
delta-spark writes the rows into files of its own (with its statistics), and the staged files are
deleted once the table's commit holds them; a kill in between leaves them as orphans for VACUUM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.tables import table
from streaming.delta_sink import DataFile, RoutedDeltaWriter, _check_columns

log = logging.getLogger(__name__)


class DeltaSparkWriter(RoutedDeltaWriter):
    """:class:`RoutedDeltaWriter` whose per-table commit is a delta-spark append of the staged files."""

    def _commit_table(self, name: str, mine: list[DataFile], batch_id: int, now_ms: int) -> tuple[str, int | None]:
        dt = self._table(name)  # the replay check through the loaded log: no Spark job for a replay
        if self._holds(dt, batch_id):
            log.info("%s: batch %d already in %s (replay): skipped", self.app_id, batch_id, name)
            return name, None
        _check_columns(dt, name, table(name).columns)
        path = str(Path(self.root) / name)
        spark = _session()
        frame = staged_frame(spark, path, name, mine)
        (frame.write.format("delta").mode("append")
         .option("txnAppId", self.app_id).option("txnVersion", str(batch_id))
         .option("userMetadata", f"faultwatch {self.app_id} batch {batch_id}")
         .save(path))
        for f in mine:  # in the table now as delta-spark's own files
            (Path(path) / f.path).unlink(missing_ok=True)
        return name, sum(f.num_records for f in mine)


def staged_frame(spark: Any, path: str, name: str, files: Sequence[DataFile]) -> Any:
    """The rows of a table's staged Parquet files as one DataFrame in the table's column order.

    The files hold the data columns; the values of partition columns are in each file's
    ``partition_values`` (as in a Delta log), so files are read per partition and given them.
    """
    from pyspark.sql import functions as F

    spec = table(name)
    schema = spark.read.format("delta").load(path).schema
    data_schema = type(schema)([f for f in schema.fields if f.name not in spec.partition_by])
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for f in files:
        groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(str(Path(path) / f.path))
    frames = []
    for values, paths in groups.items():
        frame = spark.read.schema(data_schema).parquet(*paths)
        for column, value in values:
            frame = frame.withColumn(column, F.lit(value).cast(schema[column].dataType))
        frames.append(frame.select(*[f.name for f in schema.fields]))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _session() -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    return spark if spark is not None else SparkSession.builder.getOrCreate()
