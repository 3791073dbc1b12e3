"""Bronze through a real broker and real Spark: every valid event exactly once, every bad one quarantined."""

from __future__ import annotations

import io
from collections import Counter

import orjson
import pyarrow.compute as pc
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from schemas.tables import table
from tests.conftest import unique_topics
from tests.integration.bronze_data import assert_bronze_holds, make_mix, produce_mix

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def run_once(spark, cfg: Config) -> str:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    out = io.StringIO()
    assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()
    return out.getvalue()


def test_valid_events_land_once_and_bad_ones_in_quarantine(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "bronze20k").replace(
        stream__max_events_per_batch=6000, stream__max_events_per_task=700  # split reads too
    )
    mix = make_mix(20_000)
    assert 150 <= len(mix.bad) <= 250
    produced = produce_mix(kafka.bootstrap, cfg.topics.event_topics(), mix)

    log = run_once(spark, cfg)
    assert "[bronze] batch 0:" in log and "quarantined=" in log and "backlog=" in log

    root = cfg.storage.root
    sends = read_table(root, "send_results")
    expected_ids = sorted(orjson.loads(v)["event_id"] for v in mix.valid["send_result"])
    assert sorted(sends.column("event_id").to_pylist()) == expected_ids  # each exactly once
    # Every record produced is one row at its Kafka position: an event whole in its kind's table
    # (send results, consumer progress, group membership), a malformed one in quarantine.
    assert_bronze_holds(root, mix, produced)

    quarantine = read_table(root, "quarantine")
    assert Counter(quarantine.column("reason").to_pylist()) == Counter(r for _k, _v, r in mix.bad)
    assert sorted(quarantine.column("raw_value").to_pylist()) == sorted(v for _k, v, _r in mix.bad)
    assert set(quarantine.column("stage").to_pylist()) == {"bronze"}
    assert pc.all(pc.greater_equal(quarantine.column("source_offset"), 0)).as_py()

    # A second run finds nothing new and writes nothing.
    again = run_once(spark, cfg)
    assert "written=" not in again
    assert read_table(root, "send_results").num_rows == len(expected_ids)

    # Readable by Spark too, with the declared schemas.
    for name in ("send_results", "quarantine", "consumer_progress", "group_membership"):
        df = spark.read.parquet(f"{root}/{name}")
        assert set(df.columns) == set(table(name).columns)
    assert spark.read.parquet(f"{root}/send_results").count() == len(expected_ids)


def test_delta_log_carries_the_batch_transaction(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from deltalake import DeltaTable

    cfg = unique_topics(cfg, kafka, "bronzetxn").replace(stream__max_events_per_batch=300)
    mix = make_mix(1000, seed=3)
    produce_mix(kafka.bootstrap, cfg.topics.event_topics(), mix)
    run_once(spark, cfg)
    dt = DeltaTable(f"{cfg.storage.root}/send_results")
    last_batch = dt.transaction_version("faultwatch:bronze")
    assert last_batch is not None and last_batch >= 2  # several micro-batches, each a transaction
    assert dt.schema().to_arrow().names == table("send_results").columns
    history = [h for h in dt.history() if h.get("operation") == "WRITE"]  # version 0 creates the table
    assert all("faultwatch.batch_id" in h for h in history), history  # every write says its batch
    batch_ids = sorted(int(h["faultwatch.batch_id"]) for h in history)
    assert len(batch_ids) == len(set(batch_ids)), batch_ids  # never two commits for one batch
    assert batch_ids[-1] == last_batch and len(batch_ids) >= 3, (batch_ids, last_batch)


def test_unreachable_kafka_is_a_clear_error(spark, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from pipeline.kafka_local import free_port
    from streaming.job import run_stream

    cfg = cfg.replace(kafka__bootstrap_servers=f"127.0.0.1:{free_port()}", kafka__connect_timeout_s=3.0)
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=io.StringIO())
    assert code == 1
    assert "unreachable" in err.getvalue() and "kafka.bootstrap_servers" in err.getvalue()
