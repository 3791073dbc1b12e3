"""The simulator's stream: reproducible byte for byte, valid per contract, offsets as a broker assigns them."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import defaultdict
from pathlib import Path

from pipeline.simulate import (
    JsonLinesSink,
    MemorySink,
    Simulation,
    load_scenario,
    run_to_memory,
)
from pipeline.simulate.sinks import KINDS
from schemas.events import decode_event


@functools.cache
def _run(name: str, seed: int | None = None, duration_s: float | None = None) -> tuple[Simulation, MemorySink]:
    return run_to_memory(name, seed=seed, duration_s=duration_s)


def _bytes(sink: MemorySink) -> dict[str, bytes]:
    return {kind: sink.json_lines(kind) for kind in KINDS}


def test_same_seed_same_stream_byte_for_byte() -> None:
    _, first = _run("demo", duration_s=40.0)
    _, again = run_to_memory("demo", duration_s=40.0)
    assert _bytes(first) == _bytes(again)
    assert all(_bytes(first).values())  # every kind present


def test_another_seed_changes_the_stream() -> None:
    _, first = _run("demo", duration_s=40.0)
    _, other = run_to_memory("demo", seed=43, duration_s=40.0)
    assert _bytes(first)["send_result"] != _bytes(other)["send_result"]


def test_file_sink_bytes_equal_memory_bytes(tmp_path: Path) -> None:
    _, memory = _run("demo", duration_s=40.0)
    sim = Simulation(load_scenario("demo").replace(duration_s=40.0))
    with JsonLinesSink(tmp_path) as files:
        sim.run(files)
    for kind in KINDS:
        assert (tmp_path / f"{kind}.jsonl").read_bytes() == memory.json_lines(kind)


def test_pacing_and_tick_batches_do_not_change_the_stream() -> None:
    scenario = load_scenario("broker-outage").replace(duration_s=40.0)
    _, fast = run_to_memory(scenario)
    paced = MemorySink()
    stats = Simulation(scenario).run(paced, speed=400.0)  # 40 virtual s in ~0.1 wall s
    assert _bytes(paced) == _bytes(fast)
    assert stats.virtual_ms >= 40_000 and not stats.stopped
    stepped = MemorySink()
    sim = Simulation(scenario)
    for batch in sim.batches():
        for kind, rows in batch.items():
            stepped.write(kind, rows)
    assert _bytes(stepped) == _bytes(fast)


def test_stop_event_ends_early_and_completes_messages_in_flight() -> None:
    sim = Simulation(load_scenario("steady"))
    stop = threading.Event()
    stop.set()
    sink = MemorySink()
    stats = sim.run(sink, stop_event=stop)
    assert stats.stopped and sim.done and stats.virtual_ms == 0
    assert sink.count() == 0


def test_every_event_satisfies_its_contract() -> None:
    # Each run covers the start of its scenario's fault.
    for name, duration in (("demo", 40.0), ("flow-control", 40.0), ("slow-disk", 40.0), ("latency-spike", 50.0)):
        _, sink = _run(name, duration_s=duration)
        for kind in KINDS:
            for event in sink.events(kind):
                decoded = decode_event(kind, event.to_json())
                expected = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
                if kind == "group_membership":
                    expected["client_ids"] = list(expected["client_ids"])
                assert decoded == expected


def test_event_ids_unique_and_in_per_client_order() -> None:
    _, sink = _run("demo", duration_s=40.0)
    sends = sink.events("send_result")
    assert len({e.event_id for e in sends}) == len(sends)
    per_client: dict[str, list] = defaultdict(list)
    for e in sends:
        per_client[e.client_id].append(e)
    for events in per_client.values():
        assert [e.event_id for e in events] == sorted(e.event_id for e in events)
        assert [e.ts_ms for e in events] == sorted(e.ts_ms for e in events)


def test_stream_is_in_time_order_per_kind() -> None:
    _, sink = _run("demo", duration_s=40.0)
    for kind in KINDS:
        ts = [e.ts_ms for e in sink.events(kind)]
        assert ts == sorted(ts)


def test_queue_offsets_are_consecutive_per_queue_and_match_broker_offsets() -> None:
    _sim, sink = _run("steady", duration_s=60.0)
    offsets: dict[tuple, list[int]] = defaultdict(list)
    stored_ts: dict[tuple, list[int]] = defaultdict(list)
    for e in sink.events("send_result"):
        key = (e.cluster, e.topic, e.broker_name, e.queue_id)
        if e.status == "FAILED":
            assert e.queue_offset is None
        else:
            offsets[key].append(e.queue_offset)
            stored_ts[key].append(e.ts_ms)
    assert len(offsets) == 12
    for key, got in offsets.items():
        assert got == list(range(len(got))), key
    checked = 0
    for p in sink.events("consumer_progress"):
        key = (p.cluster, p.topic, p.broker_name, p.queue_id)
        assert p.broker_offset == sum(1 for t in stored_ts[key] if t < p.ts_ms)
        assert -1 <= p.consumer_offset <= p.broker_offset
        checked += 1
    assert checked > 100


def test_client_fields_follow_the_producer_spec() -> None:
    _, sink = _run("demo", duration_s=40.0)
    specs = {p.group: p for p in load_scenario("demo").producers}
    for e in sink.events("send_result"):
        spec = specs[e.producer_group]
        assert e.client_version == spec.client_version
        assert e.send_latency_fault_enable is spec.fault_tolerance
        assert (e.reachable is None) == (spec.client_version == "4.9.8")
        assert e.isolation is not None


def test_live_view_hooks_see_each_batch_and_the_active_faults() -> None:
    sim = Simulation(load_scenario("broker-outage").replace(duration_s=35.0))
    seen: list[tuple[int, int, int]] = []
    stats = sim.run(MemorySink(), on_batch=lambda b: seen.append((b.start_ms, b.end_ms, len(b))))
    assert sum(n for *_, n in seen) == stats.total
    assert [s for s, _, _ in seen[:-1]] == list(range(sim.epoch_ms, sim.end_ms, 100))  # ticks, then the drain
    assert sim.active_faults(sim.epoch_ms + 29_999) == {}
    assert sim.active_faults(sim.epoch_ms + 30_000) == {"broker-b": ["outage (refused)"]}


def test_unpaced_runs_relax_the_gc_threshold_only_while_they_run() -> None:
    import gc

    from pipeline.simulate.engine import _BULK_GC_THRESHOLD

    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    inner: list[tuple[int, ...]] = []

    def nested(_batch: object) -> None:
        seen.append(gc.get_threshold())
        if not inner:  # a second unpaced run inside the first leaves the raised threshold in place
            Simulation(load_scenario("steady").replace(duration_s=1.0)).run(MemorySink())
            inner.append(gc.get_threshold())

    Simulation(load_scenario("steady").replace(duration_s=2.0)).run(MemorySink(), on_batch=nested)
    assert seen and all(t[0] == max(before[0], _BULK_GC_THRESHOLD) and t[1:] == before[1:] for t in seen)
    assert inner == [seen[0]]
    assert gc.get_threshold() == before
    paced: list[tuple[int, ...]] = []
    Simulation(load_scenario("steady").replace(duration_s=0.5)).run(
        MemorySink(), speed=1000.0, on_batch=lambda _b: paced.append(gc.get_threshold())
    )
    assert paced and set(paced) == {before}


def test_rows_a_memory_sink_keeps_are_hidden_from_the_gc_only_while_an_unpaced_run_lasts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gc

    from pipeline.simulate.sinks import JsonLinesSink

    def frozen_during(sink: object, **run: object) -> list[int]:
        seen: list[int] = []
        Simulation(load_scenario("steady").replace(duration_s=1.0)).run(
            sink, on_batch=lambda _b: seen.append(gc.get_freeze_count()), **run
        )
        assert seen and gc.get_freeze_count() == 0  # handed back at the end
        return seen

    assert gc.get_freeze_count() == 0
    assert min(frozen_during(MemorySink())) > 0
    assert set(frozen_during(MemorySink(), speed=1000.0)) == {0}  # paced: rows arrive slowly
    assert set(frozen_during(JsonLinesSink(tmp_path), close=True)) == {0}  # keeps nothing
    gc.freeze()  # objects someone else froze (a pre-fork server): left as they are
    try:
        theirs = gc.get_freeze_count()
        seen: list[int] = []
        Simulation(load_scenario("steady").replace(duration_s=1.0)).run(
            MemorySink(), on_batch=lambda _b: seen.append(gc.get_freeze_count())
        )
        # (frozen objects may still be freed, so the count can only drop, never grow by our rows)
        assert seen and max(seen) <= theirs and gc.get_freeze_count() <= theirs
    finally:
        gc.unfreeze()
