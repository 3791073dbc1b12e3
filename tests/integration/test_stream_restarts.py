"""``faultwatch stream --once`` started many times over one backlog, most starts SIGKILLed.

Start-up must never fail on its own: every start that is not killed exits 0 with a clean log, and no
start shows a query failure before its kill. Each kill lands on a milestone the job itself reports,
chosen by a seeded plan: a start-up point (the CLI's first line, the JVM launched, Spark's session
under way, the queries started) or a point in the backlog (the start's first new checkpoint file, its
k-th planned or committed micro-batch, its k-th Delta commit of a table). A milestone is always
followed by seconds of work, so the kill reaches a live job: the plan's eighteen kills of twenty
starts all land, and the test counts them. The backlog is checked to hold more micro-batches than
the plan's kills can consume, so no kill waits for a batch that never comes. At the end every Delta
table equals, row for row, what one clean run over the same backlog wrote into its own storage root,
with no row written twice.

It runs twice over one backlog and one clean run (``deltalake`` writer, local folders):
- ``local-both-writers``: both roots in local folders, ``storage.writer`` switched at every start
  (``deltalake`` on even starts, ``delta-spark`` on odd ones, so a start of one writer recovers from
  a kill of the other: both record each batch as the same Delta transaction, app id and batch id);
- ``s3``: both roots on ``s3://`` in a real S3-compatible server (Versity's gateway over a folder,
  tests/integration/s3_server.py), whose folder the milestones are counted in.
``FAULTWATCH_RESTARTS_DELTA_SPARK=1`` adds a third run with ``delta-spark`` at every start, by hand
(268 s on a quiet machine: the suite is near its 40 minutes).

The test knows the job only through its command line, its log and the files it writes: the queries
and tables it compares are the ones the job reports, whatever the default concerns are.
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline import objstore
from pipeline.config import Config, S3Config, Secret, StorageConfig
from pipeline.deltaio import read_table
from pipeline.simulate import KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.integration.processes import kill_tree, start_faultwatch, write_config
from tests.integration.s3_server import REGION, S3Server, s3_server

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(2400)]

SEED = 20
SIMULATED_S = 120.0  # broker-b is down from 30 s to 90 s of it: the job sees an outage and a recovery
MAX_EVENTS_PER_BATCH = 2000  # ~34 micro-batches per query: more than the plan's kills can consume
RUN_TIMEOUT_S = 420.0
DELTA_SPARK_RUN_TIMEOUT_S = 3600.0  # a start that runs the whole backlog at 24-36 s per micro-batch
POLL_S = 0.02  # a micro-batch takes ~0.3 s and start-up seconds: a milestone is seen long before the next
KILLS, COMPLETED = 18, 2  # of the twenty starts, as README says

# Bronze tables have a key per record; their rows are compared sorted by it and it must be unique.
BRONZE_KEYS: dict[str, tuple[str, ...]] = {
    "send_results": ("event_id",),
    "consumer_progress": ("kafka_topic", "kafka_partition", "kafka_offset"),
    "group_membership": ("kafka_topic", "kafka_partition", "kafka_offset"),
    # A record may be rejected by more than one stage (e.g. valid for bronze, late for the faults).
    "quarantine": ("source_topic", "source_partition", "source_offset", "stage", "reason"),
}
# Silver tables and the live changelogs (producer_fault_windows[_live], broker_fault_episodes[_live],
# broker_health, queue_lag, group_status, and any a later job adds) are compared as whole rows sorted
# by all columns. None of the declared tables holds a wall-clock column (schemas/tables.py,
# schemas/faults.py, schemas/lag.py: every time in them is event time), so no column is dropped.
DELTA_TABLE = "send_results"  # written by every micro-batch: its Delta commits are milestones

# Start-up lines every start prints, in this order: the CLI read its config (no JVM yet); Spark's
# session is being created; the queries started (each recovers its checkpoint, then its first batch).
LINES = {
    "launched": re.compile(r"^faultwatch stream: ", re.MULTILINE),
    "session": re.compile(r"^Setting default log level", re.MULTILINE),
    "started": re.compile(r"^started: ", re.MULTILINE),
}
STARTED = re.compile(r"^started: (.+) \(", re.MULTILINE)
TOTAL = re.compile(r"^\[[^\]]+\] total: ", re.MULTILINE)
# Before the queries start: seconds of start-up follow, even when nothing is left to read.
BEFORE_QUERIES = ("launched", "jvm", "session")
# What a start that failed by itself leaves in its log: the CLI's own failure line
# (streaming/job.py prints "faultwatch stream: query NAME failed: ..."), a Python traceback (from the
# driver or a Python worker), or a Spark ERROR line (a failed task or query).
FAILURE = re.compile(
    r"query \S+ failed|Traceback \(most recent call last\)|StreamingQueryException"
    r"|^\S+ \S+ ERROR |terminated with (?:error|exception)",
    re.MULTILINE,
)
BATCH_FILE = re.compile(r"\d+")  # a checkpoint's offsets/N or commits/N (Spark renames them complete)
DELTA_FILE = re.compile(r"\d{20}\.json")  # a Delta commit (written complete)


@dataclass(frozen=True)
class Kill:
    """Where a start is killed: ``at`` names a milestone the job reports, ``k`` its count in the start.

    "launched", "session", "started": a start-up line (above); "jvm": a java process in the start's
    process group; "first": the first new file in the query's offsets/ or commits/ (the start's first
    micro-batch, a replay or a new one); "planned"/"committed": the k-th new offsets/N (batch N under
    way) or commits/N (batch N done) file; "delta": the k-th new Delta commit of ``DELTA_TABLE`` (its
    part of a batch written, Spark's commit maybe not yet).
    """

    at: str
    k: int = 1

    def batches(self) -> int:
        """At most how many micro-batches of the backlog a start killed here commits: the k it waits
        for, one replayed batch that writes no new file, and one more between the milestone and the kill."""
        if self.at in BEFORE_QUERIES:
            return 0
        return 1 if self.at == "started" else self.k + 2

    def __str__(self) -> str:
        return f"{self.at}{self.k}"


def _plan(rng: random.Random) -> list[Kill | None]:
    """The twenty starts in order, each with its kill (None: run to the end), eighteen killed. Every
    milestone is in the plan whatever the seed; the seed picks the rest, the counts and the order."""
    startup = [*BEFORE_QUERIES, "started", *rng.sample([*BEFORE_QUERIES, "started"], 2)]
    batch = ["planned", "committed", "delta", rng.choice(["planned", "committed", "delta"])]
    first: list[Kill | None] = [Kill(at) for at in startup] + [Kill("first") for _ in range(4)]
    first += [Kill(at, rng.randint(1, 3)) for at in batch]
    rng.shuffle(first)
    # After the first run to the end the backlog is done: the starts then only recover the
    # checkpoint, and their kills land before the queries start (after that a start may end at once).
    then: list[Kill | None] = [Kill(at) for at in [*BEFORE_QUERIES, rng.choice(BEFORE_QUERIES)]]
    rng.shuffle(then)
    return [*first, None, *then, None]


def _backlog_batches_needed(plan: list[Kill | None]) -> int:
    """Micro-batches the kills before the first run to the end may commit, at most."""
    before_end = plan[: plan.index(None)]
    return sum(kill.batches() for kill in before_end if kill is not None)


@dataclass(frozen=True)
class Where:
    """The files a start's milestones are counted in: the query's checkpoint and a table's log."""

    checkpoint: Path
    table_log: Path

    def files(self) -> dict[str, set[str]]:
        return {
            "planned": _names(self.checkpoint / "offsets", BATCH_FILE),
            "committed": _names(self.checkpoint / "commits", BATCH_FILE),
            "delta": _names(self.table_log, DELTA_FILE),
        }


def _names(folder: Path, pattern: re.Pattern[str]) -> set[str]:
    try:
        return {name for name in os.listdir(folder) if pattern.fullmatch(name)}
    except FileNotFoundError:
        return set()


def _java_in_group(pgid: int) -> bool:
    """True once a java process (Spark's JVM) runs in the process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        comm, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if comm == "java" and int(fields[2]) == pgid:  # fields: state, ppid, pgrp, ...
            return True
    return False


def _reached(kill: Kill, pid: int, log: Path, where: Where, base: dict[str, set[str]]) -> bool:
    if kill.at in LINES:
        return LINES[kill.at].search(_read(log)) is not None
    if kill.at == "jvm":
        return _java_in_group(pid)
    new = {key: names - base[key] for key, names in where.files().items()}
    if kill.at == "first":
        return bool(new["planned"] or new["committed"])
    return len(new[kill.at]) >= kill.k


def _stream(conf: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # Unbuffered, so that the "started:" line reaches the log when it is printed.
    return start_faultwatch("stream", "--config", str(conf), "--once", log=log,
                            env={"PYTHONUNBUFFERED": "1", **(env or {})})


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _group_gone(pgid: int, timeout_s: float = 30.0) -> None:
    """Wait until no process of the killed start's group is left (none may touch the checkpoint)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of group {pgid} still alive {timeout_s}s after SIGKILL")


def _assert_clean(log: Path, what: str) -> None:
    text = _read(log)
    failure = FAILURE.search(text)
    assert failure is None, f"{what}: the log shows a failure ({failure.group(0)!r}):\n{text[-4000:]}"


def _kill_at(kill: Kill, proc: subprocess.Popen[bytes], log: Path, where: Where, timeout_s: float) -> None:
    """SIGKILL the start's whole process group once it reports ``kill``'s milestone."""
    base = where.files()
    deadline = time.monotonic() + timeout_s
    while not _reached(kill, proc.pid, log, where, base):
        code = proc.poll()
        assert code is None, f"{log.name}: the job exited ({code}) before its milestone {kill}:\n{_read(log)[-4000:]}"
        assert time.monotonic() < deadline, f"{log.name}: no milestone {kill} within {timeout_s}s"
        time.sleep(POLL_S)
    kill_tree(proc, signal.SIGKILL)
    _group_gone(proc.pid)
    text = _read(log)
    assert proc.returncode == -signal.SIGKILL and TOTAL.search(text) is None, (
        f"{log.name}: the job ended by itself ({proc.returncode}) before the kill at {kill}:\n{text[-4000:]}"
    )
    _assert_clean(log, f"killed start ({log.name})")  # no query failed before the kill


def _run_start(kill: Kill | None, conf: Path, log: Path, where: Where, env: dict[str, str] | None = None,
               timeout_s: float = RUN_TIMEOUT_S) -> str:
    """One start; returns how it ended: "killed" (at its milestone) or "completed" (exited 0 by itself)."""
    proc = _stream(conf, log, env)
    try:
        if kill is not None:
            _kill_at(kill, proc, log, where, timeout_s)
            return "killed"
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            kill_tree(proc, signal.SIGKILL)
    assert code == 0, f"{log.name} exited {code} by itself:\n{_read(log)[-4000:]}"
    _assert_clean(log, f"completed start ({log.name})")
    assert TOTAL.search(_read(log)), f"{log.name}: no total line:\n{_read(log)[-4000:]}"
    return "completed"


def _tables(root: Path) -> set[str]:
    return {p.parent.name for p in root.glob("*/_delta_log")} if root.exists() else set()


def _canonical(value: object) -> object:
    """A value that compares and prints the same for equal cells (map entries in key order)."""
    if isinstance(value, list):
        items = [_canonical(v) for v in value]
        if all(isinstance(v, tuple) and len(v) == 2 for v in items):  # a map column's entries
            return tuple(sorted(items, key=repr))
        return tuple(items)
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return "NaN"  # NaN equals NaN here
    return value


def _rows(table: pa.Table, key: tuple[str, ...]) -> list[tuple[object, ...]]:
    """Whole rows, columns by name, sorted by ``key`` then by every column."""
    names = sorted(table.column_names)
    cols = {n: table.column(n).to_pylist() for n in names}
    rows = [tuple(_canonical(cols[n][i]) for n in names) for i in range(table.num_rows)]
    index = [names.index(k) for k in key]
    return sorted(rows, key=lambda r: (repr(tuple(r[i] for i in index)), repr(r)))


def _assert_same_tables(restarted: Path | str, clean: Path, folder: Path | None = None) -> None:
    """Every table under root ``restarted`` equals its clean twin; ``folder``: where the restarted
    tables' files are (an S3 root's, in the server's folder), the root itself by default."""
    names = _tables(Path(restarted) if folder is None else folder)
    assert names == _tables(clean), f"tables differ: {sorted(names)} vs {sorted(_tables(clean))}"
    for name in sorted(names):
        got, want = read_table(str(restarted), name), read_table(str(clean), name)
        assert sorted(got.column_names) == sorted(want.column_names), name
        key = BRONZE_KEYS.get(name, ())
        got_rows, want_rows = _rows(got, key), _rows(want, key)
        if key:
            index = [sorted(got.column_names).index(k) for k in key]
            keys = Counter(tuple(r[i] for i in index) for r in got_rows)
            dupes = [k for k, n in keys.items() if n > 1]
            assert not dupes, f"{name}: {len(dupes)} keys written twice, e.g. {dupes[:3]}"
        dupes = [r for r, n in Counter(map(repr, got_rows)).items() if n > 1 and Counter(map(repr, want_rows))[r] < n]
        assert not dupes, f"{name}: rows written twice, e.g. {dupes[:2]}"
        missing = Counter(map(repr, want_rows)) - Counter(map(repr, got_rows))
        extra = Counter(map(repr, got_rows)) - Counter(map(repr, want_rows))
        assert not missing and not extra, (
            f"{name}: {got.num_rows} rows after the restarts, {want.num_rows} in the clean run; "
            f"{sum(missing.values())} missing, e.g. {list(missing)[:2]}; {sum(extra.values())} extra, e.g. {list(extra)[:2]}"
        )


@dataclass(frozen=True)
class Backlog:
    """The simulator's backlog on its topics, and what one clean run of the job made of it."""

    cfg: Config  # its topics and stream settings
    events: int  # send_result events in it
    clean: Path  # the clean run's storage root
    query: str  # the first query (its files count the milestones)
    batches: int  # micro-batches of that query in the clean run


@pytest.fixture(scope="module")
def backlog(kafka, tmp_path_factory: pytest.TempPathFactory) -> Backlog:  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("restarts")
    cfg = unique_topics(Config(), kafka, "restarts").replace(stream__max_events_per_batch=MAX_EVENTS_PER_BATCH)
    scenario = load_scenario("broker-outage").replace(duration_s=SIMULATED_S)
    stats = Simulation(scenario, seed=SEED).run(KafkaSink(cfg), close=True)
    clean = cfg.replace(
        storage__root=str(base / "clean" / "tables"),
        storage__checkpoint_root=str(base / "clean" / "checkpoints"),
        storage__publish_dir=str(base / "clean" / "avoidance"),
    )
    clean_log = base / "clean.log"
    assert _run_start(None, write_config(clean, base / "clean.toml"), clean_log, Where(base, base)) == "completed"
    started = STARTED.search(_read(clean_log))
    assert started, f"no 'started:' line:\n{_read(clean_log)[-4000:]}"
    query = started.group(1).split(", ")[0]  # the milestones are counted in the first query's files
    batches = len(Where(Path(clean.storage.checkpoint_root) / query, base).files()["committed"])
    root = Path(clean.storage.root)
    assert read_table(str(root), "send_results", columns=["event_id"]).num_rows == stats.events["send_result"]
    assert read_table(str(root), "broker_fault_episodes_live").num_rows > 0  # the outage was seen
    return Backlog(cfg, stats.events["send_result"], root, query, batches)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


STORAGES: list[object] = ["local-both-writers", "s3"]
if os.environ.get("FAULTWATCH_RESTARTS_DELTA_SPARK") == "1":  # by hand: ~5 minutes more, quiet
    STORAGES.append(pytest.param("delta-spark", marks=pytest.mark.timeout(3 * 3600)))


@pytest.mark.parametrize("storage", STORAGES)
def test_startup_never_fails_and_kills_change_no_table(backlog: Backlog, storage: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    plan = _plan(random.Random(SEED))
    assert [k is None for k in plan].count(False) == KILLS and plan.count(None) == COMPLETED, plan
    # Each kill in the backlog waits for batches: the backlog must hold more than they all consume.
    assert _backlog_batches_needed(plan) < backlog.batches, (_backlog_batches_needed(plan), backlog.batches, plan)

    env: dict[str, str] = {}
    if storage in ("local-both-writers", "delta-spark"):
        cfg = backlog.cfg.replace(storage__root=str(tmp_path / "tables"),
                                  storage__checkpoint_root=str(tmp_path / "checkpoints"),
                                  storage__publish_dir=str(tmp_path / "avoidance"))
        writers = ["delta-spark"] if storage == "delta-spark" else ["deltalake", "delta-spark"]
        confs = [write_config(cfg.replace(storage__writer=w), tmp_path / f"fw-{w}.toml") for w in writers]
        folder, checkpoints = Path(cfg.storage.root), Path(cfg.storage.checkpoint_root)
    else:  # the bucket's objects are files in the server's folder: the milestones are counted there
        server: S3Server = request.getfixturevalue("s3")
        cfg = backlog.cfg.replace(storage__root=f"s3://{server.bucket}/restarts/tables",
                                  storage__checkpoint_root=f"s3://{server.bucket}/restarts/checkpoints",
                                  storage__publish_dir=str(tmp_path / "avoidance"))
        confs = [write_config(cfg, tmp_path / "fw.toml", **{"storage.s3": {"endpoint": server.endpoint, "region": REGION}})]
        env = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
        objstore.configure(StorageConfig(root=cfg.storage.root, s3=S3Config(
            server.endpoint, REGION, server.access_key, Secret(server.secret_key))), env={})
        folder = server.folder / server.bucket / "restarts" / "tables"
        checkpoints = server.folder / server.bucket / "restarts" / "checkpoints"
    where = Where(checkpoints / backlog.query, folder / DELTA_TABLE / "_delta_log")
    ends: Counter[str] = Counter()
    for i, kill in enumerate(plan):
        conf = confs[i % len(confs)]
        spark_writer = "delta-spark" in conf.name
        log = tmp_path / f"start-{i:02d}-{kill or 'end'}{'-delta-spark' if spark_writer else ''}.log"
        ends[_run_start(kill, conf, log, where, env, DELTA_SPARK_RUN_TIMEOUT_S if spark_writer else RUN_TIMEOUT_S)] += 1
    assert ends == Counter(killed=KILLS, completed=COMPLETED), ends
    if storage == "s3":
        assert list(folder.glob("send_results/**/*.parquet")), "no data file in the bucket"
    _assert_same_tables(cfg.storage.root, backlog.clean, folder)
