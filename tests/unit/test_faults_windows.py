"""``producer_fault_windows`` from the pure step equals the pure rules on the whole stream.

Oracles: :func:`pipeline.rocketmq.derive_windows` over each producer x broker's complete ordered
stream (no batches, no state), the Java client's own ``start_timestamp`` values in the
differential vectors, and the simulator's clients (their recorded avoid-until times).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import FaultsConfig
from pipeline.faults import decode_state, encode_state, from_send_results, initial_state, step
from pipeline.faults.frame import take
from schemas.events import SendResult, decode_event
from tests.doubles.faults_reference import (
    current_view,
    expected_windows,
    run_steps,
    uses_default_tables,
    vector_events,
    window_keys,
    windows_from_vector,
)
from tests.doubles.faults_synth import T0, random_stream

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq-vectors"
CFG = FaultsConfig()
FAR = 4_000_000_000_000


def cases(version: str) -> list[dict]:
    with open(VECTORS / f"faults-{version}.jsonl") as fh:
        return [json.loads(line) for line in fh]


def split_by_time(events: list[SendResult], cuts: list[int]) -> list[list[SendResult]]:
    """Consecutive batches of an ordered stream, cut before the given timestamps."""
    out, current, bounds = [], [], sorted(cuts)
    for e in events:
        while bounds and e.ts_ms >= bounds[0]:
            out.append(current)
            current = []
            bounds.pop(0)
        current.append(e)
    out.append(current)
    return out


def cols(events: list[SendResult], first_offset: int = 0) -> dict:
    return from_send_results(events, partitions=0, offsets=range(first_offset, first_offset + len(events)))


@pytest.mark.parametrize("version,client", [("4.9.8", "4.9.8"), ("5.3.3", "5.3.3")])
def test_vector_cases_give_the_windows_of_the_java_client(version: str, client: str) -> None:
    offset = T0
    checked = skipped = 0
    all_events, expected = [], []
    for case in cases(version):
        if not uses_default_tables(case):
            skipped += 1  # setLatencyMax / setNotAvailableDuration have no send-result field
            continue
        evs = vector_events(case, client, offset)
        all_events += evs
        enabled = case["input"].get("send_latency_fault_enable", True)
        if enabled:
            expected += [("vectors", "PG_vectors", case["case_id"], b, s, e)
                         for b, s, e in windows_from_vector(case, offset)]
        checked += 1
    all_events.sort(key=lambda e: e.ts_ms)  # stable: each case keeps its own order for equal ts
    ts = sorted({e.ts_ms for e in all_events})
    batches = split_by_time(all_events, [ts[len(ts) // 3], ts[2 * len(ts) // 3]])
    offsets = np.cumsum([0] + [len(b) for b in batches])
    steps = [(cols(b, int(o)), 0) for b, o in zip(batches, offsets)] + [(cols([]), FAR)]
    _, rows = run_steps("vectors", steps, CFG)
    view = current_view(rows["windows"])
    assert window_keys(view, fault_enable=True) == sorted(expected)
    assert all(r["state"] == "closed" for r in view)
    assert checked >= 100 and skipped <= 15
    # fault tolerance off: the same producers are tracked with their shadow windows, flagged
    off = [c for c in cases(version) if c["input"].get("send_latency_fault_enable") is False]
    assert off, "the vectors hold cases with fault tolerance off"
    shadow = {r["client_id"] for r in view if not r["fault_enable"]}
    assert shadow <= {c["case_id"] for c in off}


def disorder(events: list[SendResult], rng: random.Random, delay_ms: int, batch_ms: int) -> list[list[SendResult]]:
    """Deliver an ordered stream in batches, each event up to ``delay_ms`` late, ordered by arrival."""
    arrivals = sorted(events, key=lambda e: (e.ts_ms + rng.randrange(delay_ms + 1), rng.random()))
    batches: dict[int, list[SendResult]] = defaultdict(list)
    for k, e in enumerate(arrivals):
        batches[k * 7 // 300].append(e)  # ~43 events per batch, in arrival order
    return [batches[k] for k in sorted(batches)]


def run_disordered(events: list[SendResult], seed: int, delay_ms: int) -> tuple[list[SendResult], dict, object]:
    """Batches with the watermark following the max event time minus ``delay_ms`` (as Spark's)."""
    rng = random.Random(seed)
    steps, accepted, wm, max_ts, offset = [], [], 0, 0, 0
    for batch in disorder(events, rng, delay_ms * 2, 2000):
        steps.append((cols(batch, offset), wm))
        accepted += [e for e in batch if e.ts_ms > wm]
        offset += len(batch)
        max_ts = max([max_ts] + [e.ts_ms for e in batch])
        wm = max(wm, max_ts - delay_ms)
    steps.append((cols([], offset), FAR))
    state, rows = run_steps("c1", steps, CFG)
    return accepted, rows, state


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), delay=st.sampled_from([0, 50, 3000]))
def test_disordered_batches_give_the_windows_of_the_whole_stream(seed: int, delay: int) -> None:
    events = random_stream(seed, producers=10, brokers=3, events=900, span_ms=60_000)
    accepted, rows, state = run_disordered(events, seed, delay)
    expected = expected_windows(from_send_results(accepted), fault_enable=None)
    view = current_view(rows["windows"])
    assert window_keys(view) == expected
    late = [r for r in rows["quarantine"] if r["reason"] == "late"]
    assert len(late) + len(accepted) == len(events)
    assert all(r["state"] == "closed" for r in view)
    assert state.pairs["pair"].size == 0 or state.watermark_ms == FAR


