"""The sync send loop of ``DefaultMQProducerImpl.sendDefaultImpl``: attempts, updates and retries.

Split from :mod:`pipeline.rocketmq.selection` (which forwards these names) because the loop comes
twice. :func:`send_attempts` does ``ProducerSelector.select`` / ``record``'s steps inline for a
plain :class:`ProducerSelector`: the producer's table, index and generation are looked up once per
message, not per attempt through three layers of calls, and no object is built per attempt but a
tuple. ``_send_via_methods`` goes through ``producer.select`` / ``producer.record`` so subclasses
(the feed-aware selector) can change them. The simulator sends every message through here, so
this is most of its speed (project issue 6); tests hold both loops equal to the first, plain
implementation on random sequences of faults, retries, routes and clock jumps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.rocketmq.outcomes import SUCCESS_STATUSES, ErrorKind, broker_response_code, classify_error
from pipeline.rocketmq.queues import MessageQueue
from pipeline.rocketmq.selection import (
    ProducerSelector,
    TopicRoute,
    _select_5,
    _select_49,
    _select_plain,
    failure_args,
)

__all__ = ["Attempt", "AttemptFn", "AttemptRow", "SendOutcome", "send_attempts", "send_with_retries"]


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


# Attempt's nine fields as a plain tuple: what send_attempts returns, far cheaper to build.
AttemptRow = tuple[MessageQueue, int, int, int, bool, "str | None", bool, bool, "int | None"]


@dataclass(frozen=True)
class SendOutcome:
    ok: bool
    attempts: tuple[Attempt, ...]
    end_ms: int
    timed_out: bool = False


AttemptFn = Callable[[MessageQueue], "tuple[int, bool, str | None]"]

_CACHE_LIMIT = 4096
_RETRY_FACTS: dict[str | None, tuple[ErrorKind, int | None]] = {}


def _retryable(error: str | None, codes: frozenset[int]) -> bool:
    """Java retries remoting and client errors, and broker errors whose code is in ``codes``.

    InterruptedException and unknown errors stop. The (kind, code) of a text is memoised: it takes
    regular expressions, and a producer sees the same few texts again and again.
    """
    facts = _RETRY_FACTS.get(error)
    if facts is None:
        facts = (classify_error(error), broker_response_code(error))
        if len(_RETRY_FACTS) >= _CACHE_LIMIT:
            _RETRY_FACTS.clear()
        _RETRY_FACTS[error] = facts
    kind, code = facts
    if kind is ErrorKind.REMOTING or kind is ErrorKind.CLIENT:
        return True
    return kind is ErrorKind.BROKER and code in codes


def send_attempts(
    producer: ProducerSelector,
    route: TopicRoute,
    attempt: AttemptFn,
    now_ms: int,
    retries: int = 2,
    *,
    timeout_ms: int | None = 3000,
    thread: int = 0,
) -> tuple[bool, list[AttemptRow], int, bool]:
    """:func:`send_with_retries` returning ``(ok, attempts, end_ms, timed_out)``, attempts as tuples.

    Each row holds :class:`Attempt`'s fields in order (``Attempt(*row)`` makes one). For a plain
    :class:`ProducerSelector` this is ``select`` and ``record`` inlined: the table, index and
    generation are looked up once per message, not through three layers of calls per attempt.
    A subclass that overrides either goes through :func:`_send_via_methods`, the same loop.
    """
    if not producer._inline_steps:
        return _send_via_methods(producer, route, attempt, now_ms, retries, timeout_ms, thread)
    attempts: list[AttemptRow] = []
    clock = now_ms
    last_broker: str | None = None
    # ProducerSelector.index_for and fault_table(), inlined: this runs once per simulated message.
    index = producer._indexes.get((route.topic, thread)) or producer.index_for(route.topic, thread)
    enabled = producer.fault_enabled
    faults = producer._faults
    if faults.gen is not producer.generation:
        faults = producer.fault_table()
    items = faults.items
    five = faults.windows_only_grow
    on_change = producer.on_change
    queues = route.queues
    times = -1
    while times < retries:  # times = 0 .. retries, as range(1 + retries) but without allocating it
        times += 1
        if timeout_ms is not None and clock - now_ms > timeout_ms:
            return False, attempts, clock, True
        if not queues:
            break
        if not enabled:
            mq = _select_plain(route, index, last_broker)
        elif five:
            if times:
                index.reset()
            mq = _select_5(route, items, index, clock, last_broker)
        else:
            mq = _select_49(route, faults, index, clock, producer.which_item_worst, on_change)
        last_broker = mq.broker
        latency, ok, error = attempt(mq)
        end = clock if latency < 0 else clock + latency  # clock + max(latency, 0), without the call
        if ok:
            status = error if error in SUCCESS_STATUSES else "SEND_OK"
            isolation, reachable = False, True
        else:
            status = "FAILED"
            isolation, reachable = failure_args(faults.gen.name, status, error, producer.detector_enabled)
        duration = None
        if enabled:
            duration = faults.update(last_broker, latency, isolation, reachable, end)
            if on_change is not None:
                on_change(last_broker, end, items[last_broker][1])
        attempts.append((mq, clock, end, latency, ok, error, isolation, reachable, duration))
        clock = end
        if ok:
            if status != "SEND_OK" and producer.retry_another_broker_when_not_store_ok:
                continue
            return True, attempts, clock, False
        if not _retryable(error, producer.retry_response_codes):
            break
    return False, attempts, clock, False


def _send_via_methods(
    producer: ProducerSelector,
    route: TopicRoute,
    attempt: AttemptFn,
    now_ms: int,
    retries: int,
    timeout_ms: int | None,
    thread: int,
) -> tuple[bool, list[AttemptRow], int, bool]:
    """The loop of :func:`send_attempts` through ``producer.select`` and ``producer.record``."""
    attempts: list[AttemptRow] = []
    clock = now_ms
    last_broker: str | None = None
    for times in range(1 + retries):
        if timeout_ms is not None and clock - now_ms > timeout_ms:
            return False, attempts, clock, True
        mq = producer.select(route, clock, last_broker, thread=thread, retry=times > 0)
        if mq is None:
            break
        last_broker = mq.broker
        latency, ok, error = attempt(mq)
        end = clock + max(latency, 0)
        status = (error if error in SUCCESS_STATUSES else "SEND_OK") if ok else "FAILED"
        isolation, reachable, duration = producer.record(last_broker, latency, status, None if ok else error, end)
        attempts.append((mq, clock, end, latency, ok, error, isolation, reachable, duration))
        clock = end
        if ok:
            if status != "SEND_OK" and producer.retry_another_broker_when_not_store_ok:
                continue
            return True, attempts, clock, False
        if not _retryable(error, producer.retry_response_codes):
            break
    return False, attempts, clock, False


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
    ok, rows, end_ms, timed_out = send_attempts(
        producer, route, attempt, now_ms, retries, timeout_ms=timeout_ms, thread=thread
    )
    return SendOutcome(ok, tuple(Attempt(*row) for row in rows), end_ms, timed_out)
