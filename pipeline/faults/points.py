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
import pyarrow as pa

from pipeline.config import FaultsConfig
from pipeline.faults import episodes as ep_mod
from pipeline.faults.events import REMOVED
from pipeline.faults.frame import Cols

# The integer fields of a Point, then p99; bucket_errors travels as JSON.
COUNTS = ep_mod.POINT_COUNTS
HEADER = -1  # the tick of the row that only says "my forecast from here on is this emission"
_NO_ERRORS = json.dumps({})
POINT_FIELDS = ("cluster", "broker_name", "from_ms", "head_ms", "tick", *COUNTS, "p99", "bucket_errors", "seen")
_TYPES = {"cluster": pa.string(), "broker_name": pa.string(), "bucket_errors": pa.string(), "p99": pa.float64(),
          "seen": pa.bool_()}
POINT_SCHEMA = pa.schema([(f, _TYPES.get(f, pa.int64())) for f in POINT_FIELDS])


def forecasts(
    log: Cols, wins: Cols, after: int, cluster: str, names: tuple[str, ...], codes: list[int],
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> pa.Table:
    """Point rows (:data:`POINT_SCHEMA`) of the brokers ``codes`` (codes into ``names``, ascending)
    for every grid point after ``after`` where their sends or windows reach, each broker's rows
    after a header.

    The header row (tick ``HEADER``) makes an emission replace everything the broker said before
    for grid points after ``after``, even when it has no point left. ``log`` and ``wins`` may hold
    other brokers too: only the rows of ``codes`` within reach are read, sorted once by (broker,
    time), and each broker's points come from :func:`episodes.broker_columns` over its block.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    slack = int(cfg.episode_close_after_s * 1000) + interval
    wanted = np.asarray(codes, dtype=np.int64)
    mine = np.isin(log["broker"], wanted) & (log["status"] != REMOVED)  # sends only
    rows = np.flatnonzero(mine & (log["ts"] > after - reach))
    order = rows[log["ts"][rows].argsort(kind="stable")]
    order = order[ep_mod.stable_argsort(log["broker"][order])]
    recent = {name: log[name][order] for name in ep_mod.POINT_COLUMNS}
    starts = np.searchsorted(recent["broker"], wanted, side="left")
    stops = np.searchsorted(recent["broker"], wanted, side="right")
    live = wins["end"] > after
    heads, ticks = [], []
    for k, code in enumerate(wanted.tolist()):
        ts = recent["ts"][int(starts[k]):int(stops[k])]  # in time order
        heads.append(int(ts[-1]) if len(ts) else _latest(log, code))
        mine_live = live & (wins["broker"] == code)
        if not len(ts) and not mine_live.any():
            ticks.append(np.empty(0, dtype=np.int64))
            continue
        spans_from = np.concatenate([ts, wins["start"][mine_live]])
        spans_to = np.concatenate([ts + reach, wins["end"][mine_live]]) + slack
        ticks.append(ep_mod.grid_times(spans_from, spans_to, after, int(spans_to.max()), interval))
    # every broker's points in one pass, each broker a block (its position in ``wanted``)
    counts = np.asarray([len(t) for t in ticks], dtype=np.int64)
    blocks = np.arange(len(wanted))
    used = live & np.isin(wins["broker"], wanted) & (True if cfg.quorum_counts_shadow_windows else wins["enable"])
    all_ticks = np.concatenate(ticks) if ticks else np.empty(0, dtype=np.int64)
    cols = ep_mod.grid_columns(all_ticks, np.repeat(blocks, counts), recent, np.repeat(blocks, stops - starts),
                               wins["start"][used], wins["end"][used], wins["pair"][used],
                               np.searchsorted(wanted, wins["broker"][used]), errors, cfg)
    return _table(cluster, after, [names[c] for c in wanted.tolist()], heads, all_ticks, counts, cols)


def _table(cluster: str, after: int, brokers: list[str], heads: list[int], ticks: np.ndarray, counts: np.ndarray,
           cols: dict[str, Any]) -> pa.Table:
    """The rows: each broker's header, then a row per tick (``counts[k]`` ticks of broker ``k``)."""
    n = len(ticks) + len(brokers)
    at = np.arange(len(ticks)) + np.repeat(np.arange(len(brokers)) + 1, counts)  # each tick's row
    columns: dict[str, Any] = {
        "cluster": [cluster] * n, "from_ms": np.full(n, after, dtype=np.int64),
        "broker_name": np.repeat(np.asarray(brokers, dtype=object), counts + 1),
        "head_ms": np.repeat(np.asarray(heads, dtype=np.int64), counts + 1),
    }
    for name, values in (("tick", ticks), *((name, cols[name]) for name in (*COUNTS, "p99", "seen"))):
        column = np.full(n, HEADER, dtype=np.int64) if name == "tick" else np.zeros(n, dtype=values.dtype)
        column[at] = values
        columns[name] = column
    errors = np.full(n, _NO_ERRORS, dtype=object)
    for k, found in cols["bucket_errors"].items():
        errors[at[k]] = json.dumps(dict(found), sort_keys=True)
    columns["bucket_errors"] = errors
    return pa.Table.from_arrays([pa.array(columns[f.name], f.type) for f in POINT_SCHEMA], schema=POINT_SCHEMA)


def _latest(log: Cols, code: int) -> int:
    """The broker's latest send (none within reach); HEADER if the log has none."""
    ts = log["ts"][(log["broker"] == code) & (log["status"] != REMOVED)]
    return int(ts.max()) if len(ts) else HEADER


def point_of(row: dict[str, Any]) -> ep_mod.Point:
    p = ep_mod.Point(**{name: int(row[name]) for name in COUNTS})  # type: ignore[arg-type]  # COUNTS: the int fields
    p.p99 = float(row["p99"])
    p.bucket_errors = Counter(json.loads(row["bucket_errors"]))
    return p

