"""Schema changes between faultwatch versions, on real Delta tables: a column this version writes is
added to an older table (or refused with what to do), never dropped silently."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipeline.config import ConfigError
from pipeline.deltaio import read_table
from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_sink import RoutedDeltaWriter, ensure_tables

NAME = "broker_fault_episodes"
NEW = "closed_by"  # the column an "older faultwatch" did not write


def _episode(episode_id: str, closed_by: str | None) -> dict[str, object]:
    return {"episode_id": episode_id, "cluster": "c1", "broker_name": "broker-a", "opened_ms": 1_000, "closed_ms": None,
            "state": "open", "reason": "quorum", "peak_avoiding_share": 0.5, "peak_avoiding_producers": 3,
            "active_producers": 6, "sends": 100, "failures": 40, "p99_latency_ms": 900.0, "dominant_error": "Timeout",
            "revision": 1, "updated_ms": 2_000, "cluster_brokers": 3, NEW: closed_by}


def _older_table(root: Path, schema: pa.Schema, e0: dict[str, object] | None = None) -> str:
    """The table as another faultwatch left it: ``schema``, holding episode e0."""
    path = str(root / NAME)
    DeltaTable.create(path, schema=schema)
    row = {k: v for k, v in (e0 or _episode("e0", None)).items() if k in schema.names}
    write_deltalake(path, pa.Table.from_pylist([row], schema), mode="append")
    return path


def _without(schema: pa.Schema, column: str) -> pa.Schema:
    return schema.remove(schema.get_field_index(column))


def _commit_e1(root: Path) -> None:
    sink = RoutedDeltaWriter(str(root), [NAME], "test:schema")
    row = _episode("e1", "recovery") | {ROUTE_COLUMN: NAME}
    batch = pa.RecordBatch.from_pylist([row], table(NAME).arrow_schema().append(pa.field(ROUTE_COLUMN, pa.string())))
    sink.commit([sink.write(iter([batch]), 0)], 0)


def test_a_column_this_version_writes_is_added_to_an_older_table(tmp_path: Path) -> None:
    path = _older_table(tmp_path, _without(table(NAME).arrow_schema(), NEW))
    ensure_tables(str(tmp_path), [NAME], "evolve")
    dt = DeltaTable(path)
    assert [(f.name, f.nullable) for f in dt.schema().fields][-1] == (NEW, True)
    assert dt.history(1)[0]["faultwatch.schema"] == f"added {NEW}"
    _commit_e1(tmp_path)
    got = read_table(str(tmp_path), NAME).sort_by("episode_id")
    assert got.to_pylist() == [_episode("e0", None), _episode("e1", "recovery")]  # older rows read as null
    ensure_tables(str(tmp_path), [NAME], "evolve")  # nothing more to add: no commit
    assert DeltaTable(path).version() == dt.version() + 1


def test_refuse_names_the_missing_column_and_what_to_do(tmp_path: Path) -> None:
    path = _older_table(tmp_path, _without(table(NAME).arrow_schema(), NEW))
    before = DeltaTable(path).version()
    with pytest.raises(ConfigError, match=rf"{NAME} .*lacks column\(s\) \['{NEW}'\].*schema_changes = \"evolve\""):
        ensure_tables(str(tmp_path), [NAME], "refuse")
    assert DeltaTable(path).version() == before


@pytest.mark.parametrize("mode", ["evolve", "refuse"])
def test_a_retyped_column_is_refused_in_either_mode(tmp_path: Path, mode: str) -> None:
    declared = table(NAME).arrow_schema()
    narrow = declared.set(declared.get_field_index("sends"), pa.field("sends", pa.int32(), nullable=False))
    _older_table(tmp_path, _without(narrow, NEW))
    with pytest.raises(ConfigError, match=r"column sends as .*integer.* writes it as .*long.*rebuild it from Kafka"):
        ensure_tables(str(tmp_path), [NAME], mode)


def test_a_column_only_a_newer_version_writes_is_kept_or_refused(tmp_path: Path) -> None:
    """An older faultwatch over a table a newer one evolved: its rows hold null in the newer column
    ("evolve"), or it does not start ("refuse")."""
    newer = table(NAME).arrow_schema().append(pa.field("note", pa.string()))
    path = _older_table(tmp_path, newer, _episode("e0", "silence") | {"note": "n"})
    with pytest.raises(ConfigError, match=r"has column\(s\) \['note'\] that this version of faultwatch does not write"):
        ensure_tables(str(tmp_path), [NAME], "refuse")
    ensure_tables(str(tmp_path), [NAME], "evolve")
    _commit_e1(tmp_path)
    got = read_table(str(tmp_path), NAME).sort_by("episode_id")
    assert got.to_pylist() == [_episode("e0", "silence") | {"note": "n"}, _episode("e1", "recovery") | {"note": None}]
    assert [f.name for f in DeltaTable(path).schema().fields][-1] == "note"


def test_the_sink_never_commits_files_into_a_table_lacking_their_columns(tmp_path: Path) -> None:
    """A table replaced behind the running job (no start to evolve it): the commit fails, naming the
    column, and the log is left as it was."""
    path = _older_table(tmp_path, _without(table(NAME).arrow_schema(), NEW))
    with pytest.raises(ValueError, match=rf"lacks column\(s\) \['{NEW}'\]"):
        _commit_e1(tmp_path)
    dt = DeltaTable(path)
    assert dt.version() == 1 and dt.transaction_version("test:schema") is None
    assert read_table(str(tmp_path), NAME).to_pylist() == [{k: v for k, v in _episode("e0", None).items() if k != NEW}]
