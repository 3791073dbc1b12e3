"""A long run of the live job with the publisher and ``serve`` beside it: do its figures stay flat?

    .venv/bin/python bench/soak.py [--minutes 40] [--batches N] [--speed 30] [--trigger-s 2] [--every-s 120]
                                   [--scenario demo] [--no-maintenance] [--jvm dev|production]
                                   [--retention-h 1] [--data-retention-h 720] [--label NAME]
                                   [--broker apache|tansu]

Starts a local Kafka broker, the simulator accelerated (``--speed`` virtual seconds per wall second,
ending at the wall clock), ``faultwatch stream`` (the default job with ``[maintenance]``) and
``faultwatch serve``, and runs a publisher cycle every ``publish.interval_s``. Every ``--every-s`` it
prints a point: files, bytes and log length per table, the job's state, each process tree's RSS and
CPU, the micro-batches since the last point, serve's refresh and the publisher's cycle time (medians
since the last point), and the event time reached. After ``--minutes`` or ``--batches`` it compares the point after the first
tenth with the last, PASS or FAIL against 1.5x. Two soaks may run at once (own directories and
ports); ``--jvm`` is the job's ``[spark] jvm``. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import tree_procs, tree_rss
from pipeline.config import Config

BIN = Path(sys.executable).parent
BATCH = re.compile(r"\[(\w+)\] batch (\d+): in=(\d+).*?(?: state=(\d+) rows/([\d.]+)MiB)? \(([\d.]+)s\)(?: maintenance: (.*))?$")
STEP_SECONDS = re.compile(r"([\d.]+)s$")
GOAL = 1.5  # the last point within this many times the one after the first tenth
NEWEST = re.compile(r'^faultwatch_table_newest_event_timestamp_seconds\{table="send_results"\} ([\d.e+-]+)$', re.MULTILINE)


@dataclass
class Watch:
    """What the job's progress lines said since the last point."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: list[float] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    total_batches: int = 0
    events: int = 0
    state: str = "-"
    state_mib: float = float("nan")

    def line(self, text: str) -> None:
        m = BATCH.search(text.strip())
        if not m:
            return
        with self.lock:
            self.total_batches += 1
            self.events += int(m.group(3))
            self.batches.append(float(m.group(6)))
            if m.group(4):
                self.state = f"{int(m.group(4)):,} rows/{float(m.group(5)):.1f} MiB"
                self.state_mib = float(m.group(5))
            if m.group(7):
                self.steps.append(m.group(7))

    def take(self) -> tuple[list[float], list[str]]:
        with self.lock:
            out = (self.batches, self.steps)
            self.batches, self.steps = [], []
            return out


def write_config(path: Path, work: Path, bootstrap: str, port: int, args: argparse.Namespace) -> Config:
    text = f"""[kafka]
bootstrap_servers = "{bootstrap}"
[storage]
root = "{work / 'tables'}"
checkpoint_root = "{work / 'checkpoints'}"
publish_dir = "{work / 'avoidance'}"
[stream]
trigger_interval_s = {args.trigger_s}
[maintenance]
enabled = {'false' if args.no_maintenance else 'true'}
compact_every_batches = {args.compact_every}
vacuum_interval_s = {args.vacuum_every_s}
vacuum_retention_h = {args.retention_h}
log_retention_h = {args.retention_h}
data_retention_h = {args.data_retention_h}
[policy]
max_input_age_s = {max(2 * 86400.0, 1.2 * args.speed * (args.minutes + 1) * 60 + 3600)}
[serve]
port = {port}
refresh_interval_s = 10.0
[spark]
jvm = "{args.jvm}"
"""
    path.write_text(text)
    from pipeline.config import load_config

    return load_config(path)


