"""Alerts with a lifecycle: each fires once, repeats while active and resolves when its condition ends.

Pure (no clock, no I/O): a cycle computes the conditions that hold now (:func:`broker_conditions`,
:func:`group_conditions`), and :func:`advance` turns the previous cycle's alerts and those
conditions into the new alerts and what to send. An alert's identity (``alert_id``) is what it is
about (a broker, a consumer group), never a cycle or a time, so Alertmanager's fingerprint (its
labels) stays the same from firing to resolution. A resolved alert stays in the state until
Alertmanager has acknowledged its resolution, so an outage of Alertmanager never loses one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.policy.model import Episode

FIRING = "firing"
RESOLVED = "resolved"

BROKER_FAULT = "broker_fault"
CONSUMER_GROUP = "consumer_lag"
AVOIDANCE_REFUSED = "avoidance_refused"
AVOIDANCE_FAILED = "avoidance_failed"  # enabled with AVOIDANCE_REFUSED: either way no list went out
ALERT_KINDS = (BROKER_FAULT, CONSUMER_GROUP, AVOIDANCE_REFUSED)

# Alertmanager's alertname per kind: what routes and silences match on. Brokers and groups use the
# names and labels of the Prometheus rules in deploy/prometheus/faultwatch-rules.yml, so Alertmanager
# sees one alert (one fingerprint) whichever path raised it.
ALERT_NAMES = {
    BROKER_FAULT: "FaultwatchBrokerFaultEpisode",
    CONSUMER_GROUP: "FaultwatchConsumerGroupNotOK",
    AVOIDANCE_REFUSED: "FaultwatchAvoidanceRefused",
    AVOIDANCE_FAILED: "FaultwatchAvoidanceFailed",
}
TIME_LAG_ALERT_NAME = "FaultwatchConsumerGroupTimeLag"  # a group whose status is fine but is too far behind
GROUP_ALERT_STATUSES = ("WARN", "STOP", "STALL", "REWIND")


@dataclass(frozen=True)
class Condition:
    """An alert condition that holds at this cycle."""

    alert_id: str
    kind: str
    severity: str
    cluster: str  # "" for the publisher's own alerts
    labels: Mapping[str, str]  # identity labels besides cluster/severity (an "alertname" here overrides the kind's)
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    """One alert as the publisher tracks it from cycle to cycle."""

    alert_id: str
    kind: str
    severity: str
    cluster: str
    labels: Mapping[str, str]
    summary: str
    details: Mapping[str, Any]
    status: str  # firing | resolved
    starts_ms: int
    ends_ms: int | None  # set when resolved
    sent_ms: int  # when a record of it last went to the alerts topic
    delivered: bool  # resolved only: Alertmanager acknowledged the resolution

    @property
    def firing(self) -> bool:
        return self.status == FIRING


@dataclass(frozen=True)
class Step:
    alerts: tuple[Alert, ...]  # the state to keep (firing, and resolved not yet delivered)
    records: tuple[Alert, ...]  # to the alerts topic now: new, repeated and resolved alerts
    to_alertmanager: tuple[Alert, ...]  # every firing alert and every undelivered resolution


def _fire(c: Condition, now_ms: int) -> Alert:
    return Alert(c.alert_id, c.kind, c.severity, c.cluster, dict(c.labels), c.summary, dict(c.details),
                 FIRING, now_ms, None, now_ms, False)


def _update(a: Alert, c: Condition, now_ms: int, repeat_ms: int) -> tuple[Alert, bool]:
    repeat = now_ms - a.sent_ms >= repeat_ms
    new = dataclasses.replace(a, summary=c.summary, details=dict(c.details), sent_ms=now_ms if repeat else a.sent_ms)
    return new, repeat


def _resolve(a: Alert, now_ms: int) -> Alert:
    return dataclasses.replace(a, status=RESOLVED, ends_ms=now_ms, sent_ms=now_ms, delivered=False)


def advance(
    previous: Sequence[Alert], conditions: Iterable[Condition], now_ms: int, repeat_ms: int,
    retry_resolution_ms: int = 3_600_000,
) -> Step:
    """One cycle of the lifecycle; alerts ordered by identity.

    An unacknowledged resolution is posted again each cycle for ``retry_resolution_ms`` after it
    resolved (by then Alertmanager has long resolved the alert itself: nothing re-sent it).
    """
    holding = {c.alert_id: c for c in conditions}
    before = {a.alert_id: a for a in previous}
    kept: list[Alert] = []
    records: list[Alert] = []
    for alert_id in sorted(holding.keys() | before.keys()):
        old, cond = before.get(alert_id), holding.get(alert_id)
        if cond is not None and (old is None or not old.firing):
            new = _fire(cond, now_ms)  # a new alert, or one that resolved and is back
            kept.append(new)
            records.append(new)
        elif cond is not None and old is not None:
            new, repeat = _update(old, cond, now_ms, repeat_ms)
            kept.append(new)
            if repeat:
                records.append(new)
        elif old is not None and old.firing:
            new = _resolve(old, now_ms)
            kept.append(new)
            records.append(new)
        elif old is not None and not old.delivered and now_ms - (old.ends_ms or now_ms) < retry_resolution_ms:
            kept.append(old)  # a resolution Alertmanager has not acknowledged yet
    return Step(tuple(kept), tuple(records), tuple(kept))


def delivered(step: Step, ok: bool) -> tuple[Alert, ...]:
    """The state to keep once Alertmanager answered: acknowledged resolutions are done with."""
    if not ok:
        return step.alerts
    return tuple(a for a in step.alerts if a.firing)


def broker_conditions(episodes: Iterable[Episode]) -> list[Condition]:
    """A broker alerts while one of its episodes is suspected or open (withdrawn ones are gone).

    Its identity includes the episode's state, as the Prometheus rule's labels do: from suspected
    to open, the suspected alert resolves and the open one fires.
    """
    out: dict[str, Condition] = {}
    for e in sorted(episodes, key=lambda e: (e.cluster, e.broker_name, e.opened_ms)):
        if not e.is_open:
            continue
        alert_id = f"{BROKER_FAULT}|{e.cluster}|{e.broker_name}|{e.state}"
        word = "suspected" if e.state == "suspected" else "confirmed"
        out[alert_id] = Condition(
            alert_id, BROKER_FAULT, "critical", e.cluster, {"broker": e.broker_name, "state": e.state},
            f"broker {e.broker_name} of cluster {e.cluster}: fault episode {word} ({e.reason}), "
            f"{e.peak_avoiding_producers} of {e.active_producers} producers avoiding it",
            {"episode_id": e.episode_id, "state": e.state, "opened_ms": e.opened_ms, "reason": e.reason,
             "sends": e.sends, "failures": e.failures, "p99_latency_ms": e.p99_latency_ms},
        )
    return list(out.values())


def group_conditions(rows: Iterable[Mapping[str, Any]], time_lag_bound_ms: int) -> list[Condition]:
    """A consumer group alerts while its newest status is WARN or worse or its time lag is over the bound.

    ``rows`` are ``group_status`` rows; the newest per group counts.
    """
    newest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in rows:
        key = (r["cluster"], r["consumer_group"])
        if key not in newest or r["ts_ms"] >= newest[key]["ts_ms"]:
            newest[key] = r
    out = []
    for (cluster, group), r in sorted(newest.items()):
        time_lag = r.get("max_time_lag_ms")
        over = time_lag if time_lag is not None and time_lag > time_lag_bound_ms else None
        if r["status"] not in GROUP_ALERT_STATUSES and over is None:
            continue
        why = [f"status {r['status']}"] if r["status"] in GROUP_ALERT_STATUSES else []
        if over is not None:
            why.append(f"time lag {over / 1000:.0f} s over {time_lag_bound_ms / 1000:.0f} s")
        # the Prometheus rules' labels: FaultwatchConsumerGroupNotOK by status, else the time-lag rule
        if r["status"] in GROUP_ALERT_STATUSES:
            alert_id, labels = f"{CONSUMER_GROUP}|{cluster}|{group}|{r['status']}", {"group": group, "status": r["status"]}
        else:
            alert_id, labels = f"{CONSUMER_GROUP}|{cluster}|{group}|time_lag", {"alertname": TIME_LAG_ALERT_NAME, "group": group}
        out.append(Condition(
            alert_id, CONSUMER_GROUP, "warning", cluster, labels,
            f"consumer group {group} of cluster {cluster} is lagging: {', '.join(why)}"
            + (f" ({r['alert_reason']})" if r.get("alert_reason") else ""),
            {k: r.get(k) for k in ("consumer_group", "status", "ts_ms", "total_lag", "max_time_lag_ms", "retry_lag", "dlq_lag",
                                   "worst_topic", "worst_broker", "worst_queue_id", "worst_owner")},
        ))
    return out


def refusal_conditions(cycles: Iterable[Mapping[str, Any]], publisher: str) -> list[Condition]:
    """The publisher alerts while its newest decided avoidance cycle was refused by validation, or failed.

    ``cycles`` are ``publisher_cycles`` rows; a later ``published`` cycle resolves it.
    """
    decided = [r for r in cycles if r["step"] == "avoidance" and r["status"] in ("published", "rejected", "failed")]
    if not decided:
        return []
    newest = max(r["cycle_number"] for r in decided)
    last_rows = [r for r in decided if r["cycle_number"] == newest]
    if any(r["status"] == "published" for r in last_rows):
        return []
    last = last_rows[-1]
    if last["status"] == "failed":
        return [Condition(
            f"{AVOIDANCE_FAILED}|{publisher}", AVOIDANCE_FAILED, "critical", "", {"publisher": publisher},
            f"avoidance publisher {publisher}: cycle {last['cycle_id']} failed, nothing published: "
            f"{last.get('reason') or 'see publisher_cycles'}; producers keep the last list until it expires",
            {"cycle_id": last["cycle_id"], "reason": last.get("reason")},
        )]
    failed = list(last.get("failed_checks") or [])
    return [Condition(
        f"{AVOIDANCE_REFUSED}|{publisher}", AVOIDANCE_REFUSED, "critical", "", {"publisher": publisher},
        f"avoidance publisher {publisher}: cycle {last['cycle_id']} refused by validation, nothing published; "
        f"producers keep the last list until it expires ({'; '.join(failed) or 'see publisher_cycles'})",
        {"cycle_id": last["cycle_id"], "failed_checks": failed},
    )]
