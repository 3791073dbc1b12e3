"""The wire format of ``rmq.avoidance`` and of the per-cluster JSON files (schemas/avoidance.schema.json).

One object per cluster holds the *full* current list, so the newest record of a key is all a
producer needs (latest wins; a compacted topic keeps exactly that).
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.policy.model import AVOID, ClusterDecision, Decision, Recommendation
from schemas.avoidance import WIRE_SCHEMA_ID


def _entry(r: Recommendation) -> dict[str, Any]:
    return {
        "broker_name": r.broker_name,
        "avoid_until_ms": r.avoid_until_ms,
        "expires_ms": r.expires_ms,
        "reason": r.reason,
        "episode_id": r.episode_id,
        "multiplier": r.multiplier,
        "evidence": {
            "producers_avoiding": r.evidence.producers_avoiding,
            "failure_rate": r.evidence.failure_rate,
            "p99_latency_ms": r.evidence.p99_latency_ms,
        },
    }


def cluster_message(decision: Decision, cluster: ClusterDecision, cycle_id: str) -> dict[str, Any]:
    """The list of one cluster as a JSON-able object."""
    return {
        "schema": WIRE_SCHEMA_ID,
        "cluster": cluster.cluster,
        "cycle_id": cycle_id,
        "policy_version": decision.policy_version,
        "decided_ms": decision.decided_ms,
        "expires_ms": decision.expires_ms,
        "brokers_known": cluster.brokers_known,
        "max_avoid": cluster.max_avoid,
        "capped": cluster.capped,
        "avoid": [_entry(r) for r in cluster.recommendations if r.action == AVOID],
        "keep_available": [_entry(r) for r in cluster.recommendations if r.action != AVOID],
    }


def encode(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


def messages(decision: Decision, cycle_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(cluster, message) for every cluster of the decision, in cluster order."""
    return [(c.cluster, cluster_message(decision, c, cycle_id)) for c in decision.clusters]
