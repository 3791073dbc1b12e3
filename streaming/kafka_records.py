"""Faster unpacking of fetched record batches for kafka-python's consumer.

kafka-python turns every fetched record into a ``ConsumerRecord`` through several layers of Python
(a call per varint, a ``DefaultRecord`` object, two copies of key and value): most of a bronze read
task's time (docs/performance.md). :class:`FastPartitionRecords` replaces only that per-record part
for message format v2 (every Kafka since 0.11): one flat loop per batch that reads the varints
inline and yields the very same ``ConsumerRecord`` tuples. :class:`ColumnarPartitionRecords` goes
further for the Kafka source's tasks, which read only offsets, timestamps, keys and values: it fills
:class:`RecordColumns`, unpacking a fetch's plain batches together with numpy
(:mod:`streaming.kafka_batches`) and any other batch with the same loop (:func:`unpack_v2`).
Everything around it stays kafka-python's (fetch protocol, positions, CRC checks, decompression,
control batches, aborted transactions, which it decides with its own bookkeeping); legacy batches
(magic 0 and 1) and consumers with deserializers take kafka-python's own loop unchanged.

:func:`install` puts it into one consumer. It leans on kafka-python internals (``Fetcher`` and
its ``PartitionRecords``, ``DefaultRecordBatch``'s header fields), so it checks them first and
leaves the consumer as it is if they are not there (pyproject pins kafka-python below 3.1).
:func:`read_until` stops the unpacking at a range's end: a fetch response holds up to 16 MiB.
``tests/unit/test_kafka_records.py`` holds both forms equal to kafka-python's loop on batches with
headers, null keys and values, compression, control batches, log-append time and corrupt bytes.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import kafka.errors as Errors
from kafka.consumer.fetcher import ConsumerRecord, Fetcher
from kafka.record.default_records import DefaultRecordBatch

from streaming.kafka_batches import unpack_plain
from streaming.kafka_batches import uvarint as _uvarint

log = logging.getLogger(__name__)

_new = tuple.__new__
_REQUIRED = ("_buffer", "_pos", "_header_data", "_maybe_uncompress", "validate_crc", "is_control_batch")
# kafka-python's PartitionRecords helpers for read_committed; without them such consumers take its own loop.
_TRANSACTION_HELPERS = ("_consume_aborted_transactions_up_to", "_contains_abort_marker", "_is_batch_aborted",
                        "aborted_producer_ids")


class FastPartitionRecords(Fetcher.PartitionRecords):
    """``Fetcher.PartitionRecords`` whose v2 batches are unpacked by :func:`_unpack_v2`.

    ``stop_offsets`` (per consumer: :func:`install` gives each its own subclass, :func:`read_until`
    fills it) ends a partition's unpacking at the first batch that starts at or past the offset: a
    reader of a short range then unpacks the batches it reads, not the whole fetch response."""

    stop_offsets: Mapping[Any, int] = MappingProxyType({})

    def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any) -> Iterator[Any]:
        committed_only = self.isolation_level != 0
        if key_deserializer is not None or value_deserializer is not None or (committed_only and not all(
            hasattr(self, name) for name in _TRANSACTION_HELPERS
        )):
            yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
            return
        try:
            batch = records.next_batch()
            last_batch = None
            stop = self.stop_offsets.get(tp)
            while batch is not None:
                if stop is not None and batch.base_offset >= stop:  # this batch and the rest: not wanted
                    yield from self._flush()
                    self.next_fetch_offset = batch.base_offset
                    self.drain()
                    return
                last_batch = batch
                if self.check_crcs and not batch.validate_crc():
                    raise Errors.CorruptRecordError(
                        f"Record batch for partition {tp} at offset {batch.base_offset} failed crc check"
                    )
                if batch.magic != 2:
                    yield from self._flush()
                    yield from self._unpack_legacy(tp, batch)
                # (_aborted first: an abort marker, itself a control batch, updates the bookkeeping)
                elif (committed_only and batch.has_producer_id() and self._aborted(batch)) or batch.is_control_batch:
                    yield from self._flush()
                    self.leader_epoch = batch.leader_epoch
                    self.next_fetch_offset = batch.next_offset
                else:
                    self.leader_epoch = batch.leader_epoch
                    yield from self._unpack_v2(tp, batch)
                batch = records.next_batch()
            yield from self._flush()
            # Format v2 keeps a batch's last offset even when compaction removed its last record.
            if last_batch is not None and last_batch.magic == 2:
                self.next_fetch_offset = last_batch.next_offset
            self.drain()
        except StopIteration:  # as kafka-python: a StopIteration must not end the generator silently
            raise RuntimeError("StopIteration raised unpacking messageset") from None
        except Exception:  # the records before the fault first, as kafka-python hands them out
            yield from self._flush()
            raise

    def _aborted(self, batch: DefaultRecordBatch) -> bool:
        """Whether a transactional batch belongs to an aborted transaction (read_committed), as
        kafka-python decides it: its own bookkeeping of the fetch's aborted transactions."""
        self._consume_aborted_transactions_up_to(batch.last_offset)
        if self._contains_abort_marker(batch):
            self.aborted_producer_ids.discard(batch.producer_id)
            return False  # a control batch: skipped as such
        return bool(self._is_batch_aborted(batch))

    def _flush(self) -> Iterator[Any]:
        """The records ``_unpack_v2`` held back (here: none)."""
        return iter(())

    def _unpack_legacy(self, tp: Any, batch: Any) -> Iterator[Any]:
        """Magic 0/1 batches, record by record as kafka-python unpacks them."""
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise Errors.CorruptRecordError(f"Record for partition {tp} at offset {record.offset} failed crc check")
            key, value = record.key, record.value
            self.records_read += 1
            self.bytes_read += record.size_in_bytes
            self.next_fetch_offset = record.offset + 1
            yield ConsumerRecord(
                tp.topic, tp.partition, self.leader_epoch, record.offset, record.timestamp, record.timestamp_type,
                key, value, record.headers, record.checksum,
                len(key) if key is not None else -1, len(value) if value is not None else -1, -1,
            )

    def _unpack_v2(self, tp: Any, batch: DefaultRecordBatch) -> Iterator[Any]:
        """One v2 batch's records, as ``DefaultRecordBatch._read_msg`` and the fetcher would build them."""
        cols, error = unpack_v2(batch)
        topic, partition, epoch, ts_type = tp.topic, tp.partition, batch._header_data[2], batch.timestamp_type
        no_headers: list[tuple[str, bytes | None]] = []
        for offset, timestamp, key, value, headers, size in zip(
            cols.offsets, cols.timestamps, cols.keys, cols.values, cols.headers, cols.sizes
        ):
            self.records_read += 1
            self.bytes_read += size
            self.next_fetch_offset = offset + 1
            yield _new(ConsumerRecord, (
                topic, partition, epoch, offset, timestamp, ts_type, key, value,
                no_headers if headers is None else headers[0], None,
                len(key) if key is not None else -1, len(value) if value is not None else -1,
                -1 if headers is None else headers[1],
            ))
        if error is not None:
            raise error


