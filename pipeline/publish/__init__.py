"""The avoidance publisher: one cycle = load (deltalake) → recommend (policy) → validate (GX) → publish.

Publishes each cluster's full list to Kafka (``rmq.avoidance``, key = cluster) and to a JSON file,
records it in ``avoidance_recommendations`` and the cycle in ``publisher_cycles``, and forwards
alerts with a lifecycle (broker fault episodes, lagging consumer groups) to ``rmq.alerts`` and
Alertmanager. Entry points: :func:`run_cycle` (CLI) and the
step functions the Airflow DAG calls one per task.
"""

from pipeline.publish.alert_step import send_alerts
from pipeline.publish.cycle import (
    CycleInput,
    already_done,
    cycle_number_for,
    load_inputs,
    publish,
    recommend,
    reject,
    skip_cycle,
    skip_reason,
    validate,
)
from pipeline.publish.gate import GateResult, run_gate
from pipeline.publish.run import CycleReport, record_failure, run_alerts, run_cycle, short_reason

__all__ = [
    "CycleInput",
    "CycleReport",
    "GateResult",
    "already_done",
    "cycle_number_for",
    "load_inputs",
    "publish",
    "recommend",
    "record_failure",
    "reject",
    "run_alerts",
    "run_cycle",
    "run_gate",
    "send_alerts",
    "short_reason",
    "skip_cycle",
    "skip_reason",
    "validate",
]
