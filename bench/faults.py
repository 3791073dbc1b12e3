"""Fault-state throughput, memory, state size and detection latency, in one run.

    .venv/bin/python bench/faults.py [--events 1000000] [--live-s 60] [--rate 5000]

1. starts a local broker (Tansu) and preloads N send results over 50 brokers and 500 producers,
   each producer's in time order (slow sends, failures, one broker failing for a minute);
2. runs each configuration as its own process the way ``faultwatch stream --once`` does
   (``streaming.job``'s query builders, availableNow trigger, a warm-up run on a small topic first):
   (a) bronze only; (b) bronze + faults as two queries (each reads Kafka); (c) bronze + faults as
   one query (``bronze_faults``); with ``--shapes ...,default`` the default job. Prints events/s,
   the ratio to (a), peak RSS and per micro-batch its duration and the fault state's size;
3. live, for each shape but (a): a 1 s trigger while another process (nice 10) sends ``--rate``
   wall-clock-stamped events/s and this one polls ``producer_fault_windows_live`` every 100 ms.
   Detection latency = when a window's first row became readable minus its start, over windows
   opened after a warm-up; and per live micro-batch its duration and its WAL and commit steps.
``--live-only`` skips steps 1-2 (~2 minutes per shape); ``--compact-every N`` adds table upkeep (a
compaction per table every N batches, a vacuum every ``--vacuum-every-s``). ``--writer
deltalake,delta-spark`` runs step 3 with each Delta writer (``storage.writer``) in ``--pairs``
alternated pairs, each on a topic of its own. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import log_tail, run_measured, run_parallel
from pipeline.config import Config

BROKERS, PRODUCERS = 50, 500
SHAPES = {"bronze": "bronze only", "separate": "bronze + faults, two queries", "combined": "bronze + faults, one query",
          "default": "the default job (+ lag)"}


# -- data --------------------------------------------------------------------------------------
def _produce_slice(bootstrap: str, topic: str, n: int, part: int, parts: int) -> None:
    import numpy as np
    from kafka import KafkaProducer

    from schemas.events import SendResult
    from tests.doubles.faults_synth import bulk_stream

    cols = bulk_stream(n, brokers=BROKERS, producers=PRODUCERS)
    lists = {f: cols[f].tolist() for f in SendResult.__dataclass_fields__ if f in cols}
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024,
                             max_request_size=8 * 1024 * 1024)
    # Each producer client's results are sent by one preload process, in time order, as a client
    # reports its own sends. Splitting by event instead interleaves two writers' batches in every
    # partition, so a producer's results would reach Kafka seconds out of order.
    owner = np.unique(cols["client_id"], return_inverse=True)[1] % parts
    for i in np.flatnonzero(owner == part).tolist():
        e = SendResult(**{f: values[i] for f, values in lists.items()})
        producer.send(topic, key=e.key(), value=e.to_json())
    producer.flush()
    producer.close()


def preload(bootstrap: str, topic: str, n: int, procs: int = 2) -> float:
    return run_parallel(_produce_slice, [(bootstrap, topic, n, i, procs) for i in range(procs)])


def _live_producer(bootstrap: str, topic: str, rate: int, seconds: float, seed: int) -> None:
    """Send ``rate`` events/s stamped with the wall clock: healthy, with slow sends and failures."""
    import random

    from kafka import KafkaProducer

    from schemas.events import SendResult
    from tests.doubles.faults_synth import ERRORS

    # Below the job's priority: in production the producers run on other machines; here the
    # generator (~0.6 of a core at 5,000 events/s) would otherwise compete with the job for the
    # two cores as an equal. Events are stamped when sent, so a delayed send adds no latency.
    os.nice(10)
    rng = random.Random(seed)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024)
    start = time.time()
    sent = 0
    while time.time() - start < seconds:
        due = int((time.time() - start) * rate)
        while sent < due:
            now = int(time.time() * 1000)
            p, b = rng.randrange(PRODUCERS), rng.randrange(BROKERS)
            r = rng.random()
            failed = r < 0.001
            latency = rng.randrange(600, 4000) if r < 0.003 else rng.randrange(1, 30)
            e = SendResult(
                event_id=f"live-{seed}-{sent}", ts_ms=now, cluster="c1", producer_group=f"PG_{p % 10}",
                client_id=f"10.1.{p // 250}.{p % 250}@{2000 + p}", client_version="4.9.8" if p % 2 else "5.3.3",
                topic="TopicLive", broker_name=f"broker-{b:02d}", queue_id=rng.randrange(8),
                status="FAILED" if failed else "SEND_OK", latency_ms=latency, error=ERRORS[0] if failed else None,
                queue_offset=None if failed else sent, attempt=0, send_latency_fault_enable=True,
            )
            producer.send(topic, key=e.key(), value=e.to_json(), timestamp_ms=now)
            sent += 1
        time.sleep(0.01)
    producer.flush()
    producer.close()


# -- child: one configuration in its own process -----------------------------------------------
def bench_config(bootstrap: str, topic: str, work: Path, name: str, **extra: Any) -> Config:
    cfg = Config().replace(
        kafka__bootstrap_servers=bootstrap, topics__send_results=topic,
        storage__root=str(work / name / "tables"), storage__checkpoint_root=str(work / name / "checkpoints"),
        storage__publish_dir=str(work / name / "avoidance"),
    )
    return cfg.replace(**extra) if extra else cfg


def maintenance_settings(compact_every: int, vacuum_every_s: float) -> dict[str, Any]:
    """Table upkeep for the live run: off (``compact_every`` 0), or a schedule denser than the default
    so that a short run carries many steps."""
    if compact_every <= 0:
        return {"maintenance__enabled": False}
    return {"maintenance__compact_every_batches": compact_every, "maintenance__vacuum_interval_s": vacuum_every_s}


CONCERNS = {"bronze": ["bronze"], "separate": ["bronze", "faults"], "combined": ["bronze_faults"],
            "default": ["combined"]}


def writers(spark: Any, cfg: Config, shape: str) -> dict[str, Any]:
    """The unstarted queries ``faultwatch stream --only ...`` builds for that shape."""
    from streaming.job import build_queries

    return dict(build_queries(spark, cfg, CONCERNS[shape]))


def child(args: argparse.Namespace) -> None:
    from streaming.faults_query import state_metrics
    from streaming.job import start_query
    from streaming.session import spark_session

    work = Path(args.work)
    common: dict[str, Any] = {"stream__max_events_per_batch": args.max_batch}
    if args.writer:
        common["storage__writer"] = args.writer
    name = f"{args.shape}{args.tag or ''}"
    spark = spark_session(bench_config(args.bootstrap, args.warm_topic, work, f"{name}-warm", **common))
    # a warm-up run on a small topic first (JIT, Python workers, first-query costs); live: only that
    runs = [(f"{name}-warm", args.warm_topic)] + ([(name, args.topic)] if args.mode == "once" else [])
    for run, topic in runs:
        cfg = bench_config(args.bootstrap, topic, work, run, **common)
        t0 = time.perf_counter()
        queries = {n: start_query(spark, n, w, availableNow=True) for n, w in writers(spark, cfg, args.shape).items()}
        for q in queries.values():
            q.awaitTermination()
        secs = time.perf_counter() - t0
    states = [(state_metrics(p) if p.get("stateOperators") else {})
              | {"query": n, "batch": p["batchId"], "seconds": p["durationMs"].get("triggerExecution", 0) / 1000}
              for n, q in queries.items() for p in q.recentProgress]
    print("RESULT " + json.dumps({"seconds": secs, "states": states}), flush=True)
    if args.mode == "live":
        cfg = bench_config(args.bootstrap, args.topic, work, name, stream__trigger_interval_s=1.0,
                           **common, **maintenance_settings(args.compact_every, args.vacuum_every_s))
        live = [start_query(spark, n, w, processingTime="1 second") for n, w in writers(spark, cfg, args.shape).items()]
        print("STARTED " + cfg.storage.root, flush=True)
        time.sleep(args.live_s)
        batches = [{"seconds": p["durationMs"].get("triggerExecution", 0) / 1000,
                    "wal_ms": p["durationMs"].get("walCommit", 0), "commit_ms": p["durationMs"].get("commitOffsets", 0)}
                   for q in live for p in q.recentProgress[5:]]  # (the first ones warm up)
        for q in live:
            q.stop()
        print("LIVE " + json.dumps(batches), flush=True)
    spark.stop()


# -- parent ------------------------------------------------------------------------------------
def live_runs(shapes: list[str], writers: list[str], pairs: int) -> list[tuple[str, str, str]]:
    """(shape, writer, tag) of each live run in order: per shape one run (the configured writer, or
    the one named), or with two writers ``pairs`` alternated pairs; the tag keeps their topics,
    tables and checkpoints apart."""
    if len(writers) < 2:
        return [(shape, writers[0] if writers else "", "") for shape in shapes]
    out = []
    for shape in shapes:
        for pair in range(pairs):
            order = writers if pair % 2 == 0 else writers[::-1]
            out += [(shape, w, f"-{w}-{pair + 1}") for w in order]
    return out


def run_child(base: list[str], extra: list[str], on_line: Any = None) -> tuple[dict[str, Any], int]:
    """Run one child; its RESULT (and LIVE batches, under ``live_batches``) and peak RSS."""
    work = Path(base[base.index("--work") + 1])
    log = work / f"child-{len(list(work.glob('child-*.log')))}.log"
    result: dict[str, Any] = {}

    def line(text: str) -> None:
        if text.startswith("RESULT "):
            result.update(json.loads(text[7:]))
        elif text.startswith("LIVE "):
            result["live_batches"] = json.loads(text[5:])
        elif on_line is not None:
            on_line(text)

    code, peak = run_measured([sys.executable, __file__, "--child", *base, *extra], log, line, REPO)
    if code != 0:
        raise SystemExit(f"child {extra} failed with exit code {code}; last lines of {log}:\n{log_tail(log)}")
    return result, peak


def poll_windows(root: str, stop: threading.Event, seen: dict[str, tuple[int, float]], cpu: list[float]) -> None:
    """Record the wall time at which each window id's first row became readable in Delta; the
    poller's own CPU seconds go to ``cpu`` (it shares the machine with the job it measures)."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = str(Path(root) / "producer_fault_windows_live")
    files: set[str] = set()
    dt = None
    while not stop.is_set():
        # The table stays loaded and is read forward: loading it anew each time reads its whole
        # log, whose cost grows with every commit and takes CPU from the job being measured.
        try:
            if dt is None:
                dt = DeltaTable(path)
            else:
                dt.update_incremental()
            uris = set(dt.file_uris())
        except TableNotFoundError:
            time.sleep(0.1)
            continue
        now = time.time()
        for uri in sorted(uris - files):
            for r in pq.read_table(uri.removeprefix("file://"), columns=["window_id", "start_ms"]).to_pylist():
                seen.setdefault(r["window_id"], (r["start_ms"], now))
        files |= uris
        time.sleep(0.1)
    cpu.append(time.thread_time())


