"""The demo's summary: which groups count as lagging, and how an episode's length is told."""

from __future__ import annotations

from typing import Any

import pytest

from faultwatch.demo_story import AlertStory
from pipeline.demo_view import DemoSnapshot, episode_span, summary_lines


def group(name: str, status: str, lag: int) -> dict[str, Any]:
    return {"cluster": "c1", "consumer_group": name, "status": status, "total_lag": lag}


def episode(state: str, opened_ms: int, updated_ms: int, closed_ms: int | None) -> dict[str, Any]:
    return {
        "cluster": "c1", "broker_name": "broker-b", "reason": "avoided_by_producers", "state": state,
        "opened_ms": opened_ms, "updated_ms": updated_ms, "closed_ms": closed_ms,
        "peak_avoiding_share": 0.75, "failures": 12, "dominant_error": "connect_refused",
    }


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (episode("closed", 20_000, 61_000, 61_000), "closed, lasted 41 s"),
        (episode("closed", 20_000, 61_000, 61_000) | {"closed_by": "recovery"}, "closed, lasted 41 s"),
        (episode("closed", 20_000, 920_000, 920_000) | {"closed_by": "silence"},
         "closed by silence after 900 s: not heard of since, maybe still down"),
        (episode("open", 3_620_000, 3_650_000, None), "still open, since 01:00:20 UTC"),
        (episode("suspected", 20_000, 20_000, None), "suspected since 00:00:20 UTC, not confirmed yet"),
    ],
)
def test_episode_span(row: dict[str, Any], expected: str) -> None:
    assert episode_span(row) == expected


def test_only_groups_with_a_lagging_status_count_and_are_listed() -> None:
    snap = DemoSnapshot(
        groups=[
            group("CG_orders", "OK", 140),  # keeps up: its last poll's messages are still outstanding
            group("CG_analytics", "STALL", 9_000),
            group("CG_new", "UNKNOWN", 0),
            group("CG_billing", "WARN", 800),
        ]
    )
    lines = summary_lines(snap)
    start = lines.index("lagging consumer groups: 2 of 4")
    assert lines[start + 1 : start + 3] == [
        "  c1/CG_analytics: STALL, lag 9000 messages",
        "  c1/CG_billing: WARN, lag 800 messages",
    ]
    assert not any("CG_orders" in line or "CG_new" in line for line in lines)


def test_an_open_episode_is_not_said_to_have_lasted() -> None:
    snap = DemoSnapshot(episodes=[episode("open", 20_000, 45_000, None), episode("closed", 0, 9_000, 9_000)])
    lines = summary_lines(snap)
    assert "fault episodes: 2 (1 still open)" in lines
    assert lines[2].endswith(", still open, since 00:00:20 UTC") and "lasted" not in lines[2]
    assert lines[3].endswith(", closed, lasted 9 s")


def test_the_summary_tells_each_alert_from_firing_to_resolution() -> None:
    alerts = [
        AlertStory("broker_fault|c1|broker-b", "broker_fault", "broker broker-b ...", 25_000, 101_000),
        AlertStory("consumer_lag|c1|CG_analytics", "consumer_lag", "group CG_analytics ...", 70_000),
    ]
    lines = summary_lines(DemoSnapshot(), alerts)
    start = lines.index("alerts on the alerts topic: 2")
    assert lines[start + 1:] == [
        "  broker_fault c1|broker-b: fired 00:00:25 UTC, resolved 00:01:41 UTC",
        "  consumer_lag c1|CG_analytics: fired 00:01:10 UTC, still firing",
    ]
