"""The read-only JSON API, shaped like Burrow's v3 HTTP API where it fits.

Every answer carries ``error`` (bool), ``message`` and ``request`` like Burrow's; unknown clusters
and groups are 404s with ``error: true``; a table the answer depends on that cannot be read gives a
503 with the reason in ``message``. Queues take the place of Burrow's partitions and the worst queue
that of ``maxlag``. The avoidance list is served as the very document the publisher wrote to its
file, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

import orjson

from pipeline.publish.sinks import safe_file_name
from pipeline.serve.state import Broker, Group, Queue, ServeState

API_PREFIX = "/v3/rocketmq"

_GROUP_TABLES = ("group_status", "queue_lag")
_BROKER_TABLES = ("broker_fault_episodes_live", "broker_health")

Answer = tuple[int, bytes]


def segment(name: str) -> str:
    """A name as one path segment: every character but ``A-Za-z0-9_.-~`` percent-encoded, and a
    name of dots fully encoded, so no name (``a/b``, ``..``) can stand for another path."""
    if name.strip(".") == "":
        return "%2E" * len(name)
    return quote(name, safe="")


def canonical_path(raw: str) -> str:
    """A request's path (still percent-encoded) in the one encoding the API's own paths use:
    each segment decoded once and encoded again, ``/`` always a separator, ``%2F`` never."""
    return "/".join(segment(unquote(part, errors="replace")) if part else "" for part in raw.split("/"))


def reply(code: int, url: str, message: str, **body: Any) -> Answer:
    """A Burrow-style answer: ``error``, ``message``, the body's keys and ``request``."""
    doc = {"error": code >= 400, "message": message, **body, "request": {"url": url}}
    return code, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def not_found(url: str, what: str) -> Answer:
    return reply(404, url, f"{what} not found")


def queue_doc(q: Queue) -> dict[str, Any]:
    return {
        "topic": q.topic,
        "topic_kind": q.topic_kind,
        "broker": q.broker,
        "queue_id": q.queue_id,
        "status": q.status,
        "lag": q.lag,
        "time_lag_ms": q.time_lag_ms,
        "owner": q.owner,
        "updated_ms": q.ts_ms,
        "last_commit_ms": q.last_commit_ms,
    }


def group_doc(g: Group) -> dict[str, Any]:
    return {
        **{k: v for k, v in g.extra.items() if k not in ("complete", "completeness")},
        "cluster": g.cluster,
        "group": g.name,
        "status": g.status,
        "complete": g.complete,
        "totallag": g.total_lag,
        "retry_lag": g.retry_lag,
        "dlq_lag": g.dlq_lag,
        "max_time_lag_ms": g.max_time_lag_ms,
        "maxlag": queue_doc(g.worst) if g.worst is not None else None,
        "queue_count": len(g.queues),
        "queues": [queue_doc(q) for q in g.queues],
        "updated_ms": g.ts_ms,
    }


def broker_doc(b: Broker) -> dict[str, Any]:
    return {
        "broker": b.name,
        "episode_state": b.episode_state,
        "open_episodes": [dict(e) for e in b.open_episodes],
        "episodes_confirmed": b.episodes_confirmed,
        "health": dict(b.health) if b.health is not None else None,
        "avoidance_recommended": b.avoided,
    }


def clusters(state: ServeState, url: str) -> Answer:
    error = state.error_for((*_GROUP_TABLES, *_BROKER_TABLES))
    if error:
        return reply(503, url, error)
    return reply(200, url, "cluster list returned", clusters=sorted(state.clusters))


def cluster(state: ServeState, url: str, name: str) -> Answer:
    c = state.clusters.get(name)
    if c is None:
        return not_found(url, f"cluster {name!r}")
    detail = {
        "name": c.name,
        "groups": len(c.groups),
        "brokers": len(c.brokers),
        "brokers_with_open_episodes": sorted(b.name for b in c.brokers.values() if b.open_episodes),
        "avoidance_published": c.avoidance is not None,
    }
    return reply(200, url, "cluster detail returned", cluster=detail)


def consumers(state: ServeState, url: str, name: str) -> Answer:
    error = state.error_for(_GROUP_TABLES)
    if error:
        return reply(503, url, error)
    c = state.clusters.get(name)
    if c is None:
        return not_found(url, f"cluster {name!r}")
    return reply(200, url, "consumer list returned", consumers=sorted(c.groups))


def group_status(state: ServeState, url: str, name: str, group: str) -> Answer:
    error = state.error_for(_GROUP_TABLES)
    if error:
        return reply(503, url, error)
    c = state.clusters.get(name)
    if c is None:
        return not_found(url, f"cluster {name!r}")
    g = c.groups.get(group)
    if g is None:
        return not_found(url, f"consumer group {group!r} in cluster {name!r}")
    return reply(200, url, "consumer status returned", status=group_doc(g))


def brokers(state: ServeState, url: str, name: str) -> Answer:
    error = state.error_for(_BROKER_TABLES)
    if error:
        return reply(503, url, error)
    c = state.clusters.get(name)
    if c is None:
        return not_found(url, f"cluster {name!r}")
    return reply(200, url, "broker list returned", brokers=[broker_doc(b) for b in c.brokers.values()])


def avoidance(state: ServeState, url: str, name: str, raw: Mapping[str, bytes]) -> Answer:
    """The cluster's published list exactly as the publisher wrote it (``raw``: file bytes)."""
    if name not in state.clusters:
        return not_found(url, f"cluster {name!r}")
    if name not in raw:
        bad = state.avoidance_bad.get(safe_file_name(name))
        if bad is not None:
            return reply(503, url, f"avoidance file {safe_file_name(name)}: {bad}")
        if state.avoidance_error:
            return reply(503, url, state.avoidance_error)
        return not_found(url, f"avoidance list of cluster {name!r}")
    return 200, raw[name]
