"""The fault state as a :class:`pipeline.stateful.Concern`: Arrow in, Arrow out, over the pure steps.

:class:`BrokerFaults` keeps the state of some brokers of one cluster (the combined query's keys,
one per (cluster, shard), see ``faults.shards``): its step writes their windows, health and the
grid points of each broker that got events (``_points``, for the cluster decision in the sink),
and asks to be stepped again when the watermark would settle something. :class:`FleetFaults` keeps
every cluster under one key with its own watermark (the ``faults`` query), so it needs no wake-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import FaultsConfig
from pipeline.faults.codec import decode_fleet, decode_state, encode_fleet, encode_state
from pipeline.faults.events import EVENT_COLUMNS, Events, from_arrow_table, with_removals
from pipeline.faults.fleet import FleetState, fleet_step
from pipeline.faults.state import FaultOutputs, FaultState, initial_state, is_empty, step
from pipeline.stateful import Clock, Stepped, concat
from schemas.faults import SETTLES_INTO
from schemas.tables import table

POINTS = "_points"  # the brokers' grid points: rows for the cluster decision, not a table
_OUTPUTS = (("producer_fault_windows_live", "windows"), ("broker_fault_episodes_live", "episodes"),
            ("broker_health", "health"), ("quarantine", "quarantine"))


@cache
def event_schema() -> pa.Schema:
    """The Arrow schema of the fault step's input: the send-result columns it reads, as in bronze."""
    bronze = table("send_results").arrow_schema()
    return pa.schema([bronze.field(c) for c in EVENT_COLUMNS])


@cache
def _schema(name: str) -> pa.Schema:
    return table(name).arrow_schema()


def send_results(chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
    """The fault step's input: the send results among a key's chunks, the columns it reads."""
    return concat(chunks.get("send_results", ()), event_schema()).select(EVENT_COLUMNS)


def with_settled(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """``tables`` plus, for each live changelog among them, its final rows for the silver table.

    A final row is a "closed" one: written once per window or episode, when the watermark has
    passed its end, with the same content however the events were batched; its revision there is 0.
    """
    out = dict(tables)
    for live, silver in SETTLES_INTO.items():
        rows = tables.get(live)
        if rows is None:
            continue
        closed = rows.filter(pc.equal(rows["state"], "closed"))
        if closed.num_rows:
            i = closed.schema.get_field_index("revision")
            zeros = pa.array(np.zeros(closed.num_rows, dtype=np.int32), closed.schema.field(i).type)
            out[silver] = closed.set_column(i, closed.schema.field(i), zeros)
    return out


def output_tables(out: FaultOutputs) -> dict[str, pa.Table]:
    """A step's rows as Arrow tables with the Delta tables' schemas (tables without rows left out)."""
    tables = {}
    for name, attr in _OUTPUTS:
        rows = getattr(out, attr)
        if rows:
            tables[name] = pa.Table.from_pylist(rows, schema=_schema(name))
    if out.points is not None and out.points.num_rows:
        tables[POINTS] = out.points
    return with_settled(tables)


@dataclass(frozen=True)
class BrokerFaults:
    """The fault state of a shard of a cluster's brokers under Spark's watermark; episodes are
    decided per cluster elsewhere, on the grid points it writes per broker."""

    cfg: FaultsConfig

    def initial(self, key: str) -> FaultState:
        return initial_state(key)

    def events(self, chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        return send_results(chunks)

    def step(self, state: FaultState, events: pa.Table, clock: Clock) -> Stepped[FaultState]:
        state, out = step(state, Events(events), clock.watermark_ms, self.cfg, clock.now_ms,
                          clock.settle_ms, points=True)
        return Stepped(state, output_tables(out), out.wakeup_ms)

    def encode(self, state: FaultState) -> tuple[Any, ...]:
        return encode_state(state)

    def decode(self, row: Sequence[Any]) -> FaultState:
        return decode_state(tuple(row))

    def is_empty(self, state: FaultState) -> bool:
        return is_empty(state)


@dataclass(frozen=True)
class FleetFaults:
    """Every cluster's fault state under one key and its own watermark (see :mod:`pipeline.faults.fleet`)."""

    cfg: FaultsConfig
    delay_ms: int

    def initial(self, key: str) -> FleetState:
        return FleetState()

    def events(self, chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        return with_removals(send_results(chunks))  # one key: every broker's rows are here

    def step(self, state: FleetState, events: pa.Table, clock: Clock) -> Stepped[FleetState]:
        state, out = fleet_step(state, from_arrow_table(events), self.cfg, self.delay_ms, clock.now_ms)
        return Stepped(state, output_tables(out), None)

    def encode(self, state: FleetState) -> tuple[Any, ...]:
        return encode_fleet(state)

    def decode(self, row: Sequence[Any]) -> FleetState:
        return decode_fleet(row)

    def is_empty(self, state: FleetState) -> bool:
        return not state.clusters
