"""The lag state's tables and how a batch of events updates them (everything but the verdicts).

The state of one cluster (shard) is a few column tables with integer keys:

- ``queues`` (by ``qkey``, a sequence number): topic/broker codes, queue id, kind (main, retry,
  dlq), best known max offset, last seen; ``qcode`` packs (topic, broker, queue id) for lookups;
- ``index``: the bounded (offset -> store time) points of each queue (:mod:`pipeline.lag.offsets`);
- ``brokers``: each queue's recent broker offsets, aligned row for row with ``queues``
  (:mod:`pipeline.lag.brokers`);
- ``pairs`` (by ``pkey`` = group code, qkey): last raw offset, reporter, owner, last status, and
  ``windows`` aligned row for row (:mod:`pipeline.lag.window`);
- ``members`` (by ``mkey`` = group code, topic code): the latest membership and its allocation;
- ``groups`` (by group code): the last status and whether the time-lag alert is raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.lag.brokers import BrokerSamples
from pipeline.lag.events import MEMBERSHIP, PROGRESS, SEND
from pipeline.lag.model import NO_OFFSET, UNKNOWN, topic_kinds
from pipeline.lag.offsets import OffsetIndex, add_points
from pipeline.lag.ownership import membership_owners
from pipeline.lag.table import Table, encode, last_of_each, lookup, unique_ints
from pipeline.lag.window import Windows
from pipeline.rocketmq import MessageQueue

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

I64 = np.int64
QUEUES = {
    "qkey": "int64",
    "qcode": "int64",
    "tcode": "int64",
    "bcode": "int64",
    "queue_id": "int64",
    "kind": "int8",
    "max_offset": "int64",
    "last_seen_ms": "int64",
}
PAIRS = {
    "pkey": "int64",
    "gcode": "int64",
    "qkey": "int64",
    "first_seen_ms": "int64",
    "seen_ms": "int64",
    "last_commit_ms": "int64",
    "raw_offset": "int64",
    "reported_by": "object",
    "owner": "object",
    "mismatch": "bool",
    "status": "int8",
    "last_row_ms": "int64",
}
MEMBERS = {
    "mkey": "int64",
    "gcode": "int64",
    "tcode": "int64",
    "client_ids": "object",
    "strategy": "object",
    "ts_ms": "int64",
    "changed_ms": "int64",
    "idle": "object",
    "error": "object",
}
GROUPS = {"gcode": "int64", "status": "int8", "time_alert": "bool", "ts_ms": "int64"}


def _names() -> np.ndarray:
    return np.empty(0, dtype=object)


def qcode_of(tcode: np.ndarray, bcode: np.ndarray, queue_id: np.ndarray) -> np.ndarray:
    """(topic, broker, queue id) in one int64: queue ids are < 2^16 by contract."""
    return (tcode.astype(I64) << 40) | (bcode.astype(I64) << 16) | queue_id.astype(I64)


def pair_key(gcode: np.ndarray, low: np.ndarray) -> np.ndarray:
    return (gcode.astype(I64) << 32) | low.astype(I64)


@dataclass(frozen=True)
class LagState:
    """One cluster's (shard's) lag state. Tables are never modified in place, only replaced."""

    cluster: str = ""
    clock_ms: int = 0
    next_qkey: int = 0
    group_names: np.ndarray = field(default_factory=_names)
    topic_names: np.ndarray = field(default_factory=_names)
    broker_names: np.ndarray = field(default_factory=_names)
    queues: Table = field(default_factory=lambda: Table.empty(QUEUES))
    index: OffsetIndex = field(default_factory=OffsetIndex.empty)
    brokers: BrokerSamples = field(default_factory=lambda: BrokerSamples.empty(0, 10))
    pairs: Table = field(default_factory=lambda: Table.empty(PAIRS))
    windows: Windows = field(default_factory=lambda: Windows.empty(0, 10))
    members: Table = field(default_factory=lambda: Table.empty(MEMBERS))
    groups: Table = field(default_factory=lambda: Table.empty(GROUPS))

    def queue_rows(self, qkeys: np.ndarray) -> np.ndarray:
        """Row of each (known) qkey in ``queues``, which is sorted by qkey."""
        return np.searchsorted(self.queues["qkey"], qkeys)

    def pair_tcodes(self) -> np.ndarray:
        return self.queues["tcode"][self.queue_rows(self.pairs["qkey"])]


@dataclass(frozen=True)
class Codes:
    """The batch's events as integer codes (-1 where the event kind has no such field)."""

    gcode: np.ndarray
    tcode: np.ndarray
    qkey: np.ndarray
    new_qkeys: np.ndarray


