"""``broker_fault_episodes``: when the fleet, not one producer, says a broker is in trouble.

Evaluated on an event-time grid (``faults.evaluation_interval_s``) at points the watermark has
passed, so a verdict never changes afterwards. At each grid point and for each broker, rules in
order, one small function each: ``quorum_holds`` (enough of its active producers avoid it: one
sick producer cannot condemn a broker), ``failure_outlier`` (Envoy's failure-percentage ejection
with a peer check: a cluster-wide failure is nobody's outlier) and ``latency_outlier`` (p99 far
above the peers' median). Both outlier rules also need the failures or slow sends to come from
``quorum_min_producers`` producers. An episode opens at the first point where a rule holds (its
reason is the first rule that held).

Silence is not recovery: once a broker is down the name server drops it from the routes and the
fleet stops sending to it, so no rule holds any more while it is still dead. An episode therefore
closes only on evidence (:func:`advance_episode`): grid points whose interval holds sends to the
broker that succeed (``healthy_bucket``) for ``episode_close_after_s`` with no rule holding and no
failing interval in between; ``closed_ms`` is where that stretch began. A broker nobody sends to
keeps its episode open until ``episode_max_silence_s`` after it was last heard of, when the episode
closes with ``closed_by`` "silence" (a broker decommissioned or renamed) instead of "recovery".
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.config import FaultsConfig
from pipeline.faults.frame import Cols

QUORUM, FAILURE_OUTLIER, LATENCY_OUTLIER = "quorum", "failure_rate_outlier", "latency_outlier"
# How an episode closed (``closed_by``): sends to the broker succeeded again, or nobody sent to it.
RECOVERY, SILENCE = "recovery", "silence"
NEVER = -1  # ``Episode.recovering`` when no healthy stretch is under way

EPISODE_SCHEMA: dict[str, str] = {
    "broker": "int32",
    "opened": "int64",
    "last_signal": "int64",
    "reason": "object",
    "peak_share": "float64",
    "peak_avoiding": "int64",
    "active_at_peak": "int64",
    "sends": "int64",
    "failures": "int64",
    "p99": "float64",
    "errors": "object",  # JSON {error class: failures}
    "pending": "object",  # JSON [sends, failures, {errors}] since the last signal
    "revision": "int64",
    "last_heard": "int64",  # the last grid point with a signal or sends to the broker
    "recovering": "int64",  # the first healthy grid point since the last bad one (NEVER: none)
}
# The columns fault states written before ``last_heard`` and ``recovering`` hold (pipeline.faults.codec).
EPISODE_SCHEMA_V5: dict[str, str] = {k: v for k, v in EPISODE_SCHEMA.items() if k not in ("last_heard", "recovering")}


def quorum_holds(avoiding: int, active: int, cfg: FaultsConfig) -> bool:
    return avoiding >= cfg.quorum_min_producers and active > 0 and avoiding / active >= cfg.quorum_share


def failure_outlier(
    rate: float, sends: int, peer_rates: list[float], cfg: FaultsConfig, producers: int | None = None
) -> bool:
    """``producers``: how many producers the failures came from (None: not checked)."""
    if sends < cfg.outlier_min_sends or len(peer_rates) < cfg.outlier_min_peers:
        return False
    if producers is not None and producers < cfg.quorum_min_producers:
        return False
    return rate >= cfg.outlier_failure_rate and float(np.median(peer_rates)) < cfg.outlier_failure_rate


def latency_outlier(
    p99: float, sends: int, peer_p99s: list[float], cfg: FaultsConfig, producers: int | None = None
) -> bool:
    """``producers``: how many producers had slow sends (None: not checked)."""
    if sends < cfg.outlier_min_sends or len(peer_p99s) < cfg.outlier_min_peers:
        return False
    if producers is not None and producers < cfg.quorum_min_producers:
        return False
    return p99 >= cfg.outlier_min_latency_ms and p99 >= cfg.outlier_latency_factor * float(np.median(peer_p99s))


@dataclass
class Point:
    """One broker at one grid point."""

    avoiding: int = 0
    active: int = 0
    sends: int = 0  # trailing outlier window
    failures: int = 0
    p99: float = 0.0
    failing: int = 0  # producers with a failure in the trailing window
    slow: int = 0  # producers with a send of at least outlier_min_latency_ms in it
    bucket_sends: int = 0  # (t - interval, t]
    bucket_failures: int = 0
    bucket_errors: Counter = field(default_factory=Counter)


def signal(b: int, points: dict[int, Point], cfg: FaultsConfig) -> str | None:
    """The first rule that holds for broker ``b`` among the cluster's ``points`` at one grid time."""
    me = points[b]
    if quorum_holds(me.avoiding, me.active, cfg):
        return QUORUM
    # An outlier rule holds only for a broker whose own figure passes its threshold: the peers are
    # gathered for those alone, so a grid point costs a pass over its brokers, not one per broker.
    rate = me.failures / me.sends if me.sends else 0.0
    if rate >= cfg.outlier_failure_rate and failure_outlier(
            rate, me.sends, [p.failures / p.sends for p in _peers(b, points, cfg)], cfg, me.failing):
        return FAILURE_OUTLIER
    if me.p99 >= cfg.outlier_min_latency_ms and latency_outlier(
            me.p99, me.sends, [p.p99 for p in _peers(b, points, cfg)], cfg, me.slow):
        return LATENCY_OUTLIER
    return None


