"""The alerts step of a cycle: decide the alert lifecycle, commit it, then send it.

Separate from the avoidance step (:mod:`pipeline.publish.cycle`) because it runs whatever that step
did, and the DAG runs it as its own task. The new state is committed before anything is sent, so
one publisher decides a cycle's alerts and a re-run after a crash sends what was decided.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow.compute as pc

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.publish import alert_state, alertmanager, alerts, crash, lifecycle, sinks
from pipeline.publish.cycle import (
    ALERTS_STEP,
    AVOIDANCE_STEP,
    CycleInput,
    _date,
    alerts_app_id,
    cycle_row,
    describe_cycle,
    skip_reason,
)

log = logging.getLogger(__name__)


def alert_conditions(cfg: Config, inp: CycleInput, kept: tuple[lifecycle.Alert, ...] | None = None,
                     ) -> list[lifecycle.Condition]:
    """The enabled alert conditions that hold at this cycle: episodes from the snapshot, groups from
    their newest ``group_status`` row within ``alerts.group_lookback_s``, refusals and failures from
    ``publisher_cycles``. ``kept``: the inputs could not be read, so the broker alerts of the last
    state hold on (neither fired nor resolved on no evidence)."""
    kinds = cfg.alerts.kinds
    found: list[lifecycle.Condition] = []
    if lifecycle.BROKER_FAULT in kinds:
        found += lifecycle.broker_conditions(inp.snapshot.episodes) if kept is None else [
            lifecycle.Condition(a.alert_id, a.kind, a.severity, a.cluster, a.labels, a.summary, a.details)
            for a in kept if a.firing and a.kind == lifecycle.BROKER_FAULT]
    if lifecycle.CONSUMER_GROUP in kinds:
        since = inp.now_ms - int(cfg.alerts.group_lookback_s * 1000)
        rows = read_table(
            cfg.storage.root, "group_status",
            columns=["cluster", "consumer_group", "ts_ms", "status", "alert_reason", "total_lag", "max_time_lag_ms",
                     "retry_lag", "dlq_lag", "worst_topic", "worst_broker", "worst_queue_id", "worst_owner"],
            filter=(pc.field("event_date") >= _date(since)) & (pc.field("ts_ms") > since)
            & (pc.field("ts_ms") <= inp.now_ms),
        ).to_pylist()
        found += lifecycle.group_conditions(rows, cfg.lag.time_lag_alert_ms)
    if lifecycle.AVOIDANCE_REFUSED in kinds:
        cycles = read_table(
            cfg.storage.root, "publisher_cycles",
            columns=["cycle_id", "cycle_number", "step", "status", "failed_checks", "reason"],
            filter=(pc.field("step") == AVOIDANCE_STEP) & pc.field("status").isin(["published", "rejected", "failed"]),
        ).to_pylist()
        found += lifecycle.refusal_conditions(cycles, cfg.publish.app_id)
    return found


def _acknowledged(cfg: Config, cycle_number: int) -> bool:
    """Whether every Alertmanager took the alerts of that cycle (its ``alerts`` row names no failure)."""
    rows = read_table(
        cfg.storage.root, "publisher_cycles", columns=["status", "reason"],
        filter=(pc.field("cycle_number") == cycle_number) & (pc.field("step") == ALERTS_STEP),
    ).to_pylist()
    return any(r["status"] == "sent" and not (r["reason"] or "").startswith("Alertmanager") for r in rows)


def send_alerts(
    cfg: Config, inp: CycleInput, inputs_failed: bool = False, kafka_down: str | None = None
) -> dict[str, Any]:
    """One cycle of the alert lifecycle: the new state first (a conditional commit: one publisher per
    cycle, and a re-run after a crash sends what it decided, with the same ``starts_ms``), then every
    active alert and pending resolution to Alertmanager, then the records to the alerts topic.

    Neither Alertmanager nor Kafka failing stops the other; the ``alerts`` row says what failed.
    ``kafka_down``: this cycle already found Kafka unreachable; its records are not tried again, so
    a cycle waits on a dead broker once, not once per step.
    """
    reason = "publish.publish_alerts is false" if not cfg.publish.publish_alerts else skip_reason(
        cfg, inp.cycle_number, ALERTS_STEP)
    if reason is not None:
        return {"cycle_id": inp.cycle_id, "status": "skipped", "alerts": 0, "reason": reason}
    root, app_id = cfg.storage.root, alerts_app_id(cfg)
    last, state, sent = alert_state.load_cycle(root, app_id)
    if last is not None and last > inp.cycle_number:
        return {"cycle_id": inp.cycle_id, "status": "skipped", "alerts": 0,
                "reason": f"{describe_cycle(inp.cycle_number)}: alerts of {describe_cycle(last)} already decided"}
    if last == inp.cycle_number:  # a crashed attempt of this cycle saved its state: finish it as decided
        log.warning("%s: sending the alerts an earlier attempt decided", describe_cycle(inp.cycle_number))
        active, records_of = state, sent
    else:
        previous = tuple(a for a in state if a.firing) if last is not None and _acknowledged(cfg, last) else state
        step = lifecycle.advance(
            previous, alert_conditions(cfg, inp, state if inputs_failed else None), inp.now_ms,
            int(cfg.alerts.repeat_interval_s * 1000), int(cfg.alerts.resolution_retry_s * 1000),
        )
        if not alert_state.save(root, app_id, step.alerts, inp.cycle_number, inp.now_ms):
            return {"cycle_id": inp.cycle_id, "status": "skipped", "alerts": 0,
                    "reason": f"{describe_cycle(inp.cycle_number)}: another publisher decided its alerts"}
        active, records_of = step.to_alertmanager, step.records
    crash.point("alerts_state")
    failures = alertmanager.deliver(cfg.alerts.alertmanager_urls, active, cfg.alerts.timeout_s)
    records = [alerts.lifecycle_record(a, inp.cycle_id, a.sent_ms) for a in records_of]
    problems = ["Alertmanager: " + "; ".join(failures)] if failures else []
    try:
        if kafka_down is not None and records:
            raise ConnectionError(f"not tried, the avoidance step found it down ({kafka_down})")
        sinks.send_records(cfg, cfg.topics.alerts, [(k, alerts.encode_alert(r)) for k, r in records])
    except Exception as exc:  # noqa: BLE001 - Alertmanager got them; the row says Kafka did not
        problems.append(f"Kafka {cfg.kafka.bootstrap_servers} topic {cfg.topics.alerts}: {type(exc).__name__}: {exc}")
    crash.point("alerts_sent")
    kafka_ok = not any(p.startswith("Kafka") for p in problems)
    row = cycle_row(cfg, inp, None, ALERTS_STEP, "sent" if kafka_ok else "failed",
                    alerts=len(records) if kafka_ok else 0, reason="; ".join(problems) or None)
    sinks.append_once(root, "publisher_cycles", [row], app_id, inp.cycle_number)
    firing = sum(a.firing for a in active)
    return {"cycle_id": inp.cycle_id, "status": row["status"], "alerts": row["alerts"], "firing": firing,
            "alertmanager_failures": failures, "reason": row["reason"]}
