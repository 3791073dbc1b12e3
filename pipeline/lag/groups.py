"""Group status: the worst main-topic queue (Burrow), totals, and the alert rules.

A group's status, total lag, max time lag and worst queue come from its main topics only. Its
``%RETRY%`` and ``%DLQ%`` queues are summed apart (``retry_lag``, ``dlq_lag``), as
rocketmq-exporter reports retry and DLQ diffs: a retry backlog is messages that failed and wait for
a later attempt, a DLQ backlog is messages given up on; neither means the consumer is slow.

The worst queue is the most severe status, then the oldest unconsumed message, then the largest
lag, then the first in (group, queue registration) order, so ties always resolve the same way.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.config import LagConfig
from pipeline.lag.model import KIND_DLQ, KIND_MAIN, KIND_RETRY, STATUS_NAMES, UNKNOWN, Status, topic_kind
from pipeline.lag.registry import GROUPS, LagState
from pipeline.lag.report import PairView, nullable, utc_date
from pipeline.lag.table import Table, lookup, unique_ints
from schemas.lag import GROUP_STATUS

I64 = np.int64


def status_alert(previous: np.ndarray, status: np.ndarray) -> np.ndarray:
    """A transition to WARN or worse (a group's first row counts as a transition)."""
    return (status != previous) & (status >= Status.WARN)


def time_lag_alert(
    previously_above: np.ndarray, max_time_lag: np.ndarray, bound_ms: int
) -> tuple[np.ndarray, np.ndarray]:
    """(alert now, above the bound): alert once when the max time lag crosses above the bound."""
    above = (max_time_lag != UNKNOWN) & (max_time_lag > bound_ms)
    return above & ~previously_above, above


def _per_group(codes: np.ndarray, values: np.ndarray, groups: np.ndarray, how: str) -> np.ndarray:
    """Aggregate ``values`` by group code; UNKNOWN for groups without values."""
    known = values != UNKNOWN
    agg = pd.Series(values[known]).groupby(codes[known]).agg(how)
    return agg.reindex(groups).fillna(UNKNOWN).to_numpy(dtype=I64)


def worst_rows(
    codes: np.ndarray, status: np.ndarray, tlag: np.ndarray, lag: np.ndarray, groups: np.ndarray
) -> np.ndarray:
    """Index (into the given arrays) of each group's worst queue, -1 for groups with none."""
    order = np.lexsort((np.arange(len(codes)), -lag, -tlag, -status.astype(I64), codes))
    first = np.r_[True, codes[order][1:] != codes[order][:-1]] if len(order) else np.zeros(0, dtype=bool)
    best = pd.Series(order[first], index=codes[order][first])
    return best.reindex(groups).fillna(-1).to_numpy(dtype=I64)


def idle_consumers(state: LagState, groups: np.ndarray) -> list[list[str]]:
    """Members that own no queue in any main topic of their group (more consumers than queues).

    Allocation already lists each topic's members without a share; one idle in topic A may own
    queues of topic B, so candidates are checked against the group's main-topic owners.
    """
    m = state.members
    rows = np.flatnonzero(np.isin(m["gcode"], groups))
    idle: dict[int, set[str]] = {}
    for r in rows:
        if m["idle"][r] and topic_kind(str(state.topic_names[m["tcode"][r]])) == KIND_MAIN:
            idle.setdefault(int(m["gcode"][r]), set()).update(m["idle"][r])
    out = []
    for g in groups:
        candidates = idle.get(int(g), set())
        if candidates:
            lo, hi = np.searchsorted(state.pairs["pkey"], [int(g) << 32, (int(g) + 1) << 32])
            kinds = state.queues["kind"][state.queue_rows(state.pairs["qkey"][lo:hi])]
            candidates = candidates - set(state.pairs["owner"][lo:hi][kinds == KIND_MAIN])
        out.append(sorted(candidates))
    return out


def group_rows(
    state: LagState, view: PairView, previous: Table, touched: np.ndarray, now_ms: int, cfg: LagConfig
) -> tuple[pd.DataFrame, Table]:
    """``group_status`` rows for the ``touched`` group codes, and the updated ``groups`` table."""
    groups = unique_ints(np.asarray(touched, dtype=I64))
    if len(groups) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in GROUP_STATUS.columns}), previous
    pairs = state.pairs
    sel = np.flatnonzero(np.isin(pairs["gcode"], groups))
    codes, kind = pairs["gcode"][sel], view.kind[sel]
    lag, tlag, status = view.lag[sel], view.time_lag[sel], view.status[sel]
    main = kind == KIND_MAIN
    g_status = _per_group(codes[main], status[main].astype(I64), groups, "max")
    g_status = np.where(g_status == UNKNOWN, Status.UNKNOWN, g_status).astype(np.int8)
    max_tlag = _per_group(codes[main], tlag[main], groups, "max")
    worst = worst_rows(codes[main], status[main], tlag[main], lag[main], groups)
    has_worst = worst >= 0
    wsel = sel[main][np.maximum(worst, 0)] if main.any() else np.zeros(len(groups), dtype=I64)
    wq = state.queue_rows(pairs["qkey"][wsel]) if len(pairs) else wsel

    pos, had = lookup(previous["gcode"], groups)
    prev_status = np.full(len(groups), -1, dtype=np.int8)
    prev_status[had] = previous["status"][pos[had]]
    prev_above = np.zeros(len(groups), dtype=bool)
    prev_above[had] = previous["time_alert"][pos[had]]
    alert_s = status_alert(prev_status, g_status)
    alert_t, above = time_lag_alert(prev_above, max_tlag, cfg.time_lag_alert_ms)

    def pick(values: np.ndarray) -> np.ndarray:
        out = np.empty(len(groups), dtype=object)
        out[:] = [v if ok else None for v, ok in zip(values, has_worst)]
        return out

    rows = pd.DataFrame(
        {
            "cluster": state.cluster,
            "consumer_group": state.group_names[groups],
            "ts_ms": np.full(len(groups), now_ms, dtype=I64),
            "status": STATUS_NAMES[g_status],
            "previous_status": np.where(prev_status >= 0, STATUS_NAMES[np.maximum(prev_status, 0)], None),
            "total_lag": nullable(_per_group(codes[main], lag[main], groups, "sum")),
            "max_time_lag_ms": nullable(max_tlag),
            "retry_lag": nullable(
                _per_group(codes[kind == KIND_RETRY], lag[kind == KIND_RETRY], groups, "sum")
            ),
            "dlq_lag": nullable(_per_group(codes[kind == KIND_DLQ], lag[kind == KIND_DLQ], groups, "sum")),
            "worst_topic": pick(state.topic_names[state.queues["tcode"][wq]]),
            "worst_broker": pick(state.broker_names[state.queues["bcode"][wq]]),
            "worst_queue_id": nullable(np.where(has_worst, state.queues["queue_id"][wq], UNKNOWN), "Int32"),
            "worst_owner": pick(pairs["owner"][wsel]),
            "queues": np.bincount(np.searchsorted(groups, codes[main]), minlength=len(groups)).astype(
                np.int32
            ),
            "mismatched_queues": np.bincount(
                np.searchsorted(groups, codes), weights=pairs["mismatch"][sel], minlength=len(groups)
            ).astype(np.int32),
            "idle_consumers": idle_consumers(state, groups),
            "alert": alert_s | alert_t,
            "alert_reason": _reasons(
                prev_status, g_status, alert_s, alert_t, max_tlag, cfg.time_lag_alert_ms
            ),
            "event_date": utc_date(now_ms),
        }
    )
    return rows[GROUP_STATUS.columns], _next_groups(state, previous, groups, g_status, above, now_ms)


