"""``faultwatch replay lag``: queue and group lines in, Burrow's verdicts out, an error line per bad line.

The CLI runs as a subprocess (``faultwatch replay lag`` through ``faultwatch.cli``) with its input given
explicitly, so the test needs no terminal. Burrow's own cases are in test_lag_burrow.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.lag.replay import LagCaseError, replay_lag_case

REPO = Path(__file__).resolve().parents[2]

# Burrow's caching_test.go case 0 (zero lag at the first commit) and case 5 (stalled)
OK_QUEUE = {
    "id": "ok",
    "commits": [
        [1000, 100000, 0],
        [2000, 200000, 50],
        [3000, 300000, 100],
        [4000, 400000, 150],
        [5000, 500000, 200],
    ],
    "current_lag": 200,
    "now_ms": 600_000,
    "window_size": 5,
    "broker_offsets": [5200],
}
STALLED = {
    "id": "stalled",
    "commits": [[1000, 100000 * (i + 1), 100 + 50 * i] for i in range(5)],
    "current_lag": 300,
    "now_ms": 600_000,
    "window_size": 5,
    "broker_offsets": [1300],
}


def faultwatch(args: list[str], lines: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [sys.executable, "-m", "faultwatch.cli", *args],
        input="".join(line + "\n" for line in lines),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


BAD_LINES = [
    ("{not json", None, "invalid JSON"),
    ("[1, 2]", None, "a case must be a JSON object, got list"),
    (json.dumps({**OK_QUEUE, "id": "no-window", "window_size": None}), "no-window", "window_size: expected an integer"),
    (json.dumps({k: v for k, v in OK_QUEUE.items() if k != "now_ms"}), "ok", "now_ms: missing"),
    (json.dumps({**OK_QUEUE, "id": "short", "commits": [[1, 2]]}), "short", "commits[0]: expected [offset, ts_ms, lag]"),
    (json.dumps({**OK_QUEUE, "id": "neg", "current_lag": -3}), "neg", "current_lag: -3 is outside"),
    (json.dumps({**OK_QUEUE, "id": "huge", "broker_offsets": [2**70]}), "huge", "broker_offsets[0]:"),
    (json.dumps({**OK_QUEUE, "id": "float", "allowed_lag": 1.5}), "float", "allowed_lag: expected an integer"),
    (json.dumps({**OK_QUEUE, "id": "overfull", "window_size": 2}), "overfull", "5 commits do not fit window_size 2"),
    (json.dumps({**OK_QUEUE, "id": "share", "minimum_complete": 2}), "share", "minimum_complete: expected a number"),
    (json.dumps({"id": "g", "group": [OK_QUEUE, {"id": "q2"}]}), "g", "group[1].window_size: missing"),
    (json.dumps({"id": "g2", "group": "all"}), "g2", "group: expected a list of queue cases or null"),
]  # fmt: skip


def test_every_bad_line_gets_an_error_line_and_the_run_goes_on() -> None:
    lines = [json.dumps(OK_QUEUE)] + [line for line, _, _ in BAD_LINES] + ["", json.dumps(STALLED)]
    code, out, err = faultwatch(["replay", "lag"], lines)
    assert code == 1, err
    assert out[0] == {"id": "ok", "status": "OK", "complete": 1.0}
    assert out[-1] == {"id": "stalled", "status": "STALL", "complete": 1.0}
    for got, (_, case_id, reason), line_no in zip(out[1:-1], BAD_LINES, range(2, 2 + len(BAD_LINES))):
        assert got["line"] == line_no and reason in got["error"], got
        assert got.get("id") == case_id
    assert len(out) == len(lines) - 1  # the blank line is skipped


def test_group_line_inherits_the_groups_settings_and_picks_burrows_maxlag() -> None:
    queue = {"commits": [[10, 1_000, 5], [20, 2_000, 4]], "current_lag": 4}
    rising = {"id": "b", "current_lag": 9, "commits": [[10, 1_000, 5], [20, 2_000, 9]]}
    group = {
        "id": "G",
        "now_ms": 2_500,
        "window_size": 2,
        "group": [{**queue, "id": "a"}, {**queue, **rising}, {**queue, "id": "d", "current_lag": None}],
    }
    assert replay_lag_case(group) == {
        "id": "G",
        "status": "WARN",  # b's lag never went down; d's current lag is unknown: no verdict
        "complete": 1.0,
        "maxlag_id": "b",
        "total_lag": 13,
        "partitions": [
            {"id": "a", "status": "OK", "complete": 1.0},
            {"id": "b", "status": "WARN", "complete": 1.0},
            {"id": "d", "status": "UNKNOWN", "complete": 1.0},
        ],
    }
    # one commit in a window of 4 (its own size), excused from STOP by a broker offset at the commit:
    # Burrow's STALL, so the group is ERR; c ties b's lag of 9 but comes later, so b stays maxlag
    young = {
        "id": "c",
        "current_lag": 9,
        "commits": [[10, 1_000, 5]],
        "window_size": 4,
        "broker_offsets": [10],
    }
    got = replay_lag_case({**group, "group": [*group["group"], young]})
    assert (got["status"], got["complete"], got["maxlag_id"], got["partitions"][-1]) == (
        "ERR",
        0.75,
        "b",
        {"id": "c", "status": "STALL", "complete": 0.25},
    )


def test_rules_flag_selects_the_rule_set_and_refuses_unknown_names() -> None:
    young = {"id": "young", "commits": [[100, 0, 10]], "current_lag": 10, "now_ms": 0, "window_size": 10}
    code, out, _ = faultwatch(["replay", "lag"], [json.dumps(young)])
    assert (code, out) == (0, [{"id": "young", "status": "STALL", "complete": 0.1}])
    code, out, _ = faultwatch(
        ["replay", "lag", "--rules", "faultwatch"], [json.dumps({**young, "min_commits": 3})]
    )
    assert (code, out) == (0, [{"id": "young", "status": "OK", "complete": 0.1}])
    code, out, err = faultwatch(["replay", "lag", "--rules", "kafka"], [json.dumps(young)])
    assert (
        code == 2
        and out == []
        and "unknown lag rule set 'kafka'; valid names: ['burrow', 'faultwatch']" in err
    )


def test_a_case_error_names_the_field() -> None:
    with pytest.raises(LagCaseError, match=r"commits\[1\]\[2\] \(lag\): expected an integer"):
        replay_lag_case({**OK_QUEUE, "commits": [[1, 2, 0], [3, 4, "x"]]})
