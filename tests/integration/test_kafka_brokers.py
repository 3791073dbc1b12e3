"""The source's two broker-proof look-ups, on each broker the project runs: partition ends (Kafka's
ListOffsets answer where a probe shows the broker answers it right, as Apache Kafka does; fetch high
watermarks where it is short, as Tansu's is after a multi-record batch), and the settle point's
event-time look-ups (a fetch from the offset wanted)."""

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


def reader(bootstrap: str, topic: str, **options: str) -> KafkaEventReader:
    cfg = Config().replace(kafka__bootstrap_servers=bootstrap)
    return KafkaEventReader({"topics": json.dumps({topic: "send_result"}),
                             SECRET_OPTION: json.dumps(cfg.kafka.client_options()), "connect_timeout_s": "20",
                             **options})


def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20)
    for partition, n in per_partition.items():
        for i in range(n):
            value = json.dumps({"ts_ms": BASE_TS + partition * 1_000_000 + i}).encode()
            producer.send(topic, value=value, partition=partition)
    producer.flush()
    producer.close()


# What the probe finds on each broker, and the polls a look-up of the ends takes after it.
PROBED = {"apache": (True, 0), "tansu": (False, 2)}


def listed_ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        listed = consumer.end_offsets([TopicPartition(topic, p) for p in (0, 1)])
        return {tp.partition: n for tp, n in listed.items()}
    finally:
        consumer.close()


@pytest.mark.parametrize("how", ["auto", "fetch"])
def test_partition_ends_are_exact_on_each_broker(broker, how: str) -> None:  # type: ignore[no-untyped-def]
    name, kafka = broker
    topic = f"brokers.ends.{how}"
    create_topics(kafka.bootstrap, [topic], 2)
    produce(kafka.bootstrap, topic, {0: 1000, 1: 7})  # one batch per partition
    truth = {f"{topic}/0": 1000, f"{topic}/1": 7}
    r = reader(kafka.bootstrap, topic, end_offsets=how)
    try:
        start = r.initialOffset()
        assert start == {f"{topic}/0": 0, f"{topic}/1": 0}
        assert r.latestOffset(start, ReadAllAvailable()) == truth
        produce(kafka.bootstrap, topic, {0: 5})
        assert r.latestOffset(start, ReadAllAvailable()) == {**truth, f"{topic}/0": 1005}
        exact, polls = PROBED[name] if how == "auto" else (None, 2)
        assert (r.listing_exact, r.end_polls) == (exact, polls)
    finally:
        r.stop()
    # The probe's verdict is the broker's own: ListOffsets alone is exact on Apache Kafka, short on Tansu.
    assert (listed_ends(kafka.bootstrap, topic) == {0: 1005, 1: 7}) is (name == "apache")


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
