"""kafka.isolation_level: with read_committed (the default) records of aborted transactions never reach
bronze, and an open transaction holds its partition back until it ends; read_uncommitted reads all."""

from __future__ import annotations

import io

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from tests.conftest import unique_topics
from tests.integration.bronze_data import send_result

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def run_once(spark, cfg: Config) -> None:  # type: ignore[no-untyped-def]
    from streaming.job import run_stream

    out = io.StringIO()
    assert run_stream(cfg, once=True, concerns=["bronze"], spark=spark, out=out) == 0, out.getvalue()


def bronze_ids(cfg: Config) -> list[str]:
    return sorted(r["event_id"] for r in read_table(cfg.storage.root, "send_results").to_pylist())


def ids(first: int, n: int) -> list[str]:
    return [f"ev-{i}" for i in range(first, first + n)]


def send(producer, topic: str, first: int, n: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(first, first + n):
        value = send_result(i).to_json()
        producer.send(topic, key=orjson.loads(value)["broker_name"].encode(), value=value)


def test_aborted_transactions_never_reach_bronze(spark, kafka, cfg: Config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaProducer

    cfg = unique_topics(cfg, kafka, "txn")
    topic = cfg.topics.send_results
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id="faultwatch-test-txn",
                             compression_type="lz4", linger_ms=5)
    producer.init_transactions()
    for first, commit in ((0, True), (100, False), (200, True), (300, False), (400, True)):
        producer.begin_transaction()
        send(producer, topic, first, 100)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    committed = ids(0, 100) + ids(200, 100) + ids(400, 100)

    # An open transaction: its records (and everything after them) wait until it ends.
    producer.begin_transaction()
    send(producer, topic, 500, 100)
    producer.flush()
    run_once(spark, cfg)
    assert bronze_ids(cfg) == sorted(committed)
    producer.commit_transaction()
    run_once(spark, cfg)
    assert bronze_ids(cfg) == sorted(committed + ids(500, 100))
    producer.close()

    rows = read_table(cfg.storage.root, "send_results").to_pylist()
    sent = {e: orjson.loads(send_result(int(e[3:])).to_json()) for e in committed + ids(500, 100)}
    for row in rows:
        assert {k: row[k] for k in sent[row["event_id"]]} == sent[row["event_id"]]

    # read_uncommitted, from a new checkpoint: every record written, the aborted ones included.
    everything = cfg.replace(kafka__isolation_level="read_uncommitted", storage__root=str(tmp_path / "all"),
                             storage__checkpoint_root=str(tmp_path / "all-checkpoints"))
    run_once(spark, everything)
    assert bronze_ids(everything) == sorted(ids(0, 600))
