"""The fault state as one row of Spark's state store, and back.

Every micro-batch decodes and encodes each key's whole state, so the layout is the one that costs
least both ways: each table's columns as they lie in memory (:func:`frame.to_bytes`), integers
narrowed to offsets from their minimum (serials, times and offsets to steps from row to row),
wide values in byte planes, strings as a dictionary over the rows that hold one, the whole
zstd-compressed (level 1). Spark hands a state to the Python worker through a pickler that copies a
binary value byte by byte into a string and encodes that as UTF-8, and every byte crosses back, is
copied into the state store and written to its files, which costs the JVM more per byte than
compressing costs Python, so every byte the layout saves counts: zstd's entropy coding stores the
random producer pairs, brokers and latencies of a live fault key in far fewer bytes than LZ4
(docs/performance.md, 2026-11-27 (17)). No Python class paths are stored,
so moving a module never breaks a checkpoint (pickle would). Scalars and the small dictionaries
(broker names, client versions, error classes) travel as JSON. An empty table travels as no bytes.
A changed layout bumps :data:`STATE_VERSION`; older versions are still read, and an unknown one
fails loudly instead of misreading a checkpoint.
"""

from __future__ import annotations

import json
import struct
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.faults.episodes import EPISODE_SCHEMA, EPISODE_SCHEMA_V5, NEVER
from pipeline.faults.fleet import FleetState
from pipeline.faults.frame import empty, from_arrow, from_bytes, nrows, to_arrow, to_bytes
from pipeline.faults.pairs import LOG_SCHEMA, PAIR_SCHEMA
from pipeline.faults.state import FaultState
from pipeline.faults.windows import WINDOW_SCHEMA
from pipeline.ipc import ipc_table

# 6: as 5, open episodes with last_heard and recovering; 5: as 4, zstd instead of LZ4; 4: as 3, integer columns as steps where narrower, wide values in
# byte planes (frame.to_bytes's packed layout); 3: columns as raw bytes (frame.to_bytes), LZ4;
# 2: Arrow IPC, integers narrowed; 1: Arrow IPC, zstd
STATE_VERSION = 6
_READS = (1, 2, 3, 4, 5, STATE_VERSION)
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
    blobs = [_compressed(to_bytes(getattr(state, name), schema)) if nrows(getattr(state, name)) else b""
             for name, schema in _TABLES]
    return (STATE_VERSION, json.dumps(header), *blobs)


_LZ4 = pa.Codec("lz4")
_ZSTD = pa.Codec("zstd", compression_level=1)


def _codec(version: int) -> Any:
    return _ZSTD if version >= 5 else _LZ4


def _compressed(raw: bytes, version: int = STATE_VERSION) -> bytes:
    return struct.pack("<Q", len(raw)) + _codec(version).compress(raw, asbytes=True)


def _decompressed(blob: Any, version: int = STATE_VERSION) -> bytes:
    (size,) = struct.unpack_from("<Q", blob, 0)
    return _codec(version).decompress(memoryview(blob)[8:], decompressed_size=size, asbytes=True)


@cache
def _no_rows(name: str) -> pa.RecordBatch:
    """What an empty table decoded to when it was stored as an IPC stream (types included)."""
    schema = dict(_TABLES)[name]
    return to_arrow(empty(schema), schema)


def _table(name: str, schema: Any, blob: Any, version: int) -> Any:
    if not len(blob):
        return from_arrow(_no_rows(name), schema)
    if name == "episodes" and version < 6:
        return _episodes_v5(_stored(EPISODE_SCHEMA_V5, blob, version))
    return _stored(schema, blob, version)


def _stored(schema: Any, blob: Any, version: int) -> Any:
    return from_bytes(_decompressed(blob, version), schema) if version >= 3 else from_arrow(ipc_table(bytes(blob)), schema)


def _episodes_v5(cols: Any) -> Any:
    """Open episodes stored before version 6: heard of last at their last signal, no healthy stretch."""
    return {**cols, "last_heard": cols["last_signal"].copy(),
            "recovering": np.full(len(cols["last_signal"]), NEVER, dtype=np.int64)}


def decode_state(row: tuple[Any, ...]) -> FaultState:
    version = row[0]
    if version not in _READS:
        raise ValueError(
            f"fault state version {version} in the checkpoint; this code reads versions {_READS}. "
            "Start the faults query with a new checkpoint (it rebuilds from Kafka's retained events)."
        )
    header = json.loads(row[1])
    tables: dict[str, Any] = {name: _table(name, schema, blob, version)
                              for (name, schema), blob in zip(_TABLES, row[2:])}
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


def _cluster_state(blob: bytes, version: int) -> FaultState:
    chunks = _unpack(blob)
    return decode_state((version, chunks[0].decode(), *chunks[1:]))


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
    clusters = {name: _cluster_state(blob, version) for name, blob in zip(names, _unpack(bytes(row[3])))}
    return FleetState(int(row[1]), clusters)
