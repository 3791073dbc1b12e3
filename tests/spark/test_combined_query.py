"""The combined query's operator and sink: keyed chunks in (a file stream), Delta tables out.

Each Parquet file is one micro-batch of the chunks the Kafka readers would emit, with the batch's
settle point. The fault state is kept per (cluster, shard of brokers) and the episodes are decided per
cluster in the sink; the tables must hold exactly what one pure fault state per cluster writes
when given the previous batch's settle point as its watermark and the batch's as the point to
settle to. The readers' file lists reach the sink; a cluster without events in the last batch is
still settled up to the end (event-time timeouts).
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
from streaming.combined_query import build_combined_output
from streaming.delta_sink import WRITTEN
from streaming.faults_query import FAULT_TABLES
from streaming.feeds import WRITTEN_KEY, fault_feed
from streaming.kafka_source import KEYED_CHUNK_SCHEMA, SETTLE, _keyed_chunks
from tests.doubles.faults_reference import current_view
from tests.doubles.faults_synth import bronze_table, random_stream
from tests.spark.test_faults_query import TABLE_KEY, expected, normalize


def pq_listing(tmp: Path, cfg: Config) -> list[bytes]:
    """Four readers' file lists: one consumer_progress file each, already in the table's folder."""
    import json

    from streaming.delta_sink import ensure_tables, write_table_files
    from streaming.kafka_source import output_tables

    ensure_tables(cfg.storage.root, output_tables(["consumer_progress"]))
    out = []
    for i in range(4):
        rows = pa.table({"ts_ms": [1_767_225_600_000 + i], "cluster": ["c1"], "consumer_group": ["G"],
                         "topic": ["T"], "broker_name": ["b"], "queue_id": [0], "consumer_offset": [i],
                         "event_date": ["2026-01-01"], "schema_version": [1]})
        files = write_table_files(cfg.storage.root, "consumer_progress", _widen(rows), lambda k, i=i: f"part-r{i}-{k}")
        out.append(json.dumps([dataclasses.asdict(f) for f in files]).encode())
    return out


def _widen(rows: pa.Table) -> pa.Table:
    from schemas.tables import table

    schema = table("consumer_progress").arrow_schema()
    def filler(f: pa.Field) -> pa.Array:
        if f.nullable:
            return pa.nulls(rows.num_rows, f.type)
        return pa.array(["x" if pa.types.is_string(f.type) else 0] * rows.num_rows).cast(f.type)

    return pa.table({f.name: rows.column(f.name).cast(f.type) if f.name in rows.column_names else filler(f)
                     for f in schema}, schema=schema)

pytestmark = pytest.mark.spark


def test_each_cluster_gets_what_the_pure_step_writes_at_the_batches_settle_points(spark: Any, tmp_path: Path) -> None:
    from pipeline.deltaio import read_table
    from pipeline.faults.events import EVENT_COLUMNS
    from streaming.combined_query import tables_of
    from streaming.decisions import ClusterDecisions
    from streaming.delta_sink import write_routed

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
    cfg = Config().replace(storage__root=str(tmp_path / "tables"), storage__checkpoint_root=str(tmp_path / "ck"))
    written = pq_listing(tmp_path, cfg)
    chunks_in = spark.readStream.schema(KEYED_CHUNK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    query = write_routed(build_combined_output(chunks_in, cfg), cfg, "combined", tables_of(True, False),
                         driver_step=ClusterDecisions(cfg, str(tmp_path / "ck" / "combined"), "test")).start()
    try:
        for i, (batch, settle) in enumerate(zip(batches, settles)):
            pieces = fault_feed(bronze_table(batch), EVENT_COLUMNS, cfg.faults.shards)
            chunk = _keyed_chunks(pieces, settle)
            listing = {"_key": WRITTEN_KEY, "_table": WRITTEN, "rows": i, "arrow": written[i], SETTLE: settle}
            rows = pa.Table.from_batches([chunk]).to_pylist() + [listing]
            pq.write_table(pa.Table.from_pylist(rows, schema=chunk.schema), src / f"part-{i:04d}.parquet")
            query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    got = {t: read_table(cfg.storage.root, t).to_pylist() for t in FAULT_TABLES}
    assert read_table(cfg.storage.root, "consumer_progress").num_rows == len(written)  # the listed files

    want: dict[str, list[dict]] = {k: [] for k in TABLE_KEY.values()}
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
    for name in FAULT_TABLES:
        assert normalize(got[name], name) == normalize(expected(want, name), name), name
    assert current_view(got["broker_fault_episodes_live"], "episode_id")
    assert {h["cluster"] for h in got["broker_health"]} == {"c1", "c2"}
    last_minute_c2 = max(h["minute_ms"] for h in got["broker_health"] if h["cluster"] == "c2")
    c2_last_event = int(take(cols, cols["cluster"] == "c2")["ts_ms"].max())
    # c2's last minute was settled by a timeout (no c2 event in the last batch)
    assert last_minute_c2 == c2_last_event // 60_000 * 60_000


def test_keys_are_placed_by_sparks_own_hash(spark: Any) -> None:
    """streaming.feeds places keys with a copy of Spark's hash(): it must agree with Spark's."""
    import random

    from streaming.feeds import FAULTS, LAG, placed, spark_hash

    rng = random.Random(7)
    keys = ["", "é", "\x1f\xff"] + ["".join(chr(rng.randrange(1, 700)) for _ in range(rng.randrange(0, 20)))
                                  for _ in range(300)]
    keys += [placed(concern, f"cluster-{c}", s) for concern in (FAULTS, LAG) for c in range(3) for s in range(8)]
    rows = spark.createDataFrame([(k,) for k in keys], "k string").selectExpr("k", "hash(k) AS h").collect()
    assert [r.h for r in rows] == [spark_hash(r.k.encode()) for r in rows]
