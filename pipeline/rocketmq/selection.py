"""Producer queue selection, as ``MQFaultStrategy`` and ``DefaultMQProducerImpl`` do it.

The simulator models producers with this, so the traffic it generates shifts between brokers the way
a real client's does: round robin over the write queues, avoiding ``lastBrokerName`` on a retry, and
(with ``sendLatencyFaultEnable``) avoiding brokers the fault rules mark unavailable. Randomness (the
initial per-thread index, 5.x's index reset on retry) comes from a seeded ``random.Random``, so a run
is reproducible. :func:`select_queue` is pure over the immutable :class:`FaultState`;
:class:`ProducerSelector` runs the same selection functions on its own mutable :class:`FaultTable`
(Java's per-producer ``ConcurrentHashMap``), so a send copies nothing: the simulator sends a few
hundred thousand messages per second through here. The send retry loop is in
:mod:`pipeline.rocketmq.send` (its names are forwarded from this module).

Known difference: 4.9.0-5.1.3 rewrote the *shared* MessageQueue's broker name and queue id in the
``pickOneAtLeast`` fallback (#7779), corrupting the route until the next refresh. Here the fallback
returns a new queue and the route stays intact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pipeline.rocketmq.fault import FaultState, FaultTable, Generation, rank_49
from pipeline.rocketmq.outcomes import SUCCESS_STATUSES, update_args_for
from pipeline.rocketmq.queues import MessageQueue

_MASK = 0x7FFFFFFF  # also Integer.MAX_VALUE
# DefaultMQProducer.retryResponseCodes: TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR,
# NO_PERMISSION, NO_BUYER_ID, NOT_IN_CURRENT_UNIT. SYSTEM_BUSY (2, "[TIMEOUT_CLEAN_QUEUE]") is absent.
RETRY_RESPONSE_CODES = frozenset({17, 14, 1, 16, 204, 205})
# on_change(broker, now_ms, avoid_until_ms): see ProducerSelector.
ChangeFn = Callable[[str, int, int], None]


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
        value = self._value
        if value is None:
            value = self._rng.randrange(_MASK + 1)
        # Only Integer.MAX_VALUE wraps, and masking leaves a non-negative value as it is: comparisons,
        # cheaper than arithmetic on these (often multi-digit) ints. Runs once per message sent.
        self._value = value = value + 1 if value != _MASK else -_MASK - 1
        return value if value >= 0 else value & _MASK

    def reset(self) -> None:
        """5.x ``resetIndex`` on a retry: ``random.nextInt(Integer.MAX_VALUE)``."""
        self._value = self._rng.randrange(_MASK)


def _select_plain(route: TopicRoute, index: ThreadLocalIndex, last_broker: str | None) -> MessageQueue:
    """Fault tolerance off: the next queue, skipping ``lastBrokerName`` for up to one full turn."""
    queues = route.queues
    n = tries = len(queues)
    if last_broker is not None:
        while tries:
            tries -= 1
            mq = queues[index.increment_and_get() % n]
            if mq.broker != last_broker:
                return mq
    return queues[index.increment_and_get() % n]


def _select_5(
    route: TopicRoute, items: dict[str, list], index: ThreadLocalIndex, now_ms: int, last_broker: str | None
) -> MessageQueue:
    """5.x: available and not the last broker; else reachable and not the last broker; else any.

    ``items`` is a :class:`FaultTable`'s: a broker is available without an item or once
    ``now >= item[1]``, reachable without an item or if ``item[2]``.
    """
    queues = route.queues
    n = tries = len(queues)
    while tries:  # up to one full turn; counted down, as range() would allocate on every send
        tries -= 1
        mq = queues[index.increment_and_get() % n]
        if mq.broker != last_broker:
            item = items.get(mq.broker)
            if item is None or now_ms >= item[1]:
                return mq
    tries = n
    while tries:
        tries -= 1
        mq = queues[index.increment_and_get() % n]
        if mq.broker != last_broker:
            item = items.get(mq.broker)
            if item is None or item[2]:
                return mq
    return queues[index.increment_and_get() % n]


def _select_49(
    route: TopicRoute,
    faults: FaultTable,
    index: ThreadLocalIndex,
    now_ms: int,
    which_item_worst: ThreadLocalIndex,
    on_change: ChangeFn | None,
) -> MessageQueue:
    """4.9: one index read, then a local walk over the queues (lastBrokerName is ignored here).

    If no broker is available, ``pickOneAtLeast``; a picked broker without write queues is dropped
    from the table (and so available again: ``on_change(broker, now, now)``).
    """
    queues, items = route.queues, faults.items
    n = len(queues)
    start = i = index.increment_and_get()
    while i - start < n:
        mq = queues[(i & _MASK) % n]
        item = items.get(mq.broker)
        if item is None or now_ms >= item[1]:
            return mq
        i += 1
    not_best = _pick_one_at_least_49(faults.snapshot(), now_ms, which_item_worst)
    if not_best is not None:
        write_nums = route.write_queue_nums.get(not_best, -1)
        if write_nums > 0:
            base = queues[index.increment_and_get() % n]
            return MessageQueue(base.topic, not_best, index.increment_and_get() % write_nums)
        faults.drop(not_best)
        if on_change is not None:
            on_change(not_best, now_ms, now_ms)
    return queues[index.increment_and_get() % n]


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
    when ``pickOneAtLeast`` names a broker without write queues (it removes that item); otherwise
    the very ``state`` passed in. :class:`ProducerSelector` runs the same functions on its own
    mutable :class:`FaultTable` instead of copying the state.
    """
    if not route.queues:
        return None, state
    if gen is None:
        return _select_plain(route, index, last_broker), state
    faults = FaultTable(gen, state)
    if gen.windows_only_grow:
        if reset_index:
            index.reset()
        return _select_5(route, faults.items, index, now_ms, last_broker), state
    worst = which_item_worst or ThreadLocalIndex(random.Random(0))
    mq = _select_49(route, faults, index, now_ms, worst, None)
    return mq, state if len(faults.items) == len(state.items) else faults.snapshot()


