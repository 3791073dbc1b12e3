"""``faultwatch lab``: the whole loop on a real RocketMQ cluster, with a broker killed and another frozen.

Apache Kafka and a name server with three brokers (Maven Central's jars) start on loopback; real Java
producers on both client lines (``sendLatencyFaultEnable`` on and off, some with the feed client
reading ``rmq.avoidance``) send at a steady rate through faultwatch's hook, a consumer group consumes,
the admin poller polls, ``faultwatch stream`` runs live and ``faultwatch publish --every`` publishes
(every 5 s, and at once on a new episode: the stream's 1 s trigger and 1 s grid keep detection short).
Four more producers go idle from the kill until a few seconds after it (``LATE``).
Phases: warm, broker-b SIGKILLed then restarted (the lab waits for its episode to close, which takes
sends to it succeeding again: the producers' next route refresh after the restart), broker-c
SIGSTOPped for some seconds then resumed; then it waits (bounded) for the feed to release broker-b in
the 4.9 producer that runs it. Each phase ends with every producer's own fault table read from the
running client, and from broker-b's restart on the fault-tolerant producers' tables are read about
once a second; :mod:`faultwatch.lab_measure` turns the tables into the printed facts.
Everything lives under ``--root`` (replaced on each run); every process the lab starts is stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pipeline.children import DIE_WITH_PARENT, stop_children
from pipeline.java_clients import LabDriver, start_poller
from pipeline.jvm import JvmError

TOPIC = "lab-orders"
GROUP = "lab-consumers"
CLUSTER = "DefaultCluster"
KILLED, FROZEN = "broker-b", "broker-c"
# (client version, sendLatencyFaultEnable, feed client): both lines, on and off, with and without the feed.
FLEET = (("4.9.8", True, False), ("4.9.8", True, True), ("4.9.8", False, False),
         ("5.3.3", True, False), ("5.3.3", True, True), ("5.3.3", False, False))
# Late producers (fault tolerance on, with and without the feed, both lines): idle from just before
# the kill until LATE_S after it, like a producer whose next send comes a few seconds into an outage.
# The busy fleet meets the dead broker within a send or two, before any list can reach it; these
# show what the feed does for a producer that has not met it yet.
LATE = (("4.9.8", True, False), ("4.9.8", True, True), ("5.3.3", True, False), ("5.3.3", True, True))
LATE_S = 6.0
SEND_BATCH = 2
SEND_PAUSE_S = 0.2


@dataclass
class LabProducer:
    """One real producer and the thread that keeps it sending."""

    name: str
    version: str
    fault_enable: bool
    feed: bool
    driver: LabDriver
    late: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    hold: threading.Event = field(default_factory=threading.Event)  # set: no sends
    client_id: str = ""
    errors: list[str] = field(default_factory=list)

    def command(self, line: str) -> dict[str, Any]:
        with self.lock:
            return self.driver.command(line)

    def run(self) -> None:
        while not self.stop.wait(SEND_PAUSE_S):
            if self.hold.is_set():
                continue
            try:
                self.command(f"send {SEND_BATCH}")
            except Exception as exc:  # noqa: BLE001 - kept for the summary; the lab goes on
                self.errors.append(str(exc))
                return


@dataclass
class Snapshot:
    phase: str
    producer: str
    version: str
    fault_enable: bool
    feed: bool
    faults: dict[str, Any]


@dataclass
class LabRun:
    """What happened, with wall-clock marks (Unix ms), for :mod:`faultwatch.lab_measure`."""

    root: Path
    storage_root: str
    bootstrap: str
    avoidance_topic: str
    producers: list[LabProducer] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    feed_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (producer, client clock ms, the killed broker's avoid-until in its table; 0: no item)
    release_samples: list[tuple[str, int, int]] = field(default_factory=list)
    load_average: list[float] = field(default_factory=list)

    def mark(self, what: str) -> int:
        self.marks[what] = now_ms()
        return self.marks[what]


def now_ms() -> int:
    return int(time.time() * 1000)


def lab_config(root: Path, bootstrap: str, phase_s: float) -> Path:
    """The lab's TOML: its Kafka and folders, a 2 s trigger, a short watermark and publisher cycle.

    ``quorum_share`` 0.6: half the fleet runs 4.9.x, whose clients keep a refused broker for 10
    minutes; with the default 0.5 those windows alone would hold the episode open that long.
    The policy's holds shrink with the publisher's 5 s cycle (defaults: 30 s and 100 s for a 60 s
    cycle), so the feed's release of a recovered broker happens within the lab's run.
    """
    text = f"""
