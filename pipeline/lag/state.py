"""The lag state transition: ``step(state, events, now_ms, cfg) -> (state, outputs)``.

One state holds one cluster (or one shard of it, see ``LagConfig.shards``): its queues, offset
index, (group, queue) pairs with their Burrow windows, memberships and group statuses. A whole
cluster in one state is what lets one pass compute what no smaller key can: a topic's queues across
all brokers (allocation), a group's topics together with its ``%RETRY%`` and ``%DLQ%`` topics
(group status), and send results shared by every group that consumes the topic.

Time is ``now_ms`` (from the caller: the watermark, the batch's event time) and the events'
timestamps; the clock never goes backwards. Nothing here reads a wall clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import orjson
import pandas as pd

from pipeline.config import LagConfig
from pipeline.lag.brokers import BrokerSamples
from pipeline.lag.events import PROGRESS, normalize_events
from pipeline.lag.groups import group_rows
from pipeline.lag.model import UNKNOWN
from pipeline.lag.offsets import max_offsets_at
from pipeline.lag.ownership import owner_mismatch
from pipeline.lag.registry import (
    Codes,
    LagState,
    assign_owners,
    encode_events,
    ensure_pairs,
    membership_pairs,
    pair_key,
    update_index,
    update_members,
    update_offsets,
)
from pipeline.lag.report import evaluate_pairs, group_policies, queue_rows, start_timestamps
from pipeline.lag.retention import compact_names, expire, renumber_queues
from pipeline.lag.startpos import effective_offsets
from pipeline.lag.table import Table, first_of_each, last_of_each, lookup, unique_ints
from pipeline.lag.window import Windows
from schemas.tables import QUARANTINE

I64 = np.int64
MS_PER_S = 1000
_NO_QUARANTINE = pd.DataFrame(columns=QUARANTINE.columns)


@dataclass(frozen=True)
class LagOutput:
    """Rows for ``queue_lag``, ``group_status`` and ``quarantine`` (columns exactly as the tables)."""

    queue_lag: pd.DataFrame
    group_status: pd.DataFrame
    quarantine: pd.DataFrame


def initial_state(cluster: str, cfg: LagConfig) -> LagState:
    return LagState(
        cluster=cluster,
        windows=Windows.empty(0, cfg.window_commits),
        brokers=BrokerSamples.empty(0, cfg.window_commits),
    )


def is_empty(state: LagState) -> bool:
    return len(state.queues) == 0 and len(state.pairs) == 0 and len(state.members) == 0


def step(
    state: LagState, events: pd.DataFrame, now_ms: int, cfg: LagConfig, watermark_ms: int = 0
) -> tuple[LagState, LagOutput]:
    """Apply one batch of events (any order) and judge every queue and group at the new clock.

    Events at or before ``watermark_ms`` (Spark's event-time watermark, 0 = none yet) are late:
    they go to quarantine with reason ``late`` rather than being applied or silently dropped.
    """
    return step_normalized(state, normalize_events(events), now_ms, cfg, watermark_ms)


def step_normalized(
    state: LagState, ev: pd.DataFrame, now_ms: int, cfg: LagConfig, watermark_ms: int = 0
) -> tuple[LagState, LagOutput]:
    """:func:`step` over events that went through :func:`normalize_events` already (a caller that
    applies many slices of one frame by event time normalises it once: each slice stays normalised)."""
    state = _adopt_cluster(state, ev)
    ev, late = _reject_late(ev, watermark_ms)
    ev, future = _reject_future(ev, state.clock_ms, now_ms, cfg.max_future_skew_ms)
    rejected = pd.concat([late, future], ignore_index=True) if len(late) and len(future) else (late if len(late) else future)
    clock = max(state.clock_ms, now_ms, int(ev["ts_ms"].max()) if len(ev) else 0)
    previous_groups = state.groups
    state, batch = _ingest(state, ev, clock, cfg)
    state, queue_lag, group_status = _report(state, batch, previous_groups, clock, cfg)
    return state, LagOutput(queue_lag, group_status, _quarantine_rows(rejected))


@dataclass(frozen=True)
class _Batch:
    """What a batch changed, for deciding which rows to emit."""

    is_new: np.ndarray  # per pair
    committed: np.ndarray  # per pair
    changed_max: np.ndarray  # qkeys whose max offset grew
    reported: np.ndarray  # (group, topic) keys with a membership report
    expired: np.ndarray  # group codes of expired pairs


def _ingest(state: LagState, ev: pd.DataFrame, clock: int, cfg: LagConfig) -> tuple[LagState, _Batch]:
    """Queues, offsets, index, memberships, owners, pairs and windows after the batch's events."""
    old_max = state.queues["max_offset"]
    state, codes = encode_events(state, ev)
    queues, changed_max, obs = update_offsets(state.queues, ev, codes.qkey)
    index = update_index(state.index, ev, codes.qkey, cfg.index_points)
    brokers = state.brokers.resized(cfg.window_commits).record(
        state.queue_rows(obs["q"]), obs["t"], obs["v"], cfg.broker_offset_refresh_ms
    )
    members, reported, changed = update_members(state.members, ev, codes)
    state = dataclasses.replace(
        state,
        queues=queues,
        index=index,
        brokers=brokers,
        members=members,
        windows=state.windows.resized(cfg.window_commits),
    )
    dirty = _dirty_members(state, changed, codes.new_qkeys)
    members = _mark_rebalanced(state.members, dirty, changed, clock)

    progress = (ev["kind"] == PROGRESS).to_numpy()
    mg, mq = membership_pairs(state, dirty)
    pairs, windows, is_new = ensure_pairs(
        state.pairs,
        state.windows,
        np.concatenate([codes.gcode[progress], mg]),
        np.concatenate([codes.qkey[progress], mq]),
        clock,
    )
    state = dataclasses.replace(state, pairs=pairs, windows=windows, members=members)
    state = dataclasses.replace(state, pairs=_refresh_seen(state, reported, clock))
    members, pairs = assign_owners(state, dirty)
    state = dataclasses.replace(state, members=members, pairs=pairs)

    state, committed = _apply_commits(state, ev[progress], codes, progress, old_max, obs, cfg)
    state, expired, keep = expire(state, clock - int(cfg.queue_idle_expiry_s * MS_PER_S))
    return state, _Batch(is_new[keep], committed[keep], changed_max, reported, expired)


def _report(
    state: LagState, batch: _Batch, previous_groups: Table, clock: int, cfg: LagConfig
) -> tuple[LagState, pd.DataFrame, pd.DataFrame]:
    """Judge every pair at the clock; rows for the pairs and groups the batch touched."""
    view = evaluate_pairs(state, clock, cfg)
    emit = row_due(state.pairs, batch.committed, batch.is_new, view.status, clock, cfg)
    pairs = state.pairs.replace(
        status=view.status, last_row_ms=np.where(emit, clock, state.pairs["last_row_ms"])
    )
    state = dataclasses.replace(state, pairs=pairs, clock_ms=clock)
    moved = emit | batch.committed | np.isin(pairs["qkey"], batch.changed_max)
    touched = np.concatenate([pairs["gcode"][moved], batch.reported >> 32, batch.expired])
    queue_lag = queue_rows(state, view, np.flatnonzero(emit), clock)
    group_status, groups = group_rows(state, view, previous_groups, touched, clock, cfg)
    state = renumber_queues(compact_names(dataclasses.replace(state, groups=groups)))
    return state, queue_lag, group_status


def row_due(
    pairs: Table, committed: np.ndarray, is_new: np.ndarray, status: np.ndarray, clock: int, cfg: LagConfig
) -> np.ndarray:
    """Which pairs get a ``queue_lag`` row: new ones, status changes, and commits once per interval."""
    interval_ms = int(cfg.queue_row_interval_s * MS_PER_S)
    sampled = committed & (clock - pairs["last_row_ms"] >= interval_ms)
    return is_new | (status != pairs["status"]) | sampled


def _adopt_cluster(state: LagState, ev: pd.DataFrame) -> LagState:
    clusters = ev["cluster"].unique()
    if len(clusters) > 1 or (len(clusters) == 1 and state.cluster and clusters[0] != state.cluster):
        raise ValueError(
            f"lag state of cluster {state.cluster!r} got events of clusters {sorted(map(str, clusters))}"
        )
    if not state.cluster and len(clusters):
        return dataclasses.replace(state, cluster=str(clusters[0]))
    return state


def late_rows(events: pd.DataFrame, watermark_ms: int) -> pd.DataFrame:
    """Quarantine rows (reason ``late``) for events at or before ``watermark_ms``; a caller that
    buffers events itself (:class:`pipeline.lag.concern.GridLag`) screens them with this."""
    return _quarantine_rows(_reject_late(normalize_events(events), watermark_ms)[1])


def _reject_late(ev: pd.DataFrame, watermark_ms: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events at or before the watermark: too late to apply (the same rule as the fault step)."""
    if watermark_ms <= 0 or ev.empty:
        return ev, ev.iloc[0:0]
    late = ev["ts_ms"].to_numpy() <= watermark_ms
    if not late.any():
        return ev, ev.iloc[0:0]
    rejected = ev[late].reset_index(drop=True)
    rejected["_reason"] = "late"
    rejected["_detail"] = [f"ts_ms {t} is at or before the watermark {watermark_ms}" for t in rejected["ts_ms"]]
    return ev[~late].reset_index(drop=True), rejected


def _reject_future(
    ev: pd.DataFrame, clock_ms: int, now_ms: int, skew_ms: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events too far ahead of the clock would drag it forward and make every consumer look stopped."""
    ts = ev["ts_ms"].to_numpy()
    ref = max(clock_ms, now_ms)
    if ref <= 0 and len(ts):
        ref = int(np.median(ts))
    future = ts > ref + skew_ms
    if not future.any():
        return ev, ev.iloc[0:0]
    rejected = ev[future].reset_index(drop=True)
    rejected["_reason"] = "future_ts"
    rejected["_detail"] = [f"ts_ms {t} is more than lag.max_future_skew_ms ahead of the lag clock" for t in rejected["ts_ms"]]
    return ev[~future].reset_index(drop=True), rejected


def _dirty_members(state: LagState, changed: np.ndarray, new_qkeys: np.ndarray) -> np.ndarray:
    """(group, topic) keys whose owners must be recomputed: new membership, or new queues in the topic."""
    new_topics = unique_ints(state.queues["tcode"][state.queue_rows(new_qkeys)])
    grown = np.isin(state.members["tcode"], new_topics)
    return unique_ints(np.concatenate([changed, state.members["mkey"][grown]]))


def _mark_rebalanced(members: Table, dirty: np.ndarray, changed: np.ndarray, clock: int) -> Table:
    """New queues make clients rebalance (within their next 20 s round), like a membership change."""
    grown = np.isin(members["mkey"], dirty) & ~np.isin(members["mkey"], changed)
    return members.replace(
        changed_ms=np.where(grown, np.maximum(members["changed_ms"], clock), members["changed_ms"])
    )


def _refresh_seen(state: LagState, reported: np.ndarray, clock: int) -> Table:
    """A membership report keeps all the group's queues of that topic alive."""
    pairs = state.pairs
    if len(reported) == 0 or len(pairs) == 0:
        return pairs
    hit = np.isin(pair_key(pairs["gcode"], state.pair_tcodes()), reported)
    return pairs.replace(seen_ms=np.where(hit, np.maximum(pairs["seen_ms"], clock), pairs["seen_ms"]))


def _apply_commits(
    state: LagState,
    ev: pd.DataFrame,
    codes: Codes,
    progress: np.ndarray,
    old_max: np.ndarray,
    obs: dict[str, np.ndarray],
    cfg: LagConfig,
) -> tuple[LagState, np.ndarray]:
    """Each progress event is a commit, measured against the max offset known at its time."""
    pairs = state.pairs
    committed = np.zeros(len(pairs), dtype=bool)
    if ev.empty:
        return state, committed
    gcode, qkey = codes.gcode[progress], codes.qkey[progress]
    pos, _ = lookup(pairs["pkey"], pair_key(gcode, qkey))
    ts = ev["ts_ms"].to_numpy()
    raw = ev["consumer_offset"].to_numpy()
    # The queues table only grew this batch: rows below the old length are the old rows.
    rows = state.queue_rows(qkey)
    prev_max = np.full(len(qkey), UNKNOWN, dtype=I64)
    known_before = rows < len(old_max)
    prev_max[known_before] = old_max[rows[known_before]]
    base_q, first = first_of_each(qkey)
    max_at = max_offsets_at(
        np.concatenate([base_q, obs["q"]]),
        np.concatenate([np.full(len(base_q), np.iinfo(I64).min), obs["t"]]),
        np.concatenate([prev_max[first], obs["v"]]),
        qkey,
        ts,
    )
    policy, stamp = group_policies(state.group_names, gcode, cfg)
    kind = state.queues["kind"][state.queue_rows(qkey)]
    start_ts = start_timestamps(stamp, pairs["first_seen_ms"][pos])
    offset = effective_offsets(raw, kind, policy, start_ts, max_at, state.index, qkey)
    lag = np.where((offset >= 0) & (max_at != UNKNOWN), np.maximum(max_at - offset, 0), UNKNOWN)
    usable = offset != UNKNOWN
    windows, _ = state.windows.append(pos[usable], ts[usable], offset[usable], lag[usable])

    _, last = last_of_each(pos)  # the latest event per pair (events are sorted by time)
    last = last[ts[last] >= pairs["last_commit_ms"][pos[last]]]
    p = pos[last]
    committed[p] = True
    clients = ev["client_id"].to_numpy()[last]
    reported_by = pairs["reported_by"].copy()
    reported_by[p] = np.where(pd.isna(clients), reported_by[p], clients)
    mismatch = pairs["mismatch"].copy()
    mismatch[p] = owner_mismatch(
        clients, pairs["owner"][p], ts[last], _changed_ms(state, p), cfg.rebalance_grace_ms
    )
    cols = {name: pairs[name].copy() for name in ("raw_offset", "last_commit_ms", "seen_ms")}
    cols["raw_offset"][p], cols["last_commit_ms"][p] = raw[last], ts[last]
    cols["seen_ms"][p] = np.maximum(cols["seen_ms"][p], ts[last])
    pairs = pairs.replace(reported_by=reported_by, mismatch=mismatch, **cols)
    return dataclasses.replace(state, pairs=pairs, windows=windows), committed


def _changed_ms(state: LagState, pair_rows: np.ndarray) -> np.ndarray:
    pairs, members = state.pairs, state.members
    tcode = state.queues["tcode"][state.queue_rows(pairs["qkey"][pair_rows])]
    pos, found = lookup(members["mkey"], pair_key(pairs["gcode"][pair_rows], tcode))
    out = np.full(len(pair_rows), UNKNOWN, dtype=I64)
    out[found] = members["changed_ms"][pos[found]]
    return out


def _quarantine_rows(rejected: pd.DataFrame) -> pd.DataFrame:
    if rejected.empty:
        return _NO_QUARANTINE.copy()
    fields = [
        "kind",
        "ts_ms",
        "cluster",
        "consumer_group",
        "topic",
        "broker_name",
        "queue_id",
        "consumer_offset",
    ]
    raw = [
        orjson.dumps({k: (v.item() if hasattr(v, "item") else v) for k, v in zip(fields, row)})
        for row in rejected[fields].itertuples(index=False)
    ]
    return pd.DataFrame(
        {
            "source_topic": rejected["src_topic"].to_numpy(),
            "source_partition": rejected["src_partition"].to_numpy().astype(np.int32),
            "source_offset": rejected["src_offset"].to_numpy(),
            "kafka_ts_ms": rejected["src_ts_ms"].to_numpy(),
            "raw_key": None,
            "raw_value": raw,
            "event_kind": rejected["kind"].to_numpy(),
            "reason": rejected["_reason"].to_numpy(),
            "detail": rejected["_detail"].to_numpy(),
            "stage": "lag",
        }
    )[QUARANTINE.columns]
