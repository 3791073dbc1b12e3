"""Send results as columns, their processing order, and what the fault rules need of each.

Order (the tie-break): ``(ts_ms, kafka_partition, kafka_offset)``, then ``event_id``. Events are
keyed by broker name in Kafka, so one producer's results for one broker share a partition and their
offsets are the order in which the producer's hook wrote them: that reproduces the order of the
client's ``updateFaultItem`` calls for equal timestamps, which decides e.g. whether a 4.9 window
opened and was cut short in the same millisecond. ``event_id`` only breaks ties between records
that claim the same Kafka position (possible outside Kafka, e.g. in tests).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.faults.coded import Coded
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
    "fault_item_removed": "object",
    "fault_item_removed_ms": "object",
    "kafka_topic": "object",
    "kafka_partition": "int64",
    "kafka_offset": "int64",
    "kafka_ts_ms": "int64",
}
EVENT_COLUMNS = list(EVENT_SCHEMA)

GEN_NAMES = (GEN_49, GEN_5)  # generation codes: index into this tuple
GEN_CODE = {name: i for i, name in enumerate(GEN_NAMES)}
BAD_VERSION = -1
# The status of a row the fault step adds for a fault item a client removed by itself (an event's
# ``fault_item_removed``, see :func:`with_removals`): never on the wire (the contract refuses it).
REMOVAL = "FAULT_ITEM_REMOVED"
STATUS_CODE = {name: i for i, name in enumerate((*SEND_STATUSES, REMOVAL))}
FAILED = STATUS_CODE["FAILED"]
REMOVED = STATUS_CODE[REMOVAL]


def from_arrow_table(table: pa.Table | pa.RecordBatch) -> Cols:
    """Events from bronze-shaped Arrow data (extra columns are ignored)."""
    return from_arrow(table, EVENT_SCHEMA)


class Events(Mapping[str, np.ndarray]):
    """One batch of send results for the step, from Arrow (the readers' chunks) or from columns.

    From Arrow a column becomes numpy when the step first reads it, and only the rows it asks for
    when it asks for some (an event id is read only where an update can open a window); a string
    column's :class:`Coded` comes from its dictionary. As a mapping it is the events' columns
    (:data:`EVENT_SCHEMA`), as :func:`from_arrow_table` would give them.
    """

    def __init__(self, source: pa.Table | Cols) -> None:
        self._table = source if isinstance(source, pa.Table) else None
        self._cols: Cols = {} if isinstance(source, pa.Table) else dict(source)
        self._coded: dict[str, Coded] = {}
        self.num_rows = source.num_rows if isinstance(source, pa.Table) else nrows(source)
        # pyarrow builds this list anew on every access: kept, since membership is asked per column
        self._table_names = source.column_names if isinstance(source, pa.Table) else []

    def _names(self) -> list[str]:
        return list(self._cols) if self._table is None else self._table_names

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cols:
            if self._table is None or name not in self._table_names:
                raise KeyError(name)
            self._cols[name] = from_arrow(self._table.select([name]), {name: EVENT_SCHEMA[name]})[name]
        return self._cols[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def codes(self, name: str, rows: np.ndarray | None = None) -> Coded:
        """A string column as codes (of the rows at ``rows``, or all)."""
        coded = self._coded.get(name)
        if coded is None:
            if self._table is not None and name not in self._cols:
                coded = Coded.of_arrow(self._table.column(name))
            else:
                coded = Coded.of(self[name])
            self._coded[name] = coded
        return coded if rows is None else coded.take(rows)

    def at(self, name: str, rows: np.ndarray) -> np.ndarray:
        """A column's values at ``rows`` (positions)."""
        if name in self._cols or self._table is None:
            return self[name][rows]
        if name in self._coded:
            return self._coded[name].take(rows).values()
        part = pa.table({name: self._table.column(name).take(pa.array(rows, type=pa.int64()))})
        return from_arrow(part, {name: EVENT_SCHEMA[name]})[name]

    def flags(self, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A nullable boolean column at ``rows``: (where the event gives a value, the value there)."""
        if name in self._cols or self._table is None:
            values = self[name][rows]
            given = np.asarray([v is not None for v in values], dtype=bool) if len(values) else np.zeros(0, bool)
            value = np.zeros(len(values), dtype=bool)
            value[given] = np.asarray(values[given], dtype=bool)
            return given, value
        column = self._table.column(name)
        given = column.is_valid().to_numpy(zero_copy_only=False)
        value = column.fill_null(False).to_numpy(zero_copy_only=False).astype(bool, copy=False)
        return given[rows], value[rows]


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


def processing_order(events: Mapping[str, np.ndarray]) -> np.ndarray:
    """Positions of ``events`` sorted by (ts, kafka partition, kafka offset, event_id)."""
    return order_of(events["ts_ms"], events["kafka_partition"], events["kafka_offset"], lambda: events["event_id"])


def order_of(ts: np.ndarray, part: np.ndarray, off: np.ndarray, event_ids: Callable[[], np.ndarray]) -> np.ndarray:
    """:func:`processing_order` of these columns; ``event_ids`` is called only for a tie."""
    order = np.lexsort((off, part, ts))
    if len(order) > 1:
        s_ts, s_part, s_off = ts[order], part[order], off[order]
        same = (s_ts[1:] == s_ts[:-1]) & (s_part[1:] == s_part[:-1]) & (s_off[1:] == s_off[:-1])
        if same.any():  # rare: the same Kafka position twice; order those by event_id
            ids = np.asarray([str(x) for x in event_ids()])
            order = np.lexsort((ids, off, part, ts))
    return order


def generation_codes(versions: np.ndarray) -> np.ndarray:
    """Generation code per event; :data:`BAD_VERSION` where the version cannot be parsed."""
    return generations(Coded.of(versions))


def generations(versions: Coded) -> np.ndarray:
    return versions.table(_generation_code, np.int8)


def _generation_code(version: str | None) -> int:
    if version is None:
        return BAD_VERSION
    try:
        return GEN_CODE[generation_for_client_version(version)]
    except ValueError:
        return BAD_VERSION


def update_arguments(
    gen: np.ndarray, status: np.ndarray, error: np.ndarray, isolation: np.ndarray, reachable: np.ndarray,
    detector_enabled: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(isolation, reachable) passed to ``updateFaultItem`` per event, from :mod:`pipeline.rocketmq`.

    Computed once per distinct (generation, status, error) and spread back; an event's own
    ``isolation``/``reachable`` fields win, as in :func:`pipeline.rocketmq.update_args_for`.
    """
    if len(gen) == 0:
        return np.zeros(0, dtype=bool), np.ones(0, dtype=bool)
    failed_error = np.where(status == "FAILED", error, None)  # type: ignore[call-overload]  # numpy's stubs read a None value as the omitted argument
    iso, reach = rule_arguments(gen, Coded.of(status), Coded.of(failed_error), detector_enabled)
    cols = Events({"isolation": isolation, "reachable": reachable})
    rows = np.arange(len(gen))
    return given(iso, *cols.flags("isolation", rows)), given(reach, *cols.flags("reachable", rows))


def rule_arguments(gen: np.ndarray, status: Coded, failed_error: Coded, detector_enabled: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`update_arguments` by the rules alone (not the events' own fields); ``failed_error``:
    the error of a failed send, null otherwise."""
    n = len(gen)
    iso = np.zeros(n, dtype=bool)
    reach = np.ones(n, dtype=bool)
    if n == 0:
        return iso, reach
    s_codes, e_codes = status.codes, failed_error.codes
    n_errors = len(failed_error.words)
    combined = (gen.astype(np.int64) + 1) * (len(status.words) * (n_errors + 1)) + s_codes * (n_errors + 1) + (e_codes + 1)
    keys, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    looked = np.empty((len(keys), 2), dtype=bool)
    for k, i in enumerate(first.tolist()):
        g = int(gen[i])
        st: Any = status.words[s_codes[i]] if s_codes[i] >= 0 else None
        err = failed_error.words[e_codes[i]] if e_codes[i] >= 0 else None
        if g < 0 or st == REMOVAL:  # a removal: the item's end moves to its time (4.9), as a 0 ms window
            looked[k] = (False, True)
        else:
            looked[k] = update_args_for(GEN_NAMES[g], st, err, detector_enabled)
    iso[:] = looked[inverse, 0]
    reach[:] = looked[inverse, 1]
    return iso, reach


def with_removals(table: pa.Table) -> pa.Table:
    """``table``'s send results and, after them, one row per fault item a client removed by itself.

    A 4.9 client whose routed brokers are all unavailable falls back on ``pickOneAtLeast``; a picked
    broker without write queues (one that left the route) has its item removed, and no send shows
    it. The send hook puts that on the thread's next event (``fault_item_removed`` and
    ``fault_item_removed_ms``). The added row is that producer's update of the removed broker at that
    time with a window of 0 ms, which is what the removal does to the item's end: the broker is
    available from then on. Its status is :data:`REMOVAL`, so no count of sends (health, episodes)
    takes it. It keeps its event's Kafka position and gets the event id with ``/removed`` appended.
    Made before the rows are spread over the state keys (the removed broker may be another key's).
    A removal said to come after its own event is not one the hook writes: it is left out.
    """
    if "fault_item_removed" not in table.column_names or "fault_item_removed_ms" not in table.column_names:
        return table
    removed, at = table.column("fault_item_removed"), table.column("fault_item_removed_ms")
    if removed.null_count == len(removed):
        return table
    # a removal comes before the attempt whose event carries it; one said to come later is not modelled
    extra = table.filter(pc.and_(pc.is_valid(removed), pc.less_equal(at, table.column("ts_ms"))))
    if extra.num_rows == 0:
        return table
    n = extra.num_rows
    changed: dict[str, Any] = {
        "broker_name": extra.column("fault_item_removed"),
        "ts_ms": extra.column("fault_item_removed_ms"),
        "status": pa.array([REMOVAL] * n),
        "latency_ms": pa.array([0] * n, pa.int64()),
        "error": pa.nulls(n, pa.string()),
        "queue_offset": pa.nulls(n, pa.int64()),
        "isolation": pa.array([False] * n),
        "reachable": pa.nulls(n, pa.bool_()),
        "event_id": pc.binary_join_element_wise(pc.cast(extra.column("event_id"), pa.string()), "/removed", ""),
        "fault_item_removed": pa.nulls(n, pa.string()),
        "fault_item_removed_ms": pa.nulls(n, pa.int64()),
    }
    for name, values in changed.items():
        if name in extra.column_names:
            i = extra.column_names.index(name)
            field = extra.schema.field(i)
            if pa.types.is_null(field.type):  # a column without a value in this batch
                extra = extra.set_column(i, field.with_type(values.type), values)
            else:
                extra = extra.set_column(i, field, pc.cast(values, field.type))
    return pa.concat_tables([table, extra], promote_options="default").combine_chunks()


def given(derived: np.ndarray, present: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``derived`` where the event says nothing, the event's own ``value`` where it is ``present``."""
    return np.where(present, value, derived)


def fault_enabled(values: np.ndarray, default: bool) -> np.ndarray:
    """Each event's ``send_latency_fault_enable``, the configured fleet default where it is null."""
    flags = Events({"send_latency_fault_enable": values}).flags("send_latency_fault_enable", np.arange(len(values)))
    return given(np.full(len(values), default, dtype=bool), *flags)


def status_codes(status: np.ndarray) -> np.ndarray:
    return statuses(Coded.of(status))


def statuses(status: Coded) -> np.ndarray:
    return status.table(lambda s: STATUS_CODE.get(s, -1), np.int8)


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
    return Coded.of(errors).map(error_class).values()


def reencode(events: Mapping[str, np.ndarray], rows: Iterable[int]) -> list[bytes]:
    """The JSON of each event, as the send hook would have written it (for quarantine rows)."""
    cols = {name: events[name] for name in SendResult.__dataclass_fields__ if name in events}  # once, not per row
    return [SendResult(**{name: _plain(col[i], name in _INT_FIELDS) for name, col in cols.items()}).to_json()
            for i in rows]


# Read from Arrow, a nullable integer column arrives as floats (NaN for null): re-encoded as integers.
_INT_FIELDS = frozenset(name for name, f in SendResult.__dataclass_fields__.items() if str(f.type).startswith("int"))


def _plain(value: Any, integer: bool = False) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if integer and isinstance(value, float):
        return None if math.isnan(value) else int(value)
    return value


def event_count(events: Cols) -> int:
    return nrows(events)
