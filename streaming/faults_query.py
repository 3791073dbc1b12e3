"""The ``faults`` query: a thin Spark shim over :func:`pipeline.faults.fleet_step`, reading Kafka itself.

``faultwatch stream --only faults`` (with ``--only bronze`` as a second query): its own Kafka read
-> ``applyInPandasWithState`` under one constant key -> routed rows for the fault tables
(:data:`FAULT_TABLES`). Kept for running the fault state on
its own (e.g. replaying it on a new checkpoint without rewriting bronze); the default job runs the
same rules per cluster in :mod:`streaming.combined_query`.

The watermark is kept in the state (:mod:`pipeline.faults.fleet`: max event time of earlier batches
minus ``stream.watermark_delay_s``), not Spark's: with an event-time timeout Spark drops rows at
or behind its watermark before the function sees them, and a late event must reach quarantine with
reason ``late``. Late events are re-encoded to JSON for quarantine from their columns.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from pipeline.config import Config
from pipeline.faults import EVENT_COLUMNS, STATE_DDL
from pipeline.faults.concern import FleetFaults
from pipeline.ipc import ipc_bytes
from pipeline.stateful import Clock
from schemas.fields import Field, spark_schema
from schemas.tables import ROUTE_COLUMN, routed_fields
from streaming.delta_sink import COUNTED, EVENTS_COLUMN
from streaming.stateful import NOW, read_chunks, routed_frame, step_key

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

NAME = "faults"
FAULT_TABLES = ("producer_fault_windows_live", "producer_fault_windows", "broker_fault_episodes_live",
                "broker_fault_episodes", "broker_health", "quarantine")
BRONZE = "send_results"
KEY = "_all"
# The output's one column beyond the tables': a COUNTED row's send results read in the batch.
EVENTS_FIELD = Field(EVENTS_COLUMN, "int64", required=False, nullable=True)


# Trim only past this much free heap: a smaller rest is faulted straight back in by the next step.
TRIM_FREE_BYTES = 64 << 20


def release_memory() -> None:
    """Hand freed heap back to the OS after a step that left much of it (glibc keeps it otherwise):
    the Python worker that runs the steps then holds their state, not the peak of the last batch."""
    libc = _glibc()
    if libc is None:
        return
    free = _free_heap(libc)
    if free is None or free >= TRIM_FREE_BYTES:
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _glibc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def _free_heap(libc: Any) -> int | None:
    """Free bytes in malloc's heap (glibc >= 2.33), None if it cannot say."""
    try:
        info = libc.mallinfo2
    except AttributeError:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


def faults_function(cfg: Config) -> Any:
    """The function Spark calls once per batch: decode state, step every cluster, encode state."""
    concern = FleetFaults(cfg.faults, int(cfg.stream.watermark_delay_s * 1000))

    def run(key: tuple[str], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        tables, _settle, now_ms = read_chunks(frames)
        read = sum(rows.num_rows for parts in tables.values() for rows in parts)
        out = step_key(concern, key[0], state, concern.events(tables), Clock(now_ms=now_ms))
        if read:  # the chunks are few Spark rows for many events: say how many for the progress line
            out = {**out, COUNTED: pa.table({EVENTS_COLUMN: pa.array([read], pa.int64())})}
        frame = routed_frame(out, FAULT_TABLES, (EVENTS_FIELD,))
        if len(frame):
            yield frame
        release_memory()

    return run


def build_faults_output(events_df: DataFrame, cfg: Config) -> DataFrame:
    """Routed fault rows from the Kafka source's rows (chunked, or routed rows as in tests)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    sends = events_df.where(F.col(ROUTE_COLUMN) == BRONZE)
    if "arrow" in events_df.columns:
        chunks = sends.select("arrow")
    else:  # routed rows (file-stream tests): pack each Arrow batch as a chunk, as the source does
        chunks = sends.select(*EVENT_COLUMNS).mapInArrow(_pack_rows, "arrow BINARY")
    keyed = chunks.select(F.lit(KEY).alias(KEY), F.lit(BRONZE).alias(ROUTE_COLUMN), "arrow",
                          F.unix_millis(F.current_timestamp()).alias(NOW))
    return keyed.groupBy(KEY).applyInPandasWithState(
        faults_function(cfg),
        spark_schema((*routed_fields(list(FAULT_TABLES)), EVENTS_FIELD)),
        STATE_DDL,
        "append",
        GroupStateTimeout.NoTimeout,
    )


def _pack_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows:
            yield pa.RecordBatch.from_pydict({"arrow": [ipc_bytes(batch)]})


def build_faults(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """The unstarted faults query of ``faultwatch stream``: Kafka send results -> fault tables."""
    from streaming.delta_sink import write_routed
    from streaming.kafka_source import read_events

    events = read_events(spark, cfg, ["send_result"], NAME, chunked=True)
    return write_routed(build_faults_output(events, cfg), cfg, NAME, list(FAULT_TABLES))


def state_metrics(progress: dict[str, Any]) -> dict[str, int]:
    """The fault state's size in one ``StreamingQueryProgress`` (as a dict)."""
    op = (progress.get("stateOperators") or [{}])[0]
    custom = op.get("customMetrics") or {}
    return {
        "state_rows": int(op.get("numRowsTotal", 0)),
        "state_memory_bytes": int(op.get("memoryUsedBytes", 0)),
        "state_current_version_bytes": int(custom.get("stateOnCurrentVersionSizeBytes", 0)),
    }


__all__ = [
    "FAULT_TABLES",
    "NAME",
    "build_faults",
    "build_faults_output",
    "faults_function",
    "state_metrics",
]
