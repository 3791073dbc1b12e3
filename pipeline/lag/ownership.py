"""Who owns each queue: RocketMQ's own allocation over a group's membership, never a second copy.

``group_membership`` gives the client ids and the strategy name; the queues are every queue of the
topic seen so far (all brokers). :func:`queue_owners` runs ``pipeline.rocketmq.rebalance`` (the
RebalanceImpl view: queues deduplicated and sorted, client ids sorted, one allocation per member).

Only strategies that need nothing beyond the membership event can be computed from the stream:
AVG, AVG_BY_CIRCLE and CONSISTENT_HASH (RocketMQ's default 10 virtual nodes). CONFIG and the machine
room strategies depend on settings inside the clients; their owners are reported as unknown rather
than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.rocketmq import MessageQueue, canonical_strategy_name, rebalance

MEMBERSHIP_ONLY_STRATEGIES = frozenset({"AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"})


@dataclass(frozen=True)
class Ownership:
    """Owner per queue (queues nobody claims are absent), idle members, and why owners are missing."""

    owners: dict[MessageQueue, str]
    idle: tuple[str, ...]
    error: str | None = None


def queue_owners(
    strategy: str, group: str, queues: Sequence[MessageQueue], client_ids: Sequence[str], **options: Any
) -> Ownership:
    """Every queue's owner and the members left without queues, as RocketMQ's clients compute them.

    A Java exception in the strategy (empty membership, no queues, ...) is returned as ``error``:
    RebalanceImpl logs it and keeps the old assignment, so the owners are unknown to us.
    Only ByConfig lets two members claim one queue; the first in client-id order is reported.
    """
    rb = rebalance(strategy, group, queues, client_ids, **options)
    owners: dict[MessageQueue, str] = {}
    idle: list[str] = []
    errors = [a.error for a in rb.ownership_by_cid.values() if a.error]
    for cid, alloc in rb.ownership_by_cid.items():
        if alloc.error or alloc.result is None:
            continue
        if not alloc.result:
            idle.append(cid)
        for mq in alloc.result:
            owners.setdefault(mq, cid)
    if not rb.ownership_by_cid:
        errors.append("no members")
    return Ownership(owners, tuple(idle), errors[0] if errors else None)


def membership_owners(
    strategy: str, group: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> Ownership:
    """:func:`queue_owners` for what a membership event says; other strategies are not guessed."""
    name = canonical_strategy_name(strategy)
    if name not in MEMBERSHIP_ONLY_STRATEGIES:
        return Ownership({}, (), f"{name} needs client-side settings; owners unknown")
    if not queues:
        return Ownership({}, (), "no queues known")
    return queue_owners(name, group, queues, client_ids)


def owner_mismatch(
    reported_by: np.ndarray, owner: np.ndarray, ts_ms: np.ndarray, changed_ms: np.ndarray, grace_ms: int
) -> np.ndarray:
    """Progress reported by a client that does not own the queue.

    Consumers rebalance on their own timers (every 20 s in RocketMQ), so for ``grace_ms`` after the
    membership changed the previous owner may still legitimately commit: not flagged then.
    """
    known = np.array([r is not None and o is not None for r, o in zip(reported_by, owner)], dtype=bool)
    differs = known & (reported_by != owner)
    return differs & (ts_ms - changed_ms >= grace_ms)
