"""Every compression codec a producer may choose reaches bronze; a batch that cannot be unpacked
stops the read with a message naming its topic, partition and offset."""

from __future__ import annotations

import io

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from tests.conftest import unique_topics
from tests.integration.bronze_data import send_result

pytestmark = [pytest.mark.kafka]

CODECS = (None, "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 200


def produce_with(bootstrap: str, topic: str, codec: str | None, first: int, n: int,
                 partition: int | None = None) -> list[bytes]:
    """``n`` send results from event ``first`` on, sent in ``codec`` batches; their values."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=20,
                             batch_size=64 * 1024)
    values = [send_result(i).to_json() for i in range(first, first + n)]
    for v in values:
        producer.send(topic, key=orjson.loads(v)["broker_name"].encode(), value=v, partition=partition)
    producer.flush()
    producer.close()
    return values


@pytest.mark.spark
def test_batches_in_every_codec_reach_bronze_row_for_row(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    cfg = unique_topics(cfg, kafka, "codecs")
    sent: dict[str, dict] = {}
    for n, codec in enumerate(CODECS):
        for v in produce_with(kafka.bootstrap, cfg.topics.send_results, codec, n * PER_CODEC, PER_CODEC):
            sent[orjson.loads(v)["event_id"]] = orjson.loads(v)

    out = io.StringIO()
    assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()

    rows = read_table(cfg.storage.root, "send_results").to_pylist()
    assert sorted(r["event_id"] for r in rows) == sorted(sent)  # each exactly once
    for row in rows:
        assert {k: row[k] for k in sent[row["event_id"]]} == sent[row["event_id"]]
    assert read_table(cfg.storage.root, "quarantine").num_rows == 0


def test_a_batch_in_a_missing_codec_is_reported_by_topic_partition_and_offset(
    kafka, cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """As in a set-up without the lz4 package: kafka-python finds no lz4 module."""
    from kafka import codec as kafka_codecs

    from streaming.kafka_source import (
        SECRET_OPTION,
        TopicPartitionRange,
        UndecodableBatchError,
        _fetch_range,
    )

    cfg = unique_topics(cfg, kafka, "nocodec")
    topic = cfg.topics.send_results
    produce_with(kafka.bootstrap, topic, "gzip", 0, 50, partition=0)
    produce_with(kafka.bootstrap, topic, "lz4", 50, 50, partition=0)
    monkeypatch.setattr(kafka_codecs, "lz4", None)
    options = {SECRET_OPTION: orjson.dumps(cfg.kafka.client_options()).decode(), "connect_timeout_s": "20"}
    read: list[int] = []
    with pytest.raises(UndecodableBatchError) as err:
        for cols in _fetch_range(options, TopicPartitionRange(topic, 0, "send_result", 0, 100)):
            read.extend(cols.offsets)
    assert read == list(range(50))  # the gzip records before it were read
    message = str(err.value)
    assert f"{topic}/0 at or after offset 50" in message
    assert "lz4" in message and "install" in message
