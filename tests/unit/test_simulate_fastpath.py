"""The simulator's fast path through ``pipeline.rocketmq`` equals the pure rules it replaced.

``ProducerSelector`` keeps its fault items in a mutable ``FaultTable`` and ``send_attempts``
inlines ``select`` and ``record`` for it (project issue 6: the simulator sends every message
through them). Here the straightforward implementation they replaced (immutable ``FaultState``,
``apply_update``, closures per call, an ``Attempt`` per attempt) is kept as the oracle: the Java
vectors and random sequences of sends, failures, retries, routes and clock jumps must give the same
attempts, states, table order, traces and random draws, through the inlined loop and through the
method loop that subclasses take.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rocketmq import (
    GENERATIONS,
    ErrorKind,
    FaultItem,
    FaultState,
    MessageQueue,
    ProducerSelector,
    ThreadLocalIndex,
    TopicRoute,
    apply_update,
    classify_error,
    generation_for_client_version,
    get_generation,
    is_available,
    is_reachable,
    rank_49,
    select_queue,
    send_with_retries,
    update_args_for,
)
from pipeline.rocketmq.fault import FaultTable
from pipeline.rocketmq.outcomes import SUCCESS_STATUSES, broker_response_code
from pipeline.rocketmq.selection import RETRY_RESPONSE_CODES, Attempt, SendOutcome
from pipeline.rocketmq.vectors import FAULT_FILES, read_jsonl

VECTORS = Path(__file__).resolve().parent.parent / "fixtures" / "rocketmq-vectors"
G49, G5 = GENERATIONS["4.9"], GENERATIONS["5"]


class FixedIndex(ThreadLocalIndex):
    """A ThreadLocalIndex that starts at a known value."""

    def __init__(self, start: int) -> None:
        super().__init__(random.Random(0))
        self._value = start


def _state(gen, *updates: tuple[str, int, bool, bool]) -> FaultState:  # type: ignore[no-untyped-def]
    state = FaultState()
    for broker, latency, isolation, reachable in updates:
        state, _ = apply_update(gen, state, broker, latency, isolation, reachable, 0)
    return state


def _ref_first_matching(route: TopicRoute, index: ThreadLocalIndex, accept) -> MessageQueue | None:  # type: ignore[no-untyped-def]
    for _ in range(len(route.queues)):
        mq = route.queues[index.increment_and_get() % len(route.queues)]
        if accept(mq):
            return mq
    return None


def _ref_round_robin(route: TopicRoute, index: ThreadLocalIndex) -> MessageQueue | None:
    return route.queues[index.increment_and_get() % len(route.queues)] if route.queues else None


def _ref_select_queue(gen, route, state, index, now_ms, last_broker=None, *, which_item_worst=None, reset_index=False):  # type: ignore[no-untyped-def]
    if not route.queues:
        return None, state
    if gen is None:
        mq = _ref_first_matching(route, index, lambda q: last_broker is None or q.broker != last_broker)
        return mq or _ref_round_robin(route, index), state
    if gen.windows_only_grow:
        if reset_index:
            index.reset()
        not_last = (lambda q: q.broker != last_broker) if last_broker is not None else (lambda q: True)
        mq = _ref_first_matching(route, index, lambda q: is_available(gen, state, q.broker, now_ms) and not_last(q))
        if mq is None:
            mq = _ref_first_matching(route, index, lambda q: is_reachable(state, q.broker) and not_last(q))
        return mq or _ref_round_robin(route, index), state
    start = index.increment_and_get()
    n = len(route.queues)
    for i in range(n):
        mq = route.queues[((start + i) & 0x7FFFFFFF) % n]
        if is_available(gen, state, mq.broker, now_ms):
            return mq, state
    worst = which_item_worst or ThreadLocalIndex(random.Random(0))
    ranked = rank_49(state, now_ms)
    not_best = None if not ranked else ranked[0] if len(ranked) // 2 <= 0 else ranked[worst.increment_and_get() % (len(ranked) // 2)]
    if not_best is not None:
        write_nums = route.write_queue_nums.get(not_best, -1)
        if write_nums > 0:
            base = route.queues[index.increment_and_get() % n]
            return MessageQueue(base.topic, not_best, index.increment_and_get() % write_nums), state
        state = state.without(not_best)
    return _ref_round_robin(route, index), state


class _Reference(ProducerSelector):
    """The selector as first written: pure selection over ``pure``, and the old traced subclasses' notes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.pure = FaultState()
        self.notes: list[tuple[str, int, int]] = []

    def select(self, route, now_ms, last_broker=None, *, thread=0, retry=False):  # type: ignore[no-untyped-def]
        before = self.pure
        mq, self.pure = _ref_select_queue(
            self.generation if self.fault_enabled else None, route, self.pure, self.index_for(route.topic, thread),
            now_ms, last_broker, which_item_worst=self.which_item_worst, reset_index=retry,
        )
        self.notes.extend((b, now_ms, now_ms) for b in sorted(set(before.items) - set(self.pure.items)))
        return mq

    def record(self, broker, latency_ms, status, error, now_ms):  # type: ignore[no-untyped-def]
        isolation, reachable = update_args_for(self.generation.name, status, error, self.detector_enabled)
        duration = None
        if self.fault_enabled:
            self.pure, duration = apply_update(self.generation, self.pure, broker, latency_ms, isolation, reachable, now_ms)
            self.notes.append((broker, now_ms, self.pure.items[broker].start_timestamp))
        return isolation, reachable, duration


