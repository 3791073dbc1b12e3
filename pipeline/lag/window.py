"""The sliding window of each (group, queue)'s last N commits, for many queues at once.

Burrow judges a partition on its last N committed offsets, each with the lag at that moment. Here a
window is one row of three (queues x N) arrays, right-aligned: the newest commit is in the last
column and ``count`` says how many columns hold commits. Unused slots hold UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.lag.model import UNKNOWN

I64 = np.int64


@dataclass(frozen=True)
class Windows:
    ts: np.ndarray
    offset: np.ndarray
    lag: np.ndarray
    count: np.ndarray

    @staticmethod
    def empty(rows: int, size: int) -> Windows:
        full = np.full((rows, size), UNKNOWN, dtype=I64)
        return Windows(full, full.copy(), full.copy(), np.zeros(rows, dtype=I64))

    @staticmethod
    def from_lists(rows: Sequence[Sequence[tuple[int, int, int]]], size: int) -> Windows:
        """Windows from (ts_ms, offset, lag) commits per queue, oldest first (tests, docs)."""
        w = Windows.empty(len(rows), size)
        for i, commits in enumerate(rows):
            commits = list(commits)[-size:]
            for j, (ts, off, lag) in enumerate(commits):
                col = size - len(commits) + j
                w.ts[i, col], w.offset[i, col], w.lag[i, col] = ts, off, lag
            w.count[i] = len(commits)
        return w

    @property
    def size(self) -> int:
        return self.ts.shape[1]

    def __len__(self) -> int:
        return self.ts.shape[0]

    def valid(self) -> np.ndarray:
        return np.arange(self.size)[None, :] >= (self.size - self.count)[:, None]

    def consecutive(self) -> np.ndarray:
        """(queues x N-1): both commits of each neighbouring pair exist."""
        v = self.valid()
        return v[:, 1:] & v[:, :-1]

    def last_ts(self) -> np.ndarray:
        return np.where(self.count > 0, self.ts[:, -1], UNKNOWN)

    def last_offset(self) -> np.ndarray:
        return np.where(self.count > 0, self.offset[:, -1], UNKNOWN)

    def first_ts(self) -> np.ndarray:
        col = np.clip(self.size - self.count, 0, self.size - 1)
        return np.where(self.count > 0, self.ts[np.arange(len(self)), col], UNKNOWN)

    def take(self, positions: np.ndarray) -> Windows:
        return Windows(self.ts[positions], self.offset[positions], self.lag[positions], self.count[positions])

    @staticmethod
    def concat(parts: Sequence[Windows]) -> Windows:
        return Windows(
            np.concatenate([p.ts for p in parts]),
            np.concatenate([p.offset for p in parts]),
            np.concatenate([p.lag for p in parts]),
            np.concatenate([p.count for p in parts]),
        )

    def resized(self, size: int) -> Windows:
        """The same windows with room for ``size`` commits (the newest are kept when shrinking)."""
        if size == self.size:
            return self
        if size < self.size:
            cut = self.size - size
            return Windows(
                self.ts[:, cut:], self.offset[:, cut:], self.lag[:, cut:], np.minimum(self.count, size)
            )
        pad = np.full((len(self), size - self.size), UNKNOWN, dtype=I64)
        return Windows(
            np.hstack([pad, self.ts]), np.hstack([pad, self.offset]), np.hstack([pad, self.lag]), self.count
        )

    def append(
        self, pair: np.ndarray, ts: np.ndarray, offset: np.ndarray, lag: np.ndarray
    ) -> tuple[Windows, np.ndarray]:
        """Add commits (rows ``pair``); returns the new windows and which commits were taken.

        Only commits strictly newer than the queue's newest one enter (Burrow drops older ones too);
        of several commits with one timestamp the last given wins, so a replayed report is a no-op.
        """
        n = len(pair)
        if n == 0:
            return self, np.zeros(0, dtype=bool)
        order = np.lexsort((np.arange(n), ts, pair))
        p, t = pair[order], ts[order]
        last_of_ts = np.r_[(p[1:] != p[:-1]) | (t[1:] != t[:-1]), True]
        newer = t > np.where(self.count[p] > 0, self.ts[p, -1], np.iinfo(I64).min)
        accept = last_of_ts & newer
        taken = np.zeros(n, dtype=bool)
        taken[order[accept]] = True
        order = order[accept]
        if len(order) == 0:
            return self, taken
        return self._shift_in(pair[order], ts[order], offset[order], lag[order]), taken

    def _shift_in(self, p: np.ndarray, t: np.ndarray, o: np.ndarray, g: np.ndarray) -> Windows:
        """Append commits sorted by (row, time): round r shifts in every row's r-th new commit."""
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        rank = np.arange(len(p)) - np.repeat(starts, np.diff(np.r_[starts, len(p)]))
        out = Windows(self.ts.copy(), self.offset.copy(), self.lag.copy(), self.count.copy())
        for r in range(int(rank.max()) + 1):
            sel = rank == r
            rows = p[sel]
            for arr, new in ((out.ts, t[sel]), (out.offset, o[sel]), (out.lag, g[sel])):
                arr[rows, :-1] = arr[rows, 1:]
                arr[rows, -1] = new
            out.count[rows] = np.minimum(out.count[rows] + 1, self.size)
        return out
