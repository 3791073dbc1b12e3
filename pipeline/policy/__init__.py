"""Which brokers producers should avoid, and until when: a pure policy over the silver tables.

``decide(snapshot, previous, now_ms, cfg.policy) -> Decision``; the rules are in :mod:`rules`,
the values in :mod:`model`, the reduction of Delta rows to a snapshot in :mod:`inputs`.
Imports no pyspark, kafka or airflow.
"""

from pipeline.policy.decide import decide, known_brokers
from pipeline.policy.model import (
    AVOID,
    KEEP_AVAILABLE,
    Avoiding,
    ClusterDecision,
    Decision,
    Episode,
    Evidence,
    Health,
    PreviousEntry,
    PreviousState,
    Recommendation,
    Snapshot,
    decision_from_jsonable,
    previous_from_jsonable,
    snapshot_from_jsonable,
    to_jsonable,
)

__all__ = [
    "AVOID",
    "KEEP_AVAILABLE",
    "Avoiding",
    "ClusterDecision",
    "Decision",
    "Episode",
    "Evidence",
    "Health",
    "PreviousEntry",
    "PreviousState",
    "Recommendation",
    "Snapshot",
    "decide",
    "decision_from_jsonable",
    "known_brokers",
    "previous_from_jsonable",
    "snapshot_from_jsonable",
    "to_jsonable",
]
