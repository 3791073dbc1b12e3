"""The publisher end to end: real Delta tables in, the real local Kafka broker and files out."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topics
from deltalake import DeltaTable

from pipeline.config import Config
from pipeline.deltaio import latest_revision, read_table
from pipeline.producer import AvoidanceFeed
from pipeline.publish import run_cycle
from pipeline.publish.sinks import safe_file_name

# The row builders and the topic reader are shared with the DAG tests (tests/airflow is no package:
# a folder named airflow must not shadow the real one).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, day, episode_row, health_row, read_topic, write

pytestmark = pytest.mark.kafka


def window_row(client: str, broker: str, now: int, revision: int = 0) -> dict[str, Any]:
    start = now - 20 * S
    return {
        "window_id": f"c1|pg|{client}|{broker}|{start}", "cluster": "c1", "producer_group": "pg",
        "client_id": client, "client_version": "5.3.3", "generation": "5", "broker_name": broker,
        "start_ms": start, "end_ms": now + 10 * S, "state": "open", "trigger_event_id": f"e-{client}",
        "trigger_status": "FAILED", "trigger_latency_ms": 3000, "trigger_error": "RemotingTimeoutException",
        "trigger_isolation": True, "updates": 1, "fault_enable": True, "revision": revision,
        "updated_ms": now - 20 * S, "event_date": day(start),
    }


def lag_row(now: int) -> dict[str, Any]:
    return {
        "cluster": "c1", "consumer_group": "GID_orders", "ts_ms": now - 30 * S, "status": "STALL",
        "previous_status": "OK", "total_lag": 5000, "max_time_lag_ms": 400_000, "retry_lag": 0, "dlq_lag": 0,
        "worst_topic": "orders", "worst_broker": "b2", "worst_queue_id": 1, "worst_owner": "cid-1", "queues": 8,
        "mismatched_queues": 0, "idle_consumers": [], "alert": True, "alert_reason": "offsets did not move", "event_date": day(now),
        "burrow_status": "ERR", "complete": 1.0, "max_lag": 5000, "maxlag_topic": "orders", "maxlag_broker": "b2",
        "maxlag_queue_id": 1,
    }


def write_inputs(root: str, now: int) -> None:
    write(root, "broker_health", [health_row(b, now) for b in ("b1", "b2", "b3", "b4")])
    # b2: opened, revised (still open); b4: an old episode closed long ago (revision 1 replaces 0).
    old = now - 3 * 3600 * S
    write(root, "broker_fault_episodes_live", [
        episode_row("b2", now - 90 * S, 0, now), episode_row("b2", now - 90 * S, 1, now),
        episode_row("b4", old, 0, now), episode_row("b4", old, 1, now, closed=old + 60 * S),
    ])
    write(root, "producer_fault_windows_live", [window_row(c, "b2", now) for c in ("p1", "p2", "p3")])
    write(root, "group_status", [lag_row(now)])


def table_version(root: str, name: str) -> int | None:
    path = Path(root) / name
    return DeltaTable(str(path)).version() if DeltaTable.is_deltatable(str(path)) else None


@pytest.fixture
def pcfg(cfg: Config, kafka, request) -> Config:  # type: ignore[no-untyped-def]
    return unique_topics(cfg, kafka, f"pub{abs(hash(request.node.name)) % 10**8}")


def test_cycle_publishes_the_decision_everywhere_once(pcfg: Config) -> None:
    now = int(time.time() * 1000)
    root = pcfg.storage.root
    write_inputs(root, now)
    cycle = now // 60_000

    report = run_cycle(pcfg, cycle_number=cycle, at_ms=now)

    # Written out, not derived with the publisher's own functions: b2 has an open episode (opened
    # 90 s ago) and 3 producers' windows on it; 4 brokers known, at most half avoided; b2's health
    # minute gives the evidence; the list expires after policy.expiry_s (180 s).
    episode = f"c1|b2|{now - 90 * S}"
    want = {
        "schema": "faultwatch.avoidance/1", "cluster": "c1", "cycle_id": str(cycle), "policy_version": "1",
        "decided_ms": now, "expires_ms": now + 180 * S, "brokers_known": 4, "max_avoid": 2, "capped": False,
        "avoid": [{"broker_name": "b2", "avoid_until_ms": now + 100 * S, "expires_ms": now + 180 * S,
                   "reason": "open_episode: quorum", "episode_id": episode, "multiplier": 1,
                   "evidence": {"producers_avoiding": 3, "failure_rate": 0.0, "p99_latency_ms": 12.0}}],
        "keep_available": [],
    }
    assert report.status == "published"
    assert [(r.broker_name, r.action, r.avoid_until_ms) for r in report.decision.recommendations()] == [
        ("b2", "avoid", now + 100 * S)]
    assert read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance) == [("c1", want)]
    file = Path(pcfg.storage.publish_dir) / safe_file_name("c1")
    assert json.loads(file.read_bytes()) == want
    history = read_table(root, "avoidance_recommendations")
    assert history.column_names == [
        "cycle_id", "cluster", "broker_name", "action", "avoid_until_ms", "expires_ms", "reason", "episode_id",
        "producers_avoiding", "failure_rate", "p99_latency_ms", "multiplier", "policy_version", "decided_ms"]
    assert [tuple(r.values()) for r in history.to_pylist()] == [
        (str(cycle), "c1", "b2", "avoid", now + 100 * S, now + 180 * S, "open_episode: quorum", episode,
         3, 0.0, 12.0, 1, "1", now)]
    cycles = read_table(root, "publisher_cycles", columns=["cycle_number", "step", "status", "avoided", "alerts"])
    assert sorted(cycles.to_pylist(), key=lambda r: (r["step"], r["status"])) == [
        {"cycle_number": cycle, "step": "alerts", "status": "sent", "avoided": 0, "alerts": 2},
        {"cycle_number": cycle, "step": "avoidance", "status": "claimed", "avoided": 1, "alerts": 0},
        {"cycle_number": cycle, "step": "avoidance", "status": "published", "avoided": 1, "alerts": 0},
    ]
    # Alerts: the open episode on b2 and the stalled group, both firing.
    fired = read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts)
    assert sorted((k, a["kind"], a["status"], a["alert_id"], a["cycle_id"]) for k, a in fired) == [
        ("c1", "broker_fault", "firing", "broker_fault|c1|b2|open", str(cycle)),
        ("c1", "consumer_lag", "firing", "consumer_lag|c1|GID_orders|STALL", str(cycle)),
    ]
    assert {a["kind"]: a["details"].get("consumer_group") for _, a in fired}["consumer_lag"] == "GID_orders"

    # The producer feed sees exactly the published avoidance.
    feed = AvoidanceFeed.from_config(pcfg)
    try:
        deadline = time.monotonic() + 30  # the first fetch may come after an empty poll
        while not feed.avoided("c1", now) and time.monotonic() < deadline:
            feed.poll(500)
        assert feed.avoided("c1", now) == {"b2": now + 100 * S}
    finally:
        feed.close()

    # Re-running the same cycle appends, publishes and alerts nothing.
    versions = {n: table_version(root, n) for n in ("avoidance_recommendations", "publisher_cycles")}
    again = run_cycle(pcfg, cycle_number=cycle, at_ms=now + 5 * S)
    assert again.status == "skipped" and again.alerts == 0
    assert {n: table_version(root, n) for n in versions} == versions
    assert len(read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)) == 1
    assert len(read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts)) == 2

    # Next cycle: the episode closed 50 s ago, probation (30 s) is over, but the published
    # avoidance (until now + 100 s) holds: hysteresis comes from the history table.
    later = now + 60 * S
    write(root, "broker_fault_episodes_live", [episode_row("b2", now - 90 * S, 2, later, closed=later - 50 * S)])
    write(root, "broker_health", [health_row(b, later, minute_ms=later - 60 * S) for b in ("b1", "b2", "b3", "b4")])
    nxt = run_cycle(pcfg, cycle_number=cycle + 1, at_ms=later)
    [rec] = nxt.decision.recommendations()
    assert (nxt.status, rec.broker_name, rec.reason.split(":")[0], rec.avoid_until_ms) == (
        "published", "b2", "hysteresis", now + 100 * S)
    assert [m["cycle_id"] for _, m in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)] == [str(cycle), str(cycle + 1)]


def test_invalid_input_publishes_nothing_keeps_the_last_list_and_alerts(pcfg: Config) -> None:
    now = int(time.time() * 1000)
    root = pcfg.storage.root
    write_inputs(root, now)
    cycle = now // 60_000
    assert run_cycle(pcfg, cycle_number=cycle, at_ms=now).status == "published"
    file = Path(pcfg.storage.publish_dir) / safe_file_name("c1")
    published = file.read_bytes()

    # A broken health row (failure rate above 1) arrives; the next cycle must refuse to publish.
    later = now + 60 * S
    write(root, "broker_health", [health_row("b1", later, minute_ms=later - 30 * S, failure_rate=1.7, failures=5)])
    report = run_cycle(pcfg, cycle_number=cycle + 1, at_ms=later)

    assert report.status == "rejected"
    assert report.gate is not None and report.gate.failed == (
        "avoidance_health:expect_column_values_to_be_between(failure_rate) (1 unexpected)",
    )
    assert [m["cycle_id"] for _, m in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)] == [str(cycle)]
    assert file.read_bytes() == published
    alerts = [a for _, a in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts) if a["kind"] == "avoidance_validation_failed"]
    assert [(a["cycle_id"], a["details"]["failed_checks"]) for a in alerts] == [(str(cycle + 1), list(report.gate.failed))]
    rows = latest_revision(read_table(root, "publisher_cycles"), ["cycle_number", "step"], revision="decided_ms")
    assert [(r["cycle_number"], r["step"], r["status"]) for r in rows.to_pylist() if r["step"] == "avoidance"] == [
        (cycle, "avoidance", "published"), (cycle + 1, "avoidance", "rejected")]
    # The rejected cycle added no history: the last good list is still the one in force.
    assert {r["cycle_id"] for r in read_table(root, "avoidance_recommendations").to_pylist()} == {str(cycle)}


def test_stale_input_is_refused(pcfg: Config) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now - 3600 * S)
    report = run_cycle(pcfg, cycle_number=now // 60_000, at_ms=now)
    assert report.status == "rejected"
    assert report.gate is not None
    assert report.gate.failed == ("avoidance_snapshot:expect_column_values_to_be_between(input_age_ms) (1 unexpected)",)
    assert read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance) == []
