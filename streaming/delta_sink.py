"""The streaming sink of every query: routed rows into several Delta tables, exactly once.

Each micro-batch goes through ``foreachBatch``: Parquet files are written on the executors (a
``mapInArrow`` job), by the driver from the collected rows when they are few, or were already
written by the Kafka reader tasks (``WRITTEN`` listings, named after their offset range so a
replay reuses them); the driver commits them with ``deltalake``, one
commit per table, each carrying the Delta transaction ``(app id, batch id)``. A replayed batch finds
its transaction in the log and is skipped, so a kill at any moment loses and duplicates nothing;
a failed batch deletes only files no log holds (orphans wait for ``vacuum``). ``foreachBatch``
rather than a Python Data Source writer: the writer starts two more planner interpreters per query,
and the commit here runs in the driver's process, where ``deltalake`` is loaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import objstore
from pipeline.config import Config, ConfigError
from pipeline.maintenance import Maintainer
from schemas.tables import ROUTE_COLUMN, table
from streaming.delta_stats import file_stats

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

log = logging.getLogger(__name__)

# driver_step(batch_id, extras) -> files: the driver's own share of a batch (see write_routed)
DriverStep = Callable[[int, list[tuple[str, int, bytes]]], list["DataFile"]]
COMMIT_COLUMN = "commit"  # one row per write task: its RoutedCommit as JSON
# A column's values are dictionary-encoded until their dictionary passes this size, then written
# plain (Parquet's own fallback, here early): a unique id, offset or time is not hashed row after
# row into a dictionary it will not use, and zstd packs plain values of such columns tighter.
DICTIONARY_PAGE_BYTES = 16 << 10
# Route of chunk rows listing Parquet files a Kafka reader task already wrote (``arrow`` holds their
# DataFile list as JSON, ``rows`` the Kafka records the task read): the sink only commits them.
WRITTEN = "_written"
# Route of a routed row that only counts: ``EVENTS_COLUMN`` holds the Kafka records its query read
# (the ``faults`` query, whose readers write no files and so list nothing).
COUNTED = "_events_in"
# Key of a batch report holding what the maintenance step after the commits did (a line of text).
MAINTENANCE = "_maintenance"
EVENTS_COLUMN = "_events"
# Tables the driver has loaded, by path, with their version's commit file stamp
# (RoutedDeltaWriter._table); never shipped to executors.
_LOADED: dict[str, tuple[Any, int | None]] = {}


def _commit_stamp(path: str, version: int) -> int | None:
    """The modification time (ns) of a table's commit file for ``version``; None if it is gone."""
    return objstore.mtime_ns(objstore.join(path, "_delta_log", f"{version:020d}.json"))


@dataclass(frozen=True)
class DataFile:
    table: str
    path: str  # relative to the table root
    size: int
    partition_values: dict[str, str]
    num_records: int
    stats: str | None = None  # Delta's per-file statistics JSON (streaming.delta_stats)


@dataclass
class RoutedCommit:
    """What one write task wrote: its files, and for chunked input the events the chunks carried."""

    files: list[DataFile] = field(default_factory=list)
    events_in: int | None = None
    # chunks for the driver (route starting with "_", other than WRITTEN): (route, rows, payload)
    extras: list[tuple[str, int, bytes]] = field(default_factory=list)
    listed: bool = False  # events_in counts the records Kafka readers listed (WRITTEN rows)

    def to_json(self) -> str:
        obj = asdict(self)
        obj["extras"] = [[name, n, base64.b64encode(payload).decode()] for name, n, payload in self.extras]
        return json.dumps(obj)

    @classmethod
    def from_json(cls, text: str) -> RoutedCommit:
        obj = json.loads(text)
        extras = [(name, n, base64.b64decode(payload)) for name, n, payload in obj.get("extras", [])]
        return cls([DataFile(**f) for f in obj["files"]], obj["events_in"], extras, bool(obj.get("listed")))


