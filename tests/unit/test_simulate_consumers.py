"""Consumer groups as the admin poller reports them: ownership, stalls, idle members, growing lag."""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict

from pipeline.rocketmq.allocate import owners, rebalance
from pipeline.rocketmq.queues import MessageQueue
from pipeline.simulate import MemorySink, Simulation, run_to_memory
from schemas.events import ConsumerProgress, GroupMembership

S = 1000


@functools.cache
def _run(name: str, duration_s: float | None = None) -> tuple[Simulation, MemorySink]:
    return run_to_memory(name, duration_s=duration_s)


def _rounds(sink: MemorySink, group: str) -> dict[int, list[ConsumerProgress]]:
    out: dict[int, list[ConsumerProgress]] = defaultdict(list)
    for p in sink.events("consumer_progress"):
        if p.consumer_group == group:
            out[p.ts_ms].append(p)
    return dict(sorted(out.items()))


def _members_at(memberships: list[GroupMembership], ts: int) -> tuple[str, ...]:
    return [m for m in memberships if m.ts_ms <= ts][-1].client_ids


def _lag(round_: list[ConsumerProgress]) -> int:
    return sum(p.broker_offset - max(p.consumer_offset, 0) for p in round_)


def test_progress_owners_follow_the_allocation_of_the_reported_members() -> None:
    """Whoever the poller names as owner is what the strategy gives the members last reported."""
    _sim, sink = _run("rebalance")
    memberships = sink.events("group_membership")
    checked = 0
    for ts, round_ in _rounds(sink, "CG_clicks").items():
        members = _members_at(memberships, ts - 2 * S)  # rebalance follows a change within 1 s
        queues = [MessageQueue(p.topic, p.broker_name, p.queue_id) for p in round_]
        expected = owners(rebalance("CONSISTENT_HASH", "CG_clicks", queues, list(members)))
        assert {MessageQueue(p.topic, p.broker_name, p.queue_id): p.client_id for p in round_} == expected
        checked += 1
    assert checked == 30


def test_membership_changes_are_reported_when_they_happen() -> None:
    sim, sink = _run("rebalance")
    changes = []
    last: tuple[str, ...] = ()
    for m in sink.events("group_membership"):
        if m.client_ids != last:
            changes.append(((m.ts_ms - sim.epoch_ms) // S, len(m.client_ids)))
            last = m.client_ids
    assert changes == [(0, 2), (30, 4), (60, 3), (90, 4)]
    assert all(m.strategy == "CONSISTENT_HASH" for m in sink.events("group_membership"))


def test_crashed_consumer_stalls_its_queues_until_the_broker_expires_it() -> None:
    sim, sink = _run("consumer-crash")
    crashed = "10.20.0.2@4001"
    rounds = _rounds(sink, "CG_jobs")
    stalled: dict[tuple[str, int], set[int]] = defaultdict(set)
    for ts, round_ in rounds.items():
        t = (ts - sim.epoch_ms) // S
        for p in round_:
            if 45 <= t <= 70 and p.client_id == crashed:
                stalled[(p.broker_name, p.queue_id)].add(p.consumer_offset)
            if t >= 75:
                assert p.client_id != crashed
    assert len(stalled) == 2 and all(len(offsets) == 1 for offsets in stalled.values())
    lags = {(ts - sim.epoch_ms) // S: _lag(r) for ts, r in rounds.items()}
    assert lags[70] > lags[50] > 1.5 * lags[35]
    assert lags[150] < 1.5 * lags[35]  # back to the usual commit-interval lag once the queues moved
    gone = [m for m in sink.events("group_membership") if crashed not in m.client_ids]
    assert (gone[0].ts_ms - sim.epoch_ms) // S == 70


def test_more_consumers_than_queues_leaves_members_idle() -> None:
    _, sink = _run("more-consumers-than-queues")
    members = set(sink.events("group_membership")[0].client_ids)
    owners_seen = {p.client_id for p in sink.events("consumer_progress")}
    assert len(members) == 6 and len(owners_seen) == 4 and owners_seen < members


def test_slow_group_lag_grows_and_fast_group_keeps_up() -> None:
    _sim, sink = _run("slow-consumer")
    slow = [_lag(r) for r in _rounds(sink, "CG_slow").values()]
    fast = [_lag(r) for r in _rounds(sink, "CG_fast").values()]
    assert all(b > a for a, b in itertools.pairwise(slow[1:]))
    assert max(fast) < 2000 and slow[-1] > 10 * max(fast)
    growth_before, growth_after = slow[11] - slow[5], slow[23] - slow[17]  # 5 s rounds: 30-60 s vs 90-120 s
    assert growth_after > 1.5 * growth_before


def test_no_progress_from_a_broker_that_is_down() -> None:
    sim, sink = _run("broker-outage", 100.0)
    seen = defaultdict(set)
    for p in sink.events("consumer_progress"):
        seen[p.broker_name].add((p.ts_ms - sim.epoch_ms) // S)
    assert not {t for t in seen["broker-b"] if 30 <= t < 90}
    assert {35, 60, 85} <= seen["broker-a"]


def test_last_timestamp_is_the_store_time_of_the_last_committed_message() -> None:
    _, sink = _run("slow-consumer", 60.0)
    store = {(e.broker_name, e.queue_id, e.queue_offset): e.ts_ms for e in sink.events("send_result") if e.queue_offset is not None}
    checked = 0
    for p in sink.events("consumer_progress"):
        if p.consumer_offset > 0:
            assert p.last_timestamp_ms == store[(p.broker_name, p.queue_id, p.consumer_offset - 1)]
            checked += 1
        else:
            assert p.last_timestamp_ms is None
    assert checked > 50
