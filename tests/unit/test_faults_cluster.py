"""Fault state per broker + the cluster decision over their points == one state for the cluster.

The combined query keeps the fault state per (cluster, broker) and decides episodes on the
brokers' grid points (pipeline.faults.points, pipeline.faults.cluster). Run both ways over the
simulator's outage in micro-batches, as the query calls them (a broker with events in a batch is
stepped to the batch's settle point, an idle one once the watermark reaches its wake-up time),
they must write the same windows, health rows and episode rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import from_send_results, initial_state, step
from pipeline.faults.cluster import ClusterState, cluster_step, dumps, loads
from pipeline.faults.frame import take
from pipeline.simulate import MemorySink, Simulation
from tests.doubles.faults_synth import outage_scenario

CFG = FaultsConfig()
DELAY = 30_000


def batches_of(cols: Any, size_ms: int) -> list[tuple[Any, int]]:
    ts = cols["ts_ms"]
    out, lo = [], int(ts.min())
    while lo <= int(ts.max()):
        out.append((take(cols, (ts >= lo) & (ts < lo + size_ms)), lo + size_ms - DELAY))
        lo += size_ms
    out.append((take(cols, ts < 0), int(ts.max()) + 1))  # the end: everything settles
    return out


def one_state(batches: list[tuple[Any, int]]) -> dict[str, list[dict]]:
    state, previous = initial_state("DefaultCluster"), 0
    rows: dict[str, list[dict]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    for events, settle in batches:
        state, out = step(state, events, previous, CFG, None, settle)
        for key in rows:
            rows[key] += getattr(out, key)
        previous = settle
    return rows


def per_broker(batches: list[tuple[Any, int]], through_json: bool) -> dict[str, list[dict]]:
    states: dict[str, Any] = {}
    wakeups: dict[str, int | None] = {}
    decider = ClusterState("DefaultCluster")
    rows: dict[str, list[dict]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    previous = 0
    for events, settle in batches:
        names = events["broker_name"]
        points: list[dict] = []
        for broker in sorted(set(names.tolist()) | set(states)):
            mine = take(events, names == broker)
            if mine["ts_ms"].size:
                state, out = step(states.get(broker) or initial_state("DefaultCluster"), mine, previous, CFG,
                                  None, settle, points=True)
            elif wakeups.get(broker) is not None and previous >= wakeups[broker]:  # an event-time timeout
                state, out = step(states[broker], mine, previous, CFG, None, previous, points=True)
            else:
                continue
            states[broker], wakeups[broker] = state, out.wakeup_ms
            points += out.points
            for key in ("windows", "health", "quarantine"):
                rows[key] += getattr(out, key)
        decider, episodes = cluster_step(decider, points, settle, CFG)
        if through_json:
            decider = loads(dumps({"DefaultCluster": decider}))["DefaultCluster"]
        rows["episodes"] += episodes
        previous = settle
    return rows


@pytest.fixture(scope="module")
def outage() -> Any:
    sim = Simulation(outage_scenario())
    sink = MemorySink()
    sim.run(sink)
    return from_send_results(sink.events("send_result"))


def canon(rows: list[dict]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


@pytest.mark.parametrize("size_ms", [5_000, 41_000])
def test_per_broker_states_and_the_cluster_decision_write_what_one_state_writes(outage: Any, size_ms: int) -> None:
    batches = batches_of(outage, size_ms)
    want = one_state(batches)
    got = per_broker(batches, through_json=size_ms == 5_000)
    assert want["episodes"], "the outage opens an episode"
    for key in ("windows", "health", "quarantine", "episodes"):
        assert canon(got[key]) == canon(want[key]), key


def test_a_broker_without_events_keeps_its_forecast(outage: Any) -> None:
    # The dead broker's producers stop sending to it; its windows still count towards the quorum.
    batches = batches_of(outage, 5_000)
    dead = [b for b in set(outage["broker_name"].tolist()) if b == "broker-c"]
    assert dead
    quiet = [int(np.count_nonzero(events["broker_name"] == "broker-c")) for events, _ in batches]
    assert 0 in quiet[:-1]  # some batches have no send to it at all
