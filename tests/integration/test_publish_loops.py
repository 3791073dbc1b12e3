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
