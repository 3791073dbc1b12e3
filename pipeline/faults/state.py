"""The fault state of one cluster and its pure transition ``step(state, events, watermark_ms, cfg)``.

One step is one micro-batch of one cluster. Time is the watermark passed in (Spark's event-time
watermark: every event at or before it is late); nothing here reads a clock, so a batch replayed
after a crash produces the same rows. Order of work:

1. quarantine what the rules cannot use (:mod:`pipeline.faults.intake`): an unparseable
   ``client_version``, a late event (``ts_ms <= watermark``), an event stamped further ahead of the
   batch time than ``max_future_skew_s``, the events of a producer beyond ``max_producers_per_broker``;
2. fold updates the watermark has passed into each pair's ``base``, apply the batch to ``head``
   (rewinding a pair that got an out-of-order update) and write window rows;
3. close windows whose end the watermark has passed; write the health of final minutes; evaluate
   the episode grid up to the watermark;
4. forget what nothing needs any more: idle pairs (``producer_idle_expiry_s`` after their last send
   or window end), updates older than every pending minute, tick and rewind, final windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.config import FaultsConfig
from pipeline.faults import decide, health, intake, pairs, windows
from pipeline.faults import episodes as ep_mod
from pipeline.faults import events as ev
from pipeline.faults.decide import Suspect
from pipeline.faults.frame import Cols, concat, empty, nrows, take
from pipeline.faults.points import forecasts
from schemas.events import SEND_STATUSES

NONE = -1


@dataclass(frozen=True)
class FaultState:
    """Everything one cluster's fault tracking remembers between micro-batches."""

    cluster: str
    watermark_ms: int = 0
    next_serial: int = 0
    next_pair: int = 0
    next_minute: int = NONE  # first minute whose health row is not written yet
    last_tick: int = NONE  # last episode grid point evaluated
    brokers: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    pairs: Cols = field(default_factory=lambda: empty(pairs.PAIR_SCHEMA))
    log: Cols = field(default_factory=lambda: empty(pairs.LOG_SCHEMA))
    windows: Cols = field(default_factory=lambda: empty(windows.WINDOW_SCHEMA))
    episodes: Cols = field(default_factory=lambda: empty(ep_mod.EPISODE_SCHEMA))
    suspects: tuple[Suspect, ...] = ()  # episodes suspected ahead of the watermark, until it decides them
    ahead_tick: int = NONE  # the last grid point the look-ahead evaluated


@dataclass(frozen=True)
class FaultOutputs:
    windows: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    health: list[dict[str, Any]]
    quarantine: list[dict[str, Any]]
    wakeup_ms: int | None  # the watermark at which the state wants a step without events
    stats: dict[str, int]
    points: pa.Table | None = None  # per-broker grid points (points mode; points.POINT_SCHEMA)


def initial_state(cluster: str) -> FaultState:
    return FaultState(cluster)


def is_empty(state: FaultState) -> bool:
    return not (nrows(state.pairs) or nrows(state.log) or nrows(state.windows) or nrows(state.episodes)
                or state.suspects)


def stats_of(state: FaultState) -> dict[str, int]:
    return {
        "pairs": nrows(state.pairs),
        "log_rows": nrows(state.log),
        "windows": nrows(state.windows),
        "open_episodes": nrows(state.episodes),
    }


