"""Alerts: the wire format of ``rmq.alerts`` and the publisher's alert state between cycles.

The wire format is ``alert.schema.json`` beside this file (:data:`ALERT_SCHEMA_PATH`). The state
table holds, per cycle, every firing alert and every resolution Alertmanager has not acknowledged:
the next cycle starts from it, so an alert fires once and its resolution is never lost.
"""

from __future__ import annotations

from pathlib import Path

from schemas.fields import Field, TableSpec
from schemas.tables import register

ALERT_SCHEMA_PATH = Path(__file__).resolve().parent / "alert.schema.json"
ALERT_SCHEMA_ID = "faultwatch.alert/1"
ALERT_STATUSES = ("firing", "resolved")

ALERT_STATE = TableSpec(
    "alert_state",
    (
        Field("cycle_number", "int64", doc="the publisher cycle (its time in ms) this state is the outcome of"),
        Field("alert_id", "string", doc="what the alert is about: kind|cluster|broker or group"),
        Field("kind", "string"),
        Field("severity", "string"),
        Field("cluster", "string"),
        Field("labels", "string", doc="identity labels besides alertname, cluster, severity (a JSON object)"),
        Field("summary", "string"),
        Field("details", "string", doc="a JSON object"),
        Field("status", "string", enum=ALERT_STATUSES),
        Field("starts_ms", "int64"),
        Field("ends_ms", "int64", nullable=True, doc="set once resolved"),
        Field("sent_ms", "int64", doc="when a record of it last went to the alerts topic"),
        Field("delivered", "bool", doc="resolved: Alertmanager acknowledged the resolution"),
        Field("cycle_ms", "int64", nullable=True,
              doc="when the cycle that wrote this state ran: alerts with sent_ms equal to it were its records"),
    ),
)

register(ALERT_STATE)
