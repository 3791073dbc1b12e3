"""The avoidance step of a cycle: load → recommend → validate → publish (or reject).

The steps are separate functions so the Airflow DAG runs each as a task and ``faultwatch publish``
runs them in a row (:mod:`pipeline.publish.run`; the alerts are :mod:`pipeline.publish.alert_step`).
Values between steps are JSON-able (XCom). Who publishes a cycle is decided by a claim
(:mod:`pipeline.publish.claim`) before anything is sent.

A cycle's identity (``cycle_number``) is its logical time in ms: the DAG run's logical time, or
``now`` aligned down to ``publish.interval_s``. It is the Delta transaction version of the cycle's
appends, so identities stay comparable across publishers and interval changes: a step is done
when a cycle at or after this time committed it. A cycle that does nothing says why
(:func:`skip_reason`); a superseded one records a ``skipped`` row; a refused one always records
its ``rejected`` row and alert, once per cycle.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from pipeline.config import Config
from pipeline.deltaio import read_table, table_uri
from pipeline.policy import (
    AVOID,
    Decision,
    PreviousState,
    Snapshot,
    decide,
    previous_from_jsonable,
    snapshot_from_jsonable,
    to_jsonable,
)
from pipeline.policy.inputs import build_snapshot, previous_state
from pipeline.publish import alerts, claim, crash, sinks, wire
from pipeline.publish.gate import GateResult, run_gate
from schemas.errors import FaultwatchError

log = logging.getLogger(__name__)

AVOIDANCE_STEP = "avoidance"
ALERTS_STEP = "alerts"


def now_ms() -> int:
    return int(time.time() * 1000)


def cycle_number_for(t_ms: int, interval_s: float) -> int:
    """The identity of the cycle that runs at ``t_ms``: that time aligned down to the interval, in ms."""
    step = round(interval_s * 1000)
    return int(t_ms // step * step)


def _when(ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(ms // 1000, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ms % 1000:03d}Z"


def describe_cycle(cycle_number: int) -> str:
    """``cycle 1764018060000 (2025-11-24T21:01:00.000Z)``: identities are times, show them as such."""
    if cycle_number < 10**11:  # an identity forced by hand (tests, old tables): not a time
        return f"cycle {cycle_number}"
    return f"cycle {cycle_number} ({_when(cycle_number)})"


def alerts_app_id(cfg: Config) -> str:
    return f"{cfg.publish.app_id}-alerts"


@dataclass(frozen=True)
class CycleInput:
    cycle_number: int
    now_ms: int
    snapshot: Snapshot
    previous: PreviousState

    @property
    def cycle_id(self) -> str:
        return str(self.cycle_number)

    def to_jsonable(self) -> dict[str, Any]:
        return {
            "cycle_number": self.cycle_number,
            "now_ms": self.now_ms,
            "snapshot": to_jsonable(self.snapshot),
            "previous": to_jsonable(self.previous),
        }

    @classmethod
    def from_jsonable(cls, d: dict[str, Any]) -> CycleInput:
        return cls(d["cycle_number"], d["now_ms"], snapshot_from_jsonable(d["snapshot"]),
                   previous_from_jsonable(d["previous"]))


def _date(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).strftime("%Y-%m-%d")


class TableError(FaultwatchError, RuntimeError):
    """A table the cycle needs cannot be read: the message names it and its location."""


def _read(root: str, name: str, **kw: Any) -> Any:
    try:
        return read_table(root, name, **kw)
    except Exception as exc:
        raise TableError(f"table {name} ({table_uri(root, name)}): {type(exc).__name__}: {exc}") from exc


def load_inputs(cfg: Config, cycle_number: int, at_ms: int | None = None) -> CycleInput:
    """Read the current views the policy needs (bounded by time where the tables allow it)."""
    now = now_ms() if at_ms is None else at_ms
    root, pol = cfg.storage.root, cfg.policy
    seen_from = now - int(pol.broker_seen_s * 1000)
    window_from = now - int(pol.repeat_period_s * 1000)
    # Episodes are few and must be read whole: a filter on one revision would hide a later one.
    episodes = _read(root, "broker_fault_episodes_live")
    health = _read(
        root, "broker_health",
        filter=(pc.field("event_date") >= _date(seen_from)) & (pc.field("minute_ms") >= seen_from),
    )
    windows = _read(
        root, "producer_fault_windows_live",
        filter=(pc.field("event_date") >= _date(window_from)) & (pc.field("start_ms") >= window_from),
    )
    previous = previous_state(_read(root, "avoidance_recommendations"), _read(root, "publisher_cycles"))
    snapshot = build_snapshot(episodes, health, windows, now, cfg.faults.quorum_counts_shadow_windows)
    return CycleInput(cycle_number, now, snapshot, previous)


def recommend(inp: CycleInput, cfg: Config) -> Decision:
    return decide(inp.snapshot, inp.previous, inp.now_ms, cfg.policy)


def validate(inp: CycleInput, decision: Decision, cfg: Config) -> GateResult:
    return run_gate(inp.snapshot, decision, cfg.policy)


def _app_id(cfg: Config, step: str) -> str:
    return cfg.publish.app_id if step == AVOIDANCE_STEP else alerts_app_id(cfg)


_DONE = {AVOIDANCE_STEP: "published", ALERTS_STEP: "sent its alerts"}


def _committed(cfg: Config, step: str) -> int | None:
    return sinks.committed_version(cfg.storage.root, "publisher_cycles", _app_id(cfg, step))


def skip_reason(cfg: Config, cycle_number: int, step: str = AVOIDANCE_STEP) -> str | None:
    """Why ``step`` of this cycle must do nothing (a cycle at or after its time did it), or None."""
    done = _committed(cfg, step)
    if done is None or done < cycle_number:
        return None
    this = describe_cycle(cycle_number)
    if done == cycle_number:
        return f"{this} already {_DONE[step]}: nothing to do"
    return (
        f"{this} superseded: {describe_cycle(done)}, at or after this cycle's time, already {_DONE[step]} "
        f"(Delta transaction app id {_app_id(cfg, step)!r}); an older cycle never overrides a newer one"
    )


def already_done(cfg: Config, cycle_number: int, step: str = AVOIDANCE_STEP) -> bool:
    """True when this cycle (or a later one) already committed ``step``: a re-run does nothing."""
    return skip_reason(cfg, cycle_number, step) is not None


def _has_row(cfg: Config, cycle_number: int, step: str, status: str) -> bool:
    rows = read_table(
        cfg.storage.root, "publisher_cycles", columns=["cycle_number"],
        filter=(pc.field("cycle_number") == cycle_number) & (pc.field("step") == step) & (pc.field("status") == status),
    )
    return rows.num_rows > 0


def skip_cycle(cfg: Config, cycle_number: int, at_ms: int | None = None) -> str | None:
    """:func:`skip_reason` for the avoidance step; a superseded cycle also gets its ``skipped`` row.

    A re-run of a cycle that published adds nothing (its ``published`` row says what happened); a
    cycle that never published because a later one had, records why, once.
    """
    reason = skip_reason(cfg, cycle_number)
    if reason is None:
        return None
    log.warning("%s", reason)
    done = _committed(cfg, AVOIDANCE_STEP)
    if done is not None and done > cycle_number and not _has_row(cfg, cycle_number, AVOIDANCE_STEP, "skipped"):
        now = now_ms() if at_ms is None else at_ms
        row = _row(cfg, cycle_number, now, None, None, AVOIDANCE_STEP, "skipped", reason=reason)
        sinks.append_rows(cfg.storage.root, "publisher_cycles", [row])
    return reason


def _row(
    cfg: Config, cycle_number: int, decided_ms: int, freshest_ms: int | None, decision: Decision | None,
    step: str, status: str, **kw: Any,
) -> dict[str, Any]:
    recs = decision.recommendations() if decision is not None else []
    row = {
        "cycle_id": str(cycle_number), "cycle_number": cycle_number, "step": step, "status": status,
        "decided_ms": decided_ms, "input_freshest_ms": freshest_ms,
        "clusters": len(decision.clusters) if decision is not None else 0,
        "avoided": sum(r.action == AVOID for r in recs), "kept_available": sum(r.action != AVOID for r in recs),
        "failed_checks": [], "alerts": 0, "alerts_until_ms": None, "policy_version": cfg.policy.version,
        "reason": None, "lease_until_ms": None, "claim": None,
    }
    row.update(kw)
    return row


def cycle_row(
    cfg: Config, inp: CycleInput, decision: Decision | None, step: str, status: str, **kw: Any
) -> dict[str, Any]:
    return _row(cfg, inp.cycle_number, inp.now_ms, inp.snapshot.freshest_ms, decision, step, status, **kw)


def history_rows(decision: Decision, cycle_id: str) -> list[dict[str, Any]]:
    return [
        {
            "cycle_id": cycle_id, "cluster": r.cluster, "broker_name": r.broker_name, "action": r.action,
            "avoid_until_ms": r.avoid_until_ms, "expires_ms": r.expires_ms, "reason": r.reason,
            "episode_id": r.episode_id, "producers_avoiding": r.evidence.producers_avoiding,
            "failure_rate": r.evidence.failure_rate, "p99_latency_ms": r.evidence.p99_latency_ms,
            "multiplier": r.multiplier, "policy_version": r.policy_version, "decided_ms": r.decided_ms,
        }
        for r in decision.recommendations()
    ]


def publish(cfg: Config, inp: CycleInput, decision: Decision, gate: GateResult) -> dict[str, Any]:
    """Claim the cycle, then Kafka, the files, the history and the ``published`` row (it marks it done)."""
    return _publish(cfg, inp, decision, gate)[0]


def _skipped(cfg: Config, inp: CycleInput, reason: str) -> dict[str, Any]:
    """A cycle another publisher (or a later cycle) has: say so, with one ``skipped`` row per cycle."""
    log.warning("%s", reason)
    if not _has_row(cfg, inp.cycle_number, AVOIDANCE_STEP, "skipped"):
        sinks.append_rows(cfg.storage.root, "publisher_cycles",
                          [cycle_row(cfg, inp, None, AVOIDANCE_STEP, "skipped", reason=reason)])
    return {"cycle_id": inp.cycle_id, "status": "skipped", "clusters": 0, "reason": reason}


def _publish(
    cfg: Config, inp: CycleInput, decision: Decision, gate: GateResult
) -> tuple[dict[str, Any], Decision | None]:
    if not gate.success:
        raise ValueError(f"cycle {inp.cycle_id}: refusing to publish a decision that failed validation")
    reason = skip_cycle(cfg, inp.cycle_number, inp.now_ms)
    if reason is not None:
        return {"cycle_id": inp.cycle_id, "status": "skipped", "clusters": 0, "reason": reason}, None
    sinks.remove_stale_temp_files(cfg.storage.publish_dir)
    base = cycle_row(cfg, inp, decision, AVOIDANCE_STEP, "claimed")
    for _ in range(3):  # at most: finish an abandoned older claim, then claim this one
        verdict = claim.acquire(cfg, inp.cycle_number, base, decision, inp.now_ms)
        if verdict.finish_first is not None:
            complete(cfg, verdict.finish_first, time.monotonic() + cfg.publish.send_timeout_s)
            continue
        if verdict.claim is None:
            return _skipped(cfg, inp, f"{describe_cycle(inp.cycle_number)} skipped: {verdict.reason}"), None
        won = verdict.claim
        return complete(cfg, won, time.monotonic() + cfg.publish.send_timeout_s), won.decision
    return _skipped(cfg, inp, f"{describe_cycle(inp.cycle_number)} skipped: other publishers kept claiming first"), None


def _failed(cfg: Config, won: claim.Claim, reason: str) -> dict[str, Any]:
    log.error("%s failed: %s", describe_cycle(won.cycle_number), reason)
    row = _row(cfg, won.cycle_number, won.decided_ms, won.freshest_ms, won.decision, AVOIDANCE_STEP, "failed",
               reason=reason, lease_until_ms=won.lease_until_ms)
    sinks.append_rows(cfg.storage.root, "publisher_cycles", [row])
    return {"cycle_id": str(won.cycle_number), "status": "failed", "clusters": 0, "reason": reason}


def _lost(cfg: Config, won: claim.Claim, reason: str) -> dict[str, Any]:
    """A holder that lost its claim before sending: nothing sent, one ``skipped`` row per cycle."""
    reason = f"{describe_cycle(won.cycle_number)} skipped: {reason}"
    log.warning("%s", reason)
    if not _has_row(cfg, won.cycle_number, AVOIDANCE_STEP, "skipped"):
        row = _row(cfg, won.cycle_number, won.decided_ms, won.freshest_ms, None, AVOIDANCE_STEP, "skipped",
                   reason=reason, lease_until_ms=won.lease_until_ms)
        sinks.append_rows(cfg.storage.root, "publisher_cycles", [row])
    return {"cycle_id": str(won.cycle_number), "status": "skipped", "clusters": 0, "reason": reason}


def complete(cfg: Config, won: claim.Claim, deadline: float) -> dict[str, Any]:
    """Publish a claimed list: Kafka, then the files (only before ``deadline``, a ``time.monotonic()``),
    then the history and the ``published`` row, each once; a step that fails leaves a ``failed`` row.

    Just before the send the claim is checked again: a holder that lost it (a later cycle claimed,
    another publisher took over) sends nothing and is ``skipped``; the send ends by the lease's end.
    """
    cycle_id = str(won.cycle_number)
    msgs = [(cluster, wire.encode(m)) for cluster, m in wire.messages(won.decision, cycle_id)]
    crash.point("claimed")
    crash.barrier("send")
    lost = claim.lost(cfg, won)
    if lost is not None:
        return _lost(cfg, won, lost)
    left = min(deadline - time.monotonic(), (won.lease_until_ms - claim.wall_ms()) / 1000)
    if left <= 0:
        return _failed(cfg, won, f"the claim's lease (publish.send_timeout_s, {cfg.publish.send_timeout_s} s) ran "
                                 "out before the Kafka send; nothing sent")
    try:
        sinks.send_records(cfg, cfg.topics.avoidance, msgs, timeout_s=left)
    except Exception as exc:  # noqa: BLE001 - every broker failure becomes the cycle's failed row
        return _failed(cfg, won, f"Kafka {cfg.kafka.bootstrap_servers} topic {cfg.topics.avoidance}: "
                                 f"{type(exc).__name__}: {exc}")
    crash.point("sent")
    if cfg.publish.write_files:
        if time.monotonic() > deadline:
            return _failed(cfg, won, f"publish.send_timeout_s ({cfg.publish.send_timeout_s} s) ran out before the "
                                     f"files in {cfg.storage.publish_dir} were written")
        try:
            sinks.write_cluster_files(cfg.storage.publish_dir, msgs)
        except OSError as exc:
            return _failed(cfg, won, f"file {getattr(exc, 'filename', None) or cfg.storage.publish_dir}: "
                                     f"{exc.strerror or exc}")
    crash.point("file")
    root, app_id = cfg.storage.root, cfg.publish.app_id
    rows = history_rows(won.decision, cycle_id)
    if rows:
        sinks.append_once(root, "avoidance_recommendations", rows, app_id, won.cycle_number)
    crash.point("history")
    row = _row(cfg, won.cycle_number, won.decided_ms, won.freshest_ms, won.decision, AVOIDANCE_STEP, "published")
    sinks.append_once(root, "publisher_cycles", [row], app_id, won.cycle_number)
    crash.point("published")
    log.info("%s published %d cluster list(s), %d avoided", describe_cycle(won.cycle_number), len(msgs),
             sum(len(c.avoided()) for c in won.decision.clusters))
    return {"cycle_id": cycle_id, "status": "published", "clusters": len(msgs)}


def reject(cfg: Config, inp: CycleInput, decision: Decision, gate: GateResult) -> dict[str, Any]:
    """Publish nothing, alert, and record the refusal; the last good list keeps its own expiry.

    Once per cycle whatever other cycles did: a retry that finds this cycle's ``rejected`` row sends
    and appends nothing (a crash between the alert and the row re-sends the same ``alert_id``).
    """
    failed = list(gate.failed)
    result = {"cycle_id": inp.cycle_id, "status": "rejected", "failed_checks": failed, "reason": gate.summary()}
    if _has_row(cfg, inp.cycle_number, AVOIDANCE_STEP, "rejected"):
        log.warning("%s was already rejected and alerted on: %s", describe_cycle(inp.cycle_number), gate.summary())
        return result
    key, alert = alerts.gate_alert(
        inp.cycle_id, inp.now_ms, gate.failed, [c.cluster for c in decision.clusters], inp.previous.cycle_id
    )
    sinks.send_records(cfg, cfg.topics.alerts, [(key, alerts.encode_alert(alert))])
    row = cycle_row(
        cfg, inp, decision, AVOIDANCE_STEP, "rejected", failed_checks=failed, alerts=1, reason=gate.summary()
    )
    sinks.append_rows(cfg.storage.root, "publisher_cycles", [row])
    log.warning("%s rejected by the gate: %s", describe_cycle(inp.cycle_number), gate.summary())
    return result
