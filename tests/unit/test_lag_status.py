"""The "faultwatch" rule set, one verdict per rule per case, hand-computed; the commit window and the
broker offset samples the rules read. (Burrow's own cases are in test_lag_burrow.py.)

Window of N=5 commits, STALL/WARN need 3 commits, a commit with zero lag excuses a pause for 60 s.
Commits are (ts_ms, offset, lag at that commit). The faultwatch stop rule is
``(now - last) * (count - 1) > (last - first) * (N - 1)``: for 3 commits spanning 20 s that means
more than 40 s without a commit.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.lag.brokers import BrokerSamples
from pipeline.lag.model import UNKNOWN, Status
from pipeline.lag.status import RuleParams, combine, evaluate, verdicts
from pipeline.lag.window import Windows

N = 5
P = RuleParams(rules="faultwatch", min_commits=3, caught_up_grace_ms=60_000)
T, F = True, False
U = UNKNOWN
RULES = (
    "lag_always_not_zero",
    "rewound",
    "offsets_stopped",
    "excused",
    "offsets_stalled",
    "lag_not_decreasing",
    "trend_ready",
)

# name: (commits, current lag, now, {rule: verdict} in RULES order, status)
CASES = {
    "ok_lag_touched_zero": (
        [(0, 100, 10), (10_000, 110, 0), (20_000, 120, 5)],
        5,
        25_000,
        (F, F, F, T, F, F, T),
        Status.OK,
    ),
    "warn_lag_never_decreased": (
        [(0, 100, 10), (10_000, 110, 10), (20_000, 120, 12)],
        12,
        25_000,
        (T, F, F, F, F, T, T),
        Status.WARN,
    ),
    "warn_unknown_lags_between_rising_ones_are_skipped": (
        [(0, 100, 10), (5_000, 105, U), (10_000, 110, 12), (15_000, 115, U), (20_000, 120, 14)],
        14,
        25_000,
        (T, F, F, F, F, T, T),
        Status.WARN,
    ),
    "stall_commits_without_progress": (
        [(0, 100, 10), (10_000, 100, 12), (20_000, 100, 15)],
        15,
        25_000,
        (T, F, F, F, T, T, T),
        Status.STALL,
    ),
    "stop_no_commit_for_longer_than_span": (
        [(0, 100, 10), (10_000, 110, 8), (20_000, 120, 6)],
        9,
        120_000,
        (T, F, T, F, F, F, T),
        Status.STOP,
    ),
    "rewind_offset_went_back": (
        [(0, 100, 10), (10_000, 90, 20), (20_000, 95, 15)],
        15,
        25_000,
        (T, T, F, F, F, F, T),
        Status.REWIND,
    ),
    "ok_rewind_recovered": (
        [(0, 100, 10), (10_000, 90, 20), (20_000, 101, 15)],
        15,
        25_000,
        (T, F, F, F, F, F, T),
        Status.OK,
    ),
    "stop_outranks_rewind": (  # Burrow's order: stop first
        [(0, 100, 10), (10_000, 90, 20), (20_000, 95, 15)],
        15,
        200_000,
        (T, T, T, F, F, F, T),
        Status.STOP,
    ),
    "ok_stopped_but_recently_caught_up": (
        [(0, 100, 0), (10_000, 110, 0), (20_000, 120, 0)],
        30,
        70_000,
        (F, F, T, T, F, T, T),
        Status.OK,
    ),
    "stop_caught_up_long_ago": (
        [(0, 100, 0), (10_000, 110, 0), (20_000, 120, 0)],
        30,
        90_000,
        (F, F, T, F, F, T, T),
        Status.STOP,
    ),
    "ok_current_lag_zero_beats_stall": (
        [(0, 100, 10), (10_000, 100, 12), (20_000, 100, 15)],
        0,
        25_000,
        (T, F, F, F, T, T, T),
        Status.OK,
    ),
    "unknown_without_max_offset": (
        [(0, 100, U), (10_000, 110, U)],
        U,
        15_000,
        (T, F, F, F, F, F, F),
        Status.UNKNOWN,
    ),
    "ok_young_window_trends_wait": (
        [(0, 100, 10), (10_000, 100, 12)],
        12,
        15_000,
        (T, F, F, F, T, T, F),
        Status.OK,
    ),
    "stop_young_window_uses_full_span": (
        # 2 commits 10 s apart -> a full window spans 40 s; 50 s without a commit is a stop
        [(0, 100, 10), (10_000, 110, 12)],
        20,
        60_000,
        (T, F, T, F, F, T, F),
        Status.STOP,
    ),
    "ok_single_commit_proves_nothing": (
        [(0, 100, 10)],
        10,
        500_000,
        (T, F, F, F, T, F, F),
        Status.OK,
    ),
    "warn_full_window_exact_burrow_span": (
        # full window: span 40 s, 40 s since the last commit is not yet "longer than the span"
        [(0, 100, 5), (10_000, 101, 6), (20_000, 102, 7), (30_000, 103, 7), (40_000, 104, 8)],
        8,
        80_000,
        (T, F, F, F, F, T, T),
        Status.WARN,
    ),
    "stop_full_window_one_ms_later": (
        [(0, 100, 5), (10_000, 101, 6), (20_000, 102, 7), (30_000, 103, 7), (40_000, 104, 8)],
        8,
        80_001,
        (T, F, T, F, F, T, T),
        Status.STOP,
    ),
}


def named(v: dict[str, np.ndarray], i: int) -> dict[str, bool]:
    rewound = v["offsets_rewind"][i] > 0 and not v["rewind_recovered"][i]
    return {rule: bool(rewound if rule == "rewound" else v[rule][i]) for rule in RULES}


def test_cases_cover_every_status() -> None:
    assert {case[4] for case in CASES.values()} == set(Status)


@pytest.mark.parametrize("name", list(CASES))
def test_rule_verdicts_and_status(name: str) -> None:
    commits, current_lag, now, expected, status = CASES[name]
    w = Windows.from_lists([commits], N)
    got = verdicts(w, now, UNKNOWN, P)
    assert named(got, 0) == dict(zip(RULES, expected))
    assert Status(int(combine(got, np.array([current_lag]), P)[0])) == status


def test_all_cases_in_one_vectorised_call() -> None:
    """The rules run over many queues at once and give each the verdict it gets alone."""
    names = list(CASES)
    w = Windows.from_lists([CASES[n][0] for n in names], N)
    now = np.array([CASES[n][2] for n in names])
    lags = np.array([CASES[n][1] for n in names])
    got = evaluate(w, lags, now, np.full(len(names), UNKNOWN), P)
    assert [Status(int(s)).name for s in got] == [CASES[n][4].name for n in names]


# Each departure of the "faultwatch" rule set (pipeline/lag/status.py, docs/lag.md), on the case that
# shows it: (commits, current lag, now, lowest recent broker offset, Burrow's status, faultwatch's).
DEPARTURES = {
    "trend_rules_wait": ([(0, 100, 10), (10_000, 100, 12)], 12, 15_000, 112, Status.STALL, Status.OK),
    "young_stop_scales": ([(0, 100, 10), (10_000, 110, 12)], 12, 25_000, 122, Status.STOP, Status.OK),
    "stop_excuse_by_commit": (
        [(0, 100, 0), (10_000, 110, 0), (20_000, 120, 0)],
        30,
        70_000,
        150,
        Status.STOP,
        Status.OK,
    ),
    "no_trend_without_two_known_lags": (
        [(0, 100, U), (10_000, 110, U), (20_000, 120, U)],
        5,
        25_000,
        U,
        Status.WARN,
        Status.OK,
    ),
}


@pytest.mark.parametrize("name", list(DEPARTURES))
def test_each_departure_on_the_case_that_shows_it(name: str) -> None:
    commits, current_lag, now, broker_min, burrow, faultwatch = DEPARTURES[name]
    w = Windows.from_lists([commits], N)
    lag = np.array([current_lag])
    assert Status(int(evaluate(w, lag, now, broker_min, RuleParams(rules="burrow"))[0])) == burrow
    assert Status(int(evaluate(w, lag, now, broker_min, P)[0])) == faultwatch


def test_allowed_lag_counts_as_caught_up_in_both_rule_sets() -> None:
    """A lag at or below allowed_lag is no lag: it stops the rules and excuses a pause."""
    w = Windows.from_lists([[(0, 100, 3), (10_000, 100, 2), (20_000, 100, 2)]], N)
    for rules in ("burrow", "faultwatch"):
        strict = RuleParams(rules=rules, min_commits=3)
        assert Status(int(evaluate(w, np.array([2]), 25_000, UNKNOWN, strict)[0])) == Status.STALL
        lenient = RuleParams(rules=rules, min_commits=3, allowed_lag=2)
        assert Status(int(evaluate(w, np.array([2]), 25_000, UNKNOWN, lenient)[0])) == Status.OK
        assert Status(int(evaluate(w, np.array([3]), 25_000, UNKNOWN, lenient)[0])) == Status.OK


def test_minimum_complete_leaves_young_windows_ok() -> None:
    w = Windows.from_lists([[(0, 100, 10), (10_000, 100, 12)]], N)  # 2 of 5: 0.4 complete
    for share, status in ((0.4, Status.STALL), (0.41, Status.OK)):
        p = RuleParams(minimum_complete=share)
        assert Status(int(evaluate(w, np.array([12]), 15_000, UNKNOWN, p)[0])) == status


def test_unknown_rule_set_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown lag rule set 'kafka'; valid names: \['burrow', 'faultwatch'\]"
    ):
        RuleParams(rules="kafka")


def test_config_offers_exactly_the_rule_sets() -> None:
    """lag.rules is validated at load against the same names the rules module knows."""
    import typing

    from pipeline.config import LagConfig
    from pipeline.lag.status import RULE_SETS

    assert typing.get_args(typing.get_type_hints(LagConfig)["rules"]) == RULE_SETS
    assert RuleParams.of(LagConfig(rules="faultwatch", allowed_lag=3)) == RuleParams(
        rules="faultwatch", allowed_lag=3
    )


def test_status_order_is_severity() -> None:
    assert sorted(Status, key=int) == [
        Status.UNKNOWN,
        Status.OK,
        Status.WARN,
        Status.STALL,
        Status.STOP,
        Status.REWIND,
    ]


def test_broker_samples_keep_the_newest_slots_with_running_maxima() -> None:
    """One sample per 10 s slot: the highest offset known by its end; the newest 3 slots kept."""
    b = BrokerSamples.empty(2, 3)
    b = b.record(np.array([0, 0, 1]), np.array([25_000, 3_000, 1_000]), np.array([40, 10, 7]), 10_000)
    assert b.slot.tolist() == [[U, 0, 2], [U, U, 0]] and b.offset.tolist() == [[U, 10, 40], [U, U, 7]]
    # an older slot's higher offset lifts the later ones (max offsets never decrease)
    b = b.record(np.array([0, 0, 0]), np.array([12_000, 31_000, 45_000]), np.array([50, 45, 60]), 10_000)
    assert b.slot.tolist()[0] == [2, 3, 4] and b.offset.tolist()[0] == [50, 50, 60]
    assert b.slot.tolist()[1] == [U, U, 0]  # an untouched queue keeps its samples


def test_broker_samples_recent_min_is_the_offset_at_the_rings_first_slot() -> None:
    b = BrokerSamples.empty(1, 3).record(
        np.array([0, 0, 0]), np.array([5_000, 15_000, 55_000]), np.array([10, 20, 30]), 10_000
    )
    # at 55 s Burrow's ring holds the polls of slots 3, 4, 5: slot 3's offset is slot 1's, 20
    assert b.recent_min(55_000, 10_000).tolist() == [20]
    # at 25 s the ring holds slots 0..2: the lowest is slot 0's
    assert b.recent_min(25_000, 10_000).tolist() == [10]
    assert BrokerSamples.empty(1, 3).recent_min(55_000, 10_000).tolist() == [U]
    # only samples after the ring's first slot: the oldest of them
    late = BrokerSamples.empty(1, 3).record(np.array([0]), np.array([52_000]), np.array([9]), 10_000)
    assert late.recent_min(55_000, 10_000).tolist() == [9]


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
