"""Apache Kafka stopped for 45 s and started again in the middle of a backlog: the streaming job waits
(kafka.connect_timeout_s covers the outage), goes on, and bronze equals what was produced, once each."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.kafka_apache import start_apache_kafka
from tests.integration.bronze_data import assert_bronze_holds, make_mix, produce_mix
from tests.integration.processes import committed_batches, kill_tree, start_faultwatch, wait_for, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# Longer than kafka-python's own request timeout (30 s), so a look-up the job sends into the outage
# times out inside it and must be retried (a 20 s outage passed or failed on how long the restart took).
OUTAGE_S = 45.0


def test_a_broker_restart_mid_backlog_loses_and_duplicates_nothing(cfg: Config, tmp_path: Path) -> None:
    broker = start_apache_kafka(topics=Config().topics.all(), partitions=2, home=tmp_path / "kafka")
    try:
        cfg = cfg.replace(kafka__bootstrap_servers=broker.bootstrap, kafka__connect_timeout_s=240.0,
                          stream__max_events_per_batch=1500, stream__trigger_interval_s=0.5)
        mix = make_mix(20_000, seed=23)
        produced = produce_mix(broker.bootstrap, cfg.topics.event_topics(), mix)
        conf = write_config(cfg, tmp_path / "fw.toml")
        log = tmp_path / "stream.log"
        proc = start_faultwatch("stream", "--config", str(conf), "--only", "bronze", log=log)
        try:
            wait_for(lambda: committed_batches(cfg, "bronze") >= 2, 300, "two committed batches", proc, log)
            broker.stop()
            down_at = committed_batches(cfg, "bronze")
            outage_end = time.monotonic() + OUTAGE_S
            while time.monotonic() < outage_end:  # the outage itself; the job must stay up through it
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                time.sleep(0.5)
            assert committed_batches(cfg, "bronze") <= down_at + 1  # (a batch read before the stop may commit)
            broker.start()
            expected = len(mix.valid["send_result"])
            wait_for(lambda: read_table(cfg.storage.root, "send_results").num_rows >= expected, 600,
                     "every send result in bronze after the restart", proc, log)
            assert committed_batches(cfg, "bronze") > down_at + 1  # batches read after the restart
            print(f"batches: {down_at} before the stop, {committed_batches(cfg, 'bronze')} in all")
        finally:
            kill_tree(proc, signal.SIGTERM)
        assert_bronze_holds(cfg.storage.root, mix, produced)  # every record at its position, once
    finally:
        broker.close()
