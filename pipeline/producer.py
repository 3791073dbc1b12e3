"""Producer side of the avoidance feed: read ``rmq.avoidance``, merge it into RocketMQ selection.

A recommended-avoid broker is treated exactly like one the producer's own fault table marks
unavailable (:func:`overlay`): its fault item's avoid-until time is pushed out to the
recommendation's, so 4.9's ``pickOneAtLeast`` and 5.x's reachable / any-queue passes are the
fallbacks, unchanged. The feed never makes a broker *more* available than local knowledge says.

The core (:class:`FeedState`, :func:`apply_message`, :func:`avoided_brokers`, :func:`overlay`) is pure;
:class:`AvoidanceFeed` is the thin Kafka/file reader (kafka-python imported on use).

Wire format: ``schemas/avoidance.schema.json``; the Java twin is ``clients/java/feed-client`` (docs/feed.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pipeline.rocketmq.fault import FaultItem, FaultState
from pipeline.rocketmq.queues import MessageQueue
from pipeline.rocketmq.selection import ProducerSelector, TopicRoute, select_queue
from schemas.avoidance import WIRE_SCHEMA_ID
from schemas.errors import FaultwatchError


class InvalidList(FaultwatchError, ValueError):
    """A record that is not an avoidance list of this wire version."""


@dataclass(frozen=True)
class AvoidEntry:
    broker_name: str
    avoid_until_ms: int
    expires_ms: int
    reason: str


@dataclass(frozen=True)
class AvoidanceList:
    """One cluster's current list as published (only what a producer needs of it)."""

    cluster: str
    cycle_id: str
    decided_ms: int
    expires_ms: int
    avoid: tuple[AvoidEntry, ...] = ()

    def newer_than(self, other: AvoidanceList) -> bool:
        return (self.decided_ms, _cycle_key(self.cycle_id)) > (other.decided_ms, _cycle_key(other.cycle_id))


def _cycle_key(cycle_id: str) -> tuple[int, str]:
    return (int(cycle_id), "") if cycle_id.isdigit() else (-1, cycle_id)


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidList(f"avoidance list field {key!r} must be an integer, got {value!r}")
    return value


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidList(f"avoidance list field {key!r} must be a non-empty string, got {value!r}")
    return value


def _avoid_entry(e: Any) -> AvoidEntry:
    if not isinstance(e, Mapping):
        raise InvalidList("avoidance list entries must be JSON objects")
    return AvoidEntry(_str(e, "broker_name"), _int(e, "avoid_until_ms"), _int(e, "expires_ms"), str(e.get("reason", "")))


def parse_list(value: bytes | str | Mapping[str, Any]) -> AvoidanceList:
    """Decode one record value (or file); raises :class:`InvalidList` naming the first bad field."""
    obj = json.loads(value) if isinstance(value, (bytes, str)) else value
    if not isinstance(obj, Mapping):
        raise InvalidList("an avoidance list must be a JSON object")
    if obj.get("schema") != WIRE_SCHEMA_ID:
        raise InvalidList(f"unknown avoidance list schema {obj.get('schema')!r}; expected {WIRE_SCHEMA_ID!r}")
    entries = obj.get("avoid")
    if not isinstance(entries, list):
        raise InvalidList("avoidance list field 'avoid' must be an array")
    avoid = tuple(_avoid_entry(e) for e in entries)
    return AvoidanceList(
        _str(obj, "cluster"), str(obj.get("cycle_id", "")), _int(obj, "decided_ms"), _int(obj, "expires_ms"), avoid
    )


@dataclass(frozen=True)
class FeedState:
    """The newest list per cluster; older or replayed records never replace a newer one."""

    lists: Mapping[str, AvoidanceList] = field(default_factory=lambda: MappingProxyType({}))
    rejected: int = 0


def apply_message(state: FeedState, value: bytes | str | Mapping[str, Any]) -> FeedState:
    """Merge one record; a malformed one is counted and skipped (bad data is not a crash)."""
    try:
        new = parse_list(value)
    except (ValueError, TypeError):
        return FeedState(state.lists, state.rejected + 1)
    old = state.lists.get(new.cluster)
    if old is not None and not new.newer_than(old):
        return state
    return FeedState(MappingProxyType({**state.lists, new.cluster: new}), state.rejected)


