"""Group status history over time: a consumer that stops, one that falls behind, time-lag alerts.

Batches every 5 s at t_k = T0 + 5000k. Rule set "faultwatch": window N=4, STALL/WARN need 3
commits, grace 10 s (Burrow's own verdicts are tested case by case in test_lag_burrow.py).

- Group GS reads topic T (one message per batch, stored at t_k - 2500, so the max offset is k) and
  commits offset k at t_k: lag 0. It stops after t_4. Its window spans t_1..t_4 = 15 s, so it is
  STOP once more than 15 s pass without a commit and its last zero-lag commit (t_4) is more than
  10 s old: first at t_8 (t_7 is exactly 15 s, not more).
- Group GW reads topic U (two messages per batch, max offset 2k) and commits offset k: the lag at
  its commits is 1, 2, 3, ...: never decreasing, WARN as soon as the window holds 3 commits (t_3).
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from pipeline.config import LagConfig
from pipeline.lag import events_frame, initial_state, step
from tests.doubles.lag_synth import progress, send

T0 = 1_700_000_000_000
CFG = LagConfig(
    rules="faultwatch",
    window_commits=4,
    min_commits=3,
    caught_up_grace_ms=10_000,
    time_lag_alert_ms=3_600_000,
)


def t(k: int) -> int:
    return T0 + 5_000 * k


def batch(k: int) -> list[Any]:
    events: list[Any] = [
        send(t(k) - 2_500, 0, k - 1, topic="T"),
        send(t(k) - 3_000, 0, 2 * (k - 1), topic="U"),
        send(t(k) - 1_000, 0, 2 * (k - 1) + 1, topic="U"),
        progress(t(k), 0, k, group="GW", topic="U", client="w1"),
    ]
    if k <= 4:
        events.append(progress(t(k), 0, k, group="GS", topic="T", client="s1"))
    return events


def history(batches: list[list[Any]], cfg: LagConfig = CFG) -> pd.DataFrame:
    state = initial_state("c1", cfg)
    rows = []
    for k, events in enumerate(batches, start=1):
        state, out = step(state, events_frame(events), t(k), cfg)
        rows.append(out.group_status)
    return pd.concat(rows, ignore_index=True)


def test_stop_and_warn_at_the_right_times() -> None:
    got = history([batch(k) for k in range(1, 10)])
    view = [
        (r.consumer_group, (r.ts_ms - T0) // 1000, r.status, r.previous_status, r.alert, r.alert_reason)
        for r in got.itertuples()
    ]
    gs = [v for v in view if v[0] == "GS"]
    gw = [v for v in view if v[0] == "GW"]
    assert gs == [
        ("GS", 5, "OK", None, False, None),
        ("GS", 10, "OK", "OK", False, None),
        ("GS", 15, "OK", "OK", False, None),
        ("GS", 20, "OK", "OK", False, None),
        ("GS", 25, "OK", "OK", False, None),
        ("GS", 30, "OK", "OK", False, None),
        ("GS", 35, "OK", "OK", False, None),
        ("GS", 40, "STOP", "OK", True, "status OK->STOP"),
        ("GS", 45, "STOP", "STOP", False, None),
    ]
    assert gw == [
        ("GW", 5, "OK", None, False, None),
        ("GW", 10, "OK", "OK", False, None),
        ("GW", 15, "WARN", "OK", True, "status OK->WARN"),
    ] + [("GW", s, "WARN", "WARN", False, None) for s in range(20, 50, 5)]
    stopped = got[(got.consumer_group == "GS") & (got.status == "STOP")].iloc[0]
    # 8 messages sent, 4 consumed; the oldest unconsumed (offset 4) was stored at t_5 - 2.5 s
    assert (stopped.total_lag, stopped.max_time_lag_ms, stopped.worst_owner) == (4, 40_000 - 22_500, None)


def test_status_history_does_not_depend_on_event_order() -> None:
    batches = [batch(k) for k in range(1, 10)]
    rng = random.Random(3)
    shuffled = [rng.sample(b, len(b)) for b in batches]
    pd.testing.assert_frame_equal(history(batches), history(shuffled))


def test_time_lag_alert_fires_when_crossing_the_bound() -> None:
    cfg = LagConfig(window_commits=10, min_commits=10, time_lag_alert_ms=3_000)
    steps = [
        (T0 + 1_000, [send(T0, 0, 0), progress(T0 + 1_000, 0, 0)]),  # oldest unconsumed: offset 0 @ T0
        (T0 + 4_000, [progress(T0 + 4_000, 0, 0)]),
        (T0 + 5_000, [progress(T0 + 5_000, 0, 0)]),
        (T0 + 6_000, [progress(T0 + 6_000, 0, 1)]),  # caught up
        (T0 + 7_000, [send(T0 + 6_500, 0, 1), progress(T0 + 7_000, 0, 1)]),
        (T0 + 10_000, [progress(T0 + 10_000, 0, 1)]),
    ]
    state = initial_state("c1", cfg)
    seen = []
    for now, events in steps:
        state, out = step(state, events_frame(events), now, cfg)
        (row,) = out.group_status.itertuples()
        seen.append((row.max_time_lag_ms, row.status, row.alert, row.alert_reason))
    # rules = "burrow": offset 0 committed three times with a lag of 1 is STALL until it moves
    assert seen == [
        (1_000, "STALL", True, "status NEW->STALL"),
        (4_000, "STALL", True, "max time lag 4000 ms > 3000 ms"),
        (5_000, "STALL", False, None),
        (0, "OK", False, None),
        (500, "OK", False, None),
        (3_500, "OK", True, "max time lag 3500 ms > 3000 ms"),
    ]
