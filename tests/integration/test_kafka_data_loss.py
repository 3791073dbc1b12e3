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


def recreate(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` and create it again, empty, once Kafka has let go of the old one."""
    import time

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if topic not in admin.list_topics():
                    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
                    break
            except TopicAlreadyExistsError:  # the old one is still being deleted
                pass
            assert time.monotonic() < deadline, f"{topic} not re-created within {timeout_s}s"
            time.sleep(0.1)
        while topic not in admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} not listed within {timeout_s}s of its creation"
            time.sleep(0.1)
    finally:
        admin.close()


def test_a_topic_recreated_behind_the_checkpoint_stops_the_query_or_is_read_from_zero(  # type: ignore[no-untyped-def]
    spark, kafka, cfg: Config, capsys,
) -> None:
    cfg = unique_topics(cfg, kafka, "recreate")
    topic = cfg.topics.send_results
    first = produce_with(kafka.bootstrap, topic, None, 0, 300, partition=0)
    assert run_once(spark, cfg)[0] == 0  # the checkpoint now points at offset 300 of partition 0
    recreate(kafka.bootstrap, topic, 4)
    second = produce_with(kafka.bootstrap, topic, None, 1000, 120, partition=0)  # the new topic's 0-119

    code, _ = run_once(spark, cfg)
    assert code == 1
    err = capsys.readouterr().err
    assert (f"DataLossError: unread offsets are gone from Kafka: {topic}/0 offsets 120-299 gone: the "
            "partition now ends before them (topic re-created") in err
    assert "reading resumes at offset 0" in err and "kafka.fail_on_data_loss = false" in err
    assert read_table(cfg.storage.root, "send_results").num_rows == 300  # nothing of the new topic yet

    lenient = cfg.replace(kafka__fail_on_data_loss=False)
    code, log = run_once(spark, lenient)
    assert code == 0, log + capsys.readouterr().err[-3000:]
    sent = {orjson.loads(v)["event_id"]: orjson.loads(v) for v in first + second}
    rows = read_table(cfg.storage.root, "send_results").to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(sent)  # the new topic's records, from offset 0
    for row in rows:
        assert {k: row[k] for k in sent[row["event_id"]]} == sent[row["event_id"]]
    new_offsets = sorted(r["kafka_offset"] for r in rows if r["event_id"] in {orjson.loads(v)["event_id"] for v in second})
    assert new_offsets == list(range(120))
    gaps = read_table(cfg.storage.root, "quarantine").to_pylist()
    assert [(g["source_topic"], g["source_partition"], g["source_offset"], g["reason"], g["raw_value"])
            for g in gaps] == [(topic, 0, 120, "data_loss", None)]
    assert gaps[0]["detail"].startswith(f"{topic}/0 offsets 120-299 gone: the partition now ends before them")

    assert run_once(spark, lenient)[0] == 0  # recorded once
    assert read_table(cfg.storage.root, "quarantine").num_rows == 1
