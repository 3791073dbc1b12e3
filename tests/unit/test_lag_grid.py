"""The combined query's lag keys (GridLag): the same events give the same rows however they are cut
into micro-batches, as long as no batch's settle point passes an event still to come."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from typing import Any

import pyarrow as pa
import pytest

from pipeline.config import Config
from pipeline.lag.concern import GridLag, lag_events
from pipeline.stateful import Clock
from streaming.feeds import lag_feed, plain
from tests.doubles.lag_synth import membership, progress, send

START = 1_700_000_000_000
BRONZE = {"SendResult": "send_results", "ConsumerProgress": "consumer_progress", "GroupMembership": "group_membership"}


def workload() -> list[tuple[str, dict[str, Any]]]:
    """Two groups on 2 brokers x 2 queues for 400 s: G keeps up, H stops committing at 150 s
    (WARN, then STOP/STALL), and a quiet stretch of 120 s with no events at all in the middle."""
    rng = random.Random(3)
    events: list[Any] = [membership(START, ["c1", "c2"], group=g) for g in ("G", "H")]
    offsets = {(b, q): 0 for b in ("b1", "b2") for q in (0, 1)}
    for t in range(0, 400_000, 250):
        if 200_000 <= t < 320_000:
            continue  # nothing at all: only the idle grid points judge
        for b, q in list(offsets):
            if rng.random() < 0.7:
                offsets[b, q] += 1
                events.append(send(START + t + rng.randrange(250), q, offsets[b, q], broker=b))
        if t % 5_000 == 0:
            for (b, q), head in offsets.items():
                events.append(progress(START + t + rng.randrange(5_000), q, head - 2, group="G", broker=b))
                if t < 150_000:
                    events.append(progress(START + t + rng.randrange(5_000), q, head - 1, group="H", broker=b))
    out = []
    for k, e in enumerate(events):
        row = dataclasses.asdict(e)
        row.update(kafka_topic=f"rmq.{type(e).__name__}", kafka_partition=k % 4, kafka_offset=k, kafka_ts_ms=row["ts_ms"])
        out.append((BRONZE[type(e).__name__], row))
    return sorted(out, key=lambda r: r[1]["ts_ms"])


def run(events: list[tuple[str, dict[str, Any]]], cuts: list[int], cfg: Config, fetches: int = 0) -> dict[str, list[str]]:
    """Feed ``events`` in batches cut at ``cuts`` (indexes), each batch shuffled; the settle point is
    just before the next batch's first event (the last one: the newest event). With ``fetches``,
    each batch goes through the readers' lag feed in that many pieces, as many fetches would."""
    concern = GridLag(cfg.lag)
    state = concern.initial("c1")
    watermark, rows = 0, {}
    bounds = [0, *cuts, len(events)]
    rng = random.Random(len(cuts))
    for lo, hi in itertools.pairwise(bounds):
        batch = events[lo:hi]
        rng.shuffle(batch)
        chunks: dict[str, list[pa.Table]] = {}
        if fetches:
            for piece in (batch[k::fetches] for k in range(fetches)):
                by_table: dict[str, list[dict[str, Any]]] = {}
                for name, row in piece:
                    by_table.setdefault(name, []).append(row)
                feed = lag_feed({name: pa.Table.from_pylist(r) for name, r in by_table.items()}, shards=1)
                for _, name, part in feed:
                    chunks.setdefault(name, []).append(plain(part))
        else:
            for name, row in batch:
                chunks.setdefault(name, []).append(pa.Table.from_pylist([row]))
        settle = events[hi][1]["ts_ms"] - 1 if hi < len(events) else events[-1][1]["ts_ms"]
        done = concern.step(state, lag_events(chunks), Clock(watermark, max(settle, watermark), None, False))
        state = concern.decode(concern.encode(done.state))  # through the state store's encoding
        watermark = max(settle, watermark)
        for name, table in done.tables.items():
            rows.setdefault(name, []).extend(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())
    return {name: sorted(values) for name, values in rows.items()}


