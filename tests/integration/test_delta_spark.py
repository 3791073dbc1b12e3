"""The job's tables are standard Delta for delta-spark: Spark users read, time-travel and maintain them.

A short real job (``faultwatch stream --once`` over the simulator's broker outage) writes every table
of the default job; the same job with ``storage.writer = "delta-spark"`` writes the same rows into
another root. Then delta-spark, in the tests' own Spark session (streaming/deltaspark.py),
reads each table, lists ``DESCRIBE HISTORY`` and reads the version before the latest (``versionAsOf``);
on the two tables the job wrote in several files it runs ``OPTIMIZE`` and ``VACUUM ... RETAIN 0 HOURS``
and reads it again (each such step is dozens of small Spark jobs). Every read must
equal, row for row, what ``deltalake`` reads of the same version. Afterwards ``deltalake`` still reads each table
as it was, and the job runs again on the maintained tables: the new events land next to the old rows.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.fs as pa_fs
import pytest
from deltalake import DeltaTable

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.simulate import DEFAULT_EPOCH_MS, KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.integration.processes import start_faultwatch, write_config

# three job runs and ~60 small Spark jobs of delta-spark: ~15 min on a machine loaded many times over
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(2400)]

# what the default job writes from this scenario (the check also covers any other table it finds)
EXPECTED = {"send_results", "consumer_progress", "group_membership", "quarantine", "producer_fault_windows",
            "producer_fault_windows_live", "broker_fault_episodes", "broker_fault_episodes_live", "broker_health",
            "queue_lag", "group_status"}
MAINTAIN = ("send_results", "consumer_progress")  # one file per executor task: several each


def run_job(conf: Path, log: Path) -> None:
    proc = start_faultwatch("stream", "--config", str(conf), "--once", log=log)
    assert proc.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]


def tables_of(root: str) -> dict[str, str]:
    return {p.parent.name: str(p.parent) for p in sorted(Path(root).glob("*/_delta_log"))}


def canonical(table: Any) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def deltalake_rows(path: str, version: int) -> list[str]:
    dataset = DeltaTable(path, version=version).to_pyarrow_dataset(
        filesystem=pa_fs.SubTreeFileSystem(path, pa_fs.LocalFileSystem()))  # explicit: delta-rs#2184
    return canonical(dataset.to_table())


def spark_rows(df: Any) -> list[str]:
    """What delta-spark read."""
    return canonical(df.toArrow())


def check_table(spark: Any, path: str, maintain: bool) -> dict[str, Any]:
    """What a Spark user does with a table: read it, ``DESCRIBE HISTORY``, read the version before the
    latest (``versionAsOf``); with ``maintain`` also ``OPTIMIZE`` and ``VACUUM ... RETAIN 0 HOURS``,
    then read it again."""
    ref = f"delta.`{path}`"
    history = [r.asDict() for r in spark.sql(f"DESCRIBE HISTORY {ref}").select("version", "operation").collect()]
    latest = max(int(h["version"]) for h in history)
    out: dict[str, Any] = {"latest": latest, "history": history,
                           "rows": spark_rows(spark.read.format("delta").load(path))}
    if latest > 0:
        out["before"] = spark_rows(spark.read.format("delta").option("versionAsOf", latest - 1).load(path))
    if maintain:
        out["optimize"] = spark.sql(f"OPTIMIZE {ref}").select("metrics.numFilesAdded", "metrics.numFilesRemoved").first().asDict()
        spark.sql(f"VACUUM {ref} RETAIN 0 HOURS").collect()
        out["maintained"] = spark_rows(spark.read.format("delta").load(path))
        out["detail"] = spark.sql(f"DESCRIBE DETAIL {ref}").select("numFiles").first().asDict()
    return out


def test_delta_spark_reads_time_travels_and_maintains_the_jobs_tables(kafka: Any, spark: Any, cfg: Config,
                                                                     tmp_path: Path) -> None:
    cfg = unique_topics(cfg, kafka, "deltaspark")
    scenario = load_scenario("broker-outage").replace(duration_s=90.0)
    Simulation(scenario).run(KafkaSink(cfg), close=True)
    conf = write_config(cfg, tmp_path / "job.toml")
    run_job(conf, tmp_path / "job.log")

    tables = tables_of(cfg.storage.root)
    assert EXPECTED <= set(tables), sorted(tables)
    versions = {name: DeltaTable(path).version() for name, path in tables.items()}
    latest = {name: deltalake_rows(path, versions[name]) for name, path in tables.items()}
    before = {name: deltalake_rows(path, versions[name] - 1) for name, path in tables.items() if versions[name] > 0}
    history = {name: sorted(h["version"] for h in DeltaTable(path).history()) for name, path in tables.items()}

    # the delta-spark writer, over the same topics into its own root, writes the very same rows
    other = cfg.replace(storage__writer="delta-spark", storage__root=str(tmp_path / "ds" / "tables"),
                        storage__checkpoint_root=str(tmp_path / "ds" / "checkpoints"),
                        storage__publish_dir=str(tmp_path / "ds" / "avoidance"))
    run_job(write_config(other, tmp_path / "ds.toml"), tmp_path / "ds.log")
    assert set(tables_of(other.storage.root)) == set(tables)
    for name in tables:
        assert canonical(read_table(other.storage.root, name)) == latest[name], name
    written = [h for h in DeltaTable(str(Path(other.storage.root) / "send_results")).history() if h["operation"] == "WRITE"]
    assert written and all(h.get("engineInfo", "").startswith("Apache-Spark") for h in written), written[:2]

    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:  # the tables side by side: each check is many small Spark jobs that leave the cores idle between them
        with ThreadPoolExecutor(max_workers=4) as pool:
            checks = {name: pool.submit(check_table, spark, path, name in MAINTAIN) for name, path in tables.items()}
            summary = {name: check.result() for name, check in checks.items()}
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    for name in tables:
        got = summary[name]
        assert got["latest"] == versions[name], name
        assert sorted(h["version"] for h in got["history"]) == history[name], name
        assert got["rows"] == latest[name], name
        if name in before:
            assert got["before"] == before[name], name
    for name in MAINTAIN:
        assert summary[name]["optimize"]["numFilesRemoved"] > 1, (name, summary[name])
        assert summary[name]["detail"]["numFiles"] < len(DeltaTable(tables[name], version=versions[name]).file_uris()), name
        assert summary[name]["maintained"] == latest[name], name
        operations = [h["operation"] for h in DeltaTable(tables[name]).history(3)]
        assert operations == ["VACUUM END", "VACUUM START", "OPTIMIZE"], (name, operations)
        # and deltalake reads the table delta-spark optimised and vacuumed exactly as before
        assert canonical(read_table(cfg.storage.root, name)) == latest[name], name

    # the job runs on: a later stretch of the outage story lands beside the old rows, nothing lost
    later = Simulation(scenario, seed=2, epoch_ms=DEFAULT_EPOCH_MS + 120_000).run(KafkaSink(cfg), close=True)
    run_job(conf, tmp_path / "job2.log")
    sends = Counter(canonical(read_table(cfg.storage.root, "send_results")))
    old = Counter(latest["send_results"])
    assert not old - sends, "rows of send_results lost after delta-spark's OPTIMIZE and VACUUM"
    assert sum((sends - old).values()) == later.events["send_result"]
    for name in MAINTAIN:
        assert DeltaTable(tables[name]).version() > versions[name] + 3, name  # the job's, after delta-spark's 3
