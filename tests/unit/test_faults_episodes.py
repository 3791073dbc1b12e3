"""``broker_fault_episodes``: each rule's verdict per case, and the scripted outage end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import from_send_results
from pipeline.faults.episodes import (
    FAILURE_OUTLIER,
    LATENCY_OUTLIER,
    QUORUM,
    Point,
    failure_outlier,
    grid_times,
    latency_outlier,
    quorum_holds,
    signal,
)
from pipeline.faults.frame import take
from pipeline.faults.state import initial_state, step
from pipeline.simulate import MemorySink, Simulation
from schemas.events import SendResult
from tests.doubles.faults_reference import current_view, run_steps
from tests.doubles.faults_synth import misbehave, outage_scenario

CFG = FaultsConfig()  # quorum 0.5 of >= 3; outliers: 20 sends, 2 peers, rate 0.5, p99 5x and >= 550 ms


@pytest.mark.parametrize(
    "avoiding,active,holds",
    [
        (3, 6, True),  # half of the active producers, and three of them
        (2, 2, False),  # everyone, but fewer than quorum_min_producers: one sick client cannot decide
        (3, 7, False),  # three, but under half
        (10, 10, True),
        (0, 0, False),
    ],
)
def test_quorum_rule(avoiding: int, active: int, holds: bool) -> None:
    assert quorum_holds(avoiding, active, CFG) is holds


@pytest.mark.parametrize(
    "rate,sends,peers,holds",
    [
        (0.9, 100, [0.0, 0.01], True),
        (0.5, 20, [0.0, 0.0, 0.0], True),  # exactly at the thresholds
        (0.9, 19, [0.0, 0.0], False),  # too few sends to judge
        (0.9, 100, [0.0], False),  # too few peers to compare with
        (0.9, 100, [0.8, 0.9, 0.1], False),  # the peers fail as much: cluster-wide, nobody's outlier
        (0.4, 100, [0.0, 0.0], False),
    ],
)
def test_failure_rate_outlier_rule(rate: float, sends: int, peers: list[float], holds: bool) -> None:
    assert failure_outlier(rate, sends, peers, CFG) is holds


@pytest.mark.parametrize(
    "p99,sends,peers,holds",
    [
        (600.0, 50, [20.0, 30.0], True),
        (600.0, 50, [200.0, 130.0], False),  # under 5x the peers' median
        (500.0, 50, [20.0, 30.0], False),  # under outlier_min_latency_ms
        (600.0, 10, [20.0, 30.0], False),
        (9000.0, 50, [20.0], False),
    ],
)
def test_latency_outlier_rule(p99: float, sends: int, peers: list[float], holds: bool) -> None:
    assert latency_outlier(p99, sends, peers, CFG) is holds


@pytest.mark.parametrize("producers,holds", [(1, False), (2, False), (3, True), (None, True)])
def test_outliers_need_several_producers(producers: int | None, holds: bool) -> None:
    assert failure_outlier(0.9, 100, [0.0, 0.0], CFG, producers) is holds
    assert latency_outlier(900.0, 100, [10.0, 10.0], CFG, producers) is holds


def test_signal_names_the_first_rule_that_holds() -> None:
    healthy = Point(avoiding=0, active=5, sends=100, failures=0, p99=10.0)
    sick = Point(avoiding=4, active=5, sends=100, failures=90, p99=900.0, failing=4, slow=4)
    points = {0: sick, 1: healthy, 2: healthy}
    assert signal(0, points, CFG) == QUORUM
    points[0] = dataclasses.replace(points[0], avoiding=1)
    assert signal(0, points, CFG) == FAILURE_OUTLIER
    points[0] = dataclasses.replace(points[0], failures=0)
    assert signal(0, points, CFG) == LATENCY_OUTLIER
    assert signal(1, points, CFG) is None


def _signal_with_every_peer(b: int, points: dict[int, Point], cfg: FaultsConfig) -> str | None:
    """The rules in order, each given its peers whatever the broker's own figures (the reference)."""
    me = points[b]
    peers = [p for k, p in points.items() if k != b and p.sends >= cfg.outlier_min_sends]
    if quorum_holds(me.avoiding, me.active, cfg):
        return QUORUM
    rate = me.failures / me.sends if me.sends else 0.0
    if failure_outlier(rate, me.sends, [p.failures / p.sends for p in peers], cfg, me.failing):
        return FAILURE_OUTLIER
    if latency_outlier(me.p99, me.sends, [p.p99 for p in peers], cfg, me.slow):
        return LATENCY_OUTLIER
    return None


