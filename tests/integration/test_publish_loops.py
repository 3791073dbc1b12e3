"""Two ``faultwatch publish --every`` loops at once over the same tables: real processes, real Kafka.

Nothing forces the race: both loops wake on the same interval boundaries and try the same cycles.
Whoever wins a cycle publishes it once, with one content, recorded once; the other says it skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import unique_topics

from pipeline.config import Config
from pipeline.deltaio import read_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import read_topic, write_inputs

from tests.integration.processes import write_config
from tests.integration.test_publish_races import history, history_of

pytestmark = pytest.mark.kafka
FAULTWATCH = str(Path(sys.executable).parent / "faultwatch")
INTERVAL_S, CYCLES = 3.0, 4
LINE = re.compile(r"^cycle (\d+): (published|skipped|failed|rejected)\b(.*)$", re.MULTILINE)


def test_two_publish_every_loops_publish_each_cycle_once(cfg: Config, kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = unique_topics(cfg, kafka, "loops")
    write_inputs(c.storage.root, int(time.time() * 1000))
    conf = write_config(c, tmp_path / "fw.toml", publish={"interval_s": INTERVAL_S},
                        policy={"max_input_age_s": 1800.0})
    args = [FAULTWATCH, "publish", "--config", str(conf), "--every", "--cycles", str(CYCLES)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL, env=dict(os.environ)) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    said = [LINE.findall(out) for out in outs]
    assert [len(s) for s in said] == [CYCLES, CYCLES], outs  # every cycle of each loop printed its verdict

    # Each cycle: at most one loop says published; the other (when it tried the same cycle) skipped, with a reason.
    by_cycle: dict[str, list[tuple[str, str]]] = {}
    for lines in said:
        for cycle, status, rest in lines:
            by_cycle.setdefault(cycle, []).append((status, rest))
    published = sorted(c for c, verdicts in by_cycle.items() if any(s == "published" for s, _ in verdicts))
    for cycle, verdicts in by_cycle.items():
        statuses = sorted(s for s, _ in verdicts)
        assert statuses in (["published"], ["published", "skipped"], ["skipped"]), (cycle, verdicts, outs)
        assert all(rest.startswith(" (") for s, rest in verdicts if s == "skipped"), verdicts
    assert len(published) >= 2, outs  # both loops' lifetimes overlap: the race really ran over cycles
    assert any(len(v) == 2 for v in by_cycle.values()), by_cycle  # and at least one cycle was tried by both

    # Kafka: each published cycle exactly once, in cycle order, one record per cycle (the one cluster).
    records = read_topic(c.kafka.bootstrap_servers, c.topics.avoidance)
    assert [(k, m["cycle_id"]) for k, m in records] == [("c1", cycle) for cycle in published]
    assert records[-1][1] == json.loads((Path(c.storage.publish_dir) / "c1.json").read_bytes())
    assert history(c) == history_of(records)
    rows = read_table(c.storage.root, "publisher_cycles",
                      columns=["cycle_id", "step", "status", "decided_ms"]).to_pylist()
    avoidance = [r for r in rows if r["step"] == "avoidance"]
    decided = {m["cycle_id"]: m["decided_ms"] for _, m in records}
    assert sorted((r["cycle_id"], r["status"], r["decided_ms"]) for r in avoidance if r["status"] != "skipped") == [
        (cycle, status, decided[cycle]) for cycle in published for status in ("claimed", "published")]
    skipped = Counter(r["cycle_id"] for r in avoidance if r["status"] == "skipped")
    assert set(skipped) <= {cycle for cycle, v in by_cycle.items() if ("skipped" in {s for s, _ in v})}
    assert set(skipped.values()) <= {1}


def read_verdicts(proc: subprocess.Popen[str], n: int, timeout_s: float = 120.0) -> list[tuple[str, str, str]]:
    """The next ``n`` cycle verdict lines the loop prints (bounded; other lines are skipped)."""
    assert proc.stdout is not None
    found: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < n:
        assert time.monotonic() < deadline and proc.poll() is None, found
        line = proc.stdout.readline()
        found += LINE.findall(line)
    return found


def wait_line(proc: subprocess.Popen[str], text: str, timeout_s: float = 120.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while text not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None, f"no line with {text!r}"


@pytest.mark.parametrize("mode", ["--every", "--watch"])
def test_a_new_episode_is_published_at_once_between_regular_cycles(cfg: Config, kafka, tmp_path: Path,
                                                                   mode: str) -> None:  # type: ignore[no-untyped-def]
    """The interval is an hour: only the watch can publish b3's suspected episode while the loop runs.
    ``--every`` runs its regular cycle at start; ``--watch`` (beside the DAG) only the early one."""
    from dag_inputs import S, episode_row, write

    c = unique_topics(cfg, kafka, "early" + mode.strip("-"))
    now = int(time.time() * 1000)
    write_inputs(c.storage.root, now)
    conf = write_config(c, tmp_path / "fw.toml", publish={"interval_s": 3600.0, "watch_interval_s": 0.2},
                        policy={"max_input_age_s": 1800.0, "max_avoid_share": 0.5})
    regular = mode == "--every"
    proc = subprocess.Popen([FAULTWATCH, "publish", "--config", str(conf), mode, "--cycles", str(1 + regular)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        first = read_verdicts(proc, 1)[0] if regular else None
        wait_line(proc, "early cycles: a new episode")  # the watch's first look is done
        written = int(time.time() * 1000)
        write(c.storage.root, "broker_fault_episodes_live",
              [episode_row("b3", written - 5 * S, 0, written) | {"state": "suspected"}])
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, out
    early = LINE.findall(out)
    assert len(early) == 1 and early[0][1] == "published", out
    assert "avoid c1/b2, c1/b3" in early[0][2], out
    assert int(early[0][0]) >= written and int(early[0][0]) % 3_600_000 != 0, early  # its time, not the hour's
    records = read_topic(c.kafka.bootstrap_servers, c.topics.avoidance)
    expected = ([first[0]] if first else []) + [early[0][0]]
    assert [m["cycle_id"] for _, m in records] == expected
    assert sorted(e["broker_name"] for e in records[-1][1]["avoid"]) == ["b2", "b3"]
    rows = read_table(c.storage.root, "publisher_cycles", columns=["cycle_id", "step", "status"]).to_pylist()
    assert sorted(r["cycle_id"] for r in rows if r["step"] == "avoidance" and r["status"] == "published") == expected
