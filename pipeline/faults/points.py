"""Each broker's grid points for the cluster decision: what the episode rules read of a broker.

The episode rules compare a broker with all its peers, so with the fault state kept per (cluster,
shard), a few brokers of a cluster per key, no key can decide them. What a rule reads of one
broker at a grid point (:class:`episodes.Point`) depends only on that broker's sends and windows,
so the step writes those summaries per broker and :mod:`pipeline.faults.cluster` decides on them.
A broker's summaries are written when that broker gets events (not when only a peer in its state
does): for every grid point after the watermark where they can matter, computed as if no further
event came. Without further events that forecast is exact; with them the broker writes a new one,
and late events cannot change what the watermark has passed. So the rows do not depend on which
brokers share a state.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from pipeline.config import FaultsConfig
from pipeline.faults import episodes as ep_mod
from pipeline.faults.frame import Cols

# The integer fields of a Point, then p99; bucket_errors travels as JSON.
COUNTS = ("avoiding", "active", "sends", "failures", "failing", "slow", "bucket_sends", "bucket_failures")
HEADER = -1  # the tick of the row that only says "my forecast from here on is this emission"


def forecasts(
    log: Cols, wins: Cols, after: int, cluster: str, names: tuple[str, ...], codes: list[int],
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> list[dict[str, Any]]:
    """Point rows of the brokers ``codes`` (codes into ``names``, ascending) for every grid point
    after ``after`` where their sends or windows reach, each broker's rows after a header.

    The header row (tick ``HEADER``) makes an emission replace everything the broker said before
    for grid points after ``after``, even when it has no point left. ``log`` and ``wins`` may hold
    other brokers too: only the rows of ``codes`` within reach are read, sorted once by (broker,
    time), and each broker's points come from :func:`broker_points` over its block.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    slack = int(cfg.episode_close_after_s * 1000) + interval
    wanted = np.asarray(codes, dtype=np.int64)
    mine = np.isin(log["broker"], wanted)
    heads = np.full(len(wanted), HEADER, dtype=np.int64)
    if mine.any():  # each broker's latest send, whether within reach or not
        np.maximum.at(heads, np.searchsorted(wanted, log["broker"][mine]), log["ts"][mine])
    rows = np.flatnonzero(mine & (log["ts"] > after - reach))
    order = rows[log["ts"][rows].argsort(kind="stable")]
    order = order[ep_mod.stable_argsort(log["broker"][order])]
    recent = {name: log[name][order] for name in ep_mod.POINT_COLUMNS}
    starts = np.searchsorted(recent["broker"], wanted, side="left")
    stops = np.searchsorted(recent["broker"], wanted, side="right")
    win_use = np.ones(len(wins["pair"]), dtype=bool) if cfg.quorum_counts_shadow_windows else wins["enable"]
    live = wins["end"] > after
    out: list[dict[str, Any]] = []
    for k, code in enumerate(wanted.tolist()):
        broker, head = names[code], int(heads[k])
        out.append(_row(cluster, broker, after, head, HEADER, ep_mod.Point(), False))
        block = slice(int(starts[k]), int(stops[k]))
        ts = recent["ts"][block]
        mine_live = live & (wins["broker"] == code)
        if not len(ts) and not mine_live.any():
            continue
        spans_from = np.concatenate([ts, wins["start"][mine_live]])
        spans_to = np.concatenate([ts + reach, wins["end"][mine_live]]) + slack
        ticks = ep_mod.grid_times(spans_from, spans_to, after, int(spans_to.max()), interval)
        if not len(ticks):
            continue
        used = mine_live & win_use
        points, seen = broker_points(ticks, {name: col[block] for name, col in recent.items()},
                                     wins["start"][used], wins["end"][used], wins["pair"][used], errors, cfg)
        out.extend(_row(cluster, broker, after, head, t, p, s) for t, p, s in zip(ticks.tolist(), points, seen))
    return out


