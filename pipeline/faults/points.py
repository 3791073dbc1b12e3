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
_NO_ERRORS = json.dumps({})


def forecasts(
    log: Cols, wins: Cols, after: int, cluster: str, names: tuple[str, ...], codes: list[int],
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> list[dict[str, Any]]:
    """Point rows of the brokers ``codes`` (codes into ``names``, ascending) for every grid point
    after ``after`` where their sends or windows reach, each broker's rows after a header.

    The header row (tick ``HEADER``) makes an emission replace everything the broker said before
    for grid points after ``after``, even when it has no point left. ``log`` and ``wins`` may hold
    other brokers too: only the rows of ``codes`` within reach are read, sorted once by (broker,
    time), and each broker's points come from :func:`episodes.broker_points` over its block.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    slack = int(cfg.episode_close_after_s * 1000) + interval
    wanted = np.asarray(codes, dtype=np.int64)
    mine = np.isin(log["broker"], wanted)
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
        block = slice(int(starts[k]), int(stops[k]))
        ts = recent["ts"][block]  # in time order
        broker, head = names[code], int(ts[-1]) if len(ts) else _latest(log, code)
        out.append(_row(cluster, broker, after, head, HEADER, ep_mod.Point(), False))
        mine_live = live & (wins["broker"] == code)
        if not len(ts) and not mine_live.any():
            continue
        spans_from = np.concatenate([ts, wins["start"][mine_live]])
        spans_to = np.concatenate([ts + reach, wins["end"][mine_live]]) + slack
        ticks = ep_mod.grid_times(spans_from, spans_to, after, int(spans_to.max()), interval)
        if not len(ticks):
            continue
        used = mine_live & win_use
        points, seen = ep_mod.broker_points(ticks, {name: col[block] for name, col in recent.items()},
                                     wins["start"][used], wins["end"][used], wins["pair"][used], errors, cfg)
        out.extend(_row(cluster, broker, after, head, t, p, s) for t, p, s in zip(ticks.tolist(), points, seen))
    return out


def _latest(log: Cols, code: int) -> int:
    """The broker's latest send (none within reach); HEADER if the log has none."""
    ts = log["ts"][log["broker"] == code]
    return int(ts.max()) if len(ts) else HEADER


def _row(cluster: str, broker: str, after: int, head: int, tick: int, p: ep_mod.Point, seen: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"cluster": cluster, "broker_name": broker, "from_ms": after, "head_ms": head, "tick": tick}
    row.update({name: int(getattr(p, name)) for name in COUNTS})
    row["p99"] = float(p.p99)
    row["bucket_errors"] = json.dumps(dict(p.bucket_errors), sort_keys=True) if p.bucket_errors else _NO_ERRORS
    row["seen"] = seen
    return row


def point_of(row: dict[str, Any]) -> ep_mod.Point:
    p = ep_mod.Point(**{name: int(row[name]) for name in COUNTS})  # type: ignore[arg-type]  # COUNTS: the int fields
    p.p99 = float(row["p99"])
    p.bucket_errors = Counter(json.loads(row["bucket_errors"]))
    return p


POINT_FIELDS = ("cluster", "broker_name", "from_ms", "head_ms", "tick", *COUNTS, "p99", "bucket_errors", "seen")
