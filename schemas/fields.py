"""One definition per data contract.

Every event and table is a tuple of :class:`Field`. The pyarrow schema, the Spark schema and the
validator of incoming JSON all derive from it, so a column cannot drift between Kafka, Spark and
Delta. Nothing here imports pyspark at module level: :func:`spark_schema` does it on demand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from schemas.errors import FaultwatchError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import StructType

# Event timestamps outside this range are rejected. Fixed bounds (not "now ± x") keep validation
# deterministic, so a batch replayed after a crash classifies every record the same way.
MIN_TS_MS = 1_000_000_000_000  # 2001-09-09
MAX_TS_MS = 4_102_444_800_000  # 2100-01-01

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "list<string>": pa.list_(pa.string()),
    "map<string,int64>": pa.map_(pa.string(), pa.int64()),
}

# JSON value types accepted for each kind (bool is a subclass of int in Python: excluded explicitly).
_JSON_TYPES: dict[str, tuple[type[Any], ...]] = {
    "string": (str,),
    "int64": (int,),
    "int32": (int,),
    "float64": (int, float),
    "bool": (bool,),
    "list<string>": (list,),
}


@dataclass(frozen=True)
class Field:
    """A column: its type, whether JSON input must carry it, and the value rules it obeys."""

    name: str
    kind: str
    required: bool = True
    nullable: bool = False
    enum: tuple[str, ...] | None = None
    min: int | float | None = None
    max: int | float | None = None
    max_len: int | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _ARROW_TYPES:
            raise ValueError(f"field {self.name!r}: unknown kind {self.kind!r}; valid: {sorted(_ARROW_TYPES)}")

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW_TYPES[self.kind]


@dataclass(frozen=True)
class TableSpec:
    """A Delta table under ``storage.root``: its name, columns and partition columns."""

    name: str
    fields: tuple[Field, ...]
    partition_by: tuple[str, ...] = ()
    doc: str = ""
    # The event-time column (epoch ms) a row's age is told by: ``maintenance.data_retention_h``
    # deletes rows by it; ``event_date``, where a table has it, is this column's UTC date.
    time_column: str | None = None

    def __post_init__(self) -> None:
        if self.time_column is not None and self.time_column not in self.columns:
            raise ValueError(f"table {self.name!r}: time_column {self.time_column!r} is not one of its columns")

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.fields]

    def arrow_schema(self) -> pa.Schema:
        return arrow_schema(self.fields)

    def spark_schema(self) -> StructType:
        return spark_schema(self.fields)


def arrow_schema(fields: Sequence[Field]) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.arrow_type, nullable=f.nullable or not f.required) for f in fields])


def spark_schema(fields: Sequence[Field]) -> StructType:
    """The Spark StructType of ``fields``, derived from the pyarrow schema (same nullability)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema(fields))


class Invalid(FaultwatchError):
    """A record breaks its contract; ``reason`` is a short stable code, ``detail`` says what and where."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def check_record(fields: Sequence[Field], obj: Any) -> dict[str, Any]:
    """Validate a decoded JSON object against ``fields`` and return the columns it fills.

    Unknown keys are ignored (forward compatibility: a newer producer hook may add fields).
    Raises :class:`Invalid` with the first problem found.
    """
    if not isinstance(obj, dict):
        raise Invalid("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    plan = _PLANS.get(id(fields))
    if plan is None:
        plan = _PLANS[id(fields)] = _plan(fields)
    out: dict[str, Any] = {}
    for name, exact, required, nullable, bounded, f in plan:
        value = obj.get(name, _MISSING)
        if type(value) in exact and not bounded:  # the common case: right type, nothing to bound
            out[name] = value
        elif value is _MISSING:
            if required:
                raise Invalid("missing_field", f"missing field {name!r}")
            out[name] = None
        elif value is None:
            if not nullable:
                raise Invalid("null_field", f"field {name!r} must not be null")
            out[name] = None
        else:
            out[name] = _check_value(f, value)
    return out


_MISSING = object()
_INT_RANGE = {"int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1)}
_EXACT_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "int64": frozenset({int}),
    "int32": frozenset({int}),
    "float64": frozenset({int, float}),
    "bool": frozenset({bool}),
    "list<string>": frozenset(),  # always checked element by element
}
_PLANS: dict[int, list[tuple[str, frozenset[type], bool, bool, bool, Field]]] = {}


def _plan(fields: Sequence[Field]) -> list[tuple[str, frozenset[type], bool, bool, bool, Field]]:
    """Per field: (name, exact JSON types, required, nullable, needs value checks, field)."""
    out = []
    for f in fields:
        bounded = f.enum is not None or f.min is not None or f.max is not None or f.max_len is not None
        bounded = bounded or f.kind in ("string", "int64", "int32")  # empty strings, Arrow int range
        out.append((f.name, _EXACT_TYPES.get(f.kind, frozenset()), f.required, f.nullable, bounded, f))
    return out


def _check_value(f: Field, value: Any) -> Any:
    accepted = _JSON_TYPES[f.kind]
    if isinstance(value, bool) and bool not in accepted:
        raise Invalid("wrong_type", f"field {f.name!r} must be {f.kind}, got bool")
    if not isinstance(value, accepted):
        raise Invalid("wrong_type", f"field {f.name!r} must be {f.kind}, got {type(value).__name__}")
    if f.kind == "list<string>" and not all(isinstance(v, str) for v in value):
        raise Invalid("wrong_type", f"field {f.name!r} must be a list of strings")
    if f.enum is not None and value not in f.enum:
        raise Invalid("unknown_value", f"field {f.name!r} = {value!r} is not one of {list(f.enum)}")
    if f.kind in _INT_RANGE and not _INT_RANGE[f.kind][0] <= value <= _INT_RANGE[f.kind][1]:
        raise Invalid("out_of_range", f"field {f.name!r} = {value!r} does not fit {f.kind}")
    if f.min is not None and value < f.min:
        raise Invalid("out_of_range", f"field {f.name!r} = {value!r} is below {f.min}")
    if f.max is not None and value > f.max:
        raise Invalid("out_of_range", f"field {f.name!r} = {value!r} is above {f.max}")
    if f.max_len is not None and len(value) > f.max_len:
        raise Invalid("too_long", f"field {f.name!r} is longer than {f.max_len}")
    if f.kind == "string" and not value:
        raise Invalid("empty_string", f"field {f.name!r} must not be empty")
    return value