def _ref_send(producer, route, attempt, now_ms, retries, timeout_ms, thread):  # type: ignore[no-untyped-def]
    """``send_with_retries`` as first written."""
    attempts, clock, last = [], now_ms, None
    for times in range(1 + retries):
        if timeout_ms is not None and clock - now_ms > timeout_ms:
            return SendOutcome(False, tuple(attempts), clock, timed_out=True)
        mq = producer.select(route, clock, last.broker if last else None, thread=thread, retry=times > 0)
        if mq is None:
            break
        last = mq
        latency, ok, error = attempt(mq)
        end = clock + max(latency, 0)
        status = (error if error in SUCCESS_STATUSES else "SEND_OK") if ok else "FAILED"
        isolation, reachable, duration = producer.record(mq.broker, latency, status, None if ok else error, end)
        attempts.append(Attempt(mq, clock, end, latency, ok, error, isolation, reachable, duration))
        clock = end
        if ok:
            if status != "SEND_OK" and producer.retry_another_broker_when_not_store_ok:
                continue
            return SendOutcome(True, tuple(attempts), clock)
        kind = classify_error(error)
        retry = kind in (ErrorKind.REMOTING, ErrorKind.CLIENT) or (
            kind is ErrorKind.BROKER and broker_response_code(error) in producer.retry_response_codes
        )
        if not retry:
            break
    return SendOutcome(False, tuple(attempts), clock)


class _ViaMethods(ProducerSelector):
    """Overrides ``select``, so the send loop goes through the methods rather than inlining them."""

    def select(self, route, now_ms, last_broker=None, *, thread=0, retry=False):  # type: ignore[no-untyped-def]
        return super().select(route, now_ms, last_broker, thread=thread, retry=retry)


ERRORS = [
    "RemotingConnectException: connect to 10.0.0.10:10911 failed",
    "RemotingTimeoutException: wait response on the channel <10.0.0.11:10911> timeout, 2990(ms)",
    "RemotingTooMuchRequestException: sendKernelImpl call timeout",
    "MQBrokerException: CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while",
    "MQBrokerException: CODE: 14  DESC: service not available now",
    "MQClientException: No route info of this topic",
    "InterruptedException",
    "java.lang.IllegalStateException: boom",
    None,
]
# The defaults, an unsorted custom table, one whose smallest latencyMax has a non-zero duration, none.
GENS = [
    G49,
    G5,
    get_generation("5", [3000, 100, 550, 50], [9, 8, 7, 0]),
    get_generation("4.9", [100, 20, 700], [5000, 3000, 9000]),
    get_generation("4.9", [], []),
]


