"""The source's two broker-proof look-ups, on each broker the project runs: partition ends from fetch
high watermarks (Tansu answers ListOffsets wrongly after a multi-record batch; Apache Kafka right), and
the settle point's event-time look-ups (a fetch from the offset wanted)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pipeline.config import Config
from pipeline.kafka_local import create_topics, start_local_kafka
from streaming.kafka_source import SECRET_OPTION, KafkaEventReader

pytestmark = [pytest.mark.kafka]

BASE_TS = 1_700_000_000_000


@pytest.fixture(params=["apache", "tansu"])
def broker(request, kafka) -> Iterator[tuple[str, object]]:  # type: ignore[no-untyped-def]
    if request.param == "apache":
        yield "apache", kafka
        return
    tansu = start_local_kafka()
    try:
        yield "tansu", tansu
    finally:
        tansu.stop()


def reader(bootstrap: str, topic: str) -> KafkaEventReader:
    cfg = Config().replace(kafka__bootstrap_servers=bootstrap)
    return KafkaEventReader({"topics": json.dumps({topic: "send_result"}),
                             SECRET_OPTION: json.dumps(cfg.kafka.client_options()), "connect_timeout_s": "20"})


def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20)
    for partition, n in per_partition.items():
        for i in range(n):
            value = json.dumps({"ts_ms": BASE_TS + partition * 1_000_000 + i}).encode()
            producer.send(topic, value=value, partition=partition)
    producer.flush()
    producer.close()


def test_partition_ends_are_exact_on_each_broker(broker) -> None:  # type: ignore[no-untyped-def]
    name, kafka = broker
    create_topics(kafka.bootstrap, ["brokers.ends"], 2)
    produce(kafka.bootstrap, "brokers.ends", {0: 1000, 1: 7})  # one batch per partition
    r = reader(kafka.bootstrap, "brokers.ends")
    try:
        start = r.initialOffset()
        assert start == {"brokers.ends/0": 0, "brokers.ends/1": 0}
        assert r.latestOffset(start, ReadAllAvailable()) == {"brokers.ends/0": 1000, "brokers.ends/1": 7}
    finally:
        r.stop()
    if name == "apache":  # where ListOffsets alone would do
        consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
        try:
            listed = consumer.end_offsets([TopicPartition("brokers.ends", p) for p in (0, 1)])
            assert {tp.partition: n for tp, n in listed.items()} == {0: 1000, 1: 7}
        finally:
            consumer.close()


def test_event_time_look_ups_on_each_broker(broker) -> None:  # type: ignore[no-untyped-def]
    name, kafka = broker
    create_topics(kafka.bootstrap, ["brokers.ts"], 2)
    produce(kafka.bootstrap, "brokers.ts", {0: 3000, 1: 3000})
    r = reader(kafka.bootstrap, "brokers.ts")
    try:
        r.latestOffset(r.initialOffset(), ReadAllAvailable())  # learns the ends, as a micro-batch does
        wanted = [("brokers.ts/0", 1234, True), ("brokers.ts/1", 2999, True)]
        began = time.perf_counter()
        rounds = 20
        for _ in range(rounds):
            found = r._event_times(wanted)
        per_look_up_ms = (time.perf_counter() - began) * 1000 / rounds
        assert found == {("brokers.ts/0", 1234): BASE_TS + 1234, ("brokers.ts/1", 2999): BASE_TS + 1_002_999}
        print(f"{name}: event-time look-up of 2 partitions in {per_look_up_ms:.1f} ms")
    finally:
        r.stop()
