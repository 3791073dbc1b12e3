"""One producer's fault item for one broker, driven by :func:`pipeline.rocketmq.step_broker`.

A RocketMQ client's item for broker X changes only on that client's updates for X, so following
each (producer, broker) pair on its own reproduces the client's windows exactly. Each pair keeps two
:class:`~pipeline.rocketmq.BrokerTrack` values:

- ``head``: every update applied so far, in processing order (what the rows show);
- ``base``: only updates at or before the watermark, which no later event can precede.

An event that sorts before the head's last one (out of order, yet not late) rewinds the pair: the
head is rebuilt from ``base`` plus the pair's later updates, which the state keeps until the
watermark passes them. Each update is thus applied twice (head, then base), in exchange for exact
windows without holding events back until the watermark.

``updates`` counts, for the window open in a track, the timestamp groups that changed its end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.faults.events import GEN_NAMES
from pipeline.faults.frame import Cols
from pipeline.rocketmq import (
    GENERATIONS,
    BrokerTrack,
    FaultEvent,
    FaultItem,
    Window,
    WindowChange,
    advance_broker,
    flush_broker,
    step_broker,
)

_GENS = tuple(GENERATIONS[name] for name in GEN_NAMES)
NONE = -1  # "absent" in integer columns

# Columns of one track (prefixed "b_" for base and "h_" for head in the pair table).
TRACK_SCHEMA: dict[str, str] = {
    "item_latency": "int64",
    "item_start": "int64",  # NONE: no item yet
    "item_reachable": "bool",
    "win_start": "int64",  # NONE: no open window
    "win_end": "int64",
    "win_trigger": "int64",
    "win_last": "int64",
    "win_latency": "int64",
    "win_isolation": "bool",
    "group_ts": "int64",  # NONE: no pending timestamp group
    "ch_index": "int64",  # NONE: no changer
    "ch_latency": "int64",
    "ch_isolation": "bool",
    "updates": "int64",
}


@dataclass
class Track:
    """A BrokerTrack plus the update count of its open window (mutable while a step runs)."""

    state: BrokerTrack
    updates: int = 0


def track_from_row(broker: str, row: Mapping[str, Any]) -> Track:
    """Rebuild a track from its columns (``row`` holds plain Python values)."""
    start = row["item_start"]
    item = None if start == NONE else FaultItem(broker, row["item_latency"], start, row["item_reachable"])
    win_start = row["win_start"]
    window = None
    if win_start != NONE:
        window = Window(
            broker, win_start, row["win_end"], row["win_trigger"], row["win_last"],
            row["win_latency"], row["win_isolation"],
        )
    group_ts = None if row["group_ts"] == NONE else row["group_ts"]
    changer = None
    if row["ch_index"] != NONE:
        changer = (row["ch_index"], row["ch_latency"], row["ch_isolation"])
    return Track(BrokerTrack(broker, item, window, group_ts, changer), int(row["updates"]))


def track_to_row(track: Track) -> tuple:
    """Column values of a track, in :data:`TRACK_SCHEMA` order."""
    st = track.state
    item, window, changer = st.item, st.window, st.changer
    return (
        item.current_latency if item else 0,
        item.start_timestamp if item else NONE,
        bool(item.reachable) if item else True,
        window.start_ms if window else NONE,
        window.end_ms if window else NONE,
        window.trigger_index if window else NONE,
        window.last_index if window else NONE,
        window.latency_ms if window else 0,
        bool(window.isolation) if window else False,
        NONE if st.group_ts is None else st.group_ts,
        changer[0] if changer else NONE,
        changer[1] if changer else 0,
        bool(changer[2]) if changer else False,
        track.updates,
    )


def empty_track(broker: str) -> Track:
    return Track(BrokerTrack(broker))


@dataclass
class Seen:
    """Windows a run of updates showed, by start: the latest version and its update count."""

    windows: dict[int, tuple[Window, int]] = field(default_factory=dict)

    def note(self, window: Window, updates: int) -> None:
        self.windows[window.start_ms] = (window, updates)


def _count(updates: int, prior: Window | None, changes: list[WindowChange], seen: Seen | None) -> int:
    """The open window's update count after ``changes`` (``prior``: the window before them)."""
    current = prior
    for change in changes:
        w = change.window
        if change.kind == "opened":
            updates = 1
        elif change.kind in ("extended", "shortened"):
            updates += 1
        elif current is not None and current.start_ms == w.start_ms and w.end_ms != current.end_ms:
            updates += 1  # closed and cut short by this group (4.9)
        current = w
        if seen is not None:
            seen.note(w, updates)
    return updates


def apply_events(
    track: Track,
    ts: Sequence[int],
    latency: Sequence[int],
    isolation: Sequence[bool],
    reachable: Sequence[bool],
    gen: Sequence[int],
    serial: Sequence[int],
    seen: Seen | None = None,
) -> Track:
    """Apply one pair's updates (already in processing order) with ``step_broker``."""
    state = track.state
    broker = state.broker
    updates = track.updates
    for i in range(len(ts)):
        before = state
        state, changes = step_broker(
            _GENS[gen[i]], before, FaultEvent(ts[i], broker, latency[i], isolation[i], reachable[i]), serial[i]
        )
        if changes:
            updates = _count(updates, before.window, changes, seen)
    return Track(state, updates)


def advance(track: Track, watermark_ms: int) -> Track:
    """No update at or before ``watermark_ms`` can arrive: settle and close what that decides."""
    state, changes = advance_broker(track.state, watermark_ms + 1)
    updates = _count(track.updates, track.state.window, changes, None) if changes else track.updates
    return Track(state, updates if state.window is not None else 0)


def settled_view(track: Track, seen: Seen) -> None:
    """Note in ``seen`` the head's windows as if its pending timestamp group were complete."""
    state, changes = flush_broker(track.state)
    updates = _count(track.updates, track.state.window, changes, seen) if changes else track.updates
    if state.window is not None:
        seen.note(state.window, updates)


def rows_to_tracks(brokers: Sequence[str], cols: Cols, prefix: str, index: np.ndarray) -> list[Track]:
    """Tracks of the pairs at ``index`` from the pair table's ``prefix`` columns."""
    names = list(TRACK_SCHEMA)
    lists = {name: cols[prefix + name][index].tolist() for name in names}
    out = []
    for k in range(len(index)):
        row = {name: lists[name][k] for name in names}
        out.append(track_from_row(brokers[k], row))
    return out


def tracks_to_columns(tracks: Sequence[Track], prefix: str) -> Cols:
    names = list(TRACK_SCHEMA)
    rows = [track_to_row(t) for t in tracks]
    cols: Cols = {}
    for j, name in enumerate(names):
        cols[prefix + name] = np.asarray([r[j] for r in rows], dtype=TRACK_SCHEMA[name])
    return cols
