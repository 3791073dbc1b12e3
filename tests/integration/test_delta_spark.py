"""The job's tables are standard Delta for delta-spark: Spark users read, time-travel and maintain them.

A short real job (``faultwatch stream --once`` over the simulator's broker outage) writes every table
of the default job. Then delta-spark (pyspark 4.2, in its own environment: ``tests/deltaspark``)
reads each table, lists ``DESCRIBE HISTORY`` and reads the version before the latest (``versionAsOf``);
on the two tables the job wrote in several files it runs ``OPTIMIZE`` and ``VACUUM ... RETAIN 0 HOURS``
and reads it again (each such step is dozens of small Spark jobs). Every read must
equal, row for row, what ``deltalake`` reads of the same version. Afterwards ``deltalake`` still reads each table
as it was, and the job runs again on the maintained tables: the new events land next to the old rows.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.simulate import DEFAULT_EPOCH_MS, KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.deltaspark import run_check
from tests.integration.processes import start_faultwatch, write_config

# two job runs and a Spark 4.2 session's ~60 small jobs: ~15 min on a machine loaded many times over
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


def spark_rows(folder: Path) -> list[str]:
    """What delta-spark read (it wrote it as Parquet there)."""
    return canonical(pq.read_table(folder))


def test_delta_spark_reads_time_travels_and_maintains_the_jobs_tables(kafka: Any, cfg: Config, tmp_path: Path) -> None:
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

    out = tmp_path / "delta-spark"
    check = run_check(tables, MAINTAIN, out)
    assert check.returncode == 0, check.stderr[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spark"].startswith("4.2"), summary["spark"]
    for name in tables:
        got = summary[name]
        assert got["latest"] == versions[name], name
        assert sorted(h["version"] for h in got["history"]) == history[name], name
        assert spark_rows(out / name / "latest") == latest[name], name
        if name in before:
            assert spark_rows(out / name / "before") == before[name], name
    for name in MAINTAIN:
        assert summary[name]["optimize"]["numFilesRemoved"] > 1, (name, summary[name])
        assert summary[name]["detail"]["numFiles"] < len(DeltaTable(tables[name], version=versions[name]).file_uris()), name
        assert spark_rows(out / name / "maintained") == latest[name], name
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
