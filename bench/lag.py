"""Benchmark of the lag query: 200 groups x 1,000 queues, progress every 5 s, plus send results.

Run: ``.venv/bin/python bench/lag.py [--groups 200] [--intervals 4] [--splits 2] [--no-spark]``.

Each 5 s interval of event time is cut into ``--splits`` micro-batches (default 2: 100,000 progress
events and 25,000 send results each). Prints:

1. the pure step (``pipeline.lag.step``): time per batch and events/s in steady state, next to a
   baseline run in this process on the same batches (a stateless lag: max offset per queue joined to
   the progress, summed per group, what an exporter computes per scrape) and their ratio; the size
   of the state (arrays in memory, and the encoded row Spark stores) and the encode+decode time;
2. the Spark query (file stream of routed bronze rows -> lag query -> ``noop`` or Delta sink): each
   micro-batch's duration, Spark's state-store figures, and peak RSS of the JVM and Python workers.

Goals: the state of 200,000 (group, queue) pairs within 2 GiB; a micro-batch of 100,000 progress
events in <= 5 s on this machine. Nothing here asserts: the tests check correctness, this prints.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import Config, LagConfig
from pipeline.lag import initial_state, step
from pipeline.lag.codec import decode_state, encode_state
from pipeline.lag.events import PROGRESS, SEND
from pipeline.lag.registry import LagState
from tests.doubles.lag_synth import Fleet, bronze_rows, fleet_batches

MIB = 1024 * 1024
GIB = 1024 * MIB


def baseline(frame: pd.DataFrame) -> pd.Series:
    """Stateless lag of one batch: max offset per queue, joined to progress, summed per group."""
    key = ["topic", "broker_name", "queue_id"]
    sends = frame[frame["kind"] == SEND]
    prog = frame[frame["kind"] == PROGRESS]
    head = sends.assign(m=sends["queue_offset"] + 1).groupby(key)["m"].max().rename("head")
    joined = prog.join(head, on=key)
    top = np.maximum(joined["head"].fillna(0).to_numpy(), joined["broker_offset"].to_numpy())
    return (
        pd.Series(np.maximum(top - joined["consumer_offset"].to_numpy(), 0))
        .groupby(joined["consumer_group"].to_numpy())
        .sum()
    )


def state_bytes(state: LagState) -> int:
    """Bytes held by the state's arrays, strings counted once each."""
    arrays: list[np.ndarray] = [state.group_names, state.topic_names, state.broker_names]
    for table in (state.queues, state.pairs, state.members, state.groups):
        arrays.extend(table.cols.values())
    arrays += [state.index.qkey, state.index.offset, state.index.store_ms]
    arrays += [state.windows.ts, state.windows.offset, state.windows.lag, state.windows.count]
    total, seen = 0, set()
    for arr in arrays:
        total += arr.nbytes
        if arr.dtype == object:
            for v in arr:
                if id(v) not in seen:
                    seen.add(id(v))
                    total += sys.getsizeof(v)
    return total


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def describe_batches(fleet: Fleet, batches: list[tuple[int, pd.DataFrame]]) -> None:
    _, frame = batches[1]
    kinds = frame["kind"].value_counts()
    print(
        f"fleet: {fleet.groups} groups x {fleet.queues:,} queues = {fleet.groups * fleet.queues:,} (group, queue) "
        f"pairs; {fleet.groups // fleet.groups_per_topic} topics, "
        f"{fleet.groups // fleet.groups_per_topic * fleet.queues:,} queues, {fleet.brokers} brokers"
    )
    print(
        f"batch: {kinds.get(PROGRESS, 0):,} progress + {kinds.get(SEND, 0):,} send results "
        f"({len(batches)} batches, {(batches[-1][0] - fleet.start_ms) // 1000} s of event time)"
    )


