"""The lag state as a row of bytes for Spark's state store, and back.

Each table is one Arrow IPC stream (:mod:`pipeline.ipc`, zstd-compressed): columnar, typed, fast to
write and read, and independent of Python class paths, so renaming a module never breaks a
checkpoint (pickle would).
``STATE_VERSION`` changes when the layout does; an unknown version fails loudly, naming it.
``STATE_DDL`` is the Spark state schema (a DDL string, so this module imports no pyspark).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.ipc import ipc_bytes, ipc_table
from pipeline.lag.brokers import BrokerSamples
from pipeline.lag.offsets import OffsetIndex
from pipeline.lag.registry import GROUPS, MEMBERS, PAIRS, QUEUES, LagState
from pipeline.lag.table import Table
from pipeline.lag.window import Windows

STATE_VERSION = 1
STATE_DDL = (
    "version INT, cluster STRING, clock_ms BIGINT, next_qkey BIGINT, names BINARY, queues BINARY, "
    "offset_index BINARY, pairs BINARY, members BINARY, groups BINARY"
)
_LISTS = {"client_ids", "idle"}
_NAME_KINDS = ("group", "topic", "broker")


def _to_ipc(columns: Mapping[str, Any]) -> bytes:
    return ipc_bytes(pa.record_batch(dict(columns)), compress=True)


def _arrow(name: str, values: np.ndarray, dtype: str) -> pa.Array:
    if name in _LISTS:
        return pa.array([None if v is None else list(v) for v in values], type=pa.list_(pa.string()))
    if dtype == "object":  # few distinct client ids over 200,000 rows: store them once
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        return pa.DictionaryArray.from_arrays(
            pa.array(codes.astype(np.int32), mask=codes < 0),
            pa.array(np.asarray(uniques, dtype=object), pa.string()),
        )
    return pa.array(values)


def _numpy(column: pa.ChunkedArray, name: str, dtype: str) -> np.ndarray:
    if name in _LISTS:
        out = np.empty(len(column), dtype=object)
        out[:] = [None if v is None else tuple(v) for v in column.to_pylist()]
        return out
    if dtype == "object":
        arr = column.combine_chunks()
        if not pa.types.is_dictionary(arr.type):
            return arr.to_numpy(zero_copy_only=False).astype(object)
        words = np.append(np.asarray(arr.dictionary.to_pylist(), dtype=object), None)  # type: ignore[call-overload]  # numpy's stubs read a None value as the omitted argument
        codes = arr.indices.fill_null(-1).to_numpy()
        return words[codes]  # -1 picks the trailing None
    return column.to_numpy().astype(dtype)


def _table_bytes(table: Table, schema: Mapping[str, str]) -> bytes:
    return _to_ipc({name: _arrow(name, table[name], dtype) for name, dtype in schema.items()})


def _table_from(blob: bytes, schema: Mapping[str, str]) -> Table:
    t = ipc_table(blob)
    return Table({name: _numpy(t.column(name), name, dtype) for name, dtype in schema.items()})


def _broker_columns(b: BrokerSamples) -> dict[str, pa.Array]:
    return {
        "bo_slot": pa.FixedSizeListArray.from_arrays(pa.array(b.slot.ravel(), pa.int64()), b.size),
        "bo_offset": pa.FixedSizeListArray.from_arrays(pa.array(b.offset.ravel(), pa.int64()), b.size),
    }


def _brokers_from(t: pa.Table, size: int) -> BrokerSamples:
    """The queues' broker offset samples; a state written before they existed has none yet."""
    if "bo_slot" not in t.column_names:
        return BrokerSamples.empty(len(t), size)
    width = t.schema.field("bo_slot").type.list_size

    def matrix(name: str) -> np.ndarray:
        return t.column(name).combine_chunks().flatten().to_numpy().reshape(len(t), width).astype(np.int64)

    return BrokerSamples(matrix("bo_slot"), matrix("bo_offset")).resized(size)


