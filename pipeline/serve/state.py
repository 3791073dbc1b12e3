"""What ``serve`` knows at one moment, built from the tables' current views by pure functions.

Every endpoint (``/metrics``, the JSON API, the page, ``/healthz``) renders one :class:`ServeState`,
so they always agree with each other. Time is a parameter (``now_ms``): nothing here reads a clock
or a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

EPISODE_STATES = ("none", "suspected", "open")

# The column each table's event time is read from (the newest value says how fresh the table is).
TIME_COLUMN: dict[str, str] = {
    "send_results": "ts_ms",
    "consumer_progress": "ts_ms",
    "group_membership": "ts_ms",
    "quarantine": "kafka_ts_ms",
    "producer_fault_windows_live": "updated_ms",
    "broker_fault_episodes_live": "updated_ms",
    "broker_health": "minute_ms",
    "queue_lag": "ts_ms",
    "group_status": "ts_ms",
    "avoidance_recommendations": "decided_ms",
    "publisher_cycles": "decided_ms",
}

# group_status columns with a place of their own in a group's document; any other column the
# table has (Burrow-style additions) is passed through under its own name.
_GROUP_COLUMNS = frozenset({
    "cluster", "consumer_group", "ts_ms", "status", "previous_status", "total_lag", "max_time_lag_ms",
    "retry_lag", "dlq_lag", "worst_topic", "worst_broker", "worst_queue_id", "worst_owner", "queues",
    "alert", "alert_reason", "event_date",
})
_COMPLETENESS_COLUMNS = ("complete", "completeness")


@dataclass(frozen=True)
class Queue:
    topic: str
    topic_kind: str
    broker: str
    queue_id: int
    status: str
    lag: int | None
    time_lag_ms: int | None
    owner: str | None
    ts_ms: int
    last_commit_ms: int | None


@dataclass(frozen=True)
class Group:
    cluster: str
    name: str
    status: str
    ts_ms: int
    total_lag: int | None
    retry_lag: int | None
    dlq_lag: int | None
    max_time_lag_ms: int | None
    worst: Queue | None
    complete: float | None
    queues: tuple[Queue, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Broker:
    cluster: str
    name: str
    episode_state: str
    open_episodes: tuple[Mapping[str, Any], ...]
    episodes_confirmed: int
    health: Mapping[str, Any] | None
    avoided: bool


@dataclass(frozen=True)
class Cluster:
    name: str
    groups: Mapping[str, Group]
    brokers: Mapping[str, Broker]
    avoidance: Mapping[str, Any] | None


@dataclass(frozen=True)
class ServeState:
    now_ms: int
    clusters: Mapping[str, Cluster]
    table_errors: Mapping[str, str]
    newest_ms: Mapping[str, int | None]
    quarantine: tuple[tuple[str, str, int], ...]
    publisher: tuple[tuple[str, str, int], ...]
    avoidance_error: str | None = None
    # Published files that could not be used, by file name: why.
    avoidance_bad: Mapping[str, str] = field(default_factory=dict)

    def error_for(self, tables: Sequence[str]) -> str | None:
        """The first problem among ``tables`` (None: all readable)."""
        for name in tables:
            if name in self.table_errors:
                return self.table_errors[name]
        return None


@dataclass(frozen=True)
class Views:
    """The folded views the state is built from (None: the table could not be read)."""

    group_status: pa.Table | None
    queue_lag: pa.Table | None
    episodes: pa.Table | None
    broker_health: pa.Table | None
    publisher_cycles: pa.Table | None
    quarantine: pa.Table | None
    newest_ms: Mapping[str, int | None]
    errors: Mapping[str, str]
    avoidance: Mapping[str, Mapping[str, Any]]
    avoidance_error: str | None = None
    avoidance_bad: Mapping[str, str] = field(default_factory=dict)


def build_state(views: Views, now_ms: int, forget_after_ms: int) -> ServeState:
    """The state of every cluster from the views; rows older than ``forget_after_ms`` before their
    table's newest row are left out (groups and queues that went away)."""
    queues = _queues_by_group(_recent(views.queue_lag, "ts_ms", forget_after_ms))
    groups = _groups(_recent(views.group_status, "ts_ms", forget_after_ms), queues)
    brokers = _brokers(views.episodes, views.broker_health, views.avoidance, now_ms)
    names = sorted({c for c, _ in groups} | {c for c, _ in brokers} | set(views.avoidance))
    clusters = {
        name: Cluster(
            name,
            {g: groups[(c, g)] for c, g in sorted(groups) if c == name},
            {b: brokers[(c, b)] for c, b in sorted(brokers) if c == name},
            views.avoidance.get(name),
        )
        for name in names
    }
    return ServeState(
        now_ms=now_ms,
        clusters=clusters,
        table_errors=dict(views.errors),
        newest_ms=dict(views.newest_ms),
        quarantine=_quarantine_counts(views.quarantine),
        publisher=_publisher_cycles(views.publisher_cycles),
        avoidance_error=views.avoidance_error,
        avoidance_bad=dict(views.avoidance_bad),
    )


def _recent(table: pa.Table | None, column: str, forget_after_ms: int) -> list[dict[str, Any]]:
    if table is None or table.num_rows == 0:
        return []
    rows = table.to_pylist()
    newest = max(r[column] for r in rows)
    return [r for r in rows if r[column] >= newest - forget_after_ms]


