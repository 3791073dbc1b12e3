"""Many v2 record batches unpacked at once: a short Python loop, numpy for every field.

A fetch brings tens of batches of a few dozen records each. :func:`streaming.kafka_records.unpack_v2`
reads them record by record in Python; here a loop only hops from record to record by their
lengths, and numpy reads the other fields (timestamp and offset deltas, key and value sizes) of
every record of every batch together. Only what is plainly well formed is read so: varints of up
to five bytes, no headers, each record ending where its length says. Any other batch is left to
``unpack_v2``, which reads it exactly and names its faults.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import kafka.errors as Errors
import numpy as np

_PAD = bytes(8)  # a varint read at a record's end may look up to 5 bytes further
_LIMIT = 1 << 62  # batch base offsets and timestamps beyond this are left to unpack_v2 (no int64 overflow)



class Slices(Sequence[bytes | None]):
    """``buf[start:start + size]`` for each record, made only when asked for (None where the size
    is -1): a fetch's values are parsed one by one as they are made, so their bytes are freed and
    reused right away, and its keys are rarely wanted at all."""

    __slots__ = ("_buf", "_starts", "sizes")

    def __init__(self, buf: bytes, starts: np.ndarray, sizes: np.ndarray) -> None:
        self._buf = buf
        self._starts = starts
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, i: int) -> bytes | None: ...
    @overload
    def __getitem__(self, i: slice) -> Slices: ...
    def __getitem__(self, i: int | slice) -> bytes | None | Slices:
        if isinstance(i, slice):
            return Slices(self._buf, self._starts[i], self.sizes[i])
        size = int(self.sizes[i])
        start = int(self._starts[i])
        return None if size < 0 else self._buf[start : start + size]

    def __iter__(self) -> Iterator[bytes | None]:
        if (self.sizes < 0).any():
            return (self[i] for i in range(len(self)))
        return map(self._buf.__getitem__, map(slice, self._starts.tolist(), (self._starts + self.sizes).tolist()))


# The fields of a run of records, in the order RecordColumns holds them (headers: none).
Columns = tuple[list[int], list[int], Slices, Slices, list[int]]
_NOTHING: Columns = ([], [], Slices(b"", np.zeros(0, np.int64), np.zeros(0, np.int64)),
                     Slices(b"", np.zeros(0, np.int64), np.zeros(0, np.int64)), [])


def uvarint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    """An unsigned varint of two or more bytes at ``pos``: (value, next position)."""
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise Errors.CorruptRecordError("varint longer than 10 bytes")


def unpack_plain(batches: Sequence[Any]) -> tuple[Columns, int]:
    """The records of the longest run of plain batches at the start of ``batches`` (v2, not control,
    CRC checked, uncompressed: ``_maybe_uncompress`` called), and how many batches that run holds.

    The columns (offsets, timestamps, keys, values, sizes) equal ``unpack_v2``'s of those batches
    one after the other; none has headers. 0 batches: the first one is not plain (``unpack_v2``
    must read it).
    """
    starts: list[int] = []  # where each record's body begins (after its length), in its batch
    ends: list[int] = []
    firsts = [0]  # index of each batch's first record
    plain = 0
    for batch in batches:
        header = batch._header_data
        if not (-_LIMIT < header[0] < _LIMIT and -_LIMIT < header[7] < _LIMIT and -_LIMIT < header[8] < _LIMIT):
            break
        if not _hop(batch._buffer, batch._pos, header[12], starts, ends):
            del starts[firsts[-1]:], ends[firsts[-1]:]
            break
        plain += 1
        firsts.append(len(starts))
    if not plain:
        return _NOTHING, 0
    counts = np.diff(firsts)
    sizes = [len(b._buffer) for b in batches[:plain]]
    at = np.repeat(np.cumsum([0, *sizes[:-1]]), counts)  # where each record's batch begins in buf
    buf = b"".join([*(b._buffer for b in batches[:plain]), _PAD])
    fields = _fields(np.frombuffer(buf, np.uint8), np.array(starts, np.int64) + at, np.array(ends, np.int64) + at)
    bad = np.flatnonzero(~fields["ok"])
    if bad.size:  # the run stops before the first batch holding an odd record
        plain = int(np.searchsorted(firsts, bad[0], side="right")) - 1
        if not plain:
            return _NOTHING, 0
        n = firsts[plain]
        counts = counts[:plain]
        fields = {name: column[:n] for name, column in fields.items()}
    headers = [b._header_data for b in batches[:plain]]
    base = np.repeat(np.array([h[0] for h in headers], np.int64), counts)
    first_ts = np.repeat(np.array([h[7] for h in headers], np.int64), counts)
    max_ts = np.repeat(np.array([h[8] for h in headers], np.int64), counts)
    log_append = np.repeat(np.array([bool(h[5] & 0x08) for h in headers]), counts)
    offsets = (base + fields["offset_delta"]).tolist()
    timestamps = np.where(log_append, max_ts, first_ts + fields["ts_delta"]).tolist()
    keys = Slices(buf, fields["key_start"], fields["key_size"])
    values = Slices(buf, fields["value_start"], fields["value_size"])
    return (offsets, timestamps, keys, values, fields["size"].tolist()), plain


def _hop(buf: bytearray, pos: int, count: int, starts: list[int], ends: list[int]) -> bool:
    """Append where each of the ``count`` records from ``pos`` begins and ends; False unless they
    fill the rest of ``buf`` exactly, each with a length that is not negative and a last byte of 0
    (its header count, the records with headers thus turned away here already)."""
    start, stop = starts.append, ends.append
    try:
        for _ in range(count):
            # the length varint read inline, as kafka_records.unpack_v2 does (a call per varint costs more)
            v = buf[pos]
            if v < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = uvarint(buf, pos)
            if v & 1:
                return False
            start(pos)
            pos += v >> 1
            if buf[pos - 1]:
                return False
            stop(pos)
    except (IndexError, Errors.CorruptRecordError):  # bytes missing, a varint too long: unpack_v2 names it
        return False
    return pos == len(buf)


def _fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """Every record's fields, read at once; ``ok`` is False where a record is not plain."""
    # Every position is kept within its record (a field running past the end makes the record not
    # ok: each later step moves on by one byte at least, so it cannot end where the record ends).
    ok = np.ones(len(starts), bool)
    pos = np.minimum(starts + 1, ends)  # the attributes byte: unused
    ts_delta, pos = _zigzag(buf, pos, ends, ok)
    offset_delta, pos = _zigzag(buf, pos, ends, ok)
    key_size, pos = _zigzag(buf, pos, ends, ok)
    key_start = pos
    pos = np.minimum(pos + np.maximum(key_size, 0), ends)
    value_size, pos = _zigzag(buf, pos, ends, ok)
    value_start = pos
    pos = np.minimum(pos + np.maximum(value_size, 0), ends)
    ok &= (buf[pos] == 0) & (pos + 1 == ends) & (key_size >= -1) & (value_size >= -1)  # no headers, then the end
    return {"ok": ok, "ts_delta": ts_delta, "offset_delta": offset_delta, "key_start": key_start,
            "key_size": key_size, "value_start": value_start, "value_size": value_size, "size": ends - starts}


def _zigzag(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints at ``pos`` and the positions after them (at most ``ends``); longer than 5
    bytes: not ``ok``."""
    byte = buf[pos].astype(np.int64)
    value = byte & 0x7F
    more = byte >= 0x80
    size = np.ones(len(pos), np.int64)
    shift = 7
    while more.any():
        if shift == 35:
            ok &= ~more
            break
        lanes = np.flatnonzero(more)
        byte = buf[pos[lanes] + size[lanes]].astype(np.int64)
        value[lanes] |= (byte & 0x7F) << shift
        size[lanes] += 1
        more[lanes] = byte >= 0x80
        shift += 7
    return (value >> 1) ^ -(value & 1), np.minimum(pos + size, ends)
