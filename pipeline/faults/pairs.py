"""Producer x broker pairs: registry, folding final updates into ``base``, applying new ones to ``head``.

See :mod:`pipeline.faults.tracks` for why each pair carries two tracks. The log (recent updates,
one row per send result) is ordered by serial; a pair's updates are applied in processing order
``(ts, kafka partition, kafka offset, serial)``, which for one batch is the serial order too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.faults.frame import Cols, concat, empty, group_bounds
from pipeline.faults.tracks import (
    TRACK_SCHEMA,
    Seen,
    Track,
    advance,
    apply_events,
    rows_to_tracks,
    settled_view,
    tracks_to_columns,
)
from pipeline.faults.windows import WindowUpdate

NONE = -1

PAIR_SCHEMA: dict[str, str] = {
    "pair": "int64",
    "broker": "int32",
    "producer_group": "object",
    "client_id": "object",
    "version": "int32",
    "gen": "int8",
    "enable": "bool",
    "last_event_ts": "int64",
    "last_window_end": "int64",
    "revision": "int64",
    "head_ts": "int64",
    "head_part": "int64",
    "head_off": "int64",
    **{"b_" + k: v for k, v in TRACK_SCHEMA.items()},
    **{"h_" + k: v for k, v in TRACK_SCHEMA.items()},
}

LOG_SCHEMA: dict[str, str] = {
    "serial": "int64",
    "ts": "int64",
    "part": "int64",
    "off": "int64",
    "pair": "int64",
    "broker": "int32",
    "latency": "int64",
    "iso": "bool",
    "reach": "bool",
    "gen": "int8",
    "enable": "bool",
    "status": "int8",
    "version": "int32",
    "err": "int32",
    "failed": "bool",
    "hot": "bool",  # the update's duration is > 0: it can open or extend a window
    "event_id": "object",  # kept only for updates that could open a window (duration > 0)
    "error": "object",
    "folded": "bool",
}


def new_pairs(pair_ids: np.ndarray, brokers: np.ndarray, groups: np.ndarray, clients: np.ndarray) -> Cols:
    """Pair rows with empty tracks (no item, no window) for newly seen producers x brokers."""
    n = len(pair_ids)
    cols = empty(PAIR_SCHEMA)
    for name, dtype in PAIR_SCHEMA.items():
        arr = np.zeros(n, dtype=dtype) if dtype != "object" else np.empty(n, dtype=object)
        cols[name] = arr
    cols.update(pair=pair_ids, broker=brokers.astype(np.int32), producer_group=groups, client_id=clients)
    for name in ("last_event_ts", "last_window_end", "head_ts", "head_part", "head_off"):
        cols[name] = np.full(n, NONE, dtype=np.int64)
    for prefix in ("b_", "h_"):
        for name in ("item_start", "win_start", "group_ts", "ch_index"):
            cols[prefix + name] = np.full(n, NONE, dtype=np.int64)
        cols[prefix + "item_reachable"] = np.ones(n, dtype=bool)
    return cols


def pair_rows(pairs: Cols, pair_ids: np.ndarray) -> np.ndarray:
    """Row positions of ``pair_ids`` (the table is sorted by pair id)."""
    return np.searchsorted(pairs["pair"], pair_ids)


def _in_order(log: Cols, rows: np.ndarray) -> np.ndarray:
    """``rows`` of the log sorted by (pair, ts, partition, offset, serial)."""
    keys = (log["serial"][rows], log["off"][rows], log["part"][rows], log["ts"][rows], log["pair"][rows])
    return rows[np.lexsort(keys)]


# What a replay reads of the log: _in_order's sort keys and _args's columns.
_REPLAY_COLUMNS = ("serial", "off", "part", "ts", "pair", "latency", "iso", "reach", "gen")


def _replay_rows(log: Cols, rows: np.ndarray) -> Cols:
    """``take(log, rows)`` of the columns a replay reads (a replay runs per out-of-order pair)."""
    return {name: log[name][rows] for name in _REPLAY_COLUMNS}


def _args(log: Cols, rows: np.ndarray) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]:
    return (
        log["ts"][rows].tolist(), log["latency"][rows].tolist(), log["iso"][rows].tolist(),
        log["reach"][rows].tolist(), log["gen"][rows].tolist(), log["serial"][rows].tolist(),
    )


def _write_tracks(pairs: Cols, rows: np.ndarray, tracks: list[Track], prefix: str) -> None:
    cols = tracks_to_columns(tracks, prefix)
    for name, values in cols.items():
        pairs[name][rows] = values


def _reset(pairs: Cols, rows: np.ndarray, prefix: str) -> None:
    """Give the pairs at ``rows`` an empty track (no item, no window, nothing pending)."""
    for name in TRACK_SCHEMA:
        pairs[prefix + name][rows] = NONE if name in ("item_start", "win_start", "group_ts", "ch_index") else (
            name == "item_reachable")


def fold(pairs: Cols, log: Cols, wins: Cols, brokers: tuple[str, ...], watermark_ms: int) -> None:
    """Bring every pair's base up to the watermark (in place).

    A pair with no window spanning the watermark is quiescent there: its broker is available and
    nothing it did before can touch a later window (4.9 sets avoid-until to ``now + duration`` on
    every update; 5.x keeps the later of the old avoid-until, already past, and ``now + duration``).
    Its base becomes an empty track, and the updates the watermark passed are simply dropped; only
    pairs inside a window replay them. The equivalence tests hold this against whole-stream replays.
    """
    due = np.flatnonzero(~log["folded"] & (log["ts"] <= watermark_ms))
    if len(due) == 0:
        return
    log["folded"][due] = True
    spanning = (wins["start"] <= watermark_ms) & (wins["end"] > watermark_ms)
    busy = np.isin(log["pair"][due], wins["pair"][spanning]) if spanning.any() else np.zeros(len(due), bool)
    quiet_ids = np.unique(log["pair"][due[~busy]])
    if len(quiet_ids):
        _reset(pairs, pair_rows(pairs, quiet_ids), "b_")
    due = due[busy]
    if len(due) == 0:
        return
    due = _in_order(log, due)
    starts, ends = group_bounds(log["pair"][due])
    ids = log["pair"][due[starts]]
    rows = pair_rows(pairs, ids)
    names = [brokers[b] for b in pairs["broker"][rows].tolist()]
    bases = rows_to_tracks(names, pairs, "b_", rows)
    quiet = _quiet(pairs, rows, "b_").tolist()
    out = []
    for track, lo, hi, calm in zip(bases, starts.tolist(), ends.tolist(), quiet):
        run = due[lo:hi]
        track = apply_events(track, *_args(log, run[_first_hot(log, run) if calm else 0:]))
        out.append(advance(track, watermark_ms))
    _write_tracks(pairs, rows, out, "b_")


def _quiet(pairs: Cols, rows: np.ndarray, prefix: str = "h_") -> np.ndarray:
    """Tracks (heads, or bases with ``prefix`` "b_") with no window open and no pending group
    about to open one."""
    start, group = pairs[prefix + "item_start"][rows], pairs[prefix + "group_ts"][rows]
    settled = (start == NONE) | (group == NONE) | (start <= group)
    return (pairs[prefix + "win_start"][rows] == NONE) & settled


def _first_hot(log: Cols, run: np.ndarray) -> int:
    """Where a quiet track's run of updates (in order, all later than the track's) starts to matter.

    Updates of duration 0 keep a quiet track quiet and change no window; the first update that
    can open one then leaves the track exactly as if they had been applied (its avoid-until time,
    item and changer are its own). So they are skipped up to it; with none, nothing is skipped.
    """
    hot = log["hot"][run]
    return int(hot.argmax()) if hot.any() else 0


def _after(ts: np.ndarray, part: np.ndarray, off: np.ndarray, pairs: Cols, rows: np.ndarray) -> np.ndarray:
    """(ts, partition, offset) sorts after the head's last update."""
    hts, hpart, hoff = pairs["head_ts"][rows], pairs["head_part"][rows], pairs["head_off"][rows]
    return (ts > hts) | ((ts == hts) & ((part > hpart) | ((part == hpart) & (off > hoff))))


