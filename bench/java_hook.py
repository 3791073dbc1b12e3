"""Overhead of faultwatch's send hook on a real producer: sends/s and p99 with it against without.

Run: ``.venv/bin/python bench/java_hook.py [--sends N] [--rounds R] [--warmup W] [--warmup-max M]
[--client 4.9.8] [--kafka tansu|apache] [--jvm-arg ARG]``. Starts a name server and one broker
(``pipeline/rocketmq_cluster.py``) and a Kafka broker for the hook's events, then two real producers
of the same client version in separate JVMs, one with the hook and one without. Both send warm-up
rounds (connections, JIT) until their JIT compilers have settled, then R rounds of N synchronous
sends in pairs whose order alternates (hook first, then none first), so drift and whatever one
producer leaves running is charged to each side alike; the hook's queue is drained after each of its
rounds, outside the timing. Prints each pair, the medians, the ratio of throughputs and the p99
difference with their spread over the pairs (the noise to weigh them against), the producer JVM's CPU
time per send in all and by group of threads (a figure other processes' load moves little), the
Kafka broker's CPU, the hook's drops and the load average. Goals: >= 0.95 of the throughput, <= 100 us
more at p99, no drops while Kafka is up. Nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.java_clients import LabDriver
from pipeline.kafka_apache import start_apache_kafka
from pipeline.kafka_local import start_local_kafka
from pipeline.rocketmq_cluster import start_cluster

TOPIC = "rmq.send-results"


@contextlib.contextmanager
def kafka_broker(kind: str) -> Iterator[tuple[str, int]]:
    """A Kafka broker with the hook's topic; yields its bootstrap address and process id."""
    if kind == "tansu":
        with start_local_kafka(topics=[TOPIC], partitions=4) as tansu:
            yield tansu.bootstrap, tansu.proc.pid
    else:
        with start_apache_kafka(topics=[TOPIC], partitions=4) as apache:
            assert apache.proc is not None
            yield apache.bootstrap, apache.proc.pid


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


THREAD_GROUPS = (  # the start of a thread's name (Linux keeps 15 characters) -> its group
    ("java", "send thread"), ("faultwatch-send", "hook sink"), ("kafka-producer-", "hook Kafka client"),
    ("C1 CompilerThre", "JIT"), ("C2 CompilerThre", "JIT"), ("NettyClient", "RocketMQ Netty"),
)


def thread_cpu_ns(pid: int) -> Counter[str]:
    """CPU time each group of a process's threads has used so far (``schedstat``: nanoseconds)."""
    out: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().rstrip("\n")
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        group = next((g for prefix, g in THREAD_GROUPS if name == prefix or name.startswith(prefix)
                      and prefix != "java"), "other")
        out[group] += ns
    return out


def jvm_flags(templates: list[str], name: str) -> list[str]:
    """``--jvm-arg`` options for the producer ``name`` (a profiler's output file named after it)."""
    return [t.replace("{name}", name) for t in templates]


def timed_round(driver: LabDriver, sends: int, drain: bool, broker_pid: int) -> dict[str, Any]:
    """One round; with the producer JVM's CPU per send by thread group, the hook's draining included,
    and the Kafka broker's CPU meanwhile."""
    before = thread_cpu_ns(driver.proc.pid)
    broker_before = sum(thread_cpu_ns(broker_pid).values())
    out = driver.command(f"send {sends}", timeout_s=600)
    if drain:
        driver.command("flush", timeout_s=60)
    used = thread_cpu_ns(driver.proc.pid)
    used.subtract(before)
    out["threads_ns"] = used
    out["broker_ns"] = sum(thread_cpu_ns(broker_pid).values()) - broker_before
    out["cpu_us"] = sum(used.values()) / 1e3 / sends
    return out


def warm_up(drivers: dict[str, LabDriver], sends: int, least: int, most: int, broker_pid: int) -> int:
    """Rounds on both producers until the JIT settles (under 2 % of a round's CPU in each), ``least`` to ``most``."""
    for r in range(most):
        rounds = {name: timed_round(d, sends, name == "hook", broker_pid) for name, d in drivers.items()}
        jit = {n: o["threads_ns"]["JIT"] / max(1, sum(o["threads_ns"].values())) for n, o in rounds.items()}
        print(f"warm-up {r}: JIT share of the round's CPU " + ", ".join(f"{n} {j:.1%}" for n, j in jit.items()),
              flush=True)
        if r + 1 >= least and max(jit.values()) < 0.02:
            return r + 1
    return most


def run_pairs(drivers: dict[str, LabDriver], sends: int, rounds: int, broker_pid: int) -> list[dict[str, dict[str, Any]]]:
    """``rounds`` pairs of rounds, the order alternating; the hook's queue drained after its rounds."""
    pairs = []
    for r in range(rounds):
        order = ("hook", "none") if r % 2 == 0 else ("none", "hook")
        pair = {name: timed_round(drivers[name], sends, name == "hook", broker_pid) for name in order}
        print(f"pair {r} ({order[0]} first): " + "; ".join(
            f"{n} {pair[n]['per_s']:.0f}/s p50 {pair[n]['p50_us']} p99 {pair[n]['p99_us']} us"
            f" cpu {pair[n]['cpu_us']:.0f} us/send"
            f"{'' if pair[n]['failed'] == 0 else ' FAILED ' + str(pair[n]['failed'])}" for n in ("hook", "none")
        ) + f"; ratio {pair['hook']['per_s'] / pair['none']['per_s']:.3f}", flush=True)
        pairs.append(pair)
    return pairs


