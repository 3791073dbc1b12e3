"""The simulation loop: a virtual clock advanced in ticks, faster than real time or paced to it.

Each tick ``[start, end)``: every producer sends the messages whose start time falls in the tick
(attempt rows may complete later and are held back until their tick), the rows due are put in time
order and get their queue offsets in that order, then every consumer group consumes, commits and
reports. Producers and groups own their random streams (seeded from the scenario seed and their
names), so the same seed gives the same event stream byte for byte, paced or not.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.rocketmq.queues import MessageQueue
from pipeline.rocketmq.selection import TopicRoute
from pipeline.simulate.brokers import BrokerModel
from pipeline.simulate.client_state import ClientWindow
from pipeline.simulate.consumers import GroupSim
from pipeline.simulate.producers import OFFSET, SimProducer
from pipeline.simulate.queues import QueueLog
from pipeline.simulate.scenario import Scenario, cluster_of

_TS0 = operator.itemgetter(0)

# While a simulation runs unpaced, the young generation of the cyclic garbage collector is collected
# every _BULK_GC_THRESHOLD allocations instead of Python's default 700. Every emitted row is a list
# the sink may keep, so the default collects (and later rescans) them ~1,400 times per million
# events, about a tenth of the run (bench/simulate.py); the loop makes no reference cycles.
# Into a sink that keeps its rows (``Sink.keeps_rows``: the memory sink), each tick's rows are also
# moved out of the collector's sight (``gc.freeze``) once written, and handed back (``gc.unfreeze``)
# when the last unpaced run ends: otherwise every collection of the older generations walks every
# kept row again. Measured with bench/simulate.py's workloads, 4 runs each, alternated: steady
# 287-296k against 230-274k events per CPU second, outage 283-291k against 263-270k. What freezing
# also holds back until the run ends (cyclic garbage made meanwhile by any thread) is collected
# after it. A process that froze objects itself (a pre-fork server) is left alone.
_BULK_GC_THRESHOLD = 100_000
_bulk_lock = threading.Lock()
_bulk_users = 0
_bulk_froze = False
_bulk_may_freeze = False
_saved_threshold: tuple[int, ...] = ()


@contextlib.contextmanager
def _bulk_allocation() -> Iterator[None]:
    """Raise the young-generation GC threshold while at least one unpaced run is inside (restored after)."""
    global _bulk_users, _bulk_froze, _bulk_may_freeze, _saved_threshold
    with _bulk_lock:
        if _bulk_users == 0:
            _bulk_may_freeze = gc.get_freeze_count() == 0
            _saved_threshold = gc.get_threshold()
            gc.set_threshold(max(_saved_threshold[0], _BULK_GC_THRESHOLD), *_saved_threshold[1:])
        _bulk_users += 1
    try:
        yield
    finally:
        with _bulk_lock:
            _bulk_users -= 1
            if _bulk_users == 0:
                gc.set_threshold(*_saved_threshold)
                if _bulk_froze:
                    gc.unfreeze()
                    _bulk_froze = False


def _freeze_kept_rows() -> None:
    """Inside ``_bulk_allocation``: stop the collector walking the rows kept so far (see above)."""
    global _bulk_froze
    with _bulk_lock:
        if _bulk_users and _bulk_may_freeze:
            gc.freeze()
            _bulk_froze = True


@dataclass
class Batch:
    """The rows of one tick, per event kind, each list in time order."""

    start_ms: int
    end_ms: int
    send_result: list[list[Any]] = field(default_factory=list)
    consumer_progress: list[list[Any]] = field(default_factory=list)
    group_membership: list[list[Any]] = field(default_factory=list)

    def items(self) -> Iterator[tuple[str, list[list[Any]]]]:
        yield "send_result", self.send_result
        yield "consumer_progress", self.consumer_progress
        yield "group_membership", self.group_membership

    def __len__(self) -> int:
        return len(self.send_result) + len(self.consumer_progress) + len(self.group_membership)


@dataclass
class RunStats:
    events: dict[str, int]
    virtual_ms: int
    wall_s: float
    stopped: bool = False

    @property
    def total(self) -> int:
        return sum(self.events.values())


class Simulation:
    """A scenario instantiated with a seed and a start time; drive it with :meth:`run` or :meth:`batches`."""

    def __init__(self, scenario: Scenario, seed: int | None = None, epoch_ms: int | None = None) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.epoch_ms = scenario.epoch_ms if epoch_ms is None else epoch_ms
        self.tick_ms = scenario.tick_ms
        self.now_ms = self.epoch_ms
        self.end_ms = self.epoch_ms + round(scenario.duration_s * 1000)
        self.model = BrokerModel(scenario, self.epoch_ms)
        self.queue_logs: dict[tuple[str, str], dict[tuple[str, int], QueueLog]] = {}
        consumed = {(cluster_of(c.cluster, scenario), c.topic) for c in scenario.consumers}
        self.producers: list[SimProducer] = []
        for block, spec in enumerate(scenario.producers):
            cluster = cluster_of(spec.cluster, scenario)
            logs = self._logs(cluster, spec.topic, (cluster, spec.topic) in consumed)
            route = TopicRoute.from_brokers(spec.topic, self._write_queues(cluster))
            for i in range(spec.count):
                cid = f"10.10.{block}.{i % 250 + 1}@{3000 + i}"
                self.producers.append(SimProducer(spec, cid, cluster, route, logs, self.model, self.seed, self.epoch_ms))
        self.groups: list[GroupSim] = []
        for gi, group in enumerate(scenario.consumers):
            cluster = cluster_of(group.cluster, scenario)
            logs = self._logs(cluster, group.topic, True)
            events = [e for e in scenario.consumer_events if e.group == group.group]
            self.groups.append(GroupSim(group, gi, cluster, list(logs.values()), self.model, events, self.epoch_ms))
        # Attempt rows not emitted yet, by time, each list in the order the producers made them. A
        # tick takes its due times in order: cheaper than sorting all rows by their (multi-digit)
        # int timestamps, and rows of equal time keep the producers' order as that stable sort did.
        self._pending: defaultdict[int, list[list[Any]]] = defaultdict(list)
        self._finished = False
        self._ticks = 0

    def _write_queues(self, cluster: str) -> dict[str, int]:
        return {b.name: b.queues for b in self.scenario.brokers if b.cluster == cluster}

    def _logs(self, cluster: str, topic: str, keep_times: bool) -> dict[tuple[str, int], QueueLog]:
        logs = self.queue_logs.get((cluster, topic))
        if logs is None:
            logs = {
                (broker, qid): QueueLog(MessageQueue(topic, broker, qid), cluster, keep_times)
                for broker, n in sorted(self._write_queues(cluster).items())
                for qid in range(n)
            }
            self.queue_logs[(cluster, topic)] = logs
        elif keep_times:
            for log in logs.values():
                if log.times is None:
                    log.times = []
        return logs

    # -- stepping -------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._finished

    def step(self) -> Batch:
        """Advance one tick (or drain what is in flight once the duration is reached)."""
        if self._finished:
            raise RuntimeError("the simulation has finished")
        if self.now_ms >= self.end_ms:
            return self.finish()
        start = self.now_ms
        end = min(start + self.tick_ms, self.end_ms)
        pending = self._pending
        for p in self.producers:
            p.run_until(end, pending)
        batch = Batch(start, end, _take(pending, sorted(ts for ts in pending if ts < end)))
        _assign_offsets(batch.send_result)
        for g in self.groups:
            g.step(start, end, batch.consumer_progress, batch.group_membership)
        batch.consumer_progress.sort(key=_TS0)
        batch.group_membership.sort(key=_TS0)
        self.now_ms = end
        self._ticks += 1
        if self._ticks % 600 == 0:
            self._trim()
        return batch

    def finish(self) -> Batch:
        """Emit the attempts still in flight (they complete after the end) and stop."""
        rows = _take(self._pending, sorted(self._pending))
        _assign_offsets(rows)
        self._finished = True
        return Batch(self.now_ms, max([self.now_ms] + [r[1] + 1 for r in rows[-1:]]), rows)

    def batches(self, until_ms: int | None = None) -> Iterator[Batch]:
        """Ticks until ``until_ms`` (default: the scenario's end, then the in-flight drain)."""
        stop = self.end_ms if until_ms is None else min(until_ms, self.end_ms)
        while not self._finished and self.now_ms < stop:
            yield self.step()
        if until_ms is None and not self._finished:
            yield self.finish()

    def run(
        self,
        sink: Any,
        *,
        duration_s: float | None = None,
        speed: float = 0.0,
        stop_event: threading.Event | None = None,
        flush_every_s: float = 1.0,
        close: bool = False,
        on_batch: Callable[[Batch], None] | None = None,
    ) -> RunStats:
        """Write events to ``sink`` (``write(kind, rows)``/``flush()``) until the end or ``stop_event``.

        ``speed`` 0 runs as fast as possible; ``speed`` X > 0 paces virtual time at X times wall
        time, writing each tick once its end has passed. At the end, in-flight attempts are written
        too (``finish``), so every message's retries are complete; after a stop some of them may
        lie up to one send timeout in the future. ``duration_s`` shortens the run. ``on_batch``
        sees each tick's batch after the sink did (e.g. a live view counting events). An unpaced run
        collects young garbage less often while it lasts, and hides the rows a keeping sink holds
        from the collector (see ``_bulk_allocation``).
        """
        until = self.end_ms if duration_s is None else min(self.end_ms, self.now_ms + round(duration_s * 1000))
        counts = {"send_result": 0, "consumer_progress": 0, "group_membership": 0}
        wall0, virt0 = time.monotonic(), self.now_ms
        last_flush = wall0
        stopped = False
        freeze = speed <= 0 and getattr(sink, "keeps_rows", False)
        with _bulk_allocation() if speed <= 0 else contextlib.nullcontext():
            while not self._finished:
                if stop_event is not None and stop_event.is_set():
                    stopped = True
                batch = self.finish() if (stopped or self.now_ms >= until) else self.step()
                if speed > 0 and not self._finished:
                    delay = wall0 + (batch.end_ms - virt0) / 1000.0 / speed - time.monotonic()
                    if delay > 0:
                        if stop_event is not None:
                            stopped = stop_event.wait(delay) or stopped
                        else:
                            time.sleep(delay)
                for kind, rows in batch.items():
                    if rows:
                        sink.write(kind, rows)
                        counts[kind] += len(rows)
                if freeze:
                    _freeze_kept_rows()
                if on_batch is not None:
                    on_batch(batch)
                now = time.monotonic()
                if speed > 0 and now - last_flush >= flush_every_s:
                    sink.flush()
                    last_flush = now
        sink.flush()
        if close:
            sink.close()
        return RunStats(counts, self.now_ms - virt0, time.monotonic() - wall0, stopped)

    def _trim(self) -> None:
        """Forget store times no group can ask for any more (keeps long runs in bounded memory)."""
        for (cluster, topic), logs in self.queue_logs.items():
            groups = [g for g in self.groups if g.cluster == cluster and g.spec.topic == topic]
            for log in logs.values():
                if groups and log.times is not None:
                    log.trim(min(g.min_needed_offset(log) for g in groups))

    # -- the simulated clients' own state -------------------------------------------------------

    def client_windows(self) -> list[ClientWindow]:
        """Every avoidance window the fault-tolerant producers used so far, by client then broker."""
        out = []
        for p in self.producers:
            if not p.selector.fault_enabled:
                continue
            for broker in p.trace.brokers():
                for start, end in p.trace.intervals(broker):
                    out.append(ClientWindow(p.cluster, p.spec.group, p.client_id, p.spec.client_version,
                                            p.generation.name, broker, start, end))
        return out

    def active_faults(self, at_ms: int | None = None) -> dict[str, list[str]]:
        """Broker -> kinds of the faults active at ``at_ms`` (default: the virtual now)."""
        t = self.now_ms if at_ms is None else at_ms
        out = {}
        for broker in self.model.names:
            kinds = [f.kind if f.kind != "outage" else f"outage ({f.mode})" for f in self.model.active(broker, t)]
            if kinds:
                out[broker] = kinds
        return out

    def producer(self, client_id: str) -> SimProducer:
        for p in self.producers:
            if p.client_id == client_id:
                return p
        raise KeyError(f"no producer {client_id!r}")

    def ownership(self) -> dict[str, list[tuple[int, dict[MessageQueue, str]]]]:
        """Per group, every rebalance: (time, queue -> owner client id)."""
        return {g.spec.group: list(g.ownership_log) for g in self.groups}


def _take(pending: dict[int, list[list[Any]]], times: list[int]) -> list[list[Any]]:
    """Remove the rows of ``times`` (sorted) from ``pending``, concatenated in that order."""
    rows: list[list[Any]] = []
    for ts in times:
        rows += pending.pop(ts)
    return rows


def _assign_offsets(rows: list[list[Any]]) -> None:
    """Give each stored message the next offset of its queue, in time order; drop the internal cell."""
    for row in rows:
        log = row.pop()
        if log is not None:
            offset = log.count
            log.count = offset + 1
            if row[9] != "FAILED":
                row[OFFSET] = offset
            times = log.times
            if times is not None:
                times.append(row[1])


def run_to_memory(
    scenario: Scenario | str, seed: int | None = None, epoch_ms: int | None = None, duration_s: float | None = None
) -> tuple[Simulation, Any]:
    """Run a whole scenario (by name, file or object) into a :class:`MemorySink`: the test double."""
    from pipeline.simulate.scenario import load_scenario
    from pipeline.simulate.sinks import MemorySink

    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    if duration_s is not None:
        scenario = scenario.replace(duration_s=duration_s)
    sim = Simulation(scenario, seed=seed, epoch_ms=epoch_ms)
    sink = MemorySink()
    sim.run(sink)
    return sim, sink
