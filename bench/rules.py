"""Benchmark of the RocketMQ rules: window derivation and allocation.

Run: ``.venv/bin/python bench/rules.py [--events N] [--repeat R]``. Prints, per fault generation,
numpy window derivation over N send results (events/s, best of R) next to the plain per-event
Python derivation on the same events (the baseline) and their ratio; then the time to allocate
1,000 queues over 100 consumers (the whole group's ownership, as every member computes it) per
strategy. The goal is >= 1,000,000 events/s vectorised, so the rules never limit the pipeline.
Nothing here asserts timings; the tests check correctness.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.rocketmq import (
    GENERATIONS,
    FaultEvent,
    MessageQueue,
    derive_windows,
    derive_windows_arrays,
    rebalance,
    windows_from_arrays,
)

BROKERS = [f"broker-{i}" for i in range(8)]


def synthetic_sends(n: int, seed: int = 42) -> tuple[np.ndarray, ...]:
    """One producer's send results: ~1 ms apart, mostly fast, with slow spells and isolations."""
    rng = np.random.default_rng(seed)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(0, 3, n, dtype=np.int64))
    codes = rng.integers(0, len(BROKERS), n).astype(np.int32)
    latency = rng.lognormal(2.5, 0.8, n).astype(np.int64)
    slow = rng.random(n) < 0.001
    latency[slow] = rng.integers(550, 20_000, int(slow.sum()))
    isolation = rng.random(n) < 0.0002
    return ts, codes, latency, isolation


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_windows(n: int, repeat: int) -> None:
    ts, codes, latency, isolation = synthetic_sends(n)
    events = [
        FaultEvent(t, BROKERS[c], lat, iso)
        for t, c, lat, iso in zip(
            ts.tolist(), codes.tolist(), latency.tolist(), isolation.tolist(), strict=True
        )
    ]
    print(f"window derivation over {n:,} send results ({len(BROKERS)} brokers, one producer)")
    print(f"{'generation':>10} {'numpy ev/s':>14} {'python ev/s':>14} {'ratio':>8} {'windows':>9}")
    for name, gen in GENERATIONS.items():
        t_np, arrays = best_of(
            repeat, partial(derive_windows_arrays, gen, ts, codes, latency, isolation)
        )
        t_py, windows = best_of(1, partial(derive_windows, gen, events))
        if windows_from_arrays(arrays, BROKERS) != windows:
            raise SystemExit(f"numpy and python derivations differ for generation {name}")
        print(f"{name:>10} {n / t_np:>14,.0f} {n / t_py:>14,.0f} {t_py / t_np:>7.1f}x {len(windows):>9,}")


def allocation_inputs(strategy: str) -> tuple[list[MessageQueue], list[str], dict[str, Any]]:
    rooms = ["hz", "sh", "bj"]
    brokers = [f"broker-{i}" for i in range(20)]
    cids = [f"10.0.{i // 250}.{i % 250}@{4000 + i}" for i in range(100)]
    options: dict[str, Any] = {}
    if strategy == "MACHINE_ROOM":
        brokers = [f"{rooms[i % 3]}@{b}" for i, b in enumerate(brokers)]
        options = {"consumer_idcs": rooms}
    queues = [MessageQueue("TopicBench", b, q) for b in brokers for q in range(50)]
    if strategy == "MACHINE_ROOM_NEARBY":
        options = {
            "inner_strategy": "AVG",
            "broker_rooms": {b: rooms[i % 3] for i, b in enumerate(brokers)},
            "consumer_rooms": {c: rooms[i % 2] for i, c in enumerate(cids)},
        }
    if strategy == "CONFIG":
        options = {"config_mq_list": queues[:10]}
    return queues, cids, options


def bench_allocation(repeat: int) -> None:
    print("\nallocation of 1,000 queues over 100 consumers (whole group, RebalanceImpl view)")
    print(f"{'strategy':>20} {'ms':>9}")
    for strategy in (
        "AVG",
        "AVG_BY_CIRCLE",
        "CONSISTENT_HASH",
        "CONFIG",
        "MACHINE_ROOM",
        "MACHINE_ROOM_NEARBY",
    ):
        queues, cids, options = allocation_inputs(strategy)
        seconds, rb = best_of(
            repeat, partial(rebalance, strategy, "CG", queues, cids, **options)
        )
        errors = {r.error for r in rb.ownership_by_cid.values() if r.error}
        if errors:
            raise SystemExit(f"{strategy} failed: {errors}")
        print(f"{strategy:>20} {seconds * 1000:>9.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    bench_windows(args.events, args.repeat)
    bench_allocation(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
