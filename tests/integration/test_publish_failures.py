"""A publisher facing a refused or hung broker, a read-only folder, a crashed write: bounded, recorded, coded.

Real sockets stand in for broken brokers: a port nobody listens on (refused) and a listening socket
that never answers (hung: the handshake completes in the kernel, no reply ever comes).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topics

from faultwatch.cli import main
from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.kafka_local import free_port
from pipeline.publish import cycle_number_for, run_cycle
from pipeline.publish.sinks import send_records

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, cut_newest_commit, episode_row, read_topic, write, write_config, write_inputs

pytestmark = pytest.mark.kafka
TIMEOUT_S = 2.0
CLOSE_MARGIN_S = 1.5  # what closing the client may take beyond publish.send_timeout_s


@pytest.fixture
def hung() -> Iterator[str]:
    """A listening socket that never accepts nor answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def refused() -> str:
    return f"127.0.0.1:{free_port()}"


def kafka_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "kafka" in t.name.lower() and t.is_alive()]


@pytest.mark.parametrize("kind", ["refused", "hung"])
def test_a_send_to_a_dead_broker_ends_within_the_timeout_and_leaves_no_sender(
    cfg: Config, hung: str, kind: str
) -> None:
    broker = refused() if kind == "refused" else hung
    c = cfg.replace(kafka__bootstrap_servers=broker, publish__send_timeout_s=TIMEOUT_S)
    before = set(kafka_threads())
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - kafka-python's error type differs per failure
        send_records(c, "t", [("c1", b"{}")])
    took = time.monotonic() - started
    assert took < TIMEOUT_S + CLOSE_MARGIN_S, f"{kind}: {took:.1f} s"
    # Nothing is left that could still send once the publisher gave up: the client's threads end.
    deadline = time.monotonic() + 10
    while set(kafka_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(kafka_threads()) - before


def test_a_cycle_on_a_refused_broker_fails_with_a_row_a_code_and_an_alert_state(
    cfg: Config, kafka, tmp_path: Path, capsys  # type: ignore[no-untyped-def]
) -> None:
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now)
    dead = unique_topics(cfg, kafka, "fail").replace(kafka__bootstrap_servers=refused())
    conf = write_config(str(tmp_path / "fw.toml"), dead)
    with open(conf, "a", encoding="utf-8") as fh:
        fh.write(f"[publish]\nsend_timeout_s = {TIMEOUT_S}\n")
    cycle = cycle_number_for(now, 60.0)

    assert main(["publish", "--config", conf, "--cycle-id", str(cycle)]) == 5
    assert f"cycle {cycle}: failed (Kafka {dead.kafka.bootstrap_servers} topic {dead.topics.avoidance}:" in (
        capsys.readouterr().out)
    rows = read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status", "reason"])
    got = sorted((r["step"], r["status"], (r["reason"] or "").split(": ")[0]) for r in rows.to_pylist())
    assert got == [("alerts", "failed", f"Kafka {dead.kafka.bootstrap_servers} topic {dead.topics.alerts}"),
                   ("avoidance", "claimed", ""),
                   ("avoidance", "failed", f"Kafka {dead.kafka.bootstrap_servers} topic {dead.topics.avoidance}")]
    assert not (Path(cfg.storage.publish_dir) / "c1.json").exists()  # no file for a list Kafka never got
    # The alerts still ran: the broker alert fires, and so does the failed cycle itself.
    state = read_table(cfg.storage.root, "alert_state", columns=["alert_id", "status"]).to_pylist()
    assert sorted(state, key=lambda a: a["alert_id"]) == [
        {"alert_id": "avoidance_failed|faultwatch-publisher", "status": "firing"},
        {"alert_id": "broker_fault|c1|b2|open", "status": "firing"}]

    # Kafka is back: the retry of the same cycle publishes the list it claimed, once.
    live = unique_topics(cfg, kafka, "fail")
    again = run_cycle(live, cycle_number=cycle, at_ms=now + 1000)
    assert again.status == "published"
    assert [m["cycle_id"] for _, m in read_topic(kafka.bootstrap, live.topics.avoidance)] == [str(cycle)]


