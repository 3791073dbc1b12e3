"""One producer's fault items as a pure transition (``LatencyFaultToleranceImpl`` without the clock).

The Java class mutates a ``ConcurrentHashMap`` and reads ``System.currentTimeMillis()``; here the
state is immutable and time is an argument, so the same function drives the replay oracle, the
simulator and a Spark stateful processor. ``apply_update`` is what
``MQFaultStrategy.updateFaultItem`` does when ``sendLatencyFaultEnable`` is on; callers model "off"
by not calling it. :class:`FaultTable` is its mutable twin for a producer's own send loop, where
copying the whole table on every attempt was the simulator's largest cost; tests hold the two equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.rocketmq.generation import (
    GEN_5,
    GEN_49,
    GENERATIONS,
    Generation,
    duration_for,
    generation_for_client_version,
    get_generation,
)
from pipeline.rocketmq.outcomes import update_args

# Window names live in pipeline.rocketmq.windows (which imports this module); they are forwarded
# lazily so ``from pipeline.rocketmq.fault import derive_windows`` works too.
_FORWARDED = {
    "Window": "pipeline.rocketmq.windows",
    "WindowChange": "pipeline.rocketmq.windows",
    "FaultEvent": "pipeline.rocketmq.windows",
    "BrokerTrack": "pipeline.rocketmq.windows",
    "derive_windows": "pipeline.rocketmq.windows",
    "step_windows": "pipeline.rocketmq.windows",
    "advance_windows": "pipeline.rocketmq.windows",
    "derive_windows_arrays": "pipeline.rocketmq.windows_np",
    "WindowArrays": "pipeline.rocketmq.windows_np",
}


def __getattr__(name: str) -> object:
    if name in _FORWARDED:
        import importlib

        return getattr(importlib.import_module(_FORWARDED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GENERATIONS",
    "GEN_5",
    "GEN_49",
    "FaultItem",
    "FaultState",
    "FaultTable",
    "Generation",
    "apply_update",
    "duration_for",
    "generation_for_client_version",
    "get_generation",
    "is_available",
    "is_reachable",
    "next_start",
    "pick_candidates",
    "rank_49",
    "rank_has_ties",
    "update_args",
]


@dataclass(frozen=True)
class FaultItem:
    """``FaultItem``: ``start_timestamp`` is the "avoid until" time, despite its Java name.

    4.9 has no reachable flag; its items always carry ``reachable=True``.
    """

    broker: str
    current_latency: int
    start_timestamp: int
    reachable: bool = True


def _empty_items() -> Mapping[str, FaultItem]:
    return MappingProxyType({})


@dataclass(frozen=True)
class FaultState:
    """The fault item table of one producer instance; never mutated, copied on update."""

    items: Mapping[str, FaultItem] = field(default_factory=_empty_items)

    def __hash__(self) -> int:
        return hash(frozenset(self.items.items()))

    def get(self, broker: str) -> FaultItem | None:
        return self.items.get(broker)

    def sorted_items(self) -> list[FaultItem]:
        """Items ordered by broker name, the order the vectors list them in."""
        return [self.items[name] for name in sorted(self.items)]

    def with_item(self, item: FaultItem) -> FaultState:
        updated = dict(self.items)
        updated[item.broker] = item
        return FaultState(MappingProxyType(updated))

    def without(self, broker: str) -> FaultState:
        """``LatencyFaultTolerance.remove``: 4.9 drops a picked broker that has no write queues."""
        updated = dict(self.items)
        updated.pop(broker, None)
        return FaultState(MappingProxyType(updated))

    def __iter__(self) -> Iterator[FaultItem]:
        return iter(self.sorted_items())

    def __len__(self) -> int:
        return len(self.items)


def next_start(gen: Generation, old_start: int | None, duration_ms: int, now_ms: int) -> int:
    """The avoid-until time after one update; ``old_start`` is None for a broker not yet seen.

    4.9 always writes ``now + duration``, so a fast success ends an avoidance at once. 5.x writes it
    only when ``duration > 0`` and it moves the time later; a new 5.x item starts at 0.
    """
    if not gen.windows_only_grow:
        return now_ms + duration_ms
    base = 0 if old_start is None else old_start
    candidate = now_ms + duration_ms
    return candidate if duration_ms > 0 and candidate > base else base


def apply_update(
    gen: Generation,
    state: FaultState,
    broker: str,
    latency_ms: int,
    isolation: bool,
    reachable: bool,
    now_ms: int,
) -> tuple[FaultState, int]:
    """``updateFaultItem`` at time ``now_ms``; returns the new state and the duration it computed.

    The stored latency is the attempt's real latency even when isolation charged a larger one.
    """
    duration = duration_for(gen, latency_ms, isolation)
    old = state.items.get(broker)
    start = next_start(gen, None if old is None else old.start_timestamp, duration, now_ms)
    item = FaultItem(broker, latency_ms, start, bool(reachable) if gen.name == GEN_5 else True)
    return state.with_item(item), duration


class FaultTable:
    """One producer's fault items, mutable: ``items[broker] = [current_latency, start_timestamp, reachable]``.

    The pure :func:`apply_update` copies the table and builds two frozen objects per send attempt;
    a producer that owns its table (``ProducerSelector``, the simulator) can instead change one list
    in place. :meth:`update` must equal :func:`apply_update` item for item (tests replay the Java
    vectors and random sequences through both), and :meth:`snapshot` returns the equal
    :class:`FaultState`, cached until the next change, so the public API stays pure. Selection
    reads ``items`` directly: a broker is available when it has no item or ``now >= item[1]``.
    """

    __slots__ = ("_floor", "_iso_duration", "_snapshot", "gen", "items", "windows_only_grow")

    def __init__(self, gen: Generation, state: FaultState | None = None) -> None:
        self.gen = gen
        self.items: dict[str, list] = {}
        if state is not None:
            for name, item in state.items.items():
                self.items[name] = [item.current_latency, item.start_timestamp, item.reachable]
        self._snapshot = state
        self.windows_only_grow = gen.windows_only_grow  # read once per attempt: kept as a plain attribute
        self._iso_duration = duration_for(gen, 0, True)
        # Below every latencyMax entry the scan matches nothing: the common, healthy case costs one compare.
        self._floor = min(gen.latency_max, default=None)

    def update(self, broker: str, latency_ms: int, isolation: bool, reachable: bool, now_ms: int) -> int:
        """:func:`apply_update` in place; returns the duration it computed."""
        if isolation:
            duration = self._iso_duration
        elif self._floor is None or latency_ms < self._floor:
            duration = 0
        else:
            duration = duration_for(self.gen, latency_ms, False)
        self._snapshot = None
        item = self.items.get(broker)
        if self.windows_only_grow:  # 5.x: the avoid-until time only moves later; a new item starts at 0
            if item is None:
                candidate = now_ms + duration
                self.items[broker] = [latency_ms, candidate if duration > 0 and candidate > 0 else 0, bool(reachable)]
            else:
                item[0] = latency_ms
                if duration > 0 and now_ms + duration > item[1]:  # the sum only then: timestamps are big ints
                    item[1] = now_ms + duration
                item[2] = bool(reachable)
        elif item is None:  # 4.9: always now + duration, and no reachable flag
            self.items[broker] = [latency_ms, now_ms + duration, True]
        else:
            item[0], item[1], item[2] = latency_ms, now_ms + duration, True
        return duration

    def drop(self, broker: str) -> None:
        """:meth:`FaultState.without` in place."""
        if self.items.pop(broker, None) is not None:
            self._snapshot = None

    def start_of(self, broker: str) -> int | None:
        """The broker's avoid-until time, or None for a broker never seen."""
        item = self.items.get(broker)
        return None if item is None else item[1]

    def snapshot(self) -> FaultState:
        """The equal immutable state (same items, same order)."""
        snap = self._snapshot
        if snap is None:
            built = {name: FaultItem(name, lat, start, reach) for name, (lat, start, reach) in self.items.items()}
            snap = self._snapshot = FaultState(MappingProxyType(built))
        return snap


