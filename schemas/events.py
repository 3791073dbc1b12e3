"""Kafka event contracts (v1): JSON, UTF-8, one event per record, key = broker name.

Each contract is a tuple of :class:`~schemas.fields.Field`; the dataclasses below are the same events
as Python objects, used by the simulator, the tests and the producer-side hook examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from schemas.fields import MAX_TS_MS, MIN_TS_MS, Field, Invalid, check_record

SCHEMA_VERSION = 1
# A RocketMQ send result is a few hundred bytes; anything far larger is not one of ours.
DEFAULT_MAX_EVENT_BYTES = 65_536

SEND_STATUSES = ("SEND_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE", "FAILED")
ALLOCATION_STRATEGIES = (
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "CONFIG",
    "MACHINE_ROOM",
    "MACHINE_ROOM_NEARBY",
)

_VERSION = Field("schema_version", "int32", min=SCHEMA_VERSION, max=SCHEMA_VERSION, doc="contract version")

SEND_RESULT: tuple[Field, ...] = (
    _VERSION,
    Field("event_id", "string", max_len=256, doc="unique per send attempt"),
    Field("ts_ms", "int64", min=MIN_TS_MS, max=MAX_TS_MS, doc="send completion time on the producer's clock"),
    Field("cluster", "string", max_len=256),
    Field("producer_group", "string", max_len=256),
    Field("client_id", "string", max_len=256, doc="producer instance (ClientConfig.buildMQClientId)"),
    Field("client_version", "string", max_len=64, doc='e.g. "4.9.8", "5.3.3": selects the fault table'),
    Field("topic", "string", max_len=512),
    Field("broker_name", "string", max_len=256),
    Field("queue_id", "int32", min=0, max=65_535),
    Field("status", "string", enum=SEND_STATUSES),
    Field("latency_ms", "int64", min=0, max=86_400_000, doc="latency of this attempt alone"),
    Field("error", "string", nullable=True, max_len=2048, doc="exception class or broker response"),
    Field("queue_offset", "int64", nullable=True, min=0, doc="offset the message got; null on failure"),
    Field("attempt", "int32", min=0, max=1000, doc="0-based attempt number"),
    Field("isolation", "bool", required=False, nullable=True, doc="as passed to updateFaultItem"),
    Field("reachable", "bool", required=False, nullable=True, doc="5.x: as passed to updateFaultItem"),
    Field(
        "send_latency_fault_enable",
        "bool",
        required=False,
        nullable=True,
        doc="the producer's sendLatencyFaultEnable; null = the configured fleet default",
    ),
    Field(
        "fault_item_removed",
        "string",
        required=False,
        nullable=True,
        max_len=256,
        doc="4.9: a broker whose fault item the client removed by itself just before this attempt",
    ),
    Field(
        "fault_item_removed_ms",
        "int64",
        required=False,
        nullable=True,
        min=MIN_TS_MS,
        max=MAX_TS_MS,
        doc="when it removed it, on the producer's clock (with fault_item_removed)",
    ),
)

CONSUMER_PROGRESS: tuple[Field, ...] = (
    _VERSION,
    Field("ts_ms", "int64", min=MIN_TS_MS, max=MAX_TS_MS),
    Field("cluster", "string", max_len=256),
    Field("consumer_group", "string", max_len=256),
    Field("topic", "string", max_len=512),
    Field("broker_name", "string", max_len=256),
    Field("queue_id", "int32", min=0, max=65_535),
    Field("consumer_offset", "int64", min=-1, doc="committed offset; -1 = nothing committed yet"),
    Field("broker_offset", "int64", required=False, nullable=True, min=0, doc="max offset of the queue"),
    Field("client_id", "string", required=False, nullable=True, max_len=256),
    Field("last_timestamp_ms", "int64", required=False, nullable=True, min=0, max=MAX_TS_MS),
)

GROUP_MEMBERSHIP: tuple[Field, ...] = (
    Field("schema_version", "int32", required=False, nullable=True, min=SCHEMA_VERSION, max=SCHEMA_VERSION),
    Field("ts_ms", "int64", min=MIN_TS_MS, max=MAX_TS_MS),
    Field("cluster", "string", max_len=256),
    Field("consumer_group", "string", max_len=256),
    Field("topic", "string", max_len=512),
    Field("client_ids", "list<string>"),
    Field("strategy", "string", enum=ALLOCATION_STRATEGIES),
)

EVENTS: dict[str, tuple[Field, ...]] = {
    "send_result": SEND_RESULT,
    "consumer_progress": CONSUMER_PROGRESS,
    "group_membership": GROUP_MEMBERSHIP,
}


def decode_event(kind: str, value: bytes | None, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> dict[str, Any]:
    """Parse and validate one Kafka record value of event ``kind``.

    Returns the event's columns. Raises :class:`Invalid` with a stable reason code
    (``empty``, ``oversize``, ``not_utf8``, ``bad_json``, ``missing_field``, ``wrong_type``, ...).
    """
    fields = EVENTS[kind]
    if value is None or len(value) == 0:
        raise Invalid("empty", "record has no value")
    if len(value) > max_bytes:
        raise Invalid("oversize", f"value is {len(value)} bytes, limit {max_bytes}")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise Invalid("not_utf8", "value is not valid UTF-8") from None
        raise Invalid("bad_json", str(exc)[:200]) from None
    return check_record(fields, obj)


def _encode(event: Any) -> bytes:
    return orjson.dumps(event)


@dataclass(frozen=True, slots=True)
class SendResult:
    event_id: str
    ts_ms: int
    cluster: str
    producer_group: str
    client_id: str
    client_version: str
    topic: str
    broker_name: str
    queue_id: int
    status: str
    latency_ms: int
    error: str | None
    queue_offset: int | None
    attempt: int
    isolation: bool | None = None
    reachable: bool | None = None
    send_latency_fault_enable: bool | None = None
    fault_item_removed: str | None = None
    fault_item_removed_ms: int | None = None
    schema_version: int = SCHEMA_VERSION

    kind = "send_result"

    def key(self) -> bytes:
        return self.broker_name.encode()

    def to_json(self) -> bytes:
        raw = _encode(self)
        if self.fault_item_removed is None and self.fault_item_removed_ms is None:
            # absent, as the send hook writes them; a string value cannot hold this text (its quotes
            # would be escaped), so only the two fields go
            raw = raw.replace(_NO_REMOVAL, b"", 1)
        return raw


_NO_REMOVAL = b',"fault_item_removed":null,"fault_item_removed_ms":null'


@dataclass(frozen=True, slots=True)
class ConsumerProgress:
    ts_ms: int
    cluster: str
    consumer_group: str
    topic: str
    broker_name: str
    queue_id: int
    consumer_offset: int
    broker_offset: int | None = None
    client_id: str | None = None
    last_timestamp_ms: int | None = None
    schema_version: int = SCHEMA_VERSION

    kind = "consumer_progress"

    def key(self) -> bytes:
        return self.broker_name.encode()

    def to_json(self) -> bytes:
        return _encode(self)


@dataclass(frozen=True, slots=True)
class GroupMembership:
    ts_ms: int
    cluster: str
    consumer_group: str
    topic: str
    client_ids: tuple[str, ...]
    strategy: str = "AVG"
    schema_version: int = SCHEMA_VERSION

    kind = "group_membership"

    def key(self) -> bytes:
        # Membership is per group, not per broker: key by group so one group's events stay ordered.
        return self.consumer_group.encode()

    def to_json(self) -> bytes:
        return _encode(self)


Event = SendResult | ConsumerProgress | GroupMembership

__all__ = [
    "ALLOCATION_STRATEGIES",
    "CONSUMER_PROGRESS",
    "DEFAULT_MAX_EVENT_BYTES",
    "EVENTS",
    "GROUP_MEMBERSHIP",
    "SEND_RESULT",
    "SEND_STATUSES",
    "ConsumerProgress",
    "Event",
    "GroupMembership",
    "Invalid",
    "SendResult",
    "decode_event",
]
