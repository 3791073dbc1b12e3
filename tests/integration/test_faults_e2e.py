"""``faultwatch stream`` (faults query) through Kafka and Delta, killed with SIGKILL mid-run.

The windows in Delta must equal what the pure rules derive from the same events (whole stream,
no batches), every Delta commit must land exactly once, and the tables must have the declared
schemas.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.faults import from_send_results
from schemas.tables import table
from tests.conftest import unique_topics
from tests.doubles.faults_reference import current_view, expected_windows, window_keys
from tests.doubles.faults_synth import random_stream
from tests.integration.processes import (
    committed_batches,
    kill_tree,
    start_faultwatch,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TABLES = ("producer_fault_windows_live", "producer_fault_windows", "broker_fault_episodes_live", "broker_fault_episodes",
          "broker_health", "quarantine")


def produce(bootstrap: str, topic: str, events: list) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024)
    for e in events:
        producer.send(topic, key=e.key(), value=e.to_json())
    producer.flush()
    producer.close()


def start(shape: str, conf: Path, log: Path, once: bool = False) -> subprocess.Popen[bytes]:
    return start_faultwatch("stream", "--config", str(conf), "--only", shape, *(["--once"] if once else []), log=log)


@pytest.mark.parametrize("shape", ["faults", "bronze_faults"])
def test_windows_survive_sigkill_and_equal_the_pure_rules(kafka, cfg: Config, tmp_path: Path, shape: str) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, f"kill-{shape}").replace(
        stream__max_events_per_batch=2500, stream__trigger_interval_s=0.5
    )
    events = random_stream(41, producers=40, brokers=6, events=24_000, span_ms=600_000, explicit_share=0.2)
    produce(kafka.bootstrap, cfg.topics.send_results, events)
    conf = write_config(cfg, tmp_path / "fw.toml")
    log = tmp_path / "stream.log"

    proc = start(shape, conf, log)
    wait_for(lambda: committed_batches(cfg, shape) >= 3, 300, "three committed batches", proc, log)
    kill_tree(proc, signal.SIGKILL)
    partial = read_table(cfg.storage.root, "producer_fault_windows_live").num_rows
    assert partial > 0

    again = start(shape, conf, log, once=True)
    assert again.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]
    assert f"[{shape}] total:" in log.read_text(errors="replace")

    tables = {name: read_table(cfg.storage.root, name) for name in TABLES}
    for name, data in tables.items():
        declared = [(f.name, f.type) for f in table(name).arrow_schema()]
        assert [(f.name, f.type) for f in data.schema] == declared, name
    windows = tables["producer_fault_windows_live"].to_pylist()
    quarantine = tables["quarantine"].to_pylist()
    # exactly once: no row twice
    assert not [k for k, n in Counter((r["window_id"], r["revision"]) for r in windows).items() if n > 1]
    assert not [k for k, n in Counter((q["source_partition"], q["source_offset"]) for q in quarantine).items() if n > 1]
    health = tables["broker_health"].to_pylist()
    assert not [k for k, n in Counter((h["broker_name"], h["minute_ms"]) for h in health).items() if n > 1]
    assert health
    # equivalence with the pure rules over the accepted events (late ones are in quarantine)
    late = {(q["source_partition"], q["source_offset"]) for q in quarantine if q["reason"] == "late"}
    assert all(q["stage"] == "faults" for q in quarantine) and len(late) < len(events) * 0.05
    offsets = kafka_positions(kafka.bootstrap, cfg.topics.send_results)
    accepted = [e for e in events if offsets[e.event_id] not in late]
    view = current_view(windows)
    assert len(view) > 100 and {r["generation"] for r in view} == {"4.9", "5"}
    assert window_keys(view) == expected_windows(from_send_results(accepted))
    assert {r["state"] for r in view} >= {"open", "closed"}
    # the silver table: the closed rows of the live one, once each, revision 0
    final = [{**r, "revision": 0} for r in view if r["state"] == "closed"]
    silver = read_table(cfg.storage.root, "producer_fault_windows").to_pylist()
    assert sorted(silver, key=lambda r: r["window_id"]) == sorted(final, key=lambda r: r["window_id"])
    if shape == "bronze_faults":  # bronze rode along: every event exactly once
        ids = read_table(cfg.storage.root, "send_results").column("event_id").to_pylist()
        assert sorted(ids) == sorted(e.event_id for e in events)


def kafka_positions(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """event_id -> (partition, offset), read back from the topic."""
    import orjson
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    out = {}
    for record in consumer:
        out[orjson.loads(record.value)["event_id"]] = (record.partition, record.offset)
    consumer.close()
    return out
