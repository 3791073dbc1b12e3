"""Spark's Python worker daemon, with the modules the tasks use imported before it forks.

Spark forks every executor Python worker from one daemon process. A fresh worker would import
pyarrow, pandas, kafka-python, pyspark's worker and faultwatch's modules by itself: seconds of CPU
per worker, paid by every query's first tasks. Imported once here, every fork starts with them in
memory (copy-on-write); ``streaming.session`` makes this the daemon (``spark.python.daemon.module``).
The daemon then freezes its objects (``gc.freeze``), so a reused worker's ``gc.collect()`` after
each task does not walk the preloaded modules while Spark waits for it.

A worker whose JVM end of the socket has closed ends quietly: pyspark's daemon prints a
BrokenPipeError traceback into the job's log, though nobody is left to read a report. The JVM
closes such sockets when it stops and a minute after an idle planner worker's last call (the data
source's lookup, create and plan each run under a daemon Spark starts as ``pyspark.daemon``). So
the planners' daemons run this module too, without preloading: the wrapper in
:mod:`streaming.session` swaps the module, as ``faultwatch-python`` (:mod:`streaming.pyexec`) does
under spark-submit, and importing :mod:`streaming.kafka_source` quiets a pyspark daemon it finds
itself in (:func:`quiet_pyspark_daemon`). Figures: docs/performance.md, 2026-11-25 (10), 2026-11-27 (17).
"""

from __future__ import annotations

import gc
import importlib
import sys
from types import ModuleType
from typing import Any

# Only imports: nothing here may start a thread or open a connection before the fork (deltalake,
# which must not be used across a fork, is left out: executors write Parquet with pyarrow).
PRELOAD = (
    "numpy", "pandas", "pyarrow", "pyarrow.compute", "pyarrow.ipc", "pyarrow.parquet", "orjson", "kafka",
    "pyspark.worker", "pyspark.sql.worker.plan_data_source_read", "streaming.kafka_source", "streaming.decode",
    "streaming.kafka_records", "streaming.feeds", "streaming.combined_query", "streaming.delta_sink",
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; the names that failed (an import error must not stop the daemon)."""
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it itself then, and reports a real error
            failed.append(name)
    return failed


def freeze() -> int:
    """Move every object so far out of the collector's reach (the forks inherit that); how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


# The module a daemon's forked children run when Spark names none (the executors' Python workers).
EXECUTOR_WORKER = "pyspark.worker"


def quiet_when_closed(daemon: ModuleType | None = None) -> None:
    """Make every forked worker end quietly (exit 0) when its socket's other end has gone.

    pyspark's worker loop calls ``worker`` of its daemon module (``pyspark.daemon`` unless given)
    per task, looking it up each time; a broken pipe or a reset there means the JVM closed the
    connection (the task ended, an idle worker timed out, or Spark stopped), which the JVM knows.
    Any other error still ends in pyspark's traceback.
    """
    if daemon is None:
        import pyspark.daemon

        daemon = pyspark.daemon
    target: Any = daemon
    inner = target.worker
    if getattr(inner, "quiet_when_closed", False):
        return

    def worker(sock: Any, authenticated: bool) -> int:
        try:
            return int(inner(sock, authenticated))
        except (BrokenPipeError, ConnectionResetError):
            return 1  # non-zero: the loop stops reusing this worker, which then exits

    worker.quiet_when_closed = True  # type: ignore[attr-defined]
    target.worker = worker


def quiet_pyspark_daemon() -> bool:
    """In a process started as ``python -m pyspark.daemon`` (its code is ``__main__``, not the
    importable ``pyspark.daemon``), quiet its worker loop from now on; whether it was one."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or getattr(spec, "name", None) != "pyspark.daemon" or not hasattr(main, "worker"):
        return False
    quiet_when_closed(main)
    return True


if __name__ == "__main__":
    if sys.argv[1:2] in ([], [EXECUTOR_WORKER]):  # the planners' daemons fork a few workers: no preload
        preload()
        freeze()
    quiet_when_closed()
    from pyspark.daemon import manager

    manager()
