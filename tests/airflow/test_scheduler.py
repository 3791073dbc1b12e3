"""The DAG under a real Airflow scheduler, over tables written by a real pipeline run.

A temporary ``AIRFLOW_HOME`` (SQLite, LocalExecutor), Airflow's own processes (API server, DAG
processor, scheduler), the DAG unpaused with the ``airflow`` CLI and a 10 s schedule
(``FAULTWATCH_AVOIDANCE_SCHEDULE``); the tables come from ``faultwatch simulate`` (broker outage)
through ``faultwatch stream --once``. A scheduled run must publish: a record on the real broker's
``rmq.avoidance``, the JSON file and a ``published`` row whose cycle is the run's time. Every
process started here is stopped at the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import unique_topics
from dag_inputs import read_topic

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DAG_ID = "faultwatch_avoidance"
pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def airflow_env(home: Path, port: int, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    return {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "airflow" / "dags"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": "faultwatch-scheduler-test",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "FAULTWATCH_AVOIDANCE_SCHEDULE": "10",
        "FAULTWATCH_CONFIG": str(config),
        "GX_ANALYTICS_ENABLED": "False",
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    }


class Started:
    """Processes this test started, each in its own session, stopped together at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=REPO, start_new_session=True)
        self.procs[name] = proc
        return proc

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if name.startswith("airflow-") and proc.poll() is not None:
                raise AssertionError(f"{name} exited ({proc.returncode}):\n{self.tail(name)}")

    def stop_all(self, home: Path) -> None:
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # Task processes may have left the groups: they carry this test's AIRFLOW_HOME.
        for pid in _pids_with_env("AIRFLOW_HOME", str(home)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _pids_with_env(key: str, value: str) -> list[int]:
    wanted = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until(predicate, timeout_s: float, what: str, started: Started, logs: tuple[str, ...], state=None):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` with the logs
    (and ``state()``, what the test can see of the outcome so far)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started.check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    tails = "\n".join(f"--- {n}:\n{started.tail(n, 2000)}" for n in logs)
    seen = f"\n--- seen so far: {state()}" if state is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{seen}\n{tails}")


def query(db: Path, sql: str, *args: object) -> list[tuple]:  # type: ignore[type-arg]
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # tables not created yet, or busy
        return []
    finally:
        con.close()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Started(logs)
    try:
        yield procs
    finally:
        procs.stop_all(tmp_path / "airflow")


def run_pipeline(cfg, conf: Path, started: Started) -> None:  # type: ignore[no-untyped-def]
    """Simulated broker outage → Kafka → ``faultwatch stream --once`` → the Delta tables."""
    duration_s = 90
    epoch = int(time.time() * 1000) - duration_s * 1000  # events up to now: fresh input
    sim = started.start("simulate", [str(BIN / "faultwatch"), "simulate", "--config", str(conf),
                                     "--scenario", "broker-outage", "--duration", str(duration_s),
                                     "--epoch", str(epoch)], dict(os.environ))
    assert sim.wait(timeout=300) == 0, started.tail("simulate")
    stream = started.start("stream", [str(BIN / "faultwatch"), "stream", "--config", str(conf), "--once"],
                           dict(os.environ))
    assert stream.wait(timeout=600) == 0, started.tail("stream")


COMPONENTS = ("airflow-scheduler", "airflow-dag-processor", "airflow-api-server")


def start_airflow(conf: Path, home: Path, started: Started) -> Path:
    """Airflow's own processes on ``home`` with the DAG unpaused; returns the metadata database."""
    env = airflow_env(home, free_port(), conf)
    migrate = started.start("airflow-db-migrate", [str(BIN / "airflow"), "db", "migrate"], env)
    assert migrate.wait(timeout=300) == 0, started.tail("airflow-db-migrate")
    del started.procs["airflow-db-migrate"]
    for name in ("api-server", "dag-processor", "scheduler"):
        started.start(f"airflow-{name}", [str(BIN / "airflow"), name], env)
    db = home / "airflow.db"
    wait_until(lambda: query(db, "select is_paused from dag where dag_id = ?", DAG_ID), 180,
               "the DAG processor to register the DAG", started, ("airflow-dag-processor",))
    unpause = subprocess.run([str(BIN / "airflow"), "dags", "unpause", DAG_ID], env=env, capture_output=True,
                             text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert unpause.returncode == 0, unpause.stdout + unpause.stderr
    return db


def test_a_scheduled_run_publishes_over_a_real_pipeline_run(kafka, tmp_path: Path, started: Started) -> None:  # type: ignore[no-untyped-def]
    from pipeline.config import Config
    from pipeline.deltaio import read_table
    from tests.integration.processes import write_config

    cfg = Config().replace(
        storage__root=str(tmp_path / "tables"), storage__checkpoint_root=str(tmp_path / "checkpoints"),
        storage__publish_dir=str(tmp_path / "avoidance"),
    )
    cfg = unique_topics(cfg, kafka, "sched")
    # The input must stay fresh from the pipeline run to the scheduled run, however slow the machine.
    conf = write_config(cfg, tmp_path / "faultwatch.toml", policy={"max_input_age_s": 1800.0})
    run_pipeline(cfg, conf, started)
    assert read_table(cfg.storage.root, "broker_fault_episodes_live").num_rows > 0

    db = start_airflow(conf, tmp_path / "airflow", started)

    def cycles() -> list[dict]:  # type: ignore[type-arg]
        return read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status"]).to_pylist()

    def runs_so_far() -> str:
        return f"publisher_cycles {cycles()}; dag_run {query(db, 'select run_id, state from dag_run')}"

    [row, *_] = wait_until(
        lambda: [r for r in cycles() if (r["step"], r["status"]) == ("avoidance", "published")],
        300, "a scheduled run to publish (a 'published' row)", started, COMPONENTS, runs_so_far)
    runs = wait_until(
        lambda: query(db, "select run_after, run_type, state from dag_run where dag_id = ? and state = 'success'",
                      DAG_ID),
        120, "the publishing run to finish", started, COMPONENTS, runs_so_far)

    # The cycle is a scheduled run's own time (run_after, in ms).
    def ms(stamp: str) -> int:
        from datetime import datetime, timezone

        when = datetime.fromisoformat(stamp)
        return int((when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp() * 1000)

    assert {r[1] for r in runs} == {"scheduled"}
    assert row["cycle_number"] in {ms(r[0]) for r in runs}
    records = [(k, m) for k, m in read_topic(cfg.kafka.bootstrap_servers, cfg.topics.avoidance)
               if m["cycle_id"] == str(row["cycle_number"])]
    [(cluster, message)] = records
    assert cluster == "DefaultCluster" and message["schema"] == "faultwatch.avoidance/1"
    # The content, not just a list: the scenario's outage on broker-b (of 4 brokers) is still open
    # when the run decides, so broker-b, and only it, is avoided; at most half the brokers may be.
    assert (message["brokers_known"], message["max_avoid"], message["capped"]) == (4, 2, False)
    assert [(e["broker_name"], e["reason"].split(":")[0]) for e in message["avoid"]] == [("broker-b", "open_episode")]
    assert message["avoid"][0]["avoid_until_ms"] > message["decided_ms"]
    file = Path(cfg.storage.publish_dir) / "DefaultCluster.json"
    on_disk = json.loads(file.read_bytes())
    assert on_disk["cycle_id"] >= message["cycle_id"] and on_disk["cluster"] == "DefaultCluster"
    if on_disk["cycle_id"] == message["cycle_id"]:
        assert on_disk == message


def test_a_scheduled_run_over_a_corrupt_table_still_alerts(  # type: ignore[no-untyped-def]
    kafka, alertmanager, tmp_path: Path, started: Started
) -> None:
    """An input table that cannot be read fails ``load``; ``alerts`` runs all the same and Alertmanager
    gets the failed cycle as an alert naming the table; ``outcome`` fails the run."""
    from conftest import active_alerts
    from dag_inputs import cut_newest_commit, episode_row, write, write_inputs

    from pipeline.config import Config
    from pipeline.deltaio import read_table
    from tests.integration.processes import write_config

    url, _ = alertmanager
    cfg = unique_topics(Config().replace(
        storage__root=str(tmp_path / "tables"), storage__checkpoint_root=str(tmp_path / "checkpoints"),
        storage__publish_dir=str(tmp_path / "avoidance"),
    ), kafka, "schedbad")
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now)
    write(cfg.storage.root, "broker_fault_episodes_live", [episode_row("b2", now - 90_000, 1, now)])
    cut_newest_commit(cfg.storage.root, "broker_fault_episodes_live")
    conf = write_config(cfg, tmp_path / "faultwatch.toml", alerts={"alertmanager_urls": [url], "timeout_s": 5.0})
    db = start_airflow(conf, tmp_path / "airflow", started)

    def runs() -> list[tuple]:  # type: ignore[type-arg]
        return query(db, "select run_id, state from dag_run where dag_id = ? and state in ('success', 'failed')",
                     DAG_ID)

    def tasks(run_id: str) -> dict[str, str]:
        return dict(query(db, "select task_id, state from task_instance where run_id = ?", run_id))

    def seen() -> str:
        return f"dag_run {runs()}; Alertmanager {sorted(active_alerts(url))}"

    [(run_id, state), *_] = wait_until(runs, 400, "a scheduled run to finish", started, COMPONENTS, seen)
    assert (state, tasks(run_id)) == ("failed", {
        "load": "failed", "recommend": "upstream_failed", "validate": "upstream_failed",
        "publish": "upstream_failed", "alerts": "success", "outcome": "failed"})
    table = f"table broker_fault_episodes_live ({Path(cfg.storage.root).resolve() / 'broker_fault_episodes_live'})"
    [failed] = [a for a in active_alerts(url).values() if a["labels"]["alertname"] == "FaultwatchAvoidanceFailed"]
    assert {k: v for k, v in failed["labels"].items() if v} == {
        "alertname": "FaultwatchAvoidanceFailed", "publisher": cfg.publish.app_id, "severity": "critical"}
    assert table in failed["annotations"]["summary"], failed
    rows = read_table(cfg.storage.root, "publisher_cycles", columns=["step", "status", "reason"]).to_pylist()
    # One failed row per attempt of the load task (it is retried twice), each naming the table.
    assert {(r["step"], r["status"], r["reason"].split(": ")[0]) for r in rows if r["step"] == "avoidance"} == {
        ("avoidance", "failed", table)}
    assert read_topic(cfg.kafka.bootstrap_servers, cfg.topics.avoidance) == []