def broker_points(
    ticks: np.ndarray, sends: Cols, w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray,
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> tuple[list[ep_mod.Point], list[bool]]:
    """One broker's :class:`episodes.Point` at each of ``ticks``, and whether it had a send in the
    active-producer window there: what :func:`episodes.points_at` computes, over all ticks at once.

    ``sends`` holds the broker's log rows (:data:`episodes.POINT_COLUMNS`) in time order; the
    windows are the ones the quorum counts. A distinct count over a range of rows is the number of
    rows there whose pair does not come again before the range ends (:func:`episodes.next_same`),
    taken for every tick at once on a (ticks x rows) grid; only the p99s and the error counts of
    a tick with failures take a step per tick.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    act_ms, out_ms = int(cfg.active_producer_window_s * 1000), int(cfg.outlier_window_s * 1000)
    ts, lat, pair, failed = sends["ts"], sends["latency"], sends["pair"], sends["failed"]
    hi = np.searchsorted(ts, ticks, side="right")
    lo_out = np.searchsorted(ts, ticks - out_ms, side="right")
    lo_act = np.searchsorted(ts, ticks - act_ms, side="right")
    lo_bkt = np.searchsorted(ts, ticks - interval, side="right")
    cum_fail = np.concatenate([[0], np.cumsum(failed)])
    n_sends, failures = hi - lo_out, cum_fail[hi] - cum_fail[lo_out]
    bucket_sends, bucket_failures = hi - lo_bkt, cum_fail[hi] - cum_fail[lo_bkt]
    active = _distinct(pair, lo_act, hi)
    failing = _distinct_where(pair, failed, lo_out, hi)
    slow = _distinct_where(pair, lat >= cfg.outlier_min_latency_ms, lo_out, hi)
    avoiding, idle = _avoiding(ticks, w_start, w_end, w_pair, pair, lo_act, hi)
    points = []
    for k in range(len(ticks)):
        p = ep_mod.Point(avoiding=int(avoiding[k]), active=int(active[k] + idle[k]), sends=int(n_sends[k]),
                         failures=int(failures[k]), bucket_sends=int(bucket_sends[k]),
                         bucket_failures=int(bucket_failures[k]))
        if p.sends:
            p.p99 = ep_mod.quantile(lat[lo_out[k]:hi[k]], 0.99)
            p.failing, p.slow = int(failing[k]), int(slow[k])
        if p.bucket_failures:
            seg = slice(int(lo_bkt[k]), int(hi[k]))
            p.bucket_errors = Counter(errors[e] for e in sends["err"][seg][failed[seg]].tolist())
        points.append(p)
    return points, (hi - lo_act > 0).tolist()


def _distinct(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many distinct ``values`` each range ``[lo[k], hi[k])`` holds (``lo``, ``hi`` ascending)."""
    out = np.zeros(len(lo), dtype=np.int64)
    if not len(values):
        return out
    nxt = ep_mod.next_same(values)
    k = 0
    while k < len(lo):  # a few ticks at a time: the grid stays small when a backlog's ranges are long
        first = int(lo[k])
        stop = k + 1
        while stop < len(lo) and (stop + 1 - k) * (int(hi[stop]) - first) <= _GRID_CELLS:
            stop += 1
        last = int(hi[stop - 1])
        idx = np.arange(first, last)
        lo_k, hi_k = lo[k:stop, None], hi[k:stop, None]
        out[k:stop] = ((idx >= lo_k) & (idx < hi_k) & (nxt[first:last] >= hi_k)).sum(axis=1)
        k = stop
    return out


_GRID_CELLS = 1 << 20  # (ticks x rows) cells per step of _distinct


def _distinct_where(values: np.ndarray, where: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many distinct ``values`` of the rows selected by ``where`` each range ``[lo, hi)`` holds."""
    rows = np.flatnonzero(where)
    if not len(rows):
        return np.zeros(len(lo), dtype=np.int64)
    return _distinct(values[rows], np.searchsorted(rows, lo), np.searchsorted(rows, hi))


def _avoiding(
    ticks: np.ndarray, w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray, pair: np.ndarray,
    lo_act: np.ndarray, hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per tick: the producers with a window covering it, and how many of those sent nothing in
    the active window (they count as active all the same)."""
    avoiding = np.zeros(len(ticks), dtype=np.int64)
    idle = np.zeros(len(ticks), dtype=np.int64)
    covering = (w_start[None, :] <= ticks[:, None]) & (w_end[None, :] > ticks[:, None])
    if not covering.any():
        return avoiding, idle
    k, w = np.nonzero(covering)
    width = int(max(int(w_pair.max()), int(pair.max(initial=0)))) + 1
    combos = np.unique(k.astype(np.int64) * width + w_pair[w])  # each (tick, producer) once
    k, who = combos // width, combos % width
    avoiding += np.bincount(k, minlength=len(ticks))
    # a producer sent in the active window iff one of its rows lies in [lo_act, hi): rows sorted
    # by (pair, position), then one range count per (tick, producer)
    n = len(pair)
    keyed = np.sort(pair.astype(np.int64) * (n + 1) + np.arange(n))
    sent = (np.searchsorted(keyed, who * (n + 1) + hi[k]) - np.searchsorted(keyed, who * (n + 1) + lo_act[k])) > 0
    idle += np.bincount(k[~sent], minlength=len(ticks))
    return avoiding, idle


def _row(cluster: str, broker: str, after: int, head: int, tick: int, p: ep_mod.Point, seen: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"cluster": cluster, "broker_name": broker, "from_ms": after, "head_ms": head, "tick": tick}
    row.update({name: int(getattr(p, name)) for name in COUNTS})
    row["p99"] = float(p.p99)
    row["bucket_errors"] = json.dumps(dict(p.bucket_errors), sort_keys=True)
    row["seen"] = seen
    return row


def point_of(row: dict[str, Any]) -> ep_mod.Point:
    p = ep_mod.Point(**{name: int(row[name]) for name in COUNTS})  # type: ignore[arg-type]  # COUNTS: the int fields
    p.p99 = float(row["p99"])
    p.bucket_errors = Counter(json.loads(row["bucket_errors"]))
    return p


POINT_FIELDS = ("cluster", "broker_name", "from_ms", "head_ms", "tick", *COUNTS, "p99", "bucket_errors", "seen")
