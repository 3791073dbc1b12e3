"""The fault state as one row of Spark's state store, and back.

Tables travel as Arrow IPC streams (:mod:`pipeline.ipc`): columnar, typed, cheap to write and read,
and free of Python class paths, so moving a module never breaks a checkpoint (pickle would).
Integer columns are narrowed to offsets from their minimum (:func:`frame.to_arrow`), which makes
them small enough that compressing them costs more than it saves (Spark compresses its state
files itself).
Scalars and the small dictionaries (broker names, client versions, error classes) travel as JSON.
An empty table travels as no bytes (each key is encoded and decoded every micro-batch).
A changed layout bumps :data:`STATE_VERSION`; an unknown version fails loudly instead of misreading
a checkpoint.
"""

from __future__ import annotations

import json
import struct
from functools import cache
from typing import Any

import pyarrow as pa

from pipeline.faults.episodes import EPISODE_SCHEMA
from pipeline.faults.fleet import FleetState
from pipeline.faults.frame import empty, from_arrow, nrows, to_arrow
from pipeline.faults.pairs import LOG_SCHEMA, PAIR_SCHEMA
from pipeline.faults.state import FaultState
from pipeline.faults.windows import WINDOW_SCHEMA
from pipeline.ipc import ipc_bytes, ipc_table

STATE_VERSION = 2  # 2: integer columns narrowed, no compression; 1 (zstd) is still read
_READS = (1, STATE_VERSION)
# One row for the whole query: the watermark and every cluster's state (see pipeline.faults.fleet).
# (Array columns in a pandas state schema fail in PySpark 4.3's worker: KeyError 'elementType'.)
STATE_DDL = "version INT, watermark_ms BIGINT, clusters STRING, states BINARY"
_TABLES = (("pairs", PAIR_SCHEMA), ("log", LOG_SCHEMA), ("windows", WINDOW_SCHEMA), ("episodes", EPISODE_SCHEMA))
_SCALARS = ("cluster", "watermark_ms", "next_serial", "next_pair", "next_minute", "last_tick")
_NAMES = ("brokers", "versions", "errors")


def encode_state(state: FaultState) -> tuple[Any, ...]:
    """(version, header JSON, pairs, log, windows, episodes) of one cluster."""
    header = {name: getattr(state, name) for name in _SCALARS}
    header.update({name: list(getattr(state, name)) for name in _NAMES})
    header["suspects"] = [list(x) for x in state.suspects]
    header["ahead_tick"] = state.ahead_tick
    blobs = [_table_blob(getattr(state, name), schema) for name, schema in _TABLES]
    return (STATE_VERSION, json.dumps(header), *blobs)


# An empty table is stored as no bytes: an IPC stream of no rows still costs ~1.5 kB and ~0.5 ms
# each way (schema, zstd frames), and most brokers' windows and episodes are empty most batches.
def _table_blob(cols: Any, schema: Any) -> bytes:
    return ipc_bytes(to_arrow(cols, schema, narrow=True)) if nrows(cols) else b""


@cache
def _no_rows(name: str) -> pa.RecordBatch:
    """What an empty table decoded to when it was stored as an IPC stream (types included)."""
    schema = dict(_TABLES)[name]
    return to_arrow(empty(schema), schema)


def _table(name: str, schema: Any, blob: Any) -> Any:
    return from_arrow(ipc_table(bytes(blob)) if len(blob) else _no_rows(name), schema)


def decode_state(row: tuple[Any, ...]) -> FaultState:
    version = row[0]
    if version not in _READS:
        raise ValueError(
            f"fault state version {version} in the checkpoint; this code reads versions {_READS}. "
            "Start the faults query with a new checkpoint (it rebuilds from Kafka's retained events)."
        )
    header = json.loads(row[1])
    tables: dict[str, Any] = {name: _table(name, schema, blob) for (name, schema), blob in zip(_TABLES, row[2:])}
    names: dict[str, Any] = {name: tuple(header[name]) for name in _NAMES}
    return FaultState(
        **{name: header[name] for name in _SCALARS},
        **names,
        suspects=tuple((int(b), int(o), int(r), bool(a), str(why)) for b, o, r, a, why in header.get("suspects", [])),
        ahead_tick=int(header.get("ahead_tick", -1)),
        **tables,
    )


def state_bytes(row: tuple[Any, ...]) -> int:
    """Size of an encoded cluster state (:func:`encode_state`) or fleet state (:func:`encode_fleet`)."""
    if len(row) == 4:
        return len(row[2]) + len(row[3])
    return len(row[1]) + sum(len(b) for b in row[2:])


def _pack(chunks: list[bytes]) -> bytes:
    """Length-prefixed blobs in one."""
    head = struct.pack(f"<I{len(chunks)}Q", len(chunks), *(len(c) for c in chunks))
    return head + b"".join(chunks)


def _unpack(blob: bytes) -> list[bytes]:
    (count,) = struct.unpack_from("<I", blob, 0)
    sizes = struct.unpack_from(f"<{count}Q", blob, 4)
    pos = 4 + 8 * count
    chunks = []
    for size in sizes:
        chunks.append(blob[pos:pos + size])
        pos += size
    return chunks


def _cluster_blob(state: FaultState) -> bytes:
    parts = encode_state(state)
    return _pack([parts[1].encode(), *(bytes(b) for b in parts[2:])])


def _cluster_state(blob: bytes) -> FaultState:
    chunks = _unpack(blob)
    return decode_state((STATE_VERSION, chunks[0].decode(), *chunks[1:]))


def encode_fleet(fleet: FleetState) -> tuple[Any, ...]:
    """A tuple matching :data:`STATE_DDL`."""
    names = sorted(fleet.clusters)
    return (STATE_VERSION, fleet.watermark_ms, json.dumps(names),
            _pack([_cluster_blob(fleet.clusters[n]) for n in names]))


def decode_fleet(row: Any) -> FleetState:
    version = row[0]
    if version not in _READS:
        raise ValueError(
            f"fault state version {version} in the checkpoint; this code reads versions {_READS}. "
            "Start the faults query with a new checkpoint (it rebuilds from Kafka's retained events)."
        )
    names = json.loads(row[2])
    clusters = {name: _cluster_state(blob) for name, blob in zip(names, _unpack(bytes(row[3])))}
    return FleetState(int(row[1]), clusters)
