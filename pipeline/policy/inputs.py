"""From Arrow tables (as read from Delta) to the policy's :class:`Snapshot` and :class:`PreviousState`.

No I/O here: the publisher reads the tables, these functions reduce them. Silver rows are appended
with a ``revision``; only the highest revision per id is current.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.deltaio import latest_revision
from pipeline.policy.model import (
    Avoiding,
    Episode,
    Health,
    PreviousEntry,
    PreviousState,
    Snapshot,
)

EPISODE_COLUMNS = [
    "episode_id", "cluster", "broker_name", "opened_ms", "closed_ms", "state", "reason",
    "peak_avoiding_producers", "active_producers", "sends", "failures", "p99_latency_ms", "updated_ms",
    "cluster_brokers",
]
HEALTH_COLUMNS = [
    "cluster", "broker_name", "minute_ms", "sends", "failures", "failure_rate", "latency_p99_ms",
    "active_producers", "producers_avoiding",
]
WINDOW_COLUMNS = [
    "window_id", "cluster", "producer_group", "client_id", "broker_name", "start_ms", "end_ms",
    "state", "revision", "updated_ms",
]


def current_episodes(table: pa.Table) -> list[Episode]:
    """The current revision of every episode; withdrawn suspicions never happened and are left out."""
    rows = latest_revision(table, "episode_id").select(EPISODE_COLUMNS).to_pylist()
    return [Episode(**r) for r in rows if r["state"] != "withdrawn"]


def latest_health(table: pa.Table) -> list[Health]:
    """The newest minute per broker (several rows of one minute: any one of them)."""
    current = latest_revision(table, ["cluster", "broker_name"], revision="minute_ms")
    return [Health(**r) for r in current.select(HEALTH_COLUMNS).to_pylist()]


def avoiding_now(table: pa.Table, now_ms: int, count_shadow: bool = True) -> list[Avoiding]:
    """Distinct producer instances whose current window covers ``now_ms``, per broker.

    ``count_shadow``: also producers running without fault tolerance, with the window their rules
    would give them (as ``faults.quorum_counts_shadow_windows`` counts them for episodes and health).
    """
    current = latest_revision(table, "window_id")
    if current.num_rows:
        active = pc.and_(pc.less_equal(current["start_ms"], now_ms), pc.greater(current["end_ms"], now_ms))
        active = pc.and_(active, pc.equal(current["state"], "open"))
        if not count_shadow:
            active = pc.and_(active, pc.equal(current["fault_enable"], True))
        current = current.filter(active)
    producers: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for r in current.select(["cluster", "broker_name", "producer_group", "client_id"]).to_pylist():
        producers[(r["cluster"], r["broker_name"])].add((r["producer_group"], r["client_id"]))
    return [Avoiding(c, b, len(p)) for (c, b), p in sorted(producers.items())]


def _max_or_none(table: pa.Table, column: str) -> int | None:
    if table.num_rows == 0:
        return None
    value = pc.max(table[column]).as_py()
    return None if value is None else int(value)


def freshest_ms(episodes: pa.Table, health: pa.Table, windows: pa.Table) -> int | None:
    """The newest event time in any input: how far the streaming job has got."""
    found = [
        _max_or_none(episodes, "updated_ms"),
        _max_or_none(health, "minute_ms"),
        _max_or_none(windows, "updated_ms"),
    ]
    present = [v for v in found if v is not None]
    return max(present) if present else None


def build_snapshot(
    episodes: pa.Table, health: pa.Table, windows: pa.Table, now_ms: int, count_shadow: bool = True
) -> Snapshot:
    return Snapshot(
        taken_ms=now_ms,
        episodes=tuple(current_episodes(episodes)),
        health=tuple(latest_health(health)),
        avoiding=tuple(avoiding_now(windows, now_ms, count_shadow)),
        freshest_ms=freshest_ms(episodes, health, windows),
    )


def previous_state(history: pa.Table, cycles: pa.Table) -> PreviousState:
    """The entries of the last *published* avoidance cycle (rejected cycles published nothing)."""
    if cycles.num_rows == 0:
        return PreviousState()
    published = cycles.filter(
        pc.and_(pc.equal(cycles["step"], "avoidance"), pc.equal(cycles["status"], "published"))
    )
    if published.num_rows == 0:
        return PreviousState()
    last = published.take(pc.sort_indices(published, [("cycle_number", "descending")])).slice(0, 1)
    cycle_id = last["cycle_id"][0].as_py()
    decided = last["decided_ms"][0].as_py()
    rows = history.filter(pc.equal(history["cycle_id"], cycle_id)) if history.num_rows else history
    entries = tuple(
        PreviousEntry(r["cluster"], r["broker_name"], r["action"], r["avoid_until_ms"], r["decided_ms"], r["reason"])
        for r in sorted(rows.to_pylist(), key=lambda r: (r["cluster"], r["broker_name"]))
    )
    return PreviousState(cycle_id, decided, entries)
