"""Inputs and readers shared by the DAG tests and the publisher's integration test.

Delta rows of a four-broker cluster c1 (:func:`write_inputs`: one open episode, on b2) and a reader of
what the publisher sent to a topic. ``tests/integration/test_publish.py`` imports them from here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from schemas.tables import table

S = 1000


def write(root: str, name: str, rows: list[dict[str, Any]]) -> None:
    spec = table(name)
    data = pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    write_deltalake(f"{root}/{name}", data, mode="append", partition_by=list(spec.partition_by) or None)


def cut_newest_commit(root: str, name: str) -> None:
    """Cut the newest commit of table ``name`` short, as a full disk or a bad copy leaves it."""
    newest = max((Path(root) / name / "_delta_log").glob("*.json"))
    newest.write_text(newest.read_text()[:40])


def day(ms: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ms / 1000))


def health_row(broker: str, now: int, **kw: Any) -> dict[str, Any]:
    """A healthy ``broker_health`` minute of cluster c1 (the minute before ``now``); ``kw`` overrides."""
    row = {
        "cluster": "c1", "broker_name": broker, "minute_ms": now - 60 * S, "sends": 120, "failures": 0,
        "failures_by_error": [], "failure_rate": 0.0, "latency_p50_ms": 3.0, "latency_p95_ms": 8.0,
        "latency_p99_ms": 12.0, "latency_max_ms": 40, "active_producers": 6, "producers_avoiding": 0,
        "event_date": day(now - 60 * S),
    }
    row.update(kw)
    return row


def episode_row(broker: str, opened: int, revision: int, now: int, closed: int | None = None) -> dict[str, Any]:
    """One revision of a quorum episode of cluster c1: open, or closed at ``closed``."""
    return {
        "episode_id": f"c1|{broker}|{opened}", "cluster": "c1", "broker_name": broker, "opened_ms": opened,
        "closed_ms": closed, "state": "open" if closed is None else "closed", "reason": "quorum",
        "peak_avoiding_share": 0.8, "peak_avoiding_producers": 5, "active_producers": 6, "sends": 300,
        "failures": 150, "p99_latency_ms": 3000.0, "dominant_error": "RemotingTimeoutException",
        "revision": revision, "updated_ms": closed or now - 5 * S, "cluster_brokers": 4,
    }


def write_inputs(root: str, now: int, bad_rate_broker: str | None = None) -> None:
    """Fresh inputs; ``bad_rate_broker`` gets an impossible failure rate (the gate must refuse)."""
    write(root, "broker_health", [
        health_row(b, now, failure_rate=1.7 if b == bad_rate_broker else 0.0) for b in ("b1", "b2", "b3", "b4")
    ])
    write(root, "broker_fault_episodes_live", [episode_row("b2", now - 90 * S, 0, now)])


def write_config(path: str, cfg: Any) -> str:
    """A TOML file with ``cfg``'s Kafka address, topics and storage (defaults for the rest)."""
    topics = ("send_results", "consumer_progress", "group_membership", "avoidance", "alerts")
    lines = [
        "[kafka]", f'bootstrap_servers = "{cfg.kafka.bootstrap_servers}"',
        "[topics]", *[f'{k} = "{getattr(cfg.topics, k)}"' for k in topics],
        "[storage]", *[f'{k} = "{getattr(cfg.storage, k)}"' for k in ("root", "checkpoint_root", "publish_dir")],
    ]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def read_topic(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record of ``topic`` in offset order per partition, up to each partition's high watermark.

    The watermark comes from fetch responses: Tansu, the local broker, answers latest-offset lookups
    wrongly when a partition's last batch holds more than one record.
    """
    import json

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        out: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                out += [(r.key.decode(), json.loads(r.value)) for r in recs]
            marks = [consumer.highwater(tp) for tp in parts]
            if all(m is not None and consumer.position(tp) >= m for tp, m in zip(parts, marks)):
                return out
        raise AssertionError(f"could not read {topic} to its end")
    finally:
        consumer.close()


def group_row(now: int, status: str, group: str = "GID_orders", **kw: Any) -> dict[str, Any]:
    """A ``group_status`` row of cluster c1 half a minute before ``now``; ``kw`` overrides."""
    bad = status in ("STALL", "STOP", "REWIND")
    row = {
        "cluster": "c1", "consumer_group": group, "ts_ms": now - 30 * S, "status": status, "previous_status": None,
        "total_lag": 5000 if bad else 10, "max_time_lag_ms": 400_000 if bad else 1_000, "retry_lag": 0, "dlq_lag": 0,
        "worst_topic": "orders", "worst_broker": "b2", "worst_queue_id": 1, "worst_owner": "cid-1", "queues": 8,
        "mismatched_queues": 0, "idle_consumers": [], "alert": bad, "alert_reason": None, "event_date": day(now - 30 * S),
        "burrow_status": "ERR" if bad else "OK", "complete": 1.0, "max_lag": 5000 if bad else 10,
        "maxlag_topic": "orders", "maxlag_broker": "b2", "maxlag_queue_id": 1,
    }
    row.update(kw)
    return row
