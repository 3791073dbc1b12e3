"""The Great Expectations gate: nothing is published unless every suite passes.

Frames are built from the policy's own values (the snapshot it read, the decision it made), with
computed columns for the checks that span rows or compare with the decision time. The suites
themselves live in ``schemas/avoidance_suite.py``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from pipeline.config import PolicyConfig
from pipeline.policy.model import AVOID, Decision, Snapshot
from schemas import avoidance_suite as suites

if TYPE_CHECKING:  # pragma: no cover
    from great_expectations.core import ExpectationValidationResult

log = logging.getLogger(__name__)

_REC_COLUMNS = [
    "cluster", "broker_name", "action", "avoid_until_ms", "expires_ms", "decided_ms", "reason", "episode_id",
    "policy_version", "producers_avoiding", "failure_rate", "p99_latency_ms", "multiplier",
    "avoid_ahead_ms", "expires_ahead_ms", "cluster_avoided", "cluster_max_avoid",
]
_EPISODE_COLUMNS = [
    "episode_id", "cluster", "broker_name", "opened_ms", "closed_ms", "state", "updated_ms", "sends", "failures",
    "close_consistent", "opened_ahead_ms",
]
_HEALTH_COLUMNS = ["cluster", "broker_name", "minute_ms", "sends", "failures", "failure_rate", "latency_p99_ms"]


@dataclass(frozen=True)
class GateResult:
    success: bool
    failed: tuple[str, ...] = ()
    evaluated: int = 0

    def summary(self) -> str:
        if self.success:
            return f"all {self.evaluated} expectations passed"
        return f"{len(self.failed)} of {self.evaluated} expectations failed: " + "; ".join(self.failed)


def recommendations_frame(decision: Decision) -> pd.DataFrame:
    rows = []
    for c in decision.clusters:
        avoided = len(c.avoided())
        for r in c.recommendations:
            rows.append({
                "cluster": r.cluster, "broker_name": r.broker_name, "action": r.action,
                "avoid_until_ms": r.avoid_until_ms, "expires_ms": r.expires_ms, "decided_ms": r.decided_ms,
                "reason": r.reason, "episode_id": r.episode_id, "policy_version": r.policy_version,
                "producers_avoiding": r.evidence.producers_avoiding, "failure_rate": r.evidence.failure_rate,
                "p99_latency_ms": r.evidence.p99_latency_ms, "multiplier": r.multiplier,
                "avoid_ahead_ms": float(r.avoid_until_ms - r.decided_ms) if r.action == AVOID else float("nan"),
                "expires_ahead_ms": r.expires_ms - r.decided_ms,
                "cluster_avoided": avoided, "cluster_max_avoid": c.max_avoid,
            })
    return pd.DataFrame(rows, columns=_REC_COLUMNS)


def snapshot_frame(snapshot: Snapshot) -> pd.DataFrame:
    fresh = snapshot.freshest_ms
    return pd.DataFrame([{
        "taken_ms": snapshot.taken_ms,
        "freshest_ms": float(fresh) if fresh is not None else float("nan"),
        "input_age_ms": float(snapshot.taken_ms - fresh) if fresh is not None else float("nan"),
        "episodes": len(snapshot.episodes),
        "health_rows": len(snapshot.health),
        "clusters": len(snapshot.clusters()),
    }])


def episodes_frame(snapshot: Snapshot) -> pd.DataFrame:
    rows = [
        {
            "episode_id": e.episode_id, "cluster": e.cluster, "broker_name": e.broker_name,
            "opened_ms": e.opened_ms, "closed_ms": e.closed_ms, "state": e.state, "updated_ms": e.updated_ms,
            "sends": e.sends, "failures": e.failures,
            # closed <=> has a close time no earlier than the open time
            "close_consistent": (e.is_open and e.closed_ms is None)
            or (e.state == "closed" and e.closed_ms is not None and e.closed_ms >= e.opened_ms),
            "opened_ahead_ms": e.opened_ms - snapshot.taken_ms,
        }
        for e in snapshot.episodes
    ]
    return pd.DataFrame(rows, columns=_EPISODE_COLUMNS)


def health_frame(snapshot: Snapshot) -> pd.DataFrame:
    rows = [{c: getattr(h, c) for c in _HEALTH_COLUMNS} for h in snapshot.health]
    return pd.DataFrame(rows, columns=_HEALTH_COLUMNS)


def validation_frames(snapshot: Snapshot, decision: Decision) -> dict[str, pd.DataFrame]:
    return {
        suites.RECOMMENDATIONS: recommendations_frame(decision),
        suites.SNAPSHOT: snapshot_frame(snapshot),
        suites.EPISODES: episodes_frame(snapshot),
        suites.HEALTH: health_frame(snapshot),
    }


def _describe(suite: str, result: ExpectationValidationResult) -> str:
    cfg = result.expectation_config
    assert cfg is not None  # a suite's results carry their expectation
    kwargs = {k: v for k, v in cfg.kwargs.items() if k in ("column", "column_A", "column_B", "column_list")}
    where = ",".join(str(v) for v in kwargs.values())
    unexpected = (result.result or {}).get("unexpected_count")
    tail = f" ({unexpected} unexpected)" if unexpected else ""
    return f"{suite}:{cfg.type}({where}){tail}"


def run_gate(snapshot: Snapshot, decision: Decision, cfg: PolicyConfig) -> GateResult:
    """Validate the frames with GX Core in an ephemeral context (no files, no network)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("faultwatch_gate")
    failed: list[str] = []
    evaluated = 0
    built = suites.build_suites(cfg)
    for name, frame in validation_frames(snapshot, decision).items():
        batch_def = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
        result = batch_def.get_batch(batch_parameters={"dataframe": frame}).validate(built[name])
        evaluated += len(result.results)
        failed += [_describe(name, r) for r in result.results if not r.success]
    outcome = GateResult(not failed, tuple(failed), evaluated)
    log.info("avoidance gate: %s", outcome.summary())
    return outcome

