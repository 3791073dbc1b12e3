"""The producer feed client's pure core: merging lists, honouring expiry, plugging into selection."""

from __future__ import annotations

import json

import orjson
import pytest

from pipeline.config import PolicyConfig
from pipeline.policy import Episode, Health, PreviousState, Snapshot, decide
from pipeline.producer import (
    AvoidanceList,
    AvoidEntry,
    FeedAwareSelector,
    FeedState,
    apply_message,
    avoided_brokers,
    overlay,
    parse_list,
)
from pipeline.publish.wire import cluster_message, encode
from pipeline.rocketmq import (
    GEN_5,
    GEN_49,
    FaultItem,
    FaultState,
    ProducerSelector,
    TopicRoute,
    get_generation,
)
from schemas.avoidance import WIRE_SCHEMA_PATH

NOW = 1_700_000_000_000
S = 1000


def msg(cluster: str = "c1", cycle: int = 10, decided: int = NOW, expires: int = NOW + 180 * S, avoid=()) -> bytes:  # type: ignore[no-untyped-def]
    return orjson.dumps({
        "schema": "faultwatch.avoidance/1", "cluster": cluster, "cycle_id": str(cycle), "policy_version": "1",
        "decided_ms": decided, "expires_ms": expires, "brokers_known": 4, "max_avoid": 2, "capped": False,
        "avoid": [{"broker_name": b, "avoid_until_ms": u, "expires_ms": x, "reason": "open_episode: quorum",
                   "episode_id": None, "multiplier": 1,
                   "evidence": {"producers_avoiding": 1, "failure_rate": 0.5, "p99_latency_ms": 10.0}}
                  for b, u, x in avoid],
        "keep_available": [],
    })


B1 = ("b1", NOW + 100 * S, NOW + 180 * S)
B2 = ("b2", NOW + 100 * S, NOW + 180 * S)

# case: (records in arrival order, {cluster: cycle kept}, rejected)
MERGE_CASES = {
    "first list": ([msg(avoid=[B1])], {"c1": "10"}, 0),
    "newer replaces": ([msg(avoid=[B1]), msg(cycle=11, decided=NOW + 60 * S)], {"c1": "11"}, 0),
    "older replay ignored": ([msg(cycle=11, decided=NOW + 60 * S), msg(avoid=[B1])], {"c1": "11"}, 0),
    "clusters kept apart": ([msg(avoid=[B1]), msg("c2", avoid=[B2])], {"c1": "10", "c2": "10"}, 0),
    "not JSON": ([b"{oops", msg()], {"c1": "10"}, 1),
    "wrong schema id": ([msg().replace(b"avoidance/1", b"avoidance/9")], {}, 1),
    "entry without until": ([msg(avoid=[B1]).replace(b'"avoid_until_ms"', b'"until"')], {}, 1),
    "entry not an object": ([orjson.dumps({**json.loads(msg()), "avoid": [3]})], {}, 1),
}


@pytest.mark.parametrize("case", sorted(MERGE_CASES))
def test_merge(case: str) -> None:
    records, kept, rejected = MERGE_CASES[case]
    state = FeedState()
    for r in records:
        state = apply_message(state, r)
    assert ({c: lst.cycle_id for c, lst in state.lists.items()}, state.rejected) == (kept, rejected)


LIST = AvoidanceList(
    "c1", "10", NOW, NOW + 180 * S,
    (
        AvoidEntry("b1", NOW + 100 * S, NOW + 180 * S, ""),
        AvoidEntry("b2", NOW + 300 * S, NOW + 180 * S, ""),
        AvoidEntry("b3", NOW + 300 * S, NOW + 60 * S, ""),
    ),
)

# case: (now offset s, cluster, expected {broker: until offset s})
EXPIRY_CASES = {
    "all in force": (0, "c1", {"b1": 100, "b2": 180, "b3": 60}),
    "entry expiry passed": (60, "c1", {"b1": 100, "b2": 180}),
    "avoid_until passed": (100, "c1", {"b2": 180}),
    "list expired: nothing avoided (dead publisher)": (180, "c1", {}),
    "unknown cluster": (0, "c9", {}),
}


