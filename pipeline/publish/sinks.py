"""Where a cycle's output goes: Kafka, per-cluster JSON files, and Delta appends once per cycle.

Every sink is idempotent for one cycle: Kafka carries the full current list per key (latest wins),
files are replaced atomically, and Delta appends carry a transaction (app id, cycle number) that
a re-run checks before appending.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import Config
from pipeline.deltaio import table_uri
from schemas.tables import table


def kafka_producer(cfg: Config) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(acks="all", retries=5, linger_ms=5, **cfg.kafka.client_options())


def send_records(cfg: Config, topic: str, records: Sequence[tuple[str, bytes]]) -> int:
    """Send ``(key, value)`` records and wait for every acknowledgement; raise if any failed."""
    if not records:
        return 0
    producer = kafka_producer(cfg)
    try:
        futures = [producer.send(topic, key=k.encode("utf-8"), value=v) for k, v in records]
        producer.flush(timeout=cfg.publish.send_timeout_s)
        for f in futures:
            f.get(timeout=cfg.publish.send_timeout_s)
    finally:
        producer.close(timeout=cfg.publish.send_timeout_s)
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


def write_cluster_files(publish_dir: str, files: Iterable[tuple[str, bytes]]) -> list[Path]:
    out = []
    for cluster, data in files:
        path = Path(publish_dir) / safe_file_name(cluster)
        write_atomic(path, data)
        out.append(path)
    return out


def committed_version(root: str, name: str, app_id: str) -> int | None:
    """The last Delta transaction version of ``app_id`` on table ``name`` (None: never)."""
    from deltalake import DeltaTable

    uri = table_uri(root, name)
    if not DeltaTable.is_deltatable(uri):
        return None
    version = DeltaTable(uri).transaction_version(app_id)
    return None if version is None else int(version)


def append_once(root: str, name: str, rows: list[dict[str, Any]], app_id: str, version: int) -> bool:
    """Append ``rows`` to table ``name`` unless ``app_id`` already committed ``version`` or later.

    Returns whether it appended. The transaction rides in the same commit as the rows, so a crash
    leaves either both or neither.
    """
    from deltalake import CommitProperties, Transaction

    done = committed_version(root, name, app_id)
    if done is not None and done >= version:
        return False
    _append(root, name, rows, CommitProperties(app_transactions=[Transaction(app_id, version)]))
    return True


def append_rows(root: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Append without a transaction: for rows whose caller checked for themselves (one per cycle).

    A transaction would move ``app_id``'s version, which must only ever grow with published cycles.
    """
    _append(root, name, rows, None)


def _append(root: str, name: str, rows: list[dict[str, Any]], commit: Any) -> None:
    from deltalake import write_deltalake

    spec = table(name)
    data = pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    write_deltalake(
        table_uri(root, name),
        data,
        mode="append",
        partition_by=list(spec.partition_by) or None,
        schema_mode="merge",  # tables written before a nullable column was declared gain it
        commit_properties=commit,
    )
