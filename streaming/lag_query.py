"""The lag query: a thin Spark shim over :func:`pipeline.lag.step`.

One stateful operator (``applyInPandasWithState``) keyed by (cluster, shard). Why not a per-broker
key and a second stateful stage keyed by group? Spark 4.3 refuses two ``applyInPandasWithState``
in one query ("Multiple applyInPandasWithStates are not supported"), and chaining it with
``transformWithStateInPandas`` is refused by the global-watermark correctness check (both verified
on this machine). And no smaller key holds what the rules need together: ownership needs every
queue of a topic across brokers, group status needs a group's topics and its %RETRY%/%DLQ% topics,
and send results are shared by every group that consumes their topic. ``lag.shards`` > 1 spreads
the groups of a very large cluster over several keys by hash, sending send results to every shard.

Time: the step's clock is the latest event time the shard has seen (it never goes back). A shard
that gets no events is re-evaluated (STOP, expiry) by an event-time timeout once the watermark has
moved ``lag.idle_evaluation_s`` past its clock, and its clock then becomes the watermark plus the
watermark delay (the query's max event time at the previous batch). Spark drops rows older than the
watermark before a stateful operator (verified), so the operator sees a far-future guard column as its
event time instead: late events reach the step, which quarantines them with reason ``late``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from pipeline.config import Config
from pipeline.lag.codec import STATE_DDL
from pipeline.lag.concern import Lag
from pipeline.lag.events import KIND_OF_TABLE
from schemas.fields import spark_schema
from schemas.tables import ROUTE_COLUMN, routed_fields
from streaming.stateful import event_clock, routed_frame, step_key

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

NAME = "lag"
KINDS = ("send_result", "consumer_progress", "group_membership")
LAG_TABLES = ("queue_lag", "group_status", "quarantine")
EVENT_TIME = "_event_time"
GUARD = "_late_guard"
GUARD_TIME = "2100-01-01 00:00:00"  # schemas.fields.MAX_TS_MS: no event can be this late
SHARD = "_shard"
_PYSPARK_CONCAT_WARNING = "The behavior of DataFrame concatenation with empty or all-NA entries"


def _events(pdfs: Iterator[pd.DataFrame]) -> pa.Table:
    """The rows Spark hands over (already shaped as the lag step reads them), as Arrow."""
    frames = [p for p in pdfs if len(p)]
    if not frames:
        return pa.table({})
    return pa.Table.from_pandas(frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True),
                                preserve_index=False)


def lag_function(cfg: Config) -> Any:
    """The function Spark calls per (cluster, shard) and batch: decode state, step, encode state."""
    # A shard with events keeps its own event-time clock: another cluster's producers may run
    # ahead, and the global watermark would make this cluster's consumers look stopped. Only a
    # silent shard (timeout) takes the query's clock (see pipeline.lag.concern).
    concern = Lag(cfg.lag, int(cfg.stream.watermark_delay_s * 1000))

    def run(key: tuple[str, int], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        # pyspark pads our output with an empty frame and pandas 2.x warns about that on every batch
        warnings.filterwarnings("ignore", message=_PYSPARK_CONCAT_WARNING, category=FutureWarning)
        clock = event_clock(state)
        events = pa.table({}) if clock.timed_out else _events(pdfs)
        yield routed_frame(step_key(concern, key[0], state, events, clock), LAG_TABLES)

    return run


def build_lag_output(events_df: DataFrame, cfg: Config) -> DataFrame:
    """Routed ``queue_lag``/``group_status``/``quarantine`` rows from routed bronze event rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    kind = F.lit(None).cast("string")
    for bronze_table, event_kind in KIND_OF_TABLE.items():
        kind = F.when(F.col(ROUTE_COLUMN) == bronze_table, F.lit(event_kind)).otherwise(kind)
    events = events_df.where(F.col(ROUTE_COLUMN).isin(list(KIND_OF_TABLE))).select(
        kind.alias("kind"),
        F.col("ts_ms"),
        F.col("cluster"),
        F.col("topic"),
        F.col("broker_name"),
        F.coalesce(F.col("queue_id").cast("bigint"), F.lit(-1)).alias("queue_id"),
        F.coalesce(F.col("queue_offset"), F.lit(-1)).alias("queue_offset"),
        F.col("status").alias("send_status"),
        F.col("consumer_group"),
        F.coalesce(F.col("consumer_offset"), F.lit(-2)).alias("consumer_offset"),
        F.coalesce(F.col("broker_offset"), F.lit(-1)).alias("broker_offset"),
        F.col("client_id"),
        F.coalesce(F.col("last_timestamp_ms"), F.lit(-1)).alias("last_timestamp_ms"),
        F.col("client_ids"),
        F.col("strategy"),
        F.col("kafka_topic").alias("src_topic"),
        F.col("kafka_partition").cast("bigint").alias("src_partition"),
        F.col("kafka_offset").alias("src_offset"),
        F.col("kafka_ts_ms").alias("src_ts_ms"),
        # Spark's watermark follows the max event time seen: one producer clock a year ahead would
        # make every later event "late" and drop it. Events further ahead of the batch time than the
        # allowed skew get no event time: they move no watermark, are not dropped as late (both
        # verified), and the step quarantines them. Spark keeps the batch time in its offset log, so
        # a replayed batch decides alike.
        F.when(
            F.col("ts_ms") > F.unix_millis(F.current_timestamp()) + F.lit(int(cfg.lag.max_future_skew_ms)),
            F.lit(None).cast("timestamp"),
        )
        .otherwise(F.timestamp_millis(F.col("ts_ms")))
        .alias(EVENT_TIME),
    )
    delay_ms = int(cfg.stream.watermark_delay_s * 1000)
    events = events.withWatermark(EVENT_TIME, f"{delay_ms} milliseconds")
    # Spark drops rows at or behind the watermark before a stateful operator whose input carries the
    # event-time column. The step must see late events to quarantine them, so the operator gets a
    # far-future constant tagged as the event-time column instead (the watermark and the event-time
    # timeout still follow the real event time); see streaming/faults_query.py, which does the same.
    guard = F.lit(GUARD_TIME).cast("timestamp").alias(GUARD, metadata={"spark.watermarkDelayMs": delay_ms})
    events = events.select(*[c for c in events.columns if c != EVENT_TIME], guard)
    shards = cfg.lag.shards
    if shards == 1:
        events = events.withColumn(SHARD, F.lit(0))
    else:  # groups by hash; send results belong to every group, so to every shard
        events = events.withColumn(
            SHARD,
            F.explode(
                F.when(F.col("kind") == "send_result", F.sequence(F.lit(0), F.lit(shards - 1))).otherwise(
                    F.array(F.pmod(F.xxhash64(F.col("consumer_group")), F.lit(shards)).cast("int"))
                )
            ),
        )
    return events.groupBy("cluster", SHARD).applyInPandasWithState(
        lag_function(cfg),
        spark_schema(routed_fields(list(LAG_TABLES))),
        STATE_DDL,
        "append",
        GroupStateTimeout.EventTimeTimeout,
    )


def build_lag(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """The unstarted lag query of ``faultwatch stream``: Kafka events -> lag tables."""
    from streaming.delta_sink import write_routed
    from streaming.kafka_source import read_events

    events = read_events(spark, cfg, KINDS, NAME)
    return write_routed(build_lag_output(events, cfg), cfg, NAME, list(LAG_TABLES), keys={"lag.shards": cfg.lag.shards})


__all__ = ["LAG_TABLES", "NAME", "build_lag", "build_lag_output", "lag_function"]
