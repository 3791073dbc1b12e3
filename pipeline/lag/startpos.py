"""A committed offset of -1 means "nothing committed yet": read it as the consumer would start.

RocketMQ's push consumer, finding -1 in its offset store, starts where its ``ConsumeFromWhere``
says (``RebalancePushImpl.computePullFromWhere``):

| policy                    | main topic                         | ``%RETRY%`` topic |
|---------------------------|------------------------------------|-------------------|
| CONSUME_FROM_LAST_OFFSET  | the queue's max offset (lag 0)     | 0                 |
| CONSUME_FROM_FIRST_OFFSET | 0                                  | 0                 |
| CONSUME_FROM_TIMESTAMP    | first offset stored at/after ts    | the max offset    |

A ``%DLQ%`` topic is consumed by nobody by default: every message in it is backlog, so -1 reads
as 0 there. Reading -1 literally would report a lag of "max offset + 1", the bug this avoids.
"""

from __future__ import annotations

import numpy as np

from pipeline.lag.model import KIND_DLQ, KIND_RETRY, NO_OFFSET, UNKNOWN
from pipeline.lag.offsets import OffsetIndex, offsets_at_time

I64 = np.int64

POLICIES = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP")
LAST, FIRST, TIMESTAMP = 0, 1, 2
DLQ_POLICY = "DLQ_NOT_CONSUMED"
# RocketMQ's DefaultMQPushConsumer.consumeTimestamp: half an hour before the consumer started.
DEFAULT_TIMESTAMP_BACK_MS = 30 * 60 * 1000


def effective_offsets(
    raw: np.ndarray,
    kind: np.ndarray,
    policy: np.ndarray,
    start_ts_ms: np.ndarray,
    max_offset: np.ndarray,
    index: OffsetIndex,
    qkeys: np.ndarray,
) -> np.ndarray:
    """The offset each consumer is at: the committed one, or the start its policy implies for -1.

    UNKNOWN where it cannot be known: never reported, or the policy needs a max offset or index
    points we do not have yet.
    """
    out = np.where(raw >= 0, raw, UNKNOWN).astype(I64)
    unset = raw == -1
    if not unset.any():
        return out
    main = unset & (kind != KIND_RETRY) & (kind != KIND_DLQ)
    retry = unset & (kind == KIND_RETRY)
    out[unset & (kind == KIND_DLQ)] = 0
    out[unset & (policy == FIRST)] = 0
    out[retry & (policy == LAST)] = 0
    out[retry & (policy == TIMESTAMP)] = max_offset[retry & (policy == TIMESTAMP)]
    out[main & (policy == LAST)] = max_offset[main & (policy == LAST)]
    by_time = main & (policy == TIMESTAMP)
    if by_time.any():
        start, end = index.segments(qkeys[by_time])
        found = offsets_at_time(index, qkeys[by_time], start_ts_ms[by_time])
        # nothing stored after the start time is known: the consumer begins at the max offset
        found = np.where((found == UNKNOWN) & (end > start), max_offset[by_time], found)
        out[by_time] = found
    return out


def applied_policy(raw: np.ndarray, kind: np.ndarray, policy: np.ndarray) -> np.ndarray:
    """The ``start_policy`` column: which rule turned -1 into an offset (None when not -1)."""
    names = np.array(POLICIES, dtype=object)[np.clip(policy, 0, 2)]
    out: np.ndarray = np.where(raw == -1, names, None)  # type: ignore[assignment]  # numpy's stubs read a None value as the omitted argument
    out[(raw == -1) & (kind == KIND_DLQ)] = DLQ_POLICY
    return out


def never_reported(raw: np.ndarray) -> np.ndarray:
    return raw == NO_OFFSET
