"""Avoidance windows for a whole batch at once, with numpy.

Same result as :func:`pipeline.rocketmq.windows.derive_windows` (a test holds them equal), computed
without a Python loop per event so that rule evaluation never limits the pipeline. The trick is that
the avoid-until time after each event has a closed form per broker: ``ts + duration`` in 4.9, and a
running maximum of ``ts + duration`` over updates with ``duration > 0`` (starting at 0) in 5. Windows
then follow from comparing, per (broker, timestamp) group, that time with the group's timestamp.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from pipeline.rocketmq.fault import Generation
from pipeline.rocketmq.windows import Window, as_event

_I64 = np.int64


class WindowArrays(NamedTuple):
    """Windows as parallel arrays, ordered by ``trigger_index`` (see :class:`Window`)."""

    broker_code: np.ndarray
    start_ms: np.ndarray
    end_ms: np.ndarray
    trigger_index: np.ndarray
    last_index: np.ndarray
    latency_ms: np.ndarray
    isolation: np.ndarray


def durations_array(gen: Generation, latency: np.ndarray, isolation: np.ndarray) -> np.ndarray:
    """``computeNotAvailableDuration`` for every event (scan from the last table entry down)."""
    lat = np.where(isolation, _I64(gen.isolation_latency), latency.astype(_I64, copy=False))
    out = np.zeros(lat.shape, dtype=_I64)
    unset = np.ones(lat.shape, dtype=bool)
    for limit, duration in zip(reversed(gen.latency_max), reversed(gen.not_available_duration)):
        hit = unset & (lat >= limit)
        out[hit] = duration
        unset &= ~hit
    return out


def _segmented_cummax(values: np.ndarray, seg_first: np.ndarray) -> np.ndarray:
    """Running maximum of non-negative ``values`` that restarts where ``seg_first`` is True."""
    if values.size == 0:
        return values
    seg_id = np.cumsum(seg_first) - 1
    span = int(values.max()) + 1
    if span * (int(seg_id[-1]) + 1) < 2**62:
        keyed = seg_id.astype(_I64) * span + values
        return np.maximum.accumulate(keyed) - seg_id * span
    out = np.empty_like(values)
    bounds = np.flatnonzero(seg_first).tolist() + [values.size]
    for lo, hi in itertools.pairwise(bounds):
        out[lo:hi] = np.maximum.accumulate(values[lo:hi])
    return out


def _stable_broker_order(codes: np.ndarray) -> np.ndarray:
    """Event positions grouped by broker, in input order within a broker (radix sort if it can)."""
    if codes.size and codes.min() >= 0 and codes.max() < 2**16:
        return np.argsort(codes.astype(np.uint16), kind="stable")
    return np.argsort(codes, kind="stable")


def derive_windows_arrays(
    gen: Generation,
    ts: np.ndarray,
    broker_codes: np.ndarray,
    latency: np.ndarray,
    isolation: np.ndarray,
) -> WindowArrays:
    """All avoidance windows of one producer's ordered send results (ts non-decreasing)."""
    ts = np.asarray(ts, dtype=_I64)
    codes = np.asarray(broker_codes)
    n = ts.size
    if not (codes.size == n == np.size(latency) == np.size(isolation)):
        raise ValueError("ts, broker_codes, latency and isolation must have the same length")
    if n and np.any(ts[1:] < ts[:-1]):
        raise ValueError("ts must be non-decreasing")
    iso = np.asarray(isolation, dtype=bool)
    lat = np.asarray(latency, dtype=_I64)
    duration = durations_array(gen, lat, iso)

    order = _stable_broker_order(codes)
    b, t, d = codes[order], ts[order], duration[order]
    seg_first = np.ones(n, dtype=bool)
    seg_first[1:] = b[1:] != b[:-1]
    if gen.windows_only_grow:
        start = _segmented_cummax(np.where(d > 0, t + d, 0), seg_first)
    else:
        start = t + d
    changed = seg_first.copy()
    changed[1:] |= start[1:] != start[:-1]

    # One row per (broker, ts) group: its last event, and the last event in it that changed start.
    group_last = np.ones(n, dtype=bool)
    group_last[:-1] = seg_first[1:] | (t[1:] != t[:-1])
    group_first = np.ones(n, dtype=bool)
    group_first[1:] = group_last[:-1]
    pos = np.arange(n)
    last_changed = np.maximum.accumulate(np.where(changed, pos, -1))
    first_pos = np.maximum.accumulate(np.where(group_first, pos, 0))
    rows = np.flatnonzero(group_last)
    gt, gs, gb = t[rows], start[rows], b[rows]
    gchg = np.where(last_changed[rows] >= first_pos[rows], last_changed[rows], -1)
    gfirst = seg_first[first_pos[rows]]

    active = gs > gt
    prev_s = np.empty_like(gs)
    prev_s[1:] = gs[:-1]
    touches = np.zeros(gt.size, dtype=bool)  # the previous group's piece reaches this group's ts
    touches[1:] = ~gfirst[1:] & active[:-1] & (prev_s[1:] >= gt[1:])
    opens = active & ~touches
    net_change = np.ones(gt.size, dtype=bool)
    net_change[1:] = gfirst[1:] | (gs[1:] != prev_s[1:])

    # A window's groups are consecutive active rows: the opening row and the touching ones after it.
    member = np.flatnonzero(active)
    open_rows = np.flatnonzero(opens)
    n_win = open_rows.size
    member_first = np.flatnonzero(opens[member])
    last_row = np.empty(n_win, dtype=np.intp)
    if n_win:
        last_row[:-1] = member[member_first[1:] - 1]
        last_row[-1] = member[-1]
        cand = np.where(net_change[member], gchg[member], -1)
        last_pos = np.maximum.reduceat(cand, member_first)
    else:
        last_pos = np.empty(0, dtype=np.intp)
    end = gs[last_row].copy()

    # A touching but inactive next group ends the window at its ts (cut short in 4.9 if earlier).
    nxt = last_row + 1
    has_next = nxt < gt.size
    closer = np.zeros(n_win, dtype=bool)
    closer[has_next] = touches[nxt[has_next]] & ~active[nxt[has_next]]
    if closer.any():
        rows_c, next_c = last_row[closer], nxt[closer]
        cut = gs[rows_c] > gt[next_c]
        end[closer] = gt[next_c]
        idx_c = np.flatnonzero(closer)[cut]
        last_pos[idx_c] = gchg[next_c[cut]]

    trigger = order[gchg[open_rows]]
    result_order = np.argsort(trigger, kind="stable")
    return WindowArrays(
        broker_code=gb[open_rows][result_order],
        start_ms=gt[open_rows][result_order],
        end_ms=end[result_order],
        trigger_index=trigger[result_order],
        last_index=order[last_pos][result_order],
        latency_ms=lat[trigger][result_order],
        isolation=iso[trigger][result_order],
    )


def windows_from_arrays(arrays: WindowArrays, broker_names: Sequence[str]) -> list[Window]:
    """Turn :class:`WindowArrays` into :class:`Window` objects, naming brokers by code."""
    return [
        Window(broker_names[int(code)], int(s), int(e), int(ti), int(li), int(lat), bool(iso))
        for code, s, e, ti, li, lat, iso in zip(*arrays)
    ]


def encode_events(events: Sequence[object]) -> tuple[list[str], tuple[np.ndarray, ...]]:
    """Events (as accepted by ``derive_windows``) to broker names and the four input arrays."""
    evs = [as_event(e) for e in events]
    names: dict[str, int] = {}
    codes = np.fromiter((names.setdefault(e.broker, len(names)) for e in evs), dtype=np.int32, count=len(evs))
    ts = np.fromiter((e.ts_ms for e in evs), dtype=_I64, count=len(evs))
    lat = np.fromiter((e.latency_ms for e in evs), dtype=_I64, count=len(evs))
    iso = np.fromiter((bool(e.isolation) for e in evs), dtype=bool, count=len(evs))
    return list(names), (ts, codes, lat, iso)