def bench_pure(batches: list[tuple[int, pd.DataFrame]], cfg: LagConfig) -> LagState:
    state = initial_state("c1", cfg)
    times, base = [], []
    for now, frame in batches:
        start = time.perf_counter()
        state, _ = step(state, frame, now, cfg)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        baseline(frame)
        base.append(time.perf_counter() - start)
    steady, steady_base = times[2:] or times, base[2:] or base
    events = statistics.mean(len(f) for _, f in batches[2:] or batches)
    p50, p50_base = statistics.median(steady), statistics.median(steady_base)
    print("\npure step (pipeline.lag.step), steady state (batches 3..):")
    print(f"  first batch (registers everything): {times[0]:.2f} s")
    print(f"  per batch: median {p50:.2f} s, max {max(steady):.2f} s -> {events / p50:,.0f} events/s")
    print(
        f"  baseline (stateless lag over the same batch): median {p50_base:.3f} s; step/baseline = {p50 / p50_base:.1f}x"
    )
    start = time.perf_counter()
    row = encode_state(state)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    decode_state(row, cfg.window_commits)
    decode_s = time.perf_counter() - start
    encoded = sum(len(v) for v in row if isinstance(v, bytes))
    print(
        f"  state: {len(state.pairs):,} pairs, {len(state.queues):,} queues, {len(state.index):,} index points; "
        f"arrays {state_bytes(state) / MIB:,.0f} MiB; encoded row {encoded / MIB:,.1f} MiB "
        f"(encode {encode_s:.2f} s, decode {decode_s:.2f} s)"
    )
    print(f"  peak RSS of this process so far: {peak_rss_mib():,.0f} MiB")
    return state


def proc_hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        out.extend(kids)
        frontier.extend(kids)
    return out


