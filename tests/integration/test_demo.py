"""faultwatch demo, as a newcomer runs it: the whole story told, even on a busy machine.

The default demo runs with one core kept busy by another process (a cold first run on a slow
machine reads its events late): it must still end with the outage's episode closed and its alert
resolved, and a lagging group.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import BIN

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def busy_core() -> Iterator[None]:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait(timeout=30)


def test_default_demo_tells_the_whole_story_with_a_core_kept_busy(tmp_path: Path, busy_core: None) -> None:
    # The demo writes data/demo/ under its working directory; run it in a scratch folder.
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "faultwatch"), "demo"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )
    took = time.monotonic() - started
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    # Publisher cycles wait for the stream's first fault rows: none meets empty inputs at the start.
    assert "rejected by the gate" not in result.stderr + out
    assert "great_expectations" not in result.stderr + out  # its INFO chatter stays out
    # Spark's and the JVM's log go to the stream log, not to the screen the live view uses.
    stream_log = (tmp_path / "data" / "demo" / "stream.log").read_text(encoding="utf-8")
    assert "log4j" in stream_log and "faultwatch stream:" in stream_log
    assert "log4j" not in result.stderr + out and " WARN " not in result.stderr
    assert re.search(r"demo: live page http://127\.0\.0\.1:\d+/ · Prometheus metrics http://\S+/metrics", out)
    summary = out[out.index("demo summary:"):]
    # The outage (broker-b, 20-60 s): one episode, closed, with how long it lasted.
    assert "fault episodes: 1 (0 still open)" in summary, summary
    (episode,) = re.findall(r"^  cluster-main/broker-b: .*$", summary, flags=re.MULTILINE)
    lasted = int(re.search(r", closed, lasted (\d+) s$", episode).group(1))  # type: ignore[union-attr]
    assert 30 <= lasted <= 60, episode
    assert re.search(r"peak \d+% of producers avoiding", episode)
    assert int(re.search(r"avoidance recommendations published: (\d+)", summary).group(1)) >= 1  # type: ignore[union-attr]
    # Its alerts, read back from the alerts topic (one per state, as the Prometheus rule names them):
    # the open episode's fired, then resolved; nothing is still firing but the lagging group's.
    assert re.search(r"^  broker_fault cluster-main\|broker-b\|open: fired \S+ UTC, resolved \S+ UTC$", summary,
                     flags=re.MULTILINE), summary
    firing = re.findall(r"^  (\S+) (\S+): fired \S+ UTC, still firing$", summary, flags=re.MULTILINE)
    assert all(kind == "consumer_lag" for kind, _ in firing), summary
    lagging = int(re.search(r"lagging consumer groups: (\d+)", summary).group(1))  # type: ignore[union-attr]
    assert lagging >= 1
    report = Path(re.search(r"report: (\S+)", summary).group(1))  # type: ignore[union-attr]
    html = report.read_text(encoding="utf-8")
    assert f"<td>closed, lasted {lasted} s</td>" in html
    told = re.findall(r"faultwatch demo — (\d+)s of", out)[-1]  # the live view's last line
    print(f"demo with a busy core: {took:.0f} s, the story told {told} s in")  # shown with -s
