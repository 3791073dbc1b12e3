"""One refresh: follow the tables and the published avoidance files, build the state, render /metrics.

:class:`Refresher` keeps the table followers (:mod:`pipeline.serve.follow`) between refreshes, so
each refresh reads only what was committed since the last one. :mod:`pipeline.serve.worker` runs
it in a child process; tests call :meth:`Refresher.refresh_once` directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config
from pipeline.serve.follow import Fold, TableFollower, latest_fold
from pipeline.serve.metrics import RefreshStats, render_metrics
from pipeline.serve.state import TIME_COLUMN, ServeState, Views, build_state

# Tables whose content serve shows: /healthz is 503 while one of them cannot be read.
REQUIRED_TABLES = ("group_status", "queue_lag", "broker_fault_episodes_live", "broker_health")

_QUEUE_COLUMNS = ("cluster", "consumer_group", "topic", "topic_kind", "broker_name", "queue_id", "ts_ms",
                  "lag_messages", "time_lag_ms", "owner_client_id", "status", "last_commit_ms")
_HEALTH_COLUMNS = ("cluster", "broker_name", "minute_ms", "sends", "failures", "failure_rate", "latency_p99_ms",
                   "active_producers", "producers_avoiding")


def _quarantine_map(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return pa.table({"reason": pa.array([], pa.string()), "stage": pa.array([], pa.string()),
                         "records": pa.array([], pa.int64()), "newest_ms": pa.array([], pa.int64())})
    grouped = table.group_by(["reason", "stage"], use_threads=False).aggregate(
        [([], "count_all"), ("kafka_ts_ms", "max")]
    )
    return pa.table({"reason": grouped["reason"], "stage": grouped["stage"],
                     "records": grouped["count_all"], "newest_ms": grouped["kafka_ts_ms_max"]})


def _quarantine_combine(table: pa.Table) -> pa.Table:
    grouped = table.group_by(["reason", "stage"], use_threads=False).aggregate(
        [("records", "sum"), ("newest_ms", "max")]
    )
    return pa.table({"reason": grouped["reason"], "stage": grouped["stage"],
                     "records": grouped["records_sum"], "newest_ms": grouped["newest_ms_max"]})


def table_folds() -> dict[str, Fold]:
    """What serve keeps of each table."""
    folds = {
        "group_status": latest_fold(["cluster", "consumer_group"], "ts_ms"),
        "queue_lag": latest_fold(["cluster", "consumer_group", "topic", "broker_name", "queue_id"], "ts_ms",
                                 _QUEUE_COLUMNS),
        "broker_fault_episodes_live": latest_fold(["episode_id"], "revision"),
        "broker_health": latest_fold(["cluster", "broker_name"], "minute_ms", _HEALTH_COLUMNS),
        "publisher_cycles": latest_fold(["step", "status"], "decided_ms", ["step", "status", "decided_ms"]),
        "quarantine": Fold(("reason", "stage", "kafka_ts_ms"), _quarantine_map, _quarantine_combine),
    }
    for name, column in TIME_COLUMN.items():
        folds.setdefault(name, latest_fold([], column, [column]))
    return folds


def _newest(name: str, view: pa.Table | None) -> int | None:
    column = "newest_ms" if name == "quarantine" else TIME_COLUMN[name]
    if view is None or view.num_rows == 0 or column not in view.column_names:
        return None
    value = pc.max(view.column(column)).as_py()
    return None if value is None else int(value)


@dataclass(frozen=True)
class AvoidanceFiles:
    """The published lists: raw bytes and parsed documents by cluster, the files that could not be
    used (file name -> why), and why none could be read at all (no folder yet)."""

    raw: dict[str, bytes]
    docs: dict[str, Any]
    bad: dict[str, str]
    missing: str | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry_problem(where: str, entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is not an object"
    if not isinstance(entry.get("broker_name"), str) or not entry["broker_name"]:
        return f"{where}.broker_name is not a non-empty string"
    for key in ("avoid_until_ms", "expires_ms"):
        if not _is_int(entry.get(key)):
            return f"{where}.{key} is not an integer"
    return None


def avoidance_problem(doc: Any) -> str | None:
    """Why a published document cannot be served (the fields serve reads), or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if not isinstance(doc.get("cluster"), str) or not doc["cluster"]:
        return "cluster is not a non-empty string"
    for key in ("decided_ms", "expires_ms"):
        if not _is_int(doc.get(key)):
            return f"{key} is not an integer"
    for key in ("avoid", "keep_available"):
        entries = doc.get(key, [])
        if not isinstance(entries, list):
            return f"{key} is not a list"
        for i, entry in enumerate(entries):
            problem = _entry_problem(f"{key}[{i}]", entry)
            if problem:
                return problem
    return None


