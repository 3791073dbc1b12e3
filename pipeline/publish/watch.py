"""Early cycles: between the regular ones, a new fault episode starts a whole cycle at once.

The regular cadence (``publish.interval_s``, 60 s by default) would leave producers up to a whole
interval without the list that avoids a broker that just died. Every ``publish.watch_interval_s``
:class:`EpisodeWatch` looks at ``broker_fault_episodes_live`` (a table version check; the rows are
read only when the table moved) for an episode, suspected or open, it has not seen; finding one,
the loop runs the same validated cycle (gate, claim, Kafka, files, history) with the current time
as its identity. Identities are times, so a regular cycle after it supersedes nothing it should not.
Each episode starts at most one early cycle; those there when a regular cycle starts are its own (and
those open when ``--watch`` starts, the DAG's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from pipeline import objstore
from pipeline.config import Config
from pipeline.deltaio import latest_revision, read_table, table_uri

log = logging.getLogger(__name__)

EPISODES = "broker_fault_episodes_live"
LIVE_STATES = ("open", "suspected")


class EpisodeWatch:
    """Which episodes (suspected or open) are new since the last look."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.uri = table_uri(root, EPISODES)
        self._table: Any = None  # a deltalake DeltaTable once the table exists
        self._version: int | None = None
        self._seen: set[str] | None = None  # None until the first look

    def _moved(self) -> bool:
        """True when the table has a version this watch has not read (cheap: the log only)."""
        from deltalake import DeltaTable

        opts = objstore.storage_options(self.uri)
        if self._table is None:
            if not DeltaTable.is_deltatable(self.uri, storage_options=opts):
                return False
            self._table = DeltaTable(self.uri, storage_options=opts)
        else:
            try:
                self._table.update_incremental()
            except Exception:
                self._table = None  # deleted or replaced underneath: the next look opens it afresh
                raise
        version = int(self._table.version())
        moved = version != self._version
        self._version = version
        return moved

    def _live(self) -> list[str]:
        rows = read_table(self.root, EPISODES, columns=["episode_id", "state", "revision"])
        current = latest_revision(rows, "episode_id")
        live = current.filter(pc.is_in(current.column("state"), value_set=pc.cast(LIVE_STATES, "string")))
        return [str(e) for e in live.column("episode_id").to_pylist()]

    def new_episodes(self) -> list[str]:
        """Episode ids suspected or open now that no earlier look saw (none on the first look; a first
        look that cannot read the table sees nothing, so what a later one finds is new). A look that
        fails is retried on the same version by the next one."""
        before = self._version
        try:
            if not self._moved() and self._seen is not None:
                return []
            live = self._live() if self._version is not None else []
        except Exception:
            self._version = before
            if self._seen is None:
                self._seen = set()
            raise
        first = self._seen is None
        fresh = [] if first else sorted(set(live) - (self._seen or set()))
        self._seen = (self._seen or set()) | set(live)
        return fresh


def cycle_loop(cfg: Config, run: Callable[[int | None], Any], *, regular: bool = True, early: bool = True,
               cycles: int | None = None, stop: threading.Event | None = None,
               clock: Callable[[], float] = time.time) -> int:
    """Run cycles until ``stop`` is set or ``cycles`` have run; returns how many ran.

    ``run(None)`` is a regular cycle (its identity is the time aligned to ``publish.interval_s``),
    ``run(now_ms)`` an early one. Regular cycles (when ``regular``) run at start and on each
    interval boundary; early ones (when ``early`` and ``publish.watch_interval_s`` > 0) whenever
    the watch finds a new episode. An exception in a cycle is logged and the loop goes on.
    """
    stop = stop or threading.Event()
    interval, look = cfg.publish.interval_s, cfg.publish.watch_interval_s
    watch = EpisodeWatch(cfg.storage.root) if early and look > 0 else None
    if watch is None and not regular:
        raise ValueError("no cycles to run: early cycles need publish.watch_interval_s > 0")
    done = 0
    failing: list[str] = []  # why the last look failed, logged once until a look succeeds

    def one(number: int | None, why: str | None = None) -> None:
        nonlocal done
        if why is not None:
            log.info("early cycle: %s", why)
        try:
            run(number)
        except Exception:  # one bad cycle must not stop the loop; the next one retries
            log.exception("publisher cycle failed")
        done += 1

    def looked(early_cycle: bool = True) -> None:
        """One look; new episodes start an early cycle (or, before a regular one, are left to it)."""
        if watch is None:
            return
        try:
            fresh = watch.new_episodes()
        except Exception as exc:  # noqa: BLE001 - the regular cycles go on; the next look retries
            why = f"{type(exc).__name__}: {exc}"
            if failing != [why]:
                log.warning("early cycles: cannot read %s (looking again every %gs): %s", EPISODES, look, why)
                failing[:] = [why]
            return
        if failing:
            log.info("early cycles: %s can be read again", EPISODES)
            failing.clear()
        if fresh and early_cycle:
            one(int(clock() * 1000), f"new episode(s) {', '.join(fresh)}")

    def regular_cycle() -> None:
        looked(early_cycle=False)  # what is there now, this cycle reads
        one(None)
        looked()  # an episode committed while it ran may have missed its inputs

    if regular:
        regular_cycle()
    else:
        looked()  # the episodes open at the start are the DAG's
    if watch is not None:
        log.info("early cycles: a new episode in %s starts a cycle (looking every %gs)", watch.uri, look)
    while cycles is None or done < cycles:
        now = clock()
        due = now + interval - (now % interval) if regular else float("inf")
        step = min(look, due - now) if watch is not None else due - now
        if stop.wait(max(0.0, step)):
            break
        if regular and clock() >= due:
            regular_cycle()
        else:
            looked()
    return done
