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
    from streaming.delta_sink import write_routed

    events = read_events(spark, cfg, KINDS, NAME, chunked=True)
    return write_routed(events, cfg, NAME, output_tables(KINDS))
