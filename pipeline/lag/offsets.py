"""What we know about a queue's messages: its max offset and a bounded (offset -> store time) index.

A send result says "message ``queue_offset`` was stored at about ``ts_ms``", and a progress event's
``last_timestamp_ms`` is the broker's store time of message ``consumer_offset - 1``. Both are points
of the index; the queue's max offset is the highest ``queue_offset + 1`` or ``broker_offset`` seen.

Every function works on whole arrays of queues at once (queues are integer ``qkey`` values): a
batch touches tens of thousands of queues and a Python loop per queue would dominate the cost.
The index keeps at most ``max_points`` per queue: the newest half at full resolution, the older
half thinned by two each time it overflows, so spacing grows with age and a consumer that is hours
behind still finds a point near its offset. The oldest point is always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.lag.model import UNKNOWN

I64 = np.int64


@dataclass(frozen=True)
class OffsetIndex:
    """Points sorted by (qkey, offset); store times never decrease with the offset within a queue."""

    qkey: np.ndarray
    offset: np.ndarray
    store_ms: np.ndarray

    @staticmethod
    def empty() -> OffsetIndex:
        z = np.empty(0, dtype=I64)
        return OffsetIndex(z, z, z)

    def __len__(self) -> int:
        return len(self.qkey)

    def take(self, mask_or_positions: np.ndarray) -> OffsetIndex:
        return OffsetIndex(
            self.qkey[mask_or_positions], self.offset[mask_or_positions], self.store_ms[mask_or_positions]
        )

    def segments(self, qkeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[start, end) of each queue's points."""
        return (
            np.searchsorted(self.qkey, qkeys, side="left"),
            np.searchsorted(self.qkey, qkeys, side="right"),
        )

    def points_of(self, qkey: int) -> list[tuple[int, int]]:
        """One queue's (offset, store_ms) points, for tests and debugging."""
        lo, hi = self.segments(np.array([qkey], dtype=I64))
        return list(zip(self.offset[lo[0] : hi[0]].tolist(), self.store_ms[lo[0] : hi[0]].tolist()))


def segmented_search(values: np.ndarray, start: np.ndarray, end: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """For each probe, the first position in its sorted segment [start, end) with ``values >= probe``.

    A vectorised binary search over many segments at once: a few numpy passes instead of one
    ``searchsorted`` call per queue. Returns ``end`` when every value is below the probe.
    """
    lo = start.astype(I64, copy=True)
    hi = end.astype(I64, copy=True)
    if len(values) == 0:
        return lo
    last = len(values) - 1
    active = lo < hi
    while active.any():
        mid = (lo + hi) // 2
        below = values[np.minimum(mid, last)] < probe
        right = active & below
        left = active & ~below
        lo = np.where(right, mid + 1, lo)
        hi = np.where(left, mid, hi)
        active = lo < hi
    return lo


def downsample_points(
    qkey: np.ndarray, offset: np.ndarray, store_ms: np.ndarray, max_points: int
) -> np.ndarray:
    """Positions to keep so that no queue brings more than ``max_points`` evenly spaced new points.

    Inputs must be sorted by (qkey, offset). A busy queue can see thousands of sends per batch; the
    index only needs a handful of them, the first and the last included.
    """
    n = len(qkey)
    if n == 0:
        return np.empty(0, dtype=I64)
    starts = np.flatnonzero(np.r_[True, qkey[1:] != qkey[:-1]])
    counts = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, counts)
    size = np.repeat(counts, counts)
    bucket = (rank * max_points) // size
    prev_bucket = ((rank - 1) * max_points) // size
    keep = (bucket != prev_bucket) | (rank == size - 1)
    return np.flatnonzero(keep)


def add_points(
    index: OffsetIndex, qkey: np.ndarray, offset: np.ndarray, store_ms: np.ndarray, max_points: int
) -> OffsetIndex:
    """Merge new (qkey, offset, store_ms) points into the index and re-establish its invariants.

    Duplicated offsets keep the earliest time (a send completes after the store). Times are made
    non-decreasing along offsets with a running maximum, because producer clocks disagree by a few
    milliseconds and interpolation must never run backwards in time. Only the new points are
    sorted: each finds its place in its queue's sorted points by a binary search, so the cost of a
    batch grows with the index's length, not with sorting it again.
    """
    if len(qkey) == 0:
        return index
    order = np.lexsort((store_ms, offset, qkey))
    qkey, offset, store_ms = qkey[order], offset[order], store_ms[order]
    keep = downsample_points(qkey, offset, store_ms, max_points)
    qkey, offset, store_ms = qkey[keep], offset[keep], store_ms[keep]
    first = np.r_[True, (qkey[1:] != qkey[:-1]) | (offset[1:] != offset[:-1])]  # the earliest per offset
    qkey, offset, store_ms = qkey[first], offset[first], store_ms[first]
    start, end = index.segments(qkey)
    at = segmented_search(index.offset, start, end, offset)
    known = at < end
    known[known] = index.offset[at[known]] == offset[known]
    times = index.store_ms.copy()
    times[at[known]] = np.minimum(times[at[known]], store_ms[known])
    fresh = ~known  # np.insert keeps the order of points that go to one place: (qkey, offset)
    q = np.insert(index.qkey, at[fresh], qkey[fresh])
    o = np.insert(index.offset, at[fresh], offset[fresh])
    t = np.insert(times, at[fresh], store_ms[fresh])
    return thin(OffsetIndex(q, o, segmented_cummax(q, t)), max_points)