def test_an_unwritable_publish_folder_fails_the_cycle_naming_the_file(cfg: Config, kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the publish folder's parent is a file: no user, root included, can write there
    c = unique_topics(cfg, kafka, "rofs").replace(storage__publish_dir=str(blocker / "avoidance"))
    report = run_cycle(c, cycle_number=cycle_number_for(now, 60.0), at_ms=now)
    assert report.status == "failed" and report.reason is not None
    assert report.reason.startswith(f"file {blocker}"), report.reason
    rows = read_table(c.storage.root, "publisher_cycles", columns=["step", "status", "reason"]).to_pylist()
    assert [r["reason"] for r in rows if r["status"] == "failed"] == [report.reason]
    # The alerts ran all the same: the failed cycle is an alert, beside the open episode's.
    state = read_table(c.storage.root, "alert_state", columns=["alert_id", "status", "summary"]).to_pylist()
    assert sorted((a["alert_id"], a["status"]) for a in state) == [
        ("avoidance_failed|faultwatch-publisher", "firing"), ("broker_fault|c1|b2|open", "firing")]
    assert report.reason in next(a["summary"] for a in state if a["alert_id"].startswith("avoidance_failed"))


def test_the_next_cycle_removes_temp_files_a_killed_write_left(cfg: Config, kafka) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now)
    c = unique_topics(cfg, kafka, "tmpf")
    folder = Path(c.storage.publish_dir)
    folder.mkdir(parents=True)
    left = folder / ".c1.json.abc123.tmp"
    left.write_bytes(b'{"half": ')
    assert run_cycle(c, cycle_number=cycle_number_for(now, 60.0), at_ms=now).status == "published"
    assert sorted(p.name for p in folder.iterdir()) == ["c1.json"]


def _one_cycle_published(cfg: Config, kafka: Any, prefix: str) -> tuple[Config, int, int]:
    """The dag inputs written and one cycle published over them: (config, now in ms, cycle number)."""
    now = int(time.time() * 1000)
    write_inputs(cfg.storage.root, now)
    c = unique_topics(cfg, kafka, prefix)
    cycle = cycle_number_for(now, 60.0)
    assert run_cycle(c, cycle_number=cycle, at_ms=now).status == "published"
    return c, now, cycle


def test_a_corrupt_cycle_log_is_named_and_the_documented_recovery_publishes_again(  # type: ignore[no-untyped-def]
    cfg: Config, kafka
) -> None:
    c, now, cycle = _one_cycle_published(cfg, kafka, "corrupt")
    cut_newest_commit(c.storage.root, "publisher_cycles")

    broken = run_cycle(c, cycle_number=cycle + 60_000, at_ms=now + 60_000)
    assert broken.status == "failed" and broken.reason is not None
    assert f"table publisher_cycles ({Path(c.storage.root).resolve() / 'publisher_cycles'})" in broken.reason

    # docs/airflow.md, "A corrupt publisher_cycles": move the table aside; the next cycle starts a new log.
    table = Path(c.storage.root) / "publisher_cycles"
    table.rename(table.with_name("publisher_cycles.corrupt-1"))
    again = run_cycle(c, cycle_number=cycle + 120_000, at_ms=now + 70_000)
    assert again.status == "published"
    assert [m["cycle_id"] for _, m in read_topic(kafka.bootstrap, c.topics.avoidance)] == [
        str(cycle), str(cycle + 120_000)]


def test_a_corrupt_input_table_fails_the_cycle_and_the_alerts_hold_the_last_broker_state(  # type: ignore[no-untyped-def]
    cfg: Config, kafka
) -> None:
    c, now, cycle = _one_cycle_published(cfg, kafka, "badin")  # b2's episode alert fires
    write(c.storage.root, "broker_fault_episodes_live", [episode_row("b2", now - 90 * S, 1, now)])
    cut_newest_commit(c.storage.root, "broker_fault_episodes_live")

    broken = run_cycle(c, cycle_number=cycle + 60 * S, at_ms=now + 60 * S)

    assert broken.status == "failed" and broken.reason is not None
    table = Path(c.storage.root, "broker_fault_episodes_live").resolve()
    assert broken.reason.startswith(f"table broker_fault_episodes_live ({table}): "), broken.reason
    # The alerts ran: the failure fires; the broker alert is neither resolved nor restarted on no evidence.
    state = read_table(c.storage.root, "alert_state", columns=["cycle_number", "alert_id", "status", "starts_ms"])
    assert sorted((a["alert_id"], a["status"], a["starts_ms"]) for a in state.to_pylist()
                  if a["cycle_number"] == cycle + 60 * S) == [
        ("avoidance_failed|faultwatch-publisher", "firing", now + 60 * S), ("broker_fault|c1|b2|open", "firing", now)]
    assert [m["cycle_id"] for _, m in read_topic(kafka.bootstrap, c.topics.avoidance)] == [str(cycle)]
