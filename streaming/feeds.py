"""What the Kafka reader tasks hand to the stateful step: each fetch's rows, cut by state key.

The combined query's stateful operator is keyed by the concern and the part of the data its rules
need together: the fault state per (cluster, shard of its brokers), the lag state per (cluster,
shard of its consumer groups). The readers have the decoded events in Arrow already, so they cut
them by key themselves and Spark only shuffles small Arrow IPC chunks (one per key and fetch) to
the tasks that own the keys.

A key is a string: the concern's letter and the key's parts joined by :data:`SEP`. Spark sends a
key to the task of partition ``murmur3(key) mod spark.shuffle_partitions``; a few keys (the shards
of a cluster) hashed at random leave one task with three or four fault keys and another with none,
and the stage waits for the busy one. So a (cluster, shard) key ends with the smallest counter that
sends it to place ``(offset of its cluster + shard) mod`` :data:`PLACES` (:func:`placed`): its
cluster's shards then spread evenly over 1, 2, 4, 8 or 16 partitions (the default is 4).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import cache
from itertools import count

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.faults.events import with_removals

# how chunks of events and of table rows travel through Spark (the reader tasks import it from here)
from pipeline.ipc import ipc_bytes  # noqa: F401
from pipeline.lag.sends import per_second

SEP = "\x1f"
FAULTS, LAG, PASS = "f", "l", "_"
WRITTEN_KEY = PASS + SEP + "written"

# The send-result columns with few distinct values per chunk: sent dictionary-encoded.
FAULT_DICTIONARY = ("cluster", "producer_group", "client_id", "client_version", "topic", "broker_name",
                    "status", "error", "kafka_topic")
# What the lag step reads of each bronze table (see pipeline.lag.events.COLUMNS).
LAG_COLUMNS = {
    "send_results": ("ts_ms", "cluster", "topic", "broker_name", "queue_id", "queue_offset",
                     "kafka_topic", "kafka_partition", "kafka_offset", "kafka_ts_ms"),
    "consumer_progress": ("ts_ms", "cluster", "consumer_group", "topic", "broker_name", "queue_id",
                          "consumer_offset", "broker_offset", "client_id", "last_timestamp_ms",
                          "kafka_topic", "kafka_partition", "kafka_offset", "kafka_ts_ms"),
    "group_membership": ("ts_ms", "cluster", "consumer_group", "topic", "client_ids", "strategy",
                         "kafka_topic", "kafka_partition", "kafka_offset", "kafka_ts_ms"),
}
LAG_COORDINATES = ("kafka_topic", "kafka_partition", "kafka_offset")  # per_second's tie-break
LAG_DICTIONARY = ("cluster", "topic", "broker_name", "consumer_group", "client_id", "kafka_topic", "strategy")


PLACES = 16  # placed keys spread evenly over any number of partitions that divides this


def key_of(concern: str, *parts: object) -> str:
    return SEP.join([concern, *(str(p) for p in parts)])


@cache
def placed(concern: str, cluster: str, shard: int) -> str:
    """The key of a (cluster, shard) state: :func:`key_of` and the first counter that places it
    (see the module docstring). The same for every process and run: the state is stored under it."""
    base = key_of(concern, cluster, shard)
    target = (zlib.crc32(key_of(concern, cluster).encode()) + shard) % PLACES
    for n in count():
        key = base + SEP + str(n)
        if spark_hash(key.encode()) % PLACES == target:
            return key
    raise AssertionError("unreachable")


def spark_hash(data: bytes, seed: int = 42) -> int:
    """Spark's ``hash()`` of a string (Murmur3 x86 32-bit, ``Murmur3_x86_32.hashUnsafeBytes``: the
    bytes after the last whole 4-byte word are mixed in one at a time, as signed bytes); what its
    hash partitioning takes modulo the number of partitions. Only placement depends on it."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    def mix(h1: int, k1: int) -> int:
        k1 = rotl((k1 * 0xCC9E2D51) & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
        return (rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF

    h1, whole = seed & 0xFFFFFFFF, len(data) - len(data) % 4
    for i in range(0, whole, 4):
        h1 = mix(h1, int.from_bytes(data[i:i + 4], "little"))
    for b in data[whole:]:
        h1 = mix(h1, (b - 256 if b > 127 else b) & 0xFFFFFFFF)
    h1 ^= len(data)
    h1 = ((h1 ^ (h1 >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h1 = ((h1 ^ (h1 >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def parts_of(key: str) -> list[str]:
    return key.split(SEP)


def split_by(rows: pa.Table, columns: Sequence[str]) -> list[tuple[tuple[str, ...], pa.Table]]:
    """``rows`` cut into runs of equal values of ``columns`` (strings), in sorted order of them."""
    if rows.num_rows == 0:
        return []
    codes = np.zeros(rows.num_rows, dtype=np.int64)
    for name in columns:
        enc = pc.dictionary_encode(rows.column(name)).combine_chunks()
        size = len(enc.dictionary)
        # sort the dictionary so that keys come out in a stable order, whatever the rows' order
        rank = np.argsort(np.argsort(np.asarray(enc.dictionary.to_pylist(), dtype=object)))
        codes = codes * (size + 1) + rank[enc.indices.to_numpy(zero_copy_only=False)]
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    taken = rows.take(pa.array(order))
    out = []
    for lo, hi in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(order)]]).tolist()):
        part = taken.slice(lo, hi - lo)
        values = tuple(str(part.column(name)[0].as_py()) for name in columns)
        out.append((values, part))
    return out


def encode_dictionary(rows: pa.Table, names: Sequence[str]) -> pa.Table:
    arrays = [pc.dictionary_encode(rows.column(i)) if name in names else rows.column(i)
              for i, name in enumerate(rows.schema.names)]
    return pa.Table.from_arrays(arrays, names=rows.schema.names)


def fault_feed(send_results: pa.Table, columns: Sequence[str], shards: int) -> list[tuple[str, str, pa.Table]]:
    """(key, table, rows) per (cluster, shard): the fault step's columns of the send results and of
    the fault items their clients removed (:func:`pipeline.faults.events.with_removals`), with the
    brokers of a cluster spread over ``shards`` keys by a hash of their name."""
    out: list[tuple[str, str, pa.Table]] = []
    if send_results.num_rows == 0:
        return out
    send_results = with_removals(send_results)  # before the spread: a removed broker may be another key's
    names = send_results.column("broker_name").combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = pc.dictionary_encode(names)
    shards_of = shard_of(names.dictionary, shards)  # per distinct broker, not per row
    # each row's shard as an index into the shards' names: no string made or hashed per row
    shard = pa.DictionaryArray.from_arrays(pa.array(shards_of[names.indices.to_numpy(zero_copy_only=False)], pa.int32()),
                                           pa.array([str(s) for s in range(max(shards, 1))]))
    # encoded once for the whole fetch: every piece then shares the fetch's (small) dictionaries
    slim = encode_dictionary(send_results.select(list(columns)), FAULT_DICTIONARY).append_column("_shard", shard)
    for (cluster, s), part in split_by(slim, ("cluster", "_shard")):
        out.append((placed(FAULTS, cluster, int(s)), "send_results", part.drop_columns(["_shard"])))
    return out


def shard_of(names: pa.Array, shards: int) -> np.ndarray:
    """The shard of each name (a broker, a consumer group): CRC-32 of it, stable across processes."""
    if shards <= 1:
        return np.zeros(len(names), dtype=np.int64)
    return np.asarray([zlib.crc32(str(n).encode()) % shards for n in names.to_pylist()], dtype=np.int64)


def lag_feed(tables: dict[str, pa.Table], shards: int) -> list[tuple[str, str, pa.Table]]:
    """(key, table, rows) per (cluster, shard) of what the lag step reads; send results go to
    every shard of their cluster (they are shared by every group consuming the topic), at most two
    per queue and second (:func:`pipeline.lag.sends.per_second`)."""
    out = []
    for name in sorted(tables):
        if name not in LAG_COLUMNS:
            continue
        rows = encode_dictionary(tables[name].select(list(LAG_COLUMNS[name])), LAG_DICTIONARY)
        if name == "send_results":
            rows = per_second(rows, LAG_COORDINATES)
        if name == "send_results" or shards <= 1:
            for (cluster,), part in split_by(rows, ("cluster",)):
                out += [(placed(LAG, cluster, s), name, part) for s in range(max(1, shards))]
            continue
        shard = pa.array(shard_of(rows.column("consumer_group"), shards).astype(str))
        for (cluster, s), part in split_by(rows.append_column("_shard", shard), ("cluster", "_shard")):
            out.append((placed(LAG, cluster, int(s)), name, part.drop_columns(["_shard"])))
    return out


def plain(rows: pa.Table) -> pa.Table:
    """Dictionary columns decoded back to their value type (what the pure steps expect)."""
    if not any(pa.types.is_dictionary(f.type) for f in rows.schema):
        return rows
    arrays = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c
              for c in (col.combine_chunks() for col in rows.columns)]
    return pa.Table.from_arrays(arrays, names=rows.schema.names)
