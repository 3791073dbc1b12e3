"""Records of ``rmq.alerts`` (schemas/alert.schema.json): lifecycle alerts and a refused publication.

Every record has a stable ``alert_id`` (what it is about) and a ``status``: a lifecycle alert
(:mod:`pipeline.publish.lifecycle`) sends ``firing`` when it starts and while it lasts, then
``resolved``; a refused cycle sends one ``firing`` record of its own identity.
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.publish.alertmanager import labels
from pipeline.publish.lifecycle import FIRING, Alert
from schemas.alerts import ALERT_SCHEMA_ID

PUBLISHER_KEY = "faultwatch-publisher"  # the record key of the publisher's own alerts


def lifecycle_record(alert: Alert, cycle_id: str, now_ms: int) -> tuple[str, dict[str, Any]]:
    """(key = cluster, record) for one lifecycle alert as it stands at this cycle."""
    return alert.cluster or PUBLISHER_KEY, {
        "schema": ALERT_SCHEMA_ID,
        "alert_id": alert.alert_id,
        "status": alert.status,
        "kind": alert.kind,
        "severity": alert.severity,
        "cluster": alert.cluster or None,
        "ts_ms": now_ms,
        "starts_ms": alert.starts_ms,
        "ends_ms": alert.ends_ms,
        "cycle_id": cycle_id,
        "summary": alert.summary,
        "labels": labels(alert),
        "details": dict(alert.details),
    }


def gate_alert(
    cycle_id: str, now_ms: int, failed: tuple[str, ...], clusters: list[str], last_published_cycle: str | None
) -> tuple[str, dict[str, Any]]:
    """(key, alert) for a cycle whose validation failed: nothing was published."""
    return PUBLISHER_KEY, {
        "schema": ALERT_SCHEMA_ID,
        "alert_id": f"avoidance_gate|{cycle_id}",
        "status": FIRING,
        "kind": "avoidance_validation_failed",
        "severity": "critical",
        "cluster": None,
        "ts_ms": now_ms,
        "cycle_id": cycle_id,
        "summary": (
            f"avoidance cycle {cycle_id} failed validation; nothing published, the list of cycle "
            f"{last_published_cycle} stays in force until it expires"
        ),
        "details": {"failed_checks": list(failed), "clusters": clusters},
    }


def encode_alert(alert: dict[str, Any]) -> bytes:
    return orjson.dumps(alert, option=orjson.OPT_SORT_KEYS)
