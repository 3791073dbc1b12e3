"""One real RocketMQ cluster (a name server, three brokers) per test session, and the lab drivers.

Starting three brokers takes ~30-40 s on two cores, so every test of this folder shares the cluster;
a test that kills or freezes a broker brings it back before it ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.java_clients import LabDriver
from pipeline.rocketmq_cluster import RocketMQCluster, start_cluster

_names = itertools.count()


@pytest.fixture(scope="session")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQCluster]:
    cluster = start_cluster(3, home=tmp_path_factory.mktemp("rocketmq"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rmq_topic(rocketmq: RocketMQCluster) -> str:
    """A fresh RocketMQ topic with 4 queues on each broker."""
    topic = f"fw-t{next(_names)}"
    rocketmq.create_topic(topic, 4)
    return topic


@pytest.fixture
def driver(rocketmq: RocketMQCluster, tmp_path: Path) -> Iterator[Callable[..., LabDriver]]:
    """Starts lab drivers (real producers) against the cluster; all are closed after the test."""
    started: list[LabDriver] = []

    def start(client_version: str, **options: str) -> LabDriver:
        n = next(_names)
        options.setdefault("group", f"pg-{n}")
        options.setdefault("instance", f"lab-{n}")
        options.setdefault("cluster", "DefaultCluster")
        # two shared cores under load: a first send (route, connection, JIT) can outlast RocketMQ's 3 s
        options.setdefault("send_timeout_ms", "15000")
        d = LabDriver(client_version, tmp_path / f"driver-{n}", namesrv=rocketmq.namesrv_addr, **options)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()