def avoided_brokers(state: FeedState, cluster: str, now_ms: int) -> dict[str, int]:
    """Broker -> avoid-until for entries in force: ``now < min(avoid_until, entry and list expiry)``."""
    lst = state.lists.get(cluster)
    if lst is None or now_ms >= lst.expires_ms:
        return {}
    out: dict[str, int] = {}
    for e in lst.avoid:
        until = min(e.avoid_until_ms, e.expires_ms, lst.expires_ms)
        if now_ms < until:
            out[e.broker_name] = max(until, out.get(e.broker_name, 0))
    return out


def overlay(state: FaultState, avoided: Mapping[str, int], now_ms: int) -> FaultState:
    """The producer's fault table with each recommended broker unavailable until its time.

    Local items keep their latency and reachable flag; a broker the producer never failed on gets
    an item with latency 0 and reachable (so 5.x may still fall back to it, as it would to a
    locally avoided but reachable broker).
    """
    out = state
    for broker, until in avoided.items():
        if until <= now_ms:
            continue
        local = state.get(broker)
        if local is None:
            out = out.with_item(FaultItem(broker, 0, until))
        elif local.start_timestamp < until:
            out = out.with_item(FaultItem(broker, local.current_latency, until, local.reachable))
    return out


def _unoverlay(local: FaultState, before: FaultState, after: FaultState) -> FaultState:
    """Carry a removal made by selection (4.9 drops a picked broker without write queues) back."""
    removed = set(before.items) - set(after.items)
    for broker in removed:
        local = local.without(broker)
    return local


@dataclass
class FeedAwareSelector(ProducerSelector):
    """A :class:`ProducerSelector` that also honours the faultwatch feed.

    ``avoid`` returns broker -> avoid-until for the producer's cluster at a time (e.g.
    ``lambda now: avoided_brokers(feed.state, "c1", now)``). With ``fault_enabled`` off the feed
    still applies, through the same generation's fault-aware selection over the feed alone.
    """

    avoid: Callable[[int], Mapping[str, int]] = field(default=lambda now_ms: {})

    def select(
        self, route: TopicRoute, now_ms: int, last_broker: str | None = None, *, thread: int = 0, retry: bool = False
    ) -> MessageQueue | None:
        avoided = self.avoid(now_ms)
        if not avoided:
            return super().select(route, now_ms, last_broker, thread=thread, retry=retry)
        local = self.state if self.fault_enabled else FaultState()
        merged = overlay(local, avoided, now_ms)
        mq, after = select_queue(
            self.generation,
            route,
            merged,
            self.index_for(route.topic, thread),
            now_ms,
            last_broker,
            which_item_worst=self.which_item_worst,
            reset_index=retry,
        )
        if self.fault_enabled:
            self.state = _unoverlay(self.state, merged, after)
        return mq


class AvoidanceFeed:
    """Reads ``rmq.avoidance`` from the beginning of every partition and keeps the newest lists.

    No consumer group: every producer needs every cluster's latest record, and a restart re-reads
    the (compacted) topic. Call :meth:`poll` from the producer's own loop or a timer thread.
    """

    def __init__(self, topic: str, client_options: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self.state = FeedState()
        self._consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **dict(client_options))
        partitions = self._consumer.partitions_for_topic(topic) or set()
        self._consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        self._consumer.seek_to_beginning()

    @classmethod
    def from_config(cls, cfg: Any) -> AvoidanceFeed:
        return cls(cfg.topics.avoidance, cfg.kafka.client_options())

    def poll(self, timeout_ms: int = 1000) -> int:
        """Apply what arrived within ``timeout_ms``; returns the number of records read."""
        count = 0
        for records in self._consumer.poll(timeout_ms=timeout_ms).values():
            for rec in records:
                self.state = apply_message(self.state, rec.value)
                count += 1
        return count

    def avoided(self, cluster: str, now_ms: int) -> dict[str, int]:
        return avoided_brokers(self.state, cluster, now_ms)

    def close(self) -> None:
        self._consumer.close()


def load_file(state: FeedState, path: str | os.PathLike[str]) -> FeedState:
    """Merge a per-cluster JSON file written by the publisher (for producers that read files)."""
    with open(path, "rb") as fh:
        return apply_message(state, fh.read())