class RecordColumns:
    """Records as parallel columns (what :class:`ColumnarPartitionRecords` yields).

    ``keys`` and ``values`` are lists, or :class:`~streaming.kafka_batches.Slices` that make each
    one when asked for; ``headers`` holds None for a record without headers, else (list of (key,
    value), their size); ``sizes`` each record's size in bytes. ``offset`` is the first offset:
    kafka-python's fetcher reads it to skip records before its fetch offset, which the columns
    never hold.
    """

    __slots__ = ("headers", "keys", "offsets", "sizes", "timestamps", "values")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: Sequence[bytes | None] = []
        self.values: Sequence[bytes | None] = []
        self.headers: list[tuple[list[tuple[str, bytes | None]], int] | None] = []
        self.sizes: list[int] = []

    @property
    def offset(self) -> int:
        return self.offsets[0]

    def __len__(self) -> int:
        return len(self.offsets)

    def from_offset(self, first: int) -> RecordColumns:
        """These columns without the records before offset ``first``."""
        if not self.offsets or self.offsets[0] >= first:
            return self
        return self._sliced(bisect.bisect_left(self.offsets, first), len(self.offsets))

    def before(self, end: int) -> RecordColumns:
        """These columns without the records at or after offset ``end``."""
        if not self.offsets or self.offsets[-1] < end:
            return self
        return self._sliced(0, bisect.bisect_left(self.offsets, end))

    def _sliced(self, lo: int, hi: int) -> RecordColumns:
        out = RecordColumns()
        for name in RecordColumns.__slots__:
            setattr(out, name, getattr(self, name)[lo:hi])
        return out

    @classmethod
    def joined(cls, parts: list[RecordColumns]) -> RecordColumns:
        """One set of columns holding ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        out = cls()
        for name in cls.__slots__:
            column = getattr(out, name)
            for part in parts:
                column.extend(getattr(part, name))
        return out

    @classmethod
    def of(cls, records: Iterable[Any]) -> RecordColumns:
        """Columns of records that have ``offset``, ``timestamp``, ``key`` and ``value`` (tests, tools)."""
        out = cls()
        rows = list(records)
        out.offsets = [r.offset for r in rows]
        out.timestamps = [r.timestamp for r in rows]
        out.keys = [r.key for r in rows]
        out.values = [r.value for r in rows]
        out.headers = [None] * len(rows)
        out.sizes = [0] * len(rows)
        return out


def unpack_v2(batch: DefaultRecordBatch) -> tuple[RecordColumns, Exception | None]:
    """A v2 batch's records as columns, and the error that stopped the unpacking (None: all read).

    The records before a corrupt one are kept, so a caller can hand them out before raising, as
    kafka-python does.
    """
    cols = RecordColumns()
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    cols.keys, cols.values = keys, values
    offsets, timestamps, all_headers, sizes = cols.offsets, cols.timestamps, cols.headers, cols.sizes
    batch._maybe_uncompress()
    buf = bytes(batch._buffer)  # one copy, so every key and value below is a single slice
    size = len(buf)
    pos = batch._pos
    header = batch._header_data
    base, first_ts, max_ts, count = header[0], header[7], header[8], header[12]
    log_append = batch.timestamp_type
    uvarint = _uvarint
    try:
        for _ in range(count):
            record_start = pos
            # Each field is a zigzag varint of one or two bytes as a rule, read here without a call.
            # The repeated blocks are deliberate: with a call per two-byte varint, unpacking took
            # 2.8-3.3 us per record against 2.4-2.9 us (1 KB JSON values, 1,000 per batch).
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            length = (v >> 1) ^ -(v & 1)
            payload_start, end = pos, pos + length
            if end > size:
                raise Errors.CorruptRecordError(f"record at byte {record_start} runs past its batch")
            pos += 1  # attributes: unused
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            timestamp = max_ts if log_append else first_ts + ((v >> 1) ^ -(v & 1))
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            offset = base + ((v >> 1) ^ -(v & 1))
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            key_size = (v >> 1) ^ -(v & 1)
            if key_size >= 0:
                key = buf[pos : pos + key_size]
                pos += key_size
            else:
                key = None
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            value_size = (v >> 1) ^ -(v & 1)
            if value_size >= 0:
                value = buf[pos : pos + value_size]
                pos += value_size
            else:
                value = None
            if buf[pos] == 0:  # no headers: the common case
                pos += 1
                headers = None
            else:
                found, header_size, pos = _headers(buf, pos)
                headers = (found, header_size)
            if pos != end:
                raise Errors.CorruptRecordError(
                    f"Invalid record size: expected to read {length} bytes in record payload, "
                    f"but instead read {pos - payload_start}"
                )
            offsets.append(offset)
            timestamps.append(timestamp)
            keys.append(key)
            values.append(value)
            all_headers.append(headers)
            sizes.append(length)
    except (ValueError, IndexError) as exc:  # e.g. bytes missing, a header key that is not UTF-8
        return cols, Errors.CorruptRecordError(f"Found invalid record structure: {exc!r}")
    except Errors.CorruptRecordError as exc:
        return cols, exc
    if pos != size:
        return cols, Errors.CorruptRecordError(f"{size - pos} unconsumed bytes after all records consumed")
    return cols, None


class ColumnarPartitionRecords(FastPartitionRecords):
    """Yields :class:`RecordColumns` instead of a ``ConsumerRecord`` per record: a poll's
    ``max_records`` then counts pieces of columns. For readers that want columns (the Kafka
    source's tasks). Consecutive plain v2 batches are held back and unpacked together by
    :func:`streaming.kafka_batches.unpack_plain` (the others by :func:`unpack_v2`); legacy and
    control batches are handled as by :class:`FastPartitionRecords`, legacy records as one-record
    columns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: list[DefaultRecordBatch] = []

    def _unpack_legacy(self, tp: Any, batch: Any) -> Iterator[Any]:
        for record in super()._unpack_legacy(tp, batch):
            cols = RecordColumns()
            cols.offsets.append(record.offset)
            cols.timestamps.append(record.timestamp)
            cols.keys = [record.key]
            cols.values = [record.value]
            cols.headers.append((record.headers, record.serialized_header_size) if record.headers else None)
            cols.sizes.append(0)
            yield cols

    def _unpack_v2(self, tp: Any, batch: DefaultRecordBatch) -> Iterator[Any]:
        batch._maybe_uncompress()
        self._held.append(batch)
        yield from ()

    def _flush(self) -> Iterator[Any]:
        held, self._held = self._held, []
        while held:
            columns, n = unpack_plain(held)
            if n:
                cols = RecordColumns()
                cols.offsets, cols.timestamps, cols.keys, cols.values, cols.sizes = columns
                cols.headers = [None] * len(cols.offsets)
                self.leader_epoch = held[n - 1].leader_epoch
                yield from self._handed_out(cols)
                del held[:n]
            if held:  # not plain: read exactly, faults named
                batch = held.pop(0)
                self.leader_epoch = batch.leader_epoch
                cols, error = unpack_v2(batch)
                yield from self._handed_out(cols)
                if error is not None:
                    raise error

    def _handed_out(self, cols: RecordColumns) -> Iterator[RecordColumns]:
        """``cols`` counted and past, without the records before the fetch offset."""
        if cols.offsets:
            self.records_read += len(cols.offsets)  # counted before the skip, as kafka-python counts
            self.bytes_read += sum(cols.sizes)
            self.next_fetch_offset = cols.offsets[-1] + 1
            cols = cols.from_offset(self.fetch_offset)
            if cols.offsets:
                yield cols


def _headers(buf: bytes, pos: int) -> tuple[list[tuple[str, bytes | None]], int, int]:
    """A record's headers at ``pos``: (list of (key, value), their serialized size, next position)."""
    v, pos = _uvarint(buf, pos)
    count = (v >> 1) ^ -(v & 1)
    if count < 0:
        raise Errors.CorruptRecordError(f"Found invalid number of record headers {count}")
    headers = []
    size = 0
    for _ in range(count):
        v, pos = _uvarint(buf, pos)
        key_len = (v >> 1) ^ -(v & 1)
        if key_len < 0:
            raise Errors.CorruptRecordError(f"Invalid negative header key size {key_len}")
        key = buf[pos : pos + key_len].decode("utf-8")
        pos += key_len
        v, pos = _uvarint(buf, pos)
        value_len = (v >> 1) ^ -(v & 1)
        if value_len >= 0:
            value: bytes | None = buf[pos : pos + value_len]
            pos += value_len
        else:
            value = None
        headers.append((key, value))
        size += len(key.encode("utf-8")) + (len(value) if value is not None else 0)
    return headers, (size if headers else -1), pos


def install(consumer: Any, columns: bool = False) -> bool:
    """Unpack ``consumer``'s fetched v2 batches with :class:`FastPartitionRecords` (with ``columns``,
    :class:`ColumnarPartitionRecords`: its polls return :class:`RecordColumns`); False if
    kafka-python's internals are not the expected ones (the consumer is then left as it was)."""
    fetcher = getattr(consumer, "_fetcher", None)
    stock = getattr(Fetcher, "PartitionRecords", None)
    if fetcher is None or stock is None or not hasattr(stock, "_unpack_records") or not all(
        hasattr(DefaultRecordBatch, name) or name in DefaultRecordBatch.__slots__ for name in _REQUIRED
    ):
        log.warning("kafka-python internals changed: fetched records are unpacked by kafka-python itself (slower)")
        return False
    base = ColumnarPartitionRecords if columns else FastPartitionRecords
    fetcher.PartitionRecords = type(base.__name__, (base,), {"stop_offsets": {}})  # this consumer's own stops
    return True


def track_stable_offsets(consumer: Any) -> dict[Any, int] | None:
    """A dict that ``consumer``'s fetch responses keep filled with each partition's last stable
    offset (the end of what read_committed may read, as the high watermark is for everything);
    None if kafka-python's fetcher is not the expected one."""
    fetcher = getattr(consumer, "_fetcher", None)
    parse = getattr(fetcher, "_parse_fetched_data", None)
    if fetcher is None or parse is None:
        return None
    stable: dict[Any, int] = {}

    def parse_noting_stable_offset(completed_fetch: Any) -> Any:
        lso = getattr(completed_fetch.partition_data, "last_stable_offset", -1)
        if lso is not None and lso >= 0:
            stable[completed_fetch.topic_partition] = int(lso)
        return parse(completed_fetch)

    fetcher._parse_fetched_data = parse_noting_stable_offset
    return stable


def read_until(consumer: Any, tp: Any, offset: int) -> None:
    """Unpack ``consumer``'s fetches of ``tp`` only up to the batch holding ``offset - 1``. A no-op
    for a consumer :func:`install` left as it was."""
    stops = getattr(getattr(consumer, "_fetcher", None), "PartitionRecords", FastPartitionRecords).stop_offsets
    if isinstance(stops, dict):
        stops[tp] = offset
