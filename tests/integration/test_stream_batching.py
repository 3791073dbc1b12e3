"""A backlog's fault tables do not depend on how it is cut into micro-batches, nor on the tasks.

The simulator's broker outage goes into Kafka first; then ``faultwatch stream --once`` runs twice
over it into two storage roots: small micro-batches on four shuffle partitions, and large ones on
one. Nothing may be quarantined as late (the settle point follows the slowest partition); every
bronze and silver table must be equal as a whole: ``producer_fault_windows`` and
``broker_fault_episodes`` (the final rows), ``broker_health`` and the lag tables (``queue_lag``,
``group_status``: judged on the event-time grid once settled). The live changelogs
(``producer_fault_windows_live``, ``broker_fault_episodes_live``) write a row per change per
micro-batch: a window extended in three micro-batches has three open rows where one large batch
writes one, and a run with more micro-batches may write the suspicion an episode started as before
the watermark decided it. They are equal in their current view (latest revision per id) without
``revision`` and ``updated_ms``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.simulate import KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.doubles.faults_reference import current_view
from tests.integration.processes import start_faultwatch, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

WHOLE = ("send_results", "consumer_progress", "group_membership", "producer_fault_windows", "broker_fault_episodes",
         "broker_health", "queue_lag", "group_status")


def run(cfg: Config, tmp: Path, name: str, batch: int, partitions: int, **sections: dict[str, object]) -> Config:
    mine = cfg.replace(storage__root=str(tmp / name / "tables"), storage__checkpoint_root=str(tmp / name / "ck"),
                       stream__max_events_per_batch=batch, spark__shuffle_partitions=partitions)
    conf = write_config(mine, tmp / f"{name}.toml", **sections)
    log = tmp / f"{name}.log"
    proc = start_faultwatch("stream", "--config", str(conf), "--once", log=log)
    assert proc.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]
    return mine


def rows(cfg: Config, table: str) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in read_table(cfg.storage.root, table).to_pylist())


def test_micro_batches_and_shuffle_partitions_change_no_fault_table(kafka: Any, cfg: Config, tmp_path: Path) -> None:
    cfg = unique_topics(cfg, kafka, "batching")
    sim = Simulation(load_scenario("broker-outage").replace(duration_s=180.0))  # the episode closes
    sim.run(KafkaSink(cfg), close=True)
    # the small batches with table upkeep between them: a compaction or a vacuum after each batch
    small = run(cfg, tmp_path, "small", batch=6_000, partitions=4,
                maintenance={"compact_every_batches": 2, "vacuum_interval_s": 0.001})
    large = run(cfg, tmp_path, "large", batch=400_000, partitions=1)

    for c in (small, large):
        reasons = {r["reason"] for r in read_table(c.storage.root, "quarantine").to_pylist()}
        assert "late" not in reasons, reasons
    assert read_table(small.storage.root, "send_results").num_rows > 5 * 6_000  # several micro-batches
    history = {h["operation"] for h in DeltaTable(str(Path(small.storage.root) / "send_results")).history()}
    assert "OPTIMIZE" in history, history
    assert "maintenance: vacuum " in (tmp_path / "small.log").read_text()  # (no commit when nothing was deleted)
    for table in WHOLE:
        assert rows(small, table) == rows(large, table), table
    for table in ("producer_fault_windows", "broker_fault_episodes", "queue_lag"):
        assert read_table(small.storage.root, table).num_rows > 0, table

    def view(c: Config, table: str, key: str) -> list[str]:
        latest = current_view(read_table(c.storage.root, table).to_pylist(), key)
        drop = ("revision", "updated_ms")
        return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in latest)

    for table, key in (("producer_fault_windows_live", "window_id"), ("broker_fault_episodes_live", "episode_id")):
        assert view(small, table, key) == view(large, table, key), table
    assert read_table(small.storage.root, "producer_fault_windows_live").num_rows > len(rows(small, "producer_fault_windows"))
