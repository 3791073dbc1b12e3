"""Producer queue selection and the send retry loop, as ``DefaultMQProducerImpl`` does them.

The simulator models producers with this, so the traffic it generates shifts between brokers the way
a real client's does: round robin over the write queues, avoiding ``lastBrokerName`` on a retry, and
(with ``sendLatencyFaultEnable``) avoiding brokers the fault rules mark unavailable. Randomness (the
initial per-thread index, 5.x's index reset on retry) comes from a seeded ``random.Random``, so a run
is reproducible. Selection is pure over the immutable :class:`FaultState`; only the per-thread
indexes are mutable, as they are in Java.

Known difference: 4.9.0-5.1.3 rewrote the *shared* MessageQueue's broker name and queue id in the
``pickOneAtLeast`` fallback (#7779), corrupting the route until the next refresh. Here the fallback
returns a new queue and the route stays intact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipeline.rocketmq.fault import FaultState, Generation, apply_update, is_available, is_reachable, rank_49
from pipeline.rocketmq.outcomes import (
    SUCCESS_STATUSES,
    ErrorKind,
    broker_response_code,
    classify_error,
    update_args_for,
)
from pipeline.rocketmq.queues import MessageQueue

_MASK = 0x7FFFFFFF
# DefaultMQProducer.retryResponseCodes: TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR,
# NO_PERMISSION, NO_BUYER_ID, NOT_IN_CURRENT_UNIT. SYSTEM_BUSY (2, "[TIMEOUT_CLEAN_QUEUE]") is absent.
RETRY_RESPONSE_CODES = frozenset({17, 14, 1, 16, 204, 205})


@dataclass(frozen=True)
class TopicRoute:
    """A topic's write queues, sorted by broker then queue id, and each broker's write queue count."""

    topic: str
    queues: tuple[MessageQueue, ...]
    write_queue_nums: Mapping[str, int]

    @classmethod
    def from_brokers(cls, topic: str, write_queues: Mapping[str, int]) -> TopicRoute:
        """``topicRouteData2TopicPublishInfo``: queues 0..n-1 of each broker, brokers sorted by name."""
        queues = tuple(
            MessageQueue(topic, broker, qid)
            for broker in sorted(write_queues)
            for qid in range(write_queues[broker])
        )
        return cls(topic, queues, dict(write_queues))


class ThreadLocalIndex:
    """``ThreadLocalIndex``: one thread's round-robin counter, starting at a random value."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._value: int | None = None

    def increment_and_get(self) -> int:
        """Java int ``++index`` (wrapping), returned masked to non-negative."""
        if self._value is None:
            self._value = self._rng.randrange(_MASK + 1)
        self._value = ((self._value + 1 + 2**31) % 2**32) - 2**31
        return self._value & _MASK

    def reset(self) -> None:
        """5.x ``resetIndex`` on a retry: ``random.nextInt(Integer.MAX_VALUE)``."""
        self._value = self._rng.randrange(_MASK)


def _round_robin(route: TopicRoute, index: ThreadLocalIndex) -> MessageQueue | None:
    """``selectOneMessageQueue()``: the next queue, whatever its broker."""
    if not route.queues:
        return None
    return route.queues[index.increment_and_get() % len(route.queues)]


def _first_matching(
    route: TopicRoute, index: ThreadLocalIndex, accept: Callable[[MessageQueue], bool]
) -> MessageQueue | None:
    """Up to one full turn of round robin, advancing the index per queue tried."""
    for _ in range(len(route.queues)):
        mq = route.queues[index.increment_and_get() % len(route.queues)]
        if accept(mq):
            return mq
    return None


def _pick_one_at_least_49(state: FaultState, now_ms: int, which_item_worst: ThreadLocalIndex) -> str | None:
    """4.9 ``pickOneAtLeast``: cycle through the better half of the ranking (ties by name)."""
    ranked = rank_49(state, now_ms)
    if not ranked:
        return None
    half = len(ranked) // 2
    return ranked[0] if half <= 0 else ranked[which_item_worst.increment_and_get() % half]


def select_queue(
    gen: Generation | None,
    route: TopicRoute,
    state: FaultState,
    index: ThreadLocalIndex,
    now_ms: int,
    last_broker: str | None = None,
    *,
    which_item_worst: ThreadLocalIndex | None = None,
    reset_index: bool = False,
) -> tuple[MessageQueue | None, FaultState]:
    """``MQFaultStrategy.selectOneMessageQueue``; ``gen=None`` means fault tolerance is off.

    Returns the queue (None only for a route without queues) and the fault state, which 4.9 changes
    when ``pickOneAtLeast`` names a broker without write queues (it removes that item).
    """
    if not route.queues:
        return None, state
    if gen is None:
        mq = _first_matching(route, index, lambda q: last_broker is None or q.broker != last_broker)
        return mq or _round_robin(route, index), state
    if gen.windows_only_grow:
        if reset_index:
            index.reset()
        not_last = (lambda q: q.broker != last_broker) if last_broker is not None else (lambda q: True)
        mq = _first_matching(
            route, index, lambda q: is_available(gen, state, q.broker, now_ms) and not_last(q)
        )
        if mq is None:
            mq = _first_matching(route, index, lambda q: is_reachable(state, q.broker) and not_last(q))
        return mq or _round_robin(route, index), state
    # 4.9: one index read, then a local walk over the queues; lastBrokerName is ignored here.
    start = index.increment_and_get()
    n = len(route.queues)
    for i in range(n):
        mq = route.queues[((start + i) & _MASK) % n]
        if is_available(gen, state, mq.broker, now_ms):
            return mq, state
    worst = which_item_worst or ThreadLocalIndex(random.Random(0))
    not_best = _pick_one_at_least_49(state, now_ms, worst)
    if not_best is not None:
        write_nums = route.write_queue_nums.get(not_best, -1)
        if write_nums > 0:
            base = route.queues[index.increment_and_get() % n]
            return MessageQueue(base.topic, not_best, index.increment_and_get() % write_nums), state
        state = state.without(not_best)
    return _round_robin(route, index), state


