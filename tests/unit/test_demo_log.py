"""The demo's stream log takes the stderr of everything it starts: Spark's JVM writes its log there.

The JVM (and the Python workers it starts) inherit the demo's file descriptor 2, so a real ``java``
started inside :func:`stderr_to` stands for Spark's: what it writes to stderr must reach the log,
never the terminal, and the demo's own stderr must come back afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch.demo import stderr_to
from streaming.session import check_java


def test_children_started_inside_write_their_stderr_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log_path = tmp_path / "stream.log"
    with stderr_to(log_path) as log:
        log.write("faultwatch stream: batch 0\n")
        subprocess.run([check_java(), "-version"], check=True, timeout=60)  # the JVM prints to stderr
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('WARN from a worker\\n')"], check=True)
        os.write(2, b"a warning of the demo process\n")
    os.write(2, b"after the demo\n")

    text = log_path.read_text(encoding="utf-8")
    assert "faultwatch stream: batch 0" in text
    assert 'version "' in text  # java -version's banner
    assert "WARN from a worker" in text and "a warning of the demo process" in text
    terminal = capfd.readouterr()
    assert terminal.err == "after the demo\n" and terminal.out == ""


def test_the_log_is_appended_to(tmp_path: Path) -> None:
    log_path = tmp_path / "stream.log"
    log_path.write_text("earlier\n", encoding="utf-8")
    with stderr_to(log_path):
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('later\\n')"], check=True)
    assert log_path.read_text(encoding="utf-8") == "earlier\nlater\n"
