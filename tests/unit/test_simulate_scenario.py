"""Scenario files load, and a bad scenario fails at load with the key named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pipeline.simulate import ScenarioError, available_scenarios, load_scenario, scenario_from_dict
from pipeline.simulate.scenario import FaultSpec, ProducerSpec

REQUIRED = (
    "steady",
    "broker-outage",
    "latency-spike",
    "flow-control",
    "slow-consumer",
    "consumer-crash",
    "rebalance",
    "more-consumers-than-queues",
    "demo",
)

BASE: dict[str, Any] = {
    "name": "t",
    "duration_s": 10.0,
    "brokers": [{"name": "broker-a"}, {"name": "broker-b", "queues": 2}],
    "faults": [{"broker": "broker-a", "kind": "outage", "start_s": 1.0, "duration_s": 2.0}],
    "producers": [{"group": "PG", "client_version": "4.9.8"}],
    "consumers": [{"group": "CG"}],
    "consumer_events": [{"group": "CG", "at_s": 5.0, "kind": "crash"}],
}


@pytest.mark.parametrize("name", REQUIRED)
def test_required_scenarios_load(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.brokers and scenario.producers


def test_every_scenario_file_loads() -> None:
    assert set(REQUIRED) <= set(available_scenarios())
    for name in available_scenarios():
        load_scenario(name)


def test_demo_is_sized_for_a_live_demo() -> None:
    demo = load_scenario("demo")
    rate = sum(p.count * p.rate_per_s for p in demo.producers)
    assert 300 <= rate <= 3000  # "a few thousand events/s at most" at speed 1, retries included
    outage = [f for f in demo.faults if f.kind == "outage"]
    assert len(outage) == 1 and 15 <= outage[0].start_s <= 30 and 30 <= (outage[0].duration_s or 0) <= 60
    versions = {p.client_version for p in demo.producers}
    assert versions == {"4.9.8", "5.3.3"}
    assert sum(p.count for p in demo.producers if p.fault_tolerance) > sum(p.count for p in demo.producers) / 2


def test_a_valid_dict_builds_typed_specs() -> None:
    s = scenario_from_dict(BASE)
    assert s.faults == (FaultSpec("broker-a", "outage", 1.0, 2.0),)
    assert s.producers == (ProducerSpec("PG", client_version="4.9.8"),)
    assert s.brokers[1].queues == 2 and s.brokers[0].queues == 4
    assert s.clusters() == ["DefaultCluster"]


def _with(path: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    target: Any = raw
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return raw


_DELETE = object()

BAD = [
    # (path to change, new value, text the error must contain)
    ("speed", 2, "unknown key speed"),
    ("producers.0.rate", 5, "unknown key producers[0].rate"),
    ("faults.0.kind", "outtage", "faults[0].kind: 'outtage' is not valid"),
    ("faults.0.mode", "refuse", "faults[0].mode: 'refuse' is not valid"),
    ("faults.0.share", 0.5, "faults[0].share: not a parameter of kind 'outage'"),
    ("faults.0.broker", "broker-z", "faults[0].broker: unknown broker 'broker-z'"),
    ("faults.0.start_s", "soon", "faults[0].start_s: expected a number"),
    ("faults.0.start_s", _DELETE, "missing key faults[0].start_s"),
    ("producers.0.client_version", "3.2.6", "producers[0].client_version"),
    ("producers.0.fault_tolerance", "yes", "producers[0].fault_tolerance: expected true or false"),
    ("producers.0.count", 0, "producers[0].count: must be > 0"),
    ("producers.0.cluster", "other", "producers[0].cluster: unknown cluster 'other'"),
    ("consumers.0.strategy", "ROUND_ROBIN", "consumers[0].strategy: unknown allocation strategy 'ROUND_ROBIN'"),
    ("consumer_events.0.group", "CG_x", "consumer_events[0].group: unknown consumer group 'CG_x'"),
    ("consumer_events.0.kind", "rate", "consumer_events[0].rate_per_s: a rate event needs rate_per_s"),
    ("brokers.1.name", "broker-a", "brokers[1].name: duplicate broker 'broker-a'"),
    ("brokers.0.latency_p99_ms", 1.0, "brokers[0].latency_p99_ms: must be >= the median"),
    ("brokers", [], "brokers: at least one broker is required"),
    ("duration_s", 0, "duration_s: must be > 0"),
    ("faults", {"broker": "broker-a"}, "faults: expected a list"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD, ids=[b[0] + ":" + b[2][:30] for b in BAD])
def test_bad_values_name_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_with(path, value))
    assert message in str(info.value)


def test_latency_spike_needs_a_latency() -> None:
    raw = _with("faults.0.kind", "latency_spike")
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.latency_ms: is required"):
        scenario_from_dict(raw)


def test_several_clusters_need_an_explicit_cluster() -> None:
    raw = _with("brokers.1.cluster", "other")
    with pytest.raises(ScenarioError, match=r"producers\[0\]\.cluster: is required when there are several clusters"):
        scenario_from_dict(raw)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('name = "typo"\n[[brokers]]\nname = "b"\nqueus = 4\n')
    with pytest.raises(ScenarioError) as info:
        load_scenario(str(path))
    assert str(path) in str(info.value) and "unknown key brokers[0].queus" in str(info.value)
    with pytest.raises(ScenarioError, match="unknown scenario 'no-such'"):
        load_scenario("no-such")
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario(str(tmp_path / "missing.toml"))