def apply_new(
    pairs: Cols, log: Cols, new: Cols, brokers: tuple[str, ...], watermark_ms: int
) -> list[WindowUpdate]:
    """Apply this batch's updates (``new``: log rows, all after the watermark) to the pairs' heads."""
    if len(new["serial"]) == 0:
        return []
    order = _in_order(new, np.arange(len(new["serial"])))
    starts, ends = group_bounds(new["pair"][order])
    ids = new["pair"][order[starts]]
    rows = pair_rows(pairs, ids)
    first, last = order[starts], order[ends - 1]
    last_ts = np.maximum.reduceat(new["ts"][order], starts)
    pairs["last_event_ts"][rows] = np.maximum(pairs["last_event_ts"][rows], last_ts)
    # Bulk path: no window, in order, only zero-duration updates -> the broker stays available and no
    # window can result; the head's item is left as it was (equivalent from a quiescent point, see
    # fold) and only its last key moves.
    cold = np.add.reduceat(new["hot"][order].astype(np.int64), starts) == 0
    quiet = _quiet(pairs, rows)
    skip = cold & quiet & _after(new["ts"][first], new["part"][first], new["off"][first], pairs, rows)
    if skip.any():
        r, j = rows[skip], last[skip]
        pairs["head_ts"][r], pairs["head_part"][r], pairs["head_off"][r] = new["ts"][j], new["part"][j], new["off"][j]
    keep = ~skip
    starts, ends, ids, rows, calm = starts[keep], ends[keep], ids[keep], rows[keep], quiet[keep].tolist()
    if len(rows) == 0:
        return []
    names = [brokers[b] for b in pairs["broker"][rows].tolist()]
    heads = rows_to_tracks(names, pairs, "h_", rows)
    head_key = list(zip(pairs["head_ts"][rows].tolist(), pairs["head_part"][rows].tolist(),
                        pairs["head_off"][rows].tolist()))
    bases: list[Track] | None = None
    pending = np.flatnonzero(~log["folded"])
    pending_by_pair: dict[int, np.ndarray] = {}
    updates, new_heads = [], []
    new_keys = []
    for k, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist())):
        sel = order[lo:hi]
        first = (int(new["ts"][sel[0]]), int(new["part"][sel[0]]), int(new["off"][sel[0]]))
        seen = Seen()
        # A strictly later timestamp continues the head. The same timestamp as the head's pending
        # group may change what that group showed (a window can vanish): replay, like out of order.
        if first[0] > head_key[k][0]:
            track = apply_events(heads[k], *_args(new, sel[_first_hot(new, sel) if calm[k] else 0:]), seen=seen)
            rewound = False
            last = (int(new["ts"][sel[-1]]), int(new["part"][sel[-1]]), int(new["off"][sel[-1]]))
        else:
            if bases is None:
                bases = rows_to_tracks(names, pairs, "b_", rows)
                if len(pending):
                    pp = log["pair"][pending]
                    by = np.argsort(pp, kind="stable")
                    g0, g1 = group_bounds(pp[by])
                    for a, z in zip(g0.tolist(), g1.tolist()):
                        pending_by_pair[int(pp[by[a]])] = pending[by[a:z]]
            earlier = pending_by_pair.get(int(ids[k]), np.empty(0, dtype=np.int64))
            merged = concat(_replay_rows(log, earlier), _replay_rows(new, sel))
            replay = _in_order(merged, np.arange(len(merged["serial"])))
            track = apply_events(bases[k], *_args(merged, replay), seen=seen)
            rewound = True
            j = replay[-1]
            last = (int(merged["ts"][j]), int(merged["part"][j]), int(merged["off"][j]))
            last = max(last, head_key[k])
        settled_view(track, seen)
        new_heads.append(track)
        new_keys.append(last)
        updates.append(WindowUpdate(int(ids[k]), seen.windows, rewound, first[0]))
    _write_tracks(pairs, rows, new_heads, "h_")
    keys = np.asarray(new_keys, dtype=np.int64)
    pairs["head_ts"][rows], pairs["head_part"][rows], pairs["head_off"][rows] = keys[:, 0], keys[:, 1], keys[:, 2]
    return updates