def test_rows_are_final_once_closed_and_revisions_grow() -> None:
    events = random_stream(3, producers=10, brokers=3, events=1500, span_ms=90_000)
    _, rows, _ = run_disordered(events, 3, 3000)
    by_id = defaultdict(list)
    for r in rows["windows"]:
        by_id[r["window_id"]].append(r)
    assert by_id
    for wid, seq in by_id.items():
        revisions = [r["revision"] for r in seq]
        assert revisions == sorted(set(revisions)), wid
        states = [r["state"] for r in seq]
        assert states.count("closed") <= 1 and (states[-1] in ("closed", "retracted")), (wid, states)
        if "closed" in states:
            assert states.index("closed") == len(states) - 1


def send(ts: int, latency: int, *, offset: int, client: str = "p1", broker: str = "b1", version: str = "4.9.8",
         failed: bool = False, enable: bool | None = True, isolation: bool | None = None) -> SendResult:
    return SendResult(
        event_id=f"{client}-{offset}", ts_ms=ts, cluster="c1", producer_group="PG", client_id=client,
        client_version=version, topic="T", broker_name=broker, queue_id=0, status="FAILED" if failed else "SEND_OK",
        latency_ms=latency, error="RemotingTimeoutException" if failed else None, queue_offset=None, attempt=0,
        isolation=isolation, send_latency_fault_enable=enable,
    )


def one(events: list[SendResult], offsets: list[int]) -> dict:
    return from_send_results(events, partitions=0, offsets=offsets)


def test_an_out_of_order_update_is_applied_in_timestamp_order_and_retracts_what_never_was() -> None:
    # 4.9: a slow send at T0+100 opens [T0+100, T0+30100); a fast success at the same millisecond that
    # the producer wrote *after* it (higher offset) arrives a batch later: the window never existed.
    slow, fast = send(T0 + 100, 600, offset=10), send(T0 + 100, 5, offset=11)
    later = send(T0 + 200, 5, offset=12)
    state, out1 = step(initial_state("c1"), one([slow, later], [10, 12]), 0, CFG)
    assert [(r["state"], r["start_ms"], r["end_ms"]) for r in out1.windows] == [("open", T0 + 100, T0 + 200)]
    state, out2 = step(state, one([fast], [11]), T0, CFG)
    assert [(r["state"], r["start_ms"], r["revision"]) for r in out2.windows] == [("retracted", T0 + 100, 1)]
    # And the same events in one batch never show a window at all.
    _, out = step(initial_state("c1"), one([slow, fast, later], [10, 11, 12]), 0, CFG)
    assert out.windows == []