def _case(seed: int):  # type: ignore[no-untyped-def]
    """A random producer configuration and 80 messages of random answers."""
    rng = random.Random(seed)
    gen = rng.choice(GENS)
    options = {
        "fault_enabled": rng.random() < 0.8,
        "detector_enabled": rng.random() < 0.3,
        "retry_another_broker_when_not_store_ok": rng.random() < 0.5,
        "seed": seed,
        "retry_response_codes": RETRY_RESPONSE_CODES if rng.random() < 0.7 else frozenset({2}),
    }
    brokers = ["b-1", "b-2", "b-3", "b-4"]
    routes = [TopicRoute.from_brokers("A", {b: rng.randint(1, 3) for b in brokers[:3]}),
              TopicRoute.from_brokers("B", {"b-1": 1, "b-4": 2}),
              TopicRoute.from_brokers("D", {"b-2": 3})]  # one broker: a retry finds only the last one
    if rng.random() < 0.2:
        routes.append(TopicRoute("C", (), {}))
    down = {b: rng.random() for b in brokers}
    messages = []
    now = 1_000_000
    for _ in range(80):
        now += rng.choice([0, 1, rng.randint(1, 3000), rng.randint(1, 700_000)])
        answers = []
        for _ in range(8):
            latency = rng.choice([rng.randint(0, 60), rng.randint(400, 2500), rng.randint(2500, 20_000), -3, 0])
            ok = rng.random() < 0.7
            status = rng.choice([None, None, "FLUSH_DISK_TIMEOUT", "SLAVE_NOT_AVAILABLE", "SEND_OK"])
            answers.append((latency, ok, status if ok else rng.choice(ERRORS)))
        # The timeout is sometimes exactly the first attempt's latency: the loop stops only past it.
        timeout = rng.choice([3000, 3000, None, 800, -1, max(answers[0][0], 0)])
        messages.append((rng.choice(routes), rng.choice([0, 0, 1]), now, rng.choice([0, 2, 2, 4]), timeout, answers))
    return gen, options, messages, down


def _answers(answers, down, rng):  # type: ignore[no-untyped-def]
    """The broker side: scripted answers, plus per-broker failures drawn from the message's own stream."""
    calls = iter(answers)

    def attempt(mq: MessageQueue) -> tuple[int, bool, str | None]:
        latency, ok, error = next(calls)
        if rng.random() < down.get(mq.broker, 0.0) * 0.6:
            return latency, False, ERRORS[0]
        return latency, ok, error

    return attempt


@pytest.mark.parametrize("seed", range(100))
def test_fast_path_equals_the_pure_rules_on_random_sends(seed: int) -> None:
    gen, options, messages, down = _case(seed)
    fast, via, ref = (cls(gen, **options) for cls in (ProducerSelector, _ViaMethods, _Reference))
    traces: dict[str, list] = {"fast": [], "via": []}
    fast.on_change = lambda *args: traces["fast"].append(args)
    via.on_change = lambda *args: traces["via"].append(args)
    shift = 0
    for k, (route, thread, now, retries, timeout, answers) in enumerate(messages):
        starts = sorted(item.start_timestamp for item in ref.pure.items.values() if item.start_timestamp > now + shift)
        if starts and k % 3 == 0:  # land exactly on an avoid-until time: available from that ms on
            shift = starts[0] - now
        now += shift
        outcomes = [
            send_with_retries(p, route, _answers(answers, down, random.Random(k)), now, retries,
                              timeout_ms=timeout, thread=thread)
            for p in (fast, via)
        ]
        expected = _ref_send(ref, route, _answers(answers, down, random.Random(k)), now, retries, timeout, thread)
        assert outcomes == [expected, expected], (seed, k)
        assert fast.state == via.state == ref.pure, (seed, k)
        assert list(fast.state.items) == list(ref.pure.items)  # same table order too
    assert traces["fast"] == traces["via"] == ref.notes
    assert fast.rng.getstate() == via.rng.getstate() == ref.rng.getstate()


