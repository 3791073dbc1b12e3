"""The episode decision of one cluster: grid points up to the watermark, then a look-ahead.

Shared by the single fault state (:mod:`pipeline.faults.state`, which evaluates the grid from its
own log and windows) and the cluster decider (:mod:`pipeline.faults.cluster`, which evaluates it
from per-broker point summaries): both pass how to evaluate grid points and how many brokers were
seen at a time, and get the same rows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.faults import episodes as ep_mod

# A suspected episode: (broker code, opened grid point, revision of its last row, still suspected, reason).
Suspect = tuple[int, int, int, bool, str]
# evaluate(open episodes, after, until): runs the grid points in (after, until], returns the closed ones
Evaluate = Callable[[dict[int, ep_mod.Episode], int, int], list[ep_mod.Episode]]


@dataclass(frozen=True)
class Decision:
    last_tick: int  # the last grid point decided
    ahead_tick: int  # the last grid point the look-ahead evaluated
    suspects: tuple[Suspect, ...] = ()
    rows: list[dict[str, Any]] = field(default_factory=list)


def decide(
    before: Decision, open_eps: dict[int, ep_mod.Episode], top: int, head: int, cluster: str,
    brokers: tuple[str, ...], evaluate: Evaluate, seen: Callable[[int], int],
) -> Decision:
    """Decide the grid points in ``(before.last_tick, top]`` (``open_eps`` is updated in place), then
    look ahead to ``head`` (the newest event's grid point). Returns the rows to write."""
    closed = evaluate(open_eps, before.last_tick, top)
    rows = []
    # a confirmed episode continues the revisions of its suspicion (same id, same opening point)
    suspected = {(b, opened): rev for b, opened, rev, _, _ in before.suspects}
    for e in [*closed, *open_eps.values()]:
        if e.revision == 0 and (e.broker, e.opened) in suspected:
            e.revision = suspected[(e.broker, e.opened)] + 1
    for e in closed:
        assert e.closed is not None
        rows.append(ep_mod.episode_row(e, cluster, brokers, int(e.closed), seen(int(e.closed))))
        e.revision += 1
    for b in sorted(open_eps):
        e = open_eps[b]
        if e.changed:
            rows.append(ep_mod.episode_row(e, cluster, brokers, top, seen(top)))
            e.revision += 1
            e.changed = False
    suspects, early_rows, ahead_tick = look_ahead(before, top, head, open_eps, closed, cluster, brokers,
                                                  evaluate, seen)
    return Decision(top, ahead_tick, suspects, rows + early_rows)


def look_ahead(
    before: Decision, top: int, head: int, open_eps: dict[int, ep_mod.Episode], closed: list[ep_mod.Episode],
    cluster: str, brokers: tuple[str, ...], evaluate: Evaluate, seen: Callable[[int], int],
) -> tuple[tuple[Suspect, ...], list[dict[str, Any]], int]:
    """Suspicions: episodes the rules open at grid points after the watermark, on the events so far.

    The watermark waits ``stream.watermark_delay_s`` for late events before a grid point is decided;
    a broker that just went down should not wait that long to be reported. So the grid points up to
    the newest event are evaluated too, on a copy: an episode opening there is written as
    "suspected" (same id the decision will use). When the watermark reaches its grid point, the
    decision either confirms it (its "open" row follows with a higher revision) or not (a
    "withdrawn" row). Nothing else depends on a suspicion: batching never changes what is decided.

    The look-ahead runs when the newest event has passed a grid point it has not evaluated yet: with
    a 1 s trigger, a 30 s watermark and a 5 s grid it would otherwise evaluate the same six points
    in every batch. Returns (suspicions, rows, the grid point it has looked up to).
    """
    ahead: dict[int, ep_mod.Episode] = {}
    fresh = head > max(top, before.ahead_tick)
    if fresh:
        early = copy.deepcopy(open_eps)
        evaluate(early, top, head)
        ahead = {b: e for b, e in early.items() if b not in open_eps and e.opened > top}
    decided = {(e.broker, e.opened) for e in [*closed, *open_eps.values()]}
    rows: list[dict[str, Any]] = []
    kept: list[Suspect] = []
    counted: list[int] = []  # the cluster's broker count at head, counted once if a row needs it

    def seen_at() -> int:
        if not counted:
            counted.append(seen(head))
        return counted[0]

    def withdraw(b: int, opened: int, rev: int, reason: str, at: int) -> None:
        gone = ep_mod.Episode(b, opened, opened, reason, closed=opened, revision=rev + 1)
        rows.append(ep_mod.episode_row(gone, cluster, brokers, at, seen_at(), state="withdrawn"))

    for b, opened, rev, active, reason in before.suspects:
        if opened <= top:  # decided now: confirmed (revisions continue above) or withdrawn
            if active and (b, opened) not in decided:
                withdraw(b, opened, rev, reason, top)
            continue
        if not fresh:  # nothing new to look at: it stands as it was
            kept.append((b, opened, rev, active, reason))
            continue
        still = b in ahead and ahead[b].opened == opened
        if active and not still:  # newer events no longer bear it out (it may come back)
            withdraw(b, opened, rev, reason, head)
            rev += 1
        elif still and not active:
            ahead[b].revision = rev + 1
            rows.append(ep_mod.episode_row(ahead[b], cluster, brokers, head, seen_at(), state="suspected"))
            rev += 1
        kept.append((b, opened, rev, still, ahead[b].reason if still else reason))
    known = {(k[0], k[1]) for k in kept}
    for b, e in sorted(ahead.items()):
        if (b, e.opened) not in known:
            rows.append(ep_mod.episode_row(e, cluster, brokers, head, seen_at(), state="suspected"))
            kept.append((b, e.opened, e.revision, True, e.reason))
    return tuple(kept), rows, max(before.ahead_tick, head)
