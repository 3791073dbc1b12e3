"""Benchmark of ``faultwatch serve``: /metrics and the group-status API under 200 concurrent clients.

Run: ``.venv/bin/python bench/serve.py [--seconds 30] [--rounds 1] [--concurrency 200] [--rate R]``.

Builds Delta tables with ``--groups`` x ``--queues`` (group, queue) pairs (10,000 by default) over
5 clusters of 10 brokers (50 brokers) and keeps committing new queue_lag and group_status rows
(every 2 s, a process of its own) while ``bench/httpload.py`` (a lean keep-alive client, also a
process of its own) sends 200 concurrent requests, half /metrics and half a random group's
status, to each phase in turn, ``--rounds`` times alternated:

- ``floor``: a trivial server answering the same bytes: the least any server costs here;
- ``serve``: ``faultwatch serve`` refreshing every ``--refresh-interval`` s (1 s by default);
- ``still``: a second ``faultwatch serve`` over the same tables that never refreshes in the run.

All phases run under the same background load (the writer and the refreshing serve's child),
so ``serve`` against ``floor`` is what serve's HTTP layer and lookups cost, and ``serve``
against ``still`` is what its refreshes cost the requests. Prints requests/s, p50/p99/max
latency (at the client), CPU of server, refresh process and client, peak RSS, and those ratios.
Goals: p99 <= 50 ms with 200 clients, and a refresh never blocking a request. Nothing here
asserts: the tests check correctness, this prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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
    _write(root, "broker_fault_episodes_live", {
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


def scrape_value(base: str, name: str) -> float:
    import urllib.error
    import urllib.request

    try:
        text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    except urllib.error.HTTPError:  # 503 until the first refresh finished
        return 0.0
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


PHASES = ("floor", "serve", "still", "other")
PHASE_HELP = {
    "floor": "the same bytes from a trivial server (bench/httpload.py floor): the least any server costs here",
    "serve": "faultwatch serve, refreshing every --refresh-interval s while new rows are committed",
    "still": "a second faultwatch serve over the same tables that never refreshes during the run",
    "other": "faultwatch serve from the checkout --other (e.g. `git archive REV | tar -x -C DIR`) and/or with "
    "the [serve] settings --other-settings, refreshing like 'serve': two versions or configurations in one run",
}


def start_serve(
    work: Path, root: Path, name: str, refresh_s: float, checkout: Path = REPO, settings: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    """``faultwatch serve`` of ``checkout`` (its own modules first on the path) on a free port,
    with ``settings`` (TOML lines) added to its [serve] section."""
    conf = work / f"{name}.toml"
    conf.write_text(f'[storage]\nroot = "{root}"\npublish_dir = "{work / "avoidance"}"\n'
                    f"[serve]\nrefresh_interval_s = {refresh_s}\nmax_queue_series = 100\n{settings}\n")
    log = work / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "faultwatch.cli", "serve", "--config", str(conf), "--port", "0"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=checkout, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://\S+?)/?$", log.read_text(), re.MULTILINE)
        if match:
            base = match.group(1)
            while scrape_value(base, "faultwatch_serve_refreshes_total") < 1:
                time.sleep(0.2)
            return proc, base
        time.sleep(0.1)
    raise RuntimeError(f"serve did not start: {log.read_text()}")


def start_floor(work: Path, base: str, status_path: str) -> tuple[subprocess.Popen[bytes], str]:
    """The trivial server, answering with the bytes serve answers (/metrics gzip-compressed)."""
    files = []
    for kind, path, headers in (("metrics", "/metrics", {"Accept-Encoding": "gzip"}), ("status", status_path, {})):
        request = urllib.request.Request(base + path, headers=headers)
        (work / f"{kind}.body").write_bytes(urllib.request.urlopen(request, timeout=30).read())
        files.append(str(work / f"{kind}.body"))
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "httpload.py"), "floor", "0", *files],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, "http://" + line.split()[-1]  # type: ignore[return-value]


def run_load(base: str, paths: list[str], seconds: float, concurrency: int, rate: float | None) -> dict[str, Any]:
    """bench/httpload.py in a process of its own (this one samples memory and CPU meanwhile)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "httpload.py"), "load", host, port, str(seconds), str(concurrency),
         str(rate) if rate else "-"], input="\n".join(paths), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class Sampler:
    """Peak RSS of a process tree, and CPU seconds of its root and of its children, over a phase."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self.done = threading.Event()
        self.cpu0 = self._cpu()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _cpu(self) -> tuple[float, float]:
        import psutil

        own = self.proc.cpu_times()
        children = 0.0
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                t = child.cpu_times()
                children += t.user + t.system
        return own.user + own.system, children

    def _run(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, tree_rss(self.proc.pid))

    def stop(self) -> tuple[int, float, float]:
        self.done.set()
        self.thread.join()
        own, children = self._cpu()
        return self.peak, own - self.cpu0[0], children - self.cpu0[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="of load per phase")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the phases, alternating, this many times")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help="comma-separated, in order: " + "; ".join(f"{k}: {v}" for k, v in PHASE_HELP.items()))
    parser.add_argument("--refresh-interval", type=float, default=1.0, help="serve.refresh_interval_s of 'serve'")
    parser.add_argument("--other", type=Path, default=None, help="a checkout of another commit: adds the phase 'other'")
    parser.add_argument("--other-settings", default="",
                        help="[serve] settings (TOML, ';' between lines) of the phase 'other', e.g. "
                        "'http = \"h11\"; loop = \"asyncio\"'")
    parser.add_argument("--no-writer", action="store_true", help="append nothing to the tables during the load")
    parser.add_argument("--rate", type=float, default=None,
                        help="open loop: this many requests/s in all, spread over the clients (default: each "
                        "client sends its next request as soon as the last one is answered)")
    parser.add_argument("--only", choices=("metrics", "status"), default=None, help="request one endpoint only")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p and (p != "other" or args.other or args.other_settings)]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase {unknown[0]!r}; known: {', '.join(PHASES)}")
    work = Path(tempfile.mkdtemp(prefix="fw-bench-serve-"))
    root = work / "tables"
    t0 = time.perf_counter()
    build_tables(root, args.groups, args.queues)
    print(f"tables: {args.groups * args.queues:,} (group, queue) pairs, {CLUSTERS * BROKERS_PER_CLUSTER} brokers, "
          f"built in {time.perf_counter() - t0:.1f}s under {root} (removed at the end)")
    names = group_names(args.groups)
    status_paths = [f"status /v3/rocketmq/{c}/consumer/{g}/status" for c, g in names]
    paths = {"metrics": ["metrics /metrics"], "status": status_paths}.get(
        args.only or "", ["metrics /metrics"] * len(status_paths) + status_paths)
    procs: dict[str, subprocess.Popen[Any]] = {}
    bases: dict[str, str] = {}
    ctx = mp.get_context("spawn")
    stop, commits = ctx.Event(), ctx.Value("i", 0)
    writer = ctx.Process(target=write_loop, args=(root, args.groups, args.queues, stop, commits), daemon=True)
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
    try:
        if "serve" in phases or "floor" in phases:
            procs["serve"], bases["serve"] = start_serve(work, root, "serve", args.refresh_interval)
        if "still" in phases:
            procs["still"], bases["still"] = start_serve(work, root, "still", 86400.0)
        if "other" in phases:
            procs["other"], bases["other"] = start_serve(work, root, "other", args.refresh_interval, args.other or REPO,
                                                         args.other_settings.replace(";", "\n"))
        if "floor" in phases:
            procs["floor"], bases["floor"] = start_floor(work, bases["serve"], status_paths[0].split(" ", 1)[1])
        body = len(urllib.request.urlopen(next(b for k, b in bases.items() if k != "floor") + "/metrics").read())
        if not args.no_writer:
            writer.start()
        for round_ in range(args.rounds):
            for phase in phases if round_ % 2 == 0 else phases[::-1]:  # alternated: ABC CBA ABC ...
                refreshes = scrape_value(bases[phase], "faultwatch_serve_refreshes_total") if phase != "floor" else 0
                commits_before = commits.value
                sampler = Sampler(procs[phase].pid)
                out = run_load(bases[phase], paths, args.seconds, args.concurrency, args.rate)
                out["rss"], out["cpu_serving"], out["cpu_children"] = sampler.stop()
                out["commits"] = commits.value - commits_before
                if phase != "floor":
                    out["refreshes"] = scrape_value(bases[phase], "faultwatch_serve_refreshes_total") - refreshes
                    out["refresh_s"] = scrape_value(bases[phase], "faultwatch_serve_refresh_duration_seconds")
                results[phase].append(out)
                report_phase(phase, out, args.seconds)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(timeout=60)
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    mix = {"metrics": "/metrics only", "status": "a random group's status only"}.get(
        args.only or "", "half /metrics, half a random group's status")
    pace = f"{args.rate:g} requests/s in all" if args.rate else "each sends its next request when answered"
    loops = sorted({out.get("loop", "?") for runs in results.values() for out in runs})
    print(f"load: {args.concurrency} keep-alive clients ({pace}; bench/httpload.py on {'/'.join(loops)}, "
          f"a process of its own) for "
          f"{args.seconds:.0f}s per phase, {mix} (/metrics is {body / 1e6:.2f} MB, gzip-compressed for these "
          f"clients as for Prometheus); {'no writes' if args.no_writer else 'new rows committed every 2s'}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    summary(results, phases, args.seconds)


def _pcts(xs: list[float]) -> tuple[float, float, float]:
    a = np.array(xs) * 1000
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.max())


def report_phase(phase: str, out: dict[str, Any], seconds: float) -> None:
    lat = out["latencies"]
    every = [x for xs in lat.values() for x in xs]
    p50, p99, mx = _pcts(every)
    kinds = "  ".join(f"{k} p50/p99 {_pcts(v)[0]:.1f}/{_pcts(v)[1]:.1f}" for k, v in lat.items() if v)
    extra = ""
    if "refreshes" in out:
        extra = f"; {out['refreshes']:.0f} refreshes (last {out['refresh_s'] * 1000:.0f} ms) while {out['commits']} commits landed"
    print(f"  {phase:6s} {len(every) / seconds:7.0f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  max {mx:6.1f} ms  "
          f"({kinds}); {out['errors']} non-200; CPU cores: server {out['cpu_serving'] / seconds:.2f}, its children "
          f"{out['cpu_children'] / seconds:.2f}, client {out['cpu_s'] / seconds:.2f}; peak RSS "
          f"{out['rss'] / 2**20:.0f} MiB{extra}", flush=True)
    slow = out.get("slow", [])
    if slow:
        worst = ", ".join(f"{took * 1000:.0f} ms at {at:.1f}s (connection {conn}, answer {nth})"
                          for at, took, conn, nth in sorted(slow, key=lambda s: -s[1])[:5])
        print(f"         {len(slow)} answers over 200 ms; the slowest: {worst}", flush=True)


def summary(results: dict[str, list[dict[str, Any]]], phases: list[str], seconds: float) -> None:
    """Per phase over all rounds, and the ratios against the floor and against no refresh."""
    agg = {}
    for phase in phases:
        runs = results[phase]
        every = [x for out in runs for xs in out["latencies"].values() for x in xs]
        if not every:
            continue
        p50, p99, mx = _pcts(every)
        agg[phase] = (len(every) / (seconds * len(runs)), p50, p99, mx, max(out["rss"] for out in runs))
        print(f"{phase:6s} (all rounds): {agg[phase][0]:7.0f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
              f"max {mx:6.1f} ms  peak RSS {agg[phase][4] / 2**20:.0f} MiB")
    for a, b, what in (("serve", "floor", "serve against the trivial floor"),
                       ("serve", "still", "serve refreshing against serve not refreshing"),
                       ("serve", "other", "serve against 'other'")):
        if a in agg and b in agg:
            print(f"{what}: req/s x{agg[a][0] / agg[b][0]:.2f}, p50 x{agg[a][1] / agg[b][1]:.2f}, "
                  f"p99 x{agg[a][2] / agg[b][2]:.2f}")


if __name__ == "__main__":
    main()
