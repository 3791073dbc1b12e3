"""Burrow's own evaluator tests, ported case by case: ``lag.rules = "burrow"`` must agree with each.

Source: linkedin/Burrow, ``core/internal/evaluator/caching_test.go`` (commit 2676759d, the newest
change to that file) and its storage fixture ``core/internal/storage/fixtures.go``
(``CoordinatorWithOffsets``). Every case names the file and line it comes from.

- ``RULE_CASES``: the ``tests`` table read by ``TestCachingEvaluator_CheckRules`` (line 576): each
  rule function's result and ``calculatePartitionStatus``'s status. Burrow's ``timeNow`` is in
  seconds; here it is ``now_ms = timeNow * 1000``. The commits are the whole slice Burrow passes,
  so the window is full (``window_size = len(commits)``).
- ``GROUP_CASES``: the request tests over the storage fixture (one partition, broker offset 4321;
  ``testgroup`` 10 commits in a ring of 10, ``testgroup2`` 5 commits in a ring of 10, 10 s apart,
  the first 100 s before the evaluation), answered by ``faultwatch replay lag`` group lines; the
  same fixture is also fed through the streaming step (``test_storage_fixture_through_the_step``).

Not ported, because they test Go plumbing faultwatch does not have: ``ImplementsModule`` (line 54),
``ImplementsEvaluatorModule`` (58), ``Configure`` (62) and ``Configure_DefaultExpireCache`` (68,
the result cache's expiry).
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import numpy as np
import pytest

from pipeline.config import LagConfig
from pipeline.lag import events_frame, initial_state, step
from pipeline.lag.model import UNKNOWN, Status
from pipeline.lag.replay import replay_lag_case
from pipeline.lag.status import RuleParams, evaluate, verdicts
from pipeline.lag.window import Windows
from pipeline.replay import run_replay
from tests.doubles.lag_synth import progress, send

TEST_GO = "core/internal/evaluator/caching_test.go"
FIXTURE_GO = "core/internal/storage/fixtures.go"


def ramp(start: int, step_: int, ts0: int, ts_step: int, lags: list[int | None]) -> list[list[int | None]]:
    """Commits [offset, ts_ms, lag] with evenly spaced offsets and times."""
    return [[start + i * step_, ts0 + i * ts_step, lag] for i, lag in enumerate(lags)]


# Burrow test 9 and 10: 15 commits one second apart, all with zero lag.
CAUGHT_UP_TS = [
    618356, 619362, 620366, 621367, 622370, 623373, 624378, 625379,
    626383, 627383, 628383, 629388, 630391, 631394, 632397,
]  # fmt: skip
CAUGHT_UP = [[792748079 + i, 1512224000000 + t, 0] for i, t in enumerate(CAUGHT_UP_TS)]

# verdicts: isLagAlwaysNotZero, checkIfOffsetsRewind, checkIfOffsetsStopped, checkIfOffsetsStalled,
# checkIfLagNotDecreasing, checkIfRecentLagZero
RULE_CASES: dict[str, dict[str, Any]] = {
    "0": {
        "line": 200,
        "commits": ramp(1000, 1000, 100000, 100000, [0, 50, 100, 150, 200]),
        "broker_offsets": [5200], "current_lag": 200, "now_s": 600, "allowed_lag": 0,
        "verdicts": (False, -1, False, False, True, False), "status": "OK",
    },
    "1": {
        "line": 222,
        "commits": ramp(1000, 1000, 100000, 100000, [0, 50, 100, 150, 200]),
        "broker_offsets": [5200], "current_lag": 200, "now_s": 900, "allowed_lag": 0,
        "verdicts": (False, -1, False, False, True, False), "status": "OK",
    },
    "2": {
        "line": 244,
        "commits": ramp(1000, 1000, 100000, 100000, [0, 50, 100, 150, 200]),
        "broker_offsets": [5200], "current_lag": 200, "now_s": 1000, "allowed_lag": 0,
        "verdicts": (False, -1, True, False, True, False), "status": "STOP",
    },
    "3": {
        "line": 266,
        "commits": ramp(1000, 1000, 100000, 100000, [50, 100, 150, 200, 250]),
        "broker_offsets": [5250], "current_lag": 250, "now_s": 1000, "allowed_lag": 0,
        "verdicts": (True, -1, True, False, True, False), "status": "STOP",
    },
    "4": {
        "line": 288,
        "commits": ramp(1000, 0, 100000, 100000, [0, 50, 100, 150, 200]),
        "broker_offsets": [1200], "current_lag": 200, "now_s": 600, "allowed_lag": 0,
        "verdicts": (False, -1, False, True, True, False), "status": "OK",
    },
    "5": {
        "line": 310,
        "commits": ramp(1000, 0, 100000, 100000, [100, 150, 200, 250, 300]),
        "broker_offsets": [1300], "current_lag": 300, "now_s": 600, "allowed_lag": 0,
        "verdicts": (True, -1, False, True, True, False), "status": "STALL",
    },
    "6": {
        "line": 332,
        "commits": ramp(1000, 0, 100000, 100000, [100, 100, 100, 100, 100]),
        "broker_offsets": [1100], "current_lag": 100, "now_s": 600, "allowed_lag": 0,
        "verdicts": (True, -1, False, True, True, False), "status": "STALL",
    },
    "7": {
        "line": 354,
        "commits": [[1000, 100000, 100], [2000, 200000, 150], [3000, 300000, 200], [2000, 400000, 1250],
                 [4000, 500000, 300]],
        "broker_offsets": [4300], "current_lag": 300, "now_s": 600, "allowed_lag": 0,
        "verdicts": (True, 3, False, False, False, False), "status": "OK",
    },
    "8": {
        "line": 376,
        "commits": ramp(1000, 1000, 100000, 100000, [50, 100, 150, 200, 250]),
        "broker_offsets": [5250], "current_lag": 0, "now_s": 1000, "allowed_lag": 0,
        "verdicts": (True, -1, True, False, True, False), "status": "OK",
    },
    "9": {
        "line": 398,
        "commits": CAUGHT_UP,
        "broker_offsets": [792749024, 792749000, 792748800, 792748600, 792748500],
        "current_lag": 931, "now_s": 1512224650, "allowed_lag": 0,
        "verdicts": (False, -1, True, False, True, False), "status": "STOP",
    },
    "10": {
        "line": 430,
        "commits": CAUGHT_UP,
        "broker_offsets": [792748094, 792748093, 792748093, 792748093],
        "current_lag": 1, "now_s": 1512224650, "allowed_lag": 0,
        "verdicts": (False, -1, True, False, True, True), "status": "OK",
    },
    "11": {
        "line": 462,
        "commits": ramp(1000, 500, 100000, 50000, [0, None, 50, None, 100, None, 150, None, 200, None]),
        "broker_offsets": [5700], "current_lag": 200, "now_s": 600, "allowed_lag": 0,
        "verdicts": (False, -1, False, False, True, False), "status": "OK",
    },
    "12": {
        "line": 489,
        "commits": [[1000, 100000, 2], [2000, 200000, 1], [2000, 300000, 1]],
        "broker_offsets": [2001], "current_lag": 1, "now_s": 550, "allowed_lag": 1,
        "verdicts": (False, -1, True, False, False, False), "status": "OK",
    },
    "13": {
        "line": 509,
        "commits": ramp(1000, 0, 100000, 100000, [100, 150, 200, 250, 300]),
        "broker_offsets": [1300], "current_lag": 300, "now_s": 600, "allowed_lag": 99,
        "verdicts": (True, -1, False, True, True, False), "status": "STALL",
    },
    "14": {
        "line": 531,
        "commits": [[1000, 100000, 100], [2000, 200000, 150], [3000, 300000, 200], [2000, 400000, 1250],
                 [4000, 500000, 300]],
        "broker_offsets": [4300], "current_lag": 300, "now_s": 600, "allowed_lag": 99,
        "verdicts": (True, 3, False, False, False, False), "status": "OK",
    },
    "15": {
        "line": 553,
        "commits": [[1000, 100000, 100], [2000, 200000, 150], [3000, 300000, 200], [2000, 400000, 1250],
                 [2500, 500000, 300]],
        "broker_offsets": [4300], "current_lag": 300, "now_s": 600, "allowed_lag": 0,
        "verdicts": (True, 3, False, False, False, False), "status": "REWIND",
    },
}  # fmt: skip

VERDICTS = (
    "lag_always_not_zero",
    "offsets_rewind",
    "offsets_stopped",
    "offsets_stalled",
    "lag_not_decreasing",
    "recent_lag_zero",
)


def queue_line(name: str, case: dict[str, Any]) -> dict[str, Any]:
    """The case as a ``faultwatch replay lag`` queue line."""
    return {
        "id": name,
        "commits": case["commits"],
        "current_lag": case["current_lag"],
        "now_ms": case["now_s"] * 1000,
        "window_size": len(case["commits"]),
        "allowed_lag": case["allowed_lag"],
        "broker_offsets": case["broker_offsets"],
    }


def window(case: dict[str, Any]) -> Windows:
    commits = [(ts, off, UNKNOWN if lag is None else lag) for off, ts, lag in case["commits"]]
    return Windows.from_lists([commits], len(commits))


def test_every_rule_case_of_the_table_is_ported() -> None:
    assert sorted(RULE_CASES, key=int) == [str(i) for i in range(16)]
    assert {c["status"] for c in RULE_CASES.values()} == {"OK", "STOP", "STALL", "REWIND"}


@pytest.mark.parametrize("name", list(RULE_CASES), ids=lambda n: f"{TEST_GO}:{RULE_CASES[n]['line']}")
def test_rule_case(name: str) -> None:
    case = RULE_CASES[name]
    p = RuleParams(rules="burrow", allowed_lag=case["allowed_lag"])
    w = window(case)
    now = case["now_s"] * 1000
    got = verdicts(w, now, min(case["broker_offsets"]), p)
    assert (
        tuple(int(got[v][0]) if v == "offsets_rewind" else bool(got[v][0]) for v in VERDICTS)
        == case["verdicts"]
    ), f"{TEST_GO}:{case['line']}"
    status = evaluate(w, np.array([case["current_lag"]]), now, min(case["broker_offsets"]), p)
    assert Status(int(status[0])).name == case["status"], f"{TEST_GO}:{case['line']}"


def test_replay_lag_answers_every_rule_case() -> None:
    lines = [json.dumps(queue_line(n, c)) for n, c in RULE_CASES.items()]
    out = io.StringIO()
    assert run_replay("lag", None, lines, out) == 0
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers == [{"id": n, "status": c["status"], "complete": 1.0} for n, c in RULE_CASES.items()]


# Where the "faultwatch" rule set disagrees with Burrow on Burrow's own cases, and which departure
# (pipeline/lag/status.py, docs/lag.md) is the reason. Its knobs: min_commits 3, grace 60 s.
FAULTWATCH_DEPARTURES = {
    "9": ("STOP", "OK", "stop excuse by commit: zero-lag commits 17.6 s ago, within the 60 s grace"),
}


def test_faultwatch_rules_depart_from_burrow_only_where_named() -> None:
    p = RuleParams(rules="faultwatch", min_commits=3, caught_up_grace_ms=60_000)
    differ = {}
    for name, case in RULE_CASES.items():
        p_case = dataclasses.replace(p, allowed_lag=case["allowed_lag"])
        got = evaluate(window(case), np.array([case["current_lag"]]), case["now_s"] * 1000, UNKNOWN, p_case)
        if Status(int(got[0])).name != case["status"]:
            differ[name] = (case["status"], Status(int(got[0])).name)
    assert differ == {n: d[:2] for n, d in FAULTWATCH_DEPARTURES.items()}


# The storage fixture (fixtures.go lines 43-89) as replay group lines: evaluation 100.35 s after the
# first commit (the fixture's sleeps), broker offset 4321, commits every 10 s from offset 1000 by 100.
START = 1_700_000_000_000
NOW = START + 100_000 + 350


def fixture_queue(commits: int) -> dict[str, Any]:
    offsets = [1000 + i * 100 for i in range(commits)]
    return {
        "id": "testtopic/0",
        "commits": [[o, START + i * 10_000, 4321 - o] for i, o in enumerate(offsets)],
        "current_lag": 4321 - offsets[-1],
        "broker_offsets": [4321],
    }


GROUP_CASES: dict[str, dict[str, Any]] = {
    "Start: nosuchgroup is NOTFOUND": {
        "line": 79,
        "case": {"id": "nosuchgroup", "group": None},
        "expect": {"status": "NOTFOUND", "complete": 1.0, "maxlag_id": None, "partitions": []},
    },
    "SingleRequest_NoShowAll: testgroup": {
        "line": 97,
        "case": {"id": "testgroup", "now_ms": NOW, "window_size": 10, "group": [fixture_queue(10)]},
        "expect": {"status": "OK", "complete": 1.0, "total_lag": 2421, "not_ok_partitions": 0},
    },
    "SingleRequest_ShowAll: testgroup": {
        "line": 120,
        "case": {"id": "testgroup", "now_ms": NOW, "window_size": 10, "group": [fixture_queue(10)]},
        "expect": {"status": "OK", "complete": 1.0, "total_lag": 2421, "partitions": 1},
    },
    "SingleRequest_Incomplete: testgroup2": {
        "line": 143,
        "case": {"id": "testgroup2", "now_ms": NOW, "window_size": 10, "group": [fixture_queue(5)]},
        "expect": {
            "status": "ERR",
            "complete": 0.0,
            "total_lag": 2921,
            "partitions": [{"id": "testtopic/0", "status": "STOP", "complete": 0.5}],
            "maxlag_id": "testtopic/0",
        },
    },
    "TopicDeleted: a group left without partitions": {
        "line": 604,
        "case": {"id": "testgroup", "group": []},
        "expect": {"status": "OK", "complete": 0.0, "partitions": []},
    },
}


@pytest.mark.parametrize("name", list(GROUP_CASES), ids=lambda n: f"{TEST_GO}:{GROUP_CASES[n]['line']}")
def test_group_case(name: str) -> None:
    case = GROUP_CASES[name]
    got = replay_lag_case(json.loads(json.dumps(case["case"])))
    assert got["id"] == case["case"]["id"]
    for key, want in case["expect"].items():
        if key == "not_ok_partitions":  # ShowAll false: only partitions above OK are listed
            assert sum(p["status"] != "OK" for p in got["partitions"]) == want
        elif key == "partitions" and isinstance(want, int):
            assert len(got["partitions"]) == want
        else:
            assert got[key] == want, f"{TEST_GO}:{case['line']} {key}"


def test_maxlag_of_the_incomplete_group_spans_its_commits() -> None:
    """Burrow's line 165-169: maxlag's window starts at offset 1000 and ends at 1400."""
    queue = fixture_queue(5)
    assert (queue["commits"][0][0], queue["commits"][-1][0]) == (1000, 1400)
    got = replay_lag_case({"id": "testgroup2", "now_ms": NOW, "window_size": 10, "group": [queue]})
    assert got["maxlag_id"] == queue["id"]


def test_storage_fixture_through_the_step() -> None:
    """The fixture's groups fed to the streaming step as events: the same group verdicts.

    The broker offset 4321 comes from a send result (queue offset 4320) before the first commit.
    """
    cfg = LagConfig(window_commits=10, queue_row_interval_s=0)
    events: list[Any] = [send(START - 1_000, 0, 4320, topic="testtopic")]
    for group, commits in (("testgroup", 10), ("testgroup2", 5)):
        events += [
            progress(START + i * 10_000, 0, 1000 + i * 100, group=group, topic="testtopic")
            for i in range(commits)
        ]
    state, out = step(initial_state("c1", cfg), events_frame(events), NOW, cfg)
    groups = {r["consumer_group"]: r for r in out.group_status.to_dict("records")}
    got = {
        g: (r["burrow_status"], r["complete"], r["total_lag"], r["status"], r["max_lag"], r["maxlag_topic"])
        for g, r in groups.items()
    }
    assert got == {
        "testgroup": ("OK", 1.0, 2421, "OK", 2421, "testtopic"),
        "testgroup2": ("ERR", 0.0, 2921, "STOP", 2921, "testtopic"),
    }
    # maxlag's Start and End (Burrow line 165-169): the window of testgroup2's queue
    row = int(np.flatnonzero(state.group_names[state.pairs["gcode"]] == "testgroup2")[0])
    w = state.windows.take(np.array([row]))
    assert (int(w.offset[0, w.size - w.count[0]]), int(w.last_offset()[0])) == (1000, 1400)
