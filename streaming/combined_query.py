"""The combined query: bronze, the fault state and the lag state from ONE Kafka read.

The reader tasks decode each fetch once, write the bronze Parquet files themselves and cut the
events into keyed chunks (:mod:`streaming.feeds`): the fault state's send results per cluster, the
lag state's events per (cluster, shard). One ``applyInPandasWithState`` operator, keyed by those
strings, runs the pure steps (:func:`pipeline.faults.step`, :func:`pipeline.lag.step`) for many
keys on every shuffle partition at once; its output chunks and the readers' file lists meet in one
sink that commits every table exactly once. The episode rules compare a broker with its peers:
each broker key writes its grid points and the sink decides per cluster on them
(:mod:`streaming.decisions`). A second stateful stage per cluster is not an option: Spark 4.3
refuses two ``applyInPandasWithState`` in one query, with ``statefulOperator.allowMultiple`` too
(checked), and an aggregation after one needs a watermark on its output.

Event time comes from the source, not from Spark's max-event-time watermark: each micro-batch's
offsets carry its settle point (:func:`streaming.kafka_source.settle_point`), which follows the
slowest partition still being read, so a backlog cut into batches makes no on-time event late.
The chunks carry it as a column, which is also the operator's event-time column, so Spark's
watermark in a batch is the previous batch's settle point: events at or before it are late. A key
that gets no events is called once the watermark reaches the time it asked for (an event-time
timeout), and settles up to the watermark then.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from pipeline.config import Config
from pipeline.faults import EVENT_COLUMNS, decode_state, encode_state, from_arrow_table, initial_state, step
from pipeline.faults import is_empty as faults_empty
from pipeline.faults.points import POINT_FIELDS
from pipeline.lag import initial_state as lag_initial
from pipeline.lag import is_empty as lag_empty
from pipeline.lag import step as lag_step
from pipeline.lag.codec import decode_state as lag_decode
from pipeline.lag.codec import encode_state as lag_encode
from pipeline.lag.events import KIND_OF_TABLE
from schemas.tables import table
from streaming.delta_sink import WRITTEN
from streaming.faults_query import FAULT_TABLES, release_memory
from streaming.feeds import FAULTS, LAG, PASS, ipc_bytes, parts_of, plain
from streaming.kafka_source import CHUNK_SCHEMA, SETTLE
from streaming.lag_query import LAG_TABLES

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

NAME = "combined"
BRONZE_KINDS = ("send_result", "consumer_progress", "group_membership")
STATE_DDL = "blob BINARY"
NOW = "_now_ms"
EVENT_TIME = "_event_time"
# Bumped whenever the keys or the state's shape change: an older checkpoint is then refused.
LAYOUT = 2

_POINT_TYPES = {"cluster": pa.string(), "broker_name": pa.string(), "bucket_errors": pa.string(),
                "p99": pa.float64(), "seen": pa.bool_()}
POINT_SCHEMA = pa.schema([(f, _POINT_TYPES.get(f, pa.int64())) for f in POINT_FIELDS])

# -- the state as one binary column -------------------------------------------------------------
_INT, _STR, _BYTES, _NONE = b"i", b"s", b"b", b"n"


def pack(values: tuple[Any, ...]) -> bytes:
    """A tuple of ints, strings, bytes and Nones as one blob (the state store keeps one column)."""
    out = [struct.pack("<I", len(values))]
    for v in values:
        if v is None:
            out.append(_NONE)
        elif isinstance(v, int):
            out.append(_INT + struct.pack("<q", v))
        elif isinstance(v, str):
            data = v.encode()
            out.append(_STR + struct.pack("<Q", len(data)) + data)
        else:
            data = bytes(v)
            out.append(_BYTES + struct.pack("<Q", len(data)) + data)
    return b"".join(out)


def unpack(blob: bytes) -> tuple[Any, ...]:
    (count,) = struct.unpack_from("<I", blob, 0)
    pos, out = 4, []
    for _ in range(count):
        tag = blob[pos:pos + 1]
        pos += 1
        if tag == _NONE:
            out.append(None)
        elif tag == _INT:
            out.append(struct.unpack_from("<q", blob, pos)[0])
            pos += 8
        else:
            (size,) = struct.unpack_from("<Q", blob, pos)
            pos += 8
            data = blob[pos:pos + size]
            pos += size
            out.append(data.decode() if tag == _STR else data)
    return tuple(out)


# -- the function Spark calls per key and batch -------------------------------------------------
def _chunk(name: str, rows: pa.Table) -> tuple[str, int, bytes]:
    return name, rows.num_rows, ipc_bytes(rows)


def _tables(frames: Iterator[pd.DataFrame]) -> tuple[dict[str, list[pa.Table]], int, int | None]:
    """A key's chunks by table, the batch's settle point and batch time."""
    out: dict[str, list[pa.Table]] = {}
    settle, now = 0, None
    for frame in frames:
        for name, blob, point, t in zip(frame["_table"], frame["arrow"], frame[SETTLE], frame[NOW]):
            out.setdefault(name, []).append(plain(pa.ipc.open_stream(pa.py_buffer(blob)).read_all()))
            settle = max(settle, int(point))
            now = int(t) if now is None else max(now, int(t))
    return out, settle, now


POINTS = "_points"  # the brokers' grid points, for the cluster decision in the sink
CLOCK = "_clock"  # the batch's settle point (``rows``), for the same


def _fault_key(cluster: str, frames: Iterator[pd.DataFrame], state: Any, cfg: Config) -> list[tuple[str, int, bytes]]:
    current = decode_state(unpack(bytes(state.get[0]))) if state.exists else initial_state(cluster)
    watermark = max(0, int(state.getCurrentWatermarkMs()))
    if state.hasTimedOut:
        tables, settle, now = {}, watermark, None
    else:
        tables, settle, now = _tables(frames)
    sends = tables.get("send_results", [])
    events = pa.concat_tables(sends, promote_options="default").select(EVENT_COLUMNS) if sends else _empty_events()
    cols = from_arrow_table(events)
    current, out = step(current, cols, watermark, cfg.faults, now, max(settle, watermark), points=True)
    if faults_empty(current):
        state.remove()
    else:
        state.update((pack(encode_state(current)),))
        if out.wakeup_ms is not None:
            state.setTimeoutTimestamp(max(out.wakeup_ms - 1, watermark + 1))
    chunks = []
    for name, rows in (("producer_fault_windows", out.windows), ("broker_health", out.health),
                       ("quarantine", out.quarantine)):
        if rows:
            chunks.append(_chunk(name, pa.Table.from_pylist(rows, schema=table(name).arrow_schema())))
    if out.points:
        chunks.append(_chunk(POINTS, pa.Table.from_pylist(out.points, schema=POINT_SCHEMA)))
    return chunks


def _empty_events() -> pa.Table:
    schema = table("send_results").arrow_schema()
    return pa.schema([schema.field(c) for c in EVENT_COLUMNS]).empty_table()


_LAG_RENAME = {"status": "send_status", "kafka_topic": "src_topic", "kafka_partition": "src_partition",
               "kafka_offset": "src_offset", "kafka_ts_ms": "src_ts_ms"}


def lag_events(tables: dict[str, list[pa.Table]]) -> pd.DataFrame:
    """The lag step's input frame from a key's chunks (see pipeline.lag.events)."""
    frames = []
    for name in sorted(tables):
        if name not in KIND_OF_TABLE:
            continue
        frame = pa.concat_tables(tables[name], promote_options="default").to_pandas()
        frame = frame.rename(columns=_LAG_RENAME)
        frame.insert(0, "kind", KIND_OF_TABLE[name])
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _lag_key(cluster: str, frames: Iterator[pd.DataFrame], state: Any, cfg: Config) -> list[tuple[str, int, bytes]]:
    lag = cfg.lag
    delay_ms = int(cfg.stream.watermark_delay_s * 1000)
    current = lag_decode(unpack(bytes(state.get[0])), lag.window_commits) if state.exists else lag_initial(cluster, lag)
    watermark = max(0, int(state.getCurrentWatermarkMs()))
    if state.hasTimedOut:
        events, now = pd.DataFrame(), watermark + delay_ms
    else:
        tables, _settle, _now = _tables(frames)
        events, now = lag_events(tables), 0
    current, out = lag_step(current, events, now, lag, watermark_ms=watermark)
    if lag_empty(current):
        state.remove()
    else:
        state.update((pack(lag_encode(current)),))
        state.setTimeoutTimestamp(max(current.clock_ms, watermark) + int(lag.idle_evaluation_s * 1000))
    chunks = []
    for name, frame in (("queue_lag", out.queue_lag), ("group_status", out.group_status),
                        ("quarantine", out.quarantine)):
        if len(frame):
            schema = table(name).arrow_schema()
            chunks.append(_chunk(name, pa.Table.from_pandas(frame[schema.names], schema=schema,
                                                             preserve_index=False)))
    return chunks


def combined_function(cfg: Config) -> Any:
    """Per key: pass the readers' file lists on, or step one fault or lag state."""

    def run(key: tuple[str], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        kind, *rest = parts_of(key[0])
        if kind == PASS:
            settle = 0
            for frame in frames:
                written = frame["_table"] == WRITTEN
                settle = max(settle, int(frame[SETTLE].max()))
                if written.any():
                    yield frame.loc[written, ["_table", "rows", "arrow"]]
            yield pd.DataFrame([(CLOCK, settle, b"")], columns=["_table", "rows", "arrow"])
            return
        if kind == FAULTS:
            chunks = _fault_key(rest[0], frames, state, cfg)
        elif kind == LAG:
            chunks = _lag_key(rest[0], frames, state, cfg)
        else:
            raise ValueError(f"unknown state key {key[0]!r}")
        if chunks:
            yield pd.DataFrame(chunks, columns=["_table", "rows", "arrow"])
        release_memory()

    return run


def build_combined_output(chunks_df: DataFrame, cfg: Config) -> DataFrame:
    """Chunk rows for every table from the source's keyed chunk rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    # The event-time column is the settle point plus 1 ms with a 1 ms delay: Spark's watermark is
    # then the previous batch's settle point, and no row is ever behind it.
    timed = chunks_df.withColumn(EVENT_TIME, F.timestamp_millis(F.col(SETTLE) + F.lit(1)))
    timed = timed.withWatermark(EVENT_TIME, "1 millisecond")
    keyed = timed.select("_key", "_table", "rows", "arrow", SETTLE,
                         F.unix_millis(F.current_timestamp()).alias(NOW), EVENT_TIME)
    return keyed.groupBy("_key").applyInPandasWithState(
        combined_function(cfg), CHUNK_SCHEMA, STATE_DDL, "append", GroupStateTimeout.EventTimeTimeout
    )


def tables_of(faults: bool, lag: bool) -> list[str]:
    from streaming.kafka_source import output_tables

    names = output_tables(list(BRONZE_KINDS))
    names += list(FAULT_TABLES) if faults else []
    names += list(LAG_TABLES) if lag else []
    return list(dict.fromkeys(names))


def _build(spark: SparkSession, cfg: Config, name: str, feeds: list[str]) -> DataStreamWriter:
    from streaming.decisions import ClusterDecisions
    from streaming.delta_sink import app_id, checkpoint_dir, file_tag, write_routed
    from streaming.kafka_source import read_events

    events = read_events(spark, cfg, list(BRONZE_KINDS), name, chunked=True,
                         write_tag=file_tag(app_id(cfg, name)), feed_columns=EVENT_COLUMNS, feeds=feeds)
    decisions = ClusterDecisions(cfg, checkpoint_dir(cfg, name), file_tag(app_id(cfg, name))) if "faults" in feeds else None
    return write_routed(build_combined_output(events, cfg), cfg, name,
                        tables_of("faults" in feeds, "lag" in feeds), layout=LAYOUT, driver_step=decisions)


def build_combined(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """The default query of ``faultwatch stream``: bronze, faults and lag from one Kafka read."""
    return _build(spark, cfg, NAME, ["faults", "lag"])


def build_bronze_faults(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """Bronze and the fault tables from one Kafka read (no lag)."""
    return _build(spark, cfg, "bronze_faults", ["faults"])


__all__ = ["LAYOUT", "NAME", "build_bronze_faults", "build_combined", "build_combined_output",
           "combined_function", "lag_events", "pack", "unpack"]
