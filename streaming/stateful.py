"""Runs a :class:`pipeline.stateful.Concern` for one key of Spark's ``applyInPandasWithState``.

The stateful queries (``combined``, ``faults``, ``lag``) do the same per key: read the key's Arrow
chunks by table, take the batch's :class:`Clock` from Spark's watermark, load the state or start
one, step it, save or drop it, set the event-time timeout the step asks for. The standalone
queries write through routed rows (one column set for several tables): :func:`routed_frame`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.ipc import ipc_table
from pipeline.stateful import Clock, Concern, S
from schemas.fields import Field, arrow_schema
from schemas.tables import ROUTE_COLUMN, routed_fields
from streaming.feeds import plain
from streaming.kafka_source import SETTLE

NOW = "_now_ms"  # the batch's processing time, on every chunk row
# Nullable pandas dtypes for routed rows: with numpy's, a null turns integers into floats.
_NULLABLE = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype(),
             pa.float64(): pd.Float64Dtype()}


def read_chunks(
    frames: Iterator[pd.DataFrame], decode: bool = True
) -> tuple[dict[str, list[pa.Table]], int, int | None]:
    """A key's chunks (``_table``, ``arrow``) by table, the batch's settle point and batch time.

    With ``decode``, dictionary-encoded columns are decoded (the readers send low-cardinality
    strings that way).
    """
    out: dict[str, list[pa.Table]] = {}
    settle, now = 0, None
    for frame in frames:
        if not len(frame):
            continue
        for name, blob in zip(frame[ROUTE_COLUMN].tolist(), frame["arrow"].tolist()):
            rows = ipc_table(blob)
            out.setdefault(name, []).append(plain(rows) if decode else rows)
        if SETTLE in frame.columns:
            settle = max(settle, int(frame[SETTLE].to_numpy().max()))
        if NOW in frame.columns:
            top = int(frame[NOW].to_numpy().max())
            now = top if now is None else max(now, top)
    return out, settle, now


def event_clock(state: Any, settle_ms: int = 0, now_ms: int | None = None) -> Clock:
    """The clock of a key under an event-time timeout: Spark's watermark, the batch's settle point."""
    watermark = max(0, int(state.getCurrentWatermarkMs()))
    if state.hasTimedOut:
        return Clock(watermark, watermark, None, True)
    return Clock(watermark, max(settle_ms, watermark), now_ms, False)


def _same(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(row)


def step_key(
    concern: Concern[S], key: str, state: Any, events: pa.Table, clock: Clock,
    load: Callable[[Sequence[Any]], tuple[Any, ...]] = _same,
    save: Callable[[tuple[Any, ...]], tuple[Any, ...]] = _same,
) -> dict[str, pa.Table]:
    """Step one key's state (Spark's ``GroupState``) over its events; its rows by table.

    ``load`` and ``save`` map the concern's encoded state to the state store's row and back.
    """
    current = concern.decode(load(state.get)) if state.exists else concern.initial(key)
    done = concern.step(current, events, clock)
    if concern.is_empty(done.state):
        state.remove()
    else:
        state.update(save(concern.encode(done.state)))
        if done.wakeup_ms is not None:  # Spark times a key out once the watermark passes this
            state.setTimeoutTimestamp(max(done.wakeup_ms - 1, clock.watermark_ms + 1))
    return done.tables


def routed_frame(tables: Mapping[str, pa.Table], names: Sequence[str], extra: Sequence[Field] = ()) -> pd.DataFrame:
    """One frame with ``routed_fields(names)`` columns (and ``extra``) from per-table rows, with
    nullable dtypes."""
    schema = arrow_schema((*routed_fields(list(names)), *extra))
    parts = []
    for name, rows in tables.items():
        n = rows.num_rows
        columns = [pa.repeat(name, n) if f.name == ROUTE_COLUMN
                   else rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type)
                   for f in schema]
        parts.append(pa.Table.from_arrays(columns, schema=schema))
    routed = pa.concat_tables(parts) if parts else schema.empty_table()
    return routed.to_pandas(types_mapper=_NULLABLE.get, maps_as_pydicts="strict")
