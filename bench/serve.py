"""Benchmark of ``faultwatch serve``: /metrics and the group-status API under 200 concurrent requests.

Run: ``.venv/bin/python bench/serve.py [--seconds 30] [--concurrency 200] [--groups 1000] [--queues 10]``.

Builds Delta tables with ``--groups`` x ``--queues`` (group, queue) pairs (10,000 by default) over
5 clusters of 10 brokers (50 brokers), starts ``faultwatch serve`` as its own process refreshing
every second, and keeps appending new queue_lag and group_status rows while 200 client coroutines
(aiohttp, in this process) request /metrics and a random group's status for ``--seconds``.
Prints requests/s, p50/p99/max latency per endpoint (measured at the client, so they include the
client's own queueing on this shared machine), the refreshes done during the run and their
duration, and the server's peak RSS.

Goals: p99 <= 50 ms, and refreshes (which here read new files every second) never blocking a
request. Nothing here asserts: the tests check correctness, this prints.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import tree_rss
from schemas.tables import table

REPO = Path(__file__).resolve().parent.parent
BROKERS_PER_CLUSTER = 10
CLUSTERS = 5
STATUSES = ["OK", "OK", "OK", "WARN", "STALL", "STOP"]


def _columns(name: str, rows: dict[str, list]) -> pa.Table:
    spec = table(name)
    n = len(next(iter(rows.values())))
    defaults = {"string": "-", "int64": 0, "int32": 0, "float64": 0.0, "bool": False}
    data = {}
    for f in spec.fields:
        if f.name in rows:
            data[f.name] = rows[f.name]
        elif f.nullable:
            data[f.name] = [None] * n
        elif f.kind == "list<string>" or f.kind.startswith("map"):
            data[f.name] = [[] for _ in range(n)]
        else:
            data[f.name] = [f.enum[0] if f.enum else defaults[f.kind]] * n
    return pa.Table.from_pydict(data, schema=spec.arrow_schema())


def _write(root: Path, name: str, rows: dict[str, list]) -> None:
    from deltalake import write_deltalake

    spec = table(name)
    write_deltalake(str(root / name), _columns(name, rows), partition_by=list(spec.partition_by) or None, mode="append")


def group_names(groups: int) -> list[tuple[str, str]]:
    return [(f"cluster-{g % CLUSTERS}", f"CG_{g:05d}") for g in range(groups)]


def queue_rows(groups: int, queues: int, ts_ms: int, rng: random.Random) -> dict[str, list]:
    rows: dict[str, list] = {k: [] for k in ("cluster", "consumer_group", "topic", "broker_name", "queue_id", "ts_ms",
                                             "lag_messages", "time_lag_ms", "owner_client_id", "status", "event_date")}
    for cluster, group in group_names(groups):
        for q in range(queues):
            rows["cluster"].append(cluster)
            rows["consumer_group"].append(group)
            rows["topic"].append(f"Topic_{group}")
            rows["broker_name"].append(f"{cluster}-broker-{q % BROKERS_PER_CLUSTER}")
            rows["queue_id"].append(q // BROKERS_PER_CLUSTER)
            rows["ts_ms"].append(ts_ms)
            rows["lag_messages"].append(rng.randrange(0, 100_000))
            rows["time_lag_ms"].append(rng.randrange(0, 900_000))
            rows["owner_client_id"].append(f"10.0.{q}.1@{group}")
            rows["status"].append(rng.choice(STATUSES))
            rows["event_date"].append(time.strftime("%Y-%m-%d", time.gmtime(ts_ms / 1000)))
    return rows


def group_rows(groups: int, queues: int, ts_ms: int, rng: random.Random) -> dict[str, list]:
    names = group_names(groups)
    return {
        "cluster": [c for c, _ in names], "consumer_group": [g for _, g in names], "ts_ms": [ts_ms] * len(names),
        "status": [rng.choice(STATUSES) for _ in names], "total_lag": [rng.randrange(0, 10**6) for _ in names],
        "max_time_lag_ms": [rng.randrange(0, 900_000) for _ in names], "retry_lag": [0] * len(names),
        "dlq_lag": [0] * len(names), "worst_topic": [f"Topic_{g}" for _, g in names],
        "worst_broker": [f"{c}-broker-0" for c, _ in names], "worst_queue_id": [0] * len(names),
        "queues": [queues] * len(names),
        "event_date": [time.strftime("%Y-%m-%d", time.gmtime(ts_ms / 1000))] * len(names),
    }


def build_tables(root: Path, groups: int, queues: int) -> None:
    rng = random.Random(7)
    now = int(time.time() * 1000)
    for i in range(3):  # some history per pair
        _write(root, "queue_lag", queue_rows(groups, queues, now - (3 - i) * 60_000, rng))
        _write(root, "group_status", group_rows(groups, queues, now - (3 - i) * 60_000, rng))
    brokers = [(f"cluster-{c}", f"cluster-{c}-broker-{b}") for c in range(CLUSTERS) for b in range(BROKERS_PER_CLUSTER)]
    minutes = [now - m * 60_000 for m in range(10, 0, -1)]
    _write(root, "broker_health", {
        "cluster": [c for c, _ in brokers for _ in minutes], "broker_name": [b for _, b in brokers for _ in minutes],
        "minute_ms": [m for _ in brokers for m in minutes], "sends": [6000] * (len(brokers) * len(minutes)),
        "failure_rate": [rng.random() * 0.05 for _ in range(len(brokers) * len(minutes))],
        "latency_p99_ms": [rng.random() * 50 for _ in range(len(brokers) * len(minutes))],
        "event_date": [time.strftime("%Y-%m-%d", time.gmtime(now / 1000))] * (len(brokers) * len(minutes)),
    })
    _write(root, "broker_fault_episodes", {
        "episode_id": [f"{c}|{b}|{now}" for c, b in brokers[:5]], "cluster": [c for c, _ in brokers[:5]],
        "broker_name": [b for _, b in brokers[:5]], "opened_ms": [now - 30_000] * 5, "state": ["open"] * 5,
        "reason": ["quorum"] * 5, "updated_ms": [now] * 5,
    })
    _write(root, "send_results", {"ts_ms": [now] * 1000, "cluster": ["cluster-0"] * 1000,
                                  "event_date": [time.strftime("%Y-%m-%d", time.gmtime(now / 1000))] * 1000})


def write_loop(root: Path, groups: int, queues: int, stop: Any, commits: Any) -> None:
    """Appends a new version of every group's status and 1/10 of the queues every 2 s.

    Runs in a process of its own: in the client's process its Python would hold the GIL the
    client's event loop needs and inflate the latencies measured.
    """
    rng = random.Random(11)
    while not stop.wait(2.0):
        now = int(time.time() * 1000)
        _write(root, "group_status", group_rows(groups, queues, now, rng))
        _write(root, "queue_lag", queue_rows(groups // 10, queues, now, rng))
        with commits.get_lock():
            commits.value += 2


async def load(
    base: str, groups: int, seconds: float, concurrency: int, only: str | None, rate: float | None
) -> dict[str, list[float]]:
    import aiohttp

    names = group_names(groups)
    latencies: dict[str, list[float]] = {"metrics": [], "status": []}
    errors = [0]
    deadline = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession, n: int) -> None:
        rng = random.Random(n)
        period = concurrency / rate if rate else 0.0
        next_at = time.monotonic() + rng.random() * period
        while time.monotonic() < deadline:
            if period:
                await asyncio.sleep(max(next_at - time.monotonic(), 0))
                next_at += period
            if only == "metrics" or (only is None and rng.random() < 0.5):
                kind, path = "metrics", "/metrics"
            else:
                cluster, group = rng.choice(names)
                kind, path = "status", f"/v3/rocketmq/{cluster}/consumer/{group}/status"
            started = time.perf_counter()
            async with session.get(base + path) as resp:
                await resp.read()
                if resp.status != 200:
                    errors[0] += 1
            latencies[kind].append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session, n) for n in range(concurrency)))
    latencies["errors"] = [float(errors[0])]
    return latencies


def scrape_value(base: str, name: str) -> float:
    import urllib.error
    import urllib.request

    try:
        text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    except urllib.error.HTTPError:  # 503 until the first refresh finished
        return 0.0
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--refresh-interval", type=float, default=1.0,
                        help="serve.refresh_interval_s (default 1; a large value and --no-writer: no refresh under load)")
    parser.add_argument("--no-writer", action="store_true", help="append nothing to the tables during the load")
    parser.add_argument("--rate", type=float, default=None,
                        help="open loop: this many requests/s in all, spread over the clients (default: each "
                        "client sends its next request as soon as the last one is answered)")
    parser.add_argument("--only", choices=("metrics", "status"), default=None, help="request one endpoint only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fw-bench-serve-"))
    root = work / "tables"
    t0 = time.perf_counter()
    build_tables(root, args.groups, args.queues)
    print(f"tables: {args.groups * args.queues:,} (group, queue) pairs, {CLUSTERS * BROKERS_PER_CLUSTER} brokers, "
          f"built in {time.perf_counter() - t0:.1f}s under {root}")
    conf = work / "serve.toml"
    conf.write_text(f'[storage]\nroot = "{root}"\npublish_dir = "{work / "avoidance"}"\n'
                    f"[serve]\nrefresh_interval_s = {args.refresh_interval}\nmax_queue_series = 100\n")
    log = work / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "faultwatch"), "serve", "--config", str(conf),
                                 "--port", "0"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        base = None
        deadline = time.monotonic() + 60
        while base is None and time.monotonic() < deadline:
            match = re.search(r"listening on (http://\S+?)/?$", log.read_text(), re.MULTILINE)
            base = match.group(1) if match else None
            time.sleep(0.1)
        assert base, log.read_text()
        while scrape_value(base, "faultwatch_serve_refreshes_total") < 1:
            time.sleep(0.2)
        body = len(__import__("urllib.request").request.urlopen(base + "/metrics").read())
        refreshes_before = scrape_value(base, "faultwatch_serve_refreshes_total")
        ctx = mp.get_context("spawn")
        stop, commits = ctx.Event(), ctx.Value("i", 0)
        writer = ctx.Process(target=write_loop, args=(root, args.groups, args.queues, stop, commits), daemon=True)
        if not args.no_writer:
            writer.start()
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        latencies = asyncio.run(load(base, args.groups, args.seconds, args.concurrency, args.only, args.rate))
        done.set()
        stop.set()
        if writer.is_alive():
            writer.join(timeout=60)
        refreshes = scrape_value(base, "faultwatch_serve_refreshes_total") - refreshes_before
        duration = scrape_value(base, "faultwatch_serve_refresh_duration_seconds")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    mix = {"metrics": "/metrics only", "status": "a random group's status only"}.get(
        args.only or "", "half /metrics, half a random group's status")
    pace = f"{args.rate:g} requests/s in all" if args.rate else "each as fast as answered"
    print(f"load: {args.concurrency} concurrent clients ({pace}) for {args.seconds:.0f}s, {mix} (/metrics is "
          f"{body / 1e6:.2f} MB, gzip-compressed for these clients as for Prometheus); refresh every {args.refresh_interval:g}s, "
          f"{'no writes' if args.no_writer else 'new rows committed every 2s'}; "
          f"{int(latencies['errors'][0])} non-200 answers")
    total = 0
    for kind in ("metrics", "status"):
        if not latencies[kind]:
            continue
        xs = np.array(latencies[kind]) * 1000
        total += len(xs)
        print(f"  {kind:8s} {len(xs) / args.seconds:8.0f} req/s  p50 {np.percentile(xs, 50):6.1f} ms  "
              f"p99 {np.percentile(xs, 99):6.1f} ms  max {xs.max():6.1f} ms")
    print(f"  all      {total / args.seconds:8.0f} req/s")
    print(f"refresh: {refreshes:.0f} refreshes during the load while {commits.value} commits landed; "
          f"last refresh took {duration * 1000:.0f} ms")
    print(f"serve peak RSS: {peak[0] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
