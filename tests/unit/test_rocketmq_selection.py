"""Producer queue selection and the retry loop, as RocketMQ's Java client does them."""

from __future__ import annotations

import random

import pytest

from pipeline.rocketmq import (
    GENERATIONS,
    FaultItem,
    FaultState,
    MessageQueue,
    ProducerSelector,
    ThreadLocalIndex,
    TopicRoute,
    apply_update,
    select_queue,
    send_with_retries,
)

G49, G5 = GENERATIONS["4.9"], GENERATIONS["5"]
ROUTE = TopicRoute.from_brokers("T", {"b": 2, "a": 2})


class FixedIndex(ThreadLocalIndex):
    """A ThreadLocalIndex that starts at a known value (Java starts at a random one)."""

    def __init__(self, start: int) -> None:
        super().__init__(random.Random(0))
        self._value = start


def Q(broker: str, qid: int) -> MessageQueue:
    return MessageQueue("T", broker, qid)


def _state(gen, *updates: tuple[str, int, bool, bool]) -> FaultState:  # type: ignore[no-untyped-def]
    state = FaultState()
    for broker, latency, isolation, reachable in updates:
        state, _ = apply_update(gen, state, broker, latency, isolation, reachable, 0)
    return state


def test_route_is_sorted_by_broker_then_queue() -> None:
    assert ROUTE.queues == (Q("a", 0), Q("a", 1), Q("b", 0), Q("b", 1))


def test_thread_local_index_wraps_like_a_java_int() -> None:
    index = FixedIndex(2**31 - 2)
    assert [index.increment_and_get() for _ in range(3)] == [2**31 - 1, 0, 1]


def _pick(gen, state, last=None, start=-1, retry=False):  # type: ignore[no-untyped-def]
    mq, _ = select_queue(gen, ROUTE, state, FixedIndex(start), 0, last, reset_index=retry)
    return mq


SELECT_TABLE = [
    ("no fault: round robin", None, FaultState(), None, 0, Q("a", 1)),
    ("no fault: retry skips the last broker", None, FaultState(), "a", 0, Q("b", 0)),
    ("4.9: skips an unavailable broker", G49, _state(G49, ("a", 600, False, True)), None, 0, Q("b", 0)),
    ("4.9: ignores lastBrokerName", G49, FaultState(), "a", 0, Q("a", 1)),
    ("5: available and not last", G5, FaultState(), "a", 0, Q("b", 0)),
    ("5: unavailable skipped", G5, _state(G5, ("b", 600, False, True)), None, 1, Q("a", 0)),
    (
        "5: falls back to reachable",
        G5,
        _state(G5, ("a", 600, False, False), ("b", 600, False, True)),
        None,
        -1,
        Q("b", 0),
    ),
    (
        "5: falls back to any",
        G5,
        _state(G5, ("a", 0, True, False), ("b", 0, True, False)),
        None,
        -1,
        Q("a", 0),
    ),
]


@pytest.mark.parametrize(
    ("gen", "state", "last", "start", "expected"),
    [r[1:] for r in SELECT_TABLE],
    ids=[r[0] for r in SELECT_TABLE],
)
def test_select_queue(gen, state, last, start, expected) -> None:  # type: ignore[no-untyped-def]
    assert _pick(gen, state, last, start) == expected


def test_49_all_unavailable_falls_back_to_the_best_half() -> None:
    state = _state(G49, ("a", 3000, False, True), ("b", 600, False, True))
    picks = {_pick(G49, state, start=s).broker for s in range(8)}
    assert picks == {"b"}  # ranking: b (lower latency) first; half of 2 is 1


def test_49_pick_of_a_broker_without_queues_removes_it() -> None:
    state = _state(G49, ("gone", 10, True, True), ("x", 20, True, True)).with_item(FaultItem("a", 99, 10**12))
    route = TopicRoute.from_brokers("T", {"a": 1})
    mq, after = select_queue(G49, route, state, FixedIndex(0), 0, None, which_item_worst=FixedIndex(-1))
    assert mq == Q("a", 0) and "gone" not in after.items


def test_empty_route_selects_nothing() -> None:
    assert select_queue(G5, TopicRoute("T", (), {}), FaultState(), FixedIndex(0), 0) == (None, FaultState())


def _attempts(script: list[tuple[int, bool, str | None]]):  # type: ignore[no-untyped-def]
    calls: list[MessageQueue] = []

    def attempt(mq: MessageQueue) -> tuple[int, bool, str | None]:
        calls.append(mq)
        return script[min(len(calls) - 1, len(script) - 1)]

    return attempt, calls


@pytest.mark.parametrize(
    ("error", "attempts", "ok"),
    [
        ("RemotingTimeoutException", 3, False),
        ("[TIMEOUT_CLEAN_QUEUE]broker busy", 1, False),  # SYSTEM_BUSY is not a retry code
        ("CODE: 14 DESC: service not available", 3, False),
        ("InterruptedException", 1, False),
        ("MQClientException", 3, False),
    ],
)
def test_retry_loop_follows_java(error: str, attempts: int, ok: bool) -> None:
    producer = ProducerSelector(G5, fault_enabled=True, seed=7)
    attempt, _ = _attempts([(100, False, error)])
    outcome = send_with_retries(producer, ROUTE, attempt, now_ms=1000)
    assert (len(outcome.attempts), outcome.ok) == (attempts, ok)


def test_retry_updates_per_attempt_and_moves_off_the_failing_broker() -> None:
    producer = ProducerSelector(G49, fault_enabled=True, seed=3)
    attempt, _ = _attempts([(1200, False, "RemotingConnectException"), (20, True, None)])
    outcome = send_with_retries(producer, ROUTE, attempt, now_ms=0)
    first, second = outcome.attempts
    assert outcome.ok and first.isolation and first.duration_ms == 600000
    assert (first.begin_ms, first.end_ms, second.begin_ms, second.end_ms) == (0, 1200, 1200, 1220)
    assert second.queue.broker != first.queue.broker
    assert producer.state.get(first.queue.broker).start_timestamp == 1200 + 600000


def test_fault_tolerance_off_records_no_update() -> None:
    producer = ProducerSelector(G5, seed=1)
    attempt, _ = _attempts([(5000, False, "RemotingTimeoutException"), (5, True, None)])
    outcome = send_with_retries(producer, ROUTE, attempt, now_ms=0, timeout_ms=None)
    assert outcome.ok and [a.duration_ms for a in outcome.attempts] == [None, None]
    assert len(producer.state) == 0


def test_timeout_stops_retrying() -> None:
    producer = ProducerSelector(G5, fault_enabled=True, seed=1)
    attempt, _ = _attempts([(3500, False, "RemotingTimeoutException")])
    outcome = send_with_retries(producer, ROUTE, attempt, now_ms=0)
    assert outcome.timed_out and len(outcome.attempts) == 1


def test_runs_are_deterministic_given_a_seed() -> None:
    def run(seed: int) -> list[MessageQueue]:
        producer = ProducerSelector(G5, fault_enabled=True, seed=seed)
        picked = []
        for t in range(50):
            attempt, calls = _attempts([(700 if t % 7 == 0 else 10, t % 5 != 0, "RemotingTimeoutException")])
            send_with_retries(producer, ROUTE, attempt, now_ms=t * 100)
            picked.extend(calls)
        return picked

    assert run(11) == run(11)
    assert run(11) != run(12)
