"""Offsets deleted before the job read them (delete-records on Apache Kafka, as retention does): the
query stops naming them, or with ``kafka.fail_on_data_loss = false`` records the gap and goes on."""

from __future__ import annotations

import io

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from tests.conftest import unique_topics
from tests.integration.test_kafka_codecs import produce_with

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def run_once(spark, cfg: Config) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    out = io.StringIO()
    return run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out), out.getvalue()


def delete_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    from kafka import KafkaAdminClient, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, partition): offset})
    finally:
        admin.close()


def test_deleted_offsets_stop_the_query_or_are_recorded_as_a_gap(spark, kafka, cfg: Config, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "loss")
    topic = cfg.topics.send_results
    first = produce_with(kafka.bootstrap, topic, None, 0, 300, partition=0)
    assert run_once(spark, cfg)[0] == 0
    second = produce_with(kafka.bootstrap, topic, None, 300, 300, partition=0)
    delete_before(kafka.bootstrap, topic, 0, 450)  # offsets 300-449: never read, now gone

    code, _ = run_once(spark, cfg)
    assert code == 1
    err = capsys.readouterr().err
    assert f"DataLossError: unread offsets are gone from Kafka: {topic}/0 offsets 300-449 deleted" in err
    assert "kafka.fail_on_data_loss = false" in err
    assert read_table(cfg.storage.root, "send_results").num_rows == 300  # nothing past the gap

    lenient = cfg.replace(kafka__fail_on_data_loss=False)
    code, log = run_once(spark, lenient)
    assert code == 0, log
    kept = {orjson.loads(v)["event_id"]: orjson.loads(v) for v in first + second[150:]}
    rows = read_table(cfg.storage.root, "send_results").to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(kept)
    for row in rows:
        assert {k: row[k] for k in kept[row["event_id"]]} == kept[row["event_id"]]
    gaps = read_table(cfg.storage.root, "quarantine").to_pylist()
    assert [(g["source_topic"], g["source_partition"], g["source_offset"], g["reason"], g["raw_value"])
            for g in gaps] == [(topic, 0, 300, "data_loss", None)]
    assert gaps[0]["detail"].startswith(f"{topic}/0 offsets 300-449 deleted by retention or delete-records")

    # Recorded once: a further run finds nothing new and no new gap.
    assert run_once(spark, lenient)[0] == 0
    assert read_table(cfg.storage.root, "quarantine").num_rows == 1


def test_a_first_run_starts_at_the_oldest_offset_left_without_a_gap(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "lossfirst")
    topic = cfg.topics.send_results
    sent = produce_with(kafka.bootstrap, topic, None, 0, 200, partition=1)
    delete_before(kafka.bootstrap, topic, 1, 120)  # before any checkpoint: retention, not a loss
    code, log = run_once(spark, cfg)
    assert code == 0, log
    ids = sorted(r["event_id"] for r in read_table(cfg.storage.root, "send_results").to_pylist())
    assert ids == sorted(orjson.loads(v)["event_id"] for v in sent[120:])
    assert read_table(cfg.storage.root, "quarantine").num_rows == 0
