"""The lag step's input: one pandas frame of mixed events, with fixed columns and no nulls in numbers.

Spark hands the stateful function pandas frames in which a nullable long becomes float64 with NaN;
tests build events from the ``schemas.events`` dataclasses. Both go through :func:`normalize_events`
so the maths sees one shape: int64 columns with the sentinels of :mod:`pipeline.lag.model`, and a
deterministic row order (event time, then Kafka position), whatever order Spark delivered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lag.model import NO_OFFSET, UNKNOWN
from schemas.events import ConsumerProgress, GroupMembership, SendResult

SEND, PROGRESS, MEMBERSHIP = "send_result", "consumer_progress", "group_membership"
KIND_OF_TABLE = {"send_results": SEND, "consumer_progress": PROGRESS, "group_membership": MEMBERSHIP}

# column -> (default when missing or null, dtype)
COLUMNS: dict[str, tuple[Any, str]] = {
    "kind": (None, "object"),
    "ts_ms": (UNKNOWN, "int64"),
    "cluster": (None, "object"),
    "topic": (None, "object"),
    "broker_name": (None, "object"),
    "queue_id": (UNKNOWN, "int64"),
    "queue_offset": (UNKNOWN, "int64"),
    "send_status": (None, "object"),
    "consumer_group": (None, "object"),
    "consumer_offset": (NO_OFFSET, "int64"),
    "broker_offset": (UNKNOWN, "int64"),
    "client_id": (None, "object"),
    "last_timestamp_ms": (UNKNOWN, "int64"),
    "client_ids": (None, "object"),
    "strategy": (None, "object"),
    "src_topic": ("", "object"),
    "src_partition": (UNKNOWN, "int64"),
    "src_offset": (UNKNOWN, "int64"),
    "src_ts_ms": (UNKNOWN, "int64"),
}
SORT_KEYS = ["ts_ms", "src_topic", "src_partition", "src_offset", "kind"]


def normalize_events(frame: pd.DataFrame) -> pd.DataFrame:
    """Fixed columns and dtypes, sentinels for missing numbers, rows in a deterministic order.

    Text columns are taken as they are: Spark delivers nulls as None, and :func:`events_frame`
    fills them with None too.
    """
    out = {}
    n = len(frame)
    for name, (default, dtype) in COLUMNS.items():
        if name not in frame.columns:
            out[name] = np.full(n, default, dtype=object if dtype == "object" else dtype)
        elif name == "client_ids":  # lists: a NaN here (frames concatenated by pandas) is not iterable
            values = frame[name].to_numpy(dtype=object)
            out[name] = np.where(pd.isna(frame[name]).to_numpy(), None, values)  # type: ignore[assignment]  # numpy's stubs read a None value as the omitted argument
        elif dtype == "object":
            out[name] = frame[name].to_numpy(dtype=object)
        elif frame[name].dtype == np.int64:
            out[name] = frame[name].to_numpy()
        else:
            out[name] = pd.to_numeric(frame[name], errors="coerce").fillna(default).to_numpy(dtype=np.int64)
    return _in_order(out, n)


def normalize_arrow(events: pa.Table) -> pd.DataFrame:
    """:func:`normalize_events` of ``events.to_pandas()``, built for less: rows are put in order
    while text is still dictionary codes, a dictionary's words become one string object each, and
    numbers stay int64 (``to_pandas`` makes floats of a column with nulls)."""
    n = events.num_rows
    columns = {name: events.column(name).combine_chunks() for name in COLUMNS if name in events.column_names}
    numbers = {name: _int64(columns.get(name), n, COLUMNS[name][0])
               for name in ("ts_ms", "src_partition", "src_offset")}
    order = np.lexsort((_text_rank(columns.get("kind"), n), numbers["src_offset"], numbers["src_partition"],
                        _text_rank(columns.get("src_topic"), n), numbers["ts_ms"]))
    in_order = not (order[1:] < order[:-1]).any()
    out = {}
    for name, (default, dtype) in COLUMNS.items():
        column = columns.get(name)
        if dtype == "int64":
            values = numbers[name] if name in numbers else _int64(column, n, default)
        elif column is None or pa.types.is_null(column.type):
            out[name] = np.full(n, default, dtype=object)
            continue
        elif name == "client_ids":
            values = column.to_numpy(zero_copy_only=False)
        else:
            values = _words(column)
        out[name] = values if in_order else values[order]  # numpy's take: cheaper than Arrow's per column
    return pd.DataFrame(out, copy=False)  # a block per column: consolidating them copies everything


def _int64(column: pa.Array | None, n: int, default: int) -> np.ndarray:
    if column is None or pa.types.is_null(column.type):
        return np.full(n, default, dtype=np.int64)
    return pc.fill_null(column, default).cast(pa.int64()).to_numpy()


def _words(column: pa.Array) -> np.ndarray:
    """Strings as an object array, None for null; one string object per distinct dictionary word."""
    if not pa.types.is_dictionary(column.type):
        return column.to_numpy(zero_copy_only=False)
    words = np.append(column.dictionary.to_numpy(zero_copy_only=False), None)  # type: ignore[call-overload]  # numpy's stubs read a None value as the omitted argument
    return words[column.indices.fill_null(-1).to_numpy()]  # -1 picks the trailing None


def _text_rank(column: pa.Array | None, n: int) -> np.ndarray:
    """Per row, its text's rank in sorted order (-1 for null): ``pd.factorize(sort=True)``'s codes."""
    if column is None or pa.types.is_null(column.type):
        return np.full(n, -1, dtype=np.int64)
    if pa.types.is_dictionary(column.type):
        words = column.dictionary.to_numpy(zero_copy_only=False)
        codes = column.indices.fill_null(-1).to_numpy()
    else:
        codes, words = pd.factorize(column.to_numpy(zero_copy_only=False), sort=False)
    rank = np.append(np.argsort(np.argsort(np.asarray(words, dtype=object), kind="stable")), -1)
    return rank[codes]


def _in_order(out: dict[str, np.ndarray], n: int) -> pd.DataFrame:
    """The columns as a frame, rows sorted by :data:`SORT_KEYS`."""
    if n:
        order = np.lexsort(
            (
                pd.factorize(out["kind"], sort=True)[0],
                out["src_offset"],
                out["src_partition"],
                pd.factorize(out["src_topic"], sort=True)[0],
                out["ts_ms"],
            )
        )
        if not (order[1:] > order[:-1]).all():
            out = {k: v[order] for k, v in out.items()}
    return pd.DataFrame(out, copy=False)  # a block per column: consolidating them copies everything


def events_frame(events: Iterable[SendResult | ConsumerProgress | GroupMembership]) -> pd.DataFrame:
    """A normalised frame from event dataclasses; their list position stands in for a Kafka offset."""
    rows = []
    for i, ev in enumerate(events):
        row: dict[str, Any] = {"kind": ev.kind, "src_topic": "memory", "src_partition": 0, "src_offset": i}
        if isinstance(ev, SendResult):
            row.update(
                ts_ms=ev.ts_ms,
                cluster=ev.cluster,
                topic=ev.topic,
                broker_name=ev.broker_name,
                queue_id=ev.queue_id,
                queue_offset=ev.queue_offset,
                send_status=ev.status,
                client_id=ev.client_id,
            )
        elif isinstance(ev, ConsumerProgress):
            row.update(
                ts_ms=ev.ts_ms,
                cluster=ev.cluster,
                consumer_group=ev.consumer_group,
                topic=ev.topic,
                broker_name=ev.broker_name,
                queue_id=ev.queue_id,
                consumer_offset=ev.consumer_offset,
                broker_offset=ev.broker_offset,
                client_id=ev.client_id,
                last_timestamp_ms=ev.last_timestamp_ms,
            )
        else:
            row.update(
                ts_ms=ev.ts_ms,
                cluster=ev.cluster,
                consumer_group=ev.consumer_group,
                topic=ev.topic,
                client_ids=tuple(ev.client_ids),
                strategy=ev.strategy,
            )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for name, (default, dtype) in COLUMNS.items():
        if dtype == "object":
            frame[name] = frame[name].astype(object).where(frame[name].notna(), default)
    return normalize_events(frame)
