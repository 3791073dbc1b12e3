"""The streaming job users run, over a realistic backlog, against the raw consume ceiling.

    .venv/bin/python bench/stream.py [--events 2000000] [--clusters 4] [--skip-scaling] [--pairs 3]
                                     [--compression zstd|gzip|none] [--brokers apache,tansu]
    .venv/bin/python bench/stream.py --fleet 1,10,100 [--rounds 2] [--max-events-per-batch N]
    .venv/bin/python bench/stream.py --writer deltalake,delta-spark [--pairs 3] [--brokers apache]

For each of ``--brokers`` it preloads a simulator backlog (``--clusters`` instances of
``bench/stream_backlog.toml``), reads it with one kafka-python consumer before and after the job
(the ceiling), runs ``faultwatch stream --once`` with the default concerns and prints events/s,
their ratio to the ceiling, ``late`` rows, peak RSS, stateful tasks and the broker's CPU. Unless
``--skip-scaling`` it also runs local[1] against local[2] and one against two standalone workers
in alternated pairs (the machine's speed drifts). ``--fleet`` runs the job over fleets of 1, 10
and 100 times the producer x broker pairs at the same event rate (bench/fleet.py), alternated, and
prints events/s, state per pair and peak RSS against the smallest fleet. ``--writer`` with two
writers (``storage.writer``) runs the job with each in alternated pairs instead; with one, the main
run uses it. Nothing asserts timings.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import log_tail, run_measured, run_parallel
from bench.fleet import alternated, pairs, parse_factors, producer_count, scale_fleet
from bench.ingest import consume_ceiling
from pipeline.config import Config
from pipeline.kafka_local import free_port, start_local_kafka
from pipeline.simulate.sinks import COMPRESSIONS

SCENARIO = REPO / "bench" / "stream_backlog.toml"
BIN = Path(sys.executable).parent
BATCH_LINE = re.compile(r"^\[([^\]]+)\] batch (\d+): in=(\d+) .*\((\d+(?:\.\d+)?)s\)")
TOTAL_LINE = re.compile(r"^\[([^\]]+)\] total: (\d+) batches, (\d+) rows in")
TASKS = re.compile(r"\btasks=(\d+)")
STATE = re.compile(r"\bstate=(\d+) rows/(\d+(?:\.\d+)?)MiB")


# --- the backlog --------------------------------------------------------------------------------


def instance_scenario(index: int, duration_s: float, fleet: int = 1):
    """The bench scenario for cluster ``bench-<index>``, ``duration_s`` long, its faults stretched with
    it, with ``fleet`` times its producer x broker pairs at the same event rate (bench/fleet.py)."""
    from pipeline.simulate import load_scenario

    base = scale_fleet(load_scenario(str(SCENARIO)), fleet)
    scale = duration_s / base.duration_s
    return base.replace(
        duration_s=duration_s,
        brokers=tuple(dataclasses.replace(b, cluster=f"bench-{index}") for b in base.brokers),
        faults=tuple(
            dataclasses.replace(f, start_s=f.start_s * scale, duration_s=f.duration_s and f.duration_s * scale)
            for f in base.faults
        ),
    )


def events_per_simulated_second(fleet: int = 1) -> float:
    """How many events one instance emits per simulated second (a short run into memory)."""
    from pipeline.simulate import MemorySink, Simulation

    stats = Simulation(instance_scenario(0, 10.0, fleet)).run(MemorySink())
    return stats.total / 10.0


def fleet_topics(fleet: int) -> dict[str, str]:
    """The event topics of a fleet's backlog: the default ones at 1, their own for a larger fleet."""
    topics = Config().topics
    if fleet == 1:
        return {}
    return {f.name: f"fleet{fleet}.{getattr(topics, f.name)}" for f in dataclasses.fields(topics)
            if f.name in ("send_results", "consumer_progress", "group_membership")}


def fleet_config(bootstrap: str, fleet: int) -> Config:
    return Config().replace(kafka__bootstrap_servers=bootstrap,
                            **{f"topics__{k}": v for k, v in fleet_topics(fleet).items()})


def _simulate_instance(bootstrap: str, index: int, duration_s: float, out: str, compression: str,
                       fleet: int = 1) -> None:
    """One cluster's simulation into Kafka (a spawned process); its event counts go to ``out``."""
    from pipeline.simulate import KafkaSink, Simulation

    class ClusterSink(KafkaSink):
        """Event ids are unique per simulation; the clusters' runs prefix theirs with the cluster."""

        def write(self, kind, rows):
            if kind == "send_result":
                rows = [[f"bench-{index}/{r[0]}", *r[1:]] for r in rows]
            super().write(kind, rows)

    cfg = fleet_config(bootstrap, fleet)
    stats = Simulation(instance_scenario(index, duration_s, fleet), seed=1 + index).run(
        ClusterSink(cfg, compression=compression), close=True)
    Path(out).write_text(json.dumps(stats.events))
    print(f"    cluster bench-{index}: {stats.total:,} events in {stats.wall_s:.1f}s", flush=True)