def by_thread(pairs: list[dict[str, dict[str, Any]]], sends: int) -> None:
    """CPU per send of each thread group over all measured rounds, hook against none."""
    total: dict[str, Counter[str]] = {k: sum((p[k]["threads_ns"] for p in pairs), Counter()) for k in ("hook", "none")}
    n = sends * len(pairs)
    groups = sorted(set(total["hook"]) | set(total["none"]), key=lambda g: -total["hook"][g])
    print("producer CPU per send by thread (all measured rounds): " + "; ".join(
        f"{g} {total['hook'][g] / 1e3 / n:.1f} / {total['none'][g] / 1e3 / n:.1f} us" for g in groups)
        + " (hook / none)")
    broker = [p[k]["broker_ns"] for p in pairs for k in ("hook", "none")]
    print(f"Kafka broker CPU per send (another process on the same cores): "
          f"{sum(p['hook']['broker_ns'] for p in pairs) / 1e3 / n:.1f} us in the hook's rounds, "
          f"{sum(p['none']['broker_ns'] for p in pairs) / 1e3 / n:.1f} us in the others' ({sum(broker) / 1e9:.1f} s in all)")


def summary(pairs: list[dict[str, dict[str, Any]]]) -> None:
    med = {k: {m: statistics.median(p[k][m] for p in pairs) for m in ("per_s", "p50_us", "p99_us", "cpu_us")}
           for k in ("hook", "none")}
    for k, m in med.items():
        print(f"  {k}: {m['per_s']:.0f} sends/s, p50 {m['p50_us']:.0f} us, p99 {m['p99_us']:.0f} us, "
              f"producer JVM CPU {m['cpu_us']:.0f} us/send (medians)")
    ratios = sorted(p["hook"]["per_s"] / p["none"]["per_s"] for p in pairs)
    p99 = sorted(p["hook"]["p99_us"] - p["none"]["p99_us"] for p in pairs)
    swing = {k: (min(p[k]["per_s"] for p in pairs), max(p[k]["per_s"] for p in pairs)) for k in med}
    print(f"throughput ratio hook/none: {med['hook']['per_s'] / med['none']['per_s']:.3f} of the medians, "
          f"{statistics.median(ratios):.3f} median of the pairs (range {ratios[0]:.3f}-{ratios[-1]:.3f}; goal >= 0.95)")
    print(f"p99 difference: {med['hook']['p99_us'] - med['none']['p99_us']:+.0f} us of the medians, "
          f"{statistics.median(p99):+.0f} us median of the pairs (range {p99[0]:+d} to {p99[-1]:+d}; goal <= +100 us)")
    cpu = sorted(p["hook"]["cpu_us"] - p["none"]["cpu_us"] for p in pairs)
    print(f"producer CPU per send, hook - none: {statistics.median(cpu):+.0f} us median of the pairs "
          f"(range {cpu[0]:+.0f} to {cpu[-1]:+.0f}; CPU time is little moved by other processes' load)")
    print("round-to-round swing (sends/s): " + ", ".join(f"{k} {lo:.0f}-{hi:.0f}" for k, (lo, hi) in swing.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sends", type=int, default=5000, help="synchronous sends per round")
    ap.add_argument("--rounds", type=int, default=16, help="measured pairs of rounds")
    ap.add_argument("--warmup", type=int, default=3, help="least warm-up rounds per producer (not measured)")
    ap.add_argument("--warmup-max", type=int, default=40, help="most warm-up rounds, if the JIT has not settled")
    ap.add_argument("--client", default="4.9.8")
    ap.add_argument("--kafka", choices=("tansu", "apache"), default="tansu", help="the broker the hook writes to")
    ap.add_argument("--jvm-arg", action="append", default=[], metavar="ARG",
                    help="an option for both producer JVMs, {name} replaced by hook or none (repeatable), e.g. "
                         "-XX:StartFlightRecording=settings=profile,filename=/tmp/{name}.jfr")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="faultwatch-bench-hook-"))
    print(f"load average at start: {load()}", flush=True)
    with kafka_broker(args.kafka) as (bootstrap, broker_pid), start_cluster(1, home=home / "rocketmq") as cluster:
        cluster.create_topic("bench", 8)
        common = {"namesrv": cluster.namesrv_addr, "topic": "bench", "cluster": "DefaultCluster"}
        drivers = {
            "hook": LabDriver(args.client, home / "hook", jvm_flags(args.jvm_arg, "hook"), group="bench-hook",
                              kafka=bootstrap, **common),
            "none": LabDriver(args.client, home / "none", jvm_flags(args.jvm_arg, "none"), group="bench-none", **common),
        }
        try:
            warmed = warm_up(drivers, args.sends, args.warmup, args.warmup_max, broker_pid)
            pairs = run_pairs(drivers, args.sends, args.rounds, broker_pid)
            stats = drivers["hook"].command("flush", timeout_s=60)
            print(f"client {args.client}, Kafka {args.kafka}, {warmed} warm-up rounds, "
                  f"{args.rounds} pairs of {args.sends} sends:")
            summary(pairs)
            by_thread(pairs, args.sends)
            print(f"hook: offered {stats['offered']}, delivered {stats['delivered']}, dropped {stats['dropped']}")
            print(f"load average at end: {load()}")
        finally:
            for d in drivers.values():
                d.close()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
