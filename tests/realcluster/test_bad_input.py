"""Bad input and faults that only a real cluster brings, through ``faultwatch stream``.

A producer whose client version the rules do not model (a pre-4.0 ``com.alibaba`` client carries
no Apache hook, so its event is the hook's real event with the version it would report) is
quarantined with the version named; a broker started while the job runs, whose name no event carried
before, gets its own state and windows. The hook with Kafka unreachable and the poller against a
down broker are in ``test_java_clients`` and ``test_poller``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.deltaio import latest_revision, read_table
from pipeline.rocketmq_cluster import RocketMQCluster
from tests.conftest import unique_topics
from tests.integration.processes import BIN, REPO, write_config
from tests.realcluster.test_java_clients import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def stream_once(conf: Path) -> None:
    done = subprocess.run([str(BIN / "faultwatch"), "stream", "--config", str(conf), "--once"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def event_ids(table: str, cfg: Config) -> list[str]:
    return sorted(read_table(cfg.storage.root, table).column("event_id").to_pylist())


def test_a_client_version_the_rules_do_not_model_is_quarantined_naming_it(  # type: ignore[no-untyped-def]
    kafka, cfg: Config, tmp_path: Path, rmq_topic: str, driver
) -> None:
    from kafka import KafkaProducer

    cfg = unique_topics(cfg, kafka, "oldclient")
    d = driver("4.9.8", topic=rmq_topic, kafka=kafka.bootstrap, results_topic=cfg.topics.send_results)
    assert d.command("send 12")["failed"] == 0
    assert d.command("flush")["delivered"] == 12
    real = [json.loads(v) for v in read_topic(kafka.bootstrap, cfg.topics.send_results, 12)]
    old = {**real[-1], "event_id": real[-1]["event_id"] + "-old", "client_version": "3.2.6"}
    old_bytes = json.dumps(old).encode()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    producer.send(cfg.topics.send_results, key=old["broker_name"].encode(), value=old_bytes).get(30)
    producer.close()

    stream_once(write_config(cfg, tmp_path / "fw.toml"))
    # bronze keeps every event as received; the fault rules refuse the one they have no table for
    assert event_ids("send_results", cfg) == sorted([e["event_id"] for e in real] + [old["event_id"]])
    rows = [{k: r[k] for k in ("event_kind", "stage", "reason", "detail", "source_topic")} | {
        "event": json.loads(r["raw_value"])} for r in read_table(cfg.storage.root, "quarantine").to_pylist()]
    assert rows == [{
        "event_kind": "send_result", "stage": "faults", "reason": "bad_client_version",
        "detail": "client_version '3.2.6': no fault table for this RocketMQ client version "
                  "(the rules model 4.0 and later)",
        # the job keeps the event as it parsed it: the contract's optional fields spelled out
        "source_topic": cfg.topics.send_results, "event": {"isolation": None, "reachable": None, **old},
    }]


def test_a_broker_started_mid_run_gets_its_own_windows(  # type: ignore[no-untyped-def]
    kafka, cfg: Config, tmp_path: Path, rocketmq: RocketMQCluster, rmq_topic: str, driver
) -> None:
    cfg = unique_topics(cfg, kafka, "newbroker")
    conf = write_config(cfg, tmp_path / "fw.toml")
    hooked = {"kafka": kafka.bootstrap, "results_topic": cfg.topics.send_results}
    first = driver("5.3.3", topic=rmq_topic, **hooked)
    assert first.command("send 24")["by_broker"].keys() == {"broker-a", "broker-b", "broker-c"}
    assert first.command("flush")["dropped"] == 0
    stream_once(conf)  # the job's state now knows broker-a..c only
    windows = read_table(cfg.storage.root, "producer_fault_windows_live").to_pylist()
    assert "broker-d" not in {w["broker_name"] for w in windows}

    rocketmq.add_running_broker("broker-d")
    try:
        rocketmq.create_topic(rmq_topic, 4)
        later = driver("4.9.8", topic=rmq_topic, **hooked)
        sent = later.command("send 32")
        assert sent["failed"] == 0 and sent["by_broker"].get("broker-d", 0) > 0, sent
        rocketmq.kill("broker-d")  # refused connections: a 10-minute window in the 4.9.8 client
        after = later.command("send 16")
        assert after["failed"] == 0 and "broker-d" not in after["by_broker"], after
        snapshot = later.command("faults")
        assert later.command("flush")["dropped"] == 0
    finally:
        rocketmq.brokers["broker-d"].stop()
        del rocketmq.brokers["broker-d"]
    client = {i["broker_name"]: i["start_timestamp"] for i in snapshot["items"]
              if i["start_timestamp"] > snapshot["now_ms"]}
    assert "broker-d" in client, snapshot

    stream_once(conf)  # the same checkpoint: broker-d arrives in a running job's state
    windows = latest_revision(read_table(cfg.storage.root, "producer_fault_windows_live"), "window_id").to_pylist()
    ours = {w["broker_name"]: w["end_ms"] for w in windows if w["client_id"] == snapshot["client_id"]
            and w["state"] != "retracted" and w["start_ms"] <= snapshot["now_ms"] < w["end_ms"]}
    assert set(ours) == set(client)
    assert 0 <= client["broker-d"] - ours["broker-d"] <= 50  # the live oracle's tolerance
    sent_to = {r["broker_name"] for r in read_table(cfg.storage.root, "send_results").to_pylist()}
    assert sent_to == {"broker-a", "broker-b", "broker-c", "broker-d"}
