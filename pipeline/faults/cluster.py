"""The cluster decision over per-broker point summaries: broker fault episodes without the events.

With the fault state kept per broker, each broker's step writes its grid points
(:mod:`pipeline.faults.points`); this state gathers them per cluster and runs the same decision as
the single fault state (:func:`pipeline.faults.decide.decide`) on them: grid points up to the
settle point are decided, later ones up to the newest event are looked ahead at. Its state is
small (a few hundred points per broker at most, open episodes, suspicions) and JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from pipeline.config import FaultsConfig
from pipeline.faults import decide
from pipeline.faults import episodes as ep_mod
from pipeline.faults.points import HEADER, point_of

NONE = -1


@dataclass(frozen=True)
class ClusterState:
    cluster: str
    brokers: tuple[str, ...] = ()  # codes of episodes and suspicions index this
    last_tick: int = NONE
    ahead_tick: int = NONE
    suspects: tuple[decide.Suspect, ...] = ()
    episodes: tuple[dict[str, Any], ...] = ()  # open episodes, as JSON-able dicts
    points: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # broker -> tick -> row
    heads: dict[str, int] = field(default_factory=dict)  # broker -> newest event time


def apply_points(state: ClusterState, rows: list[dict[str, Any]]) -> ClusterState:
    """Each broker's emission replaces what it said before for grid points after its ``from_ms``."""
    points = dict(state.points)
    heads = dict(state.heads)
    brokers = list(state.brokers)
    by_broker: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_broker.setdefault(row["broker_name"], []).append(row)
    for broker, mine in sorted(by_broker.items()):
        after = min(int(r["from_ms"]) for r in mine)
        kept = {t: r for t, r in points.get(broker, {}).items() if t <= after}
        kept.update({int(r["tick"]): r for r in mine if int(r["tick"]) != HEADER})
        points[broker] = kept
        head = max(int(r["head_ms"]) for r in mine)
        if head != HEADER:
            heads[broker] = max(head, heads.get(broker, HEADER))
        if broker not in brokers:
            brokers.append(broker)
    return replace(state, points=points, heads=heads, brokers=tuple(brokers))


def cluster_step(
    state: ClusterState, rows: list[dict[str, Any]], settle_ms: int, cfg: FaultsConfig
) -> tuple[ClusterState, list[dict[str, Any]]]:
    """One micro-batch: the brokers' new point rows, then the decision up to ``settle_ms``."""
    state = apply_points(state, rows)
    interval = int(cfg.evaluation_interval_s * 1000)
    code = {b: i for i, b in enumerate(state.brokers)}
    ticks_of = {t for pts in state.points.values() for t in pts}
    last = state.last_tick
    if last == NONE:
        if not ticks_of:
            return state, []
        last = min(ticks_of) - interval
    top = max(last, (settle_ms // interval) * interval)
    head = (max(state.heads.values()) // interval) * interval if state.heads else top
    open_eps = {int(e["broker"]): _episode(e) for e in state.episodes}
    slack = int(cfg.episode_close_after_s * 1000) + interval

    def evaluate(eps: dict[int, ep_mod.Episode], after: int, until: int) -> list[ep_mod.Episode]:
        # an open episode away from every point closes only at its silence bound (evaluate_points)
        grid = sorted(t for t in ticks_of if after < t <= until)
        at = []
        for t in grid:
            here = {code[b]: point_of(pts[t]) for b, pts in state.points.items() if t in pts}
            here.update({b: ep_mod.Point() for b in eps if b not in here})
            at.append(here)
        return ep_mod.evaluate_points(eps, grid, at, cfg, until)

    def seen(t: int) -> int:
        return sum(1 for pts in state.points.values() if t in pts and pts[t]["seen"])

    decision = decide.decide(decide.Decision(last, state.ahead_tick, state.suspects), open_eps, top, head,
                             state.cluster, state.brokers, evaluate, seen)
    # decided points are kept one closing delay back: an episode that closes later is written with
    # the brokers seen at its closing point, up to that long before the decision
    points = {b: {t: r for t, r in pts.items() if t > top - slack} for b, pts in state.points.items()}
    points = {b: pts for b, pts in points.items() if pts}
    out = replace(state, last_tick=decision.last_tick, ahead_tick=decision.ahead_tick, suspects=decision.suspects,
                  episodes=tuple(_jsonable(open_eps[b]) for b in sorted(open_eps)), points=points)
    return out, decision.rows


def _jsonable(e: ep_mod.Episode) -> dict[str, Any]:
    return {"broker": e.broker, "opened": e.opened, "last_signal": e.last_signal, "reason": e.reason,
            "peak_share": e.peak_share, "peak_avoiding": e.peak_avoiding, "active_at_peak": e.active_at_peak,
            "sends": e.sends, "failures": e.failures, "p99": e.p99, "errors": dict(e.errors),
            "pending": [e.pending[0], e.pending[1], dict(e.pending[2])], "revision": e.revision,
            "last_heard": e.last_heard, "recovering": e.recovering}


def _episode(d: dict[str, Any]) -> ep_mod.Episode:
    from collections import Counter

    return ep_mod.Episode(
        int(d["broker"]), int(d["opened"]), int(d["last_signal"]), str(d["reason"]), float(d["peak_share"]),
        int(d["peak_avoiding"]), int(d["active_at_peak"]), int(d["sends"]), int(d["failures"]), float(d["p99"]),
        Counter(d["errors"]), [d["pending"][0], d["pending"][1], Counter(d["pending"][2])], int(d["revision"]),
        # a state saved before these two were kept: heard last at the last signal, no healthy stretch
        int(d.get("last_heard", d["last_signal"])), int(d.get("recovering", ep_mod.NEVER)),
    )


def to_json(states: dict[str, ClusterState]) -> dict[str, Any]:
    """Every cluster's decision state as JSON values (kept per micro-batch)."""
    return {name: {
        "brokers": list(s.brokers), "last_tick": s.last_tick, "ahead_tick": s.ahead_tick,
        "suspects": [list(x) for x in s.suspects], "episodes": list(s.episodes),
        "points": {b: list(pts.values()) for b, pts in s.points.items()}, "heads": s.heads,
    } for name, s in sorted(states.items())}


def dumps(states: dict[str, ClusterState]) -> str:
    return orjson.dumps(to_json(states), option=orjson.OPT_SORT_KEYS).decode()


def loads(text: str | bytes) -> dict[str, ClusterState]:
    return from_json(orjson.loads(text))


def from_json(doc: dict[str, Any]) -> dict[str, ClusterState]:
    out = {}
    for name, d in doc.items():
        out[name] = ClusterState(
            name, tuple(d["brokers"]), int(d["last_tick"]), int(d["ahead_tick"]),
            tuple((int(b), int(o), int(r), bool(a), str(w)) for b, o, r, a, w in d["suspects"]),
            tuple(d["episodes"]), {b: {int(r["tick"]): r for r in rows} for b, rows in d["points"].items()},
            {b: int(h) for b, h in d["heads"].items()},
        )
    return out