def is_available(gen: Generation, state: FaultState, broker: str, now_ms: int) -> bool:
    """``isAvailable``: a broker never seen is available; otherwise once ``now >= start``.

    4.9 writes it as ``now - start >= 0`` and 5.x as ``now >= start``; with Python's unbounded ints
    (and any realistic Java long) they agree, so one comparison serves both generations. ``gen`` is
    kept in the signature so a future generation can differ (5.1.4 also required ``reachable``).
    """
    item = state.items.get(broker)
    return item is None or now_ms >= item.start_timestamp


def is_reachable(state: FaultState, broker: str) -> bool:
    """5.x ``isReachable``: the flag stored by the last update; a broker never seen is reachable."""
    item = state.items.get(broker)
    return item is None or item.reachable


def _rank_key(item: FaultItem, now_ms: int) -> tuple[int, int, int]:
    """``FaultItem.compareTo`` in 4.9: available first, then lower latency, then earlier start."""
    return (0 if now_ms >= item.start_timestamp else 1, item.current_latency, item.start_timestamp)


def rank_49(state: FaultState, now_ms: int) -> list[str]:
    """4.9's ``Collections.sort`` of the fault items at ``now_ms``, as broker names.

    Java breaks ties by ``ConcurrentHashMap`` iteration order, which carries no meaning; ties here
    fall back to broker name so the result is deterministic. See :func:`rank_has_ties`.
    """
    items = sorted(state.items.values(), key=lambda it: (_rank_key(it, now_ms), it.broker))
    return [it.broker for it in items]


def rank_has_ties(state: FaultState, now_ms: int) -> bool:
    """True when two items compare equal, i.e. when :func:`rank_49`'s order is not Java's."""
    keys = sorted(_rank_key(it, now_ms) for it in state.items.values())
    return any(a == b for a, b in itertools.pairwise(keys))


def pick_candidates(gen: Generation, state: FaultState, now_ms: int) -> list[str]:
    """Every broker ``pickOneAtLeast`` can return at ``now_ms``.

    4.9 cycles through the best half of the ranking (at least one); 5.x shuffles and returns the
    first reachable item, so any reachable broker, sorted here by name.
    """
    if gen.name == GEN_49:
        ranked = rank_49(state, now_ms)
        return ranked[: max(1, len(ranked) // 2)] if ranked else []
    return sorted(name for name, item in state.items.items() if item.reachable)
