"""faultwatch stream as a real process: SIGKILL and restart, Kafka going away, spark-submit."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.kafka_local import free_port, start_local_kafka
from tests.conftest import unique_topics
from tests.integration.bronze_data import assert_bronze_holds, make_mix, produce_mix
from tests.integration.processes import (
    BIN,
    REPO,
    committed_batches,
    kill_tree,
    start_faultwatch,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def committed_ends(cfg: Config, query: str) -> dict[str, int]:
    """Each "topic/partition"'s end offset at the last batch ``query`` committed in full (the job
    writes a batch's report once every table has committed it; Spark's offsets/N holds its ends)."""
    folder = Path(cfg.storage.checkpoint_root) / query
    last = max(int(p.stem) for p in (folder / "faultwatch-reports").glob("*.json"))
    ends = orjson.loads((folder / "offsets" / str(last)).read_text().splitlines()[2])
    return {k: int(v) for k, v in ends.items() if not k.startswith("_")}


# with either Delta writer (storage.writer): Delta's txnAppId/txnVersion skip the replayed batch too
@pytest.mark.parametrize("writer", ["deltalake", "delta-spark"])
def test_sigkill_mid_run_then_restart_loses_and_duplicates_nothing(kafka, cfg: Config, tmp_path: Path, writer: str) -> None:  # type: ignore[no-untyped-def]
    # delta-spark's micro-batches cost ~20 s whatever their size: five of them, not fourteen
    per_batch = 1500 if writer == "deltalake" else 4000
    cfg = unique_topics(cfg, kafka, f"killme-{writer}").replace(stream__max_events_per_batch=per_batch,
                                                                stream__trigger_interval_s=0.5, storage__writer=writer)
    mix = make_mix(20_000, seed=11)
    produced = produce_mix(kafka.bootstrap, cfg.topics.event_topics(), mix)
    conf = write_config(cfg, tmp_path / "fw.toml")
    log = tmp_path / "stream.log"

    proc = start_faultwatch("stream", "--config", str(conf), "--only", "bronze", log=log)
    wait_for(lambda: committed_batches(cfg, "bronze") >= 3, 240, "three committed batches", proc, log)
    kill_tree(proc, signal.SIGKILL)  # the next batch is in flight: no chance to clean up
    partial = read_table(cfg.storage.root, "send_results").num_rows
    assert 0 < partial < len(mix.valid["send_result"])

    again = subprocess.run(
        [str(BIN / "faultwatch"), "stream", "--config", str(conf), "--only", "bronze", "--once"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[bronze] total:" in again.stdout
    assert_bronze_holds(cfg.storage.root, mix, produced)


def test_kafka_going_away_mid_run_fails_loudly(cfg: Config, tmp_path: Path) -> None:
    broker = start_local_kafka(topics=Config().topics.all(), partitions=2)
    try:
        cfg = cfg.replace(
            kafka__bootstrap_servers=broker.bootstrap, kafka__connect_timeout_s=5.0, stream__trigger_interval_s=0.5
        )
        mix = make_mix(2_000, seed=5)
        produced = produce_mix(broker.bootstrap, cfg.topics.event_topics(), mix)
        conf = write_config(cfg, tmp_path / "fw.toml")
        log = tmp_path / "stream.log"
        proc = start_faultwatch("stream", "--config", str(conf), "--only", "bronze", log=log)
        wait_for(lambda: committed_batches(cfg, "bronze") >= 1, 240, "a committed batch", proc, log)
        broker.stop()
        code = proc.wait(timeout=180)
    finally:
        broker.stop()
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert "query bronze failed" in text and "Kafka" in text
    # What was committed before the outage is intact and complete per batch: every record up to
    # the last committed batch's end offsets, and nothing after them.
    ends = committed_ends(cfg, "bronze")
    before = {pos: v for pos, v in produced.items() if pos[2] < ends[f"{pos[0]}/{pos[1]}"]}
    assert before, ends
    assert_bronze_holds(cfg.storage.root, mix, before)


def test_runs_under_spark_submit_on_a_standalone_cluster(kafka, cfg: Config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import os
    import sys

    cfg = unique_topics(cfg, kafka, "standalone").replace(stream__max_events_per_batch=3000)
    mix = make_mix(5_000, seed=13)
    produced = produce_mix(kafka.bootstrap, cfg.topics.event_topics(), mix)
    conf = write_config(cfg, tmp_path / "fw.toml")
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path), "SPARK_NO_DAEMONIZE": "1"}
    spark_class = str(BIN / "spark-class")
    logs = tmp_path / "cluster.log"
    procs = []
    with open(logs, "ab") as out:
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(free_port())], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        for _ in range(2):
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                 "--work-dir", str(tmp_path / "work")], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    try:
        wait_for(lambda: logs.read_text(errors="replace").count("Successfully registered with master") >= 2,
                 120, "two workers registered", log=logs)
        result = subprocess.run(
            [str(BIN / "spark-submit"), "--master", f"spark://127.0.0.1:{port}", "--conf", "spark.executor.memory=768m",
             str(REPO / "faultwatch" / "cli.py"), "stream", "--config", str(conf), "--only", "bronze", "--once"],
            check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**env, "FAULTWATCH_SPARK_MASTER": f"spark://127.0.0.1:{port}",
                 "PYSPARK_DRIVER_PYTHON": str(Path(sys.executable).with_name("faultwatch-python"))},  # as README says
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "Traceback (most recent call last)" not in result.stdout + result.stderr, result.stderr[-3000:]
        assert f"spark=spark://127.0.0.1:{port}" in result.stdout
        # submitted without --driver-java-options: the user is told which flags the driver lacks
        # (spark-submit passes the driver's stderr on as its stdout)
        assert "the driver's JVM runs without -XX:TieredStopAtLevel=1 -XX:+UseSerialGC" in result.stdout + result.stderr
        assert_bronze_holds(cfg.storage.root, mix, produced)
        apps = list((tmp_path / "work").glob("app-*/*/stderr"))
        assert len({p.parent.name for p in apps}) >= 2 or len(apps) >= 2  # executors ran on the workers
    finally:
        for p in procs:
            try:
                import os as _os
                _os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        time.sleep(0.1)
