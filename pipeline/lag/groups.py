"""Group status: the worst main-topic queue, Burrow's group verdict, totals, and the alert rules.

A group's status, total lag, max time lag and worst queue come from its main topics only. Its
``%RETRY%`` and ``%DLQ%`` queues are summed apart (``retry_lag``, ``dlq_lag``), as
rocketmq-exporter reports retry and DLQ diffs: a retry backlog is messages that failed and wait for
a later attempt, a DLQ backlog is messages given up on; neither means the consumer is slow.

The worst queue is the most severe status, then the oldest unconsumed message, then the largest
lag, then the first in (group, queue registration) order, so ties always resolve the same way.

``status`` is the worst queue's own status (it says which rule fired). ``burrow_status`` is Burrow's
``evaluateConsumerStatus`` over the same queues: ERR when any is STOP, STALL or REWIND, else WARN
when any is WARN, else OK, and NOTFOUND once the group has no queue left; ``complete`` is the share
of queues whose window is full (0 without queues, 1 for NOTFOUND, as Burrow answers), and maxlag is
the first queue with the highest lag.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.config import LagConfig
from pipeline.lag.model import (
    GROUP_STATUS_NAMES,
    KIND_DLQ,
    KIND_MAIN,
    KIND_RETRY,
    STATUS_NAMES,
    UNKNOWN,
    GroupStatus,
    Status,
    topic_kind,
)
from pipeline.lag.registry import GROUPS, LagState
from pipeline.lag.report import PairView, nullable
from pipeline.lag.table import Table, lookup, unique_ints
from schemas.lag import GROUP_STATUS
from schemas.tables import utc_date

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
    """Aggregate ``values`` (``how``: "max" or "sum") by group code; UNKNOWN for groups without values."""
    known = values != UNKNOWN
    codes, values = codes[known], values[known]
    out = np.full(len(groups), UNKNOWN, dtype=I64)
    if len(codes) == 0:
        return out
    order = np.argsort(codes, kind="stable")
    codes, values = codes[order], values[order].astype(I64)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    totals = (np.maximum if how == "max" else np.add).reduceat(values, starts)
    pos, found = lookup(groups, codes[starts])
    out[pos[found]] = totals[found]
    return out


def _first_per_group(order: np.ndarray, codes: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per group, the first of ``order`` (positions sorted by code first) in its group; -1 for none."""
    out = np.full(len(groups), -1, dtype=I64)
    if len(order) == 0:
        return out
    s = codes[order]
    first = np.r_[True, s[1:] != s[:-1]]
    pos, found = lookup(groups, s[first])
    out[pos[found]] = order[first][found]
    return out


def worst_rows(
    codes: np.ndarray, status: np.ndarray, tlag: np.ndarray, lag: np.ndarray, groups: np.ndarray
) -> np.ndarray:
    """Index (into the given arrays) of each group's worst queue, -1 for groups with none."""
    order = np.lexsort((np.arange(len(codes)), -lag, -tlag, -status.astype(I64), codes))
    return _first_per_group(order, codes, groups)


def burrow_group_status(
    codes: np.ndarray, status: np.ndarray, groups: np.ndarray, known: np.ndarray
) -> np.ndarray:
    """Burrow's group status (``GroupStatus`` as int8) from its queues' statuses.

    ``known`` says which groups still have any queue at all; the others are NOTFOUND.
    """
    level = np.select(
        [np.isin(status, (Status.STOP, Status.STALL, Status.REWIND)), status == Status.WARN],
        [GroupStatus.ERR, GroupStatus.WARN],
        default=GroupStatus.OK,
    ).astype(I64)
    worst = _per_group(codes, level, groups, "max")
    out = np.where(worst == UNKNOWN, GroupStatus.OK, worst)
    return np.where(known, out, GroupStatus.NOTFOUND).astype(np.int8)


