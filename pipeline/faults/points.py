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
from pipeline.faults.frame import Cols, take

# The integer fields of a Point, then p99; bucket_errors travels as JSON.
COUNTS = ("avoiding", "active", "sends", "failures", "failing", "slow", "bucket_sends", "bucket_failures")
HEADER = -1  # the tick of the row that only says "my forecast from here on is this emission"


def forecast(
    log: Cols, wins: Cols, after: int, cluster: str, broker: str, code: int, errors: tuple[str, ...],
    cfg: FaultsConfig,
) -> list[dict[str, Any]]:
    """Point rows of one broker for every grid point after ``after`` where its sends or windows reach.

    ``code`` is the broker's code in the state's ``log`` and ``wins`` (which may hold other
    brokers too: only the broker's own rows are read). The first row is a header (tick
    ``HEADER``): with it, an emission replaces everything the broker said before for grid points
    after ``after``, even when it has no point left.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    slack = int(cfg.episode_close_after_s * 1000) + interval
    # Only the broker's rows within reach, only the columns the points read: a shard's log holds
    # several brokers, and copying all of it per broker was a tenth of a live micro-batch's CPU.
    mine = log["broker"] == code
    head = int(log["ts"][mine].max()) if mine.any() else HEADER
    rows: list[dict[str, Any]] = [_row(cluster, broker, after, head, HEADER, ep_mod.Point(), False)]
    in_range = mine & (log["ts"] > after - reach)
    live = (wins["broker"] == code) & (wins["end"] > after)
    if not in_range.any() and not live.any():
        return rows
    recent = {name: log[name][in_range] for name in ep_mod.POINT_COLUMNS}
    spans_from = np.concatenate([recent["ts"], wins["start"][live]])
    spans_to = np.concatenate([recent["ts"] + reach, wins["end"][live]]) + slack
    ticks = ep_mod.grid_times(spans_from, spans_to, after, int(spans_to.max()), interval)
    if not len(ticks):
        return rows
    points = ep_mod.points_at(ticks, recent, take(wins, live), [code], errors, cfg)
    active_ms = int(cfg.active_producer_window_s * 1000)
    ts = np.sort(recent["ts"])
    sent = np.searchsorted(ts, ticks, side="right") - np.searchsorted(ts, ticks - active_ms, side="right")
    for k, t in enumerate(ticks.tolist()):
        rows.append(_row(cluster, broker, after, head, t, points[k][code], bool(sent[k] > 0)))
    return rows


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
