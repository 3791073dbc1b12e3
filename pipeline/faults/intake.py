"""The way in: which events a step can use, which producer x broker each belongs to, and the
log rows it adds (processing order, serials, what the rules need of each update).

Screening quarantines what the rules cannot use, with a reason: an unparseable ``client_version``
(``bad_client_version``), a late event (``late``: at or before the watermark), one stamped further
ahead of the batch time than ``max_future_skew_s`` (``future``), and the events of producers beyond
``max_producers_per_broker`` (``state_limit``). Dictionaries (broker names, versions, error classes)
grow in sorted order, so codes do not depend on the order rows arrive in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from pipeline.config import FaultsConfig
from pipeline.faults import events as ev
from pipeline.faults import pairs
from pipeline.faults.coded import NULL, Coded
from pipeline.faults.events import Events
from pipeline.faults.frame import Cols, concat, nrows
from pipeline.rocketmq import GENERATIONS
from pipeline.rocketmq.windows_np import durations_array

NONE = -1
MAX_ERROR_CLASSES = 1000
OTHER_ERROR = "other"


def encode(values: Coded, names: tuple[str, ...], cap: int | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes of ``values`` in the dictionary ``names``, extended with new values (up to ``cap``).

    New values are added in sorted order, so the codes do not depend on the order of the rows
    (a replayed batch may deliver them in another order).
    """
    index = {name: i for i, name in enumerate(names)}
    grown = list(names)
    for value in sorted(v for v in values.words.tolist() if v not in index):
        if cap is not None and len(grown) >= cap:
            if OTHER_ERROR not in index:
                index[OTHER_ERROR] = len(grown)
                grown.append(OTHER_ERROR)
            index[value] = index[OTHER_ERROR]
            continue
        index[value] = len(grown)
        grown.append(value)
    table = np.asarray([index[v] for v in values.words.tolist()], dtype=np.int32)
    return table[values.codes] if len(values.codes) else np.empty(0, dtype=np.int32), tuple(grown)


def _joint(known: np.ndarray, new: Coded) -> tuple[np.ndarray, int]:
    """Codes of the values ``known`` and then of ``new``'s rows in one numbering; how many values."""
    codes, uniques = pd.factorize(pd.Series(known, dtype=object))
    index = {value: i for i, value in enumerate(uniques.tolist())}
    pos = np.asarray([index.setdefault(w, len(index)) for w in new.words.tolist()] + [NULL], dtype=np.int64)
    return np.concatenate([codes, pos[new.codes]]).astype(np.int64), len(index)


def quarantine(events: Events, rows: np.ndarray, reason: str, detail: Any) -> list[dict[str, Any]]:
    raw = ev.reencode(events, rows.tolist())
    out = []
    for k, i in enumerate(rows.tolist()):
        out.append({
            "source_topic": events["kafka_topic"][i],
            "source_partition": int(events["kafka_partition"][i]),
            "source_offset": int(events["kafka_offset"][i]),
            "kafka_ts_ms": int(events["kafka_ts_ms"][i]),
            "raw_key": str(events["broker_name"][i]).encode(),
            "raw_value": raw[k],
            "event_kind": "send_result",
            "reason": reason,
            "detail": detail(i) if callable(detail) else detail,
            "stage": "faults",
        })
    return out


