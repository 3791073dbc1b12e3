"""``decide(snapshot, previous, now_ms, cfg) -> Decision``: the rules of :mod:`rules`, in order.

Stateless across cycles on purpose: episode counts come from the episodes table and hysteresis
from the last published list (the history table), so a DAG run on any worker decides the same.
"""

from __future__ import annotations

from collections import defaultdict

from pipeline.config import PolicyConfig
from pipeline.policy.model import (
    AVOID,
    KEEP_AVAILABLE,
    ClusterDecision,
    Decision,
    Episode,
    Evidence,
    Health,
    PreviousState,
    Recommendation,
    Snapshot,
)
from pipeline.policy.rules import (
    RULES,
    BrokerView,
    Verdict,
    combine,
    evidence_for,
    expires_at,
    max_avoided,
    rule_share_cap,
    share_cap_reason,
)
from pipeline.policy.rules import (
    seconds_to_ms as _ms,
)


def relevant_episodes(snapshot: Snapshot, now_ms: int, cfg: PolicyConfig) -> list[Episode]:
    """Open episodes and those that ended within the repeat period (older ones are forgotten)."""
    start = now_ms - _ms(cfg.repeat_period_s)
    return [e for e in snapshot.episodes if e.end_ms(now_ms) >= start]


def recent_health(snapshot: Snapshot, now_ms: int, cfg: PolicyConfig) -> list[Health]:
    start = now_ms - _ms(cfg.broker_seen_s)
    return [h for h in snapshot.health if h.minute_ms >= start]


def known_brokers(
    snapshot: Snapshot, previous: PreviousState, cluster: str, now_ms: int, cfg: PolicyConfig
) -> set[str]:
    """The brokers that count towards the share cap: seen within ``broker_seen_s``.

    Seen means a health minute, an open episode or one that ended recently, producers avoiding it,
    or an entry of the last published list. A broker everyone avoids sends no health rows but is
    still a member of the cluster.
    """
    seen_from = now_ms - _ms(cfg.broker_seen_s)
    names = {h.broker_name for h in recent_health(snapshot, now_ms, cfg) if h.cluster == cluster}
    names |= {e.broker_name for e in snapshot.episodes if e.cluster == cluster and e.end_ms(now_ms) >= seen_from}
    names |= {a.broker_name for a in snapshot.avoiding if a.cluster == cluster and a.producers > 0}
    names |= {p.broker_name for p in previous.entries if p.cluster == cluster}
    return names


def brokers_known(
    snapshot: Snapshot, previous: PreviousState, cluster: str, now_ms: int, cfg: PolicyConfig
) -> int:
    """The share cap's denominator: the brokers known by name, or, if more, the brokers the streaming
    job saw sending when it wrote an episode row seen within ``broker_seen_s``. Until a health minute is final (the
    watermark delay plus a minute after the job first sees a cluster) the names alone would count
    only the failing brokers and the cap would keep every one of them available."""
    seen_from = now_ms - _ms(cfg.broker_seen_s)
    counted = [e.cluster_brokers for e in snapshot.episodes if e.cluster == cluster and e.end_ms(now_ms) >= seen_from]
    return max(len(known_brokers(snapshot, previous, cluster, now_ms, cfg)), *counted, 0)


def broker_views(
    snapshot: Snapshot, previous: PreviousState, cluster: str, now_ms: int, cfg: PolicyConfig
) -> list[BrokerView]:
    episodes: dict[str, list[Episode]] = defaultdict(list)
    for e in relevant_episodes(snapshot, now_ms, cfg):
        if e.cluster == cluster:
            episodes[e.broker_name].append(e)
    health = {h.broker_name: h for h in recent_health(snapshot, now_ms, cfg) if h.cluster == cluster}
    avoiding = {a.broker_name: a.producers for a in snapshot.avoiding if a.cluster == cluster}
    names = known_brokers(snapshot, previous, cluster, now_ms, cfg) | set(episodes)
    return [
        BrokerView(
            cluster,
            name,
            tuple(sorted(episodes.get(name, ()), key=lambda e: (e.opened_ms, e.episode_id))),
            health.get(name),
            avoiding.get(name, 0),
            previous.entry(cluster, name),
        )
        for name in sorted(names)
    ]


def _recommendation(
    view: BrokerView,
    verdict: Verdict,
    evidence: Evidence,
    action: str,
    reason: str,
    now_ms: int,
    cfg: PolicyConfig,
) -> Recommendation:
    return Recommendation(
        cluster=view.cluster,
        broker_name=view.broker_name,
        action=action,
        avoid_until_ms=verdict.avoid_until_ms if action == AVOID else now_ms,
        expires_ms=expires_at(now_ms, cfg),
        reason=reason,
        episode_id=verdict.episode_id,
        evidence=evidence,
        multiplier=verdict.multiplier,
        policy_version=cfg.version,
        decided_ms=now_ms,
    )


def decide_cluster(
    snapshot: Snapshot, previous: PreviousState, cluster: str, now_ms: int, cfg: PolicyConfig
) -> ClusterDecision:
    views = broker_views(snapshot, previous, cluster, now_ms, cfg)
    brokers = brokers_known(snapshot, previous, cluster, now_ms, cfg)
    candidates = []
    for view in views:
        verdict = combine([rule(view, now_ms, cfg) for rule in RULES])
        if verdict is not None:
            candidates.append((view, verdict, evidence_for(view)))
    avoid, keep = rule_share_cap(candidates, brokers, cfg)
    recs = [_recommendation(v, vd, ev, AVOID, vd.reason, now_ms, cfg) for v, vd, ev in avoid]
    recs += [
        _recommendation(v, vd, ev, KEEP_AVAILABLE, share_cap_reason(vd, len(candidates), brokers, cfg), now_ms, cfg)
        for v, vd, ev in keep
    ]
    recs.sort(key=lambda r: r.broker_name)
    return ClusterDecision(cluster, brokers, max_avoided(brokers, cfg), bool(keep), tuple(recs))


def recent_previous(previous: PreviousState, now_ms: int, cfg: PolicyConfig) -> PreviousState:
    """The last published list, unless it is older than ``broker_seen_s`` (the publisher was down):
    then it says nothing about today's clusters, brokers or promises."""
    if previous.decided_ms is None or previous.decided_ms >= now_ms - _ms(cfg.broker_seen_s):
        return previous
    return PreviousState()


def decide(snapshot: Snapshot, previous: PreviousState, now_ms: int, cfg: PolicyConfig) -> Decision:
    """The full current list of every cluster with recent input or in the last published list.

    A cluster whose list became empty still gets one (an empty list clears producers' avoidance).
    """
    previous = recent_previous(previous, now_ms, cfg)
    clusters = {e.cluster for e in relevant_episodes(snapshot, now_ms, cfg)}
    clusters |= {h.cluster for h in recent_health(snapshot, now_ms, cfg)}
    clusters |= {a.cluster for a in snapshot.avoiding} | set(previous.clusters())
    return Decision(
        decided_ms=now_ms,
        expires_ms=expires_at(now_ms, cfg),
        policy_version=cfg.version,
        clusters=tuple(decide_cluster(snapshot, previous, c, now_ms, cfg) for c in sorted(clusters)),
    )
