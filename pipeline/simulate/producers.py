"""Simulated producer instances: one sync sending thread each, routed by ``pipeline.rocketmq``.

Queue choice, the retry loop, the (isolation, reachable) of each failure and the fault table update
all come from :mod:`pipeline.rocketmq.selection` (``ProducerSelector``, ``send_with_retries``): the
simulator only supplies the broker's answer to each attempt. A producer sends its next message when
the previous one finished and its Poisson arrival time has come, so a producer stuck in timeouts
sends less, as a real sync producer does.

Events are built as positional rows in :class:`schemas.events.SendResult` field order, plus one
internal trailing cell (the queue the message was stored in, or None) that the engine pops when it
assigns queue offsets. Building rows instead of dataclasses keeps the hot loop lean; sinks turn rows
into the event objects.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

from pipeline.rocketmq.fault import get_generation
from pipeline.rocketmq.generation import GEN_5, generation_for_client_version
from pipeline.rocketmq.outcomes import SUCCESS_STATUSES
from pipeline.rocketmq.queues import MessageQueue
from pipeline.rocketmq.selection import ProducerSelector, TopicRoute, send_with_retries
from pipeline.simulate.brokers import BrokerModel
from pipeline.simulate.client_state import FaultTrace
from pipeline.simulate.scenario import ProducerSpec

_log = math.log

# Index of queue_offset in a SendResult row.
OFFSET = 12
SEND_FIELDS = 17


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from names: independent of PYTHONHASHSEED and of the order entities are made."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class TracedSelector(ProducerSelector):
    """``ProducerSelector`` that records the client's avoid-until times as it updates them.

    Only fault-tolerant producers use it (without fault tolerance the client keeps no fault state).
    """

    trace: FaultTrace

    def record(
        self, broker: str, latency_ms: int, status: str, error: str | None, now_ms: int
    ) -> tuple[bool, bool, int | None]:
        result = super().record(broker, latency_ms, status, error, now_ms)
        self.trace.note(broker, now_ms, self.state.items[broker].start_timestamp)
        return result


class TracedSelector49(TracedSelector):
    """4.9 also changes its fault state while selecting: ``pickOneAtLeast`` may drop an item."""

    def select(
        self, route: TopicRoute, now_ms: int, last_broker: str | None = None, *, thread: int = 0, retry: bool = False
    ) -> MessageQueue | None:
        before = self.state
        mq = super().select(route, now_ms, last_broker, thread=thread, retry=retry)
        if self.state is not before:  # a dropped item: that broker is available again
            for broker in set(before.items) - set(self.state.items):
                self.trace.note(broker, now_ms, now_ms)
        return mq


class _Attempter:
    """The broker's side of ``send_with_retries``: answers each attempt and keeps the attempt clock.

    ``send_with_retries`` starts each attempt when the previous one ended (``end = begin +
    max(latency, 0)``); the same arithmetic here gives the model each attempt's start time.
    """

    __slots__ = ("answer", "clock", "first", "rng", "stored", "timeout_ms")

    def __init__(self, model: BrokerModel, rng: random.Random, timeout_ms: int) -> None:
        self.answer = model.attempt
        self.rng = rng
        self.timeout_ms = timeout_ms
        self.clock = 0
        self.first = 0
        self.stored: list[bool] = []

    def start(self, now_ms: int) -> None:
        self.clock = self.first = now_ms
        self.stored = []

    def __call__(self, mq: MessageQueue) -> tuple[int, bool, str | None]:
        begin = self.clock
        latency, ok, error, stored = self.answer(mq.broker, begin, self.timeout_ms - (begin - self.first), self.rng)
        self.clock = begin + latency  # the model never answers a negative latency
        self.stored.append(stored)
        return latency, ok, error


class SimProducer:
    """One producer instance and its client-side state."""

    def __init__(
        self,
        spec: ProducerSpec,
        client_id: str,
        cluster: str,
        route: TopicRoute,
        queue_logs: dict[tuple[str, int], Any],
        model: BrokerModel,
        seed: int,
        epoch_ms: int,
    ) -> None:
        self.spec = spec
        self.client_id = client_id
        self.cluster = cluster
        self.route = route
        self.queue_logs = queue_logs
        self.generation = get_generation(generation_for_client_version(spec.client_version))
        self.rng = random.Random(stable_seed(seed, client_id, "traffic"))
        if not spec.fault_tolerance:
            selector_class: type[ProducerSelector] = ProducerSelector
        else:
            selector_class = TracedSelector if self.generation.name == GEN_5 else TracedSelector49
        self.selector = selector_class(
            self.generation,
            fault_enabled=spec.fault_tolerance,
            detector_enabled=spec.detector_enabled,
            retry_another_broker_when_not_store_ok=spec.retry_another_broker_when_not_store_ok,
            seed=stable_seed(seed, client_id, "select"),
        )
        self.trace = FaultTrace()  # stays empty without fault tolerance
        if isinstance(self.selector, TracedSelector):
            self.selector.trace = self.trace
        self._attempter = _Attempter(model, self.rng, spec.send_timeout_ms)
        self._gap_mean_ms = 1000.0 / spec.rate_per_s
        self.start_ms = epoch_ms + round(spec.start_s * 1000)
        self.stop_ms = None if spec.stop_s is None else epoch_ms + round(spec.stop_s * 1000)
        self.next_ms = self.start_ms + self.rng.expovariate(1.0) * self._gap_mean_ms
        self.seq = 0
        self.messages = 0
        fe = spec.fault_tolerance if spec.report_fault_enable else None
        self._head = (cluster, spec.group, client_id, spec.client_version, route.topic)
        self._fe = fe

    def run_until(self, end_ms: int, out: list[list[Any]]) -> None:
        """Send every message whose start time is before ``end_ms``; append one row per attempt.

        A message started before ``end_ms`` is sent to completion, so some rows may lie later; the
        engine holds them back until their time.
        """
        t = self.next_ms
        if t >= end_ms:
            return
        stop = self.stop_ms
        spec = self.spec
        selector, route, attempter = self.selector, self.route, self._attempter
        retries, timeout = spec.retries, spec.send_timeout_ms
        cluster, group, cid, version, topic = self._head
        report_args, fe, logs = spec.report_fault_args, self._fe, self.queue_logs
        report_reachable = report_args and self.generation.name == GEN_5  # 4.9 has no reachable flag
        rnd, gap = self.rng.random, self._gap_mean_ms
        seq = self.seq
        while t < end_ms:
            now = int(t)
            if stop is not None and now >= stop:
                t = float("inf")
                break
            attempter.start(now)
            outcome = send_with_retries(selector, route, attempter, now, retries, timeout_ms=timeout)
            stored = attempter.stored
            if outcome.attempts and attempter.clock != outcome.end_ms:
                raise AssertionError(
                    f"{cid}: send_with_retries ended at {outcome.end_ms} but the broker model's clock is at "
                    f"{attempter.clock}; the attempt timing convention of pipeline.rocketmq.selection changed"
                )
            for i, a in enumerate(outcome.attempts):
                seq += 1
                mq = a.queue
                if a.ok:
                    status, error = (a.error if a.error in SUCCESS_STATUSES else "SEND_OK"), None
                else:
                    status, error = "FAILED", a.error
                out.append([
                    f"{cid}-{seq:010d}", a.end_ms, cluster, group, cid, version, topic, mq.broker, mq.queue_id,
                    status, a.latency_ms, error, None, i,
                    a.isolation if report_args else None,
                    a.reachable if report_reachable else None,
                    fe,
                    logs[(mq.broker, mq.queue_id)] if stored[i] else None,
                ])
            self.messages += 1
            # Poisson arrivals (expovariate inlined: this loop runs once per message).
            t = max(float(outcome.end_ms), t - _log(1.0 - rnd()) * gap)
        self.seq = seq
        self.next_ms = t