def _locate(table: Cols, pair_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row positions of ``pair_ids`` in the pair table, and which of them are there."""
    if not nrows(table):
        return np.zeros(len(pair_ids), dtype=np.int64), np.zeros(len(pair_ids), dtype=bool)
    pos = np.minimum(pairs.pair_rows(table, pair_ids), nrows(table) - 1)
    return pos, table["pair"][pos] == pair_ids


class _Facts:
    """Per-serial facts for window rows, looked up in the (serial-ordered) log."""

    def __init__(self, log: Cols) -> None:
        self.log = log

    def __call__(self, serials: np.ndarray) -> dict[str, np.ndarray]:
        log = self.log
        pos = np.searchsorted(log["serial"], serials)
        pos = np.minimum(pos, max(nrows(log) - 1, 0))
        found = (log["serial"][pos] == serials) if nrows(log) else np.zeros(len(serials), dtype=bool)
        out = {name: log[name][pos] for name in ("ts", "event_id", "status", "error", "version", "gen",
                                                   "enable", "broker")} if nrows(log) else {}
        out["serial"] = serials
        if not found.all():  # not expected: the log keeps every update a window can point to
            raise LookupError(f"updates {serials[~found].tolist()} are no longer in the fault log")
        return out


def step(
    state: FaultState,
    events: Cols | ev.Events,
    watermark_ms: int,
    cfg: FaultsConfig,
    now_ms: int | None = None,
    advance_to_ms: int | None = None,
    points: bool = False,
) -> tuple[FaultState, FaultOutputs]:
    """One micro-batch of one cluster: the new state and the rows to append (see module doc).

    ``watermark_ms`` decides what is late in this batch. ``advance_to_ms`` (>= it), when given, is the
    watermark the next batch will use (it already counts this batch's events): windows, minutes and
    grid points up to it are settled now instead of one batch later. It becomes the state's
    watermark, so the next step cannot accept anything at or before it.

    With ``points`` (a state that holds some of the cluster's brokers: one shard of them), episodes
    are not decided here: the step writes the grid points (:mod:`pipeline.faults.points`) of each
    broker that got events in this batch, for :mod:`pipeline.faults.cluster` to decide on.
    """
    if not isinstance(events, ev.Events):
        events = ev.Events(events)
    wm = max(int(watermark_ms), state.watermark_ms)
    settle = max(wm, int(advance_to_ms)) if advance_to_ms is not None else wm
    ok, gen, quarantine = intake.screen(state, events, wm, cfg, now_ms)
    table, brokers, ids, broker_codes, next_pair = intake.register(state, events, ok, cfg)
    refused = ids == NONE
    if refused.any():
        over = ok[refused]
        over = over[~intake.removals(events, over)]  # a removal without its pair has nothing to end
        quarantine += intake.quarantine(events, over, "state_limit",
                                  f"more than faults.max_producers_per_broker={cfg.max_producers_per_broker} "
                                  "producers on this broker")
        ok, gen, ids, broker_codes = ok[~refused], gen[~refused], ids[~refused], broker_codes[~refused]
    new, versions, errors = intake.new_log(state, events, ok, gen, ids, broker_codes, cfg)
    table = {name: values.copy() for name, values in table.items()}
    log = {**state.log, "folded": state.log["folded"].copy()}  # the one column fold writes to
    pairs.fold(table, log, state.windows, brokers, wm)
    updates = pairs.apply_new(table, log, new, brokers, wm)
    if nrows(new):
        rows = pairs.pair_rows(table, new["pair"])
        table["version"][rows], table["gen"][rows], table["enable"][rows] = new["version"], new["gen"], new["enable"]
    log = concat(log, new) if nrows(new) else log
    revision = dict(zip(table["pair"].tolist(), table["revision"].tolist()))
    meta = windows.Meta(
        state.cluster, brokers, versions, SEND_STATUSES, ev.GEN_NAMES,
        dict(zip(table["pair"].tolist(), table["producer_group"].tolist())),
        dict(zip(table["pair"].tolist(), table["client_id"].tolist())),
        revision, _Facts(log),
    )
    changes = windows.WindowChanges()
    # windows the watermark has passed close before this batch's updates (all later than it) apply:
    # a state stepped late (no events for a while) writes its rows in event-time order too
    wins = windows.finalize(state.windows, wm, meta, changes)
    wins = windows.apply_updates(wins, updates, wm, meta, changes)
    wins = windows.finalize(wins, settle, meta, changes)
    table["revision"] = np.asarray([revision[p] for p in table["pair"].tolist()], dtype=np.int64)
    if nrows(wins):
        pos, known = _locate(table, wins["pair"])
        last_end = np.full(nrows(table), NONE, dtype=np.int64)
        np.maximum.at(last_end, pos[known], wins["end"][known])
        table["last_window_end"] = np.maximum(table["last_window_end"], last_end)
    next_minute, health_rows = _health(state, log, wins, settle, brokers, errors, cfg)
    point_rows = None
    suspects: tuple[Suspect, ...]
    episode_rows: list[dict[str, Any]]
    if points:
        # a forecast per broker that got events: a broker without any keeps its last one (points.py)
        if nrows(new):
            point_rows = forecasts(log, wins, wm, state.cluster, brokers, np.unique(new["broker"]).tolist(), errors, cfg)
        interval = int(cfg.evaluation_interval_s * 1000)
        # the grid is decided elsewhere; this keeps the log rows later forecasts read (see _forget)
        last_tick, episodes, suspects, ahead_tick, episode_rows = (settle // interval) * interval, state.episodes, (), NONE, []
    else:
        last_tick, episodes, suspects, ahead_tick, episode_rows = _episodes(state, log, wins, settle, brokers, errors, cfg)
    table, log, wins = _forget(table, log, wins, wm, settle, next_minute, last_tick, cfg)
    out_state = replace(
        state, watermark_ms=settle, next_serial=state.next_serial + nrows(new), next_pair=next_pair,
        next_minute=next_minute, last_tick=last_tick, brokers=brokers, versions=versions, errors=errors,
        pairs=table, log=log, windows=wins, episodes=episodes, suspects=suspects, ahead_tick=ahead_tick,
    )
    outputs = FaultOutputs(changes.rows, episode_rows, health_rows, quarantine,
                           _wakeup(out_state, cfg), stats_of(out_state), point_rows)
    return out_state, outputs


def _health(
    state: FaultState, log: Cols, wins: Cols, wm: int, brokers: tuple[str, ...], errors: tuple[str, ...],
    cfg: FaultsConfig,
) -> tuple[int, list[dict[str, Any]]]:
    next_minute = state.next_minute
    if next_minute == NONE:
        if not nrows(log):
            return NONE, []
        next_minute = int(health.minute_of(int(log["ts"].min())))
    end = int(health.final_minute_end(wm))
    if end <= next_minute:
        return next_minute, []
    rows = health.minute_rows(log, wins, next_minute, end, state.cluster, brokers, errors,
                              cfg.quorum_counts_shadow_windows)
    return end, rows


def _episodes(
    state: FaultState, log: Cols, wins: Cols, wm: int, brokers: tuple[str, ...], errors: tuple[str, ...],
    cfg: FaultsConfig,
) -> tuple[int, Cols, tuple[Suspect, ...], int, list[dict[str, Any]]]:
    """Decide the grid points up to the watermark; then look ahead at the events read so far.

    Returns (last decided grid point, open episodes, suspicions, grid point looked ahead to, rows).
    """
    interval = int(cfg.evaluation_interval_s * 1000)
    last = state.last_tick
    if last == NONE:
        if not nrows(log):
            return NONE, state.episodes, state.suspects, state.ahead_tick, []
        last = ((int(log["ts"].min()) - 1) // interval) * interval
    top = max(last, (wm // interval) * interval)
    head = ((int(log["ts"].max()) if nrows(log) else top) // interval) * interval
    open_eps = ep_mod.episodes_from_table(state.episodes)
    decision = decide.decide(
        decide.Decision(last, state.ahead_tick, state.suspects), open_eps, top, head, state.cluster, brokers,
        lambda eps, after, until: _evaluate_grid(eps, log, wins, after, until, errors, cfg),
        lambda t: _brokers_seen(log, t, cfg),
    )
    return (decision.last_tick, ep_mod.episodes_to_table(open_eps), decision.suspects, decision.ahead_tick,
            decision.rows)


def _evaluate_grid(
    open_eps: dict[int, ep_mod.Episode], log: Cols, wins: Cols, last: int, top: int, errors: tuple[str, ...],
    cfg: FaultsConfig,
) -> list[ep_mod.Episode]:
    """Evaluate the grid points in ``(last, top]`` that can matter; ``open_eps`` is updated in place."""
    if top <= last:
        return []
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    in_range = (log["ts"] > last - reach) & (log["status"] != ev.REMOVED)  # sends only
    live = (wins["end"] > last) & (wins["start"] <= top)
    if not open_eps and not in_range.any() and not live.any():
        return []
    slack = int(cfg.episode_close_after_s * 1000) + interval
    spans_from = np.concatenate([log["ts"][in_range], wins["start"][live]])
    spans_to = np.concatenate([log["ts"][in_range] + reach, wins["end"][live]]) + slack
    # an open episode away from every send and window closes only at its silence bound (evaluate)
    ticks = ep_mod.grid_times(spans_from, spans_to, last, top, interval)
    # only the columns the grid points read: the log has many more
    rows = np.flatnonzero(in_range & (log["ts"] <= top))
    recent = {name: log[name][rows] for name in ep_mod.POINT_COLUMNS}
    involved = set(np.unique(recent["broker"]).tolist()) | set(np.unique(wins["broker"][live]).tolist()) | set(open_eps)
    return ep_mod.evaluate(open_eps, ticks, recent, take(wins, live), sorted(involved), errors, cfg, top)


def _brokers_seen(log: Cols, t: int, cfg: FaultsConfig) -> int:
    """Brokers of the cluster with a send in ``(t - active_producer_window_s, t]``."""
    since = t - int(cfg.active_producer_window_s * 1000)
    seen = (log["ts"] > since) & (log["ts"] <= t) & (log["status"] != ev.REMOVED)
    return int(np.unique(log["broker"][seen]).size)


def _forget(
    table: Cols, log: Cols, wins: Cols, folded_to: int, wm: int, next_minute: int, last_tick: int,
    cfg: FaultsConfig,
) -> tuple[Cols, Cols, Cols]:
    idle_ms = int(cfg.producer_idle_expiry_s * 1000)
    if nrows(table):
        last_seen = np.maximum(table["last_event_ts"], table["last_window_end"])
        provisional = np.zeros(nrows(table), dtype=bool)
        open_rows = ~wins["final"]
        if open_rows.any():
            pos, known = _locate(table, np.unique(wins["pair"][open_rows]))
            provisional[pos[known]] = True
        # (a pair with updates not folded yet stays: the next step folds them into its base)
        expired = (last_seen + idle_ms <= wm) & ~provisional & (table["last_event_ts"] <= folded_to)
        if expired.any():
            table = take(table, ~expired)
    interval = int(cfg.evaluation_interval_s * 1000)
    reach = int(max(cfg.active_producer_window_s, cfg.outlier_window_s) * 1000)
    next_tick = last_tick + interval if last_tick != NONE else NONE
    keep_from = wm + 1  # unfolded updates (after the watermark) are always kept: a rewind needs them
    if next_minute != NONE:
        keep_from = min(keep_from, next_minute)
    if next_tick != NONE:
        keep_from = min(keep_from, next_tick - reach + 1)
    if nrows(log):
        drop = log["folded"] & (log["ts"] < keep_from)
        if drop.any():
            log = take(log, ~drop)
    horizon = [v for v in (next_minute, next_tick) if v != NONE]
    if nrows(wins) and horizon:
        wins = windows.prune(wins, min(horizon))
    return table, log, wins


def _wakeup(state: FaultState, cfg: FaultsConfig) -> int | None:
    """The smallest watermark at which a step without events would write something."""
    candidates = []
    if nrows(state.log):
        if state.next_minute != NONE:
            candidates.append(state.next_minute + health.MINUTE_MS - 1)
        if state.last_tick != NONE:
            candidates.append(state.last_tick + int(cfg.evaluation_interval_s * 1000))
    if nrows(state.episodes):  # an open episode with no further events closes at its silence bound
        interval = int(cfg.evaluation_interval_s * 1000)
        candidates.append(int(state.episodes["last_heard"].min()) + ep_mod.on_grid(cfg.episode_max_silence_s * 1000,
                                                                                   interval))
    if state.suspects:  # the watermark reaching a suspicion's grid point decides it
        candidates.append(min(opened for _, opened, _, _, _ in state.suspects))
    provisional = ~state.windows["final"]
    if provisional.any():
        candidates.append(int(state.windows["end"][provisional].min()))
    if nrows(state.pairs):
        last_seen = np.maximum(state.pairs["last_event_ts"], state.pairs["last_window_end"])
        candidates.append(int(last_seen.min()) + int(cfg.producer_idle_expiry_s * 1000))
    return min(candidates) if candidates else None
