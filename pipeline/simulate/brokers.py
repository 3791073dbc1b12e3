"""What one send attempt to a broker returns at a given time: latency, outcome and error text.

The latency of a healthy broker is log-normal (median and p99 from the scenario). A fault schedule
overrides it: an outage refuses connections or swallows requests until the client's timeout, flow
control rejects a share of sends with the broker's ``[TIMEOUT_CLEAN_QUEUE]`` (or
``[PCBUSY_CLEAN_QUEUE]``) response, a slow disk answers ``FLUSH_DISK_TIMEOUT``, a latency spike slows
responses (past the send timeout they become client timeouts). Error texts are what the Java client
reports, so ``pipeline.rocketmq.outcomes`` classifies them as it would real ones.

Draws come from the caller's ``random.Random``, so every producer owns its stream and a run is
reproducible whatever order producers are stepped in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pipeline.rocketmq.queues import MessageQueue
from pipeline.simulate.scenario import FaultSpec, Scenario

_exp = math.exp
_log = math.log
_sqrt = math.sqrt
_cos = math.cos
_sin = math.sin
_TWOPI = 2.0 * math.pi

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile

# (latency_ms, ok, error, stored): ``error`` names a non-OK SendStatus for a stored message.
Outcome = tuple[int, bool, "str | None", bool]


@dataclass(frozen=True)
class ActiveFault:
    """A fault spec resolved to absolute times and defaults."""

    kind: str
    start_ms: int
    end_ms: int
    mode: str
    share: float
    median_ms: float
    sigma: float
    response: str


def _sigma(median: float, p99: float) -> float:
    return math.log(p99 / median) / _Z99 if p99 > median > 0 else 0.0


def resolve_fault(f: FaultSpec, epoch_ms: int, end_ms: int) -> ActiveFault:
    """Absolute times and the defaults of each kind's parameters."""
    start = epoch_ms + round(f.start_s * 1000)
    stop = end_ms + 3_600_000 if f.duration_s is None else start + round(f.duration_s * 1000)
    if f.kind == "latency_spike":
        median = float(f.latency_ms or 0.0)
        p99 = f.latency_p99_ms if f.latency_p99_ms is not None else median * 2
        return ActiveFault(f.kind, start, stop, "", f.share or 1.0, median, _sigma(median, p99), "")
    if f.kind == "flow_control":
        response = f.response or "TIMEOUT_CLEAN_QUEUE"
        # TIMEOUT_CLEAN_QUEUE drops requests that waited > 200 ms in the send queue.
        default = 200.0 if response == "TIMEOUT_CLEAN_QUEUE" else 0.0
        median = default if f.latency_ms is None else f.latency_ms
        return ActiveFault(f.kind, start, stop, "", f.share or 0.5, median, 0.0, response)
    if f.kind == "slow_disk":
        median = 1000.0 if f.latency_ms is None else f.latency_ms
        return ActiveFault(f.kind, start, stop, "", f.share or 1.0, median, 0.1, "")
    return ActiveFault(f.kind, start, stop, f.mode or "refused", 1.0, 0.0, 0.0, "")


