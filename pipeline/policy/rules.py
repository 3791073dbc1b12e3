"""The avoidance rules, one small named function each, so each verdict can be tested on its own.

Three rules can make a broker a candidate for avoidance, in priority order:

1. :func:`rule_open_episode` — the cluster-wide detector has an open episode for the broker.
2. :func:`rule_probation` — an episode closed recently; like Envoy's outlier ejection, the broker
   stays out for ``base × multiplier`` (capped) after it last looked bad, where the multiplier grows
   with repeated episodes within ``repeat_period_s`` and decays by one per ``decay_s`` of health.
3. :func:`rule_hysteresis` — the last published list promised an avoidance that has not run out:
   a verdict is not withdrawn before its time, so the list does not flap cycle to cycle.

Then :func:`rule_share_cap` keeps at most ``max_avoid_share`` of a cluster's brokers avoided
(Envoy's ``max_ejection_percent``): the worst candidates are avoided, the least bad are kept
available and say so. Incumbents keep their slot against newcomers of the same class — the second
half of the hysteresis. Every function is pure: time comes in as ``now_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.config import PolicyConfig
from pipeline.policy.model import AVOID, Episode, Evidence, Health, PreviousEntry

OPEN_EPISODE = "open_episode"
PROBATION = "probation"
HYSTERESIS = "hysteresis"
SHARE_CAP = "share_cap"
# Lower is worse; the share cap avoids the worst first.
SEVERITY = {OPEN_EPISODE: 0, PROBATION: 1, HYSTERESIS: 2}


@dataclass(frozen=True)
class BrokerView:
    """Everything the rules may look at for one broker of one cluster."""

    cluster: str
    broker_name: str
    episodes: tuple[Episode, ...] = ()  # within the repeat period or still open, oldest first
    health: Health | None = None
    producers_avoiding: int = 0
    previous: PreviousEntry | None = None

    @property
    def latest_episode(self) -> Episode | None:
        return self.episodes[-1] if self.episodes else None

    @property
    def incumbent(self) -> bool:
        """Avoided by the last published list."""
        return self.previous is not None and self.previous.action == AVOID


@dataclass(frozen=True)
class Verdict:
    """A rule's finding: avoid this broker until ``avoid_until_ms``, because ``reason``."""

    rule: str
    avoid_until_ms: int
    reason: str
    episode_id: str | None
    multiplier: int

    @property
    def severity(self) -> int:
        return SEVERITY[self.rule]


def seconds_to_ms(seconds: float) -> int:
    return round(seconds * 1000)


_ms = seconds_to_ms


