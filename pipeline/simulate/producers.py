"""Simulated producer instances: one sync sending thread each, routed by ``pipeline.rocketmq``.

Queue choice, the retry loop, the (isolation, reachable) of each failure and the fault table update
all come from :mod:`pipeline.rocketmq` (``ProducerSelector`` and ``send_attempts``, the
tuple-returning core of ``send_with_retries``): the simulator only supplies the broker's answer to
each attempt (:class:`~pipeline.simulate.brokers.ProducerLink`). A producer sends its next message
when the previous one finished and its Poisson arrival time has come, so a producer stuck in
timeouts sends less, as a real sync producer does.

Events are built as positional rows in :class:`schemas.events.SendResult` field order, plus one
internal trailing cell (the queue the message was stored in, or None) that the engine pops when it
assigns queue offsets. Building rows instead of dataclasses keeps the hot loop lean; sinks turn rows
into the event objects.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from typing import Any

from pipeline.rocketmq.fault import get_generation
from pipeline.rocketmq.generation import GEN_5, generation_for_client_version
from pipeline.rocketmq.outcomes import SUCCESS_STATUSES
from pipeline.rocketmq.selection import ProducerSelector, TopicRoute
from pipeline.rocketmq.send import send_attempts
from pipeline.simulate.brokers import BrokerModel, ProducerLink
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
    """``ProducerSelector`` that records the client's avoid-until times in ``trace`` as they change.

    Only fault-tolerant producers use it (without fault tolerance the client keeps no fault state).
    Tracing goes through ``on_change`` rather than overriding ``select``/``record``, so the send
    loop keeps its direct path; assigning ``trace`` (as a subclass that swaps selectors does)
    re-points the hook.
    """

    @property
    def trace(self) -> FaultTrace:
        return self._trace

    @trace.setter
    def trace(self, trace: FaultTrace) -> None:
        self._trace = trace
        self.on_change = trace.note


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
        # The same logs as broker -> list by queue id (ids run 0..n-1): a stored row finds its log
        # with two subscripts instead of building and hashing a (broker, queue id) key.
        self._broker_logs = {
            broker: [queue_logs[(broker, qid)] for qid in range(n)]
            for broker, n in route.write_queue_nums.items()
        }
        self.generation = get_generation(generation_for_client_version(spec.client_version))
        self.rng = random.Random(stable_seed(seed, client_id, "traffic"))
        selector_class = TracedSelector if spec.fault_tolerance else ProducerSelector
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
        self._link = ProducerLink(model, self.rng, spec.send_timeout_ms)
        self._gap_mean_ms = 1000.0 / spec.rate_per_s
        self.start_ms = epoch_ms + round(spec.start_s * 1000)
        self.stop_ms = None if spec.stop_s is None else epoch_ms + round(spec.stop_s * 1000)
        self.next_ms = self.start_ms + self.rng.expovariate(1.0) * self._gap_mean_ms
        self.seq = 0
        self.messages = 0
        fe = spec.fault_tolerance if spec.report_fault_enable else None
        self._head = (cluster, spec.group, client_id, spec.client_version, route.topic)
        self._fe = fe

    def run_until(self, end_ms: int, out: defaultdict[int, list[list[Any]]]) -> None:
        """Send every message whose start time is before ``end_ms``; add each attempt's row to ``out[ts]``.

        A message started before ``end_ms`` is sent to completion, so some rows may lie later; the
        engine holds them back until their time.
        """
        t = self.next_ms
        if t >= end_ms:
            return
        stop = self.stop_ms
        spec = self.spec
        selector, route, link = self.selector, self.route, self._link
        # A bound method: the interpreter runs it in the caller's eval loop, where calling the link
        # itself (a __call__ instance) would go through the C call slot, once per attempt.
        attempt = link.attempt
        retries, timeout = spec.retries, spec.send_timeout_ms
        cluster, group, cid, version, topic = self._head
        id_prefix = cid + "-"
        report_args, fe, logs = spec.report_fault_args, self._fe, self._broker_logs
        report_reachable = report_args and self.generation.name == GEN_5  # 4.9 has no reachable flag
        rnd, gap = self.rng.random, self._gap_mean_ms
        seq = self.seq
        messages = 0
        end_f = float(end_ms)  # float < float is cheaper than float < a (multi-digit) int timestamp
        while t < end_f:
            now = int(t)
            if stop is not None and now >= stop:
                t = float("inf")
                break
            link.start(now)
            _, attempts, end, _ = send_attempts(selector, route, attempt, now, retries, timeout_ms=timeout)
            stored = link.stored
            if attempts and link.clock != end:
                raise AssertionError(
                    f"{cid}: send_attempts ended at {end} but the broker model's clock is at "
                    f"{link.clock}; the attempt timing convention of pipeline.rocketmq.send changed"
                )
            for i, (mq, _, ts, latency, ok, error, isolation, reachable, _) in enumerate(attempts):
                seq += 1
                broker, qid = mq.broker, mq.queue_id
                if not ok:
                    status = "FAILED"
                elif error is None:
                    status = "SEND_OK"
                else:
                    status, error = (error if error in SUCCESS_STATUSES else "SEND_OK"), None
                out[ts].append([
                    id_prefix + str(seq).zfill(10),  # f"{cid}-{seq:010d}", faster
                    ts, cluster, group, cid, version, topic, broker, qid,
                    status, latency, error, None, i,
                    isolation if report_args else None,
                    reachable if report_reachable else None,
                    fe,
                    logs[broker][qid] if stored[i] else None,
                ])
            messages += 1
            # Poisson arrivals (expovariate inlined: this loop runs once per message), not before the
            # previous message ended; a comparison, as builtin max() parses its arguments on every call.
            t -= _log(1.0 - rnd()) * gap
            if t < end:
                t = float(end)
        self.messages += messages
        self.seq = seq
        self.next_ms = t
