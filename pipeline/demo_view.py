"""What the demo shows: a snapshot of the Delta tables, rendered as a live terminal view.

The snapshot reads the tables with ``deltalake`` (through :mod:`pipeline.deltaio`) while the
streaming job writes them; each read sees one committed version, so the view is always consistent
with some batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow.compute as pc

from pipeline.deltaio import latest_revision, read_table

# Group statuses that mean "falling behind" (Burrow's verdicts); OK and UNKNOWN do not, whatever the
# lag: a group that keeps up still has the messages of its last poll outstanding.
LAGGING_STATUSES = ("WARN", "STALL", "STOP", "REWIND")


@dataclass
class DemoSnapshot:
    bronze_rows: int = 0
    quarantined: int = 0
    brokers: list[dict[str, Any]] = field(default_factory=list)  # one row per broker
    episodes: list[dict[str, Any]] = field(default_factory=list)  # every episode, latest revision
    groups: list[dict[str, Any]] = field(default_factory=list)  # latest status per group
    recommendations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open_episodes(self) -> list[dict[str, Any]]:
        return [e for e in self.episodes if e["state"] in ("open", "suspected")]

    @property
    def lagging_groups(self) -> list[dict[str, Any]]:
        return [g for g in self.groups if g["status"] in LAGGING_STATUSES]


def _rows(root: str, name: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    try:
        return list(read_table(root, name, columns=columns).to_pylist())
    except (OSError, ValueError):
        return []  # a table being created right now reads as empty this time


def take_snapshot(root: str) -> DemoSnapshot:
    snap = DemoSnapshot()
    snap.bronze_rows = read_table(root, "send_results", columns=["event_id"]).num_rows
    snap.quarantined = read_table(root, "quarantine", columns=["reason"]).num_rows
    episodes = read_table(root, "broker_fault_episodes_live")
    if episodes.num_rows:
        current = [e for e in latest_revision(episodes, "episode_id").to_pylist() if e["state"] != "withdrawn"]
        snap.episodes = sorted(current, key=lambda e: e["opened_ms"])
    windows = read_table(root, "producer_fault_windows_live", columns=["window_id", "cluster", "broker_name", "state", "revision", "client_id"])
    open_windows: dict[tuple[str, str], set[str]] = {}
    if windows.num_rows:
        current = latest_revision(windows, "window_id")
        current = current.filter(pc.equal(current.column("state"), "open"))
        for w in current.to_pylist():
            open_windows.setdefault((w["cluster"], w["broker_name"]), set()).add(w["client_id"])
    health = read_table(root, "broker_health")
    latest_health: dict[tuple[str, str], dict[str, Any]] = {}
    for h in health.to_pylist():
        key = (h["cluster"], h["broker_name"])
        if key not in latest_health or h["minute_ms"] > latest_health[key]["minute_ms"]:
            latest_health[key] = h
    brokers = set(open_windows) | set(latest_health) | {(e["cluster"], e["broker_name"]) for e in snap.episodes}
    open_eps = {(e["cluster"], e["broker_name"]): e for e in snap.open_episodes}
    for key in sorted(brokers):
        h = latest_health.get(key, {})
        snap.brokers.append(
            {
                "cluster": key[0],
                "broker": key[1],
                "avoiding": len(open_windows.get(key, ())),
                "episode": open_eps.get(key, {}).get("reason"),
                "failure_rate": h.get("failure_rate"),
                "p99": h.get("latency_p99_ms"),
                "sends": h.get("sends"),
            }
        )
    status = read_table(root, "group_status")
    if status.num_rows:
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for g in status.to_pylist():
            key = (g["cluster"], g["consumer_group"])
            if key not in latest or g["ts_ms"] >= latest[key]["ts_ms"]:
                latest[key] = g
        snap.groups = sorted(latest.values(), key=lambda g: -(g["total_lag"] or 0))
    snap.recommendations = _rows(root, "avoidance_recommendations")
    return snap


def render(snap: DemoSnapshot, header: str) -> Any:
    """A rich renderable: header, brokers, open episodes, top lagging groups."""
    from rich.console import Group
    from rich.table import Table

    brokers = Table(title="brokers", expand=False)
    for col in ("cluster", "broker", "producers avoiding", "episode", "failure rate", "p99 ms", "sends/min"):
        brokers.add_column(col)
    for b in snap.brokers:
        brokers.add_row(
            b["cluster"], b["broker"], str(b["avoiding"]),
            f"[bold red]OPEN ({b['episode']})[/]" if b["episode"] else "-",
            "-" if b["failure_rate"] is None else f"{b['failure_rate']:.1%}",
            "-" if b["p99"] is None else f"{b['p99']:.0f}",
            "-" if b["sends"] is None else str(b["sends"]),
        )
    groups = Table(title="consumer groups (most lag first)", expand=False)
    for col in ("cluster", "group", "status", "lag (msgs)", "time lag", "worst queue"):
        groups.add_column(col)
    for g in snap.groups[:8]:
        colour = {"OK": "green", "WARN": "yellow", "STALL": "red", "STOP": "red", "REWIND": "magenta"}.get(g["status"], "white")
        groups.add_row(
            g["cluster"], g["consumer_group"], f"[{colour}]{g['status']}[/]",
            str(g["total_lag"] if g["total_lag"] is not None else "?"),
            "-" if g["max_time_lag_ms"] is None else f"{g['max_time_lag_ms'] / 1000:.0f}s",
            f"{g['worst_broker']}/{g['worst_queue_id']}" if g.get("worst_broker") else "-",
        )
    episodes = f"fault episodes: {len(snap.open_episodes)} open, {len(snap.episodes)} in all"
    return Group(header, brokers, episodes, groups)


def episode_span(episode: dict[str, Any]) -> str:
    """How long a closed episode lasted; for one not closed, since when (event time, UTC).

    No "lasted" for an open episode: its end is not known yet, and its last change says nothing of it.
    """
    if episode["closed_ms"] is not None:
        lasted = (episode["closed_ms"] - episode["opened_ms"]) / 1000
        if episode.get("closed_by") == "silence":  # nobody sent to it for faults.episode_max_silence_s
            return f"closed by silence after {lasted:.0f} s: not heard of since, maybe still down"
        return f"closed, lasted {lasted:.0f} s"
    since = datetime.fromtimestamp(episode["opened_ms"] / 1000, tz=timezone.utc).strftime("%H:%M:%S UTC")
    if episode["state"] == "suspected":
        return f"suspected since {since}, not confirmed yet"
    return f"still open, since {since}"


def summary_lines(snap: DemoSnapshot, alerts: Sequence[Any] = ()) -> list[str]:
    """The demo's closing words; ``alerts`` are what the alerts topic told (each with a ``line()``)."""
    lines = [
        f"bronze: {snap.bronze_rows} send results, {snap.quarantined} quarantined",
        f"fault episodes: {len(snap.episodes)} ({len(snap.open_episodes)} still open)",
    ]
    for e in snap.episodes:
        lines.append(
            f"  {e['cluster']}/{e['broker_name']}: {e['reason']}, peak {e['peak_avoiding_share']:.0%} of producers "
            f"avoiding, {e['failures']} failures, dominant error {e['dominant_error']}, {episode_span(e)}"
        )
    lines.append(f"lagging consumer groups: {len(snap.lagging_groups)} of {len(snap.groups)}")
    for g in snap.lagging_groups[:5]:
        lines.append(f"  {g['cluster']}/{g['consumer_group']}: {g['status']}, lag {g['total_lag']} messages")
    avoid = [r for r in snap.recommendations if r.get("action") == "avoid"]
    lines.append(f"avoidance recommendations published: {len(avoid)}")
    lines.append(f"alerts on the alerts topic: {len(alerts)}")
    lines.extend(a.line() for a in alerts)
    return lines
