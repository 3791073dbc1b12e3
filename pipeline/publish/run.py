"""``faultwatch publish``: one whole cycle in this process, the avoidance step then the alerts.

The alerts run whatever happened to the avoidance step; an error there becomes the cycle's
``failed`` row (and so an alert) and exit code 5 instead of a traceback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pipeline.config import Config
from pipeline.maintenance import publisher_upkeep
from pipeline.policy import Decision, PreviousState, Snapshot
from pipeline.publish import sinks
from pipeline.publish.alert_step import send_alerts
from pipeline.publish.cycle import (
    ALERTS_STEP,
    AVOIDANCE_STEP,
    CycleInput,
    _publish,
    _row,
    cycle_number_for,
    describe_cycle,
    load_inputs,
    now_ms,
    recommend,
    reject,
    skip_cycle,
    validate,
)
from pipeline.publish.gate import GateResult
from schemas.errors import FaultwatchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleReport:
    cycle_id: str
    status: str  # published | rejected | skipped | failed
    gate: GateResult | None
    decision: Decision | None
    alerts: int  # records sent to the alerts topic by the alerts step
    reason: str | None = None  # why it was skipped or rejected


def short_reason(exc: BaseException) -> str:
    """An error as a ``failed`` row's reason, on one line, at most 400 characters: faultwatch's own
    errors as they are (they start with the table, file or broker), others with their type."""
    text = (str(exc) if isinstance(exc, FaultwatchError) else f"{type(exc).__name__}: {exc}").replace("\n", " ")
    return text if len(text) <= 400 else text[:397] + "..."


def record_failure(cfg: Config, cycle_number: int, at_ms: int, reason: str, step: str = AVOIDANCE_STEP) -> None:
    """A ``failed`` row for a step that stopped on an error (logged, never raised: the table itself
    may be what failed)."""
    log.error("%s: %s failed: %s", describe_cycle(cycle_number), step, reason)
    try:
        sinks.append_rows(cfg.storage.root, "publisher_cycles",
                          [_row(cfg, cycle_number, at_ms, None, None, step, "failed", reason=reason)])
    except Exception as exc:  # noqa: BLE001
        log.error("could not record the failure in publisher_cycles: %s", short_reason(exc))


def run_alerts(cfg: Config, cycle_number: int, at_ms: int | None = None) -> dict[str, Any]:
    """The alerts step on its own (the DAG's ``alerts`` task, which runs whatever the avoidance tasks
    did): it reads the inputs itself and, when they cannot be read, keeps the broker alerts of the
    last cycle; a failed avoidance step is already a ``failed`` row, so it is an alert here."""
    now = now_ms() if at_ms is None else at_ms
    loaded: CycleInput | None = None
    try:
        loaded = load_inputs(cfg, cycle_number, now)
    except Exception as exc:  # noqa: BLE001 - the alerts go on without these inputs
        log.warning("%s: the alerts go on without the inputs: %s", describe_cycle(cycle_number), short_reason(exc))
    inp = loaded if loaded is not None else CycleInput(cycle_number, now, Snapshot(now), PreviousState())
    try:
        return send_alerts(cfg, inp, loaded is None)
    except Exception as exc:
        record_failure(cfg, cycle_number, now, short_reason(exc), ALERTS_STEP)
        raise
    finally:  # the DAG's last task: the cycle's commits are all made
        publisher_upkeep(cfg)


def _avoidance(cfg: Config, inp: CycleInput) -> tuple[str, GateResult | None, Decision | None, str | None]:
    reason = skip_cycle(cfg, inp.cycle_number, inp.now_ms)
    if reason is not None:
        return "skipped", None, None, reason
    decision = recommend(inp, cfg)
    gate = validate(inp, decision, cfg)
    if not gate.success:
        result = reject(cfg, inp, decision, gate)
        return result["status"], gate, decision, result.get("reason")
    result, published = _publish(cfg, inp, decision, gate)
    return result["status"], gate, published if published is not None else decision, result.get("reason")


def run_cycle(cfg: Config, cycle_number: int | None = None, at_ms: int | None = None) -> CycleReport:
    """``faultwatch publish``: the whole cycle in this process.

    The alerts run whatever happened to the avoidance step: an error there becomes its ``failed``
    row (and, through it, the ``avoidance_failed`` alert), never a skipped alert cycle.
    """
    now = now_ms() if at_ms is None else at_ms
    number = cycle_number_for(now, cfg.publish.interval_s) if cycle_number is None else cycle_number
    loaded: CycleInput | None = None
    try:
        loaded = load_inputs(cfg, number, now)
        status, gate, decision, reason = _avoidance(cfg, loaded)
    except Exception as exc:  # noqa: BLE001 - a failed cycle is a row, a code and an alert
        status, gate, decision, reason = "failed", None, None, short_reason(exc)
        record_failure(cfg, number, now, reason)
    inputs_failed = loaded is None
    inp = loaded if loaded is not None else CycleInput(number, now, Snapshot(now), PreviousState())
    # Alerts last: a slow or unreachable Alertmanager never delays the list producers wait for.
    kafka_down = reason if status == "failed" and (reason or "").startswith("Kafka ") else None
    try:
        sent = send_alerts(cfg, inp, inputs_failed, kafka_down)["alerts"]
    except Exception as exc:  # noqa: BLE001
        record_failure(cfg, number, now, short_reason(exc), ALERTS_STEP)
        sent = 0
        if status != "failed":
            status, reason = "failed", f"alerts: {short_reason(exc)}"
    publisher_upkeep(cfg)
    return CycleReport(inp.cycle_id, status, gate, decision, sent, reason)
