"""``table_has_rows``: what the demo's publisher waits for before its first cycle."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from pipeline.deltaio import table_has_rows, table_version


def test_a_table_has_rows_only_once_a_commit_added_data(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert not table_has_rows(root, "t")  # no table at all
    schema = pa.schema([("id", pa.int64())])
    DeltaTable.create(str(tmp_path / "t"), schema)
    assert not table_has_rows(root, "t")
    DeltaTable(str(tmp_path / "t")).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 days"})
    assert table_version(root, "t") == 1 and not table_has_rows(root, "t")  # a commit, but no data
    write_deltalake(str(tmp_path / "t"), pa.table({"id": [1]}, schema=schema), mode="append")
    assert table_has_rows(root, "t")
