"""The Delta sink on real Delta tables: one commit per table and batch, replays skipped, and a failed
batch's files removed only where no table committed the batch."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_sink import (
    COUNTED,
    EVENTS_COLUMN,
    WRITTEN,
    RoutedCommit,
    RoutedDeltaWriter,
    ensure_tables,
    read_report,
    write_table_files,
)
from streaming.kafka_source import CHUNK_SCHEMA, to_chunks

TABLES = ["broker_health", "broker_fault_episodes"]


def _writer(root: Path, collect: bool = False) -> RoutedDeltaWriter:
    ensure_tables(str(root), TABLES)
    return RoutedDeltaWriter(str(root), TABLES, "test:sink", collect=collect)


def _rows(name: str, n: int) -> pa.RecordBatch:
    """``n`` rows routed to ``name``: nulls where allowed, zeros and "x" elsewhere."""
    schema = table(name).arrow_schema()
    cols = {f.name: pa.nulls(n, f.type) if f.nullable else _filled(f.type, n) for f in schema}
    cols[ROUTE_COLUMN] = pa.array([name] * n)
    return pa.RecordBatch.from_pydict(cols)


def _filled(kind: pa.DataType, n: int) -> pa.Array:
    if pa.types.is_string(kind):
        return pa.array(["x"] * n, kind)
    if pa.types.is_map(kind) or pa.types.is_list(kind):
        return pa.array([[]] * n, kind)
    if pa.types.is_boolean(kind):
        return pa.array([False] * n, kind)
    return pa.array([0] * n).cast(kind)


def _data_files(root: Path, name: str) -> set[str]:
    return {str(p.relative_to(root / name)) for p in (root / name).rglob("*.parquet")}


def test_commit_once_per_table_and_batch_replays_skipped(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    msg = w.write(iter([_rows("broker_health", 3), _rows("broker_fault_episodes", 2)]))
    w.commit([msg], 0)
    w.commit([msg], 0)  # a replayed batch: its transaction is already in both logs
    for name, n in (("broker_health", 3), ("broker_fault_episodes", 2)):
        dt = DeltaTable(str(tmp_path / name))
        assert dt.to_pyarrow_table().num_rows == n
        assert dt.transaction_version("test:sink") == 0


def test_a_loaded_table_sees_other_writers_and_a_table_made_anew(tmp_path: Path) -> None:
    """The sink keeps tables loaded between batches; what another writer committed meanwhile, and a
    table deleted and made again at the same path, must still decide what is a replay."""
    import shutil

    w = _writer(tmp_path)
    w.commit([w.write(iter([_rows("broker_health", 3)]))], 0)
    other = RoutedDeltaWriter(str(tmp_path), TABLES, "test:other")
    other.commit([other.write(iter([_rows("broker_health", 1)]))], 0)
    w.commit([w.write(iter([_rows("broker_health", 2)]))], 1)
    dt = DeltaTable(str(tmp_path / "broker_health"))
    assert dt.to_pyarrow_table().num_rows == 6
    assert (dt.transaction_version("test:sink"), dt.transaction_version("test:other")) == (1, 0)

    shutil.rmtree(tmp_path / "broker_health")  # made anew: batch 1 is no longer in its log ...
    ensure_tables(str(tmp_path), TABLES)
    for batch in range(3):  # ... and the new log reaches the versions the old one had
        other.commit([other.write(iter([_rows("broker_health", 1)]))], batch)
    w.commit([w.write(iter([_rows("broker_health", 4)]))], 1)
    dt = DeltaTable(str(tmp_path / "broker_health"))
    assert dt.to_pyarrow_table().num_rows == 7
    assert dt.transaction_version("test:sink") == 1


def test_abort_deletes_the_files_of_an_uncommitted_batch_only(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    committed = w.write(iter([_rows("broker_health", 3)]))
    w.commit([committed], 0)
    kept = _data_files(tmp_path, "broker_health")
    w.abort([committed], 0)  # the log holds batch 0: its files are live data
    assert _data_files(tmp_path, "broker_health") == kept
    failed = w.write(iter([_rows("broker_health", 4), _rows("broker_fault_episodes", 1)]))
    assert _data_files(tmp_path, "broker_health") != kept
    w.abort([failed, None], 1)
    assert _data_files(tmp_path, "broker_health") == kept
    assert _data_files(tmp_path, "broker_fault_episodes") == set()
    assert DeltaTable(str(tmp_path / "broker_health")).to_pyarrow_table().num_rows == 3


def test_discard_finds_a_failed_batchs_files_by_name(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.commit([w.write(iter([_rows("broker_health", 3)]), batch_id=0)], 0)
    kept = _data_files(tmp_path, "broker_health")
    other_query = RoutedDeltaWriter(str(tmp_path), TABLES, "test:other")
    other_query.write(iter([_rows("broker_health", 2)]), batch_id=1)  # not this query's files
    theirs = _data_files(tmp_path, "broker_health") - kept
    w.write(iter([_rows("broker_health", 4), _rows("broker_fault_episodes", 1)]), batch_id=1)
    w.write(iter([_rows("broker_health", 5)]), batch_id=1)  # a second task of the failed job
    w.discard(1)
    assert _data_files(tmp_path, "broker_health") == kept | theirs
    assert _data_files(tmp_path, "broker_fault_episodes") == set()
    w.discard(0)  # the log holds batch 0: its files are live data
    assert _data_files(tmp_path, "broker_health") == kept | theirs
    assert DeltaTable(str(tmp_path / "broker_health")).to_pyarrow_table().num_rows == 3


def test_a_task_message_survives_its_trip_to_the_driver(tmp_path: Path) -> None:
    msg = _writer(tmp_path).write(iter([_rows("broker_health", 3), _rows("broker_fault_episodes", 2)]))
    back = RoutedCommit.from_json(msg.to_json())
    assert back == msg
    assert sorted(f.num_records for f in back.files) == [2, 3]


def test_files_a_reader_wrote_are_committed_as_listed(tmp_path: Path) -> None:
    """``WRITTEN`` chunk rows carry files written elsewhere (the Kafka readers): the sink commits
    them without writing anything, counts the records the readers read, writes the other chunks
    itself, and refuses a listing for a table it does not write."""
    w = _writer(tmp_path)
    listed = write_table_files(str(tmp_path), "broker_health", pa.Table.from_batches([_rows("broker_health", 4)]),
                               lambda i: f"part-reader-{i}", keep_existing=True)
    assert [f.path.split("/")[-1] for f in listed] == ["part-reader-0.zstd.parquet"]
    listing = json.dumps([asdict(f) for f in listed]).encode()
    episodes = to_chunks(_rows("broker_fault_episodes", 2)).to_pylist()[0]
    chunks = pa.RecordBatch.from_pylist(
        [{ROUTE_COLUMN: WRITTEN, "rows": 9, "arrow": listing}, episodes], schema=to_chunks(_rows("broker_health", 1)).schema
    )
    msg = w.write(iter([chunks]), batch_id=0)
    assert msg.events_in == 9  # what the readers read, not the derived episode rows
    assert [f for f in msg.files if f.table == "broker_health"] == listed
    w.commit([msg], 0)
    assert DeltaTable(str(tmp_path / "broker_health")).to_pyarrow_table().num_rows == 4
    assert DeltaTable(str(tmp_path / "broker_fault_episodes")).to_pyarrow_table().num_rows == 2
    stray = json.dumps([{**asdict(listed[0]), "table": "quarantine"}]).encode()
    bad = pa.RecordBatch.from_pylist([{ROUTE_COLUMN: WRITTEN, "rows": 1, "arrow": stray}], schema=chunks.schema)
    with pytest.raises(ValueError, match="quarantine"):
        w.write(iter([bad]), batch_id=1)


def test_a_listing_query_reports_what_its_readers_read_and_nothing_more(tmp_path: Path) -> None:
    """The progress line's ``in``: a batch of a listing query (bronze, combined) that read nothing
    and only settled reports 0, not its derived rows; a counting query (``faults``) reports its
    ``COUNTED`` rows, not the few chunk rows Spark saw."""
    ensure_tables(str(tmp_path), TABLES)
    listing = RoutedDeltaWriter(str(tmp_path), TABLES, "test:listing", str(tmp_path / "report"), listed=True)
    settled = listing.write(iter([to_chunks(_rows("broker_fault_episodes", 2))]), batch_id=0)
    assert (settled.events_in, settled.listed) == (0, True)
    listing.commit([settled, RoutedCommit()], 0)  # the driver step's message beside it
    assert read_report(str(tmp_path / "report"), 0) == {"broker_fault_episodes": 2, "_events_in": 0}

    counting = RoutedDeltaWriter(str(tmp_path), TABLES, "test:counting", str(tmp_path / "counted"))
    count = pa.RecordBatch.from_pydict({ROUTE_COLUMN: [COUNTED, COUNTED], EVENTS_COLUMN: pa.array([700, 50], pa.int64())})
    tasks = [counting.write(iter([count, _rows("broker_health", 3)]), batch_id=0), counting.write(iter([]), batch_id=0)]
    assert [t.events_in for t in tasks] == [750, None]
    counting.commit(tasks, 0)
    assert read_report(str(tmp_path / "counted"), 0) == {"broker_health": 3, "_events_in": 750}


def _chunk(batch: pa.RecordBatch) -> tuple[str, int, bytes]:
    """One chunk row as the Kafka source emits it: (table, rows, Arrow IPC stream)."""
    row = to_chunks(batch).to_pylist()[0]
    return row[ROUTE_COLUMN], row["rows"], row["arrow"]


@pytest.mark.spark
@pytest.mark.parametrize("collect", [False, True], ids=["write-job", "collected"])
def test_batch_function_writes_commits_once_and_cleans_up_a_failed_batch(
    spark, tmp_path: Path, collect: bool  # type: ignore[no-untyped-def]
) -> None:
    """The same outcome whether the chunks are written by a job on the executors or collected
    and written by the driver."""
    w = _writer(tmp_path, collect)
    run = w.batch_function()
    rows = [_chunk(_rows("broker_health", 3)), _chunk(_rows("broker_health", 4)),
            _chunk(_rows("broker_fault_episodes", 2))]
    batch = spark.createDataFrame(rows, CHUNK_SCHEMA).repartition(2)
    run(batch, 0)
    run(batch, 0)  # replayed after a crash: skipped
    health = DeltaTable(str(tmp_path / "broker_health"))
    assert health.to_pyarrow_table().num_rows == 7
    assert health.transaction_version("test:sink") == 0
    assert DeltaTable(str(tmp_path / "broker_fault_episodes")).to_pyarrow_table().num_rows == 2
    kept = _data_files(tmp_path, "broker_health")

    misrouted = ("no_such_table",) + _chunk(_rows("broker_health", 1))[1:]
    bad = spark.createDataFrame(rows + [misrouted], CHUNK_SCHEMA).repartition(3)
    with pytest.raises(Exception, match="no_such_table"):
        run(bad, 1)
    assert _data_files(tmp_path, "broker_health") == kept  # no file of batch 1 is left behind
    assert DeltaTable(str(tmp_path / "broker_health")).transaction_version("test:sink") == 0  # log reread


def test_a_new_checkpoint_over_tables_holding_the_querys_batches_is_refused(tmp_path: Path) -> None:
    """Batch ids restart at 0 in a new checkpoint: the tables' transactions would skip them all."""
    from pipeline.config import ConfigError
    from streaming.delta_sink import check_checkpoint_matches

    w = _writer(tmp_path / "tables")
    checkpoint = tmp_path / "checkpoint"
    check_checkpoint_matches(str(tmp_path / "tables"), TABLES, str(checkpoint), "test:sink")  # nothing held yet
    w.commit([w.write(iter([_rows("broker_fault_episodes", 2)]), batch_id=0)], 0)
    w.commit([w.write(iter([_rows("broker_fault_episodes", 1)]), batch_id=1)], 1)
    with pytest.raises(ConfigError, match=r"broker_fault_episodes .*batches up to 1 of query 'test:sink'"):
        check_checkpoint_matches(str(tmp_path / "tables"), TABLES, str(checkpoint), "test:sink")
    check_checkpoint_matches(str(tmp_path / "tables"), TABLES, str(checkpoint), "test:other")  # another query
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"x"}')  # the checkpoint those batches came from
    check_checkpoint_matches(str(tmp_path / "tables"), TABLES, str(checkpoint), "test:sink")


@pytest.mark.parametrize("days", [["2026-01-01"] * 5, ["2026-01-02", "2026-01-01", "2026-01-02", "2026-01-01", "2026-01-02"]])
def test_table_files_hold_each_days_rows(tmp_path: Path, days: list[str]) -> None:
    import pyarrow.parquet as pq

    rows = pa.Table.from_batches([_rows("broker_health", len(days))]).drop_columns([ROUTE_COLUMN])
    rows = rows.set_column(rows.schema.get_field_index("event_date"), "event_date", pa.array(days))
    rows = rows.set_column(rows.schema.get_field_index("cluster"), "cluster", pa.array([str(i) for i in range(len(days))]))
    files = write_table_files(str(tmp_path), "broker_health", rows, lambda i: f"part-{i}")
    assert [f.partition_values for f in files] == [{"event_date": d} for d in sorted(set(days))]
    for f in files:
        got = pq.read_table(tmp_path / "broker_health" / f.path)
        day = rows.filter(pa.compute.equal(rows.column("event_date"), f.partition_values["event_date"]))
        assert got.to_pylist() == day.drop_columns(["event_date"]).to_pylist() and f.num_records == day.num_rows