def _peers(b: int, points: dict[int, Point], cfg: FaultsConfig) -> list[Point]:
    """The brokers ``b`` is compared with: the others with enough sends to be judged."""
    return [p for k, p in points.items() if k != b and p.sends >= cfg.outlier_min_sends]


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")``; small non-negative integers as uint16 (a radix sort)."""
    if values.dtype.kind in "iu" and len(values) and values.min() >= 0 and values.max() < 2**16:
        return values.astype(np.uint16).argsort(kind="stable")
    return values.argsort(kind="stable")


def next_same(values: np.ndarray) -> np.ndarray:
    """For each position, the next position holding the same value (``len(values)`` if none).

    The distinct values of ``values[lo:hi]`` are then ``values[lo:hi][next_same[lo:hi] >= hi]``, each
    once (its last occurrence in the range): a sliding count of distinct producers without sets.
    """
    n = len(values)
    out = np.full(n, n, dtype=np.int64)
    if n > 1:
        order = stable_argsort(values)  # equal values keep their positions' order
        same = values[order][1:] == values[order][:-1]
        out[order[:-1][same]] = order[1:][same]
    return out


def quantile(values: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation), by partial sort: ~3x faster on small arrays."""
    n = len(values)
    pos = (n - 1) * q
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (pos - lo))


# The log columns points_at reads.
POINT_COLUMNS = ("broker", "ts", "latency", "pair", "failed", "err")


def points_at(
    ticks: np.ndarray, log: Cols, windows: Cols, brokers: list[int], errors: tuple[str, ...], cfg: FaultsConfig
) -> list[dict[int, Point]]:
    """The per-broker :class:`Point` of every grid time in ``ticks`` (:func:`broker_points` per broker)."""
    result: list[dict[int, Point]] = [{b: Point() for b in brokers} for _ in ticks]
    win_use = np.ones(len(windows["pair"]), dtype=bool) if cfg.quorum_counts_shadow_windows else windows["enable"]
    # One sort by (broker, time) for all brokers; each broker's events are then a contiguous block.
    # Ties keep log order, as a per-broker stable sort by time would: a stable sort by time (the log
    # is nearly in time order already), then a stable one by broker.
    order = log["ts"].argsort(kind="stable")
    order = order[stable_argsort(log["broker"][order])]
    by_broker = log["broker"][order]
    starts = np.searchsorted(by_broker, brokers, side="left")
    stops = np.searchsorted(by_broker, brokers, side="right")
    for b, s0, s1 in zip(brokers, starts.tolist(), stops.tolist()):
        rows = order[s0:s1]
        wsel = np.flatnonzero((windows["broker"] == b) & win_use)
        points, _ = broker_points(ticks, {name: log[name][rows] for name in POINT_COLUMNS},
                                  windows["start"][wsel], windows["end"][wsel], windows["pair"][wsel], errors, cfg)
        for k, p in enumerate(points):
            result[k][b] = p
    return result


def broker_points(
    ticks: np.ndarray, sends: Cols, w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray,
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> tuple[list[Point], list[bool]]:
    """One broker's :class:`episodes.Point` at each of ``ticks``, and whether it had a send in the
    active-producer window there (:func:`broker_columns` as objects)."""
    cols = broker_columns(ticks, sends, w_start, w_end, w_pair, errors, cfg)
    counts = [cols[name].tolist() for name in POINT_COUNTS]
    points = [Point(**dict(zip(POINT_COUNTS, values)), p99=p99) for *values, p99 in zip(*counts, cols["p99"].tolist())]
    for k, errs in cols["bucket_errors"].items():
        points[k].bucket_errors = errs
    return points, cols["seen"].tolist()


# The integer fields of a Point.
POINT_COUNTS = ("avoiding", "active", "sends", "failures", "failing", "slow", "bucket_sends", "bucket_failures")


def broker_columns(
    ticks: np.ndarray, sends: Cols, w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray,
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> dict[str, Any]:
    """One broker's :class:`Point` fields at each of ``ticks`` as arrays (:func:`grid_columns`
    with one block); ``sends`` holds its log rows (:data:`POINT_COLUMNS`) in time order."""
    zeros = np.zeros(len(ticks), dtype=np.int64)
    return grid_columns(ticks, zeros, sends, np.zeros(len(sends["ts"]), dtype=np.int64),
                        w_start, w_end, w_pair, np.zeros(len(w_start), dtype=np.int64), errors, cfg)


def grid_columns(
    ticks: np.ndarray, tick_block: np.ndarray, sends: Cols, row_block: np.ndarray,
    w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray, w_block: np.ndarray,
    errors: tuple[str, ...], cfg: FaultsConfig,
) -> dict[str, Any]:
    """The :class:`Point` fields at each of ``ticks`` as arrays, over all ticks of several brokers
    at once; ``bucket_errors`` only for the ticks with failures in their bucket ({tick position:
    Counter}), and ``seen``: whether the broker had a send in the active-producer window there.

    Each broker is a block (``tick_block``, ``row_block``, ``w_block``: its number): ``sends``
    holds the brokers' log rows (:data:`POINT_COLUMNS`) in (block, time) order, ``ticks`` are in
    (block, time) order, the windows are the ones the quorum counts. A tick's rows are then one
    range of ``sends``, and the ranges ascend. A distinct count over a range of rows is the number
    of rows there whose pair does not come again before the range ends (:func:`next_same`; a pair
    is one producer and one broker, so it never crosses a block), taken for every tick at once
    (:func:`_distinct`); only the p99s and the error counts of a tick with failures take a step
    per tick.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    act_ms, out_ms = int(cfg.active_producer_window_s * 1000), int(cfg.outlier_window_s * 1000)
    ts, lat, pair, failed = sends["ts"], sends["latency"], sends["pair"], sends["failed"]
    # (block, time) as one ascending integer: ranges of every block from one search each
    low = [int(ticks.min()) - max(act_ms, out_ms, interval)] if len(ticks) else []
    high = [int(ticks.max())] if len(ticks) else []
    base = min([*low, *([int(ts.min())] if len(ts) else [])], default=0)
    span = max([*high, *([int(ts.max())] if len(ts) else [])], default=0) - base + 1
    keys = row_block * span + (ts - base)

    def ends(back: int) -> np.ndarray:
        return np.searchsorted(keys, tick_block * span + (ticks - back - base), side="right")

    hi, lo_out, lo_act, lo_bkt = ends(0), ends(out_ms), ends(act_ms), ends(interval)
    cum_fail = np.concatenate([[0], np.cumsum(failed)])
    n_sends = hi - lo_out
    avoiding, idle = _avoiding(ticks, tick_block, w_start, w_end, w_pair, w_block, pair, lo_act, hi)
    p99 = np.zeros(len(ticks), dtype=np.float64)
    for k, (a, b) in enumerate(zip(lo_out.tolist(), hi.tolist())):
        if b > a:
            p99[k] = quantile(lat[a:b], 0.99)
    bucket_failures = cum_fail[hi] - cum_fail[lo_bkt]
    bucket_errors = {}
    for k in np.flatnonzero(bucket_failures).tolist():
        seg = slice(int(lo_bkt[k]), int(hi[k]))
        bucket_errors[k] = Counter(errors[e] for e in sends["err"][seg][failed[seg]].tolist())
    return {
        "avoiding": avoiding, "active": _distinct(pair, lo_act, hi) + idle, "sends": n_sends,
        "failures": cum_fail[hi] - cum_fail[lo_out],
        "failing": _distinct_where(pair, failed, lo_out, hi),
        "slow": _distinct_where(pair, lat >= cfg.outlier_min_latency_ms, lo_out, hi),
        "bucket_sends": hi - lo_bkt, "bucket_failures": bucket_failures,
        "p99": p99, "bucket_errors": bucket_errors, "seen": hi - lo_act > 0,
    }


