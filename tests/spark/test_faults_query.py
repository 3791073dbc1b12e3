"""The Spark shim over ``pipeline.faults.step``: a file stream of routed bronze rows -> memory sink.

Each Parquet file is one micro-batch. The query must write exactly the rows the pure fleet step
writes for the same batches, let late events reach the step (Spark's own watermark would drop them:
shown below), and reproduce the Java client's windows from the differential vectors.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config
from pipeline.faults import from_send_results
from pipeline.faults.frame import Cols, concat, take
from pipeline.simulate import MemorySink, Simulation
from schemas.fields import spark_schema
from schemas.tables import routed_fields
from streaming.delta_sink import COUNTED, EVENTS_COLUMN
from streaming.faults_query import FAULT_TABLES, build_faults_output
from tests.doubles.faults_reference import (
    current_view,
    run_fleet,
    uses_default_tables,
    vector_events,
    window_keys,
    windows_from_vector,
)
from tests.doubles.faults_synth import T0, bronze_table, outage_scenario

pytestmark = pytest.mark.spark

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq-vectors"
INPUT = ["send_results", "quarantine"]
TABLE_KEY = {"producer_fault_windows_live": "windows", "broker_fault_episodes_live": "episodes",
             "broker_health": "health", "quarantine": "quarantine"}
SILVER = {"producer_fault_windows": "windows", "broker_fault_episodes": "episodes"}  # final rows, revision 0


def expected(want: dict[str, list[dict]], table: str) -> list[dict]:
    """The rows table ``table`` should hold, from the pure step's outputs (by output name)."""
    if table in SILVER:
        return [{**r, "revision": 0} for r in want[SILVER[table]] if r["state"] == "closed"]
    return want[TABLE_KEY[table]]


def run_query(spark: Any, tmp: Path, batches: list[Cols], cfg: Config, name: str) -> dict[str, list[dict]]:
    """Feed one Parquet file per micro-batch; return the written rows per table."""
    src = tmp / f"{name}-in"
    src.mkdir()
    stream = spark.readStream.schema(spark_schema(routed_fields(INPUT))).option("maxFilesPerTrigger", 1)
    query = (
        build_faults_output(stream.parquet(str(src)), cfg)
        .writeStream.format("memory").queryName(name).outputMode("append")
        .option("checkpointLocation", str(tmp / f"{name}-ck")).start()
    )
    try:
        for i, batch in enumerate(batches):
            pq.write_table(bronze_table(batch), src / f"part-{i:04d}.parquet")
            query.processAllAvailable()
        assert query.exception() is None
        rows = [r.asDict() for r in spark.sql(f"select * from {name}").collect()]
    finally:
        query.stop()
    out: dict[str, list[dict]] = {t: [] for t in FAULT_TABLES} | {COUNTED: []}
    for r in rows:
        table = r.pop("_table")
        if table == COUNTED:  # the send results a batch read, for the progress line
            out[table].append({EVENTS_COLUMN: r[EVENTS_COLUMN]})
            continue
        out[table].append({k: r[k] for k in (f.name for f in _fields(table))})
    return out


def _fields(table: str) -> Any:
    from schemas.tables import table as spec

    return spec(table).fields


