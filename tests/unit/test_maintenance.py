"""Table upkeep on real Delta tables written by the sink: compaction keeps every row and every
transaction, VACUUM deletes orphans only after the retention and never a file the log holds, and
the schedule runs one step per micro-batch."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pipeline.config import MaintenanceConfig
from pipeline.deltaio import read_table
from pipeline.maintenance import Maintainer, compact, vacuum
from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_sink import RoutedDeltaWriter, ensure_tables, write_table_files

NAME = "broker_health"
APP = "test:upkeep"
CFG = MaintenanceConfig(compact_every_batches=3, vacuum_interval_s=100.0, vacuum_retention_h=24, log_retention_h=48)
DAY_S = 86_400


def _rows(batch: int, n: int = 2) -> pa.RecordBatch:
    schema = table(NAME).arrow_schema()
    cols = {f.name: pa.array([batch * 10 + i for i in range(n)]).cast(f.type) for f in schema
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    cols |= {"cluster": pa.array(["c1"] * n), "broker_name": pa.array([f"b{i}" for i in range(n)]),
             "failures_by_error": pa.array([[]] * n, pa.map_(pa.string(), pa.int64())),
             "event_date": pa.array(["2026-11-27" if batch % 2 else "2026-11-28"] * n), ROUTE_COLUMN: pa.array([NAME] * n)}
    return pa.RecordBatch.from_pydict(cols)


def _commit(sink: RoutedDeltaWriter, batch: int) -> None:
    sink.commit([sink.write(iter([_rows(batch)]), batch)], batch)


def _sorted(t: pa.Table) -> list[dict[str, object]]:
    return sorted(t.to_pylist(), key=lambda r: (r["event_date"], r["minute_ms"], r["broker_name"]))


def _parquet(root: Path) -> set[str]:
    return {str(p.relative_to(root / NAME)) for p in (root / NAME).rglob("*.parquet") if "_delta_log" not in p.parts}


def _live(uri: str) -> set[str]:
    """The data files the table's current version holds."""
    return set(pa.table(DeltaTable(uri).get_add_actions()).column("path").to_pylist())


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_compaction_leaves_fewer_files_the_same_rows_and_every_transaction(tmp_path: Path) -> None:
    ensure_tables(str(tmp_path), [NAME])
    sink = RoutedDeltaWriter(str(tmp_path), [NAME], APP)
    for batch in range(12):
        _commit(sink, batch)
    uri = str(tmp_path / NAME)
    before = _sorted(read_table(str(tmp_path), NAME))
    assert len(_live(uri)) == 12
    DeltaTable(uri).create_checkpoint()  # the log as it was three days ago: commits 0-12, a checkpoint at 12
    for log_file in (tmp_path / NAME / "_delta_log").glob("0*"):
        _age(log_file, 3 * DAY_S)

    done = compact(uri, CFG)
    assert (done.files_removed, done.files_added, done.error) == (12, 2, None)  # one file per day
    dt = DeltaTable(uri)
    assert len(_live(uri)) == 2 and _sorted(read_table(str(tmp_path), NAME)) == before
    last = json.loads((tmp_path / NAME / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == dt.version()
    left = sorted(int(p.name[:20]) for p in (tmp_path / NAME / "_delta_log").glob("*.json"))
    assert left == [12, 13, 14]  # commits before the expired checkpoint are gone: it holds their state
    fresh = DeltaTable(uri)
    assert fresh.transaction_version(APP) == 11
    _commit(RoutedDeltaWriter(str(tmp_path), [NAME], APP), 11)  # a replay after compaction: still skipped
    assert _sorted(read_table(str(tmp_path), NAME)) == before


def test_vacuum_deletes_orphans_after_the_retention_and_never_a_file_the_log_holds(tmp_path: Path) -> None:
    ensure_tables(str(tmp_path), [NAME])
    sink = RoutedDeltaWriter(str(tmp_path), [NAME], APP)
    for batch in range(4):
        _commit(sink, batch)
    uri = str(tmp_path / NAME)
    old_orphan = sink.write(iter([_rows(90)]), 90).files[0].path  # a failed batch's file, never committed
    young_orphan = sink.write(iter([_rows(91)]), 91).files[0].path
    _age(tmp_path / NAME / old_orphan, 2 * DAY_S)
    for path in _parquet(tmp_path) - {young_orphan}:  # everything else is old as well
        _age(tmp_path / NAME / path, 2 * DAY_S)
    committed = _parquet(tmp_path) - {old_orphan, young_orphan}
    compact(uri, CFG)  # the four committed files are now compacted away: removed from the log just now
    live = _live(uri)
    rows = _sorted(read_table(str(tmp_path), NAME))

    done = vacuum(uri, CFG)
    assert (done.files_removed, done.error) == (1, None)
    assert _parquet(tmp_path) == committed | live | {young_orphan}  # removed only 24 h after their removal
    assert all((tmp_path / NAME / f).exists() for f in _live(uri))
    assert _sorted(read_table(str(tmp_path), NAME)) == rows


def test_a_file_kept_for_a_replayed_batch_survives_vacuum_until_committed(tmp_path: Path) -> None:
    """A Kafka reader keeps the file a killed attempt wrote for the same offsets: it is stamped anew,
    so a vacuum between the reader and the commit does not take it for an old orphan."""
    ensure_tables(str(tmp_path), [NAME])
    rows = pa.Table.from_batches([_rows(5)]).drop_columns([ROUTE_COLUMN])
    first = write_table_files(str(tmp_path), NAME, rows, lambda i: f"part-reader-{i}", keep_existing=True)
    _age(tmp_path / NAME / first[0].path, 2 * DAY_S)  # the attempt before a long outage
    again = write_table_files(str(tmp_path), NAME, rows, lambda i: f"part-reader-{i}", keep_existing=True)
    assert again == first
    vacuum(str(tmp_path / NAME), CFG)
    assert _parquet(tmp_path) == {first[0].path}


def test_the_schedule_runs_one_step_per_batch_and_survives_a_restart(tmp_path: Path) -> None:
    ensure_tables(str(tmp_path), [NAME, "quarantine"])
    now = [1_000.0]
    state = str(tmp_path / "checkpoint" / "faultwatch-maintenance.json")
    keeper = Maintainer(str(tmp_path), [NAME, "quarantine"], CFG, state, clock=lambda: now[0])
    assert DeltaTable(str(tmp_path / NAME)).metadata().configuration == {
        "delta.logRetentionDuration": "interval 48 hours", "delta.deletedFileRetentionDuration": "interval 24 hours"}
    sink = RoutedDeltaWriter(str(tmp_path), [NAME, "quarantine"], APP, str(tmp_path / "report"), maintainer=keeper)
    steps = []
    for batch in range(4):
        _commit(sink, batch)
        steps.append(json.loads((tmp_path / "report" / f"{batch}.json").read_text()).get("_maintenance"))
    assert steps == [None, None, "compact broker_health 2->1 files " + steps[2].split()[-1], None]
    now[0] += 100.0  # both tables are due for a vacuum: one step per batch, compaction first
    again = Maintainer(str(tmp_path), [NAME, "quarantine"], CFG, state, clock=lambda: now[0])  # a restart
    assert again.schedule[NAME].batches == 1
    assert [(r.step, r.table) for r in (again.after_batch([NAME]), again.after_batch([NAME]), again.after_batch([NAME]))
            ] == [("vacuum", NAME), ("compact", NAME), ("vacuum", "quarantine")]
    assert again.after_batch([]) is None


def test_faultwatch_maintain_compacts_and_vacuums_every_table_once(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from faultwatch.cli import main

    root = tmp_path / "tables"
    ensure_tables(str(root), [NAME])
    sink = RoutedDeltaWriter(str(root), [NAME], APP)
    for batch in range(6):
        _commit(sink, batch)
    orphan = sink.write(iter([_rows(90)]), 90).files[0].path
    _age(root / NAME / orphan, 2 * DAY_S)
    rows = _sorted(read_table(str(root), NAME))
    conf = tmp_path / "faultwatch.toml"
    conf.write_text(f'[storage]\nroot = "{root}"\n[maintenance]\nvacuum_retention_h = 24\n')

    assert main(["maintain", "--config", str(conf)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.rsplit(" ", 1)[0] for line in out] == [f"compact {NAME} 6->2 files", f"vacuum {NAME} 1 files deleted"]
    assert len(_live(str(root / NAME))) == 2 and _sorted(read_table(str(root), NAME)) == rows
    assert orphan not in _parquet(root)
    assert main(["maintain", "--config", str(conf), "--table", "no_such_table"]) == 2


def test_a_failed_step_is_reported_and_the_batch_stands(tmp_path: Path) -> None:
    """Upkeep never fails a micro-batch: a step that fails (here: a table whose log is unreadable)
    is named with its error in the batch report, and the batch's commits are kept."""
    ensure_tables(str(tmp_path), [NAME, "quarantine"])
    keeper = Maintainer(str(tmp_path), [NAME, "quarantine"], CFG, clock=lambda: 0.0)
    sink = RoutedDeltaWriter(str(tmp_path), [NAME, "quarantine"], APP, str(tmp_path / "report"), maintainer=keeper)
    (tmp_path / "quarantine" / "_delta_log" / f"{0:020d}.json").write_text("not json\n")
    keeper.schedule["quarantine"].batches = CFG.compact_every_batches
    _commit(sink, 0)
    report = json.loads((tmp_path / "report" / "0.json").read_text())
    assert report[NAME] == 2 and report["_maintenance"].startswith("compact quarantine failed after ")
    assert DeltaTable(str(tmp_path / NAME)).transaction_version(APP) == 0


def test_a_retention_under_an_hour_is_kept_in_seconds_and_vacuum_goes_by_it(tmp_path: Path) -> None:
    """deltalake's vacuum takes whole hours: a retention of a quarter hour (a soak's, to see files on
    disk level off within its run) is written to the table as seconds and vacuum goes by that."""
    from pipeline.config import load_config

    conf = tmp_path / "faultwatch.toml"
    conf.write_text(f'[storage]\nroot = "{tmp_path}"\n[maintenance]\nvacuum_retention_h = 0.25\nlog_retention_h = 0.5\n')
    cfg = load_config(conf).maintenance
    ensure_tables(str(tmp_path), [NAME])
    sink = RoutedDeltaWriter(str(tmp_path), [NAME], APP)
    _commit(sink, 0)
    old, young = (sink.write(iter([_rows(b)]), b).files[0].path for b in (90, 91))
    _age(tmp_path / NAME / old, 20 * 60)
    _age(tmp_path / NAME / young, 10 * 60)
    before = _parquet(tmp_path)

    result = vacuum(str(tmp_path / NAME), cfg)
    assert DeltaTable(str(tmp_path / NAME)).metadata().configuration == {
        "delta.logRetentionDuration": "interval 1800 seconds", "delta.deletedFileRetentionDuration": "interval 900 seconds"}
    assert (result.files_removed, _parquet(tmp_path)) == (1, before - {old})


HOUR_MS = 3_600_000
T0 = 1_795_780_800_000  # 2026-11-27 08:00 UTC


def _health(minutes: list[int]) -> pa.RecordBatch:
    """broker_health rows at ``T0 + m`` minutes, each partition value the UTC date of its minute."""
    from schemas.tables import utc_date

    schema = table(NAME).arrow_schema()
    n = len(minutes)
    cols = {f.name: pa.array([7] * n).cast(f.type) for f in schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    stamps = [T0 + m * 60_000 for m in minutes]
    cols |= {"minute_ms": pa.array(stamps, pa.int64()), "cluster": pa.array(["c1"] * n),
             "broker_name": pa.array([f"b{m}" for m in minutes]),
             "failures_by_error": pa.array([[]] * n, pa.map_(pa.string(), pa.int64())),
             "event_date": pa.array([utc_date(t) for t in stamps]), ROUTE_COLUMN: pa.array([NAME] * n)}
    return pa.RecordBatch.from_pydict(cols)


def test_vacuum_first_deletes_rows_past_the_data_retention_behind_the_newest_row(tmp_path: Path) -> None:
    """Rows 2 h or more behind the table's newest row go (event time, not the clock: these rows are
    a year old and most stay); a file wholly past the cutoff is dropped, one across it rewritten, and
    every row within the retention is kept as it was. The step says how many rows it deleted."""
    from dataclasses import replace

    ensure_tables(str(tmp_path), [NAME])
    sink = RoutedDeltaWriter(str(tmp_path), [NAME], APP)
    batches = [[0, 30, 60], [90, 119, 120, 150], [600, 900], [17 * 60, 17 * 60 + 30]]  # the last crosses midnight
    for batch, minutes in enumerate(batches):
        sink.commit([sink.write(iter([_health(minutes)]), batch)], batch)
    uri = str(tmp_path / NAME)
    every = _sorted(read_table(str(tmp_path), NAME))
    newest = T0 + (17 * 60 + 30) * 60_000

    assert vacuum(uri, replace(CFG, data_retention_h=0)).rows_expired == 0  # 0 keeps every row
    assert _sorted(read_table(str(tmp_path), NAME)) == every
    result = vacuum(uri, replace(CFG, data_retention_h=15.5))
    kept = [r for r in every if r["minute_ms"] >= newest - 15.5 * HOUR_MS]
    assert [r["broker_name"] for r in kept] == ["b120", "b150", "b600", "b900", "b1020", "b1050"]
    assert (result.rows_expired, result.error) == (5, None)
    assert _sorted(read_table(str(tmp_path), NAME)) == kept
    assert result.describe().startswith(f"vacuum {NAME} 0 files deleted (5 rows past retention deleted) ")
    assert vacuum(uri, replace(CFG, data_retention_h=15.5)).rows_expired == 0  # nothing left to expire: no commit
    assert DeltaTable(uri).transaction_version(APP) == 3  # the job's exactly-once marks stay


def test_a_table_without_a_date_partition_and_files_without_statistics_expire_too(tmp_path: Path) -> None:
    """broker_fault_episodes has no event_date: its predicate is the time column alone. Files written
    without statistics (another writer) are told by reading the column."""
    from dataclasses import replace

    from deltalake import write_deltalake

    from pipeline.maintenance import expire

    name = "broker_fault_episodes"
    spec = table(name)
    filler = {"string": "x", "bool": False}
    rows = {f.name: pa.array([filler.get(str(f.type), 0)] * 3, f.type) for f in spec.arrow_schema()}
    rows |= {"episode_id": pa.array(["e1", "e2", "e3"]), "updated_ms": pa.array([T0, T0 + HOUR_MS, T0 + 3 * HOUR_MS])}
    uri = str(tmp_path / name)
    write_deltalake(uri, pa.table(rows, schema=spec.arrow_schema()),
                    configuration={"delta.dataSkippingNumIndexedCols": "0"})
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    assert "max.updated_ms" not in actions.schema.names or actions.column("max.updated_ms").null_count == 1
    assert expire(uri, replace(CFG, data_retention_h=1.5)) == 2
    assert DeltaTable(uri).to_pyarrow_table().column("episode_id").to_pylist() == ["e3"]


def test_a_row_stamped_in_the_future_expires_nothing_before_the_clock_says_so(tmp_path: Path) -> None:
    """A Kafka record's timestamp is its producer's: a quarantined row stamped a year ahead must not
    make every other quarantine row look a year old. The cutoff counts from the clock at most."""
    from dataclasses import replace

    from deltalake import write_deltalake

    from pipeline.maintenance import expire

    spec = table("quarantine")
    now = int(time.time() * 1000)
    stamps = [now - 3 * HOUR_MS, now - 10 * 60_000, now + 365 * 24 * HOUR_MS]
    filler = {"string": "x", "binary": b"x"}
    rows = {f.name: pa.array([filler.get(str(f.type), 0)] * 3, f.type) for f in spec.arrow_schema()}
    rows |= {"kafka_ts_ms": pa.array(stamps, pa.int64()), "detail": pa.array(["old", "recent", "future"])}
    uri = str(tmp_path / "quarantine")
    write_deltalake(uri, pa.table(rows, schema=spec.arrow_schema()))
    assert expire(uri, replace(CFG, data_retention_h=1)) == 1
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("detail").to_pylist()) == ["future", "recent"]


def test_the_publishers_tables_are_maintained_after_its_cycles(tmp_path: Path) -> None:
    """Each cycle commits to publisher_cycles and reads it back: after publisher_compact_every_cycles
    cycles (not the job's compact_every_batches) the publisher compacts it, then vacuums it with the
    data retention (by decided_ms); its schedule lives under checkpoint_root. A cycle with nothing to
    maintain does nothing."""
    from pipeline.config import Config
    from pipeline.maintenance import publisher_upkeep
    from pipeline.publish.sinks import append_rows

    cfg = Config().replace(storage__root=str(tmp_path / "tables"), storage__checkpoint_root=str(tmp_path / "ck"),
                           maintenance__compact_every_batches=100, maintenance__publisher_compact_every_cycles=3,
                           maintenance__data_retention_h=1.0,
                           maintenance__vacuum_retention_h=24.0, maintenance__vacuum_interval_s=3600.0)
    assert publisher_upkeep(cfg) is None  # no table yet
    now = int(time.time() * 1000)

    def cycle(i: int) -> None:
        append_rows(cfg.storage.root, "publisher_cycles", [{
            "cycle_id": str(i), "cycle_number": i, "step": "avoidance", "status": "rejected",
            "decided_ms": now - (6 - i) * HOUR_MS, "clusters": 1, "avoided": 0, "kept_available": 0,
            "failed_checks": ["x"], "alerts": 0, "policy_version": "v1"}])

    steps = []
    for i in range(6):
        cycle(i)
        steps.append(publisher_upkeep(cfg))
    uri = str(tmp_path / "tables" / "publisher_cycles")
    assert [s.step if s else None for s in steps] == [None, None, "compact", None, None, "compact"]
    assert len(_live(uri)) == 1
    schedule = json.loads((tmp_path / "ck" / "publisher" / "faultwatch-maintenance.json").read_text())
    assert schedule["publisher_cycles"]["batches"] == 0
    schedule["publisher_cycles"]["vacuumed_at"] = 0.0  # an hour later: the vacuum is due
    (tmp_path / "ck" / "publisher" / "faultwatch-maintenance.json").write_text(json.dumps(schedule))
    cycle(6)
    done = publisher_upkeep(cfg)
    assert done is not None and (done.step, done.rows_expired) == ("vacuum", 5)  # decided over an hour before the newest
    kept = read_table(cfg.storage.root, "publisher_cycles").column("cycle_id").to_pylist()
    assert sorted(kept) == ["5", "6"]
