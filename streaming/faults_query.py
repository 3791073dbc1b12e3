"""The ``faults`` query: a thin Spark shim over :func:`pipeline.faults.fleet_step`, reading Kafka itself.

``faultwatch stream --only faults`` (with ``--only bronze`` as a second query): its own Kafka read
-> ``applyInPandasWithState`` under one constant key -> routed rows for ``producer_fault_windows``,
``broker_fault_episodes``, ``broker_health``, ``quarantine``. Kept for running the fault state on
its own (e.g. replaying it on a new checkpoint without rewriting bronze); the default job runs the
same rules per cluster in :mod:`streaming.combined_query`.

The watermark is kept in the state (:mod:`pipeline.faults.fleet`: max event time of earlier batches
minus ``stream.watermark_delay_s``), not Spark's: with an event-time timeout Spark drops rows at
or behind its watermark before the function sees them, and a late event must reach quarantine with
reason ``late``. Late events are re-encoded to JSON for quarantine from their columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from pipeline.config import Config
from pipeline.faults import (
    EVENT_COLUMNS,
    STATE_DDL,
    FleetState,
    decode_fleet,
    encode_fleet,
    fleet_step,
    from_arrow_table,
)
from schemas.fields import spark_schema
from schemas.tables import ROUTE_COLUMN, routed_fields, table

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

NAME = "faults"
FAULT_TABLES = ("producer_fault_windows", "broker_fault_episodes", "broker_health", "quarantine")
BRONZE = "send_results"
NOW = "_now_ms"
KEY = "_all"

_PANDAS_DTYPES = {"int64": "Int64", "int32": "Int32", "bool": "boolean", "float64": "Float64"}
_EVENT_SCHEMA = pa.schema([table(BRONZE).arrow_schema().field(c) for c in EVENT_COLUMNS])


def _ipc(part: pa.Table) -> bytes:
    from streaming.feeds import ipc_bytes

    return ipc_bytes(part)


def _events_of(frames: Iterator[pd.DataFrame]) -> tuple[pa.Table, int | None]:
    """The batch's send results (every chunk, in any order) and its batch time."""
    tables, now = [], None
    for frame in frames:
        for blob, n in zip(frame["arrow"], frame[NOW]):
            tables.append(pa.ipc.open_stream(pa.py_buffer(blob)).read_all().select(EVENT_COLUMNS))
            now = int(n) if now is None else max(now, int(n))
    if not tables:
        return _EVENT_SCHEMA.empty_table(), now
    return pa.concat_tables(tables, promote_options="default"), now


def routed_frame(outputs: dict[str, list[dict[str, Any]]]) -> pd.DataFrame:
    """One frame with ``routed_fields(FAULT_TABLES)`` columns from per-table row lists.

    Built column by column with nullable dtypes: a frame per table concatenated would turn integers
    into floats and booleans into objects on the way to Arrow.
    """
    fields = routed_fields(list(FAULT_TABLES))
    cols: dict[str, pd.Series] = {}
    for f in fields:
        values: list[Any] = []
        for name, rows in outputs.items():
            if f.name == ROUTE_COLUMN:
                values += [name] * len(rows)
            else:
                values += [r.get(f.name) for r in rows]
        cols[f.name] = pd.Series(values, dtype=_PANDAS_DTYPES.get(f.kind, "object"))
    return pd.DataFrame(cols)


def release_memory() -> None:
    """Hand freed heap back to the OS after a batch (glibc keeps it otherwise): the Python worker
    that runs the step then holds its state, not the peak of the last batch."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:  # not glibc
            pass


def faults_function(cfg: Config) -> Any:
    """The function Spark calls once per batch: decode state, step every cluster, encode state."""
    faults = cfg.faults
    delay_ms = int(cfg.stream.watermark_delay_s * 1000)

    def run(key: tuple[str], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        fleet = decode_fleet(state.get) if state.exists else FleetState()
        events, now_ms = _events_of(frames)
        fleet, out = fleet_step(fleet, from_arrow_table(events), faults, delay_ms, now_ms)
        if fleet.clusters:
            state.update(encode_fleet(fleet))
        elif state.exists:
            state.remove()
        frame = routed_frame({
            "producer_fault_windows": out.windows,
            "broker_fault_episodes": out.episodes,
            "broker_health": out.health,
            "quarantine": out.quarantine,
        })
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
    keyed = chunks.select(F.lit(KEY).alias(KEY), "arrow", F.unix_millis(F.current_timestamp()).alias(NOW))
    return keyed.groupBy(KEY).applyInPandasWithState(
        faults_function(cfg),
        spark_schema(routed_fields(list(FAULT_TABLES))),
        STATE_DDL,
        "append",
        GroupStateTimeout.NoTimeout,
    )


def _pack_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows:
            yield pa.RecordBatch.from_pydict({"arrow": [_ipc(pa.Table.from_batches([batch]))]})


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
