"""Alerts with a lifecycle against a real Alertmanager (Debian's prometheus-alertmanager) on loopback.

The publisher runs through a broker outage (an episode suspected, then confirmed) with a stalled
consumer group, and their recovery; Alertmanager's ``/api/v2/alerts`` shows both alerts active
during the outage and gone after it. The publisher reaches Alertmanager through a TCP relay the
test can cut (connection refused, as when Alertmanager is down, but without restarting it, which
would empty its memory): while cut, the cycle still publishes, logs the failure once and keeps the
resolutions, which reach Alertmanager on the next cycle once the link is back.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import active_alerts, unique_topics

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.publish import run_cycle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, episode_row, group_row, health_row, read_topic, write

pytestmark = pytest.mark.kafka


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Link:
    """A TCP relay to Alertmanager that the test cuts (connection refused) and restores."""

    def __init__(self, target_port: int) -> None:
        self.port, self.target = free_port(), target_port
        self.server: socket.socket | None = None

    def up(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.server.settimeout(0.2)
        threading.Thread(target=self._serve, args=(self.server,), daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        server, self.server = self.server, None
        server.close()

    def _serve(self, server: socket.socket) -> None:
        while self.server is server:
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def inputs(root: str, t: int, episode_state: str | None, group_status: str, revision: int, opened: int) -> None:
    """Fresh health rows at ``t``, the b2 episode in ``episode_state`` (None: closed), the group's row."""
    write(root, "broker_health", [health_row(b, t) for b in ("b1", "b2", "b3", "b4")])
    ep = episode_row("b2", opened, revision, t, closed=None if episode_state else t - 10 * S)
    if episode_state:
        ep["state"] = episode_state
    write(root, "broker_fault_episodes_live", [ep])
    write(root, "group_status", [group_row(t, group_status)])


def test_alerts_fire_once_stay_active_and_resolve_in_alertmanager(  # type: ignore[no-untyped-def]
    cfg: Config, kafka, alertmanager, caplog
) -> None:
    url, am_port = alertmanager
    link = Link(am_port)
    link.up()
    via = f"http://127.0.0.1:{link.port}"
    cfg = unique_topics(cfg, kafka, "amlife").replace(
        alerts__alertmanager_urls=(via,), alerts__timeout_s=2.0, alerts__repeat_interval_s=300.0
    )
    root = cfg.storage.root
    now = int(time.time() * 1000)
    # Cycles a minute apart, ending now: Alertmanager compares endsAt with its own clock.
    t0, t1, t2, t3 = (now - 180 * S, now - 120 * S, now - 60 * S, now)
    opened = t0 - 20 * S
    # The names and labels of the shipped Prometheus rules (deploy/prometheus), so Alertmanager takes
    # the publisher's alert and the rule's as one; the episode's state is part of the identity.
    suspected, broker = "FaultwatchBrokerFaultEpisode/b2/suspected", "FaultwatchBrokerFaultEpisode/b2/open"
    group = "FaultwatchConsumerGroupNotOK/GID_orders/STALL"

    # The outage: suspected, then confirmed; the group stalls.
    inputs(root, t0, "suspected", "STALL", 0, opened)
    assert run_cycle(cfg, cycle_number=t0, at_ms=t0).status == "published"
    first = active_alerts(url)
    assert sorted(first) == [suspected, group]
    assert first[suspected]["labels"] == {"alertname": "FaultwatchBrokerFaultEpisode", "cluster": "c1",
                                          "severity": "critical", "broker": "b2", "state": "suspected"}
    assert first[group]["labels"] == {"alertname": "FaultwatchConsumerGroupNotOK", "cluster": "c1",
                                      "severity": "warning", "group": "GID_orders", "status": "STALL"}
    assert first[suspected]["status"]["state"] == "active"
    assert "suspected" in first[suspected]["annotations"]["summary"]

    inputs(root, t1, "open", "STALL", 1, opened)
    assert run_cycle(cfg, cycle_number=t1, at_ms=t1).status == "published"
    second = active_alerts(url)
    assert sorted(second) == [broker, group]  # suspected resolved, open fired (as the rule's series would)
    assert second[group]["startsAt"] == first[group]["startsAt"]  # the same alert (same labels), re-sent
    assert "confirmed" in second[broker]["annotations"]["summary"]

    # Recovery while Alertmanager is unreachable: the cycle still publishes and logs once.
    inputs(root, t2, None, "OK", 2, opened)
    link.down()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.publish.alertmanager"):
        report = run_cycle(cfg, cycle_number=t2, at_ms=t2)
    warnings = [r for r in caplog.records if r.name == "pipeline.publish.alertmanager"]
    assert report.status == "published"
    assert len(warnings) == 1 and via in warnings[0].getMessage()
    assert sorted(active_alerts(url)) == [broker, group]  # the resolutions have not arrived yet

    # Alertmanager is reachable again: the next cycle delivers the kept resolutions.
    link.up()
    inputs(root, t3, None, "OK", 3, opened)
    assert run_cycle(cfg, cycle_number=t3, at_ms=t3).status == "published"
    assert active_alerts(url) == {}

    # The alerts topic: each alert fired once (repeat interval 5 min) and resolved once.
    records = [a for _, a in read_topic(cfg.kafka.bootstrap_servers, cfg.topics.alerts)]
    assert sorted((a["alert_id"], a["status"], a["starts_ms"], a["ends_ms"]) for a in records) == [
        ("broker_fault|c1|b2|open", "firing", t1, None), ("broker_fault|c1|b2|open", "resolved", t1, t2),
        ("broker_fault|c1|b2|suspected", "firing", t0, None), ("broker_fault|c1|b2|suspected", "resolved", t0, t1),
        ("consumer_lag|c1|GID_orders|STALL", "firing", t0, None),
        ("consumer_lag|c1|GID_orders|STALL", "resolved", t0, t2),
    ]
    cycles = read_table(root, "publisher_cycles", columns=["cycle_number", "step", "reason"]).to_pylist()
    failed = [r["cycle_number"] for r in cycles if r["step"] == "alerts" and r["reason"]]
    assert failed == [t2]
