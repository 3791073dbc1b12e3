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
    return pd.DataFrame(out)


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
