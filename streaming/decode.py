"""Kafka records -> routed Arrow record batches: valid events for bronze, the rest for quarantine.

Runs inside the Kafka reader on executors. The rules themselves live in :mod:`schemas.events`; this
module only adds where each record came from and shapes the rows as Arrow.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

import pyarrow as pa

from schemas.events import EVENTS, decode_event
from schemas.fields import Invalid, arrow_schema
from schemas.tables import BRONZE_TABLE_FOR_EVENT, ROUTE_COLUMN, routed_fields

_DAY_MS = 86_400_000
_EPOCH = dt.date(1970, 1, 1)


class BatchDecoder:
    def __init__(self, kind: str, tables: Sequence[str], max_event_bytes: int) -> None:
        self.kind = kind
        self.table = BRONZE_TABLE_FOR_EVENT[kind].name
        self.schema = arrow_schema(routed_fields(list(tables)))
        self.max_event_bytes = max_event_bytes
        self._dates: dict[int, str] = {}
        self.event_columns = {f.name for f in EVENTS[kind]}

    def event_date(self, ts_ms: int) -> str:
        day = ts_ms // _DAY_MS
        date = self._dates.get(day)
        if date is None:
            date = self._dates[day] = (_EPOCH + dt.timedelta(days=day)).isoformat()
        return date

    def decode(self, topic: str, partition: int, records: Sequence[Any]) -> pa.RecordBatch:
        good: list[dict[str, Any]] = []
        bad: list[dict[str, Any]] = []
        offsets: list[int] = []
        stamps: list[int] = []
        for rec in records:
            try:
                good.append(decode_event(self.kind, rec.value, self.max_event_bytes))
                offsets.append(rec.offset)
                stamps.append(rec.timestamp)
            except Invalid as exc:
                bad.append(self._quarantine_row(topic, partition, rec, exc))
        extra = {
            ROUTE_COLUMN: [self.table] * len(good),
            "kafka_topic": [topic] * len(good),
            "kafka_partition": [partition] * len(good),
            "kafka_offset": offsets,
            "kafka_ts_ms": stamps,
            "event_date": [self.event_date(row["ts_ms"]) for row in good],
        }
        valid = self._columns(good, extra)
        if not bad:
            return valid
        return pa.Table.from_batches([valid, pa.RecordBatch.from_pylist(bad, schema=self.schema)]).combine_chunks().to_batches()[0]

    def _columns(self, rows: list[dict[str, Any]], extra: dict[str, list[Any]]) -> pa.RecordBatch:
        """Column-wise build: an order of magnitude faster than from_pylist on wide schemas."""
        n = len(rows)
        arrays = []
        for f in self.schema:
            if f.name in extra:
                arrays.append(pa.array(extra[f.name], f.type))
            elif f.name in self.event_columns:
                arrays.append(pa.array([row[f.name] for row in rows], f.type))
            else:
                arrays.append(pa.nulls(n, f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _quarantine_row(self, topic: str, partition: int, rec: Any, exc: Invalid) -> dict[str, Any]:
        return {
            ROUTE_COLUMN: "quarantine",
            "source_topic": topic,
            "source_partition": partition,
            "source_offset": rec.offset,
            "kafka_ts_ms": rec.timestamp,
            "raw_key": rec.key,
            "raw_value": rec.value,
            "event_kind": self.kind,
            "reason": exc.reason,
            "detail": exc.detail,
            "stage": "bronze",
        }
