"""Queue owners and idle members against the Java allocation vectors, and the mismatch rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.lag.ownership import membership_owners, owner_mismatch, queue_owners
from pipeline.rocketmq import MessageQueue
from pipeline.rocketmq.vectors import ALLOC_FILE, read_jsonl

VECTORS = Path(__file__).resolve().parent.parent / "fixtures" / "rocketmq-vectors"
CASES = list(read_jsonl(VECTORS / ALLOC_FILE))


def mq(obj: dict[str, Any]) -> MessageQueue:
    return MessageQueue(obj["topic"], obj["broker"], obj["queue_id"])


def options(inp: dict[str, Any]) -> dict[str, Any]:
    """The strategy settings a case carries (what a client would be configured with)."""
    out: dict[str, Any] = {}
    if "virtual_node_cnt" in inp:
        out["virtual_node_cnt"] = inp["virtual_node_cnt"]
    if inp["strategy"] == "CONFIG":
        lst = inp.get("config_mq_list")
        out["config_mq_list"] = None if lst is None else [mq(q) for q in lst]
    if inp["strategy"] == "MACHINE_ROOM":
        out["consumer_idcs"] = inp.get("consumer_idcs")
    if inp["strategy"] == "MACHINE_ROOM_NEARBY":
        for key in ("inner_strategy", "inner_virtual_node_cnt", "broker_rooms", "consumer_rooms"):
            if key in inp:
                out[key] = inp[key]
    return out


def expected_ownership(
    rebalance: dict[str, Any],
) -> tuple[dict[MessageQueue, str], tuple[str, ...], str | None]:
    """Owners (first claimant in client-id order), members with an empty share, first error."""
    owners: dict[MessageQueue, str] = {}
    idle, errors = [], []
    for cid, alloc in rebalance["ownership_by_cid"].items():
        if alloc["error"]:
            errors.append(alloc["error"])
            continue
        if alloc["result"] is None:
            continue
        if not alloc["result"]:
            idle.append(cid)
        for q in alloc["result"]:
            owners.setdefault(mq(q), cid)
    if not rebalance["ownership_by_cid"]:
        errors.append("no members")
    return owners, tuple(idle), (errors[0] if errors else None)


def test_fixture_is_complete() -> None:
    assert len(CASES) == 117


@pytest.mark.parametrize("case", CASES, ids=[c["case_id"] for c in CASES])
def test_owners_match_java(case: dict[str, Any]) -> None:
    inp = case["input"]
    got = queue_owners(
        inp["strategy"], inp["consumer_group"], [mq(q) for q in inp["mq_all"]], inp["cid_all"], **options(inp)
    )
    owners, idle, error = expected_ownership(case["expected"]["rebalance"])
    assert (got.owners, got.idle, got.error) == (owners, idle, error)


def test_every_queue_has_one_owner_for_membership_strategies() -> None:
    checked = 0
    for case in CASES:
        inp = case["input"]
        if inp["strategy"] not in ("AVG", "AVG_BY_CIRCLE") or case["expected"]["rebalance"]["error"]:
            continue
        if len(set(inp["cid_all"])) != len(inp["cid_all"]):
            continue  # a duplicated client id shifts shares in Java too; covered by the exact test above
        got = membership_owners(
            inp["strategy"], inp["consumer_group"], [mq(q) for q in inp["mq_all"]], inp["cid_all"]
        )
        assert set(got.owners) == {mq(q) for q in inp["mq_all"]}
        # more members than queues -> exactly the surplus is idle
        assert len(got.idle) == max(0, len(set(inp["cid_all"])) - len({mq(q) for q in inp["mq_all"]}))
        checked += 1
    assert checked >= 40


def test_averagely_by_hand() -> None:
    queues = [MessageQueue("T", b, i) for b in ("b1", "b2") for i in range(2)]
    got = membership_owners("AVG", "G", queues, ["c2", "c1", "c3", "c4", "c5"])
    assert got.owners == {queues[0]: "c1", queues[1]: "c2", queues[2]: "c3", queues[3]: "c4"}
    assert got.idle == ("c5",) and got.error is None


@pytest.mark.parametrize("strategy", ["CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY"])
def test_strategies_needing_client_settings_are_not_guessed(strategy: str) -> None:
    got = membership_owners(strategy, "G", [MessageQueue("T", "b", 0)], ["c1"])
    assert got.owners == {} and got.idle == () and "owners unknown" in (got.error or "")


def test_no_members_or_no_queues() -> None:
    assert membership_owners("AVG", "G", [MessageQueue("T", "b", 0)], []).error == "no members"
    assert membership_owners("AVG", "G", [], ["c1"]).error == "no queues known"


def test_owner_mismatch_rule() -> None:
    reported = np.array(["c1", "c2", "c2", None, "c2"], dtype=object)
    owner = np.array(["c1", "c1", "c1", "c1", None], dtype=object)
    ts = np.array([100_000, 100_000, 115_000, 100_000, 100_000])
    changed = np.array([0, 0, 100_000, 0, 0])
    got = owner_mismatch(reported, owner, ts, changed, 20_000)
    # owner reports; another client; another client within the rebalance grace; no reporter; no owner
    assert got.tolist() == [False, True, False, False, False]
