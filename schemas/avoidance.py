"""What the publisher wrote: the recommendation history and one row per cycle step.

The wire format of ``rmq.avoidance`` (and of the per-cluster JSON files) is
``avoidance.schema.json`` beside this file; :data:`WIRE_SCHEMA_PATH` locates it.
"""

from __future__ import annotations

from pathlib import Path

from schemas.fields import Field, TableSpec
from schemas.tables import register

WIRE_SCHEMA_PATH = Path(__file__).resolve().parent / "avoidance.schema.json"
WIRE_SCHEMA_ID = "faultwatch.avoidance/1"

AVOIDANCE_RECOMMENDATIONS = TableSpec(
    "avoidance_recommendations",
    (
        Field("cycle_id", "string", doc="publisher cycle: its logical time in ms (as a string)"),
        Field("cluster", "string"),
        Field("broker_name", "string"),
        Field("action", "string", enum=("avoid", "keep_available")),
        Field("avoid_until_ms", "int64", doc="= decided_ms for keep_available rows"),
        Field("expires_ms", "int64", doc="producers ignore the entry after this, even if nothing replaces it"),
        Field("reason", "string", doc="rule code first: open_episode | probation | hysteresis | share_cap"),
        Field("episode_id", "string", nullable=True),
        Field("producers_avoiding", "int32"),
        Field("failure_rate", "float64"),
        Field("p99_latency_ms", "float64"),
        Field("multiplier", "int32", doc="Envoy-style repeat count the avoidance time was scaled by"),
        Field("policy_version", "string"),
        Field("decided_ms", "int64"),
    ),
    time_column="decided_ms",
)

CYCLE_STEPS = ("avoidance", "alerts", "lag_alerts")  # lag_alerts: rows of older versions
CYCLE_STATUSES = ("claimed", "published", "rejected", "sent", "skipped", "failed")

PUBLISHER_CYCLES = TableSpec(
    "publisher_cycles",
    (
        Field("cycle_id", "string"),
        Field("cycle_number", "int64", doc="the cycle's logical time in ms; the Delta transaction version of its appends"),
        Field("step", "string", enum=CYCLE_STEPS),
        Field(
            "status", "string", enum=CYCLE_STATUSES,
            doc="claimed: this publisher won the cycle (a conditional commit) and is sending it; rejected: the "
            "gate failed, nothing published; skipped: another publisher or a later cycle had it; failed: the "
            "step stopped, reason says where",
        ),
        Field("decided_ms", "int64"),
        Field("input_freshest_ms", "int64", nullable=True),
        Field("clusters", "int32"),
        Field("avoided", "int32"),
        Field("kept_available", "int32"),
        Field("failed_checks", "list<string>", doc="the gate's failed expectations, empty when published"),
        Field("alerts", "int32", doc="records sent on rmq.alerts by this step"),
        Field("alerts_until_ms", "int64", nullable=True, doc="unused since alerts have a lifecycle (older rows only)"),
        Field("policy_version", "string"),
        Field(
            "reason", "string", nullable=True,
            doc="why the cycle was skipped, rejected or failed; alerts: the Alertmanager instances that failed",
        ),
        Field("lease_until_ms", "int64", nullable=True,
              doc="claimed: the claim holder sends nothing after this; another publisher may finish it later"),
        Field("claim", "string", nullable=True,
              doc="claimed: the decision (JSON) of the cycle, so whoever finishes it publishes exactly this"),
    ),
    time_column="decided_ms",
)

register(AVOIDANCE_RECOMMENDATIONS, PUBLISHER_CYCLES)
