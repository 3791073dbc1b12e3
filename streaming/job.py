"""``faultwatch stream``: assemble the queries (one per concern), start them, report progress.

Configure, then build, then start: :func:`build_queries` returns unstarted writers and makes no
connection; :func:`run_stream` starts them and watches them until they finish (``--once``), a
signal arrives, or ``duration_s`` passes.
"""

from __future__ import annotations

import importlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config import Config, describe

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

# concern -> (module, function building its unstarted writer from (spark, cfg)).
CONCERNS: dict[str, tuple[str, str]] = {
    "combined": ("streaming.combined_query", "build_combined"),
    "bronze_faults": ("streaming.combined_query", "build_bronze_faults"),
    "lag": ("streaming.lag_query", "build_lag"),
    "bronze": ("streaming.bronze", "build_bronze"),
    "faults": ("streaming.faults_query", "build_faults"),
}
# What runs without --only: ``combined`` writes the bronze, fault and lag tables from ONE Kafka read
# (see streaming/combined_query.py). The others run parts of it alone: ``bronze_faults`` without
# lag; ``bronze``, ``faults`` and ``lag`` as queries that each read Kafka (bench/ingest.py runs
# ``bronze``). Two queries that write the same tables cannot run together.
DEFAULT_CONCERNS = ("combined",)
OVERLAPPING = {"combined": ("bronze_faults", "bronze", "faults", "lag"), "bronze_faults": ("bronze", "faults")}


# The ``faults`` query keeps every cluster under one key (see streaming/faults_query.py), so its
# stateful operator needs one shuffle partition; with the default four, three empty tasks (a state
# store and a Python worker each) cost ~0.25 s per micro-batch on 2 cores. Spark keeps the count in
# the checkpoint, so this applies to new checkpoints only; older ones keep theirs.
STATE_PARTITIONS = {"faults": 1}


def to_restart(failed: dict[str, str], retries: dict[str, int]) -> list[str]:
    """The failed queries to start again: all of them, if each failed only because a Python
    worker started too slowly and has retries left; none if any failed for another reason."""
    again = [n for n, message in failed.items() if TRANSIENT in message and retries.get(n, 0) < START_RETRIES]
    return again if len(again) == len(failed) else []


def start_query(spark: SparkSession, name: str, writer: DataStreamWriter, **trigger: Any) -> StreamingQuery:
    """Start concern ``name``'s writer; Spark copies the session's settings when a query starts."""
    partitions = STATE_PARTITIONS.get(name)
    if partitions is None:
        return writer.trigger(**trigger).start()
    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    spark.conf.set(key, str(partitions))
    try:
        return writer.trigger(**trigger).start()
    finally:
        spark.conf.set(key, before)  # type: ignore[arg-type]  # the key always has a value (Spark's default)


