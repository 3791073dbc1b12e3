"""Every cluster's fault state under one event-time watermark: what the Spark shim runs per batch.

The watermark follows Spark's rule: the largest event time seen in earlier batches minus
``stream.watermark_delay_s`` (0 before any event); an event at or before it is late. Events stamped
more than ``faults.max_future_skew_s`` after the batch time do not move it (one producer clock a
year ahead would otherwise make every later event late). It lives in the state, so a replayed
batch sees the same watermark, and the step settles windows, minutes and grid points up to the
next batch's watermark at once instead of waiting for another batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import FaultsConfig
from pipeline.faults.frame import Cols, nrows, take
from pipeline.faults.state import FaultOutputs, FaultState, initial_state, is_empty, stats_of, step


@dataclass(frozen=True)
class FleetState:
    watermark_ms: int = 0
    clusters: Mapping[str, FaultState] = field(default_factory=dict)


def next_watermark(watermark_ms: int, events: Cols, delay_ms: int, now_ms: int | None, skew_ms: int) -> int:
    ts = events["ts_ms"]
    if now_ms is not None:
        ts = ts[ts <= now_ms + skew_ms]
    return max(watermark_ms, int(ts.max()) - delay_ms) if len(ts) else watermark_ms


def fleet_step(
    fleet: FleetState, events: Cols, cfg: FaultsConfig, delay_ms: int, now_ms: int | None = None
) -> tuple[FleetState, FaultOutputs]:
    """One micro-batch of every cluster; outputs of all clusters together, by cluster name."""
    wm = fleet.watermark_ms
    upcoming = next_watermark(wm, events, delay_ms, now_ms, int(cfg.max_future_skew_s * 1000))
    names = events["cluster"]
    present = sorted(set(names.tolist())) if nrows(events) else []
    states: dict[str, FaultState] = dict(fleet.clusters)
    rows: dict[str, list[dict[str, Any]]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    wakeups, stats = [], {"clusters": 0}
    for cluster in sorted(set(states) | set(present)):
        if len(present) == 1 and cluster in present:
            mine = events
        else:
            mine = take(events, names == cluster)
        state, out = step(states.get(cluster) or initial_state(cluster), mine, wm, cfg, now_ms, upcoming)
        for key in rows:
            rows[key] += getattr(out, key)
        if out.wakeup_ms is not None:
            wakeups.append(out.wakeup_ms)
        if is_empty(state):
            states.pop(cluster, None)
        else:
            states[cluster] = state
            stats["clusters"] += 1
            for k, v in stats_of(state).items():
                stats[k] = stats.get(k, 0) + v
    outputs = FaultOutputs(rows["windows"], rows["episodes"], rows["health"], rows["quarantine"],
                           min(wakeups) if wakeups else None, stats)
    return FleetState(upcoming, states), outputs