def thin(index: OffsetIndex, max_points: int) -> OffsetIndex:
    """Bring every queue down to ``max_points``: keep the newest half, every other older point and
    the oldest one, and repeat until all queues fit."""
    recent = max_points // 2
    while len(index):
        q = index.qkey
        n = len(q)
        starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
        counts = np.diff(np.r_[starts, n])
        if counts.max() <= max_points:
            return index
        size = np.repeat(counts, counts)
        pos = np.arange(n) - np.repeat(starts, counts)
        newest_rank = size - 1 - pos
        keep = (size <= max_points) | (newest_rank < recent) | (pos == 0) | ((newest_rank - recent) % 2 == 1)
        index = index.take(keep)
    return index


def store_times_around(index: OffsetIndex, qkeys: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """The index points bracketing each (qkey, offset): previous (<=) and next (>) point, or UNKNOWN.

    Also returns the two points before the previous one's successor needed for extrapolation: the
    queue's newest two points (``last``/``before_last``) and its oldest point (``first``).
    """
    start, end = index.segments(qkeys)
    at_or_after = segmented_search(index.offset, start, end, offsets)
    n = len(index)
    safe = np.minimum(at_or_after, max(n - 1, 0))
    exact = (at_or_after < end) & (index.offset[safe] == offsets if n else False)
    # prev = last point with offset <= probe; next = first point with offset > probe
    prev_pos = np.where(exact, at_or_after, at_or_after - 1)
    next_pos = np.where(exact, at_or_after + 1, at_or_after)
    has_prev = prev_pos >= start
    has_next = next_pos < end

    def pick(arr: np.ndarray, pos: np.ndarray, ok: np.ndarray) -> np.ndarray:
        if n == 0:
            return np.full(len(pos), UNKNOWN, dtype=I64)
        return np.where(ok, arr[np.clip(pos, 0, n - 1)], UNKNOWN)

    count = end - start
    return {
        "count": count,
        "exact": exact,
        "prev_off": pick(index.offset, prev_pos, has_prev),
        "prev_ms": pick(index.store_ms, prev_pos, has_prev),
        "next_off": pick(index.offset, next_pos, has_next),
        "next_ms": pick(index.store_ms, next_pos, has_next),
        "last_off": pick(index.offset, end - 1, count > 0),
        "last_ms": pick(index.store_ms, end - 1, count > 0),
        "before_last_off": pick(index.offset, end - 2, count > 1),
        "before_last_ms": pick(index.store_ms, end - 2, count > 1),
    }


def offsets_at_time(index: OffsetIndex, qkeys: np.ndarray, ts_ms: np.ndarray) -> np.ndarray:
    """The estimated first offset stored at or after ``ts_ms`` (RocketMQ's ``searchOffset``).

    Before the oldest point: that point's offset (older messages may exist, we do not know them).
    Between two points: linear interpolation, rounded up. After the newest point: UNKNOWN, which
    the caller reads as "nothing that new is known: start at the max offset".
    """
    start, end = index.segments(qkeys)
    pos = segmented_search(index.store_ms, start, end, ts_ms)
    n = len(index)
    out = np.full(len(qkeys), UNKNOWN, dtype=I64)
    if n == 0:
        return out
    found = pos < end
    p = np.clip(pos, 0, n - 1)
    q = np.clip(pos - 1, 0, n - 1)
    first = found & (pos == start)
    between = found & (pos > start)
    out[first] = index.offset[p[first]]
    o1, t1 = index.offset[q[between]], index.store_ms[q[between]]
    o2, t2 = index.offset[p[between]], index.store_ms[p[between]]
    span_t = np.maximum(t2 - t1, 1)
    frac_num = (ts_ms[between] - t1) * (o2 - o1)
    est = o1 + -(-frac_num // span_t)  # ceil division
    out[between] = np.clip(est, o1 + 1, o2)
    return out


def segmented_cummax(segment: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum restarting at each new ``segment`` value (input grouped by segment)."""
    if len(values) == 0:
        return values.astype(I64)
    seg_id = np.cumsum(np.r_[0, segment[1:] != segment[:-1]])
    lo, hi = int(values.min()), int(values.max())
    width = hi - lo + 1
    if width * (int(seg_id[-1]) + 1) < 2**62:
        lifted = (values - lo) + seg_id * width
        return np.maximum.accumulate(lifted) - seg_id * width + lo
    return pd.Series(values).groupby(seg_id, sort=False).cummax().to_numpy(dtype=I64)


def max_offsets_at(
    obs_qkey: np.ndarray,
    obs_ts: np.ndarray,
    obs_value: np.ndarray,
    query_qkey: np.ndarray,
    query_ts: np.ndarray,
) -> np.ndarray:
    """For each query, the highest observed max offset of its queue with ``obs_ts <= query_ts``.

    This is the broker offset a commit is measured against: the lag *at the commit*, which is what
    Burrow's window stores. Observations include the previous max (with the lowest timestamp).
    Returns UNKNOWN where nothing was observed yet.
    """
    nq = len(query_qkey)
    if nq == 0:
        return np.empty(0, dtype=I64)
    q = np.concatenate([obs_qkey, query_qkey]).astype(I64)
    t = np.concatenate([obs_ts, query_ts]).astype(I64)
    is_query = np.r_[np.zeros(len(obs_qkey), dtype=np.int8), np.ones(nq, dtype=np.int8)]
    v = np.concatenate([obs_value, np.full(nq, UNKNOWN)]).astype(I64)
    order = np.lexsort((is_query, t, q))
    running = segmented_cummax(q[order], v[order])
    out = np.empty(nq, dtype=I64)
    chosen = is_query[order] == 1
    out[order[chosen] - len(obs_qkey)] = running[chosen]
    return out
