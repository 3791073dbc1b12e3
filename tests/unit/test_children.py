"""Children stop on SIGTERM even when stopped, are killed when they ignore it, and die with their parent."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from pipeline.children import DIE_WITH_PARENT, stop_child


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True  # a zombie: dead, waiting for a reaper that is gone
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_a_stopped_child_ends_on_sigterm() -> None:
    proc = subprocess.Popen(["sleep", "300"], preexec_fn=DIE_WITH_PARENT)  # noqa: PLW1509
    proc.send_signal(signal.SIGSTOP)
    stop_child(proc, timeout_s=10)
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed() -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, preexec_fn=DIE_WITH_PARENT)  # noqa: PLW1509
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    stop_child(proc, timeout_s=0.5)
    assert proc.returncode == -signal.SIGKILL


def test_a_child_dies_with_its_parent_even_on_sigkill() -> None:
    parent_code = (
        "import subprocess, sys; from pipeline.children import DIE_WITH_PARENT; "
        "p = subprocess.Popen(['sleep', '300'], preexec_fn=DIE_WITH_PARENT); "
        "print(p.pid, flush=True); sys.stdin.read()"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert _wait_gone(child, timeout_s=30), f"child {child} outlived its parent"
