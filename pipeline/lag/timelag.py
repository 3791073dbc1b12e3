"""Time lag: how old is the oldest message the consumer has not consumed yet?

That message is the one at the consumer offset ``c`` (the next to consume). Its store time is read
from the queue's (offset -> store time) index:

- exact: a point at ``c``;
- interpolated: linear between the points around ``c``;
- extrapolated, beyond the newest point: along the newest segment's rate, kept between the newest
  point's time and now (the message exists, so it was stored by now); with a single point, that
  point's time, which bounds the lag from above;
- extrapolated, before the oldest point: the oldest point's time, a lower bound of the lag. We do
  not run the line backwards: that is where Kafka Lag Exporter's users saw absurd values after
  spikes and replays;
- idle: the consumer is caught up (``c >= max offset``), the lag is 0 whatever the index says;
- unknown: no max offset, no consumer offset, or an empty index. Never NaN.
"""

from __future__ import annotations

import numpy as np

from pipeline.lag.model import UNKNOWN
from pipeline.lag.offsets import OffsetIndex, store_times_around

I64 = np.int64

M_UNKNOWN, M_EXACT, M_INTERPOLATED, M_EXTRAPOLATED, M_IDLE = 0, 1, 2, 3, 4
METHOD_NAMES = np.array(["unknown", "exact", "interpolated", "extrapolated", "idle"], dtype=object)


def estimate_store_ms(
    index: OffsetIndex, qkeys: np.ndarray, offsets: np.ndarray, now_ms: np.ndarray | int
) -> tuple[np.ndarray, np.ndarray]:
    """Estimated store time of message ``offsets[i]`` of queue ``qkeys[i]``, and how it was found."""
    n = len(qkeys)
    now = np.broadcast_to(np.asarray(now_ms, dtype=I64), (n,))
    p = store_times_around(index, qkeys, offsets)
    out = np.full(n, UNKNOWN, dtype=I64)
    method = np.full(n, M_UNKNOWN, dtype=np.int8)
    has_prev = p["prev_off"] != UNKNOWN
    has_next = p["next_off"] != UNKNOWN

    exact = p["exact"] & has_prev
    out[exact], method[exact] = p["prev_ms"][exact], M_EXACT

    inner = ~exact & has_prev & has_next
    span_o = np.maximum(p["next_off"][inner] - p["prev_off"][inner], 1)
    step = (p["next_ms"][inner] - p["prev_ms"][inner]) * (offsets[inner] - p["prev_off"][inner]) // span_o
    out[inner], method[inner] = p["prev_ms"][inner] + step, M_INTERPOLATED

    below = ~has_prev & has_next
    out[below], method[below] = p["next_ms"][below], M_EXTRAPOLATED

    above = has_prev & ~has_next & ~exact
    out[above], method[above] = _beyond_newest(p, offsets, now, above), M_EXTRAPOLATED
    return out, method


def _beyond_newest(
    p: dict[str, np.ndarray], offsets: np.ndarray, now: np.ndarray, sel: np.ndarray
) -> np.ndarray:
    last_off, last_ms = p["last_off"][sel], p["last_ms"][sel]
    prior_off, prior_ms = p["before_last_off"][sel], p["before_last_ms"][sel]
    has_rate = prior_off != UNKNOWN
    span_o = np.maximum(last_off - prior_off, 1)
    ahead = (last_ms - prior_ms) * (offsets[sel] - last_off) // span_o
    est = np.where(has_rate, last_ms + ahead, last_ms)
    return np.clip(est, last_ms, np.maximum(now[sel], last_ms))


def time_lags(
    index: OffsetIndex,
    qkeys: np.ndarray,
    consumer_offsets: np.ndarray,
    max_offsets: np.ndarray,
    now_ms: np.ndarray | int,
) -> tuple[np.ndarray, np.ndarray]:
    """Age in ms of each queue's oldest unconsumed message at ``now_ms`` (UNKNOWN = -1), and method."""
    n = len(qkeys)
    now = np.broadcast_to(np.asarray(now_ms, dtype=I64), (n,))
    lag = np.full(n, UNKNOWN, dtype=I64)
    method = np.full(n, M_UNKNOWN, dtype=np.int8)
    known = (max_offsets != UNKNOWN) & (consumer_offsets >= 0)
    idle = known & (consumer_offsets >= max_offsets)
    lag[idle], method[idle] = 0, M_IDLE
    behind = known & ~idle
    if behind.any():
        est, how = estimate_store_ms(index, qkeys[behind], consumer_offsets[behind], now[behind])
        ok = est != UNKNOWN
        lag[behind] = np.where(ok, np.maximum(now[behind] - est, 0), UNKNOWN)
        method[behind] = how
    return lag, method
