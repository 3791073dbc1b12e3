"""The Airflow DAG: parses cleanly and lightly, and a whole ``dag.test()`` run publishes the policy's
decision from real Delta tables to the real local broker (or, on invalid input, publishes nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "airflow" / "dags"
# Airflow reads its configuration when first imported: point it at a private home first.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="faultwatch-airflow-"))
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

from conftest import unique_topics
from dag_inputs import read_topic, write_config, write_inputs

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]
DAG_ID = "faultwatch_avoidance"
HEAVY = ("pyspark", "kafka", "deltalake", "great_expectations", "pipeline.publish", "pipeline.policy")


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    db.resetdb()
    return DagBag(dag_folder=str(DAGS))  # examples are off through AIRFLOW__CORE__LOAD_EXAMPLES


def test_import_airflow_is_the_real_package_not_the_project_folder() -> None:
    import airflow

    assert not (REPO / "airflow" / "__init__.py").exists()
    assert Path(airflow.__file__).resolve().parent != (REPO / "airflow").resolve()
    assert "site-packages" in airflow.__file__


def test_dag_parses_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    dag = dagbag.get_dag(DAG_ID)
    assert sorted(dagbag.dag_ids) == [DAG_ID]
    assert (dag.catchup, dag.max_active_runs, dag.schedule) == (False, 1, "* * * * *")
    assert {t: sorted(dag.get_task(t).downstream_task_ids) for t in dag.task_ids} == {
        "load": ["publish", "recommend", "validate"],
        "recommend": ["publish", "validate"],
        "validate": ["publish"],
        "publish": ["alerts", "outcome"],
        "alerts": ["outcome"],
        "outcome": [],
    }
    # The alerts run whatever happened before them; the run fails when an avoidance task failed.
    assert (dag.get_task("alerts").trigger_rule, dag.get_task("outcome").trigger_rule) == ("all_done", "one_failed")
    load = dag.get_task("load")
    assert (load.retries, load.retry_exponential_backoff) == (2, True)
    assert dag.params["config"] == str(REPO / "conf" / "faultwatch.toml")


def test_parsing_imports_nothing_heavy() -> None:
    """Parsing makes no connection and loads no Kafka, Delta, GX, Spark or pipeline code."""
    code = (
        "import sys, runpy\n"
        f"runpy.run_path({str(DAGS / 'faultwatch_avoidance.py')!r})\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}]\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _setup(tmp_path: Path, kafka, tag: str, bad: bool):  # type: ignore[no-untyped-def]
    from pipeline.config import Config

    cfg = Config().replace(
        storage__root=str(tmp_path / "tables"), storage__publish_dir=str(tmp_path / "avoidance"),
        storage__checkpoint_root=str(tmp_path / "ckpt"),
    )
    cfg = unique_topics(cfg, kafka, tag)
    path = write_config(str(tmp_path / "faultwatch.toml"), cfg)
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now, bad_rate_broker="b3" if bad else None)
    return cfg, path, now


def _states(dr) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=session)}


def test_dag_run_publishes_what_the_policy_decided(dagbag, tmp_path: Path, kafka) -> None:  # type: ignore[no-untyped-def]
    from pipeline.config import load_config
    from pipeline.deltaio import read_table

    cfg, path, now = _setup(tmp_path, kafka, "dagok", bad=False)
    assert load_config(path) == cfg
    cycle = now // 60_000
    dr = dagbag.get_dag(DAG_ID).test(run_conf={"config": path, "cycle": cycle})
    assert str(dr.state) == "success", _states(dr)

    published = read_topic(kafka.bootstrap, cfg.topics.avoidance)
    [(key, message)] = published
    # Written out, not derived with the publisher's functions: b2's episode opened 90 s before the
    # inputs and is open, so b2 is avoided for 100 s from the decision (the DAG's own time), with b2's
    # health minute as evidence and no producer windows; 4 brokers known, at most half avoided; the
    # list expires after policy.expiry_s (180 s).
    decided = message["decided_ms"]
    assert now <= decided <= int(time.time() * 1000)
    episode = f"c1|b2|{now - 90_000}"
    assert (key, message) == ("c1", {
        "schema": "faultwatch.avoidance/1", "cluster": "c1", "cycle_id": str(cycle), "policy_version": "1",
        "decided_ms": decided, "expires_ms": decided + 180_000, "brokers_known": 4, "max_avoid": 2, "capped": False,
        "avoid": [{"broker_name": "b2", "avoid_until_ms": decided + 100_000, "expires_ms": decided + 180_000,
                   "reason": "open_episode: quorum", "episode_id": episode, "multiplier": 1,
                   "evidence": {"producers_avoiding": 0, "failure_rate": 0.0, "p99_latency_ms": 12.0}}],
        "keep_available": [],
    })
    history = read_table(cfg.storage.root, "avoidance_recommendations")
    assert history.column_names == [
        "cycle_id", "cluster", "broker_name", "action", "avoid_until_ms", "expires_ms", "reason", "episode_id",
        "producers_avoiding", "failure_rate", "p99_latency_ms", "multiplier", "policy_version", "decided_ms"]
    assert [tuple(r.values()) for r in history.to_pylist()] == [
        (str(cycle), "c1", "b2", "avoid", decided + 100_000, decided + 180_000, "open_episode: quorum", episode,
         0, 0.0, 12.0, 1, "1", decided)]
    assert _states(dr) == {**dict.fromkeys(["load", "recommend", "validate", "publish", "alerts"], "success"),
                           "outcome": "skipped"}


def test_dag_run_on_invalid_input_fails_and_publishes_nothing_new(dagbag, tmp_path: Path, kafka) -> None:  # type: ignore[no-untyped-def]
    from pipeline.deltaio import read_table
    from pipeline.publish import run_cycle

    cfg, path, now = _setup(tmp_path, kafka, "dagbad", bad=False)
    cycle = now // 60_000
    assert run_cycle(cfg, cycle_number=cycle, at_ms=now).status == "published"  # the last good list
    file = Path(cfg.storage.publish_dir) / "c1.json"
    good = file.read_bytes()
    write_inputs(cfg.storage.root, now + 1000, bad_rate_broker="b3")  # an impossible failure rate arrives

    dr = dagbag.get_dag(DAG_ID).test(run_conf={"config": path, "cycle": cycle + 1})

    assert str(dr.state) == "failed"
    states = _states(dr)
    assert (states["validate"], states["publish"], states["alerts"], states["outcome"]) == (
        "failed", "upstream_failed", "success", "failed")
    assert [m["cycle_id"] for _, m in read_topic(kafka.bootstrap, cfg.topics.avoidance)] == [str(cycle)]
    assert file.read_bytes() == good
    # (The open episode on b2 also fired its broker alert, once, in the first cycle.)
    others = [a for _, a in read_topic(kafka.bootstrap, cfg.topics.alerts) if a["kind"] != "broker_fault"]
    # The alerts task runs after the refusal, whatever happened before it: the refusal fires in this run.
    assert [(a["alert_id"], a["status"], a["cycle_id"]) for a in others if a["kind"] == "avoidance_refused"] == [
        ("avoidance_refused|faultwatch-publisher", "firing", str(cycle + 1))]
    [alert] = [a for a in others if a["kind"] != "avoidance_refused"]
    assert (alert["kind"], alert["cycle_id"], alert["details"]["failed_checks"]) == (
        "avoidance_validation_failed",
        str(cycle + 1),
        ["avoidance_health:expect_column_values_to_be_between(failure_rate) (1 unexpected)"],
    )
    cycles = read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status"])
    assert sorted(r["cycle_number"] - cycle for r in cycles.to_pylist() if r["status"] == "rejected") == [1]
    history = read_table(cfg.storage.root, "avoidance_recommendations", columns=["cycle_id"])
    assert set(history.column("cycle_id").to_pylist()) == {str(cycle)}


def test_dag_run_of_a_superseded_cycle_ends_skipped_with_its_reason(dagbag, tmp_path: Path, kafka) -> None:  # type: ignore[no-untyped-def]
    from pipeline.deltaio import read_table
    from pipeline.publish import run_cycle

    cfg, path, now = _setup(tmp_path, kafka, "dagskip", bad=False)
    cycle = now // 60_000 * 60_000
    assert run_cycle(cfg, cycle_number=cycle, at_ms=now).status == "published"

    dr = dagbag.get_dag(DAG_ID).test(run_conf={"config": path, "cycle": cycle - 60_000})

    assert _states(dr) == dict.fromkeys(["load", "recommend", "validate", "publish", "alerts", "outcome"], "skipped")
    rows = read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status", "reason"])
    [skipped] = [r for r in rows.to_pylist() if r["status"] == "skipped"]
    assert (skipped["cycle_number"], skipped["step"]) == (cycle - 60_000, "avoidance")
    assert "superseded" in skipped["reason"] and f"cycle {cycle} (" in skipped["reason"]
    assert [m["cycle_id"] for _, m in read_topic(kafka.bootstrap, cfg.topics.avoidance)] == [str(cycle)]
