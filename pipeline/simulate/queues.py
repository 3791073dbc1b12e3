"""The broker side of one message queue: its max offset and, if consumed, its store times."""

from __future__ import annotations

import bisect

from pipeline.rocketmq.queues import MessageQueue


class QueueLog:
    """``count`` is the queue's max offset (the next offset to write), as ConsumeStats reports it.

    ``times`` holds the store time of each message from offset ``base`` on, kept only for queues
    some consumer group reads (for ``lastTimestamp`` and CONSUME_FROM_TIMESTAMP); ``trim`` drops
    entries no group can ask for any more. A list, not an ``array("q")``: an array parses every
    appended int (``PyArg_Parse``), about 2.5 % of the simulator's instructions per event, while
    a list entry shares the row's int. Behind a sink that drops its rows, an entry costs its int
    object too (40 bytes instead of 8) until it is trimmed.
    """

    __slots__ = ("base", "cluster", "count", "mq", "times")

    def __init__(self, mq: MessageQueue, cluster: str, keep_times: bool) -> None:
        self.mq = mq
        self.cluster = cluster
        self.count = 0
        self.times: list[int] | None = [] if keep_times else None
        self.base = 0

    def store_time(self, offset: int) -> int | None:
        """Store time of the message at ``offset``, if known."""
        if self.times is None or offset < self.base or offset >= self.count:
            return None
        return self.times[offset - self.base]

    def first_offset_at(self, ts_ms: int) -> int:
        """The first offset stored at or after ``ts_ms`` (the max offset if none)."""
        if self.times is None:
            return self.count
        return self.base + bisect.bisect_left(self.times, ts_ms)

    def trim(self, below: int) -> None:
        if self.times is not None and below > self.base:
            cut = min(below, self.count) - self.base
            del self.times[:cut]
            self.base += cut
