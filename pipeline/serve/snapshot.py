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


def read_avoidance_files(publish_dir: str) -> tuple[dict[str, bytes], dict[str, Any], str | None]:
    """Raw bytes and parsed documents of the published lists, by cluster, and a problem if any."""
    folder = Path(publish_dir)
    if not folder.is_dir():
        return {}, {}, f"no avoidance list published yet: {folder} does not exist"
    raw: dict[str, bytes] = {}
    docs: dict[str, Any] = {}
    problems = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = path.read_bytes()
            doc = orjson.loads(data)
            raw[doc["cluster"]], docs[doc["cluster"]] = data, doc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{path.name}: {type(exc).__name__}: {exc}")
    return raw, docs, ("unreadable avoidance files: " + "; ".join(problems)) if problems else None


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
    reasons = [snapshot.state.table_errors[t] for t in (*REQUIRED_TABLES, *s.fresh_tables)
               if t in snapshot.state.table_errors]
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
        raw, docs, avoidance_error = read_avoidance_files(self.cfg.storage.publish_dir)
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
            avoidance=docs,
            avoidance_error=avoidance_error,
        )
        now_ms = int(self.clock() * 1000)
        state = build_state(views, now_ms, int(self.cfg.serve.forget_after_s * 1000))
        if any(t in errors for t in REQUIRED_TABLES):
            self.error_total += 1
        else:
            self.ok_total += 1
        stats = RefreshStats(time.monotonic() - started, int(self.clock() * 1000), self.ok_total, self.error_total)
        metrics = render_metrics(state, stats, self.cfg.serve.max_queue_series)
        snapshot = Snapshot(state, metrics, raw, stats)
        self.snapshot = snapshot
        return snapshot
