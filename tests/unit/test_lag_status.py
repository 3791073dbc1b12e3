"""Burrow's rules, one verdict per rule per case, hand-computed; and the commit window they read.

Window of N=5 commits, STALL/WARN need 3 commits, a zero-lag commit excuses a pause for 60 s.
Commits are (ts_ms, offset, lag at that commit). ``commits_stopped`` is
``(now - last) * (count - 1) > (last - first) * (N - 1)``: for 3 commits spanning 20 s that means
more than 40 s without a commit.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.lag.model import UNKNOWN, Status
from pipeline.lag.status import RULES, combine, verdicts
from pipeline.lag.window import Windows

N, MIN_COMMITS, GRACE = 5, 3, 60_000
T, F = True, False

# name: (commits, current lag, now, {rule: verdict} in RULES order, status)
CASES = {
    "ok_lag_touched_zero": (
        [(0, 100, 10), (10_000, 110, 0), (20_000, 120, 5)],
        5,
        25_000,
        (T, T, F, F, F, F, T),
        Status.OK,
    ),
    "warn_lag_never_decreased": (
        [(0, 100, 10), (10_000, 110, 10), (20_000, 120, 12)],
        12,
        25_000,
        (F, F, F, F, F, T, T),
        Status.WARN,
    ),
    "stall_commits_without_progress": (
        [(0, 100, 10), (10_000, 100, 12), (20_000, 100, 15)],
        15,
        25_000,
        (F, F, F, F, T, T, T),
        Status.STALL,
    ),
    "stop_no_commit_for_longer_than_span": (
        [(0, 100, 10), (10_000, 110, 8), (20_000, 120, 6)],
        9,
        120_000,
        (F, F, F, T, F, F, T),
        Status.STOP,
    ),
    "rewind_offset_went_back": (
        [(0, 100, 10), (10_000, 90, 20), (20_000, 95, 15)],
        15,
        25_000,
        (F, F, T, F, F, F, T),
        Status.REWIND,
    ),
    "rewind_outranks_stop": (
        [(0, 100, 10), (10_000, 90, 20), (20_000, 95, 15)],
        15,
        200_000,
        (F, F, T, T, F, F, T),
        Status.REWIND,
    ),
    "ok_stopped_but_recently_caught_up": (
        [(0, 100, 0), (10_000, 110, 0), (20_000, 120, 0)],
        30,
        70_000,
        (T, T, F, T, F, T, T),
        Status.OK,
    ),
    "stop_caught_up_long_ago": (
        [(0, 100, 0), (10_000, 110, 0), (20_000, 120, 0)],
        30,
        90_000,
        (T, F, F, T, F, T, T),
        Status.STOP,
    ),
    "ok_current_lag_zero_beats_stall": (
        [(0, 100, 10), (10_000, 100, 12), (20_000, 100, 15)],
        0,
        25_000,
        (F, F, F, F, T, T, T),
        Status.OK,
    ),
    "unknown_without_max_offset": (
        [(0, 100, UNKNOWN), (10_000, 110, UNKNOWN)],
        UNKNOWN,
        15_000,
        (F, F, F, F, F, F, F),
        Status.UNKNOWN,
    ),
    "ok_young_window_trends_wait": (
        [(0, 100, 10), (10_000, 100, 12)],
        12,
        15_000,
        (F, F, F, F, T, T, F),
        Status.OK,
    ),
    "stop_young_window_uses_full_span": (
        # 2 commits 10 s apart -> a full window spans 40 s; 50 s without a commit is a stop
        [(0, 100, 10), (10_000, 110, 12)],
        20,
        60_000,
        (F, F, F, T, F, T, F),
        Status.STOP,
    ),
    "ok_single_commit_proves_nothing": (
        [(0, 100, 10)],
        10,
        500_000,
        (F, F, F, F, F, F, F),
        Status.OK,
    ),
    "warn_full_window_exact_burrow_span": (
        # full window: span 40 s, 40 s since the last commit is not yet "longer than the span"
        [(0, 100, 5), (10_000, 101, 6), (20_000, 102, 7), (30_000, 103, 7), (40_000, 104, 8)],
        8,
        80_000,
        (F, F, F, F, F, T, T),
        Status.WARN,
    ),
    "stop_full_window_one_ms_later": (
        [(0, 100, 5), (10_000, 101, 6), (20_000, 102, 7), (30_000, 103, 7), (40_000, 104, 8)],
        8,
        80_001,
        (F, F, F, T, F, T, T),
        Status.STOP,
    ),
}


def test_cases_cover_every_status() -> None:
    assert {case[4] for case in CASES.values()} == set(Status)


@pytest.mark.parametrize("name", list(CASES))
def test_rule_verdicts_and_status(name: str) -> None:
    commits, current_lag, now, expected, status = CASES[name]
    w = Windows.from_lists([commits], N)
    got = verdicts(w, now, GRACE, MIN_COMMITS)
    assert {rule: bool(got[rule][0]) for rule in RULES} == dict(zip(RULES, expected))
    assert Status(int(combine(got, np.array([current_lag]))[0])) == status


def test_all_cases_in_one_vectorised_call() -> None:
    """The rules run over many queues at once and give each the verdict it gets alone."""
    names = list(CASES)
    w = Windows.from_lists([CASES[n][0] for n in names], N)
    now = np.array([CASES[n][2] for n in names])
    lags = np.array([CASES[n][1] for n in names])
    got = combine(verdicts(w, now, GRACE, MIN_COMMITS), lags)
    assert [Status(int(s)).name for s in got] == [CASES[n][4].name for n in names]


def test_status_order_is_severity() -> None:
    assert sorted(Status, key=int) == [
        Status.UNKNOWN,
        Status.OK,
        Status.WARN,
        Status.STALL,
        Status.STOP,
        Status.REWIND,
    ]


def window_rows(w: Windows) -> list[list[tuple[int, int, int]]]:
    out = []
    for i in range(len(w)):
        cols = range(w.size - int(w.count[i]), w.size)
        out.append([(int(w.ts[i, c]), int(w.offset[i, c]), int(w.lag[i, c])) for c in cols])
    return out


def test_window_append_keeps_last_n_newer_commits() -> None:
    w = Windows.from_lists([[(10, 1, 9), (20, 2, 8)], [], [(5, 7, 0)]], 3)
    pair = np.array([0, 1, 0, 0, 1, 2, 0])
    ts = np.array([30, 1, 20, 40, 2, 5, 50])
    off = np.array([3, 11, 99, 4, 12, 8, 5])
    lag = np.array([7, 0, 0, 6, 0, 0, 5])
    got, taken = w.append(pair, ts, off, lag)
    assert window_rows(got) == [
        [(30, 3, 7), (40, 4, 6), (50, 5, 5)],  # ts 20 is not newer than the window's last commit
        [(1, 11, 0), (2, 12, 0)],
        [(5, 7, 0)],  # a replayed commit (same ts) is a no-op
    ]
    assert taken.tolist() == [True, True, False, True, True, False, True]
    assert window_rows(w)[0] == [(10, 1, 9), (20, 2, 8)]  # the old windows are untouched


def test_window_same_timestamp_in_batch_last_wins() -> None:
    got, taken = Windows.empty(1, 4).append(
        np.array([0, 0]), np.array([7, 7]), np.array([1, 2]), np.array([0, 0])
    )
    assert window_rows(got) == [[(7, 2, 0)]] and taken.tolist() == [False, True]


def test_window_resize_keeps_newest() -> None:
    w = Windows.from_lists([[(1, 1, 1), (2, 2, 2), (3, 3, 3)]], 3)
    assert window_rows(w.resized(2)) == [[(2, 2, 2), (3, 3, 3)]]
    assert window_rows(w.resized(5)) == [[(1, 1, 1), (2, 2, 2), (3, 3, 3)]]
