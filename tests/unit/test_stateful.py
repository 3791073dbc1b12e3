"""The step contract: each concern stepped through it writes what its pure step writes.

The input is what the Kafka readers send (bronze rows cut by :mod:`streaming.feeds`, dictionary-
encoded, through Arrow IPC); the state lives in Spark's own ``GroupState`` between batches, with
the event-time timeout the step asked for. Routed rows keep integers, booleans, maps and lists.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from pipeline.config import FaultsConfig, LagConfig
from pipeline.faults import EVENT_COLUMNS, from_send_results
from pipeline.faults import initial_state as fault_initial
from pipeline.faults import step as fault_step
from pipeline.faults.concern import BrokerFaults, FleetFaults, output_tables
from pipeline.faults.frame import take
from pipeline.ipc import ipc_bytes, ipc_table
from pipeline.lag import events_frame
from pipeline.lag import initial_state as lag_initial
from pipeline.lag import step as lag_step
from pipeline.lag.codec import encode_state as lag_encode
from pipeline.lag.concern import Lag
from pipeline.stateful import Clock
from schemas.tables import ROUTE_COLUMN, table
from streaming.feeds import LAG, fault_feed, lag_feed, parts_of
from streaming.stateful import event_clock, read_chunks, routed_frame, step_key
from tests.doubles.faults_synth import bronze_table, random_stream
from tests.doubles.lag_synth import bronze_rows, membership, progress, send

T0 = 1_700_000_000_000
DELAY = 30_000


def group_state(row: tuple[Any, ...] | None, watermark: int, timed_out: bool = False) -> GroupState:
    """Spark's state object for one key, as the Python worker gets it."""
    return GroupState(row, 0, watermark, GroupStateTimeout.EventTimeTimeout, timed_out, True,
                      row is not None, False, False, GroupState.NO_TIMESTAMP, b"", None)


def reader_frame(chunks: list[tuple[str, str, pa.Table]], settle: int, now: int) -> pd.DataFrame:
    """One key's chunk rows as the stateful operator receives them."""
    return pd.DataFrame({"_key": [k for k, _, _ in chunks], ROUTE_COLUMN: [n for _, n, _ in chunks],
                         "rows": [t.num_rows for _, _, t in chunks],
                         "arrow": [ipc_bytes(t) for _, _, t in chunks], "_settle_ms": settle, "_now_ms": now})


def test_ipc_round_trip_keeps_types_and_nulls_and_compression_is_smaller() -> None:
    rows = pa.table({"a": pa.array([1, None, 3] * 1000, pa.int64()),
                     "b": pa.array(["x", None, "y"] * 1000).dictionary_encode(),
                     "c": pa.array([["p"], None, []] * 1000, pa.list_(pa.string()))})
    for compress in (False, True):
        assert ipc_table(ipc_bytes(rows, compress=compress)).equals(rows)
    assert len(ipc_bytes(rows, compress=True)) < len(ipc_bytes(rows)) / 5


@pytest.mark.parametrize("decode", [False, True])  # False: dictionary codes, as the combined query reads them
def test_broker_faults_through_the_contract_write_what_the_pure_step_writes(decode: bool) -> None:
    cfg = FaultsConfig()
    events = from_send_results(random_stream(3, producers=8, brokers=1, events=1500, span_ms=300_000))
    ts = events["ts_ms"]
    cuts = [int(ts.min()) + k * 60_000 for k in range(1, 5)] + [int(ts.max()) + 1]
    concern, pure = BrokerFaults(cfg), fault_initial("c1")
    row, watermark, lo = None, 0, 0
    for hi in cuts:
        part = take(events, (ts >= lo) & (ts < hi))
        lo, settle = hi, hi - DELAY
        chunks = fault_feed(bronze_table(part).drop_columns([ROUTE_COLUMN]), EVENT_COLUMNS, cfg.shards)
        frame = reader_frame(chunks, settle, hi)
        tables, got_settle, now = read_chunks(iter([frame]), decode)
        assert (got_settle, now) == (settle, hi)
        assert pa.types.is_dictionary(tables["send_results"][0].schema.field("status").type) != decode
        state = group_state(row, watermark)
        clock = event_clock(state, settle, now)
        got = step_key(concern, "c1", state, concern.events(tables), clock)
        pure, out = fault_step(pure, part, watermark, cfg, hi, max(settle, watermark), points=True)
        want = output_tables(out)
        assert sorted(got) == sorted(want) and "_points" in got
        for name, rows in want.items():
            assert got[name].equals(rows), name
            assert got[name].schema == rows.schema
        assert state.exists and state.get == concern.encode(pure)
        assert state.getCurrentWatermarkMs() == watermark
        assert state._timeout_timestamp == max(out.wakeup_ms - 1, watermark + 1)  # Spark reads this field
        row, watermark = state.get, max(settle, watermark)
    # event time far ahead: a timed-out step settles everything and the key is dropped
    late = 10 * 3_600_000 + watermark
    state = group_state(row, late, timed_out=True)
    step_key(concern, "c1", state, concern.events({}), event_clock(state))
    assert not state.exists