def _distinct(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many distinct ``values`` each range ``[lo[k], hi[k])`` holds (``lo``, ``hi`` ascending).

    Row ``i`` counts for range ``k`` when ``lo[k] <= i < hi[k] <= next_same[i]``: with ascending
    bounds those ``k`` are consecutive, found by search, and the counts are a sum of intervals.
    """
    out = np.zeros(len(lo), dtype=np.int64)
    if not len(values) or not len(lo) or int(hi[-1]) <= int(lo[0]):
        return out
    first, last = int(lo[0]), int(hi[-1])
    i = np.arange(first, last)
    start = np.searchsorted(hi, i, side="right")  # first range that ends after i
    stop = np.minimum(np.searchsorted(lo, i, side="right"),  # ranges that start at or before i ...
                      np.searchsorted(hi, next_same(values)[first:last], side="right"))  # ... and end before its next
    keep = start < stop
    bounds = np.bincount(start[keep], minlength=len(lo) + 1) - np.bincount(stop[keep], minlength=len(lo) + 1)
    return np.cumsum(bounds[:len(lo)])


def _distinct_where(values: np.ndarray, where: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many distinct ``values`` of the rows selected by ``where`` each range ``[lo, hi)`` holds."""
    rows = np.flatnonzero(where)
    if not len(rows):
        return np.zeros(len(lo), dtype=np.int64)
    return _distinct(values[rows], np.searchsorted(rows, lo), np.searchsorted(rows, hi))


def _avoiding(
    ticks: np.ndarray, tick_block: np.ndarray, w_start: np.ndarray, w_end: np.ndarray, w_pair: np.ndarray,
    w_block: np.ndarray, pair: np.ndarray, lo_act: np.ndarray, hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per tick: the producers with a window of its block covering it, and how many of those sent
    nothing in the active window (they count as active all the same)."""
    avoiding = np.zeros(len(ticks), dtype=np.int64)
    idle = np.zeros(len(ticks), dtype=np.int64)
    covering = ((w_start[None, :] <= ticks[:, None]) & (w_end[None, :] > ticks[:, None])
                & (w_block[None, :] == tick_block[:, None]))
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


@dataclass
class Episode:
    broker: int
    opened: int
    last_signal: int
    reason: str
    peak_share: float = 0.0
    peak_avoiding: int = 0
    active_at_peak: int = 0
    sends: int = 0
    failures: int = 0
    p99: float = 0.0
    errors: Counter = field(default_factory=Counter)
    pending: list = field(default_factory=lambda: [0, 0, Counter()])
    revision: int = 0
    last_heard: int = NEVER  # NEVER: the last signal
    recovering: int = NEVER
    changed: bool = False
    closed: int | None = None
    closed_by: str | None = None

    def __post_init__(self) -> None:
        if self.last_heard == NEVER:
            self.last_heard = self.last_signal

    def close(self, at: int, by: str) -> Episode:
        self.closed, self.closed_by, self.changed = at, by, True
        return self

    def take(self, p: Point, signalled: bool) -> None:
        if p.active and (p.avoiding / p.active > self.peak_share or p.avoiding > self.peak_avoiding):
            if p.avoiding / p.active > self.peak_share:
                self.peak_share = p.avoiding / p.active
                self.active_at_peak = p.active
            self.peak_avoiding = max(self.peak_avoiding, p.avoiding)
            self.changed = True
        if p.p99 > self.p99 and signalled:
            self.p99 = p.p99
            self.changed = True
        self.pending[0] += p.bucket_sends
        self.pending[1] += p.bucket_failures
        self.pending[2].update(p.bucket_errors)
        if signalled:
            self.sends += self.pending[0]
            self.failures += self.pending[1]
            self.errors.update(self.pending[2])
            self.changed = self.changed or self.pending[0] > 0
            self.pending = [0, 0, Counter()]


def healthy_bucket(p: Point, cfg: FaultsConfig) -> bool:
    """Whether the sends of the interval ending at this grid point show the broker working: some, and
    failing less than the failure-outlier rate (a broker back but still failing is not recovered)."""
    return p.bucket_sends > 0 and p.bucket_failures / p.bucket_sends < cfg.outlier_failure_rate


def on_grid(ms: float, interval: int) -> int:
    """``ms`` rounded up to a whole number of grid intervals."""
    return -(-int(ms) // interval) * interval


def confirm_ms(cfg: FaultsConfig, interval: int) -> int:
    """The healthy stretch that closes an episode: ``episode_close_after_s`` on the grid, at least one interval."""
    return max(interval, on_grid(cfg.episode_close_after_s * 1000, interval))


def silence_bound(ep: Episode, cfg: FaultsConfig, interval: int) -> int:
    """The grid point at which an episode whose broker nobody sends to closes."""
    return ep.last_heard + on_grid(cfg.episode_max_silence_s * 1000, interval)


def advance_episode(ep: Episode | None, b: int, t: int, reason: str | None, p: Point, cfg: FaultsConfig,
                    interval: int) -> tuple[Episode | None, Episode | None]:
    """One grid point for one broker: (the open episode after it, an episode that closed at it).

    A grid point where the broker has no sends, no windows and no signal changes nothing but can
    reach the silence bound: a grid skips such points (:func:`grid_times`), and
    :func:`evaluate_points` closes a silent episode at its bound between the points it runs.
    """
    if ep is None:
        if reason is None:
            return None, None
        ep = Episode(b, t, t, reason, changed=True)
        ep.take(p, True)
        return ep, None
    if reason is not None:
        ep.last_signal = ep.last_heard = t
        ep.recovering = NEVER
        ep.take(p, True)
        return ep, None
    if p.bucket_sends:
        ep.last_heard = t
        if not healthy_bucket(p, cfg):
            ep.recovering = NEVER
        else:
            ep.recovering = t if ep.recovering == NEVER else ep.recovering
            confirm = confirm_ms(cfg, interval)
            if t - ep.recovering + interval >= confirm:  # healthy sends over (t - confirm, t]
                return None, ep.close(t - confirm + interval, RECOVERY)
    elif t >= silence_bound(ep, cfg, interval):
        return None, ep.close(silence_bound(ep, cfg, interval), SILENCE)
    ep.take(p, False)
    return ep, None


def episode_row(
    ep: Episode, cluster: str, brokers: tuple[str, ...], updated_ms: int, cluster_brokers: int, state: str | None = None
) -> dict[str, Any]:
    """One ``broker_fault_episodes`` row; ``state`` overrides open/closed (suspected, withdrawn)."""
    dominant = None
    if ep.errors:
        dominant = min(ep.errors.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    broker = brokers[ep.broker]
    return {
        "episode_id": f"{cluster}|{broker}|{ep.opened}",
        "cluster": cluster,
        "broker_name": broker,
        "opened_ms": ep.opened,
        "closed_ms": ep.closed,
        "state": state or ("open" if ep.closed is None else "closed"),
        "reason": ep.reason,
        "peak_avoiding_share": ep.peak_share,
        "peak_avoiding_producers": ep.peak_avoiding,
        "active_producers": ep.active_at_peak,
        "sends": ep.sends,
        "failures": ep.failures,
        "p99_latency_ms": ep.p99,
        "dominant_error": dominant,
        "revision": ep.revision,
        "updated_ms": updated_ms,
        "cluster_brokers": cluster_brokers,
        "closed_by": ep.closed_by,
    }


def episodes_from_table(table: Cols) -> dict[int, Episode]:
    out = {}
    for i in range(len(table["broker"])):
        pending = json.loads(table["pending"][i])
        out[int(table["broker"][i])] = Episode(
            int(table["broker"][i]), int(table["opened"][i]), int(table["last_signal"][i]),
            str(table["reason"][i]), float(table["peak_share"][i]), int(table["peak_avoiding"][i]),
            int(table["active_at_peak"][i]), int(table["sends"][i]), int(table["failures"][i]),
            float(table["p99"][i]), Counter(json.loads(table["errors"][i])),
            [pending[0], pending[1], Counter(pending[2])], int(table["revision"][i]),
            int(table["last_heard"][i]), int(table["recovering"][i]),
        )
    return out


def episodes_to_table(episodes: dict[int, Episode]) -> Cols:
    eps = [episodes[b] for b in sorted(episodes)]
    cols: Cols = {}
    for name, dtype in EPISODE_SCHEMA.items():
        if name == "errors":
            values: list[Any] = [json.dumps(dict(e.errors), sort_keys=True) for e in eps]
        elif name == "pending":
            values = [json.dumps([e.pending[0], e.pending[1], dict(e.pending[2])], sort_keys=True) for e in eps]
        else:
            values = [getattr(e, name) for e in eps]
        arr = np.empty(len(values), dtype=dtype)
        arr[:] = values
        cols[name] = arr
    return cols


def grid_times(
    starts: np.ndarray, ends: np.ndarray, after: int, until: int, interval: int
) -> np.ndarray:
    """Grid points ``k * interval`` in ``(after, until]`` that lie in the union of ``[starts, ends]``.

    Away from every update and window nothing can signal and an open episode only waits for its
    silence bound (:func:`evaluate_points` closes it there), so an idle stretch of event time (or
    data years apart) costs nothing.
    """
    if len(starts) == 0:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    lo = s[new]
    hi = np.concatenate([e[np.flatnonzero(new)[1:] - 1], e[-1:]])
    out = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        first = max(a, after + 1)
        last = min(b, until)
        if first > last:
            continue
        k0 = -(-first // interval)
        k1 = last // interval
        if k1 >= k0:
            out.append(np.arange(k0, k1 + 1, dtype=np.int64) * interval)
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def evaluate(
    episodes: dict[int, Episode],
    ticks: np.ndarray,
    log: Cols,
    windows: Cols,
    brokers: list[int],
    errors: tuple[str, ...],
    cfg: FaultsConfig,
    until: int | None = None,
) -> list[Episode]:
    """Run the grid points ``ticks`` (ascending, up to ``until``); returns episodes closed on the way.

    ``episodes`` (open ones, by broker) is updated in place.
    """
    if len(ticks) == 0 or not brokers:
        return evaluate_points(episodes, [], [], cfg, until)
    return evaluate_points(episodes, ticks.tolist(), points_at(ticks, log, windows, brokers, errors, cfg), cfg, until)


def evaluate_points(
    episodes: dict[int, Episode], ticks: list[int], points: list[dict[int, Point]], cfg: FaultsConfig,
    until: int | None = None,
) -> list[Episode]:
    """The rules at each grid point over its brokers' :class:`Point` (``points[k]`` at ``ticks[k]``);
    returns the episodes closed on the way, ``episodes`` is updated in place.

    ``ticks`` are the grid points of ``(after, until]`` that have data; an open episode whose silence
    bound falls between them (or after the last, up to ``until``) closes there: its broker had no
    sends, windows or signal at that point, since the grid would hold it otherwise.
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    closed: list[Episode] = []
    for k, t in enumerate(ticks):
        closed += close_silent(episodes, t - 1, cfg, interval)
        for b in sorted(points[k]):
            reason = signal(b, points[k], cfg)
            ep, done = advance_episode(episodes.get(b), b, t, reason, points[k][b], cfg, interval)
            if ep is None:
                episodes.pop(b, None)
            else:
                episodes[b] = ep
            if done is not None:
                closed.append(done)
    if until is not None:
        closed += close_silent(episodes, until, cfg, interval)
    return closed


def close_silent(episodes: dict[int, Episode], upto: int, cfg: FaultsConfig, interval: int) -> list[Episode]:
    """Close (and remove) the open episodes whose :func:`silence_bound` is at or before ``upto``."""
    done = [e for e in episodes.values() if silence_bound(e, cfg, interval) <= upto]
    for e in sorted(done, key=lambda e: (silence_bound(e, cfg, interval), e.broker)):
        del episodes[e.broker]
        e.close(silence_bound(e, cfg, interval), SILENCE)
    return sorted(done, key=lambda e: (e.closed or 0, e.broker))
