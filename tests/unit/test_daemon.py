"""The worker daemon imports what the tasks use, and nothing that must not cross a fork."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


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


def _state(pid: int) -> str:
    """A process's state letter from /proc (S: blocked, e.g. in a read; Z: exited, not yet reaped),
    or "gone" once it was reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def _wait_for_state(pid: int, state: str, what: str, timeout_s: float = 30.0) -> None:
    """Wait until worker ``pid`` is in ``state`` (an exited one counts as "gone"); fail after the bound."""
    deadline = time.monotonic() + timeout_s
    while (now := _state(pid)) != state and not (state == "gone" and now == "Z"):
        assert now not in ("Z", "gone"), f"worker {pid} exited before it was {what}"
        assert time.monotonic() < deadline, f"worker {pid} not {what} within {timeout_s}s (state {now})"
        time.sleep(0.01)


def _idle_worker_closed_by_the_jvm(command: list[str]) -> str:
    """Start a daemon as Spark starts a planner's (``command`` + the worker module), take a worker
    as the JVM does (its pid, the secret), then drop the connection while it waits for its call, as
    the JVM does to a worker idle for a minute, and stop the daemon. The daemon's standard error."""
    import os
    import socket
    import struct

    env = {**os.environ, "PYTHON_WORKER_FACTORY_SECRET": "s3cret", "SPARK_REUSE_WORKER": "1",
           "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE": "1"}
    proc = subprocess.Popen([*command, "pyspark.sql.worker.lookup_data_sources"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        (port,) = struct.unpack(">i", proc.stdout.read(4))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            f = sock.makefile("rwb")
            (pid,) = struct.unpack(">i", f.read(4))
            assert pid > 0
            f.write(struct.pack(">i", 6) + b"s3cret")
            f.flush()
            assert f.read(6) == struct.pack(">i", 2) + b"ok"
            _wait_for_state(pid, "S", "blocked reading its call")  # the worker now waits for the call
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a reset
            f.close()  # the socket closes only once its file is closed too
        # the worker reads the reset, answers into the closed socket, and exits (the daemon reaps it)
        _wait_for_state(pid, "gone", "ended")
        proc.stdin.close()  # how Spark stops a daemon
        return proc.stderr.read().decode(errors="replace") if proc.wait(timeout=30) is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_idle_planner_worker_dropped_by_the_jvm_ends_quietly() -> None:
    """Spark starts each data source planner under ``python -m pyspark.daemon``; through the session's
    wrapper it is faultwatch's daemon, and the dropped worker leaves no traceback. pyspark's own
    daemon, started the same way, prints one: the test sees the difference."""
    from streaming.session import driver_python

    wrapper = driver_python()
    assert wrapper != sys.executable
    assert "Traceback (most recent call last)" in _idle_worker_closed_by_the_jvm([sys.executable, "-m", "pyspark.daemon"])
    assert _idle_worker_closed_by_the_jvm([wrapper, "-m", "pyspark.daemon"]) == ""
    # what spark-submit's driver is told to use (README): the same swap, as an installed command
    command = os.path.join(os.path.dirname(sys.executable), "faultwatch-python")
    assert _idle_worker_closed_by_the_jvm([command, "-m", "pyspark.daemon"]) == ""


def test_faultwatch_python_swaps_only_pysparks_daemon() -> None:
    from streaming.pyexec import exec_args

    assert exec_args(["-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"]) == [
        "-m", "streaming.daemon", "pyspark.sql.worker.lookup_data_sources"]
    assert exec_args(["faultwatch/cli.py", "stream", "-m", "pyspark.daemon"]) == [
        "faultwatch/cli.py", "stream", "-m", "pyspark.daemon"]
    assert exec_args(["-m", "pyspark.worker"]) == ["-m", "pyspark.worker"]


def test_a_pyspark_daemon_that_imports_the_kafka_source_is_quieted() -> None:
    """Planners started without the wrapper (another master's driver) run pyspark's daemon as
    ``__main__``: importing the data source's module, as their workers do to unpickle it, quiets it."""
    code = (
        "import runpy, sys\n"
        "main = sys.modules['__main__']\n"
        "ns = runpy.run_module('pyspark.daemon', run_name='not_main')\n"  # the daemon's code, not started
        "main.__dict__.update({k: v for k, v in ns.items() if k in ('worker', 'manager')})\n"
        "main.__spec__ = __import__('importlib.util').util.find_spec('pyspark.daemon')\n"
        "before = getattr(main.worker, 'quiet_when_closed', False)\n"
        "import streaming.kafka_source\n"
        "print(before, getattr(main.worker, 'quiet_when_closed', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"], out
