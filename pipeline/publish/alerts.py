"""Alerts on ``rmq.alerts``: consumer lag (from ``group_status``) and a refused publication.

Each alert has a stable ``alert_id`` derived from what it is about, so a consumer can drop the
duplicate that a re-run after a crash may send.
"""

from __future__ import annotations

from typing import Any

import orjson

ALERT_SCHEMA_ID = "faultwatch.alert/1"


def lag_alert(row: dict[str, Any], cycle_id: str) -> tuple[str, dict[str, Any]]:
    """(key = cluster, alert) for one ``group_status`` row with ``alert`` set."""
    alert_id = f"lag|{row['cluster']}|{row['consumer_group']}|{row['ts_ms']}|{row['status']}"
    return row["cluster"], {
        "schema": ALERT_SCHEMA_ID,
        "alert_id": alert_id,
        "kind": "consumer_lag",
        "severity": "critical" if row["status"] in ("STOP", "STALL") else "warning",
        "cluster": row["cluster"],
        "ts_ms": row["ts_ms"],
        "cycle_id": cycle_id,
        "summary": (
            f"consumer group {row['consumer_group']} is {row['status']}"
            + (f": {row['alert_reason']}" if row.get("alert_reason") else "")
        ),
        "details": {
            k: row.get(k)
            for k in (
                "consumer_group", "status", "previous_status", "total_lag", "max_time_lag_ms", "retry_lag",
                "dlq_lag", "worst_topic", "worst_broker", "worst_queue_id", "worst_owner", "idle_consumers", "mismatched_queues",
            )
        },
    }


def gate_alert(
    cycle_id: str, now_ms: int, failed: tuple[str, ...], clusters: list[str], last_published_cycle: str | None
) -> tuple[str, dict[str, Any]]:
    """(key, alert) for a cycle whose validation failed: nothing was published."""
    return "faultwatch-publisher", {
        "schema": ALERT_SCHEMA_ID,
        "alert_id": f"avoidance_gate|{cycle_id}",
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
