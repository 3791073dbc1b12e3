"""``faultwatch demo``: the whole system on embedded defaults, on this machine.

A local Kafka-protocol broker (Tansu), the simulator feeding it a scenario with a broker outage and
a lagging consumer group, the streaming job, the avoidance publisher, a live view, and the HTML
report at the end. The demo ends when its story is told (the outage's episode closed and its alert
resolved, :mod:`faultwatch.demo_story`), not on the wall clock, so a slow first run tells it too.
Everything the demo writes lives under ``data/demo/`` and is replaced by the next demo (the broker
keeps nothing between runs, so old checkpoints would not match it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from faultwatch.demo_story import AlertLog, settle_needed_ms, story_told
from pipeline.config import Config

DEMO_ROOT = Path("data/demo")


@dataclass
class DemoResult:
    code: int
    report_path: Path | None
    summary: list[str]


# The demo's outage lasts 40 s: a publisher cycle every minute (production) could miss it, so the
# demo runs one every 10 s. (Episodes show as "suspected" about one trigger after the outage
# starts, well before the 30 s watermark decides them, and the publisher acts on them.)
DEMO_PUBLISH_INTERVAL_S = 10.0

# How much longer than its duration the demo may run while it waits for its story to be told (the
# simulator keeps the clusters' steady traffic going meanwhile, so event time moves on).
DEMO_STORY_BOUND_S = 180.0


def demo_config(cfg: Config, root: Path, bootstrap: str) -> Config:
    return cfg.replace(
        kafka__bootstrap_servers=bootstrap,
        storage__root=str(root / "tables"),
        storage__checkpoint_root=str(root / "checkpoints"),
        storage__publish_dir=str(root / "avoidance"),
        stream__trigger_interval_s=min(cfg.stream.trigger_interval_s, 2.0),
        publish__interval_s=min(cfg.publish.interval_s, DEMO_PUBLISH_INTERVAL_S),
        serve__refresh_interval_s=min(cfg.serve.refresh_interval_s, 2.0),
        serve__page_refresh_s=min(cfg.serve.page_refresh_s, 2.0),
    )


def start_serve(cfg: Config) -> tuple[Any, str | None]:
    """``faultwatch serve`` over the demo's tables on serve.port, or any free port if that is taken."""
    from pipeline.serve import Server

    for port in (cfg.serve.port, 0):
        server = Server(cfg, port=port)
        try:
            return server, server.start()
        except OSError:
            continue
    return None, None


class Publisher(threading.Thread):
    """Runs the publisher cycles as ``faultwatch publish --every`` does: every ``publish.interval_s``
    (what the Airflow DAG does in production), and one at once on each new fault episode.

    Cycles begin once the streaming job has committed fault rows: before that the inputs are empty,
    which the gate rightly rejects (and alerts on), but at the demo's start it is only noise.
    """

    def __init__(self, cfg: Config, alert_log: AlertLog) -> None:
        super().__init__(name="faultwatch-publisher", daemon=True)
        self.cfg = cfg
        self.alert_log = alert_log  # read after each cycle, in this thread only
        self.stop = threading.Event()
        self.cycles: list[str] = []

    def run(self) -> None:
        from pipeline.publish.watch import cycle_loop

        cycle_loop(self.cfg, self.cycle, stop=self.stop)

    def cycle(self, number: int | None) -> None:
        """One cycle, regular or early (a new episode), once the inputs are there."""
        from pipeline.publish import run_cycle

        try:
            if not self.inputs_ready():
                return
            report = run_cycle(self.cfg, cycle_number=number)
            self.cycles.append(report.status)
            self.alert_log.read()
        except Exception as exc:  # noqa: BLE001 - a failed cycle must not end the demo; the next one retries
            self.cycles.append(f"error: {type(exc).__name__}: {exc}")

    def inputs_ready(self) -> bool:
        from pipeline.deltaio import table_has_rows

        return any(table_has_rows(self.cfg.storage.root, name) for name in FAULT_INPUTS)


# The tables the publisher's snapshot reads (see pipeline/policy/inputs.py); each is created empty
# before the streaming job starts, and the job's first commits may only set its properties.
FAULT_INPUTS = ("broker_fault_episodes_live", "broker_health", "producer_fault_windows_live")


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[TextIO]:
    """Point this process's stderr (fd 2) at ``path`` and yield that file, opened for appending.

    The JVM Spark starts inherits fd 2, and so do the Python workers it starts: Spark's log (log4j2
    writes to stderr) and any warning land in the file instead of tearing the live view apart, and
    the JVM keeps writing there after this process's stderr is restored.
    """
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield log
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:]


