"""``/metrics``: a :class:`ServeState` in the Prometheus text exposition format (0.0.4).

Names follow Prometheus conventions: base units (``_seconds``, ratios 0-1 as ``_ratio``),
``_total`` for counters, one series per state with value 0 or 1 for enumerations (group status,
episode state). Per-queue series exist for the ``max_queue_series`` worst queues only, so label
cardinality stays bounded however many queues the clusters have.

The text is written here rather than by prometheus-client's ``generate_latest``: for 10,000
series that took most of a refresh, while this writer does the same in a small fraction of it
(the tests parse the output with prometheus-client's parser).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.serve.state import EPISODE_STATES, TIME_COLUMN, Queue, ServeState
from schemas.lag import LAG_STATUSES


@dataclass(frozen=True)
class RefreshStats:
    """How the refresh that produced a state went (``serve``'s own health)."""

    duration_s: float
    finished_ms: int
    ok_total: int
    error_total: int


@dataclass
class Family:
    """One metric family: its HELP and TYPE lines and its samples, already formatted."""

    name: str
    doc: str
    kind: str
    labels: Sequence[str]
    lines: list[str] = field(default_factory=list)

    def add_metric(self, values: Sequence[str], value: float) -> None:
        sample = self.name + "_total" if self.kind == "counter" else self.name
        if self.labels:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(self.labels, values))
            self.lines.append(f"{sample}{{{pairs}}} {_number(value)}")
        else:
            self.lines.append(f"{sample} {_number(value)}")

    def add_line(self, labels: str, value: float) -> None:
        """A sample whose label pairs are already formatted (``a="x",b="y"``): shared prefixes are
        formatted once per group rather than once per series."""
        sample = self.name + "_total" if self.kind == "counter" else self.name
        self.lines.append(f"{sample}{{{labels}}} {_number(value)}")

    def text(self) -> str:
        name = self.name + "_total" if self.kind == "counter" else self.name
        doc = self.doc.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.lines)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    if value == 0.0:
        return "0.0"
    if value == 1.0:
        return "1.0"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _g(name: str, doc: str, labels: list[str]) -> Family:
    return Family(name, doc, "gauge", labels)


def _c(name: str, doc: str, labels: list[str]) -> Family:
    return Family(name, doc, "counter", labels)


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def group_families(state: ServeState) -> list[Family]:
    labels = ["cluster", "group"]
    lag = _g("faultwatch_group_lag_messages", "Messages behind on the group's main-topic queues.", labels)
    retry = _g("faultwatch_group_retry_lag_messages", "Messages behind on the group's retry topic.", labels)
    dlq = _g("faultwatch_group_dlq_lag_messages", "Messages in the group's dead-letter topic not consumed.", labels)
    time_lag = _g("faultwatch_group_max_time_lag_seconds", "Largest time lag over the group's queues.", labels)
    status = _g("faultwatch_group_status", "1 for the group's current Burrow-style status, 0 for the others.",
                [*labels, "status"])
    complete = _g("faultwatch_group_complete_ratio", "Share of the evaluation window the status rests on.", labels)
    for cluster in state.clusters.values():
        for group in cluster.groups.values():
            prefix = f'cluster="{_escape(cluster.name)}",group="{_escape(group.name)}"'
            for family, value in ((lag, group.total_lag), (retry, group.retry_lag), (dlq, group.dlq_lag),
                                  (time_lag, _seconds(group.max_time_lag_ms)), (complete, group.complete)):
                if value is not None:
                    family.add_line(prefix, float(value))
            for s in LAG_STATUSES:
                status.add_line(f'{prefix},status="{s}"', 1.0 if group.status == s else 0.0)
    return [lag, retry, dlq, time_lag, status, complete]


def worst_queues(state: ServeState, limit: int) -> list[tuple[str, str, Queue]]:
    """The ``limit`` queues with the most lag (then time lag), over every group."""
    rows = [
        (c.name, g.name, q)
        for c in state.clusters.values() for g in c.groups.values() for q in g.queues
        if q.lag is not None or q.time_lag_ms is not None
    ]
    rows.sort(key=lambda r: (-(r[2].lag or 0), -(r[2].time_lag_ms or 0), r[0], r[1], r[2].topic, r[2].broker, r[2].queue_id))
    return rows[:limit]


def queue_families(state: ServeState, limit: int) -> list[Family]:
    labels = ["cluster", "group", "topic", "broker", "queue"]
    lag = _g("faultwatch_queue_lag_messages", "Messages behind on one of the worst queues.", labels)
    time_lag = _g("faultwatch_queue_time_lag_seconds", "Time lag of one of the worst queues.", labels)
    for cluster, group, q in worst_queues(state, limit):
        values = [cluster, group, q.topic, q.broker, str(q.queue_id)]
        if q.lag is not None:
            lag.add_metric(values, float(q.lag))
        if q.time_lag_ms is not None:
            time_lag.add_metric(values, q.time_lag_ms / 1000.0)
    return [lag, time_lag]