def normalize(rows: list[dict], table: str) -> list[str]:
    def plain(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            return v.hex()
        if isinstance(v, float):
            return round(v, 6)
        if isinstance(v, list):  # a map from Spark comes back as a dict; pure rows hold dicts
            return dict(v)
        return v

    return sorted(json.dumps({k: plain(v) for k, v in r.items()}, sort_keys=True, default=str) for r in rows)


def test_query_writes_exactly_what_the_pure_step_writes(spark: Any, tmp_path: Path) -> None:
    sim = Simulation(outage_scenario(producers=12, outage_s=60.0, start_s=30.0, after_s=90.0, rate_per_s=4.0))
    sink = MemorySink()
    sim.run(sink)
    events = sink.events("send_result")
    cols = from_send_results(events, partitions=[sum(map(ord, e.broker_name)) % 4 for e in events])
    ts = cols["ts_ms"]
    t0 = int(ts.min())
    edges = [t0 + s * 1000 for s in (0, 40, 70, 95, 130, 160, 10_000)]
    batches = [take(cols, (ts >= a) & (ts < b)) for a, b in itertools.pairwise(edges)]
    late = take(cols, (ts >= t0) & (ts < t0 + 200))  # re-delivered: behind the watermark by then
    batches.append(concat(late, take(cols, ts < 0)))
    cfg = Config()
    got = run_query(spark, tmp_path, batches, cfg, "faults_vs_pure")
    _, want = run_fleet(batches, cfg.faults, int(cfg.stream.watermark_delay_s * 1000))
    for table in FAULT_TABLES:
        assert normalize(got[table], table) == normalize(expected(want, table), table), table
    assert got["producer_fault_windows"] and got["broker_fault_episodes"]
    assert {q["reason"] for q in got["quarantine"]} == {"late"} and len(got["quarantine"]) == late["ts_ms"].size
    assert [e["broker_name"] for e in current_view(got["broker_fault_episodes_live"], "episode_id")] == ["broker-c"]
    assert got["broker_health"] and all(isinstance(h["failures_by_error"], dict) for h in got["broker_health"])
    # one count per batch: what it read, not the few chunk rows Spark saw
    assert sorted(c[EVENTS_COLUMN] for c in got[COUNTED]) == sorted(b["ts_ms"].size for b in batches if b["ts_ms"].size)


def test_spark_alone_would_drop_late_rows_before_a_stateful_function(spark: Any, tmp_path: Path) -> None:
    """Why the query keeps its own watermark: with Spark's (and an event-time timeout) the function
    never sees a row behind the watermark, so it could not quarantine it."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    src = tmp_path / "plain"
    src.mkdir()

    def fn(key: Any, frames: Any, state: Any) -> Any:
        n = sum(len(f) for f in frames)
        state.update((n,))
        state.setTimeoutTimestamp(max(state.getCurrentWatermarkMs(), 1) + 1)
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    df = spark.readStream.schema("k string, ts_ms long").option("maxFilesPerTrigger", 1).parquet(str(src))
    df = df.withColumn("t", F.timestamp_millis("ts_ms")).withWatermark("t", "30 seconds")
    q = (df.groupBy("k").applyInPandasWithState(fn, "k string, n long", "n long", "append",
                                                GroupStateTimeout.EventTimeTimeout)
         .writeStream.format("memory").queryName("plain_drop").option("checkpointLocation", str(tmp_path / "ck"))
         .start())
    try:
        for i, rows in enumerate([[("a", T0 + 100_000)], [("a", T0)]]):
            pq.write_table(pa.table({"k": [r[0] for r in rows], "ts_ms": [r[1] for r in rows]}), src / f"{i}.parquet")
            q.processAllAvailable()
        seen = sum(r["n"] for r in spark.sql("select * from plain_drop").collect())
    finally:
        q.stop()
    assert seen == 1  # the late row never reached the function


def test_vector_cases_through_spark_give_the_java_client_windows(spark: Any, tmp_path: Path) -> None:
    events, expected = [], []
    for version in ("4.9.8", "5.3.3"):
        with open(VECTORS / f"faults-{version}.jsonl") as fh:
            cases = [json.loads(line) for line in fh]
        for i, case in enumerate(cases[:60]):
            if not uses_default_tables(case) or not case["input"]["events"]:
                continue
            # each case an hour apart from T0 on: real times, and none ahead of the batch time
            offset = T0 + i * 3_600_000 - min(e["ts_ms"] for e in case["input"]["events"])
            group = f"PG_{version}"
            events += vector_events(case, version, offset, group=group)
            if case["input"].get("send_latency_fault_enable", True):
                expected += [("vectors", group, case["case_id"], b, s, e)
                             for b, s, e in windows_from_vector(case, offset)]
    events.sort(key=lambda e: e.ts_ms)
    cols = from_send_results(events)
    n = cols["ts_ms"].size
    batches = [take(cols, np.arange(0, n // 2)), take(cols, np.arange(n // 2, n))]
    got = run_query(spark, tmp_path, batches, Config().replace(stream__watermark_delay_s=10_000_000.0), "vectors")
    assert window_keys(current_view(got["producer_fault_windows_live"]), fault_enable=True) == sorted(expected)
    assert got["quarantine"] == []
