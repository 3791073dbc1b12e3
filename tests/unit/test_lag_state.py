"""``pipeline.lag.step`` on small hand-computed scenarios: whole output rows are compared."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pipeline.config import ConfigError, LagConfig, LagGroupConfig, from_dict
from pipeline.lag import events_frame, initial_state, step
from pipeline.lag.codec import decode_state, encode_state
from tests.doubles.lag_synth import membership, progress, send

T0 = 1_700_000_000_000
CFG = LagConfig(window_commits=4, min_commits=3, queue_row_interval_s=0)
DAY = "2023-11-14"


def records(frame: pd.DataFrame, sort: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows as plain dicts (nulls as None), sorted for a stable comparison."""
    if sort:
        frame = frame.sort_values(sort, kind="stable")
    out = []
    for row in frame.to_dict("records"):
        out.append(
            {k: (None if not isinstance(v, (list, tuple)) and pd.isna(v) else v) for k, v in row.items()}
        )
    return out


def qrow(**values: Any) -> dict[str, Any]:
    """A queue_lag row with this test module's defaults."""
    row = {
        "cluster": "c1",
        "consumer_group": "G",
        "topic": "T",
        "topic_kind": "main",
        "broker_name": "b1",
        "queue_id": 0,
        "ts_ms": T0,
        "consumer_offset": None,
        "broker_offset": None,
        "lag_messages": None,
        "offset_clamped": False,
        "time_lag_ms": None,
        "time_lag_method": "unknown",
        "start_policy": None,
        "last_commit_ms": None,
        "owner_client_id": None,
        "reported_by": None,
        "owner_mismatch": False,
        "status": "OK",
        "event_date": DAY,
    }
    row.update(values)
    return row


def grow(**values: Any) -> dict[str, Any]:
    row = {
        "cluster": "c1",
        "consumer_group": "G",
        "ts_ms": T0,
        "status": "OK",
        "previous_status": None,
        "total_lag": None,
        "max_time_lag_ms": None,
        "retry_lag": None,
        "dlq_lag": None,
        "worst_topic": "T",
        "worst_broker": "b1",
        "worst_queue_id": 0,
        "worst_owner": None,
        "queues": 1,
        "mismatched_queues": 0,
        "idle_consumers": [],
        "alert": False,
        "alert_reason": None,
        "event_date": DAY,
        "burrow_status": "OK",
        "complete": 0.0,
        "max_lag": None,
        "maxlag_topic": "T",
        "maxlag_broker": "b1",
        "maxlag_queue_id": 0,
    }
    row.update(values)
    return row


def run(batches: list[tuple[list[Any], int]], cfg: LagConfig = CFG):  # type: ignore[no-untyped-def]
    state = initial_state("c1", cfg)
    outs = []
    for events, now in batches:
        state, out = step(state, events_frame(events), now, cfg)
        outs.append(out)
    return state, outs


def test_offsets_above_the_known_maximum_are_reported_and_clamped() -> None:
    events = [send(T0 - 1000 + i * 100, 0, i) for i in range(10)]
    events += [progress(T0, 0, 15, client="c-1"), progress(T0, 1, 12, broker_offset=10)]
    _, (out,) = run([(events, T0)])
    common = {
        "broker_offset": 10,
        "lag_messages": 0,
        "offset_clamped": True,
        "time_lag_ms": 0,
        "time_lag_method": "idle",
        "last_commit_ms": T0,
    }
    assert records(out.queue_lag, ["queue_id"]) == [
        qrow(queue_id=0, consumer_offset=15, reported_by="c-1", **common),
        qrow(queue_id=1, consumer_offset=12, **common),
    ]
    assert records(out.group_status) == [grow(total_lag=0, max_time_lag_ms=0, queues=2, max_lag=0)]


