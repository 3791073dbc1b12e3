"""State hygiene of the fault step: purity, expiry, bounds, quarantine reasons, wake-ups."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import from_send_results, initial_state, is_empty, step
from pipeline.faults.codec import encode_state, state_bytes
from pipeline.faults.frame import take
from schemas.events import SendResult
from tests.doubles.faults_synth import T0, bulk_stream, random_stream

REPO = Path(__file__).resolve().parents[2]
CFG = FaultsConfig()


def send(ts: int, latency: int, client: str = "p1", broker: str = "b1", offset: int = 0, **kw: object) -> SendResult:
    return SendResult(
        event_id=f"{client}-{offset}", ts_ms=ts, cluster="c1", producer_group="PG", client_id=client,
        client_version=str(kw.get("version", "5.3.3")), topic="T", broker_name=broker, queue_id=0, status="SEND_OK",
        latency_ms=latency, error=None, queue_offset=offset, attempt=0, send_latency_fault_enable=True,
    )


def test_the_fault_core_imports_without_spark_kafka_or_airflow() -> None:
    probe = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        BLOCKED = ("pyspark", "kafka", "airflow")
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked import of {name}")
        sys.meta_path.insert(0, Block())
        import pipeline.faults as pkg
        names = [m.name for m in pkgutil.walk_packages(pkg.__path__, "pipeline.faults.")]
        for name in names:
            importlib.import_module(name)
        print(len(names), sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    count, leaked = done.stdout.split(" ", 1)
    assert int(count) >= 10 and leaked.strip() == "[]"


def test_an_idle_producer_is_forgotten_after_the_expiry() -> None:
    slow = send(T0, 5500, offset=1)  # 5.x: >= 5000 ms -> a 10 s window
    state, out = step(initial_state("c1"), from_send_results([slow]), 0, CFG)
    assert [r["end_ms"] for r in out.windows] == [T0 + 10_000]
    expiry = int(CFG.producer_idle_expiry_s * 1000)
    state, _ = step(state, from_send_results([]), T0 + 10_000 + expiry - 1, CFG)
    assert state.pairs["pair"].tolist() == [0]
    state, _ = step(state, from_send_results([]), T0 + 10_000 + expiry, CFG)
    assert state.pairs["pair"].size == 0 and is_empty(state)
    # It comes back as a new pair, and its windows are computed as before.
    state, out = step(state, from_send_results([send(T0 + 2 * expiry, 5500, offset=2)]), T0 + expiry + 20_000, CFG)
    assert [(r["start_ms"], r["end_ms"]) for r in out.windows] == [(T0 + 2 * expiry, T0 + 2 * expiry + 10_000)]


def test_producers_beyond_the_per_broker_limit_are_quarantined_not_dropped() -> None:
    cfg = FaultsConfig(max_producers_per_broker=2)
    events = [send(T0 + i, 5, client=f"p{i}", offset=i) for i in range(4)] + [send(T0 + 9, 5, client="p0", broker="b2", offset=9)]
    state, out = step(initial_state("c1"), from_send_results(events), 0, cfg)
    assert sorted(state.pairs["client_id"].tolist()) == ["p0", "p0", "p1"]
    assert sorted((q["reason"], q["source_offset"]) for q in out.quarantine) == [("state_limit", 2), ("state_limit", 3)]


def test_events_far_ahead_of_the_batch_time_are_quarantined() -> None:
    now = T0 + 1000
    ahead = send(now + int(CFG.max_future_skew_s * 1000) + 1, 5500, offset=1)
    ok = send(now, 5500, client="p2", offset=2)
    _, out = step(initial_state("c1"), from_send_results([ahead, ok]), 0, CFG, now_ms=now)
    assert [q["reason"] for q in out.quarantine] == ["future"]
    assert [r["client_id"] for r in out.windows] == ["p2"]


def test_the_wakeup_is_the_next_thing_the_watermark_would_decide() -> None:
    state, out = step(initial_state("c1"), from_send_results([send(T0 + 1, 5500, offset=1)]), 0, CFG)
    assert out.wakeup_ms == T0 + 5_000  # the first evaluation grid point after the event
    state, out = step(state, from_send_results([]), T0 + 5_000, CFG)
    assert out.wakeup_ms == T0 + 10_000  # the next grid point, just before the window's end
    state, out = step(state, from_send_results([]), T0 + 10_000, CFG)
    assert out.windows == [] and out.wakeup_ms == T0 + 10_001  # the window becomes final
    state, out = step(state, from_send_results([]), T0 + 10_001, CFG)
    assert [r["state"] for r in out.windows] == ["closed"] and out.wakeup_ms == T0 + 15_000


def test_state_stays_bounded_by_the_watermark_not_by_the_stream_length() -> None:
    events = bulk_stream(120_000, brokers=20, producers=200, rate_per_s=1000, sick_broker=None)
    ts = events["ts_ms"]
    state = initial_state("c1")
    sizes, log_rows = [], []
    for lo in range(int(ts.min()), int(ts.max()) + 1, 10_000):
        batch = take(events, (ts >= lo) & (ts < lo + 10_000))
        state, _ = step(state, batch, lo - 30_000, CFG)
        sizes.append(state_bytes(encode_state(state)))
        log_rows.append(state.log["ts"].size)
    # 120 s of events at 1000/s; kept: the watermark delay, the open minute, the trailing windows
    assert max(log_rows[-3:]) < 110_000 and log_rows[-1] < ts.size
    assert state.pairs["pair"].size <= 20 * 200
    assert max(sizes) < 8_000_000


def test_a_batch_of_many_producers_runs_both_paths_consistently(monkeypatch: pytest.MonkeyPatch) -> None:
    """pairs.apply_new moves a quiet pair's head in bulk when its updates can open no window, and
    applies them track by track otherwise: with the bulk path off (every pair through its track),
    batch after batch the rows and the pairs' keys and windows are the same."""
    from pipeline.faults import pairs

    events = from_send_results(random_stream(17, producers=40, brokers=5, events=4000))
    ts = events["ts_ms"]
    applied: list[int] = []  # heads applied track by track, per run
    to_tracks = pairs.rows_to_tracks

    def counted(brokers: list[str], cols: dict, prefix: str, index: np.ndarray) -> list:
        applied[-1] += len(index) if prefix == "h_" else 0
        return to_tracks(brokers, cols, prefix, index)

    monkeypatch.setattr(pairs, "rows_to_tracks", counted)
    runs = []
    for bulk in (True, False):
        monkeypatch.setattr(pairs, "_after", pairs._after if bulk else lambda *a: np.zeros(len(a[-1]), dtype=bool))
        applied.append(0)
        state, rows, watermark = initial_state("c1"), [], 0
        for lo in range(int(ts.min()), int(ts.max()) + 1, 10_000):
            state, out = step(state, take(events, (ts >= lo) & (ts < lo + 10_000)), watermark, CFG, None, lo + 5_000)
            watermark = lo + 5_000
            rows.append([sorted(map(repr, part)) for part in (out.windows, out.episodes, out.health, out.quarantine)])
        assert np.all(np.diff(state.pairs["pair"]) > 0)
        kept = ("pair", "broker", "head_ts", "head_part", "head_off", "last_event_ts", "h_win_start", "b_win_start")
        runs.append((rows, {k: state.pairs[k].tolist() for k in kept}))
    assert runs[0] == runs[1]
    assert any(windows for windows, *_ in runs[0][0])
    assert 0 < applied[0] < applied[1], applied  # both paths ran with the bulk path on


