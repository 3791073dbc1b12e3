"""The avoidance policy, table-driven: each rule's verdict per case, then whole decisions per case."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from pipeline.config import PolicyConfig
from pipeline.policy import (
    AVOID,
    KEEP_AVAILABLE,
    Avoiding,
    ClusterDecision,
    Decision,
    Episode,
    Evidence,
    Health,
    PreviousEntry,
    PreviousState,
    Recommendation,
    Snapshot,
    decide,
    decision_from_jsonable,
    previous_from_jsonable,
    snapshot_from_jsonable,
    to_jsonable,
)
from pipeline.policy.rules import (
    BrokerView,
    avoid_duration_ms,
    envoy_multiplier,
    max_avoided,
    rule_hysteresis,
    rule_open_episode,
    rule_probation,
)

NOW = 1_700_000_000_000
S = 1000
CFG = PolicyConfig()  # base 30 s, max 300 s, period 1 h, decay 600 s, share 0.5, hysteresis 100 s


def ep(broker: str, opened_s: float, closed_s: float | None = None, cluster: str = "c1", **kw) -> Episode:
    """An episode opened ``opened_s`` seconds before NOW, closed ``closed_s`` before NOW (None: open)."""
    opened = NOW - int(opened_s * S)
    closed = None if closed_s is None else NOW - int(closed_s * S)
    base = {
        "episode_id": f"{cluster}|{broker}|{opened}",
        "cluster": cluster,
        "broker_name": broker,
        "opened_ms": opened,
        "closed_ms": closed,
        "state": "open" if closed is None else "closed",
        "reason": "quorum",
        "peak_avoiding_producers": 5,
        "active_producers": 10,
        "sends": 100,
        "failures": 40,
        "p99_latency_ms": 3000.0,
        "updated_ms": closed if closed is not None else NOW - 5 * S,
    }
    base.update(kw)
    return Episode(**base)


def hl(broker: str, cluster: str = "c1", ago_s: float = 60, **kw) -> Health:
    base = {
        "cluster": cluster,
        "broker_name": broker,
        "minute_ms": NOW - int(ago_s * S),
        "sends": 100,
        "failures": 0,
        "failure_rate": 0.0,
        "latency_p99_ms": 20.0,
        "active_producers": 10,
        "producers_avoiding": 0,
    }
    base.update(kw)
    return Health(**base)


def prev(broker: str, until_s: float, action: str = AVOID, cluster: str = "c1") -> PreviousEntry:
    """A previous cycle's entry (decided 60 s ago) avoiding ``broker`` until NOW + ``until_s``."""
    return PreviousEntry(cluster, broker, action, NOW + int(until_s * S), NOW - 60 * S, "open_episode: quorum")


def cluster_of(n: int, cluster: str = "c1") -> tuple[Health, ...]:
    return tuple(hl(f"b{i}", cluster) for i in range(1, n + 1))


def repeats(broker: str, count: int, gap_s: float, last_closed_s: float, length_s: float = 20) -> tuple:
    """``count`` episodes of ``broker``, the last closed ``last_closed_s`` ago, ``gap_s`` apart."""
    out = []
    closed = last_closed_s
    for _ in range(count):
        out.append(ep(broker, closed + length_s, closed))
        closed += length_s + gap_s
    return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------
# 1. Each rule's verdict per case (Burrow-style): (rule verdicts as (rule, avoid_until offset s)).
# ---------------------------------------------------------------------------------------------

RULE_CASES = {
    # case: (episodes, previous entry, multiplier, open_episode, probation, hysteresis)
    "healthy": ((), None, 0, None, None, None),
    "open episode, first": ((ep("b1", 30),), None, 1, 100, None, None),
    "open episode, fifth in the hour: base x 5 beats the hold": (
        repeats("b1", 4, 60, 100) + (ep("b1", 10),), None, 5, 150, None, None),
    "closed 10 s ago: probation base x 1": ((ep("b1", 40, 10),), None, 1, None, 20, None),
    "closed 40 s ago: probation over": ((ep("b1", 70, 40),), None, 1, None, None, None),
    "three repeats within decay: base x 3": (repeats("b1", 3, 60, 10), None, 3, None, 80, None),
    "twelve repeats: capped at max_avoid_s": (repeats("b1", 12, 30, 10), None, 12, None, 290, None),
    "repeats 2 x decay apart: decayed to 1": (repeats("b1", 3, 1200, 10), None, 1, None, 20, None),
    "episodes beyond the repeat period forgotten": (
        (ep("b1", 7300, 7200), ep("b1", 40, 10)), None, 1, None, 20, None),
    "published avoidance still running: hysteresis": (
        (ep("b1", 200, 100),), prev("b1", 50), 1, None, None, 50),
    "published avoidance ran out": ((ep("b1", 200, 100),), prev("b1", -1), 1, None, None, None),
    "previous keep_available is no promise": ((), prev("b1", 50, KEEP_AVAILABLE), 0, None, None, None),
    "previous far beyond max_avoid_s: clipped": ((), prev("b1", 9999), 0, None, None, 300),
}