def test_progress_events_alone() -> None:
    events = [
        progress(T0, 0, 90, broker_offset=100, last_ts=T0 - 60_000),  # index point 89 -> T0-60s
        progress(T0, 1, 50, broker_offset=50, last_ts=T0 - 1_000),
        progress(T0, 2, 10, broker_offset=20),  # no store time known at all
    ]
    _, (out,) = run([(events, T0)])
    assert records(out.queue_lag, ["queue_id"]) == [
        qrow(
            queue_id=0,
            consumer_offset=90,
            broker_offset=100,
            lag_messages=10,
            time_lag_ms=60_000,
            time_lag_method="extrapolated",
            last_commit_ms=T0,
            status="STALL",  # Burrow: one commit with lag "never moved"
        ),
        qrow(
            queue_id=1,
            consumer_offset=50,
            broker_offset=50,
            lag_messages=0,
            time_lag_ms=0,
            time_lag_method="idle",
            last_commit_ms=T0,
        ),
        qrow(
            queue_id=2,
            consumer_offset=10,
            broker_offset=20,
            lag_messages=10,
            last_commit_ms=T0,
            status="STALL",
        ),
    ]
    assert records(out.group_status) == [
        grow(
            status="STALL",
            total_lag=20,
            max_time_lag_ms=60_000,
            queues=3,
            alert=True,
            alert_reason="status NEW->STALL",
            burrow_status="ERR",
            max_lag=10,
        )
    ]


def test_send_results_alone_give_unknown_lag_not_zero() -> None:
    sends = [send(T0 - 500, q, 4) for q in (0, 1)]
    _, (alone,) = run([(sends, T0)])
    assert alone.queue_lag.empty and alone.group_status.empty  # no group is known at all
    _, (out,) = run([(sends + [membership(T0 - 900, ["c2", "c1"])], T0)])
    assert records(out.queue_lag, ["queue_id"]) == [
        qrow(queue_id=q, broker_offset=5, status="UNKNOWN", owner_client_id=f"c{q + 1}") for q in (0, 1)
    ]
    assert records(out.group_status) == [grow(status="UNKNOWN", queues=2, worst_owner="c1")]


def test_consume_from_where_for_an_offset_of_minus_one() -> None:
    cfg = LagConfig(
        window_commits=4,
        min_commits=3,
        queue_row_interval_s=0,
        groups={
            "GF": LagGroupConfig("CONSUME_FROM_FIRST_OFFSET"),
            "GT": LagGroupConfig("CONSUME_FROM_TIMESTAMP", T0 - 5_500),
            "GT2": LagGroupConfig("CONSUME_FROM_TIMESTAMP"),
        },
    )
    now = T0
    events = [send(T0 - 10_000 + i * 1000, 0, i) for i in range(10)]  # offset i stored at T0-10s+i s
    events += [progress(now, 0, -1, group=g) for g in ("GL", "GF", "GT", "GT2")]
    events += [progress(now, 0, -1, group="GL", topic="%RETRY%GL", broker_offset=7)]
    events += [progress(now, 0, -1, group="GL", topic="%DLQ%GL", broker_offset=3)]
    _, (out,) = run([(events, now)], cfg)
    # Burrow: one commit with lag is STALL ("never moved"); GL's main queue has none
    base = {"ts_ms": now, "last_commit_ms": now, "status": "STALL"}
    assert records(out.queue_lag, ["consumer_group", "topic"]) == [
        qrow(
            consumer_group="GF",
            consumer_offset=0,
            broker_offset=10,
            lag_messages=10,
            time_lag_ms=10_000,
            time_lag_method="exact",
            start_policy="CONSUME_FROM_FIRST_OFFSET",
            **base,
        ),
        qrow(
            consumer_group="GL",
            topic="%DLQ%GL",
            topic_kind="dlq",
            consumer_offset=0,
            broker_offset=3,
            lag_messages=3,
            start_policy="DLQ_NOT_CONSUMED",
            **base,
        ),
        qrow(
            consumer_group="GL",
            topic="%RETRY%GL",
            topic_kind="retry",
            consumer_offset=0,
            broker_offset=7,
            lag_messages=7,
            start_policy="CONSUME_FROM_LAST_OFFSET",
            **base,
        ),
        qrow(
            consumer_group="GL",
            consumer_offset=10,
            broker_offset=10,
            lag_messages=0,
            time_lag_ms=0,
            time_lag_method="idle",
            start_policy="CONSUME_FROM_LAST_OFFSET",
            **{**base, "status": "OK"},
        ),
        # first message stored at or after T0-5.5s: between 4 (T0-6s) and 5 (T0-5s) -> 5
        qrow(
            consumer_group="GT",
            consumer_offset=5,
            broker_offset=10,
            lag_messages=5,
            time_lag_ms=5_000,
            time_lag_method="exact",
            start_policy="CONSUME_FROM_TIMESTAMP",
            **base,
        ),
        # default start: 30 min before the queue was first seen, before every message -> offset 0
        qrow(
            consumer_group="GT2",
            consumer_offset=0,
            broker_offset=10,
            lag_messages=10,
            time_lag_ms=10_000,
            time_lag_method="exact",
            start_policy="CONSUME_FROM_TIMESTAMP",
            **base,
        ),
    ]
    groups = {r["consumer_group"]: r for r in records(out.group_status)}
    assert groups["GL"] == grow(
        consumer_group="GL", total_lag=0, max_time_lag_ms=0, retry_lag=7, dlq_lag=3, max_lag=0
    )


