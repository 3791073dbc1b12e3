"""What the benchmarks share: running a measured child process, and parallel preloading."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def tree_procs(pid: int) -> list[Any]:
    """A process and all its live descendants (psutil processes); none once it has ended."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants (driver, JVM, Python workers), bytes."""
    import psutil

    total = 0
    for p in tree_procs(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_measured(args: Sequence[str], log: Path, on_line: Callable[[str], None], cwd: Path) -> tuple[int, int]:
    """Run ``args``; hand each stdout line to ``on_line``; stderr goes to ``log``.

    Returns (exit code, peak RSS of the process tree sampled every 200 ms).
    """
    with log.open("w") as err:
        proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        on_line(line)
    code = proc.wait()
    sampler.join()
    return code, peak[0]


def log_tail(log: Path, lines: int = 30) -> str:
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def run_parallel(target: Callable[..., None], argsets: Sequence[tuple[Any, ...]], timeout_s: float = 900.0) -> float:
    """Run ``target(*args)`` in one spawned process per argument tuple; seconds until all are done.

    A process still running after ``timeout_s`` (e.g. a producer waiting on a broker that died)
    is terminated, and the run stops with a message instead of hanging.
    """
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=target, args=args) for args in argsets]
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, t0 + timeout_s - time.perf_counter()))
        if w.is_alive():
            for other in workers:
                other.terminate()
            raise SystemExit(f"{target.__name__} did not finish within {timeout_s:.0f}s; stopped it")
        if w.exitcode != 0:
            raise SystemExit(f"{target.__name__} failed (exit {w.exitcode})")
    return time.perf_counter() - t0
