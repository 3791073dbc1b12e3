"""A queue's lag status: Burrow's evaluator, one small named function per rule, over many windows.

Two rule sets, chosen by name (``lag.rules``). ``burrow`` (the default) is Burrow's partition
evaluation in its order: STOP (unless a recent broker offset excuses the pause), REWIND (unless
recovered), OK when some lag was at most ``allowed_lag``, STALL, WARN; OK otherwise, and UNKNOWN
while the current lag is unknown. ``faultwatch`` keeps that order with four named departures
(docs/lag.md; ``DEPARTURES`` in ``tests/unit/test_lag_status.py`` shows each case): a RocketMQ window
that is young or quiet proves less than Burrow assumes (queues are handed over on every
rebalance), so trend rules wait for ``min_commits``, a young window's STOP scales its span, a
recent caught-up commit excuses a pause, and WARN needs two known lags.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import LagConfig
from pipeline.lag.model import UNKNOWN, Status
from pipeline.lag.window import Windows

I64 = np.int64
RULE_SETS = ("burrow", "faultwatch")


@dataclass(frozen=True)
class RuleParams:
    """The knobs the rules read: Burrow's ``allowed-lag`` and ``minimum-complete``, and faultwatch's own."""

    rules: str = "burrow"
    allowed_lag: int = 0
    minimum_complete: float = 0.0
    min_commits: int = 10
    caught_up_grace_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.rules not in RULE_SETS:
            raise ValueError(f"unknown lag rule set {self.rules!r}; valid names: {list(RULE_SETS)}")

    @staticmethod
    def of(cfg: LagConfig) -> RuleParams:
        """The rule knobs of a ``LagConfig``."""
        return RuleParams(
            rules=cfg.rules,
            allowed_lag=cfg.allowed_lag,
            minimum_complete=cfg.minimum_complete,
            min_commits=cfg.min_commits,
            caught_up_grace_ms=cfg.caught_up_grace_ms,
        )


def _known_lag(w: Windows) -> np.ndarray:
    return w.valid() & (w.lag != UNKNOWN)


def complete(w: Windows) -> np.ndarray:
    """Share of the window's slots holding a commit (float32, as Burrow computes it)."""
    return w.count.astype(np.float32) / np.float32(w.size)


def lag_always_not_zero(w: Windows, allowed_lag: int) -> np.ndarray:
    """Rule 1 (``isLagAlwaysNotZero``): no commit's known lag is at or below ``allowed_lag``."""
    return ~(_known_lag(w) & (w.lag <= allowed_lag)).any(axis=1)  # type: ignore[return-value]  # 2-D: an array


def offsets_rewind(w: Windows) -> np.ndarray:
    """Rule 2 (``checkIfOffsetsRewind``): position among the commits of the first offset lower than
    the one before it, -1 when none is."""
    down = w.consecutive() & (w.offset[:, 1:] < w.offset[:, :-1])
    col = np.argmax(down, axis=1) + 1  # window column of the lower commit
    first = w.size - w.count
    return np.where(down.any(axis=1), col - first, -1).astype(I64)


def rewind_recovered(w: Windows, rewind: np.ndarray) -> np.ndarray:
    """Rule 2, part 2 (``checkIfRewindRecovered``): a commit from the rewind on is back at or above
    the offset committed just before it."""
    out = np.zeros(len(w), dtype=bool)
    some = np.flatnonzero(rewind > 0)
    if len(some):
        out[some] = _recovered(w.take(some), rewind[some])
    return out


def _recovered(w: Windows, rewind: np.ndarray) -> np.ndarray:
    rows = np.arange(len(w))
    col = np.clip(w.size - w.count + rewind, 1, max(w.size - 1, 1))
    before = w.offset[rows, col - 1] if w.size > 1 else np.full(len(w), UNKNOWN, dtype=I64)
    after = np.arange(w.size)[None, :] >= col[:, None]
    back = (after & w.valid() & (w.offset >= before[:, None])).any(axis=1)
    return (rewind > 0) & back


def offsets_stopped(w: Windows, now_ms: np.ndarray | int) -> np.ndarray:
    """Rule 3 (``checkIfOffsetsStopped``): the time since the last commit exceeds the window's span."""
    last = w.last_ts()
    return (w.count >= 1) & (np.asarray(now_ms, dtype=I64) - last > last - w.first_ts())


def offsets_stopped_scaled(w: Windows, now_ms: np.ndarray | int) -> np.ndarray:
    """Rule 3, faultwatch: against the span a full window would have at the same commit rate."""
    first, last = w.first_ts(), w.last_ts()
    idle = np.asarray(now_ms, dtype=I64) - last
    # (now - last) > span * (N - 1) / (count - 1), in integers
    return (w.count >= 2) & (idle * (w.count - 1) > (last - first) * (w.size - 1))


def offsets_stalled(w: Windows) -> np.ndarray:
    """Rule 4 (``checkIfOffsetsStalled``): the offset never changed (true for a single commit)."""
    moved = (w.consecutive() & (w.offset[:, 1:] != w.offset[:, :-1])).any(axis=1)
    return (w.count >= 1) & ~moved


