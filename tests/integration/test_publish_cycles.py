"""Cycle identity and cycles that do nothing: real Delta tables, the real local broker.

A cycle is its logical time in ms, so publishers with different intervals (or an interval that
changes) over the same tables keep publishing; a cycle that does nothing says why (a ``skipped``
row, exit code 4); a refused cycle always records its refusal and alert, once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import unique_topics

from faultwatch.cli import main
from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.publish import cycle_number_for, run_cycle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, health_row, read_topic, write, write_config, write_inputs

pytestmark = pytest.mark.kafka
COLUMNS = ["cycle_number", "step", "status", "reason", "alerts"]


@pytest.fixture
def pcfg(cfg: Config, kafka, request) -> Config:  # type: ignore[no-untyped-def]
    return unique_topics(cfg, kafka, f"cyc{abs(hash(request.node.name)) % 10**8}")


def avoidance_rows(cfg: Config) -> list[dict]:  # type: ignore[type-arg]
    rows = read_table(cfg.storage.root, "publisher_cycles", columns=COLUMNS).to_pylist()
    return sorted((r for r in rows if r["step"] == "avoidance"), key=lambda r: (r["cycle_number"], r["status"]))


def published_cycles(cfg: Config) -> list[str]:
    return [m["cycle_id"] for _, m in read_topic(cfg.kafka.bootstrap_servers, cfg.topics.avoidance)]


HOUR = 3600 * S


@pytest.mark.parametrize(
    ("offset", "last"),
    [(100 * S, "published"),  # the hour cycle (next hour's start) is after the 10 s cycle: it publishes
     (HOUR - 10 * S, "skipped")],  # 70 s later is already past the next hour: the hour cycle is older
)
def test_interval_changes_in_both_directions_keep_publishing(pcfg: Config, offset: int, last: str) -> None:
    # The clock is injected (every run gets its time), so both outcomes are tested whatever the hour.
    now = int(time.time() * 1000) // HOUR * HOUR + offset
    write_inputs(pcfg.storage.root, now)
    runs = [(10.0, now), (60.0, now + 60 * S), (10.0, now + 70 * S), (3600.0, now + HOUR)]
    for interval, at in runs[:3]:
        write(pcfg.storage.root, "broker_health", [health_row("b1", at)])  # fresh input each cycle
        cfg = pcfg.replace(publish__interval_s=interval)
        assert run_cycle(cfg, at_ms=at).status == "published", (interval, at)
    # An hour-long interval aligns its cycle to the hour: that may be at or before the cycle just
    # published, and then it must say so rather than publish an older list.
    interval, at = runs[3]
    write(pcfg.storage.root, "broker_health", [health_row("b1", at)])
    report = run_cycle(pcfg.replace(publish__interval_s=interval), at_ms=at)
    # Written out: 10 s, 60 s and 10 s alignments of the three times, then the hour's start.
    base = now - offset
    expected = [str(base + offset // (10 * S) * 10 * S), str(base + (offset + 60 * S) // (60 * S) * 60 * S),
                str(base + (offset + 70 * S) // (10 * S) * 10 * S)]
    assert report.status == last
    if last == "published":
        expected.append(str(base + HOUR))
    else:
        assert report.reason is not None and "superseded" in report.reason
    assert published_cycles(pcfg) == expected


def test_a_superseded_cycle_is_skipped_with_its_reason_once(pcfg: Config) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    cycle = cycle_number_for(now, 60.0)
    assert run_cycle(pcfg, cycle_number=cycle, at_ms=now).status == "published"

    late = run_cycle(pcfg, cycle_number=cycle - 60 * S, at_ms=now + 2 * S)  # e.g. a late retry of the previous run
    again = run_cycle(pcfg, cycle_number=cycle - 60 * S, at_ms=now + 3 * S)
    same = run_cycle(pcfg, cycle_number=cycle, at_ms=now + 4 * S)  # a re-run of the published cycle

    assert (late.status, again.status, same.status) == ("skipped", "skipped", "skipped")
    assert late.reason is not None and f"cycle {cycle} (" in late.reason and "superseded" in late.reason
    assert same.reason is not None and "already published" in same.reason
    assert [(r["cycle_number"] - cycle, r["status"], r["reason"]) for r in avoidance_rows(pcfg)] == [
        (-60 * S, "skipped", late.reason), (0, "claimed", None), (0, "published", None)]
    assert published_cycles(pcfg) == [str(cycle)]


def test_a_refused_cycle_records_its_row_and_alert_once_and_blocks_no_later_cycle(pcfg: Config) -> None:
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    cycle = cycle_number_for(now, 60.0)
    assert run_cycle(pcfg, cycle_number=cycle - 60 * S, at_ms=now).status == "published"
    write(pcfg.storage.root, "broker_health", [health_row("b3", now + S, failure_rate=1.7)])

    first = run_cycle(pcfg, cycle_number=cycle, at_ms=now + 2 * S)
    retry = run_cycle(pcfg, cycle_number=cycle, at_ms=now + 3 * S)  # e.g. the task cleared and run again
    write(pcfg.storage.root, "broker_health", [health_row("b3", now + 4 * S)])  # the bad row is superseded
    later = run_cycle(pcfg, cycle_number=cycle + 60 * S, at_ms=now + 5 * S)

    assert (first.status, retry.status, later.status) == ("rejected", "rejected", "published")
    assert first.reason is not None and "failure_rate" in first.reason
    assert [(r["cycle_number"] - cycle, r["status"], r["alerts"]) for r in avoidance_rows(pcfg)] == [
        (-60 * S, "claimed", 0), (-60 * S, "published", 0), (0, "rejected", 1), (60 * S, "claimed", 0),
        (60 * S, "published", 0)]
    alerts = [a for _, a in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts)
              if a["kind"] == "avoidance_validation_failed"]
    assert [a["alert_id"] for a in alerts] == [f"avoidance_gate|{cycle}"]
    assert published_cycles(pcfg) == [str(cycle - 60 * S), str(cycle + 60 * S)]
    # The refusal as an alert with a lifecycle: firing with the refused cycle, resolved by the next publication.
    refused = [(a["status"], a["cycle_id"]) for _, a in read_topic(pcfg.kafka.bootstrap_servers, pcfg.topics.alerts)
               if a["kind"] == "avoidance_refused"]
    assert refused == [("firing", str(cycle)), ("resolved", str(cycle + 60 * S))]


def test_faultwatch_publish_exit_codes_and_printed_reason(pcfg: Config, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time() * 1000)
    write_inputs(pcfg.storage.root, now)
    conf = write_config(str(tmp_path / "fw.toml"), pcfg)
    cycle = cycle_number_for(now, 60.0)

    assert main(["publish", "--config", conf, "--cycle-id", str(cycle)]) == 0
    assert f"cycle {cycle}: published; avoid c1/b2" in capsys.readouterr().out
    assert main(["publish", "--config", conf, "--cycle-id", str(cycle - 60 * S)]) == 4
    out = capsys.readouterr().out
    assert f"cycle {cycle - 60 * S}: skipped (cycle {cycle - 60 * S} (" in out and "superseded" in out
    write(pcfg.storage.root, "broker_health", [health_row("b3", now + S, failure_rate=1.7)])
    assert main(["publish", "--config", conf, "--cycle-id", str(cycle + 60 * S)]) == 3
    assert f"cycle {cycle + 60 * S}: rejected" in capsys.readouterr().out
