"""Tiny columnar tables: a dict of equally long numpy arrays with a declared dtype per column.

The fault state holds tens of thousands of producer x broker rows and a few hundred thousand
recent events; keeping them as arrays lets most of a step run in numpy, and lets the state go to
Spark's state store as Arrow IPC without touching a Python object per cell.
Strings (and nullable values) live in ``object`` arrays.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

Cols = dict[str, np.ndarray]
Schema = Mapping[str, str]  # column -> numpy dtype ("int64", "int32", "int8", "bool", "float64", "object")


def empty(schema: Schema) -> Cols:
    return {name: np.empty(0, dtype=dtype) for name, dtype in schema.items()}


def nrows(cols: Cols) -> int:
    for values in cols.values():
        return len(values)
    return 0


def take(cols: Cols, index: np.ndarray) -> Cols:
    """Rows by position or boolean mask."""
    return {name: values[index] for name, values in cols.items()}


def concat(*parts: Cols) -> Cols:
    parts = tuple(p for p in parts if p)
    if not parts:
        return {}
    names = list(parts[0])
    return {name: np.concatenate([p[name] for p in parts]) for name in names}


def column(values: Any, dtype: str, n: int | None = None) -> np.ndarray:
    """An array of ``dtype`` from a list, array or scalar (repeated ``n`` times)."""
    if np.isscalar(values) or values is None:
        out = np.empty(n or 0, dtype=dtype)
        out[:] = values
        return out
    if dtype == "object":
        out = np.empty(len(values), dtype=object)
        out[:] = list(values) if not isinstance(values, np.ndarray) else values
        return out
    return np.asarray(values, dtype=dtype)


def build(schema: Schema, **values: Any) -> Cols:
    """A table of ``schema`` from keyword columns; every column must be given."""
    missing = set(schema) - set(values)
    if missing:
        raise KeyError(f"missing columns {sorted(missing)}")
    lengths = {len(v) for v in values.values() if not (np.isscalar(v) or v is None)}
    n = lengths.pop() if lengths else 0
    if lengths:
        raise ValueError("columns differ in length")
    return {name: column(values[name], dtype, n) for name, dtype in schema.items()}


# Field metadata of a narrowed integer column (to_arrow's ``narrow``): the minimum it is stored from.
BASE = b"base"
_UNSIGNED = tuple((t, int(np.iinfo(t).max)) for t in (np.uint8, np.uint16, np.uint32))


def to_arrow(cols: Cols, schema: Schema, narrow: bool = False) -> pa.RecordBatch:
    """``cols`` as Arrow; ``narrow`` stores integer columns as offsets from their minimum in the
    smallest unsigned type that holds them (a state's columns mostly span small ranges: a fraction
    of the bytes to write, compress and read), the minimum in the field's metadata."""
    arrays, fields = [], []
    for name, dtype in schema.items():
        values, meta = cols[name], None
        if narrow and dtype in ("int64", "int32") and len(values):
            values, meta = _narrowed(values)
        array = pa.array(values, from_pandas=True) if dtype == "object" else pa.array(values)
        arrays.append(array)
        fields.append(pa.field(name, array.type, metadata=meta))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _narrowed(values: np.ndarray) -> tuple[np.ndarray, dict[bytes, bytes] | None]:
    low = int(values.min())
    span = int(values.max()) - low
    for unsigned, top in _UNSIGNED:
        if span <= top:
            out = np.empty(len(values), dtype=unsigned)
            np.subtract(values, low, out=out, casting="unsafe")  # each difference fits: exact
            return out, {BASE: str(low).encode()}
    return values, None


def from_arrow(table: pa.Table | pa.RecordBatch, schema: Schema) -> Cols:
    """Columns as numpy; strings through a dictionary, so a value repeated on many rows (a broker,
    a client id, a status) is one Python object: 200k events cost ~8 bytes per row and column
    instead of a new string each (measured: ~120 MB less per 200k-event batch)."""
    out: Cols = {}
    for name, dtype in schema.items():
        col = table.column(name)
        if dtype == "object" and (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                                  or pa.types.is_dictionary(col.type)):
            encoded = col if pa.types.is_dictionary(col.type) else pc.dictionary_encode(col)
            if isinstance(encoded, pa.ChunkedArray):  # one dictionary for all chunks
                encoded = encoded.combine_chunks()
            words = np.empty(len(encoded.dictionary) + 1, dtype=object)
            words[:-1] = encoded.dictionary.to_pylist()
            words[-1] = None
            indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
            out[name] = words[indices]
        elif dtype == "object":
            values = col.to_numpy(zero_copy_only=False)
            out[name] = values if values.dtype == object else values.astype(object)
        else:
            values = col.to_numpy(zero_copy_only=False)
            meta = table.schema.field(name).metadata
            if meta and BASE in meta:  # narrowed by to_arrow
                values = values.astype(dtype)
                values += np.asarray(int(meta[BASE]), dtype=dtype)
            out[name] = values.astype(dtype, copy=False)
    return out