def broker_families(state: ServeState) -> list[Family]:
    labels = ["cluster", "broker"]
    state_f = _g("faultwatch_broker_episode_state",
                 "1 for the broker's fault episode state (none, suspected, open), 0 for the others.",
                 [*labels, "state"])
    episodes = _c("faultwatch_broker_episodes", "Confirmed fault episodes of the broker.", labels)
    failure = _g("faultwatch_broker_failure_ratio", "Failed sends / sends in the broker's latest health minute.",
                 labels)
    p99 = _g("faultwatch_broker_latency_p99_seconds", "p99 send latency in the broker's latest health minute.",
             labels)
    avoiding = _g("faultwatch_broker_producers_avoiding",
                  "Producers avoiding the broker (their own fault rules) in its latest health minute.", labels)
    active = _g("faultwatch_broker_active_producers", "Producers sending to the broker in its latest health minute.",
                labels)
    minute = _g("faultwatch_broker_health_timestamp_seconds", "Start of the broker's latest health minute.",
                labels)
    avoided = _g("faultwatch_broker_avoidance_recommended",
                 "1 while the published avoidance list tells producers to avoid the broker.", labels)
    for cluster in state.clusters.values():
        for broker in cluster.brokers.values():
            values = [cluster.name, broker.name]
            for s in EPISODE_STATES:
                state_f.add_metric([*values, s], 1.0 if broker.episode_state == s else 0.0)
            episodes.add_metric(values, float(broker.episodes_confirmed))
            avoided.add_metric(values, 1.0 if broker.avoided else 0.0)
            h = broker.health
            if h is None:
                continue
            for family, value in ((failure, h.get("failure_rate")), (p99, _seconds(h.get("latency_p99_ms"))),
                                  (avoiding, h.get("producers_avoiding")), (active, h.get("active_producers")),
                                  (minute, _seconds(h.get("minute_ms")))):
                if value is not None:
                    family.add_metric(values, float(value))
    return [state_f, episodes, failure, p99, avoiding, active, minute, avoided]


def avoidance_families(state: ServeState) -> list[Family]:
    count = _g("faultwatch_avoidance_brokers", "Brokers the cluster's published list tells producers to avoid now.",
               ["cluster"])
    decided = _g("faultwatch_avoidance_decided_timestamp_seconds", "When the cluster's published list was decided.",
                 ["cluster"])
    expires = _g("faultwatch_avoidance_expiry_timestamp_seconds",
                 "When producers drop the cluster's published list if no newer one arrives.", ["cluster"])
    for cluster in state.clusters.values():
        count.add_metric([cluster.name], float(sum(b.avoided for b in cluster.brokers.values())))
        doc = cluster.avoidance
        if doc is not None:
            decided.add_metric([cluster.name], int(doc["decided_ms"]) / 1000.0)
            expires.add_metric([cluster.name], int(doc["expires_ms"]) / 1000.0)
    bad = _g("faultwatch_avoidance_file_unusable",
             "1 for each published avoidance file serve could not use (unreadable or of the wrong shape).", ["file"])
    for name in sorted(state.avoidance_bad):
        bad.add_metric([name], 1.0)
    return [count, decided, expires, bad]


def pipeline_families(state: ServeState, refresh: RefreshStats) -> list[Family]:
    up = _g("faultwatch_table_up", "1 when the Delta table was readable at the last refresh.", ["table"])
    newest = _g("faultwatch_table_newest_event_timestamp_seconds", "Event time of the table's newest row.",
                ["table"])
    age = _g("faultwatch_table_newest_event_age_seconds", "Wall-clock age of the table's newest row.", ["table"])
    for table in TIME_COLUMN:
        up.add_metric([table], 0.0 if table in state.table_errors else 1.0)
        ms = state.newest_ms.get(table)
        if ms is not None:
            newest.add_metric([table], ms / 1000.0)
            age.add_metric([table], max(state.now_ms - ms, 0) / 1000.0)
    cycles = _g("faultwatch_publisher_last_cycle_timestamp_seconds",
                "Decision time of the publisher's last cycle per step and outcome.", ["step", "status"])
    for step, status, ms in state.publisher:
        cycles.add_metric([step, status], ms / 1000.0)
    quarantine = _c("faultwatch_quarantine_records", "Records rejected into quarantine.", ["reason", "stage"])
    for reason, stage, n in state.quarantine:
        quarantine.add_metric([reason, stage], float(n))
    duration = _g("faultwatch_serve_refresh_duration_seconds", "How long serve's last refresh of the tables took.", [])
    duration.add_metric([], refresh.duration_s)
    last = _g("faultwatch_serve_last_refresh_timestamp_seconds", "When serve's last refresh finished.", [])
    last.add_metric([], refresh.finished_ms / 1000.0)
    refreshes = _c("faultwatch_serve_refreshes", "serve's refreshes of the tables by result.", ["result"])
    refreshes.add_metric(["ok"], float(refresh.ok_total))
    refreshes.add_metric(["error"], float(refresh.error_total))
    return [up, newest, age, cycles, quarantine, duration, last, refreshes]


def render_metrics(state: ServeState, refresh: RefreshStats, max_queue_series: int) -> bytes:
    """The whole ``/metrics`` body for ``state``."""
    families = [
        *group_families(state),
        *queue_families(state, max_queue_series),
        *broker_families(state),
        *avoidance_families(state),
        *pipeline_families(state, refresh),
    ]
    return "".join(f.text() for f in families).encode()