def read_avoidance_files(publish_dir: str) -> AvoidanceFiles:
    """Every published list that reads and has the expected shape; each other file is named in ``bad``."""
    folder = Path(publish_dir)
    if not folder.is_dir():
        return AvoidanceFiles({}, {}, {}, "no avoidance list published yet")
    out = AvoidanceFiles({}, {}, {})
    for path in sorted(folder.glob("*.json")):
        try:
            data = path.read_bytes()
            doc = orjson.loads(data)
        except OSError as exc:
            out.bad[path.name] = f"cannot be read: {exc.strerror or type(exc).__name__}"
            continue
        except orjson.JSONDecodeError as exc:
            out.bad[path.name] = f"not JSON: {exc}"
            continue
        problem = avoidance_problem(doc)
        if problem:
            out.bad[path.name] = problem
        elif doc["cluster"] in out.docs:
            out.bad[path.name] = f"a second list for cluster {doc['cluster']!r}"
        else:
            out.raw[doc["cluster"]], out.docs[doc["cluster"]] = data, doc
    return out


@dataclass(frozen=True)
class Snapshot:
    """One refresh's state, its /metrics body and the published files' bytes."""

    state: ServeState
    metrics: bytes
    avoidance_raw: Mapping[str, bytes]
    refresh: RefreshStats


class _HasHealth(Protocol):
    @property
    def state(self) -> ServeState: ...

    @property
    def refresh(self) -> RefreshStats: ...


def health(snapshot: _HasHealth | None, cfg: Config, now_ms: int) -> tuple[int, list[str]]:
    """/healthz: 200 and no reasons, or 503 and every reason it is not healthy."""
    if snapshot is None:
        return 503, ["no refresh of the tables has finished yet"]
    s = cfg.serve
    reasons = [snapshot.state.table_errors[t] for t in dict.fromkeys((*REQUIRED_TABLES, *s.fresh_tables))
               if t in snapshot.state.table_errors]  # each table once, though required and fresh
    reasons += [f"avoidance file {name}: {why}" for name, why in sorted(snapshot.state.avoidance_bad.items())]
    stale_after_ms = int((3 * s.refresh_interval_s + 30) * 1000)
    if now_ms - snapshot.refresh.finished_ms > stale_after_ms:
        reasons.append(f"last refresh finished {(now_ms - snapshot.refresh.finished_ms) / 1000:.0f} s ago")
    for table in s.fresh_tables:
        newest = snapshot.state.newest_ms.get(table)
        if table in snapshot.state.table_errors:
            continue
        if newest is None:
            reasons.append(f"table {table} has no rows yet")
        elif now_ms - newest > s.max_data_age_s * 1000:
            reasons.append(
                f"table {table}: newest event is {(now_ms - newest) / 1000:.0f} s old (limit {s.max_data_age_s:g} s)"
            )
    return (503 if reasons else 200), reasons


class Refresher:
    """Builds snapshots; the followers it keeps make each refresh read only new files."""

    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.followers = {name: TableFollower(cfg.storage.root, name, fold) for name, fold in table_folds().items()}
        self.snapshot: Snapshot | None = None
        self.ok_total = 0
        self.error_total = 0

    def refresh_once(self) -> Snapshot:
        started = time.monotonic()
        for follower in self.followers.values():
            follower.refresh()
        files = read_avoidance_files(self.cfg.storage.publish_dir)
        errors = {name: f.error for name, f in self.followers.items() if f.error}
        views = Views(
            group_status=self.followers["group_status"].view,
            queue_lag=self.followers["queue_lag"].view,
            episodes=self.followers["broker_fault_episodes_live"].view,
            broker_health=self.followers["broker_health"].view,
            publisher_cycles=self.followers["publisher_cycles"].view,
            quarantine=self.followers["quarantine"].view,
            newest_ms={name: _newest(name, f.view) for name, f in self.followers.items()},
            errors=errors,
            avoidance=files.docs,
            avoidance_error=files.missing,
            avoidance_bad=files.bad,
        )
        now_ms = int(self.clock() * 1000)
        state = build_state(views, now_ms, int(self.cfg.serve.forget_after_s * 1000))
        if any(t in errors for t in REQUIRED_TABLES):
            self.error_total += 1
        else:
            self.ok_total += 1
        stats = RefreshStats(time.monotonic() - started, int(self.clock() * 1000), self.ok_total, self.error_total)
        metrics = render_metrics(state, stats, self.cfg.serve.max_queue_series)
        snapshot = Snapshot(state, metrics, files.raw, stats)
        self.snapshot = snapshot
        return snapshot
