"""``queue_lag`` on a real cluster follows what RocketMQ's own ``mqadmin consumerProgress`` prints.

A real consumer group consumes, then stops; real producers send more. The admin poller writes its
``consumer_progress`` and ``group_membership`` events to Apache Kafka, the default job
(``faultwatch stream --once``'s :func:`streaming.job.run_stream`) reads them, and the newest
``queue_lag`` row of every (topic, broker, queue) of the group must equal mqadmin's broker offset,
consumer offset and diff taken at the same quiescent moment (no consumer, no producer sending), with
the owner the group's membership gave. Twice: the second run, from the same checkpoint and state,
after more sends.

The job judges lag on an event-time grid once its settle point passes a grid point. With no
watermark delay the settle point is the newest event read, so each quiescent poll is followed by a
second one past the next grid point; ``lag.queue_row_interval_s = 0`` gives a row at every judged
point with a report, so the newest row is the newest poll's (the default samples once a minute).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.java_clients import LabDriver
from pipeline.rocketmq_cluster import RocketMQCluster
from tests.conftest import unique_topics
from tests.integration.processes import wait_for
from tests.realcluster.test_poller import Row, mqadmin_progress, poll_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

GRID_MS = 1000  # lag.evaluation_interval_s, in ms
COMPARED = ("cluster", "consumer_group", "topic", "topic_kind", "broker_name", "queue_id",
            "broker_offset", "consumer_offset", "lag_messages", "offset_clamped", "owner_client_id")


def expected_rows(progress: dict[Row, tuple[int, int, int]], group: str, owner: str) -> list[dict[str, Any]]:
    """``queue_lag`` rows (the compared columns) for mqadmin's figures; every queue owned by ``owner``."""
    return sorted(({"cluster": "DefaultCluster", "consumer_group": group, "topic": topic,
                    "topic_kind": "retry" if topic.startswith("%RETRY%") else "main",
                    "broker_name": broker, "queue_id": queue, "broker_offset": broker_offset,
                    "consumer_offset": consumer_offset, "lag_messages": diff, "offset_clamped": False,
                    "owner_client_id": owner}
                   for (topic, broker, queue), (broker_offset, consumer_offset, diff) in progress.items()),
                  key=lambda r: (r["topic"], r["broker_name"], r["queue_id"]))


def newest_rows(cfg: Config, group: str) -> tuple[list[dict[str, Any]], int]:
    """The newest ``queue_lag`` row of each queue of ``group`` (compared columns) and their oldest ``ts_ms``."""
    newest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in read_table(cfg.storage.root, "queue_lag").to_pylist():
        key = (r["topic"], r["broker_name"], r["queue_id"])
        if r["consumer_group"] == group and (key not in newest or r["ts_ms"] > newest[key]["ts_ms"]):
            newest[key] = r
    rows = sorted(({c: r[c] for c in COMPARED} for r in newest.values()),
                  key=lambda r: (r["topic"], r["broker_name"], r["queue_id"]))
    return rows, min((r["ts_ms"] for r in newest.values()), default=0)


def quiescent_polls(rocketmq: RocketMQCluster, group: str, home: Path, to_kafka: list[str]
                    ) -> tuple[dict[Row, tuple[int, int, int]], int]:
    """A poll to Kafka, mqadmin's figures, and a second poll past the next grid point (which settles
    the first one's): nothing moves meanwhile, so both polls must print what mqadmin prints."""
    events, status = poll_once(rocketmq, group, home / "first", *to_kafka)
    figures = mqadmin_progress(rocketmq, group)
    first_ms = status["poll_ms"]
    grid_point = -(-first_ms // GRID_MS) * GRID_MS
    wait_for(lambda: time.time() * 1000 > grid_point, 5, "the wall clock to pass the next grid point")
    again, _ = poll_once(rocketmq, group, home / "second", *to_kafka)
    for polled in (events, again):  # the poller's own figures first: a mismatch below is then the job's
        assert {(e["topic"], e["broker_name"], e["queue_id"]): (
            e["broker_offset"], e["consumer_offset"], e["broker_offset"] - e["consumer_offset"])
            for e in polled if "queue_id" in e} == figures
    return figures, first_ms


def run_job(spark: Any, cfg: Config) -> None:
    from streaming.job import run_stream

    out = io.StringIO()
    assert run_stream(cfg, once=True, spark=spark, out=out) == 0, out.getvalue()[-3000:]


def test_queue_lag_follows_mqadmin_consumer_progress(  # type: ignore[no-untyped-def]
    spark, kafka, cfg: Config, tmp_path: Path, rocketmq: RocketMQCluster, rmq_topic: str,
    driver: Callable[..., LabDriver],
) -> None:
    cfg = unique_topics(cfg, kafka, "queuelag").replace(
        stream__watermark_delay_s=0.0, lag__evaluation_interval_s=GRID_MS / 1000, lag__queue_row_interval_s=0.0
    )
    to_kafka = ["--kafka", kafka.bootstrap, "--progress-topic", cfg.topics.consumer_progress,
                "--membership-topic", cfg.topics.group_membership]
    group = f"cg-{rmq_topic}"
    producer, consumer = driver("4.9.8", topic=rmq_topic), driver("5.3.3", topic=rmq_topic)
    member = consumer.command(f"consume {group}")["client_id"]
    assert producer.command("send 48")["failed"] == 0
    wait_for(lambda: consumer.command("consumed")["consumed"] >= 48, 120, "the consumer to consume 48 messages")
    _, live = poll_once(rocketmq, group, tmp_path / "live", *to_kafka)  # the group's members, to Kafka
    assert live["events"] > 0 and live["brokers"] == {"broker-a": "ok", "broker-b": "ok", "broker-c": "ok"}

    consumer.close()  # shutting down commits its offsets; nothing moves them after this
    assert producer.command("send 30")["failed"] == 0
    first, first_ms = quiescent_polls(rocketmq, group, tmp_path / "p1", to_kafka)
    run_job(spark, cfg)
    rows, oldest = newest_rows(cfg, group)
    assert rows == expected_rows(first, group, member)
    assert oldest >= first_ms  # judged after the quiescent poll, not before it
    assert sum(d for _b, _c, d in first.values()) == 30

    assert producer.command("send 20")["failed"] == 0
    second, second_ms = quiescent_polls(rocketmq, group, tmp_path / "p2", to_kafka)
    run_job(spark, cfg)  # the same checkpoint and state
    rows, oldest = newest_rows(cfg, group)
    assert rows == expected_rows(second, group, member)
    assert oldest >= second_ms
    assert sum(d for _b, _c, d in second.values()) == 50
