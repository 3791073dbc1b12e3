"""Child processes that never outlive faultwatch: the brokers and JVMs that the demo, the lab and the
tests start. Each dies with its parent (Linux's PR_SET_PDEATHSIG), even when the parent is killed
with SIGKILL, and stops with SIGTERM first so it can shut down cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable


def die_with_parent() -> None:
    """In the child, between fork and exec: get SIGTERM when the parent dies (a prctl call only, so it
    is safe with threads in the parent)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the owners' context managers still stop it on every normal exit


# Popen's preexec_fn for every child faultwatch starts (None where prctl does not exist).
DIE_WITH_PARENT: Callable[[], None] | None = die_with_parent if sys.platform.startswith("linux") else None


def stop_children(procs: list[subprocess.Popen[bytes] | None], timeout_s: float) -> None:
    """:func:`stop_child` for several at once: all get SIGTERM together and share the one deadline
    (brokers that each take seconds to shut down then cost the slowest one's time, not the sum)."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_child(proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM (after SIGCONT: a stopped process cannot handle it), then SIGKILL after ``timeout_s``."""
    stop_children([proc], timeout_s)
