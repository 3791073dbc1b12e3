"""``queue_lag`` on a real cluster follows what RocketMQ's own ``mqadmin consumerProgress`` prints.

A real consumer group consumes, then stops; a real producer sends more. The admin poller, running
every second through the whole story, writes its ``consumer_progress`` and ``group_membership``
events to Apache Kafka, the default job
(``faultwatch stream --once``'s :func:`streaming.job.run_stream`) reads them, and the newest
``queue_lag`` row of every (topic, broker, queue) of the group must equal mqadmin's broker offset,
consumer offset and diff taken at the same quiescent moment (no consumer, no producer sending), with
the owner the group's membership gave. Twice: the second run, from the same checkpoint and state,
after more sends.

The job judges lag on an event-time grid once its settle point passes a grid point. With no
watermark delay the settle point is the newest event read, so the job runs once a poll past the grid
point after the first quiescent poll is in Kafka; ``lag.queue_row_interval_s = 0`` gives a row at
every judged point with a report, so the newest row is the newest judged poll's (the default samples
once a minute).
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.java_clients import LabDriver, start_poller
from pipeline.rocketmq_cluster import RocketMQCluster
from tests.conftest import unique_topics
from tests.integration.processes import wait_for
from tests.realcluster.test_poller import Row, mqadmin_progress

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


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a running poller has finished writing to ``path`` (a last line may be partial)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.startswith("{")]


def members(home: Path) -> list[str] | None:
    """The members the running poller's newest membership event names."""
    named = [e["client_ids"] for e in lines(home / "events.jsonl") if "client_ids" in e]
    return named[-1] if named else None


def now_ms() -> int:
    return int(time.time() * 1000)


ALL_OK = {"broker-a": "ok", "broker-b": "ok", "broker-c": "ok"}


def next_poll(home: Path, proc: subprocess.Popen[bytes], after_ms: int, what: str, all_ok: bool = False) -> int:
    """When the running poller's first cycle that started after ``after_ms`` (with ``all_ok``: that
    every broker answered) started; its events are in Kafka."""
    def found() -> int | None:
        return next((s["poll_ms"] for s in lines(home / "status.jsonl") if "poll_ms" in s
                     and s["poll_ms"] > after_ms and (not all_ok or s["brokers"] == ALL_OK)), None)

    wait_for(lambda: found() is not None, 60, what, proc)
    poll = found()
    assert poll is not None
    return poll


def polled(home: Path, poll_ms: int) -> dict[Row, tuple[int, int, int]]:
    """What the poller's cycle at ``poll_ms`` printed, as :func:`mqadmin_progress` gives it."""
    return {(e["topic"], e["broker_name"], e["queue_id"]): (
        e["broker_offset"], e["consumer_offset"], e["broker_offset"] - e["consumer_offset"])
        for e in lines(home / "events.jsonl") if "queue_id" in e and e["ts_ms"] == poll_ms}


def quiescent_figures(rocketmq: RocketMQCluster, group: str, home: Path, proc: subprocess.Popen[bytes]
                      ) -> tuple[dict[Row, tuple[int, int, int]], int]:
    """mqadmin's figures once nothing moves, and the first poll after that moment. The job settles
    that poll's grid point only when a later event passes it: wait for a poll past the point too."""
    quiet_ms = now_ms()
    figures = mqadmin_progress(rocketmq, group)
    first = next_poll(home, proc, quiet_ms, "a poll after the sends that every broker answered", all_ok=True)
    next_poll(home, proc, -(-first // GRID_MS) * GRID_MS - 1, "a poll past the next grid point")
    assert polled(home, first) == figures  # the poller's own figures first: a mismatch below is the job's
    return figures, first


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
    home = tmp_path / "poller"
    home.mkdir()
    # one poller for the whole story, every second: its JVM starts while the drivers' do
    poller = start_poller(rocketmq.namesrv_addr, "DefaultCluster", [group], home, "--stdout", *to_kafka,
                          "--interval-ms", "1000")
    try:
        producer, consumer = driver("4.9.8", topic=rmq_topic), driver("5.3.3", topic=rmq_topic)
        member = consumer.command(f"consume {group}")["client_id"]
        assert producer.command("send 48")["failed"] == 0
        wait_for(lambda: consumer.command("consumed")["consumed"] >= 48, 120, "the consumer to consume 48 messages")
        wait_for(lambda: members(home) == [member], 60, "a poll naming the group's member", poller)

        consumer.close()  # shutting down commits its offsets; nothing moves them after this
        assert producer.command("send 30")["failed"] == 0
        first, first_ms = quiescent_figures(rocketmq, group, home, poller)
        run_job(spark, cfg)
        rows, oldest = newest_rows(cfg, group)
        assert rows == expected_rows(first, group, member)
        assert oldest >= first_ms  # judged after the quiescent poll, not before it
        assert sum(d for _b, _c, d in first.values()) == 30

        assert producer.command("send 20")["failed"] == 0
        second, second_ms = quiescent_figures(rocketmq, group, home, poller)
        run_job(spark, cfg)  # the same checkpoint and state
        rows, oldest = newest_rows(cfg, group)
        assert rows == expected_rows(second, group, member)
        assert oldest >= second_ms
        assert sum(d for _b, _c, d in second.values()) == 50
    finally:
        poller.terminate()
        poller.wait(20)
