"""A real Prometheus scrapes ``faultwatch serve`` over the tables of a real pipeline run.

The simulator's demo scenario, with broker-b's outage lasting past the run's end (so its episode
is open when the run stops; CG_analytics consumes slower than the producers send), goes to the
local Kafka-protocol broker, ``faultwatch stream --once`` turns it into Delta tables, ``faultwatch
serve`` exports them with a published avoidance list beside them, and Debian's Prometheus scrapes
serve with deploy/'s rules loaded. Prometheus's HTTP API must then show the open broker-b episode,
the avoidance list's values, CG_analytics as the group with the most lag, and the episode alert
firing.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.config import Config
from pipeline.publish.sinks import write_cluster_files
from tests.conftest import unique_topics
from tests.integration.processes import kill_tree, start_faultwatch, wait_for, write_config
from tests.integration.test_serve_security import start_serve
from tests.unit.test_serve import avoidance_doc

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "faultwatch-rules.yml"


def open_outage_scenario(tmp_path: Path) -> Path:
    """The demo scenario with broker-b's outage lasting past the run's end."""
    text = (ROOT / "conf" / "scenarios" / "demo.toml").read_text()
    fault = 'kind = "outage"\nmode = "refused"\nstart_s = 20.0\nduration_s = 40.0\n'
    assert fault in text, "conf/scenarios/demo.toml's broker-b outage changed: update this test"
    path = tmp_path / "demo-open-outage.toml"
    path.write_text(text.replace(fault, fault.replace("duration_s = 40.0", "duration_s = 3600.0")))
    return path


def value(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (the test set-up runs: apt-get install -y prometheus)")
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{RULES.name}]\n"
        "scrape_configs:\n"
        "  - job_name: faultwatch\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    return proc, f"http://127.0.0.1:{port}", log


def prom_get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else base + path
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def query(base: str, expr: str) -> list[dict[str, Any]]:
    answer = prom_get(base, "/api/v1/query", query=expr)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def prometheus_ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_prometheus_scrapes_the_episode_and_the_lagging_group(kafka, cfg: Config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # lag is judged once event time has settled past it: a short delay judges it near the run's end
    cfg = unique_topics(cfg, kafka, "serve-prom").replace(stream__trigger_interval_s=0.5,
                                                          stream__watermark_delay_s=5.0)
    conf = write_config(cfg, tmp_path / "fw.toml", serve={"refresh_interval_s": 1.0})
    log = tmp_path / "run.log"
    epoch = str(int(time.time() * 1000) - 120_000)
    scenario = open_outage_scenario(tmp_path)
    sim = start_faultwatch("simulate", "--config", str(conf), "--scenario", str(scenario), "--to", "kafka",
                           "--duration", "80", "--epoch", epoch, log=log)
    assert sim.wait(timeout=300) == 0, log.read_text(errors="replace")[-3000:]
    stream = start_faultwatch("stream", "--config", str(conf), "--once", log=log)
    assert stream.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]

    decided_ms = int(time.time() * 1000)
    published = avoidance_doc("cluster-main", decided_ms, broker="broker-b")
    published["expires_ms"] = published["avoid"][0]["expires_ms"] = decided_ms + 3_600_000
    published["avoid"][0]["avoid_until_ms"] = decided_ms + 3_600_000
    write_cluster_files(cfg.storage.publish_dir, [("cluster-main", orjson.dumps(published))])
    serve, url = start_serve(conf, tmp_path / "serve.log", env={})
    prometheus, base, prom_log = start_prometheus(tmp_path, url.split("//")[1].rstrip("/"))
    try:
        wait_for(lambda: prometheus_ready(base), 60, "Prometheus ready", prometheus, prom_log)
        wait_for(lambda: bool(query(base, 'faultwatch_group_lag_messages{group="CG_analytics"}')), 60,
                 "the first scrape of serve", prometheus, prom_log)
        targets = prom_get(base, "/api/v1/targets")["data"]["activeTargets"]
        assert [(t["labels"]["job"], t["health"]) for t in targets] == [("faultwatch", "up")], targets

        # The episode: broker-b's is open (its outage outlasts the run), and no other broker has one.
        episodes = query(base, 'faultwatch_broker_episode_state{state=~"suspected|open"} == 1')
        assert [(r["metric"]["cluster"], r["metric"]["broker"], r["metric"]["state"]) for r in episodes] == [
            ("cluster-main", "broker-b", "open")], episodes

        # The lagging group: CG_analytics has the most lag, thousands of messages, growing.
        worst = query(base, "topk(1, faultwatch_group_lag_messages)")
        assert worst[0]["metric"]["group"] == "CG_analytics" and float(worst[0]["value"][1]) > 1000, worst
        # CG_orders keeps up: OK, its lag at most what arrives between two of its commits
        keeping_up = query(base, 'faultwatch_group_lag_messages{group="CG_orders"}')
        assert float(keeping_up[0]["value"][1]) < float(worst[0]["value"][1]) / 3, keeping_up
        assert query(base, 'faultwatch_group_status{group="CG_orders",status="OK"} == 1')
        status = query(base, 'faultwatch_group_status{group="CG_analytics"} == 1')
        assert len(status) == 1, status
        worst_queue = query(base, 'topk(1, faultwatch_queue_lag_messages)')
        assert worst_queue[0]["metric"]["group"] == "CG_analytics", worst_queue

        # Pipeline health series arrive too, and deploy/'s episode alert fires on these series.
        assert value(query(base, 'faultwatch_table_up{table="send_results"}')) == 1.0
        # The published list, as serve read it from its file.
        assert value(query(base, 'faultwatch_avoidance_brokers{cluster="cluster-main"}')) == 1.0
        assert value(query(base, 'faultwatch_avoidance_decided_timestamp_seconds{cluster="cluster-main"}')) == \
            decided_ms / 1000
        assert value(query(base, 'faultwatch_avoidance_expiry_timestamp_seconds{cluster="cluster-main"}')) == \
            published["expires_ms"] / 1000
        recommended = query(base, 'faultwatch_broker_avoidance_recommended{cluster="cluster-main"}')
        assert {r["metric"]["broker"]: float(r["value"][1]) for r in recommended} == {
            "broker-a": 0.0, "broker-b": 1.0, "broker-c": 0.0, "broker-d": 0.0}, recommended

        def episode_alert() -> bool:
            alerts = prom_get(base, "/api/v1/alerts")["data"]["alerts"]
            return any(a["labels"]["alertname"] == "FaultwatchBrokerFaultEpisode" and a["state"] == "firing"
                       for a in alerts)

        wait_for(episode_alert, 60, "the episode alert firing", prometheus, prom_log)
    finally:
        kill_tree(prometheus, 15)
        kill_tree(serve, 15)