def preload(bootstrap: str, events: int, clusters: int, work: Path, compression: str = "zstd",
            fleet: int = 1, duration_s: float | None = None) -> dict[str, int]:
    """Simulate ``clusters`` clusters in parallel into Kafka (``fleet_topics(fleet)``), for
    ``duration_s`` or as long as ``events`` take; events per kind in all."""
    duration = duration_s or max(5.0, events / clusters / events_per_simulated_second(fleet))
    print(f"preload: {clusters} clusters x {duration:.0f}s of simulated time ({SCENARIO.name}"
          f"{f', fleet x{fleet}' if fleet != 1 else ''}), batches {compression}", flush=True)
    work.mkdir(parents=True, exist_ok=True)  # before sending: a retry after a late failure doubles the backlog
    outs = [work / f"preload-{fleet}-{i}.json" for i in range(clusters)]
    secs = run_parallel(_simulate_instance, [(bootstrap, i, duration, str(outs[i]), compression, fleet)
                                             for i in range(clusters)])
    counts: dict[str, int] = {}
    for out in outs:
        for kind, n in json.loads(out.read_text()).items():
            counts[kind] = counts.get(kind, 0) + n
    total = sum(counts.values())
    print(f"preload: {total:,} events ({counts}) at {total / secs:,.0f} events/s ({secs:.1f}s)", flush=True)
    return counts


def ceiling(bootstrap: str, counts: dict[str, int]) -> float:
    """Seconds for one kafka-python consumer to read every event topic, one after another."""
    topics = Config().topics.event_topics()
    return sum(consume_ceiling(bootstrap, topics[kind], n) for kind, n in counts.items() if n)


# --- one run of the job -------------------------------------------------------------------------


@dataclass
class QueryFigures:
    batches: int = 0
    events: int = 0
    batch_s: float = 0.0
    later_events: int = 0  # batches after the first, which also pays for the Python workers' start
    later_s: float = 0.0
    tasks: str | None = None
    total_events: int | None = None  # as its "total:" line says
    state_rows: int | None = None  # the state store after its last batch, as the batch line says
    state_bytes: int | None = None


@dataclass
class RunFigures:
    code: int = 0
    wall_s: float = 0.0
    startup_s: float = 0.0  # to the start of the first micro-batch
    processing_s: float = 0.0  # from there to the end of the last micro-batch (its line)
    stop_s: float = 0.0  # from there to the last "total:" line, printed once Spark has stopped
    peak_rss: int = 0
    queries: dict[str, QueryFigures] = field(default_factory=dict)
    cores_busy: float = float("nan")  # the whole machine's busy CPU over the processing, in cores


