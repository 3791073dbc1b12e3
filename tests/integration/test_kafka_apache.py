"""The Apache Kafka starter (pipeline/kafka_apache.py): it answers, keeps its data across a restart,
refuses a broken configuration loudly, and never outlives the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.kafka_apache import ApacheKafkaError, start_apache_kafka

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def _values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out.extend(r.value for r in records)
        return sorted(out)
    finally:
        consumer.close()


def test_a_restarted_broker_answers_on_the_same_port_with_its_data() -> None:
    from kafka import KafkaProducer

    with start_apache_kafka(topics=["restart.t"], partitions=2) as kafka:
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
        sent = sorted(f"v{i}".encode() for i in range(300))
        for v in sent:
            producer.send("restart.t", v)
        producer.flush()
        producer.close()
        kafka.stop()
        assert kafka.proc is not None and kafka.proc.poll() is not None
        kafka.start()
        assert _values(kafka.bootstrap, "restart.t", 2) == sent
    assert not kafka.home.exists()


def test_a_broker_that_cannot_start_is_reported_with_its_log() -> None:
    with pytest.raises(ApacheKafkaError) as err:
        start_apache_kafka(extra_properties={"node.id": "not-a-number"}, timeout_s=60)
    assert "Invalid value not-a-number for configuration" in str(err.value)


def test_the_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    code = ("import sys, time; from pipeline.kafka_apache import start_apache_kafka; "
            "k = start_apache_kafka(); print(k.proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        assert _pid_alive(broker_pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while _pid_alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(broker_pid)
