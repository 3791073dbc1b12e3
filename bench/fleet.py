"""The bench fleet grown to N times its producer x broker pairs, at the same event rate.

bench/stream.py simulates one instance of bench/stream_backlog.toml per cluster. A fleet factor F
multiplies a cluster's pairs (each producer sends to every broker of its cluster) by F: brokers by
b and producers by p, b * p = F, b the largest divisor of F not above its square root (10: 2 x 5,
100: 10 x 10). The events stay as many per simulated second, so a bigger fleet is the same load
spread thinner, as in a large real fleet where most pairs see few sends: each producer sends p
times less often, and each consumer group, which has b times the queues, reports their progress b
times less often. A new broker copies one of the scenario's (queues, latency), named after it;
faults stay on the scenario's own brokers.
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.simulate.scenario import Scenario, cluster_of


def fleet_shape(factor: int) -> tuple[int, int]:
    """(broker multiplier, producer multiplier) for a fleet ``factor`` times the pairs."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"fleet factor must be an integer >= 1, got {factor!r}")
    brokers = max(d for d in range(1, math.isqrt(factor) + 1) if factor % d == 0)
    return brokers, factor // brokers


def scale_fleet(base: Scenario, factor: int) -> Scenario:
    """``base`` with ``factor`` times its producer x broker pairs and the same events per second."""
    if factor == 1:
        return base
    b, p = fleet_shape(factor)
    taken = {x.name for x in base.brokers}
    copies = []
    for k in range(1, b):
        for broker in base.brokers:
            name = f"{broker.name}-x{k}"
            if name in taken:
                raise ValueError(f"scenario {base.name!r} already has a broker named {name!r}")
            copies.append(dataclasses.replace(broker, name=name))
    return base.replace(
        brokers=(*base.brokers, *copies),
        producers=tuple(dataclasses.replace(s, count=s.count * p, rate_per_s=s.rate_per_s / p)
                        for s in base.producers),
        consumers=tuple(dataclasses.replace(c, progress_interval_s=c.progress_interval_s * b)
                        for c in base.consumers),
    )


def producer_count(s: Scenario) -> int:
    return sum(p.count for p in s.producers)


def pairs(s: Scenario) -> int:
    """Producer x broker pairs: every producer with every broker of its own cluster."""
    per_cluster = {c: sum(1 for b in s.brokers if b.cluster == c) for c in s.clusters()}
    return sum(p.count * per_cluster[cluster_of(p.cluster, s)] for p in s.producers)


def send_rate(s: Scenario) -> float:
    """Messages the producers start per second (retries come on top)."""
    return sum(p.count * p.rate_per_s for p in s.producers)


def progress_rate(s: Scenario) -> float:
    """Consumer-progress rows per second: one per queue of a group's topic and report."""
    queues = {c: sum(b.queues for b in s.brokers if b.cluster == c) for c in s.clusters()}
    return sum(queues[cluster_of(c.cluster, s)] / c.progress_interval_s for c in s.consumers)


def parse_factors(text: str) -> list[int]:
    """``"1,10,100"`` as [1, 10, 100]; a clear error for anything else."""
    try:
        factors = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--fleet takes fleet factors such as 1,10,100, got {text!r}") from None
    for f in factors:
        fleet_shape(f)
    if len(factors) < 2 or len(set(factors)) != len(factors):
        raise ValueError(f"--fleet takes two or more different factors such as 1,10,100, got {text!r}")
    return factors


def alternated(factors: list[int], rounds: int) -> list[int]:
    """The run order: the factors, then reversed, and so on (1,10,100,100,10,1 for two rounds),
    so a drift in the machine's speed over the runs favours no size."""
    order: list[int] = []
    for r in range(rounds):
        order += factors if r % 2 == 0 else factors[::-1]
    return order