def test_signal_over_many_brokers_matches_every_rule_with_every_peer() -> None:
    """Clusters of 130 brokers, some sick in each way: the verdicts of ``signal``, which gathers the
    peers only for a broker whose own figure passes a threshold, are the reference's, and every
    verdict occurs."""
    rng = np.random.default_rng(7)
    seen = []
    for _ in range(20):
        points = {}
        for b in range(130):
            sends = int(rng.choice([0, 5, 19, 20, 200]))
            failures = int(rng.binomial(sends, rng.choice([0.0, 0.05, 0.5, 0.9])))
            points[b] = Point(avoiding=int(rng.integers(0, 5)), active=int(rng.integers(0, 8)), sends=sends,
                              failures=failures, p99=float(rng.choice([2.0, 20.0, 549.0, 550.0, 3000.0])),
                              failing=int(rng.integers(0, 5)), slow=int(rng.integers(0, 5)))
        verdicts = {b: signal(b, points, CFG) for b in points}
        assert verdicts == {b: _signal_with_every_peer(b, points, CFG) for b in points}
        seen += verdicts.values()
    assert set(seen) == {QUORUM, FAILURE_OUTLIER, LATENCY_OUTLIER, None}


def test_grid_points_only_near_activity() -> None:
    starts = np.asarray([1_000, 1_000_000_000], dtype=np.int64)
    ends = starts + 12_000
    got = grid_times(starts, ends, 0, 2_000_000_000, 5_000)
    assert got.tolist() == [5_000, 10_000, 1_000_000_000, 1_000_005_000, 1_000_010_000]


def simulate(scenario: object) -> list:
    sim = Simulation(scenario)
    sink = MemorySink()
    sim.run(sink)
    return sink.events("send_result")


def episodes_of(events: list, batch_ms: int, cfg: FaultsConfig = CFG) -> list[dict]:
    batch = from_send_results(events, partitions=[sum(map(ord, e.broker_name)) % 4 for e in events])
    ts = batch["ts_ms"]
    steps, lo = [], int(ts.min())
    while lo <= int(ts.max()):
        steps.append((take(batch, (ts >= lo) & (ts < lo + batch_ms)), lo - 30_000))
        lo += batch_ms
    steps.append((take(batch, ts < 0), int(ts.max()) + 1))
    _, rows = run_steps("DefaultCluster", steps, cfg)
    return current_view(rows["episodes"], "episode_id")


@pytest.fixture(scope="module")
def outage() -> tuple[list, int]:
    scenario = outage_scenario()
    return simulate(scenario), scenario.epoch_ms


def test_scripted_outage_opens_one_episode_and_closes_it_after_recovery(outage: tuple[list, int]) -> None:
    events, epoch = outage
    got = episodes_of(events, 5_000)
    assert len(got) == 1
    [ep] = got
    assert (ep["broker_name"], ep["state"], ep["reason"]) == ("broker-c", "closed", QUORUM)
    assert epoch + 60_000 <= ep["opened_ms"] <= epoch + 75_000  # the outage starts at 60 s
    assert epoch + 180_000 <= ep["closed_ms"] <= epoch + 260_000  # and ends at 180 s
    assert ep["peak_avoiding_producers"] >= 15 and ep["peak_avoiding_share"] > 0.9
    assert ep["failures"] > 0 and ep["dominant_error"] == "RemotingConnectException"
    assert ep["sends"] >= ep["failures"]


def test_episodes_do_not_depend_on_batching(outage: tuple[list, int]) -> None:
    events, _ = outage
    a = episodes_of(events, 5_000)
    b = episodes_of(events, 41_000)
    drop = ("revision", "updated_ms")
    assert [{k: v for k, v in e.items() if k not in drop} for e in a] == [
        {k: v for k, v in e.items() if k not in drop} for e in b
    ]


def test_one_misbehaving_producer_opens_no_episode() -> None:
    scenario = outage_scenario(outage_s=1.0, start_s=1.0, after_s=120.0)
    events = [e for e in simulate(scenario) if e.ts_ms > scenario.epoch_ms + 5_000]
    clients = sorted({e.client_id for e in events})
    bad = misbehave(events, clients[0], "broker-c")
    assert sum(e.status == "FAILED" for e in bad) > 50
    assert episodes_of(bad, 5_000) == []
    # ...while the same failures from a quorum of producers open one
    for c in clients[:12]:
        events = misbehave(events, c, "broker-c")
    assert [e["broker_name"] for e in episodes_of(events, 5_000)] == ["broker-c"]


