"""Kafka records -> routed Arrow record batches: valid events for bronze, the rest for quarantine.

Runs inside the Kafka reader on executors. The rules themselves live in :mod:`schemas.events`; this
module only adds where each record came from and shapes the rows as Arrow.
"""

from __future__ import annotations

import datetime as dt
import gc
from collections.abc import Sequence
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from schemas.columnar import validate_columns
from schemas.events import EVENTS, decode_event
from schemas.fields import Invalid, arrow_schema, check_record
from schemas.tables import BRONZE_TABLE_FOR_EVENT, ROUTE_COLUMN, routed_fields
from streaming.kafka_batches import Slices
from streaming.kafka_records import RecordColumns

_DAY_MS = 86_400_000
_EPOCH = dt.date(1970, 1, 1)


FUTURE = "future_event_time"  # quarantine reason: stamped too far ahead of its Kafka record


class BatchDecoder:
    def __init__(
        self, kind: str, tables: Sequence[str], max_event_bytes: int, max_future_skew_ms: int | None = None
    ) -> None:
        """``max_future_skew_ms``: how far an event's ``ts_ms`` may be ahead of its Kafka record's
        timestamp (None: not judged). Further ahead, a producer clock is wrong, and the event would
        drag event time (and a date partition) into the future: it goes to quarantine."""
        self.kind = kind
        self.max_future_skew_ms = max_future_skew_ms
        self.table = BRONZE_TABLE_FOR_EVENT[kind].name
        self.schema = arrow_schema(routed_fields(list(tables)))
        self.max_event_bytes = max_event_bytes
        self._dates: dict[int, str] = {}
        self.fields = EVENTS[kind]

    def event_date(self, ts_ms: int) -> str:
        day = ts_ms // _DAY_MS
        date = self._dates.get(day)
        if date is None:
            date = self._dates[day] = (_EPOCH + dt.timedelta(days=day)).isoformat()
        return date

    def decode(self, topic: str, partition: int, records: RecordColumns) -> pa.RecordBatch:
        """Decode ``records``; the valid ones become the kind's bronze rows, the rest quarantine rows.

        Parsing takes one pass (orjson) when every value parses, else goes record by record;
        validation runs column-wise (:mod:`schemas.columnar`) and only suspect records go through
        the per-record check, which names the reason.
        """
        if not gc.isenabled():
            return self._decode(topic, partition, records)
        # The parsed objects (a dict and its strings per record, thousands per fetch) hold no
        # cycles and are freed by reference counting with the fetch; collections triggered by
        # their allocation would only walk them.
        gc.disable()
        try:
            return self._decode(topic, partition, records)
        finally:
            gc.enable()

    def _decode(self, topic: str, partition: int, records: RecordColumns) -> pa.RecordBatch:
        values = records.values
        bad_rows: list[dict[str, Any]] = []
        parsed = self._parse_all(values)
        keep: Sequence[int] = range(len(values))  # which record each parsed object came from
        if parsed is not None:
            objs = parsed
        else:
            kept: list[int] = []
            objs = []
            limit = self.max_event_bytes
            for i, value in enumerate(values):
                if value is not None and 0 < len(value) <= limit:
                    try:
                        objs.append(orjson.loads(value))
                        kept.append(i)
                        continue
                    except orjson.JSONDecodeError:
                        pass
                try:  # the per-record check knows the exact reason
                    decode_event(self.kind, value, limit)
                except Invalid as exc:
                    bad_rows.append(self._quarantine_row(topic, partition, records, i, exc))
            keep = kept
        arrays, suspects = validate_columns(self.fields, objs)
        rescued: list[dict[str, Any]] = []
        rescued_src: list[int] = []
        for j in sorted(suspects):
            try:
                rescued.append(check_record(self.fields, objs[j]))
                rescued_src.append(keep[j])
            except Invalid as exc:
                bad_rows.append(self._quarantine_row(topic, partition, records, keep[j], exc))
        good_src = [keep[j] for j in range(len(objs)) if j not in suspects] if suspects else keep
        if suspects:
            mask = pa.array([j not in suspects for j in range(len(objs))], pa.bool_())
            arrays = {k: v.filter(mask) for k, v in arrays.items()}
        parts = [self._valid_batch(topic, partition, arrays, records, good_src)]
        if rescued:
            cols = {f.name: pa.array([r[f.name] for r in rescued], f.arrow_type) for f in self.fields}
            parts.append(self._valid_batch(topic, partition, cols, records, rescued_src))
        if self.max_future_skew_ms is not None:
            sources = [good_src, rescued_src]
            for k, part in enumerate(parts):
                parts[k] = self._drop_future(topic, partition, part, records, sources[k], bad_rows)
        if bad_rows:
            parts.append(pa.RecordBatch.from_pylist(bad_rows, schema=self.schema))
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _parse_all(self, values: Sequence[bytes | None]) -> list[Any] | None:
        """Every value parsed, in one C-level pass: the common case. None if a value is missing, out
        of the size limit or not JSON: the caller then goes record by record."""
        if not values:
            return None
        if isinstance(values, Slices):  # their sizes are known without making them (-1: missing)
            if values.sizes.min() <= 0 or values.sizes.max() > self.max_event_bytes:
                return None
        elif None in values or min(map(len, cast("list[bytes]", values))) == 0 or max(
                map(len, cast("list[bytes]", values))) > self.max_event_bytes:
            return None
        try:
            return list(map(orjson.loads, cast("Sequence[bytes]", values)))
        except orjson.JSONDecodeError:
            return None

    def _valid_batch(
        self, topic: str, partition: int, arrays: dict[str, pa.Array], records: RecordColumns, rows: Sequence[int]
    ) -> pa.RecordBatch:
        """The bronze rows of ``arrays``, which hold records ``rows`` of ``records`` (indexes)."""
        n = len(rows)
        whole = n == len(records.offsets)  # every record (rows is then 0..n-1)
        offsets = records.offsets if whole else [records.offsets[i] for i in rows]
        stamps = records.timestamps if whole else [records.timestamps[i] for i in rows]
        extra = {
            ROUTE_COLUMN: pa.repeat(pa.scalar(self.table, pa.string()), n),
            "kafka_topic": pa.repeat(pa.scalar(topic, pa.string()), n),
            "kafka_partition": pa.repeat(pa.scalar(partition, pa.int32()), n),
            "kafka_offset": pa.array(offsets, pa.int64()),
            "kafka_ts_ms": pa.array(stamps, pa.int64()),
            "event_date": self.event_dates(arrays["ts_ms"]),
        }
        columns = []
        for f in self.schema:
            arr = extra.get(f.name)
            if arr is None:
                arr = arrays.get(f.name)
            columns.append(pa.nulls(n, f.type) if arr is None else arr)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _drop_future(
        self, topic: str, partition: int, batch: pa.RecordBatch, records: RecordColumns, rows: Sequence[int],
        bad_rows: list[dict[str, Any]],
    ) -> pa.RecordBatch:
        """``batch`` (records ``rows``) without the rows stamped beyond the skew bound; those become
        quarantine rows."""
        skew_ms = self.max_future_skew_ms
        assert skew_ms is not None  # only called with a bound
        kafka_ts = batch.column("kafka_ts_ms")
        ahead = pc.and_(pc.greater_equal(kafka_ts, 0), pc.greater(batch.column("ts_ms"), pc.add(kafka_ts, skew_ms)))
        if not pc.any(ahead).as_py():
            return batch
        for i in pc.indices_nonzero(ahead).to_pylist():
            detail = (f"ts_ms {batch.column('ts_ms')[i].as_py()} is more than stream.max_future_skew_s "
                      f"({skew_ms / 1000:g}s) ahead of its Kafka record's timestamp {records.timestamps[rows[i]]}")
            bad_rows.append(self._quarantine_row(topic, partition, records, rows[i], Invalid(FUTURE, detail)))
        return batch.filter(pc.invert(ahead))

    def event_dates(self, ts_ms: pa.Array) -> pa.Array:
        """UTC dates as YYYY-MM-DD strings, computed once per distinct day."""
        days = pc.divide(ts_ms, _DAY_MS)
        return pa.array([self.event_date(d * _DAY_MS) for d in days.to_pylist()], pa.string()) if len(days) < 64 else (
            pc.take(
                pa.array([self.event_date(d * _DAY_MS) for d in pc.unique(days).to_pylist()], pa.string()),
                pc.index_in(days, value_set=pc.unique(days)),
            )
        )

    def gap_row(self, topic: str, partition: int, first: int, when_ms: int, detail: str) -> pa.RecordBatch:
        """One quarantine row recording lost offsets (from ``first``; ``detail`` names them all)."""
        row = {
            ROUTE_COLUMN: "quarantine", "source_topic": topic, "source_partition": partition,
            "source_offset": first, "kafka_ts_ms": when_ms, "raw_key": None, "raw_value": None,
            "event_kind": self.kind, "reason": "data_loss", "detail": detail, "stage": "bronze",
        }
        return pa.RecordBatch.from_pylist([row], schema=self.schema)

    def _quarantine_row(self, topic: str, partition: int, records: RecordColumns, i: int, exc: Invalid) -> dict[str, Any]:
        return {
            ROUTE_COLUMN: "quarantine",
            "source_topic": topic,
            "source_partition": partition,
            "source_offset": records.offsets[i],
            "kafka_ts_ms": records.timestamps[i],
            "raw_key": records.keys[i],
            "raw_value": records.values[i],
            "event_kind": self.kind,
            "reason": exc.reason,
            "detail": exc.detail,
            "stage": "bronze",
        }