@pytest.mark.parametrize("seed", range(20))
def test_select_queue_equals_the_first_implementation(seed: int) -> None:
    rng = random.Random(seed)
    route = TopicRoute.from_brokers("T", {"a": 2, "b": 1, "c": 3})
    for _ in range(60):
        gen = rng.choice([None, *GENS])
        state = FaultState()
        for _ in range(rng.randint(0, 5)):
            update = (rng.choice("abcz"), rng.choice([0, 60, 700, 4000, 20000]), rng.random() < 0.3, rng.random() < 0.7)
            state, _ = apply_update(gen or G5, state, *update, rng.randint(0, 50_000))
        starts = [item.start_timestamp for item in state.items.values()]
        now = rng.choice(starts) + rng.choice([-1, 0, 0, 1]) if starts and rng.random() < 0.5 else rng.randint(0, 700_000)
        args = (now, rng.choice([None, "a", "b", "z"]))
        start, worst, reset = rng.randint(-(2**31), 2**31 - 1), rng.randint(-5, 5), rng.random() < 0.5
        picks = []
        for select in (select_queue, _ref_select_queue):
            index, worst_index = FixedIndex(start), FixedIndex(worst)
            mq, after = select(gen, route, state, index, *args, which_item_worst=worst_index, reset_index=reset)
            picks.append((mq, after, after is state, index._value, worst_index._value))
        assert picks[0] == picks[1]


def _table_vs_pure(gen, events, state: FaultState | None = None) -> None:  # type: ignore[no-untyped-def]
    table = FaultTable(gen, state)
    pure = state or FaultState()
    for ts, broker, latency, isolation, reachable in events:
        pure, expected = apply_update(gen, pure, broker, latency, isolation, reachable, ts)
        assert table.update(broker, latency, isolation, reachable, ts) == expected
        assert table.snapshot() == pure and list(table.snapshot().items) == list(pure.items)
        assert table.start_of(broker) == pure.items[broker].start_timestamp


@pytest.mark.parametrize("version", list(FAULT_FILES))
def test_fault_table_equals_apply_update_on_the_vectors(version: str) -> None:
    cases = list(read_jsonl(VECTORS / FAULT_FILES[version]))
    for case in cases:
        spec = case["input"]
        gen = get_generation(
            generation_for_client_version(version), spec.get("latency_max"), spec.get("not_available_duration")
        )
        events = [(e["ts_ms"], e["broker"], e["latency_ms"], e["isolation"], e.get("reachable", True))
                  for e in spec["events"]]
        _table_vs_pure(gen, events)
    assert len(cases) == 115


@given(
    gen=st.sampled_from(GENS),
    events=st.lists(
        st.tuples(st.integers(-10, 10**6), st.sampled_from("abc"), st.integers(-50, 40_000), st.booleans(), st.booleans()),
        max_size=30,
    ),
    preload=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-5, 5000), st.integers(-10, 10**6), st.booleans()), max_size=4),
)
def test_fault_table_equals_apply_update_on_random_sequences(gen, events, preload) -> None:  # type: ignore[no-untyped-def]
    state = FaultState()
    for item in preload:
        state = state.with_item(FaultItem(*item))
    _table_vs_pure(gen, sorted(events), state)
    table = FaultTable(gen, state)
    for broker in "ad":
        table.drop(broker)
        state = state.without(broker)
        assert table.snapshot() == state


def test_selector_state_reads_and_writes_the_table() -> None:
    selector = ProducerSelector(G5, fault_enabled=True)
    preset = _state(G5, ("a", 600, False, True))
    selector.state = preset
    assert selector.state is preset  # unchanged: the very object assigned
    selector.record("b", 10, "SEND_OK", None, 5)
    assert selector.state == preset.with_item(FaultItem("b", 10, 0))
    assert ProducerSelector(G49, state=preset).state is preset
    selector.generation = G49  # the table follows a reassigned generation
    selector.record("b", 10, "SEND_OK", None, 7)
    assert selector.state == preset.with_item(FaultItem("b", 10, 7))
