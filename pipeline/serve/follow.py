"""Follow one Delta table incrementally: read only the data files added since the last refresh.

The tables ``serve`` reads are append-only histories, and Delta data files never change once
committed, so a table's current view can be folded file by file: ``map`` reduces the rows of the new
files (latest row per key, counts per reason, ...) and ``combine`` merges that with the previous
view. A refresh then costs the new files, not the table. When a file disappears (OPTIMIZE, VACUUM,
a rewritten table) the view is rebuilt from every current file.

Files are read with pyarrow over an explicit filesystem (the safe path around delta-rs#2184, see
:mod:`pipeline.deltaio`). Columns a file lacks (older files of a table whose schema grew) read as
nulls; columns the table does not have at all are left out, so readers tolerate both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pa_fs

from pipeline import objstore
from pipeline.deltaio import table_uri
from schemas.errors import FaultwatchError

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

Reducer = Callable[[pa.Table], pa.Table]


class TableMissing(FaultwatchError, RuntimeError):
    """The table does not exist (yet)."""


@dataclass(frozen=True)
class Fold:
    """How a table's rows reduce to the view ``serve`` keeps of it.

    ``columns`` None means every column the table has (partition columns excepted).
    ``combine`` must accept the concatenation of earlier views and new ``map`` output.
    """

    columns: tuple[str, ...] | None
    map: Reducer
    combine: Reducer


def latest_per_key(keys: Sequence[str], order: str) -> Reducer:
    """A reducer keeping the row with the highest ``order`` per ``keys`` (later rows win ties)."""

    def reduce(table: pa.Table) -> pa.Table:
        n = table.num_rows
        if n <= 1:
            return table
        index = pa.table({
            **{f"k{i}": table.column(k) for i, k in enumerate(keys)},
            "order": table.column(order),
            "row": pa.array(range(n), pa.int64()),
        })
        sort = [(f"k{i}", "ascending") for i in range(len(keys))] + [("order", "descending"), ("row", "descending")]
        ordered = index.take(pc.sort_indices(index, sort_keys=sort))
        if not keys:
            return table.take(ordered.column("row").slice(0, 1))
        changed = None
        for i in range(len(keys)):
            col = ordered.column(f"k{i}")
            diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
            changed = diff if changed is None else pc.or_(changed, diff)
        assert changed is not None  # keys is not empty
        first = pa.concat_arrays([pa.array([True]), *changed.chunks])
        return table.take(ordered.column("row").filter(first))

    return reduce


def latest_fold(keys: Sequence[str], order: str, columns: Sequence[str] | None = None) -> Fold:
    reducer = latest_per_key(keys, order)
    return Fold(tuple(columns) if columns is not None else None, reducer, reducer)


class TableFollower:
    """The folded view of one table, refreshed from the files added since the last call."""

    def __init__(self, root: str, name: str, fold: Fold) -> None:
        self.name = name
        self.uri = table_uri(root, name)
        self.fold = fold
        self.view: pa.Table | None = None
        self.error: str | None = None
        self.version: int | None = None
        self._dt: DeltaTable | None = None
        self._seen: set[str] = set()

    def refresh(self) -> None:
        """Bring the view up to the table's latest version; a failure is kept in ``error``."""
        try:
            self._refresh()
            self.error = None
        except TableMissing as exc:
            self.error = str(exc)
            self._forget()
        except Exception as exc:  # noqa: BLE001 - an unreadable table is reported, never a crash
            self.error = f"table {self.name} unreadable: {type(exc).__name__}: {short_reason(exc, self.uri)}"
            self._dt = None

    def _forget(self) -> None:
        self._dt, self.view, self.version, self._seen = None, None, None, set()

    def _refresh(self) -> None:
        from deltalake import DeltaTable

        # Checked on every refresh: a followed table's update_incremental() succeeds on a directory
        # that has gone away, which would keep serving the old view as if it were current.
        if not DeltaTable.is_deltatable(self.uri, storage_options=objstore.storage_options(self.uri)):
            raise TableMissing(f"table {self.name} does not exist")
        if self._dt is None:
            self._dt = DeltaTable(self.uri, storage_options=objstore.storage_options(self.uri))
        else:
            self._dt.update_incremental()
        version = int(self._dt.version())
        if version == self.version and self.view is not None:
            return
        paths = set(pa.table(self._dt.get_add_actions(flatten=True)).column("path").to_pylist())
        if not self._seen <= paths:  # files were removed or rewritten: start over
            self._seen, self.view = set(), None
        new = sorted(paths - self._seen)
        schema = self._read_schema()
        rows = self._read(new, schema) if new else schema.empty_table()
        partial = self.fold.map(rows)
        self.view = partial if self.view is None else self.fold.combine(
            pa.concat_tables([self.view, partial], promote_options="permissive")
        )
        self._seen |= set(new)
        self.version = version

    def _read_schema(self) -> pa.Schema:
        assert self._dt is not None
        full = pa.schema(self._dt.schema().to_arrow())
        partitions = set(self._dt.metadata().partition_columns)
        wanted = self.fold.columns
        fields = [
            f.with_nullable(True)
            for f in full
            if f.name not in partitions and (wanted is None or f.name in wanted)
        ]
        return pa.schema(fields)

    def _read(self, paths: list[str], schema: pa.Schema) -> pa.Table:
        files = [unquote(p) for p in paths]
        dataset = pds.dataset(files, schema=schema, format="parquet", filesystem=_filesystem(self.uri))
        return dataset.to_table()


def short_reason(exc: BaseException, uri: str, limit: int = 200) -> str:
    """The first line of an error, without the table's location (it goes to clients and /healthz:
    no paths, no backtraces)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    first = first.replace(uri, "<table>")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _filesystem(uri: str) -> pa_fs.FileSystem:
    if "://" not in uri:
        return pa_fs.SubTreeFileSystem(uri, pa_fs.LocalFileSystem())
    raw, path = objstore.filesystem(uri)
    return pa_fs.SubTreeFileSystem(path, raw)
