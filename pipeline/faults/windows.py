"""Avoidance windows as rows: what is new, what changed, what became final, what never was.

The state keeps a row per window that is not final yet ("provisional": the watermark has not passed
its end, so an out-of-order update could still move it) and, for a while, the final ones (the health
minutes and episode ticks still to be evaluated count them). Rules of emission:

- a window seen for the first time is appended as "open" in the batch of the event that opened it;
- a change of its end (or update count) appends a new revision;
- once ``end_ms <= watermark`` it is appended as "closed" with its final end, and never again;
- after a rewind, a provisional window the replay did not produce is appended as "retracted".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.faults.frame import Cols, concat, empty, take
from pipeline.rocketmq import Window
from schemas.tables import utc_date

WINDOW_SCHEMA: dict[str, str] = {
    "pair": "int64",
    "broker": "int32",
    "start": "int64",
    "end": "int64",
    "final": "bool",
    "updates": "int64",
    "trigger_serial": "int64",
    "last_serial": "int64",
    "trigger_event_id": "object",
    "trigger_status": "int8",
    "trigger_latency": "int64",
    "trigger_error": "object",
    "trigger_isolation": "bool",
    "version": "int32",
    "gen": "int8",
    "enable": "bool",
}


@dataclass
class WindowUpdate:
    """What one pair's updates showed in this step: windows by start, and whether it was a replay."""

    pair: int
    seen: dict[int, tuple[Window, int]]
    rewound: bool
    first_ts: int  # earliest update of the batch for this pair (the rewind point)


@dataclass
class Meta:
    """How to fill a window row: names and per-serial event facts, supplied by the state."""

    cluster: str
    brokers: tuple[str, ...]
    versions: tuple[str, ...]
    statuses: tuple[str, ...]
    gens: tuple[str, ...]
    pair_group: dict[int, str]
    pair_client: dict[int, str]
    revision: dict[int, int]  # pair -> next revision (mutated)
    event_facts: Any  # callable(serials) -> dict of arrays: ts, event_id, status, error, version, gen, enable


@dataclass
class WindowChanges:
    rows: list[dict[str, Any]] = field(default_factory=list)


def _row(meta: Meta, w: dict[str, Any], state: str, updated_ms: int) -> dict[str, Any]:
    pair = int(w["pair"])
    rev = meta.revision.get(pair, 0)
    meta.revision[pair] = rev + 1
    group, client = meta.pair_group[pair], meta.pair_client[pair]
    broker = meta.brokers[int(w["broker"])]
    start = int(w["start"])
    return {
        "window_id": f"{meta.cluster}|{group}|{client}|{broker}|{start}",
        "cluster": meta.cluster,
        "producer_group": group,
        "client_id": client,
        "client_version": meta.versions[int(w["version"])],
        "generation": meta.gens[int(w["gen"])],
        "broker_name": broker,
        "start_ms": start,
        "end_ms": int(w["end"]),
        "state": state,
        "trigger_event_id": w["trigger_event_id"],
        "trigger_status": meta.statuses[int(w["trigger_status"])],
        "trigger_latency_ms": int(w["trigger_latency"]),
        "trigger_error": w["trigger_error"],
        "trigger_isolation": bool(w["trigger_isolation"]),
        "updates": int(w["updates"]),
        "fault_enable": bool(w["enable"]),
        "revision": rev,
        "updated_ms": updated_ms,
        "event_date": utc_date(start),
    }


def _table_row(table: Cols, i: int) -> dict[str, Any]:
    return {name: values[i] for name, values in table.items()}


