"""The broker-outage scenario through Kafka, ``faultwatch stream --once`` and Delta.

The simulator records the avoidance windows its fault-tolerant producers actually used when they
chose queues (``Simulation.client_windows()``, kept from the clients' own state, not derived with
the pipeline's rule code). The ``producer_fault_windows_live`` table the streaming job writes from the
same events must hold exactly those windows; producers without fault tolerance must show up as
shadow windows only (``fault_enable`` false), and the bronze ``send_results`` table must show every
retry after a refusal by the dead broker going to another broker.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.faults import from_send_results
from pipeline.simulate import KafkaSink, MemorySink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.doubles.faults_reference import current_view, expected_windows
from tests.integration.processes import start_faultwatch, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DEAD = "broker-b"
# broker-b refuses connections from 30 s to 90 s; 100 s covers the outage, the recovery and the end
# of the last 5.x avoidance windows (~91 s) with ~56k send results.
DURATION_S = 100.0
WATERMARK_DELAY_S = 30.0  # the default
BATCH_EVENTS = 15_000  # about four micro-batches: windows are carried in the state across batches


class Tee:
    """Hands every tick's rows to the Kafka sink and keeps the send results for the checks."""

    def __init__(self, kafka: KafkaSink) -> None:
        self.kafka, self.memory = kafka, MemorySink()

    def write(self, kind: str, rows: list[list[Any]]) -> None:
        if kind == "send_result":
            self.memory.write(kind, rows)
        self.kafka.write(kind, rows)

    def flush(self) -> None:
        self.kafka.flush()

    def close(self) -> None:
        self.kafka.close()


def test_outage_windows_in_delta_equal_the_simulated_clients(kafka, cfg: Config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "simwin").replace(
        stream__max_events_per_batch=BATCH_EVENTS, stream__trigger_interval_s=0.5,
        stream__watermark_delay_s=WATERMARK_DELAY_S,
    )
    sim = Simulation(load_scenario("broker-outage").replace(duration_s=DURATION_S))
    tee = Tee(KafkaSink(cfg))
    sim.run(tee, close=True)  # as fast as possible; the in-flight attempts are drained at the end
    sends = tee.memory.events("send_result")
    assert sim.done and sends

    log = tmp_path / "stream.log"
    conf = write_config(cfg, tmp_path / "fw.toml")
    # Only the combined bronze + faults query: the lag query reads the same topics again and adds
    # nothing to what is checked here (it doubled the job's time on 2 cores).
    proc = start_faultwatch("stream", "--config", str(conf), "--once", "--only", "bronze_faults", log=log)
    assert proc.wait(timeout=600) == 0, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    assert "[bronze_faults] total:" in text, text[-3000:]

    root = cfg.storage.root
    # Every event was accepted. The topics are complete before the job starts, so the batches are
    # fixed by the data: each reads the same share of every partition's backlog, and the earliest
    # send result of each lies 17 s or more after the watermark the batches before it set. (A late
    # event would be missing from the windows, and the comparison below would have to leave it out.)
    assert read_table(root, "quarantine").num_rows == 0
    bronze = read_table(root, "send_results", columns=["event_id", "broker_name", "status", "attempt"])
    assert bronze.num_rows == len(sends)

    view = current_view(read_table(root, "producer_fault_windows_live").to_pylist())
    # Windows still "open" after --once: the watermark only moves with event time, so it ends at the
    # last send result minus the delay, and windows ending after that (the 4.9 clients' 600 s
    # isolation, the 5.x windows of the last 30 s) are never closed. Their end is nonetheless final:
    # the simulator drained every in-flight attempt, the job read every event (no late ones, above),
    # and an open row's end is the avoid-until of its pair's last update, exactly what the client's
    # own state ends its last window with. So open windows are compared too, and the state split
    # is checked against that watermark.
    watermark = max(e.ts_ms for e in sends) - int(WATERMARK_DELAY_S * 1000)
    assert {r["state"] for r in view} == {"open", "closed"}
    assert all((r["state"] == "closed") == (r["end_ms"] <= watermark) for r in view)

    client = {(w.client_id, w.broker_name, w.start_ms, w.end_ms) for w in sim.client_windows()}
    table = {(r["client_id"], r["broker_name"], r["start_ms"], r["end_ms"]) for r in view if r["fault_enable"]}
    assert client and {w[1] for w in client} == {DEAD}
    assert table == client

    fault_tolerant = {p.client_id for p in sim.producers if p.spec.fault_tolerance}
    legacy = {p.client_id for p in sim.producers if p.spec.fault_tolerance and p.spec.client_version.startswith("4.")}
    assert {w[0] for w in client} == fault_tolerant  # every one of them avoided the dead broker
    assert legacy and all(r["state"] == "open" for r in view if r["client_id"] in legacy)

    # Producers without fault tolerance: the table flags them (shadow windows, fault_enable false),
    # by the same rules over their own sends; the simulator keeps no windows for them.
    blind = {p.client_id for p in sim.producers if not p.spec.fault_tolerance}
    shadow = [r for r in view if not r["fault_enable"]]
    assert blind and {r["client_id"] for r in shadow} == blind
    assert {r["broker_name"] for r in shadow} == {DEAD}
    shadow_keys = sorted((r["cluster"], r["producer_group"], r["client_id"], r["broker_name"], r["start_ms"],
                          r["end_ms"]) for r in shadow)
    assert shadow_keys == expected_windows(from_send_results(sends), fault_enable=False)

    # Retries move to other brokers, as the bronze table shows: per client, attempts in send order
    # (the event id is the client id and a sequence number); attempt 0 starts a message.
    attempts: dict[str, list[tuple[str, str, str, int]]] = defaultdict(list)
    for row in bronze.to_pylist():
        client_id, _ = row["event_id"].rsplit("-", 1)
        attempts[client_id].append((row["event_id"], row["broker_name"], row["status"], row["attempt"]))
    moved = 0
    for rows in attempts.values():
        rows.sort()
        messages: list[list[tuple[str, str, str, int]]] = []
        for row in rows:
            if row[3] == 0:
                messages.append([])
            messages[-1].append(row)
        for message in messages:
            for first, second in itertools.pairwise(message):
                assert first[2] == "FAILED" and second[1] != first[1]
                moved += first[1] == DEAD
            assert message[-1][2] == "SEND_OK"
    assert moved > 100
