"""Values the avoidance policy reads and writes: frozen, JSON-able, free of I/O.

A DAG passes them between tasks through XCom, so every value converts to plain JSON
(:func:`to_jsonable`) and back (``from_jsonable``) without loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

AVOID = "avoid"
KEEP_AVAILABLE = "keep_available"
Action = Literal["avoid", "keep_available"]


@dataclass(frozen=True)
class Episode:
    """The current revision of one ``broker_fault_episodes_live`` row."""

    episode_id: str
    cluster: str
    broker_name: str
    opened_ms: int
    closed_ms: int | None
    state: str
    reason: str
    peak_avoiding_producers: int
    active_producers: int
    sends: int
    failures: int
    p99_latency_ms: float
    updated_ms: int
    cluster_brokers: int = 0  # brokers of the cluster seen sending when the row was written

    @property
    def is_open(self) -> bool:
        """Open, or suspected: the rules hold on the events read so far, ahead of the watermark."""
        return self.state in ("open", "suspected")

    def end_ms(self, now_ms: int) -> int:
        """When the broker was last seen faulty in this episode: its close, or now while open."""
        return now_ms if self.is_open or self.closed_ms is None else self.closed_ms


@dataclass(frozen=True)
class Health:
    """The latest ``broker_health`` minute of one broker."""

    cluster: str
    broker_name: str
    minute_ms: int
    sends: int
    failures: int
    failure_rate: float
    latency_p99_ms: float
    active_producers: int
    producers_avoiding: int


@dataclass(frozen=True)
class Avoiding:
    """How many producer instances' own fault tolerance avoids a broker right now."""

    cluster: str
    broker_name: str
    producers: int


@dataclass(frozen=True)
class Snapshot:
    """The input of one decision: current views of the three silver tables, reduced.

    ``freshest_ms`` is the newest event time found in any input (None: the inputs are empty);
    the gate refuses to publish when it is too old, because a stalled streaming job would otherwise
    freeze the last verdicts in place.
    """

    taken_ms: int
    episodes: tuple[Episode, ...] = ()
    health: tuple[Health, ...] = ()
    avoiding: tuple[Avoiding, ...] = ()
    freshest_ms: int | None = None

    def clusters(self) -> list[str]:
        names = {e.cluster for e in self.episodes} | {h.cluster for h in self.health}
        return sorted(names | {a.cluster for a in self.avoiding})


@dataclass(frozen=True)
class PreviousEntry:
    """One row of the last published cycle, as recorded in ``avoidance_recommendations``."""

    cluster: str
    broker_name: str
    action: str
    avoid_until_ms: int
    decided_ms: int
    reason: str


@dataclass(frozen=True)
class PreviousState:
    """What the last successful cycle published; empty on the first run."""

    cycle_id: str | None = None
    decided_ms: int | None = None
    entries: tuple[PreviousEntry, ...] = ()

    def entry(self, cluster: str, broker: str) -> PreviousEntry | None:
        for e in self.entries:
            if e.cluster == cluster and e.broker_name == broker:
                return e
        return None

    def clusters(self) -> list[str]:
        return sorted({e.cluster for e in self.entries})


@dataclass(frozen=True)
class Evidence:
    producers_avoiding: int = 0
    failure_rate: float = 0.0
    p99_latency_ms: float = 0.0


@dataclass(frozen=True)
class Recommendation:
    """One broker of one cluster: avoid it (until ``avoid_until_ms``) or keep it available.

    ``keep_available`` rows exist only when the share cap refused an avoidance; they carry
    ``avoid_until_ms == decided_ms`` (nothing to avoid) and say why in ``reason``.
    Producers honour an entry until ``min(avoid_until_ms, expires_ms)``.
    """

    cluster: str
    broker_name: str
    action: str
    avoid_until_ms: int
    expires_ms: int
    reason: str
    episode_id: str | None
    evidence: Evidence
    multiplier: int
    policy_version: str
    decided_ms: int


@dataclass(frozen=True)
class ClusterDecision:
    cluster: str
    brokers_known: int
    max_avoid: int
    capped: bool
    recommendations: tuple[Recommendation, ...] = ()

    def avoided(self) -> list[Recommendation]:
        return [r for r in self.recommendations if r.action == AVOID]


@dataclass(frozen=True)
class Decision:
    decided_ms: int
    expires_ms: int
    policy_version: str
    clusters: tuple[ClusterDecision, ...] = ()

    def recommendations(self) -> list[Recommendation]:
        return [r for c in self.clusters for r in c.recommendations]

    def cluster(self, name: str) -> ClusterDecision | None:
        return next((c for c in self.clusters if c.cluster == name), None)


def to_jsonable(value: Any) -> Any:
    """Plain dicts/lists of a policy value (for XCom, logs and the wire)."""
    return dataclasses.asdict(value)


def snapshot_from_jsonable(d: dict[str, Any]) -> Snapshot:
    return Snapshot(
        taken_ms=d["taken_ms"],
        episodes=tuple(Episode(**e) for e in d["episodes"]),
        health=tuple(Health(**h) for h in d["health"]),
        avoiding=tuple(Avoiding(**a) for a in d["avoiding"]),
        freshest_ms=d["freshest_ms"],
    )


def previous_from_jsonable(d: dict[str, Any]) -> PreviousState:
    return PreviousState(d["cycle_id"], d["decided_ms"], tuple(PreviousEntry(**e) for e in d["entries"]))


def _recommendation(d: dict[str, Any]) -> Recommendation:
    return Recommendation(**{**d, "evidence": Evidence(**d["evidence"])})


def decision_from_jsonable(d: dict[str, Any]) -> Decision:
    clusters = tuple(
        ClusterDecision(
            c["cluster"],
            c["brokers_known"],
            c["max_avoid"],
            c["capped"],
            tuple(_recommendation(r) for r in c["recommendations"]),
        )
        for c in d["clusters"]
    )
    return Decision(d["decided_ms"], d["expires_ms"], d["policy_version"], clusters)
