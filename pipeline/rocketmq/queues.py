"""``MessageQueue``: the (topic, broker, queue id) triple shared by producers and consumers."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.rocketmq.javalang import java_str_key


@functools.total_ordering
@dataclass(frozen=True)
class MessageQueue:
    """A queue, equal and hashed by all three fields, ordered like Java's ``compareTo``.

    Ordering is topic, then broker name (Java String order), then queue id as a number, which is
    what RebalanceImpl sorts by. Java computes ``this.queueId - o.queueId`` in ``int`` arithmetic,
    which would overflow for ids two billion apart; real queue ids are small, so that is not copied.
    """

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        """Java ``toString``; ConsistentHash hashes exactly this text."""
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker}, queueId={self.queue_id}]"

    def sort_key(self) -> tuple[bytes, bytes, int]:
        return (java_str_key(self.topic), java_str_key(self.broker), self.queue_id)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.sort_key() < other.sort_key()

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "broker": self.broker, "queue_id": self.queue_id}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> MessageQueue:
        """From ``{"topic", "broker", "queue_id"}``; wrong types raise TypeError naming the field."""
        if not isinstance(obj, Mapping):
            raise TypeError(f"a message queue must be an object, got {obj!r}")
        for key in ("topic", "broker"):
            if not isinstance(obj.get(key), str):
                raise TypeError(f"message queue field {key!r} must be a string, got {obj.get(key)!r}")
        queue_id = obj.get("queue_id")
        if not isinstance(queue_id, int) or isinstance(queue_id, bool):
            raise TypeError(f"message queue field 'queue_id' must be an integer, got {queue_id!r}")
        return cls(obj["topic"], obj["broker"], queue_id)


def sort_queues(queues: list[MessageQueue]) -> list[MessageQueue]:
    """``Collections.sort(mqAll)``; ASCII names (the usual case) sort without encoding."""
    if all(q.topic.isascii() and q.broker.isascii() for q in queues):
        return sorted(queues, key=lambda q: (q.topic, q.broker, q.queue_id))
    return sorted(queues, key=MessageQueue.sort_key)
