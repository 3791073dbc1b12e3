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



def test_the_daemon_freezes_what_it_imported_so_worker_collections_skip_it() -> None:
    code = (
        "import gc, streaming.daemon as d; d.preload(); n = d.freeze(); print(n, len(gc.get_objects()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    frozen, collectable = map(int, out.split())
    assert frozen > 10_000, out
    assert collectable < 1_000, out  # a worker's gc.collect() walks only what it made after the fork