def ensure_tables(root: str, names: Sequence[str], schema_changes: str = "evolve") -> None:
    """Create missing tables with their declared schema, and bring existing ones to it (before any
    query starts): new columns are added, or refused, per ``schema_changes`` (pipeline/deltaschema.py)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from pipeline.deltaschema import reconcile_schema

    for name in names:
        spec = table(name)
        path = objstore.join(root, name)
        options = objstore.storage_options(path)
        try:
            DeltaTable(path, storage_options=options)
        except TableNotFoundError:
            if not objstore.is_remote(path):
                Path(path).mkdir(parents=True, exist_ok=True)
            DeltaTable.create(
                path, schema=spec.arrow_schema(), mode="ignore", partition_by=list(spec.partition_by) or None,
                storage_options=options,
            )
            continue
        reconcile_schema(path, name, spec.arrow_schema(), schema_changes)


def write_table_files(
    root: str, name: str, rows: pa.Table, stem: Callable[[int], str], keep_existing: bool = False
) -> list[DataFile]:
    """Write ``rows`` into table ``name``'s folder, one Parquet file per partition value.

    ``stem(i)`` names the i-th file (without suffix). With ``keep_existing`` the names must be
    deterministic: a file already there is kept as it is (it may be committed data), and a new one
    appears atomically (written aside, then renamed), so a retried task never leaves half a file.
    """
    spec = table(name)
    schema = spec.arrow_schema()
    rows = rows.select(spec.columns).cast(schema)
    groups: list[tuple[dict[str, str], pa.Table]]
    if spec.partition_by:
        keys = rows.select(list(spec.partition_by)).group_by(list(spec.partition_by)).aggregate([])
        groups = []
        for values in sorted(keys.to_pylist(), key=lambda v: [str(x) for x in v.values()]):
            if keys.num_rows == 1 and None not in values.values():  # one day, as a rule: no filtered copy
                groups.append(({k: str(v) for k, v in values.items()}, rows))
                continue
            mask = None
            for col, val in values.items():
                cond = pc.equal(rows.column(col), val)
                mask = cond if mask is None else pc.and_(mask, cond)
            groups.append(({k: str(v) for k, v in values.items()}, rows.filter(mask)))
    else:
        groups = [({}, rows)]
    out = []
    for i, (values, part) in enumerate(groups):
        subdir = "/".join(f"{k}={v}" for k, v in values.items())
        rel = (subdir + "/" if subdir else "") + f"{stem(i)}.zstd.parquet"
        data = part.drop_columns(list(spec.partition_by)) if spec.partition_by else part
        if objstore.is_remote(root):
            size = _write_remote(objstore.join(root, name, rel), data, keep_existing)
            out.append(DataFile(name, rel, size, values, part.num_rows, file_stats(data)))
            continue
        full = Path(root) / name / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        # Partition columns are not stored in the files (the Delta protocol keeps them in the log).
        if not (keep_existing and _stamp_anew(full)):
            target = full.with_name(f".{full.name}.{uuid.uuid4().hex}.tmp") if keep_existing else full
            pq.write_table(data, target, compression="zstd", dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
            if keep_existing:
                os.replace(target, full)
        out.append(DataFile(name, rel, full.stat().st_size, values, part.num_rows, file_stats(data)))
    return out


def _write_remote(uri: str, data: pa.Table, keep_existing: bool) -> int:
    """Write one data file on object storage; its size. An object appears whole when its upload
    completes, so no file is written aside. A file kept for a replayed batch cannot have its time
    set there: VACUUM runs only between the job's micro-batches, after the replayed one commits."""
    import pyarrow.fs as pa_fs

    fs, key = objstore.filesystem(uri)
    if keep_existing:
        info = fs.get_file_info(key)
        if info.type == pa_fs.FileType.File:
            return int(info.size)
    pq.write_table(data, key, filesystem=fs, compression="zstd", dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
    return int(fs.get_file_info(key).size)


def _stamp_anew(path: Path) -> bool:
    """Mark an existing file as just written; False if there is none.

    A file kept for a replayed batch is about to be committed: VACUUM, which takes a file no log
    holds for an orphan once it is older than the retention, must not take it meanwhile.
    """
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False


class RoutedDeltaWriter:
    """Writes a batch's routed rows as Parquet (executors) and commits them to Delta (driver).

    With ``collect`` the batch's rows are collected to the driver and written there: for input
    that is (almost) only ``WRITTEN`` listings, such as the ``bronze`` query's, or a few derived
    rows, such as the stateful output of the combined query. A write job would start another
    Python worker beside each task only to pass a listing or a few rows on.
    """

    def __init__(
        self, root: str, tables: Sequence[str], app_id: str, report_dir: str | None = None, collect: bool = False,
        driver_step: DriverStep | None = None, listed: bool = False, maintainer: Maintainer | None = None,
    ) -> None:
        self.root = root
        # Table upkeep after the commits, at most one step per batch (pipeline/maintenance.py).
        self.maintainer = maintainer
        # The query's Kafka readers list what they read (WRITTEN rows): a batch without a listing
        # read nothing, whatever rows it derived (a batch that only moves the settle point).
        self.listed = listed
        self.driver_step = driver_step
        self.collect = collect
        self.tables = list(tables)
        self.app_id = app_id
        self.report_dir = report_dir
        # File names carry the query and the batch, so a failed batch's files can be found again.
        self.file_tag = file_tag(app_id)

    # -- executors ---------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch], batch_id: int = 0) -> RoutedCommit:
        """Write one task's rows (routed rows, or chunk rows of the Kafka source) as Parquet files.

        Chunk rows routed to ``WRITTEN`` list files a Kafka reader already wrote: they are only
        committed. ``events_in`` is what the readers read: the records of the ``WRITTEN`` rows
        (none for a ``listed`` writer's batch without them), else what ``COUNTED`` rows say, else
        every chunk's rows.
        """
        by_table: dict[str, list[pa.RecordBatch]] = {}
        files: list[DataFile] = []
        extras: list[tuple[str, int, bytes]] = []
        chunk_rows: int | None = None
        records_read: int | None = None
        counted: int | None = None
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            if "arrow" in batch.schema.names:  # chunked input (see streaming.kafka_source.to_chunks)
                for name, rows, payload in zip(batch.column(ROUTE_COLUMN).to_pylist(),
                                               batch.column("rows").to_pylist(), batch.column("arrow").to_pylist()):
                    if name == WRITTEN:
                        records_read = (records_read or 0) + rows
                        for data_file in json.loads(payload):
                            self._check_route(data_file["table"])
                            files.append(DataFile(**data_file))
                        continue
                    if name.startswith("_"):  # for the driver step, not a table
                        extras.append((name, rows, payload))
                        continue
                    chunk_rows = (chunk_rows or 0) + rows
                    self._check_route(name)
                    by_table.setdefault(name, []).extend(pa.ipc.open_stream(payload).read_all().to_batches())
                continue
            routes = batch.column(ROUTE_COLUMN)
            for name in pc.unique(routes).to_pylist():
                part = batch.filter(pc.equal(routes, name))
                if name == COUNTED:
                    counted = (counted or 0) + int(pc.sum(part.column(EVENTS_COLUMN)).as_py() or 0)
                    continue
                self._check_route(name)
                by_table.setdefault(name, []).append(part)
        for name, batches in by_table.items():
            if batches:
                files.extend(self._write_table(name, pa.Table.from_batches(batches), batch_id))
        if self.listed or records_read is not None:
            return RoutedCommit(files, records_read or 0, extras, True)
        return RoutedCommit(files, chunk_rows if counted is None else counted, extras)

    def _file_prefix(self, batch_id: int) -> str:
        return f"part-{self.file_tag}-b{batch_id}-"

    def _check_route(self, name: str) -> None:
        if name not in self.tables:
            raise ValueError(f"row routed to {name!r}, which this sink does not write ({self.tables})")

    def _write_table(self, name: str, rows: pa.Table, batch_id: int) -> list[DataFile]:
        prefix = self._file_prefix(batch_id)
        return write_table_files(self.root, name, rows, lambda _: f"{prefix}{uuid.uuid4().hex}")

    # -- driver --------------------------------------------------------------------------------
    def commit(self, messages: Sequence[RoutedCommit | None], batchId: int) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        now_ms = int(time.time() * 1000)
        by_table = {name: [f for f in files if f.table == name] for name in self.tables}
        by_table = {name: mine for name, mine in by_table.items() if mine}
        # Tables commit independently (Delta has no multi-table transaction; each carries its own
        # (app id, batch id)), so they commit side by side: a batch touches up to seven tables.
        with ThreadPoolExecutor(max_workers=max(1, len(by_table))) as pool:
            done = list(pool.map(lambda item: self._commit_table(item[0], item[1], batchId, now_ms), by_table.items()))
        counts = {name: n for name, n in done if n is not None}
        upkeep = self.maintainer.after_batch(counts) if self.maintainer is not None else None
        if self.report_dir:
            report: dict[str, Any] = {f.table: 0 for f in files} | counts
            if upkeep is not None:
                report[MAINTENANCE] = upkeep.describe()
            chunked = [m.events_in for m in messages if m is not None and m.events_in is not None]
            if any(m is not None and m.listed for m in messages):  # the readers' count, not derived rows
                chunked = [m.events_in for m in messages if m is not None and m.listed and m.events_in is not None]
            if chunked:
                report["_events_in"] = sum(chunked)
            _write_report(self.report_dir, batchId, report)

    def _table(self, name: str) -> Any:
        """The table at its latest version: loaded once per driver, then read forward.

        Loading a log from its last checkpoint reads up to a hundred commit files (tens of ms per
        table); a loaded table reads only the commits made since (about a millisecond). A table
        deleted and made anew at the same path is told by its log: the commit file of the version
        held then is gone or is another file.
        """
        from deltalake import DeltaTable

        path = objstore.join(self.root, name)
        held = _LOADED.get(path)
        if held is not None and _commit_stamp(path, held[0].version()) == held[1]:
            dt = held[0]
            try:
                dt.update_incremental()
                _LOADED[path] = (dt, _commit_stamp(path, dt.version()))
                return dt
            except Exception:  # its log is unreadable from there: load it anew
                log.info("reloading %s", path, exc_info=True)
        dt = DeltaTable(path, storage_options=objstore.storage_options(path))
        _LOADED[path] = (dt, _commit_stamp(path, dt.version()))
        return dt

    def _holds(self, dt: Any, batch_id: int) -> bool:
        """Whether a table's log already holds this query's ``batch_id`` (a replay if so)."""
        done = dt.transaction_version(self.app_id)
        return done is not None and done >= batch_id

    def _commit_table(self, name: str, mine: list[DataFile], batch_id: int, now_ms: int) -> tuple[str, int | None]:
        """Commit one table's files of the batch; (name, rows), rows None if already committed."""
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        dt = self._table(name)
        if self._holds(dt, batch_id):
            log.info("%s: batch %d already in %s (replay): skipped", self.app_id, batch_id, name)
            return name, None
        spec = table(name)
        _check_columns(dt, name, spec.columns)
        actions = [
            AddAction(f.path, f.size, f.partition_values, now_ms, True,
                      f.stats or json.dumps({"numRecords": f.num_records}))
            for f in mine
        ]
        try:
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
        except Exception:
            _LOADED.pop(objstore.join(self.root, name), None)  # next time, load it anew
            raise
        return name, sum(f.num_records for f in mine)

    def abort(self, messages: Sequence[RoutedCommit | None], batchId: int) -> None:
        """Delete the listed files of tables whose log does not hold ``batchId``."""
        for name in self.tables:
            if self._holds(self._table(name), batchId):
                continue  # the log holds this batch: its files are live data
            for m in messages:
                for f in m.files if m is not None else []:
                    if f.table == name:
                        objstore.remove(objstore.join(self.root, name, f.path))

    def discard(self, batch_id: int) -> None:
        """After a failed write job: delete this query's files of ``batch_id`` (found by name) in
        every table whose log does not hold the batch. The tasks' own list of files is lost with
        the job, so the names say which batch a file belongs to."""
        prefix = self._file_prefix(batch_id)
        for name in self.tables:
            if self._holds(self._table(name), batch_id):
                continue
            objstore.remove_prefixed(objstore.join(self.root, name), prefix)

    def batch_function(self) -> Any:
        """The ``foreachBatch`` function: one write job over the batch, then the commits."""

        def run(batch_df: DataFrame, batch_id: int) -> None:
            def write_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                message = self.write(batches, batch_id)
                yield pa.RecordBatch.from_pydict({COMMIT_COLUMN: [message.to_json()]})

            try:
                if self.collect:
                    messages = [self.write(iter(batch_df.toArrow().to_batches()), batch_id)]
                else:
                    rows = batch_df.mapInArrow(write_task, f"{COMMIT_COLUMN} string").collect()
                    messages = [RoutedCommit.from_json(r[COMMIT_COLUMN]) for r in rows]
                if self.driver_step is not None:
                    extras = [x for m in messages for x in m.extras]
                    messages.append(RoutedCommit(self.driver_step(batch_id, extras)))
            except Exception:
                self.discard(batch_id)
                raise
            try:
                self.commit(messages, batch_id)
            except Exception:
                self.abort(messages, batch_id)
                raise

        return run


def _check_columns(dt: Any, name: str, columns: Sequence[str]) -> None:
    """Refuse to commit files whose columns the table's schema lacks: Delta would take them, and
    readers would never see those columns (the start evolves or refuses them; this catches a table
    changed since)."""
    have = {f.name for f in dt.schema().fields}
    missing = [c for c in columns if c not in have]
    if missing:
        raise ValueError(
            f"table {name} lacks column(s) {missing} that this batch's files hold (was it replaced while the "
            "job ran?). Restart faultwatch stream: at start it adds them, or says why it cannot "
            "(storage.schema_changes)."
        )


def _write_report(folder: str, batch_id: int, counts: dict[str, Any]) -> None:
    """Rows committed per table in this batch, for the progress line of ``faultwatch stream``."""
    if objstore.is_remote(folder):
        objstore.write_text(objstore.join(folder, f"{batch_id}.json"), json.dumps(counts))
        objstore.remove(objstore.join(folder, f"{batch_id - 1000}.json"))  # keep the last thousand
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    tmp = Path(folder) / f".{batch_id}.json.tmp"
    tmp.write_text(json.dumps(counts))
    tmp.replace(Path(folder) / f"{batch_id}.json")
    (Path(folder) / f"{batch_id - 1000}.json").unlink(missing_ok=True)  # keep the last thousand


def read_report(folder: str, batch_id: int) -> dict[str, Any] | None:
    try:
        return dict(json.loads(objstore.read_text(objstore.join(folder, f"{batch_id}.json"))))
    except FileNotFoundError:
        return None


def write_routed(
    df: DataFrame, cfg: Config, name: str, tables: Sequence[str], checkpoint: str | None = None,
    collect: bool = False, layout: int | None = None, driver_step: DriverStep | None = None,
    keys: Mapping[str, int] | None = None, listed: bool = False,
) -> DataStreamWriter:
    """An unstarted streaming writer of ``df``'s routed rows into ``tables`` (created if missing).

    ``layout``: the version of the query's state layout, kept in its checkpoint; a checkpoint of
    another layout is refused (see :func:`check_layout`), as is one whose state was keyed with other
    ``keys`` settings (``{"faults.shards": 8}``). ``driver_step(batch_id, extras)``: runs
    on the driver after the write job, before the commits, and returns more files to commit.
    ``listed``: the query's Kafka readers write files and list them with the records they read.
    """
    ensure_tables(cfg.storage.root, tables, cfg.storage.schema_changes)
    checkpoint = checkpoint or checkpoint_dir(cfg, name)
    check_checkpoint_matches(cfg.storage.root, tables, checkpoint, app_id(cfg, name))
    check_other_writers(cfg, name, tables)
    if layout is not None or keys:
        check_layout(checkpoint, name, layout, keys)
    maintainer = None
    if cfg.maintenance.enabled:
        maintainer = Maintainer(cfg.storage.root, tables, cfg.maintenance, objstore.join(checkpoint, MAINTENANCE_FILE))
    writer_class = RoutedDeltaWriter
    if cfg.storage.writer == "delta-spark":  # Delta's own Spark writer commits (streaming/delta_spark_sink.py)
        from streaming.delta_spark_sink import DeltaSparkWriter

        writer_class = DeltaSparkWriter
    writer = writer_class(cfg.storage.root, tables, app_id(cfg, name), report_dir(checkpoint), collect,
                          driver_step, listed, maintainer)
    return (
        df.writeStream.foreachBatch(writer.batch_function())
        .queryName(name)
        .option("checkpointLocation", objstore.hadoop_uri(checkpoint))
        .outputMode("append")
    )


def check_checkpoint_matches(root: str, tables: Sequence[str], checkpoint: str, app: str) -> None:
    """Refuse a new checkpoint over tables that already hold batches of the same query (``app``).

    Its batch ids would start again at 0, and every batch the tables already hold would be skipped
    as a replay: silent loss. (Spark writes ``metadata`` into a checkpoint when a query first
    starts there; its absence marks a new or deleted checkpoint.)
    """
    from deltalake import DeltaTable

    if objstore.exists(objstore.join(checkpoint, "metadata")):
        return
    for name in tables:
        path = objstore.join(root, name)
        done = DeltaTable(path, storage_options=objstore.storage_options(path)).transaction_version(app)
        if done is not None:
            raise ConfigError(
                f"checkpoint {checkpoint} is new, but table {name} under storage.root already holds "
                f"micro-batches up to {done} of query {app!r}; the new checkpoint would skip its first "
                f"{done + 1} batches as replays. Restore the old checkpoint, or remove the tables (or "
                "point storage.root elsewhere) to rebuild them from Kafka."
            )


# Every query ``faultwatch stream`` can run (streaming.job.CONCERNS; a test keeps them equal).
QUERIES = ("combined", "bronze_faults", "bronze", "faults", "lag")
LAYOUT_FILE = "faultwatch-layout.json"
MAINTENANCE_FILE = "faultwatch-maintenance.json"  # the query's maintenance schedule


def check_other_writers(cfg: Config, name: str, tables: Sequence[str]) -> None:
    """Refuse to write tables that another of faultwatch's queries has written (quarantine aside).

    That query's rows are there already, and this query would add its own from the start of
    Kafka: e.g. the default query of this version over tables of the two queries of an older one.
    """
    from deltalake import DeltaTable

    for table_name in tables:
        if table_name == "quarantine":  # every query writes its own stage's rejects there
            continue
        path = objstore.join(cfg.storage.root, table_name)
        dt = DeltaTable(path, storage_options=objstore.storage_options(path))
        for other in QUERIES:
            if other != name and dt.transaction_version(app_id(cfg, other)) is not None:
                raise ConfigError(
                    f"table {table_name} under storage.root holds micro-batches of query {other!r}, and "
                    f"query {name!r} would write its rows again from the start of Kafka. Run "
                    f"`faultwatch stream --only {other}` as before, or remove the tables and checkpoints "
                    "(or point storage.root and storage.checkpoint_root elsewhere) to rebuild them "
                    f"with {name!r}."
                )


def check_layout(checkpoint: str, name: str, layout: int | None, keys: Mapping[str, int] | None = None) -> None:
    """Refuse a checkpoint whose state layout is not ``layout``, or whose state was keyed with other
    settings than ``keys`` (e.g. ``{"faults.shards": 8}``); mark a new checkpoint with both.

    Spark cannot tell that the same columns now hold another shape of state (e.g. keyed per
    cluster instead of one key for all), so the layout is written next to Spark's own files. Nor
    can it tell that a broker's state now lives under another key: with another ``faults.shards``
    the old keys would keep settling their brokers while new keys started them afresh. ``layout``
    None: the query has no layout number (only ``keys`` are checked). A checkpoint marked before
    key settings were recorded takes today's as its own.
    """
    marker = objstore.join(checkpoint, LAYOUT_FILE)
    wanted = dict(keys or {})
    if objstore.exists(objstore.join(checkpoint, "metadata")):
        found: dict[str, Any] = json.loads(objstore.read_text(marker)) if objstore.exists(marker) else {"layout": 0}
        if layout is not None and found.get("layout") != layout:
            raise ConfigError(
                f"checkpoint {checkpoint} holds query {name!r}'s state in layout {found.get('layout')}, "
                f"and this version of faultwatch keeps it in layout {layout}. Remove the checkpoint and "
                "the tables it wrote (or point storage.root and storage.checkpoint_root elsewhere) to "
                "rebuild them from Kafka, or finish with the faultwatch version that wrote it."
            )
        held = found.get("keys")
        if held is None:
            if wanted:
                _write_marker(marker, json.dumps({**found, "query": name, "keys": wanted}))
            return
        for setting, value in wanted.items():
            if setting in held and held[setting] != value:
                raise ConfigError(
                    f"{setting} is {value}, but checkpoint {checkpoint} keeps query {name!r}'s state under "
                    f"{setting} = {held[setting]}: a key would lose the state its events belong to. Set "
                    f"{setting} = {held[setting]} again, or remove the checkpoint and the tables it wrote (or "
                    "point storage.root and storage.checkpoint_root elsewhere) to rebuild them from Kafka."
                )
        return
    # a query without a layout number is layout 0, as a checkpoint marked before layouts were
    _write_marker(marker, json.dumps({"query": name, "layout": 0 if layout is None else layout, "keys": wanted}))


def _write_marker(path: str, text: str) -> None:
    if objstore.is_remote(path):
        objstore.write_text(path, text)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def app_id(cfg: Config, name: str) -> str:
    """The Delta transaction app id of query ``name``."""
    return f"{cfg.stream.app_id}:{name}"


def file_tag(app_id: str) -> str:
    """What the names of a query's data files start with (after ``part-``)."""
    return hashlib.sha1(app_id.encode()).hexdigest()[:10]


def checkpoint_dir(cfg: Config, name: str) -> str:
    return objstore.join(cfg.storage.checkpoint_root, name)


def report_dir(checkpoint: str) -> str:
    return objstore.join(checkpoint, "faultwatch-reports")
