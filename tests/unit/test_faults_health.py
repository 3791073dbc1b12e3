"""``broker_health``: per broker and final minute, equal to a plain pandas computation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.config import FaultsConfig
from pipeline.faults import error_class, from_send_results, initial_state, step
from pipeline.faults.frame import take
from pipeline.faults.health import final_minute_end, quantiles_sorted
from tests.doubles.faults_reference import expected_windows, run_steps
from tests.doubles.faults_synth import T0, random_stream

CFG = FaultsConfig()
FAR = 4_000_000_000_000


def pandas_health(events: list) -> pd.DataFrame:
    """The same figures with pandas, from the raw events and the pure rules' windows."""
    fields = ("ts_ms", "broker_name", "client_id", "producer_group", "status", "latency_ms", "error")
    df = pd.DataFrame([{f: getattr(e, f) for f in fields} for e in events])
    df["minute_ms"] = df["ts_ms"] // 60_000 * 60_000
    df["failed"] = df["status"] == "FAILED"
    df["err"] = [error_class(e) if f else None for e, f in zip(df["error"], df["failed"])]
    windows = expected_windows(from_send_results(events))
    rows = []
    for (broker, minute), g in df.groupby(["broker_name", "minute_ms"]):
        lat = g["latency_ms"].to_numpy()
        avoiding = {(grp, c) for (_cl, grp, c, b, s, e) in windows if b == broker and s < minute + 60_000 and e > minute}
        rows.append({
            "broker_name": broker, "minute_ms": int(minute), "sends": len(g), "failures": int(g["failed"].sum()),
            "failures_by_error": dict(sorted(g.loc[g["failed"], "err"].value_counts().to_dict().items())),
            "failure_rate": float(g["failed"].mean()),
            "latency_p50_ms": float(np.percentile(lat, 50)), "latency_p95_ms": float(np.percentile(lat, 95)),
            "latency_p99_ms": float(np.percentile(lat, 99)), "latency_max_ms": int(lat.max()),
            "active_producers": g[["producer_group", "client_id"]].drop_duplicates().shape[0],
            "producers_avoiding": len(avoiding),
        })
    return pd.DataFrame(rows).sort_values(["broker_name", "minute_ms"]).reset_index(drop=True)


def test_minutes_equal_a_pandas_computation_across_batches() -> None:
    events = random_stream(21, producers=15, brokers=4, events=6000, span_ms=300_000)
    batch = from_send_results(events)
    ts = batch["ts_ms"]
    steps = []
    for lo in range(T0, T0 + 300_000, 25_000):
        steps.append((take(batch, (ts >= lo) & (ts < lo + 25_000)), lo - 10_000))
    steps.append((take(batch, ts < 0), FAR))
    _, rows = run_steps("c1", steps, CFG)
    got = pd.DataFrame(rows["health"]).drop(columns=["cluster", "event_date"])
    got = got.sort_values(["broker_name", "minute_ms"]).reset_index(drop=True)
    want = pandas_health(events)
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert got.duplicated(["broker_name", "minute_ms"]).sum() == 0


def test_a_minute_is_written_once_the_watermark_passes_its_last_millisecond() -> None:
    events = random_stream(4, events=400, span_ms=50_000)  # all in the first minute
    state, out = step(initial_state("c1"), from_send_results(events), 0, CFG)
    assert out.health == []
    state, out = step(state, from_send_results([]), T0 + 59_998, CFG)
    assert out.health == []
    state, out = step(state, from_send_results([]), T0 + 59_999, CFG)
    assert {r["minute_ms"] for r in out.health} == {T0} and len(out.health) == 4
    assert final_minute_end(T0 + 59_999) == T0 + 60_000


def test_quantiles_match_numpy_linear_interpolation() -> None:
    rng = np.random.default_rng(3)
    runs = [np.sort(rng.integers(0, 5000, n)) for n in (1, 2, 3, 10, 101)]
    values = np.concatenate(runs)
    ends = np.cumsum([len(r) for r in runs])
    starts = ends - [len(r) for r in runs]
    for q in (0.5, 0.95, 0.99):
        got = quantiles_sorted(values, starts, ends, q)
        assert np.allclose(got, [np.quantile(r, q) for r in runs])


def test_no_row_for_a_broker_without_sends_in_the_minute() -> None:
    events = [e for e in random_stream(8, events=300, span_ms=50_000) if e.broker_name != "broker-1"]
    state, _ = step(initial_state("c1"), from_send_results(events), 0, CFG)
    _, out = step(state, from_send_results([]), FAR, CFG)
    assert {r["broker_name"] for r in out.health} == {"broker-0", "broker-2", "broker-3"}