@pytest.mark.parametrize("case", sorted(EXPIRY_CASES))
def test_expiry(case: str) -> None:
    offset, cluster, expected = EXPIRY_CASES[case]
    state = FeedState({"c1": LIST})
    got = avoided_brokers(state, cluster, NOW + offset * S)
    assert {b: (u - NOW) // S for b, u in got.items()} == expected


# case: (local items, avoided {broker: until}, expected items)
OVERLAY_CASES = {
    "unknown broker gets a fresh unavailable item": (
        [], {"b1": NOW + 5}, [FaultItem("b1", 0, NOW + 5, True)]),
    "local shorter: pushed out, latency and reachable kept": (
        [FaultItem("b1", 3000, NOW + 1, False)], {"b1": NOW + 5}, [FaultItem("b1", 3000, NOW + 5, False)]),
    "local longer: unchanged": (
        [FaultItem("b1", 3000, NOW + 9, True)], {"b1": NOW + 5}, [FaultItem("b1", 3000, NOW + 9, True)]),
    "past until: ignored": ([], {"b1": NOW}, []),
}


@pytest.mark.parametrize("case", sorted(OVERLAY_CASES))
def test_overlay(case: str) -> None:
    items, avoided, expected = OVERLAY_CASES[case]
    state = FaultState()
    for it in items:
        state = state.with_item(it)
    assert overlay(state, avoided, NOW).sorted_items() == expected


ROUTE = TopicRoute.from_brokers("T", {"b1": 4, "b2": 4, "b3": 4, "b4": 4})


@pytest.mark.parametrize("gen", [GEN_49, GEN_5])
@pytest.mark.parametrize("avoid", [("b2",), ("b1", "b2", "b3", "b4")], ids=["one", "all"])
def test_feed_avoidance_is_local_unavailability(gen: str, avoid: tuple[str, ...]) -> None:
    """The feed selects exactly like a producer whose own table marks those brokers unavailable,
    including the fallbacks when every broker is avoided; and never picks a feed-avoided broker
    while another one is available."""
    until = NOW + 60 * S
    local = FaultState()
    for b in avoid:
        local = local.with_item(FaultItem(b, 0, until))
    plain = ProducerSelector(get_generation(gen), fault_enabled=True, seed=7, state=local)
    fed = FeedAwareSelector(get_generation(gen), fault_enabled=True, seed=7, avoid=lambda now: dict.fromkeys(avoid, until))
    picks_plain, picks_fed = [], []
    for i in range(200):
        now = NOW + i * 10
        last = "b1" if i % 3 == 0 else None
        picks_plain.append(plain.select(ROUTE, now, last, retry=last is not None))
        picks_fed.append(fed.select(ROUTE, now, last, retry=last is not None))
    assert picks_fed == picks_plain
    if len(avoid) < 4:
        assert not {q.broker for q in picks_fed} & set(avoid)
    assert fed.state == FaultState()  # the feed never leaks into the producer's own table


def test_feed_without_local_fault_tolerance_still_avoids() -> None:
    fed = FeedAwareSelector(get_generation(GEN_5), fault_enabled=False, seed=1, avoid=lambda now: {"b3": NOW + S})
    picks = {fed.select(ROUTE, NOW).broker for _ in range(100)}
    assert picks == {"b1", "b2", "b4"}


def test_wire_round_trip_and_schema() -> None:
    import jsonschema  # a dev dependency: this test must never be skipped
    episode = Episode("c1|b2|1", "c1", "b2", NOW - 30 * S, None, "open", "quorum", 5, 10, 100, 40, 3000.0, NOW)
    health = tuple(Health("c1", f"b{i}", NOW - 60 * S, 100, 0, 0.0, 20.0, 10, 0) for i in range(1, 5))
    snapshot = Snapshot(NOW, (episode,), health, (), NOW)
    decision = decide(snapshot, PreviousState(), NOW, PolicyConfig())
    message = cluster_message(decision, decision.clusters[0], "4242")
    jsonschema.validate(json.loads(encode(message)), json.loads(WIRE_SCHEMA_PATH.read_text()))
    parsed = parse_list(encode(message))
    assert parsed == AvoidanceList(
        "c1", "4242", NOW, NOW + 180 * S, (AvoidEntry("b2", NOW + 100 * S, NOW + 180 * S, "open_episode: quorum"),)
    )
    assert avoided_brokers(FeedState({"c1": parsed}), "c1", NOW) == {"b2": NOW + 100 * S}