def test_out_of_order_across_batches_is_replayed_exactly() -> None:
    # 5.x: windows only grow. An earlier slow send delivered late extends a window already shown.
    a = send(T0 + 1000, 600, offset=1, version="5.3.3")  # 2 s window -> [1000, 3000)
    b = send(T0 + 2500, 1900, offset=2, version="5.3.3")  # 5 s from 2500 -> until 7500
    c = send(T0 + 900, 3100, offset=3, version="5.3.3")  # out of order: 6 s from 900 -> until 6900
    state, out1 = step(initial_state("c1"), one([a, b], [1, 2]), 0, CFG)
    state, out2 = step(state, one([c], [3]), T0 + 500, CFG)
    state, out3 = step(state, one([], []), FAR, CFG)
    view = current_view(out1.windows + out2.windows + out3.windows)
    expected = expected_windows(one([c, a, b], [3, 1, 2]))
    assert window_keys(view) == expected == [("c1", "PG", "p1", "b1", T0 + 900, T0 + 7500)]
    states = Counter(r["state"] for r in out1.windows + out2.windows + out3.windows)
    assert states == Counter({"open": 2, "retracted": 1, "closed": 1})


def test_ties_follow_kafka_partition_and_offset_not_arrival() -> None:
    # Same millisecond, same broker: 4.9 keeps the last update. Offsets say the slow one came last.
    slow, fast = send(T0, 600, offset=2), send(T0, 5, offset=1)
    for order in ([slow, fast], [fast, slow]):
        offsets = [2 if e is slow else 1 for e in order]
        _, out = step(initial_state("c1"), one(order, offsets), 0, CFG)
        assert [(r["start_ms"], r["end_ms"]) for r in out.windows] == [(T0, T0 + 30_000)]


def test_late_events_go_to_quarantine_re_encoded() -> None:
    early = send(T0 + 50_000, 600, offset=1)
    late = send(T0, 700, offset=2, isolation=True, failed=True)
    state, _ = step(initial_state("c1"), one([early], [1]), 0, CFG)
    _, out = step(state, one([late], [2]), T0 + 10_000, CFG)
    assert out.windows == []
    [q] = out.quarantine
    assert (q["reason"], q["stage"], q["source_offset"], q["event_kind"]) == ("late", "faults", 2, "send_result")
    assert q["raw_key"] == b"b1"
    assert decode_event("send_result", q["raw_value"]) == decode_event("send_result", late.to_json())
    assert f"watermark {T0 + 10_000}" in q["detail"]


def test_producers_without_fault_tolerance_are_tracked_and_flagged() -> None:
    on = send(T0, 600, offset=1, client="on", enable=True)
    off = send(T0, 600, offset=2, client="off", enable=False)
    default = send(T0, 600, offset=3, client="default", enable=None)
    _, out = step(initial_state("c1"), one([on, off, default], [1, 2, 3]), 0, CFG)
    flags = {r["client_id"]: r["fault_enable"] for r in out.windows}
    assert flags == {"on": True, "off": False, "default": False}  # RocketMQ's default is off
    _, out = step(initial_state("c1"), one([default], [3]),
                  0, FaultsConfig(default_send_latency_fault_enable=True))
    assert [r["fault_enable"] for r in out.windows] == [True]


def test_window_rows_carry_the_trigger_and_generation() -> None:
    a = send(T0, 5, offset=1)
    b = send(T0 + 10, 1200, offset=2, failed=True, isolation=True)
    _, out = step(initial_state("c1"), one([a, b], [1, 2]), 0, CFG)
    [row] = out.windows
    assert row["window_id"] == f"c1|PG|p1|b1|{T0 + 10}"
    assert (row["trigger_event_id"], row["trigger_status"], row["trigger_latency_ms"]) == ("p1-2", "FAILED", 1200)
    assert (row["trigger_error"], row["trigger_isolation"], row["generation"]) == ("RemotingTimeoutException", True, "4.9")
    assert (row["end_ms"], row["updates"], row["state"], row["event_date"]) == (T0 + 10 + 600_000, 1, "open", "2026-01-01")


def test_a_bad_client_version_is_quarantined() -> None:
    bad = send(T0, 600, offset=1, version="banana")
    _, out = step(initial_state("c1"), one([bad], [1]), 0, CFG)
    assert out.windows == [] and [q["reason"] for q in out.quarantine] == ["bad_client_version"]