def run_demo(
    cfg: Config, duration_s: float | None = None, root: Path = DEMO_ROOT, out: Any = sys.stdout
) -> DemoResult:
    from rich.console import Console
    from rich.live import Live

    from pipeline.demo_view import render, summary_lines, take_snapshot
    from pipeline.kafka_local import start_local_kafka
    from pipeline.report import write_report
    from pipeline.simulate import KafkaSink, Simulation, load_scenario
    from streaming.job import run_stream
    from streaming.session import spark_session

    duration = duration_s if duration_s is not None else cfg.demo.duration_s
    console = Console(file=out)
    if root.exists():
        console.print(f"demo: replacing the previous demo's data in {root}/")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    scenario = load_scenario(cfg.demo.scenario)
    console.print(f"demo: scenario {scenario.name!r} for {duration:.0f}s at speed {cfg.demo.speed}; starting Kafka and Spark")
    stream_log_path = root / "stream.log"  # the stream's batches, and Spark's and the JVM's log
    console.print(f"demo: Spark's log goes to {stream_log_path}")
    with (
        start_local_kafka(topics=cfg.topics.all(), partitions=cfg.kafka.partitions, log_dir=root) as kafka,
        stderr_to(stream_log_path) as stream_log,
    ):
        cfg = demo_config(cfg, root, kafka.bootstrap)
        spark = spark_session(cfg)  # before the simulator starts, so the outage is seen live
        epoch_ms = int(time.time() * 1000)
        sim = Simulation(scenario, epoch_ms=epoch_ms)
        needed_ms = settle_needed_ms(scenario, epoch_ms, duration, cfg)
        stop_sim = threading.Event()
        sim_thread = threading.Thread(
            target=sim.run,
            kwargs={"sink": KafkaSink(cfg), "speed": cfg.demo.speed, "duration_s": duration + DEMO_STORY_BOUND_S,
                    "stop_event": stop_sim, "close": True},
            name="faultwatch-simulator",
            daemon=True,
        )
        alert_log = AlertLog(cfg)
        publisher = Publisher(cfg, alert_log)
        started = time.monotonic()
        sim_thread.start()
        publisher.start()
        server, url = start_serve(cfg)
        if url is not None:
            console.print(f"demo: live page {url} · Prometheus metrics {url}metrics · API {url}v3/rocketmq",
                          soft_wrap=True, highlight=False)
        last_refresh = [0.0]
        latest: list[Any] = [None]  # the newest snapshot, for the story's end

        def header() -> str:
            elapsed = time.monotonic() - started
            if elapsed > duration:
                state = "waiting for the episode to close and its alert to resolve"
            else:
                faults = ", ".join(f"{b}: {', '.join(fs)}" for b, fs in sim.active_faults().items()) or "none"
                state = f"simulated faults now: {faults}"
            return (
                f"faultwatch demo — {elapsed:.0f}s of {duration:.0f}s; {state}; "
                f"publisher cycles: {len(publisher.cycles)}"
            )

        live = (
            Live(console=console, refresh_per_second=1, transient=False, redirect_stderr=False)
            if console.is_terminal
            else None
        )

        def tick() -> None:
            if time.monotonic() - last_refresh[0] < cfg.demo.refresh_s:
                return
            last_refresh[0] = time.monotonic()
            snap = latest[0] = take_snapshot(cfg.storage.root)
            if live is not None:
                live.update(render(snap, header()))
            else:
                console.print(
                    f"{header()} | bronze rows {snap.bronze_rows}, open episodes {len(snap.open_episodes)}, "
                    f"lagging groups {len(snap.lagging_groups)}"
                )

        def told(settled: int | None) -> bool:
            if time.monotonic() - started < duration or latest[0] is None:
                return False
            return story_told(settled, needed_ms, len(latest[0].open_episodes), alert_log.stories("broker_fault"))

        if live is not None:
            live.start()
        try:
            code = run_stream(cfg, duration_s=duration + DEMO_STORY_BOUND_S, spark=spark, out=stream_log,
                              on_tick=tick, until=told)
        finally:
            if live is not None:
                live.stop()
            stop_sim.set()
            publisher.stop.set()
            sim_thread.join(timeout=30)
            publisher.join(timeout=60)
        # One last cycle so the report shows what the final state recommends; it publishes to
        # Kafka, so it runs before the local broker stops. (None if the stream wrote no fault rows.)
        try:
            from pipeline.publish import run_cycle

            if publisher.inputs_ready():
                run_cycle(cfg)
                alert_log.read()
            else:
                console.print("demo: the stream wrote no fault rows, so no publisher cycle ran")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal for the demo
            console.print(f"demo: final publisher cycle failed: {exc}")
        finally:
            alert_log.close()
    if code != 0:
        console.print(_tail(stream_log_path), markup=False, highlight=False)
    snap = take_snapshot(cfg.storage.root)
    report = write_report(cfg.storage.root, out=root / "faultwatch-report.html")
    summary = summary_lines(snap, alert_log.stories())
    # Plain print: a summary that is piped or logged must not be re-wrapped by rich.
    print("\n".join(["", "demo summary:", *summary, f"report: {Path(report).resolve()}"]), file=out, flush=True)
    if server is not None:
        server.stop()
    return DemoResult(code, Path(report), summary)
