"""Consumer queue allocation by strategy name, and the whole group's view RebalanceImpl builds.

Strategies are chosen by name (the names their Java ``getName()`` returns, or the Java class names)
and unknown names or options fail with the valid ones listed. Java failures are not
Python exceptions here: like RebalanceImpl, which catches them, logs and keeps the old assignment,
:func:`allocate` returns them as :class:`AllocResult` ``error`` values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.rocketmq import strategies as s
from pipeline.rocketmq.javalang import JavaException, java_sorted
from pipeline.rocketmq.queues import MessageQueue, sort_queues

__all__ = [
    "STRATEGIES",
    "AllocResult",
    "MessageQueue",
    "Rebalance",
    "StrategySpec",
    "allocate",
    "build_strategy",
    "canonical_strategy_name",
    "owner_lists",
    "owners",
    "rebalance",
]


@dataclass(frozen=True)
class AllocResult:
    """What ``allocate`` returned (possibly null), or the Java exception class it threw."""

    result: list[MessageQueue] | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        queues = None if self.result is None else [mq.to_json() for mq in self.result]
        return {"result": queues, "error": self.error}


@dataclass(frozen=True)
class Rebalance:
    """``RebalanceImpl.rebalanceByTopic`` (CLUSTERING) for every member of the group at once.

    ``mq_all_sorted`` is deduplicated and sorted; ``cid_all_sorted`` is sorted but keeps duplicates
    (Java sorts the list it got). ``ownership_by_cid`` has one entry per distinct client id, in that
    order; ``current`` is the allocation of the ``current_cid`` passed to :func:`rebalance`, if any.
    """

    mq_all_sorted: list[MessageQueue]
    cid_all_sorted: list[str]
    ownership_by_cid: dict[str, AllocResult]
    current: AllocResult | None = None


@dataclass(frozen=True)
class StrategySpec:
    """A registered strategy: its canonical name, Java class, accepted options and constructor."""

    name: str
    java_class: str
    options: tuple[str, ...]
    build: Callable[..., s.Strategy]


def _build_nearby(
    inner_strategy: str | None = None,
    inner_virtual_node_cnt: int = 10,
    broker_rooms: Mapping[str, str | None] | None = None,
    consumer_rooms: Mapping[str, str | None] | None = None,
) -> s.Strategy:
    inner: s.Strategy | None = None
    if inner_strategy is not None:
        name = canonical_strategy_name(inner_strategy)
        if name == "MACHINE_ROOM_NEARBY":
            raise ValueError("MACHINE_ROOM_NEARBY cannot be its own inner strategy")
        options = {"virtual_node_cnt": inner_virtual_node_cnt} if name == "CONSISTENT_HASH" else {}
        inner = build_strategy(name, **options)
    return s.MachineRoomNearby(inner, broker_rooms, consumer_rooms)


def _build_config(config_mq_list: Sequence[MessageQueue] | None = None) -> s.Strategy:
    return s.ByConfig(config_mq_list)


def _build_machine_room(consumer_idcs: Collection[str] | None = None) -> s.Strategy:
    return s.ByMachineRoom(consumer_idcs)


def _build_consistent_hash(virtual_node_cnt: int = 10) -> s.Strategy:
    return s.ConsistentHash(virtual_node_cnt)


_SPECS = (
    StrategySpec("AVG", "AllocateMessageQueueAveragely", (), s.Averagely),
    StrategySpec("AVG_BY_CIRCLE", "AllocateMessageQueueAveragelyByCircle", (), s.AveragelyByCircle),
    StrategySpec(
        "CONSISTENT_HASH", "AllocateMessageQueueConsistentHash", ("virtual_node_cnt",), _build_consistent_hash
    ),
    StrategySpec("CONFIG", "AllocateMessageQueueByConfig", ("config_mq_list",), _build_config),
    StrategySpec(
        "MACHINE_ROOM", "AllocateMessageQueueByMachineRoom", ("consumer_idcs",), _build_machine_room
    ),
    StrategySpec(
        "MACHINE_ROOM_NEARBY",
        "AllocateMachineRoomNearby",
        ("inner_strategy", "inner_virtual_node_cnt", "broker_rooms", "consumer_rooms"),
        _build_nearby,
    ),
)

STRATEGIES: Mapping[str, StrategySpec] = {
    **{spec.name: spec for spec in _SPECS},
    **{spec.java_class: spec for spec in _SPECS},
}


def canonical_strategy_name(name: str) -> str:
    """The short name ("AVG", ...) for a short or Java class name; ValueError lists valid names."""
    spec = STRATEGIES.get(name)
    if spec is None:
        raise ValueError(f"unknown allocation strategy {name!r}; valid: {sorted(STRATEGIES)}")
    return spec.name


def build_strategy(name: str, **options: Any) -> s.Strategy:
    """Construct a strategy. Unknown names/options raise ValueError; Java constructor failures
    (a negative virtual node count, a null inner strategy) raise a JavaException."""
    spec = STRATEGIES[canonical_strategy_name(name)]
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(f"strategy {spec.name} does not take {unknown}; valid options: {list(spec.options)}")
    return spec.build(**options)


def _run(
    strategy: s.Strategy, group: str, cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> AllocResult:
    try:
        return AllocResult(strategy.allocate(group, cid, mq_all, cid_all))
    except JavaException as exc:
        return AllocResult(None, exc.java_name)


def allocate(
    strategy_name: str,
    consumer_group: str,
    current_cid: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
    **options: Any,
) -> AllocResult:
    """``strategy.allocate(group, cid, mqAll, cidAll)`` on the lists exactly as given."""
    try:
        strategy = build_strategy(strategy_name, **options)
    except JavaException as exc:
        return AllocResult(None, exc.java_name)
    return _run(strategy, consumer_group, current_cid, list(mq_all), list(cid_all))


def rebalance(
    strategy_name: str,
    consumer_group: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
    current_cid: str | None = None,
    **options: Any,
) -> Rebalance:
    """Deduplicate and sort the queues, sort the client ids, and allocate for each distinct member."""
    mq_sorted = sort_queues(list(dict.fromkeys(mq_all)))
    cid_sorted = java_sorted(list(cid_all))
    try:
        strategy: s.Strategy | None = build_strategy(strategy_name, **options)
        failure = None
    except JavaException as exc:
        strategy, failure = None, AllocResult(None, exc.java_name)

    def one(cid: str) -> AllocResult:
        if strategy is None:
            assert failure is not None
            return failure
        return _run(strategy, consumer_group, cid, mq_sorted, cid_sorted)

    ownership = {cid: one(cid) for cid in dict.fromkeys(cid_sorted)}
    current = None
    if current_cid is not None:
        current = ownership[current_cid] if current_cid in ownership else one(current_cid)
    return Rebalance(mq_sorted, cid_sorted, ownership, current)


def owner_lists(rb: Rebalance) -> dict[MessageQueue, list[str]]:
    """Every consumer that claims each queue, in client-id order; unclaimed queues are absent."""
    claims: dict[MessageQueue, list[str]] = {}
    for cid, alloc in rb.ownership_by_cid.items():
        for mq in alloc.result or ():
            claims.setdefault(mq, []).append(cid)
    return claims


def owners(rb: Rebalance) -> dict[MessageQueue, str]:
    """The owner of each claimed queue. Only ByConfig makes several consumers claim one queue; such
    a queue maps to the first claimant in client-id order (see :func:`owner_lists`)."""
    return {mq: cids[0] for mq, cids in owner_lists(rb).items()}