@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_rule_verdicts(case: str) -> None:
    episodes, previous, mult, want_open, want_probation, want_hysteresis = RULE_CASES[case]
    view = BrokerView("c1", "b1", tuple(sorted(episodes, key=lambda e: e.opened_ms)), None, 0, previous)
    got = {
        "multiplier": envoy_multiplier(view.episodes, NOW, CFG),
        "open_episode": rule_open_episode(view, NOW, CFG),
        "probation": rule_probation(view, NOW, CFG),
        "hysteresis": rule_hysteresis(view, NOW, CFG),
    }
    offsets = {k: None if v is None else (v.avoid_until_ms - NOW) / S for k, v in got.items() if k != "multiplier"}
    assert (got["multiplier"], offsets) == (
        mult,
        {"open_episode": want_open, "probation": want_probation, "hysteresis": want_hysteresis},
    )
    for name, verdict in got.items():
        if name != "multiplier" and verdict is not None:
            assert verdict.reason.startswith(name + ": ")


@pytest.mark.parametrize(
    "multiplier, seconds", [(0, 30), (1, 30), (2, 60), (9, 270), (10, 300), (11, 300), (1000, 300)]
)
def test_avoid_duration_grows_and_caps(multiplier: int, seconds: int) -> None:
    assert avoid_duration_ms(multiplier, CFG) == seconds * S


@pytest.mark.parametrize(
    "brokers, share, limit", [(0, 0.5, 0), (1, 0.5, 0), (2, 0.5, 1), (3, 0.5, 1), (4, 0.5, 2), (10, 0.3, 3),
                              (3, 1.0, 3), (10, 0.1, 1)]
)
def test_share_cap_limit(brokers: int, share: float, limit: int) -> None:
    assert max_avoided(brokers, replace(CFG, max_avoid_share=share)) == limit


# ---------------------------------------------------------------------------------------------
# 2. Whole decisions per case: {cluster: (capped, max_avoid, {broker: (action, rule, until s)})}.
# ---------------------------------------------------------------------------------------------

def snap(*, episodes=(), health=(), avoiding=()) -> Snapshot:  # type: ignore[no-untyped-def]
    return Snapshot(NOW, tuple(episodes), tuple(health), tuple(avoiding), NOW - 5 * S)