def test_retry_and_dlq_do_not_decide_the_status_or_the_worst_queue() -> None:
    events = [
        progress(T0, 0, 5, broker_offset=5),
        progress(T0, 0, 1, topic="%RETRY%G", broker_offset=40),
        progress(T0, 0, 0, topic="%DLQ%G", broker_offset=900),
    ]
    _, (out,) = run([(events, T0)])
    assert records(out.group_status) == [
        grow(total_lag=0, max_time_lag_ms=0, retry_lag=39, dlq_lag=900, max_lag=0)
    ]


def test_ownership_idle_consumers_and_progress_from_a_non_owner() -> None:
    t1, t2 = T0 + 1_000, T0 + 30_000
    first = [membership(T0, ["c3", "c1", "c2"])] + [send(T0 + 10 * i, q, i) for q in (0, 1) for i in range(5)]
    first += [progress(t1, 0, 3, client="c1"), progress(t1, 1, 2, client="c1")]  # c1 inside the 20 s grace
    second = [progress(t2, 1, 3, client="c1")]
    _, (a, b) = run([(first, t1), (second, t2)])
    # Burrow: queue 0 (one commit, lag 2, broker offsets above it) is STOP at t2; queue 1 moved: OK
    assert records(b.queue_lag[b.queue_lag["queue_id"] == 0])[0]["status"] == "STOP"
    b = dataclasses.replace(b, queue_lag=b.queue_lag[b.queue_lag["queue_id"] == 1])
    owners = {r["queue_id"]: (r["owner_client_id"], r["owner_mismatch"]) for r in records(a.queue_lag)}
    assert owners == {0: ("c1", False), 1: ("c2", False)}
    assert records(a.group_status)[0]["idle_consumers"] == ["c3"]
    assert records(b.queue_lag) == [
        qrow(
            queue_id=1,
            ts_ms=t2,
            consumer_offset=3,
            broker_offset=5,
            lag_messages=2,
            time_lag_ms=t2 - (T0 + 30),
            time_lag_method="exact",
            last_commit_ms=t2,
            owner_client_id="c2",
            reported_by="c1",
            owner_mismatch=True,
        )
    ]
    (g,) = records(b.group_status)
    assert (g["mismatched_queues"], g["idle_consumers"], g["queues"]) == (1, ["c3"], 2)


def test_events_too_far_in_the_future_are_quarantined() -> None:
    far = T0 + 2 * 3_600_000
    state, (_, out) = run([([progress(T0, 0, 1, broker_offset=2)], T0), ([progress(far, 0, 2)], T0 + 5_000)])
    assert state.clock_ms == T0 + 5_000
    # the far event is not applied: the only row is the T0 commit turning STOP (Burrow) at T0 + 5 s
    assert [(r["consumer_offset"], r["last_commit_ms"], r["status"]) for r in records(out.queue_lag)] == [
        (1, T0, "STOP")
    ]
    (q,) = records(out.quarantine)
    assert (q["reason"], q["stage"], q["event_kind"], q["source_offset"]) == (
        "future_ts",
        "lag",
        "consumer_progress",
        0,
    )


def test_events_at_or_before_the_watermark_are_quarantined_as_late() -> None:
    state = initial_state("c1", CFG)
    state, _ = step(state, events_frame([progress(T0, 0, 1, broker_offset=2)]), T0, CFG, watermark_ms=0)
    batch = events_frame([progress(T0 + 1_000, 0, 1), progress(T0 + 9_000, 1, 3, broker_offset=5)])
    state, out = step(state, batch, T0 + 9_000, CFG, watermark_ms=T0 + 1_000)
    (q,) = records(out.quarantine)
    assert (q["reason"], q["stage"], q["event_kind"]) == ("late", "lag", "consumer_progress")
    assert "at or before the watermark" in q["detail"]
    got = {r["queue_id"]: (r["consumer_offset"], r["last_commit_ms"]) for r in records(out.queue_lag)}
    assert got[1] == (3, T0 + 9_000)  # the on-time event is applied
    assert got.get(0, (1, T0)) == (1, T0)  # the late one is not (queue 0 may report turning STOP)