def screen(
    state: Any, events: Events, watermark_ms: int, cfg: FaultsConfig, now_ms: int | None
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(accepted rows, their generation codes, quarantine rows) of a batch."""
    n = events.num_rows
    gen = ev.generations(events.codes("client_version")) if n else np.empty(0, dtype=np.int8)
    ts = events["ts_ms"]
    bad = gen == ev.BAD_VERSION
    late = ~bad & (ts <= watermark_ms)
    limit = None if now_ms is None else now_ms + int(cfg.max_future_skew_s * 1000)
    future = ~bad & ~late & (ts > limit) if limit is not None else np.zeros(n, dtype=bool)
    refused = bad | late | future
    if n and refused.any():
        # A removal the rules cannot take is no event of its own: the event that carries it goes to
        # quarantine if it is refused too (a removal shortly before a send can fall at or behind the
        # watermark when its send does not: then the window it would have ended stays, as before).
        removal = removals(events)
        bad, late, future = bad & ~removal, late & ~removal, future & ~removal
    else:
        removal = np.zeros(n, dtype=bool)
    q: list[dict[str, Any]] = []
    if bad.any():
        q += quarantine(events, np.flatnonzero(bad), "bad_client_version",
                         lambda i: f"client_version {events['client_version'][i]!r}: no fault table for this "
                         "RocketMQ client version (the rules model 4.0 and later)")
    if late.any():
        q += quarantine(events, np.flatnonzero(late), "late",
                         lambda i: f"ts_ms {int(ts[i])} is at or before the watermark {watermark_ms}")
    if future.any():
        q += quarantine(events, np.flatnonzero(future), "future",
                         lambda i: f"ts_ms {int(ts[i])} is more than max_future_skew_s after the batch time {now_ms}")
    ok = np.flatnonzero(~(bad | late | future | (removal & refused)))
    return ok, gen[ok], q


def removals(events: Events, rows: np.ndarray | None = None) -> np.ndarray:
    """Which rows (of ``rows``, or all) are removals (:func:`events.with_removals`), not sends."""
    return ev.statuses(events.codes("status", rows) if rows is not None else events.codes("status")) == ev.REMOVED


def register(
    state: Any, events: Events, rows: np.ndarray, cfg: FaultsConfig
) -> tuple[Cols, tuple[str, ...], np.ndarray, np.ndarray, int]:
    """Pair ids of ``rows`` (new pairs added); rows refused by the per-broker limit, and removals naming a
    pair not kept (nothing to end), get id -1."""
    broker_codes, brokers = encode(events.codes("broker_name", rows), state.brokers)
    table = state.pairs
    if len(rows) == 0:
        return table, brokers, np.empty(0, dtype=np.int64), broker_codes, state.next_pair
    n_old = nrows(table)
    group, client = events.codes("producer_group", rows), events.codes("client_id", rows)
    groups, n_groups = _joint(table["producer_group"], group)
    clients, n_clients = _joint(table["client_id"], client)
    brokers_all = np.concatenate([table["broker"].astype(np.int64), broker_codes.astype(np.int64)])
    key = (brokers_all * n_groups + groups) * n_clients + clients
    uniq, first, codes = np.unique(key[n_old:], return_index=True, return_inverse=True)
    old_keys = key[:n_old]
    sorter = np.argsort(old_keys)
    pos = np.searchsorted(old_keys, uniq, sorter=sorter)
    pos = np.minimum(pos, max(n_old - 1, 0))
    found = (old_keys[sorter[pos]] == uniq) if n_old else np.zeros(len(uniq), dtype=bool)
    unique_ids = np.where(found, table["pair"][sorter[pos]] if n_old else NONE, NONE).astype(np.int64)
    group_of, client_of = group.words[group.codes[first]], client.words[client.codes[first]]  # per unique pair
    missing = np.flatnonzero(~found)
    if len(missing):  # a pair only removals name has no window to end: no new pair, no slot taken
        only_removals = np.ones(len(uniq), dtype=bool)
        np.logical_and.at(only_removals, codes, removals(events, rows))
        missing = missing[~only_removals[missing]]
    per_broker = np.bincount(table["broker"], minlength=len(brokers)).tolist() if n_old else []
    per_broker += [0] * (len(brokers) - len(per_broker))
    next_pair = state.next_pair
    added: list[int] = []
    names = [(brokers[int(broker_codes[first[i]])], group_of[i], client_of[i]) for i in missing.tolist()]
    for _, i in sorted(zip(names, missing.tolist())):
        b = int(broker_codes[first[i]])
        if per_broker[b] >= cfg.max_producers_per_broker:
            continue
        per_broker[b] += 1
        unique_ids[i] = next_pair
        added.append(i)
        next_pair += 1
    if added:
        idx = np.asarray(added)
        new = pairs.new_pairs(unique_ids[idx], broker_codes[first[idx]], group_of[idx], client_of[idx])
        table = concat(table, new)
    ids = unique_ids[codes].astype(np.int64) if len(codes) else np.empty(0, dtype=np.int64)
    return table, brokers, ids, broker_codes, next_pair


def new_log(
    state: Any, events: Events, rows: np.ndarray, gen: np.ndarray, ids: np.ndarray,
    broker_codes: np.ndarray, cfg: FaultsConfig,
) -> tuple[Cols, tuple[str, ...], tuple[str, ...]]:
    """Log rows of the accepted events, in processing order, with serials."""
    ts, part, off = (events[name][rows] for name in ("ts_ms", "kafka_partition", "kafka_offset"))
    order = ev.order_of(ts, part, off, lambda: events.at("event_id", rows))
    idx = rows[order]
    ts, part, off, latency = ts[order], part[order], off[order], events["latency_ms"][idx]
    gen, ids, broker_codes = gen[order], ids[order], broker_codes[order]
    n = len(order)
    status, error = events.codes("status", idx), events.codes("error", idx)
    codes = ev.statuses(status)
    failed = codes == ev.FAILED
    failed_error = Coded(np.where(failed, error.codes, NULL), error.words).compact()
    iso, reach = ev.rule_arguments(gen, status, failed_error, cfg.detector_enabled)
    iso = ev.given(iso, *events.flags("isolation", idx))
    reach = ev.given(reach, *events.flags("reachable", idx))
    err, errors = encode(failed_error.map(ev.error_class), state.errors, MAX_ERROR_CLASSES)
    version, versions = encode(events.codes("client_version", idx), state.versions)
    triggers = np.zeros(n, dtype=bool)
    for code, name in enumerate(ev.GEN_NAMES):
        mine = gen == code
        if mine.any():
            triggers[mine] = durations_array(GENERATIONS[name], latency[mine], iso[mine]) > 0
    # the event id and error of an update that can open a window (a window row names them)
    hot = np.flatnonzero(triggers)
    event_id, error_text = np.full(n, None, dtype=object), np.full(n, None, dtype=object)
    event_id[hot] = events.at("event_id", idx[hot])
    error_text[hot] = error.take(hot).values()
    enable = ev.given(np.full(n, cfg.default_send_latency_fault_enable, dtype=bool),
                      *events.flags("send_latency_fault_enable", idx))
    log = {
        "serial": state.next_serial + np.arange(n, dtype=np.int64),
        "ts": ts, "part": part, "off": off, "pair": ids,
        "broker": broker_codes.astype(np.int32), "latency": latency, "iso": iso, "reach": reach,
        "gen": gen.astype(np.int8), "enable": enable,
        "status": codes, "version": version, "err": err, "failed": failed, "hot": triggers,
        "event_id": event_id, "error": error_text, "folded": np.zeros(n, dtype=bool),
    }
    return {name: np.asarray(log[name], dtype=dtype) for name, dtype in pairs.LOG_SCHEMA.items()}, versions, errors
