"""The Spark shim over ``pipeline.lag.step``: a file stream of routed bronze rows -> memory sink.

The query's output must be exactly what the pure step gives for the same batches (a shard with
events runs on its own event time); and a cluster that goes silent must still be judged, by the
event-time timeout, at the query's clock (watermark + delay) while other clusters move it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config, LagConfig, LagGroupConfig
from pipeline.lag import events_frame, initial_state, step
from schemas.fields import spark_schema
from schemas.tables import routed_fields, table
from streaming.lag_query import LAG_TABLES, build_lag_output
from tests.doubles.lag_synth import bronze_rows, membership, progress, send

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
FUTURE = 4_000_000_000_000  # 2096: ahead of any batch time
INPUT = ["send_results", "consumer_progress", "group_membership", "quarantine"]


def run_query(spark: Any, cfg: Config, folder: Path, batches: list[list[Any]], name: str) -> pd.DataFrame:
    folder.mkdir(parents=True, exist_ok=True)
    stream = spark.readStream.schema(spark_schema(routed_fields(INPUT))).parquet(str(folder))
    query = (
        build_lag_output(stream, cfg)
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(folder.parent / f"{name}-checkpoint"))
        .start()
    )
    try:
        offset = 0
        for i, events in enumerate(batches):
            frame = events_frame(events)
            frame["src_offset"] += offset
            offset += len(frame)
            pq.write_table(bronze_rows(frame), folder / f"batch-{i:03d}.parquet")
            query.processAllAvailable()
    finally:
        query.stop()
    return spark.sql(f"SELECT * FROM {name}").toPandas()


def rows_of(frame: pd.DataFrame, name: str) -> list[dict[str, Any]]:
    """One table's rows as sorted plain dicts (nulls as None, lists as lists)."""
    cols = table(name).columns
    if "_table" in frame.columns:
        frame = frame[frame["_table"] == name]
    out = []
    for row in frame[cols].to_dict("records"):
        clean = {}
        for k, v in row.items():
            if hasattr(v, "tolist"):
                v = v.tolist()
            clean[k] = None if not isinstance(v, (list, bytes)) and pd.isna(v) else v
        out.append(clean)
    return sorted(out, key=lambda r: [str(r[c]) for c in cols])


def pure_outputs(batches: list[list[Any]], cfg: Config) -> dict[str, pd.DataFrame]:
    state = initial_state("c1", cfg.lag)
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in LAG_TABLES}
    offset = 0
    for events in batches:
        frame = events_frame(events)
        frame["src_offset"] += offset
        frame["src_topic"] = [f"rmq.{k}" for k in frame["kind"]]
        frame["src_ts_ms"] = frame["ts_ms"]
        offset += len(frame)
        state, out = step(state, frame, 0, cfg.lag)
        parts["queue_lag"].append(out.queue_lag)
        parts["group_status"].append(out.group_status)
        parts["quarantine"].append(out.quarantine)
    return {name: pd.concat(p, ignore_index=True) for name, p in parts.items()}


