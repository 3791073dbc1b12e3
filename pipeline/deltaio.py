"""Safe reads of the Delta tables under ``storage.root`` with deltalake (no Spark).

``DeltaTable.to_pyarrow_table()`` with its default filesystem makes the process abort at exit in a
good share of runs (delta-rs issue 2184). Here the dataset is built with an explicit
pyarrow filesystem rooted at the table, which keeps partition values and file pruning and avoids
the crash. A table that does not exist yet reads as an empty table of its declared schema: the
publisher's first cycle often runs before the streaming job has written anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pa_fs

from pipeline import objstore

__all__ = ["latest_revision", "read_table", "table_columns", "table_exists", "table_uri", "table_version"]


def table_uri(root: str, name: str) -> str:
    """The table's location: ``root/name``, made absolute for local paths."""
    if "://" in root:
        return root.rstrip("/") + "/" + name
    return str((Path(root) / name).resolve())


def table_exists(root: str, name: str) -> bool:
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(table_uri(root, name), storage_options=objstore.storage_options(root)))


def table_version(root: str, name: str) -> int | None:
    """The table's latest version (0: created, nothing committed since), None if it does not exist."""
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    opts = objstore.storage_options(uri)
    return int(DeltaTable(uri, storage_options=opts).version()) if DeltaTable.is_deltatable(uri, storage_options=opts) else None


def table_columns(root: str, name: str) -> list[str]:
    """The columns the table has now (a table written by an older faultwatch may lack newer ones); a
    missing table has its declared schema's."""
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    opts = objstore.storage_options(uri)
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        schema = _declared_schema(name)
        return list(schema.names) if schema is not None else []
    return [f.name for f in DeltaTable(uri, storage_options=opts).schema().fields]


def table_has_rows(root: str, name: str) -> bool:
    """True once a commit has added a data file (a created table, or one whose only commits set
    properties or columns, has none)."""
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    opts = objstore.storage_options(uri)
    return bool(DeltaTable.is_deltatable(uri, storage_options=opts) and DeltaTable(uri, storage_options=opts).file_uris())


def _declared_schema(name: str) -> pa.Schema | None:
    from schemas.tables import all_tables

    spec = all_tables().get(name)
    return spec.arrow_schema() if spec is not None else None


def _filesystem_for(uri: str) -> pa_fs.FileSystem:
    """An explicit filesystem rooted at the table (the safe path around delta-rs#2184)."""
    if "://" not in uri:
        return pa_fs.SubTreeFileSystem(uri, pa_fs.LocalFileSystem())
    raw, path = objstore.filesystem(uri)
    return pa_fs.SubTreeFileSystem(path, raw)


def read_table(
    root: str,
    name: str,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """The current snapshot of table ``name`` under ``root`` as a pyarrow Table.

    ``filter`` is a pyarrow compute expression (``pc.field("state") == "open"``); it prunes files
    by partition values and statistics, then filters rows exactly. A missing table gives an empty
    table with the declared schema (or raises ``FileNotFoundError`` for an undeclared name).
    """
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    storage_options = storage_options or objstore.storage_options(uri)
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        schema = _declared_schema(name)
        if schema is None:
            raise FileNotFoundError(f"no Delta table at {uri} and no declared schema for {name!r}")
        empty = schema.empty_table()
        return empty.select(list(columns)) if columns is not None else empty
    dt = DeltaTable(uri, storage_options=storage_options)
    dataset: pds.Dataset = dt.to_pyarrow_dataset(filesystem=_filesystem_for(uri))
    return dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)


def latest_revision(table: pa.Table, key: str | Sequence[str], revision: str = "revision") -> pa.Table:
    """Keep the row with the highest ``revision`` per ``key`` (the current view of appended history).

    Silver tables append a row each time a window or an episode changes; readers want the last
    one. Ties on revision keep one row arbitrarily but deterministically (the first in sort order).
    The result is sorted by key.
    """
    keys = [key] if isinstance(key, str) else list(key)
    if table.num_rows == 0:
        return table
    order = [(k, "ascending") for k in keys] + [(revision, "descending")]
    ordered = table.take(pc.sort_indices(table, sort_keys=order))
    n = ordered.num_rows
    first = pa.array([True] + [False] * (n - 1)) if n else pa.array([], pa.bool_())
    if n > 1:
        changed = None
        for k in keys:
            col = ordered.column(k)
            diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
            changed = diff if changed is None else pc.or_(changed, diff)
        assert changed is not None  # keys is not empty
        first = pa.concat_arrays([pa.array([True]), pa.concat_arrays(changed.chunks)])
    return ordered.filter(first)
