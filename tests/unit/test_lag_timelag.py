"""Time lag (exact, interpolated, extrapolated, idle, unknown) and the bounded offset index, by hand.

Queue 0 has points 10 -> 1000 ms, 20 -> 2000 ms, 40 -> 2400 ms; queue 1 has one point 5 -> 500 ms;
queue 2 has none. The time lag of consumer offset c is ``now - store_time(c)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.lag.model import UNKNOWN
from pipeline.lag.offsets import (
    OffsetIndex,
    add_points,
    downsample_points,
    max_offsets_at,
    offsets_at_time,
    segmented_cummax,
    thin,
)
from pipeline.lag.timelag import METHOD_NAMES, time_lags

I64 = np.int64


def index_of(points: dict[int, list[tuple[int, int]]], max_points: int = 32) -> OffsetIndex:
    q = [k for k, pts in points.items() for _ in pts]
    o = [p[0] for pts in points.values() for p in pts]
    t = [p[1] for pts in points.values() for p in pts]
    return add_points(OffsetIndex.empty(), np.array(q, I64), np.array(o, I64), np.array(t, I64), max_points)


INDEX = index_of({0: [(10, 1000), (20, 2000), (40, 2400)], 1: [(5, 500)]})

# name: (qkey, consumer offset, max offset, now) -> (time lag, method)
CASES = {
    "exact": ((0, 20, 50, 10_000), (8_000, "exact")),
    "interpolated_first_segment": ((0, 15, 50, 10_000), (8_500, "interpolated")),  # 1000 + 1000*5/10
    "interpolated_second_segment": ((0, 30, 50, 10_000), (7_800, "interpolated")),  # 2000 + 400*10/20
    "extrapolated_beyond_newest_at_its_rate": ((0, 45, 50, 10_000), (7_500, "extrapolated")),  # 2400 + 20*5
    "extrapolated_never_after_now": ((0, 1000, 2000, 3_000), (0, "extrapolated")),  # 21600 -> 3000
    "extrapolated_before_oldest_is_a_lower_bound": ((0, 5, 50, 10_000), (9_000, "extrapolated")),
    "one_point_above": ((1, 8, 10, 10_000), (9_500, "extrapolated")),
    "one_point_below": ((1, 2, 10, 10_000), (9_500, "extrapolated")),
    "one_point_exact": ((1, 5, 10, 10_000), (9_500, "exact")),
    "idle_caught_up": ((0, 50, 50, 10_000), (0, "idle")),
    "idle_offset_above_max": ((0, 60, 50, 10_000), (0, "idle")),
    "idle_empty_queue_without_index": ((2, 0, 0, 10_000), (0, "idle")),
    "unknown_empty_index": ((2, 3, 10, 10_000), (UNKNOWN, "unknown")),
    "unknown_max_offset": ((0, 20, UNKNOWN, 10_000), (UNKNOWN, "unknown")),
    "unknown_consumer_offset": ((0, UNKNOWN, 50, 10_000), (UNKNOWN, "unknown")),
    "store_time_after_now_gives_zero_not_negative": ((0, 20, 50, 1_500), (0, "exact")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_time_lag(name: str) -> None:
    (q, c, m, now), expected = CASES[name]
    lag, method = time_lags(INDEX, np.array([q], I64), np.array([c], I64), np.array([m], I64), now)
    assert (int(lag[0]), METHOD_NAMES[method[0]]) == expected


def test_time_lag_vectorised_matches_one_by_one_and_is_never_nan() -> None:
    rows = [CASES[n][0] for n in CASES]
    q, c, m, now = (np.array(col, I64) for col in zip(*rows))
    lag, method = time_lags(INDEX, q, c, m, now)
    assert lag.dtype == I64
    assert [(int(a), METHOD_NAMES[b]) for a, b in zip(lag, method)] == [CASES[n][1] for n in CASES]


def test_points_are_deduplicated_and_made_monotone() -> None:
    idx = index_of({7: [(3, 300), (1, 120), (3, 290), (2, 100)]})
    # offset 3 keeps its earliest time; offset 2 (100 ms) cannot precede offset 1 (120 ms)
    assert idx.points_of(7) == [(1, 120), (2, 120), (3, 290)]


def test_index_stays_bounded_keeps_oldest_and_recent_points() -> None:
    idx = OffsetIndex.empty()
    for batch in range(40):
        offs = np.arange(batch * 25, batch * 25 + 25, dtype=I64)
        idx = add_points(idx, np.zeros(25, I64), offs, offs * 10, 16)
        assert len(idx.points_of(0)) <= 16
    pts = idx.points_of(0)
    assert pts[0] == (0, 0)  # the oldest point is kept
    assert pts[-1] == (999, 9990)  # and the newest
    gaps = np.diff([p[0] for p in pts])
    assert gaps[0] > gaps[-1]  # older points are sparser than recent ones
    assert all(t == o * 10 for o, t in pts)  # kept points are exact


def resorted(index: OffsetIndex, qkey: np.ndarray, offset: np.ndarray, store_ms: np.ndarray, max_points: int) -> OffsetIndex:
    """What :func:`add_points` must equal: the new points thinned, all points sorted again, the
    earliest time per offset, times running up, every queue thinned."""
    order = np.lexsort((store_ms, offset, qkey))
    qkey, offset, store_ms = qkey[order], offset[order], store_ms[order]
    keep = downsample_points(qkey, offset, store_ms, max_points)
    q = np.concatenate([index.qkey, qkey[keep]])
    o = np.concatenate([index.offset, offset[keep]])
    t = np.concatenate([index.store_ms, store_ms[keep]])
    order = np.lexsort((t, o, q))
    q, o, t = q[order], o[order], t[order]
    first = np.r_[True, (q[1:] != q[:-1]) | (o[1:] != o[:-1])]
    q, o, t = q[first], o[first], t[first]
    return thin(OffsetIndex(q, o, segmented_cummax(q, t)), max_points)


@pytest.mark.parametrize("seed", range(6))
def test_points_merged_into_the_index_equal_the_whole_index_sorted_again(seed: int) -> None:
    """New points go into their queues' places (repeated offsets, equal times, queues new between
    old ones, queues without new points, overflowing queues) as if everything were sorted again."""
    rng = np.random.default_rng(seed)
    want = got = OffsetIndex.empty()
    for _ in range(30):
        n = int(rng.integers(0, 300))
        qkey = rng.choice(rng.permutation(40)[: int(rng.integers(1, 40))], n).astype(I64)
        offset = rng.integers(0, 400, n).astype(I64)
        store_ms = offset * 10 + rng.integers(-30, 30, n)
        store_ms[rng.random(n) < 0.2] = 5_000  # equal times
        want = resorted(want, qkey, offset, store_ms, 16)
        got = add_points(got, qkey, offset, store_ms, 16)
        for a, b in ((got.qkey, want.qkey), (got.offset, want.offset), (got.store_ms, want.store_ms)):
            assert a.tolist() == b.tolist()
    assert len(got) > 300


def test_many_sends_in_one_batch_bring_few_points() -> None:
    offs = np.arange(10_000, dtype=I64)
    idx = add_points(OffsetIndex.empty(), np.zeros(10_000, I64), offs, offs, 32)
    pts = idx.points_of(0)
    assert len(pts) <= 32 and pts[0] == (0, 0) and pts[-1] == (9999, 9999)


@pytest.mark.parametrize(
    ("q", "ts", "expected"),
    [
        (0, 1000, 10),  # exactly the time of a point
        (0, 500, 10),  # before the oldest point: its offset
        (0, 1500, 15),  # between 10@1000 and 20@2000: ceil(10 + 10 * 500 / 1000)
        (0, 1001, 11),  # rounded up: the first message at or after the time
        (0, 2401, UNKNOWN),  # after the newest point: nothing that new is known
        (2, 1000, UNKNOWN),  # no points
    ],
)
def test_offset_at_time(q: int, ts: int, expected: int) -> None:
    assert int(offsets_at_time(INDEX, np.array([q], I64), np.array([ts], I64))[0]) == expected


def test_max_offset_at_each_commit_time() -> None:
    # queue 0: previously 5; a send makes it 8 at t=10 and progress says 12 at t=30; queue 1 unseen
    got = max_offsets_at(
        np.array([0, 0, 0], I64),
        np.array([np.iinfo(I64).min, 10, 30], I64),
        np.array([5, 8, 12], I64),
        np.array([0, 0, 0, 0, 1], I64),
        np.array([5, 10, 29, 31, 40], I64),
    )
    assert got.tolist() == [5, 8, 8, 12, UNKNOWN]
