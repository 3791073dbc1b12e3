"""Upkeep of the Delta tables: compaction, log checkpoints, expired log files and VACUUM.

The streaming job commits to each table in every micro-batch: many small files and a long log.
:class:`Maintainer` runs after a micro-batch's commits, in the same thread (so it never races
the job's own commits), and runs at most one table's step per micro-batch, so a batch carries at
most one step's cost: a table is compacted (then checkpointed, expired commit files deleted)
after ``compact_every_batches`` micro-batches that wrote to it, and vacuumed every
``vacuum_interval_s`` (when both are due, the two kinds take turns); before a vacuum, rows older
than ``data_retention_h`` behind the table's newest row are deleted, so a table's bytes stop
growing. Its schedule is kept in a small JSON file beside the query's checkpoint, so a restarted
job does not start counting again. :func:`maintain_all` runs every step on every
table once (``faultwatch maintain``).

Safe with the job's exactly-once writes: compaction removes and adds files without changing data
(``dataChange`` false), and the log keeps every transaction (app id, batch id) through checkpoints;
VACUUM deletes only files no version within the retention references, so the orphans of failed
or replayed micro-batches go once they are older than the retention, and a file written for a
batch not yet committed is younger than that (a reused one is stamped anew when kept).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipeline import objstore
from pipeline.config import Config, MaintenanceConfig

log = logging.getLogger(__name__)

__all__ = ["Maintainer", "StepResult", "compact", "ensure_properties", "expire", "maintain_all", "publisher_upkeep",
           "vacuum"]

STEP_METADATA = "faultwatch.maintenance"
# The tables the publisher writes (a commit or two per cycle, every cycle), and where their
# schedule is kept: under checkpoint_root, as the job keeps its own beside its checkpoint.
PUBLISHER_TABLES = ("publisher_cycles", "avoidance_recommendations", "alert_state")
PUBLISHER_SCHEDULE = ("publisher", "faultwatch-maintenance.json")


@dataclass(frozen=True)
class StepResult:
    step: str  # "compact" (with checkpoint and log clean-up) or "vacuum"
    table: str
    seconds: float
    files_removed: int = 0  # compact: small files replaced; vacuum: files deleted
    files_added: int = 0
    error: str | None = None
    rows_expired: int = 0  # vacuum: rows past maintenance.data_retention_h deleted before it

    def describe(self) -> str:
        if self.error:
            return f"{self.step} {self.table} failed after {self.seconds:.2f}s: {self.error}"
        if self.step == "compact":
            return f"compact {self.table} {self.files_removed}->{self.files_added} files {self.seconds:.2f}s"
        expired = f" ({self.rows_expired} rows past retention deleted)" if self.rows_expired else ""
        return f"vacuum {self.table} {self.files_removed} files deleted{expired} {self.seconds:.2f}s"


def table_properties(cfg: MaintenanceConfig) -> dict[str, str]:
    """The retention settings a table keeps in its own metadata, for every engine that reads it."""
    return {
        "delta.logRetentionDuration": interval(cfg.log_retention_h),
        "delta.deletedFileRetentionDuration": interval(cfg.vacuum_retention_h),
    }


def interval(hours: float) -> str:
    """A retention as Delta's table properties spell it: whole hours, or else whole seconds."""
    if float(hours).is_integer():
        return f"interval {int(hours)} hours"
    return f"interval {max(1, round(hours * 3600))} seconds"


def ensure_properties(uri: str, cfg: MaintenanceConfig, dt: Any = None) -> None:
    """Set the retention properties on a table that does not hold them yet (a commit only then)."""
    from deltalake import DeltaTable

    dt = dt if dt is not None else DeltaTable(uri, storage_options=objstore.storage_options(uri))
    wanted = table_properties(cfg)
    held = dt.metadata().configuration
    if any(held.get(k) != v for k, v in wanted.items()):
        dt.alter.set_table_properties(wanted, raise_if_not_exists=False)


def compact(uri: str, cfg: MaintenanceConfig, tasks: int = 1) -> StepResult:
    """Bin-pack the table's small files, then checkpoint its log and delete expired commit files."""
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

    began = time.perf_counter()
    dt = DeltaTable(uri, storage_options=objstore.storage_options(uri))
    ensure_properties(uri, cfg, dt)  # the log retention the clean-up below goes by
    metrics = dt.optimize.compact(
        target_size=cfg.target_file_mb << 20, max_concurrent_tasks=tasks,
        commit_properties=CommitProperties(custom_metadata={STEP_METADATA: "compact"}),
    )
    dt.create_checkpoint()
    dt.cleanup_metadata()
    return StepResult("compact", _name(uri), time.perf_counter() - began,
                      int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0)))