def live(base: list[str], shape: str, topic: str, bootstrap: str, rate: int, seconds: float,
         more: tuple[str, ...] = ()) -> tuple[list[float], int, list[dict[str, float]], float]:
    seen: dict[str, tuple[int, float]] = {}
    poll_cpu: list[float] = []
    stop = threading.Event()
    began: list[float] = []
    threads: list[threading.Thread] = []

    def on_line(line: str) -> None:
        if line.startswith("STARTED ") and not began:
            began.append(time.time())
            poller = threading.Thread(target=poll_windows, args=(line[8:].strip(), stop, seen, poll_cpu), daemon=True)
            sender = threading.Thread(target=_send_for, args=(bootstrap, topic, rate, seconds - 15), daemon=True)
            threads.extend([poller, sender])
            poller.start()
            sender.start()

    res, peak = run_child(base, ["--mode", "live", "--shape", shape, "--topic", topic, "--live-s", str(seconds), *more],
                          on_line)
    stop.set()
    for t in threads:
        t.join()
    cutoff = (began[0] + 15) * 1000 if began else 0
    latencies = sorted(at - start / 1000 for start, at in seen.values() if start >= cutoff)
    return latencies, peak, res.get("live_batches", []), sum(poll_cpu)


def _send_for(bootstrap: str, topic: str, rate: int, seconds: float) -> None:
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_live_producer, args=(bootstrap, topic, rate, seconds, 5))
    p.start()
    p.join()


def pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=Config().stream.max_events_per_batch,
                    help="events per micro-batch (default: the config default)")
    ap.add_argument("--live-s", type=float, default=75.0)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--shapes", default="bronze,separate,combined")
    ap.add_argument("--live-only", action="store_true", help="only the live runs (no big preload, no once runs)")
    ap.add_argument("--compact-every", type=int, default=0,
                    help="live runs: compact each table every N micro-batches (0: table upkeep off)")
    ap.add_argument("--vacuum-every-s", type=float, default=30.0, help="live runs with upkeep: vacuum each table this often")
    ap.add_argument("--writer", default="",
                    help="live runs: storage.writer; two, comma-separated (deltalake,delta-spark): each in "
                         "--pairs alternated pairs")
    ap.add_argument("--pairs", type=int, default=1, help="--writer with two writers: alternated pairs per shape")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("mode", "shape", "bootstrap", "topic", "warm-topic", "work", "tag"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from pipeline.kafka_local import start_local_kafka

    n = args.events
    work = Path(tempfile.mkdtemp(prefix="faultwatch-bench-faults-"))
    print(f"bench/faults: {'live only' if args.live_only else f'{n} send results'}, {BROKERS} brokers, {PRODUCERS} producers, {args.partitions} partitions, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)
    names = [w for w in args.writer.split(",") if w]
    if any(w not in ("deltalake", "delta-spark") for w in names) or len(names) > 2:
        raise SystemExit(f"--writer: one or two of deltalake, delta-spark; got {args.writer!r}")
    runs = live_runs([s for s in args.shapes.split(",") if s != "bronze"], names, args.pairs)
    topics = ["bench.warm", "bench.send-results", *(f"bench.live-{s}{t}" for s, _, t in runs), *Config().topics.all()]
    with start_local_kafka(topics=topics, partitions=args.partitions) as kafka:
        secs = preload(kafka.bootstrap, "bench.send-results", n) if not args.live_only else 0.0
        preload(kafka.bootstrap, "bench.warm", 20_000)
        if not args.live_only:
            print(f"preload: {n / secs:,.0f} events/s ({secs:.1f}s)", flush=True)
        base = ["--bootstrap", kafka.bootstrap, "--warm-topic", "bench.warm", "--work", str(work),
                "--max-batch", str(args.max_batch), "--compact-every", str(args.compact_every),
                "--vacuum-every-s", str(args.vacuum_every_s)]
        results = {}
        for shape in args.shapes.split(",") if not args.live_only else []:
            res, peak = run_child(base, ["--mode", "once", "--shape", shape, "--topic", "bench.send-results"])
            results[shape] = res
            ratio = results["bronze"]["seconds"] / res["seconds"] if "bronze" in results else float("nan")
            print(f"({shape}) {SHAPES[shape]:<30} {n / res['seconds']:>8,.0f} events/s ({res['seconds']:.1f}s), "
                  f"ratio to bronze {ratio:.2f}, peak RSS {peak / 2**30:.2f} GiB, load {os.getloadavg()[0]:.1f}",
                  flush=True)
            for s in res["states"]:
                state = (f", state {s['state_current_version_bytes'] / 2**20:.1f} MiB (store memory "
                         f"{s['state_memory_bytes'] / 2**20:.1f} MiB)" if "state_memory_bytes" in s else "")
                print(f"    {s['query']} batch {s['batch']}: {s['seconds']:.1f}s{state}")
        for shape, writer, tag in runs:
            more = ("--writer", writer, f"--tag={tag}") if writer else ()
            lat, peak, batches, poll_cpu = live(base, shape, f"bench.live-{shape}{tag}", kafka.bootstrap, args.rate,
                                                args.live_s, more)
            print(f"({shape}{', ' + writer if writer else ''}) detection latency at {args.rate}/s, 1 s trigger: p50 {pct(lat, 50):.2f}s, "
                  f"p95 {pct(lat, 95):.2f}s, max {max(lat) if lat else float('nan'):.2f}s over {len(lat)} windows; "
                  f"peak RSS {peak / 2**30:.2f} GiB, load {os.getloadavg()[0]:.1f}", flush=True)
            took = [b["seconds"] for b in batches]
            print(f"    {len(batches)} live micro-batches: p50 {pct(took, 50):.2f}s, p95 {pct(took, 95):.2f}s; "
                  f"WAL {pct([b['wal_ms'] for b in batches], 50):.0f} ms, offset commit "
                  f"{pct([b['commit_ms'] for b in batches], 50):.0f} ms (p50); the Delta poller used {poll_cpu:.1f} CPU-s",
                  flush=True)


if __name__ == "__main__":
    main()