WARM_JOB_GROUP = "faultwatch-warm-workers"
# Spark waits a fixed 10 s for a new Python worker to connect back; on a saturated machine its
# imports can take longer. The query is then restarted from its checkpoint, up to this many times.
TRANSIENT = "Python worker failed to connect back"
START_RETRIES = 3
WARM_JOIN_S = 60.0


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Start the executors' Python workers in the background, one per core, with a tiny job.

    Meant for the moment the session exists. Before a query's first tasks can run, Spark looks up
    and creates the data source, starts the source's Python runner, asks Kafka for offsets, plans
    the read in another Python process, and only then starts the executors' worker daemon and its
    workers (~1.3 s on this 2-core machine). This job does that last step meanwhile; the query's
    tasks then get the idle workers (Spark keeps them for reuse). Started once the queries had
    started, it competed with the read planning for the cores, and the first micro-batch waited
    for both (docs/performance.md). It then reads a source of no rows
    (:class:`streaming.kafka_source.PlannerWarmup`), which starts the read planner's Python
    process with the Kafka source's modules loaded; the first micro-batch reuses it.
    """

    def run() -> None:
        try:
            spark.sparkContext.setJobGroup(WARM_JOB_GROUP, "faultwatch: start the Python workers")
            n = max(1, spark.sparkContext.defaultParallelism)
            spark.range(n, numPartitions=n).mapInArrow(_pass_through, "id long").collect()
            from streaming.kafka_source import PlannerWarmup

            spark.dataSource.register(PlannerWarmup)
            spark.read.format(PlannerWarmup.name()).load().collect()
        except Exception as exc:  # noqa: BLE001 - only an optimisation: the queries start workers anyway
            log.debug("warming the Python workers failed: %s", exc)

    thread = threading.Thread(target=run, name="faultwatch-warm-workers", daemon=True)
    thread.start()
    return thread


def _pass_through(batches: Any) -> Any:
    return batches


def available_concerns() -> list[str]:
    out = []
    for name in DEFAULT_CONCERNS:
        module, _fn = CONCERNS[name]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        out.append(name)
    return out


def resolve_concerns(concerns: list[str] | None) -> list[str]:
    """The queries to run: ``concerns`` (deduplicated) or the defaults; ValueError on a bad mix."""
    names = list(dict.fromkeys(concerns or available_concerns()))
    unknown = [n for n in names if n not in CONCERNS]
    if unknown:
        raise ValueError(f"unknown concern(s) {unknown}; valid: {sorted(CONCERNS)}")
    for combined, parts in OVERLAPPING.items():
        clash = [p for p in parts if combined in names and p in names]
        if clash:
            raise ValueError(f"concern {combined} already writes what {clash} write; run one or the other")
    return names


def build_queries(
    spark: SparkSession, cfg: Config, concerns: list[str] | None = None
) -> dict[str, DataStreamWriter]:
    names = resolve_concerns(concerns)
    out = {}
    for name in names:
        module, fn = CONCERNS[name]
        builder: Callable[[Any, Config], DataStreamWriter] = getattr(importlib.import_module(module), fn)
        out[name] = builder(spark, cfg)
    return out


@dataclass
class Progress:
    """What the progress lines add up to, per query."""

    checkpoint: str = ""
    batches: int = 0
    rows_in: int = 0
    written: dict[str, int] = field(default_factory=dict)
    seen_batches: set[int] = field(default_factory=set)


def backlog_of(source: dict[str, Any]) -> int | None:
    """Records not yet read: latest offset minus end offset, summed over partitions."""
    try:
        latest = _offsets(source.get("latestOffset"))
        end = _offsets(source.get("endOffset"))
    except (TypeError, ValueError):
        return None
    if latest is None or end is None:
        return None
    return sum(max(0, v - end.get(k, 0)) for k, v in latest.items())


def _offsets(raw: Any) -> dict[str, int] | None:
    if raw is None:
        return None
    obj = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(obj, dict):
        return None
    return {str(k): int(v) for k, v in obj.items() if not str(k).startswith("_")}  # "_": not a partition


def report_batches(name: str, query: StreamingQuery, prog: Progress, out: TextIO) -> None:
    from streaming.delta_sink import MAINTENANCE, read_report, report_dir

    # recentProgress converts every retained batch's progress (up to 100) through py4j on each
    # call; _watch calls this twice a second, so ask for it only when there is a batch not seen yet.
    last = query.lastProgress
    if last is None or int(last["batchId"]) in prog.seen_batches:
        return
    for p in query.recentProgress:
        batch = int(p["batchId"])
        if batch in prog.seen_batches:
            continue
        prog.seen_batches.add(batch)
        rows = int(p.get("numInputRows", 0))
        sources = p.get("sources") or [{}]
        backlog = backlog_of(sources[0])
        counts = read_report(report_dir(prog.checkpoint), batch) or {}
        rows = counts.pop("_events_in", rows)  # chunked queries carry many events per Spark row
        upkeep = counts.pop(MAINTENANCE, None)
        if rows == 0 and not counts:
            continue
        prog.batches += 1
        prog.rows_in += rows
        for table, n in counts.items():
            prog.written[table] = prog.written.get(table, 0) + n
        quarantined = counts.get("quarantine", 0)
        written = sum(n for t, n in counts.items() if t != "quarantine")
        secs = p.get("durationMs", {}).get("triggerExecution", 0) / 1000
        print(
            f"[{name}] batch {batch}: in={rows} written={written} quarantined={quarantined} "
            f"backlog={'?' if backlog is None else backlog}{_state_text(p)} ({secs:.1f}s)"
            + (f" maintenance: {upkeep}" if upkeep else ""),
            file=out,
            flush=True,
        )

def _state_text(progress: dict[str, Any]) -> str:
    """`` state=<rows> rows/<size>`` for a stateful query's progress, empty for a stateless one."""
    ops = progress.get("stateOperators") or []
    if not ops:
        return ""
    rows = sum(int(op.get("numRowsTotal", 0)) for op in ops)
    size = sum(int((op.get("customMetrics") or {}).get("stateOnCurrentVersionSizeBytes", 0))
               or int(op.get("memoryUsedBytes", 0)) for op in ops)
    return f" state={rows} rows/{size / 2**20:.2f}MiB"