class MachineCpu:
    """The machine's busy CPU seconds (all processes, every core), sampled in the background.

    A one-core Spark worker keeps more than one core busy (its JVM, its Python workers, the driver
    beside it); on a two-core machine that bounds what a second worker can add.
    """

    def __init__(self, every_s: float = 0.25) -> None:
        import psutil

        self._psutil = psutil
        self.samples = [self._read()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _read(self) -> tuple[float, float]:
        t = self._psutil.cpu_times()
        return time.perf_counter(), sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(self._read())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._read())

    def cores(self, start: float, end: float) -> float:
        """Busy cores between two perf_counter instants (the samples nearest inside them)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan")
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else float("nan")


def write_config(path: Path, bootstrap: str, data: Path, master: str | None = None,
                 max_events_per_batch: int = 0, topics: dict[str, str] | None = None, writer: str = "",
                 grid_s: float = 0.0) -> Path:
    """The shipped defaults but for the broker, the storage and (optionally) the Spark master, the
    micro-batch size (0: the shipped default), the event topics, the Delta writer and the episode
    grid (``faults.evaluation_interval_s``; 0: the shipped default)."""
    text = (
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        f'[storage]\nroot = "{data}/tables"\ncheckpoint_root = "{data}/checkpoints"\npublish_dir = "{data}/avoidance"\n'
    )
    if writer:
        text += f'writer = "{writer}"\n'
    if master is not None:
        text += f'[spark]\nmaster = "{master}"\n'
    if max_events_per_batch:
        text += f"[stream]\nmax_events_per_batch = {max_events_per_batch}\n"
    if topics:
        text += "[topics]\n" + "".join(f'{k} = "{v}"\n' for k, v in topics.items())
    if grid_s:
        text += f"[faults]\nevaluation_interval_s = {grid_s}\n"
    path.write_text(text)
    return path


def run_job(args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> RunFigures:
    """Run one ``faultwatch stream --once`` (or its spark-submit) and collect what its output says."""
    r = RunFigures()
    t0 = time.perf_counter()
    first: list[float] = []
    ended: list[float] = []  # when each batch line came: --once ends its query right after the last
    done: list[float] = []

    def on_line(line: str) -> None:
        now = time.perf_counter()
        batch, total = BATCH_LINE.match(line), TOTAL_LINE.match(line)
        if batch:
            q = r.queries.setdefault(batch[1], QueryFigures())
            n, secs = int(batch[3]), float(batch[4])
            q.batches, q.events, q.batch_s = q.batches + 1, q.events + n, q.batch_s + secs
            if q.batches > 1:
                q.later_events, q.later_s = q.later_events + n, q.later_s + secs
            tasks = TASKS.search(line)
            if tasks:
                q.tasks = tasks[1]
            state = STATE.search(line)
            if state:
                q.state_rows, q.state_bytes = int(state[1]), round(float(state[2]) * 2**20)
            if not first:
                first.append(now - secs)  # the line comes when the batch is over
            ended.append(now)
            print("   ", line.rstrip(), flush=True)
        elif line.startswith("faultwatch stream: kafka="):  # the header: where it runs, the Spark master
            print("   ", line.rstrip(), flush=True)
        elif total:
            done.append(now)
            r.queries.setdefault(total[1], QueryFigures()).total_events = int(total[3])
            print("   ", line.rstrip(), flush=True)

    if env:  # through env(1), so that the measured process tree is still the job's own
        args = ["env", *(f"{k}={v}" for k, v in env.items()), *args]
    cpu = MachineCpu()
    try:
        r.code, r.peak_rss = run_measured(args, log, on_line, REPO)
    finally:
        cpu.stop()
    end = time.perf_counter()
    r.wall_s = end - t0
    start = first[0] if first else end
    r.startup_s = start - t0
    last = ended[-1] if ended else end
    r.processing_s = last - start
    r.stop_s = (done[-1] if done else end) - last
    r.cores_busy = cpu.cores(start, start + r.processing_s)
    return r


def stateful_tasks(checkpoints: Path, figures: RunFigures) -> dict[str, str]:
    """Each query's stateful stage's task count: as its progress lines say, else the number of state
    store partitions in its checkpoint (one task each), else n/a."""
    out = {}
    for name, q in figures.queries.items():
        if q.tasks is not None:
            out[name] = q.tasks
            continue
        ops = sorted((checkpoints / name / "state").glob("*"))
        parts = [len([p for p in op.iterdir() if p.name.isdigit()]) for op in ops if op.name.isdigit()]
        out[name] = "+".join(map(str, parts)) if parts else "n/a (stateless)"
    return out


def late_rows(tables: Path) -> int:
    import pyarrow.compute as pc

    from pipeline.deltaio import read_table

    return read_table(str(tables), "quarantine", columns=["reason"], filter=pc.field("reason") == "late").num_rows


def rates(r: RunFigures, events: int) -> tuple[float, float]:
    """(events/s over the whole process, events/s from the start of the first micro-batch on)."""
    return events / r.wall_s, events / r.processing_s if r.processing_s > 0 else float("nan")


def stream_args(conf: Path) -> list[str]:
    return [str(BIN / "faultwatch"), "stream", "--config", str(conf), "--once"]


def check(r: RunFigures, log: Path, what: str) -> bool:
    if r.code != 0:
        print(f"{what}: exited {r.code}; last lines of {log}:\n{log_tail(log)}", flush=True)
    return r.code == 0


# --- scaling ------------------------------------------------------------------------------------


def spark_env() -> dict[str, str]:
    """What pyspark's launch scripts need when this interpreter's bin folder is not on PATH."""
    import pyspark

    quiet = Path(sys.executable).with_name("faultwatch-python")  # as README's spark-submit command
    return {"SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": str(quiet) if quiet.exists() else sys.executable}


class StandaloneCluster:
    """A Spark master and one-core workers on loopback, as tests/integration/test_bronze_process.py runs them."""

    def __init__(self, work: Path) -> None:
        self.work, self.port = work, free_port()
        self.env = {**os.environ, **spark_env(), "SPARK_LOG_DIR": str(work), "SPARK_NO_DAEMONIZE": "1"}
        self.log = work / "cluster.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(free_port()))

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, cls: str, *args: str) -> None:
        with open(self.log, "ab") as out:
            self.procs.append(subprocess.Popen([str(BIN / "spark-class"), cls, *args], stdout=out,
                                               stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def add_worker(self) -> None:
        self.started += 1  # every worker started logs one registration
        self._start("org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--cores", "1",
                    "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(self.work / "work"))
        deadline = time.monotonic() + 120
        while self.log.read_text(errors="replace").count("Successfully registered with master") < self.started:
            if time.monotonic() > deadline:
                raise SystemExit(f"Spark worker {self.started} did not register within 120s:\n{log_tail(self.log)}")
            time.sleep(0.5)

    def remove_worker(self) -> None:
        """Stop the last worker started (the master drops it once its connection closes)."""
        proc = self.procs.pop()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
        time.sleep(2)

    def submit_args(self, conf: Path) -> list[str]:
        """spark-submit as README runs it: spark-submit starts the driver's JVM, so faultwatch's
        driver memory and JVM flags are given here (the executors get them from the session)."""
        from streaming.session import DEFAULT_DRIVER_MEMORY, DEFAULT_JAVA_OPTIONS

        return [str(BIN / "spark-submit"), "--master", self.url, "--conf", "spark.executor.memory=768m",
                "--driver-memory", DEFAULT_DRIVER_MEMORY, "--driver-java-options", DEFAULT_JAVA_OPTIONS,
                str(REPO / "faultwatch" / "cli.py"), "stream", "--config", str(conf), "--once"]

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def fresh(work: Path, name: str) -> Path:
    data = work / name
    shutil.rmtree(data, ignore_errors=True)
    return data


SAMPLE_RECORDS = 100_000
SAMPLE_ROUNDS = 5
CHUNK = 10_000  # records decoded at a time by the machine probe


def sample_send_results(bootstrap: str, path: Path, n: int = SAMPLE_RECORDS) -> int:
    """Write the first ``n`` send results of the backlog (every partition in turn) to ``path`` as
    length-prefixed values; how many there were."""
    from kafka import KafkaConsumer, TopicPartition

    topic = Config().topics.event_topics()["send_result"]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    consumer.assign(tps)
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < n and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500, max_records=5_000).values():
            values.extend(r.value for r in records if r.value is not None)
    consumer.close()
    values = values[:n]
    with path.open("wb") as out:
        for v in values:
            out.write(len(v).to_bytes(4, "big") + v)
    return len(values)


def _decode_sample(path: str, rounds: int) -> None:
    """The reader tasks' main work on the sample, ``rounds`` times: decode 10,000 records at a time
    (the job's own decoder) and write the rows as Parquet into memory."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from streaming.decode import BatchDecoder
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import output_tables

    data, values, pos = Path(path).read_bytes(), [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        values.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    decoder = BatchDecoder("send_result", output_tables(["send_result"]), 65_536)
    for _ in range(rounds):
        for lo in range(0, len(values), CHUNK):
            chunk = values[lo:lo + CHUNK]
            cols = RecordColumns()
            cols.offsets = list(range(lo, lo + len(chunk)))
            cols.timestamps = [0] * len(chunk)
            cols.keys = [None] * len(chunk)
            cols.values = chunk
            cols.headers = [None] * len(chunk)
            cols.sizes = [len(v) for v in chunk]
            pq.write_table(pa.Table.from_batches([decoder.decode("t", 0, cols)]), io.BytesIO(), compression="zstd")


def machine_scaling(bootstrap: str, work: Path, pairs: int) -> None:
    """The machine's own ratio on the job's kind of work: the sample decoded by one process, then
    by two at once (each the same work, its imports included), in alternated pairs; throughput
    ratio = 2 x one's time / two's time. Caches and memory traffic are shared too, so it may be
    below 2 on a machine whose cores are idle."""
    path = work / "sample.bin"
    n = sample_send_results(bootstrap, path)
    ratios = []
    for pair in range(pairs):
        secs = {}
        for procs in in_pair_order((1, 2), pair):
            secs[procs] = run_parallel(_decode_sample, [(str(path), SAMPLE_ROUNDS)] * procs)
        one, two = secs[1], secs[2]
        ratios.append(2 * one / two)
        print(f"machine (pair {pair + 1}): {n * SAMPLE_ROUNDS / one:,.0f} records/s decoded by one process, "
              f"{2 * n * SAMPLE_ROUNDS / two:,.0f} by two at once", flush=True)
    print_ratio("two processes / one, the job's decoding without Spark (the machine's bound)", ratios)


def in_pair_order(sides: tuple[T, T], pair: int) -> tuple[T, T]:
    """A pair's two sides, swapped every other pair: with a steady drift of the machine's speed
    (seen over minutes here), a fixed order would favour the side that always runs second."""
    return sides if pair % 2 == 0 else (sides[1], sides[0])


def scaling(bootstrap: str, work: Path, events: int, pairs: int) -> None:
    """local[1] vs local[2], then a standalone cluster with one vs two one-core workers: each in
    ``pairs`` alternated pairs (this machine's speed drifts within minutes), every pair's ratio
    and their median printed."""
    local: dict[str, list[RunFigures]] = {"local[1]": [], "local[2]": []}
    for pair in range(pairs):
        for master in in_pair_order(("local[1]", "local[2]"), pair):
            runs = local[master]
            print(f"run: faultwatch stream --once, spark.master {master} (pair {pair + 1})", flush=True)
            data = fresh(work, f"local{master[6]}")
            log = work / f"{data.name}.log"
            r = run_job(stream_args(write_config(work / f"{data.name}.toml", bootstrap, data, master)), log)
            if check(r, log, master):
                runs.append(r)
                print(f"{master}: {run_line(r, events)}", flush=True)
    print_ratios("local[2] / local[1]", local["local[2]"], local["local[1]"], events)

    cluster = StandaloneCluster(work)
    standalone: dict[int, list[RunFigures]] = {1: [], 2: []}
    try:
        cluster.add_worker()
        for pair in range(pairs):
            for workers in in_pair_order((1, 2), pair):
                if workers == 2:
                    cluster.add_worker()
                print(f"run: spark-submit on a standalone cluster, {workers} one-core worker(s) (pair {pair + 1})",
                      flush=True)
                data = fresh(work, f"standalone{workers}")
                conf = write_config(work / f"{data.name}.toml", bootstrap, data)
                log = work / f"{data.name}.log"
                r = run_job(cluster.submit_args(conf), log, env={**spark_env(), "FAULTWATCH_SPARK_MASTER": cluster.url})
                if check(r, log, f"standalone, {workers} worker(s)"):
                    standalone[workers].append(r)
                    print(f"standalone {workers} worker(s): {run_line(r, events)}", flush=True)
                if workers == 2:
                    cluster.remove_worker()
    finally:
        cluster.stop()
    print_ratios("standalone 2 workers / 1 worker", standalone[2], standalone[1], events)


def steady_rate(r: RunFigures) -> float:
    """Events/s over the micro-batches after the first (which also pays for the cold JVM code, the
    first use of the Python workers and the first state-store versions)."""
    events = sum(q.later_events for q in r.queries.values())
    secs = sum(q.later_s for q in r.queries.values())
    return events / secs if secs else float("nan")


def run_line(r: RunFigures, events: int) -> str:
    wall, processing = rates(r, events)
    return (f"{processing:,.0f} events/s processing ({steady_rate(r):,.0f} after the first micro-batch), "
            f"{wall:,.0f} wall; {r.cores_busy:.2f} cores busy")


def print_ratios(what: str, faster: list[RunFigures], slower: list[RunFigures], events: int) -> None:
    """The ratios of alternated runs: processing (the goal's figure), after the first micro-batch,
    and the machine's busy cores. At equal CPU per event the throughput ratio equals the busy-cores
    ratio, so that one is the bound the machine sets while one run leaves cores to the other's
    helpers (JVM, driver, broker)."""
    pairs = list(zip(faster, slower))
    print_ratio(what, [rates(a, events)[1] / rates(b, events)[1] for a, b in pairs])
    print_ratio(f"{what}, after the first micro-batch", [steady_rate(a) / steady_rate(b) for a, b in pairs])
    print_ratio(f"{what}, cores busy", [a.cores_busy / b.cores_busy for a, b in pairs])


def print_ratio(what: str, ratios: list[float]) -> None:
    """Each alternated pair's ratio and their median."""
    if ratios:
        pairs = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"ratio {what}: {statistics.median(ratios):.2f} (median of {len(ratios)} alternated pairs: {pairs})",
              flush=True)


def writers(bootstrap: str, work: Path, events: int, pairs: int, names: Sequence[str],
            max_events_per_batch: int, setting: str = "storage.writer") -> None:
    """The default job with each of two values of ``setting`` (``storage.writer``: two Delta
    writers; ``faults.evaluation_interval_s``: two episode grids), in ``pairs`` alternated pairs;
    each run's figures, then the ratios of the first value to the second."""
    runs: dict[str, list[RunFigures]] = {name: [] for name in names}
    for pair in range(pairs):
        for name in in_pair_order((names[0], names[1]), pair):
            print(f"run: faultwatch stream --once, {setting} {name} (pair {pair + 1}), "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            data = fresh(work, f"{setting.split('.')[0]}-{name}")
            log = work / f"{data.name}.log"
            choice = {"writer": name} if setting == "storage.writer" else {"grid_s": float(name)}
            conf = write_config(work / f"{data.name}.toml", bootstrap, data,
                                max_events_per_batch=max_events_per_batch, **choice)
            r = run_job(stream_args(conf), log)
            if check(r, log, name):
                runs[name].append(r)
                print(f"{name}: {run_line(r, events)}; peak RSS {r.peak_rss / 2**30:.2f} GiB; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print_ratios(f"{names[0]} / {names[1]}", runs[names[0]], runs[names[1]], events)


# --- main ---------------------------------------------------------------------------------------


def report(r: RunFigures, events: int, ceiling_rate: float, data: Path) -> None:
    wall, processing = rates(r, events)
    print(f"job: {events:,} events in {r.wall_s:.1f}s = {wall:,.0f} events/s wall "
          f"({r.startup_s:.1f}s of start-up before the first micro-batch)")
    print(f"job: {processing:,.0f} events/s processing ({r.processing_s:.1f}s from the start of the first "
          f"micro-batch to the end of the last; the machine's CPU busy meanwhile: {r.cores_busy:.2f} of "
          f"{os.cpu_count()} cores; then {r.stop_s:.1f}s to stop Spark and exit)")
    for name, q in r.queries.items():
        steady = f", after its first batch {q.later_events / q.later_s:,.0f}" if q.later_s else ""
        told = "" if q.total_events in (None, q.events) else f" (its total line: {q.total_events:,})"
        print(f"  [{name}] {q.batches} batches, {q.events:,} events in{told}, {q.batch_s:.1f}s of batches: "
              f"{q.events / q.batch_s if q.batch_s else float('nan'):,.0f} events/s{steady}")
    print(f"ratio against the ceiling (the mean of its readings before and after the job): "
          f"{processing / ceiling_rate:.2f} processing, {wall / ceiling_rate:.2f} wall")
    print(f"quarantine rows with reason late: {late_rows(data / 'tables'):,}")
    print(f"peak RSS of the process tree: {r.peak_rss / 2**30:.2f} GiB")
    tasks = ", ".join(f"{k}={v}" for k, v in stateful_tasks(data / "checkpoints", r).items())
    print(f"stateful stage tasks: {tasks or 'n/a'}", flush=True)


# --- a larger fleet -----------------------------------------------------------------------------


@dataclass
class FleetRun:
    """One ``--fleet`` run's figures."""

    fleet: int
    events: int
    processing: float  # events/s from the start of the first micro-batch to the end of the last
    batches: int
    state_rows: int | None  # the state store after the last batch, as the job reports it
    state_bytes: int | None
    disk_bytes: int  # the state store's folder under the checkpoint (every version it keeps)
    peak_rss: int
    pairs_seen: int  # distinct (cluster, producer, broker) in bronze send_results
    sends: int
    late: int


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pairs_seen(tables: Path) -> tuple[int, int]:
    """(distinct producer x broker pairs, send results) in the bronze ``send_results`` table."""
    from pipeline.deltaio import read_table

    keys = ["cluster", "client_id", "broker_name"]
    sends = read_table(str(tables), "send_results", columns=keys)
    return sends.group_by(keys).aggregate([]).num_rows, sends.num_rows


def fleet_run(bootstrap: str, work: Path, fleet: int, events: int, max_events_per_batch: int) -> FleetRun:
    """``faultwatch stream --once`` (default concerns) over the backlog of fleet ``fleet``."""
    data = fresh(work, f"fleet{fleet}")
    conf = write_config(work / f"fleet{fleet}.toml", bootstrap, data, max_events_per_batch=max_events_per_batch,
                        topics=fleet_topics(fleet))
    log = work / f"fleet{fleet}.log"
    r = run_job(stream_args(conf), log)
    if not check(r, log, f"fleet x{fleet}"):
        raise SystemExit(1)
    stateful = [q for q in r.queries.values() if q.state_bytes is not None]
    seen, sends = pairs_seen(data / "tables")
    return FleetRun(
        fleet, events, rates(r, events)[1], sum(q.batches for q in r.queries.values()),
        sum(q.state_rows or 0 for q in stateful) if stateful else None,
        sum(q.state_bytes or 0 for q in stateful) if stateful else None,
        sum(dir_bytes(d / "state") for d in (data / "checkpoints").iterdir() if (d / "state").is_dir()),
        r.peak_rss, seen, sends, late_rows(data / "tables"),
    )


def fleet_sizes(fleet: int, clusters: int) -> tuple[int, int, int]:
    """(brokers, producers, producer x broker pairs) of ``clusters`` clusters at fleet ``fleet``."""
    s = instance_scenario(0, 10.0, fleet)
    return clusters * len(s.brokers), clusters * producer_count(s), clusters * pairs(s)


def run_fleet(broker: str, factors: list[int], rounds: int, events: int, clusters: int, partitions: int,
              compression: str, max_events_per_batch: int, work: Path, warmup: bool = True) -> None:
    """Every fleet's backlog into one broker (its own topics), the same simulated time each, then
    the job over each in alternated order; a table and each size's ratios against the smallest."""
    topics = [t for f in factors for t in fleet_topics(f).values()]
    with start_broker(broker, [*Config().topics.all(), *topics], partitions) as kafka:
        duration = max(5.0, events / clusters / events_per_simulated_second())
        counts = {f: sum(preload(kafka.bootstrap, events, clusters, work, compression, f, duration).values())
                  for f in factors}
        runs: dict[int, list[FleetRun]] = {f: [] for f in factors}
        if warmup:  # the machine's first job run pays for cold caches (jars, Python imports)
            print(f"warm-up run (not counted): fleet x{factors[0]}", flush=True)
            print(f"warm-up: {fleet_line(fleet_run(kafka.bootstrap, work, factors[0], counts[factors[0]], max_events_per_batch))}",
                  flush=True)
        for n, fleet in enumerate(alternated(factors, rounds)):
            b, p, pr = fleet_sizes(fleet, clusters)
            print(f"run {n + 1}: fleet x{fleet} ({b} brokers, {p} producers, {pr:,} pairs), "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            run = fleet_run(kafka.bootstrap, work, fleet, counts[fleet], max_events_per_batch)
            runs[fleet].append(run)
            print(f"fleet x{fleet}: {fleet_line(run)}", flush=True)
    print_fleet(runs, clusters)


def fleet_line(r: FleetRun) -> str:
    state = "n/a" if r.state_bytes is None else f"{r.state_bytes / 2**20:.2f} MiB in {r.state_rows} rows"
    return (f"{r.events:,} events, {r.processing:,.0f} events/s processing in {r.batches} micro-batches; "
            f"state {state} (on disk {r.disk_bytes / 2**20:.1f} MiB); {r.pairs_seen:,} pairs seen, "
            f"{r.sends / max(r.pairs_seen, 1):,.1f} sends per pair; peak RSS {r.peak_rss / 2**30:.2f} GiB; "
            f"late {r.late}")


def print_fleet(runs: dict[int, list[FleetRun]], clusters: int) -> None:
    """The table (medians over the runs of each size) and the ratios against the smallest fleet,
    run by run in the order they alternated."""
    base = min(runs)
    print("| fleet | brokers | producers | pairs (seen) | sends per pair | events/s processing "
          "| vs smallest | state | bytes per pair | state on disk | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fleet, rs in runs.items():
        b, p, pr = fleet_sizes(fleet, clusters)
        ratios = [r.processing / o.processing for r, o in zip(rs, runs[base])]
        state = [r.state_bytes for r in rs if r.state_bytes is not None]
        st = statistics.median(state) if state else float("nan")
        seen = max(r.pairs_seen for r in rs)
        print(f"| x{fleet} | {b:,} | {p:,} | {pr:,} ({seen:,}) | {rs[0].sends / max(seen, 1):,.1f} "
              f"| {statistics.median(r.processing for r in rs):,.0f} ({', '.join(f'{r.processing:,.0f}' for r in rs)}) "
              f"| {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)}) "
              f"| {st / 2**20:.2f} MiB | {st / max(seen, 1):,.1f} "
              f"| {statistics.median(r.disk_bytes for r in rs) / 2**20:.1f} MiB "
              f"| {max(r.peak_rss for r in rs) / 2**30:.2f} GiB |", flush=True)


BROKERS = {"apache": "Apache Kafka (KRaft, pipeline/kafka_apache.py)", "tansu": "Tansu (the demo's broker)"}


def broker_cpu_s(broker: Any) -> float:
    """CPU seconds the broker's process has used so far (its share of the two cores the job wants)."""
    import psutil

    times = psutil.Process(broker.proc.pid).cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def start_broker(name: str, topics: Sequence[str], partitions: int) -> Iterator[Any]:
    """A fresh broker of kind ``name`` with ``topics``, stopped (and its data deleted) on exit."""
    if name not in BROKERS:
        raise SystemExit(f"unknown broker {name!r}: choose among {', '.join(BROKERS)}")
    if name == "apache":
        from pipeline.kafka_apache import start_apache_kafka

        broker: Any = start_apache_kafka(topics=topics, partitions=partitions)
    else:
        broker = start_local_kafka(topics=topics, partitions=partitions)
    try:
        yield broker
    finally:
        (broker.close if hasattr(broker, "close") else broker.stop)()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--clusters", type=int, default=4, help="simulated clusters, one process each (13 brokers each)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="a small backlog (60k events) for a smoke run")
    ap.add_argument("--skip-scaling", action="store_true", help="only the main run, no local[1] or standalone runs")
    ap.add_argument("--pairs", type=int, default=3, help="alternated pairs per scaling ratio (odd: a true median)")
    ap.add_argument("--brokers", default="apache,tansu",
                    help="brokers to run against, in order: apache (Apache Kafka, as production), tansu (the demo's)")
    ap.add_argument("--max-events-per-batch", type=int, default=0,
                    help="the main run's stream.max_events_per_batch (default: the shipped setting)")
    ap.add_argument("--compression", choices=COMPRESSIONS, default="zstd",
                    help="codec of the backlog's record batches (default zstd, as faultwatch simulate writes)")
    ap.add_argument("--fleet", default="",
                    help="instead of the runs above: fleets of these factors times the producer x broker pairs "
                         "(e.g. 1,10,100) at the same events and event rate, on the first of --brokers")
    ap.add_argument("--rounds", type=int, default=2,
                    help="--fleet: rounds over the sizes, every other one in reverse order (1,10,100,100,10,1)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="--fleet: no uncounted run of the first size before the measured ones")
    ap.add_argument("--writer", default="",
                    help="storage.writer of the main run; two, comma-separated (deltalake,delta-spark): "
                         "instead of the runs above, the job with each in --pairs alternated pairs")
    ap.add_argument("--grid-s", default="",
                    help="two faults.evaluation_interval_s values, comma-separated (5,1): instead of the runs "
                         "above, the job with each in --pairs alternated pairs")
    args = ap.parse_args()
    names = [w for w in args.writer.split(",") if w]
    if len(names) > 2 or any(w not in ("deltalake", "delta-spark") for w in names):
        raise SystemExit(f"--writer: one or two of deltalake, delta-spark; got {args.writer!r}")
    grids = [g for g in args.grid_s.split(",") if g]
    if grids and (len(grids) != 2 or names or not all(g.replace(".", "", 1).isdigit() for g in grids)):
        raise SystemExit(f"--grid-s: two numbers of seconds, without --writer; got {args.grid_s!r}")
    events_wanted = 60_000 if args.quick else args.events
    work = Path(tempfile.mkdtemp(prefix="faultwatch-bench-stream-"))
    cfg = Config()
    print(f"bench/stream: ~{events_wanted:,} events, {args.clusters} clusters, {args.partitions} partitions, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)
    if args.fleet:
        try:
            factors = parse_factors(args.fleet)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        run_fleet(args.brokers.split(",")[0], factors, args.rounds, events_wanted, args.clusters, args.partitions,
                  args.compression, args.max_events_per_batch, work, warmup=not args.no_warmup)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
        return
    for n, broker in enumerate(args.brokers.split(",")):
        with start_broker(broker, cfg.topics.all(), args.partitions) as kafka:
            print(f"== broker: {BROKERS[broker]} at {kafka.bootstrap}, load average {os.getloadavg()[0]:.1f}", flush=True)
            counts = preload(kafka.bootstrap, events_wanted, args.clusters, work, args.compression)
            events = sum(counts.values())
            if len(names) == 2:
                writers(kafka.bootstrap, work, events, args.pairs, names, args.max_events_per_batch)
                continue
            if grids:
                writers(kafka.bootstrap, work, events, args.pairs, grids, args.max_events_per_batch,
                        setting="faults.evaluation_interval_s")
                continue
            cpu = broker_cpu_s(kafka)
            secs = ceiling(kafka.bootstrap, counts)
            print(f"ceiling, raw kafka-python consume of every event topic in one process: "
                  f"{events / secs:,.0f} events/s ({secs:.1f}s; the broker's CPU meanwhile "
                  f"{broker_cpu_s(kafka) - cpu:.1f}s)", flush=True)
            print("run: faultwatch stream --once, default concerns", flush=True)
            data = fresh(work, f"main-{broker}")
            log = work / f"main-{broker}.log"
            cpu = broker_cpu_s(kafka)
            main_run = run_job(stream_args(write_config(work / f"main-{broker}.toml", kafka.bootstrap, data,
                                                           max_events_per_batch=args.max_events_per_batch,
                                                           writer=names[0] if names else "")), log)
            if not check(main_run, log, "faultwatch stream"):
                raise SystemExit(1)
            print(f"the broker's CPU over the whole run (start-up included): {broker_cpu_s(kafka) - cpu:.1f}s",
                  flush=True)
            # The ceiling again after the job: the ratio is against their mean, so a machine whose
            # load drifts during the run favours neither side (a lone reading moved it by x4).
            after = ceiling(kafka.bootstrap, counts)
            print(f"ceiling again after the job: {events / after:,.0f} events/s ({after:.1f}s)", flush=True)
            report(main_run, events, events / ((secs + after) / 2), data)
            if not args.skip_scaling and n == 0:  # the scaling ratios: on the first broker only
                machine_scaling(kafka.bootstrap, work, args.pairs)
                scaling(kafka.bootstrap, work, events, args.pairs)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
