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


BARRIER_ENV = "FAULTWATCH_PUBLISH_BARRIER"  # "<folder>:<parties>": meet there (see barrier)
BARRIER_AT_ENV = "FAULTWATCH_PUBLISH_BARRIER_AT"  # the one point that is a barrier (default: "claim")
BARRIERS = ("claim", "send")


def barrier(name: str, timeout_s: float = 60.0) -> None:
    """Test hook: wait until ``parties`` processes (or files a test adds) reached ``name``.

    ``claim``: just before a claim is committed, so two publishers commit on the same snapshot and
    the race is forced, not hoped for. ``send``: a claimed cycle just before its Kafka send, held
    until the test lets it go (by adding ``send.<anything>`` to the folder).
    """
    if name not in BARRIERS:
        raise ValueError(f"unknown barrier {name!r}; one of {', '.join(BARRIERS)}")
    spec = os.environ.get(BARRIER_ENV)
    if not spec or os.environ.get(BARRIER_AT_ENV, "claim") != name:
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
