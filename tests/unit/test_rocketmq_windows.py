"""Avoidance windows: against the Java oracle's per-event states, across implementations, streaming."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.rocketmq import (
    GENERATIONS,
    BrokerTrack,
    FaultEvent,
    Generation,
    Window,
    advance_windows,
    derive_windows,
    derive_windows_arrays,
    get_generation,
    step_windows,
    wakeup_ms,
    windows_from_arrays,
)
from pipeline.rocketmq.vectors import FAULT_FILES, read_jsonl
from pipeline.rocketmq.windows import flush_broker
from pipeline.rocketmq.windows_np import encode_events

VECTORS = Path(__file__).resolve().parent.parent / "fixtures" / "rocketmq-vectors"
G49, G5 = GENERATIONS["4.9"], GENERATIONS["5"]
GEN_OF_VERSION = {"4.9.8": "4.9", "5.3.3": "5"}

ENABLED_CASES = [
    (version, case)
    for version, name in FAULT_FILES.items()
    for case in read_jsonl(VECTORS / name)
    if case["input"].get("send_latency_fault_enable", True)
]


def _gen(version: str, case_input: dict[str, Any]) -> Generation:
    return get_generation(
        GEN_OF_VERSION[version], case_input.get("latency_max"), case_input.get("not_available_duration")
    )


def oracle_windows(expected_events: list[dict[str, Any]]) -> list[Window]:
    """Windows read off the oracle's per-event ``start_timestamp``s, by probing every critical time.

    Availability only changes at event times and at avoid-until times, and a probe at ``t`` sees
    every event with ``ts <= t``; so probing each critical point gives the unavailable set exactly.
    """
    history: dict[str, list[tuple[int, int, int]]] = {}  # broker -> [(ts, index, start after)]
    for ev in expected_events:
        row = next(b for b in ev["brokers"] if b["broker"] == ev["broker"])
        history.setdefault(ev["broker"], []).append((ev["ts_ms"], ev["i"], row["start_timestamp"]))
    windows = []
    for broker, hist in history.items():

        def start_at(t: int, hist: list = hist) -> int | None:
            seen = [s for ts, _, s in hist if ts <= t]
            return seen[-1] if seen else None

        points = sorted({ts for ts, _, _ in hist} | {s for _, _, s in hist})
        spans: list[list[int]] = []
        for t, nxt in itertools.pairwise(points):
            s = start_at(t)
            if s is not None and t < s:
                if spans and spans[-1][1] == t:
                    spans[-1][1] = nxt
                else:
                    spans.append([t, nxt])
        for lo, hi in spans:
            windows.append(_indexes(broker, hist, lo, hi, ev_by_i={e["i"]: e for e in expected_events}))
    return sorted(windows, key=lambda w: w.trigger_index)


def _indexes(broker: str, hist: list[tuple[int, int, int]], lo: int, hi: int, ev_by_i: dict) -> Window:
    """Trigger: the last event at ``lo`` that changed the avoid-until time. Last: the last event whose
    group changed it inside [lo, hi), or the event group at ``hi`` that cut the window short."""
    changed, prev = [], None
    for ts, i, s in hist:
        changed.append((ts, i, s, prev is None or s != prev[2], prev[2] if prev else None))
        prev = (ts, i, s)
    trigger = max(i for ts, i, _, ch, _ in changed if ts == lo and ch)
    last = trigger
    groups: dict[int, list[tuple[int, int, bool, int | None]]] = {}
    for ts, i, s, ch, before in changed:
        groups.setdefault(ts, []).append((i, s, ch, before))
    for ts, rows in groups.items():
        before_group, after_group = rows[0][3], rows[-1][1]
        net = before_group is None or before_group != after_group
        in_window = lo < ts < hi or (ts == hi and before_group is not None and before_group > hi)
        if in_window and net:
            last = max(last, max(i for i, _, ch, _ in rows if ch))
    ev = ev_by_i[trigger]
    return Window(broker, lo, hi, trigger, last, ev["latency_ms"], ev["isolation"])


@pytest.mark.parametrize(
    ("version", "case"), ENABLED_CASES, ids=[f"{v}:{c['case_id']}" for v, c in ENABLED_CASES]
)
def test_windows_match_the_oracle_states(version: str, case: dict[str, Any]) -> None:
    gen = _gen(version, case["input"])
    windows = derive_windows(gen, case["input"]["events"])
    assert windows == oracle_windows(case["expected"]["events"])
    # and every oracle probe agrees: a known broker is unavailable exactly inside one of its windows
    for probe in case["expected"]["probes"]:
        for broker in probe["brokers"]:
            inside = any(
                w.broker == broker["broker"] and w.start_ms <= probe["ts_ms"] < w.end_ms for w in windows
            )
            assert inside == (not broker["available_at_ts"]), (probe["ts_ms"], broker)
    names, arrays = encode_events(case["input"]["events"])
    assert windows_from_arrays(derive_windows_arrays(gen, *arrays), names) == windows


def E(ts: int, broker: str, latency: int, isolation: bool = False) -> FaultEvent:
    return FaultEvent(ts, broker, latency, isolation)


WINDOW_TABLE = [
    ("4.9 one slow send", G49, [E(0, "a", 600)], [Window("a", 0, 30000, 0, 0, 600, False)]),
    (
        "4.9 fast success cuts it short",
        G49,
        [E(0, "a", 600), E(10, "a", 5)],
        [Window("a", 0, 10, 0, 1, 600, False)],
    ),
    ("4.9 open and close in one ms is invisible", G49, [E(0, "a", 600), E(0, "a", 5)], []),
    (
        "4.9 close then reopen in one ms: last event triggers",
        G49,
        [E(0, "a", 600), E(0, "a", 5), E(0, "a", 1000)],
        [Window("a", 0, 60000, 2, 2, 1000, False)],
    ),
    (
        "4.9 a later slower send extends",
        G49,
        [E(0, "a", 600), E(5, "a", 1000)],
        [Window("a", 0, 60005, 0, 1, 600, False)],
    ),
    (
        "4.9 a later shorter send shortens",
        G49,
        [E(0, "a", 1000), E(5, "a", 600)],
        [Window("a", 0, 30005, 0, 1, 1000, False)],
    ),
    (
        "5 a fast success does not end it",
        G5,
        [E(0, "a", 600), E(10, "a", 5)],
        [Window("a", 0, 2000, 0, 0, 600, False)],
    ),
    (
        "5 windows touching at T merge",
        G5,
        [E(0, "a", 600), E(2000, "a", 600)],
        [Window("a", 0, 4000, 0, 1, 600, False)],
    ),
    (
        "5 a gap makes two windows",
        G5,
        [E(0, "a", 600), E(2001, "a", 600)],
        [Window("a", 0, 2000, 0, 0, 600, False), Window("a", 2001, 4001, 1, 1, 600, False)],
    ),
    ("5 isolation", G5, [E(7, "b", 1, True)], [Window("b", 7, 10007, 0, 0, 1, True)]),
    (
        "brokers are independent, ordered by trigger",
        G49,
        [E(0, "b", 600), E(1, "a", 600)],
        [Window("b", 0, 30000, 0, 0, 600, False), Window("a", 1, 30001, 1, 1, 600, False)],
    ),
]


@pytest.mark.parametrize(
    ("gen", "events", "windows"), [r[1:] for r in WINDOW_TABLE], ids=[r[0] for r in WINDOW_TABLE]
)
def test_window_rules(gen: Generation, events: list[FaultEvent], windows: list[Window]) -> None:
    assert derive_windows(gen, events) == windows
    names, arrays = encode_events(events)
    assert windows_from_arrays(derive_windows_arrays(gen, *arrays), names) == windows


def test_accepts_tuples_mappings_and_objects() -> None:
    class Obj:
        ts_ms, broker, latency_ms, isolation = 0, "a", 600, False

    expected = [Window("a", 0, 30000, 0, 0, 600, False)]
    for ev in (
        (0, "a", 600, False, True),
        {"ts_ms": 0, "broker": "a", "latency_ms": 600, "isolation": False},
        Obj(),
    ):
        assert derive_windows(G49, [ev]) == expected


def test_arrays_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        derive_windows_arrays(
            G5, np.array([2, 1]), np.array([0, 0]), np.array([600, 600]), np.array([False, False])
        )
    with pytest.raises(ValueError, match="same length"):
        derive_windows_arrays(G5, np.array([1]), np.array([0, 0]), np.array([600]), np.array([False]))
    empty = derive_windows_arrays(
        G5,
        np.array([], dtype=np.int64),
        np.array([], dtype=np.int32),
        np.array([], dtype=np.int64),
        np.array([], dtype=bool),
    )
    assert all(a.size == 0 for a in empty)


LATENCIES = st.sampled_from([-5, 0, 10, 49, 50, 549, 550, 999, 1000, 1800, 2000, 3000, 5000, 15000, 20000])
GAPS = st.sampled_from([0, 0, 0, 1, 2, 100, 1999, 2000, 5000, 30000, 60000, 600000])
EVENT_LISTS = st.lists(st.tuples(GAPS, st.sampled_from("abc"), LATENCIES, st.booleans()), max_size=40)


def _events(raw: list[tuple[int, str, int, bool]], start: int = 1000) -> list[FaultEvent]:
    out, ts = [], start
    for gap, broker, latency, isolation in raw:
        ts += gap
        out.append(E(ts, broker, latency, isolation and latency % 3 == 0))
    return out


@settings(max_examples=300, deadline=None)
@given(gen=st.sampled_from([G49, G5]), raw=EVENT_LISTS)
def test_python_and_numpy_derivations_agree(gen: Generation, raw: list) -> None:
    events = _events(raw)
    names, arrays = encode_events(events)
    assert windows_from_arrays(derive_windows_arrays(gen, *arrays), names) == derive_windows(gen, events)


def _stream(gen: Generation, events: list[FaultEvent], cuts: list[int]) -> tuple[list[Window], list]:
    """Feed micro-batches; after each, advance the watermark to the next batch's first timestamp and
    round-trip the state through flat rows."""
    tracks: dict[str, BrokerTrack] = {}
    log = []
    bounds = sorted({0, len(events), *[c % (len(events) + 1) for c in cuts]})
    for lo, hi in itertools.pairwise(bounds):
        for i in range(lo, hi):
            tracks, changes = step_windows(gen, tracks, events[i], i)
            log.extend(changes)
        if hi < len(events):
            tracks, changes = advance_windows(tracks, events[hi].ts_ms)
            log.extend(changes)
        # state goes to a store between micro-batches, as flat rows
        tracks = {b: BrokerTrack.from_row(t.as_row()) for b, t in tracks.items()}
    final = []
    for track in tracks.values():
        track, changes = flush_broker(track)
        log.extend(changes)
        if track.window is not None:
            final.append(track.window)
    closed = [c.window for c in log if c.kind == "closed"]
    return sorted(closed + final, key=lambda w: w.trigger_index), log


@settings(max_examples=300, deadline=None)
@given(gen=st.sampled_from([G49, G5]), raw=EVENT_LISTS, cuts=st.lists(st.integers(0, 60), max_size=6))
def test_streaming_in_micro_batches_emits_exactly_the_windows(
    gen: Generation, raw: list, cuts: list[int]
) -> None:
    events = _events(raw)
    windows, log = _stream(gen, events, cuts)
    assert windows == derive_windows(gen, events)
    history: dict[int, list[str]] = {}
    for change in log:
        history.setdefault(change.window.trigger_index, []).append(change.kind)
    for kinds in history.values():  # opened once, first; closed at most once, last
        assert kinds[0] == "opened" and "opened" not in kinds[1:]
        assert "closed" not in kinds[:-1]
    if gen is G5:
        assert all(c.kind != "shortened" for c in log)


def test_time_passing_closes_a_window_without_events() -> None:
    tracks, changes = step_windows(G5, {}, E(0, "a", 600), 0)
    assert changes == [] and wakeup_ms(tracks["a"]) == 1  # the group at ts 0 may still grow
    tracks, changes = advance_windows(tracks, 1)
    assert [c.kind for c in changes] == ["opened"] and wakeup_ms(tracks["a"]) == 2001
    tracks, changes = advance_windows(tracks, 2000)  # an event at 2000 could still merge
    assert changes == []
    tracks, changes = advance_windows(tracks, 2001)
    assert [(c.kind, c.window) for c in changes] == [("closed", Window("a", 0, 2000, 0, 0, 600, False))]
    assert wakeup_ms(tracks["a"]) is None


def test_out_of_order_event_is_refused() -> None:
    tracks, _ = step_windows(G49, {}, E(10, "a", 600), 0)
    with pytest.raises(ValueError, match="ordered by timestamp"):
        step_windows(G49, tracks, E(9, "a", 600), 1)


@settings(max_examples=300, deadline=None)
@given(raw=EVENT_LISTS)
def test_5_windows_never_shrink(raw: list) -> None:
    """Every window seen after a prefix of the events survives: same broker and start, end no earlier.

    (Its trigger may move to a later event of the same millisecond, so windows are matched by start.)
    """
    events = _events(raw)
    full = {(w.broker, w.start_ms): w for w in derive_windows(G5, events)}
    for k in range(len(events) + 1):
        for w in derive_windows(G5, events[:k]):
            assert full[(w.broker, w.start_ms)].end_ms >= w.end_ms
