"""Publishers that race and publishers that die: real processes, real Delta tables, the real local broker.

Two ``faultwatch publish`` processes meet at the claim (a test hook makes both commit on the same
table snapshot), so the conditional commit, not luck, decides who publishes. A publisher killed
with SIGKILL at each point between its steps (a test hook names the point) is re-run; afterwards
Kafka, the file, ``avoidance_recommendations`` and ``publisher_cycles`` tell one story.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_topics

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.publish import cycle_number_for, run_cycle
from pipeline.publish.claim import TAKEOVER_MARGIN_MS
from pipeline.publish.crash import BARRIER_AT_ENV, BARRIER_ENV, ENV
from tests.integration.processes import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, read_topic, write_config, write_inputs

pytestmark = pytest.mark.kafka
FAULTWATCH = str(Path(sys.executable).parent / "faultwatch")


@pytest.fixture
def pcfg(cfg: Config, kafka, request) -> Config:  # type: ignore[no-untyped-def]
    return unique_topics(cfg, kafka, f"race{abs(hash(request.node.name)) % 10**8}")


def start_publisher(conf: str, cycle: int, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [FAULTWATCH, "publish", "--config", conf, "--cycle-id", str(cycle)],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, out


def avoidance_rows(cfg: Config) -> list[tuple[int, str]]:
    rows = read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status"]).to_pylist()
    return sorted((r["cycle_number"], r["status"]) for r in rows if r["step"] == "avoidance")


def history_of(records: list[tuple[str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """The ``avoidance_recommendations`` rows the published lists stand for, written out from them."""
    return sorted((m["cycle_id"], key, e["broker_name"], action, e["avoid_until_ms"], e["expires_ms"], m["decided_ms"])
                  for key, m in records for action, entries in (("avoid", m["avoid"]), ("keep_available", m["keep_available"]))
                  for e in entries)


def history(cfg: Config) -> list[tuple[Any, ...]]:
    return sorted((h["cycle_id"], h["cluster"], h["broker_name"], h["action"], h["avoid_until_ms"], h["expires_ms"],
                   h["decided_ms"]) for h in read_table(cfg.storage.root, "avoidance_recommendations").to_pylist())


def one_story(cfg: Config, cycle: int) -> dict[str, Any]:
    """Kafka, the file, the history and the cycle rows agree on one list for ``cycle``; returns it."""
    records = read_topic(cfg.kafka.bootstrap_servers, cfg.topics.avoidance)
    contents = {json.dumps(m, sort_keys=True) for _, m in records}
    assert len(contents) == 1, f"cycle {cycle}: {len(contents)} different lists on Kafka"
    [(key, message)] = {(k, json.dumps(m, sort_keys=True)) for k, m in records}
    listed = json.loads(message)
    assert (key, listed["cycle_id"], listed["cluster"]) == ("c1", str(cycle), "c1")
    assert json.loads((Path(cfg.storage.publish_dir) / "c1.json").read_bytes()) == listed
    # Written out from the published list itself, not with the publisher's own row builder.
    assert history(cfg) == history_of([(key, listed)])
    published = read_table(cfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status", "decided_ms"])
    assert [r for r in published.to_pylist() if r["status"] == "published"] == [
        {"cycle_number": cycle, "step": "avoidance", "status": "published", "decided_ms": listed["decided_ms"]}]
    return listed


def test_two_publishers_at_once_publish_the_cycle_once(pcfg: Config, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    conf = write_config(str(tmp_path / "fw.toml"), pcfg)
    cycle = cycle_number_for(now, 60.0)
    meet = {BARRIER_ENV: f"{tmp_path / 'meet'}:2"}

    results = sorted(finish(p) for p in [start_publisher(conf, cycle, **meet) for _ in range(2)])

    assert [rc for rc, _ in results] == [0, 4], results[1][1][-3000:]
    assert f"cycle {cycle}: published; avoid c1/b2" in results[0][1]
    assert "another publisher claimed this cycle first" in results[1][1]
    listed = one_story(pcfg, cycle)
    assert len(read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)) == 1
    assert [e["broker_name"] for e in listed["avoid"]] == ["b2"]
    assert avoidance_rows(pcfg) == [(cycle, "claimed"), (cycle, "published"), (cycle, "skipped")]


def test_a_cycle_held_before_its_send_while_a_newer_one_published_sends_nothing(pcfg: Config, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    conf = write_config(str(tmp_path / "fw.toml"), pcfg)
    cycle, hold = cycle_number_for(now, 60.0), tmp_path / "hold"
    held = start_publisher(conf, cycle, **{BARRIER_ENV: f"{hold}:2", BARRIER_AT_ENV: "send"})
    try:
        wait_for(lambda: any(hold.glob("send.*")), 120, "the publisher to claim and reach its send", held)
        # The next cycle comes once the held claim's lease is over (its clock says so): it finishes the
        # held cycle's claimed list, then publishes its own.
        later = int(time.time() * 1000) + int(pcfg.publish.send_timeout_s * 1000) + TAKEOVER_MARGIN_MS + S
        newer = run_cycle(pcfg, cycle_number=cycle + 60 * S, at_ms=later)
        assert newer.status == "published", newer.reason
        (hold / "send.go").touch()  # the held publisher goes on, to its send
        rc, out = finish(held)
    finally:
        held.kill()
    assert rc == 4, out[-3000:]
    assert f"cycle {cycle}: skipped (cycle {cycle} (" in out
    assert f"skipped: superseded: cycle {cycle + 60 * S}, after this one, was claimed while" in out

    records = read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)
    assert [(k, m["cycle_id"]) for k, m in records] == [("c1", str(cycle)), ("c1", str(cycle + 60 * S))]
    assert records[-1][1] == json.loads((Path(pcfg.storage.publish_dir) / "c1.json").read_bytes())
    assert history(pcfg) == history_of(records)
    rows = read_table(pcfg.storage.root, "publisher_cycles",
                      columns=["cycle_number", "step", "status", "decided_ms", "reason"]).to_pylist()
    assert sorted((r["cycle_number"] - cycle, r["status"], r["decided_ms"]) for r in rows if r["step"] == "avoidance") == [
        (0, "claimed", records[0][1]["decided_ms"]), (0, "claimed", records[0][1]["decided_ms"]),
        (0, "published", records[0][1]["decided_ms"]), (0, "skipped", records[0][1]["decided_ms"]),
        (60 * S, "claimed", later), (60 * S, "published", later)]


@pytest.mark.parametrize("point", ["claimed", "sent", "file", "history", "published"])
def test_a_publisher_killed_at_each_point_is_finished_by_a_re_run(pcfg: Config, tmp_path: Path, point: str) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    conf = write_config(str(tmp_path / "fw.toml"), pcfg)
    cycle = cycle_number_for(now, 60.0)

    rc, out = finish(start_publisher(conf, cycle, **{ENV: point}))
    assert rc == -9, out

    # The re-run comes after the dead publisher's lease (its decision time is a different one):
    # it must publish what the dead one claimed, not a new decision of its own.
    later = int(time.time() * 1000) + int(pcfg.publish.send_timeout_s * 1000) + TAKEOVER_MARGIN_MS + S
    again = run_cycle(pcfg, cycle_number=cycle, at_ms=later)

    assert again.status == ("skipped" if point == "published" else "published"), again.reason
    listed = one_story(pcfg, cycle)
    assert listed["decided_ms"] < later
    claims = [s for c, s in avoidance_rows(pcfg) if s == "claimed"]
    assert claims == (["claimed"] if point == "published" else ["claimed", "claimed"])
    # Nothing more on a further run.
    before = read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance)
    assert run_cycle(pcfg, cycle_number=cycle, at_ms=later + S).status == "skipped"
    assert read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.avoidance) == before


@pytest.mark.parametrize("point", ["alerts_state", "alerts_sent"])
def test_alerts_killed_between_state_and_sends_keep_their_start_on_a_re_run(
    pcfg: Config, tmp_path: Path, point: str
) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)  # b2's episode is open: one broker alert fires
    conf = write_config(str(tmp_path / "fw.toml"), pcfg)
    cycle = cycle_number_for(now, 60.0)

    rc, out = finish(start_publisher(conf, cycle, **{ENV: point}))
    assert rc == -9, out
    [saved] = read_table(pcfg.storage.root, "alert_state", columns=["alert_id", "starts_ms", "cycle_ms"]).to_pylist()
    assert saved["alert_id"] == "broker_fault|c1|b2|open" and saved["starts_ms"] == saved["cycle_ms"]

    again = run_cycle(pcfg, cycle_number=cycle, at_ms=saved["starts_ms"] + 20 * S)
    assert again.status == "skipped" and again.alerts == 1  # the list went out; the alerts are finished

    records = [a for _, a in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts)]
    assert {(a["alert_id"], a["status"], a["starts_ms"], a["cycle_id"]) for a in records} == {
        ("broker_fault|c1|b2|open", "firing", saved["starts_ms"], str(cycle))}
    assert len(records) == (1 if point == "alerts_state" else 2)  # a repeat of the same record at most
    rows = read_table(pcfg.storage.root, "publisher_cycles", columns=["cycle_number", "step", "status", "alerts"])
    assert [r for r in rows.to_pylist() if r["step"] == "alerts"] == [
        {"cycle_number": cycle, "step": "alerts", "status": "sent", "alerts": 1}]
