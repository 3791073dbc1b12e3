"""streaming.kafka_records against kafka-python's own unpacking, on record batches kafka-python builds.

Both loops run over the same bytes; every ConsumerRecord field, the position (next fetch offset)
after every partial take, the metrics counters and the errors on corrupt input must be equal.
"""

from __future__ import annotations

import struct

import pytest
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record import MemoryRecords
from kafka.record._crc32c import crc as crc32c
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.structs import TopicPartition

from streaming.kafka_batches import unpack_plain
from streaming.kafka_records import (
    ColumnarPartitionRecords,
    FastPartitionRecords,
    RecordColumns,
    install,
    read_until,
    unpack_v2,
)

TP = TopicPartition("t", 3)
TS = 1_767_225_600_000
ATTRIBUTES_AT = 21  # v2 batch header: base offset 8, length 4, leader epoch 4, magic 1, crc 4


def _batch(magic: int = 2, compression: int = 0, start: int = 0, n: int = 50, *, records=None, gap: int = 0) -> bytes:
    """A closed batch of ``n`` records (or ``records``: (ts, key, value, headers) tuples)."""
    b = MemoryRecordsBuilder(magic, compression, 1 << 20, offset=start)
    rows = records if records is not None else [
        (TS + 37 * i, f"broker-{i % 7}".encode(), b'{"event_id": "e%d", "pad": "%s"}' % (i, b"x" * (i * 13 % 700)), [])
        for i in range(n)
    ]
    for i, (ts, key, value, headers) in enumerate(rows):
        if gap and i and i % 5 == 0:
            b.skip(gap)  # offsets removed by compaction
        assert b.append(ts, key, value, headers) is not None
    b.close()
    return bytes(b.buffer())


def _with_attributes(batch: bytes, set_bits: int) -> bytes:
    """``batch`` (v2) with attribute bits set and its CRC recomputed, as a broker would write it."""
    out = bytearray(batch)
    (attrs,) = struct.unpack_from(">h", out, ATTRIBUTES_AT)
    struct.pack_into(">h", out, ATTRIBUTES_AT, attrs | set_bits)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[ATTRIBUTES_AT:])))
    return bytes(out)


def _take_all(cls: type, data: bytes, fetch_offset: int = 0, step: int | None = None, **kw):
    """Every record ``cls`` yields, in takes of ``step``; with the position after each take."""
    parts = cls(fetch_offset, TP, MemoryRecords(data), **kw)
    out, positions = [], []
    while parts:  # false once drained
        got = parts.take(step)
        out.extend(got)
        positions.append(parts.next_fetch_offset)
    positions.append(parts.next_fetch_offset)
    return out, positions, (parts.records_read, parts.bytes_read)


def _same(data: bytes, fetch_offset: int = 0, step: int | None = None, **kw) -> list:
    stock = _take_all(Fetcher.PartitionRecords, data, fetch_offset, step, **kw)
    fast = _take_all(FastPartitionRecords, data, fetch_offset, step, **kw)
    assert fast == stock
    assert [type(r) for r in fast[0]] == [type(r) for r in stock[0]]
    # The columnar form: the same records as columns (its takes count record batches, not records),
    # the same final position and counters.
    batches, positions, counters = _take_all(ColumnarPartitionRecords, data, fetch_offset, step, **kw)
    cols = RecordColumns.joined(batches) if batches else RecordColumns()
    assert all(type(b) is RecordColumns and len(b) for b in batches)
    assert (positions[-1], counters) == (stock[1][-1], stock[2])
    assert list(zip(cols.offsets, cols.timestamps, cols.keys, cols.values)) == [
        (r.offset, r.timestamp, r.key, r.value) for r in stock[0]]
    assert [([], -1) if h is None else h for h in cols.headers] == [
        (r.headers, r.serialized_header_size if r.headers else -1) for r in stock[0]]
    return stock[0]