def expire(uri: str, cfg: MaintenanceConfig, dt: Any = None) -> int:
    """Delete the rows ``cfg.data_retention_h`` or more behind the table's newest row; return how many.

    Age is event time, by the table's ``time_column``, and counts from the newest row (or the wall
    clock, if that is earlier) rather than from the clock: a job catching up on a backlog, or
    replaying one, keeps what it just wrote, a long outage deletes nothing, and a row stamped in the
    future (a Kafka timestamp is the producer's) cannot take the others with it. Files whose
    statistics put them wholly past the cutoff go without being read; the few that straddle it are
    rewritten. Tables without a time column, and
    ``data_retention_h = 0``, keep every row.
    """
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

    from schemas.tables import all_tables, utc_date

    spec = all_tables().get(_name(uri))
    if not cfg.data_retention_h or spec is None or spec.time_column is None:
        return 0
    dt = dt if dt is not None else DeltaTable(uri, storage_options=objstore.storage_options(uri))
    column = spec.time_column
    bounds = _time_bounds(dt, column)
    if bounds is None:
        return 0
    oldest, newest = bounds
    newest = min(newest, int(time.time() * 1000))  # a row stamped ahead of the clock moves no cutoff
    cutoff = newest - round(cfg.data_retention_h * 3_600_000)
    if oldest >= cutoff:
        return 0
    predicate = f"{column} < {cutoff}"
    if spec.partition_by == ("event_date",):  # the date is the time column's: whole days prune first
        predicate = f"event_date <= '{utc_date(cutoff)}' AND {predicate}"
    metrics = dt.delete(predicate, commit_properties=CommitProperties(custom_metadata={STEP_METADATA: "expire"}))
    return int(metrics.get("num_deleted_rows", 0))


