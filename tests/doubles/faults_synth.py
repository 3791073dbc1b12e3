"""Synthetic send-result streams for the fault tests and benchmarks (the simulator models clients;
these are cheap, seeded, and can be as large or as disordered as a test needs).

- :func:`random_stream`: many producers x brokers x both client versions, some without fault
  tolerance, with slow sends, failures of every error class, and optional explicit
  isolation/reachable fields.
- :func:`bulk_stream`: a vectorised stream of a given size (benchmarks).
- :func:`bronze_table`: events as routed bronze rows (the Kafka source's output), for file streams.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from pipeline.faults.events import EVENT_SCHEMA
from pipeline.faults.frame import Cols, build
from schemas.events import SendResult
from schemas.fields import arrow_schema
from schemas.tables import routed_fields

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
ERRORS = (
    "RemotingConnectException: connect to 10.0.0.1:10911 failed",
    "RemotingTimeoutException: wait response on the channel <10.0.0.1:10911> timeout, 3000(ms)",
    "MQBrokerException: CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while",
    "MQClientException: No route info of this topic",
    "InterruptedException",
)


def random_stream(
    seed: int,
    producers: int = 12,
    brokers: int = 4,
    events: int = 3000,
    start_ms: int = T0,
    span_ms: int = 120_000,
    cluster: str = "c1",
    explicit_share: float = 0.3,
) -> list[SendResult]:
    """A seeded stream in timestamp order; equal timestamps are common (1 ms resolution)."""
    rng = random.Random(seed)
    out = []
    sick = rng.randrange(brokers)  # one broker fails a lot in the middle third
    for i in range(events):
        ts = start_ms + rng.randrange(span_ms)
        p = rng.randrange(producers)
        b = rng.randrange(brokers)
        version = ("4.9.8", "5.3.3", "5.1.4", "4.9.4")[p % 4]
        enable = None if p % 5 == 0 else (p % 7 != 0)
        bad = b == sick and start_ms + span_ms // 3 < ts < start_ms + 2 * span_ms // 3
        failed = rng.random() < (0.6 if bad else 0.02)
        latency = rng.choice((1, 2, 5, 40, 120, 560, 1100, 1900, 3200, 5500, 16000)) if rng.random() < 0.3 \
            else rng.randrange(0, 30)
        explicit = rng.random() < explicit_share
        out.append(SendResult(
            event_id=f"{cluster}-{seed}-{i}", ts_ms=ts, cluster=cluster, producer_group=f"PG_{p % 3}",
            client_id=f"10.0.0.{p}@{4000 + p}", client_version=version, topic="TopicTest",
            broker_name=f"broker-{b}", queue_id=rng.randrange(4), status="FAILED" if failed else "SEND_OK",
            latency_ms=latency, error=rng.choice(ERRORS) if failed else None,
            queue_offset=None if failed else i, attempt=rng.randrange(3),
            isolation=(failed and rng.random() < 0.8) if explicit else None,
            reachable=(rng.random() < 0.7) if explicit else None,
            send_latency_fault_enable=enable,
        ))
    out.sort(key=lambda e: e.ts_ms)
    return out


def bulk_stream(
    n: int, brokers: int = 50, producers: int = 500, rate_per_s: int = 5000, seed: int = 1,
    start_ms: int = T0, sick_broker: int | None = 7,
) -> Cols:
    """``n`` events at ``rate_per_s`` of event time: mostly healthy, a few slow sends and failures,
    and (unless None) one broker failing for a minute a minute in."""
    rng = np.random.default_rng(seed)
    ts = start_ms + np.sort(rng.integers(0, max(1, int(n / rate_per_s * 1000)), n))
    p = rng.integers(0, producers, n)
    b = rng.integers(0, brokers, n)
    lat = np.minimum(rng.lognormal(1.0, 1.0, n).astype(np.int64), 5000)
    slow = rng.random(n) < 0.002
    lat[slow] = rng.integers(600, 4000, int(slow.sum()))
    fail = rng.random(n) < 0.001
    if sick_broker is not None:
        fail |= (b == sick_broker) & (ts > start_ms + 60_000) & (ts < start_ms + 120_000)
    names_p = np.asarray([f"10.0.{x // 250}.{x % 250}@{1000 + x}" for x in range(producers)], dtype=object)
    names_b = np.asarray([f"broker-{x:02d}" for x in range(brokers)], dtype=object)
    groups = np.asarray([f"PG_{x % 10}" for x in range(producers)], dtype=object)
    return build(
        EVENT_SCHEMA,
        schema_version=1, event_id=np.asarray([f"e{seed}-{i}" for i in range(n)], dtype=object), ts_ms=ts,
        cluster="c1", producer_group=groups[p], client_id=names_p[p],
        client_version=np.where(p % 2 == 0, "4.9.8", "5.3.3").astype(object), topic="TopicTest",
        broker_name=names_b[b], queue_id=rng.integers(0, 8, n), status=np.where(fail, "FAILED", "SEND_OK").astype(object),
        latency_ms=lat, error=np.where(fail, ERRORS[0], None).astype(object),
        queue_offset=np.where(fail, None, np.arange(n)).astype(object), attempt=0, isolation=None, reachable=None,
        send_latency_fault_enable=np.where(p % 3 == 0, None, True).astype(object),
        fault_item_removed=None, fault_item_removed_ms=None,
        kafka_topic="rmq.send-results", kafka_partition=b % 4, kafka_offset=np.arange(n), kafka_ts_ms=ts,
    )


def bronze_table(events: Cols) -> pa.Table:
    """Events as routed rows of the Kafka source (``_table = 'send_results'``)."""
    fields = routed_fields(["send_results", "quarantine"])
    n = len(events["ts_ms"])
    cols: dict[str, list[object]] = {}
    for f in fields:
        if f.name in events:
            cols[f.name] = events[f.name].tolist()
        else:
            cols[f.name] = [None] * n
    cols["_table"] = ["send_results"] * n
    from schemas.tables import utc_date

    cols["event_date"] = [utc_date(int(t)) for t in events["ts_ms"]]
    return pa.Table.from_pydict(cols, schema=arrow_schema(fields))


def outage_scenario(
    producers: int = 20, brokers: int = 5, outage_s: float = 120.0, start_s: float = 60.0, after_s: float = 150.0,
    rate_per_s: float = 8.0, legacy_share: float = 0.3, seed: int = 3,
) -> object:
    """The scripted outage: ``broker-c`` refuses connections for ``outage_s`` while ``producers``
    fault-tolerant producers (a ``legacy_share`` of them on 4.9.8, the rest on 5.3.3) send."""
    from pipeline.simulate import scenario_from_dict

    legacy = round(producers * legacy_share)
    groups = [
        {"group": "PG_orders", "count": producers - legacy, "topic": "TopicOrders", "client_version": "5.3.3",
         "fault_tolerance": True, "rate_per_s": rate_per_s},
    ]
    if legacy:
        groups.append({"group": "PG_legacy", "count": legacy, "topic": "TopicOrders", "client_version": "4.9.8",
                       "fault_tolerance": True, "rate_per_s": rate_per_s})
    return scenario_from_dict({
        "name": "scripted-outage",
        "seed": seed,
        "duration_s": start_s + outage_s + after_s,
        "brokers": [{"name": f"broker-{chr(ord('a') + i)}", "queues": 4} for i in range(brokers)],
        "faults": [{"broker": "broker-c", "kind": "outage", "mode": "refused", "start_s": start_s,
                    "duration_s": outage_s}],
        "producers": groups,
    })


def misbehave(events: list[SendResult], client_id: str, broker: str, every: int = 1) -> list[SendResult]:
    """One producer's sends to ``broker`` fail on its side (timeouts), everyone else's are fine."""
    import dataclasses

    out = []
    k = 0
    for e in events:
        if e.client_id == client_id and e.broker_name == broker:
            k += 1
            if k % every == 0:
                e = dataclasses.replace(e, status="FAILED", latency_ms=3000, error="RemotingTimeoutException",
                                        queue_offset=None, isolation=True, reachable=True)
        out.append(e)
    return out


def dropped_from_routes(back_s: float | None, producers: int = 8, span_s: float = 300.0) -> list[SendResult]:
    """A real cluster's kill: ``producers`` (5.3.3, fault tolerance on) each send once a second to each of
    broker-a, broker-b and broker-c; broker-c refuses connections from 60 s, the name server drops it
    from the routes and from 70 s nobody sends to it; from ``back_s`` (None: never) it is back in the
    routes and its sends succeed. Sorted by time."""
    out = []
    for second in range(int(span_s)):
        for p in range(producers):
            for b, broker in enumerate(("broker-a", "broker-b", "broker-c")):
                ts = T0 + second * 1000 + p * 10 + b
                down = broker == "broker-c" and second >= 60 and (back_s is None or second < back_s)
                if down and second >= 70:
                    continue  # not in the routes: nobody sends to it
                out.append(SendResult(
                    event_id=f"k-{second}-{p}-{b}", ts_ms=ts, cluster="DefaultCluster", producer_group="PG",
                    client_id=f"10.0.0.{p}@{4000 + p}", client_version="5.3.3", topic="TopicTest",
                    broker_name=broker, queue_id=p % 4, status="FAILED" if down else "SEND_OK",
                    latency_ms=1 if down else 3, error="RemotingConnectException: connect failed" if down else None,
                    queue_offset=None if down else second * producers + p, attempt=0,
                    send_latency_fault_enable=True,
                ))
    return out