def _reasons(
    prev: np.ndarray,
    status: np.ndarray,
    alert_s: np.ndarray,
    alert_t: np.ndarray,
    tlag: np.ndarray,
    bound: int,
) -> list[str | None]:
    out: list[str | None] = []
    for p, s, a, b, t in zip(prev, status, alert_s, alert_t, tlag):
        parts = [f"status {STATUS_NAMES[p] if p >= 0 else 'NEW'}->{STATUS_NAMES[s]}"] if a else []
        parts += [f"max time lag {t} ms > {bound} ms"] if b else []
        out.append(";".join(parts) or None)
    return out


def _next_groups(
    state: LagState, previous: Table, groups: np.ndarray, status: np.ndarray, above: np.ndarray, now_ms: int
) -> Table:
    """Touched groups replace their rows; groups without any queue left are forgotten."""
    others = previous.take(np.flatnonzero(~np.isin(previous["gcode"], groups)))
    fresh = Table(
        {
            "gcode": groups,
            "status": status,
            "time_alert": above,
            "ts_ms": np.full(len(groups), now_ms, dtype=I64),
        }
    )
    table = others.append(dict(fresh.cols))
    table = table.take(np.argsort(table["gcode"], kind="stable"))
    alive = np.isin(table["gcode"], state.pairs["gcode"])
    out = table.take(np.flatnonzero(alive))
    assert set(out.names) == set(GROUPS)
    return out
