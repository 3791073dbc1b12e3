"""Every (group, queue) judged at the batch clock, and the ``queue_lag`` rows that report it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.config import LagConfig
from pipeline.lag.model import KIND_NAMES, STATUS_NAMES, UNKNOWN
from pipeline.lag.registry import LagState
from pipeline.lag.startpos import (
    DEFAULT_TIMESTAMP_BACK_MS,
    POLICIES,
    applied_policy,
    effective_offsets,
)
from pipeline.lag.status import RuleParams, complete, evaluate
from pipeline.lag.timelag import METHOD_NAMES, time_lags
from schemas.lag import QUEUE_LAG
from schemas.tables import utc_date

I64 = np.int64


@dataclass(frozen=True)
class PairView:
    """What each pair looks like now; arrays aligned with the pairs table, UNKNOWN where unknown."""

    kind: np.ndarray
    max_offset: np.ndarray
    consumer_offset: np.ndarray
    lag: np.ndarray
    clamped: np.ndarray
    time_lag: np.ndarray
    method: np.ndarray
    status: np.ndarray
    start_policy: np.ndarray
    complete: np.ndarray  # share of the window holding commits (float32)


def group_policies(
    group_names: np.ndarray, gcodes: np.ndarray, cfg: LagConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ConsumeFromWhere code and configured start timestamp (UNKNOWN = RocketMQ default)."""
    settings = [cfg.for_group(str(g)) for g in group_names]
    codes = np.array([POLICIES.index(s.consume_from_where) for s in settings], dtype=I64)
    stamps = np.array(
        [UNKNOWN if s.consume_timestamp_ms is None else s.consume_timestamp_ms for s in settings], dtype=I64
    )
    return codes[gcodes], stamps[gcodes]


def start_timestamps(configured: np.ndarray, first_seen_ms: np.ndarray) -> np.ndarray:
    return np.where(configured != UNKNOWN, configured, first_seen_ms - DEFAULT_TIMESTAMP_BACK_MS)


def evaluate_pairs(state: LagState, now_ms: int, cfg: LagConfig) -> PairView:
    pairs, queues = state.pairs, state.queues
    qkeys = pairs["qkey"]
    rows = state.queue_rows(qkeys)
    kind = queues["kind"][rows]
    max_offset = queues["max_offset"][rows]
    raw = pairs["raw_offset"]
    policy, stamp = group_policies(state.group_names, pairs["gcode"], cfg)
    start_ts = start_timestamps(stamp, pairs["first_seen_ms"])
    offset = effective_offsets(raw, kind, policy, start_ts, max_offset, state.index, qkeys)
    known = (offset >= 0) & (max_offset != UNKNOWN)
    lag = np.where(known, np.maximum(max_offset - offset, 0), UNKNOWN)
    clamped = known & (offset > max_offset)
    time_lag, method = time_lags(state.index, qkeys, offset, max_offset, now_ms)
    broker_min = state.brokers.recent_min(now_ms, cfg.broker_offset_refresh_ms)[rows]
    status = evaluate(state.windows, lag, now_ms, broker_min, RuleParams.of(cfg))
    return PairView(
        kind=kind,
        max_offset=max_offset,
        consumer_offset=offset,
        lag=lag,
        clamped=clamped,
        time_lag=time_lag,
        method=method,
        status=status,
        start_policy=applied_policy(raw, kind, policy),
        complete=complete(state.windows),
    )


def nullable(values: np.ndarray, dtype: str = "Int64") -> pd.arrays.IntegerArray:
    """int64 with UNKNOWN -> a nullable integer column (null, never NaN)."""
    values = np.asarray(values, dtype=I64)
    return pd.arrays.IntegerArray(values.astype(dtype.lower()), values == UNKNOWN)


def queue_rows(state: LagState, view: PairView, rows: np.ndarray, now_ms: int) -> pd.DataFrame:
    """``queue_lag`` rows for the pairs at positions ``rows``, as of the batch clock."""
    pairs, queues = state.pairs, state.queues
    q = state.queue_rows(pairs["qkey"][rows])
    out = {
        "cluster": state.cluster,
        "consumer_group": state.group_names[pairs["gcode"][rows]],
        "topic": state.topic_names[queues["tcode"][q]],
        "topic_kind": np.array(KIND_NAMES, dtype=object)[view.kind[rows]],
        "broker_name": state.broker_names[queues["bcode"][q]],
        "queue_id": queues["queue_id"][q].astype(np.int32),
        "ts_ms": np.full(len(rows), now_ms, dtype=I64),
        "consumer_offset": nullable(view.consumer_offset[rows]),
        "broker_offset": nullable(view.max_offset[rows]),
        "lag_messages": nullable(view.lag[rows]),
        "offset_clamped": view.clamped[rows],
        "time_lag_ms": nullable(view.time_lag[rows]),
        "time_lag_method": METHOD_NAMES[view.method[rows]],
        "start_policy": view.start_policy[rows],
        "last_commit_ms": nullable(pairs["last_commit_ms"][rows]),
        "owner_client_id": pairs["owner"][rows],
        "reported_by": pairs["reported_by"][rows],
        "owner_mismatch": pairs["mismatch"][rows],
        "status": STATUS_NAMES[view.status[rows]],
        "event_date": utc_date(now_ms),
    }
    return pd.DataFrame({name: out[name] for name in QUEUE_LAG.columns}, copy=False)