def test_idle_pairs_queues_and_groups_expire() -> None:
    cfg = LagConfig(window_commits=4, min_commits=3, queue_idle_expiry_s=60, queue_row_interval_s=0)
    later = T0 + 61_000
    state, (_, out) = run(
        [
            ([send(T0, 0, 0), progress(T0, 0, 0)], T0),
            ([progress(later, 0, 1, group="H", topic="U", broker_offset=1)], later),
        ],
        cfg,
    )
    gone = {r["consumer_group"]: r for r in records(out.group_status)}["G"]
    assert gone == grow(
        ts_ms=later,
        status="UNKNOWN",
        previous_status="STALL",  # Burrow: its one commit (lag 1) was STALL
        queues=0,
        worst_topic=None,
        worst_broker=None,
        worst_queue_id=None,
        burrow_status="NOTFOUND",
        complete=1.0,
        maxlag_topic=None,
        maxlag_broker=None,
        maxlag_queue_id=None,
    )
    assert list(state.group_names[state.pairs["gcode"]]) == ["H"]
    assert list(state.topic_names[state.queues["tcode"]]) == ["U"]
    assert len(state.index) == 0 and list(state.group_names[state.groups["gcode"]]) == ["H"]


def test_state_survives_encoding_and_continues_identically() -> None:
    batches = [
        (
            [membership(T0, ["c1", "c2"])]
            + [send(T0 + i, q, i) for q in (0, 1) for i in range(3)]
            + [progress(T0 + 5, 0, 1, client="c2")],
            T0 + 5,
        ),
        ([send(T0 + 6_000, 0, 3), progress(T0 + 6_000, 0, 2, client="c1")], T0 + 6_000),
    ]
    state, _ = run(batches[:1])
    restored = decode_state(encode_state(state), CFG.window_commits)
    assert encode_state(restored) == encode_state(state)
    _, a = step(state, events_frame(batches[1][0]), batches[1][1], CFG)
    _, b = step(restored, events_frame(batches[1][0]), batches[1][1], CFG)
    pd.testing.assert_frame_equal(a.queue_lag, b.queue_lag)
    pd.testing.assert_frame_equal(a.group_status, b.group_status)


def test_broker_offset_samples_survive_the_codec() -> None:
    """The queues' recent broker offsets round-trip; a state encoded before they existed starts empty."""
    import pyarrow as pa

    from pipeline.ipc import ipc_table
    from pipeline.lag.codec import _to_ipc

    batches = [([send(T0 + 10_000 * k, q, k) for q in (0, 1)] + [progress(T0 + 10_000 * k, 0, k)], T0 + 10_000 * k)
               for k in range(6)]  # fmt: skip
    state, _ = run(batches)
    assert (state.brokers.slot[0] != -1).sum() == 4  # four 10 s slots kept (window_commits)
    restored = decode_state(encode_state(state), CFG.window_commits)
    assert np.array_equal(restored.brokers.slot, state.brokers.slot)
    assert np.array_equal(restored.brokers.offset, state.brokers.offset)
    row = list(encode_state(state))
    queues = ipc_table(row[5])
    row[5] = _to_ipc(
        {n: queues.column(n).combine_chunks() for n in queues.column_names if not n.startswith("bo_")}
    )
    old = decode_state(tuple(row), CFG.window_commits)
    assert old.brokers.slot.shape == (2, 4) and (old.brokers.slot == -1).all()
    assert isinstance(queues.column("bo_slot").type, pa.FixedSizeListType)