DECIDE_CASES = {
    "healthy cluster: an empty list": (
        snap(health=cluster_of(4)), PreviousState(), {"c1": (False, 2, {})}),
    "open episode: avoid": (
        snap(episodes=[ep("b2", 30)], health=cluster_of(4)),
        PreviousState(),
        {"c1": (False, 2, {"b2": (AVOID, "open_episode", 100)})},
    ),
    "probation after close": (
        snap(episodes=[ep("b2", 60, 10)], health=cluster_of(4)),
        PreviousState(),
        {"c1": (False, 2, {"b2": (AVOID, "probation", 20)})},
    ),
    "cap: three of four bad, the least bad kept available": (
        snap(
            episodes=[ep("b1", 30), ep("b2", 30), ep("b3", 30)],
            health=cluster_of(4),
            avoiding=[Avoiding("c1", "b1", 9), Avoiding("c1", "b2", 3), Avoiding("c1", "b3", 7)],
        ),
        PreviousState(),
        {"c1": (True, 2, {"b1": (AVOID, "open_episode", 100), "b2": (KEEP_AVAILABLE, "share_cap", 0),
                          "b3": (AVOID, "open_episode", 100)})},
    ),
    "cap: open episodes beat probation": (
        snap(episodes=[ep("b1", 60, 5), ep("b2", 30)], health=cluster_of(2),
             avoiding=[Avoiding("c1", "b1", 9)]),
        PreviousState(),
        {"c1": (True, 1, {"b1": (KEEP_AVAILABLE, "share_cap", 0), "b2": (AVOID, "open_episode", 100)})},
    ),
    "cap: a one-broker cluster keeps its broker": (
        snap(episodes=[ep("b1", 30)], health=cluster_of(1)),
        PreviousState(),
        {"c1": (True, 0, {"b1": (KEEP_AVAILABLE, "share_cap", 0)})},
    ),
    "hysteresis: a published avoidance is not withdrawn early": (
        snap(episodes=[ep("b2", 200, 100)], health=cluster_of(4)),
        PreviousState("100", NOW - 60 * S, (prev("b2", 45),)),
        {"c1": (False, 2, {"b2": (AVOID, "hysteresis", 45)})},
    ),
    "hysteresis: an incumbent keeps its slot under the cap": (
        snap(
            episodes=[ep("b1", 30), ep("b2", 300), ep("b3", 30)],
            health=cluster_of(4),
            avoiding=[Avoiding("c1", "b1", 9), Avoiding("c1", "b2", 1), Avoiding("c1", "b3", 8)],
        ),
        PreviousState("100", NOW - 60 * S, (prev("b2", 60),)),
        {"c1": (True, 2, {"b1": (AVOID, "open_episode", 100), "b2": (AVOID, "open_episode", 100),
                          "b3": (KEEP_AVAILABLE, "share_cap", 0)})},
    ),
    "release once probation and hysteresis ran out": (
        snap(episodes=[ep("b2", 300, 200)], health=cluster_of(4)),
        PreviousState("100", NOW - 60 * S, (prev("b2", -10),)),
        {"c1": (False, 2, {})},
    ),
    "suspected (ahead of the watermark) counts as open": (
        snap(episodes=[ep("b2", 30, state="suspected")], health=cluster_of(4)),
        PreviousState(),
        {"c1": (False, 2, {"b2": (AVOID, "open_episode", 100)})},
    ),
    "cold start: no final health minute yet, the episode row counts the cluster's brokers": (
        snap(episodes=[ep("b2", 30, state="suspected", cluster_brokers=4)]),
        PreviousState(),
        {"c1": (False, 2, {"b2": (AVOID, "open_episode", 100)})},
    ),
    "an episode row older than broker_seen_s does not count the cluster's brokers": (
        snap(episodes=[ep("b1", 30), ep("b1", 1900, 1800, cluster_brokers=10)], health=cluster_of(2)),
        PreviousState(),
        {"c1": (False, 1, {"b1": (AVOID, "open_episode", 100)})},
    ),
    "cold start without that count: the only known broker is kept available": (
        snap(episodes=[ep("b2", 30)]),
        PreviousState(),
        {"c1": (True, 0, {"b2": (KEEP_AVAILABLE, "share_cap", 0)})},
    ),
    "an avoided broker without health rows still counts towards the cap": (
        snap(episodes=[ep("b3", 30)], health=cluster_of(2)),
        PreviousState(),
        {"c1": (False, 1, {"b3": (AVOID, "open_episode", 100)})},
    ),
    "clusters decide independently; a cleared cluster gets an empty list": (
        snap(episodes=[ep("b1", 30, cluster="c2")], health=cluster_of(2, "c2")),
        PreviousState("100", NOW - 60 * S, (prev("b9", -1, cluster="c1"),)),
        {"c1": (False, 0, {}), "c2": (False, 1, {"b1": (AVOID, "open_episode", 100)})},
    ),
    "a previous list older than broker_seen_s is forgotten": (
        snap(health=cluster_of(2)),
        PreviousState("1", NOW - 3600 * S, (prev("b9", 60),)),
        {"c1": (False, 1, {})},
    ),
    "old health and old episodes do not keep a cluster alive": (
        snap(episodes=[ep("b1", 9000, 8000, cluster="gone")], health=(hl("b1", "gone", ago_s=5000),)),
        PreviousState(),
        {},
    ),
}


def _summary(d: Decision) -> dict:
    return {
        c.cluster: (
            c.capped,
            c.max_avoid,
            {r.broker_name: (r.action, r.reason.split(":")[0], (r.avoid_until_ms - NOW) / S) for r in c.recommendations},
        )
        for c in d.clusters
    }


@pytest.mark.parametrize("case", sorted(DECIDE_CASES))
def test_decide(case: str) -> None:
    snapshot, previous, expected = DECIDE_CASES[case]
    assert _summary(decide(snapshot, previous, NOW, CFG)) == expected


