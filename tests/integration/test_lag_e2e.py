"""Lag end to end: events into Kafka, ``faultwatch stream --once`` (lag query), Delta tables out.

Three phases of event time, each produced then processed by one run of the query (which restarts
from its checkpoint and state each time). Every 5 s (t_k = T0 + 5k s):

- group GS reads topic T (one message per 5 s) and keeps up, committing offset k at t_k, until its
  consumer stops after t_4. Its window (4 commits, t_1..t_4) spans 15 s, and its last zero-lag commit
  excuses a pause for 10 s: STOP once more than 15 s pass without a commit, i.e. at t_8, not at t_7;
- group GW reads topic U (two messages per 5 s) but commits only offset k at t_k: its lag at the
  commits is 1, 2, 3, 4: never decreasing, WARN as soon as the window is complete.

Phase 1 = t_1..t_4, phase 2 = t_5..t_7, phase 3 = t_8..t_9. The lag query alone judges at the end
of each phase, at the phase's last event time (t_4, t_7, t_9); the default job (``combined``, here
with no watermark delay) judges at every 5 s grid point with events, once settled: t_1 .. t_9.

The grace and the trend gate are the "faultwatch" rule set's (lag.rules): under Burrow's rules GS
would still be OK at t_9, excused by a broker offset of its last 4 x 10 s at its last commit.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from pipeline.config import Config, LagConfig
from pipeline.deltaio import read_table
from tests.conftest import unique_topics
from tests.doubles.lag_synth import progress, send

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

T0 = 1_700_000_000_000


def t(k: int) -> int:
    return T0 + 5_000 * k


def events(k: int) -> list[Any]:
    out: list[Any] = [
        send(t(k) - 2_500, 0, k - 1, topic="T"),
        send(t(k) - 3_000, 0, 2 * (k - 1), topic="U"),
        send(t(k) - 1_000, 0, 2 * (k - 1) + 1, topic="U"),
        progress(t(k), 0, k, group="GW", topic="U", client="w1"),
    ]
    if k <= 4:
        out.append(progress(t(k), 0, k, group="GS", topic="T", client="s1"))
    return out


def produce(cfg: Config, evs: list[Any]) -> None:
    from kafka import KafkaProducer

    topics = cfg.topics.event_topics()
    producer = KafkaProducer(bootstrap_servers=cfg.kafka.bootstrap_servers, linger_ms=5)
    for ev in evs:
        producer.send(topics[ev.kind], key=ev.key(), value=ev.to_json())
    producer.flush()
    producer.close()


def run_once(spark: Any, cfg: Config, concern: str) -> str:
    from streaming.job import run_stream

    out = io.StringIO()
    assert run_stream(cfg, once=True, concerns=[concern], spark=spark, out=out) == 0, out.getvalue()
    return out.getvalue()


# The lag query alone judges at each micro-batch's newest event time (t_4, t_7, t_9).
BATCH_GROUPS = [
    ("GS", 20, "OK", None, False, None, 0),
    ("GS", 35, "OK", "OK", False, None, 3),
    ("GS", 45, "STOP", "OK", True, "status OK->STOP", 5),
    ("GW", 20, "WARN", None, True, "status NEW->WARN", 4),
    ("GW", 35, "WARN", "WARN", False, None, 7),
    ("GW", 45, "WARN", "WARN", False, None, 9),
]
# The default job judges every 5 s grid point with events once settled, whatever the batches:
# GS stops at t_8 exactly, GW warns once its window holds min_commits (3) commits, at t_3.
GRID_GROUPS = sorted(
    [("GS", 5 * k, "OK", None if k == 1 else "OK", False, None, max(0, k - 4)) for k in range(1, 8)]
    + [("GS", 40, "STOP", "OK", True, "status OK->STOP", 4), ("GS", 45, "STOP", "STOP", False, None, 5)]
    + [("GW", 5, "OK", None, False, None, 1), ("GW", 10, "OK", "OK", False, None, 2),
       ("GW", 15, "WARN", "OK", True, "status OK->WARN", 3)]
    + [("GW", 5 * k, "WARN", "WARN", False, None, k) for k in range(4, 10)]
)


@pytest.mark.parametrize("concern", ["lag", "combined"])
def test_stopped_and_slow_consumers_reach_stop_and_warn_on_time(spark: Any, kafka: Any, cfg: Config,
                                                                concern: str) -> None:
    cfg = unique_topics(cfg, kafka, f"lag-e2e-{concern}").replace(
        lag=LagConfig(rules="faultwatch", window_commits=4, min_commits=3, caught_up_grace_ms=10_000)
    )
    if concern == "combined":  # judged on the 5 s grid once settled: settle at the newest event
        cfg = cfg.replace(stream__watermark_delay_s=0.0)
    for phase in ([1, 2, 3, 4], [5, 6, 7], [8, 9]):
        produce(cfg, [ev for k in phase for ev in events(k)])
        log = run_once(spark, cfg, concern)
        assert f"[{concern}] batch" in log

    groups = read_table(cfg.storage.root, "group_status").to_pylist()
    got = sorted(
        (
            g["consumer_group"],
            (g["ts_ms"] - T0) // 1000,
            g["status"],
            g["previous_status"],
            g["alert"],
            g["alert_reason"],
            g["total_lag"],
        )
        for g in groups
    )
    assert got == (GRID_GROUPS if concern == "combined" else BATCH_GROUPS)
    stop = min((g for g in groups if g["status"] == "STOP"), key=lambda g: g["ts_ms"])
    # the oldest unconsumed message of GS (offset 4) was stored at t_5 - 2.5 s
    at = stop["ts_ms"] - T0
    assert (stop["max_time_lag_ms"], stop["worst_topic"], stop["worst_queue_id"]) == (at - 22_500, "T", 0)

    queues = read_table(cfg.storage.root, "queue_lag").to_pylist()
    gs_rows = sorted(
        ((q["ts_ms"] - T0) // 1000, q["status"], q["consumer_offset"], q["lag_messages"])
        for q in queues
        if q["consumer_group"] == "GS"
    )
    # a row for the new queue, per commit batch (at most once a minute) and per status change
    assert gs_rows == ([(5, "OK", 1, 0), (40, "STOP", 4, 4)] if concern == "combined"
                       else [(20, "OK", 4, 0), (45, "STOP", 4, 5)])
    assert read_table(cfg.storage.root, "quarantine").num_rows == 0
