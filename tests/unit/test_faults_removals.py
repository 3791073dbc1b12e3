"""A fault item a 4.9 client removed by itself (``fault_item_removed`` on the next event) ends the
producer's window on that broker at that time, and counts as no send."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from pipeline.config import FaultsConfig
from pipeline.faults import from_send_results, initial_state, step
from pipeline.faults.events import EVENT_SCHEMA, REMOVAL, with_removals
from pipeline.faults.frame import to_arrow
from pipeline.faults.state import FaultOutputs
from schemas.events import SendResult
from streaming.feeds import fault_feed, shard_of
from tests.doubles.faults_synth import T0

CFG = FaultsConfig()
REFUSED = "RemotingConnectException: connect to 127.0.0.1:10931 failed"


def send(ts: int, broker: str, offset: int, *, failed: bool = False, removed: str | None = None,
         removed_ms: int | None = None) -> SendResult:
    return SendResult(
        event_id=f"p1-{offset}", ts_ms=ts, cluster="c1", producer_group="PG", client_id="p1", client_version="4.9.8",
        topic="T", broker_name=broker, queue_id=0, status="FAILED" if failed else "SEND_OK", latency_ms=3,
        error=REFUSED if failed else None, queue_offset=None if failed else offset, attempt=0,
        send_latency_fault_enable=True, fault_item_removed=removed, fault_item_removed_ms=removed_ms,
    )


def arrow(events: list[SendResult]) -> pa.Table:
    return pa.Table.from_batches([to_arrow(from_send_results(events, offsets=range(len(events))), EVENT_SCHEMA)])


def windows_of(out: FaultOutputs) -> list[tuple[str, int, int]]:
    """Each window as its last row in ``out`` left it: (broker, start, end)."""
    last = {r["window_id"]: r for r in out.windows}
    return sorted((r["broker_name"], r["start_ms"], r["end_ms"]) for r in last.values())


def test_the_added_row_is_the_removal_and_the_event_is_kept() -> None:
    events = [send(T0, "b2", 0, failed=True), send(T0 + 5_000, "b1", 1, removed="b2", removed_ms=T0 + 4_990)]
    table = with_removals(arrow(events))
    assert table.num_rows == 3
    added = table.slice(2).to_pylist()[0]
    assert (added["broker_name"], added["ts_ms"], added["status"], added["latency_ms"], added["isolation"]) == (
        "b2", T0 + 4_990, REMOVAL, 0, False)
    assert added["event_id"] == "p1-1/removed" and added["fault_item_removed"] is None
    assert added["kafka_offset"] == 1  # the carrying event's Kafka position
    assert table.slice(0, 2).to_pylist() == arrow(events).to_pylist()
    plain = arrow(events[:1])
    assert with_removals(plain) is plain  # nothing removed: the very table
    assert with_removals(plain.drop_columns(["fault_item_removed"])).num_rows == 1  # an older bronze table


def run(events: list[SendResult]) -> tuple[list[tuple[str, int, int]], dict[str, int], list[dict[str, Any]]]:
    """Windows, sends per broker in the health rows, and quarantine, once the minutes have closed."""
    state, first = step(initial_state("c1"), from_send_results(events), 0, CFG)
    _, later = step(state, from_send_results([]), T0 + 180_000, CFG)
    health = first.health + later.health
    return windows_of(first), {r["broker_name"]: r["sends"] for r in health}, first.quarantine + later.quarantine


def test_a_removal_ends_the_window_and_counts_as_no_send() -> None:
    fail = send(T0, "b2", 0, failed=True)  # 4.9: a refused connection isolates b2 for 10 minutes
    carrier = send(T0 + 5_000, "b1", 1, removed="b2", removed_ms=T0 + 4_990)
    windows, sends, quarantine = run([fail, dataclasses.replace(carrier, fault_item_removed=None)])
    assert windows == [("b2", T0, T0 + 600_000)] and sends == {"b1": 1, "b2": 1} and quarantine == []
    windows, sends, quarantine = run(Events.of(with_removals(arrow([fail, carrier]))))
    assert windows == [("b2", T0, T0 + 4_990)] and sends == {"b1": 1, "b2": 1} and quarantine == []


def test_a_removal_behind_the_watermark_is_dropped_and_its_event_still_counts() -> None:
    fail = send(T0, "b2", 0, failed=True)
    state, _ = step(initial_state("c1"), from_send_results([fail]), 0, CFG)
    carrier = send(T0 + 5_000, "b1", 1, removed="b2", removed_ms=T0 + 4_000)
    state, out = step(state, from_send_results(Events.of(with_removals(arrow([carrier])))), T0 + 4_500, CFG)
    assert out.quarantine == []  # the removal is not an event of its own; its event was on time
    assert windows_of(out) == []  # the window (to T0 + 600,000) is not cut
    _, later = step(state, from_send_results([]), T0 + 180_000, CFG)
    assert {r["broker_name"]: r["sends"] for r in out.health + later.health} == {"b1": 1, "b2": 1}


def test_a_removal_after_its_own_event_or_beyond_the_producer_limit_changes_nothing() -> None:
    fail = send(T0, "b2", 0, failed=True)
    later = send(T0 + 5_000, "b1", 1, removed="b2", removed_ms=T0 + 5_001)  # no hook writes this
    assert with_removals(arrow([fail, later])).num_rows == 2
    # b3 already holds its one producer: a removal naming b3 for p1 has no pair to end, and is no
    # event to quarantine either
    cfg = FaultsConfig(max_producers_per_broker=1)
    other = dataclasses.replace(send(T0 + 1, "b3", 2), client_id="p2", event_id="p2-2")
    carrier = send(T0 + 5_000, "b1", 3, removed="b3", removed_ms=T0 + 4_990)
    state, out = step(initial_state("c1"), from_send_results(Events.of(with_removals(arrow([fail, other, carrier])))),
                      0, cfg)
    assert out.quarantine == [] and windows_of(out) == [("b2", T0, T0 + 600_000)]
    assert sorted(zip(state.pairs["client_id"].tolist(), state.pairs["broker"].tolist())) == [
        ("p1", 0), ("p1", 1), ("p2", 2)]


def test_the_removal_reaches_the_removed_brokers_own_state_key() -> None:
    brokers = [f"broker-{c}" for c in "abcdefgh"]
    shards = shard_of(pa.array(brokers), 8)
    gone, sent = next((b, a) for a in brokers for b in brokers if shards[brokers.index(a)] != shards[brokers.index(b)])
    table = arrow([send(T0 + 5_000, sent, 1, removed=gone, removed_ms=T0 + 4_990)])
    pieces = {key: part for key, _, part in fault_feed(table, list(EVENT_SCHEMA), 8)}
    assert len(pieces) == 2
    by_broker = {part.column("broker_name").to_pylist()[0]: part for part in pieces.values()}
    assert by_broker[gone].column("status").to_pylist() == [REMOVAL]
    assert by_broker[sent].column("status").to_pylist() == ["SEND_OK"]


class Events:
    """Send results back from Arrow rows (the step's test input is dataclasses)."""

    @staticmethod
    def of(table: pa.Table) -> list[SendResult]:
        fields = set(SendResult.__dataclass_fields__)
        return [SendResult(**{k: v for k, v in row.items() if k in fields}) for row in table.to_pylist()]
