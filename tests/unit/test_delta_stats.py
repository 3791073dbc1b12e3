"""Per-file statistics: what the sink writes into each ``add`` action, and that readers skip files by it
(real Delta tables, read back through deltalake)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pa_fs
from deltalake import DeltaTable

from pipeline.deltaio import read_table
from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_sink import RoutedDeltaWriter, ensure_tables
from streaming.delta_stats import file_stats


def test_stats_give_exact_bounds_and_leave_out_what_has_none() -> None:
    utc = dt.timezone.utc
    data = pa.table({
        "n": pa.array([3, None, -2], pa.int64()),
        "name": pa.array(["b", "a", None]),
        "long": pa.array(["x" * 40, "y", "z"]),  # beyond 32 characters: no bounds at all
        "rate": pa.array([0.5, float("nan"), 2.0]),  # NaN: no bounds
        "ok": pa.array([True, False, None]),
        "tags": pa.array([["a"], [], None], pa.list_(pa.string())),
        "at": pa.array([dt.datetime(2026, 11, 28, 6, 0, 0, 1500, utc), None, dt.datetime(2026, 11, 28, 5, 0, tzinfo=utc)],
                       pa.timestamp("us", "UTC")),
        "day": pa.array([dt.date(2026, 11, 28), dt.date(2026, 11, 27), None]),
        "none": pa.nulls(3, pa.int32()),
    })
    assert json.loads(file_stats(data)) == {
        "numRecords": 3,
        "minValues": {"n": -2, "name": "a", "at": "2026-11-28T05:00:00.000Z", "day": "2026-11-27"},
        "maxValues": {"n": 3, "name": "b", "at": "2026-11-28T06:00:00.002Z", "day": "2026-11-28"},  # widened up
        "nullCount": {"n": 1, "name": 1, "long": 0, "rate": 0, "ok": 1, "at": 1, "day": 1, "none": 3},
    }


def _health(cluster: str, minutes: list[int], day: str) -> pa.RecordBatch:
    """broker_health rows of one cluster at the given minutes."""
    n = len(minutes)
    rows = {f.name: pa.array([0] * n).cast(f.type) for f in table("broker_health").arrow_schema()
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    rows |= {"cluster": pa.array([cluster] * n), "broker_name": pa.array([f"broker-{m % 3}" for m in minutes]),
             "minute_ms": pa.array([m * 60_000 for m in minutes], pa.int64()), "event_date": pa.array([day] * n),
             "failures_by_error": pa.array([[("Timeout", m)] for m in minutes], pa.map_(pa.string(), pa.int64())),
             ROUTE_COLUMN: pa.array(["broker_health"] * n)}
    return pa.RecordBatch.from_pydict(rows)


def test_each_commit_carries_the_statistics_that_let_a_filtered_read_skip_files(tmp_path: Path) -> None:
    ensure_tables(str(tmp_path), ["broker_health"])
    sink = RoutedDeltaWriter(str(tmp_path), ["broker_health"], "test:stats")
    batches = [_health("east", [0, 1, 2], "2026-11-27"), _health("west", [10, 11], "2026-11-28"),
               _health("east", [20, 21, 22, 23], "2026-11-28")]
    for batch_id, batch in enumerate(batches):
        sink.commit([sink.write(iter([batch]), batch_id)], batch_id)

    log = tmp_path / "broker_health" / "_delta_log"
    adds = [json.loads(line)["add"] for version in (1, 2, 3)
            for line in (log / f"{version:020d}.json").read_text().splitlines() if '"add"' in line]
    stats = [json.loads(a["stats"]) for a in adds]
    assert [(s["numRecords"], s["minValues"]["minute_ms"], s["maxValues"]["minute_ms"]) for s in stats] == [
        (3, 0, 120_000), (2, 600_000, 660_000), (4, 1_200_000, 1_380_000)]
    assert [(s["minValues"]["cluster"], s["maxValues"]["cluster"]) for s in stats] == [("east", "east"), ("west", "west"),
                                                                                     ("east", "east")]
    assert all("event_date" not in s["nullCount"] and "failures_by_error" not in s["nullCount"] for s in stats)

    uri = str((tmp_path / "broker_health").resolve())
    dataset: pds.Dataset = DeltaTable(uri).to_pyarrow_dataset(
        filesystem=pa_fs.SubTreeFileSystem(uri, pa_fs.LocalFileSystem()))
    by_file = {a["path"]: a for a in adds}
    late = pc.field("minute_ms") >= 1_200_000
    west = pc.field("cluster") == "west"
    assert [by_file[f.path]["partitionValues"] for f in dataset.get_fragments(filter=late)] == [{"event_date": "2026-11-28"}]
    assert [json.loads(by_file[f.path]["stats"])["numRecords"] for f in dataset.get_fragments(filter=late)] == [4]
    assert [json.loads(by_file[f.path]["stats"])["numRecords"] for f in dataset.get_fragments(filter=west)] == [2]
    assert len(list(dataset.get_fragments())) == 3

    got = read_table(str(tmp_path), "broker_health", columns=["cluster", "minute_ms"], filter=late | west)
    assert sorted(got.to_pylist(), key=lambda r: r["minute_ms"]) == [
        {"cluster": c, "minute_ms": m * 60_000} for c, m in [("west", 10), ("west", 11), ("east", 20), ("east", 21),
                                                              ("east", 22), ("east", 23)]]
