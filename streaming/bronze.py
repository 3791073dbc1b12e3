"""The bronze query: every event topic into its bronze table, everything invalid into quarantine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.config import Config
from streaming.kafka_source import output_tables, read_events

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter

KINDS = ("send_result", "consumer_progress", "group_membership")
NAME = "bronze"


def build_bronze(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    from streaming.delta_sink import app_id, file_tag, write_routed

    # The reader tasks write the Parquet files themselves (the source's write mode) and pass on only
    # their lists, which the sink commits: no event crosses from Python to the JVM and back. Those
    # lists are all the sink receives, so it collects them to the driver (``collect``) rather than
    # run a write task, and its second Python worker, per reader task.
    events = read_events(spark, cfg, KINDS, NAME, chunked=True, write_tag=file_tag(app_id(cfg, NAME)))
    return write_routed(events, cfg, NAME, output_tables(KINDS), collect=True, listed=True)