def _queue(row: Mapping[str, Any]) -> Queue:
    return Queue(
        topic=row["topic"],
        topic_kind=row.get("topic_kind") or "main",
        broker=row["broker_name"],
        queue_id=int(row["queue_id"]),
        status=row.get("status") or "UNKNOWN",
        lag=row.get("lag_messages"),
        time_lag_ms=row.get("time_lag_ms"),
        owner=row.get("owner_client_id"),
        ts_ms=int(row["ts_ms"]),
        last_commit_ms=row.get("last_commit_ms"),
    )


def _queues_by_group(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[Queue]]:
    out: dict[tuple[str, str], list[Queue]] = {}
    for row in rows:
        out.setdefault((row["cluster"], row["consumer_group"]), []).append(_queue(row))
    for qs in out.values():
        qs.sort(key=lambda q: (q.topic, q.broker, q.queue_id))
    return out


def _groups(
    rows: list[dict[str, Any]], queues: Mapping[tuple[str, str], list[Queue]]
) -> dict[tuple[str, str], Group]:
    out = {}
    for row in rows:
        key = (row["cluster"], row["consumer_group"])
        group_queues = tuple(queues.get(key, ()))
        out[key] = Group(
            cluster=key[0],
            name=key[1],
            status=row.get("status") or "UNKNOWN",
            ts_ms=int(row["ts_ms"]),
            total_lag=row.get("total_lag"),
            retry_lag=row.get("retry_lag"),
            dlq_lag=row.get("dlq_lag"),
            max_time_lag_ms=row.get("max_time_lag_ms"),
            worst=_worst_queue(row, group_queues),
            complete=_completeness(row),
            queues=group_queues,
            extra={k: v for k, v in row.items() if k not in _GROUP_COLUMNS},
        )
    return out


def _worst_queue(row: Mapping[str, Any], queues: Sequence[Queue]) -> Queue | None:
    """Burrow's maxlag queue when the row names one, else the lag query's worst queue, else the
    queue with the most lag."""
    for prefix in ("maxlag", "worst"):
        key = (row.get(f"{prefix}_topic"), row.get(f"{prefix}_broker"), row.get(f"{prefix}_queue_id"))
        if key[0] is None or key[2] is None:
            continue
        for q in queues:
            if (q.topic, q.broker, q.queue_id) == key:
                return q
        return Queue(key[0], "main", key[1] or "", int(key[2]), row.get("status") or "UNKNOWN",
                     row.get("max_lag"), None, row.get("worst_owner"), int(row["ts_ms"]), None)
    lagging = [q for q in queues if q.lag is not None]
    return max(lagging, key=lambda q: (q.lag, q.time_lag_ms or 0)) if lagging else None


def _completeness(row: Mapping[str, Any]) -> float | None:
    for name in _COMPLETENESS_COLUMNS:
        if row.get(name) is not None:
            return float(row[name])
    return None


def _brokers(
    episodes: pa.Table | None,
    health: pa.Table | None,
    avoidance: Mapping[str, Mapping[str, Any]],
    now_ms: int,
) -> dict[tuple[str, str], Broker]:
    open_eps: dict[tuple[str, str], list[dict[str, Any]]] = {}
    confirmed: dict[tuple[str, str], int] = {}
    for ep in episodes.to_pylist() if episodes is not None else []:
        key = (ep["cluster"], ep["broker_name"])
        open_eps.setdefault(key, [])
        if ep["state"] in ("suspected", "open"):
            open_eps[key].append(ep)
        if ep["state"] in ("open", "closed"):
            confirmed[key] = confirmed.get(key, 0) + 1
    latest_health = {(h["cluster"], h["broker_name"]): h for h in (health.to_pylist() if health is not None else [])}
    avoided = {(c, b) for c, doc in avoidance.items() for b in avoided_brokers(doc, now_ms)}
    known = set(open_eps) | set(latest_health) | avoided | {
        (c, e["broker_name"]) for c, doc in avoidance.items() for e in [*doc.get("avoid", []), *doc.get("keep_available", [])]
    }
    out = {}
    for key in known:
        eps = sorted(open_eps.get(key, []), key=lambda e: e["opened_ms"])
        state = "open" if any(e["state"] == "open" for e in eps) else ("suspected" if eps else "none")
        out[key] = Broker(key[0], key[1], state, tuple(eps), confirmed.get(key, 0), latest_health.get(key), key in avoided)
    return out


def avoided_brokers(doc: Mapping[str, Any], now_ms: int) -> list[str]:
    """Brokers a producer following this published list avoids at ``now_ms``."""
    if int(doc.get("expires_ms") or 0) <= now_ms:
        return []
    return [
        e["broker_name"] for e in doc.get("avoid", [])
        if int(e.get("avoid_until_ms") or 0) > now_ms and int(e.get("expires_ms") or 0) > now_ms
    ]


def _quarantine_counts(table: pa.Table | None) -> tuple[tuple[str, str, int], ...]:
    if table is None or table.num_rows == 0:
        return ()
    rows = table.to_pylist()
    return tuple(sorted((r["reason"], r["stage"], int(r["records"])) for r in rows))


def _publisher_cycles(table: pa.Table | None) -> tuple[tuple[str, str, int], ...]:
    if table is None or table.num_rows == 0:
        return ()
    return tuple(sorted((r["step"], r["status"], int(r["decided_ms"])) for r in table.to_pylist()))
