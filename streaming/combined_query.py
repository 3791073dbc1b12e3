"""The combined query: bronze, the fault state and the lag state from ONE Kafka read.

The reader tasks decode each fetch once, write the bronze Parquet files and cut the events into
keyed chunks (:mod:`streaming.feeds`): send results per (cluster, shard of its brokers) for the
fault state, events per (cluster, shard of its groups) for the lag state. One
``applyInPandasWithState`` operator runs the pure steps for many keys on every shuffle partition;
its output chunks and the readers' file lists meet in one sink that commits every table exactly
once. The episode rules compare a broker with its peers, so each fault key writes its brokers'
grid points and the sink decides per cluster (:mod:`streaming.decisions`): Spark 4.3 refuses a
second ``applyInPandasWithState`` in one query (``statefulOperator.allowMultiple`` too), and an
aggregation after one needs a watermark on its output.

Event time comes from the source: each micro-batch's offsets carry its settle point
(:func:`streaming.kafka_source.settle_point`), which follows the slowest partition still being
read, so cutting a backlog into batches makes no on-time event late. The chunks carry it as the
operator's event-time column, so the watermark in a batch is the previous batch's settle point.
A key without events is called once the watermark reaches the time it asked for (an event-time
timeout) and settles up to the watermark then.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from pipeline.config import Config
from pipeline.faults import EVENT_COLUMNS
from pipeline.faults.concern import BrokerFaults
from pipeline.ipc import ipc_bytes
from pipeline.lag.concern import GridLag
from pipeline.stateful import Concern
from streaming.delta_sink import WRITTEN
from streaming.faults_query import FAULT_TABLES, release_memory
from streaming.feeds import FAULTS, LAG, PASS, parts_of
from streaming.kafka_source import CHUNK_SCHEMA, SETTLE
from streaming.lag_query import LAG_TABLES
from streaming.stateful import event_clock, read_chunks, step_key

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

NAME = "combined"
BRONZE_KINDS = ("send_result", "consumer_progress", "group_membership")
STATE_DDL = "blob BINARY"
NOW = "_now_ms"
EVENT_TIME = "_event_time"
# Bumped whenever the keys, the state's shape or what the tables hold change: an older checkpoint
# is then refused. 3: the lag keys keep their unsettled events and judge on the event-time grid
# (GridLag). 4: windows and episodes go to the *_live changelogs; the silver tables get final rows.
# 5: the fault keys are (cluster, shard of its brokers), no longer (cluster, broker). 6: the
# (cluster, shard) keys end with a counter that spreads them evenly over the tasks (feeds.placed).
LAYOUT = 6

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
    out: list[Any]
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
CLOCK = "_clock"  # the batch's settle point (``rows``), for the cluster decision in the sink


def _step(concern: Concern[Any], key: str, frames: Iterator[pd.DataFrame], state: Any,
          plain: bool = True) -> list[tuple[str, int, bytes]]:
    """One key's state stepped over its chunks; its rows as chunks (table, rows, Arrow IPC).

    ``plain``: decode the readers' dictionary-encoded strings first (a step that reads the codes
    itself does not need it).
    """
    tables, settle, now = ({}, 0, None) if state.hasTimedOut else read_chunks(frames, plain)
    out = step_key(concern, key, state, concern.events(tables), event_clock(state, settle, now),
                   load=lambda row: unpack(bytes(row[0])), save=lambda values: (pack(values),))
    return [(name, rows.num_rows, ipc_bytes(rows)) for name, rows in out.items()]


def _fault_key(cluster: str, frames: Iterator[pd.DataFrame], state: Any, cfg: Config) -> list[tuple[str, int, bytes]]:
    return _step(BrokerFaults(cfg.faults), cluster, frames, state, plain=False)


def _lag_key(cluster: str, frames: Iterator[pd.DataFrame], state: Any, cfg: Config) -> list[tuple[str, int, bytes]]:
    return _step(GridLag(cfg.lag), cluster, frames, state)


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
    # collect: the stateful tasks' output (derived rows, file listings) is small, so the driver
    # writes it; a write job on the executors would start one more Python runner per stateful task.
    return write_routed(build_combined_output(events, cfg), cfg, name,
                        tables_of("faults" in feeds, "lag" in feeds), layout=LAYOUT, driver_step=decisions,
                        collect=True, keys=state_keys(cfg, feeds), listed=True)


def state_keys(cfg: Config, feeds: list[str]) -> dict[str, int]:
    """The settings that decide which key holds a broker's or a group's state: fixed for a checkpoint."""
    keys = {"faults.shards": cfg.faults.shards} if "faults" in feeds else {}
    return keys | ({"lag.shards": cfg.lag.shards} if "lag" in feeds else {})


def build_combined(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """The default query of ``faultwatch stream``: bronze, faults and lag from one Kafka read."""
    return _build(spark, cfg, NAME, ["faults", "lag"])


def build_bronze_faults(spark: SparkSession, cfg: Config) -> DataStreamWriter:
    """Bronze and the fault tables from one Kafka read (no lag)."""
    return _build(spark, cfg, "bronze_faults", ["faults"])


__all__ = ["LAYOUT", "NAME", "build_bronze_faults", "build_combined", "build_combined_output",
           "combined_function", "pack", "state_keys", "unpack"]