def encode_events(state: LagState, ev: pd.DataFrame) -> tuple[LagState, Codes]:
    """Codes for groups, topics and queues of the batch; new queues get the next qkeys."""
    kind = ev["kind"].to_numpy()
    n = len(kind)
    gcode = np.full(n, UNKNOWN, dtype=I64)
    has_group = kind != SEND
    gcode[has_group], groups = encode(state.group_names, ev["consumer_group"].to_numpy()[has_group])
    tcode, topics = encode(state.topic_names, ev["topic"].to_numpy())
    has_queue = kind != MEMBERSHIP
    bcode = np.full(n, UNKNOWN, dtype=I64)
    bcode[has_queue], brokers = encode(state.broker_names, ev["broker_name"].to_numpy()[has_queue])
    qcode = qcode_of(tcode[has_queue], bcode[has_queue], ev["queue_id"].to_numpy()[has_queue])
    queues, next_qkey, new_qkeys = _register(state.queues, state.next_qkey, qcode, topics)
    order = np.argsort(queues["qcode"], kind="stable")
    pos, _ = lookup(queues["qcode"][order], qcode)
    qkey = np.full(n, UNKNOWN, dtype=I64)
    qkey[has_queue] = queues["qkey"][order[pos]] if len(pos) else np.empty(0, dtype=I64)
    state = LagState(
        cluster=state.cluster,
        clock_ms=state.clock_ms,
        next_qkey=next_qkey,
        group_names=groups,
        topic_names=topics,
        broker_names=brokers,
        queues=queues,
        index=state.index,
        brokers=state.brokers.grown(len(queues) - len(state.queues)),
        pairs=state.pairs,
        windows=state.windows,
        members=state.members,
        groups=state.groups,
    )
    return state, Codes(gcode, tcode, qkey, new_qkeys)


def _register(
    queues: Table, next_qkey: int, qcode: np.ndarray, topics: np.ndarray
) -> tuple[Table, int, np.ndarray]:
    _, found = lookup(np.sort(queues["qcode"]), qcode)
    fresh = unique_ints(qcode[~found])
    if len(fresh) == 0:
        return queues, next_qkey, np.empty(0, dtype=I64)
    qkeys = np.arange(next_qkey, next_qkey + len(fresh), dtype=I64)
    tcode = fresh >> 40
    queues = queues.append(
        {
            "qkey": qkeys,
            "qcode": fresh,
            "tcode": tcode,
            "bcode": (fresh >> 16) & 0xFFFFFF,
            "queue_id": fresh & 0xFFFF,
            "kind": topic_kinds(topics[tcode]),
            "max_offset": np.full(len(fresh), UNKNOWN, dtype=I64),
            "last_seen_ms": np.full(len(fresh), UNKNOWN, dtype=I64),
        }
    )
    return queues, next_qkey + len(fresh), qkeys


