"""The simulated clients' own fault state, kept so tests can hold the pipeline against it.

Every fault-tolerant producer records, per broker, its avoid-until time (``FaultItem.start_timestamp``)
after each update that changes availability. The broker is unavailable on the union of
``[ts_i, min(until_i, ts_{i+1}))``; maximal intervals of that union are the windows the client
actually used when it chose queues. This is plain interval arithmetic over the client's recorded
state — deliberately not :func:`pipeline.rocketmq.windows.derive_windows` — so comparing the two (or
the ``producer_fault_windows`` table) is a real check of the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientWindow:
    """One interval ``[start_ms, end_ms)`` in which a simulated producer avoided a broker."""

    cluster: str
    producer_group: str
    client_id: str
    client_version: str
    generation: str
    broker_name: str
    start_ms: int
    end_ms: int


class FaultTrace:
    """Per broker, the (ts, avoid_until) points where one producer's availability could change.

    Points that cannot change the union are skipped, so a healthy producer records nothing:
    an update that leaves the broker available when it already was, or that keeps the same
    avoid-until time.
    """

    __slots__ = ("points",)

    def __init__(self) -> None:
        self.points: dict[str, list[tuple[int, int]]] = {}

    def note(self, broker: str, ts_ms: int, until_ms: int) -> None:
        pts = self.points.get(broker)
        if pts is None:
            if until_ms <= ts_ms:
                return
            self.points[broker] = [(ts_ms, until_ms)]
            return
        prev_until = pts[-1][1]
        if until_ms == prev_until or (until_ms <= ts_ms and prev_until <= ts_ms):
            return
        pts.append((ts_ms, until_ms))

    def intervals(self, broker: str) -> list[tuple[int, int]]:
        """Maximal unavailable intervals of ``broker``; touching intervals are one."""
        pts = self.points.get(broker, [])
        out: list[tuple[int, int]] = []
        for i, (ts, until) in enumerate(pts):
            end = until if i + 1 == len(pts) else min(until, pts[i + 1][0])
            if end <= ts:
                continue
            if out and out[-1][1] >= ts:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((ts, end))
        return out

    def brokers(self) -> list[str]:
        return sorted(self.points)
