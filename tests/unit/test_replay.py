"""The replay CLI as a subprocess: every vector input in, exactly the oracle's output out."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faultwatch.commands import replay as replay_command
from pipeline.replay import replay_line
from pipeline.rocketmq.vectors import ALLOC_FILE, FAULT_FILES, comparable_fault_expected, read_jsonl

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "tests" / "fixtures" / "rocketmq-vectors"


def _replay(args: list[str], lines: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.replay", *args],
        input="".join(line + "\n" for line in lines),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


@pytest.mark.parametrize("version", sorted(FAULT_FILES))
def test_fault_replay_reproduces_every_case(version: str) -> None:
    cases = list(read_jsonl(VECTORS / FAULT_FILES[version]))
    code, outputs, err = _replay(["faults", "--version", version], [json.dumps(c["input"]) for c in cases])
    assert code == 0, err
    assert len(outputs) == len(cases)
    for case, out in zip(cases, outputs, strict=True):
        assert comparable_fault_expected(out) == comparable_fault_expected(case["expected"]), case["case_id"]


def test_alloc_replay_reproduces_every_case() -> None:
    cases = list(read_jsonl(VECTORS / ALLOC_FILE))
    code, outputs, err = _replay(["alloc"], [json.dumps(c["input"]) for c in cases])
    assert code == 0, err
    assert outputs == [c["expected"] for c in cases]


def test_bad_lines_yield_errors_and_processing_continues() -> None:
    good = next(read_jsonl(VECTORS / FAULT_FILES["5.3.3"]))
    lines = [
        "{not json",
        json.dumps(
            {
                "case_id": "x1",
                "events": [{"ts_ms": 1, "broker": "a", "latency_ms": "slow", "isolation": False}],
                "probes": [],
            }
        ),
        json.dumps(good["input"]),
        "",
        json.dumps({"case_id": "x2", "events": [], "probes": [5, 1]}),
        "[1, 2]",
    ]
    code, outputs, _ = _replay(["faults", "--version", "5.3.3"], lines)
    assert code == 1
    assert outputs[0]["line"] == 1 and outputs[0]["error"].startswith("invalid JSON")
    assert outputs[1] == {
        "line": 2,
        "case_id": "x1",
        "error": "events[0].latency_ms: expected int, got 'slow'",
    }
    assert outputs[2] == good["expected"]
    assert outputs[3] == {"line": 5, "case_id": "x2", "error": "probes[1]: 1 is before the previous probe 5"}
    assert outputs[4]["line"] == 6 and "object" in outputs[4]["error"]
    assert len(outputs) == 5  # the blank line carries no case


ALLOC_ERRORS = [
    (
        {"strategy": "NOPE", "consumer_group": "g", "current_cid": "c", "mq_all": [], "cid_all": []},
        "unknown allocation strategy 'NOPE'",
    ),
    (
        {
            "strategy": "AVG",
            "consumer_group": "g",
            "current_cid": "c",
            "mq_all": [{"topic": "T"}],
            "cid_all": [],
        },
        "mq_all: message queue field 'broker' must be a string, got None",
    ),
    ({"strategy": "AVG", "consumer_group": "g", "mq_all": [], "cid_all": []}, "current_cid: missing"),
]


@pytest.mark.parametrize(("case", "message"), ALLOC_ERRORS)
def test_bad_alloc_cases_name_the_problem(case: dict, message: str) -> None:
    out = replay_line("alloc", None, json.dumps(case), 7)
    assert out["line"] == 7 and message in out["error"]


def test_usage_errors() -> None:
    code, _, err = _replay(["faults"], ["{}"])
    assert code == 2 and "--version" in err
    code, _, err = _replay(["faults", "--version", "banana"], ["{}"])
    assert code == 2 and "banana" in err


def test_subcommand_registers_with_the_cli() -> None:
    parser = argparse.ArgumentParser(prog="faultwatch")
    replay_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["replay", "faults", "--version", "4.9.8"])
    assert (args.kind, args.version, args.handler) == ("faults", "4.9.8", replay_command.handle)
