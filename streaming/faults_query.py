"""The faults query: a thin Spark shim over :func:`pipeline.faults.fleet_step`.

Two shapes of ``faultwatch stream``, same step:

- ``build_bronze_faults`` (concern ``bronze_faults``, the default): ONE query for bronze and faults.
  Reading Kafka is nearly all of bronze's cost (kafka-python's fetch and the decode) and a separate
  faults query pays it again. The combined query reads once. Its Kafka reader tasks write the
  bronze Parquet files themselves, on every core (the source's write mode), and emit the list of
  those files plus the send results as chunks; the stateful function feeds the send results to the
  fault step and passes the file lists on, the fault rows join as chunks of their tables, and one
  sink commits all of them exactly once.
- ``build_faults`` (concern ``faults``, with ``bronze`` as a second query): its own Kafka read ->
  ``applyInPandasWithState`` under one constant key -> routed rows for ``producer_fault_windows``,
  ``broker_fault_episodes``, ``broker_health``, ``quarantine``. Kept for running the fault state
  on its own (e.g. replaying it on a new checkpoint without rewriting bronze).

Measured with ``bench/faults.py`` (1M events, 50 brokers, 500 producers, 2 cores). This VM's speed
drifts by a third, so each change was judged by paired runs, old and new alternated:

- the combined query's rate went 31-39k events/s (a Python Data Source sink) -> 35.6-43.2k (the sink
  through ``foreachBatch``, two fewer Python processes) -> readers writing bronze themselves, so the
  bronze rows no longer pass through the one-task stateful step and back out through a second
  shuffle (dev harness pairs 31.9k -> 38.2k, 35.2k -> 41.7k) -> 400k events per micro-batch instead
  of 200k, as the stateful step has fixed costs per batch (pairs 41.4k -> 49.4k, 41.9k -> 47.2k;
  600k ran as fast, 1M slower; 48.0k, 49.4k and 47.3k in three runs) -> the reader unpacking
  Kafka record batches itself (``streaming/kafka_records.py``, ~1.7x kafka-python's raw rate);
- now: 69.2k and 57.2k events/s in two runs, 0.79 and 0.66 of bronze alone, peak RSS 2.2 GiB; two
  queries ran at ~0.59 (before the record unpacking). Live at 5,000 events/s with a 1 s trigger,
  window rows are readable in Delta p95 1.9-2.0 s after the event;
- per 200k events: the read stage ~2.4 s on both cores (Kafka fetch, decode, the bronze Parquet, the
  feed chunks), the stateful task 1.1-1.6 s on one core (the fault step 0.5-0.8 s, state decode +
  encode ~0.15 s, events to columns ~0.1 s, the rest Spark bringing the feed chunks in), ~0.4 s
  between jobs (commit, offsets, planning).

Why (each choice measured or verified on this machine, Spark 4.3, 2 cores):

- One stateful operator holding every cluster. Windows need only a (producer, broker)'s own
  updates, but episodes compare a broker with its peers, so a per-broker key cannot decide them,
  and Spark allows no second stage: two ``applyInPandasWithState`` in one query are refused, and
  ``transformWithStateInPandas`` after one is refused by the global-watermark correctness check.
- ``applyInPandasWithState``, not ``transformWithStateInPandas``: no RocksDB/protobuf setting for
  the whole session, and faster here (78k vs 46k rows/s).
- The source's chunks (Arrow IPC of a fetch's decoded events) go straight in; the function splits
  them by cluster. A per-cluster key needs a cluster column, i.e. a ``mapInArrow`` stage to unpack
  the chunks first: that stage cost ~0.7 s per 1 s micro-batch at 5,000 events/s (2.0 s vs
  1.2-1.3 s per batch, same load). Per-row input is worse: the JVM's per-cell conversions.
- The watermark is kept in the state (:mod:`pipeline.faults.fleet`, Spark's rule: max event time
  of earlier batches minus ``stream.watermark_delay_s``), not Spark's: with an event-time timeout
  Spark drops rows at or behind its watermark before the function sees them (verified; see
  ``tests/spark/test_faults_query.py``), and a late event must reach quarantine with reason
  ``late``. The step settles what the next batch's watermark decides (windows closing, minutes,
  episode grid points) in the same call, so no no-data batch or timeout is needed: the watermark
  only moves when events arrive. Late events are re-encoded to JSON for quarantine from their
  columns: the query never holds the record bytes, and the bronze ``send_results`` table has the
  event at the same Kafka topic/partition/offset.

State size per batch: Spark reports it in each progress (``stateOperators[0]``; see
:func:`state_metrics`); the query's checkpoint holds it in one row (zstd Arrow IPC).
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
from streaming.delta_sink import WRITTEN
from streaming.kafka_source import CHUNK_SCHEMA

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
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as writer:
        writer.write_table(part)
    return sink.getvalue().to_pybytes()


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


# -- bronze and faults from one Kafka read ------------------------------------------------------
# Reading Kafka is most of bronze's cost (kafka-python's fetch and the decode: ~30 core-seconds per
# million events here), and a separate faults query pays it again. The combined query reads once:
# the reader tasks write the bronze files and list them (``WRITTEN`` rows), the send results also
# reach the fault step as chunks, and the fault rows join the file lists as chunks of their own
# tables; one sink commits all of them, exactly once.

COMBINED = "bronze_faults"
# The send-result columns with few distinct values per chunk: the readers dictionary-encode them in
# the chunks they feed to the fault step (``from_arrow`` takes them as they are).
FEED_DICTIONARY = ("cluster", "producer_group", "client_id", "client_version", "topic", "broker_name",
                   "status", "error", "kafka_topic")
BRONZE_KINDS = ("send_result", "consumer_progress", "group_membership")


def _fault_chunks(out: Any) -> list[tuple[str, int, bytes]]:
    chunks = []
    for name, rows in (("producer_fault_windows", out.windows), ("broker_fault_episodes", out.episodes),
                       ("broker_health", out.health), ("quarantine", out.quarantine)):
        if rows:
            data = pa.Table.from_pylist(rows, schema=table(name).arrow_schema())
            chunks.append((name, data.num_rows, _ipc(data)))
    return chunks


def combined_function(cfg: Config) -> Any:
    """Pass the readers' file lists through; add the fault rows of the batch's send results as chunks."""
    faults = cfg.faults
    delay_ms = int(cfg.stream.watermark_delay_s * 1000)

    def run(key: tuple[str], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        fleet = decode_fleet(state.get) if state.exists else FleetState()
        sends: list[pd.DataFrame] = []
        for frame in frames:  # the readers wrote the bronze files: only their lists go on to the sink
            sends.append(frame.loc[frame[ROUTE_COLUMN] == BRONZE, ["arrow", NOW]])
            written = frame[ROUTE_COLUMN] == WRITTEN
            if written.any():
                yield frame.loc[written, [ROUTE_COLUMN, "rows", "arrow"]]
        events, now_ms = _events_of(iter(sends))
        del sends
        fleet, out = fleet_step(fleet, from_arrow_table(events), faults, delay_ms, now_ms)
        del events
        if fleet.clusters:
            state.update(encode_fleet(fleet))
        elif state.exists:
            state.remove()
        extra = _fault_chunks(out)
        if extra:
            yield pd.DataFrame(extra, columns=[ROUTE_COLUMN, "rows", "arrow"])
        release_memory()

    return run


def build_bronze_faults_output(chunks_df: DataFrame, cfg: Config) -> DataFrame:
    """Chunk rows for the bronze tables and the fault tables from the source's chunk rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    keyed = chunks_df.select(
        F.lit(KEY).alias(KEY), ROUTE_COLUMN, "rows", "arrow", F.unix_millis(F.current_timestamp()).alias(NOW)
    )
    return keyed.groupBy(KEY).applyInPandasWithState(
        combined_function(cfg), CHUNK_SCHEMA, STATE_DDL, "append", GroupStateTimeout.NoTimeout
    )


def build_bronze_faults(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """One query for bronze and the fault tables (one Kafka read, one sink): see above."""
    from streaming.delta_sink import app_id, file_tag, write_routed
    from streaming.kafka_source import output_tables, read_events

    tables = list(dict.fromkeys(output_tables(list(BRONZE_KINDS)) + list(FAULT_TABLES)))
    events = read_events(spark, cfg, list(BRONZE_KINDS), COMBINED, chunked=True,
                         write_tag=file_tag(app_id(cfg, COMBINED)), feed_tables=[BRONZE],
                         feed_columns=EVENT_COLUMNS, feed_dictionary=FEED_DICTIONARY)
    return write_routed(build_bronze_faults_output(events, cfg), cfg, COMBINED, tables)


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
    "COMBINED",
    "FAULT_TABLES",
    "NAME",
    "build_bronze_faults",
    "build_bronze_faults_output",
    "build_faults",
    "build_faults_output",
    "combined_function",
    "faults_function",
    "state_metrics",
]
