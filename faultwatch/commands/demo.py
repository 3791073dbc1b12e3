"""``faultwatch demo``: the whole system on embedded defaults (see faultwatch/demo.py)."""

from __future__ import annotations

import argparse

from faultwatch.commands.common import add_config_arg, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run everything locally: broker, simulator, streaming job, publisher, live view, report",
        description="Runs the whole system on this machine and writes data/demo/ (replaced on each run).",
    )
    add_config_arg(p)
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="default: demo.duration_s (120)")
    p.add_argument("--scenario", default=None, help="simulator scenario (default: demo.scenario)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.scenario:
        cfg = cfg.replace(demo__scenario=args.scenario)
    from faultwatch.demo import run_demo
    from pipeline.kafka_local import LocalKafkaError, tansu_binary
    from streaming.session import JavaMissingError

    try:
        tansu_binary()  # before the previous demo's data is replaced
        return run_demo(cfg, duration_s=args.duration).code
    except (JavaMissingError, LocalKafkaError) as exc:
        print(f"faultwatch demo: {exc}")
        return 1