def update_offsets(
    queues: Table, ev: pd.DataFrame, qkey: np.ndarray
) -> tuple[Table, np.ndarray, dict[str, np.ndarray]]:
    """New max offsets and last-seen times; returns (queues, changed qkeys, max-offset observations)."""
    kind = ev["kind"].to_numpy()
    ts = ev["ts_ms"].to_numpy()
    qoff = ev["queue_offset"].to_numpy()
    boff = ev["broker_offset"].to_numpy()
    sent = (kind == SEND) & (qoff >= 0)
    polled = (kind == PROGRESS) & (boff >= 0)
    obs = {
        "q": np.concatenate([qkey[sent], qkey[polled]]),
        "t": np.concatenate([ts[sent], ts[polled]]),
        "v": np.concatenate([qoff[sent] + 1, boff[polled]]),
    }
    has_queue = qkey != UNKNOWN
    seen = queues["last_seen_ms"].copy()
    np.maximum.at(seen, np.searchsorted(queues["qkey"], qkey[has_queue]), ts[has_queue])
    old = queues["max_offset"]
    new = old.copy()
    np.maximum.at(new, np.searchsorted(queues["qkey"], obs["q"]), obs["v"])
    return queues.replace(max_offset=new, last_seen_ms=seen), queues["qkey"][new != old], obs


def update_index(index: OffsetIndex, ev: pd.DataFrame, qkey: np.ndarray, max_points: int) -> OffsetIndex:
    """Send results (queue_offset at ts) and progress (consumer_offset - 1 at last_timestamp)."""
    kind = ev["kind"].to_numpy()
    qo = ev["queue_offset"].to_numpy()
    co = ev["consumer_offset"].to_numpy()
    lt = ev["last_timestamp_ms"].to_numpy()
    sent = (kind == SEND) & (qo >= 0)
    consumed = (kind == PROGRESS) & (co >= 1) & (lt > 0)
    return add_points(
        index,
        np.concatenate([qkey[sent], qkey[consumed]]),
        np.concatenate([qo[sent], co[consumed] - 1]),
        np.concatenate([ev["ts_ms"].to_numpy()[sent], lt[consumed]]),
        max_points,
    )


def update_members(members: Table, ev: pd.DataFrame, codes: Codes) -> tuple[Table, np.ndarray, np.ndarray]:
    """Latest membership per (group, topic). Returns (members, reported mkeys, changed mkeys)."""
    sel = np.flatnonzero(ev["kind"].to_numpy() == MEMBERSHIP)
    if len(sel) == 0:
        return members, np.empty(0, dtype=I64), np.empty(0, dtype=I64)
    mkey = pair_key(codes.gcode[sel], codes.tcode[sel])
    _, last = last_of_each(mkey)  # the last report per (group, topic)
    sel, mkey = sel[last], mkey[last]
    ts = ev["ts_ms"].to_numpy()[sel]
    cids = np.empty(len(sel), dtype=object)
    # Spark hands list columns over as numpy arrays, tests as tuples; None = no members
    cids[:] = [tuple(sorted(set(() if c is None else c))) for c in ev["client_ids"].to_numpy()[sel]]
    strategy = ev["strategy"].to_numpy()[sel]
    pos, found = lookup(members["mkey"], mkey)
    p = np.minimum(pos, max(len(members) - 1, 0))
    newer = ~found | (ts >= np.where(found, members["ts_ms"][p] if len(members) else 0, 0))
    same = found & np.array(
        [
            found[i] and members["client_ids"][p[i]] == cids[i] and members["strategy"][p[i]] == strategy[i]
            for i in range(len(sel))
        ],
        dtype=bool,
    )
    keep = newer
    rows = {
        "mkey": mkey[keep],
        "gcode": codes.gcode[sel][keep],
        "tcode": codes.tcode[sel][keep],
        "client_ids": cids[keep],
        "strategy": strategy[keep],
        "ts_ms": ts[keep],
        "changed_ms": np.where(same, members["changed_ms"][p] if len(members) else 0, ts)[keep],
        "idle": np.where(same, members["idle"][p] if len(members) else None, None)[keep],
        "error": np.where(same, members["error"][p] if len(members) else None, None)[keep],
    }
    others = members.take(np.flatnonzero(~np.isin(members["mkey"], rows["mkey"])))
    merged = others.append(rows)
    merged = merged.take(np.argsort(merged["mkey"], kind="stable"))
    return merged, mkey, mkey[keep & ~same]


