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


def test_a_worker_whose_jvm_socket_closed_ends_quietly() -> None:
    # The JVM end closes first, then the worker runs (Spark stopping): pyspark's own worker
    # function raises BrokenPipeError (Spark asks it to, to kill such workers) and its loop prints
    # the traceback into the job's log. The patched one returns non-zero: the loop then ends.
    code = (
        "import os, socket, streaming.daemon as d, pyspark.daemon as pd\n"
        "os.environ['PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE'] = '1'\n"
        "def run():\n"
        "    a, b = socket.socketpair(); a.close()\n"
        "    try:\n"
        "        return repr(pd.worker(b, True))\n"
        "    except BaseException as e:\n"
        "        return type(e).__name__\n"
        "print(run()); d.quiet_when_closed(); d.quiet_when_closed(); print(run())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["BrokenPipeError", "1"], proc