def test_every_recommendation_carries_reason_evidence_version_and_expiry() -> None:
    snapshot = snap(
        episodes=[ep("b1", 30)],
        health=(hl("b1", failure_rate=0.4, sends=50, failures=20, latency_p99_ms=2500.0),) + cluster_of(4)[1:],
        avoiding=[Avoiding("c1", "b1", 7)],
    )
    decision = decide(snapshot, PreviousState(), NOW, replace(CFG, version="7", expiry_s=90))
    first = ep("b1", 30)
    assert decision == Decision(
        decided_ms=NOW,
        expires_ms=NOW + 90 * S,
        policy_version="7",
        clusters=(
            ClusterDecision(
                "c1",
                4,
                2,
                False,
                (
                    Recommendation(
                        cluster="c1",
                        broker_name="b1",
                        action=AVOID,
                        avoid_until_ms=NOW + 100 * S,
                        expires_ms=NOW + 90 * S,
                        reason="open_episode: quorum",
                        episode_id=first.episode_id,
                        evidence=Evidence(producers_avoiding=7, failure_rate=0.4, p99_latency_ms=2500.0),
                        multiplier=1,
                        policy_version="7",
                        decided_ms=NOW,
                    ),
                ),
            ),
        ),
    )


def test_evidence_falls_back_to_the_episode_when_nobody_sends() -> None:
    snapshot = snap(episodes=[ep("b1", 30, sends=200, failures=50, p99_latency_ms=4000.0)],
                    health=cluster_of(4))
    snapshot = replace(snapshot, health=(hl("b1", sends=0, failure_rate=0.0),) + snapshot.health[1:])
    rec = decide(snapshot, PreviousState(), NOW, CFG).recommendations()[0]
    assert rec.evidence == Evidence(0, 0.25, 4000.0)


def test_expiry_frees_brokers_when_the_publisher_dies() -> None:
    """A list is honoured until min(avoid_until, expires): a repeat offender's 300 s avoidance still
    ends at the 180 s expiry when no newer list arrives."""
    snapshot = snap(episodes=list(repeats("b1", 11, 30, 50)) + [ep("b1", 10)], health=cluster_of(4))
    rec = decide(snapshot, PreviousState(), NOW, CFG).recommendations()[0]
    assert (rec.avoid_until_ms - NOW, rec.expires_ms - NOW) == (300 * S, 180 * S)
    assert min(rec.avoid_until_ms, rec.expires_ms) == NOW + 180 * S


def test_decide_is_deterministic_and_jsonable() -> None:
    snapshot, previous, _ = DECIDE_CASES["hysteresis: an incumbent keeps its slot under the cap"]
    decision = decide(snapshot, previous, NOW, CFG)
    assert decision == decide(snapshot, previous, NOW, CFG)
    assert decision_from_jsonable(to_jsonable(decision)) == decision
    assert snapshot_from_jsonable(to_jsonable(snapshot)) == snapshot
    assert previous_from_jsonable(to_jsonable(previous)) == previous


def test_policy_imports_no_spark_kafka_or_airflow() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pyspark', 'kafka', 'airflow', 'great_expectations', 'deltalake'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pipeline.policy, pipeline.policy.inputs, pipeline.producer\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_producers_avoiding_now_counts_shadow_windows_only_when_told() -> None:
    import pyarrow as pa

    from pipeline.policy.inputs import avoiding_now

    def w(wid: str, client: str, enable: bool, end_s: float, state: str = "open", revision: int = 0) -> dict:
        return {"window_id": wid, "cluster": "c1", "producer_group": "PG", "client_id": client, "broker_name": "b1",
                "start_ms": NOW - 10 * S, "end_ms": NOW + int(end_s * S), "state": state, "revision": revision,
                "fault_enable": enable}

    table = pa.Table.from_pylist([
        w("1", "p1", True, 20), w("2", "p2", False, 20),  # avoiding now; p2 without fault tolerance
        w("3", "p3", True, -1),  # ended a second ago
        w("4", "p4", True, 20), w("4", "p4", True, 20, state="retracted", revision=1),  # gone
        w("5", "p1", True, 30),  # the same producer twice counts once
    ])
    assert avoiding_now(table, NOW) == [Avoiding("c1", "b1", 2)]
    assert avoiding_now(table, NOW, count_shadow=False) == [Avoiding("c1", "b1", 1)]
