"""deploy/: the Prometheus rules load in promtool and fire as intended, and every series the rules
and the Grafana dashboard name is one that ``faultwatch serve`` really exports on /metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.serve.snapshot import Refresher
from tests.unit.test_report import _write
from tests.unit.test_serve import metric_samples, serve_config, write_outage_tables

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "faultwatch-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "faultwatch-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "faultwatch-dashboard.json"
# Series Prometheus itself makes, not /metrics.
PROMETHEUS_OWN = {"up"}


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (the test set-up runs: apt-get install -y prometheus)")
    return binary


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    result = subprocess.run([promtool(), "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def expressions() -> dict[str, list[str]]:
    import yaml

    rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return {"rules": rules, "dashboard": exprs}


def names_in(expr: str) -> set[str]:
    """Series names an expression selects: faultwatch_* identifiers and any name{...} selector."""
    return set(re.findall(r"\bfaultwatch_[a-z0-9_]+", expr)) | set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))


def served_names(tmp_path: Path) -> set[str]:
    """Series names of a real /metrics over tables where every family has data."""
    write_outage_tables(tmp_path)
    now = int(time.time() * 1000)
    _write(tmp_path / "tables", "quarantine", [{"reason": "bad_json", "stage": "bronze", "kafka_ts_ms": now}])
    _write(tmp_path / "tables", "publisher_cycles", [{"cycle_id": "1", "step": "avoidance", "status": "published",
                                                      "decided_ms": now, "policy_version": "1"}])
    _write(tmp_path / "tables", "group_status", [{"cluster": "DefaultCluster", "consumer_group": "CG_all", "ts_ms": now,
                                                 "status": "WARN", "total_lag": 9, "retry_lag": 2, "dlq_lag": 1,
                                                 "max_time_lag_ms": 400_000, "queues": 1, "event_date": "x"}])
    _write(tmp_path / "tables", "queue_lag", [{"cluster": "DefaultCluster", "consumer_group": "CG_all", "topic": "T",
                                              "broker_name": "broker-a", "queue_id": 0, "ts_ms": now, "lag_messages": 9,
                                              "time_lag_ms": 400_000, "status": "WARN", "event_date": "x"}])
    cfg: Config = serve_config(tmp_path)
    return {name for name, _ in metric_samples(Refresher(cfg).refresh_once().metrics.decode())}


def test_every_series_named_in_deploy_is_exported(tmp_path: Path) -> None:
    exported = served_names(tmp_path)
    for source, exprs in expressions().items():
        assert exprs, source
        for expr in exprs:
            names = names_in(expr)
            assert names, (source, expr)
            missing = names - exported - PROMETHEUS_OWN
            assert not missing, (source, expr, missing)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    titles = " ".join(p["title"] for p in panels).lower()
    assert all(word in titles for word in ("broker", "lag", "avoid"))
