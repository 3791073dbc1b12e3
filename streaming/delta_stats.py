"""Per-file statistics for Delta ``add`` actions, computed from the rows a file was written from.

Readers skip files by them: deltalake's pyarrow datasets and queries turn ``minValues``/``maxValues``
into each file's bounds, so a filter on time, cluster or broker reads only the files that may match.
The JSON follows the Delta protocol's per-file statistics: ``numRecords`` and, per column of the
file (partition columns are not in the files), ``nullCount`` and the bounds. A bound is left out
where it could mislead or the protocol has no form for it: booleans, binary, nested and non-finite
values, and strings longer than :data:`MAX_STRING` (Delta writers truncate those; leaving them out
keeps every bound exact). Only the first :data:`INDEXED_COLUMNS` columns are described, the
protocol's default ``delta.dataSkippingNumIndexedCols``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

INDEXED_COLUMNS = 32
MAX_STRING = 32

__all__ = ["INDEXED_COLUMNS", "MAX_STRING", "file_stats"]


def file_stats(data: pa.Table) -> str:
    """The Delta statistics JSON of a file holding exactly ``data``."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in list(data.schema)[:INDEXED_COLUMNS]:
        column = data.column(field.name)
        if _nested(field.type):
            continue
        nulls[field.name] = column.null_count
        bounds = _bounds(column)
        if bounds is not None:
            mins[field.name], maxs[field.name] = bounds
    return json.dumps({"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def _nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_nested(kind))


def _bounds(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """(min, max) as Delta writes them in JSON, or None where no exact bound can be given."""
    kind = column.type
    if pa.types.is_dictionary(kind):  # bounds over the dictionary hold for the values it encodes
        values = [chunk.dictionary for chunk in column.chunks]
        column = pa.chunked_array(values, kind.value_type) if values else pa.chunked_array([], kind.value_type)
        kind = kind.value_type
    if not _bounded(kind) or column.null_count == len(column):
        return None
    if pa.types.is_floating(kind) and pc.any(pc.is_nan(column)).as_py():  # NaN sorts above all in Spark
        return None
    low, high = (v.as_py() for v in pc.min_max(column).values())
    if low is None or high is None:
        return None
    if pa.types.is_floating(kind) and not (math.isfinite(low) and math.isfinite(high)):
        return None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return (low, high) if max(len(low), len(high)) <= MAX_STRING else None
    if pa.types.is_timestamp(kind):
        return _instant(low, kind, ceil=False), _instant(high, kind, ceil=True)
    if pa.types.is_date(kind):
        return low.isoformat(), high.isoformat()
    return low, high


def _bounded(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind)
        or pa.types.is_large_string(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind)
    )


def _instant(value: dt.datetime, kind: pa.TimestampType, ceil: bool) -> str:
    """A timestamp bound at millisecond precision (as Delta stores them), widened outwards."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc)
    whole = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if ceil and whole != value:
        whole += dt.timedelta(milliseconds=1)
    text = whole.strftime("%Y-%m-%dT%H:%M:%S.") + f"{whole.microsecond // 1000:03d}"
    return text + ("Z" if kind.tz is not None else "")
