"""faultwatch demo, as a newcomer runs it: it finishes and shows an episode and a lagging group."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.processes import BIN

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.spark]


def test_demo_for_60_seconds_shows_an_episode_and_a_lagging_group(tmp_path: Path) -> None:
    # The demo writes data/demo/ under its working directory; run it in a scratch folder.
    result = subprocess.run(
        [str(BIN / "faultwatch"), "demo", "--duration", "60"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
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
    episodes = int(re.search(r"fault episodes: (\d+)", summary).group(1))  # type: ignore[union-attr]
    lagging = int(re.search(r"lagging consumer groups: (\d+)", summary).group(1))  # type: ignore[union-attr]
    assert episodes >= 1 and "broker-b" in summary  # the scenario's outage
    assert lagging >= 1
    report = Path(re.search(r"report: (\S+)", summary).group(1))  # type: ignore[union-attr]
    assert report.exists() and report.stat().st_size > 10_000
