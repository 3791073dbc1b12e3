"""Shared fixtures: one real Apache Kafka broker and one Spark session per test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