def test_fleet_faults_keeps_every_cluster_under_one_key_and_asks_for_no_timeout() -> None:
    cfg = FaultsConfig()
    sends = (random_stream(4, producers=6, brokers=3, events=600)
             + random_stream(5, producers=6, brokers=3, events=600, cluster="c2"))
    chunks = {"send_results": [bronze_table(from_send_results(sends))]}
    concern = FleetFaults(cfg, DELAY)
    done = concern.step(concern.initial("_all"), concern.events(chunks), Clock(now_ms=sends[-1].ts_ms))
    assert sorted(done.state.clusters) == ["c1", "c2"] and done.wakeup_ms is None
    assert concern.encode(concern.decode(concern.encode(done.state))) == concern.encode(done.state)
    assert set(done.tables) <= {"producer_fault_windows_live", "producer_fault_windows", "broker_fault_episodes_live",
                                "broker_fault_episodes", "broker_health", "quarantine"}
    assert done.tables["producer_fault_windows_live"].num_rows > 0


def bronze_chunks(evs: list[Any], cfg: LagConfig) -> dict[str, list[pa.Table]]:
    """Events as the lag key's chunks: bronze rows cut by the readers' lag feed, through IPC."""
    routed = bronze_rows(events_frame(evs), topics={k: "memory" for k in ("send_result", "consumer_progress",
                                                                          "group_membership")})
    names = routed.column(ROUTE_COLUMN).to_pylist()
    by_table = {}
    for name in sorted(set(names)):
        rows = routed.filter(pa.array([n == name for n in names]))
        by_table[name] = rows.select(table(name).columns)
    feed = lag_feed(by_table, cfg.shards)
    assert [parts_of(key)[:3] for key, _, _ in feed] == [[LAG, "c1", "0"]] * len(feed)
    tables, _, _ = read_chunks(iter([reader_frame(feed, 0, 0)]))
    return tables


def test_lag_through_the_contract_writes_what_the_pure_step_writes() -> None:
    cfg = LagConfig(window_commits=4, min_commits=3, queue_row_interval_s=0)
    batches = [
        [membership(T0, ["a", "b"]), send(T0 + 1, 0, 10), send(T0 + 2, 1, 20), progress(T0 + 3, 0, 4, client="a")],
        [progress(T0 + 1, 1, 5), send(T0 + 60_000, 0, 30), progress(T0 + 61_000, 0, 8, client="b"),
         progress(T0 + 61_000, 1, 9, broker_offset=40, last_ts=T0), membership(T0 + 62_000, ["a"], group="H")],
        # late (the watermark is 30 s behind the clock), on time, too far ahead
        [progress(T0 + 10_000, 1, 9), progress(T0 + 120_000, 0, 30), send(T0 + 9 * 3_600_000, 0, 31)],
    ]
    concern = Lag(cfg, DELAY)
    pure, row, watermark = lag_initial("c1", cfg), None, 0
    seen = set()
    for evs in batches:
        state = group_state(row, watermark)
        got = step_key(concern, "c1", state, concern.events(bronze_chunks(evs, cfg)), event_clock(state))
        frame = events_frame(evs).assign(src_ts_ms=lambda f: f["ts_ms"])  # bronze's kafka_ts_ms
        pure, out = lag_step(pure, frame, 0, cfg, watermark_ms=watermark)
        for name, rows in (("queue_lag", out.queue_lag), ("group_status", out.group_status),
                           ("quarantine", out.quarantine)):
            schema = table(name).arrow_schema()
            if len(rows):
                want = pa.Table.from_pandas(rows[schema.names], schema=schema, preserve_index=False)
                assert got[name].to_pylist() == want.to_pylist(), name
                seen.add(name)
            else:
                assert name not in got
        assert concern.encode(concern.decode(state.get)) == lag_encode(pure)
        idle = int(cfg.idle_evaluation_s * 1000)
        assert state._timeout_timestamp == max(pure.clock_ms, watermark) + idle
        row, watermark = state.get, pure.clock_ms - DELAY
    assert seen == {"queue_lag", "group_status", "quarantine"}
    assert sorted(got["quarantine"].column("reason").to_pylist()) == ["future_ts", "late"]
    # a silent shard is judged at the watermark plus the delay
    state = group_state(row, watermark + 600_000, timed_out=True)
    got = step_key(concern, "c1", state, concern.events({}), event_clock(state))
    watermark += 600_000
    pure, out = lag_step(pure, events_frame([]), watermark + DELAY, cfg, watermark_ms=watermark)
    assert concern.encode(concern.decode(state.get)) == lag_encode(pure)
    assert len(out.queue_lag) and got["queue_lag"].num_rows == len(out.queue_lag)


