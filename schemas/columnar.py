"""Validate many decoded JSON objects at once, column by column.

:func:`schemas.fields.check_record` is the definition of validity and of every rejection reason.
This module is a faster route to the same verdicts for whole batches: it checks each column with
C-level operations (type sets, Arrow compute) and flags *suspect* rows; every suspect row is then
re-checked by ``check_record``, which decides and names the reason. A row this module passes is
valid by ``check_record`` too (a property test holds the two together).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.fields import Field

_ALLOWED_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "int64": frozenset({int}),
    "int32": frozenset({int}),
    "float64": frozenset({int, float}),
    "bool": frozenset({bool}),
}
_NONE = type(None)
_INT64_MAX = 2**63 - 1


def validate_columns(fields: Sequence[Field], objs: Sequence[Any]) -> tuple[dict[str, pa.Array], set[int]]:
    """Build one Arrow array per field from ``objs`` and return them with the suspect row indexes.

    Suspect rows are included in the arrays as nulls where their value could not be converted;
    callers drop them (or re-check them with ``check_record``) before using the arrays.
    """
    fast = _whole_batch(fields, objs)
    return fast if fast is not None else _field_by_field(fields, objs)


# Types Arrow would convert although check_record refuses them: a float in an integer column (1.0
# becomes 1), a bool in a float column (True becomes 1.0), a string or a dict in a list column (a
# sequence of characters, of keys). Every other wrong type makes Arrow raise.
_SILENTLY_CONVERTED: dict[str, frozenset[type]] = {
    "int64": frozenset({float}), "int32": frozenset({float}), "float64": frozenset({bool}),
    "list<string>": frozenset({str, dict, bytes, tuple}),
}
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)


def _whole_batch(fields: Sequence[Field], objs: Sequence[Any]) -> tuple[dict[str, pa.Array], set[int]] | None:
    """The common case in one C-level pass: every object a dict whose values all have the field's type.

    The objects become one Arrow struct array; the value rules then run on its columns. None when
    the batch needs the field-by-field route (a non-dict, or a value of a wrong type somewhere).
    """
    if not objs or set(map(type, objs)) != {dict}:
        return None
    odd, held = _odd_types(fields, objs)
    if odd:
        return None
    try:
        struct = pa.array(objs, pa.struct([(f.name, f.arrow_type) for f in fields]))
    except _CONVERSION_ERRORS:
        return None
    n = len(objs)
    suspects: set[int] = set()
    arrays: dict[str, pa.Array] = {}
    unsure: list[str] = []  # required fields with nulls: null values, or missing somewhere?
    for i, f in enumerate(fields):
        arr = struct.field(i)
        if arr.null_count:
            if not f.nullable:
                suspects.update(_true_indexes(arr.is_null()) or ())
            elif f.required and f.name not in held:
                unsure.append(f.name)
        if f.kind == "list<string>":
            elements = arr.flatten()  # a null element (JSON null in the list) is not a string
            if elements.null_count:
                parents = pc.list_parent_indices(arr).to_numpy()
                suspects.update(parents[elements.is_null().to_numpy(zero_copy_only=False)].tolist())
        else:
            suspects.update(_bounds_violations(f, arr) or ())
        if f.kind == "string":
            suspects.update(_string_violations(f, arr) or ())
        arrays[f.name] = arr
    if unsure and not _held_by_all(objs, unsure):
        for name in unsure:
            if sum(map(dict.__contains__, objs, repeat(name))) < n:
                suspects.update(i for i, o in enumerate(objs) if name not in o)
    return arrays, suspects


def _held_by_all(objs: Sequence[dict[str, Any]], names: list[str]) -> bool:
    """True if every object holds every key of ``names`` (one pass for all of them)."""
    try:
        deque(map(itemgetter(*names), objs), maxlen=0)
    except KeyError:
        return False
    return True


def _odd_types(fields: Sequence[Field], objs: Sequence[dict[str, Any]]) -> tuple[bool, set[str]]:
    """True if a value somewhere has a type Arrow would convert silently (``_SILENTLY_CONVERTED``);
    and the names of the fields every object was found to hold on the way."""
    held: set[str] = set()
    for odd in set(_SILENTLY_CONVERTED.values()):
        names = [f.name for f in fields if _SILENTLY_CONVERTED.get(f.kind) == odd]
        if not names:
            continue
        try:  # the fields of one kind together: one tuple per object, not a pass per field
            values: Any = map(itemgetter(names[0]), objs) if len(names) == 1 else chain.from_iterable(
                map(itemgetter(*names), objs))
            if not odd.isdisjoint(map(type, values)):
                return True, held
            held.update(names)
        except KeyError:  # a field missing somewhere: field by field, a missing value counting as None
            if any(not odd.isdisjoint(map(type, map(dict.get, objs, repeat(name)))) for name in names):
                return True, held
    return False, held


def _field_by_field(fields: Sequence[Field], objs: Sequence[Any]) -> tuple[dict[str, pa.Array], set[int]]:
    """Each field's values checked by type in Python, then converted: finds the odd rows of any batch."""
    suspects: set[int] = {i for i, o in enumerate(objs) if type(o) is not dict}
    if suspects:
        objs = [o if type(o) is dict else {} for o in objs]
    n = len(objs)
    arrays: dict[str, pa.Array] = {}
    for f in fields:
        name = f.name
        values = list(map(dict.get, objs, repeat(name)))
        if f.kind == "list<string>":
            for i, v in enumerate(values):
                if v is None or type(v) is not list or not all(type(x) is str for x in v):
                    if v is not None or not f.nullable or (f.required and name not in objs[i]):
                        suspects.add(i)
                    values[i] = None
            arrays[name] = pa.array(values, f.arrow_type)
            continue
        allowed = _ALLOWED_TYPES[f.kind]
        kinds = set(map(type, values))
        if not kinds <= allowed | {_NONE}:
            for i, v in enumerate(values):
                if type(v) not in allowed and v is not None:
                    suspects.add(i)
                    values[i] = None
        if _NONE in kinds:
            if not f.nullable:
                suspects.update(i for i, v in enumerate(values) if v is None)
            elif f.required and sum(map(dict.__contains__, objs, repeat(name))) < n:
                suspects.update(i for i, o in enumerate(objs) if name not in o)
        if f.kind in ("int64", "int32"):
            arr = _int_array(f, values, suspects)
        else:
            arr = pa.array(values, f.arrow_type)
            bad = _bounds_violations(f, arr)
            if bad is not None:
                suspects.update(bad)
        if f.kind == "string":
            bad = _string_violations(f, arr)
            if bad is not None:
                suspects.update(bad)
        arrays[name] = arr
    return arrays, suspects


