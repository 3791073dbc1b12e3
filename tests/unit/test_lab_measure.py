"""The lab's measures over hand-made readings: the exact two-way live oracle, a window as faultwatch
knew it at a moment, and the release measure (broker-minutes of avoidance from a producer's readings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faultwatch.lab import LabRun, Snapshot
from faultwatch.lab_measure import (
    avoided_ms,
    client_removals,
    faultwatch_windows_at,
    oracle,
    released_at,
    revisions_by_client,
)


def window(wid: str, broker: str, start: int, end: int, revision: int, updated: int, state: str = "open",
           client: str = "c1") -> dict[str, Any]:
    return {"window_id": wid, "client_id": client, "broker_name": broker, "start_ms": start, "end_ms": end,
            "revision": revision, "updated_ms": updated, "state": state}


def snapshot(phase: str, now: int, items: dict[str, int], *, feed: bool = False, enable: bool = True) -> Snapshot:
    faults = {"now_ms": now, "client_id": "c1",
              "items": [{"broker_name": b, "start_timestamp": u} for b, u in items.items()]}
    return Snapshot(phase, "p0", "4.9.8", enable, feed, faults)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (999, {}),                     # before the window opened
        (1_000, {"b": 31_000}),        # opened at 1,000 with a 30 s window
        (5_000, {"b": 601_000}),       # a later update (at 2,000, isolation) pushed it out
        (601_000, {}),                 # its end: available again (the client's "now - start >= 0")
    ],
)
def test_a_window_is_read_as_it_stood_at_the_moment(now: int, expected: dict[str, int]) -> None:
    rows = [window("w1", "b", 1_000, 31_000, 1, 1_000), window("w1", "b", 1_000, 601_000, 2, 2_000),
            window("w1", "b", 1_000, 601_000, 3, 601_000, "closed")]
    assert faultwatch_windows_at(revisions_by_client(rows)["c1"], now) == expected


def test_a_retracted_window_and_another_clients_are_not_read() -> None:
    rows = [window("w1", "b", 1_000, 31_000, 1, 1_000), window("w1", "b", 1_000, 31_000, 2, 3_000, "retracted"),
            window("w2", "c", 1_000, 31_000, 1, 1_000, client="c2")]
    assert faultwatch_windows_at(revisions_by_client(rows)["c1"], 5_000) == {}


def test_a_window_whose_opening_was_folded_into_a_later_revision_still_counts() -> None:
    rows = [window("w1", "b", 1_000, 601_000, 1, 9_000)]
    assert faultwatch_windows_at(revisions_by_client(rows)["c1"], 5_000) == {"b": 601_000}


def test_the_oracle_counts_both_ways_and_needs_equal_ends(tmp_path: Path) -> None:
    run = LabRun(tmp_path, str(tmp_path), "127.0.0.1:1", "rmq.avoidance")
    run.snapshots = [
        snapshot("killed", 5_000, {"b": 601_000, "c": 4_000}),   # c no longer in force
        snapshot("frozen", 9_000, {"b": 601_000}),
        snapshot("frozen", 9_000, {"a": 99_999}, feed=True),      # the feed's producer: left out
        snapshot("frozen", 9_000, {"a": 99_999}, enable=False),   # fault tolerance off: left out
    ]
    windows = [window("w1", "b", 1_000, 601_000, 1, 1_000),
               window("w2", "a", 8_000, 38_000, 1, 8_000),          # faultwatch only: a miss
               window("w3", "c", 2_000, 4_000, 1, 2_000)]
    misses: list[str] = []
    by_version: dict[str, list[int]] = {}
    assert oracle(run, windows, misses, by_version) == {"killed": (1, 1), "frozen": (1, 2)}
    assert by_version == {"4.9.8": [2, 3]}
    assert misses == ["frozen p0 a: client until None, faultwatch end 38000 (read at 9000)"]
    windows[0]["end_ms"] = 601_001  # one millisecond off is a miss
    assert oracle(run, windows, [], None) == {"killed": (0, 1), "frozen": (0, 2)}


def test_a_state_folded_by_one_micro_batch_into_a_later_change_is_not_compared(tmp_path: Path) -> None:
    """An isolation (until 601,000) read at 1,500, then a success at 1,700 ends it; the micro-batch that
    wrote the window carried both, so its first row (written at 1,700) says 1,700: not a miss, not a match."""
    run = LabRun(tmp_path, str(tmp_path), "127.0.0.1:1", "rmq.avoidance")
    run.snapshots = [snapshot("frozen", 1_500, {"b": 601_000}), snapshot("frozen", 1_800, {})]
    windows = [window("w1", "b", 1_000, 1_700, 0, 1_700), window("w1", "b", 1_000, 1_700, 1, 1_700, "closed")]
    sends = [{"client_id": "c1", "broker_name": "b", "ts_ms": t} for t in (1_000, 1_700)]
    misses: list[str] = []
    folded: list[str] = []
    assert oracle(run, windows, misses, None, sends, folded) == {"frozen": (0, 0)}
    assert misses == [] and folded == [
        "frozen p0 b: client until 601000, faultwatch's first row of the window written later (read at 1500)"]
    # without a send between the reading and the row, the row is the state that stood: compared, a miss
    assert oracle(run, windows, misses, None, sends[:1], folded) == {"frozen": (0, 1)}
    assert len(misses) == 1


def test_an_item_the_client_removed_by_itself_is_compared_and_counted(tmp_path: Path) -> None:
    """A failure's 10-minute window from 1,000; the client's fallback removed the item at 4,000 and its
    next event told faultwatch, which ended the window there: no item on either side, no miss."""
    run = LabRun(tmp_path, str(tmp_path), "127.0.0.1:1", "rmq.avoidance")
    run.snapshots = [snapshot("killed", 3_000, {"b": 601_000}), snapshot("killed", 5_000, {})]
    run.snapshots[1].faults["removed"] = [{"broker_name": "b", "at_ms": 4_000}]
    windows = [window("w1", "b", 1_000, 601_000, 1, 1_000), window("w1", "b", 1_000, 4_000, 2, 4_000)]
    misses: list[str] = []
    assert oracle(run, windows, misses, None) == {"killed": (1, 1)} and misses == []
    assert client_removals(run) == {"p0": 1}


@pytest.mark.parametrize(
    ("samples", "avoided", "released"),
    [
        ([], 0, None),
        ([(0, 600_000)], 600_000, None),                                   # one reading: its window to the end
        ([(0, 600_000), (1_000, 600_000), (2_000, 1_500)], 2_000, 2_000),  # released between the 2nd and 3rd
        ([(0, 500), (1_000, 0), (2_000, 0)], 500, 1_000),                   # a short window ran out by itself
        ([(0, 0), (1_000, 30_000), (2_000, 30_000)], 29_000, None),          # avoided again, still at the end
        ([(2_000, 1_500), (0, 600_000), (1_000, 600_000)], 2_000, 2_000),  # readings in any order
    ],
)
def test_release_broker_time_and_moment(samples: list[tuple[int, int]], avoided: int, released: int | None) -> None:
    assert avoided_ms(samples) == avoided
    assert released_at(samples) == released
