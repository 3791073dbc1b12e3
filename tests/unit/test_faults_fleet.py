"""Every cluster under the query's own watermark (what the Spark shim runs per batch)."""

from __future__ import annotations

import random

from pipeline.config import FaultsConfig
from pipeline.faults import FleetState, fleet_step, from_send_results, next_watermark
from tests.doubles.faults_reference import current_view, expected_windows, run_fleet, window_keys
from tests.doubles.faults_synth import T0, random_stream

CFG = FaultsConfig()
DELAY = 30_000


def test_the_watermark_is_the_max_event_time_of_earlier_batches_minus_the_delay() -> None:
    a = from_send_results(random_stream(1, events=200, span_ms=40_000))
    b = from_send_results(random_stream(2, events=200, start_ms=T0 + 40_000, span_ms=40_000))
    fleet, _ = fleet_step(FleetState(), a, CFG, DELAY)
    assert fleet.watermark_ms == int(a["ts_ms"].max()) - DELAY
    fleet, _ = fleet_step(fleet, b, CFG, DELAY)
    assert fleet.watermark_ms == int(b["ts_ms"].max()) - DELAY
    # a clock far ahead of the batch time moves nothing
    assert next_watermark(5, b, DELAY, now_ms=T0, skew_ms=1000) == 5


def test_clusters_are_tracked_apart_under_one_watermark() -> None:
    one = random_stream(3, events=1500, span_ms=120_000, cluster="east")
    two = random_stream(4, events=1500, span_ms=120_000, cluster="west")
    stream = sorted(one + two, key=lambda e: e.ts_ms)
    rng = random.Random(5)
    batches, current = [], []
    for e in stream:
        current.append(e)
        if rng.random() < 0.02:
            batches.append(current)
            current = []
    batches.append(current)
    offsets, cols = 0, []
    for batch in batches:
        cols.append(from_send_results(batch, offsets=range(offsets, offsets + len(batch))))
        offsets += len(batch)
    fleet, rows = run_fleet(cols, CFG, DELAY)
    view = current_view(rows["windows"])
    assert {r["cluster"] for r in view} == {"east", "west"}
    assert window_keys(view) == expected_windows(from_send_results(stream))
    assert rows["quarantine"] == []  # in order: nothing late
    assert set(fleet.clusters) <= {"east", "west"}


def test_a_late_event_is_late_for_every_cluster_and_windows_settle_in_the_same_batch() -> None:
    east = random_stream(6, events=300, span_ms=60_000, cluster="east")
    fleet, out = fleet_step(FleetState(), from_send_results(east), CFG, DELAY)
    top = max(e.ts_ms for e in east)
    assert fleet.watermark_ms == top - DELAY
    # windows ending by the next batch's watermark are already closed in this batch's rows
    assert all(r["state"] == "closed" for r in current_view(out.windows) if r["end_ms"] <= top - DELAY)
    assert any(r["state"] == "closed" for r in out.windows)
    west = random_stream(7, events=50, span_ms=1_000, cluster="west", start_ms=T0)
    fleet, out = fleet_step(fleet, from_send_results(west, offsets=range(1000, 1050)), CFG, DELAY)
    assert {q["reason"] for q in out.quarantine} == {"late"} and len(out.quarantine) == 50
