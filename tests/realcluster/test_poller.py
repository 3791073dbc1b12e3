"""The admin poller on a real cluster: the same per-queue numbers as RocketMQ's own mqadmin, the
group's members, and a frozen or killed broker reported by name while the others' rows keep coming."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.java_clients import run_poller, start_poller
from pipeline.rocketmq_cluster import RocketMQCluster
from schemas.events import decode_event
from tests.integration.processes import wait_for

pytestmark = [pytest.mark.slow]

Row = tuple[str, str, int]


def mqadmin_progress(rocketmq: RocketMQCluster, group: str) -> dict[Row, tuple[int, int, int]]:
    """(topic, broker, queue) -> (broker offset, consumer offset, diff) as ``mqadmin consumerProgress`` prints."""
    out: dict[Row, tuple[int, int, int]] = {}
    table = False
    for line in rocketmq.mqadmin("consumerProgress", "-g", group).splitlines():
        if line.startswith("#Topic"):
            table = True
            continue
        cols = line.split()
        if table and len(cols) >= 6 and cols[2].isdigit():
            out[(cols[0], cols[1], int(cols[2]))] = (int(cols[3]), int(cols[4]), int(cols[5]))
    return out


def poll_once(rocketmq: RocketMQCluster, group: str, home: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    done = run_poller(rocketmq.namesrv_addr, "DefaultCluster", [group], home, "--stdout")
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    status = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"poll_ms"')]
    assert len(status) == 1, done.stderr[-3000:]
    return events, status[0]


def test_poller_prints_what_mqadmin_prints_and_the_groups_members(  # type: ignore[no-untyped-def]
    rocketmq: RocketMQCluster, driver, rmq_topic: str, tmp_path: Path
) -> None:
    group = f"cg-{rmq_topic}"
    producer = driver("4.9.8", topic=rmq_topic)
    consumer = driver("5.3.3", topic=rmq_topic)
    member = consumer.command(f"consume {group}")["client_id"]
    assert producer.command("send 48")["failed"] == 0
    wait_for(lambda: consumer.command("consumed")["consumed"] >= 48, 120, "the consumer to consume 48 messages")

    events, status = poll_once(rocketmq, group, tmp_path / "p1")
    membership = [decode_event("group_membership", json.dumps(e).encode()) for e in events if "client_ids" in e]
    assert [(m["topic"], m["client_ids"], m["strategy"]) for m in membership if m["topic"] == rmq_topic] == [
        (rmq_topic, [member], "AVG")
    ]
    assert status["brokers"] == {"broker-a": "ok", "broker-b": "ok", "broker-c": "ok"}

    consumer.close()  # shutting down commits its offsets; nothing moves them after this
    assert producer.command("send 30")["failed"] == 0  # lag on every broker
    events, _ = poll_once(rocketmq, group, tmp_path / "p2")
    progress = [decode_event("consumer_progress", json.dumps(e).encode()) for e in events if "queue_id" in e]
    polled = {
        (p["topic"], p["broker_name"], p["queue_id"]): (p["broker_offset"], p["consumer_offset"],
                                                         p["broker_offset"] - p["consumer_offset"])
        for p in progress
    }
    assert len(polled) == len(progress)
    expected = mqadmin_progress(rocketmq, group)
    assert polled == expected
    assert sum(d for _b, _c, d in expected.values()) == 30


def status_lines(home: Path) -> list[dict[str, Any]]:
    path = home / "status.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith('{"poll_ms"')]


def event_brokers_since(home: Path, since_ms: int) -> set[str]:
    path = home / "events.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return {r["broker_name"] for r in rows if "queue_id" in r and r["ts_ms"] >= since_ms}


def test_poller_reports_a_frozen_and_a_killed_broker_and_keeps_the_others(  # type: ignore[no-untyped-def]
    rocketmq: RocketMQCluster, driver, rmq_topic: str, tmp_path: Path
) -> None:
    group = f"cg-{rmq_topic}"
    consumer = driver("4.9.8", topic=rmq_topic)
    consumer.command(f"consume {group}")
    assert driver("4.9.8", topic=rmq_topic).command("send 24")["failed"] == 0
    home = tmp_path / "poller"
    home.mkdir()
    proc = start_poller(rocketmq.namesrv_addr, "DefaultCluster", [group], home, "--stdout",
                        "--interval-ms", "1000", "--timeout-ms", "1500")
    try:
        def last_with(broker: str, prefix: str) -> dict[str, Any] | None:
            hits = [s for s in status_lines(home) if s["brokers"].get(broker, "").startswith(prefix)]
            return hits[-1] if hits else None

        wait_for(lambda: last_with("broker-c", "ok") is not None, 60, "a poll with every broker ok", proc)
        rocketmq.freeze("broker-c")
        try:
            wait_for(lambda: last_with("broker-c", "down: no answer") is not None, 60, "broker-c reported frozen", proc)
        finally:
            rocketmq.thaw("broker-c")
        frozen = last_with("broker-c", "down: no answer")
        assert frozen is not None
        assert {b: s for b, s in frozen["brokers"].items() if b != "broker-c"} == {"broker-a": "ok", "broker-b": "ok"}
        assert event_brokers_since(home, frozen["poll_ms"]) >= {"broker-a", "broker-b"}

        killed_at = int(time.time() * 1000)
        rocketmq.kill("broker-c")
        try:
            wait_for(lambda: (s := last_with("broker-c", "down: ")) is not None and s["poll_ms"] >= killed_at,
                     60, "broker-c reported down after the kill", proc)
            down = last_with("broker-c", "down: ")
            assert down is not None and down["brokers"]["broker-a"] == down["brokers"]["broker-b"] == "ok"
        finally:
            rocketmq.restart("broker-c")
        back_at = int(time.time() * 1000)
        wait_for(lambda: (s := last_with("broker-c", "ok")) is not None and s["poll_ms"] >= back_at,
                 60, "broker-c ok again", proc)
    finally:
        proc.terminate()
        proc.wait(20)
