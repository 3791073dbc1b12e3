"""``faultwatch lab``: the whole loop on a real RocketMQ cluster and Apache Kafka (see faultwatch/lab.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lab",
        help="a real RocketMQ cluster, real Java producers with the hook and the feed, a broker killed and one frozen",
        description="Starts Apache Kafka, a RocketMQ name server and three brokers, real 4.9.8 and 5.3.3 "
                    "producers, the poller, `faultwatch stream` and `faultwatch publish --every`; kills one "
                    "broker and freezes another, and prints what faultwatch saw against what the clients did. "
                    "Needs the Java clients built (scripts/bootstrap.sh test).",
    )
    p.add_argument("--root", type=Path, default=Path("data/lab"), help="where everything goes (replaced; default data/lab)")
    p.add_argument("--phase", type=float, default=30.0, metavar="SECONDS", help="length of each phase (default 30)")
    p.add_argument("--freeze", type=float, default=8.0, metavar="SECONDS", help="how long broker-c stays SIGSTOPped")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from faultwatch.lab import run_lab
    from pipeline.jvm import JvmError

    if args.phase <= 0 or args.freeze <= 0:
        print("faultwatch lab: --phase and --freeze must be > 0")
        return 2
    try:
        return run_lab(args.root, phase_s=args.phase, freeze_s=args.freeze)
    except (JvmError, TimeoutError) as exc:
        print(f"faultwatch lab: {exc}")
        return 1
