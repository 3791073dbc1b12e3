"""Run by the delta-spark environment's Python (pyspark 4.2): what a Spark user does with a Delta table.

For each ``name=path`` argument: read the table with delta-spark, list ``DESCRIBE HISTORY`` and read
the version before the latest (``versionAsOf``); for the tables named in ``--maintain a,b`` also
``OPTIMIZE`` and ``VACUUM ... RETAIN 0 HOURS``, then read it again. Each read is written as Parquet under OUT/name/ (the caller compares it with what
``deltalake`` reads) and OUT/summary.json lists versions, history and the commands' metrics.
Imports nothing of faultwatch: it runs under another pyspark.
"""

from __future__ import annotations

import json
import os
import sys


def main(out: str, maintain: set[str], specs: list[str]) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("delta-spark-check")
        .config("spark.jars", os.environ["FAULTWATCH_DELTA_JARS"])
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        # Delta rebuilds a snapshot's state on spark.databricks.delta.snapshotPartitions (50) tasks,
        # and VACUUM and OPTIMIZE shuffle: a few small tables want one or two.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")  # dozens of tiny jobs: planning is the cost
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    summary: dict[str, object] = {"spark": spark.version}
    for spec in specs:
        name, path = spec.split("=", 1)
        summary[name] = check_table(spark, name, path, out, name in maintain)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    spark.stop()


def check_table(spark, name: str, path: str, out: str, maintain: bool) -> dict[str, object]:  # type: ignore[no-untyped-def]
    ref = f"delta.`{path}`"
    history = [r.asDict() for r in spark.sql(f"DESCRIBE HISTORY {ref}").select("version", "operation").collect()]
    latest = max(int(h["version"]) for h in history)
    spark.read.format("delta").load(path).write.parquet(os.path.join(out, name, "latest"))
    if latest > 0:
        before = spark.read.format("delta").option("versionAsOf", latest - 1).load(path)
        before.write.parquet(os.path.join(out, name, "before"))
    result: dict[str, object] = {"latest": latest, "history": history}
    if not maintain:
        return result
    optimize = spark.sql(f"OPTIMIZE {ref}").select("metrics.numFilesAdded", "metrics.numFilesRemoved").first()
    vacuum = spark.sql(f"VACUUM {ref} RETAIN 0 HOURS").count()
    spark.read.format("delta").load(path).write.parquet(os.path.join(out, name, "maintained"))
    detail = spark.sql(f"DESCRIBE DETAIL {ref}").select("numFiles", "minReaderVersion", "minWriterVersion").first()
    return {**result, "optimize": optimize.asDict(), "vacuum_rows": vacuum, "detail": detail.asDict()}


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--maintain":
        sys.exit("usage: check.py OUT --maintain NAME[,NAME...] NAME=PATH...")
    main(sys.argv[1], set(sys.argv[3].split(",")), sys.argv[4:])
