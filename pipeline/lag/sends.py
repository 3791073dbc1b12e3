"""What the lag state needs of the send results: per queue and second, the lowest and highest offset.

The lag step reads a send result as "queue Q exists, was seen at ``ts_ms`` and holds message
``queue_offset``": the queue's registration and idle expiry, its max offset, points of its
(offset -> store time) index, and its broker-offset samples. At one-second resolution two sends
per (cluster, topic, broker, queue id, second) say all of that: the one with the lowest and the
one with the highest ``queue_offset`` (both ends, so that a consumer offset inside a second that
follows a gap is interpolated within that second, not across the gap), or, in a second without
any stored message, one failed send (the queue was still there). Seconds end on whole seconds,
``(t - 1000, t]``, as the grid's intervals do, so a second never straddles a grid point.

The rule is associative, with ties broken by the earliest ``ts_ms`` and then the lowest Kafka
coordinates: the readers apply it to each fetch and the lag key again to what it gathered for a
grid interval, so the rows kept do not depend on how the events were cut into fetches, tasks and
micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lag.table import unique_ints

SECOND_MS = 1000
QUEUE = ("cluster", "topic", "broker_name", "queue_id")
I64 = np.int64


def per_second(sends: pa.Table, coordinates: Sequence[str]) -> pa.Table:
    """At most two send results per queue and second (module doc); ``coordinates`` names the Kafka
    topic, partition and offset columns (the tie-break: the bronze and the lag step name them apart)."""
    n = sends.num_rows
    if n <= 1:
        return sends
    group = _queue_seconds(sends)
    order = np.argsort(group)
    group = group[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    sizes = np.diff(np.r_[starts, n])
    high = _ints(sends, "queue_offset")[order]  # -1 (failed) ranks lowest
    low = np.where(high >= 0, high, np.iinfo(I64).max)  # ... and here highest
    kept = [_first_of_each(sends, order[best], group[best], coordinates)
            for best in (high == np.repeat(np.maximum.reduceat(high, starts), sizes),
                         low == np.repeat(np.minimum.reduceat(low, starts), sizes))]
    rows = unique_ints(np.concatenate(kept))  # (np.unique hashes: ~3x the whole cut's time at 100x)
    return sends if len(rows) == n else sends.take(pa.array(rows))


def _first_of_each(sends: pa.Table, positions: np.ndarray, group: np.ndarray, coordinates: Sequence[str]) -> np.ndarray:
    """Of the rows at ``positions`` (sorted by ``group``), the earliest of each group, then the one
    first in Kafka."""
    if len(group) < 2 or (group[1:] != group[:-1]).all():
        return positions
    rows = sends.take(pa.array(positions))
    topic, partition, offset = coordinates
    order = np.lexsort((_ints(rows, offset), _ints(rows, partition), _rank(rows.column(topic)),
                        _ints(rows, "ts_ms"), group))
    first = np.r_[True, group[order][1:] != group[order][:-1]]
    return positions[order[first]]


def _queue_seconds(sends: pa.Table) -> np.ndarray:
    """An integer per (cluster, topic, broker, queue id, second) of the rows."""
    parts = [-(-_ints(sends, "ts_ms") // SECOND_MS), *(_codes(sends.column(c)) for c in QUEUE[:3]),
             _ints(sends, "queue_id")]
    key = np.zeros(len(parts[0]), dtype=I64)
    room = 1
    for part in parts:
        low = int(part.min())
        size = int(part.max()) - low + 1
        room *= size
        if room >= 2**62:  # (seconds centuries apart): number the distinct tuples instead
            return np.unique(np.stack(parts), axis=1, return_inverse=True)[1].ravel().astype(I64)
        key = key * size + (part - low)
    return key


def _ints(rows: pa.Table, name: str) -> np.ndarray:
    """An integer column as int64, -1 for null (offsets, ids and times are never negative)."""
    column = rows.column(name)
    if pa.types.is_null(column.type):
        return np.full(rows.num_rows, -1, dtype=I64)
    if column.null_count:
        column = pc.fill_null(column, -1)
    return column.to_numpy().astype(I64, copy=False)


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """Equal codes for equal text within ``column`` (-1 for null)."""
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    return _indices(encoded.combine_chunks())


def _rank(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's text ranked in sorted order (-1 for null): an order that holds across calls."""
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    array = encoded.combine_chunks()
    words = np.asarray(array.dictionary.to_pylist(), dtype=object)
    rank = np.append(np.argsort(np.argsort(words, kind="stable")), -1).astype(I64)
    return rank[_indices(array)]


def _indices(array: pa.DictionaryArray) -> np.ndarray:
    return pc.fill_null(array.indices, -1).cast(pa.int64()).to_numpy()
