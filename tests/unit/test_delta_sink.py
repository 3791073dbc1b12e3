"""The Delta sink's driver side on real Delta tables: one commit per table and batch, replays skipped,
and abort removes only the files of a batch no table committed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_sink import DeltaStreamWriter, ensure_tables

TABLES = ["broker_health", "broker_fault_episodes"]


def _writer(root: Path) -> DeltaStreamWriter:
    ensure_tables(str(root), TABLES)
    return DeltaStreamWriter({"root": str(root), "tables": json.dumps(TABLES), "app_id": "test:sink"})


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