def run_stream(
    cfg: Config,
    once: bool = False,
    duration_s: float | None = None,
    concerns: list[str] | None = None,
    spark: SparkSession | None = None,
    out: TextIO = sys.stdout,
    on_tick: Callable[[], None] | None = None,
    until: Callable[[int | None], bool] | None = None,
) -> int:
    """Run the streaming job; returns a process exit code (0 ok, 1 a query failed).

    ``until(settled_ms)`` ends the run early once it returns True; it is given the event time the
    job has settled so far (:func:`settled_ms`), so a caller can end when the story it waits for is
    told in event time, not on the wall clock (the demo does).
    """
    from streaming.delta_sink import checkpoint_dir
    from streaming.session import spark_session

    concerns = resolve_concerns(concerns)
    print(f"faultwatch stream: {describe(cfg)}", file=out, flush=True)
    own_session = spark is None
    spark = spark or spark_session(cfg)
    warm = warm_python_workers(spark)  # before the queries are built: the workers start while Spark plans
    writers = build_queries(spark, cfg, concerns)
    queries: dict[str, StreamingQuery] = {}
    progress = {name: Progress(checkpoint=checkpoint_dir(cfg, name)) for name in writers}
    stop = {"requested": False}

    def _request_stop(signum: int, _frame: object) -> None:
        stop["requested"] = True

    previous = {s: signal.signal(s, _request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    trigger = {"availableNow": True} if once else {"processingTime": f"{cfg.stream.trigger_interval_s} seconds"}
    try:
        for name, writer in writers.items():
            queries[name] = start_query(spark, name, writer, **trigger)
        print(f"started: {', '.join(queries)} ({'until caught up' if once else 'until stopped'})", file=out)
        deadline = None if duration_s is None else time.monotonic() + duration_s
        retries = {name: 0 for name in queries}
        while True:
            failed = _watch(queries, progress, stop, deadline, out, on_tick, until)
            again = to_restart(failed, retries)
            if not again:
                break
            for name in again:  # the checkpoint makes a restart exact: nothing is lost or doubled
                retries[name] += 1
                print(f"[{name}] a Python worker did not start within Spark's 10 s (a busy machine?); "
                      f"restarting the query, attempt {retries[name]} of {START_RETRIES}", file=out, flush=True)
                queries[name] = start_query(spark, name, writers[name], **trigger)
    finally:
        for q in queries.values():
            if q.isActive:
                q.stop()
        # A run with nothing to read can end first; a session stopped under the warm-up job's
        # tasks logs accumulator errors for them. The job takes seconds.
        warm.join(timeout=WARM_JOIN_S)
        for name, q in queries.items():
            report_batches(name, q, progress[name], out)
        for s, handler in previous.items():
            signal.signal(s, handler)
        if own_session:  # stop Spark's Python processes while the JVM can still pass on what they print
            spark.stop()
    for name, prog in progress.items():
        written = ", ".join(f"{t}={n}" for t, n in sorted(prog.written.items())) or "nothing"
        print(f"[{name}] total: {prog.batches} batches, {prog.rows_in} rows in; written {written}", file=out)
    if failed:
        for name, message in failed.items():
            print(f"faultwatch stream: query {name} failed: {message}", file=sys.stderr, flush=True)
        return 1
    return 0


def _watch(
    queries: dict[str, StreamingQuery],
    progress: dict[str, Progress],
    stop: dict[str, bool],
    deadline: float | None,
    out: TextIO,
    on_tick: Callable[[], None] | None,
    until: Callable[[int | None], bool] | None = None,
) -> dict[str, str]:
    failed: dict[str, str] = {}
    while not stop["requested"]:
        for name, q in queries.items():
            report_batches(name, q, progress[name], out)
            exc = q.exception()
            if exc is not None:
                failed[name] = _short_error(exc)
        active = [q for q in queries.values() if q.isActive]
        if failed or not active:
            break
        if deadline is not None and time.monotonic() > deadline:
            break
        if on_tick is not None:
            on_tick()
        if until is not None and until(settled_ms(queries.values())):
            break
        _wait_for_end(active[0], 0.5)
    return failed


def settled_ms(queries: Iterable[StreamingQuery]) -> int | None:
    """The event time every query has settled (its last batch's settle point), None before a batch.

    Read from the source's end offsets in the last progress, where the settle point travels
    (:func:`streaming.kafka_source.settle_point`).
    """
    from streaming.kafka_source import SETTLE

    points = []
    for q in queries:
        last: dict[str, Any] = dict(q.lastProgress or {})
        sources = last.get("sources") or [{}]
        end = sources[0].get("endOffset")
        try:
            offsets = json.loads(end) if isinstance(end, str) else end
            points.append(int(offsets[SETTLE]))
        except (TypeError, ValueError, KeyError):
            return None
    return min(points) if points else None


def _wait_for_end(query: StreamingQuery, seconds: float) -> None:
    """Sleep up to ``seconds``, waking as soon as ``query`` ends (``--once`` exits without a poll's delay)."""
    from pyspark.errors import StreamingQueryException

    try:
        query.awaitTermination(seconds)  # type: ignore[arg-type]  # pyspark takes float seconds; its stubs say int
    except StreamingQueryException:
        pass  # _watch reads it from query.exception() and reports it


def _short_error(exc: Any) -> str:
    """The Python error at the bottom of a StreamingQueryException, not a JVM stack trace."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error:" in ln or "Exception:" in ln) and not ln.startswith("at "):
            return ln[:2000]
    return (lines[0] if lines else repr(exc))[:2000]