@pytest.mark.parametrize("seed", range(3))
def test_skipping_what_cannot_matter_leaves_every_track_as_applying_it_would(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet track skips the updates of duration 0 before its first one that can open a window
    (pairs._first_hot): batch after batch, the state and the rows equal those of applying all."""
    from pipeline.faults import pairs

    events = from_send_results(random_stream(seed, producers=10, brokers=3, events=4000, span_ms=300_000))
    ts = events["ts_ms"]
    runs, skipped = [], []
    first_hot = pairs._first_hot

    def counted(log: dict[str, np.ndarray], run: np.ndarray) -> int:
        skipped.append(first_hot(log, run))
        return skipped[-1]

    for skipping in (True, False):
        monkeypatch.setattr(pairs, "_first_hot", counted if skipping else lambda log, run: 0)
        state, rows, watermark = initial_state("c1"), [], 0
        for lo in range(int(ts.min()), int(ts.max()) + 1, 20_000):
            state, out = step(state, take(events, (ts >= lo) & (ts < lo + 20_000)), watermark, CFG, None, lo + 20_000 - 5_000)
            watermark = lo + 20_000 - 5_000
            rows.append((out.windows, out.episodes, out.health))
        runs.append((rows, {k: v.tolist() for k, v in state.pairs.items()}))
    assert runs[0] == runs[1]
    assert any(windows for windows, _, _ in runs[0][0]) and sum(k > 0 for k in skipped) > 10
