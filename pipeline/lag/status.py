"""Burrow's evaluation rules, one small named function each, over many queues' windows at once.

Each rule returns one boolean per queue. :func:`verdicts` computes all of them (tests list every
rule's verdict per case) and :func:`combine` applies them in Burrow's order of severity:

1. ``lag_touched_zero``: the lag was zero at some commit in the window -> OK (Burrow rule 1);
2. ``offsets_rewound``: an offset went backwards -> REWIND (rule 2);
3. ``commits_stopped``: no commit for longer than the window's span -> STOP (rule 3), unless the
   queue was ``recently_caught_up`` (a zero-lag commit within ``caught_up_grace_ms``);
4. ``offsets_stalled``: commits that never move -> STALL (rule 4);
5. ``lag_not_decreasing``: the lag never went down -> WARN (rule 5).

Two deliberate departures, both because a young window proves nothing: STALL and WARN need
``min_commits`` commits (with one commit, "never moved" and "never decreased" are vacuously true);
and STOP on a window that is not full yet compares with the span a full window would have at the
same commit rate (for a full window that is exactly Burrow's rule). And STOP is judged even when the
window holds a zero-lag commit if that commit is older than the grace: Burrow would call a consumer
that died while caught up OK forever, although messages keep arriving.

Before any rule: an unknown current lag is UNKNOWN, a current lag of 0 is OK.
"""

from __future__ import annotations

import numpy as np

from pipeline.lag.model import UNKNOWN, Status
from pipeline.lag.window import Windows

I64 = np.int64


def lag_touched_zero(w: Windows) -> np.ndarray:
    """Rule 1: some commit in the window had zero lag."""
    return (w.valid() & (w.lag == 0)).any(axis=1)


def recently_caught_up(w: Windows, now_ms: np.ndarray | int, grace_ms: int) -> np.ndarray:
    """A zero-lag commit no older than ``grace_ms`` excuses a pause in commits."""
    recent = w.ts >= (np.asarray(now_ms, dtype=I64).reshape(-1, 1) - grace_ms)
    return (w.valid() & (w.lag == 0) & recent).any(axis=1)


def offsets_rewound(w: Windows) -> np.ndarray:
    """Rule 2: an offset is lower than the one committed before it."""
    return (w.consecutive() & (w.offset[:, 1:] < w.offset[:, :-1])).any(axis=1)


def commits_stopped(w: Windows, now_ms: np.ndarray | int) -> np.ndarray:
    """Rule 3: the time since the last commit exceeds the window's span (scaled up to a full window)."""
    first, last = w.first_ts(), w.last_ts()
    idle = np.asarray(now_ms, dtype=I64) - last
    # (now - last) > span * (N - 1) / (count - 1), in integers
    return (w.count >= 2) & (idle * (w.count - 1) > (last - first) * (w.size - 1))


def offsets_stalled(w: Windows) -> np.ndarray:
    """Rule 4: at least two commits and the offset never changed."""
    moved = (w.consecutive() & (w.offset[:, 1:] != w.offset[:, :-1])).any(axis=1)
    return (w.count >= 2) & ~moved


def lag_not_decreasing(w: Windows) -> np.ndarray:
    """Rule 5: between commits whose lags are known, the lag never went down."""
    known = w.consecutive() & (w.lag[:, 1:] != UNKNOWN) & (w.lag[:, :-1] != UNKNOWN)
    decreased = (known & (w.lag[:, 1:] < w.lag[:, :-1])).any(axis=1)
    return known.any(axis=1) & ~decreased


def window_complete(w: Windows, min_commits: int) -> np.ndarray:
    """Enough commits for the trend rules (STALL, WARN)."""
    return w.count >= min_commits


RULES = (
    "lag_touched_zero",
    "recently_caught_up",
    "offsets_rewound",
    "commits_stopped",
    "offsets_stalled",
    "lag_not_decreasing",
    "window_complete",
)


def verdicts(w: Windows, now_ms: np.ndarray | int, grace_ms: int, min_commits: int) -> dict[str, np.ndarray]:
    """Every rule's verdict for every queue."""
    return {
        "lag_touched_zero": lag_touched_zero(w),
        "recently_caught_up": recently_caught_up(w, now_ms, grace_ms),
        "offsets_rewound": offsets_rewound(w),
        "commits_stopped": commits_stopped(w, now_ms),
        "offsets_stalled": offsets_stalled(w),
        "lag_not_decreasing": lag_not_decreasing(w),
        "window_complete": window_complete(w, min_commits),
    }


def combine(v: dict[str, np.ndarray], current_lag: np.ndarray) -> np.ndarray:
    """The status per queue (``Status`` values as int8), rules applied in order of severity."""
    touched = v["lag_touched_zero"]
    trend = ~touched & v["window_complete"]
    conditions = [
        current_lag == UNKNOWN,
        current_lag == 0,
        ~touched & v["offsets_rewound"],
        v["commits_stopped"] & ~v["recently_caught_up"],
        touched,
        trend & v["offsets_stalled"],
        trend & v["lag_not_decreasing"],
    ]
    choices = [Status.UNKNOWN, Status.OK, Status.REWIND, Status.STOP, Status.OK, Status.STALL, Status.WARN]
    return np.select(conditions, [np.int8(c) for c in choices], default=np.int8(Status.OK)).astype(np.int8)


def evaluate(
    w: Windows, current_lag: np.ndarray, now_ms: np.ndarray | int, grace_ms: int, min_commits: int
) -> np.ndarray:
    return combine(verdicts(w, now_ms, grace_ms, min_commits), current_lag)