def apply_updates(
    table: Cols, updates: list[WindowUpdate], watermark_ms: int, meta: Meta, out: WindowChanges
) -> Cols:
    """Merge what the pairs' updates showed into the window table, appending rows to ``out``."""
    if not updates:
        return table
    touched = np.asarray([u.pair for u in updates], dtype=np.int64)
    mine = np.isin(table["pair"], touched)
    keep, rest = take(table, ~mine), take(table, mine)
    by_key = {(int(p), int(s)): i for i, (p, s) in enumerate(zip(rest["pair"].tolist(), rest["start"].tolist()))}
    by_pair: dict[int, list[tuple[int, int]]] = {}  # pair -> its (start, row) in by_key's order
    i: int | None
    for (p, s), i in by_key.items():
        by_pair.setdefault(p, []).append((s, i))
    rows = [_table_row(rest, i) for i in range(len(rest["pair"]))]
    alive = [True] * len(rows)
    added: list[dict[str, Any]] = []
    need_facts: list[tuple[dict[str, Any], Window]] = []
    for u in updates:
        for start, (w, upd) in sorted(u.seen.items()):
            i = by_key.get((u.pair, start))
            if i is None:
                if w.end_ms <= watermark_ms:
                    continue  # final long ago and forgotten: nothing can have changed it
                row = {"pair": u.pair, "start": start, "end": w.end_ms, "final": False, "updates": upd,
                       "trigger_serial": w.trigger_index, "last_serial": w.last_index}
                added.append(row)
                need_facts.append((row, w))
                continue
            row = rows[i]
            if row["final"] or (row["end"] == w.end_ms and row["updates"] == upd):
                continue
            row.update(end=w.end_ms, updates=upd, last_serial=w.last_index, _changed=True)
        if u.rewound:
            for s, i in by_pair.get(u.pair, ()):
                # A replay starts from the watermark: windows that ended by then are final, not gone.
                if s not in u.seen and not rows[i]["final"] and rows[i]["end"] > watermark_ms:
                    alive[i] = False
                    out.rows.append(_row(meta, rows[i], "retracted", u.first_ts))
    _fill_triggers(need_facts, meta)
    changed = [r for r in rows if r.get("_changed")] + added
    if changed:
        facts = meta.event_facts(np.asarray([r["last_serial"] for r in changed], dtype=np.int64))
        for k, r in enumerate(changed):
            final = bool(r["end"] <= watermark_ms)
            r["final"] = final
            updated = int(r["end"]) if final else int(facts["ts"][k])
            out.rows.append(_row(meta, r, "closed" if final else "open", updated))
    merged = [r for r, ok in zip(rows, alive) if ok] + added
    return concat(keep, _to_table(merged)) if merged else keep


def _fill_triggers(need: list[tuple[dict[str, Any], Window]], meta: Meta) -> None:
    if not need:
        return
    facts = meta.event_facts(np.asarray([w.trigger_index for _, w in need], dtype=np.int64))
    for k, (row, w) in enumerate(need):
        row.update(
            broker=facts["broker"][k],
            trigger_event_id=facts["event_id"][k],
            trigger_status=facts["status"][k],
            trigger_latency=w.latency_ms,
            trigger_error=facts["error"][k],
            trigger_isolation=bool(w.isolation),
            version=facts["version"][k],
            gen=facts["gen"][k],
            enable=bool(facts["enable"][k]),
        )


def _to_table(rows: list[dict[str, Any]]) -> Cols:
    out = empty(WINDOW_SCHEMA)
    if not rows:
        return out
    for name, dtype in WINDOW_SCHEMA.items():
        values = [r[name] for r in rows]
        if dtype == "object":
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[name] = arr
        else:
            out[name] = np.asarray(values, dtype=dtype)
    return out


def finalize(table: Cols, watermark_ms: int, meta: Meta, out: WindowChanges) -> Cols:
    """Append a "closed" row for every provisional window whose end the watermark has passed."""
    due = np.flatnonzero(~table["final"] & (table["end"] <= watermark_ms))
    if len(due) == 0:
        return table
    for i in due.tolist():
        row = _table_row(table, i)
        out.rows.append(_row(meta, row, "closed", int(row["end"])))
    final = table["final"].copy()
    final[due] = True
    return {**table, "final": final}


def prune(table: Cols, keep_after_ms: int) -> Cols:
    """Forget final windows that ended before ``keep_after_ms`` (nothing still counts them)."""
    drop = table["final"] & (table["end"] < keep_after_ms)
    return take(table, ~drop) if drop.any() else table
