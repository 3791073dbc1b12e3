"""Tables of the fault-state query: producer windows, broker episodes, broker health.

Windows and episodes come in two tables each. The ``_live`` table is a changelog: a window or an
episode that changes is appended again with a higher ``revision`` in the micro-batch that saw the
change, so its current view (highest revision per id) is what the fleet knows now; how many rows a
change takes depends on how the stream was cut into micro-batches. The silver table holds the
final row of each window or episode only ("closed", ``revision`` 0), written once the watermark has
passed its end: the same events give the same silver table however they were batched.

A window row is provisional ("open") until the watermark has passed its end: only then can no event
still change it, and it is appended once more as "closed" with its final end. An out-of-order event
(within the watermark) for a producer and broker replays that pair's updates in timestamp order; a
window that the replay shows never existed is appended to the live table as "retracted" (rare:
readers that keep ``state == "open"`` of the current view need do nothing about it).
"""

from __future__ import annotations

from schemas.fields import Field, TableSpec
from schemas.tables import register

WINDOW_FIELDS = (
    Field("window_id", "string", doc="cluster|producer_group|client_id|broker_name|start_ms"),
    Field("cluster", "string"),
    Field("producer_group", "string"),
    Field("client_id", "string"),
    Field("client_version", "string"),
    Field("generation", "string", doc='fault rules applied: "4.9" or "5"'),
    Field("broker_name", "string"),
    Field("start_ms", "int64", doc="when isAvailable(broker) turned false"),
    Field("end_ms", "int64", doc="avoid-until as currently known (final once closed)"),
    Field("state", "string", enum=("open", "closed", "retracted")),
    Field("trigger_event_id", "string"),
    Field("trigger_status", "string"),
    Field("trigger_latency_ms", "int64"),
    Field("trigger_error", "string", nullable=True),
    Field("trigger_isolation", "bool"),
    Field(
        "updates",
        "int32",
        doc="timestamp groups of send results that moved end_ms, the opening one included",
    ),
    Field("fault_enable", "bool", doc="false: the client runs without fault tolerance (shadow window)"),
    Field("revision", "int32", doc="live: increases each time the window's row is re-emitted; silver: 0"),
    Field(
        "updated_ms",
        "int64",
        doc="event time of the change this row records: the last update that moved end_ms; "
        "end_ms for a closed row",
    ),
    Field("event_date", "string", doc="UTC date of start_ms"),
)

EPISODE_FIELDS = (
    Field("episode_id", "string", doc="cluster|broker_name|opened_ms"),
    Field("cluster", "string"),
    Field("broker_name", "string"),
    Field("opened_ms", "int64"),
    Field("closed_ms", "int64", nullable=True),
    Field(
        "state",
        "string",
        enum=("suspected", "open", "closed", "withdrawn"),
        doc="suspected: the rules hold on the events read so far, ahead of the watermark; open/closed: "
        "decided at a grid point the watermark has passed; withdrawn: a suspicion the decision did not confirm",
    ),
    Field(
        "reason",
        "string",
        enum=("quorum", "failure_rate_outlier", "latency_outlier"),
        doc="the condition that opened it (quorum first when several held)",
    ),
    Field("peak_avoiding_share", "float64"),
    Field("peak_avoiding_producers", "int32"),
    Field("active_producers", "int32", doc="producers active on the broker at the peak share"),
    Field("sends", "int64", doc="sends to the broker in the evaluation intervals while open"),
    Field("failures", "int64"),
    Field("p99_latency_ms", "float64", doc="highest trailing-window p99 latency while open"),
    Field("dominant_error", "string", nullable=True, doc="most frequent error class while open"),
    Field("revision", "int32", doc="live: increases each time the episode's row is re-emitted; silver: 0"),
    Field("updated_ms", "int64", doc="event-time grid point of the change this row records"),
    Field(
        "cluster_brokers",
        "int32",
        doc="brokers of the cluster with sends in the last active_producer_window_s at updated_ms "
        "(the share cap's denominator before any health minute is final)",
    ),
    Field(
        "closed_by",
        "string",
        nullable=True,
        enum=("recovery", "silence"),
        doc="recovery: sends to the broker succeeded for episode_close_after_s; silence: nobody sent to it "
        "for episode_max_silence_s (it may still be down); null while suspected or open, and when withdrawn",
    ),
)

PRODUCER_FAULT_WINDOWS = TableSpec(
    "producer_fault_windows",
    WINDOW_FIELDS,
    partition_by=("event_date",),
    time_column="start_ms",
    doc="the final row of each avoidance window, once the watermark has passed its end",
)
PRODUCER_FAULT_WINDOWS_LIVE = TableSpec(
    "producer_fault_windows_live",
    WINDOW_FIELDS,
    partition_by=("event_date",),
    time_column="start_ms",
    doc="every revision of every window, appended in the micro-batch that saw it change",
)
BROKER_FAULT_EPISODES = TableSpec(
    "broker_fault_episodes",
    EPISODE_FIELDS,
    time_column="updated_ms",
    doc="the final row of each fault episode, once it is decided closed",
)
BROKER_FAULT_EPISODES_LIVE = TableSpec(
    "broker_fault_episodes_live",
    EPISODE_FIELDS,
    time_column="updated_ms",
    doc="every revision of every episode (suspicions included), appended in the micro-batch that saw it change",
)

# The live changelog and the silver table it settles into (see the module notes).
SETTLES_INTO = {
    "producer_fault_windows_live": "producer_fault_windows",
    "broker_fault_episodes_live": "broker_fault_episodes",
}

BROKER_HEALTH = TableSpec(
    "broker_health",
    (
        Field("cluster", "string"),
        Field("broker_name", "string"),
        Field("minute_ms", "int64", doc="start of the event-time minute"),
        Field("sends", "int64"),
        Field("failures", "int64"),
        Field("failures_by_error", "map<string,int64>", doc="FAILED sends by error class"),
        Field("failure_rate", "float64"),
        Field("latency_p50_ms", "float64"),
        Field("latency_p95_ms", "float64"),
        Field("latency_p99_ms", "float64"),
        Field("latency_max_ms", "int64"),
        Field("active_producers", "int32", doc="producers that sent to the broker in the minute"),
        Field("producers_avoiding", "int32", doc="producers with a window (or shadow window) in the minute"),
        Field("event_date", "string"),
    ),
    partition_by=("event_date",),
    time_column="minute_ms",
    doc="one row per broker and minute with sends, once the watermark has passed the minute",
)

register(
    PRODUCER_FAULT_WINDOWS,
    PRODUCER_FAULT_WINDOWS_LIVE,
    BROKER_FAULT_EPISODES,
    BROKER_FAULT_EPISODES_LIVE,
    BROKER_HEALTH,
)
