"""Send results as columns, their processing order, and what the fault rules need of each.

Order (the tie-break): ``(ts_ms, kafka_partition, kafka_offset)``, then ``event_id``. Events are
keyed by broker name in Kafka, so one producer's results for one broker share a partition and their
offsets are the order in which the producer's hook wrote them: that reproduces the order of the
client's ``updateFaultItem`` calls for equal timestamps, which decides e.g. whether a 4.9 window
opened and was cut short in the same millisecond. ``event_id`` only breaks ties between records
that claim the same Kafka position (possible outside Kafka, e.g. in tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.faults.frame import Cols, build, from_arrow, nrows
from pipeline.rocketmq import GEN_5, GEN_49, generation_for_client_version, update_args_for
from pipeline.rocketmq.outcomes import broker_response_code
from schemas.events import SEND_STATUSES, SendResult

# The bronze columns the fault step reads: every send-result field (a late event is re-encoded for
# quarantine from them) plus where it came from in Kafka.
EVENT_SCHEMA: dict[str, str] = {
    "schema_version": "int64",
    "event_id": "object",
    "ts_ms": "int64",
    "cluster": "object",
    "producer_group": "object",
    "client_id": "object",
    "client_version": "object",
    "topic": "object",
    "broker_name": "object",
    "queue_id": "int64",
    "status": "object",
    "latency_ms": "int64",
    "error": "object",
    "queue_offset": "object",
    "attempt": "int64",
    "isolation": "object",
    "reachable": "object",
    "send_latency_fault_enable": "object",
    "kafka_topic": "object",
    "kafka_partition": "int64",
    "kafka_offset": "int64",
    "kafka_ts_ms": "int64",
}
EVENT_COLUMNS = list(EVENT_SCHEMA)

GEN_NAMES = (GEN_49, GEN_5)  # generation codes: index into this tuple
GEN_CODE = {name: i for i, name in enumerate(GEN_NAMES)}
BAD_VERSION = -1
STATUS_CODE = {name: i for i, name in enumerate(SEND_STATUSES)}
FAILED = STATUS_CODE["FAILED"]


def from_arrow_table(table: pa.Table | pa.RecordBatch) -> Cols:
    """Events from bronze-shaped Arrow data (extra columns are ignored)."""
    return from_arrow(table, EVENT_SCHEMA)


def from_frame(frame: pd.DataFrame) -> Cols:
    if len(frame) == 0:
        return build(EVENT_SCHEMA, **{c: [] for c in EVENT_SCHEMA})
    out = {}
    for name, dtype in EVENT_SCHEMA.items():
        values = frame[name]
        if dtype == "object":
            out[name] = values.astype(object).where(values.notna(), None).to_numpy(dtype=object)
        else:
            out[name] = values.to_numpy(dtype=dtype)
    return out


def from_send_results(
    events: Sequence[SendResult],
    partitions: Sequence[int] | int = 0,
    offsets: Sequence[int] | None = None,
    kafka_topic: str = "rmq.send-results",
) -> Cols:
    """Events from the event dataclasses (tests, simulator output); offsets default to positions."""
    n = len(events)
    parts = [partitions] * n if isinstance(partitions, int) else list(partitions)
    offs = list(range(n)) if offsets is None else list(offsets)
    values: dict[str, Any] = {name: [getattr(e, name) for e in events] for name in EVENT_SCHEMA if
                              name not in ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_ts_ms")}
    values.update(
        kafka_topic=[kafka_topic] * n,
        kafka_partition=parts,
        kafka_offset=offs,
        kafka_ts_ms=[e.ts_ms for e in events],
    )
    return build(EVENT_SCHEMA, **values)


def processing_order(events: Cols) -> np.ndarray:
    """Positions of ``events`` sorted by (ts, kafka partition, kafka offset, event_id)."""
    ts, part, off = events["ts_ms"], events["kafka_partition"], events["kafka_offset"]
    order = np.lexsort((off, part, ts))
    if len(order) > 1:
        s_ts, s_part, s_off = ts[order], part[order], off[order]
        same = (s_ts[1:] == s_ts[:-1]) & (s_part[1:] == s_part[:-1]) & (s_off[1:] == s_off[:-1])
        if same.any():  # rare: the same Kafka position twice; order those by event_id
            ids = np.asarray([str(x) for x in events["event_id"]])
            order = np.lexsort((ids, off, part, ts))
    return order


def generation_codes(versions: np.ndarray) -> np.ndarray:
    """Generation code per event; :data:`BAD_VERSION` where the version cannot be parsed."""
    codes, uniques = pd.factorize(pd.Series(versions, dtype=object), use_na_sentinel=True)
    table = np.empty(len(uniques) + 1, dtype=np.int8)
    table[-1] = BAD_VERSION  # na sentinel -1 indexes the last slot
    for i, version in enumerate(uniques):
        try:
            table[i] = GEN_CODE[generation_for_client_version(version)]
        except ValueError:
            table[i] = BAD_VERSION
    return table[codes]


def update_arguments(
    gen: np.ndarray, status: np.ndarray, error: np.ndarray, isolation: np.ndarray, reachable: np.ndarray,
    detector_enabled: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(isolation, reachable) passed to ``updateFaultItem`` per event, from :mod:`pipeline.rocketmq`.

    Computed once per distinct (generation, status, error) and spread back; an event's own
    ``isolation``/``reachable`` fields win, as in :func:`pipeline.rocketmq.update_args_for`.
    """
    n = len(gen)
    iso = np.zeros(n, dtype=bool)
    reach = np.ones(n, dtype=bool)
    if n == 0:
        return iso, reach
    s_codes, s_uniques = pd.factorize(pd.Series(status, dtype=object))
    failed_error = np.where(status == "FAILED", error, None)  # type: ignore[call-overload]  # numpy's stubs read a None value as the omitted argument
    e_codes, e_uniques = pd.factorize(pd.Series(failed_error, dtype=object), use_na_sentinel=True)
    combined = (gen.astype(np.int64) + 1) * (len(s_uniques) * (len(e_uniques) + 1)) + s_codes * (
        len(e_uniques) + 1) + (e_codes + 1)
    keys, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    looked = np.empty((len(keys), 2), dtype=bool)
    for k, i in enumerate(first.tolist()):
        g = int(gen[i])
        err = e_uniques[e_codes[i]] if e_codes[i] >= 0 else None
        looked[k] = update_args_for(GEN_NAMES[g], status[i], err, detector_enabled) if g >= 0 else (False, True)
    iso[:] = looked[inverse, 0]
    reach[:] = looked[inverse, 1]
    given_iso = np.asarray([v is not None for v in isolation], dtype=bool) if n else iso
    given_reach = np.asarray([v is not None for v in reachable], dtype=bool) if n else reach
    if given_iso.any():
        iso[given_iso] = np.asarray(isolation[given_iso], dtype=bool)
    if given_reach.any():
        reach[given_reach] = np.asarray(reachable[given_reach], dtype=bool)
    return iso, reach


