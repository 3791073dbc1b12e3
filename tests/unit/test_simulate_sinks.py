"""Sinks carry the same bytes; the CLI runs a scenario into files; failures are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.cli import main
from pipeline.config import Config
from pipeline.kafka_local import free_port
from pipeline.simulate import JsonLinesSink, KafkaSink, MemorySink, SinkError, run_to_memory
from pipeline.simulate.sinks import KINDS


def test_event_objects_and_rows_give_the_same_bytes(tmp_path: Path) -> None:
    _, source = run_to_memory("more-consumers-than-queues", duration_s=10.0)
    events = [e for kind in KINDS for e in source.events(kind)]
    copy = MemorySink()
    copy.write_events(events)
    with JsonLinesSink(tmp_path) as files:
        files.write_events(events)
    for kind in KINDS:
        assert copy.events(kind) == source.events(kind)
        assert (tmp_path / f"{kind}.jsonl").read_bytes() == source.json_lines(kind)
    assert copy.count() == len(events) > 100


def test_kafka_sink_reports_an_unreachable_cluster() -> None:
    cfg = Config().replace(kafka__bootstrap_servers=f"127.0.0.1:{free_port()}", kafka__connect_timeout_s=1.0)
    with pytest.raises(SinkError, match="no Kafka broker reachable at"):
        KafkaSink(cfg)


def test_kafka_sink_names_an_unknown_compression_before_connecting() -> None:
    cfg = Config().replace(kafka__bootstrap_servers=f"127.0.0.1:{free_port()}", kafka__connect_timeout_s=1.0)
    with pytest.raises(SinkError, match="unknown compression 'lz4'; use one of zstd, gzip, none"):
        KafkaSink(cfg, compression="lz4")


def test_cli_refuses_an_unknown_compression(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--scenario", "steady", "--compression", "lz4"])
    assert exit_info.value.code == 2
    assert "--compression: invalid choice: 'lz4'" in capsys.readouterr().err


def test_cli_simulates_into_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "events"
    rc = main(["simulate", "--scenario", "steady", "--to", "file", "--out", str(out), "--duration", "5s", "--seed", "3"])
    assert rc == 0
    assert "done:" in capsys.readouterr().out
    _, expected = run_to_memory("steady", seed=3, duration_s=5.0)
    for kind in KINDS:
        assert (out / f"{kind}.jsonl").read_bytes() == expected.json_lines(kind)


def test_cli_names_an_unknown_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "stedy", "--to", "file", "--out", str(tmp_path)]) == 2
    assert "unknown scenario 'stedy'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[brokers]]\nname = "b"\n[[faults]]\nbroker = "b"\nkind = "outage"\nstart_s = 1\nmode = "boom"\n')
    assert main(["simulate", "--scenario", str(bad), "--to", "file", "--out", str(tmp_path)]) == 2
    assert "faults[0].mode: 'boom' is not valid" in capsys.readouterr().err


def test_cli_lists_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list"]) == 0
    assert {"demo", "steady", "broker-outage"} <= set(capsys.readouterr().out.split())


def test_another_process_with_another_hash_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    """Determinism must not hang on str hashing (set/dict order) or anything else per-process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    cmd = [sys.executable, "-m", "faultwatch.cli", "simulate", "--scenario", "demo", "--to", "file",
           "--out", str(tmp_path), "--duration", "30s", "--seed", "9"]
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=Path(__file__).resolve().parents[2])
    _, expected = run_to_memory("demo", seed=9, duration_s=30.0)
    for kind in KINDS:
        assert (tmp_path / f"{kind}.jsonl").read_bytes() == expected.json_lines(kind)
