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
from pipeline.faults.frame import Cols, concat, nrows
from pipeline.rocketmq import GENERATIONS
from pipeline.rocketmq.windows_np import durations_array

NONE = -1
MAX_ERROR_CLASSES = 1000
OTHER_ERROR = "other"


def encode(values: np.ndarray, names: tuple[str, ...], cap: int | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes of ``values`` in the dictionary ``names``, extended with new values (up to ``cap``).

    New values are added in sorted order, so the codes do not depend on the order of the rows
    (a replayed batch may deliver them in another order).
    """
    codes, uniques = pd.factorize(pd.Series(values, dtype=object))
    index = {name: i for i, name in enumerate(names)}
    grown = list(names)
    for value in sorted(v for v in uniques if v not in index):
        if cap is not None and len(grown) >= cap:
            if OTHER_ERROR not in index:
                index[OTHER_ERROR] = len(grown)
                grown.append(OTHER_ERROR)
            index[value] = index[OTHER_ERROR]
            continue
        index[value] = len(grown)
        grown.append(value)
    table = np.asarray([index[v] for v in uniques], dtype=np.int32)
    return table[codes] if len(codes) else np.empty(0, dtype=np.int32), tuple(grown)


def quarantine(events: Cols, rows: np.ndarray, reason: str, detail: Any) -> list[dict[str, Any]]:
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
    state: Any, events: Cols, watermark_ms: int, cfg: FaultsConfig, now_ms: int | None
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(accepted rows, their generation codes, quarantine rows) of a batch."""
    n = nrows(events)
    gen = ev.generation_codes(events["client_version"]) if n else np.empty(0, dtype=np.int8)
    ts = events["ts_ms"]
    bad = gen == ev.BAD_VERSION
    late = ~bad & (ts <= watermark_ms)
    limit = None if now_ms is None else now_ms + int(cfg.max_future_skew_s * 1000)
    future = ~bad & ~late & (ts > limit) if limit is not None else np.zeros(n, dtype=bool)
    q: list[dict[str, Any]] = []
    if bad.any():
        q += quarantine(events, np.flatnonzero(bad), "bad_client_version",
                         lambda i: f"client_version {events['client_version'][i]!r} is not a RocketMQ version")
    if late.any():
        q += quarantine(events, np.flatnonzero(late), "late",
                         lambda i: f"ts_ms {int(ts[i])} is at or before the watermark {watermark_ms}")
    if future.any():
        q += quarantine(events, np.flatnonzero(future), "future",
                         lambda i: f"ts_ms {int(ts[i])} is more than max_future_skew_s after the batch time {now_ms}")
    ok = np.flatnonzero(~(bad | late | future))
    return ok, gen[ok], q


def register(
    state: Any, events: Cols, rows: np.ndarray, cfg: FaultsConfig
) -> tuple[Cols, tuple[str, ...], np.ndarray, np.ndarray, int]:
    """Pair ids of ``rows`` (new pairs added); rows refused by the per-broker limit get id -1."""
    broker_codes, brokers = encode(events["broker_name"][rows], state.brokers)
    table = state.pairs
    if len(rows) == 0:
        return table, brokers, np.empty(0, dtype=np.int64), broker_codes, state.next_pair
    n_old = nrows(table)
    groups, g_names = pd.factorize(pd.Series(np.concatenate([table["producer_group"], events["producer_group"][rows]]),
                                             dtype=object))
    clients, c_names = pd.factorize(pd.Series(np.concatenate([table["client_id"], events["client_id"][rows]]),
                                              dtype=object))
    brokers_all = np.concatenate([table["broker"].astype(np.int64), broker_codes.astype(np.int64)])
    key = (brokers_all * len(g_names) + groups) * len(c_names) + clients
    uniq, first, codes = np.unique(key[n_old:], return_index=True, return_inverse=True)
    old_keys = key[:n_old]
    sorter = np.argsort(old_keys)
    pos = np.searchsorted(old_keys, uniq, sorter=sorter)
    pos = np.minimum(pos, max(n_old - 1, 0))
    found = (old_keys[sorter[pos]] == uniq) if n_old else np.zeros(len(uniq), dtype=bool)
    unique_ids = np.where(found, table["pair"][sorter[pos]] if n_old else NONE, NONE).astype(np.int64)
    row_of = rows[first]  # a representative event row per unique pair
    missing = np.flatnonzero(~found)
    per_broker = np.bincount(table["broker"], minlength=len(brokers)).tolist() if n_old else []
    per_broker += [0] * (len(brokers) - len(per_broker))
    next_pair = state.next_pair
    added: list[int] = []
    names = [(brokers[int(broker_codes[first[i]])], events["producer_group"][row_of[i]], events["client_id"][row_of[i]])
             for i in missing.tolist()]
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
        new = pairs.new_pairs(
            unique_ids[idx], broker_codes[first[idx]],
            events["producer_group"][row_of[idx]], events["client_id"][row_of[idx]],
        )
        table = concat(table, new)
    ids = unique_ids[codes].astype(np.int64) if len(codes) else np.empty(0, dtype=np.int64)
    return table, brokers, ids, broker_codes, next_pair


def new_log(
    state: Any, events: Cols, rows: np.ndarray, gen: np.ndarray, ids: np.ndarray,
    broker_codes: np.ndarray, cfg: FaultsConfig,
) -> tuple[Cols, tuple[str, ...], tuple[str, ...]]:
    """Log rows of the accepted events, in processing order, with serials."""
    keys = {name: events[name][rows] for name in ("ts_ms", "kafka_partition", "kafka_offset", "event_id")}
    order = ev.processing_order(keys)
    idx = rows[order]
    needed = ("ts_ms", "kafka_partition", "kafka_offset", "event_id", "status", "error", "isolation", "reachable",
              "client_version", "latency_ms", "send_latency_fault_enable")
    sub = {name: events[name][idx] for name in needed}
    gen, ids, broker_codes = gen[order], ids[order], broker_codes[order]
    n = len(order)
    iso, reach = ev.update_arguments(gen, sub["status"], sub["error"], sub["isolation"], sub["reachable"],
                                     cfg.detector_enabled)
    status = ev.status_codes(sub["status"])
    failed = status == ev.FAILED
    failed_errors: np.ndarray = np.where(failed, sub["error"], None)  # type: ignore[assignment]  # numpy's stubs read a None value as the omitted argument
    err, errors = encode(ev.error_classes(failed_errors), state.errors, MAX_ERROR_CLASSES)
    version, versions = encode(sub["client_version"], state.versions)
    triggers = np.zeros(n, dtype=bool)
    for code, name in enumerate(ev.GEN_NAMES):
        mine = gen == code
        if mine.any():
            triggers[mine] = durations_array(GENERATIONS[name], sub["latency_ms"][mine], iso[mine]) > 0
    event_id: np.ndarray = np.where(triggers, sub["event_id"], None)  # type: ignore[assignment]  # numpy's stubs read a None value as the omitted argument
    error: np.ndarray = np.where(triggers, sub["error"], None)  # type: ignore[assignment]  # numpy's stubs read a None value as the omitted argument
    log = {
        "serial": state.next_serial + np.arange(n, dtype=np.int64),
        "ts": sub["ts_ms"], "part": sub["kafka_partition"], "off": sub["kafka_offset"], "pair": ids,
        "broker": broker_codes.astype(np.int32), "latency": sub["latency_ms"], "iso": iso, "reach": reach,
        "gen": gen.astype(np.int8), "enable": ev.fault_enabled(sub["send_latency_fault_enable"],
                                                                cfg.default_send_latency_fault_enable),
        "status": status, "version": version, "err": err, "failed": failed, "hot": triggers,
        "event_id": event_id.astype(object), "error": error.astype(object), "folded": np.zeros(n, dtype=bool),
    }
    return {name: np.asarray(log[name], dtype=dtype) for name, dtype in pairs.LOG_SCHEMA.items()}, versions, errors
