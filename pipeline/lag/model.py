"""Shared vocabulary of the lag maths: the ordered status enum, topic kinds and sentinels.

Arrays carry integers, not ``None``: numpy stays vectorised and nothing can turn into NaN. The
sentinels below are the only "unknown" values, and every public row converts them to null.
"""

from __future__ import annotations

import enum

import numpy as np

# An int64 offset / time that is not known. Offsets are >= 0 and timestamps > 0, so -1 is free.
UNKNOWN = -1
# A raw consumer offset that was never reported (RocketMQ's -1 means "nothing committed yet").
NO_OFFSET = -2

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

KIND_MAIN, KIND_RETRY, KIND_DLQ = 0, 1, 2
KIND_NAMES = ("main", "retry", "dlq")


class Status(enum.IntEnum):
    """Queue and group verdicts, ordered by severity: the group's status is its worst queue's.

    UNKNOWN (no lag can be computed yet) ranks below OK so that one queue without data never hides
    or outranks a verdict; the order of the rest is the one in ``schemas.lag.LAG_STATUSES``.
    """

    UNKNOWN = 0
    OK = 1
    WARN = 2
    STALL = 3
    STOP = 4
    REWIND = 5


STATUS_NAMES = np.array([s.name for s in Status], dtype=object)


class GroupStatus(enum.IntEnum):
    """Burrow's group verdict (its ``StatusConstant`` for groups): STOP, STALL and REWIND queues make ERR."""

    NOTFOUND = 0
    OK = 1
    WARN = 2
    ERR = 3


GROUP_STATUS_NAMES = np.array([s.name for s in GroupStatus], dtype=object)


def topic_kind(topic: str) -> int:
    """``%RETRY%group`` and ``%DLQ%group`` backlogs mean different things from a main topic's lag."""
    if topic.startswith(RETRY_PREFIX):
        return KIND_RETRY
    if topic.startswith(DLQ_PREFIX):
        return KIND_DLQ
    return KIND_MAIN


def topic_kinds(topics: np.ndarray) -> np.ndarray:
    """:func:`topic_kind` over an array of topic names (int8)."""
    return np.fromiter((topic_kind(t) for t in topics), dtype=np.int8, count=len(topics))
