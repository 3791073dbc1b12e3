"""The alert state between cycles, in the ``alert_state`` Delta table (schemas/alerts.py).

Each cycle appends its whole state (firing alerts, unacknowledged resolutions) under a Delta
transaction (its app id, the cycle): the state a cycle starts from is the last committed cycle's.
An empty state is an empty commit, so "no alerts" is recorded too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow.compute as pc

from pipeline.deltaio import read_table
from pipeline.publish import sinks
from pipeline.publish.lifecycle import Alert

TABLE = "alert_state"


def to_row(alert: Alert, cycle_number: int, cycle_ms: int | None = None) -> dict[str, Any]:
    return {"cycle_ms": cycle_ms,
        "cycle_number": cycle_number, "alert_id": alert.alert_id, "kind": alert.kind, "severity": alert.severity,
        "cluster": alert.cluster, "labels": json.dumps(dict(alert.labels), sort_keys=True),
        "summary": alert.summary, "details": json.dumps(dict(alert.details), sort_keys=True, default=str),
        "status": alert.status, "starts_ms": alert.starts_ms, "ends_ms": alert.ends_ms, "sent_ms": alert.sent_ms,
        "delivered": alert.delivered,
    }


def from_row(row: dict[str, Any]) -> Alert:
    return Alert(
        row["alert_id"], row["kind"], row["severity"], row["cluster"], json.loads(row["labels"]), row["summary"],
        json.loads(row["details"]), row["status"], row["starts_ms"], row["ends_ms"], row["sent_ms"],
        row["delivered"],
    )


def load(root: str, app_id: str) -> tuple[Alert, ...]:
    """The state the last committed cycle left (empty before the first)."""
    return load_cycle(root, app_id)[1]


def load_cycle(root: str, app_id: str) -> tuple[int | None, tuple[Alert, ...], tuple[Alert, ...]]:
    """(last committed cycle, its state, the alerts that cycle sent as records)."""
    last = sinks.committed_version(root, TABLE, app_id)
    if last is None:
        return None, (), ()
    rows = sorted(read_table(root, TABLE, filter=pc.field("cycle_number") == last).to_pylist(),
                  key=lambda r: r["alert_id"])
    state = tuple(from_row(r) for r in rows)
    sent = tuple(from_row(r) for r in rows if r.get("cycle_ms") is not None and r["sent_ms"] == r["cycle_ms"])
    return last, state, sent


def save(root: str, app_id: str, alerts: Sequence[Alert], cycle_number: int, cycle_ms: int | None = None) -> bool:
    """Commit this cycle's state once (False: this cycle or a later one already did, maybe concurrently)."""
    return sinks.append_once(root, TABLE, [to_row(a, cycle_number, cycle_ms) for a in alerts], app_id, cycle_number)