class _StateView:
    """``ProducerSelector.state``: an immutable :class:`FaultState` over the selector's mutable table.

    The selector updates a :class:`FaultTable` in place on every attempt; reading ``state`` gives
    the equal FaultState (built once per change), assigning one replaces the table. A dataclass
    field with a descriptor default keeps ``state=`` in the constructor, as before.
    """

    def __get__(self, obj: ProducerSelector | None, owner: type | None = None) -> FaultState:
        if obj is None:
            return _EMPTY_STATE
        return obj.fault_table().snapshot()

    def __set__(self, obj: ProducerSelector, state: FaultState) -> None:
        obj._faults = FaultTable(obj.generation, state)


_EMPTY_STATE = FaultState()


@dataclass
class ProducerSelector:
    """The routing side of one producer instance: its fault table and per-thread indexes.

    ``fault_enabled`` is ``sendLatencyFaultEnable`` (off by default, as in Java); ``generation`` also
    decides the (isolation, reachable) mapping of failures. ``on_change``, if set, is called as
    ``(broker, now_ms, avoid_until_ms)`` after every change of the fault table (the simulator
    records the windows its clients used with it). Subclasses may override :meth:`select` and
    :meth:`record`; the send loop then goes through them.
    """

    generation: Generation
    fault_enabled: bool = False
    detector_enabled: bool = False
    retry_another_broker_when_not_store_ok: bool = False
    retry_response_codes: frozenset[int] = RETRY_RESPONSE_CODES
    seed: int | None = 0
    state: FaultState = _StateView()  # type: ignore[assignment]
    # Whether send_attempts may inline select and record, fixed when a subclass is defined: one
    # attribute read per message instead of looking both methods up on the class.
    _inline_steps: ClassVar[bool] = True
    if TYPE_CHECKING:  # set by ``state``'s descriptor; not a field at run time
        _faults: FaultTable = field(init=False, repr=False, compare=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._inline_steps = cls.select is ProducerSelector.select and cls.record is ProducerSelector.record

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._indexes: dict[tuple[str, int], ThreadLocalIndex] = {}
        self.which_item_worst = ThreadLocalIndex(self.rng)
        self.on_change: ChangeFn | None = None

    def fault_table(self) -> FaultTable:
        """The mutable table behind ``state`` (rebuilt if ``generation`` was reassigned)."""
        faults = self._faults
        if faults.gen is not self.generation:
            faults = self._faults = FaultTable(self.generation, faults.snapshot())
        return faults

    def index_for(self, topic: str, thread: int = 0) -> ThreadLocalIndex:
        """Each topic's TopicPublishInfo keeps its own ThreadLocalIndex, one value per thread."""
        key = (topic, thread)
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = ThreadLocalIndex(self.rng)
        return index

    def select(
        self,
        route: TopicRoute,
        now_ms: int,
        last_broker: str | None = None,
        *,
        thread: int = 0,
        retry: bool = False,
    ) -> MessageQueue | None:
        """:func:`select_queue` on this producer's own table, changed in place rather than copied."""
        index = self.index_for(route.topic, thread)
        if not route.queues:
            return None
        if not self.fault_enabled:
            return _select_plain(route, index, last_broker)
        if self.generation.windows_only_grow:
            if retry:
                index.reset()
            return _select_5(route, self.fault_table().items, index, now_ms, last_broker)
        return _select_49(route, self.fault_table(), index, now_ms, self.which_item_worst, self.on_change)

    def record(
        self, broker: str, latency_ms: int, status: str, error: str | None, now_ms: int
    ) -> tuple[bool, bool, int | None]:
        """Apply one attempt's result (``updateFaultItem``) at the attempt's end time.

        Returns (isolation, reachable, duration_ms); the duration is None when fault tolerance is
        off, because Java then skips the update entirely.
        """
        if status in SUCCESS_STATUSES:
            isolation, reachable = False, True
        else:
            isolation, reachable = failure_args(self.generation.name, status, error, self.detector_enabled)
        if not self.fault_enabled:
            return isolation, reachable, None
        faults = self.fault_table()
        duration = faults.update(broker, latency_ms, isolation, reachable, now_ms)
        if self.on_change is not None:
            self.on_change(broker, now_ms, faults.items[broker][1])
        return isolation, reachable, duration


# Classifying an error text takes regular expressions; a producer sees the same few texts again and again.
_CACHE_LIMIT = 4096
_ARGS_CACHE: dict[tuple[str, str, str | None, bool], tuple[bool, bool]] = {}


def failure_args(generation: str, status: str, error: str | None, detector_enabled: bool) -> tuple[bool, bool]:
    """:func:`update_args_for` of a status outside ``SUCCESS_STATUSES``, memoised."""
    key = (generation, status, error, detector_enabled)
    args = _ARGS_CACHE.get(key)
    if args is None:
        args = update_args_for(generation, status, error, detector_enabled)
        if len(_ARGS_CACHE) >= _CACHE_LIMIT:
            _ARGS_CACHE.clear()
        _ARGS_CACHE[key] = args
    return args


# The send loop lives in pipeline.rocketmq.send (it needs ProducerSelector); its names are forwarded
# lazily so ``from pipeline.rocketmq.selection import send_with_retries`` keeps working.
_FORWARDED = frozenset({"Attempt", "AttemptFn", "AttemptRow", "SendOutcome", "send_attempts", "send_with_retries"})


def __getattr__(name: str) -> object:
    if name in _FORWARDED:
        from pipeline.rocketmq import send

        return getattr(send, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
