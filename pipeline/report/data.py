"""What the report reads: current views of the silver tables, as pandas frames, never failing.

Reads go through :func:`pipeline.deltaio.read_table` (deltalake with an explicit pyarrow filesystem,
the safe path around delta-rs#2184). A missing table reads as empty, so the report can be written
at any moment of a run ("no data yet" where nothing arrived). Appended histories are reduced to
their current view (highest ``revision`` per id). When ``broker_health`` (per event-time minute)
holds too few minutes to draw a line, as after a short run, and bronze ``send_results`` exists,
per-broker statistics are computed from bronze instead, at a resolution that suits the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.deltaio import latest_revision, read_table, table_columns, table_exists

_COLUMNS = {
    "producer_fault_windows_live": ["window_id", "cluster", "producer_group", "client_id", "client_version", "broker_name",
                               "start_ms", "end_ms", "state", "fault_enable", "revision"],
    "broker_fault_episodes_live": ["episode_id", "cluster", "broker_name", "opened_ms", "closed_ms", "state", "reason",
                              "peak_avoiding_share", "peak_avoiding_producers", "failures", "dominant_error", "revision"],
    "broker_health": ["cluster", "broker_name", "minute_ms", "sends", "failures", "failure_rate", "latency_p50_ms",
                      "latency_p95_ms", "latency_p99_ms", "producers_avoiding"],
    "group_status": ["cluster", "consumer_group", "ts_ms", "status", "total_lag", "max_time_lag_ms", "idle_consumers"],
    "queue_lag": ["cluster", "consumer_group", "topic", "broker_name", "queue_id", "ts_ms", "owner_client_id",
                  "lag_messages"],
    "avoidance_recommendations": ["cycle_id", "cluster", "broker_name", "action", "avoid_until_ms", "expires_ms",
                                  "reason", "producers_avoiding", "decided_ms"],
}
# Columns shown when the table has them (a table an older faultwatch wrote, not yet evolved, lacks them).
_OPTIONAL = {"broker_fault_episodes_live": ["closed_by"]}
_TIME_COLUMN = {
    "producer_fault_windows_live": "end_ms",
    "broker_fault_episodes_live": None,
    "broker_health": "minute_ms",
    "group_status": "ts_ms",
    "queue_lag": "ts_ms",
    "avoidance_recommendations": "decided_ms",
}
# broker_health with fewer minutes per broker than this is drawn from bronze at a finer resolution,
# one of these bucket sizes (ms): the largest that still gives about that many points.
HEALTH_MIN_POINTS = 6
HEALTH_BUCKETS_MS = (60_000, 30_000, 15_000, 10_000, 5_000)
_CURRENT_VIEW_KEY = {"producer_fault_windows_live": "window_id", "broker_fault_episodes_live": "episode_id"}


@dataclass
class ReportData:
    """Frames per table (empty frames for missing tables) and where they came from."""

    frames: dict[str, pd.DataFrame]
    present: dict[str, bool]
    health_source: str = "broker_health"
    health_bucket_ms: int = 60_000  # the resolution of the broker_health frame
    notes: list[str] = field(default_factory=list)

    def frame(self, name: str) -> pd.DataFrame:
        return self.frames[name]

    def time_range(self) -> tuple[int, int] | None:
        """The span of event time observed (ms), if any; avoid-until times in the future do not count."""
        lo, hi = [], []
        for name, col, extra in (("broker_health", "minute_ms", self.health_bucket_ms), ("group_status", "ts_ms", 0),
                                 ("queue_lag", "ts_ms", 0), ("producer_fault_windows_live", "start_ms", 0),
                                 ("broker_fault_episodes_live", "opened_ms", 0)):
            df = self.frames[name]
            if len(df):
                lo.append(int(df[col].min()))
                hi.append(int(df[col].max()) + extra)
        episodes = self.frames["broker_fault_episodes_live"]
        if len(episodes) and episodes["closed_ms"].notna().any():
            hi.append(int(episodes["closed_ms"].max()))
        return (min(lo), max(hi)) if lo else None


def load_report_data(root: str, since_ms: int | None = None) -> ReportData:
    """Read every table the report plots; ``since_ms`` keeps recent rows only."""
    frames: dict[str, pd.DataFrame] = {}
    present: dict[str, bool] = {}
    for name, columns in _COLUMNS.items():
        present[name] = table_exists(root, name)
        frames[name] = _read(root, name, columns, since_ms)
    data = ReportData(frames, present)
    minutes = _points_per_broker(frames["broker_health"])
    if minutes < HEALTH_MIN_POINTS and table_exists(root, "send_results"):
        _health_from_bronze_instead(data, root, since_ms, minutes)
    return data


def _points_per_broker(health: pd.DataFrame) -> int:
    return int(health.groupby(["cluster", "broker_name"]).minute_ms.nunique().max()) if len(health) else 0


def health_bucket_ms(span_ms: int) -> int:
    """The coarsest of :data:`HEALTH_BUCKETS_MS` that cuts ``span_ms`` into HEALTH_MIN_POINTS or more."""
    for bucket in HEALTH_BUCKETS_MS:
        if span_ms >= bucket * HEALTH_MIN_POINTS:
            return bucket
    return HEALTH_BUCKETS_MS[-1]


def _health_from_bronze_instead(data: ReportData, root: str, since_ms: int | None, minutes: int) -> None:
    flt = pc.field("ts_ms") >= since_ms if since_ms is not None else None
    times = read_table(root, "send_results", columns=["ts_ms"], filter=flt).column("ts_ms")
    if len(times) == 0:
        return
    bucket = health_bucket_ms(int(pc.max(times).as_py()) - int(pc.min(times).as_py()))
    health = health_from_bronze(root, since_ms, bucket)
    if health.empty or (bucket == 60_000 and minutes):
        return  # nothing finer to show than what broker_health holds
    data.frames["broker_health"] = health
    data.health_source = "send_results"
    data.health_bucket_ms = bucket
    held = "is empty" if not minutes else f"holds {minutes} minute{'s' if minutes > 1 else ''} per broker so far"
    data.notes.append(
        f"broker_health (per event-time minute) {held}, too few to draw: failure rates and latencies are "
        f"computed from bronze send_results per {bucket // 1000} s"
    )


def _read(root: str, name: str, columns: list[str], since_ms: int | None) -> pd.DataFrame:
    time_col = _TIME_COLUMN[name]
    flt = pc.field(time_col) >= since_ms if (since_ms is not None and time_col) else None
    optional = _OPTIONAL.get(name, [])
    if optional:
        have = set(table_columns(root, name))
        columns = columns + [c for c in optional if c in have]
    table = read_table(root, name, columns=columns, filter=flt)
    key = _CURRENT_VIEW_KEY.get(name)
    if key is not None:
        table = latest_revision(table, key)
        if "state" in table.column_names:  # rows that turned out never to have happened
            table = table.filter(pc.invert(pc.is_in(table.column("state"), pa.array(["retracted", "withdrawn"]))))
    return table.to_pandas()


def health_from_bronze(root: str, since_ms: int | None = None, bucket_ms: int = 60_000) -> pd.DataFrame:
    """Per broker and ``bucket_ms`` (a minute by default): sends, failures, failure rate and latency
    percentiles (t-digest). The bucket's start is in ``minute_ms``, broker_health's time column."""
    flt = pc.field("ts_ms") >= since_ms if since_ms is not None else None
    t = read_table(root, "send_results", columns=["cluster", "broker_name", "ts_ms", "status", "latency_ms"], filter=flt)
    if t.num_rows == 0:
        return pd.DataFrame(columns=_COLUMNS["broker_health"])
    step = pa.scalar(bucket_ms, pa.int64())
    minute = pc.multiply(pc.divide(t.column("ts_ms"), step), step)
    failed = pc.cast(pc.equal(t.column("status"), "FAILED"), pa.int64())
    t = t.append_column("minute_ms", minute).append_column("failed", failed)
    agg = t.group_by(["cluster", "broker_name", "minute_ms"]).aggregate(
        [("failed", "count"), ("failed", "sum"), ("latency_ms", "tdigest", pc.TDigestOptions(q=[0.5, 0.95, 0.99]))]
    )
    df = agg.to_pandas()
    q = df.pop("latency_ms_tdigest")
    out = pd.DataFrame({
        "cluster": df["cluster"],
        "broker_name": df["broker_name"],
        "minute_ms": df["minute_ms"].astype("int64"),
        "sends": df["failed_count"].astype("int64"),
        "failures": df["failed_sum"].astype("int64"),
    })
    out["failure_rate"] = out["failures"] / out["sends"]
    for i, name in enumerate(("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")):
        out[name] = [float(v[i]) for v in q]
    out["producers_avoiding"] = pd.NA
    return out.sort_values(["cluster", "broker_name", "minute_ms"]).reset_index(drop=True)
