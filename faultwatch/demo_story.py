"""When the demo's story is told: the outage seen, confirmed, closed, and its alert resolved.

The demo ends on what the job reports, not on the wall clock: a cold first run (slow Spark start, a
busy machine) reads the same events later, and would otherwise stop with the episode still open.
The story is told once the job has settled event time past the scenario's last recovery plus the
episode close rule, no episode is open any more, and every broker alert that fired on the alerts
topic has resolved. The alerts are read back from that topic, as an operator's tooling would.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson

from pipeline.config import Config
from pipeline.simulate.scenario import Scenario


def settle_needed_ms(scenario: Scenario, epoch_ms: int, duration_s: float, cfg: Config) -> int:
    """The event time the job must settle before the story can be told.

    The end of the simulated duration (less the watermark delay: what a caught-up job settles at
    that moment), or, when a fault within it recovers, that recovery plus the close rule and two
    grid steps (the grid point after the last signal, and the one that decides it). A fault that
    never recovers adds nothing: its episode stays open, and that is its story.
    """
    point_s = duration_s - cfg.stream.watermark_delay_s
    for f in scenario.faults:
        if f.start_s < duration_s and f.duration_s is not None:
            recovered = f.start_s + f.duration_s
            point_s = max(point_s, recovered + cfg.faults.episode_close_after_s + 2 * cfg.faults.evaluation_interval_s)
    return epoch_ms + round(point_s * 1000)


@dataclass
class AlertStory:
    """One alert as the alerts topic told it: when it fired and, if it did, when it resolved."""

    alert_id: str
    kind: str
    summary: str
    fired_ms: int
    resolved_ms: int | None = None

    def line(self) -> str:
        fired = _clock(self.fired_ms)
        end = f"resolved {_clock(self.resolved_ms)}" if self.resolved_ms is not None else "still firing"
        return f"  {self.kind} {self.alert_id.split('|', 1)[-1]}: fired {fired}, {end}"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S UTC")


class AlertLog:
    """The records of the alerts topic, read from its start; :meth:`read` takes the new ones."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.alerts: dict[str, AlertStory] = {}
        self._consumer: Any = None
        self._lock = threading.Lock()

    def read(self) -> None:
        """Read what the topic holds beyond what was read; an unreadable record is an error."""
        consumer = self._consumer or self._open()
        if consumer is None:
            return  # the topic has no partitions yet: nothing was sent to it
        for records in consumer.poll(timeout_ms=1000, max_records=10_000).values():
            for r in records:
                self._take(orjson.loads(r.value))

    def _open(self) -> Any:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            enable_auto_commit=False, auto_offset_reset="earliest", **self.cfg.kafka.client_options()
        )
        topic = self.cfg.topics.alerts
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            consumer.close()
            return None
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        self._consumer = consumer
        return consumer

    def _take(self, rec: dict[str, Any]) -> None:
        with self._lock:
            known = self.alerts.get(rec["alert_id"])
            if rec["status"] == "firing" and (known is None or known.resolved_ms is not None):
                self.alerts[rec["alert_id"]] = AlertStory(rec["alert_id"], rec["kind"], rec["summary"], rec["ts_ms"])
            elif rec["status"] == "resolved" and known is not None:
                known.resolved_ms = rec.get("ends_ms") or rec["ts_ms"]

    def stories(self, kind: str | None = None) -> list[AlertStory]:
        with self._lock:
            found = [a for a in self.alerts.values() if kind is None or a.kind == kind]
        return sorted(found, key=lambda a: (a.fired_ms, a.alert_id))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def story_told(settled_ms: int | None, needed_ms: int, open_episodes: int, broker_alerts: list[AlertStory]) -> bool:
    """Event time settled far enough, no episode open, and every broker alert that fired resolved."""
    if settled_ms is None or settled_ms < needed_ms or open_episodes:
        return False
    return all(a.resolved_ms is not None for a in broker_alerts)