def test_state_survives_the_state_store_encoding_unchanged() -> None:
    events = random_stream(9, events=800)
    state, _ = step(initial_state("c1"), from_send_results(events[:600]), 0, CFG)
    row = encode_state(state)
    again = decode_state(row)
    assert encode_state(again) == row
    a, out_a = step(state, from_send_results(events[600:], offsets=range(600, 800)), T0 + 10_000, CFG)
    b, out_b = step(again, from_send_results(events[600:], offsets=range(600, 800)), T0 + 10_000, CFG)
    assert out_a == out_b and encode_state(a) == encode_state(b)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_a_state_written_by_an_older_version_reads_the_same(version: int) -> None:
    """Checkpoints of older layouts still load: version 5 (as 6, open episodes without last_heard and
    recovering: test_faults_episode_close has one), version 4 (packed, LZ4), version 3 (columns raw,
    LZ4), version 2 (Arrow IPC, integer columns narrowed) and version 1 (Arrow IPC, zstd, full width)."""
    from pipeline.faults.codec import _TABLES, _compressed
    from pipeline.faults.episodes import EPISODE_SCHEMA_V5
    from pipeline.faults.frame import to_arrow, to_bytes
    from pipeline.ipc import ipc_bytes

    state, _ = step(initial_state("c1"), from_send_results(random_stream(9, events=800)), 0, CFG)
    row = encode_state(state)

    def old_blob(name: str, schema: Any) -> bytes:
        schema = EPISODE_SCHEMA_V5 if name == "episodes" else schema
        if version >= 3:
            return _compressed(to_bytes(getattr(state, name), schema, packed=version >= 4), version)
        return ipc_bytes(to_arrow(getattr(state, name), schema, narrow=version == 2), compress=version == 1)

    old = (version, row[1], *(old_blob(name, schema) if blob else b"" for (name, schema), blob in zip(_TABLES, row[2:])))
    assert row[0] == 6 and old != row
    assert encode_state(decode_state(old)) == row


@pytest.mark.parametrize("values", [[5, 5], [-3, 250, 7], [0, 70_000, 1], [-(2**40), 2**40],
                                    [np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max],
                                    [np.iinfo(np.int64).max, np.iinfo(np.int64).min, np.iinfo(np.int64).max - 3],
                                    list(range(10**12, 10**12 + 5000, 3)), [7], []])
def test_narrowed_integer_columns_come_back_exactly(values: list[int]) -> None:
    from pipeline.faults.frame import from_arrow, from_bytes, to_arrow, to_bytes
    from pipeline.ipc import ipc_bytes, ipc_table

    schema = {"i64": "int64", "i32": "int32"}
    cols = {"i64": np.asarray(values, dtype=np.int64), "i32": np.clip(values, -(2**31), 2**31 - 1).astype(np.int32)}
    for back in (from_arrow(ipc_table(ipc_bytes(to_arrow(cols, schema, narrow=True))), schema),
                 from_bytes(to_bytes(cols, schema), schema), from_bytes(to_bytes(cols, schema, packed=False), schema)):
        for name, dtype in schema.items():
            assert back[name].dtype == dtype and back[name].tolist() == cols[name].tolist()


def test_the_packed_layout_stores_a_log_in_under_half_the_bytes() -> None:
    """Serials, times and offsets in log order go as steps, wide values in byte planes: the
    compressed blob is under half the earlier layout's, and comes back exactly."""
    from pipeline.faults.codec import _compressed, _decompressed
    from pipeline.faults.frame import from_bytes, to_bytes

    rng = np.random.default_rng(3)
    n = 50_000
    schema = {"serial": "int64", "ts": "int64", "off": "int64", "latency": "int64"}
    cols = {"serial": np.arange(n, dtype=np.int64) + 9_000, "ts": T0 + np.cumsum(rng.integers(0, 3, n)),
            "off": 10**9 + np.cumsum(rng.integers(1, 3, n)), "latency": rng.integers(1, 3_000, n)}
    packed, plain = (_compressed(to_bytes(cols, schema, packed=p)) for p in (True, False))
    assert len(packed) < len(plain) / 2
    back = from_bytes(_decompressed(packed), schema)
    assert all(back[c].dtype == cols[c].dtype and back[c].tolist() == cols[c].tolist() for c in schema)