@pytest.mark.parametrize("batches", [2, 7, 40])
def test_lag_rows_do_not_depend_on_the_micro_batches(batches: int) -> None:
    cfg = Config()
    events = workload()
    whole = run(events, [], cfg)
    rng = random.Random(batches)
    cuts = sorted(rng.sample(range(1, len(events) - 1), batches - 1))
    cut = run(events, cuts, cfg)
    assert set(whole) >= {"queue_lag", "group_status"}
    statuses = {json.loads(r)["status"] for r in whole["group_status"]}
    assert {"OK"} < statuses, statuses  # H's stop is seen, not only OK rows
    assert cut == whole


def test_sends_cut_down_per_fetch_give_the_rows_of_all_sends_cut_down_at_once() -> None:
    """The readers keep two sends per queue and second of each fetch; the lag key applies the rule
    again, so how the sends were cut into fetches and micro-batches changes no row."""
    cfg = Config()
    events = workload()
    sends = pa.Table.from_pylist([row for name, row in events if name == "send_results"])
    assert len(lag_feed({"send_results": sends}, shards=1)[0][2]) < 0.8 * sends.num_rows  # some are dropped
    at_once = run(events, [], cfg, fetches=1)
    assert len(at_once["queue_lag"]) > 20
    rng = random.Random(5)
    for batches, fetches in ((3, 4), (20, 9)):
        cuts = sorted(rng.sample(range(1, len(events) - 1), batches - 1))
        assert run(events, cuts, cfg, fetches=fetches) == at_once, (batches, fetches)


def test_rows_wait_for_the_settle_point_and_late_events_are_quarantined() -> None:
    cfg = Config()
    concern = GridLag(cfg.lag)
    events = workload()[:400]
    chunks: dict[str, list[pa.Table]] = {}
    for name, row in events:
        chunks.setdefault(name, []).append(pa.Table.from_pylist([row]))
    unsettled = concern.step(concern.initial("c1"), lag_events(chunks), Clock(0, START - 1, None, False))
    assert not unsettled.tables and unsettled.wakeup_ms is not None  # everything waits in the state
    settled = concern.step(unsettled.state, lag_events({}), Clock(START + 60_000, START + 60_000, None, True))
    assert "queue_lag" in settled.tables
    late = concern.step(settled.state, lag_events({"send_results": [pa.Table.from_pylist([events[-1][1]])]}),
                        Clock(START + 60_000, START + 60_000, None, False))
    assert late.tables["quarantine"].column("reason").to_pylist() == ["late"]


def test_a_state_saved_with_plain_text_pending_events_reads_and_steps_alike() -> None:
    """Pending events are kept dictionary-encoded; a state saved before that holds them as text."""
    cfg = Config()
    concern = GridLag(cfg.lag)
    events = workload()
    first, rest = events[:300], events[300:600]
    chunks: dict[str, list[pa.Table]] = {}
    for name, row in first:
        chunks.setdefault(name, []).append(pa.Table.from_pylist([row]))
    waiting = concern.step(concern.initial("c1"), lag_events(chunks), Clock(0, START - 1, None, False)).state
    assert waiting.pending is not None
    plain_text = dataclasses.replace(waiting, pending=pa.Table.from_pylist(waiting.pending.to_pylist()))
    later: dict[str, list[pa.Table]] = {}
    for name, row in rest:
        later.setdefault(name, []).append(pa.Table.from_pylist([row]))
    clock = Clock(0, rest[-1][1]["ts_ms"], None, False)
    new = concern.step(concern.decode(concern.encode(waiting)), lag_events(later), clock)
    old = concern.step(concern.decode(concern.encode(plain_text)), lag_events(later), clock)
    assert "queue_lag" in new.tables
    assert {n: t.to_pylist() for n, t in old.tables.items()} == {n: t.to_pylist() for n, t in new.tables.items()}