@dataclass(frozen=True)
class Attempt:
    """One send attempt inside :func:`send_with_retries` and the update it caused."""

    queue: MessageQueue
    begin_ms: int
    end_ms: int
    latency_ms: int
    ok: bool
    error: str | None
    isolation: bool
    reachable: bool
    duration_ms: int | None  # None when fault tolerance is off (no update happened)


@dataclass(frozen=True)
class SendOutcome:
    ok: bool
    attempts: tuple[Attempt, ...]
    end_ms: int
    timed_out: bool = False


AttemptFn = Callable[[MessageQueue], "tuple[int, bool, str | None]"]


@dataclass
class ProducerSelector:
    """The routing side of one producer instance: its fault table and per-thread indexes.

    ``fault_enabled`` is ``sendLatencyFaultEnable`` (off by default, as in Java); ``generation`` also
    decides the (isolation, reachable) mapping of failures.
    """

    generation: Generation
    fault_enabled: bool = False
    detector_enabled: bool = False
    retry_another_broker_when_not_store_ok: bool = False
    retry_response_codes: frozenset[int] = RETRY_RESPONSE_CODES
    seed: int | None = 0
    state: FaultState = field(default_factory=FaultState)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._indexes: dict[tuple[str, int], ThreadLocalIndex] = {}
        self.which_item_worst = ThreadLocalIndex(self.rng)

    def index_for(self, topic: str, thread: int = 0) -> ThreadLocalIndex:
        """Each topic's TopicPublishInfo keeps its own ThreadLocalIndex, one value per thread."""
        key = (topic, thread)
        if key not in self._indexes:
            self._indexes[key] = ThreadLocalIndex(self.rng)
        return self._indexes[key]

    def select(
        self,
        route: TopicRoute,
        now_ms: int,
        last_broker: str | None = None,
        *,
        thread: int = 0,
        retry: bool = False,
    ) -> MessageQueue | None:
        mq, self.state = select_queue(
            self.generation if self.fault_enabled else None,
            route,
            self.state,
            self.index_for(route.topic, thread),
            now_ms,
            last_broker,
            which_item_worst=self.which_item_worst,
            reset_index=retry,
        )
        return mq

    def record(
        self, broker: str, latency_ms: int, status: str, error: str | None, now_ms: int
    ) -> tuple[bool, bool, int | None]:
        """Apply one attempt's result (``updateFaultItem``) at the attempt's end time.

        Returns (isolation, reachable, duration_ms); the duration is None when fault tolerance is
        off, because Java then skips the update entirely.
        """
        isolation, reachable = update_args_for(self.generation.name, status, error, self.detector_enabled)
        duration = None
        if self.fault_enabled:
            self.state, duration = apply_update(
                self.generation, self.state, broker, latency_ms, isolation, reachable, now_ms
            )
        return isolation, reachable, duration


def send_with_retries(
    producer: ProducerSelector,
    route: TopicRoute,
    attempt: AttemptFn,
    now_ms: int,
    retries: int = 2,
    *,
    timeout_ms: int | None = 3000,
    thread: int = 0,
) -> SendOutcome:
    """``sendDefaultImpl`` in sync mode: up to ``1 + retries`` attempts, an update after each.

    ``attempt(queue)`` returns ``(latency_ms, ok, error)``; for a success ``error`` may name a
    non-OK SendStatus (e.g. "FLUSH_DISK_TIMEOUT"). Each attempt starts when the previous one ended
    and its update is applied at its end. Retries follow Java: remoting and client errors retry; a
    broker error retries only if its "CODE: n" is in ``retry_response_codes`` (so
    "[TIMEOUT_CLEAN_QUEUE]" busy rejections do not); InterruptedException and unknown errors stop.
    The loop also stops once more than ``timeout_ms`` has passed since the first attempt.
    """
    attempts: list[Attempt] = []
    clock = now_ms
    last: MessageQueue | None = None
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
        isolation, reachable, duration = producer.record(
            mq.broker, latency, status, None if ok else error, end
        )
        attempts.append(Attempt(mq, clock, end, latency, ok, error, isolation, reachable, duration))
        clock = end
        if ok:
            if status != "SEND_OK" and producer.retry_another_broker_when_not_store_ok:
                continue
            return SendOutcome(True, tuple(attempts), clock)
        if not _retryable(classify_error(error), error, producer.retry_response_codes):
            break
    return SendOutcome(False, tuple(attempts), clock)


def _retryable(kind: ErrorKind, error: str | None, codes: frozenset[int]) -> bool:
    if kind in (ErrorKind.REMOTING, ErrorKind.CLIENT):
        return True
    if kind is ErrorKind.BROKER:
        return broker_response_code(error) in codes
    return False