def test_rules_are_chosen_by_name() -> None:
    """The same commits under each rule set: one commit with a lag is STALL for Burrow, OK otherwise."""
    events = [send(T0 - 1_000, 0, 9), progress(T0, 0, 5)]
    statuses = {}
    for rules in ("burrow", "faultwatch"):
        cfg = dataclasses.replace(CFG, rules=rules)
        _, (out,) = run([(events, T0)], cfg)
        statuses[rules] = (out.queue_lag["status"].tolist(), out.group_status["burrow_status"].tolist())
    assert statuses == {"burrow": (["STALL"], ["ERR"]), "faultwatch": (["OK"], ["OK"])}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"min_commits": 11}, "lag.min_commits must be between 2 and lag.window_commits"),
        ({"index_points": 4}, "lag.index_points must be >= 8"),
        ({"default": {"consume_from_where": "CONSUME_FROM_MIDDLE"}}, "lag.default.consume_from_where"),
        ({"shards": 0}, "lag.shards must be > 0"),
        ({"rules": "kafka"}, r"lag.rules: 'kafka' is not valid; valid values: \['burrow', 'faultwatch'\]"),
        ({"allowed_lag": -1}, "lag.allowed_lag must be >= 0"),
        ({"minimum_complete": 1.5}, "lag.minimum_complete must be between 0 and 1"),
        ({"broker_offset_refresh_ms": 0}, "lag.broker_offset_refresh_ms must be > 0"),
    ],
)
def test_lag_config_is_validated_naming_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict({"lag": raw})


PROBE = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "kafka", "airflow"):
            raise ImportError("blocked import of " + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib, pipeline.lag as pkg
for m in pkgutil.walk_packages(pkg.__path__, "pipeline.lag."):
    importlib.import_module(m.name)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "kafka", "airflow")))
"""


def test_lag_core_imports_no_spark_kafka_or_airflow() -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=repo, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_queue_rows_are_sampled_but_changes_always_reported() -> None:
    """A caught-up queue gets a row when new, then at most once per 60 s; a status change at once.
    The group gets a row with every commit."""
    cfg = LagConfig(window_commits=4, min_commits=3)
    seconds = [1, 20, 40, 61, 62]
    batches = [
        ([send(T0 + 1_000 * s, 0, i), progress(T0 + 1_000 * s, 0, i + 1)], T0 + 1_000 * s)
        for i, s in enumerate(seconds)
    ]
    # No commit after 62 s. At 200 s a new message arrives, but Burrow's broker offsets of the last
    # 4 x 10 s still hold one at the last commit: excused. At 240 s they no longer do: STOP.
    batches.append(([send(T0 + 200_000, 0, 5)], T0 + 200_000))
    batches.append(([send(T0 + 240_000, 0, 6)], T0 + 240_000))
    _, outs = run(batches, cfg)
    rows = [[((r["ts_ms"] - T0) // 1000, r["status"]) for r in records(o.queue_lag)] for o in outs]
    assert rows == [[(1, "OK")], [], [], [(61, "OK")], [], [], [(240, "STOP")]]
    assert [len(o.group_status) for o in outs] == [1, 1, 1, 1, 1, 1, 1]


def test_name_and_queue_numbering_stay_bounded_and_change_nothing() -> None:
    """Renumbering (queue sequence near 2^31) and dropping unused names keep every output equal."""
    import dataclasses

    from pipeline.lag import retention
    from pipeline.lag.offsets import OffsetIndex

    events = [membership(T0, ["c1", "c2"])] + [send(T0 + i, q, i) for q in (0, 1) for i in range(3)]
    events += [progress(T0 + 5, q, 1, client="c1") for q in (0, 1)]
    state, _ = run([(events, T0 + 5)])
    shifted = dataclasses.replace(
        state,
        queues=state.queues.replace(qkey=state.queues["qkey"] + 2**31),
        pairs=state.pairs.replace(
            qkey=state.pairs["qkey"] + 2**31,
            pkey=(state.pairs["gcode"] << 32) | (state.pairs["qkey"] + 2**31),
        ),
        index=OffsetIndex(state.index.qkey + 2**31, state.index.offset, state.index.store_ms),
        next_qkey=state.next_qkey + 2**31,
        group_names=np.concatenate(
            [state.group_names, np.array([f"old{i}" for i in range(3000)], dtype=object)]
        ),
    )
    renumbered = retention.renumber_queues(retention.compact_names(shifted))
    assert renumbered.next_qkey == 2 and list(renumbered.queues["qkey"]) == [0, 1]
    assert list(renumbered.group_names) == ["G"]
    later = [send(T0 + 6_000, 0, 3), progress(T0 + 6_000, 0, 3, client="c2")]
    _, a = step(state, events_frame(later), T0 + 6_000, CFG)
    _, b = step(renumbered, events_frame(later), T0 + 6_000, CFG)
    pd.testing.assert_frame_equal(a.queue_lag, b.queue_lag)
    pd.testing.assert_frame_equal(a.group_status, b.group_status)