def _new_progress(query: Any, before: set[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(batches with rows, no-data batches) reported since ``before`` (progress timestamps)."""
    data: list[dict[str, Any]] = []
    for _ in range(50):  # progress events are posted just after the batch commits
        fresh = [p for p in query.recentProgress if p["timestamp"] not in before]
        data = [p for p in fresh if p["numInputRows"] > 0]
        if data:
            return data, [p for p in fresh if p["numInputRows"] == 0]
        time.sleep(0.1)
    return data, []


def _seconds(progress: list[dict[str, Any]], part: str = "triggerExecution") -> float:
    return sum(p["durationMs"].get(part, 0) for p in progress) / 1000


def _count_rows(key: Any, pdfs: Any, state: Any) -> Any:
    """Baseline stateful function: reads every row, keeps a count, emits one row."""
    n = sum(len(p) for p in pdfs) + (state.get[0] if state.exists else 0)
    state.update((n,))
    yield pd.DataFrame({"n": [n]})


def bench_spark(batches: list[tuple[int, pd.DataFrame]], cfg: Config, sink: str) -> list[float]:
    import pyarrow.parquet as pq
    from pyspark.sql.streaming.state import GroupStateTimeout

    from schemas.fields import spark_schema
    from schemas.tables import routed_fields
    from streaming.lag_query import LAG_TABLES, build_lag_output
    from streaming.session import spark_session

    work = Path(tempfile.mkdtemp(prefix="faultwatch-bench-lag-"))
    cfg = cfg.replace(storage__root=str(work / "tables"), storage__checkpoint_root=str(work / "checkpoints"))
    start = time.perf_counter()
    spark = spark_session(cfg)
    print(
        f"\nspark (file stream -> lag query -> {sink} sink): session in {time.perf_counter() - start:.1f} s"
    )
    inputs = ["send_results", "consumer_progress", "group_membership", "quarantine"]
    folders = {name: work / name for name in ("baseline", "lag")}
    streams = {}
    for name, folder in folders.items():
        folder.mkdir()
        streams[name] = spark.readStream.schema(spark_schema(routed_fields(inputs))).parquet(str(folder))
    baseline_q = (
        streams["baseline"]
        .groupBy("cluster")
        .applyInPandasWithState(_count_rows, "n long", "n long", "append", GroupStateTimeout.NoTimeout)
        .writeStream.format("noop")
        .option("checkpointLocation", str(work / "ck-baseline"))
        .start()
    )
    out = build_lag_output(streams["lag"], cfg)
    if sink == "delta":
        from streaming.delta_sink import write_routed

        writer = write_routed(out, cfg, "bench-lag", list(LAG_TABLES))
    else:
        writer = (
            out.writeStream.format("noop").option("checkpointLocation", str(work / "ck")).outputMode("append")
        )
    lag_q = writer.start()
    durations: list[float] = []
    try:
        for i, (_, frame) in enumerate(batches):
            table = bronze_rows(frame)
            results = {}
            for name, query in (("baseline", baseline_q), ("lag", lag_q)):
                before = {p["timestamp"] for p in query.recentProgress}
                pq.write_table(table, folders[name] / f"batch-{i:04d}.parquet")
                query.processAllAvailable()
                results[name] = _new_progress(query, before)
            data, idle = results["lag"]
            base = _seconds(results["baseline"][0])
            took = _seconds(data)
            durations.append(took)
            ops = data[-1]["stateOperators"] if data else []
            state = ops[0] if ops else {}
            print(
                f"  batch {i}: {len(frame):,} events in {took:.2f} s (addBatch {_seconds(data, 'addBatch'):.2f} s; "
                f"baseline {base:.2f} s, ratio {took / max(base, 1e-3):.1f}x; then a no-data batch "
                f"{_seconds(idle):.2f} s); state store {state.get('memoryUsedBytes', 0) / MIB:,.0f} MiB"
            )
        jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        workers = [
            p
            for p in descendants(jvm)
            if "pyspark" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        ]
        print(
            f"  peak RSS: JVM {proc_hwm_mib(jvm):,.0f} MiB; Python workers "
            f"{max((proc_hwm_mib(p) for p in workers), default=0):,.0f} MiB (largest of {len(workers)})"
        )
    finally:
        lag_q.stop()
        baseline_q.stop()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--brokers", type=int, default=4)
    parser.add_argument("--queues-per-broker", type=int, default=250)
    parser.add_argument("--intervals", type=int, default=4, help="5 s intervals of event time")
    parser.add_argument("--splits", type=int, default=2, help="micro-batches per interval")
    parser.add_argument("--sink", choices=("noop", "delta"), default="noop")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument(
        "--queue-row-interval",
        type=float,
        default=0.0,
        help="lag.queue_row_interval_s; 0 (default here) = a queue_lag row for every commit, the worst case",
    )
    args = parser.parse_args()

    fleet = Fleet(groups=args.groups, brokers=args.brokers, queues_per_broker=args.queues_per_broker)
    cfg = Config()
    print(
        f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (others' jobs slow this down)"
    )
    batches = list(fleet_batches(fleet, args.intervals, splits=args.splits))
    describe_batches(fleet, batches)
    state = bench_pure(batches, cfg.lag)
    pure_state = state_bytes(state)
    spark_times: list[float] = []
    if not args.no_spark:
        spark_times = bench_spark(batches, cfg, args.sink)
    print("\ngoals:")
    pairs = len(state.pairs)
    print(
        f"  state of {pairs:,} pairs within 2 GiB: {pure_state / MIB:,.0f} MiB in arrays -> "
        f"{'met' if pure_state < 2 * GIB else 'NOT met'}"
    )
    if spark_times:
        steady = spark_times[3:] or spark_times  # the first batches warm up the JVM and workers
        worst = max(steady)
        print(
            f"  micro-batch of {args.groups * fleet.queues // args.splits:,} progress events <= 5 s: "
            f"median {statistics.median(steady):.2f} s, max {worst:.2f} s -> {'met' if worst <= 5 else 'NOT met'}"
        )
    print(f"  load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