def _int_array(f: Field, values: list[Any], suspects: set[int]) -> pa.Array:
    """Integers checked against the field's bounds in Arrow; violators become null suspects."""
    try:
        wide = pa.array(values, pa.int64())
    except OverflowError:  # beyond int64: find them the slow way
        for i, v in enumerate(values):
            if v is not None and not -_INT64_MAX <= v <= _INT64_MAX:
                suspects.add(i)
                values[i] = None
        wide = pa.array(values, pa.int64())
    bad = _bounds_violations(f, wide)
    if bad is not None:
        suspects.update(bad)
        mask = pa.array(_mask(len(values), bad), pa.bool_())
        wide = pc.if_else(mask, pa.scalar(None, pa.int64()), wide)
    return wide.cast(f.arrow_type)


def _mask(n: int, indexes: list[int]) -> list[bool]:
    out = [False] * n
    for i in indexes:
        out[i] = True
    return out


def _bounds_violations(f: Field, arr: pa.Array) -> list[int] | None:
    if f.min is None and f.max is None:
        return None
    low, high = _min_max(arr)
    if low is None or ((f.min is None or low >= f.min) and (f.max is None or high <= f.max)):
        return None  # the common case in one pass: every value within bounds
    mask = None
    if f.min is not None:
        mask = pc.less(arr, f.min)
    if f.max is not None:
        over = pc.greater(arr, f.max)
        mask = over if mask is None else pc.or_(mask, over)
    return _true_indexes(mask)


def _string_violations(f: Field, arr: pa.Array) -> list[int] | None:
    lengths = pc.utf8_length(arr)
    low, high = _min_max(lengths)
    if low is None or (low > 0 and (f.max_len is None or high <= f.max_len) and (
            f.enum is None or set(pc.unique(arr).drop_null().to_pylist()) <= set(f.enum))):
        return None  # the common case in a few passes: no empty, long or unknown string
    mask = pc.equal(lengths, 0)
    if f.max_len is not None:
        mask = pc.or_(mask, pc.greater(lengths, f.max_len))
    if f.enum is not None:
        mask = pc.or_(mask, pc.invert(pc.is_in(arr, value_set=pa.array(list(f.enum), pa.string()))))
    return _true_indexes(mask)


def _min_max(arr: pa.Array) -> tuple[Any, Any]:
    """The smallest and largest non-null value; (None, None) when there is none."""
    both = pc.min_max(arr)
    return both["min"].as_py(), both["max"].as_py()


def _true_indexes(mask: pa.Array | None) -> list[int] | None:
    if mask is None:
        return None
    mask = pc.fill_null(mask, False)
    if not pc.any(mask).as_py():
        return None
    return pc.indices_nonzero(mask).to_pylist()
