"""Every case of every oracle vector file, compared as a whole object with the Java client's output.

One test per case id, so a failure names the case. Only the tie-dependent order of 4.9's ``rank`` /
``pick_candidates`` is compared order-insensitively (vectors README), and a separate test proves the
exact order wherever there are no ties.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.replay import replay_alloc_case, replay_fault_case
from pipeline.rocketmq.vectors import ALLOC_FILE, FAULT_FILES, comparable_fault_expected, read_jsonl

VECTORS = Path(__file__).resolve().parent.parent / "fixtures" / "rocketmq-vectors"


def _cases(filename: str) -> list[dict[str, Any]]:
    return list(read_jsonl(VECTORS / filename))


FAULT_CASES = [(version, case) for version, name in FAULT_FILES.items() for case in _cases(name)]
ALLOC_CASES = _cases(ALLOC_FILE)


def test_fixture_files_hold_every_case() -> None:
    assert {v: sum(1 for ver, _ in FAULT_CASES if ver == v) for v in FAULT_FILES} == {
        "4.9.8": 115,
        "5.3.3": 115,
    }
    assert len(ALLOC_CASES) == 117


@pytest.mark.parametrize(
    ("version", "case"), FAULT_CASES, ids=[f"{v}:{c['case_id']}" for v, c in FAULT_CASES]
)
def test_fault_case_matches_java(version: str, case: dict[str, Any]) -> None:
    got = replay_fault_case(case["input"], version)
    assert comparable_fault_expected(got) == comparable_fault_expected(case["expected"])


@pytest.mark.parametrize("case", ALLOC_CASES, ids=[c["case_id"] for c in ALLOC_CASES])
def test_alloc_case_matches_java(case: dict[str, Any]) -> None:
    assert replay_alloc_case(case["input"]) == case["expected"]


def test_rank_order_exact_wherever_untied() -> None:
    untied = 0
    for version, case in FAULT_CASES:
        if version != "4.9.8":
            continue
        got = replay_fault_case(case["input"], version)
        for mine, theirs in zip(got["probes"], case["expected"]["probes"], strict=True):
            assert mine["rank_has_ties"] == theirs["rank_has_ties"], case["case_id"]
            if not theirs["rank_has_ties"]:
                untied += 1
                assert (mine["rank"], mine["pick_candidates"]) == (theirs["rank"], theirs["pick_candidates"])
    # The README says 74 probes in 10 cases have ties; the file itself has 23 probes in 5 cases.
    assert untied == 4539 - 23


def test_edge_case_with_ties_keeps_the_set() -> None:
    """fault-edge-06: three equal items behind one fast broker; which tied one is 2nd is arbitrary."""
    case = next(c for v, c in FAULT_CASES if v == "4.9.8" and c["case_id"] == "fault-edge-06")
    probe = replay_fault_case(case["input"], "4.9.8")["probes"][0]
    assert probe["rank"][0] == "broker-d"
    assert set(probe["rank"]) == {"broker-a", "broker-b", "broker-c", "broker-d"}
    assert probe["pick_candidates"][0] == "broker-d" and len(probe["pick_candidates"]) == 2