class BrokerModel:
    """All brokers of a scenario; :meth:`attempt` is the broker side of one send attempt."""

    def __init__(self, scenario: Scenario, epoch_ms: int) -> None:
        end_ms = epoch_ms + round(scenario.duration_s * 1000)
        self.names = [b.name for b in scenario.brokers]
        self.addresses = {b.name: f"10.0.{i // 250}.{i % 250 + 10}:10911" for i, b in enumerate(scenario.brokers)}
        self._base = {b.name: (b.latency_median_ms, _sigma(b.latency_median_ms, b.latency_p99_ms)) for b in scenario.brokers}
        self._faults: dict[str, list[ActiveFault]] = {name: [] for name in self.names}
        for f in scenario.faults:
            self._faults[f.broker].append(resolve_fault(f, epoch_ms, end_ms))
        # Brokers without any scheduled fault: always on the healthy path (ProducerLink).
        self._fault_free = frozenset(name for name, faults in self._faults.items() if not faults)
        # Per broker: (valid_from, valid_to, active faults) — the fault set is constant in between.
        self._cache: dict[str, tuple[int, int, tuple[ActiveFault, ...]]] = {}

    def active(self, broker: str, t_ms: int) -> tuple[ActiveFault, ...]:
        cached = self._cache.get(broker)
        if cached is not None and cached[0] <= t_ms < cached[1]:
            return cached[2]
        lo, hi = -(2**62), 2**62
        active = []
        for f in self._faults[broker]:
            if f.start_ms <= t_ms < f.end_ms:
                active.append(f)
                lo, hi = max(lo, f.start_ms), min(hi, f.end_ms)
            elif t_ms < f.start_ms:
                hi = min(hi, f.start_ms)
            else:
                lo = max(lo, f.end_ms)
        entry = (lo, hi, tuple(active))
        self._cache[broker] = entry
        return entry[2]

    def is_down(self, broker: str, t_ms: int) -> bool:
        """An outage is active: consumers cannot pull and the admin poller gets no answer."""
        return any(f.kind == "outage" for f in self.active(broker, t_ms))

    def attempt(self, broker: str, begin_ms: int, budget_ms: int, rng: random.Random) -> Outcome:
        """One attempt started at ``begin_ms`` with ``budget_ms`` of the send timeout left."""
        if budget_ms <= 0:
            return 0, False, "RemotingTooMuchRequestException: sendKernelImpl call timeout", False
        median, sigma = self._base[broker]
        latency = int(median * math.exp(sigma * rng.gauss(0.0, 1.0)))
        faults = self.active(broker, begin_ms)
        status: str | None = None
        if faults:
            for f in faults:
                if f.kind == "outage":
                    return self._outage(broker, f, latency, budget_ms)
            for f in faults:
                if f.kind == "flow_control" and rng.random() < f.share:
                    return self._busy(f, latency, budget_ms, rng)
            for f in faults:
                if f.kind == "latency_spike" and rng.random() < f.share:
                    latency = max(latency, int(f.median_ms * math.exp(f.sigma * rng.gauss(0.0, 1.0))))
                elif f.kind == "slow_disk" and rng.random() < f.share:
                    latency = max(latency, int(f.median_ms * math.exp(f.sigma * rng.gauss(0.0, 1.0))))
                    status = "FLUSH_DISK_TIMEOUT"
        if latency >= budget_ms:
            # The broker stores the message, but the reply comes after the client gave up.
            return budget_ms, False, self._timeout_text(broker, budget_ms), True
        return latency, True, status, True

    def _outage(self, broker: str, f: ActiveFault, latency: int, budget_ms: int) -> Outcome:
        if f.mode == "timeout":
            return budget_ms, False, self._timeout_text(broker, budget_ms), False
        # Connection refused comes back at once.
        return min(latency, budget_ms), False, f"RemotingConnectException: connect to {self.addresses[broker]} failed", False

    def _busy(self, f: ActiveFault, latency: int, budget_ms: int, rng: random.Random) -> Outcome:
        waited = int(f.median_ms + rng.random() * 20) if f.response == "TIMEOUT_CLEAN_QUEUE" else rng.randrange(1, 50)
        size = rng.randrange(200, 5000)
        error = (
            f"MQBrokerException: CODE: 2  DESC: [{f.response}]broker busy, start flow control for a while, "
            f"period in queue: {waited}ms, size of queue: {size}"
        )
        return min(latency + int(f.median_ms), budget_ms), False, error, False

    def _timeout_text(self, broker: str, budget_ms: int) -> str:
        return f"RemotingTimeoutException: wait response on the channel <{self.addresses[broker]}> timeout, {budget_ms}(ms)"


class ProducerLink:
    """One producer's side of the brokers: answers each attempt of a message and keeps its clock.

    :meth:`attempt` is the ``attempt(queue)`` callback of ``pipeline.rocketmq``'s send loop, which
    starts each attempt when the previous one ended (``end = begin + max(latency, 0)``); the same
    arithmetic here gives the model each attempt's start time and remaining send timeout.
    ``stored`` says, per attempt of the current message, whether the broker stored it. The common
    case, a broker without an active fault, is :meth:`BrokerModel.attempt` inlined (same draws,
    same answer): it runs once per event the simulator emits.
    """

    __slots__ = (
        "_base", "_cache", "_fault_free", "_model", "_random", "_rng",
        "clock", "first", "stored", "timeout_ms",
    )

    def __init__(self, model: BrokerModel, rng: random.Random, timeout_ms: int) -> None:
        self._model = model
        self._base = model._base
        self._cache = model._cache
        self._fault_free = model._fault_free
        self._rng = rng
        self._random = rng.random
        self.timeout_ms = timeout_ms
        self.clock = 0
        self.first = 0
        self.stored: list[bool] = []

    def start(self, now_ms: int) -> None:
        """A new message: its first attempt begins at ``now_ms``."""
        self.clock = self.first = now_ms
        self.stored = []

    def attempt(self, mq: MessageQueue) -> tuple[int, bool, str | None]:
        begin = self.clock
        budget = self.timeout_ms - (begin - self.first)
        broker = mq.broker
        # A broker without any scheduled fault is always healthy: no lookup in the time-bound cache.
        healthy = broker in self._fault_free
        if not healthy:
            cached = self._cache.get(broker)
            healthy = cached is not None and not cached[2] and cached[0] <= begin < cached[1]
        error: str | None
        if budget > 0 and healthy:
            median, sigma = self._base[broker]
            # rng.gauss(0.0, 1.0), inlined with the same draws and the same cached second value
            # (``gauss_next``, shared with the model's own calls): this runs once per event.
            rng = self._rng
            z = rng.gauss_next  # type: ignore[attr-defined]  # CPython's Random has it; typeshed omits it
            if z is None:
                x2pi = self._random() * _TWOPI
                g2rad = _sqrt(-2.0 * _log(1.0 - self._random()))
                z = _cos(x2pi) * g2rad
                rng.gauss_next = _sin(x2pi) * g2rad  # type: ignore[attr-defined]
            else:
                rng.gauss_next = None  # type: ignore[attr-defined]
            latency = int(median * _exp(sigma * z))
            if latency < budget:
                self.clock = begin + latency
                self.stored.append(True)
                return latency, True, None
            latency, ok, error, stored = budget, False, self._model._timeout_text(broker, budget), True
        else:
            latency, ok, error, stored = self._model.attempt(broker, begin, budget, self._rng)
        self.clock = begin + latency  # the model never answers a negative latency
        self.stored.append(stored)
        return latency, ok, error
