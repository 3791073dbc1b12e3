"""faultwatch's Java clients on a real RocketMQ cluster: the send hook, the feed client, the poller.

Real 4.9.8 and 5.3.3 producers (``clients/java``'s lab driver) send through three real brokers; what
the hook writes must pass the ``send_result`` contract and reach bronze through ``faultwatch stream``;
the feed client must write the recommended windows into the producers' own fault tables; the poller
must print what RocketMQ's own ``mqadmin consumerProgress`` prints.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.kafka_local import free_port
from schemas.events import decode_event
from tests.conftest import unique_topics
from tests.integration.processes import BIN, REPO, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CLIENT_VERSIONS = ("4.9.8", "5.3.3")
EVENT_FIELDS = ("event_id", "ts_ms", "cluster", "producer_group", "client_id", "client_version", "topic",
                "broker_name", "queue_id", "status", "latency_ms", "error", "queue_offset", "attempt")


def read_topic(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[bytes]:
    """Every record value of ``topic``, waiting (bounded) until ``expected`` of them arrived."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
        return values
    finally:
        consumer.close()


def test_hook_events_from_both_client_lines_pass_the_contract_and_reach_bronze(  # type: ignore[no-untyped-def]
    kafka, cfg: Config, tmp_path: Path, rmq_topic: str, driver
) -> None:
    cfg = unique_topics(cfg, kafka, "hook")
    sent: dict[str, dict[str, Any]] = {}
    for version in CLIENT_VERSIONS:
        d = driver(version, topic=rmq_topic, kafka=kafka.bootstrap, results_topic=cfg.topics.send_results)
        result = d.command("send 60")
        assert result["failed"] == 0, result
        stats = d.command("flush")
        assert (stats["offered"], stats["delivered"], stats["dropped"]) == (60, 60, 0), stats
        assert stats["client_latency"] is True, stats  # the hook's tap sits on the producer's fault strategy
        sent[version] = {**result, "client_id": d.command("faults")["client_id"]}

    values = read_topic(kafka.bootstrap, cfg.topics.send_results, 120)
    events = [decode_event("send_result", v) for v in values]  # raises on any contract breach
    assert len(events) == 120
    for version, result in sent.items():
        mine = [e for e in events if e["client_version"] == version]
        by_broker: dict[str, int] = {}
        for e in mine:
            by_broker[e["broker_name"]] = by_broker.get(e["broker_name"], 0) + 1
        assert by_broker == result["by_broker"], version
        assert {(e["status"], e["attempt"], e["error"], e["client_id"]) for e in mine} == {
            ("SEND_OK", 0, None, result["client_id"])
        }
        # the tap completes each event with what the client passed to updateFaultItem: 5.x passes reachable
        assert {e.get("reachable") for e in mine} == ({True} if version.startswith("5.") else {None}), version
    # every message got its own offset in its queue: the events say exactly where each one went
    placed = [(e["broker_name"], e["queue_id"], e["queue_offset"]) for e in events]
    assert len(set(placed)) == len(placed)

    conf = write_config(cfg, tmp_path / "fw.toml")
    done = subprocess.run([str(BIN / "faultwatch"), "stream", "--config", str(conf), "--only", "bronze", "--once"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bronze = read_table(cfg.storage.root, "send_results").to_pylist()
    rows = sorted(({k: r[k] for k in EVENT_FIELDS} for r in bronze), key=lambda r: r["event_id"])
    assert rows == sorted(({k: e[k] for k in EVENT_FIELDS} for e in events), key=lambda r: r["event_id"])
    assert read_table(cfg.storage.root, "quarantine").num_rows == 0


def test_hook_with_kafka_unreachable_never_stops_sends_and_counts_its_drops(driver, rmq_topic: str) -> None:  # type: ignore[no-untyped-def]
    nowhere = f"127.0.0.1:{free_port()}"
    d = driver("4.9.8", topic=rmq_topic, kafka=nowhere, hook_capacity="10")
    result = d.command("send 50")
    assert (result["ok"], result["failed"]) == (50, 0)
    stats = d.command("hook")
    assert stats["offered"] == 50 and stats["delivered"] == 0
    # the queue holds at most 10; the sender thread holds at most one more, waiting for Kafka
    assert stats["dropped"] + stats["queued"] >= 49 and stats["queued"] <= 10, stats
    assert stats["dropped"] >= 39, stats
    d.command("send 5")
    log = d.tail(200)
    assert log.count("events dropped so far") == 1, log  # once per interval (60 s), with the total


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_hook_records_a_fault_item_the_client_removes_by_itself(  # type: ignore[no-untyped-def]
    kafka, cfg: Config, driver, rmq_topic: str, version: str
) -> None:
    """4.9's fallback drops the item of a picked broker outside the route; no send shows it, the tap
    does, and the thread's next event carries it (faultwatch ends the window there)."""
    cfg = unique_topics(cfg, kafka, "removal-" + version.replace(".", "-"))
    d = driver(version, topic=rmq_topic, kafka=kafka.bootstrap, results_topic=cfg.topics.send_results)
    assert d.command("send 6")["failed"] == 0  # the producer learns the route
    before = int(time.time() * 1000)
    out = d.command("fallback broker-gone")
    after = int(time.time() * 1000)
    assert out["routed"] == ["broker-a", "broker-b", "broker-c"], out
    assert set(out["picked"]) <= set(out["routed"]) and out["picked"], out
    items = {i["broker_name"] for i in out["items"]}
    assert d.command("send 1")["failed"] == 0  # the next attempt of the thread that removed it
    assert d.command("flush")["delivered"] == 7
    events = [decode_event("send_result", v) for v in read_topic(kafka.bootstrap, cfg.topics.send_results, 7)]
    carried = [(e["event_id"], e["fault_item_removed"], e["fault_item_removed_ms"]) for e in events
               if e["fault_item_removed"] is not None]
    if version.startswith("4."):
        [removed] = out["removed"]
        assert removed["broker_name"] == "broker-gone" and before <= removed["at_ms"] <= after, out
        assert "broker-gone" not in items, out
        log = d.tail(200)
        assert log.count("removed its fault item for broker-gone by itself") == 1, log  # the operator is told
        last = max(events, key=lambda e: int(e["event_id"].rsplit("-", 1)[1]))
        assert carried == [(last["event_id"], "broker-gone", removed["at_ms"])], events
    else:  # 5.x's selection never removes an item
        assert out["removed"] == [] and "broker-gone" in items, out
        assert carried == [], events


def test_hook_delivers_again_once_kafka_is_back(driver, rmq_topic: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pipeline.kafka_local import start_local_kafka

    port = free_port()
    d = driver("5.3.3", topic=rmq_topic, kafka=f"127.0.0.1:{port}", results_topic="rmq.send-results")
    assert d.command("send 20")["failed"] == 0  # Kafka is not there yet
    with start_local_kafka(port=port, topics=["rmq.send-results"], partitions=2, log_dir=tmp_path) as kafka:
        assert d.command("send 20")["failed"] == 0
        stats = d.command("flush")
        # the 20 sent while Kafka was away waited in the queue (well under its bound): none is lost
        assert (stats["offered"], stats["queued"], stats["delivered"], stats["dropped"]) == (40, 0, 40, 0), stats
        values = read_topic(kafka.bootstrap, "rmq.send-results", stats["delivered"])
        assert len(values) == stats["delivered"]
        assert all(decode_event("send_result", v)["topic"] == rmq_topic for v in values)


def avoidance_list(decided_ms: int, expires_ms: int, avoid: dict[str, int], cycle: str | None = None) -> str:
    entries = [
        {"broker_name": b, "avoid_until_ms": until, "expires_ms": expires_ms, "reason": "open_episode: test",
         "episode_id": f"DefaultCluster|{b}|{decided_ms}", "multiplier": 1,
         "evidence": {"producers_avoiding": 1, "failure_rate": 1.0, "p99_latency_ms": 3000.0}}
        for b, until in avoid.items()
    ]
    return json.dumps({
        "schema": "faultwatch.avoidance/1", "cluster": "DefaultCluster", "cycle_id": cycle or str(decided_ms),
        "policy_version": "1", "decided_ms": decided_ms, "expires_ms": expires_ms, "brokers_known": 3,
        "max_avoid": 1, "capped": False, "avoid": entries, "keep_available": [],
    })


def items_by_broker(d) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    return {i["broker_name"]: i for i in d.command("faults")["items"]}


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_feed_client_writes_the_recommended_window_into_the_producers_fault_table(  # type: ignore[no-untyped-def]
    driver, rmq_topic: str, version: str
) -> None:
    d = driver(version, topic=rmq_topic, feed="stdin")
    assert d.command("send 12")["failed"] == 0  # the producer learns the route and fills its table
    now = int(time.time() * 1000)
    until = now + 60_000
    assert d.command("feed " + avoidance_list(now, now + 180_000, {"broker-b": until}))["accepted"]
    item = items_by_broker(d)["broker-b"]
    # updateFaultItem(now', duration = until - now) with now' the client's clock a few ms later
    assert until <= item["start_timestamp"] <= until + 1000, item
    assert item["reachable"] is (None if version.startswith("4.") else True)
    sends = d.command("send 30")
    assert sends["failed"] == 0 and "broker-b" not in sends["by_broker"], sends

    # bad input: each is refused with the field named, and changes nothing
    for bad, why in (
        ('{"schema": "faultwatch.avoidance/2"}', "unknown avoidance list schema"),
        (json.dumps({**json.loads(avoidance_list(now + 1, now + 9, {})), "decided_ms": "soon"}), "'decided_ms'"),
        ("not json", "must be JSON"),
    ):
        out = d.command("feed " + bad)
        assert not out["accepted"] and why in out["last_rejection"], out
    older = d.command("feed " + avoidance_list(now - 1000, now + 180_000, {}))
    assert not older["accepted"]  # an older list never replaces a newer one
    assert items_by_broker(d)["broker-b"]["start_timestamp"] == item["start_timestamp"]

    # the episode closed: a newer list without broker-b
    later = int(time.time() * 1000)
    assert d.command("feed " + avoidance_list(later, later + 180_000, {}))["accepted"]
    after = items_by_broker(d)["broker-b"]
    if version.startswith("4."):
        assert after["start_timestamp"] <= int(time.time() * 1000), after  # released at once
    else:
        assert after["start_timestamp"] == item["start_timestamp"], after  # 5.x windows never shrink


def test_feed_client_ignores_an_expired_list(driver, rmq_topic: str) -> None:  # type: ignore[no-untyped-def]
    d = driver("4.9.8", topic=rmq_topic, feed="stdin")
    assert d.command("send 6")["failed"] == 0
    before = items_by_broker(d)
    now = int(time.time() * 1000)
    assert d.command("feed " + avoidance_list(now - 200_000, now - 1, {"broker-c": now + 60_000}))["accepted"]
    # No send ran since ``before``: an ignored list leaves the producer's table exactly as it was (a
    # window the client opened itself on a slow send stays what it was, however slow the machine).
    assert items_by_broker(d) == before


def test_feed_has_no_effect_when_the_producer_runs_without_latency_fault_tolerance(  # type: ignore[no-untyped-def]
    driver, rmq_topic: str
) -> None:
    d = driver("4.9.8", topic=rmq_topic, feed="stdin", fault_enable="false")
    assert d.command("send 6")["failed"] == 0
    now = int(time.time() * 1000)
    assert d.command("feed " + avoidance_list(now, now + 180_000, {"broker-b": now + 60_000}))["accepted"]
    sends = d.command("send 30")
    # the client never reads its fault table with sendLatencyFaultEnable=false: broker-b still gets sends
    assert sends["failed"] == 0 and sends["by_broker"].get("broker-b", 0) > 0, sends
    assert "sendLatencyFaultEnable=false" in d.tail(200)


def test_feed_client_reads_again_once_kafka_is_back(driver, rmq_topic: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Kafka away when the feed starts (or slow to answer): its reader retries instead of stopping for good."""
    from kafka import KafkaProducer

    from pipeline.kafka_local import start_local_kafka

    port = free_port()
    d = driver("4.9.8", topic=rmq_topic, feed="kafka", kafka=f"127.0.0.1:{port}", feed_topic="rmq.avoidance")
    assert d.command("send 12")["failed"] == 0
    deadline = time.monotonic() + 120
    while d.command("feedstats")["reader_errors"] < 1:  # its topic look-up timed out (5 s)
        assert time.monotonic() < deadline, d.command("feedstats")
        time.sleep(0.5)
    with start_local_kafka(port=port, topics=["rmq.avoidance"], partitions=2, log_dir=tmp_path) as kafka:
        now = int(time.time() * 1000)
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
        producer.send("rmq.avoidance", key=b"DefaultCluster",
                      value=avoidance_list(now, now + 180_000, {"broker-b": now + 60_000}).encode())
        producer.flush()
        producer.close()
        deadline = time.monotonic() + 120
        while items_by_broker(d).get("broker-b", {}).get("start_timestamp", 0) < now + 60_000:
            assert time.monotonic() < deadline, (items_by_broker(d), d.command("feedstats"), d.tail())
            time.sleep(0.5)
    assert d.command("feedstats")["records"] == 1
    assert "reading rmq.avoidance failed, retrying" in d.tail(200)
