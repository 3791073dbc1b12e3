"""A Spark streaming sink that writes routed rows to several Delta tables, exactly once.

Executors write Parquet files straight into each table's folder and return their paths; the driver
commits them with ``deltalake`` (delta-rs), one commit per table and micro-batch, each carrying the
Delta transaction ``(app id, batch id)``. A batch that Spark replays after a crash finds its
transaction already in the table's log and is skipped, so a kill at any moment neither loses nor
duplicates rows. ``abort`` deletes only files of tables whose log does not hold the batch; files of a
replayed batch that was already committed stay as orphans until ``vacuum``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from pipeline.config import Config
from schemas.tables import ROUTE_COLUMN, table

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

log = logging.getLogger(__name__)

SINK_NAME = "faultwatch_delta"


@dataclass(frozen=True)
class DataFile:
    table: str
    path: str  # relative to the table root
    size: int
    partition_values: dict[str, str]
    num_records: int


@dataclass
class RoutedCommit(WriterCommitMessage):
    files: list[DataFile] = field(default_factory=list)
    events_in: int | None = None  # chunked input only: the events the chunks carried


def ensure_tables(root: str, names: Sequence[str]) -> None:
    """Create missing tables with their declared schema (before any query starts)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    for name in names:
        spec = table(name)
        path = str(Path(root) / name)
        try:
            DeltaTable(path)
        except TableNotFoundError:
            Path(path).mkdir(parents=True, exist_ok=True)
            DeltaTable.create(
                path, schema=spec.arrow_schema(), mode="ignore", partition_by=list(spec.partition_by) or None
            )


class DeltaRoutedSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def streamWriter(self, schema: Any, overwrite: bool) -> DeltaStreamWriter:
        return DeltaStreamWriter(dict(self.options))


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.root = options["root"]
        self.tables: list[str] = json.loads(options["tables"])
        self.app_id = options["app_id"]
        self.report_dir = options.get("report_dir")

    # -- executors ---------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> RoutedCommit:
        by_table: dict[str, list[pa.RecordBatch]] = {}
        events_in: int | None = None
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            if "arrow" in batch.schema.names:  # chunked input (see streaming.kafka_source.to_chunks)
                events_in = (events_in or 0) + sum(batch.column("rows").to_pylist())
                for name, payload in zip(batch.column(ROUTE_COLUMN).to_pylist(), batch.column("arrow").to_pylist()):
                    self._check_route(name)
                    by_table.setdefault(name, []).extend(pa.ipc.open_stream(payload).read_all().to_batches())
                continue
            routes = batch.column(ROUTE_COLUMN)
            for name in pc.unique(routes).to_pylist():
                self._check_route(name)
                part = batch.filter(pc.equal(routes, name))
                by_table.setdefault(name, []).append(part)
        files: list[DataFile] = []
        for name, batches in by_table.items():
            if batches:
                files.extend(self._write_table(name, pa.Table.from_batches(batches)))
        return RoutedCommit(files, events_in)

    def _check_route(self, name: str) -> None:
        if name not in self.tables:
            raise ValueError(f"row routed to {name!r}, which this sink does not write ({self.tables})")

    def _write_table(self, name: str, rows: pa.Table) -> list[DataFile]:
        spec = table(name)
        schema = spec.arrow_schema()
        rows = rows.select(spec.columns).cast(schema)
        groups: list[tuple[dict[str, str], pa.Table]]
        if spec.partition_by:
            keys = rows.select(list(spec.partition_by)).group_by(list(spec.partition_by)).aggregate([])
            groups = []
            for values in keys.to_pylist():
                mask = None
                for col, val in values.items():
                    cond = pc.equal(rows.column(col), val)
                    mask = cond if mask is None else pc.and_(mask, cond)
                groups.append(({k: str(v) for k, v in values.items()}, rows.filter(mask)))
        else:
            groups = [({}, rows)]
        out = []
        for values, part in groups:
            subdir = "/".join(f"{k}={v}" for k, v in values.items())
            rel = (subdir + "/" if subdir else "") + f"part-{uuid.uuid4().hex}.zstd.parquet"
            full = Path(self.root) / name / rel
            full.parent.mkdir(parents=True, exist_ok=True)
            # Partition columns are not stored in the files (the Delta protocol keeps them in the log).
            data = part.drop_columns(list(spec.partition_by)) if spec.partition_by else part
            pq.write_table(data, full, compression="zstd")
            out.append(DataFile(name, rel, full.stat().st_size, values, part.num_rows))
        return out

    # -- driver --------------------------------------------------------------------------------
    def commit(self, messages: list[RoutedCommit | None], batchId: int) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        now_ms = int(time.time() * 1000)
        by_table = {name: [f for f in files if f.table == name] for name in self.tables}
        by_table = {name: mine for name, mine in by_table.items() if mine}
        # Tables commit independently (Delta has no multi-table transaction; each carries its own
        # (app id, batch id)), so they commit side by side: a batch touches up to seven tables.
        with ThreadPoolExecutor(max_workers=max(1, len(by_table))) as pool:
            done = list(pool.map(lambda item: self._commit_table(item[0], item[1], batchId, now_ms), by_table.items()))
        counts = {name: n for name, n in done if n is not None}
        if self.report_dir:
            report = {f.table: 0 for f in files} | counts
            chunked = [m.events_in for m in messages if m is not None and m.events_in is not None]
            if chunked:
                report["_events_in"] = sum(chunked)
            _write_report(self.report_dir, batchId, report)


    def _commit_table(self, name: str, mine: list[DataFile], batch_id: int, now_ms: int) -> tuple[str, int | None]:
        """Commit one table's files of the batch; (name, rows), rows None if already committed."""
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        dt = DeltaTable(str(Path(self.root) / name))
        done = dt.transaction_version(self.app_id)
        if done is not None and done >= batch_id:
            log.info("%s: batch %d already in %s (replay): skipped", self.app_id, batch_id, name)
            return name, None
        spec = table(name)
        actions = [
            AddAction(f.path, f.size, f.partition_values, now_ms, True, json.dumps({"numRecords": f.num_records}))
            for f in mine
        ]
        dt.create_write_transaction(
            actions,
            mode="append",
            schema=spec.arrow_schema(),
            partition_by=list(spec.partition_by) or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.app_id, batch_id)],
                custom_metadata={"faultwatch.batch_id": str(batch_id), "faultwatch.app_id": self.app_id},
            ),
        )
        return name, sum(f.num_records for f in mine)

    def abort(self, messages: list[RoutedCommit | None], batchId: int) -> None:
        from deltalake import DeltaTable

        for name in self.tables:
            done = DeltaTable(str(Path(self.root) / name)).transaction_version(self.app_id)
            if done is not None and done >= batchId:
                continue  # the log holds this batch: its files are live data
            for m in messages:
                for f in m.files if m is not None else []:
                    if f.table == name:
                        try:
                            os.remove(Path(self.root) / name / f.path)
                        except FileNotFoundError:
                            pass


