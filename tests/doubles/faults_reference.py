"""What the fault tables must say, computed the slow and obvious way (tests, benchmarks, audits).

- :func:`expected_windows`: each producer x broker's whole, ordered stream through
  :func:`pipeline.rocketmq.derive_windows`, with no batches, no state and no watermark.
- :func:`windows_from_vector`: windows read off the Java oracle's ``start_timestamp`` after each
  event of a differential-vector case (interval arithmetic, no rule code at all).
- :func:`current_view`: the highest revision of each row id, as readers of the tables see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pipeline.faults.events import (
    GEN_NAMES,
    fault_enabled,
    generation_codes,
    processing_order,
    update_arguments,
)
from pipeline.faults.frame import Cols, take
from pipeline.rocketmq import GENERATIONS, FaultEvent, derive_windows
from schemas.events import SendResult

WindowKey = tuple[str, str, str, str, int, int]  # cluster, group, client, broker, start, end


def current_view(rows: Iterable[Mapping[str, Any]], key: str = "window_id") -> list[dict[str, Any]]:
    """The latest revision per ``key``; retracted windows and withdrawn episodes are left out."""
    latest: dict[Any, dict[str, Any]] = {}
    for row in rows:
        k = row[key]
        if k not in latest or row["revision"] > latest[k]["revision"]:
            latest[k] = dict(row)
    return [r for r in latest.values() if r.get("state") not in ("retracted", "withdrawn")]


def window_keys(rows: Iterable[Mapping[str, Any]], fault_enable: bool | None = None) -> list[WindowKey]:
    return sorted(
        (r["cluster"], r["producer_group"], r["client_id"], r["broker_name"], int(r["start_ms"]), int(r["end_ms"]))
        for r in rows
        if fault_enable is None or bool(r["fault_enable"]) == fault_enable
    )


def expected_windows(events: Cols, detector_enabled: bool = False, default_enable: bool = False,
                     fault_enable: bool | None = None) -> list[WindowKey]:
    """Windows of every (cluster, group, client, broker) in ``events``, from the whole stream at once.

    One generation per pair (the first event's). ``fault_enable`` keeps only pairs whose first
    event ran with (True) or without (False) fault tolerance.
    """
    events = take(events, processing_order(events))
    gen = generation_codes(events["client_version"])
    iso, reach = update_arguments(gen, events["status"], events["error"], events["isolation"],
                                  events["reachable"], detector_enabled)
    enable = fault_enabled(events["send_latency_fault_enable"], default_enable)
    by_pair: dict[tuple[str, str, str, str], list[int]] = {}
    keys = zip(events["cluster"], events["producer_group"], events["client_id"], events["broker_name"])
    for i, key in enumerate(keys):
        by_pair.setdefault(key, []).append(i)
    out: list[WindowKey] = []
    for (cluster, group, client, broker), idx in by_pair.items():
        if gen[idx[0]] < 0 or (fault_enable is not None and bool(enable[idx[0]]) != fault_enable):
            continue
        seq = [FaultEvent(int(events["ts_ms"][i]), broker, int(events["latency_ms"][i]), bool(iso[i]),
                          bool(reach[i])) for i in idx]
        for w in derive_windows(GENERATIONS[GEN_NAMES[gen[idx[0]]]], seq):
            out.append((cluster, group, client, broker, w.start_ms, w.end_ms))
    return sorted(out)


def windows_from_vector(case: Mapping[str, Any], offset_ms: int = 0) -> list[tuple[str, int, int]]:
    """(broker, start, end) windows implied by the oracle's ``start_timestamp`` after each event.

    After the events with timestamp ``t`` (a group), broker B is unavailable on
    ``[t, min(start_B, next group's t))``; windows are the maximal unions of those intervals.
    """
    expected = case["expected"]["events"]
    groups: dict[int, dict[str, int]] = {}
    order: list[int] = []
    for ev in expected:
        t = ev["ts_ms"]
        if t not in groups:
            groups[t] = {}
            order.append(t)
        groups[t] = {b["broker"]: b["start_timestamp"] for b in ev["brokers"]}
    out = []
    brokers = sorted({b for g in groups.values() for b in g})
    for broker in brokers:
        spans: list[tuple[int, int]] = []
        for k, t in enumerate(order):
            until = groups[t].get(broker)
            if until is None:
                continue
            end = until if k + 1 == len(order) else min(until, order[k + 1])
            if end <= t:
                continue
            if spans and spans[-1][1] >= t:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((t, end))
        out.extend((broker, s + offset_ms, e + offset_ms) for s, e in spans)
    return sorted(out)


def vector_events(case: Mapping[str, Any], client_version: str, offset_ms: int, cluster: str = "vectors",
                  group: str = "PG_vectors") -> list[SendResult]:
    """A vector case as one producer's send results (explicit isolation/reachable).

    Timestamps move by ``offset_ms`` (the vectors start near 0; events must be real times).
    Negative latencies become 0: every case that uses this has the default tables, where both
    mean a duration of 0.
    """
    inp = case["input"]
    enable = inp.get("send_latency_fault_enable", True)
    out = []
    for i, ev in enumerate(inp["events"]):
        iso = bool(ev["isolation"])
        out.append(SendResult(
            event_id=f"{case['case_id']}-{i:04d}", ts_ms=ev["ts_ms"] + offset_ms, cluster=cluster,
            producer_group=group, client_id=case["case_id"], client_version=client_version, topic="TopicTest",
            broker_name=ev["broker"], queue_id=0, status="FAILED" if iso else "SEND_OK",
            latency_ms=max(0, int(ev["latency_ms"])), error="RemotingTimeoutException" if iso else None,
            queue_offset=None if iso else i, attempt=0, isolation=iso, reachable=bool(ev.get("reachable", True)),
            send_latency_fault_enable=enable,
        ))
    return out


def uses_default_tables(case: Mapping[str, Any]) -> bool:
    inp = case["input"]
    return "latency_max" not in inp and "not_available_duration" not in inp


def event_array(values: Iterable[Any]) -> np.ndarray:
    out = list(values)
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def run_steps(cluster: str, batches: Iterable[tuple[Cols, int]], cfg: Any, now_ms: int | None = None,
              through_codec: bool = True) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """Feed ``(events, watermark)`` batches to :func:`pipeline.faults.step` as Spark would.

    With ``through_codec`` the state goes through the state-store encoding between batches.
    Returns the last state and every row written, per table.
    """
    from pipeline.faults.codec import decode_state, encode_state
    from pipeline.faults.state import initial_state, step

    state = initial_state(cluster)
    rows: dict[str, list[dict[str, Any]]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    for events, watermark in batches:
        state, out = step(state, events, watermark, cfg, now_ms)
        if through_codec:
            state = decode_state(encode_state(state))
        rows["windows"] += out.windows
        rows["episodes"] += out.episodes
        rows["health"] += out.health
        rows["quarantine"] += out.quarantine
    return state, rows


def run_fleet(batches: Iterable[Cols], cfg: Any, delay_ms: int, now_ms: int | None = None,
              through_codec: bool = True) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """Feed batches to :func:`pipeline.faults.fleet_step` exactly as the Spark shim does."""
    from pipeline.faults.codec import decode_fleet, encode_fleet
    from pipeline.faults.fleet import FleetState, fleet_step

    fleet = FleetState()
    rows: dict[str, list[dict[str, Any]]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    for events in batches:
        fleet, out = fleet_step(fleet, events, cfg, delay_ms, now_ms)
        if through_codec:
            fleet = decode_fleet(encode_fleet(fleet))
        for key in rows:
            rows[key] += getattr(out, key)
    return fleet, rows