def _time_bounds(dt: Any, column: str) -> tuple[int, int] | None:
    """(oldest, newest) of ``column`` over the table's live files: from their statistics, or by
    reading the column where a file has none. None for an empty table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return None
    names = actions.schema.names
    lows = actions.column(f"min.{column}") if f"min.{column}" in names else None
    highs = actions.column(f"max.{column}") if f"max.{column}" in names else None
    if lows is None or highs is None or lows.null_count or highs.null_count:
        values = dt.to_pyarrow_dataset().to_table(columns=[column]).column(column)
        low, high = pc.min(values).as_py(), pc.max(values).as_py()
    else:
        low, high = pc.min(lows).as_py(), pc.max(highs).as_py()
    return None if low is None or high is None else (int(low), int(high))


def vacuum(uri: str, cfg: MaintenanceConfig) -> StepResult:
    """Delete expired rows (:func:`expire`), then the files no version within the retention
    references (``full``: orphans too)."""
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

    began = time.perf_counter()
    dt = DeltaTable(uri, storage_options=objstore.storage_options(uri))
    expired = expire(uri, cfg, dt)
    hours: int | None = int(cfg.vacuum_retention_h)
    if not float(cfg.vacuum_retention_h).is_integer():  # deltalake takes whole hours, or the table's property
        ensure_properties(uri, cfg, dt)
        hours = None
    deleted = dt.vacuum(
        retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True,
        commit_properties=CommitProperties(custom_metadata={STEP_METADATA: "vacuum"}),
    )
    return StepResult("vacuum", _name(uri), time.perf_counter() - began, len(deleted), rows_expired=expired)


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if objstore.is_remote(uri) else Path(uri).name


STEPS: dict[str, Callable[[str, MaintenanceConfig], StepResult]] = {"compact": compact, "vacuum": vacuum}


def maintain_all(root: str, tables: Sequence[str], cfg: MaintenanceConfig) -> list[StepResult]:
    """Every step on every table once (``faultwatch maintain``); a failure is reported, not raised."""
    out = []
    for name in tables:
        uri = objstore.join(root, name)
        ensure_properties(uri, cfg)
        for step in STEPS:
            out.append(_run(step, uri, cfg))
    return out


def _run(step: str, uri: str, cfg: MaintenanceConfig) -> StepResult:
    began = time.perf_counter()
    try:
        return STEPS[step](uri, cfg)
    except Exception as exc:  # upkeep must not stop the job: said in the log and the progress line
        log.warning("maintenance: %s of %s failed", step, uri, exc_info=True)
        return StepResult(step, _name(uri), time.perf_counter() - began, error=f"{type(exc).__name__}: {exc}")


@dataclass
class _TableSchedule:
    batches: int = 0  # micro-batches that wrote to the table since its last compaction
    vacuumed_at: float = 0.0  # wall clock (s) of its last vacuum, or of when it was first seen


class Maintainer:
    """The schedule of one query's tables, advanced after each micro-batch's commits."""

    def __init__(self, root: str, tables: Sequence[str], cfg: MaintenanceConfig, state_path: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.tables = list(tables)
        self.cfg = cfg
        self.state_path = state_path
        self.clock = clock
        self.schedule = self._load()
        self.last_step: str | None = None
        for name in self.tables:
            ensure_properties(objstore.join(root, name), cfg)

    def _load(self) -> dict[str, _TableSchedule]:
        held: dict[str, Any] = {}
        if self.state_path is not None and objstore.exists(self.state_path):
            held = json.loads(objstore.read_text(self.state_path))
        now = self.clock()
        return {name: _TableSchedule(**held[name]) if name in held else _TableSchedule(0, now) for name in self.tables}

    def _save(self) -> None:
        if self.state_path is None:
            return
        objstore.write_text(self.state_path, json.dumps({name: asdict(s) for name, s in self.schedule.items()}))

    def due(self) -> tuple[str, str] | None:
        """(step, table) to run now, or None: the table most overdue for its step; when both a
        compaction and a vacuum are due, the kind that did not run last (neither starves)."""
        now = self.clock()
        # (how overdue, table): the most written-to since its compaction, the longest unvacuumed
        full: list[tuple[float, str]] = [(-s.batches, n) for n, s in self.schedule.items() if s.batches >= self.cfg.compact_every_batches]
        stale: list[tuple[float, str]] = [(s.vacuumed_at, n) for n, s in self.schedule.items()
                 if now - s.vacuumed_at >= self.cfg.vacuum_interval_s]
        kinds = {"compact": full, "vacuum": stale}
        ready = [kind for kind, tables in kinds.items() if tables]
        if not ready:
            return None
        kind = next((k for k in ready if k != self.last_step), ready[0])
        return kind, min(kinds[kind])[1]

    def after_batch(self, committed: Iterable[str]) -> StepResult | None:
        """Count a micro-batch's commits, then run the one step most due (if any)."""
        for name in committed:
            if name in self.schedule:
                self.schedule[name].batches += 1
        due = self.due()
        result = None
        if due is not None:
            step, name = due
            result = _run(step, objstore.join(self.root, name), self.cfg)
            self.last_step = step
            if step == "compact":
                self.schedule[name].batches = 0
            else:
                self.schedule[name].vacuumed_at = self.clock()
            log.info("maintenance: %s", result.describe())
        self._save()
        return result


def publisher_upkeep(cfg: Config) -> StepResult | None:
    """The publisher's tables after one of its cycles (one step at most), compacted on a cadence of their own.

    Each cycle commits to ``publisher_cycles`` (and to the others when it publishes or alerts), and
    every cycle reads them back several times: each small file and commit since the last compaction
    makes every cycle slower (unmaintained, a week of cycles is ~10,000 of them). So a table is
    compacted after ``publisher_compact_every_cycles`` cycles; vacuum and data retention go by the
    job's settings. Never raises: upkeep must not fail a cycle.
    """
    if not cfg.maintenance.enabled:
        return None
    try:
        from pipeline.deltaio import table_exists

        tables = [t for t in PUBLISHER_TABLES if table_exists(cfg.storage.root, t)]
        if not tables:
            return None
        state = objstore.join(cfg.storage.checkpoint_root, *PUBLISHER_SCHEDULE)
        own = replace(cfg.maintenance, compact_every_batches=cfg.maintenance.publisher_compact_every_cycles)
        return Maintainer(cfg.storage.root, tables, own, state).after_batch(tables)
    except Exception:  # e.g. a table another publisher is creating: tried again next cycle
        log.warning("maintenance of the publisher's tables failed", exc_info=True)
        return None