@pytest.mark.parametrize("step", [None, 1, 7, 50])
def test_plain_batches_equal_kafka_python_at_every_take(step):
    data = _batch(start=0) + _batch(start=50, n=30) + _batch(start=80, n=1)
    records = _same(data, step=step)
    assert [r.offset for r in records] == list(range(81))


def test_fetch_offset_inside_a_batch_and_compacted_gaps():
    data = _batch(start=100, n=40, gap=3) + _batch(start=200, n=10)
    records = _same(data, fetch_offset=107, step=4)
    assert records[0].offset >= 107 and len({r.offset for r in records}) == len(records)


def test_headers_null_keys_null_values_and_long_varints():
    rows = [
        (TS, None, b"v", []),
        (TS + 1, b"k", None, []),
        (TS + 2, b"", b"", [("h", b"1")]),
        (TS + 300_000, b"k" * 200, b"v" * 70_000, [("trace-id", b"abc"), ("empty", None), ("ütf", b"")]),
        (TS - 5, b"k", b"v", []),  # a negative timestamp delta
    ]
    records = _same(_batch(records=rows, start=5))
    assert records[3].headers == [("trace-id", b"abc"), ("empty", None), ("ütf", b"")]
    assert records[3].serialized_header_size == len("trace-id") + 3 + len("empty") + len("ütf".encode())
    assert records[0].key is None and records[1].value is None and records[4].timestamp == TS - 5


@pytest.mark.parametrize("codec", [1, 4])  # gzip, zstd: what this environment has
def test_compressed_batches(codec):
    _same(_batch(compression=codec) + _batch(compression=codec, start=50), step=9)