def test_routed_frame_keeps_nullable_integers_booleans_maps_and_lists() -> None:
    names = ["broker_health", "group_status", "quarantine"]
    health = {"cluster": "c1", "broker_name": "b1", "minute_ms": T0, "sends": 5, "failures": 2,
              "failures_by_error": {"E": 2}, "failure_rate": 0.4, "latency_p50_ms": 1.0, "latency_p95_ms": 2.0,
              "latency_p99_ms": 3.0, "latency_max_ms": 4, "active_producers": 3, "producers_avoiding": 1,
              "event_date": "2023-11-14"}
    status = dict.fromkeys(table("group_status").columns) | {
        "cluster": "c1", "consumer_group": "G", "ts_ms": T0, "status": "OK", "queues": 4, "mismatched_queues": 0,
        "idle_consumers": ["a", "b"], "alert": False, "event_date": "2023-11-14", "burrow_status": "OK",
        "complete": 1.0}
    tables = {name: pa.Table.from_pylist([rows], schema=table(name).arrow_schema())
              for name, rows in (("broker_health", health), ("group_status", status))}
    frame = routed_frame(tables, names)
    assert frame[ROUTE_COLUMN].tolist() == ["broker_health", "group_status"]
    assert str(frame["ts_ms"].dtype) == "Int64" and frame["ts_ms"].isna().tolist() == [True, False]
    assert str(frame["active_producers"].dtype) == "Int32" and frame["active_producers"].tolist()[0] == 3
    assert str(frame["alert"].dtype) == "boolean" and frame["alert"].isna().tolist() == [True, False]
    assert frame["failures_by_error"].tolist()[0] == {"E": 2}
    assert list(frame["idle_consumers"].tolist()[1]) == ["a", "b"]
    assert frame["total_lag"].isna().all()
    empty = routed_frame({}, names)
    assert len(empty) == 0 and list(empty.columns) == list(frame.columns)


@pytest.mark.parametrize("watermark", [0, T0])
def test_the_clock_of_a_timed_out_key_has_no_batch(watermark: int) -> None:
    timed_out = event_clock(group_state(None, watermark, timed_out=True), T0 + 5, T0)
    assert timed_out == Clock(watermark, watermark, None, True)
    assert event_clock(group_state(None, watermark), T0 - 5, T0) == Clock(watermark, max(watermark, T0 - 5), T0)


def test_freed_heap_goes_back_to_the_os_only_when_a_step_left_much(monkeypatch: pytest.MonkeyPatch) -> None:
    from streaming import faults_query

    trims: list[int] = []

    class Libc:
        def malloc_trim(self, pad: int) -> None:
            trims.append(pad)

    monkeypatch.setattr(faults_query, "_glibc", lambda: Libc())
    for free, count in ((faults_query.TRIM_FREE_BYTES - 1, 0), (faults_query.TRIM_FREE_BYTES, 1), (None, 2)):
        monkeypatch.setattr(faults_query, "_free_heap", lambda libc, free=free: free)
        faults_query.release_memory()
        assert len(trims) == count
    monkeypatch.undo()
    libc = faults_query._glibc()
    assert libc is None or isinstance(faults_query._free_heap(libc), (int, type(None)))
    faults_query.release_memory()
