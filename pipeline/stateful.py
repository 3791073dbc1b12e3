"""One step contract for the stateful concerns: the fault state and the lag state.

Spark keeps one state per key and calls a function per key and micro-batch. What that function
does is the same for every concern: start or decode the key's state, step it over the key's events
(Arrow, as the readers decode them) at the batch's :class:`Clock`, encode it or drop it when empty,
and ask to be stepped again at some event time. A :class:`Concern` is that much, as a thin adapter
over its pure step (:mod:`pipeline.faults.concern`, :mod:`pipeline.lag.concern`), so the Spark shims
run every concern alike. Outputs are Arrow tables with the Delta tables' schemas, by table name; a
name starting with ``_`` is not a table but rows for the sink's driver step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

S = TypeVar("S")


@dataclass(frozen=True)
class Clock:
    """The time a key is stepped at."""

    watermark_ms: int = 0  # events at or before it are late (0: no watermark yet)
    settle_ms: int = 0  # event time the batch lets a state settle up to (>= watermark_ms)
    now_ms: int | None = None  # the batch's processing time; None without a batch
    timed_out: bool = False  # stepped without events because event time reached its wake-up


@dataclass(frozen=True)
class Stepped(Generic[S]):
    """What one step returns: the new state, the rows to append, the wake-up it asks for."""

    state: S
    tables: dict[str, pa.Table]  # only tables with rows
    wakeup_ms: int | None  # the smallest watermark at which it wants a step without events


class Concern(Protocol[S]):
    def initial(self, key: str) -> S:
        """A new state for ``key`` (the key's first part: its cluster)."""
        ...

    def events(self, chunks: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        """The step's input from a key's chunks of bronze rows, by bronze table."""
        ...

    def step(self, state: S, events: pa.Table, clock: Clock) -> Stepped[S]: ...

    def encode(self, state: S) -> tuple[Any, ...]: ...

    def decode(self, row: Sequence[Any]) -> S: ...

    def is_empty(self, state: S) -> bool:
        """True when the state holds nothing worth keeping (Spark then drops the key)."""
        ...


def concat(chunks: Sequence[pa.Table], empty: pa.Schema) -> pa.Table:
    """Chunks as one table (columns missing from a chunk are nulls); ``empty``'s table if none."""
    if not chunks:
        return empty.empty_table()
    return chunks[0] if len(chunks) == 1 else pa.concat_tables(chunks, promote_options="default")