def to_bytes(cols: Cols, schema: Schema, packed: bool = True) -> bytes:
    """``cols`` as one blob: a JSON header, then each column's values as they lie in memory.

    Integer columns are narrowed as by :func:`to_arrow`, strings (object columns) stored as a
    dictionary over the rows that hold one. Reading it back (:func:`from_bytes`) is a copy per
    column; an Arrow IPC stream costs a fixed toll per column and a conversion per string, and
    the fault state goes through the state store every micro-batch.

    ``packed`` (the default) makes the blob compress about twice as well: an integer column whose
    steps from row to row narrow to fewer bytes than its values (serials, times and offsets in
    log order) is stored as those steps, and a column of wider values is stored byte plane by
    byte plane (all first bytes, then all second bytes, ...), so the high bytes, nearly constant,
    compress to almost nothing. ``packed=False`` writes the earlier layout (still read).
    """
    specs: list[list[Any]] = []
    parts: list[Any] = []
    for name, dtype in schema.items():
        spec, buffers = _strings(cols[name]) if dtype == "object" else _numbers(cols[name], dtype, packed)
        specs.append(spec)
        parts += buffers
    head = json.dumps({"n": nrows(cols), "cols": specs}).encode()
    return b"".join([struct.pack("<I", len(head)), head, *parts])


def _numbers(values: np.ndarray, dtype: str, packed: bool) -> tuple[list[Any], list[np.ndarray]]:
    """[stored dtype, base (None: not narrowed), bytes] (packed: then byte planes, first value
    (None: not stored as steps)) and the buffer."""
    base = first = None
    if dtype in ("int64", "int32") and len(values):
        plain, meta = _narrowed(values)
        if packed and len(values) > 1 and plain.dtype.itemsize > 1:  # (one byte: steps cannot be narrower)
            # int64 steps wrap around exactly where the values are extreme; the sum unwraps them
            steps, step_meta = _narrowed(np.diff(values.astype(np.int64, copy=False)))
            if step_meta and steps.dtype.itemsize < plain.dtype.itemsize:
                first, plain, meta = int(values[0]), steps, step_meta
        values = plain
        base = int(meta[BASE]) if meta else None
    values = np.ascontiguousarray(values, dtype=values.dtype if base is not None else dtype)
    if not packed:
        return [values.dtype.str, base, values.nbytes], [values]
    stored, size = values.dtype.str, values.dtype.itemsize
    planes = size > 1 and len(values) > 1
    if planes:
        values = np.ascontiguousarray(values.view(np.uint8).reshape(len(values), size).T)
    return [stored, base, values.nbytes, planes, first], [values]


def _strings(values: np.ndarray) -> tuple[list[Any], list[np.ndarray]]:
    """["object", distinct values, row positions' dtype (None: every row), codes' dtype, their
    bytes] and the buffers: positions of the rows with a value, each one's code in the values."""
    n = len(values)
    rows = np.flatnonzero(~pd.isna(values)) if n else np.empty(0, dtype=np.int64)
    codes, words = pd.factorize(values[rows] if len(rows) < n else values)
    buffers, where = [], None
    if len(rows) < n:
        where = _unsigned(n).str
        buffers.append(rows.astype(where))
    codes = codes.astype(_unsigned(len(words)))
    buffers.append(codes)
    return ["object", words.tolist(), where, codes.dtype.str, [b.nbytes for b in buffers]], buffers


def _unsigned(top: int) -> np.dtype:
    """The smallest unsigned type that holds every value below ``top``."""
    for unsigned, limit in _UNSIGNED:
        if top <= limit:
            return np.dtype(unsigned)
    return np.dtype(np.uint64)


def from_bytes(blob: bytes, schema: Schema) -> Cols:
    """The columns :func:`to_bytes` stored, with ``schema``'s dtypes."""
    (size,) = struct.unpack_from("<I", blob, 0)
    head = json.loads(bytes(blob[4:4 + size]))
    n, pos = int(head["n"]), 4 + size
    out: Cols = {}
    for (name, dtype), spec in zip(schema.items(), head["cols"]):
        if dtype == "object":
            _, words, where, code_type, sizes = spec
            buffers = []
            for kind, nbytes in zip([where, code_type] if where else [code_type], sizes):
                buffers.append(np.frombuffer(blob, dtype=kind, count=nbytes // np.dtype(kind).itemsize, offset=pos))
                pos += nbytes
            table = np.empty(len(words), dtype=object)
            table[:] = words
            if where:
                column = np.empty(n, dtype=object)  # None where no value was stored
                column[buffers[0]] = table[buffers[1]]
            else:
                column = table[buffers[0]]
            out[name] = column
            continue
        stored, base, nbytes, planes, first = spec if len(spec) == 5 else (*spec, False, None)
        size = np.dtype(stored).itemsize
        raw: np.ndarray
        if planes:
            plane_rows = np.frombuffer(blob, dtype=np.uint8, count=nbytes, offset=pos).reshape(size, nbytes // size)
            raw = np.ascontiguousarray(plane_rows.T).view(stored).reshape(-1)
        else:
            raw = np.frombuffer(blob, dtype=stored, count=nbytes // size, offset=pos)
        pos += nbytes
        if first is None:
            column = raw.astype(dtype)  # a copy: the state's arrays are written to
            if base is not None:
                column += np.asarray(base, dtype=dtype)  # wraps back exactly where the cast wrapped
        else:  # steps from the first value (int64 sums wrap back exactly as the steps wrapped)
            steps = np.empty(len(raw) + 1, dtype=np.int64)
            steps[0] = first
            steps[1:] = raw
            if base is not None:
                steps[1:] += np.int64(base)
            column = np.cumsum(steps).astype(dtype, copy=False)
        out[name] = column
    return out


def group_bounds(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end positions of runs of equal values in a sorted array."""
    n = len(sorted_keys)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    change = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    ends = np.concatenate([change, [n]]).astype(np.int64)
    return starts, ends
