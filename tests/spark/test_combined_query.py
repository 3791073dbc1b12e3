"""The combined query's stateful operator: keyed chunks in (a file stream), chunks per table out.

Each Parquet file is one micro-batch of the chunks the Kafka readers would emit, with the batch's
settle point. Per cluster, the operator must write exactly what the pure fault step writes when
given the previous batch's settle point as its watermark and the batch's as the point to settle
to; the readers' file lists pass through untouched; a cluster without events in the last batch is
still settled up to the end (an event-time timeout).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config
from pipeline.faults import from_send_results, initial_state, step
from pipeline.faults.frame import take
from pipeline.faults.reference import current_view
from pipeline.faults.synth import bronze_table, random_stream
from streaming.combined_query import build_combined_output
from streaming.delta_sink import WRITTEN
from streaming.faults_query import FAULT_TABLES
from streaming.feeds import WRITTEN_KEY, fault_feed
from streaming.kafka_source import KEYED_CHUNK_SCHEMA, SETTLE, _keyed_chunks
from tests.spark.test_faults_query import TABLE_KEY, normalize

pytestmark = pytest.mark.spark


def test_each_cluster_gets_what_the_pure_step_writes_at_the_batches_settle_points(spark: Any, tmp_path: Path) -> None:
    from pipeline.faults.events import EVENT_COLUMNS

    events = random_stream(21, producers=16, brokers=4, events=3000, span_ms=240_000)
    events += [dataclasses.replace(e, cluster="c2", event_id=e.event_id + "-2")
               for e in random_stream(22, producers=10, brokers=3, events=2000, span_ms=150_000)]
    cols = from_send_results(events)
    ts = cols["ts_ms"]
    t0 = int(ts.min())
    edges = [t0 + s * 1000 for s in (0, 50, 110, 170, 10_000)]  # c2 stops at 150 s: idle in the last batch
    batches = [take(cols, (ts >= a) & (ts < b)) for a, b in itertools.pairwise(edges)]
    settles = [t0 + 20_000, t0 + 80_000, t0 + 140_000, t0 + 300_000]
    src = tmp_path / "chunks"
    src.mkdir()
    query = (
        build_combined_output(spark.readStream.schema(KEYED_CHUNK_SCHEMA).option("maxFilesPerTrigger", 1)
                              .parquet(str(src)), Config())
        .writeStream.format("memory").queryName("combined_keys").outputMode("append")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )
    listings = []
    try:
        for i, (batch, settle) in enumerate(zip(batches, settles)):
            pieces = fault_feed(bronze_table(batch), EVENT_COLUMNS)
            chunk = _keyed_chunks(pieces, settle)
            listing = {"_key": WRITTEN_KEY, "_table": WRITTEN, "rows": i, "arrow": f"[{i}]".encode(), SETTLE: settle}
            listings.append((i, f"[{i}]".encode()))
            rows = pa.Table.from_batches([chunk]).to_pylist() + [listing]
            pq.write_table(pa.Table.from_pylist(rows, schema=chunk.schema), src / f"part-{i:04d}.parquet")
            query.processAllAvailable()
        assert query.exception() is None
        out = [r.asDict() for r in spark.sql("select * from combined_keys").collect()]
    finally:
        query.stop()
    assert sorted((r["rows"], bytes(r["arrow"])) for r in out if r["_table"] == WRITTEN) == listings
    got: dict[str, list[dict]] = {t: [] for t in FAULT_TABLES}
    for r in out:
        if r["_table"] in got:
            got[r["_table"]] += pa.ipc.open_stream(pa.py_buffer(bytes(r["arrow"]))).read_all().to_pylist()

    want: dict[str, list[dict]] = {TABLE_KEY[t]: [] for t in FAULT_TABLES}
    for cluster in ("c1", "c2"):
        state, previous = initial_state(cluster), 0
        for batch, settle in zip(batches, settles):
            mine = take(batch, batch["cluster"] == cluster)
            if mine["ts_ms"].size:
                state, o = step(state, mine, previous, Config().faults, None, settle)
                for key in want:
                    want[key] += getattr(o, key)
            previous = settle
        state, o = step(state, take(cols, cols["ts_ms"] < 0), previous, Config().faults, None, previous)
        for key in want:
            want[key] += getattr(o, key)
    drop = {"revision", "updated_ms"}  # an idle cluster settles in a later batch: same rows, other bookkeeping
    for name in ("producer_fault_windows", "broker_health", "quarantine"):
        assert normalize(got[name], name) == normalize(want[TABLE_KEY[name]], name), name
    episodes = [{k: v for k, v in e.items() if k not in drop} for e in current_view(got["broker_fault_episodes"], "episode_id")]
    expected = [{k: v for k, v in e.items() if k not in drop}
                for e in current_view(want["episodes"], "episode_id")]
    assert normalize(episodes, "broker_fault_episodes") == normalize(expected, "broker_fault_episodes")
    assert {h["cluster"] for h in got["broker_health"]} == {"c1", "c2"}
    last_minute_c2 = max(h["minute_ms"] for h in got["broker_health"] if h["cluster"] == "c2")
    c2_last_event = int(take(cols, cols["cluster"] == "c2")["ts_ms"].max())
    # c2's last minute was settled by a timeout (no c2 event in the last batch)
    assert last_minute_c2 == c2_last_event // 60_000 * 60_000