@pytest.mark.parametrize("rows", [0, 1, 300])
def test_raw_columns_come_back_exactly(rows: int) -> None:
    """Every column kind of the raw layout: strings with and without gaps, floats, booleans, int8."""
    from pipeline.faults.frame import from_bytes, to_bytes

    rng = np.random.default_rng(rows)
    schema = {"s": "object", "gaps": "object", "none": "object", "f": "float64", "b": "bool", "i8": "int8",
              "i64": "int64"}
    words = np.asarray(["a", "", "é|x", "a b"], dtype=object)
    gaps = words[rng.integers(0, 4, rows)]
    gaps[rng.random(rows) < 0.7] = None
    cols = {"s": words[rng.integers(0, 4, rows)], "gaps": gaps, "none": np.full(rows, None, dtype=object),
            "f": rng.normal(size=rows), "b": rng.random(rows) < 0.5, "i8": rng.integers(-128, 128, rows).astype(np.int8),
            "i64": rng.integers(-(2**62), 2**62, rows)}
    back = from_bytes(to_bytes(cols, schema), schema)
    for name, dtype in schema.items():
        assert back[name].dtype == dtype and back[name].tolist() == cols[name].tolist()
        back[name][:] = back[name][::-1]  # writable: the state's arrays are written to


def test_the_order_rows_arrive_in_does_not_matter() -> None:
    events = random_stream(5, events=1200)
    batch = from_send_results(events)
    perm = np.random.default_rng(1).permutation(len(events))
    _, out_a = step(initial_state("c1"), batch, 0, CFG)
    _, out_b = step(initial_state("c1"), take(batch, perm), 0, CFG)
    assert out_a == out_b and out_a.windows


def test_simulated_clients_windows_are_reproduced_across_batches() -> None:
    from pipeline.simulate import run_to_memory

    sim, sink = run_to_memory("broker-outage")
    events = sink.events("send_result")
    batch = from_send_results(events, partitions=[hash(e.broker_name) % 4 for e in events])
    ts = batch["ts_ms"]
    steps, lo = [], int(ts.min())
    while lo <= int(ts.max()):
        steps.append((take(batch, (ts >= lo) & (ts < lo + 7000)), lo - 30_000))
        lo += 7000
    steps.append((take(batch, ts < 0), FAR))
    _, rows = run_steps("DefaultCluster", steps, CFG)
    view = current_view(rows["windows"])
    mine = sorted((r["client_id"], r["broker_name"], r["start_ms"], r["end_ms"]) for r in view if r["fault_enable"])
    theirs = sorted((w.client_id, w.broker_name, w.start_ms, w.end_ms) for w in sim.client_windows())
    assert mine == theirs and theirs


def test_quarantine_and_window_rows_are_json_safe() -> None:
    """Every cell is a plain Python value (no numpy scalar), so rows go to JSON and Arrow as they are:
    windows from a stream, quarantine rows from the same stream replayed behind the watermark (late)
    and from events of an unknown client version."""
    import dataclasses

    sends = random_stream(2, events=300)
    odd = [dataclasses.replace(e, client_version="x.y") for e in sends[:5]]
    late = max(e.ts_ms for e in sends)
    _, rows = run_steps("c1", [(from_send_results(sends), 0), (from_send_results(sends + odd), late)], CFG)
    assert rows["windows"]
    assert Counter(r["reason"] for r in rows["quarantine"]) == {"late": len(sends), "bad_client_version": len(odd)}
    plain = (str, int, float, bool, type(None))
    for table in ("windows", "quarantine"):
        for row in rows[table]:
            odd_cells = {k: type(v) for k, v in row.items()
                         if type(v) not in plain and not (table == "quarantine" and k.startswith("raw_") and type(v) is bytes)}
            assert not odd_cells, f"{table}: {odd_cells}"
    text = {k: v for k, v in rows["quarantine"][0].items() if not k.startswith("raw_")}
    assert orjson.loads(orjson.dumps([*rows["windows"], text])) == [*rows["windows"], text]