def _write_report(folder: str, batch_id: int, counts: dict[str, int]) -> None:
    """Rows committed per table in this batch, for the progress line of ``faultwatch stream``."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    tmp = Path(folder) / f".{batch_id}.json.tmp"
    tmp.write_text(json.dumps(counts))
    tmp.replace(Path(folder) / f"{batch_id}.json")
    (Path(folder) / f"{batch_id - 1000}.json").unlink(missing_ok=True)  # keep the last thousand


def read_report(folder: str, batch_id: int) -> dict[str, int] | None:
    try:
        return dict(json.loads((Path(folder) / f"{batch_id}.json").read_text()))
    except FileNotFoundError:
        return None

def write_routed(
    df: DataFrame, cfg: Config, name: str, tables: Sequence[str], checkpoint: str | None = None
) -> DataStreamWriter:
    """An unstarted streaming writer of ``df``'s routed rows into ``tables`` (created if missing)."""
    spark = df.sparkSession
    register(spark)
    ensure_tables(cfg.storage.root, tables)
    checkpoint = checkpoint or checkpoint_dir(cfg, name)
    return (
        df.writeStream.format(SINK_NAME)
        .queryName(name)
        .option("root", cfg.storage.root)
        .option("tables", json.dumps(list(tables)))
        .option("app_id", f"{cfg.stream.app_id}:{name}")
        .option("report_dir", report_dir(checkpoint))
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
    )


def checkpoint_dir(cfg: Config, name: str) -> str:
    return str(Path(cfg.storage.checkpoint_root) / name)


def report_dir(checkpoint: str) -> str:
    return str(Path(checkpoint) / "faultwatch-reports")


_REGISTERED: set[int] = set()


def register(spark: Any) -> None:
    if id(spark) not in _REGISTERED:
        spark.dataSource.register(DeltaRoutedSink)
        _REGISTERED.add(id(spark))
