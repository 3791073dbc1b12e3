"""The lag state as a :class:`pipeline.stateful.Concern`: Arrow in, Arrow out, over :func:`step`.

A key holds one cluster (or one shard of it). Two clocks:

- :class:`GridLag` (the combined query): events wait in the state until the batch's settle point
  passes the end of their ``lag.evaluation_interval_s`` bucket; then each bucket is applied and
  judged at its end, in event-time order, with quiet keys judged every ``lag.idle_evaluation_s``
  of event time. Which grid points are judged, and on which events, depends on the events alone,
  so the lag tables do not depend on how a backlog is cut into micro-batches. The price: rows come
  a watermark delay (plus up to one interval) after their events. Of the send results it gets
  (the readers cut each fetch's down to :func:`pipeline.lag.sends.per_second`), it applies the
  same rule again to what an interval gathered, so a second's sends that came in several fetches
  count once.
- :class:`Lag` (the ``lag`` query, alone): its clock is its own events' time; stepped without
  events (a timeout), it takes the watermark plus the watermark delay (the query's newest event
  time at the previous batch), so a silent shard still sees its consumers stop and its queues
  expire. It asks to be stepped again once event time is ``lag.idle_evaluation_s`` past its clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import LagConfig
from pipeline.ipc import ipc_bytes, ipc_table
from pipeline.lag.codec import decode_state, encode_state
from pipeline.lag.events import KIND_OF_TABLE, SEND, normalize_arrow, normalize_events
from pipeline.lag.registry import LagState
from pipeline.lag.sends import per_second
from pipeline.lag.state import initial_state, is_empty, late_rows, step, step_normalized
from pipeline.stateful import Clock, Stepped
from schemas.tables import table

# bronze column -> the lag step's name for it (see pipeline.lag.events.COLUMNS)
_RENAME = {"status": "send_status", "kafka_topic": "src_topic", "kafka_partition": "src_partition",
           "kafka_offset": "src_offset", "kafka_ts_ms": "src_ts_ms"}
_COORDINATES = ("src_topic", "src_partition", "src_offset")


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


@dataclass(frozen=True)
class GridState:
    """A lag state, the events not applied yet, and the last grid point it was judged at."""

    inner: LagState
    pending: pa.Table | None = None  # events after ``judged_ms``, waiting for their bucket to settle
    judged_ms: int = 0  # the last grid point evaluated (0: none yet)


@dataclass(frozen=True)
class GridLag:
    """The lag state judged on an event-time grid settled by the batch's settle point (module doc)."""

    cfg: LagConfig

    @property
    def interval_ms(self) -> int:
        return int(self.cfg.evaluation_interval_s * 1000)

    @property
    def idle_ms(self) -> int:
        return int(self.cfg.idle_evaluation_s * 1000)

    def initial(self, key: str) -> GridState:
        return GridState(initial_state(key, self.cfg))

    def events(self, chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        return lag_events(chunks)

    def step(self, state: GridState, events: pa.Table, clock: Clock) -> Stepped[GridState]:
        outputs: dict[str, list[pd.DataFrame]] = {}
        pending = state.pending
        if events.num_rows:
            ts = events.column("ts_ms")
            late = pc.less_equal(ts, clock.watermark_ms) if clock.watermark_ms > 0 else None
            if late is not None and pc.any(late).as_py():
                outputs["quarantine"] = [late_rows(events.filter(late).to_pandas(), clock.watermark_ms)]
                events = events.filter(pc.invert(late))
            parts = [t for t in (pending, _compact(events)) if t is not None and t.num_rows]
            pending = pa.concat_tables(parts, promote_options="default").combine_chunks() if parts else None
        inner, judged = state.inner, state.judged_ms
        top = (clock.settle_ms // self.interval_ms) * self.interval_ms
        if top > judged:
            due, pending = _split(pending, top)
            inner = self._judge(inner, _sends_per_second(due), top, outputs)
            judged = top
        tables = {name: _arrow(name, pd.concat(frames, ignore_index=True))
                  for name, frames in outputs.items() if sum(map(len, frames))}
        done = GridState(inner, pending, judged)
        return Stepped(done, tables, self._wakeup(done))

    def _judge(self, inner: LagState, due: pa.Table | None, top: int,
               outputs: dict[str, list[pd.DataFrame]]) -> LagState:
        """Apply ``due`` (the events up to ``top``) bucket by bucket, each judged at its end; a state
        holding something is also judged at every multiple of ``idle_ms`` after its last judgment."""
        # normalised once (by time first): each bucket's slice of it is normalised too
        frame = normalize_arrow(due) if due is not None else normalize_events(pd.DataFrame())
        ts = frame["ts_ms"].to_numpy()
        buckets = sorted(set((-(-ts // self.interval_ms) * self.interval_ms).tolist()))
        lo = 0
        for point in [*buckets, None]:
            while not is_empty(inner):  # quiet stretches: the idle grid points before this bucket
                idle = (inner.clock_ms // self.idle_ms + 1) * self.idle_ms
                if idle > top or (point is not None and idle >= point):
                    break
                inner = self._at(inner, frame.iloc[0:0], idle, outputs)
            if point is None:
                break
            hi = int(np.searchsorted(ts, point, side="right"))
            inner = self._at(inner, frame.iloc[lo:hi], point, outputs)
            lo = hi
        return inner

    def _at(self, inner: LagState, frame: pd.DataFrame, point: int, outputs: dict[str, list[pd.DataFrame]]) -> LagState:
        inner, out = step_normalized(inner, frame, point, self.cfg)
        for name, rows in (("queue_lag", out.queue_lag), ("group_status", out.group_status),
                           ("quarantine", out.quarantine)):
            if len(rows):
                outputs.setdefault(name, []).append(rows)
        return inner

    def _wakeup(self, state: GridState) -> int | None:
        """The grid point the watermark must reach for a step without events to judge something."""
        candidates = []
        if state.pending is not None and state.pending.num_rows:
            first = int(pc.min(state.pending.column("ts_ms")).as_py())
            candidates.append(-(-first // self.interval_ms) * self.interval_ms)
        if not is_empty(state.inner):
            candidates.append((state.inner.clock_ms // self.idle_ms + 1) * self.idle_ms)
        return min(candidates) + 1 if candidates else None

    def encode(self, state: GridState) -> tuple[Any, ...]:
        pending = state.pending
        blob = ipc_bytes(pending, compress="lz4") if pending is not None and pending.num_rows else b""
        return (*encode_state(state.inner), blob, state.judged_ms)

    def decode(self, row: Sequence[Any]) -> GridState:
        *inner, pending, judged = tuple(row)
        return GridState(decode_state(tuple(inner), self.cfg.window_commits),
                         _compact(ipc_table(bytes(pending))) if pending else None, int(judged))

    def is_empty(self, state: GridState) -> bool:
        return is_empty(state.inner) and (state.pending is None or state.pending.num_rows == 0)


def _compact(events: pa.Table) -> pa.Table:
    """Text columns dictionary-encoded: the pending events are filtered, saved and read back every
    micro-batch, and a few distinct names per column then cost a few integers per row. (A state
    saved before holds them as plain text: they are encoded when read.)"""
    arrays = [pc.dictionary_encode(c) if pa.types.is_string(c.type) else c for c in events.columns]
    return pa.Table.from_arrays(arrays, names=events.column_names)


def _sends_per_second(events: pa.Table | None) -> pa.Table | None:
    """The send results among ``events`` cut down to one per queue and second, again: the readers
    did it per fetch, and a second's sends can come in several fetches, tasks or micro-batches."""
    if events is None or events.num_rows == 0:
        return events
    sends = pc.equal(events.column("kind"), SEND).combine_chunks()
    return pa.concat_tables([events.filter(pc.invert(sends)), per_second(events.filter(sends), _COORDINATES)])


def _split(pending: pa.Table | None, top: int) -> tuple[pa.Table | None, pa.Table | None]:
    """(events at or before ``top``, the rest)."""
    if pending is None or pending.num_rows == 0:
        return None, pending
    due = pc.less_equal(pending.column("ts_ms"), top).combine_chunks()  # (a chunked mask filters slowly)
    return pending.filter(due), pending.filter(pc.invert(due))
