"""Arrow tables as bytes (one Arrow IPC stream) and back: the one way rows travel as bytes.

The fault and lag states go to Spark's state store this way (the lag state zstd-compressed, its
pending events, rewritten every micro-batch, LZ4; the fault state's narrowed integers are not worth
compressing, see :mod:`pipeline.faults.codec`), and the streaming job's chunks of events and of
output rows cross Spark's shuffle this way (uncompressed: they live for one batch). IPC keeps the
columns typed and is free of Python class paths, so moving a module never breaks a checkpoint
(pickle would).
"""

from __future__ import annotations

import pyarrow as pa

_CODECS = {"zstd": pa.ipc.IpcWriteOptions(compression="zstd"),
           "lz4": pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)}


def ipc_bytes(rows: pa.Table | pa.RecordBatch, compress: bool | str = False) -> bytes:
    """``rows`` as one Arrow IPC stream; ``compress`` for bytes that are kept (True: zstd, or a
    codec's name: "zstd", "lz4")."""
    options = _CODECS["zstd" if compress is True else compress] if compress else None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema, options=options) as writer:
        writer.write(rows)
    return sink.getvalue().to_pybytes()


def ipc_table(blob: bytes) -> pa.Table:
    """The rows of one Arrow IPC stream (compressed or not)."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
