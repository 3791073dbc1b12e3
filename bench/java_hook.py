"""Overhead of faultwatch's send hook on a real producer: sends/s and p99 with it against without.

Run: ``.venv/bin/python bench/java_hook.py [--sends N] [--rounds R] [--client 4.9.8]``. Starts a name
server and one broker (``pipeline/rocketmq_cluster.py``) and a local Kafka-protocol broker, then two
real producers of the same client version in separate JVMs, one with the hook and one without, and
alternates them: R rounds of N synchronous sends each, after a warm-up round. Prints each round and
the medians, the ratio of throughputs, the p99 difference and the hook's drops. Goals: >= 0.95 of
the throughput, <= 100 us more at p99, no drops while Kafka is up. Nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.java_clients import LabDriver
from pipeline.kafka_local import start_local_kafka
from pipeline.rocketmq_cluster import start_cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--client", default="4.9.8")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="faultwatch-bench-hook-"))
    with start_local_kafka(topics=["rmq.send-results"], partitions=4) as kafka, \
            start_cluster(1, home=home / "rocketmq") as cluster:
        cluster.create_topic("bench", 8)
        common = {"namesrv": cluster.namesrv_addr, "topic": "bench", "cluster": "DefaultCluster"}
        drivers = {
            "hook": LabDriver(args.client, home / "hook", group="bench-hook", kafka=kafka.bootstrap, **common),
            "none": LabDriver(args.client, home / "none", group="bench-none", **common),
        }
        try:
            for d in drivers.values():
                d.command(f"send {args.sends}")  # warm-up: connections, JIT
            rounds: dict[str, list[dict[str, float]]] = {k: [] for k in drivers}
            for r in range(args.rounds):
                for name, d in drivers.items():
                    out = d.command(f"send {args.sends}", timeout_s=600)
                    rounds[name].append(out)
                    print(f"round {r} {name}: {out['per_s']:.0f} sends/s, p50 {out['p50_us']} us, "
                          f"p99 {out['p99_us']} us, failed {out['failed']}")
            stats = drivers["hook"].command("flush")
            med = {k: {m: statistics.median(o[m] for o in v) for m in ("per_s", "p50_us", "p99_us")}
                   for k, v in rounds.items()}
            print(f"client {args.client}, {args.rounds} rounds of {args.sends} sends, medians:")
            for k, m in med.items():
                print(f"  {k}: {m['per_s']:.0f} sends/s, p50 {m['p50_us']:.0f} us, p99 {m['p99_us']:.0f} us")
            print(f"throughput ratio hook/none: {med['hook']['per_s'] / med['none']['per_s']:.3f} (goal >= 0.95)")
            print(f"p99 difference: {med['hook']['p99_us'] - med['none']['p99_us']:+.0f} us (goal <= +100 us)")
            print(f"hook: offered {stats['offered']}, delivered {stats['delivered']}, dropped {stats['dropped']}")
        finally:
            for d in drivers.values():
                d.close()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