def _window_columns(w: Windows) -> dict[str, pa.Array]:
    size = w.size
    return {
        "w_ts": pa.FixedSizeListArray.from_arrays(pa.array(w.ts.ravel()), size),
        "w_offset": pa.FixedSizeListArray.from_arrays(pa.array(w.offset.ravel()), size),
        "w_lag": pa.FixedSizeListArray.from_arrays(pa.array(w.lag.ravel()), size),
        "w_count": pa.array(w.count),
    }


def _windows_from(t: pa.Table) -> Windows:
    size = t.schema.field("w_ts").type.list_size

    def matrix(name: str) -> np.ndarray:
        flat = t.column(name).combine_chunks().flatten().to_numpy()
        return flat.reshape(len(t), size).astype(np.int64)

    return Windows(
        matrix("w_ts"), matrix("w_offset"), matrix("w_lag"), t.column("w_count").to_numpy().astype(np.int64)
    )


def encode_state(state: LagState) -> tuple[Any, ...]:
    """The state as a tuple matching :data:`STATE_DDL`."""
    names = [
        (k, n)
        for k, arr in zip(_NAME_KINDS, (state.group_names, state.topic_names, state.broker_names))
        for n in arr
    ]
    pairs = {name: _arrow(name, state.pairs[name], dtype) for name, dtype in PAIRS.items()}
    return (
        STATE_VERSION,
        state.cluster,
        state.clock_ms,
        state.next_qkey,
        _to_ipc(
            {
                "kind": pa.array([k for k, _ in names], pa.string()),
                "name": pa.array([n for _, n in names], pa.string()),
            }
        ),
        _to_ipc(
            {
                **{name: _arrow(name, state.queues[name], dtype) for name, dtype in QUEUES.items()},
                **_broker_columns(state.brokers),
            }
        ),
        _to_ipc(
            {
                "qkey": pa.array(state.index.qkey),
                "offset": pa.array(state.index.offset),
                "store_ms": pa.array(state.index.store_ms),
            }
        ),
        _to_ipc({**pairs, **_window_columns(state.windows)}),
        _table_bytes(state.members, MEMBERS),
        _table_bytes(state.groups, GROUPS),
    )


def decode_state(row: tuple[Any, ...] | Mapping[str, Any], window_size: int) -> LagState:
    """A state from :func:`encode_state`'s tuple (or Spark's Row), windows resized to ``window_size``."""
    values = tuple(row.values()) if isinstance(row, Mapping) else tuple(row)
    version, cluster, clock_ms, next_qkey, names, queues, index, pairs, members, groups = values
    if version != STATE_VERSION:
        raise ValueError(f"lag state version {version} is not supported (this code reads {STATE_VERSION})")
    nt = ipc_table(names)
    kinds = np.array(nt.column("kind").to_pylist(), dtype=object)
    all_names = np.array(nt.column("name").to_pylist(), dtype=object)
    it = ipc_table(index)
    pt = ipc_table(pairs)
    qt = ipc_table(queues)
    return LagState(
        cluster=cluster,
        clock_ms=int(clock_ms),
        next_qkey=int(next_qkey),
        group_names=all_names[kinds == "group"],
        topic_names=all_names[kinds == "topic"],
        broker_names=all_names[kinds == "broker"],
        queues=Table({name: _numpy(qt.column(name), name, dtype) for name, dtype in QUEUES.items()}),
        brokers=_brokers_from(qt, window_size),
        index=OffsetIndex(
            *(it.column(c).to_numpy().astype(np.int64) for c in ("qkey", "offset", "store_ms"))
        ),
        pairs=Table({name: _numpy(pt.column(name), name, dtype) for name, dtype in PAIRS.items()}),
        windows=_windows_from(pt).resized(window_size),
        members=_table_from(members, MEMBERS),
        groups=_table_from(groups, GROUPS),
    )