def ensure_pairs(
    pairs: Table, windows: Windows, gcode: np.ndarray, qkey: np.ndarray, now_ms: int
) -> tuple[Table, Windows, np.ndarray]:
    """Add missing (group, queue) pairs, keep pairs sorted. Returns (pairs, windows, new-pair mask)."""
    want = unique_ints(pair_key(gcode, qkey))
    _, found = lookup(pairs["pkey"], want)
    fresh = want[~found]
    if len(fresh) == 0:
        return pairs, windows, np.zeros(len(pairs), dtype=bool)
    n = len(fresh)
    none = np.empty(n, dtype=object)
    merged = pairs.append(
        {
            "pkey": fresh,
            "gcode": fresh >> 32,
            "qkey": fresh & 0xFFFFFFFF,
            "first_seen_ms": np.full(n, now_ms, dtype=I64),
            "seen_ms": np.full(n, now_ms, dtype=I64),
            "last_commit_ms": np.full(n, UNKNOWN, dtype=I64),
            "raw_offset": np.full(n, NO_OFFSET, dtype=I64),
            "reported_by": none,
            "owner": none.copy(),
            "mismatch": np.zeros(n, dtype=bool),
            "status": np.full(n, -1, dtype=np.int8),
            "last_row_ms": np.full(n, UNKNOWN, dtype=I64),
        }
    )
    order = np.argsort(merged["pkey"], kind="stable")
    is_new = np.r_[np.zeros(len(pairs), dtype=bool), np.ones(n, dtype=bool)][order]
    all_windows = Windows.concat([windows, Windows.empty(n, windows.size)])
    return merged.take(order), all_windows.take(order), is_new


def membership_pairs(state: LagState, mkeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gcode, qkey) of every known queue of each (group, topic) in ``mkeys``."""
    g, q = [np.empty(0, dtype=I64)], [np.empty(0, dtype=I64)]
    tcodes = state.queues["tcode"]
    for mkey in mkeys:
        qk = state.queues["qkey"][tcodes == (mkey & 0xFFFFFFFF)]
        g.append(np.full(len(qk), mkey >> 32, dtype=I64))
        q.append(qk)
    return np.concatenate(g), np.concatenate(q)


def assign_owners(state: LagState, dirty: np.ndarray) -> tuple[Table, Table]:
    """Recompute owners of the (group, topic)s in ``dirty`` with RocketMQ's allocation."""
    members, pairs = state.members, state.pairs
    if len(dirty) == 0:
        return members, pairs
    owner = pairs["owner"].copy()
    idle, error = members["idle"].copy(), members["error"].copy()
    tcodes = state.pair_tcodes()
    for mkey in unique_ints(dirty):
        m, found = lookup(members["mkey"], np.array([mkey]))
        if not found[0]:
            continue
        g, t = int(mkey >> 32), int(mkey & 0xFFFFFFFF)
        lo, hi = np.searchsorted(pairs["pkey"], [g << 32, (g + 1) << 32])
        mine = lo + np.flatnonzero(tcodes[lo:hi] == t)
        rows = state.queue_rows(pairs["qkey"][mine])
        topic = str(state.topic_names[t])
        mqs = [
            MessageQueue(topic, str(b), int(q))
            for b, q in zip(state.broker_names[state.queues["bcode"][rows]], state.queues["queue_id"][rows])
        ]
        result = membership_owners(
            members["strategy"][m[0]], str(state.group_names[g]), mqs, list(members["client_ids"][m[0]])
        )
        owner[mine] = [result.owners.get(mq) for mq in mqs]
        idle[m[0]], error[m[0]] = result.idle, result.error
    return members.replace(idle=idle, error=error), pairs.replace(owner=owner)
