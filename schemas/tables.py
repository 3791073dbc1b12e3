"""Delta table contracts (names under ``storage.root``).

Bronze tables are the event contracts plus where each record came from in Kafka. Silver tables are
declared in their own modules and registered in :data:`TABLES` here, the one list of every table.
"""

from __future__ import annotations

from datetime import datetime, timezone

from schemas.events import CONSUMER_PROGRESS, GROUP_MEMBERSHIP, SEND_RESULT
from schemas.fields import Field, TableSpec

KAFKA_SOURCE: tuple[Field, ...] = (
    Field("kafka_topic", "string"),
    Field("kafka_partition", "int32"),
    Field("kafka_offset", "int64"),
    Field("kafka_ts_ms", "int64", doc="the record's Kafka timestamp"),
)
# Bronze is partitioned by the event's UTC date: readers almost always filter on a time range.
EVENT_DATE = Field("event_date", "string", doc="UTC date of ts_ms, YYYY-MM-DD")


def utc_date(ms: int) -> str:
    """The ``event_date`` partition value of an event time (epoch ms)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


SEND_RESULTS = TableSpec(
    "send_results", SEND_RESULT + KAFKA_SOURCE + (EVENT_DATE,), ("event_date",), time_column="ts_ms"
)
CONSUMER_PROGRESS_TABLE = TableSpec(
    "consumer_progress", CONSUMER_PROGRESS + KAFKA_SOURCE + (EVENT_DATE,), ("event_date",), time_column="ts_ms"
)
GROUP_MEMBERSHIP_TABLE = TableSpec(
    "group_membership", GROUP_MEMBERSHIP + KAFKA_SOURCE + (EVENT_DATE,), ("event_date",), time_column="ts_ms"
)

QUARANTINE = TableSpec(
    "quarantine",
    (
        Field("source_topic", "string"),
        Field("source_partition", "int32"),
        Field("source_offset", "int64"),
        Field("kafka_ts_ms", "int64"),
        Field("raw_key", "binary", nullable=True),
        Field("raw_value", "binary", nullable=True, doc="the record's bytes, exactly as read"),
        Field("event_kind", "string", doc="the contract the record was checked against"),
        Field("reason", "string", doc="stable code: bad_json, missing_field, late, ..."),
        Field("detail", "string", doc="what exactly was wrong, for a human"),
        Field("stage", "string", doc="which query rejected it: bronze, faults, lag"),
    ),
    time_column="kafka_ts_ms",
)

# Which bronze table each event kind lands in.
BRONZE_TABLE_FOR_EVENT: dict[str, TableSpec] = {
    "send_result": SEND_RESULTS,
    "consumer_progress": CONSUMER_PROGRESS_TABLE,
    "group_membership": GROUP_MEMBERSHIP_TABLE,
}

TABLES: dict[str, TableSpec] = {
    t.name: t for t in (SEND_RESULTS, CONSUMER_PROGRESS_TABLE, GROUP_MEMBERSHIP_TABLE, QUARANTINE)
}


def register(*specs: TableSpec) -> None:
    """Add silver tables to :data:`TABLES` (called by their schema modules at import)."""
    for spec in specs:
        existing = TABLES.get(spec.name)
        if existing is not None and existing != spec:
            raise ValueError(f"table {spec.name!r} is declared twice with different columns")
        TABLES[spec.name] = spec


def table(name: str) -> TableSpec:
    _load_silver()
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}") from None


def all_tables() -> dict[str, TableSpec]:
    _load_silver()
    return dict(TABLES)


_SILVER_MODULES = ("schemas.faults", "schemas.lag", "schemas.avoidance", "schemas.alerts")


def _load_silver() -> None:
    import importlib

    for mod in _SILVER_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real import error inside the module must surface
                raise


ROUTE_COLUMN = "_table"


def routed_fields(table_names: list[str] | tuple[str, ...]) -> tuple[Field, ...]:
    """Columns of a query output that feeds several tables through one sink.

    Each output row names its table in ``_table`` and fills that table's columns; the sink writes
    each table's columns only. Columns shared by several tables must have one type. Everything is
    nullable here because a row leaves the other tables' columns empty.
    """
    import dataclasses

    out: dict[str, Field] = {ROUTE_COLUMN: Field(ROUTE_COLUMN, "string")}
    for name in table_names:
        for f in table(name).fields:
            seen = out.get(f.name)
            if seen is not None and seen.kind != f.kind:
                raise ValueError(f"column {f.name!r} is {seen.kind} in one table and {f.kind} in {name!r}")
            out.setdefault(f.name, dataclasses.replace(f, required=False, nullable=True))
    return tuple(out.values())
