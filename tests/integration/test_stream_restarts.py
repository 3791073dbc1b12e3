"""``faultwatch stream --once`` started many times over one backlog, most starts SIGKILLed.

Start-up must never fail on its own: every start that is not killed exits 0 with a clean log, and no
start shows a query failure before its kill. Kills land at seeded pseudo-random moments, some during
start-up (the session, the checkpoint's recovery, the first micro-batch) and some mid-backlog. At the
end every Delta table equals, row for row, what one clean run over the same backlog wrote into its own
storage root, with no row written twice.

The test knows the job only through its command line: the queries and tables it compares are the
ones the job writes, whatever the default concerns are.
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
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.simulate import KafkaSink, Simulation, load_scenario
from tests.conftest import unique_topics
from tests.integration.processes import kill_tree, start_faultwatch, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = 20
SIMULATED_S = 120.0  # broker-b is down from 30 s to 90 s of it: the job sees an outage and a recovery
MAX_EVENTS_PER_BATCH = 2500  # ~27 micro-batches per query: room for kills between and inside them
RUN_TIMEOUT_S = 420.0

# Bronze tables have a key per record; their rows are compared sorted by it and it must be unique.
BRONZE_KEYS: dict[str, tuple[str, ...]] = {
    "send_results": ("event_id",),
    "consumer_progress": ("kafka_topic", "kafka_partition", "kafka_offset"),
    "group_membership": ("kafka_topic", "kafka_partition", "kafka_offset"),
    # A record may be rejected by more than one stage (e.g. valid for bronze, late for the faults).
    "quarantine": ("source_topic", "source_partition", "source_offset", "stage", "reason"),
}
# Silver tables and the live changelogs (producer_fault_windows[_live], broker_fault_episodes[_live],
# broker_health, queue_lag, group_status, and any a later job adds) are compared as whole rows sorted by all columns. None of
# the declared tables holds a wall-clock column (schemas/tables.py, schemas/faults.py,
# schemas/lag.py: every time in them is event time), so no column is dropped.

BATCH_LINE = re.compile(r"^\[([^\]]+)\] batch \d+: in=", re.MULTILINE)
WAIT_FOR = {"first": re.compile(r"^started: ", re.MULTILINE), "mid": BATCH_LINE}
# What a start that failed by itself leaves in its log: the CLI's own failure line
# (streaming/job.py prints "faultwatch stream: query NAME failed: ..."), a Python traceback (from the
# driver or a Python worker), or a Spark ERROR line (a failed task or query).
FAILURE = re.compile(
    r"query \S+ failed|Traceback \(most recent call last\)|StreamingQueryException"
    r"|^\S+ \S+ ERROR |terminated with (?:error|exception)",
    re.MULTILINE,
)


def _plan(rng: random.Random) -> list[tuple[str, float]]:
    """The starts in order, each with its kill delay: ("startup", seconds after launch), ("first",
    seconds after the "started:" line: the first micro-batch, often a replay), ("mid", seconds after
    the start's first batch line), or ("end", 0: run to the end). Twenty in all, eighteen killed;
    start-up kills come cheapest (no batch to wait for), so they are the most."""
    first = [("startup", rng.uniform(1.0, 12.0)) for _ in range(6)]
    first += [("first", rng.uniform(0.0, 6.0)) for _ in range(4)]
    first += [("mid", rng.uniform(0.0, 3.0)) for _ in range(4)]
    rng.shuffle(first)
    # After the first run to the end the backlog is done: the starts then only recover the checkpoint.
    then = [("startup", rng.uniform(1.0, 12.0)) for _ in range(2)] + [("first", rng.uniform(0.0, 4.0)) for _ in range(2)]
    rng.shuffle(then)
    return [*first, ("end", 0.0), *then, ("end", 0.0)]


def _stream(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    # Unbuffered, so that the "started:" line reaches the log when it is printed.
    return start_faultwatch("stream", "--config", str(conf), "--once", log=log, env={"PYTHONUNBUFFERED": "1"})


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _wait(predicate: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """True once ``predicate`` holds; False if ``proc`` ended first. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    raise AssertionError(f"no progress within {timeout_s}s")


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


def _run_start(kind: str, delay_s: float, conf: Path, log: Path) -> str:
    """One start; returns how it ended: "killed" or "completed" (exited 0 by itself)."""
    proc = _stream(conf, log)
    try:
        mark = WAIT_FOR.get(kind)
        if mark is not None:  # the moment the delay counts from
            alive = _wait(lambda: mark.search(_read(log)) is not None, proc, RUN_TIMEOUT_S)
            kind = "startup" if alive else "end"  # it ended first, e.g. nothing left to read
        if kind == "startup":
            deadline = time.monotonic() + delay_s
            alive = _wait(lambda: time.monotonic() >= deadline, proc, delay_s + 5)
            if alive:
                kill_tree(proc, signal.SIGKILL)
                _group_gone(proc.pid)
                _assert_clean(log, f"killed start ({log.name})")  # no query failed before the kill
                return "killed"
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_tree(proc, signal.SIGKILL)
    assert code == 0, f"{log.name} exited {code} by itself:\n{_read(log)[-4000:]}"
    _assert_clean(log, f"completed start ({log.name})")
    assert "total:" in _read(log), f"{log.name}: no total line:\n{_read(log)[-4000:]}"
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


def _assert_same_tables(restarted: Path, clean: Path) -> None:
    names = _tables(restarted)
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


def test_startup_never_fails_and_kills_change_no_table(kafka, cfg: Config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = unique_topics(cfg, kafka, "restarts").replace(stream__max_events_per_batch=MAX_EVENTS_PER_BATCH)
    scenario = load_scenario("broker-outage").replace(duration_s=SIMULATED_S)
    stats = Simulation(scenario, seed=SEED).run(KafkaSink(cfg), close=True)
    assert stats.events["send_result"] > 10 * MAX_EVENTS_PER_BATCH

    clean = cfg.replace(
        storage__root=str(tmp_path / "clean" / "tables"),
        storage__checkpoint_root=str(tmp_path / "clean" / "checkpoints"),
        storage__publish_dir=str(tmp_path / "clean" / "avoidance"),
    )
    clean_log = tmp_path / "clean.log"
    assert _run_start("end", 0.0, write_config(clean, tmp_path / "clean.toml"), clean_log) == "completed"

    conf = write_config(cfg, tmp_path / "fw.toml")
    ends: Counter[str] = Counter()
    for i, (kind, delay) in enumerate(_plan(random.Random(SEED))):
        ends[_run_start(kind, delay, conf, tmp_path / f"start-{i:02d}-{kind}.log")] += 1
    assert ends["killed"] >= 12 and ends["completed"] >= 2, ends

    root, clean_root = Path(cfg.storage.root), Path(clean.storage.root)
    sends = read_table(str(clean_root), "send_results", columns=["event_id"]).num_rows
    assert sends == stats.events["send_result"]
    assert read_table(str(clean_root), "broker_fault_episodes_live").num_rows > 0  # the outage was seen
    _assert_same_tables(root, clean_root)
