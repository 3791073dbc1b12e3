"""kafka.starting_offsets: where a query without a checkpoint starts (earliest, latest, a time); once a
checkpoint exists, it alone decides."""

from __future__ import annotations

import io
import time

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from tests.conftest import unique_topics
from tests.integration.bronze_data import send_result

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

# Kafka record timestamps of the first block (the second is a minute later): recent, or the broker's
# retention (7 days) would delete the records before the test reads them.
T0 = (int(time.time()) - 600) * 1000


def run_once(spark, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    out = io.StringIO()
    assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()


def produce(bootstrap: str, topic: str, first: int, n: int, ts_ms: int | None = None) -> list[str]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i in range(first, first + n):
        value = send_result(i).to_json()
        producer.send(topic, key=orjson.loads(value)["broker_name"].encode(), value=value, timestamp_ms=ts_ms)
    producer.flush()
    producer.close()
    return [f"ev-{i}" for i in range(first, first + n)]


def bronze_ids(cfg: Config) -> list[str]:
    return sorted(r["event_id"] for r in read_table(cfg.storage.root, "send_results").to_pylist())


def test_a_time_then_the_checkpoint(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "startts")
    topic = cfg.topics.send_results
    produce(kafka.bootstrap, topic, 0, 200, ts_ms=T0)
    later = produce(kafka.bootstrap, topic, 200, 200, ts_ms=T0 + 60_000)
    at = cfg.replace(kafka__starting_offsets=str(T0 + 30_000))
    run_once(spark, at)
    assert bronze_ids(at) == sorted(later)

    # With a checkpoint, starting_offsets no longer matters: earliest does not re-read the first block.
    more = produce(kafka.bootstrap, topic, 400, 50)
    run_once(spark, at.replace(kafka__starting_offsets="earliest"))
    assert bronze_ids(at) == sorted(later + more)


def test_latest_reads_only_what_arrives_after_the_first_start(spark, kafka, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "startlatest").replace(kafka__starting_offsets="latest")
    topic = cfg.topics.send_results
    produce(kafka.bootstrap, topic, 0, 300)
    run_once(spark, cfg)
    assert bronze_ids(cfg) == []
    new = produce(kafka.bootstrap, topic, 300, 120)
    run_once(spark, cfg)
    assert bronze_ids(cfg) == sorted(new)


def test_an_iso_time_is_taken_and_a_bad_value_names_the_key() -> None:
    from pipeline.config import ConfigError, from_dict

    cfg = from_dict({"kafka": {"starting_offsets": "2026-11-28T06:00:00+00:00"}})
    assert cfg.kafka.starting_position() == "1795845600000"
    with pytest.raises(ConfigError, match="kafka.starting_offsets"):
        from_dict({"kafka": {"starting_offsets": "2026-11-28 06:00"}})  # no zone: ambiguous
    with pytest.raises(ConfigError, match="kafka.starting_offsets"):
        from_dict({"kafka": {"starting_offsets": "yesterday"}})
