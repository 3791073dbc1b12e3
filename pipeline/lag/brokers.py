"""Each queue's recent broker offsets, as Burrow's poller would have recorded them.

Burrow reads every partition's log-end offset once per ``offset-refresh`` and keeps the last
``intervals`` of them; its stop rule is excused when one of them is at or below the last commit.
faultwatch learns max offsets from events instead (send results' ``queue_offset + 1``, progress
events' ``broker_offset``), so it samples them by event time: one sample per queue per
``broker_offset_refresh_ms`` slot, the highest offset known by the end of that slot. A queue keeps
its newest ``size`` samples (the window's length, as Burrow uses one ``intervals`` for both).

Max offsets never decrease, so the lowest offset Burrow would hold at ``now`` is the one sampled at
the first slot of its ring: the newest sample at or before that slot, or else the oldest sample
after it. Keeping ``size`` distinct slots is enough to answer that exactly.

Rows are aligned with the ``queues`` table; samples are right-aligned, UNKNOWN where empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.lag.model import UNKNOWN
from pipeline.lag.offsets import segmented_cummax
from pipeline.lag.table import unique_ints

I64 = np.int64


@dataclass(frozen=True)
class BrokerSamples:
    slot: np.ndarray  # (queues x size) event-time slot of each sample
    offset: np.ndarray  # (queues x size) highest broker offset known at the end of that slot

    @staticmethod
    def empty(rows: int, size: int) -> BrokerSamples:
        full = np.full((rows, size), UNKNOWN, dtype=I64)
        return BrokerSamples(full, full.copy())

    @property
    def size(self) -> int:
        return self.slot.shape[1]

    def __len__(self) -> int:
        return self.slot.shape[0]

    def take(self, positions: np.ndarray) -> BrokerSamples:
        return BrokerSamples(self.slot[positions], self.offset[positions])

    def grown(self, rows: int) -> BrokerSamples:
        """Room for ``rows`` more queues (appended at the end, like new queues)."""
        if rows <= 0:
            return self
        pad = BrokerSamples.empty(rows, self.size)
        return BrokerSamples(np.vstack([self.slot, pad.slot]), np.vstack([self.offset, pad.offset]))

    def resized(self, size: int) -> BrokerSamples:
        """Room for ``size`` samples per queue (the newest are kept when shrinking)."""
        if size == self.size:
            return self
        if size < self.size:
            return BrokerSamples(self.slot[:, -size:], self.offset[:, -size:])
        pad = np.full((len(self), size - self.size), UNKNOWN, dtype=I64)
        return BrokerSamples(np.hstack([pad, self.slot]), np.hstack([pad, self.offset]))

    def record(
        self, rows: np.ndarray, ts_ms: np.ndarray, offset: np.ndarray, refresh_ms: int
    ) -> BrokerSamples:
        """Add max-offset observations (queue row, event time, offset), in any order."""
        if len(rows) == 0:
            return self
        rows = np.asarray(rows, dtype=I64)
        touched = unique_ints(rows)
        old_valid = self.slot[touched] != UNKNOWN
        r = np.concatenate([np.repeat(touched, old_valid.sum(axis=1)), rows])
        s = np.concatenate([self.slot[touched][old_valid], np.asarray(ts_ms, dtype=I64) // refresh_ms])
        v = np.concatenate([self.offset[touched][old_valid], np.asarray(offset, dtype=I64)])
        r, s, v = _max_per_slot(r, s, v)
        v = segmented_cummax(r, v)
        from_end = _rank_from_end(r)
        keep = from_end < self.size
        slot, out = self.slot.copy(), self.offset.copy()
        slot[touched], out[touched] = UNKNOWN, UNKNOWN
        col = self.size - 1 - from_end[keep]
        slot[r[keep], col], out[r[keep], col] = s[keep], v[keep]
        return BrokerSamples(slot, out)

    def recent_min(self, now_ms: int, refresh_ms: int) -> np.ndarray:
        """Per queue, the lowest broker offset of its last ``size`` slots at ``now_ms`` (UNKNOWN: none)."""
        slot, value = self.slot, self.offset
        first_slot = now_ms // refresh_ms - (self.size - 1)
        valid = slot != UNKNOWN
        before = valid & (slot <= first_slot)
        n = np.arange(len(self))
        newest_before = self.size - 1 - np.argmax(before[:, ::-1], axis=1)
        oldest = np.argmax(valid, axis=1)
        return np.where(
            before.any(axis=1),
            value[n, newest_before],
            np.where(valid.any(axis=1), value[n, oldest], UNKNOWN),
        ).astype(I64)


def _max_per_slot(r: np.ndarray, s: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """The highest offset per (row, slot), sorted by row then slot (one sort of a combined key)."""
    low = int(s.min())
    span = int(s.max()) - low + 1
    if (int(r.max()) + 1) * span < 2**62:
        order = np.argsort(r * span + (s - low), kind="stable")
    else:  # slots spread over centuries: fall back to sorting by both keys
        order = np.lexsort((s, r))
    r, s, v = r[order], s[order], v[order]
    starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (s[1:] != s[:-1])])
    return r[starts], s[starts], np.maximum.reduceat(v, starts)


def _rank_from_end(groups: np.ndarray) -> np.ndarray:
    """0 for the last element of each run of equal ``groups`` values, 1 for the one before, ..."""
    n = len(groups)
    ends = np.flatnonzero(np.r_[groups[1:] != groups[:-1], True])
    starts = np.r_[0, ends[:-1] + 1]
    return np.repeat(ends, ends - starts + 1) - np.arange(n)