def fault_enabled(values: np.ndarray, default: bool) -> np.ndarray:
    """Each event's ``send_latency_fault_enable``, the configured fleet default where it is null."""
    out = np.full(len(values), default, dtype=bool)
    given = np.asarray([v is not None for v in values], dtype=bool) if len(values) else out
    if given.any():
        out[given] = np.asarray(values[given], dtype=bool)
    return out


def status_codes(status: np.ndarray) -> np.ndarray:
    return pd.Series(status, dtype=object).map(STATUS_CODE).fillna(-1).to_numpy(dtype=np.int8)


_TAG_RE = re.compile(r"\[([A-Z][A-Z_]*)\]")
_CLASS_RE = re.compile(r"^\s*(?:[A-Za-z_$][\w$]*\.)*([A-Za-z_$][\w$]*(?:Exception|Error))\b")
UNKNOWN_ERROR = "unknown"


def error_class(error: str | None) -> str:
    """A short, low-cardinality name of a send error: its exception class and broker tag.

    ``"MQBrokerException: CODE: 2 DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, period in queue: 206ms"``
    -> ``"MQBrokerException[TIMEOUT_CLEAN_QUEUE]"``: the numbers in messages would otherwise make
    every failure its own error in ``failures_by_error`` and ``dominant_error``.
    """
    if not error or not error.strip():
        return UNKNOWN_ERROR
    parts = []
    match = _CLASS_RE.match(error)
    if match:
        parts.append(match[1])
    tag = _TAG_RE.search(error)
    if tag:
        parts.append(f"[{tag[1]}]")
    elif (code := broker_response_code(error)) is not None:
        parts.append(f"(CODE {code})")
    return "".join(parts) if parts else error.strip()[:64]


def error_classes(errors: np.ndarray) -> np.ndarray:
    codes, uniques = pd.factorize(pd.Series(errors, dtype=object), use_na_sentinel=True)
    table = np.empty(len(uniques) + 1, dtype=object)
    table[-1] = UNKNOWN_ERROR
    for i, err in enumerate(uniques):
        table[i] = error_class(err)
    return table[codes]


def reencode(events: Cols, rows: Iterable[int]) -> list[bytes]:
    """The JSON of each event, as the send hook would have written it (for quarantine rows)."""
    out = []
    for i in rows:
        fields = {name: _plain(events[name][i]) for name in SendResult.__dataclass_fields__ if name in events}
        out.append(SendResult(**fields).to_json())
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def event_count(events: Cols) -> int:
    return nrows(events)
