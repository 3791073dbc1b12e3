"""Keeping the lag state bounded: idle expiry and compaction of the name dictionaries.

The state grows with the fleet, not with time: a queue keeps at most ``index_points`` index points
and ``window_commits`` commits per group, and whatever has not been seen for
``queue_idle_expiry_s`` (pairs, memberships, queues nobody references) is dropped. Names of groups,
topics and brokers that no table refers to any more are dropped too, once they are the majority,
by a monotone renumbering that keeps every table's sort order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.lag.registry import LagState, pair_key, qcode_of
from pipeline.lag.table import unique_ints

I64 = np.int64
MIN_COMPACT = 1024
# qkeys are sequence numbers packed into 32 bits of the pair keys: renumber well before they run out
MAX_QKEY = 2**31


def expire(state: LagState, cutoff_ms: int) -> tuple[LagState, np.ndarray, np.ndarray]:
    """Drop what was last seen before ``cutoff_ms``; returns (state, expired pairs' groups, kept mask)."""
    keep = state.pairs["seen_ms"] >= cutoff_ms
    expired = state.pairs["gcode"][~keep]
    rows = np.flatnonzero(keep)
    pairs, windows = state.pairs.take(rows), state.windows.take(rows)
    members = state.members.take(np.flatnonzero(state.members["ts_ms"] >= cutoff_ms))
    queues, index, brokers = state.queues, state.index, state.brokers
    alive = np.isin(queues["qkey"], pairs["qkey"]) | (queues["last_seen_ms"] >= cutoff_ms)
    if not alive.all():
        queues = queues.take(np.flatnonzero(alive))
        brokers = brokers.take(np.flatnonzero(alive))
        index = index.take(np.isin(index.qkey, queues["qkey"]))
    state = dataclasses.replace(
        state, pairs=pairs, windows=windows, members=members, queues=queues, index=index, brokers=brokers
    )
    return state, expired, keep


def _renumber(names: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(new names, old code -> new code) when most names are unused, else None."""
    if len(names) < MIN_COMPACT:  # (before the distinct codes: this runs at every grid point)
        return None
    used = unique_ints(used)
    if len(used) * 2 > len(names):
        return None
    remap = np.full(len(names), -1, dtype=I64)
    remap[used] = np.arange(len(used), dtype=I64)
    return names[used], remap


def compact_names(state: LagState) -> LagState:
    q, p, m, g = state.queues, state.pairs, state.members, state.groups
    groups = _renumber(state.group_names, np.concatenate([p["gcode"], m["gcode"], g["gcode"]]))
    topics = _renumber(state.topic_names, np.concatenate([q["tcode"], m["tcode"]]))
    brokers = _renumber(state.broker_names, q["bcode"])
    if groups is None and topics is None and brokers is None:
        return state
    gmap = groups[1] if groups else np.arange(len(state.group_names), dtype=I64)
    tmap = topics[1] if topics else np.arange(len(state.topic_names), dtype=I64)
    bmap = brokers[1] if brokers else np.arange(len(state.broker_names), dtype=I64)
    tcode, bcode = tmap[q["tcode"]], bmap[q["bcode"]]
    q = q.replace(tcode=tcode, bcode=bcode, qcode=qcode_of(tcode, bcode, q["queue_id"]))
    p = p.replace(gcode=gmap[p["gcode"]], pkey=pair_key(gmap[p["gcode"]], p["qkey"]))
    m = m.replace(
        gcode=gmap[m["gcode"]], tcode=tmap[m["tcode"]], mkey=pair_key(gmap[m["gcode"]], tmap[m["tcode"]])
    )
    g = g.replace(gcode=gmap[g["gcode"]])
    return dataclasses.replace(
        state,
        group_names=groups[0] if groups else state.group_names,
        topic_names=topics[0] if topics else state.topic_names,
        broker_names=brokers[0] if brokers else state.broker_names,
        queues=q,
        pairs=p,
        members=m,
        groups=g,
    )


def renumber_queues(state: LagState) -> LagState:
    """Give the live queues qkeys 0..n-1 again (order kept) once the sequence nears 2^31.

    Expired queues leave gaps and new ones always take the next number; a fleet that keeps churning
    queues would otherwise exhaust the 32 bits a qkey has inside a pair key, after years.
    """
    if state.next_qkey < MAX_QKEY:
        return state
    old = state.queues["qkey"]
    new = np.arange(len(old), dtype=I64)
    pairs = state.pairs.replace(qkey=new[np.searchsorted(old, state.pairs["qkey"])])
    pairs = pairs.replace(pkey=pair_key(pairs["gcode"], pairs["qkey"]))
    index = state.index
    index = type(index)(new[np.searchsorted(old, index.qkey)], index.offset, index.store_ms)
    return dataclasses.replace(
        state, queues=state.queues.replace(qkey=new), pairs=pairs, index=index, next_qkey=len(old)
    )