def table_sizes(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Per table: (data files on disk, their bytes, commit files after the last checkpoint, files the
    current version holds)."""
    from deltalake import DeltaTable

    out = {}
    for table in sorted(p for p in root.iterdir() if p.is_dir()):
        files = [p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts]
        commits = _since_checkpoint(table / "_delta_log")
        try:
            live = len(DeltaTable(str(table)).file_uris())
        except Exception:  # noqa: BLE001 - a table being created: counted next time
            live = 0
        out[table.name] = (len(files), sum(p.stat().st_size for p in files if p.exists()), commits, live)
    return out


def _since_checkpoint(log: Path) -> int:
    """Commit files a reader replays after the last checkpoint (all of them without one)."""
    try:
        last = int(json.loads((log / "_last_checkpoint").read_text())["version"])
    except (OSError, ValueError, KeyError):
        last = -1
    return sum(1 for p in log.glob("*.json") if int(p.name[:20]) > last)


def serve_figures(port: int) -> tuple[float | None, float | None]:
    """serve's last refresh time (s) and the event time (epoch s) of the newest send result."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None, None
    m = re.search(r"^faultwatch_serve_refresh_duration_seconds ([\d.e+-]+)$", text, re.MULTILINE)
    newest = [float(v) for v in NEWEST.findall(text)]
    return (float(m.group(1)) if m else None), (max(newest) if newest else None)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live descendants, and of the children they
    have reaped (each ended process counted once, by the one that waited for it)."""
    import psutil

    total = 0.0
    for p in tree_procs(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system  # and the children it reaped
        except psutil.NoSuchProcess:
            pass
    return total


def publisher(cfg: Config, stop: threading.Event, cycles: list[tuple[float, str]]) -> None:
    """One publisher cycle per publish.interval_s in this process (as ``faultwatch publish --every``)."""
    from pipeline.publish import run_cycle

    while not stop.is_set():
        began = time.perf_counter()
        try:
            status = run_cycle(cfg).status
        except Exception as exc:  # noqa: BLE001 - a failed cycle is a figure of the soak, not its end
            status = f"failed: {type(exc).__name__}: {exc}"[:200]
        cycles.append((time.perf_counter() - began, status))
        stop.wait(cfg.publish.interval_s)


def start(args: list[str], log: Path, on_line: Any = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([str(BIN / "faultwatch"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO, start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        with log.open("w") as out:
            for text in proc.stdout:
                out.write(text)
                out.flush()
                if on_line is not None:
                    on_line(text)

    threading.Thread(target=pump, daemon=True).start()
    return proc


def point(elapsed: float, root: Path, watch: Watch, procs: dict[str, int], port: int,
          cycles: list[tuple[float, str]], refreshes: list[float], epoch_s: float) -> dict[str, Any]:
    """The figures now; serve's refresh and the publisher's cycle as medians of the ones since the last
    point (``cycles`` and ``refreshes``: only those), so one slow moment does not make the point."""
    took, steps = watch.take()
    step_s = [float(m.group(1)) for s in steps if (m := STEP_SECONDS.search(s))]
    sizes = table_sizes(root) if root.exists() else {}
    refresh, newest = serve_figures(port)
    refresh = statistics.median(refreshes) if refreshes else refresh
    cycle = (statistics.median(c[0] for c in cycles), cycles[-1][1], len(cycles)) if cycles else None
    import os

    return {
        "minutes": elapsed / 60, "batches": watch.total_batches, "events": watch.events, "state": watch.state,
        "state_mib": watch.state_mib, "load": os.getloadavg()[0],
        "event_h": (newest - epoch_s) / 3600 if newest else 0.0,
        "cpu_s": {name: tree_cpu_s(pid) for name, pid in procs.items()},
        "batch_n": len(took), "batch_p50": statistics.median(took) if took else float("nan"),
        "batch_max": max(took, default=float("nan")), "steps": len(steps), "step_max": max(step_s, default=0.0),
        "rss": {name: tree_rss(pid) for name, pid in procs.items()} | {"bench+publisher": _own_rss()}, "serve_refresh": refresh,
        "cycle": cycle, "files": sum(v[0] for v in sizes.values()),
        "bytes": sum(v[1] for v in sizes.values()), "commits": sum(v[2] for v in sizes.values()),
        "live_files": sum(v[3] for v in sizes.values()), "tables": sizes,
    }


def show(p: dict[str, Any]) -> None:
    rss = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in p["rss"].items())
    cycle = f"{p['cycle'][0]:.1f}s ({p['cycle'][1]}, median of {p['cycle'][2]})" if p["cycle"] else "-"
    refresh = f"{p['serve_refresh']:.2f}s" if p["serve_refresh"] is not None else "-"
    cpu = ", ".join(f"{k} {v:,.0f}" for k, v in p["cpu_s"].items())
    print(f"[{p['minutes']:5.1f} min, load {p['load']:.1f}, {p['event_h']:.1f} h of event time] "
          f"batches {p['batches']} (+{p['batch_n']}: p50 {p['batch_p50']:.2f}s, "
          f"max {p['batch_max']:.2f}s; {p['steps']} upkeep steps, longest {p['step_max']:.2f}s), "
          f"{p['events']:,} events; state {p['state']}; files {p['live_files']} live/{p['files']} on disk, "
          f"{p['bytes'] / 2**20:.1f} MiB, "
          f"log {p['commits']} commits after checkpoints; RSS MiB: {rss}; serve refresh {refresh}; publish cycle {cycle}; CPU s: {cpu}", flush=True)
    biggest = sorted(p["tables"].items(), key=lambda kv: -kv[1][1])[:4]
    print("    " + "; ".join(f"{n} {live}/{f} files {b / 2**20:.1f} MiB log {c}" for n, (f, b, c, live) in biggest),
          flush=True)


def per_batch_cpu(points: list[dict[str, Any]], i: int) -> float:
    """The job's CPU seconds per micro-batch between point ``i - 1`` and point ``i``."""
    before = points[i - 1]["cpu_s"]["stream"] if i else 0.0
    n = points[i]["batch_n"]
    return (points[i]["cpu_s"]["stream"] - before) / n if n else float("nan")


def compare(points: list[dict[str, Any]]) -> list[tuple[str, float, float, str]]:
    """The last point against the first one after a tenth of the run: (figure, then, now, verdict)."""
    if len(points) < 3:
        return []
    i = next((k for k, p in enumerate(points) if p["minutes"] >= points[-1]["minutes"] / 10 and p["batch_n"]),
             len(points) - 1)
    ref, last = points[i], points[-1]
    rows = [("live data files", ref["live_files"], last["live_files"]), ("files on disk", ref["files"], last["files"]),
            ("MiB on disk", ref["bytes"] / 2**20, last["bytes"] / 2**20),
            ("commits to replay", ref["commits"], last["commits"]),
            ("job state MiB", ref["state_mib"], last["state_mib"]),
            ("micro-batch p50 s", ref["batch_p50"], last["batch_p50"]),
            ("micro-batch max s", ref["batch_max"], last["batch_max"]),
            ("job CPU s/batch", per_batch_cpu(points, i), per_batch_cpu(points, len(points) - 1))]
    rows += [(f"RSS {k} MiB", ref["rss"][k] / 2**20, last["rss"][k] / 2**20) for k in last["rss"]]
    if ref["serve_refresh"] and last["serve_refresh"]:
        rows.append(("serve refresh s", ref["serve_refresh"], last["serve_refresh"]))
    if ref["cycle"] and last["cycle"]:
        rows.append(("publish cycle s", ref["cycle"][0], last["cycle"][0]))
    out = []
    for name, a, b in rows:
        ratio = b / a if a else float("nan")
        verdict = "PASS" if ratio <= GOAL or (a == b == 0) else "FAIL"
        out.append((name, a, b, verdict))
    print(f"the point after a tenth ({ref['minutes']:.1f} min, {ref['batches']} micro-batches, "
          f"{ref['event_h']:.1f} h of event time) against the last ({last['minutes']:.1f} min, "
          f"{last['batches']} micro-batches, {last['event_h']:.1f} h); goal: within {GOAL}x")
    print(f"    {'figure':<24} {'tenth':>12} {'last':>12} {'ratio':>7}  verdict")
    for name, a, b, verdict in out:
        print(f"    {name:<24} {a:>12,.2f} {b:>12,.2f} {(b / a if a else float('nan')):>7.2f}  {verdict}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=40.0)
    ap.add_argument("--speed", type=float, default=30.0, help="virtual seconds per wall second")
    ap.add_argument("--trigger-s", type=float, default=2.0)
    ap.add_argument("--every-s", type=float, default=120.0, help="seconds between two printed points")
    ap.add_argument("--scenario", default="demo")
    ap.add_argument("--compact-every", type=int, default=Config().maintenance.compact_every_batches)
    ap.add_argument("--vacuum-every-s", type=float, default=600.0)
    ap.add_argument("--no-maintenance", action="store_true")
    ap.add_argument("--batches", type=int, default=0, help="stop after this many micro-batches (0: no limit)")
    ap.add_argument("--retention-h", type=float, default=1.0, help="vacuum and log retention, hours")
    ap.add_argument("--data-retention-h", type=float, default=Config().maintenance.data_retention_h,
                    help="rows this many hours of event time behind a table's newest are deleted (0: none)")
    ap.add_argument("--label", default="", help="a name for this run in its output")
    ap.add_argument("--broker", choices=["apache", "tansu"], default="apache",
                    help="Apache Kafka (as production) or Tansu (the demo's broker, in memory)")
    ap.add_argument("--jvm", choices=["dev", "production"], default="dev")
    args = ap.parse_args()
    from pipeline.kafka_apache import apache_kafka
    from pipeline.kafka_local import free_port, start_local_kafka

    work = Path(tempfile.mkdtemp(prefix="faultwatch-soak-"))
    seconds = args.minutes * 60
    epoch = int((time.time() - (args.speed - 1) * (seconds + 60)) * 1000)
    print(f"bench/soak: {args.minutes:.0f} min at {args.speed:.0f}x ({seconds * args.speed / 3600:.1f} h of event time), "
          f"scenario {args.scenario}, trigger {args.trigger_s}s, maintenance "
          f"{'off' if args.no_maintenance else f'every {args.compact_every} batches / {args.vacuum_every_s:.0f}s'}, "
          f"JVM {args.jvm}, retention {args.retention_h} h, data retention {args.data_retention_h} h, stop at {args.batches or '-'} micro-batches; "
          f"broker {args.broker}; label {args.label or '-'}; work dir {work}", flush=True)
    topics = Config().topics.all()
    with (apache_kafka(topics=topics) if args.broker == "apache" else start_local_kafka(topics=topics)) as kafka:
        port = free_port()
        conf = work / "faultwatch.toml"
        cfg = write_config(conf, work, kafka.bootstrap, port, args)
        watch = Watch()
        procs = {
            "stream": start(["stream", "--config", str(conf)], work / "stream.log", watch.line),
            "simulate": start(["simulate", "--config", str(conf), "--scenario", args.scenario, "--speed", str(args.speed),
                               "--duration", f"{int(seconds * args.speed + 3600)}s", "--epoch", str(epoch)],
                              work / "simulate.log"),
            "serve": start(["serve", "--config", str(conf)], work / "serve.log"),
        }
        stop = threading.Event()
        cycles: list[tuple[float, str]] = []
        pub = threading.Thread(target=publisher, args=(cfg, stop, cycles), daemon=True)
        pub.start()
        points = []
        began = time.monotonic()
        signal.signal(signal.SIGTERM, _interrupt)  # a soak started in the background ignores SIGINT
        try:
            done = False
            while not done:
                due = min(time.monotonic() + args.every_s, began + seconds)
                refreshes: list[float] = []
                seen = len(cycles)
                while time.monotonic() < due and not done:
                    stop.wait(min(5.0, max(0.0, due - time.monotonic())))
                    done = bool(args.batches) and watch.total_batches >= args.batches
                    if (refresh := serve_figures(port)[0]) is not None:
                        refreshes.append(refresh)
                done = done or time.monotonic() - began >= seconds
                for name, proc in procs.items():
                    if proc.poll() is not None and name != "simulate":
                        raise SystemExit(f"{name} exited with {proc.returncode}; see {work / (name + '.log')}")
                pids = {n: p.pid for n, p in procs.items()}
                points.append(point(time.monotonic() - began, Path(cfg.storage.root), watch, pids, port,
                                    cycles[seen:], refreshes, epoch / 1000))
                show(points[-1])
        except KeyboardInterrupt:
            print("stopped early: the table compares the points so far", flush=True)
        finally:
            stop.set()
            for proc in procs.values():
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs.values():
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        compare(points)
        (work / "points.json").write_text(json.dumps(points))
        print(f"points: {work / 'points.json'}")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _own_rss() -> int:
    """This process alone (its children are the processes measured above)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


if __name__ == "__main__":
    main()