def test_query_output_equals_the_pure_step(spark: Any, cfg: Config, tmp_path: Path) -> None:
    cfg = cfg.replace(
        lag=LagConfig(
            window_commits=4, min_commits=3, groups={"H": LagGroupConfig("CONSUME_FROM_FIRST_OFFSET")}
        )
    )
    batches = [
        [membership(T0, ["c1", "c2"])]
        + [send(T0 + 100 * i, q, i) for q in (0, 1) for i in range(5)]
        + [
            progress(T0 + 1_000, 0, 1, client="c1"),
            progress(T0 + 1_000, 0, -1, topic="%RETRY%G", broker_offset=3),
            progress(FUTURE, 1, 1, client="c2"),
        ],
        [send(T0 + 5_000, 0, 5), send(T0 + 5_100, 0, 6)]
        + [progress(T0 + 6_000, 0, 3, client="c1"), progress(T0 + 6_000, 1, 2, client="c1")],
        [
            progress(T0 + 40_000, 0, 4, client="c1"),
            progress(T0 + 40_000, 1, 2, client="c1"),
            progress(T0 + 40_000, 0, -1, group="H"),
        ],
    ]
    got = run_query(spark, cfg, tmp_path / "in", batches, "lag_equals_pure")
    want = pure_outputs(batches, cfg)
    for name in LAG_TABLES:
        assert rows_of(got, name) == rows_of(want[name], name), name
    # the scenario covers what it claims: a quarantined event, retry lag, a non-owner, ConsumeFromWhere
    groups = rows_of(want["group_status"], "group_status")
    assert [(g["consumer_group"], g["retry_lag"], g["mismatched_queues"]) for g in groups] == [
        ("G", 3, 0),
        ("G", 3, 0),
        ("G", 3, 1),
        ("H", None, 0),
    ]
    assert [r["reason"] for r in rows_of(want["quarantine"], "quarantine")] == ["future_ts"]
    assert {r["start_policy"] for r in rows_of(want["queue_lag"], "queue_lag")} == {
        None,
        "CONSUME_FROM_LAST_OFFSET",
        "CONSUME_FROM_FIRST_OFFSET",
    }


def test_silent_cluster_is_judged_by_timeout(spark: Any, cfg: Config, tmp_path: Path) -> None:
    """c1 goes silent after its consumer committed 4 times 1 s apart (window span 3 s), while c2
    keeps the watermark moving: at the watermark T0+10 s, 6 s after the last commit, GS is STOP."""
    cfg = cfg.replace(
        lag=LagConfig(window_commits=4, min_commits=3, shards=2, idle_evaluation_s=5.0),
        stream__watermark_delay_s=0.0,
    )
    c1 = [send(T0, 0, i) for i in range(10)] + [
        progress(T0 + 1_000 * k, 0, k, group="GS") for k in (1, 2, 3, 4)
    ]
    c2 = [progress(T0 + 4_000, 0, 0, group="X", broker_offset=1, cluster="c2")]
    batches = [
        c1 + c2,
        [progress(T0 + 10_000, 0, 1, group="X", broker_offset=1, cluster="c2")],
        [progress(T0 + 20_000, 0, 1, group="X", broker_offset=1, cluster="c2")],
    ]
    got = run_query(spark, cfg, tmp_path / "in", batches, "lag_timeout")
    gs = [
        (r["ts_ms"] - T0, r["status"], r["previous_status"], r["alert"], r["total_lag"])
        for r in rows_of(got, "group_status")
        if r["consumer_group"] == "GS"
    ]
    assert gs == [(4_000, "OK", None, False, 6), (10_000, "STOP", "OK", True, 6)]
    (stopped,) = [
        r for r in rows_of(got, "queue_lag") if r["consumer_group"] == "GS" and r["status"] == "STOP"
    ]
    assert (stopped["ts_ms"] - T0, stopped["last_commit_ms"] - T0, stopped["lag_messages"]) == (
        10_000,
        4_000,
        6,
    )


def test_late_events_reach_quarantine_through_spark(spark: Any, cfg: Config, tmp_path: Path) -> None:
    """Spark would drop rows behind the watermark before the stateful operator; the guard column
    makes them reach the step, which quarantines them as late (stage lag)."""
    cfg = cfg.replace(stream__watermark_delay_s=10.0)
    batches = [
        [progress(T0 + 60_000, 0, 1, broker_offset=3)],  # watermark -> T0+50 s after this batch
        [progress(T0, 1, 1, broker_offset=3), progress(T0 + 61_000, 0, 2, broker_offset=3)],
    ]
    got = run_query(spark, cfg, tmp_path / "in", batches, "lag_late")
    (late,) = rows_of(got, "quarantine")
    assert (late["reason"], late["stage"], late["event_kind"], late["source_offset"]) == (
        "late", "lag", "consumer_progress", 1
    )
    assert {r["queue_id"] for r in rows_of(got, "queue_lag")} == {0}
