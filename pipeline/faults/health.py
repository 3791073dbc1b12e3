"""``broker_health``: one row per broker and event-time minute, once the minute is final.

A minute is final when the watermark has reached its last millisecond: every later event is late.
So a row is written once and never revised. Percentiles are exact, from the minute's latencies
(numpy's default linear interpolation between order statistics). A minute with no sends writes no
row: the policy reads "a broker everyone avoids sends no health rows" (avoidance shows in the
windows and episodes instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.faults.events import REMOVED
from pipeline.faults.frame import Cols, group_bounds
from schemas.tables import utc_date

MINUTE_MS = 60_000
QUANTILES = (0.50, 0.95, 0.99)


def minute_of(ts: np.ndarray | int) -> Any:
    return (ts // MINUTE_MS) * MINUTE_MS


def final_minute_end(watermark_ms: int) -> int:
    """Minutes starting before this are final (their last millisecond is at or before the watermark)."""
    return minute_of(watermark_ms + 1)


def quantiles_sorted(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, q: float) -> np.ndarray:
    """Linear-interpolated quantile ``q`` of each sorted run ``values[starts[i]:ends[i]]``."""
    n = ends - starts
    pos = (n - 1) * q
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = pos - lo
    a = values[starts + lo].astype(np.float64)
    b = values[starts + hi].astype(np.float64)
    return a + (b - a) * frac


def avoiding_per_minute(
    windows: Cols, first_minute: int, end_minute: int, count_shadow: bool
) -> dict[tuple[int, int], int]:
    """(broker, minute) -> distinct producers with a window overlapping that minute."""
    use = (windows["start"] < end_minute) & (windows["end"] > first_minute)
    if not count_shadow:
        use &= windows["enable"]
    if not use.any():
        return {}
    start = np.maximum(windows["start"][use], first_minute)
    end = np.minimum(windows["end"][use], end_minute)  # exclusive
    m0 = minute_of(start)
    m1 = minute_of(end - 1)
    spans = (m1 - m0) // MINUTE_MS + 1
    brokers = np.repeat(windows["broker"][use].astype(np.int64), spans)
    pairs = np.repeat(windows["pair"][use], spans)
    offsets = np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans)
    minutes = np.repeat(m0, spans) + offsets * MINUTE_MS
    span = int(pairs.max()) + 1
    index = (minutes - first_minute) // MINUTE_MS
    width = int(index.max()) + 1
    bucket = brokers * width + index  # (broker, minute) as one integer
    distinct = np.unique(bucket * span + pairs)
    keys, counts = np.unique(distinct // span, return_counts=True)
    return {(int(k // width), first_minute + int(k % width) * MINUTE_MS): int(c) for k, c in zip(keys, counts)}


def minute_rows(
    log: Cols,
    windows: Cols,
    first_minute: int,
    end_minute: int,
    cluster: str,
    brokers: tuple[str, ...],
    errors: tuple[str, ...],
    count_shadow: bool,
) -> list[dict[str, Any]]:
    """Rows for every (broker, minute) with sends in ``[first_minute, end_minute)``."""
    ts = log["ts"]
    sel = np.flatnonzero((ts >= first_minute) & (ts < end_minute) & (log["status"] != REMOVED))  # sends only
    if len(sel) == 0:
        return []
    broker = log["broker"][sel].astype(np.int64)
    minute = minute_of(ts[sel])
    latency = log["latency"][sel]
    key = broker * (1 << 40) + (minute - first_minute) // MINUTE_MS
    order = np.lexsort((latency, key))
    key, latency = key[order], latency[order]
    failed = log["failed"][sel][order]
    pair = log["pair"][sel][order]
    err = log["err"][sel][order]
    starts, ends = group_bounds(key)
    sends = ends - starts
    failures = np.add.reduceat(failed.astype(np.int64), starts)
    pcts = [quantiles_sorted(latency, starts, ends, q) for q in QUANTILES]
    group_of = np.repeat(np.arange(len(starts), dtype=np.int64), sends)
    span = int(pair.max()) + 1
    active = np.bincount(np.unique(group_of * span + pair) // span, minlength=len(starts))
    by_error: list[dict[str, int]] = [{} for _ in starts]
    if failed.any():
        kinds = len(errors) + 1
        codes, counts = np.unique(group_of[failed] * kinds + err[failed], return_counts=True)
        for code, c in zip(codes.tolist(), counts.tolist()):
            by_error[code // kinds][errors[code % kinds]] = c
    avoiding = avoiding_per_minute(windows, first_minute, end_minute, count_shadow)
    rows = []
    for g in range(len(starts)):
        b = int(key[starts[g]] >> 40)
        m = first_minute + int(key[starts[g]] & ((1 << 40) - 1)) * MINUTE_MS
        n = int(sends[g])
        rows.append({
            "cluster": cluster,
            "broker_name": brokers[b],
            "minute_ms": m,
            "sends": n,
            "failures": int(failures[g]),
            "failures_by_error": dict(sorted(by_error[g].items())),
            "failure_rate": float(failures[g]) / n,
            "latency_p50_ms": float(pcts[0][g]),
            "latency_p95_ms": float(pcts[1][g]),
            "latency_p99_ms": float(pcts[2][g]),
            "latency_max_ms": int(latency[ends[g] - 1]),
            "active_producers": int(active[g]),
            "producers_avoiding": avoiding.get((b, m), 0),
            "event_date": utc_date(m),
        })
    return rows
