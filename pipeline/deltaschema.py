"""A table's schema against the one this faultwatch writes: evolve it, or refuse to start.

Delta keeps a table's schema in its log, and a commit of files with a column the log does not
know succeeds while readers never see that column. So before any query writes, each table is
compared with its declared schema (schemas/tables.py):

- columns this version writes and the table lacks: with ``storage.schema_changes = "evolve"`` they
  are added (nullable: older rows read as null) in a commit of their own, before any file holding
  them is committed; with ``"refuse"`` the start fails with a message naming them;
- columns the table has and this version does not write (an older faultwatch over tables a newer
  one evolved): with ``"evolve"`` its rows carry null there, and a warning says so; ``"refuse"`` fails;
- a column whose type differs: always refused (Delta cannot retype the files already written).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline import objstore
from pipeline.config import ConfigError

log = logging.getLogger(__name__)

SCHEMA_CHANGES = ("evolve", "refuse")

__all__ = ["SCHEMA_CHANGES", "SchemaDiff", "reconcile_schema", "schema_diff"]


@dataclass(frozen=True)
class SchemaDiff:
    """How a table's schema differs from the declared one (column names, types as Delta names them)."""

    missing: tuple[str, ...] = ()  # declared, not in the table
    extra: tuple[str, ...] = ()  # in the table, not declared
    retyped: tuple[tuple[str, str, str], ...] = ()  # (column, table's type, declared type)


def _shape(kind: Any) -> str:
    """A Delta type without its nullability flags (those never make two types differ here)."""
    return re.sub(r",?\s*(value_)?contains_null=(True|False)|,?\s*nullable=(True|False)", "", repr(kind))


def schema_diff(table_schema: Any, declared: pa.Schema) -> SchemaDiff:
    """Compare a deltalake ``Schema`` with a declared pyarrow schema, column by column."""
    from deltalake.schema import Schema

    have = {f.name: f for f in table_schema.fields}
    want = {f.name: f for f in Schema.from_arrow(declared).fields}
    retyped = tuple(
        (name, _shape(have[name].type), _shape(f.type))
        for name, f in want.items() if name in have and _shape(have[name].type) != _shape(f.type)
    )
    return SchemaDiff(tuple(n for n in want if n not in have), tuple(n for n in have if n not in want), retyped)


def reconcile_schema(uri: str, name: str, declared: pa.Schema, mode: str) -> SchemaDiff:
    """Bring table ``name`` at ``uri`` to the declared schema per ``mode``, or raise ConfigError."""
    from deltalake import DeltaTable
    from deltalake.schema import Field, Schema
    from deltalake.transaction import CommitProperties

    if mode not in SCHEMA_CHANGES:
        raise ConfigError(f"storage.schema_changes: unknown {mode!r}; valid values: {list(SCHEMA_CHANGES)}")
    dt = DeltaTable(uri, storage_options=objstore.storage_options(uri))
    diff = schema_diff(dt.schema(), declared)
    if diff.retyped:
        column, theirs, ours = diff.retyped[0]
        raise ConfigError(
            f"table {name} under storage.root holds column {column} as {theirs}, and this version of faultwatch "
            f"writes it as {ours}: Delta cannot retype the files already written. Run the faultwatch version that "
            "wrote the table, or remove the table and its query's checkpoint (or point storage.root and "
            "storage.checkpoint_root elsewhere) to rebuild it from Kafka."
        )
    if mode == "refuse" and diff.missing:
        raise ConfigError(
            f"table {name} under storage.root lacks column(s) {list(diff.missing)} that this version of "
            "faultwatch writes. Set storage.schema_changes = \"evolve\" to add them (older rows read as null), "
            "or run the faultwatch version that wrote the table."
        )
    if diff.extra:
        if mode == "refuse":
            raise ConfigError(
                f"table {name} under storage.root has column(s) {list(diff.extra)} that this version of faultwatch "
                "does not write (a newer version added them); its rows would hold null there. Run the newer "
                "version, or set storage.schema_changes = \"evolve\" to write such rows anyway."
            )
        log.warning("table %s has column(s) %s that this version of faultwatch does not write: its rows "
                    "hold null there", name, list(diff.extra))
    if diff.missing:
        wanted = {f.name: f for f in Schema.from_arrow(declared).fields}
        dt.alter.add_columns(
            [Field(n, wanted[n].type, nullable=True) for n in diff.missing],
            commit_properties=CommitProperties(custom_metadata={"faultwatch.schema": "added " + ",".join(diff.missing)}),
        )
        log.info("table %s: added column(s) %s (older rows read as null)", name, list(diff.missing))
    return diff