def group_complete(
    codes: np.ndarray, complete: np.ndarray, groups: np.ndarray, known: np.ndarray
) -> np.ndarray:
    """Share of each group's queues with a full window: 0 without queues, 1 when NOTFOUND (Burrow)."""
    pos = np.searchsorted(groups, codes)
    full = np.bincount(pos, weights=(complete == 1.0), minlength=len(groups))
    total = np.bincount(pos, minlength=len(groups))
    share = np.divide(full, total, out=np.zeros(len(groups)), where=total > 0)
    return np.where(known, share, 1.0)


def maxlag_rows(codes: np.ndarray, lag: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Index of each group's first queue with the highest lag (unknown lags lowest), -1 for none."""
    order = np.lexsort((np.arange(len(codes)), -lag, codes))
    return _first_per_group(order, codes, groups)


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


def _take(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]``; placeholders when ``values`` is empty (a group known only from a membership
    report, before any queue of its topic: nothing is present then, and the row says None)."""
    if len(values):
        return values[rows]
    return np.full(len(rows), None, dtype=object) if values.dtype == object else np.zeros(len(rows), values.dtype)


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

    known = np.isin(groups, codes)
    b_status = burrow_group_status(codes[main], status[main], groups, known)
    complete = group_complete(codes[main], view.complete[sel][main], groups, known)
    mrow = maxlag_rows(codes[main], lag[main], groups)
    has_max = mrow >= 0
    msel = sel[main][np.maximum(mrow, 0)] if main.any() else np.zeros(len(groups), dtype=I64)
    mq = state.queue_rows(pairs["qkey"][msel]) if len(pairs) else msel

    pos, had = lookup(previous["gcode"], groups)
    prev_status = np.full(len(groups), -1, dtype=np.int8)
    prev_status[had] = previous["status"][pos[had]]
    prev_above = np.zeros(len(groups), dtype=bool)
    prev_above[had] = previous["time_alert"][pos[had]]
    alert_s = status_alert(prev_status, g_status)
    alert_t, above = time_lag_alert(prev_above, max_tlag, cfg.time_lag_alert_ms)

    def pick(values: np.ndarray, present: np.ndarray = has_worst) -> np.ndarray:
        out = np.empty(len(groups), dtype=object)
        out[:] = [v if ok else None for v, ok in zip(values, present)]
        return out

    rows = {
        "cluster": state.cluster,
        "consumer_group": state.group_names[groups],
        "ts_ms": np.full(len(groups), now_ms, dtype=I64),
        "status": STATUS_NAMES[g_status],
        "previous_status": np.where(  # type: ignore[call-overload]  # numpy's stubs read None as omitted
            prev_status >= 0, STATUS_NAMES[np.maximum(prev_status, 0)], None
        ),
        "total_lag": nullable(_per_group(codes[main], lag[main], groups, "sum")),
        "max_time_lag_ms": nullable(max_tlag),
        "retry_lag": nullable(
            _per_group(codes[kind == KIND_RETRY], lag[kind == KIND_RETRY], groups, "sum")
        ),
        "dlq_lag": nullable(_per_group(codes[kind == KIND_DLQ], lag[kind == KIND_DLQ], groups, "sum")),
        "worst_topic": pick(_take(state.topic_names, _take(state.queues["tcode"], wq))),
        "worst_broker": pick(_take(state.broker_names, _take(state.queues["bcode"], wq))),
        "worst_queue_id": nullable(np.where(has_worst, _take(state.queues["queue_id"], wq), UNKNOWN), "Int32"),
        "worst_owner": pick(_take(pairs["owner"], wsel)),
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
        "burrow_status": GROUP_STATUS_NAMES[b_status],
        "complete": complete.astype(np.float64),
        "max_lag": nullable(np.where(has_max, _take(view.lag, msel), UNKNOWN)),
        "maxlag_topic": pick(_take(state.topic_names, _take(state.queues["tcode"], mq)), has_max),
        "maxlag_broker": pick(_take(state.broker_names, _take(state.queues["bcode"], mq)), has_max),
        "maxlag_queue_id": nullable(np.where(has_max, _take(state.queues["queue_id"], mq), UNKNOWN), "Int32"),
    }
    frame = pd.DataFrame({name: rows[name] for name in GROUP_STATUS.columns}, copy=False)
    return frame, _next_groups(state, previous, groups, g_status, above, now_ms)


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
