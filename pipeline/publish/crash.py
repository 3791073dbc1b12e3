"""Test hook: ``FAULTWATCH_PUBLISH_CRASH_AT=<point>`` makes the publisher SIGKILL itself at that point.

The points sit between the steps whose order matters for recovery (claim, Kafka, file, history,
cycle row, alert records, alert state), so a test can stop a real process exactly there, without
timing. Unset (always, outside tests), :func:`point` does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "FAULTWATCH_PUBLISH_CRASH_AT"
POINTS = ("claimed", "sent", "file", "history", "published", "alerts_state", "alerts_sent")


def point(name: str) -> None:
    """Kill this process (SIGKILL: no clean-up, no ``finally``) if the hook names ``name``."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; one of {', '.join(POINTS)}")
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


BARRIER_ENV = "FAULTWATCH_PUBLISH_BARRIER"  # "<folder>:<parties>": meet there before committing a claim


def barrier(name: str, timeout_s: float = 60.0) -> None:
    """Test hook: wait until ``parties`` processes reached ``name`` (files in ``folder``), so two
    publishers commit their claims on the same snapshot: the race is forced, not hoped for."""
    spec = os.environ.get(BARRIER_ENV)
    if not spec:
        return
    import time
    from pathlib import Path

    folder, parties = spec.rsplit(":", 1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob(f"{name}.*"))) < int(parties):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{BARRIER_ENV}: {parties} parties never met at {name!r} in {folder}")
        time.sleep(0.02)
