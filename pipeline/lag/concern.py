"""The lag state as a :class:`pipeline.stateful.Concern`: Arrow in, Arrow out, over :func:`step`.

A key holds one cluster (or one shard of it). Its clock is its own events' time; stepped without
events (a timeout), it takes the watermark plus the watermark delay (the query's newest event time
at the previous batch), so a silent shard still sees its consumers stop and its queues expire.
It asks to be stepped again once event time is ``lag.idle_evaluation_s`` past its clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.config import LagConfig
from pipeline.lag.codec import decode_state, encode_state
from pipeline.lag.events import KIND_OF_TABLE
from pipeline.lag.registry import LagState
from pipeline.lag.state import initial_state, is_empty, step
from pipeline.stateful import Clock, Stepped
from schemas.tables import table

# bronze column -> the lag step's name for it (see pipeline.lag.events.COLUMNS)
_RENAME = {"status": "send_status", "kafka_topic": "src_topic", "kafka_partition": "src_partition",
           "kafka_offset": "src_offset", "kafka_ts_ms": "src_ts_ms"}


def lag_events(chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
    """The lag step's input from a key's chunks of bronze rows: one table of mixed kinds."""
    parts = []
    for name in sorted(chunks):
        if name not in KIND_OF_TABLE or not chunks[name]:
            continue
        rows = pa.concat_tables(chunks[name], promote_options="default")
        rows = rows.rename_columns([_RENAME.get(c, c) for c in rows.column_names])
        parts.append(rows.add_column(0, "kind", pa.repeat(KIND_OF_TABLE[name], rows.num_rows)))
    if not parts:
        return pa.table({})
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="default")


@cache
def _schema(name: str) -> pa.Schema:
    return table(name).arrow_schema()


def _arrow(name: str, frame: pd.DataFrame) -> pa.Table:
    schema = _schema(name)
    return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)


@dataclass(frozen=True)
class Lag:
    cfg: LagConfig
    delay_ms: int  # the query's watermark delay

    def initial(self, key: str) -> LagState:
        return initial_state(key, self.cfg)

    def events(self, chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        return lag_events(chunks)

    def step(self, state: LagState, events: pa.Table, clock: Clock) -> Stepped[LagState]:
        watermark = clock.watermark_ms
        now = watermark + self.delay_ms if clock.timed_out and watermark > 0 else 0
        state, out = step(state, events.to_pandas(), now, self.cfg, watermark_ms=watermark)
        outputs = (("queue_lag", out.queue_lag), ("group_status", out.group_status), ("quarantine", out.quarantine))
        tables = {name: _arrow(name, frame) for name, frame in outputs if len(frame)}
        wakeup = max(state.clock_ms, watermark) + int(self.cfg.idle_evaluation_s * 1000) + 1
        return Stepped(state, tables, wakeup)

    def encode(self, state: LagState) -> tuple[Any, ...]:
        return encode_state(state)

    def decode(self, row: Sequence[Any]) -> LagState:
        return decode_state(tuple(row), self.cfg.window_commits)

    def is_empty(self, state: LagState) -> bool:
        return is_empty(state)