def _previous_known(w: Windows) -> tuple[np.ndarray, np.ndarray]:
    """Per slot: whether an earlier commit had a known lag, and the latest such lag."""
    known = _known_lag(w)
    cols = np.where(known, np.arange(w.size)[None, :], -1)
    latest = np.maximum.accumulate(cols, axis=1)
    prev_col = np.c_[np.full(len(w), -1), latest[:, :-1]]
    has_prev = prev_col >= 0
    prev_lag = np.take_along_axis(w.lag, np.maximum(prev_col, 0), axis=1)
    return has_prev, prev_lag


def lag_not_decreasing(w: Windows) -> np.ndarray:
    """Rule 5 (``checkIfLagNotDecreasing``): no known lag is below the previous known one."""
    valid = w.valid()
    gaps = (valid & (w.lag == UNKNOWN)).any(axis=1)
    pairs = valid[:, 1:] & valid[:, :-1]
    out = ~(pairs & (w.lag[:, 1:] < w.lag[:, :-1])).any(axis=1)  # every lag known: neighbours
    if gaps.any():  # unknown lags in between: compare with the previous known one
        some = w.take(np.flatnonzero(gaps))
        has_prev, prev_lag = _previous_known(some)
        out[gaps] = ~(_known_lag(some) & has_prev & (some.lag < prev_lag)).any(axis=1)
    return out


def two_known_lags(w: Windows) -> np.ndarray:
    """faultwatch: at least two commits with a known lag, so that a trend exists."""
    return _known_lag(w).sum(axis=1) >= 2


def recent_lag_zero(w: Windows, broker_min: np.ndarray | int) -> np.ndarray:
    """``checkIfRecentLagZero``: a recent broker offset is at or below the last committed offset.

    ``broker_min`` is the lowest of the queue's recent broker offsets (UNKNOWN = none known):
    "some offset <= the last commit" is "the lowest one is".
    """
    low = np.asarray(broker_min, dtype=I64)
    return (w.count >= 1) & (low != UNKNOWN) & (low <= w.last_offset())


def caught_up_recently(w: Windows, now_ms: np.ndarray | int, grace_ms: int, allowed_lag: int) -> np.ndarray:
    """faultwatch's stop excuse: a commit with lag <= ``allowed_lag`` no older than ``grace_ms``."""
    recent = w.ts >= (np.asarray(now_ms, dtype=I64).reshape(-1, 1) - grace_ms)
    return (_known_lag(w) & (w.lag <= allowed_lag) & recent).any(axis=1)  # type: ignore[return-value]  # 2-D: an array


BURROW_RULES = (
    "lag_always_not_zero",
    "offsets_rewind",
    "offsets_stopped",
    "offsets_stalled",
    "lag_not_decreasing",
    "recent_lag_zero",
)


def verdicts(
    w: Windows, now_ms: np.ndarray | int, broker_min: np.ndarray | int, p: RuleParams
) -> dict[str, np.ndarray]:
    """Every rule's verdict for every queue under the rule set ``p.rules``.

    The keys are the same for both sets: ``offsets_stopped``, ``excused`` and ``trend_ready`` hold
    the set's own form of rule 3, the stop excuse and the trend gate.
    """
    rewind = offsets_rewind(w)
    v = {
        "lag_always_not_zero": lag_always_not_zero(w, p.allowed_lag),
        "offsets_rewind": rewind,
        "rewind_recovered": rewind_recovered(w, rewind),
        "offsets_stalled": offsets_stalled(w),
        "lag_not_decreasing": lag_not_decreasing(w),
        "recent_lag_zero": recent_lag_zero(w, broker_min),
        "complete": complete(w),
    }
    if p.rules == "burrow":
        v["offsets_stopped"] = offsets_stopped(w, now_ms)
        v["excused"] = v["recent_lag_zero"]
        v["trend_ready"] = np.ones(len(w), dtype=bool)
    else:
        v["offsets_stopped"] = offsets_stopped_scaled(w, now_ms)
        v["excused"] = caught_up_recently(w, now_ms, p.caught_up_grace_ms, p.allowed_lag)
        v["trend_ready"] = w.count >= p.min_commits
        v["lag_not_decreasing"] = v["lag_not_decreasing"] & two_known_lags(w)
    return v


def combine(v: dict[str, np.ndarray], current_lag: np.ndarray, p: RuleParams) -> np.ndarray:
    """The status per queue (``Status`` values as int8): Burrow's order, first match wins."""
    current_lag = np.asarray(current_lag, dtype=I64)
    judged = (
        (current_lag > p.allowed_lag)
        & (v["complete"] > 0)
        & (v["complete"] >= np.float32(p.minimum_complete))
    )
    trend = judged & v["lag_always_not_zero"] & v["trend_ready"]
    conditions = [
        current_lag == UNKNOWN,
        judged & v["offsets_stopped"] & ~v["excused"],
        judged & (v["offsets_rewind"] > 0) & ~v["rewind_recovered"],
        trend & v["offsets_stalled"],
        trend & v["lag_not_decreasing"],
    ]
    choices = [Status.UNKNOWN, Status.STOP, Status.REWIND, Status.STALL, Status.WARN]
    return np.select(conditions, [np.int8(c) for c in choices], default=np.int8(Status.OK)).astype(np.int8)


def evaluate(
    w: Windows,
    current_lag: np.ndarray,
    now_ms: np.ndarray | int,
    broker_min: np.ndarray | int,
    p: RuleParams,
) -> np.ndarray:
    """The status of every queue: :func:`verdicts` combined by :func:`combine`."""
    return combine(verdicts(w, now_ms, broker_min, p), current_lag, p)
