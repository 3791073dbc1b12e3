"""Silver tables of the lag query: per-queue lag and per-group status history.

Both are append-only histories: a row is the state of a (group, queue) or a group at the batch's
event-time clock ``ts_ms``. Unknown numbers are null, never NaN and never a guessed zero.
"""

from __future__ import annotations

from schemas.fields import Field, TableSpec
from schemas.tables import register

LAG_STATUSES = ("OK", "WARN", "STALL", "STOP", "REWIND", "UNKNOWN")
BURROW_GROUP_STATUSES = ("NOTFOUND", "OK", "WARN", "ERR")

QUEUE_LAG = TableSpec(
    "queue_lag",
    (
        Field("cluster", "string"),
        Field("consumer_group", "string"),
        Field("topic", "string"),
        Field("topic_kind", "string", enum=("main", "retry", "dlq")),
        Field("broker_name", "string"),
        Field("queue_id", "int32"),
        Field("ts_ms", "int64", doc="event time of the observation (the lag query's clock)"),
        Field(
            "consumer_offset",
            "int64",
            nullable=True,
            doc="committed offset; for -1 the start offset start_policy implies; null = never reported",
        ),
        Field("broker_offset", "int64", nullable=True, doc="best known max offset of the queue"),
        Field("lag_messages", "int64", nullable=True, doc="null = unknown (no broker offset known)"),
        Field("offset_clamped", "bool", doc="consumer offset was above the known max offset"),
        Field("time_lag_ms", "int64", nullable=True),
        Field("time_lag_method", "string", doc="exact | interpolated | extrapolated | idle | unknown"),
        Field("start_policy", "string", nullable=True, doc="ConsumeFromWhere applied to an offset of -1"),
        Field("last_commit_ms", "int64", nullable=True),
        Field("owner_client_id", "string", nullable=True),
        Field("reported_by", "string", nullable=True),
        Field("owner_mismatch", "bool", doc="progress reported by a client that does not own the queue"),
        Field("status", "string", enum=LAG_STATUSES, doc="Burrow verdict of the queue at ts_ms"),
        Field("event_date", "string"),
    ),
    partition_by=("event_date",),
    time_column="ts_ms",
)

GROUP_STATUS = TableSpec(
    "group_status",
    (
        Field("cluster", "string"),
        Field("consumer_group", "string"),
        Field("ts_ms", "int64"),
        Field("status", "string", enum=LAG_STATUSES),
        Field("previous_status", "string", nullable=True),
        Field("total_lag", "int64", nullable=True),
        Field("max_time_lag_ms", "int64", nullable=True),
        Field("retry_lag", "int64", nullable=True),
        Field("dlq_lag", "int64", nullable=True),
        Field("worst_topic", "string", nullable=True),
        Field("worst_broker", "string", nullable=True),
        Field("worst_queue_id", "int32", nullable=True),
        Field("worst_owner", "string", nullable=True),
        Field("queues", "int32", doc="main-topic queues of the group"),
        Field("mismatched_queues", "int32", doc="queues whose progress came from a client not owning them"),
        Field("idle_consumers", "list<string>", doc="members owning no main-topic queue"),
        Field("alert", "bool", doc="a transition to WARN or worse, or max time lag crossing the bound"),
        Field("alert_reason", "string", nullable=True),
        Field("event_date", "string"),
        Field(
            "burrow_status",
            "string",
            enum=BURROW_GROUP_STATUSES,
            doc="Burrow's group status over the main-topic queues: ERR for any STOP, STALL or REWIND queue; "
            "NOTFOUND once the group has no queue left",
        ),
        Field("complete", "float64", doc="share of main-topic queues whose commit window is full (Burrow)"),
        Field("max_lag", "int64", nullable=True, doc="lag of the main-topic queue with the highest lag"),
        Field("maxlag_topic", "string", nullable=True, doc="Burrow's maxlag: the queue with the highest lag"),
        Field("maxlag_broker", "string", nullable=True),
        Field("maxlag_queue_id", "int32", nullable=True),
    ),
    partition_by=("event_date",),
    time_column="ts_ms",
)

register(QUEUE_LAG, GROUP_STATUS)
