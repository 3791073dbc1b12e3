"""The worker daemon imports what the tasks use, and nothing that must not cross a fork."""

from __future__ import annotations

import subprocess
import sys


def test_the_daemon_preloads_every_module_and_nothing_fork_unsafe() -> None:
    code = (
        "import sys, streaming.daemon as d; failed = d.preload(); "
        "print(failed, sorted(m for m in sys.modules if m.split('.')[0] == 'deltalake'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []", out