def test_control_and_log_append_time_batches():
    control = _with_attributes(_batch(start=10, n=1, records=[(TS, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00", [])]), 0x20)
    log_append = _with_attributes(_batch(start=11, n=5), 0x08)
    records = _same(_batch(n=10) + control + log_append, step=3)
    assert [r.offset for r in records] == [*range(10), *range(11, 16)]
    assert {r.timestamp_type for r in records[10:]} == {1}


def test_legacy_batches_go_through_kafka_pythons_loop():
    _same(_batch(magic=1, n=20) + _batch(magic=0, start=20, n=5) + _batch(start=25, n=5), step=6)


def test_corrupt_input_fails_like_kafka_python():
    good = _batch(n=20)
    flipped = bytearray(good)
    flipped[-10] ^= 0xFF  # a payload byte: the batch CRC no longer matches
    for cls in (Fetcher.PartitionRecords, FastPartitionRecords, ColumnarPartitionRecords):
        with pytest.raises(CorruptRecordError, match="crc"):
            cls(0, TP, MemoryRecords(bytes(flipped))).take()
    # The CRC right but a record's length wrong: both reject the structure.
    bad = bytearray(good)
    bad[61] += 2  # the first record's length varint (the header is 61 bytes): one byte longer
    struct.pack_into(">I", bad, 17, crc32c(bytes(bad[ATTRIBUTES_AT:])))
    for cls in (Fetcher.PartitionRecords, FastPartitionRecords, ColumnarPartitionRecords):
        with pytest.raises(CorruptRecordError):
            cls(0, TP, MemoryRecords(bytes(bad))).take()


def test_a_header_key_that_is_not_utf8_is_a_corrupt_record_for_both():
    data = bytearray(_batch(records=[(TS, b"k", b"v", [("hk", b"x")])]))
    at = bytes(data).index(b"hk")
    data[at] = 0xFF  # the key's first byte: no longer UTF-8
    struct.pack_into(">I", data, 17, crc32c(bytes(data[ATTRIBUTES_AT:])))
    for cls in (Fetcher.PartitionRecords, FastPartitionRecords, ColumnarPartitionRecords):
        with pytest.raises(CorruptRecordError, match="invalid record structure"):
            cls(0, TP, MemoryRecords(bytes(data))).take()


def test_a_truncated_last_batch_is_left_for_the_next_fetch():
    data = _batch(n=10) + _batch(start=10, n=10)[:-7]
    records = _same(data)
    assert [r.offset for r in records] == list(range(10))


def test_install_leaves_an_object_without_a_fetcher_alone():
    assert install(object()) is False


def test_columns_cut_at_offsets_and_join():
    cols = RecordColumns.joined(_take_all(ColumnarPartitionRecords, _batch(n=10) + _batch(start=10, n=5), 0)[0])
    assert cols.offsets == list(range(15))
    assert cols.before(12).offsets == list(range(12)) and cols.before(99) is cols
    assert cols.from_offset(3).offsets == list(range(3, 15)) and cols.from_offset(0) is cols
    assert list(cols.before(12).values) == list(cols.values)[:12] and len(cols.from_offset(14)) == 1


def _batches(data: bytes) -> list:
    records, out = MemoryRecords(data), []
    while (batch := records.next_batch()) is not None:
        batch._maybe_uncompress()
        out.append(batch)
    return out


def _unpacked_one_by_one(batches: list) -> tuple:
    cols = RecordColumns.joined([unpack_v2(b)[0] for b in batches])
    return cols.offsets, cols.timestamps, cols.keys, cols.values, cols.sizes


def _listed(columns: tuple) -> tuple:
    """unpack_plain's columns with keys and values made (they are Slices)."""
    offsets, timestamps, keys, values, sizes = columns
    return offsets, timestamps, list(keys), list(values), sizes


@pytest.mark.parametrize("codec", [0, 4])
def test_plain_batches_are_unpacked_together_as_one_by_one(codec):
    rows = [
        (TS, None, b"v", []),
        (TS + 1, b"k", None, []),
        (TS + 2, b"", b"", []),
        (TS + 300_000, b"k" * 200, b"v" * 70_000, []),  # three-byte lengths
        (TS - 5, b"k", b"v", []),  # a negative timestamp delta
    ]
    batches = _batches(_batch(compression=codec) + _batch(records=rows, start=50, gap=2) + _batch(start=60, n=3))
    columns, n = unpack_plain(batches)
    assert n == 3
    assert _listed(columns) == _unpacked_one_by_one(batches)
    keys, values = columns[2], columns[3]
    assert [values[i] for i in range(len(values))] == list(values) and values[-1] == values[len(values) - 1]
    assert list(values[3:7]) == list(values)[3:7] and list(keys[::-1]) == list(keys)[::-1]


def test_a_batch_that_is_not_plain_ends_the_run():
    headers = _batch(start=50, records=[(TS, b"k", b"v", [("h", b"1")])])
    data = _batch() + headers + _batch(start=51)
    batches = _batches(data)
    columns, n = unpack_plain(batches)
    assert n == 1 and _listed(columns) == _unpacked_one_by_one(batches[:1])
    assert unpack_plain(batches[1:])[1] == 0
    _same(data, step=2)


@pytest.mark.parametrize("at", [0, 4, 13])  # in the first record: its length, key size, value size
def test_a_corrupt_record_in_a_later_batch_fails_after_the_earlier_records(at):
    first = _batch(n=20)
    bad = bytearray(_batch(start=20, n=5))
    bad[61 + at] = 0x7F if at else bad[61] + 2  # (the header is 61 bytes; 0x7F: a size of -64)
    struct.pack_into(">I", bad, 17, crc32c(bytes(bad[ATTRIBUTES_AT:])))
    data = first + bytes(bad) + _batch(start=25, n=5)
    got = {}
    for cls in (Fetcher.PartitionRecords, ColumnarPartitionRecords):
        parts = cls(0, TP, MemoryRecords(data))
        records = parts.take()
        with pytest.raises(CorruptRecordError) as err:
            parts.take()
        offsets = RecordColumns.joined(records).offsets if cls is ColumnarPartitionRecords else [
            r.offset for r in records]
        got[cls] = (offsets, str(err.value))
    assert got[ColumnarPartitionRecords] == got[Fetcher.PartitionRecords]
    assert got[Fetcher.PartitionRecords][0][:20] == list(range(20))


@pytest.mark.parametrize("odd", [None, b"", b"{", b'{"event_id": 1}'])
def test_a_fetch_decodes_the_same_from_slices_as_from_lists(odd):
    from schemas.events import SendResult
    from streaming.decode import BatchDecoder
    from streaming.kafka_source import output_tables

    good = SendResult(event_id="e", ts_ms=TS, cluster="c1", producer_group="PG", client_id="10.0.0.1@1",
                      client_version="4.9.8", topic="T", broker_name="b", queue_id=3, status="SEND_OK",
                      latency_ms=1, error=None, queue_offset=41, attempt=0).to_json()
    rows = [(TS, b"b", good, []), (TS, None, odd, []), (TS, b"b", good, [])]
    batches = _batches(_batch(records=rows) + _batch(start=3, records=rows[::2]))
    columns, n = unpack_plain(batches)
    lazy = RecordColumns()
    lazy.offsets, lazy.timestamps, lazy.keys, lazy.values, lazy.sizes = columns
    lazy.headers = [None] * len(lazy.offsets)
    listed = RecordColumns.joined([unpack_v2(b)[0] for b in batches])
    decoder = BatchDecoder("send_result", output_tables(["send_result"]), 65_536)
    assert n == 2 and decoder.decode("t", 0, lazy).equals(decoder.decode("t", 0, listed))
    assert decoder.decode("t", 0, lazy.before(2)).equals(decoder.decode("t", 0, listed.before(2)))


def _stored(start: int, n: int) -> bytes:
    """A batch as a broker stores it: the base offset in its header (a producer's batches, as
    ``_batch`` builds them, say 0 and carry the offsets in the records' deltas)."""
    return struct.pack(">q", start) + _batch(n=n)[8:]  # (the CRC does not cover the base offset)


@pytest.mark.parametrize("cls", [FastPartitionRecords, ColumnarPartitionRecords])
@pytest.mark.parametrize(("stop", "last", "position"), [(60, 79, 80), (50, 49, 50), (81, 80, 81), (500, 80, 81)])
def test_a_stop_offset_leaves_the_batches_past_it_packed(cls, stop, last, position):
    data = _stored(0, 50) + _stored(50, 30) + _stored(80, 1)
    stopping = type(cls.__name__, (cls,), {"stop_offsets": {TP: stop, TopicPartition("t", 4): 1}})
    got, positions, (records_read, _) = _take_all(stopping, data, fetch_offset=3, step=2)
    offsets = RecordColumns.joined(got).offsets if cls is ColumnarPartitionRecords else [r.offset for r in got]
    assert offsets == list(range(3, last + 1))  # the batch holding stop - 1 whole, none after it
    assert positions[-1] == position and records_read == last + 1


def test_read_until_sets_one_consumers_stops_only():
    class Consumer:  # install needs only the fetcher attribute kafka-python's consumer has
        def __init__(self) -> None:
            self._fetcher = type("F", (), {})()

    a, b = Consumer(), Consumer()
    assert install(a, columns=True) and install(b)
    read_until(a, TP, 70)
    assert a._fetcher.PartitionRecords.stop_offsets == {TP: 70} and b._fetcher.PartitionRecords.stop_offsets == {}
    assert issubclass(a._fetcher.PartitionRecords, ColumnarPartitionRecords)
    assert FastPartitionRecords.stop_offsets == {}
    read_until(a, TP, 90)  # the next range of the partition
    assert a._fetcher.PartitionRecords.stop_offsets == {TP: 90}
    read_until(object(), TP, 5)  # a consumer install left alone: nothing to do