def envoy_multiplier(episodes: Sequence[Episode], now_ms: int, cfg: PolicyConfig) -> int:
    """Envoy's consecutive-ejection count at the latest episode.

    Walk the broker's episodes that reach into the repeat period, oldest first: each adds one;
    each full ``decay_s`` of health between two episodes takes one away (never below zero).
    """
    multiplier = 0
    last_end: int | None = None
    start = now_ms - _ms(cfg.repeat_period_s)
    for ep in sorted(episodes, key=lambda e: e.opened_ms):
        if ep.end_ms(now_ms) < start:
            continue  # ended before the repeat period: forgotten
        if last_end is not None:
            healthy_ms = max(0, ep.opened_ms - last_end)
            multiplier = max(0, multiplier - healthy_ms // _ms(cfg.decay_s))
        multiplier += 1
        last_end = ep.end_ms(now_ms)
    return multiplier


def avoid_duration_ms(multiplier: int, cfg: PolicyConfig) -> int:
    """Envoy's ejection time: ``base × multiplier``, capped at ``max_avoid_s``."""
    return min(_ms(cfg.base_avoid_s) * max(1, multiplier), _ms(cfg.max_avoid_s))


def rule_open_episode(view: BrokerView, now_ms: int, cfg: PolicyConfig) -> Verdict | None:
    """Avoid a broker with an open episode, for at least ``hysteresis_s`` past this decision.

    The hold outlasts one publisher interval so an open episode's avoidance never lapses between
    cycles; the multiplier lengthens it for repeat offenders.
    """
    ep = view.latest_episode
    if ep is None or not ep.is_open:
        return None
    mult = envoy_multiplier(view.episodes, now_ms, cfg)
    hold = max(avoid_duration_ms(mult, cfg), _ms(cfg.hysteresis_s))
    return Verdict(OPEN_EPISODE, now_ms + hold, f"{OPEN_EPISODE}: {ep.reason}", ep.episode_id, mult)


def rule_probation(view: BrokerView, now_ms: int, cfg: PolicyConfig) -> Verdict | None:
    """Keep avoiding a broker for ``base × multiplier`` after its latest episode closed."""
    ep = view.latest_episode
    if ep is None or ep.is_open or ep.closed_ms is None:
        return None
    mult = envoy_multiplier(view.episodes, now_ms, cfg)
    until = ep.closed_ms + avoid_duration_ms(mult, cfg)
    if until <= now_ms:
        return None
    detail = f"{PROBATION}: episode closed {(now_ms - ep.closed_ms) // 1000}s ago, multiplier {mult}"
    return Verdict(PROBATION, until, detail, ep.episode_id, mult)


def rule_hysteresis(view: BrokerView, now_ms: int, cfg: PolicyConfig) -> Verdict | None:
    """Do not withdraw a published avoidance before its ``avoid_until_ms``.

    Bounded by ``max_avoid_s`` from now, so a bad previous row cannot pin a broker for long.
    """
    prev = view.previous
    if prev is None or prev.action != AVOID or prev.avoid_until_ms <= now_ms:
        return None
    until = min(prev.avoid_until_ms, now_ms + _ms(cfg.max_avoid_s))
    ep = view.latest_episode
    mult = envoy_multiplier(view.episodes, now_ms, cfg) if ep is not None else 0
    detail = f"{HYSTERESIS}: published avoidance runs until {prev.avoid_until_ms} (was {prev.reason})"
    return Verdict(HYSTERESIS, until, detail, ep.episode_id if ep else None, mult)


RULES = (rule_open_episode, rule_probation, rule_hysteresis)


def combine(verdicts: Sequence[Verdict | None]) -> Verdict | None:
    """The highest-priority verdict names the reason; the avoidance lasts as long as the longest."""
    found = [v for v in verdicts if v is not None]
    if not found:
        return None
    until = max(v.avoid_until_ms for v in found)
    mult = max(v.multiplier for v in found)
    first = found[0]
    return Verdict(first.rule, until, first.reason, first.episode_id, mult)


def evidence_for(view: BrokerView) -> Evidence:
    """Producers avoiding now, and the failure rate and p99 of the latest minute with sends.

    Without a recent minute (everyone already avoids the broker) the episode's own figures stand in.
    """
    ep = view.latest_episode
    h = view.health
    if h is not None and h.sends > 0:
        rate, p99 = h.failure_rate, h.latency_p99_ms
    elif ep is not None:
        rate = ep.failures / ep.sends if ep.sends else 0.0
        p99 = ep.p99_latency_ms
    else:
        rate, p99 = 0.0, 0.0
    return Evidence(view.producers_avoiding, float(rate), float(p99))


def max_avoided(brokers_known: int, cfg: PolicyConfig) -> int:
    """At most ``floor(brokers × max_avoid_share)`` brokers avoided: a one-broker cluster keeps it."""
    return math.floor(brokers_known * cfg.max_avoid_share + 1e-9)


def cap_rank(view: BrokerView, verdict: Verdict, evidence: Evidence) -> tuple:
    """Worst first: open episodes, then incumbents (no swapping within a class), then the evidence."""
    return (
        verdict.severity,
        0 if view.incumbent else 1,
        -evidence.producers_avoiding,
        -evidence.failure_rate,
        -evidence.p99_latency_ms,
        view.broker_name,
    )


def rule_share_cap(
    candidates: Sequence[tuple[BrokerView, Verdict, Evidence]], brokers_known: int, cfg: PolicyConfig
) -> tuple[list[tuple[BrokerView, Verdict, Evidence]], list[tuple[BrokerView, Verdict, Evidence]]]:
    """Split candidates into (avoid, keep available) so the avoided share stays within the cap."""
    ranked = sorted(candidates, key=lambda c: cap_rank(*c))
    limit = max_avoided(brokers_known, cfg)
    return ranked[:limit], ranked[limit:]


def share_cap_reason(verdict: Verdict, candidates: int, brokers_known: int, cfg: PolicyConfig) -> str:
    return (
        f"{SHARE_CAP}: {candidates} of {brokers_known} brokers qualify but at most "
        f"{max_avoided(brokers_known, cfg)} may be avoided (max_avoid_share={cfg.max_avoid_share}); "
        f"kept available as one of the least bad ({verdict.reason})"
    )


def expires_at(now_ms: int, cfg: PolicyConfig) -> int:
    """Producers drop a list this old even if nothing replaced it: a dead publisher frees brokers."""
    return now_ms + _ms(cfg.expiry_s)