def test_a_failure_rate_outlier_opens_an_episode_without_any_avoiding() -> None:
    scenario = outage_scenario(outage_s=1.0, start_s=1.0, after_s=120.0)
    events = [dataclasses.replace(e, send_latency_fault_enable=False) for e in simulate(scenario)]
    busy = "MQBrokerException: CODE: 2 DESC: [PCBUSY_CLEAN_QUEUE]"
    bad = [dataclasses.replace(e, status="FAILED", error=busy, queue_offset=None)
           if e.broker_name == "broker-b" and (e.ts_ms // 1000) % 10 < 8 else e for e in events]
    cfg = FaultsConfig(quorum_counts_shadow_windows=False)
    [ep] = episodes_of(bad, 5_000, cfg)
    assert (ep["broker_name"], ep["reason"]) == ("broker-b", FAILURE_OUTLIER)
    assert ep["dominant_error"] == "MQBrokerException[PCBUSY_CLEAN_QUEUE]"


# -- suspicions: the rules ahead of the watermark ----------------------------------------------
def _send(i: int, ts: int, client: str, broker: str, ok: bool) -> SendResult:
    return SendResult(
        event_id=f"e{i}", ts_ms=ts, cluster="c1", producer_group="PG", client_id=client, client_version="4.9.8",
        topic="T", broker_name=broker, queue_id=0, status="SEND_OK" if ok else "FAILED",
        latency_ms=5 if ok else 3000, error=None if ok else "RemotingConnectException", queue_offset=i if ok else None,
        attempt=0, send_latency_fault_enable=True,
    )


def test_an_outage_is_suspected_before_the_watermark_decides_it(outage: tuple[list, int]) -> None:
    events, _ = outage
    batch = from_send_results(events)
    ts = batch["ts_ms"]
    steps, lo, heads = [], int(ts.min()), []
    while lo <= int(ts.max()):
        steps.append((take(batch, (ts >= lo) & (ts < lo + 5_000)), lo - 30_000))
        heads.append(lo + 5_000)
        lo += 5_000
    state, rows, seen = initial_state("DefaultCluster"), [], []
    for k, (events_k, wm) in enumerate(steps):
        state, out = step(state, events_k, wm, CFG)
        rows += out.episodes
        seen += [(k, r) for r in out.episodes]
    [(k_s, suspected)] = [(k, r) for k, r in seen if r["state"] == "suspected"]
    k_o, opened = next((k, r) for k, r in seen if r["state"] == "open")
    assert suspected["episode_id"] == opened["episode_id"] and opened["revision"] > suspected["revision"]
    # suspected as soon as the events of its grid point were read; decided a watermark delay later
    assert heads[k_s] - suspected["opened_ms"] <= 10_000
    assert (k_o - k_s) * 5_000 >= 25_000
    assert suspected["cluster_brokers"] == len({e.broker_name for e in events}) and suspected["reason"] == QUORUM
    # what is decided does not change: the suspicion is the same episode, superseded
    assert [r["episode_id"] for r in current_view(rows, "episode_id")] == [opened["episode_id"]]


@pytest.mark.parametrize("newer", [True, False], ids=["seen-ahead", "at-the-decision"])
def test_a_suspicion_that_late_events_disprove_is_withdrawn(newer: bool) -> None:
    # four producers fail on broker-c and are the only ones seen there so far: a quorum, suspected ...
    early = [_send(i, 10_000 + 100 * i, f"p{i}", "broker-c", ok=False) for i in range(4)]
    early += [_send(10 + i, 10_000 + 1_000 * i, "p0", "broker-a", ok=True) for i in range(15)]
    # ... until ten more producers' successful sends there arrive late (but not too late). With an
    # event past the next grid point in the same batch the look-ahead sees it at once; without, the
    # suspicion stands until the watermark decides its grid point.
    late = [_send(100 + i, 9_000 + 10 * i, f"q{i}", "broker-c", ok=True) for i in range(10)]
    late += [_send(99, 26_000, "p0", "broker-a", ok=True)] if newer else []
    steps = [(from_send_results(early), 0), (from_send_results(late), 5_000), (from_send_results([]), 200_000)]
    state, rows = initial_state("c1"), []
    states = []
    for events_k, wm in steps:
        state, out = step(state, events_k, wm, CFG)
        rows.append(out.episodes)
        states.append(state.suspects)
    [suspected] = rows[0]
    assert suspected["state"] == "suspected" and suspected["broker_name"] == "broker-c"
    same = [r for r in rows[1] + rows[2] if r["episode_id"] == suspected["episode_id"]]
    [withdrawn] = same  # one more row for that id, and it withdraws it
    assert withdrawn in (rows[1] if newer else rows[2])
    assert withdrawn["state"] == "withdrawn"
    assert withdrawn["revision"] == suspected["revision"] + 1 and withdrawn["closed_ms"] == withdrawn["opened_ms"]
    assert states[2] == ()  # decided: nothing pending
    assert current_view([suspected, withdrawn], "episode_id") == []


def test_suspicions_survive_the_state_codec() -> None:
    from pipeline.faults.codec import decode_state, encode_state

    early = [_send(i, 10_000 + 100 * i, f"p{i}", "broker-c", ok=False) for i in range(4)]
    early += [_send(10 + i, 10_000 + 1_000 * i, "p0", "broker-a", ok=True) for i in range(15)]
    state, _ = step(initial_state("c1"), from_send_results(early), 0, CFG)
    assert state.suspects
    assert decode_state(encode_state(state)).suspects == state.suspects
