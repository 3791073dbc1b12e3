"""Where a cycle's output goes: Kafka, per-cluster JSON files, and Delta appends once per cycle.

Every sink is idempotent for one cycle: Kafka carries the full current list per key (latest wins),
files are replaced atomically, and Delta appends carry a transaction (app id, cycle number) that
a re-run checks before appending.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline import objstore
from pipeline.config import Config
from pipeline.deltaio import table_uri
from schemas.tables import table


def kafka_producer(cfg: Config, budget_s: float | None = None) -> Any:
    """A producer whose every wait (metadata, connection, acknowledgement) ends within ``budget_s``."""
    from kafka import KafkaProducer

    opts = cfg.kafka.client_options()
    if budget_s is None:
        return KafkaProducer(acks="all", retries=5, linger_ms=5, **opts)
    ms = max(1, int(budget_s * 1000))
    opts["request_timeout_ms"] = min(int(opts.get("request_timeout_ms") or ms), ms)
    return KafkaProducer(
        acks="all", retries=5, linger_ms=5, max_block_ms=ms, delivery_timeout_ms=ms + 5,
        bootstrap_timeout_ms=ms, **opts,
    )


def send_records(
    cfg: Config, topic: str, records: Sequence[tuple[str, bytes]], timeout_s: float | None = None
) -> int:
    """Send ``(key, value)`` records and wait for every acknowledgement; raise if any failed.

    The whole call (connecting included) ends within ``timeout_s`` (default ``publish.send_timeout_s``)
    plus the time a closing client takes; on failure the client is closed without waiting, so no
    queued record is sent after the caller gave up (one already on the wire may still land).
    """
    if not records:
        return 0
    budget = cfg.publish.send_timeout_s if timeout_s is None else timeout_s
    if budget <= 0:
        raise TimeoutError(f"Kafka {cfg.kafka.bootstrap_servers}: no time left to send to {topic!r}")
    deadline = time.monotonic() + budget
    producer = kafka_producer(cfg, budget)
    ok = False
    try:
        futures = [producer.send(topic, key=k.encode("utf-8"), value=v) for k, v in records]
        producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        for f in futures:
            f.get(timeout=max(0.0, deadline - time.monotonic()))
        ok = True
    finally:
        producer.close(timeout=cfg.publish.send_timeout_s if ok else 0)
    return len(records)


def safe_file_name(cluster: str) -> str:
    """Cluster names become file names: keep them readable, never a path."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in cluster).lstrip(".")
    return (cleaned or "_") + ".json"


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``.

    A producer reading the file sees the old list or the new one, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _list_order(data: bytes) -> tuple[int, int] | None:
    """(decided_ms, cycle) of a published list, None when it is not one (a foreign or broken file)."""
    try:
        obj = json.loads(data)
        cycle = str(obj.get("cycle_id", ""))
        return int(obj["decided_ms"]), int(cycle) if cycle.isdigit() else -1
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def remove_stale_temp_files(publish_dir: str) -> list[Path]:
    """Temp files a crashed write left (``.<cluster>.json.*.tmp``): nobody will ever rename them."""
    folder = Path(publish_dir)
    stale = sorted(folder.glob(".*.json.*.tmp")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_cluster_files(publish_dir: str, files: Iterable[tuple[str, bytes]]) -> list[Path]:
    """Replace each cluster's file, unless it already holds a list at least as new (returns those written)."""
    out = []
    for cluster, data in files:
        path = Path(publish_dir) / safe_file_name(cluster)
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            current = None
        old, new = (_list_order(current) if current is not None else None), _list_order(data)
        if current == data or (old is not None and new is not None and old >= new):
            continue
        write_atomic(path, data)
        out.append(path)
    return out


def committed_version(root: str, name: str, app_id: str) -> int | None:
    """The last Delta transaction version of ``app_id`` on table ``name`` (None: never)."""
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    if not DeltaTable.is_deltatable(uri, storage_options=objstore.storage_options(uri)):
        return None
    version = DeltaTable(uri, storage_options=objstore.storage_options(uri)).transaction_version(app_id)
    return None if version is None else int(version)


def open_table(root: str, name: str) -> Any:
    """Table ``name`` as one snapshot (a ``DeltaTable``), created empty first if it does not exist.

    A conditional append must be committed on the snapshot its condition was read in: only then
    does delta-rs refuse it when another writer committed the same app id meanwhile.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    uri = table_uri(root, name)
    if not DeltaTable.is_deltatable(uri, storage_options=objstore.storage_options(uri)):
        try:
            DeltaTable.create(uri, schema=table(name).arrow_schema(), mode="ignore", storage_options=objstore.storage_options(uri),
                              partition_by=list(table(name).partition_by) or None)
        except DeltaError:  # another writer created it at the same moment
            if not DeltaTable.is_deltatable(uri, storage_options=objstore.storage_options(uri)):
                raise
    return DeltaTable(uri, storage_options=objstore.storage_options(uri))


def append_once(root: str, name: str, rows: list[dict[str, Any]], app_id: str, version: int) -> bool:
    """Append ``rows`` to table ``name`` unless ``app_id`` already committed ``version`` or later.

    Returns whether it appended (False also when a concurrent writer committed ``app_id`` first).
    The transaction rides in the same commit as the rows, so a crash leaves either both or neither.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError

    for _ in range(3):
        snapshot = open_table(root, name)
        done = snapshot.transaction_version(app_id)
        if done is not None and int(done) >= version:
            return False
        try:
            _append(root, name, rows, CommitProperties(app_transactions=[Transaction(app_id, version)]), snapshot)
            return True
        except CommitFailedError:
            continue  # someone committed meanwhile: read again
    raise RuntimeError(f"table {table_uri(root, name)}: could not append for {app_id!r} {version} "
                       "(three concurrent commits in a row)")


def append_rows(root: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Append without a transaction: for rows whose caller checked for themselves (one per cycle).

    A transaction would move ``app_id``'s version, which must only ever grow with published cycles.
    """
    _append(root, name, rows, None)


def _append(root: str, name: str, rows: list[dict[str, Any]], commit: Any, snapshot: Any = None) -> None:
    from deltalake import write_deltalake

    spec = table(name)
    data = pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    write_deltalake(
        table_uri(root, name) if snapshot is None else snapshot,
        data,
        storage_options=objstore.storage_options(root) if snapshot is None else None,
        mode="append",
        partition_by=list(spec.partition_by) or None,
        schema_mode="merge",  # tables written before a nullable column was declared gain it
        commit_properties=commit,
    )
