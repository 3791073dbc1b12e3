"""The report over real Delta tables: every plot drawn from the data, "no data yet" where none."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline.report import build_html, load_report_data, page, plots, write_report
from pipeline.report.data import HEALTH_MIN_POINTS, health_bucket_ms, health_from_bronze
from pipeline.simulate import MemorySink, Simulation, run_to_memory
from schemas.tables import table

PLOTS = ("availability", "broker_health", "group_lag", "queue_lag_unused")[:3] + ("queue_ownership",)


def _date(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms").strftime("%Y-%m-%d")


_DEFAULTS = {"string": "-", "int64": 0, "int32": 0, "float64": 0.0, "bool": False, "list<string>": [],
             "map<string,int64>": []}


def _write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """Append rows to a Delta table of the declared schema; columns a row leaves out get a default
    (the schema owners add columns as they go: these fixtures must not break on that)."""
    spec = table(name)
    defaults = {f.name: None if f.nullable else (f.enum[0] if f.enum else _DEFAULTS[f.kind]) for f in spec.fields}
    rows = [{**defaults, **row} for row in rows]
    data = pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    write_deltalake(str(root / name), data, partition_by=list(spec.partition_by) or None, mode="append")


def silver_rows(sim: Simulation, sink: MemorySink) -> dict[str, list[dict[str, Any]]]:
    """Silver rows shaped like the pipeline's, derived from a simulation (stand-ins for the queries)."""
    e0 = sim.epoch_ms
    windows = []
    for i, w in enumerate(sim.client_windows()):
        base = {"window_id": f"{w.cluster}|{w.producer_group}|{w.client_id}|{w.broker_name}|{w.start_ms}",
                    "cluster": w.cluster, "producer_group": w.producer_group, "client_id": w.client_id,
                    "client_version": w.client_version, "generation": w.generation, "broker_name": w.broker_name,
                    "start_ms": w.start_ms, "end_ms": w.end_ms, "state": "closed", "trigger_event_id": f"e{i}",
                    "trigger_status": "FAILED", "trigger_latency_ms": 1, "trigger_error": "RemotingConnectException",
                    "trigger_isolation": True, "updates": 1, "fault_enable": True, "revision": 1, "updated_ms": w.end_ms,
                    "event_date": _date(w.start_ms)}
        windows.append({**base, "state": "open", "revision": 0, "end_ms": w.start_ms + 1})  # superseded
        windows.append(base)
    episode = {"episode_id": f"DefaultCluster|broker-b|{e0 + 30_500}", "cluster": "DefaultCluster", "broker_name": "broker-b",
                   "opened_ms": e0 + 30_500, "closed_ms": None, "state": "open", "reason": "quorum", "peak_avoiding_share": 0.5,
                   "peak_avoiding_producers": 5, "active_producers": 14, "sends": 100, "failures": 40, "p99_latency_ms": 5.0,
                   "dominant_error": "RemotingConnectException", "revision": 0, "updated_ms": e0 + 30_500}
    episodes = [episode, {**episode, "closed_ms": e0 + 95_000, "state": "closed", "revision": 1, "peak_avoiding_share": 0.7}]
    sends = pd.DataFrame([(e.cluster, e.broker_name, e.ts_ms // 60_000 * 60_000, e.status == "FAILED", e.latency_ms)
                          for e in sink.events("send_result")], columns=["cluster", "broker", "minute", "failed", "lat"])
    health = []
    for (cluster, broker, minute), df in sends.groupby(["cluster", "broker", "minute"]):
        health.append({"cluster": cluster, "broker_name": broker, "minute_ms": int(minute), "sends": len(df),
                           "failures": int(df.failed.sum()), "failures_by_error": [("RemotingConnectException", int(df.failed.sum()))],
                           "failure_rate": float(df.failed.mean()), "latency_p50_ms": float(np.percentile(df.lat, 50)),
                           "latency_p95_ms": float(np.percentile(df.lat, 95)), "latency_p99_ms": float(np.percentile(df.lat, 99)),
                           "latency_max_ms": int(df.lat.max()), "active_producers": 14, "producers_avoiding": 0,
                           "event_date": _date(int(minute))})
    queue_lag, per_round = [], defaultdict(list)
    for p in sink.events("consumer_progress"):
        lag = p.broker_offset - max(p.consumer_offset, 0)
        queue_lag.append({"cluster": p.cluster, "consumer_group": p.consumer_group, "topic": p.topic, "topic_kind": "main",
                              "broker_name": p.broker_name, "queue_id": p.queue_id, "ts_ms": p.ts_ms,
                              "consumer_offset": p.consumer_offset, "broker_offset": p.broker_offset, "lag_messages": lag,
                              "offset_clamped": False, "time_lag_ms": None, "time_lag_method": "unknown", "start_policy": None,
                              "last_commit_ms": None, "owner_client_id": p.client_id, "reported_by": p.client_id,
                              "owner_mismatch": False, "event_date": _date(p.ts_ms)})
        per_round[(p.cluster, p.consumer_group, p.ts_ms)].append(lag)
    status = [{"cluster": c, "consumer_group": g, "ts_ms": ts, "status": "OK" if sum(lags) < 2000 else "WARN",
                   "previous_status": None, "total_lag": sum(lags), "max_time_lag_ms": None, "retry_lag": None, "dlq_lag": None,
                   "worst_topic": None, "worst_broker": None, "worst_queue_id": None, "worst_owner": None, "queues": len(lags),
                   "idle_consumers": [], "alert": False, "alert_reason": None, "event_date": _date(ts)}
              for (c, g, ts), lags in sorted(per_round.items())]
    recs = [{"cycle_id": "1", "cluster": "DefaultCluster", "broker_name": "broker-b", "action": "avoid", "avoid_until_ms": e0 + 120_000,
                 "expires_ms": e0 + 180_000, "reason": "open_episode", "episode_id": episode["episode_id"], "producers_avoiding": 5,
                 "failure_rate": 0.4, "p99_latency_ms": 5.0, "multiplier": 1, "policy_version": "1", "decided_ms": e0 + 60_000}]
    return {"producer_fault_windows_live": windows, "broker_fault_episodes_live": episodes, "broker_health": health,
            "queue_lag": queue_lag, "group_status": status, "avoidance_recommendations": recs}


def write_silver(root: Path, sim: Simulation, sink: MemorySink) -> dict[str, list[dict[str, Any]]]:
    rows = silver_rows(sim, sink)
    for name, table_rows in rows.items():
        _write(root, name, table_rows)
    return rows


@pytest.fixture(scope="module")
def outage() -> tuple[Simulation, MemorySink]:
    return run_to_memory("broker-outage", duration_s=100.0)


def _figure(html: str, key: str) -> str | None:
    match = re.search(rf'<figure class="plot" data-plot="{key}" data-items="(\d+)">(.*?)</figure>', html, re.DOTALL)
    return match.group(0) if match else None


def test_report_without_tables_says_no_data_yet(tmp_path: Path) -> None:
    path = write_report(str(tmp_path / "tables"), tmp_path / "r.html", generated_ms=1_767_225_600_000)
    html = path.read_text()
    for key in ("availability", "broker_health", "group_lag", "queue_ownership"):
        assert f'<div class="empty" data-plot="{key}">no data yet: ' in html
    assert "<svg" not in html and "data no data yet" in html


def test_report_with_empty_tables_says_no_data_yet(tmp_path: Path) -> None:
    for name in ("producer_fault_windows_live", "broker_fault_episodes_live", "broker_health", "group_status", "queue_lag"):
        _write(tmp_path, name, [])
    html = build_html(load_report_data(str(tmp_path)), generated_ms=1_767_225_600_000)
    assert html.count("no data yet") >= 5 and "<svg" not in html


def test_report_reads_current_views_of_the_tables(tmp_path: Path, outage: tuple[Simulation, MemorySink]) -> None:
    rows = write_silver(tmp_path, *outage)
    data = load_report_data(str(tmp_path))
    windows = data.frame("producer_fault_windows_live").sort_values("window_id").reset_index(drop=True)
    expected = pd.DataFrame([r for r in rows["producer_fault_windows_live"] if r["revision"] == 1])
    expected = expected[list(windows.columns)].sort_values("window_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(windows, expected, check_dtype=False)
    (episode,) = data.frame("broker_fault_episodes_live").itertuples()
    assert (episode.state, episode.revision, episode.peak_avoiding_share) == ("closed", 1, 0.7)
    lag = data.frame("queue_lag").sort_values(["consumer_group", "ts_ms", "broker_name", "queue_id"]).reset_index(drop=True)
    want = pd.DataFrame(rows["queue_lag"])[list(lag.columns)]
    want = want.sort_values(["consumer_group", "ts_ms", "broker_name", "queue_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(lag, want, check_dtype=False)


def test_report_draws_every_plot_from_the_data(tmp_path: Path, outage: tuple[Simulation, MemorySink]) -> None:
    rows = write_silver(tmp_path, *outage)
    out = write_report(str(tmp_path), tmp_path / "report" / "r.html", generated_ms=outage[0].end_ms)
    html = out.read_text()
    windows = [r for r in rows["producer_fault_windows_live"] if r["revision"] == 1]
    items = {key: int(re.search(r'data-items="(\d+)"', _figure(html, key) or "").group(1))
             for key in ("availability", "broker_health", "group_lag", "queue_ownership")}
    assert items == {
        "availability": len(windows) + 1,
        "broker_health": len(rows["broker_health"]),
        "group_lag": len(rows["group_status"]),
        "queue_ownership": len(rows["queue_lag"]),
    }
    assert "no data yet" not in html
    assert "RemotingConnectException" in html and "open_episode" in html  # episode and recommendation tables
    assert "<td>closed, lasted 64 s</td>" in html  # opened at +30.5 s, closed at +95 s
    # Self-contained: nothing is fetched (xmlns URIs are names, not requests).
    assert not re.search(r'(?:src|href)\s*=\s*"(?!#|data:)', html)
    assert "url(http" not in html and "@import" not in html and "<script" not in html


def test_health_from_bronze_matches_direct_counts(tmp_path: Path, outage: tuple[Simulation, MemorySink]) -> None:
    _sim, sink = outage
    sends = sink.events("send_result")[:20_000]
    bronze = [{**{f: getattr(e, f) for f in e.__dataclass_fields__}, "kafka_topic": "t", "kafka_partition": 0,
               "kafka_offset": i, "kafka_ts_ms": e.ts_ms, "event_date": _date(e.ts_ms)} for i, e in enumerate(sends)]
    _write(tmp_path, "send_results", bronze)
    got = health_from_bronze(str(tmp_path))
    df = pd.DataFrame({"broker_name": [e.broker_name for e in sends], "minute_ms": [e.ts_ms // 60_000 * 60_000 for e in sends],
                       "failed": [e.status == "FAILED" for e in sends], "lat": [e.latency_ms for e in sends]})
    want = df.groupby(["broker_name", "minute_ms"]).agg(sends=("failed", "size"), failures=("failed", "sum"),
                                                        p50=("lat", "median")).reset_index()
    pd.testing.assert_frame_equal(got[["broker_name", "minute_ms", "sends", "failures"]].reset_index(drop=True),
                                  want[["broker_name", "minute_ms", "sends", "failures"]], check_dtype=False)
    assert np.allclose(got.latency_p50_ms, want.p50, atol=1.0)
    data = load_report_data(str(tmp_path))
    # A short run: no broker_health, and bronze cut finer than per minute so each broker has a line.
    span = max(e.ts_ms for e in sends) - min(e.ts_ms for e in sends)
    assert span < 6 * 60_000 and data.health_bucket_ms == health_bucket_ms(span) < 60_000
    assert data.health_source == "send_results"
    finer = health_from_bronze(str(tmp_path), bucket_ms=data.health_bucket_ms)
    pd.testing.assert_frame_equal(data.frame("broker_health").reset_index(drop=True), finer)
    assert finer.groupby("broker_name").minute_ms.nunique().min() >= HEALTH_MIN_POINTS
    assert f"computed from bronze send_results per {data.health_bucket_ms // 1000} s" in data.notes[0]


@pytest.mark.parametrize(
    ("span_ms", "bucket_ms"), [(3_600_000, 60_000), (360_000, 60_000), (359_999, 30_000), (100_000, 15_000),
                               (60_000, 10_000), (5_000, 5_000)],
)
def test_health_resolution_suits_the_run(span_ms: int, bucket_ms: int) -> None:
    assert health_bucket_ms(span_ms) == bucket_ms


def test_one_minute_of_health_is_drawn_as_markers_in_both_panels() -> None:
    health = pd.DataFrame([{"cluster": "c", "broker_name": "b", "minute_ms": 1_767_225_600_000, "sends": 10,
                            "failures": 1, "failure_rate": 0.1, "latency_p50_ms": 2.0, "latency_p95_ms": 9.0,
                            "latency_p99_ms": 12.0, "producers_avoiding": 0}])
    plot = plots.broker_health(health, "broker_health")
    assert plot.svg is not None and plot.items == 1
    # Three lines of one point each (failure rate, p50, p99), each drawn as a round marker (a path
    # with curves; tick marks are straight), and one more in the legend.
    round_markers = {m for m, d in re.findall(r'<path id="(m\w+)" d="([^"]*)"', plot.svg) if re.search(r"\bC ", d)}
    uses = re.findall(r'<use xlink:href="#(m\w+)"', plot.svg)
    assert sum(u in round_markers for u in uses) == 3 + 1


def test_an_empty_panel_says_why() -> None:
    for plot in (plots.broker_health(pd.DataFrame(), "broker_health"), plots.group_lag(pd.DataFrame()),
                 plots.queue_ownership(pd.DataFrame())):
        assert plot.svg is None and plot.caption == plots.EMPTY[plot.key]
        assert f'data-plot="{plot.key}">no data yet: ' in page.plot_section(plot)


def test_cli_writes_the_report_and_prints_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   outage: tuple[Simulation, MemorySink]) -> None:
    from faultwatch.cli import main

    write_silver(tmp_path / "tables", *outage)
    conf = tmp_path / "fw.toml"
    conf.write_text(f'[storage]\nroot = "{tmp_path / "tables"}"\n')
    out = tmp_path / "out.html"
    assert main(["report", "--config", str(conf), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert _figure(out.read_text(), "availability") is not None


def test_an_episode_closed_by_silence_says_so_and_an_older_table_without_the_column_still_reads(
    tmp_path: Path, outage: tuple[Simulation, MemorySink]
) -> None:
    rows = silver_rows(*outage)["broker_fault_episodes_live"]
    silent = [{**r, "closed_by": "silence" if r["state"] == "closed" else None} for r in rows]
    _write(tmp_path / "new", "broker_fault_episodes_live", silent)
    html = build_html(load_report_data(str(tmp_path / "new")), generated_ms=1_767_225_600_000)
    assert "closed by silence after 64 s: not heard of since, maybe still down" in html

    # a table an older faultwatch wrote: no closed_by column (the job adds it when it starts)
    spec = table("broker_fault_episodes_live")
    defaults = {f.name: None if f.nullable else (f.enum[0] if f.enum else _DEFAULTS[f.kind]) for f in spec.fields}
    old = pa.Table.from_pylist([{**defaults, **r} for r in rows], schema=spec.arrow_schema()).drop_columns(["closed_by"])
    write_deltalake(str(tmp_path / "old" / "broker_fault_episodes_live"), old,
                    partition_by=list(spec.partition_by) or None)
    data = load_report_data(str(tmp_path / "old"))
    assert "closed_by" not in data.frame("broker_fault_episodes_live").columns
    assert "closed, lasted 64 s" in build_html(data, generated_ms=1_767_225_600_000)
