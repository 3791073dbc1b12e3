"""Broker faults as the simulated producers live them, held against the pipeline's pure rules.

The windows test is the contract the pipeline relies on: the avoidance windows derived from the
emitted events by :func:`pipeline.rocketmq.windows.derive_windows` (what ``producer_fault_windows``
computes) equal the windows the simulated clients actually used, recorded from their own state.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict

import pytest

from pipeline.rocketmq.fault import get_generation
from pipeline.rocketmq.generation import generation_for_client_version
from pipeline.rocketmq.outcomes import ErrorKind, classify_error, update_args
from pipeline.rocketmq.windows import FaultEvent, derive_windows
from pipeline.simulate import MemorySink, Simulation, run_to_memory
from schemas.events import SendResult

S = 1000


@functools.cache
def _run(name: str, duration_s: float | None = None) -> tuple[Simulation, MemorySink]:
    return run_to_memory(name, duration_s=duration_s)


def _per_client(sink: MemorySink) -> dict[str, list[SendResult]]:
    out: dict[str, list[SendResult]] = defaultdict(list)
    for e in sink.events("send_result"):
        out[e.client_id].append(e)
    return out


def _messages(events: list[SendResult]) -> list[list[SendResult]]:
    """A client's attempts grouped into messages (attempt 0 starts one)."""
    messages: list[list[SendResult]] = []
    for e in events:
        if e.attempt == 0:
            messages.append([])
        messages[-1].append(e)
    return messages


def _pipeline_windows(sink: MemorySink) -> set[tuple[str, str, int, int]]:
    """Windows as the pipeline derives them from the events alone (ordered by ts, event id)."""
    out = set()
    for cid, events in _per_client(sink).items():
        if not events[0].send_latency_fault_enable:
            continue
        events.sort(key=lambda e: (e.ts_ms, e.event_id))
        gen = get_generation(generation_for_client_version(events[0].client_version))
        updates = []
        for e in events:
            iso, reach = update_args(e.status, e.error, e.client_version, isolation=e.isolation, reachable=e.reachable)
            updates.append(FaultEvent(e.ts_ms, e.broker_name, e.latency_ms, iso, reach))
        out.update((cid, w.broker, w.start_ms, w.end_ms) for w in derive_windows(gen, updates))
    return out


@pytest.mark.parametrize(
    ("name", "duration_s", "broker"),
    [("broker-outage", 100.0, "broker-b"), ("latency-spike", 90.0, "broker-c"),
     ("flow-control", 100.0, "broker-a"), ("slow-disk", 100.0, "broker-d")],
)
def test_client_windows_equal_the_windows_derived_from_events(name: str, duration_s: float, broker: str) -> None:
    sim, sink = _run(name, duration_s)
    client = {(w.client_id, w.broker_name, w.start_ms, w.end_ms) for w in sim.client_windows()}
    assert client == _pipeline_windows(sink)
    fault_tolerant = {p.client_id for p in sim.producers if p.spec.fault_tolerance}
    assert {w[0] for w in client if w[1] == broker} == fault_tolerant  # every such client avoided it
    assert all(w[1] == broker for w in client)  # and only the faulty broker


def test_outage_retries_move_to_other_brokers() -> None:
    _sim, sink = _run("broker-outage", 100.0)
    failed_then_retried = 0
    for events in _per_client(sink).values():
        for message in _messages(events):
            for first, second in itertools.pairwise(message):
                assert first.status == "FAILED"
                assert second.broker_name != first.broker_name
                failed_then_retried += first.broker_name == "broker-b"
            assert message[-1].status == "SEND_OK"  # three healthy brokers: every message gets through
    assert failed_then_retried > 100


def test_fault_tolerant_clients_stop_choosing_the_dead_broker() -> None:
    sim, sink = _run("broker-outage", 100.0)
    e0 = sim.epoch_ms
    first_tries: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in sink.events("send_result"):
        if e.attempt == 0 and 30 * S <= e.ts_ms - e0 < 90 * S:
            kind = "ft" if e.send_latency_fault_enable else "no-ft"
            first_tries[kind][0] += e.broker_name == "broker-b"
            first_tries[kind][1] += 1
    share = {k: hit / total for k, (hit, total) in first_tries.items()}
    # Without fault tolerance round robin runs over 16 queues; a retry after broker-b's first queue
    # skips its other three, so one first try in 12 still lands on broker-b.
    assert share["no-ft"] == pytest.approx(1 / 12, abs=0.01)
    assert share["ft"] < share["no-ft"] / 5


def test_no_client_chooses_a_broker_inside_its_own_window() -> None:
    sim, sink = _run("broker-outage", 100.0)
    windows: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for w in sim.client_windows():
        windows[(w.client_id, w.broker_name)].append((w.start_ms, w.end_ms))
    for e in sink.events("send_result"):
        begin = e.ts_ms - e.latency_ms
        for start, end in windows.get((e.client_id, e.broker_name), ()):
            # The attempt that opened the window ends at its start (a refusal can take 0 ms).
            assert not (start <= begin < end and e.ts_ms > start), e


def test_legacy_clients_isolate_the_dead_broker_for_ten_minutes() -> None:
    sim, sink = _run("broker-outage", 100.0)
    legacy = [p for p in sim.producers if p.spec.client_version == "4.9.8"]
    assert legacy
    for p in legacy:
        events = [e for e in sink.events("send_result") if e.client_id == p.client_id and e.broker_name == "broker-b"]
        first_failure = next(i for i, e in enumerate(events) if e.status == "FAILED")
        assert events[first_failure + 1 :] == []  # never again within the run (600 s isolation)
        (window,) = [w for w in sim.client_windows() if w.client_id == p.client_id]
        assert window.end_ms - window.start_ms == 600 * S


def test_flow_control_rejections_are_not_retried() -> None:
    _, sink = _run("flow-control", 100.0)
    busy = 0
    for events in _per_client(sink).values():
        for message in _messages(events):
            for e in message:
                if e.status == "FAILED":
                    assert e.broker_name == "broker-a" and "[TIMEOUT_CLEAN_QUEUE]broker busy" in (e.error or "")
                    assert classify_error(e.error) is ErrorKind.BROKER
                    assert e is message[-1]  # SYSTEM_BUSY is not a retry code
                    busy += 1
    assert busy > 50


def test_slow_disk_answers_flush_disk_timeout_with_an_offset() -> None:
    sim, sink = _run("slow-disk", 100.0)
    slow = [e for e in sink.events("send_result") if e.status == "FLUSH_DISK_TIMEOUT"]
    assert len(slow) > 20
    for e in slow:
        assert e.broker_name == "broker-d" and e.error is None and e.queue_offset is not None
        assert 30 * S <= e.ts_ms - e.latency_ms - sim.epoch_ms < 90 * S
        assert e.latency_ms >= 900


def test_latency_spike_slows_only_its_broker_and_time() -> None:
    sim, sink = _run("latency-spike", 90.0)
    lat: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for e in sink.events("send_result"):
        begin = e.ts_ms - e.latency_ms - sim.epoch_ms
        lat[(e.broker_name, 40 * S <= begin < 80 * S)].append(e.latency_ms)
    median = {k: sorted(v)[len(v) // 2] for k, v in lat.items()}
    assert 600 <= median[("broker-c", True)] <= 1000
    assert all(m < 20 for k, m in median.items() if k != ("broker-c", True))
