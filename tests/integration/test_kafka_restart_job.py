"""The whole default job (every query) through an Apache Kafka restart in the middle of a backlog.

``faultwatch stream --once`` over a simulated outage's events; once its first query has committed two
micro-batches the broker is stopped, kept down for the outage, and started again. The job must stay
up through the outage, go on, exit 0, and leave every Delta table equal, row for row, to what one
clean run over the same events wrote into a storage root of its own. (Those tables, bronze
included, are checked against the produced events by the other end-to-end tests.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.kafka_apache import start_apache_kafka
from pipeline.simulate import KafkaSink, Simulation, load_scenario
from tests.integration.processes import committed_batches, kill_tree, start_faultwatch, wait_for, write_config
from tests.integration.test_stream_restarts import STARTED, _assert_same_tables

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# The job's client request timeout here, and an outage more than twice as long: a look-up the job
# sends into the outage times out inside it and must be retried (with kafka-python's default 30 s
# and a 20 s outage, the test passed or failed on how long the restart took).
REQUEST_TIMEOUT_MS = 8_000
OUTAGE_S = 20.0

SIMULATED_S = 60.0  # broker-b is down from 30 s of it: the job sees an outage of RocketMQ's too
MAX_EVENTS_PER_BATCH = 3000  # ~8 micro-batches per query
RUN_TIMEOUT_S = 600.0


def _run_to_end(conf: Path, log: Path) -> str:
    """A clean ``--once`` run; returns its first query's name (as its "started:" line says)."""
    proc = start_faultwatch("stream", "--config", str(conf), "--once", log=log, env={"PYTHONUNBUFFERED": "1"})
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_tree(proc, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    started = STARTED.search(text)
    assert started, text[-4000:]
    return started.group(1).split(", ")[0]


def test_every_table_equals_a_clean_run_after_a_broker_restart_mid_backlog(cfg: Config, tmp_path: Path) -> None:
    broker = start_apache_kafka(topics=Config().topics.all(), partitions=2, home=tmp_path / "kafka")
    try:
        cfg = cfg.replace(kafka__bootstrap_servers=broker.bootstrap, kafka__connect_timeout_s=240.0,
                          kafka__request_timeout_ms=REQUEST_TIMEOUT_MS, stream__max_events_per_batch=MAX_EVENTS_PER_BATCH)
        scenario = load_scenario("broker-outage").replace(duration_s=SIMULATED_S)
        Simulation(scenario, seed=47).run(KafkaSink(cfg), close=True)

        clean = cfg.replace(storage__root=str(tmp_path / "clean" / "tables"),
                            storage__checkpoint_root=str(tmp_path / "clean" / "checkpoints"),
                            storage__publish_dir=str(tmp_path / "clean" / "avoidance"))
        query = _run_to_end(write_config(clean, tmp_path / "clean.toml"), tmp_path / "clean.log")
        backlog = committed_batches(clean, query)
        assert backlog >= 5, f"{query}: {backlog} micro-batches, too few to stop the broker in the middle"

        log = tmp_path / "restarted.log"
        proc = start_faultwatch("stream", "--config", str(write_config(cfg, tmp_path / "fw.toml")), "--once",
                                log=log, env={"PYTHONUNBUFFERED": "1"})
        try:
            wait_for(lambda: committed_batches(cfg, query) >= 2, RUN_TIMEOUT_S, f"two batches of {query}", proc, log)
            broker.stop()
            down_at = committed_batches(cfg, query)
            assert down_at < backlog, f"{query} read its whole backlog ({down_at}) before the broker stopped"
            outage_end = time.monotonic() + OUTAGE_S
            while time.monotonic() < outage_end:  # the outage itself; the job must stay up through it
                assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
                time.sleep(0.5)
            broker.start()  # the job waits for it within kafka.connect_timeout_s (240 s)
            code = proc.wait(timeout=RUN_TIMEOUT_S)
            assert code == 0, log.read_text(errors="replace")[-4000:]
        finally:
            if proc.poll() is None:
                kill_tree(proc, signal.SIGKILL)
        after = committed_batches(cfg, query)
        assert after > down_at + 1, f"{query}: {down_at} batches before the stop, {after} in all"
        print(f"{query}: {down_at} of {after} micro-batches before the stop (a clean run: {backlog})")
        _assert_same_tables(Path(cfg.storage.root), Path(clean.storage.root))
    finally:
        broker.close()
