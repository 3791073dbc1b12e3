"""The simulator's output pinned byte for byte: optimising it must not change a single emitted byte.

Each case hashes (sha256) every kind's JSON lines plus the avoidance windows the simulated clients
used, for a short run. The digests were taken from the simulator before its hot path was rewritten
for speed (bench/simulate.py, project issue 6), so a faster simulator that emits anything different
fails here. The "torture" scenario is defined inline so it cannot drift: every broker goes down at
once (4.9's ``pickOneAtLeast`` and 5.x's reachable/any fallbacks run), timeouts, flow control, a
slow disk with ``retryAnotherBrokerWhenNotStoreOK``, the failure detector, unreported fault
arguments, producers that start and stop late, and a second cluster.

If a scenario file under conf/scenarios changes on purpose, or the event contract changes, re-pin
the digest of that case (print ``_digest(...)``) and say why in the change.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from pipeline.simulate import MemorySink, Simulation, load_scenario, run_to_memory, scenario_from_dict
from pipeline.simulate.producers import TracedSelector
from pipeline.simulate.sinks import KINDS


def _torture() -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "torture",
        "seed": 5,
        "duration_s": 30.0,
        "brokers": [
            {"name": "b-1", "queues": 3},
            {"name": "b-2", "queues": 2, "latency_median_ms": 40.0, "latency_p99_ms": 700.0},
            {"name": "b-3", "queues": 4},
            {"name": "x-1", "cluster": "aux", "queues": 2},
        ],
        "faults": [
            {"broker": "b-1", "kind": "outage", "mode": "refused", "start_s": 4.0, "duration_s": 10.0},
            {"broker": "b-2", "kind": "outage", "mode": "timeout", "start_s": 6.0, "duration_s": 5.0},
            {"broker": "b-3", "kind": "outage", "mode": "refused", "start_s": 7.0, "duration_s": 3.0},
            {"broker": "b-3", "kind": "flow_control", "start_s": 12.0, "duration_s": 8.0, "share": 0.6},
            {"broker": "b-2", "kind": "flow_control", "start_s": 20.0, "duration_s": 5.0,
             "response": "PCBUSY_CLEAN_QUEUE"},
            {"broker": "b-1", "kind": "slow_disk", "start_s": 18.0, "duration_s": 6.0, "share": 0.5},
            {"broker": "b-3", "kind": "latency_spike", "start_s": 22.0, "duration_s": 6.0,
             "latency_ms": 900.0, "latency_p99_ms": 4000.0, "share": 0.7},
            {"broker": "x-1", "kind": "outage", "start_s": 10.0, "duration_s": 4.0},
        ],
        "producers": [
            {"group": "PG_5", "count": 3, "client_version": "5.3.3", "fault_tolerance": True, "rate_per_s": 60.0},
            {"group": "PG_5_det", "count": 2, "client_version": "5.2.0", "fault_tolerance": True,
             "detector_enabled": True, "rate_per_s": 40.0, "retries": 4, "send_timeout_ms": 1500},
            {"group": "PG_49", "count": 3, "client_version": "4.9.8", "fault_tolerance": True, "rate_per_s": 60.0,
             "retry_another_broker_when_not_store_ok": True},
            {"group": "PG_49_quiet", "count": 1, "client_version": "4.9.4", "fault_tolerance": True,
             "rate_per_s": 30.0, "report_fault_args": False, "start_s": 3.0, "stop_s": 25.0},
            {"group": "PG_plain_5", "count": 2, "client_version": "5.3.3", "rate_per_s": 50.0,
             "retry_another_broker_when_not_store_ok": True, "report_fault_enable": False},
            {"group": "PG_plain_49", "count": 1, "client_version": "4.9.8", "rate_per_s": 50.0, "retries": 0},
            {"group": "PG_aux", "count": 2, "cluster": "aux", "topic": "TopicAux", "client_version": "4.9.8",
             "fault_tolerance": True, "rate_per_s": 30.0},
        ],
        "consumers": [
            {"group": "CG_a", "instances": 3, "rate_per_s": 400.0, "progress_interval_s": 2.0},
            {"group": "CG_b", "strategy": "AVG_BY_CIRCLE", "instances": 2, "rate_per_s": 80.0,
             "membership_interval_s": 5.0},
            {"group": "CG_aux", "cluster": "aux", "topic": "TopicAux", "instances": 2},
        ],
        "consumer_events": [
            {"group": "CG_a", "at_s": 8.0, "kind": "crash"},
            {"group": "CG_b", "at_s": 15.0, "kind": "join", "count": 2},
        ],
    }
    for entry in raw["brokers"] + raw["producers"] + raw["consumers"]:
        entry.setdefault("cluster", "main")
    return raw


# (scenario, duration_s) -> sha256 of the run, taken before the speed work.
PINNED = {
    ("steady", 30.0): "d1fe57c7d239cfe3b57ede5a90c7aa17610058439dd8ea92d77a4b518266dcf1",
    ("broker-outage", 45.0): "077a0abf6c1425735ad66755c7f25fbcb4a062f0cf57117896899b3e4a3b7048",
    ("demo", 40.0): "dd4b6ba67d0801c30d9a7e0c012e0ef48df4309c2fcdd4a1ec4d2137043dd31f",
    ("torture", None): "e8dda6192d84ccbcb377a3948dab4788f3f39e272ddaf1949c3ae94f6bcd1b22",
}


def _digest(name: str, duration_s: float | None) -> str:
    scenario = scenario_from_dict(_torture()) if name == "torture" else load_scenario(name)
    sim, sink = run_to_memory(scenario, duration_s=duration_s)
    return _digest_of(sim, sink)


def _digest_of(sim: Simulation, sink: Any) -> str:
    h = hashlib.sha256()
    for kind in KINDS:
        h.update(kind.encode() + b"\n")
        h.update(sink.json_lines(kind))
    for w in sim.client_windows():
        h.update(repr(w).encode() + b"\n")
    return h.hexdigest()


@pytest.mark.parametrize(("name", "duration_s"), list(PINNED), ids=[n for n, _ in PINNED])
def test_stream_digest_is_pinned(name: str, duration_s: float | None) -> None:
    assert _digest(name, duration_s) == PINNED[(name, duration_s)]


class _OverridingSelector(TracedSelector):
    """Overrides ``select`` (as the feed-aware selector does), so every send takes the method path."""

    def select(self, route, now_ms, last_broker=None, *, thread=0, retry=False):  # type: ignore[no-untyped-def]
        return super().select(route, now_ms, last_broker, thread=thread, retry=retry)


def test_swapped_selectors_take_the_method_path_and_emit_the_same_bytes() -> None:
    sim = Simulation(scenario_from_dict(_torture()))
    for p in sim.producers:
        old = p.selector
        new = _OverridingSelector(
            old.generation, fault_enabled=old.fault_enabled, detector_enabled=old.detector_enabled,
            retry_another_broker_when_not_store_ok=old.retry_another_broker_when_not_store_ok, seed=old.seed,
        )
        new.trace = p.trace
        p.selector = new
    sink = MemorySink()
    sim.run(sink)
    assert _digest_of(sim, sink) == PINNED[("torture", None)]