[kafka]
bootstrap_servers = "{bootstrap}"
[storage]
root = "{root / 'tables'}"
checkpoint_root = "{root / 'checkpoints'}"
publish_dir = "{root / 'avoidance'}"
[stream]
trigger_interval_s = 1.0
watermark_delay_s = 5.0
[faults]
evaluation_interval_s = 1.0
quorum_share = 0.6
episode_close_after_s = {max(5.0, min(10.0, phase_s / 2))}
[publish]
interval_s = 5.0
watch_interval_s = 0.25
[policy]
base_avoid_s = 15.0
hysteresis_s = 30.0
"""
    path = root / "faultwatch.toml"
    path.write_text(text.lstrip())
    return path


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"faultwatch lab: {what} did not happen within {timeout_s:.0f}s")


def faultwatch(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """A ``faultwatch`` subcommand of this installation, its output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "faultwatch.cli", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=DIE_WITH_PARENT)  # noqa: PLW1509


def stop_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to all together (30 s for all), then whatever is left of the sessions the lab started them
    in (Spark's JVM, its workers)."""
    stop_children(list(procs), 30)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def start_fleet(run: LabRun, namesrv: str) -> None:
    """The producers' JVMs start side by side, all from this thread (a driver JVM dies with the thread
    that started it); then each one's readiness and client id are read."""
    fleet = [(v, e, f, False) for v, e, f in FLEET] + [(v, e, f, True) for v, e, f in LATE]
    for i, (version, enable, feed, late) in enumerate(fleet):
        # RocketMQ group names allow letters, digits, '-', '_', '%' and '|'
        name = (f"p{i}-v{version.replace('.', '')}-{'on' if enable else 'off'}{'-feed' if feed else ''}"
                f"{'-late' if late else ''}")
        options = {"topic": TOPIC, "group": f"lab-{name}", "instance": name, "cluster": CLUSTER,
                   "namesrv": namesrv, "kafka": run.bootstrap, "fault_enable": str(enable).lower(),
                   "send_timeout_ms": "3000"}
        if feed:
            options |= {"feed": "kafka", "feed_topic": run.avoidance_topic}
        home = run.root / "producers" / name
        run.producers.append(LabProducer(name, version, enable, feed, LabDriver.launched(version, home, **options),
                                         late=late))
    for p in run.producers:
        p.driver.ready()
        p.client_id = p.driver.command("faults")["client_id"]


def snapshot_all(run: LabRun, phase: str) -> None:
    for p in run.producers:
        run.snapshots.append(Snapshot(phase, p.name, p.version, p.fault_enable, p.feed, p.command("faults")))


def events_in_bronze(storage_root: str) -> int:
    from pipeline.deltaio import read_table, table_has_rows

    if not table_has_rows(storage_root, "send_results"):
        return 0
    return read_table(storage_root, "send_results", columns=["event_id"]).num_rows


def health_minutes(storage_root: str, broker: str) -> int:
    """The newest minute ``broker_health`` has settled for ``broker`` (-1: none yet)."""
    from pipeline.deltaio import read_table, table_has_rows

    if not table_has_rows(storage_root, "broker_health"):
        return -1
    rows = read_table(storage_root, "broker_health", columns=["broker_name", "minute_ms"]).to_pylist()
    return max((r["minute_ms"] for r in rows if r["broker_name"] == broker), default=-1)


def episode_of(storage_root: str, broker: str, since_ms: int) -> dict[str, Any] | None:
    """The newest revision of the first episode on ``broker`` opened at or after ``since_ms`` (5 s slack)."""
    from pipeline.deltaio import latest_revision, read_table, table_has_rows

    if not table_has_rows(storage_root, "broker_fault_episodes_live"):
        return None
    rows = latest_revision(read_table(storage_root, "broker_fault_episodes_live"), "episode_id").to_pylist()
    mine = sorted((r for r in rows if r["broker_name"] == broker and r["opened_ms"] >= since_ms - 5000),
                  key=lambda r: r["opened_ms"])
    return mine[0] if mine else None


class ReleaseSampler:
    """Reads the fault-tolerant producers' own tables about once a second from the killed broker's
    restart on: how long each kept avoiding it after it was back, and (producers without the feed)
    more live-oracle points, phase "sampled", through the freeze and the recovery."""

    def __init__(self, run: LabRun, every_s: float = 1.0) -> None:
        self.run, self.every_s = run, every_s
        self.producers = [p for p in run.producers if p.fault_enable]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="release-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(60)

    def _loop(self) -> None:
        while True:
            for p in self.producers:
                try:
                    f = p.command("faults")
                except JvmError:
                    continue  # a driver that died: its producer's summary line says so
                until = next((i["start_timestamp"] for i in f["items"] if i["broker_name"] == KILLED), 0)
                self.run.release_samples.append((p.name, f["now_ms"], until))
                if not p.feed:
                    self.run.snapshots.append(Snapshot("sampled", p.name, p.version, p.fault_enable, p.feed, f))
            if self._stop.wait(self.every_s):
                return

    def avoiding(self, name: str) -> bool | None:
        """Whether ``name``'s newest sample shows the killed broker unavailable (None: no sample yet)."""
        mine = [(t, u) for n, t, u in self.run.release_samples if n == name]
        return None if not mine else mine[-1][1] > mine[-1][0]


def wait_release(sampler: ReleaseSampler, timeout_s: float, say: Callable[[str], None]) -> None:
    """Keep the lab going until every 4.9 producer with the feed shows the killed broker available
    again; a release that does not come within ``timeout_s`` is said and shows in the facts."""
    feed49 = [p.name for p in sampler.producers if p.feed and p.version.startswith("4.")]
    try:
        wait_until(lambda: all(sampler.avoiding(n) is False for n in feed49), timeout_s,
                   f"the feed's release of {KILLED} in {', '.join(feed49)}")
    except TimeoutError as exc:
        say(f"lab: {exc}")


@contextlib.contextmanager
def steady_sends(run: LabRun) -> Iterator[None]:
    threads = [threading.Thread(target=p.run, name=p.name, daemon=True) for p in run.producers]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        for p in run.producers:
            p.stop.set()
        for t in threads:
            t.join(60)


def run_phases(run: LabRun, cluster: Any, phase_s: float, freeze_s: float, say: Callable[[str], None],
               sampler: ReleaseSampler) -> None:
    wait_until(lambda: events_in_bronze(run.storage_root) > 0, 600, "the stream's first bronze rows")
    time.sleep(phase_s)  # the warm phase: steady traffic before any fault
    snapshot_all(run, "warm")
    late = [p for p in run.producers if p.late]
    for p in late:
        p.hold.set()
        with p.lock:  # its send in progress, if any, is over
            pass
    say(f"lab: phase warm done; SIGKILL {KILLED} ({len(late)} late producers resume {LATE_S:.0f}s after it)")
    run.mark("kill")
    cluster.kill(KILLED)
    time.sleep(LATE_S)
    for p in late:
        p.hold.clear()
    time.sleep(max(0.0, phase_s - LATE_S))
    snapshot_all(run, "killed")
    say(f"lab: restarting {KILLED}")
    run.mark("restart")
    cluster.start_brokers([KILLED])
    run.mark("restarted")
    sampler.start()
    # The episode closes on successful sends to the restarted broker: after the producers' next route
    # refresh (every 30 s), episode_close_after_s of them, the watermark delay and a trigger (~50 s on
    # a quiet machine, a few times that under load); the bound stays well under the 900 s silence
    # bound, so an episode that never sees a recovery fails here instead of closing silently.
    wait_until(lambda: (e := episode_of(run.storage_root, KILLED, run.marks["kill"])) is not None
               and e["closed_ms"] is not None, 600, f"the episode on {KILLED} to close")
    run.mark("episode_closed")
    snapshot_all(run, "recovered")
    say(f"lab: {KILLED}'s episode closed; SIGSTOP {FROZEN} for {freeze_s:.0f}s")
    run.mark("freeze")
    cluster.freeze(FROZEN)
    try:
        time.sleep(freeze_s)
    finally:
        cluster.thaw(FROZEN)
    run.mark("thaw")
    time.sleep(phase_s)
    snapshot_all(run, "frozen")
    # broker_health settles a minute once the watermark passes it: keep sending until the thaw's has
    thaw_minute = run.marks["thaw"] // 60_000 * 60_000
    wait_until(lambda: health_minutes(run.storage_root, FROZEN) >= thaw_minute, 180,
               f"broker_health to settle {FROZEN}'s minute of the thaw")


def drain(run: LabRun) -> None:
    """Every hook event delivered and in bronze; the feed producers' counters read."""
    delivered = 0
    for p in run.producers:
        stats = p.command("flush")
        delivered += stats["delivered"]
        if p.feed:
            run.feed_stats[p.name] = p.command("feedstats")
    wait_until(lambda: events_in_bronze(run.storage_root) >= delivered, 300, f"all {delivered} events in bronze")
    wait_batch_committed(run)


def wait_batch_committed(run: LabRun) -> None:
    """Wait until the stream's batch that wrote bronze last has committed every table it touches: its
    tables commit side by side, and its report is written once all of them have."""
    from deltalake import DeltaTable

    from pipeline.config import load_config
    from streaming.combined_query import NAME
    from streaming.delta_sink import app_id, checkpoint_dir, read_report, report_dir

    cfg = load_config(run.root / "faultwatch.toml")
    batch = DeltaTable(str(Path(run.storage_root) / "send_results")).transaction_version(app_id(cfg, NAME))
    reports = report_dir(checkpoint_dir(cfg, NAME))
    wait_until(lambda: batch is None or read_report(reports, batch) is not None, 120,
               f"the stream's batch {batch} to commit all its tables")


def run_lab(root: Path, phase_s: float = 30.0, freeze_s: float = 8.0, out: TextIO = sys.stdout) -> int:
    from faultwatch.lab_measure import report
    from pipeline.config import Config
    from pipeline.kafka_apache import start_apache_kafka
    from pipeline.rocketmq_cluster import start_cluster

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    if root.exists():
        say(f"lab: replacing the previous lab's data in {root}/")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    run_load = [round(os.getloadavg()[0], 1)]
    topics = Config().topics
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # the probes while Kafka starts are expected
    say("lab: starting Apache Kafka and a RocketMQ name server with three brokers")
    kafka = start_apache_kafka(topics=topics.all(), partitions=2, home=root / "kafka")
    children: list[subprocess.Popen[bytes]] = []
    cluster = None
    run = LabRun(root, str(root / "tables"), kafka.bootstrap, topics.avoidance, load_average=run_load)
    try:
        conf = lab_config(root, kafka.bootstrap, phase_s)
        # the stream needs only Kafka: its Spark start runs beside the cluster's
        children.append(faultwatch("stream", "--config", str(conf), log=root / "stream.log"))
        cluster = start_cluster(3, home=root / "rocketmq")
        cluster.create_topic(TOPIC, 4)
        say(f"lab: faultwatch stream runs (log {root / 'stream.log'}); starting {len(FLEET) + len(LATE)} producers")
        start_fleet(run, cluster.namesrv_addr)
        run.producers[0].command(f"consume {GROUP}")
        poller_home = root / "poller"
        poller_home.mkdir()
        children.append(start_poller(cluster.namesrv_addr, CLUSTER, [GROUP], poller_home, "--kafka", kafka.bootstrap,
                                     "--interval-ms", "2000", "--timeout-ms", "1500"))
        sampler = ReleaseSampler(run)
        with steady_sends(run):
            wait_until(lambda: events_in_bronze(run.storage_root) > 0, 600, "the stream's first bronze rows")
            children.append(faultwatch("publish", "--config", str(conf), "--every", log=root / "publish.log"))
            # the kill must find the publisher watching: an episode already open at its start is no new one
            wait_until(lambda: "early cycles:" in (root / "publish.log").read_text(errors="replace"), 300,
                       "the publisher's first cycle")
            try:
                run_phases(run, cluster, phase_s, freeze_s, say, sampler)
                wait_release(sampler, 240, say)
            finally:
                sampler.stop()
        drain(run)
        for p in run.producers:
            if p.errors:
                say(f"lab: producer {p.name} stopped sending: {p.errors[-1]}")
        (root / "snapshots.json").write_text(json.dumps([vars(s) for s in run.snapshots], indent=1))
        (root / "release_samples.json").write_text(json.dumps(run.release_samples))
        run.load_average.append(round(os.getloadavg()[0], 1))
        facts = report(run)
        for line in facts["lines"]:
            say(line)
        say("lab facts: " + json.dumps(facts["facts"], sort_keys=True))
        return 0
    finally:
        for p in run.producers:  # their producers shut down side by side
            p.driver.quit()
        for p in run.producers:
            p.driver.close()
        stop_groups(children)
        if cluster is not None:
            cluster.stop()
        kafka.close()
