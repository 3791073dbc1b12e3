"""The simulator into the real local broker: every record arrives, keyed and byte-identical, in
batches of the codec asked for."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from pipeline.simulate import KafkaSink, Simulation, load_scenario, run_to_memory
from pipeline.simulate.sinks import KINDS
from tests.conftest import unique_topics

pytestmark = pytest.mark.kafka


def _read_all(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0, codecs: set[int] | None = None,
) -> list[tuple[int, bytes, bytes]]:
    """The topic's records as (partition, key, value); ``codecs`` gathers the compression codec ids
    of the record batches fetched (0 none, 1 gzip, 4 zstd)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer.fetcher import Fetcher
    from kafka.record.memory_records import MemoryRecords

    class Peek(Fetcher.PartitionRecords):  # type: ignore[misc,name-defined]
        def _unpack_records(self, tp, records, *args):  # type: ignore[no-untyped-def]
            copy = MemoryRecords(records._buffer)  # the fetched bytes, read a second time
            batch = copy.next_batch()
            while batch is not None:
                codecs.add(batch.compression_type)  # type: ignore[union-attr]  # only installed with codecs
                batch = copy.next_batch()
            return super()._unpack_records(tp, records, *args)

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    if codecs is not None:
        consumer._fetcher.PartitionRecords = Peek
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=50_000).items():
                out.extend((tp.partition, r.key, r.value) for r in records)
        return out
    finally:
        consumer.close()


def test_demo_events_reach_kafka_unchanged(kafka, cfg) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "simkafka")
    scenario = load_scenario("demo").replace(duration_s=25.0)  # covers the start of the outage
    _, expected = run_to_memory(scenario)
    sink = KafkaSink(cfg)
    stats = Simulation(scenario).run(sink, close=True)
    assert stats.events == {kind: expected.count(kind) for kind in KINDS}
    codecs: set[int] = set()
    for kind, topic in cfg.topics.event_topics().items():
        want = expected.events(kind)
        got = _read_all(kafka.bootstrap, topic, len(want), codecs=codecs)
        assert len(got) == len(want)
        by_key: dict[bytes, list[bytes]] = defaultdict(list)
        partition_of: dict[bytes, set[int]] = defaultdict(set)
        for partition, key, value in got:
            by_key[key].append(value)
            partition_of[key].add(partition)
        want_by_key: dict[bytes, list[bytes]] = defaultdict(list)
        for event in want:
            want_by_key[event.key()].append(event.to_json())
        assert by_key == want_by_key  # same records, in order per key
        assert all(len(p) == 1 for p in partition_of.values())
    assert codecs == {4}  # zstd unless asked otherwise


@pytest.mark.parametrize(("compression", "codec"), [("none", 0), ("gzip", 1)])
def test_the_sink_writes_the_codec_asked_for(kafka, cfg, compression, codec) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, f"simcodec-{compression}")
    _, expected = run_to_memory("steady", duration_s=5.0)
    Simulation(load_scenario("steady").replace(duration_s=5.0)).run(KafkaSink(cfg, compression=compression), close=True)
    want = expected.events("send_result")
    codecs: set[int] = set()
    got = _read_all(kafka.bootstrap, cfg.topics.send_results, len(want), codecs=codecs)
    assert sorted(value for _, _, value in got) == sorted(event.to_json() for event in want)
    assert codecs == {codec}
