"""Shared fixtures: one real Apache Kafka broker and one Spark session per test run, a real Alertmanager."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.children import stop_child
from pipeline.config import Config

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def kafka() -> Iterator[object]:
    """A single-node Apache Kafka (KRaft) on free loopback ports with the default topics (4 partitions)."""
    from pipeline.kafka_apache import start_apache_kafka

    broker = start_apache_kafka(topics=Config().topics.all(), partitions=4)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The session's one SparkSession (start costs ~10 s: never make another)."""
    from streaming.session import spark_session

    cfg = Config().replace(spark__master="local[2]")
    session = spark_session(cfg)
    yield session
    session.stop()


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    """Default config with storage and checkpoints in a fresh temporary folder."""
    return Config().replace(
        storage__root=str(tmp_path / "tables"),
        storage__checkpoint_root=str(tmp_path / "checkpoints"),
        storage__publish_dir=str(tmp_path / "avoidance"),
    )


AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
AM_CONFIG = """\
route:
  receiver: blackhole
  group_wait: 1s
receivers:
  - name: blackhole
"""


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real Alertmanager on a free loopback port, clustering off; stopped at the end."""
    assert Path(AM_BIN).exists(), "needs Debian's prometheus-alertmanager (scripts/bootstrap.sh test installs it)"
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(AM_CONFIG)
    from pipeline.kafka_local import free_port

    port = free_port()
    log = open(tmp_path / "alertmanager.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [AM_BIN, f"--config.file={conf}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("Alertmanager did not become ready:\n" + (tmp_path / "alertmanager.log").read_text())
            time.sleep(0.2)
        yield url, port
    finally:
        stop_child(proc, 10)
        log.close()


def active_alerts(url: str) -> dict[str, dict[str, Any]]:
    """Alertmanager's current alerts (resolved ones are not listed), by alertname/identity label."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as r:
        alerts = json.loads(r.read())
    out = {}
    for a in alerts:
        labels = a["labels"]
        key = labels.get("broker") or labels.get("group")
        out[f"{labels['alertname']}/{key}/{labels.get('state') or labels.get('status')}"] = a
    return out


def unique_topics(cfg: Config, kafka, tag: str) -> Config:  # type: ignore[no-untyped-def]
    """A copy of ``cfg`` pointing at fresh topics on ``kafka`` (tests share one broker)."""
    from pipeline.kafka_local import create_topics

    topics = {
        name: f"{tag}.{getattr(cfg.topics, name)}"
        for name in ("send_results", "consumer_progress", "group_membership", "avoidance", "alerts")
    }
    create_topics(kafka.bootstrap, list(topics.values()), 4)
    out = cfg.replace(kafka__bootstrap_servers=kafka.bootstrap)
    for name, topic in topics.items():
        out = out.replace(**{f"topics__{name}": topic})
    return out


SLOW_TIMEOUT_S = 900  # end-to-end runs (JVMs, whole jobs): ~3 min on a loaded 2-core machine, the longest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked slow get a larger bound than the suite's default timeout, unless they set one."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
